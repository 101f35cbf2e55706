"""A real OpenAI Agents SDK agent, with a scripted model, gated through the real server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from conftest import Approver, Server
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from countersign import AsyncClient, Client, ResolvedBy, Scope, Verdict
from countersign.openai_agents import run_with_approvals

set_tracing_disabled(True)


def tool_call(call_id: str, path: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc-{call_id}",
        call_id=call_id,
        type="function_call",
        name="delete_file",
        arguments=json.dumps({"path": path}),
    )


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg-1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers each turn with the next scripted output, and records what it was sent."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("the tests do not stream")


def agent_with(model: ScriptedModel, deleted: list[str]) -> Agent:
    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        deleted.append(path)
        return f"deleted {path}"

    return Agent(name="janitor", instructions="Clean up.", model=model, tools=[delete_file])


def run(server: Server, agent: Agent, agent_id: str):
    async def scenario():
        async with AsyncClient(server.address) as client:
            return await run_with_approvals(
                client, agent, "clean up", agent_id=agent_id, session_id="conversation-1", deadline=30
            )

    return asyncio.run(scenario())


def test_a_session_approval_lets_the_second_call_run_without_asking(server: Server, agent_id: str) -> None:
    deleted: list[str] = []
    model = ScriptedModel([[tool_call("call-1", "a.tmp")], [tool_call("call-2", "b.tmp")], [message("done")]])
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.SESSION, "temp files are fine")])
    result = run(server, agent_with(model, deleted), agent_id)
    approver.join()
    assert result.final_output == "done"
    assert deleted == ["a.tmp", "b.tmp"]
    with Client(server.address) as client:
        approvals = client.list(agent_id=agent_id).approvals
    assert len(approvals) == 1, "the second call needed no new approval"
    assert approvals[0].idempotency_key == "call-1"
    assert approvals[0].arguments == {"path": "a.tmp"} and approvals[0].tool_name == "delete_file"
    assert approvals[0].action == 'delete_file {"path":"a.tmp"}'
    assert approvals[0].request_reason == "asked by agent janitor"


def test_a_rejection_skips_the_tool_and_tells_the_model_why(server: Server, agent_id: str) -> None:
    deleted: list[str] = []
    model = ScriptedModel([[tool_call("call-1", "prod.db")], [message("understood")]])
    approver = Approver(
        server.address, agent_id, [(Verdict.REJECT, Scope.ONCE, "that is the production database")]
    )
    result = run(server, agent_with(model, deleted), agent_id)
    approver.join()
    assert deleted == [], "a rejected tool never runs"
    assert result.final_output == "understood"
    outputs = [
        item
        for item in model.inputs[-1]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert len(outputs) == 1 and outputs[0]["call_id"] == "call-1"
    assert "that is the production database" in str(outputs[0]["output"])


def test_an_approval_with_edits_skips_the_call_and_tells_the_model_the_edited_arguments(
    server: Server, agent_id: str
) -> None:
    """The SDK cannot run a call with other arguments: the requested call does not run, and the
    model hears the arguments the approver approved instead."""
    deleted: list[str] = []
    model = ScriptedModel([[tool_call("call-1", "prod.db")], [message("will retry")]])
    edit = {"path": "prod.db.tmp"}
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "", edit)])
    result = run(server, agent_with(model, deleted), agent_id)
    approver.join()
    assert deleted == [], "the requested arguments never run"
    assert result.final_output == "will retry"
    outputs = [
        item
        for item in model.inputs[-1]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert len(outputs) == 1 and '{"path": "prod.db.tmp"}' in str(outputs[0]["output"])


def test_a_resumed_run_asks_once_per_call_id(server: Server, agent_id: str) -> None:
    """The call id is the idempotency key: resolving the same interruption twice reuses the
    approval (and its decision) instead of asking again."""
    deleted: list[str] = []
    model = ScriptedModel([[tool_call("call-1", "x.tmp")], [message("done")]])
    agent = agent_with(model, deleted)
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "")])

    async def scenario():
        from agents import Runner

        from countersign.openai_agents import resolve_interruptions

        async with AsyncClient(server.address) as client:
            paused = await Runner.run(agent, "clean up")
            assert len(paused.interruptions) == 1
            await resolve_interruptions(client, paused, agent_id=agent_id, deadline=30)
            state = await resolve_interruptions(client, paused, agent_id=agent_id, deadline=30)
            return await Runner.run(agent, state)

    result = asyncio.run(scenario())
    approver.join()
    assert result.final_output == "done" and deleted == ["x.tmp"]
    with Client(server.address) as client:
        [approval] = client.list(agent_id=agent_id).approvals
    assert approval.resolved_by is ResolvedBy.DECISION
