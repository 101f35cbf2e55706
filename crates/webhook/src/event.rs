//! What an endpoint receives: `{"type", "timestamp", "data"}` as Standard Webhooks suggests,
//! one `approval.requested` (with decision links) and one `approval.resolved` per approval.
//! The webhook-id names the approval and the event, so that a replayed event, a snapshot
//! after a restart and a re-delivery all carry the same id.

use countersign_client::pb;
use countersign_links::store::NewLink;
use countersign_links::{expires_ms, LinkVerdict};
use countersign_worker::approval::risk_word;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::config::Endpoint;

pub const REQUESTED: &str = "approval.requested";
pub const RESOLVED: &str = "approval.resolved";
/// `countersign notify`: an agent finished, failed or waits (no approval, no links).
pub const NOTICE: &str = "agent.notice";

/// The webhook-id of an approval's event of `event_type`.
pub fn webhook_id(approval_id: &str, event_type: &str) -> String {
    let suffix = event_type.trim_start_matches("approval.");
    format!("msg_{approval_id}_{suffix}")
}

fn rfc3339(timestamp: Option<&countersign_client::Timestamp>) -> Value {
    timestamp
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.seconds).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .map_or(Value::Null, Value::String)
}

fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

fn state_name(state: pb::ApprovalState) -> &'static str {
    match state {
        pb::ApprovalState::Pending | pb::ApprovalState::Unspecified => "pending",
        pb::ApprovalState::Approved => "approved",
        pb::ApprovalState::Rejected => "rejected",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Cancelled => "cancelled",
        pb::ApprovalState::Consumed => "consumed",
    }
}

fn decider_json(decider: &pb::Decider) -> Value {
    json!({"channel": decider.channel, "user_id": decider.user_id, "display_name": decider.display_name})
}

/// The request event for `endpoint`, and the links it carries (none when the endpoint has
/// decision links off).
pub fn requested(
    approval: &pb::Approval,
    endpoint: &Endpoint,
    public_url: &str,
) -> (String, Vec<NewLink>) {
    let arguments = serde_json::from_str::<Value>(&approval.arguments_json)
        .unwrap_or_else(|_| Value::String(approval.arguments_json.clone()));
    let mut links = Vec::new();
    let mut decision_links = Value::Null;
    if endpoint.decision_links {
        let mut urls = serde_json::Map::new();
        for verdict in [LinkVerdict::Approve, LinkVerdict::Reject] {
            let (token, link) = NewLink::mint(verdict, &endpoint.approver, expires_ms(approval));
            urls.insert(
                verdict.as_str().to_owned(),
                Value::String(format!("{public_url}/decide/{token}")),
            );
            links.push(link);
        }
        urls.insert(
            "approver".to_owned(),
            Value::String(endpoint.approver.clone()),
        );
        urls.insert(
            "expires_at".to_owned(),
            rfc3339(approval.expires_at.as_ref()),
        );
        decision_links = Value::Object(urls);
    }
    let body = json!({
        "type": REQUESTED,
        "timestamp": now_rfc3339(),
        "data": {
            "approval_id": approval.id,
            "state": state_name(approval.state()),
            "agent_id": approval.agent_id,
            "session_id": approval.session_id,
            "requester": approval.requester,
            "tool_name": approval.tool_name,
            "arguments": arguments,
            "args_digest": approval.args_digest,
            "action": approval.action,
            "reason": approval.reason,
            "risk": risk_word(approval.risk()),
            "required_approvals": approval.required_approvals,
            "labels": approval.labels,
            "created_at": rfc3339(approval.created_at.as_ref()),
            "expires_at": rfc3339(approval.expires_at.as_ref()),
            "decision_links": decision_links,
        }
    });
    (body.to_string(), links)
}

/// A notice event and its webhook-id: a digest of the event and the moment it was made (a
/// notice is sent once, never replayed).
pub fn notice(title: &str, message: &str, tags: &[String]) -> (String, String) {
    let body = json!({
        "type": NOTICE,
        "timestamp": now_rfc3339(),
        "data": {"title": title, "message": message, "tags": tags},
    })
    .to_string();
    let mut digest = Sha256::new();
    digest.update(
        OffsetDateTime::now_utc()
            .unix_timestamp_nanos()
            .to_be_bytes(),
    );
    digest.update(body.as_bytes());
    let id: String = digest.finalize()[..12]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    (format!("msg_notice_{id}"), body)
}

/// The resolution event (approved, rejected, expired, cancelled).
pub fn resolved(approval: &pb::Approval) -> String {
    let resolution = approval.resolution.clone().unwrap_or_default();
    json!({
        "type": RESOLVED,
        "timestamp": now_rfc3339(),
        "data": {
            "approval_id": approval.id,
            "state": state_name(approval.state()),
            "resolved_by": resolution.resolved_by().as_str_name().trim_start_matches("RESOLVED_BY_").to_lowercase(),
            "deciders": resolution.deciders.iter().map(decider_json).collect::<Vec<_>>(),
            "reason": resolution.reason,
            "resolved_at": rfc3339(approval.resolved_at.as_ref()),
            "edit": edit_json(approval),
        }
    })
    .to_string()
}

/// The arguments an approver edited (edit-on-approve), which the agent runs instead of the
/// requested ones; null when not edited.
fn edit_json(approval: &pb::Approval) -> Value {
    if approval.edited_args_digest.is_empty() {
        return Value::Null;
    }
    let arguments = serde_json::from_str::<Value>(&approval.edited_arguments_json)
        .unwrap_or_else(|_| Value::String(approval.edited_arguments_json.clone()));
    json!({
        "arguments": arguments,
        "args_digest": approval.edited_args_digest,
        "editor": approval.editor.as_ref().map_or(Value::Null, decider_json),
        "edited_at": rfc3339(approval.edited_at.as_ref()),
    })
}

/// Whether the approval is resolved (an `approval.resolved` event is due).
pub fn is_resolved(approval: &pb::Approval) -> bool {
    matches!(
        approval.state(),
        pb::ApprovalState::Approved
            | pb::ApprovalState::Rejected
            | pb::ApprovalState::Expired
            | pb::ApprovalState::Cancelled
            | pb::ApprovalState::Consumed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_ids_are_stable_per_approval_and_event() {
        assert_eq!(webhook_id("0193", REQUESTED), "msg_0193_requested");
        assert_ne!(webhook_id("0193", REQUESTED), webhook_id("0193", RESOLVED));
    }
}
