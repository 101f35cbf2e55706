"""A real LangChain v1 agent, with a scripted chat model, gated through the real server."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import Approver, Server
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from countersign import AsyncClient, Client, ResolvedBy, Scope, Verdict
from countersign.langchain import CountersignMiddleware, resume_command


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with the scripted messages in turn, and records what it was sent."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any):
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def delete_call(call_id: str, path: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "delete_file", "args": {"path": path}, "id": call_id}])


def tools_recording(deleted: list[str]) -> list[Any]:
    @tool
    def delete_file(path: str) -> str:
        """Deletes a file."""
        deleted.append(path)
        return f"deleted {path}"

    @tool
    def list_files() -> str:
        """Lists files."""
        return "a.tmp b.tmp"

    return [delete_file, list_files]


def test_middleware_session_grant_answers_the_second_call(server: Server, agent_id: str) -> None:
    deleted: list[str] = []
    model = ScriptedChatModel(
        messages=iter([delete_call("tc-1", "a.tmp"), delete_call("tc-2", "b.tmp"), AIMessage("done")])
    )
    client = Client(server.address)
    gate = CountersignMiddleware(["delete_file"], agent_id=agent_id, client=client, risk="high", deadline=30)
    agent = create_agent(model, tools=tools_recording(deleted), middleware=[gate])
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.SESSION, "temp files")])
    result = agent.invoke(
        {"messages": [{"role": "user", "content": "clean up"}]},
        {"configurable": {"thread_id": "thread-1"}},
    )
    approver.join()
    assert result["messages"][-1].content == "done"
    assert deleted == ["a.tmp", "b.tmp"]
    second, first = client.list(agent_id=agent_id).approvals
    assert first.idempotency_key == "tc-1" and first.resolved_by is ResolvedBy.DECISION
    assert first.session_id == "thread-1", "the LangGraph thread is the session"
    assert first.action == 'delete_file {"path":"a.tmp"}', "one line a phone shows: tool and arguments"
    assert second.idempotency_key == "tc-2" and second.resolved_by is ResolvedBy.GRANT, (
        "the session grant approved the second call without a person"
    )


def test_middleware_rejection_becomes_an_error_tool_message(server: Server, agent_id: str) -> None:
    deleted: list[str] = []
    model = ScriptedChatModel(messages=iter([delete_call("tc-9", "prod.db"), AIMessage("understood")]))
    gate = CountersignMiddleware(
        ["delete_file"], agent_id=agent_id, client=Client(server.address), session_id="s", deadline=30
    )
    agent = create_agent(model, tools=tools_recording(deleted), middleware=[gate])
    approver = Approver(server.address, agent_id, [(Verdict.REJECT, Scope.ONCE, "never the production db")])
    result = agent.invoke({"messages": [{"role": "user", "content": "clean up"}]})
    approver.join()
    assert deleted == []
    [answer] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "error" and answer.tool_call_id == "tc-9"
    assert "never the production db" in answer.content
    assert any(
        isinstance(m, ToolMessage) and "never the production db" in m.content for m in model.seen[-1]
    ), "the model saw the reason"


def test_human_in_the_loop_interrupts_are_answered_by_countersign(server: Server, agent_id: str) -> None:
    deleted: list[str] = []
    model = ScriptedChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "delete_file", "args": {"path": "a.tmp"}, "id": "tc-1"},
                        {"name": "delete_file", "args": {"path": "prod.db"}, "id": "tc-2"},
                    ],
                ),
                AIMessage("done"),
            ]
        )
    )
    agent = create_agent(
        model,
        tools=tools_recording(deleted),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"delete_file": True})],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "hitl-1"}}
    paused = agent.invoke({"messages": [{"role": "user", "content": "clean up"}]}, config, version="v2")
    assert len(paused.interrupts) == 1 and deleted == []
    approver = Approver(
        server.address,
        agent_id,
        [(Verdict.APPROVE, Scope.ONCE, ""), (Verdict.REJECT, Scope.ONCE, "keep the database")],
    )
    with Client(server.address) as client:
        command = resume_command(client, paused.interrupts, agent_id=agent_id, deadline=30)
        approver.join()
        assert command.resume["decisions"][0] == {"type": "approve"}
        assert command.resume["decisions"][1]["type"] == "reject"
        finished = agent.invoke(command, config, version="v2")
        assert deleted == ["a.tmp"]
        rejected = [
            m for m in finished.value["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "tc-2"
        ]
        assert rejected and "keep the database" in rejected[0].content
        asked = {a.idempotency_key: a for a in client.list(agent_id=agent_id).approvals}
        first = next(a for key, a in asked.items() if key.endswith(":0"))
        assert first.action == 'delete_file {"path":"a.tmp"}', "no multi-line text, no Python repr"
        assert first.request_reason == "Tool execution requires approval"
        # Answering the same interrupt again asks nothing new: the keys are the interrupt's.
        again = resume_command(client, paused.interrupts, agent_id=agent_id, deadline=5)
        assert again.resume == command.resume
        assert len(client.list(agent_id=agent_id).approvals) == 2


def test_an_approval_with_edits_runs_the_edited_call(server: Server, agent_id: str) -> None:
    """Edit-on-approve: the middleware runs the tool with the arguments the approver edited,
    and a HumanInTheLoopMiddleware interrupt is answered with LangChain's edit decision."""
    deleted: list[str] = []
    model = ScriptedChatModel(messages=iter([delete_call("tc-e", "prod.db"), AIMessage("done")]))
    client = Client(server.address)
    gate = CountersignMiddleware(
        ["delete_file"], agent_id=agent_id, client=client, session_id="s", deadline=30
    )
    agent = create_agent(model, tools=tools_recording(deleted), middleware=[gate])
    edit = {"path": "prod.db.bak"}
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "", edit)])
    agent.invoke({"messages": [{"role": "user", "content": "clean up"}]})
    approver.join()
    assert deleted == ["prod.db.bak"], "the edited call ran, not the requested one"
    [approval] = client.list(agent_id=agent_id).approvals
    assert approval.arguments == {"path": "prod.db"}
    assert approval.edited_arguments == {"path": "prod.db.bak"}
    assert approval.arguments_to_run == {"path": "prod.db.bak"}
    assert approval.editor is not None and approval.editor.display_name == "Alice"
    assert approval.decisions[0].edited_arguments == {"path": "prod.db.bak"}

    hitl_model = ScriptedChatModel(messages=iter([delete_call("tc-h", "prod.db"), AIMessage("done")]))
    hitl_agent = create_agent(
        hitl_model,
        tools=tools_recording(deleted),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"delete_file": True})],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "hitl-edit"}}
    paused = hitl_agent.invoke({"messages": [{"role": "user", "content": "clean up"}]}, config, version="v2")
    hitl_agent_id = f"{agent_id}-hitl"
    edit = {"path": "old.tmp"}
    approver = Approver(server.address, hitl_agent_id, [(Verdict.APPROVE, Scope.ONCE, "", edit)])
    command = resume_command(client, paused.interrupts, agent_id=hitl_agent_id, deadline=30)
    approver.join()
    assert command.resume["decisions"] == [
        {"type": "edit", "edited_action": {"name": "delete_file", "args": {"path": "old.tmp"}}}
    ]
    hitl_agent.invoke(command, config, version="v2")
    assert deleted == ["prod.db.bak", "old.tmp"]
    client.close()


def test_an_edit_for_a_tool_that_takes_no_edits_is_a_rejection(server: Server, agent_id: str) -> None:
    """A tool configured without "edit" cannot run an edited call: countersign answers the
    interrupt with a rejection naming why, and the original call does not run either."""
    deleted: list[str] = []
    no_edits = ["approve", "reject"]
    model = ScriptedChatModel(messages=iter([delete_call("tc-n", "prod.db"), AIMessage("done")]))
    agent = create_agent(
        model,
        tools=tools_recording(deleted),
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"delete_file": {"allowed_decisions": no_edits}})],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "hitl-no-edit"}}
    paused = agent.invoke({"messages": [{"role": "user", "content": "clean up"}]}, config, version="v2")
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "", {"path": "old.tmp"})])
    with Client(server.address) as client:
        command = resume_command(client, paused.interrupts, agent_id=agent_id, deadline=30)
    approver.join()
    [decision] = command.resume["decisions"]
    assert decision["type"] == "reject"
    assert "does not accept edited calls" in decision["message"]
    finished = agent.invoke(command, config, version="v2")
    assert deleted == []
    [answer] = [m for m in finished.value["messages"] if isinstance(m, ToolMessage)]
    assert "does not accept edited calls" in answer.content


def test_an_async_agent_is_gated_through_the_async_client(server: Server, agent_id: str) -> None:
    """``ainvoke`` goes through ``awrap_tool_call`` and the AsyncClient: the tool runs only
    when approved, and a rejection reaches the model as an error tool message."""
    deleted: list[str] = []
    model = ScriptedChatModel(
        messages=iter([delete_call("ta-1", "a.tmp"), delete_call("ta-2", "prod.db"), AIMessage("done")])
    )
    approver = Approver(
        server.address,
        agent_id,
        [(Verdict.APPROVE, Scope.ONCE, ""), (Verdict.REJECT, Scope.ONCE, "not the database")],
    )

    async def scenario() -> dict[str, Any]:
        async with AsyncClient(server.address) as client:
            gate = CountersignMiddleware(
                ["delete_file"], agent_id=agent_id, async_client=client, session_id="s", deadline=30
            )
            agent = create_agent(model, tools=tools_recording(deleted), middleware=[gate])
            return await agent.ainvoke({"messages": [{"role": "user", "content": "clean up"}]})

    result = asyncio.run(scenario())
    approver.join()
    assert deleted == ["a.tmp"]
    [_, refused] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert refused.status == "error" and "not the database" in refused.content
