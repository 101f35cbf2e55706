import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Risk(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RISK_UNSPECIFIED: _ClassVar[Risk]
    RISK_LOW: _ClassVar[Risk]
    RISK_MEDIUM: _ClassVar[Risk]
    RISK_HIGH: _ClassVar[Risk]
    RISK_CRITICAL: _ClassVar[Risk]

class ApprovalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATE_UNSPECIFIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_PENDING: _ClassVar[ApprovalState]
    APPROVAL_STATE_APPROVED: _ClassVar[ApprovalState]
    APPROVAL_STATE_REJECTED: _ClassVar[ApprovalState]
    APPROVAL_STATE_EXPIRED: _ClassVar[ApprovalState]
    APPROVAL_STATE_CANCELLED: _ClassVar[ApprovalState]
    APPROVAL_STATE_CONSUMED: _ClassVar[ApprovalState]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_APPROVE: _ClassVar[Verdict]
    VERDICT_REJECT: _ClassVar[Verdict]

class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_UNSPECIFIED: _ClassVar[Scope]
    SCOPE_ONCE: _ClassVar[Scope]
    SCOPE_SESSION: _ClassVar[Scope]

class ResolvedBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOLVED_BY_UNSPECIFIED: _ClassVar[ResolvedBy]
    RESOLVED_BY_DECISION: _ClassVar[ResolvedBy]
    RESOLVED_BY_RULE: _ClassVar[ResolvedBy]
    RESOLVED_BY_GRANT: _ClassVar[ResolvedBy]
    RESOLVED_BY_EXPIRY: _ClassVar[ResolvedBy]
    RESOLVED_BY_CANCELLATION: _ClassVar[ResolvedBy]

class ConsumeOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSUME_OUTCOME_UNSPECIFIED: _ClassVar[ConsumeOutcome]
    CONSUME_OUTCOME_SUCCEEDED: _ClassVar[ConsumeOutcome]
    CONSUME_OUTCOME_FAILED: _ClassVar[ConsumeOutcome]
    CONSUME_OUTCOME_HANDED_OFF: _ClassVar[ConsumeOutcome]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_SNAPSHOT: _ClassVar[EventKind]
    EVENT_KIND_SNAPSHOT_COMPLETE: _ClassVar[EventKind]
    EVENT_KIND_REQUESTED: _ClassVar[EventKind]
    EVENT_KIND_DECISION_RECORDED: _ClassVar[EventKind]
    EVENT_KIND_RESOLVED: _ClassVar[EventKind]
    EVENT_KIND_EXPIRED: _ClassVar[EventKind]
    EVENT_KIND_CANCELLED: _ClassVar[EventKind]
    EVENT_KIND_CONSUMED: _ClassVar[EventKind]
    EVENT_KIND_DELIVERED: _ClassVar[EventKind]
    EVENT_KIND_HEARTBEAT: _ClassVar[EventKind]
    EVENT_KIND_DECISION_REFUSED: _ClassVar[EventKind]
    EVENT_KIND_GRANT_REVOKED: _ClassVar[EventKind]
    EVENT_KIND_RULE_ACCEPTED: _ClassVar[EventKind]
    EVENT_KIND_REMINDED: _ClassVar[EventKind]
    EVENT_KIND_ESCALATED: _ClassVar[EventKind]

class DecideOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECIDE_OUTCOME_UNSPECIFIED: _ClassVar[DecideOutcome]
    DECIDE_OUTCOME_RECORDED: _ClassVar[DecideOutcome]
    DECIDE_OUTCOME_RESOLVED: _ClassVar[DecideOutcome]
    DECIDE_OUTCOME_ALREADY_RESOLVED: _ClassVar[DecideOutcome]
    DECIDE_OUTCOME_DUPLICATE: _ClassVar[DecideOutcome]

class OnTimeout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_TIMEOUT_UNSPECIFIED: _ClassVar[OnTimeout]
    ON_TIMEOUT_REJECT: _ClassVar[OnTimeout]
    ON_TIMEOUT_ESCALATE: _ClassVar[OnTimeout]
RISK_UNSPECIFIED: Risk
RISK_LOW: Risk
RISK_MEDIUM: Risk
RISK_HIGH: Risk
RISK_CRITICAL: Risk
APPROVAL_STATE_UNSPECIFIED: ApprovalState
APPROVAL_STATE_PENDING: ApprovalState
APPROVAL_STATE_APPROVED: ApprovalState
APPROVAL_STATE_REJECTED: ApprovalState
APPROVAL_STATE_EXPIRED: ApprovalState
APPROVAL_STATE_CANCELLED: ApprovalState
APPROVAL_STATE_CONSUMED: ApprovalState
VERDICT_UNSPECIFIED: Verdict
VERDICT_APPROVE: Verdict
VERDICT_REJECT: Verdict
SCOPE_UNSPECIFIED: Scope
SCOPE_ONCE: Scope
SCOPE_SESSION: Scope
RESOLVED_BY_UNSPECIFIED: ResolvedBy
RESOLVED_BY_DECISION: ResolvedBy
RESOLVED_BY_RULE: ResolvedBy
RESOLVED_BY_GRANT: ResolvedBy
RESOLVED_BY_EXPIRY: ResolvedBy
RESOLVED_BY_CANCELLATION: ResolvedBy
CONSUME_OUTCOME_UNSPECIFIED: ConsumeOutcome
CONSUME_OUTCOME_SUCCEEDED: ConsumeOutcome
CONSUME_OUTCOME_FAILED: ConsumeOutcome
CONSUME_OUTCOME_HANDED_OFF: ConsumeOutcome
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_SNAPSHOT: EventKind
EVENT_KIND_SNAPSHOT_COMPLETE: EventKind
EVENT_KIND_REQUESTED: EventKind
EVENT_KIND_DECISION_RECORDED: EventKind
EVENT_KIND_RESOLVED: EventKind
EVENT_KIND_EXPIRED: EventKind
EVENT_KIND_CANCELLED: EventKind
EVENT_KIND_CONSUMED: EventKind
EVENT_KIND_DELIVERED: EventKind
EVENT_KIND_HEARTBEAT: EventKind
EVENT_KIND_DECISION_REFUSED: EventKind
EVENT_KIND_GRANT_REVOKED: EventKind
EVENT_KIND_RULE_ACCEPTED: EventKind
EVENT_KIND_REMINDED: EventKind
EVENT_KIND_ESCALATED: EventKind
DECIDE_OUTCOME_UNSPECIFIED: DecideOutcome
DECIDE_OUTCOME_RECORDED: DecideOutcome
DECIDE_OUTCOME_RESOLVED: DecideOutcome
DECIDE_OUTCOME_ALREADY_RESOLVED: DecideOutcome
DECIDE_OUTCOME_DUPLICATE: DecideOutcome
ON_TIMEOUT_UNSPECIFIED: OnTimeout
ON_TIMEOUT_REJECT: OnTimeout
ON_TIMEOUT_ESCALATE: OnTimeout

class Route(_message.Message):
    __slots__ = ("channel", "target")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    channel: str
    target: str
    def __init__(self, channel: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class Decider(_message.Message):
    __slots__ = ("channel", "user_id", "display_name")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    channel: str
    user_id: str
    display_name: str
    def __init__(self, channel: _Optional[str] = ..., user_id: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("verdict", "scope", "reason", "decider", "idempotency_key", "decided_at", "args_digest", "edited_arguments_json", "restarts_count", "approver", "delegate")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_COUNT_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    scope: Scope
    reason: str
    decider: Decider
    idempotency_key: str
    decided_at: _timestamp_pb2.Timestamp
    args_digest: str
    edited_arguments_json: str
    restarts_count: bool
    approver: str
    delegate: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., scope: _Optional[_Union[Scope, str]] = ..., reason: _Optional[str] = ..., decider: _Optional[_Union[Decider, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., args_digest: _Optional[str] = ..., edited_arguments_json: _Optional[str] = ..., restarts_count: _Optional[bool] = ..., approver: _Optional[str] = ..., delegate: _Optional[str] = ...) -> None: ...

class Resolution(_message.Message):
    __slots__ = ("verdict", "resolved_by", "deciders", "rule", "grant_id", "reason", "resolved_at", "args_digest")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDERS_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    resolved_by: ResolvedBy
    deciders: _containers.RepeatedCompositeFieldContainer[Decider]
    rule: str
    grant_id: str
    reason: str
    resolved_at: _timestamp_pb2.Timestamp
    args_digest: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., resolved_by: _Optional[_Union[ResolvedBy, str]] = ..., deciders: _Optional[_Iterable[_Union[Decider, _Mapping]]] = ..., rule: _Optional[str] = ..., grant_id: _Optional[str] = ..., reason: _Optional[str] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., args_digest: _Optional[str] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("channel", "target", "message_ref", "recorded_at")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_REF_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    channel: str
    target: str
    message_ref: str
    recorded_at: _timestamp_pb2.Timestamp
    def __init__(self, channel: _Optional[str] = ..., target: _Optional[str] = ..., message_ref: _Optional[str] = ..., recorded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Consumption(_message.Message):
    __slots__ = ("outcome", "detail", "consumed_at")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_AT_FIELD_NUMBER: _ClassVar[int]
    outcome: ConsumeOutcome
    detail: str
    consumed_at: _timestamp_pb2.Timestamp
    def __init__(self, outcome: _Optional[_Union[ConsumeOutcome, str]] = ..., detail: _Optional[str] = ..., consumed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "agent_id", "session_id", "requester", "idempotency_key", "tool_name", "arguments_json", "args_digest", "action", "reason", "risk", "routes", "required_approvals", "labels", "state", "decisions", "resolution", "deliveries", "created_at", "expires_at", "resolved_at", "consumption", "policy_rule", "edited_arguments_json", "edited_args_digest", "editor", "edited_at", "approver_groups", "follow_up", "withdraw_when_caller_leaves", "receipt", "step_up")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RISK_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    CONSUMPTION_FIELD_NUMBER: _ClassVar[int]
    POLICY_RULE_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    EDITOR_FIELD_NUMBER: _ClassVar[int]
    EDITED_AT_FIELD_NUMBER: _ClassVar[int]
    APPROVER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_WHEN_CALLER_LEAVES_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    STEP_UP_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_id: str
    session_id: str
    requester: str
    idempotency_key: str
    tool_name: str
    arguments_json: str
    args_digest: str
    action: str
    reason: str
    risk: Risk
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    required_approvals: int
    labels: _containers.ScalarMap[str, str]
    state: ApprovalState
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    resolution: Resolution
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    resolved_at: _timestamp_pb2.Timestamp
    consumption: Consumption
    policy_rule: str
    edited_arguments_json: str
    edited_args_digest: str
    editor: Decider
    edited_at: _timestamp_pb2.Timestamp
    approver_groups: _containers.RepeatedCompositeFieldContainer[GroupQuorum]
    follow_up: FollowUp
    withdraw_when_caller_leaves: bool
    receipt: str
    step_up: str
    def __init__(self, id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., requester: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., args_digest: _Optional[str] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., risk: _Optional[_Union[Risk, str]] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., required_approvals: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., resolution: _Optional[_Union[Resolution, _Mapping]] = ..., deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., consumption: _Optional[_Union[Consumption, _Mapping]] = ..., policy_rule: _Optional[str] = ..., edited_arguments_json: _Optional[str] = ..., edited_args_digest: _Optional[str] = ..., editor: _Optional[_Union[Decider, _Mapping]] = ..., edited_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., approver_groups: _Optional[_Iterable[_Union[GroupQuorum, _Mapping]]] = ..., follow_up: _Optional[_Union[FollowUp, _Mapping]] = ..., withdraw_when_caller_leaves: _Optional[bool] = ..., receipt: _Optional[str] = ..., step_up: _Optional[str] = ...) -> None: ...

class GetSigningKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SigningKeys(_message.Message):
    __slots__ = ("jwks_json", "fingerprint")
    JWKS_JSON_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    jwks_json: str
    fingerprint: str
    def __init__(self, jwks_json: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class RequestApprovalRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "requester", "idempotency_key", "tool_name", "arguments_json", "action", "reason", "risk", "routes", "required_approvals", "ttl_seconds", "labels", "approver_groups", "follow_up", "withdraw_when_caller_leaves")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RISK_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    APPROVER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_WHEN_CALLER_LEAVES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    requester: str
    idempotency_key: str
    tool_name: str
    arguments_json: str
    action: str
    reason: str
    risk: Risk
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    required_approvals: int
    ttl_seconds: int
    labels: _containers.ScalarMap[str, str]
    approver_groups: _containers.RepeatedCompositeFieldContainer[GroupQuorum]
    follow_up: FollowUp
    withdraw_when_caller_leaves: bool
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., requester: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., tool_name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., risk: _Optional[_Union[Risk, str]] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., required_approvals: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., approver_groups: _Optional[_Iterable[_Union[GroupQuorum, _Mapping]]] = ..., follow_up: _Optional[_Union[FollowUp, _Mapping]] = ..., withdraw_when_caller_leaves: _Optional[bool] = ...) -> None: ...

class RequestApprovalResponse(_message.Message):
    __slots__ = ("approval", "created")
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    created: bool
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class WaitForDecisionRequest(_message.Message):
    __slots__ = ("approval_id", "timeout_ms")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    timeout_ms: int
    def __init__(self, approval_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("states", "agent_id", "channel", "session_id", "tool_name", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[ApprovalState]
    agent_id: str
    channel: str
    session_id: str
    tool_name: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[ApprovalState, str]]] = ..., agent_id: _Optional[str] = ..., channel: _Optional[str] = ..., session_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("approval_id", "outcome", "detail", "args_digest")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    outcome: ConsumeOutcome
    detail: str
    args_digest: str
    def __init__(self, approval_id: _Optional[str] = ..., outcome: _Optional[_Union[ConsumeOutcome, str]] = ..., detail: _Optional[str] = ..., args_digest: _Optional[str] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ("after_seq", "channel", "include_snapshot", "history_id")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    channel: str
    include_snapshot: bool
    history_id: str
    def __init__(self, after_seq: _Optional[int] = ..., channel: _Optional[str] = ..., include_snapshot: _Optional[bool] = ..., history_id: _Optional[str] = ...) -> None: ...

class ApprovalEvent(_message.Message):
    __slots__ = ("seq", "kind", "approval", "at", "decision", "delivery", "detail", "history_id")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: EventKind
    approval: Approval
    at: _timestamp_pb2.Timestamp
    decision: Decision
    delivery: Delivery
    detail: str
    history_id: str
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[_Union[EventKind, str]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., detail: _Optional[str] = ..., history_id: _Optional[str] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("approval_id", "verdict", "scope", "reason", "decider", "idempotency_key", "edited_arguments_json", "expected_args_digest")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    EDITED_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    verdict: Verdict
    scope: Scope
    reason: str
    decider: Decider
    idempotency_key: str
    edited_arguments_json: str
    expected_args_digest: str
    def __init__(self, approval_id: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., scope: _Optional[_Union[Scope, str]] = ..., reason: _Optional[str] = ..., decider: _Optional[_Union[Decider, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., edited_arguments_json: _Optional[str] = ..., expected_args_digest: _Optional[str] = ...) -> None: ...

class DecideWithPasskeyRequest(_message.Message):
    __slots__ = ("decision", "passkey")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    PASSKEY_FIELD_NUMBER: _ClassVar[int]
    decision: DecideRequest
    passkey: PasskeyAssertion
    def __init__(self, decision: _Optional[_Union[DecideRequest, _Mapping]] = ..., passkey: _Optional[_Union[PasskeyAssertion, _Mapping]] = ...) -> None: ...

class PasskeyAssertion(_message.Message):
    __slots__ = ("nonce", "credential_id", "client_data_json", "authenticator_data", "signature")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATOR_DATA_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    nonce: str
    credential_id: str
    client_data_json: bytes
    authenticator_data: bytes
    signature: bytes
    def __init__(self, nonce: _Optional[str] = ..., credential_id: _Optional[str] = ..., client_data_json: _Optional[bytes] = ..., authenticator_data: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RegisterPasskeyRequest(_message.Message):
    __slots__ = ("decider", "challenge", "client_data_json", "attestation_object", "name")
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_OBJECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    decider: Decider
    challenge: bytes
    client_data_json: bytes
    attestation_object: bytes
    name: str
    def __init__(self, decider: _Optional[_Union[Decider, _Mapping]] = ..., challenge: _Optional[bytes] = ..., client_data_json: _Optional[bytes] = ..., attestation_object: _Optional[bytes] = ..., name: _Optional[str] = ...) -> None: ...

class ListPasskeysRequest(_message.Message):
    __slots__ = ("decider",)
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    decider: Decider
    def __init__(self, decider: _Optional[_Union[Decider, _Mapping]] = ...) -> None: ...

class DeletePasskeyRequest(_message.Message):
    __slots__ = ("decider", "credential_id")
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    decider: Decider
    credential_id: str
    def __init__(self, decider: _Optional[_Union[Decider, _Mapping]] = ..., credential_id: _Optional[str] = ...) -> None: ...

class ListPasskeysResponse(_message.Message):
    __slots__ = ("passkeys", "rp_id")
    PASSKEYS_FIELD_NUMBER: _ClassVar[int]
    RP_ID_FIELD_NUMBER: _ClassVar[int]
    passkeys: _containers.RepeatedCompositeFieldContainer[Passkey]
    rp_id: str
    def __init__(self, passkeys: _Optional[_Iterable[_Union[Passkey, _Mapping]]] = ..., rp_id: _Optional[str] = ...) -> None: ...

class Passkey(_message.Message):
    __slots__ = ("credential_id", "approver", "name", "algorithm", "created_at")
    CREDENTIAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    credential_id: str
    approver: str
    name: str
    algorithm: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, credential_id: _Optional[str] = ..., approver: _Optional[str] = ..., name: _Optional[str] = ..., algorithm: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("outcome", "approval")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    outcome: DecideOutcome
    approval: Approval
    def __init__(self, outcome: _Optional[_Union[DecideOutcome, str]] = ..., approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class RecordDeliveryRequest(_message.Message):
    __slots__ = ("approval_id", "channel", "target", "message_ref")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_REF_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    channel: str
    target: str
    message_ref: str
    def __init__(self, approval_id: _Optional[str] = ..., channel: _Optional[str] = ..., target: _Optional[str] = ..., message_ref: _Optional[str] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("approval_id", "kinds", "agent_id", "decider", "since", "until", "newest_first", "page_size", "page_token")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    agent_id: str
    decider: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    newest_first: bool
    page_size: int
    page_token: str
    def __init__(self, approval_id: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ..., agent_id: _Optional[str] = ..., decider: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., newest_first: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("event", "detail", "prev_hash", "hash")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    event: ApprovalEvent
    detail: str
    prev_hash: str
    hash: str
    def __init__(self, event: _Optional[_Union[ApprovalEvent, _Mapping]] = ..., detail: _Optional[str] = ..., prev_hash: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class VerifyAuditRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyAuditResponse(_message.Message):
    __slots__ = ("intact", "events_checked", "first_seq", "last_seq", "broken_seq", "problem")
    INTACT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    BROKEN_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    intact: bool
    events_checked: int
    first_seq: int
    last_seq: int
    broken_seq: int
    problem: str
    def __init__(self, intact: _Optional[bool] = ..., events_checked: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., broken_seq: _Optional[int] = ..., problem: _Optional[str] = ...) -> None: ...

class BackupDatabaseRequest(_message.Message):
    __slots__ = ("file_name",)
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    def __init__(self, file_name: _Optional[str] = ...) -> None: ...

class BackupDatabaseResponse(_message.Message):
    __slots__ = ("path", "bytes", "events_checked", "first_seq", "newest_seq")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    NEWEST_SEQ_FIELD_NUMBER: _ClassVar[int]
    path: str
    bytes: int
    events_checked: int
    first_seq: int
    newest_seq: int
    def __init__(self, path: _Optional[str] = ..., bytes: _Optional[int] = ..., events_checked: _Optional[int] = ..., first_seq: _Optional[int] = ..., newest_seq: _Optional[int] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("id", "agent_id", "session_id", "tool_name", "approval_id", "granted_by", "created_at", "expires_at", "revoked_at", "active")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_id: str
    session_id: str
    tool_name: str
    approval_id: str
    granted_by: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    active: bool
    def __init__(self, id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., approval_id: _Optional[str] = ..., granted_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active: _Optional[bool] = ...) -> None: ...

class ListGrantsRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "tool_name", "include_inactive", "page_size", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    tool_name: str
    include_inactive: bool
    page_size: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., tool_name: _Optional[str] = ..., include_inactive: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListGrantsResponse(_message.Message):
    __slots__ = ("grants", "next_page_token")
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    next_page_token: str
    def __init__(self, grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RevokeGrantRequest(_message.Message):
    __slots__ = ("grant_id", "reason")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    reason: str
    def __init__(self, grant_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RecordRuleAcceptedRequest(_message.Message):
    __slots__ = ("approval_id", "rule_name", "rule", "evidence")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    RULE_NAME_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    rule_name: str
    rule: str
    evidence: str
    def __init__(self, approval_id: _Optional[str] = ..., rule_name: _Optional[str] = ..., rule: _Optional[str] = ..., evidence: _Optional[str] = ...) -> None: ...

class GroupQuorum(_message.Message):
    __slots__ = ("group", "required", "members", "destinations", "contacts", "approved")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTACTS_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    group: str
    required: int
    members: _containers.RepeatedScalarFieldContainer[str]
    destinations: _containers.RepeatedCompositeFieldContainer[Route]
    contacts: _containers.RepeatedCompositeFieldContainer[Route]
    approved: int
    def __init__(self, group: _Optional[str] = ..., required: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., destinations: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., contacts: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., approved: _Optional[int] = ...) -> None: ...

class FollowUp(_message.Message):
    __slots__ = ("remind_after_seconds", "escalate_after_seconds", "escalate_to", "on_timeout", "reminded_at", "escalated_at", "escalation_group")
    REMIND_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ESCALATE_TO_FIELD_NUMBER: _ClassVar[int]
    ON_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    REMINDED_AT_FIELD_NUMBER: _ClassVar[int]
    ESCALATED_AT_FIELD_NUMBER: _ClassVar[int]
    ESCALATION_GROUP_FIELD_NUMBER: _ClassVar[int]
    remind_after_seconds: int
    escalate_after_seconds: int
    escalate_to: str
    on_timeout: OnTimeout
    reminded_at: _timestamp_pb2.Timestamp
    escalated_at: _timestamp_pb2.Timestamp
    escalation_group: GroupQuorum
    def __init__(self, remind_after_seconds: _Optional[int] = ..., escalate_after_seconds: _Optional[int] = ..., escalate_to: _Optional[str] = ..., on_timeout: _Optional[_Union[OnTimeout, str]] = ..., reminded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., escalated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., escalation_group: _Optional[_Union[GroupQuorum, _Mapping]] = ...) -> None: ...

class Delegation(_message.Message):
    __slots__ = ("id", "delegator", "delegate", "created_at", "until", "revoked_at", "reason", "created_by", "active")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELEGATOR_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    delegator: str
    delegate: str
    created_at: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    reason: str
    created_by: str
    active: bool
    def __init__(self, id: _Optional[str] = ..., delegator: _Optional[str] = ..., delegate: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., created_by: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...

class CreateDelegationRequest(_message.Message):
    __slots__ = ("delegator", "delegate", "until", "reason")
    DELEGATOR_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    delegator: str
    delegate: str
    until: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, delegator: _Optional[str] = ..., delegate: _Optional[str] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ListDelegationsRequest(_message.Message):
    __slots__ = ("approver", "include_inactive")
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    approver: str
    include_inactive: bool
    def __init__(self, approver: _Optional[str] = ..., include_inactive: _Optional[bool] = ...) -> None: ...

class ListDelegationsResponse(_message.Message):
    __slots__ = ("delegations",)
    DELEGATIONS_FIELD_NUMBER: _ClassVar[int]
    delegations: _containers.RepeatedCompositeFieldContainer[Delegation]
    def __init__(self, delegations: _Optional[_Iterable[_Union[Delegation, _Mapping]]] = ...) -> None: ...

class RevokeDelegationRequest(_message.Message):
    __slots__ = ("delegation_id",)
    DELEGATION_ID_FIELD_NUMBER: _ClassVar[int]
    delegation_id: str
    def __init__(self, delegation_id: _Optional[str] = ...) -> None: ...

class ListApproversRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisteredApprover(_message.Message):
    __slots__ = ("id", "name", "max_risk", "identities")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_RISK_FIELD_NUMBER: _ClassVar[int]
    IDENTITIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    max_risk: Risk
    identities: _containers.RepeatedCompositeFieldContainer[Route]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., max_risk: _Optional[_Union[Risk, str]] = ..., identities: _Optional[_Iterable[_Union[Route, _Mapping]]] = ...) -> None: ...

class ListApproversResponse(_message.Message):
    __slots__ = ("approvers",)
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    approvers: _containers.RepeatedCompositeFieldContainer[RegisteredApprover]
    def __init__(self, approvers: _Optional[_Iterable[_Union[RegisteredApprover, _Mapping]]] = ...) -> None: ...
