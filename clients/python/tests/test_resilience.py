"""Waits and watches that outlive server restarts, dropped connections and slow consumers."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from conftest import ALICE, Server, first_pending

from countersign import Approval, AsyncClient, Client, Event, EventKind, Snapshot, State, Unavailable
from countersign._common import Backoff
from countersign.v1 import approval_pb2_grpc as pb_grpc


class Waiter:
    """request_and_wait in a thread, as an agent blocked on a decision."""

    def __init__(self, server: Server, agent_id: str, deadline: float) -> None:
        self.result: Approval | None = None
        self.error: BaseException | None = None

        def run() -> None:
            with server.client(timeout=2) as client:
                try:
                    self.result = client.request_and_wait(
                        agent_id=agent_id, tool_name="deploy", idempotency_key="call-1", deadline=deadline
                    )
                except BaseException as error:  # noqa: BLE001 - checked by the test
                    self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "request_and_wait did not return"


def test_wait_reattaches_across_a_server_restart(start_server: Callable[..., Server], agent_id: str) -> None:
    server = start_server()
    waiter = Waiter(server, agent_id, deadline=60)
    with server.client() as client:
        pending = first_pending(client, agent_id)
    server.kill()
    time.sleep(1.0)  # the waiter's long-poll fails and it retries against a dead port
    assert waiter.thread.is_alive() and waiter.result is None and waiter.error is None
    server.start()
    with server.client() as client:
        client.decide(pending.id, "approve", decider=ALICE, reason="after the restart")
        waiter.join()
        assert waiter.error is None, waiter.error
        assert waiter.result is not None and waiter.result.approved
        assert waiter.result.id == pending.id and waiter.result.reason == "after the restart"
        # One approval: the wait re-attached by id, nothing was requested twice.
        assert len(client.list(agent_id=agent_id).approvals) == 1


def test_a_request_sent_while_the_server_is_down_is_retried_with_the_same_key(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    server = start_server()
    server.kill()
    waiter = Waiter(server, agent_id, deadline=60)
    time.sleep(1.0)
    assert waiter.thread.is_alive()
    server.start()
    with server.client() as client:
        pending = first_pending(client, agent_id)
        assert pending.idempotency_key == "call-1"
        client.decide(pending.id, "reject", decider=ALICE, reason="no")
        waiter.join()
        assert waiter.result is not None and waiter.result.state is State.REJECTED
        assert len(client.list(agent_id=agent_id).approvals) == 1


def test_a_server_that_stays_down_is_an_error_not_an_approval(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    server = start_server()
    waiter = Waiter(server, agent_id, deadline=3)
    with server.client() as client:
        first_pending(client, agent_id)
    server.kill()
    waiter.join()
    assert waiter.result is None
    assert isinstance(waiter.error, Unavailable), waiter.error
    server.start()  # for the fixture's cleanup


def test_a_server_that_stays_down_is_logged_again_while_the_retries_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The first failure and then one warning every WARN_EVERY seconds, saying for how long.
    monkeypatch.setattr(Backoff, "WARN_EVERY", 0.5)
    caplog.set_level(logging.DEBUG, logger="countersign")
    with Client("127.0.0.1:1", timeout=0.5) as client, pytest.raises(Unavailable):
        client.request_and_wait(agent_id="agent-down", tool_name="deploy", idempotency_key="k", deadline=4.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) >= 3, warnings
    assert "still failing" not in warnings[0]
    assert all("still failing after" in w for w in warnings[1:]), warnings


def request(client: Client, agent_id: str, n: int, payload: str = "") -> Approval:
    arguments = {"n": n, "payload": payload}
    return client.request_approval(
        agent_id=agent_id, tool_name="bash", idempotency_key=f"call-{n}", arguments=arguments
    ).approval


def test_watch_snapshot_then_events_resuming_across_a_restart(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    server = start_server()
    with server.client() as client:
        before = request(client, agent_id, 0)
        watch = client.watch(heartbeat_timeout=5, max_backoff=0.5)
        snapshot = next(watch)
        assert isinstance(snapshot, Snapshot)
        assert [a.id for a in snapshot.approvals] == [before.id]
        assert snapshot.head_seq == watch.cursor

        first = request(client, agent_id, 1)
        event = next(watch)
        assert isinstance(event, Event) and event.kind is EventKind.REQUESTED
        assert event.approval is not None and event.approval.id == first.id
        assert event.seq == snapshot.head_seq + 1

        server.restart()
        later = [request(client, agent_id, n) for n in range(2, 5)]
        client.decide(later[0].id, "approve", decider=ALICE)
        sentinel = request(client, agent_id, 5)
        seen: list[Event] = []
        while not seen or seen[-1].approval.id != sentinel.id:
            item = next(watch)
            assert isinstance(item, Event)
            seen.append(item)
        assert [e.seq for e in seen] == list(range(event.seq + 1, event.seq + 1 + len(seen))), (
            "each seq once, in order"
        )
        requested = [e.approval.id for e in seen if e.kind is EventKind.REQUESTED]
        assert requested == [a.id for a in later] + [sentinel.id]
        assert [e.approval.state for e in seen if e.kind is EventKind.RESOLVED] == [State.APPROVED]
        assert watch.reconnects >= 1
        watch.close()


def test_watch_from_now_on_without_snapshot(client: Client, agent_id: str) -> None:
    earlier = request(client, agent_id, 0)  # not shown: it happened before the watch
    watch = client.watch(include_snapshot=False)
    # The stream has no "subscribed" signal: keep creating approvals until the watch sees one.
    created: list[str] = []
    seen = threading.Event()

    def create() -> None:
        for n in range(1, 100):
            created.append(request(client, agent_id, n).id)
            if seen.wait(0.2):
                return

    creator = threading.Thread(target=create)
    creator.start()
    event = next(watch)
    seen.set()
    creator.join()
    assert isinstance(event, Event) and event.approval is not None
    assert event.approval.id in created and event.approval.id != earlier.id
    resumed = client.watch(after_seq=event.seq - 1, include_snapshot=False)
    again = next(resumed)
    assert isinstance(again, Event) and again.seq == event.seq
    watch.close()
    resumed.close()


def test_a_slow_consumer_cut_off_resumes_without_gap_or_duplicate(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    server = start_server(watch={"buffer_events": 16})
    count = 300
    with server.client() as client:
        watch = client.watch()
        # Open the stream, then stop reading while ~5 MB of events pile up: more than the
        # HTTP/2 windows absorb, so the server's 16-event buffer overflows.
        assert isinstance(next(watch), Snapshot)
        payload = "y" * 16 * 1024
        for n in range(1, count + 1):
            request(client, agent_id, n, payload)
        seqs = [next(watch).seq for _ in range(count)]
        assert seqs == list(range(seqs[0], seqs[0] + count)), "each seq once, in order"
        assert watch.reconnects >= 1, "the server never cut the stream off"
        watch.close()


def test_a_cursor_the_server_cannot_resume_from_takes_a_new_snapshot(client: Client, agent_id: str) -> None:
    pending = request(client, agent_id, 0)
    watch = client.watch(after_seq=10**9, include_snapshot=False)
    item = next(watch)
    assert isinstance(item, Snapshot), item
    assert pending.id in {a.id for a in item.approvals}
    assert watch.cursor == item.head_seq < 10**9
    watch.close()


def test_a_cursor_the_restored_log_has_passed_takes_a_new_snapshot(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    """Issue 44: a watcher read up to seq N; the database is restored from a backup taken
    before N, and agents write past N. Resumed with its (seq, history id), the watch re-lists
    every pending approval instead of skipping the restored log's events up to N."""
    server = start_server()
    backup = server.workdir / "backup.db"
    with server.client() as client:
        in_backup = {request(client, agent_id, n).id for n in range(2)}
        subprocess.run(
            [str(server.binary), "--database", str(server.database), "backup", str(backup)],
            check=True,
            capture_output=True,
        )
        for n in range(2, 5):
            request(client, agent_id, n)
        watch = client.watch()
        snapshot = next(watch)
        assert isinstance(snapshot, Snapshot) and snapshot.history_id
        seq, history_id = watch.cursor, watch.history_id
        assert (seq, history_id) == (snapshot.head_seq, snapshot.history_id)
        watch.close()
    server.kill()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{server.database}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, server.database)
    server.start()
    with server.client() as client:
        after_restore = {request(client, agent_id, n).id for n in range(10, 14)}
        resumed = client.watch(after_seq=seq, history_id=history_id, include_snapshot=False)
        item = next(resumed)
        assert isinstance(item, Snapshot), f"resumed after seq {seq} of another log: {item}"
        assert {a.id for a in item.approvals} == in_backup | after_restore
        assert item.head_seq > seq and item.history_id != history_id
        resumed.close()


class SilentWatchService(pb_grpc.ApprovalServiceServicer):
    """Accepts watch streams and never sends anything on them, like a hung server."""

    def __init__(self) -> None:
        self.opened = 0
        self.stop = threading.Event()

    def WatchApprovals(self, request, context):
        self.opened += 1
        self.stop.wait()
        return iter(())


def test_a_silent_stream_is_replaced_and_close_ends_the_iteration() -> None:
    service = SilentWatchService()
    silent = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_ApprovalServiceServicer_to_server(service, silent)
    port = silent.add_insecure_port("127.0.0.1:0")
    silent.start()
    client = Client(f"127.0.0.1:{port}")
    watch = client.watch(heartbeat_timeout=0.5, max_backoff=0.2)
    ended = threading.Event()

    def iterate() -> None:
        for _ in watch:
            pytest.fail("a silent server delivered an item")
        ended.set()

    reader = threading.Thread(target=iterate, daemon=True)
    reader.start()
    deadline = time.monotonic() + 15
    while service.opened < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service.opened >= 3, "the silent stream was not replaced"
    watch.close()
    assert ended.wait(10), "close() did not end the iteration"
    client.close()
    service.stop.set()
    silent.stop(0)


def test_async_wait_and_watch_resume_across_a_restart(
    start_server: Callable[..., Server], agent_id: str
) -> None:
    server = start_server()

    async def scenario() -> None:
        async with AsyncClient(server.address, timeout=2) as client:
            watch = client.watch(max_backoff=0.5)
            assert isinstance(await anext(watch), Snapshot)
            approval = (await client.request_approval(agent_id=agent_id, tool_name="deploy")).approval
            requested = await anext(watch)
            assert requested.approval.id == approval.id

            waiting = asyncio.create_task(client.wait_until_resolved(approval.id, deadline=60))
            await asyncio.sleep(0.3)
            server.kill()
            await asyncio.sleep(1.0)
            assert not waiting.done()
            server.start()
            with server.client() as approver:
                approver.decide(approval.id, "approve", decider=ALICE, reason="restarted")
            decided = await waiting
            assert decided.approved and decided.reason == "restarted"

            resolved = await anext(watch)
            assert resolved.seq == requested.seq + 1 and resolved.kind is EventKind.RESOLVED
            await watch.aclose()

    asyncio.run(scenario())


def test_sync_wait_until_resolved_reports_an_expiry(client: Client, agent_id: str) -> None:
    approval = client.request_approval(agent_id=agent_id, tool_name="deploy", ttl=1).approval
    expired = client.wait_until_resolved(approval.id)
    assert expired.state is State.EXPIRED and not expired.approved
    assert expired.outcome.startswith("expired")
