"""Python client for countersign: human approval of AI-agent tool calls.

from countersign import Client

client = Client("127.0.0.1:50051", token="...")
approval = client.request_and_wait(
    agent_id="deploy-bot", tool_name="deploy", arguments={"env": "prod"},
    action="deploy v1.2 to prod", risk="high", idempotency_key=tool_call_id,
)
if approval.approved:
    ...  # run it, then client.consume(approval.id)
"""

from countersign.aio import AsyncClient
from countersign.client import Client, Watch
from countersign.decorator import requires_approval
from countersign.errors import (
    AlreadyExists,
    AlreadyResolved,
    ApprovalNotGranted,
    ApprovalRejected,
    ConfigError,
    CountersignError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotApproved,
    NotFound,
    OutOfRange,
    PermissionDenied,
    RateLimited,
    ResourceExhausted,
    RpcError,
    Unauthenticated,
    Unavailable,
)
from countersign.model import (
    Approval,
    ApprovalPage,
    ApprovalRequest,
    Consumption,
    DecideOutcome,
    Decider,
    DecideResult,
    Decision,
    Event,
    EventKind,
    RequestResult,
    ResolvedBy,
    Risk,
    Scope,
    Snapshot,
    State,
    Verdict,
)
from countersign.receipts import ReceiptError

__all__ = [
    "AlreadyExists",
    "AlreadyResolved",
    "Approval",
    "ApprovalNotGranted",
    "ApprovalPage",
    "ApprovalRejected",
    "ApprovalRequest",
    "AsyncClient",
    "Client",
    "ConfigError",
    "Consumption",
    "CountersignError",
    "DeadlineExceeded",
    "DecideOutcome",
    "DecideResult",
    "Decider",
    "Decision",
    "Event",
    "EventKind",
    "FailedPrecondition",
    "InvalidArgument",
    "NotApproved",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "RateLimited",
    "ReceiptError",
    "RequestResult",
    "ResolvedBy",
    "ResourceExhausted",
    "Risk",
    "RpcError",
    "Scope",
    "Snapshot",
    "State",
    "Unauthenticated",
    "Unavailable",
    "Verdict",
    "Watch",
    "requires_approval",
]
