"""AsyncClient and @requires_approval against the real server."""

from __future__ import annotations

import asyncio

import pytest
from conftest import ALICE, Approver, Server

from countersign import (
    AlreadyResolved,
    ApprovalNotGranted,
    ApprovalRejected,
    AsyncClient,
    Client,
    DecideOutcome,
    Event,
    EventKind,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Scope,
    Snapshot,
    State,
    Verdict,
    requires_approval,
)


def test_async_client_covers_every_call(server: Server, agent_id: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.address) as client:
            watch = client.watch(channel="cli")
            snapshot = await anext(watch)
            assert isinstance(snapshot, Snapshot)

            created = await client.request_approval(agent_id=agent_id, tool_name="bash", idempotency_key="a1")
            assert created.created
            approval = created.approval
            assert (await client.get(approval.id)).id == approval.id
            event = await anext(watch)
            assert isinstance(event, Event) and event.kind is EventKind.REQUESTED
            assert event.approval.id == approval.id

            assert (await client.wait_for_decision(approval.id, timeout=0.2)).pending
            decided = await client.decide(approval.id, Verdict.APPROVE, decider=ALICE, reason="ok")
            assert decided.outcome is DecideOutcome.RESOLVED
            assert (await client.wait_for_decision(approval.id, timeout=5)).approved
            with pytest.raises(AlreadyResolved):
                await client.decide(approval.id, Verdict.REJECT, decider=ALICE)
            assert (await client.consume(approval.id)).state is State.CONSUMED
            with pytest.raises(FailedPrecondition):
                await client.consume(approval.id)

            other = (await client.request_approval(agent_id=agent_id, tool_name="bash")).approval
            assert (await client.cancel(other.id, "no longer needed")).state is State.CANCELLED
            page = await client.list(agent_id=agent_id, states=["cancelled"])
            assert [a.id for a in page.approvals] == [other.id]
            with pytest.raises(NotFound):
                await client.get("0190d6e4-0000-7000-8000-000000000000")
            with pytest.raises(InvalidArgument) as bad:
                await client.request_approval(agent_id="", tool_name="bash")
            assert bad.value.field == "agent_id"
            await watch.aclose()

    asyncio.run(scenario())


def test_async_request_and_wait_gets_the_approvers_decision(server: Server, agent_id: str) -> None:
    approver = Approver(server.address, agent_id, [(Verdict.REJECT, Scope.ONCE, "too risky")])

    async def scenario():
        async with AsyncClient(server.address) as client:
            return await client.request_and_wait(agent_id=agent_id, tool_name="deploy", deadline=20)

    approval = asyncio.run(scenario())
    approver.join()
    assert approval.state is State.REJECTED and approval.reason == "too risky"


def test_a_decorated_function_runs_only_when_approved(server: Server, agent_id: str) -> None:
    ran: list[str] = []
    client = Client(server.address)

    @requires_approval(action="delete {path}", risk="high", ttl=60, client=client, agent_id=agent_id)
    def delete(path: str, force: bool = False) -> str:
        ran.append(path)
        return f"deleted {path}"

    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "fine")])
    assert delete("./build") == "deleted ./build"
    approved = approver.join()[0]
    assert ran == ["./build"]
    assert approved.arguments == {"path": "./build", "force": False}
    assert approved.action == "delete ./build" and approved.tool_name.endswith("delete")
    assert client.get(approved.id).state is State.CONSUMED

    approver = Approver(server.address, agent_id, [(Verdict.REJECT, Scope.ONCE, "keep the logs")])
    with pytest.raises(ApprovalRejected) as rejected:
        delete("./logs", force=True)
    approver.join()
    assert rejected.value.reason == "keep the logs"
    assert rejected.value.approval.deciders == [ALICE]
    assert ran == ["./build"], "a rejected call never runs"


def test_a_decorated_call_not_decided_in_time_does_not_run(server: Server, agent_id: str) -> None:
    ran = []

    @requires_approval(action="reboot", client=Client(server.address), agent_id=agent_id, deadline=0.5)
    def reboot() -> None:
        ran.append(True)

    with pytest.raises(ApprovalNotGranted) as not_granted:
        reboot()
    assert not_granted.value.approval.pending and ran == []


def test_a_decorated_coroutine_runs_only_when_approved(server: Server, agent_id: str) -> None:
    ran: list[int] = []

    @requires_approval(
        action=lambda n: f"scale to {n}", client=lambda: AsyncClient(server.address), agent_id=agent_id
    )
    async def scale(n: int) -> int:
        ran.append(n)
        return n

    approver = Approver(
        server.address,
        agent_id,
        [(Verdict.APPROVE, Scope.ONCE, ""), (Verdict.REJECT, Scope.ONCE, "budget")],
    )
    assert asyncio.run(scale(3)) == 3
    with pytest.raises(ApprovalRejected, match="budget"):
        asyncio.run(scale(30))
    decided = approver.join()
    assert ran == [3]
    assert decided[0].action == "scale to 3" and decided[0].arguments == {"n": 3}


def test_a_decorated_call_that_fails_is_recorded_as_failed(server: Server, agent_id: str) -> None:
    client = Client(server.address)

    @requires_approval(action="migrate", client=client, agent_id=agent_id, tool_name="migrate")
    def migrate() -> None:
        raise RuntimeError("disk full")

    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "")])
    with pytest.raises(RuntimeError, match="disk full"):
        migrate()
    [approved] = approver.join()
    consumed = client.get(approved.id)
    assert consumed.state is State.CONSUMED and consumed.tool_name == "migrate"
    assert consumed.consumption is not None
    assert not consumed.consumption.succeeded and consumed.consumption.detail == "RuntimeError"


def test_the_decorator_runs_the_edited_arguments(server: Server, agent_id: str) -> None:
    """Edit-on-approve: the function runs with the arguments the approver approved instead."""
    ran: list[str] = []

    @requires_approval(action="purge {path}", agent_id=agent_id, client=Client(server.address), deadline=30)
    def purge(path: str, dry_run: bool = False) -> str:
        ran.append(f"{path} dry_run={dry_run}")
        return "purged"

    approver = Approver(
        server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "", {"path": "/tmp/cache", "dry_run": True})]
    )
    assert purge("/var/cache") == "purged"
    (approval,) = approver.join()
    assert ran == ["/tmp/cache dry_run=True"]
    # Consumed as the edited version: the server accepted the digest of what ran.
    consumed = Client(server.address).get(approval.id)
    assert consumed.state is State.CONSUMED
    assert consumed.current_args_digest == consumed.edited_args_digest != consumed.args_digest
