"""Plain dataclasses for what the server returns, and the request an agent sends."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from countersign.v1 import approval_pb2 as pb


class _WireEnum(str, Enum):
    """A str enum whose values are the proto enum names without their prefix, lower case."""

    @classmethod
    def _wire(cls) -> tuple[Any, str]:
        """The proto enum and the prefix of its value names."""
        return _WIRE_ENUMS[cls.__name__]

    @classmethod
    def of(cls, value: int) -> Any:
        """The member for a proto enum number; None for UNSPECIFIED."""
        wire, prefix = cls._wire()
        name = wire.Name(value).removeprefix(prefix)
        return None if name == "UNSPECIFIED" else cls(name.lower())

    @property
    def number(self) -> int:
        wire, prefix = self._wire()
        return wire.Value(prefix + self.value.upper())

    @classmethod
    def parse(cls, value: _WireEnum | str) -> _WireEnum:
        """A member from itself or its name ("high", "HIGH"); ValueError names the choices."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(member.value for member in cls)
            raise ValueError(f"{cls.__name__.lower()} {value!r} is not one of: {choices}") from None


class Risk(_WireEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


class State(_WireEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    CONSUMED = "consumed"


class Scope(_WireEnum):
    ONCE = "once"
    SESSION = "session"


class Verdict(_WireEnum):
    APPROVE = "approve"
    REJECT = "reject"


class ResolvedBy(_WireEnum):
    DECISION = "decision"
    RULE = "rule"
    GRANT = "grant"
    EXPIRY = "expiry"
    CANCELLATION = "cancellation"


class EventKind(_WireEnum):
    SNAPSHOT = "snapshot"
    SNAPSHOT_COMPLETE = "snapshot_complete"
    REQUESTED = "requested"
    DECISION_RECORDED = "decision_recorded"
    RESOLVED = "resolved"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    CONSUMED = "consumed"
    DELIVERED = "delivered"
    HEARTBEAT = "heartbeat"
    DECISION_REFUSED = "decision_refused"
    GRANT_REVOKED = "grant_revoked"
    #: An operator accepted a rule suggested from this and earlier approvals.
    RULE_ACCEPTED = "rule_accepted"
    #: Nobody decided within the reminder time; the channels reminded the deciders.
    REMINDED = "reminded"
    #: The approval went to its escalation group.
    ESCALATED = "escalated"


class DecideOutcome(_WireEnum):
    RECORDED = "recorded"
    RESOLVED = "resolved"
    ALREADY_RESOLVED = "already_resolved"
    DUPLICATE = "duplicate"


_WIRE_ENUMS: dict[str, tuple[Any, str]] = {
    "Risk": (pb.Risk, "RISK_"),
    "State": (pb.ApprovalState, "APPROVAL_STATE_"),
    "Scope": (pb.Scope, "SCOPE_"),
    "Verdict": (pb.Verdict, "VERDICT_"),
    "ResolvedBy": (pb.ResolvedBy, "RESOLVED_BY_"),
    "EventKind": (pb.EventKind, "EVENT_KIND_"),
    "DecideOutcome": (pb.DecideOutcome, "DECIDE_OUTCOME_"),
}


@dataclass(frozen=True)
class Decider:
    """Who decided: a platform identity."""

    channel: str
    user_id: str
    display_name: str = ""

    def __str__(self) -> str:
        return f"{self.display_name or self.user_id} via {self.channel}"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict | None
    scope: Scope
    reason: str
    decider: Decider | None
    decided_at: datetime | None
    #: The version of the arguments decided on (their digest).
    args_digest: str = ""
    #: Set when this decision edited the arguments (edit-on-approve).
    edited_arguments: dict[str, Any] | None = None
    #: This edit replaced a version that had approvals: the quorum count restarted.
    restarts_count: bool = False


@dataclass(frozen=True)
class Consumption:
    """How an approved call went, as its runtime reported with ``consume``."""

    succeeded: bool
    detail: str
    consumed_at: datetime | None
    #: The runtime handed the call to its host (a coding agent's hook): its outcome is unknown.
    handed_off: bool = False


@dataclass(frozen=True)
class Approval:
    """An approval as the server reported it. Only ``approved`` means go ahead."""

    id: str
    state: State
    agent_id: str
    session_id: str
    requester: str
    idempotency_key: str
    tool_name: str
    #: The arguments as a dict (None when redacted from storage).
    arguments: dict[str, Any] | None
    args_digest: str
    action: str
    #: Why the agent asked.
    request_reason: str
    risk: Risk | None
    required_approvals: int
    labels: dict[str, str]
    decisions: list[Decision]
    #: What ended the pending state (None while pending).
    resolved_by: ResolvedBy | None
    #: The people whose decisions resolved it.
    deciders: list[Decider]
    #: The resolution's reason: the approver's words, or the rule's.
    reason: str
    #: The policy rule that resolved it (allow / deny), or None.
    rule: str | None
    #: The session grant that approved it, or None.
    grant_id: str | None
    #: The policy rule that matched the request ("" when a human decides).
    policy_rule: str
    created_at: datetime | None
    expires_at: datetime | None
    resolved_at: datetime | None
    #: Set once the call was consumed.
    consumption: Consumption | None = None
    #: The arguments as an approver edited them (edit-on-approve): run these instead of
    #: ``arguments``. None when not edited (or when redacted from storage).
    edited_arguments: dict[str, Any] | None = None
    #: Digest of the edited arguments; "" when not edited.
    edited_args_digest: str = ""
    #: Who made the current edit, and when.
    editor: Decider | None = None
    edited_at: datetime | None = None
    #: The decision receipt the server signed once a verdict resolved it (a compact JWS);
    #: request_and_wait returns an approval only when it verifies (countersign.receipts).
    receipt: str = ""

    @property
    def edited(self) -> bool:
        """True when an approver edited the arguments."""
        return bool(self.edited_args_digest)

    @property
    def current_args_digest(self) -> str:
        """The digest of the version to run (the edited one when edited): what ``consume``
        reports as run."""
        return self.edited_args_digest if self.edited else self.args_digest

    @property
    def arguments_to_run(self) -> dict[str, Any] | None:
        """The arguments the call must run with: the edited ones when edited (None when they
        are not available, being redacted: then nothing may run)."""
        return self.edited_arguments if self.edited else self.arguments

    @property
    def approved(self) -> bool:
        """True only for state APPROVED: the call may run now."""
        return self.state is State.APPROVED

    @property
    def pending(self) -> bool:
        return self.state is State.PENDING

    @property
    def scope(self) -> Scope | None:
        """SESSION when an approving decision granted later calls of the same tool in the same
        session; ONCE for any other approval; None when not approved."""
        if self.state not in (State.APPROVED, State.CONSUMED):
            return None
        approving = [d for d in self.decisions if d.verdict is Verdict.APPROVE]
        if any(d.scope is Scope.SESSION for d in approving):
            return Scope.SESSION
        return Scope.ONCE

    @property
    def outcome(self) -> str:
        """One line for people and models: the state, who or what decided, and why."""
        text = self.state.value
        if self.resolved_by is ResolvedBy.DECISION and self.deciders:
            text += " by " + ", ".join(str(d) for d in self.deciders)
        elif self.resolved_by is ResolvedBy.RULE and self.rule:
            text += f" by policy rule {self.rule}"
        elif self.resolved_by is ResolvedBy.GRANT and self.grant_id:
            text += f" by session grant {self.grant_id}"
        if self.reason:
            text += f": {self.reason}"
        return text


@dataclass(frozen=True)
class RequestResult:
    approval: Approval
    #: False when this was an idempotent repeat of an earlier request.
    created: bool


@dataclass(frozen=True)
class DecideResult:
    outcome: DecideOutcome
    approval: Approval


@dataclass(frozen=True)
class ApprovalPage:
    approvals: list[Approval]
    #: Pass to ``list(page_token=...)`` for the next page; "" on the last page.
    next_page_token: str


@dataclass(frozen=True)
class Event:
    """One event of a watch, each seq delivered once and in order."""

    seq: int
    kind: EventKind
    approval: Approval | None
    decision: Decision | None
    at: datetime | None
    #: What happened, for people (reminders, escalations, refused decisions).
    detail: str = ""
    #: The history id of the event log ``seq`` belongs to: store it with the seq, and resume
    #: with both (``watch(after_seq=..., history_id=...)``). A restore of the server's
    #: database begins a new history, whose seqs name other events.
    history_id: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Every pending approval (first item of a snapshot watch, and again after a resync);
    ``head_seq`` is the seq the watch continues after."""

    approvals: list[Approval]
    head_seq: int
    #: The history id of the event log ``head_seq`` belongs to (see ``Event.history_id``).
    history_id: str = ""


@dataclass
class ApprovalRequest:
    """What an agent asks for. ``idempotency_key`` makes retries safe: the runtime's tool-call
    id is the natural choice; one is generated when empty."""

    agent_id: str
    tool_name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    action: str = ""
    reason: str = ""
    risk: Risk | str = Risk.MEDIUM
    session_id: str = ""
    requester: str = ""
    idempotency_key: str = ""
    #: (channel, target) pairs, e.g. [("telegram", "-100123")]; empty: every channel.
    routes: Sequence[tuple[str, str]] = ()
    required_approvals: int = 0
    #: Seconds (or a timedelta) the approval stays open; None: the server's default.
    ttl: float | timedelta | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_proto(self) -> pb.RequestApprovalRequest:
        ttl = self.ttl.total_seconds() if isinstance(self.ttl, timedelta) else self.ttl
        if ttl is not None and ttl < 1:
            raise ValueError(f"ttl must be at least 1 second, not {ttl}")
        return pb.RequestApprovalRequest(
            agent_id=self.agent_id,
            session_id=self.session_id,
            requester=self.requester,
            idempotency_key=self.idempotency_key or str(uuid.uuid4()),
            tool_name=self.tool_name,
            # default=repr: what the approver sees must not fail on an odd value.
            arguments_json=json.dumps(dict(self.arguments), default=repr, sort_keys=True),
            action=self.action,
            reason=self.reason,
            risk=Risk.parse(self.risk).number,
            routes=[pb.Route(channel=c, target=t) for c, t in self.routes],
            required_approvals=self.required_approvals,
            ttl_seconds=int(ttl) if ttl is not None else 0,
            labels=dict(self.labels),
        )


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    return getattr(message, name).ToDatetime(tzinfo=timezone.utc)


def _decider(message: pb.Decider) -> Decider:
    return Decider(message.channel, message.user_id, message.display_name)


def _decision(message: pb.Decision) -> Decision:
    return Decision(
        verdict=Verdict.of(message.verdict),
        scope=Scope.of(message.scope) or Scope.ONCE,
        reason=message.reason,
        decider=_decider(message.decider) if message.HasField("decider") else None,
        decided_at=_time(message, "decided_at"),
        args_digest=message.args_digest,
        edited_arguments=_json_or_none(message.edited_arguments_json),
        restarts_count=message.restarts_count,
    )


def _json_or_none(text: str) -> Any:
    return json.loads(text) if text else None


def approval_of(message: pb.Approval) -> Approval:
    resolution = message.resolution
    arguments = _json_or_none(message.arguments_json)
    return Approval(
        id=message.id,
        state=State.of(message.state) or State.PENDING,
        agent_id=message.agent_id,
        session_id=message.session_id,
        requester=message.requester,
        idempotency_key=message.idempotency_key,
        tool_name=message.tool_name,
        arguments=arguments,
        args_digest=message.args_digest,
        action=message.action,
        request_reason=message.reason,
        risk=Risk.of(message.risk),
        required_approvals=message.required_approvals,
        labels=dict(message.labels),
        decisions=[_decision(d) for d in message.decisions],
        resolved_by=ResolvedBy.of(resolution.resolved_by),
        deciders=[_decider(d) for d in resolution.deciders],
        reason=resolution.reason,
        rule=resolution.rule or None,
        grant_id=resolution.grant_id or None,
        policy_rule=message.policy_rule,
        created_at=_time(message, "created_at"),
        expires_at=_time(message, "expires_at"),
        resolved_at=_time(message, "resolved_at"),
        consumption=Consumption(
            succeeded=message.consumption.outcome == pb.CONSUME_OUTCOME_SUCCEEDED,
            detail=message.consumption.detail,
            consumed_at=_time(message.consumption, "consumed_at"),
            handed_off=message.consumption.outcome == pb.CONSUME_OUTCOME_HANDED_OFF,
        )
        if message.HasField("consumption")
        else None,
        edited_arguments=_json_or_none(message.edited_arguments_json),
        edited_args_digest=message.edited_args_digest,
        editor=_decider(message.editor) if message.HasField("editor") else None,
        edited_at=_time(message, "edited_at"),
        receipt=message.receipt,
    )


def event_of(message: pb.ApprovalEvent) -> Event:
    return Event(
        seq=message.seq,
        kind=EventKind.of(message.kind) or EventKind.HEARTBEAT,
        approval=approval_of(message.approval) if message.HasField("approval") else None,
        decision=_decision(message.decision) if message.HasField("decision") else None,
        at=_time(message, "at"),
        detail=message.detail,
        history_id=message.history_id,
    )
