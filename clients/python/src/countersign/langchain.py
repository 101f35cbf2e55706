"""Gate LangChain v1 agent tools through countersign (extra ``langchain``).

Two ways in:

- ``CountersignMiddleware``: an ``AgentMiddleware`` whose ``wrap_tool_call`` asks countersign
  before each call of the chosen tools (the tool call id is the idempotency key). An approved
  call runs (with the arguments an approver edited, when edited); anything else becomes
  ``ToolMessage(status="error")`` telling the model who decided and why, and the tool does not
  run.
- ``hitl_decisions`` / ``resume_command``: answer the interrupts of LangChain's own
  ``HumanInTheLoopMiddleware`` with countersign decisions (``{"decisions": [...]}``): approve,
  reject, or an approval with edits as ``{"type": "edit", "edited_action": {...}}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.config import get_config
from langgraph.types import Command, Interrupt

from countersign._common import describe_call, rejection_text
from countersign.aio import AsyncClient
from countersign.client import Client
from countersign.model import Approval, ApprovalRequest, Risk


def _thread_id() -> str:
    """The LangGraph thread id of the run in progress: the natural session of a grant."""
    try:
        return str(get_config().get("configurable", {}).get("thread_id") or "")
    except RuntimeError:
        return ""


class CountersignMiddleware(AgentMiddleware):
    """Runs the ``tools`` named only when countersign approves the call.

    ``tools``: names of the gated tools, or a mapping of name to risk. ``session_id`` (default:
    the LangGraph thread id) scopes session grants: once an approver allows a tool "for the
    session", later calls of it in the same session are approved by the server at once.
    ``client`` serves ``invoke``, ``async_client`` serves ``ainvoke``.
    """

    def __init__(
        self,
        tools: Iterable[str] | dict[str, Risk | str],
        *,
        agent_id: str,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        session_id: str | None = None,
        risk: Risk | str = Risk.MEDIUM,
        ttl: float | timedelta | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        if client is None and async_client is None:
            raise ValueError("CountersignMiddleware needs a client, an async_client or both")
        self.gated: dict[str, Risk | str] = (
            dict(tools) if isinstance(tools, dict) else dict.fromkeys(tools, risk)
        )
        self.agent_id = agent_id
        self.client = client
        self.async_client = async_client
        self.session_id = session_id
        self.ttl = ttl
        self.deadline = deadline

    def _request(self, request: ToolCallRequest) -> ApprovalRequest:
        call = request.tool_call
        if not call.get("id"):
            raise ValueError(f"tool call {call['name']!r} has no id to make its approval idempotent")
        return ApprovalRequest(
            agent_id=self.agent_id,
            session_id=self.session_id if self.session_id is not None else _thread_id(),
            idempotency_key=call["id"],
            tool_name=call["name"],
            arguments=call["args"],
            action=describe_call(call["name"], call["args"]),
            risk=self.gated[call["name"]],
            ttl=self.ttl,
        )

    @staticmethod
    def _refusal(request: ToolCallRequest, approval: Approval) -> ToolMessage:
        call = request.tool_call
        return ToolMessage(
            content=rejection_text(approval), tool_call_id=call["id"], name=call["name"], status="error"
        )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        if request.tool_call["name"] not in self.gated:
            return handler(request)
        if self.client is None:
            raise RuntimeError("CountersignMiddleware has no sync client; use ainvoke or pass client=")
        approval = self.client.request_and_wait(self._request(request), deadline=self.deadline)
        if not approval.approved or not _runnable(approval):
            return self._refusal(request, approval)
        return handler(_as_approved(request, approval))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        if request.tool_call["name"] not in self.gated:
            return await handler(request)
        if self.async_client is None:
            raise RuntimeError("CountersignMiddleware has no async client; use invoke or pass async_client=")
        approval = await self.async_client.request_and_wait(self._request(request), deadline=self.deadline)
        if not approval.approved or not _runnable(approval):
            return self._refusal(request, approval)
        return await handler(_as_approved(request, approval))


def _runnable(approval: Approval) -> bool:
    """An approval with edits runs only with the edited arguments; redacted, nothing runs."""
    return not approval.edited or approval.edited_arguments is not None


def _as_approved(request: ToolCallRequest, approval: Approval) -> ToolCallRequest:
    """The tool call as approved: with the arguments an approver edited, when edited."""
    if not approval.edited:
        return request
    return request.override(tool_call={**request.tool_call, "args": approval.edited_arguments})


def _decision(approval: Approval, name: str) -> dict[str, Any]:
    if approval.approved and _runnable(approval):
        if approval.edited:
            return {"type": "edit", "edited_action": {"name": name, "args": approval.edited_arguments}}
        return {"type": "approve"}
    return {"type": "reject", "message": rejection_text(approval)}


def hitl_decisions(
    client: Client,
    interrupt: Interrupt,
    *,
    agent_id: str,
    session_id: str = "",
    risk: Risk | str = Risk.MEDIUM,
    ttl: float | timedelta | None = None,
    deadline: float | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The answer to one HumanInTheLoopMiddleware interrupt: ``{"decisions": [...]}``, one
    approve, edit (an approval with edited arguments) or reject per action request, in order.
    Each action becomes a countersign approval keyed by the interrupt id and its position, so
    answering the same interrupt again asks nothing new."""
    value = interrupt.value
    if not isinstance(value, dict) or "action_requests" not in value:
        raise ValueError(f"interrupt {interrupt.id} is not a HumanInTheLoopMiddleware request: {value!r}")
    decisions = []
    for position, action in enumerate(value["action_requests"]):
        approval = client.request_and_wait(
            agent_id=agent_id,
            session_id=session_id,
            idempotency_key=f"{interrupt.id}:{position}",
            tool_name=action["name"],
            arguments=action["args"],
            action=describe_call(action["name"], action["args"]),
            # The middleware's description ("Tool execution requires approval", or the
            # developer's own) without the Python repr of the arguments it appends.
            reason=(action.get("description") or "").split("\n", 1)[0],
            risk=risk,
            ttl=ttl,
            deadline=deadline,
        )
        decision = _decision(approval, action["name"])
        allowed = _allowed_decisions(value, position, action["name"])
        if decision["type"] == "edit" and "edit" not in allowed:
            # The approver approved other arguments than the call's, and this tool takes no
            # edited call: running the original would run what nobody approved.
            decision = {
                "type": "reject",
                "message": f"countersign: approval {approval.id} approved arguments edited by "
                f"{approval.editor}, but {action['name']} does not accept edited calls; it was not run",
            }
        decisions.append(decision)
    return {"decisions": decisions}


def _allowed_decisions(value: dict[str, Any], position: int, name: str) -> list[str]:
    """The decision types the interrupt allows for the action at ``position`` (all of them
    when it does not say)."""
    configs = value.get("review_configs") or []
    config = configs[position] if position < len(configs) else None
    if config is None or config.get("action_name") != name:
        config = next((c for c in configs if c.get("action_name") == name), None)
    if config is None:
        return ["approve", "edit", "reject"]
    return list(config.get("allowed_decisions") or [])


def resume_command(client: Client, interrupts: Sequence[Interrupt], **options: Any) -> Command[Any]:
    """``Command(resume=...)`` answering every HumanInTheLoopMiddleware interrupt of a paused
    run; ``options`` as for ``hitl_decisions``."""
    answers = {i.id: hitl_decisions(client, i, **options) for i in interrupts}
    if len(answers) == 1:
        return Command(resume=next(iter(answers.values())))
    return Command(resume=answers)
