"""The synchronous client (grpcio)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import grpc

from countersign import _common, receipts
from countersign._common import Backoff, ClientBase, WatchCursor, log
from countersign.errors import CountersignError, RateLimited, from_rpc_error
from countersign.model import (
    Approval,
    ApprovalPage,
    ApprovalRequest,
    Decider,
    DecideResult,
    Event,
    RequestResult,
    Scope,
    Snapshot,
    State,
    Verdict,
    approval_of,
)
from countersign.v1 import approval_pb2 as pb
from countersign.v1 import approval_pb2_grpc as pb_grpc


class Client(ClientBase):
    """A connection to a countersign server, safe to share between threads.

    ``address`` is ``host:port``, ``http://host:port`` or ``https://host:port``; TLS is on for
    https://, with ``tls=True``, or when ``ca_file`` (PEM CA that signs the server's certificate)
    is given; without a CA file, TLS verifies against the system roots. ``token`` is sent as a
    bearer token. ``timeout`` bounds every call except long-polls (which get their wait plus a
    grace) and watches.
    """

    _grpc = grpc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, method)(
                request,
                timeout=timeout or self._connection.timeout,
                metadata=self._connection.metadata,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def request_approval(self, request: ApprovalRequest | None = None, /, **fields: Any) -> RequestResult:
        """Creates an approval (from an ApprovalRequest or its fields as keywords), or returns the
        existing one for the same (agent_id, idempotency_key). Policy may resolve it at once."""
        message = _common.as_request(request, fields).to_proto()
        response = self._call("RequestApproval", message)
        return RequestResult(approval_of(response.approval), response.created)

    def get(self, approval_id: str) -> Approval:
        """The approval as it is now (NotFound for an unknown id)."""
        return approval_of(self._call("GetApproval", pb.GetApprovalRequest(approval_id=approval_id)))

    def wait_for_decision(self, approval_id: str, timeout: float = 60.0) -> Approval:
        """One long-poll: the approval as soon as it is not pending, or still pending after
        ``timeout`` seconds (capped by the server's maximum wait)."""
        request, call_timeout = _common.wait_request(approval_id, timeout)
        return approval_of(self._call("WaitForDecision", request, call_timeout))

    def request_and_wait(
        self,
        request: ApprovalRequest | None = None,
        /,
        *,
        deadline: float | None = None,
        **fields: Any,
    ) -> Approval:
        """Requests an approval and waits until it is resolved or the deadline passes.

        ``deadline``: seconds; None waits until the approval's own expiry. Returns the approval
        as last reported: resolved, or still PENDING at the deadline. Only ``approved`` means go
        ahead. Survives server restarts and broken connections: the request is resent with the
        same idempotency key (so the server never creates a second approval) and the wait
        re-attaches by id, with backoff, until the deadline. When the server stays unreachable
        past the deadline the last error is raised. Nothing turns an error into an approval.
        """
        message = _common.as_request(request, fields).to_proto()
        started = time.monotonic()
        backoff = Backoff(_common.RETRY_MAX_BACKOFF)
        while True:
            try:
                approval = approval_of(self._call("RequestApproval", message).approval)
                break
            except CountersignError as error:
                # Without a deadline, keep trying for the longest an approval could stay open.
                limit = started + (deadline if deadline is not None else message.ttl_seconds or 3600)
                if isinstance(error, RateLimited) and time.monotonic() + error.retry_after < limit:
                    # The server said when the call fits: wait for it rather than fail.
                    log.warning("rate limited (%s); retrying in %.1f s", error.message, error.retry_after)
                    time.sleep(error.retry_after)
                    continue
                if not error.transient or time.monotonic() >= limit:
                    raise
                backoff.log_retry("requesting approval failed (%s); retrying", error)
                time.sleep(backoff.pause_until(limit))
        log.debug("approval %s requested: %s", approval.id, approval.state.value)
        if approval.pending:
            if deadline is not None:
                deadline -= time.monotonic() - started
            approval = self._wait_resolved(approval.id, _common.wait_deadline(deadline, approval.expires_at))
        if approval.approved:
            self.verify_receipt(approval, message.arguments_json)
        return approval

    def signing_keys(self) -> tuple[str, str]:
        """The server's receipt keys: (JWKS document, fingerprint)."""
        keys = self._call("GetSigningKeys", pb.GetSigningKeysRequest())
        return keys.jwks_json, keys.fingerprint

    def verify_receipt(self, approval: Approval, arguments_json: str) -> dict[str, Any]:
        """Checks the approval's decision receipt before its call runs: signed by the pinned key
        set (``receipt_pin``), for this approval, approving ``arguments_json`` (the arguments
        requested; an approver's edit when there is one), not expired. Returns its claims;
        raises ReceiptError naming what did not match."""
        if self._keys is None or self._unknown_key(approval):
            self._keys = receipts.KeySet.from_jwks(self.signing_keys()[0], self._receipt_pin)
        return self._check_receipt(approval, arguments_json)

    def wait_until_resolved(self, approval_id: str, *, deadline: float | None = None) -> Approval:
        """Waits until an existing approval is resolved or the deadline passes (None: its
        expiry), with the same retries and answer as request_and_wait."""
        expires_at = self.get(approval_id).expires_at if deadline is None else None
        return self._wait_resolved(approval_id, _common.wait_deadline(deadline, expires_at))

    def _wait_resolved(self, approval_id: str, deadline_at: float) -> Approval:
        backoff = Backoff(_common.RETRY_MAX_BACKOFF)
        while True:
            started = time.monotonic()
            remaining = max(0.0, deadline_at - started)
            try:
                approval = self.wait_for_decision(approval_id, remaining)
            except CountersignError as error:
                if not error.transient or time.monotonic() >= deadline_at:
                    raise
                backoff.log_retry("waiting for approval %s failed (%s); re-attaching", approval_id, error)
                time.sleep(backoff.pause_until(deadline_at))
                continue
            if not approval.pending or time.monotonic() >= deadline_at:
                return approval
            if time.monotonic() - started < min(remaining, _common.EARLY_RETURN):
                time.sleep(backoff.pause_until(deadline_at))
            else:
                backoff.reset()

    def list(
        self,
        *,
        states: Iterable[State | str] = (),
        agent_id: str = "",
        channel: str = "",
        session_id: str = "",
        tool_name: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> ApprovalPage:
        """One page of approvals, newest first, filtered."""
        request = _common.list_request(
            states, agent_id, channel, session_id, tool_name, page_size, page_token
        )
        response = self._call("ListApprovals", request)
        return ApprovalPage([approval_of(a) for a in response.approvals], response.next_page_token)

    def cancel(self, approval_id: str, reason: str = "") -> Approval:
        """Withdraws a pending approval; it resolves as CANCELLED."""
        request = pb.CancelApprovalRequest(approval_id=approval_id, reason=reason)
        return approval_of(self._call("CancelApproval", request))

    def consume(
        self, approval_id: str, *, succeeded: bool = True, detail: str = "", args_digest: str = ""
    ) -> Approval:
        """Marks an approved call as executed, once (a second consume is FailedPrecondition).
        ``args_digest`` names the version that ran (``Approval.current_args_digest``); the
        server refuses one that is not the approved version, and consumes nothing."""
        request = _common.consume_request(approval_id, succeeded, detail, args_digest)
        return approval_of(self._call("Consume", request))

    def decide(
        self,
        approval_id: str,
        verdict: Verdict | str,
        *,
        decider: Decider,
        scope: Scope | str = Scope.ONCE,
        reason: str = "",
        idempotency_key: str = "",
        edited_arguments: Mapping[str, Any] | None = None,
        expected_args_digest: str = "",
    ) -> DecideResult:
        """Records an approve or reject decision (as a worker does). A decision on an approval
        that is no longer pending raises AlreadyResolved naming who or what won."""
        request = _common.decide_request(
            approval_id,
            verdict,
            decider,
            scope,
            reason,
            idempotency_key,
            edited_arguments,
            expected_args_digest,
        )
        return _common.decide_result(self._call("Decide", request))

    def watch(
        self,
        *,
        after_seq: int = 0,
        history_id: str = "",
        include_snapshot: bool = True,
        channel: str = "",
        heartbeat_timeout: float = 30.0,
        max_backoff: float = 10.0,
    ) -> Watch:
        """An iterator of Snapshot and Event items that resumes after its last seq across
        disconnects and server restarts; see Watch."""
        cursor = WatchCursor(channel, after_seq, history_id, include_snapshot, max_backoff)
        return Watch(self, cursor, heartbeat_timeout)


class Watch:
    """Iterates a watch: an optional Snapshot of the pending approvals, then every Event once and
    in seq order.

    After a broken connection, an ended stream, a slow-consumer cut-off (RESOURCE_EXHAUSTED) or a
    stream silent beyond ``heartbeat_timeout`` it reconnects with backoff and resumes after the
    last seq it delivered. When the server cannot resume from there (OUT_OF_RANGE), or there is
    no cursor yet, it takes a new snapshot and yields it. Raises only what retrying cannot fix
    (Unauthenticated, PermissionDenied, InvalidArgument). ``close()`` ends it from any thread.
    """

    def __init__(self, client: Client, cursor: WatchCursor, heartbeat_timeout: float) -> None:
        self._client = client
        self._state = cursor
        self._heartbeat_timeout = heartbeat_timeout
        self._call: Any = None
        self._retry_at = 0.0
        #: When the reader started waiting for the current message; None when not waiting.
        self._waiting_since: float | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        # Opened now, so that a watch "from now on" sees what happens after this call.
        self._open()

    @property
    def cursor(self) -> int | None:
        """The seq the watch would resume after."""
        return self._state.cursor

    @property
    def history_id(self) -> str:
        """The history id of the event log ``cursor`` belongs to: store it with the seq."""
        return self._state.history_id

    @property
    def reconnects(self) -> int:
        return self._state.reconnects

    def __iter__(self) -> Iterator[Snapshot | Event]:
        return self

    def __next__(self) -> Snapshot | Event:
        while not self._closed.is_set():
            if self._call is None:
                self._open()
                continue
            self._waiting_since = time.monotonic()
            try:
                message = next(self._call)
            except StopIteration:
                self._drop_call()
                self._retry_at = time.monotonic() + self._state.ended()
                continue
            except grpc.RpcError as error:
                if self._closed.is_set():
                    break
                # Dropped first: after a fatal error (raised by failed) the next iteration
                # reconnects.
                self._drop_call()
                self._retry_at = time.monotonic() + self._state.failed(from_rpc_error(error))
                continue
            finally:
                self._waiting_since = None
            item = self._state.accept(message)
            if item is not None:
                return item
        raise StopIteration

    def _open(self) -> None:
        self._closed.wait(max(0.0, self._retry_at - time.monotonic()))
        # A fresh channel each time: the old connection may be dead without knowing it.
        channel = self._client._open_channel()
        stub = pb_grpc.ApprovalServiceStub(channel)
        call = stub.WatchApprovals(self._state.request(), metadata=self._client._connection.metadata)
        with self._lock:
            self._call, self._channel = call, channel
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch_silence, name="countersign-watchdog", daemon=True
            )
            self._watchdog.start()

    def _drop_call(self) -> None:
        with self._lock:
            call, self._call = self._call, None
            channel = self._channel
        if call is not None:
            call.cancel()
            channel.close()

    def _watch_silence(self) -> None:
        """Cancels a stream that delivered nothing, not even a heartbeat, for too long."""
        while not self._closed.wait(min(1.0, self._heartbeat_timeout / 4)):
            with self._lock:
                waiting_since = self._waiting_since
                silent = (
                    waiting_since is not None and time.monotonic() - waiting_since > self._heartbeat_timeout
                )
                if silent and self._call is not None:
                    log.warning("watch silent for %.1f s; reconnecting", self._heartbeat_timeout)
                    self._call.cancel()

    def close(self) -> None:
        self._closed.set()
        self._drop_call()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
