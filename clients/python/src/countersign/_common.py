"""What the sync and asyncio clients share: connection settings, retry pacing, the watch cursor."""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc

from countersign import receipts
from countersign.errors import AlreadyResolved, ConfigError, CountersignError, OutOfRange, RpcError
from countersign.model import (
    Approval,
    ApprovalRequest,
    DecideOutcome,
    Decider,
    DecideResult,
    Event,
    Scope,
    Snapshot,
    State,
    Verdict,
    approval_of,
    event_of,
)
from countersign.v1 import approval_pb2 as pb
from countersign.v1 import approval_pb2_grpc as pb_grpc

log = logging.getLogger("countersign")

#: How long a long-poll may exceed the wait it asked for before the client gives up on the
#: connection: covers the round trip and a busy server.
WAIT_GRACE = 5.0
#: The longest pause between retries of request_and_wait.
RETRY_MAX_BACKOFF = 2.0
#: A long-poll answered "still pending" sooner than this (and sooner than asked) was cut
#: short, e.g. by a server shutting down; the next one waits a backoff delay so as not to spin.
EARLY_RETURN = 1.0
#: With no deadline of its own, request_and_wait waits until the approval's expiry plus this
#: (the server's sweeper marks it EXPIRED within its sweep interval).
EXPIRY_GRACE = 10.0
#: Status codes retrying cannot fix on a watch.
WATCH_FATAL = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


@dataclass(frozen=True)
class Connection:
    """Where and how to connect; see ``Client`` for the parameters."""

    target: str
    tls: bool
    root_certificates: bytes | None
    metadata: tuple[tuple[str, str], ...]
    timeout: float

    @classmethod
    def of(
        cls,
        address: str,
        token: str | None,
        ca_file: str | os.PathLike[str] | None,
        tls: bool | None,
        timeout: float,
    ) -> Connection:
        scheme, sep, rest = address.partition("://")
        if sep:
            if scheme not in ("http", "https"):
                raise ConfigError(f"server address {address!r} must be host:port, http:// or https://")
            if tls is not None and tls != (scheme == "https"):
                raise ConfigError(f"tls={tls} contradicts the address {address!r}")
            tls = scheme == "https"
            address = rest.rstrip("/")
        if not address or ":" not in address:
            raise ConfigError(f"server address {address!r} must name a host and a port")
        root_certificates = None
        if ca_file is not None:
            if tls is False:
                # Refuse rather than silently talk plaintext to a server meant to be verified.
                raise ConfigError("a CA file is configured but TLS is off; use https:// or tls=True")
            tls = True
            try:
                root_certificates = Path(ca_file).read_bytes()
            except OSError as error:
                raise ConfigError(f"CA file {ca_file}: {error}") from None
            if b"-----BEGIN CERTIFICATE-----" not in root_certificates:
                raise ConfigError(f"CA file {ca_file} holds no PEM certificate")
        metadata: tuple[tuple[str, str], ...] = ()
        if token is not None:
            if not token or any(c in token for c in "\r\n\0"):
                raise ConfigError("the token is empty or contains characters not allowed in a header")
            metadata = (("authorization", f"Bearer {token}"),)
        if timeout <= 0:
            raise ConfigError(f"timeout must be positive, not {timeout}")
        return cls(address, bool(tls), root_certificates, metadata, timeout)

    @classmethod
    def from_env(cls) -> dict[str, str | None]:
        """Client keyword arguments from COUNTERSIGN_ADDRESS, COUNTERSIGN_TOKEN and
        COUNTERSIGN_CA_FILE, or the ``countersign`` CLI's COUNTERSIGN_SERVER and
        COUNTERSIGN_CA_CERT, so that one environment serves both."""
        env = os.environ
        return {
            "address": env.get("COUNTERSIGN_ADDRESS") or env.get("COUNTERSIGN_SERVER") or "127.0.0.1:50051",
            "token": env.get("COUNTERSIGN_TOKEN") or None,
            "ca_file": env.get("COUNTERSIGN_CA_FILE") or env.get("COUNTERSIGN_CA_CERT") or None,
        }

    def open(self, api: Any) -> Any:
        """A new channel from ``api``: the ``grpc`` module, or ``grpc.aio``."""
        if not self.tls:
            return api.insecure_channel(self.target, options=self.options())
        credentials = grpc.ssl_channel_credentials(root_certificates=self.root_certificates)
        return api.secure_channel(self.target, credentials, options=self.options())

    @staticmethod
    def options() -> list[tuple[str, int]]:
        return [
            # Reconnect quickly after a server restart (grpc's default backoff grows to 2 min);
            # request_and_wait and watch pace their own retries.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
            # Pings detect a dead connection under a long-poll that sends nothing for a while.
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
            # Each channel its own connections: grpc shares subchannels between channels by
            # default, so a new channel (a watch reconnecting) would inherit a dead
            # connection's backoff.
            ("grpc.use_local_subchannel_pool", 1),
        ]


class Backoff:
    """Exponential backoff with jitter: each delay is drawn from [d/2, d] where d doubles after
    every failure up to ``maximum``."""

    INITIAL = 0.1

    def __init__(self, maximum: float) -> None:
        self.maximum = max(maximum, 0.001)
        self.reset()

    #: While failures go on, how often (seconds) a retry is logged again as a warning.
    WARN_EVERY = 30.0

    def reset(self) -> None:
        self.current = min(self.INITIAL, self.maximum)
        self.attempts = 0
        self.failing_since = 0.0
        self.warned_at = 0.0

    def next_delay(self) -> float:
        ceiling = self.current
        self.current = min(self.current * 2, self.maximum)
        self.attempts += 1
        return random.uniform(ceiling / 2, ceiling)

    def pause_until(self, deadline: float) -> float:
        """The next delay, shortened so that it ends by ``deadline`` (a monotonic time)."""
        return max(0.0, min(self.next_delay(), deadline - time.monotonic()))

    def log_retry(self, message: str, *args: object) -> None:
        """A warning for the first failure since the last success, and again every
        ``WARN_EVERY`` seconds while failures go on (saying how many, for how long), so that a
        caller held up by a server that is down hears it; debug in between."""
        now = time.monotonic()
        if self.attempts == 0:
            self.failing_since = self.warned_at = now
            log.warning(message, *args)
        elif now - self.warned_at >= self.WARN_EVERY:
            self.warned_at = now
            log.warning(
                message + "; still failing after %d attempts in %.0f s",
                *args,
                self.attempts + 1,
                now - self.failing_since,
            )
        else:
            log.debug(message, *args)


def wait_deadline(deadline: float | None, expires_at: datetime | None) -> float:
    """The monotonic time request_and_wait gives up at: ``deadline`` seconds from now, or by
    default the approval's own expiry (plus the sweeper's grace)."""
    if deadline is not None:
        return time.monotonic() + deadline
    if expires_at is None:
        raise CountersignError("the approval carries no expiry; pass deadline=")
    remaining = (expires_at - datetime.now(timezone.utc)).total_seconds()
    return time.monotonic() + max(remaining, 0.0) + EXPIRY_GRACE


def wait_request(approval_id: str, remaining: float) -> tuple[pb.WaitForDecisionRequest, float]:
    """A long-poll of at most ``remaining`` seconds, and the call's own timeout."""
    # 0 would mean "the server's maximum"; the shortest wait that still means "at most
    # remaining" is 1 ms.
    timeout_ms = max(1, min(int(remaining * 1000), 2**32 - 1))
    return pb.WaitForDecisionRequest(approval_id=approval_id, timeout_ms=timeout_ms), (
        timeout_ms / 1000 + WAIT_GRACE
    )


class WatchCursor:
    """The state of a resumable watch, shared by the sync and asyncio iterators: which request
    to open next, which messages become items, which errors end the watch."""

    def __init__(
        self, channel: str, after_seq: int, history_id: str, include_snapshot: bool, max_backoff: float
    ) -> None:
        self.channel = channel
        #: The seq of the last delivered event (or snapshot head, or heartbeat); None when
        #: the watch cannot resume without a gap.
        self.cursor: int | None = after_seq or None
        #: The history id of the event log the cursor belongs to. The server answers a cursor
        #: of another history (the log was restored since) like one ahead of the log, and the
        #: watch re-lists; empty: not checked.
        self.history_id = history_id
        self.first = (after_seq, include_snapshot)
        self.snapshot: list[Approval] = []
        self.backoff = Backoff(max_backoff)
        #: Streams opened after the first one.
        self.reconnects = 0

    def request(self) -> pb.WatchApprovalsRequest:
        if self.first is not None:
            after_seq, include_snapshot = self.first
            self.first = None
        else:
            self.reconnects += 1
            # after_seq 0 means "from now on", not "from the beginning": without a cursor the
            # watch cannot resume without a gap, so it takes a snapshot instead.
            after_seq = self.cursor or 0
            include_snapshot = not after_seq
        self.snapshot = []
        log.debug(
            "opening watch channel=%r after_seq=%d snapshot=%s", self.channel, after_seq, include_snapshot
        )
        return pb.WatchApprovalsRequest(
            after_seq=after_seq,
            channel=self.channel,
            include_snapshot=include_snapshot,
            history_id=self.history_id if after_seq else "",
        )

    def accept(self, message: pb.ApprovalEvent) -> Snapshot | Event | None:
        """Turns one message into at most one item, advancing the cursor."""
        self.backoff.reset()
        # Resumed without a history id (not checked): the stream's is the one to resume with.
        if not self.history_id:
            self.history_id = message.history_id
        kind = message.kind
        if kind == pb.EVENT_KIND_SNAPSHOT:
            self.snapshot.append(approval_of(message.approval))
            return None
        if kind == pb.EVENT_KIND_SNAPSHOT_COMPLETE:
            self.cursor = message.seq
            self.history_id = message.history_id
            snapshot, self.snapshot = Snapshot(self.snapshot, message.seq, message.history_id), []
            return snapshot
        if kind == pb.EVENT_KIND_HEARTBEAT:
            # The server has examined everything up to this seq for this stream: a safe
            # cursor even when none of it was for our channel.
            self.cursor = max(self.cursor or 0, message.seq) or None
            return None
        if self.cursor is not None and message.seq <= self.cursor:
            log.debug("skipping seq %d, already delivered (cursor %d)", message.seq, self.cursor)
            return None
        self.cursor = message.seq
        return event_of(message)

    def failed(self, error: CountersignError) -> float:
        """Handles an error from opening or reading the stream: raises the fatal ones, returns
        the pause before reconnecting for the rest."""
        if isinstance(error, RpcError) and error.code in WATCH_FATAL:
            raise error
        if isinstance(error, OutOfRange):
            log.warning(
                "watch cursor %s out of range (%s); taking a new snapshot", self.cursor, error.message
            )
            self.cursor = None
        elif error.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            log.warning("watch cut off as a slow consumer after seq %s; resuming", self.cursor)
        else:
            self.backoff.log_retry("watch failed (%s); reconnecting after seq %s", error, self.cursor)
        return self.backoff.next_delay()

    def ended(self) -> float:
        log.info("watch stream ended; reconnecting after seq %s", self.cursor)
        return self.backoff.next_delay()


#: How much of a call's arguments an action line quotes (as the hooks' action lines do).
MAX_QUOTED_CHARS = 300


def describe_call(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The one-line action an approver reads on a phone for a call of ``tool_name``: the tool
    and its arguments as compact JSON, cut to ``MAX_QUOTED_CHARS`` (the hooks' line for a tool
    they know no better line for, e.g. ``send_email {"to":"a@b","subject":"Hi"}``)."""
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), sort_keys=False, default=str)
    if len(text) > MAX_QUOTED_CHARS:
        text = text[: MAX_QUOTED_CHARS - 1] + "…"
    return f"{tool_name} {text}"


def rejection_text(approval: Approval) -> str:
    """What a model is told when its tool call may not run: the outcome and the reason."""
    return f"Tool call not approved ({approval.outcome}). Do not retry it unless the user asks."


def list_request(
    states: Iterable[State | str],
    agent_id: str,
    channel: str,
    session_id: str,
    tool_name: str,
    page_size: int,
    page_token: str,
) -> pb.ListApprovalsRequest:
    return pb.ListApprovalsRequest(
        states=[State.parse(s).number for s in states],
        agent_id=agent_id,
        channel=channel,
        session_id=session_id,
        tool_name=tool_name,
        page_size=page_size,
        page_token=page_token,
    )


def consume_request(
    approval_id: str, succeeded: bool, detail: str, args_digest: str = ""
) -> pb.ConsumeRequest:
    outcome = pb.CONSUME_OUTCOME_SUCCEEDED if succeeded else pb.CONSUME_OUTCOME_FAILED
    return pb.ConsumeRequest(approval_id=approval_id, outcome=outcome, detail=detail, args_digest=args_digest)


def decide_request(
    approval_id: str,
    verdict: Verdict | str,
    decider: Decider,
    scope: Scope | str,
    reason: str,
    idempotency_key: str,
    edited_arguments: Mapping[str, Any] | None = None,
    expected_args_digest: str = "",
) -> pb.DecideRequest:
    return pb.DecideRequest(
        approval_id=approval_id,
        verdict=Verdict.parse(verdict).number,
        scope=Scope.parse(scope).number,
        reason=reason,
        decider=pb.Decider(
            channel=decider.channel, user_id=decider.user_id, display_name=decider.display_name
        ),
        # The platform's id for this action makes a repeat DUPLICATE; without one, each call
        # is a new action.
        idempotency_key=idempotency_key or str(uuid.uuid4()),
        edited_arguments_json=json.dumps(dict(edited_arguments)) if edited_arguments is not None else "",
        expected_args_digest=expected_args_digest,
    )


def decide_result(response: pb.DecideResponse) -> DecideResult:
    """The outcome of a decision; one that came too late raises AlreadyResolved."""
    approval = approval_of(response.approval)
    outcome = DecideOutcome.of(response.outcome)
    if outcome is DecideOutcome.ALREADY_RESOLVED:
        raise AlreadyResolved(approval)
    return DecideResult(outcome, approval)


def as_request(request: ApprovalRequest | None, fields: dict[str, Any]) -> ApprovalRequest:
    if request is not None and fields:
        raise TypeError("pass an ApprovalRequest or keyword fields, not both")
    return request if request is not None else ApprovalRequest(**fields)


class ClientBase:
    """Construction shared by Client and AsyncClient; ``_grpc`` is ``grpc`` or ``grpc.aio``."""

    _grpc: Any

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        tls: bool | None = None,
        timeout: float = 10.0,
        receipt_pin: str | None = None,
    ) -> None:
        self._connection = Connection.of(address, token, ca_file, tls, timeout)
        self._channel = self._open_channel()
        self._stub = pb_grpc.ApprovalServiceStub(self._channel)
        #: Receipts must chain to the key set with this fingerprint (None: the set the server
        #: serves).
        self._receipt_pin = receipt_pin or None
        self._keys: receipts.KeySet | None = None

    def _check_receipt(self, approval: Approval, requested_json: str) -> dict[str, Any]:
        """The receipt's claims; raises ReceiptError unless the approval's receipt verifies with
        the key set read (self._keys) for the arguments that run: the edited ones, else those
        requested."""
        assert self._keys is not None
        digest = (
            receipts.args_digest(approval.edited_arguments or {})
            if approval.edited
            else receipts.args_digest(requested_json)
        )
        return receipts.verify_receipt(
            approval.receipt, self._keys, approval_id=approval.id, args_digest=digest
        )

    def _unknown_key(self, approval: Approval) -> bool:
        """Whether the receipt names a key the set read before does not have (a rotation)."""
        return self._keys is not None and self._keys.get(receipts.header_kid(approval.receipt)) is None

    @classmethod
    def from_env(cls, **overrides: Any) -> Any:
        """A client for COUNTERSIGN_ADDRESS or COUNTERSIGN_SERVER (default 127.0.0.1:50051) with
        COUNTERSIGN_TOKEN and COUNTERSIGN_CA_FILE or COUNTERSIGN_CA_CERT when set."""
        return cls(**{**Connection.from_env(), **overrides})

    def _open_channel(self) -> Any:
        return self._connection.open(self._grpc)
