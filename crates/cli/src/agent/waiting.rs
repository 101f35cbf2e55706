//! Asking for an approval and waiting for its decision, as `request --wait` and `exec` both
//! do: the request the flags make, the resent request, the wait until the decision (or the
//! expiry), and the exit code and line that say how it ended.

use std::time::{Duration, SystemTime};

use countersign_client::{pb, Client};
use serde_json::Value;

use crate::args::CallArgs;
use crate::exit::{CliError, Exit};
use crate::render;
use crate::settings::{local_user, Settings};

/// How long past `expires_at` a default wait lasts, so that the server's expiry sweep has
/// answered (EXPIRED) by the time the wait ends.
const EXPIRY_GRACE: Duration = Duration::from_secs(5);

/// How long a wait lasts when the approval carries no expiry.
const FALLBACK_WAIT: Duration = Duration::from_secs(3600);

/// The exit code that tells how an approval ended.
pub fn verdict_exit(approval: &pb::Approval) -> Exit {
    match approval.state() {
        pb::ApprovalState::Approved | pb::ApprovalState::Consumed => Exit::Success,
        pb::ApprovalState::Rejected => Exit::Rejected,
        pb::ApprovalState::Expired => Exit::Expired,
        pb::ApprovalState::Cancelled => Exit::Cancelled,
        pb::ApprovalState::Pending => Exit::TimedOut,
        pb::ApprovalState::Unspecified => Exit::Failure,
    }
}

/// The request `request` and `exec` send.
pub fn approval_request(
    settings: &Settings,
    call: &CallArgs,
    tool_name: String,
    arguments_json: String,
    default_action: String,
) -> Result<pb::RequestApprovalRequest, CliError> {
    match serde_json::from_str::<Value>(&arguments_json) {
        Ok(Value::Object(_)) => {}
        Ok(_) => return Err(CliError::Usage("--args must be a JSON object".into())),
        Err(error) => {
            return Err(CliError::Usage(format!(
                "--args is not valid JSON: {error}"
            )))
        }
    }
    let ttl_seconds = match call.ttl {
        None => 0,
        Some(ttl) if ttl < Duration::from_secs(1) => {
            return Err(CliError::Usage("--ttl must be at least 1s".into()))
        }
        Some(ttl) => u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX),
    };
    Ok(pb::RequestApprovalRequest {
        agent_id: settings.agent_id(call.agent_id.as_deref()),
        session_id: call.session_id.clone(),
        requester: local_user().unwrap_or_default(),
        idempotency_key: call
            .idempotency_key
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        tool_name,
        arguments_json,
        action: call.action.clone().unwrap_or(default_action),
        reason: call.reason.clone(),
        risk: pb::Risk::from(call.risk).into(),
        routes: call.routes.clone(),
        required_approvals: call.required_approvals,
        ttl_seconds,
        labels: call.labels.iter().cloned().collect(),
        approver_groups: call.groups.clone(),
        follow_up: follow_up(call),
        // `request --wait` and `exec` withdraw nothing when stopped: a request may outlive
        // them on purpose (`request` without `--wait`, a decision read later).
        withdraw_when_caller_leaves: false,
    })
}

/// The follow-up the flags ask for; `None` when no flag does.
fn follow_up(call: &CallArgs) -> Option<pb::FollowUp> {
    let seconds =
        |d: Option<Duration>| d.map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
    let asked = call.remind_after.is_some()
        || call.escalate_after.is_some()
        || call.escalate_to.is_some()
        || call.on_timeout.is_some();
    asked.then(|| pb::FollowUp {
        remind_after_seconds: seconds(call.remind_after),
        escalate_after_seconds: seconds(call.escalate_after),
        escalate_to: call.escalate_to.clone().unwrap_or_default(),
        on_timeout: call
            .on_timeout
            .map_or(pb::OnTimeout::Unspecified, pb::OnTimeout::from) as i32,
        ..Default::default()
    })
}

/// Requests the approval a command will wait for (`request --wait`, `exec`): a call that a
/// server restart broke off after it was sent is resent, with the same idempotency key, for as
/// long as the wait would last.
pub async fn request_to_wait(
    client: &Client,
    request: pb::RequestApprovalRequest,
    timeout: Option<Duration>,
) -> Result<pb::Approval, CliError> {
    Ok(client
        .request_approval_resending(request, timeout.unwrap_or(FALLBACK_WAIT))
        .await?)
}

/// Waits for the decision on a just-requested approval, telling the user on stderr what it
/// waits for. `timeout` defaults to the approval's expiry (plus a grace for the sweep).
pub async fn await_decision(
    client: &Client,
    approval: pb::Approval,
    timeout: Option<Duration>,
) -> Result<pb::Approval, CliError> {
    if approval.state() != pb::ApprovalState::Pending {
        return Ok(approval);
    }
    let timeout = timeout.unwrap_or_else(|| until_expiry(&approval));
    let expires = render::timestamp(approval.expires_at.as_ref())
        .map(|at| format!(", expires {at}"))
        .unwrap_or_default();
    eprintln!(
        "countersign: waiting for a decision on approval {}{expires}",
        approval.id
    );
    Ok(client.wait_until_resolved(&approval.id, timeout).await?)
}

fn until_expiry(approval: &pb::Approval) -> Duration {
    let Some(expires_at) = &approval.expires_at else {
        return FALLBACK_WAIT;
    };
    let expires_at = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(expires_at.seconds).unwrap_or(0))
        + Duration::from_nanos(u64::try_from(expires_at.nanos).unwrap_or(0));
    expires_at
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
        + EXPIRY_GRACE
}

/// The one-line account of how an approval ended, for stderr.
pub fn outcome_text(approval: &pb::Approval) -> String {
    let mut text = format!("approval {} is {}", approval.id, render::state(approval));
    if let Some(by) = render::resolution_text(approval) {
        text.push(' ');
        text.push_str(&by);
    }
    text
}
