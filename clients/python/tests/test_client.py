"""The sync Client against the real server: every method, its results and its typed errors."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import ALICE, Approver, Server, first_pending

from countersign import (
    AlreadyExists,
    AlreadyResolved,
    ApprovalRequest,
    Client,
    ConfigError,
    DecideOutcome,
    Decider,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResolvedBy,
    Risk,
    Scope,
    State,
    Unavailable,
    Verdict,
)


def ask(client: Client, agent_id: str, key: str = "call-1", **fields: object):
    request = {
        "agent_id": agent_id,
        "tool_name": "bash",
        "arguments": {"command": "rm -rf ./build"},
        "action": "delete the build directory",
        "risk": "high",
        "idempotency_key": key,
        "session_id": "session-1",
        "labels": {"repo": "countersign"},
        **fields,
    }
    return client.request_approval(**request)


def test_request_get_and_idempotent_repeat(client: Client, agent_id: str) -> None:
    first = ask(client, agent_id)
    assert first.created
    approval = first.approval
    assert approval.state is State.PENDING and not approval.approved
    assert approval.arguments == {"command": "rm -rf ./build"}
    assert approval.risk is Risk.HIGH
    assert approval.labels == {"repo": "countersign"}
    assert approval.expires_at is not None and approval.created_at is not None
    assert approval.scope is None

    again = ask(client, agent_id)
    assert not again.created and again.approval.id == approval.id
    assert client.get(approval.id) == again.approval

    with pytest.raises(AlreadyExists) as other_arguments:
        ask(client, agent_id, arguments={"command": "rm -rf /"})
    assert "call-1" in other_arguments.value.message or "idempotency" in other_arguments.value.message


def test_wait_for_decision_returns_pending_then_the_decision(client: Client, agent_id: str) -> None:
    approval = ask(client, agent_id).approval
    started = time.monotonic()
    still = client.wait_for_decision(approval.id, timeout=0.3)
    assert still.pending and time.monotonic() - started >= 0.25

    approver = Approver(client_address(client), agent_id, [(Verdict.APPROVE, Scope.ONCE, "looks fine")])
    decided = client.wait_for_decision(approval.id, timeout=20)
    approver.join()
    assert decided.approved and decided.state is State.APPROVED
    assert decided.resolved_by is ResolvedBy.DECISION
    assert decided.deciders == [ALICE]
    assert decided.reason == "looks fine"
    assert decided.scope is Scope.ONCE

    consumed = client.consume(approval.id, detail="deleted")
    assert consumed.state is State.CONSUMED
    assert consumed.consumption is not None and consumed.consumption.succeeded
    assert consumed.consumption.detail == "deleted"
    with pytest.raises(FailedPrecondition, match="already consumed"):
        client.consume(approval.id)


def client_address(client: Client) -> str:
    return client._connection.target


def test_request_and_wait_reports_the_rejection_reason(client: Client, agent_id: str) -> None:
    approver = Approver(client_address(client), agent_id, [(Verdict.REJECT, Scope.ONCE, "not on a Friday")])
    approval = client.request_and_wait(
        ApprovalRequest(agent_id=agent_id, tool_name="deploy", arguments={"env": "prod"}, action="deploy"),
        deadline=20,
    )
    approver.join()
    assert approval.state is State.REJECTED and not approval.approved
    assert approval.reason == "not on a Friday"
    assert approval.deciders == [ALICE]
    assert "rejected by Alice via cli: not on a Friday" == approval.outcome


def test_request_and_wait_returns_pending_at_its_deadline(client: Client, agent_id: str) -> None:
    started = time.monotonic()
    approval = client.request_and_wait(agent_id=agent_id, tool_name="deploy", deadline=1.0)
    assert approval.pending and not approval.approved
    assert 0.9 <= time.monotonic() - started < 10


def test_a_session_decision_has_session_scope(client: Client, agent_id: str) -> None:
    approver = Approver(client_address(client), agent_id, [(Verdict.APPROVE, Scope.SESSION, "")])
    approval = client.request_and_wait(agent_id=agent_id, tool_name="git", session_id="s1", deadline=20)
    approver.join()
    assert approval.approved and approval.scope is Scope.SESSION
    # The grant approves the next call of the same tool in the same session at once.
    second = client.request_and_wait(agent_id=agent_id, tool_name="git", session_id="s1", deadline=5)
    assert second.approved and second.resolved_by is ResolvedBy.GRANT and second.grant_id


def test_list_filters_and_pages(client: Client, agent_id: str) -> None:
    ids = [ask(client, agent_id, key=f"call-{i}", tool_name=f"tool-{i % 2}").approval.id for i in range(5)]
    client.cancel(ids[0], reason="changed my mind")

    everything = client.list(agent_id=agent_id)
    assert [a.id for a in everything.approvals] == ids[::-1]
    assert everything.next_page_token == ""
    pending = client.list(agent_id=agent_id, states=["pending"])
    assert {a.id for a in pending.approvals} == set(ids[1:])
    cancelled = client.list(agent_id=agent_id, states=[State.CANCELLED])
    assert [a.id for a in cancelled.approvals] == [ids[0]]
    assert cancelled.approvals[0].reason == "changed my mind"
    assert cancelled.approvals[0].resolved_by is ResolvedBy.CANCELLATION
    assert {a.id for a in client.list(agent_id=agent_id, tool_name="tool-1").approvals} == {ids[1], ids[3]}

    first = client.list(agent_id=agent_id, page_size=2)
    assert len(first.approvals) == 2 and first.next_page_token
    rest = client.list(agent_id=agent_id, page_size=10, page_token=first.next_page_token)
    assert [a.id for a in first.approvals + rest.approvals] == ids[::-1]


def test_decide_outcomes_and_already_resolved(client: Client, agent_id: str) -> None:
    approval = ask(client, agent_id).approval
    result = client.decide(approval.id, "reject", decider=ALICE, reason="no", idempotency_key="cb-1")
    assert result.outcome is DecideOutcome.RESOLVED
    assert result.approval.state is State.REJECTED

    repeat = client.decide(approval.id, "reject", decider=ALICE, reason="no", idempotency_key="cb-1")
    assert repeat.outcome is DecideOutcome.DUPLICATE

    bob = Decider("telegram", "42", "Bob")
    with pytest.raises(AlreadyResolved) as late:
        client.decide(approval.id, Verdict.APPROVE, decider=bob)
    assert late.value.approval.state is State.REJECTED
    assert "already resolved: rejected by Alice via cli: no" in str(late.value)

    with pytest.raises(FailedPrecondition, match="only a pending approval can be cancelled"):
        client.cancel(approval.id)


def test_invalid_input_names_the_field_and_stores_nothing(client: Client, agent_id: str) -> None:
    with pytest.raises(InvalidArgument) as no_agent:
        client.request_approval(agent_id="", tool_name="bash", idempotency_key="k")
    assert no_agent.value.field == "agent_id", no_agent.value.message
    with pytest.raises(InvalidArgument) as long_ttl:
        client.request_approval(agent_id=agent_id, tool_name="bash", ttl=10**7)
    assert long_ttl.value.field == "ttl_seconds", long_ttl.value.message
    assert client.list(agent_id=agent_id).approvals == []

    with pytest.raises(ValueError, match="risk 'severe' is not one of: low, medium, high, critical"):
        client.request_approval(agent_id=agent_id, tool_name="bash", risk="severe")
    with pytest.raises(NotFound):
        client.get("0190d6e4-0000-7000-8000-000000000000")


def test_unusable_configurations_are_refused(tmp_path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello")
    for address, options in [
        ("ftp://127.0.0.1:1", {}),
        ("127.0.0.1", {}),
        ("http://127.0.0.1:1", {"ca_file": not_pem}),
        ("127.0.0.1:1", {"ca_file": not_pem}),
        ("127.0.0.1:1", {"ca_file": tmp_path / "missing.pem"}),
        ("127.0.0.1:1", {"token": "a\nb"}),
        ("127.0.0.1:1", {"timeout": 0}),
    ]:
        with pytest.raises(ConfigError):
            Client(address, **options)


def test_an_unreachable_server_is_an_error_never_an_approval(agent_id: str) -> None:
    from conftest import free_port

    with Client(f"127.0.0.1:{free_port()}", timeout=1) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.request_and_wait(agent_id=agent_id, tool_name="bash", deadline=1.5)
        assert time.monotonic() - started < 10


def test_one_client_serves_many_threads(client: Client, agent_id: str) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(5):
                ask(client, agent_id, key=f"t{n}-{i}")
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(client.list(agent_id=agent_id, page_size=100).approvals) == 20
    assert first_pending(client, agent_id).pending


def test_from_env_reads_the_cli_variables_too(
    server: Server, agent_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One environment serves the CLI and the package: COUNTERSIGN_SERVER is the CLI's name."""
    monkeypatch.delenv("COUNTERSIGN_ADDRESS", raising=False)
    monkeypatch.setenv("COUNTERSIGN_SERVER", f"http://{server.address}")
    with Client.from_env() as from_env:
        created = ask(from_env, agent_id)
        assert server.client().get(created.approval.id).id == created.approval.id
    monkeypatch.setenv("COUNTERSIGN_ADDRESS", "127.0.0.1:1")
    with Client.from_env() as preferred:
        assert preferred._connection.target == "127.0.0.1:1"


def test_consume_names_the_version_that_ran(client: Client, agent_id: str) -> None:
    """After an approver's edit, reporting the original arguments as run consumes nothing."""
    approval = ask(client, agent_id).approval
    client.decide(
        approval.id,
        Verdict.APPROVE,
        decider=ALICE,
        edited_arguments={"command": "rm -rf ./build/cache"},
    )
    with pytest.raises(FailedPrecondition):
        client.consume(approval.id, args_digest=approval.args_digest)
    edited = client.get(approval.id)
    assert edited.state is State.APPROVED
    consumed = client.consume(approval.id, args_digest=edited.current_args_digest)
    assert consumed.state is State.CONSUMED
