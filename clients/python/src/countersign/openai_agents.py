"""Resolve OpenAI Agents SDK tool approvals through countersign (extra ``openai-agents``).

A tool declared with ``needs_approval=True`` pauses the run: ``result.interruptions`` lists the
calls waiting for a decision. ``resolve_interruptions`` asks countersign about each (the call id
is the idempotency key, so a retried or resumed run never asks twice), then approves or rejects
it on the run state; ``run_with_approvals`` loops ``Runner.run`` until nothing is waiting.

    result = await run_with_approvals(client, agent, "clean the build", agent_id="coder-1",
                                      session_id=conversation_id)
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from agents import Agent, Runner, RunResult, RunState
from agents.items import ToolApprovalItem

from countersign._common import describe_call, rejection_text
from countersign.aio import AsyncClient
from countersign.model import Approval, Risk, Scope


async def approve_item(
    client: AsyncClient,
    item: ToolApprovalItem,
    *,
    agent_id: str,
    session_id: str = "",
    risk: Risk | str = Risk.MEDIUM,
    ttl: float | timedelta | None = None,
    deadline: float | None = None,
) -> Approval:
    """Asks countersign about one pending tool call and waits for the decision."""
    if not item.call_id:
        raise ValueError(f"tool call {item.name!r} has no call id to make its approval idempotent")
    arguments = json.loads(item.arguments) if item.arguments else {}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return await client.request_and_wait(
        agent_id=agent_id,
        session_id=session_id,
        idempotency_key=item.call_id,
        tool_name=item.name or "",
        arguments=arguments,
        action=describe_call(item.name or "", arguments),
        reason=f"asked by agent {item.agent.name}",
        risk=risk,
        ttl=ttl,
        deadline=deadline,
    )


async def resolve_interruptions(client: AsyncClient, result: RunResult, **options: Any) -> RunState[Any]:
    """The run state with every interruption of ``result`` approved or rejected by countersign;
    ``options`` (agent_id, session_id, risk, ttl, deadline) as for ``approve_item``.

    An approval with scope SESSION approves later calls of that tool in this run at once
    (``always_approve=True``); anything but APPROVED is a rejection whose message tells the
    model who decided and why. The SDK cannot run a call with other arguments than its own, so
    an approval with edited arguments rejects this call and tells the model the arguments an
    approver approved instead (a new call with them asks again).
    """
    state = result.to_state()
    for item in result.interruptions:
        approval = await approve_item(client, item, **options)
        if approval.approved and not approval.edited:
            state.approve(item, always_approve=approval.scope is Scope.SESSION)
        elif approval.approved:
            state.reject(item, rejection_message=edited_text(approval))
        else:
            state.reject(item, rejection_message=rejection_text(approval))
    return state


def edited_text(approval: Approval) -> str:
    """What the model is told about an approval with edited arguments."""
    if approval.edited_arguments is None:
        return f"Tool call not run: {approval.outcome}, with edited arguments that are not available."
    edited = json.dumps(approval.edited_arguments, sort_keys=True)
    return (
        f"Tool call not run as requested: {approval.outcome}, only with these edited arguments: "
        f"{edited}. Call the tool again with exactly these arguments if you still need it."
    )


async def run_with_approvals(
    client: AsyncClient,
    agent: Agent[Any],
    input: Any,
    *,
    agent_id: str,
    session_id: str = "",
    risk: Risk | str = Risk.MEDIUM,
    ttl: float | timedelta | None = None,
    deadline: float | None = None,
    max_rounds: int = 100,
    **run_options: Any,
) -> RunResult:
    """``Runner.run`` until no interruption remains, each resolved through countersign.
    ``run_options`` go to every ``Runner.run`` call."""
    result = await Runner.run(agent, input, **run_options)
    for _ in range(max_rounds):
        if not result.interruptions:
            return result
        state = await resolve_interruptions(
            client, result, agent_id=agent_id, session_id=session_id, risk=risk, ttl=ttl, deadline=deadline
        )
        result = await Runner.run(agent, state, **run_options)
    raise RuntimeError(f"the run was still interrupted after {max_rounds} rounds of approvals")
