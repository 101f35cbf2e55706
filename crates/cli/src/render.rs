//! How approvals and events look on the terminal (tables, summaries) and as JSON.
//!
//! JSON uses the proto field names; enums are their short names (`PENDING`, `HIGH`,
//! `APPROVE`), timestamps RFC 3339, and `arguments` the parsed arguments object.

use std::fmt::Write as _;

use countersign_client::{groups, pb, version, Timestamp};
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The short name of a proto enum value: `APPROVAL_STATE_PENDING` → `PENDING`.
fn short<'a>(full: &'a str, prefix: &str) -> &'a str {
    full.strip_prefix(prefix).unwrap_or(full)
}

pub fn state(approval: &pb::Approval) -> &'static str {
    short(approval.state().as_str_name(), "APPROVAL_STATE_")
}

fn risk(approval: &pb::Approval) -> &'static str {
    short(approval.risk().as_str_name(), "RISK_")
}

fn verdict(verdict: pb::Verdict) -> &'static str {
    short(verdict.as_str_name(), "VERDICT_")
}

pub fn event_kind(event: &pb::ApprovalEvent) -> &'static str {
    short(event.kind().as_str_name(), "EVENT_KIND_")
}

pub fn decide_outcome(response: &pb::DecideResponse) -> &'static str {
    short(response.outcome().as_str_name(), "DECIDE_OUTCOME_")
}

pub fn timestamp(ts: Option<&Timestamp>) -> Option<String> {
    let ts = ts?;
    let nanos = i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos);
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()?
        .format(&Rfc3339)
        .ok()
}

fn timestamp_json(ts: Option<&Timestamp>) -> Value {
    timestamp(ts).map_or(Value::Null, Value::String)
}

fn decider_json(decider: Option<&pb::Decider>) -> Value {
    decider.map_or(
        Value::Null,
        |d| json!({"channel": d.channel, "user_id": d.user_id, "display_name": d.display_name}),
    )
}

fn decision_json(decision: &pb::Decision) -> Value {
    json!({
        "verdict": verdict(decision.verdict()),
        "scope": short(decision.scope().as_str_name(), "SCOPE_"),
        "reason": decision.reason,
        "decider": decider_json(decision.decider.as_ref()),
        "idempotency_key": decision.idempotency_key,
        "decided_at": timestamp_json(decision.decided_at.as_ref()),
        "args_digest": decision.args_digest,
        "edited_arguments": parsed_or_null(&decision.edited_arguments_json),
        "restarts_count": decision.restarts_count,
        "approver": decision.approver,
        "delegate": decision.delegate,
    })
}

/// JSON text as JSON (the raw text if it is not JSON); empty: null.
fn parsed_or_null(text: &str) -> Value {
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
    }
}

fn delivery_json(delivery: &pb::Delivery) -> Value {
    json!({
        "channel": delivery.channel,
        "target": delivery.target,
        "message_ref": delivery.message_ref,
        "recorded_at": timestamp_json(delivery.recorded_at.as_ref()),
    })
}

pub fn approval_json(approval: &pb::Approval) -> Value {
    // Arguments are a JSON object on the wire; keep them as JSON, or as the raw text if the
    // server ever sent something else. Empty: redacted from storage.
    let arguments = parsed_or_null(&approval.arguments_json);
    let labels: Map<String, Value> = approval
        .labels
        .iter()
        .map(|(key, value)| (key.clone(), Value::String(value.clone())))
        .collect();
    let resolution = approval.resolution.as_ref().map_or(Value::Null, |r| {
        json!({
            "verdict": verdict(r.verdict()),
            "resolved_by": short(r.resolved_by().as_str_name(), "RESOLVED_BY_"),
            "deciders": r.deciders.iter().map(|d| decider_json(Some(d))).collect::<Vec<_>>(),
            "rule": r.rule,
            "grant_id": r.grant_id,
            "reason": r.reason,
            "resolved_at": timestamp_json(r.resolved_at.as_ref()),
        })
    });
    let consumption = approval.consumption.as_ref().map_or(Value::Null, |c| {
        json!({
            "outcome": short(c.outcome().as_str_name(), "CONSUME_OUTCOME_"),
            "detail": c.detail,
            "consumed_at": timestamp_json(c.consumed_at.as_ref()),
        })
    });
    json!({
        "id": approval.id,
        "agent_id": approval.agent_id,
        "session_id": approval.session_id,
        "requester": approval.requester,
        "idempotency_key": approval.idempotency_key,
        "tool_name": approval.tool_name,
        "arguments": arguments,
        "args_digest": approval.args_digest,
        "action": approval.action,
        "reason": approval.reason,
        "risk": risk(approval),
        "routes": approval.routes.iter().map(|r| json!({"channel": r.channel, "target": r.target})).collect::<Vec<_>>(),
        "required_approvals": approval.required_approvals,
        "labels": labels,
        "state": state(approval),
        "decisions": approval.decisions.iter().map(decision_json).collect::<Vec<_>>(),
        "resolution": resolution,
        "deliveries": approval.deliveries.iter().map(delivery_json).collect::<Vec<_>>(),
        "created_at": timestamp_json(approval.created_at.as_ref()),
        "expires_at": timestamp_json(approval.expires_at.as_ref()),
        "resolved_at": timestamp_json(approval.resolved_at.as_ref()),
        "consumption": consumption,
        "policy_rule": approval.policy_rule,
        "step_up": (!approval.step_up.is_empty()).then_some(&approval.step_up),
        "edited_arguments": parsed_or_null(&approval.edited_arguments_json),
        "edited_args_digest": approval.edited_args_digest,
        "editor": decider_json(approval.editor.as_ref()),
        "edited_at": timestamp_json(approval.edited_at.as_ref()),
        "approver_groups": approval.approver_groups.iter().map(|g| json!({
            "group": g.group,
            "required": g.required,
            "approved": g.approved,
            "members": g.members,
        })).collect::<Vec<_>>(),
        "follow_up": approval.follow_up.as_ref().map(|f| json!({
            "remind_after_seconds": f.remind_after_seconds,
            "escalate_after_seconds": f.escalate_after_seconds,
            "escalate_to": f.escalate_to,
            "on_timeout": short(f.on_timeout().as_str_name(), "ON_TIMEOUT_"),
            "reminded_at": timestamp_json(f.reminded_at.as_ref()),
            "escalated_at": timestamp_json(f.escalated_at.as_ref()),
        })),
    })
}

pub fn event_json(event: &pb::ApprovalEvent) -> Value {
    json!({
        "type": "event",
        "seq": event.seq,
        "kind": event_kind(event),
        "at": timestamp_json(event.at.as_ref()),
        "approval": event.approval.as_ref().map_or(Value::Null, approval_json),
        "decision": event.decision.as_ref().map_or(Value::Null, decision_json),
        "delivery": event.delivery.as_ref().map_or(Value::Null, delivery_json),
    })
}

pub fn snapshot_json(pending: &[pb::Approval]) -> Value {
    json!({"type": "snapshot", "approvals": pending.iter().map(approval_json).collect::<Vec<_>>()})
}

fn decider_text(decider: &pb::Decider) -> String {
    let name = if decider.display_name.is_empty() || decider.display_name == decider.user_id {
        decider.user_id.clone()
    } else {
        format!("{} ({})", decider.display_name, decider.user_id)
    };
    format!("{name} via {}", decider.channel)
}

/// `APPROVE by bob via telegram (bob on behalf of alice)`.
fn decided_text(decision: &pb::Decision) -> String {
    let who = decision
        .decider
        .as_ref()
        .map(decider_text)
        .unwrap_or_default();
    let mut text = format!("{} by {who}", verdict(decision.verdict()));
    if let Some(behalf) = groups::on_behalf_of(decision) {
        text.push_str(&format!(" ({behalf})"));
    }
    if !decision.edited_arguments_json.is_empty() {
        text.push_str(" with edited arguments");
        if decision.restarts_count {
            text.push_str(" (restarted the approval count)");
        }
    }
    text
}

/// Who or what resolved the approval, in a few words ("by alice via cli", "by rule ...").
pub fn resolution_text(approval: &pb::Approval) -> Option<String> {
    let resolution = approval.resolution.as_ref()?;
    let by = match resolution.resolved_by() {
        pb::ResolvedBy::Decision => {
            let deciders: Vec<String> = resolution.deciders.iter().map(decider_text).collect();
            format!("by {}", deciders.join(", "))
        }
        pb::ResolvedBy::Rule => format!("by rule {}", resolution.rule),
        pb::ResolvedBy::Grant => format!("by session grant {}", resolution.grant_id),
        pb::ResolvedBy::Expiry => "by expiry".to_owned(),
        pb::ResolvedBy::Cancellation => "by cancellation".to_owned(),
        pb::ResolvedBy::Unspecified => return None,
    };
    Some(if resolution.reason.is_empty() {
        by
    } else {
        format!("{by}: {}", resolution.reason)
    })
}

/// The detail view of one approval, one `field: value` per line.
pub fn approval_text(approval: &pb::Approval) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: &str| {
        if !value.is_empty() {
            let _ = writeln!(out, "{name:<13} {value}");
        }
    };
    line("id:", &approval.id);
    line("state:", state(approval));
    line("tool:", &approval.tool_name);
    line("action:", &approval.action);
    line("reason:", &approval.reason);
    line("risk:", risk(approval));
    line("step-up:", &approval.step_up);
    line("arguments:", &approval.arguments_json);
    line("digest:", &approval.args_digest);
    if version::is_edited(approval) {
        line(
            "edited by:",
            &approval
                .editor
                .as_ref()
                .map(decider_text)
                .unwrap_or_default(),
        );
        line("edited args:", &approval.edited_arguments_json);
        line("edited digest:", &approval.edited_args_digest);
    }
    line("agent:", &approval.agent_id);
    line("session:", &approval.session_id);
    line("requester:", &approval.requester);
    let routes: Vec<String> = approval
        .routes
        .iter()
        .map(|r| {
            if r.target.is_empty() {
                r.channel.clone()
            } else {
                format!("{}:{}", r.channel, r.target)
            }
        })
        .collect();
    line("routes:", &routes.join(", "));
    if approval.required_approvals > 1 {
        line(
            "approvals:",
            &format!(
                "{} of {} required",
                version::current_approvals(approval).count(),
                approval.required_approvals
            ),
        );
    }
    for progress in groups::group_progress(approval) {
        line("group:", &progress);
    }
    line(
        "follow-up:",
        &groups::follow_up_state(approval).unwrap_or_default(),
    );
    let labels: Vec<String> = approval
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    line("labels:", &labels.join(", "));
    line(
        "created:",
        &timestamp(approval.created_at.as_ref()).unwrap_or_default(),
    );
    line(
        "expires:",
        &timestamp(approval.expires_at.as_ref()).unwrap_or_default(),
    );
    line("resolved:", &resolution_text(approval).unwrap_or_default());
    for decision in &approval.decisions {
        let mut text = decided_text(decision);
        if !decision.reason.is_empty() {
            text.push_str(&format!(": {}", decision.reason));
        }
        line("decision:", &text);
    }
    for delivery in &approval.deliveries {
        line(
            "delivered:",
            &format!(
                "{} {} ({})",
                delivery.channel, delivery.target, delivery.message_ref
            ),
        );
    }
    if let Some(consumption) = &approval.consumption {
        let outcome = short(consumption.outcome().as_str_name(), "CONSUME_OUTCOME_");
        line(
            "consumed:",
            format!("{outcome} {}", consumption.detail).trim_end(),
        );
    }
    out
}

/// Text that fits a table cell: one line, at most `max` characters.
pub fn cell(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// Left-aligned columns separated by two spaces, the last one unpadded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, value) in widths.iter_mut().zip(row) {
            *width = (*width).max(value.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        let mut line = String::new();
        for (i, (value, width)) in row.iter().zip(&widths).enumerate() {
            if i == last {
                line.push_str(value);
            } else {
                let _ = write!(line, "{value:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn approvals_table(approvals: &[pb::Approval]) -> String {
    let rows: Vec<Vec<String>> = approvals
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                state(a).to_owned(),
                risk(a).to_owned(),
                cell(&a.tool_name, 24),
                cell(&a.agent_id, 24),
                timestamp(a.created_at.as_ref()).unwrap_or_default(),
                cell(&a.action, 60),
            ]
        })
        .collect();
    table(
        &["ID", "STATE", "RISK", "TOOL", "AGENT", "CREATED", "ACTION"],
        &rows,
    )
}

/// One line per watch event: seq, kind, approval id and state, tool, and what happened.
pub fn event_line(event: &pb::ApprovalEvent) -> String {
    let mut line = format!("{:>6}  {:<17}", event.seq, event_kind(event));
    if let Some(approval) = &event.approval {
        let _ = write!(
            line,
            "  {}  {:<9}  {}",
            approval.id,
            state(approval),
            cell(&approval.tool_name, 24)
        );
        if !approval.action.is_empty() {
            let _ = write!(line, "  {}", cell(&approval.action, 60));
        }
    }
    if let Some(decision) = &event.decision {
        let _ = write!(line, "  [{}]", decided_text(decision));
    }
    if let Some(delivery) = &event.delivery {
        let _ = write!(line, "  [{} {}]", delivery.channel, delivery.target);
    }
    line
}

/// One audit event as JSON: the event as `watch` prints it, plus why (refusals, revocations)
/// and its place in the hash chain.
pub fn audit_event_json(audit: &pb::AuditEvent) -> Value {
    let mut value = audit.event.as_ref().map_or_else(|| json!({}), event_json);
    if let Value::Object(fields) = &mut value {
        fields.insert("detail".into(), Value::String(audit.detail.clone()));
        fields.insert("prev_hash".into(), Value::String(audit.prev_hash.clone()));
        fields.insert("hash".into(), Value::String(audit.hash.clone()));
    }
    value
}

/// The audit trail as a table: what happened, to which approval, by whom and why.
pub fn audit_events_table(events: &[pb::AuditEvent]) -> String {
    let rows: Vec<Vec<String>> = events
        .iter()
        .filter_map(|audit| {
            let event = audit.event.as_ref()?;
            let approval = event.approval.as_ref();
            let mut what: Vec<String> = Vec::new();
            if let Some(decision) = &event.decision {
                what.push(decided_text(decision));
            }
            if let Some(delivery) = &event.delivery {
                what.push(format!("{} {}", delivery.channel, delivery.target));
            }
            if !audit.detail.is_empty() {
                what.push(audit.detail.clone());
            }
            Some(vec![
                event.seq.to_string(),
                timestamp(event.at.as_ref()).unwrap_or_default(),
                event_kind(event).to_owned(),
                approval.map(|a| a.id.clone()).unwrap_or_default(),
                cell(
                    &approval.map(|a| a.agent_id.clone()).unwrap_or_default(),
                    24,
                ),
                cell(&what.join("; "), 80),
            ])
        })
        .collect();
    table(&["SEQ", "AT", "KIND", "APPROVAL", "AGENT", "WHAT"], &rows)
}

/// Where something that lasts until revoked or expired (a grant, a delegation) stands.
fn lifetime_state(active: bool, revoked: bool) -> &'static str {
    match (active, revoked) {
        (true, _) => "ACTIVE",
        (false, true) => "REVOKED",
        (false, false) => "EXPIRED",
    }
}

fn grant_state(grant: &pb::Grant) -> &'static str {
    lifetime_state(grant.active, grant.revoked_at.is_some())
}

pub fn grant_json(grant: &pb::Grant) -> Value {
    json!({
        "id": grant.id,
        "state": grant_state(grant),
        "agent_id": grant.agent_id,
        "session_id": grant.session_id,
        "tool_name": grant.tool_name,
        "approval_id": grant.approval_id,
        "granted_by": grant.granted_by,
        "created_at": timestamp_json(grant.created_at.as_ref()),
        "expires_at": timestamp_json(grant.expires_at.as_ref()),
        "revoked_at": timestamp_json(grant.revoked_at.as_ref()),
    })
}

pub fn grants_table(grants: &[pb::Grant]) -> String {
    let rows: Vec<Vec<String>> = grants
        .iter()
        .map(|g| {
            vec![
                g.id.clone(),
                grant_state(g).to_owned(),
                cell(&g.agent_id, 24),
                cell(&g.session_id, 24),
                cell(&g.tool_name, 24),
                cell(&g.granted_by, 24),
                timestamp(g.expires_at.as_ref()).unwrap_or_else(|| "never".into()),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATE",
            "AGENT",
            "SESSION",
            "TOOL",
            "GRANTED BY",
            "EXPIRES",
        ],
        &rows,
    )
}

fn delegation_state(delegation: &pb::Delegation) -> &'static str {
    lifetime_state(delegation.active, delegation.revoked_at.is_some())
}

pub fn delegation_json(delegation: &pb::Delegation) -> Value {
    json!({
        "id": delegation.id,
        "state": delegation_state(delegation),
        "delegator": delegation.delegator,
        "delegate": delegation.delegate,
        "reason": delegation.reason,
        "created_by": delegation.created_by,
        "created_at": timestamp_json(delegation.created_at.as_ref()),
        "until": timestamp_json(delegation.until.as_ref()),
        "revoked_at": timestamp_json(delegation.revoked_at.as_ref()),
    })
}

pub fn delegations_table(delegations: &[pb::Delegation]) -> String {
    let rows: Vec<Vec<String>> = delegations
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                delegation_state(d).to_owned(),
                cell(&d.delegator, 24),
                cell(&d.delegate, 24),
                timestamp(d.until.as_ref()).unwrap_or_default(),
                cell(&d.reason, 40),
            ]
        })
        .collect();
    table(
        &["ID", "STATE", "FOR", "DELEGATE", "UNTIL", "REASON"],
        &rows,
    )
}

pub fn audit_report_text(report: &pb::VerifyAuditResponse) -> String {
    if report.intact {
        format!(
            "audit trail intact: {} events checked (seq {} to {})",
            report.events_checked, report.first_seq, report.last_seq
        )
    } else {
        format!(
            "audit trail BROKEN at seq {}: {}",
            report.broken_seq, report.problem
        )
    }
}

pub fn audit_report_json(report: &pb::VerifyAuditResponse) -> Value {
    json!({
        "intact": report.intact,
        "events_checked": report.events_checked,
        "first_seq": report.first_seq,
        "last_seq": report.last_seq,
        "broken_seq": report.broken_seq,
        "problem": report.problem,
    })
}

pub fn backup_text(made: &pb::BackupDatabaseResponse) -> String {
    format!(
        "backup written and verified: {} ({} bytes), audit trail intact: {} events checked (seq {} to {})",
        made.path, made.bytes, made.events_checked, made.first_seq, made.newest_seq
    )
}

pub fn backup_json(made: &pb::BackupDatabaseResponse) -> Value {
    json!({
        "path": made.path,
        "bytes": made.bytes,
        "events_checked": made.events_checked,
        "first_seq": made.first_seq,
        "newest_seq": made.newest_seq,
    })
}

/// The snapshot that starts a watch: a count, then one line per pending approval.
pub fn snapshot_text(pending: &[pb::Approval]) -> String {
    let mut out = format!("snapshot: {} pending\n", pending.len());
    for approval in pending {
        let _ = writeln!(
            out,
            "{:>6}  {:<17}  {}  {:<9}  {}  {}",
            "-",
            "PENDING",
            approval.id,
            state(approval),
            cell(&approval.tool_name, 24),
            cell(&approval.action, 60)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> pb::Approval {
        pb::Approval {
            id: "0190a1b2-0000-7000-8000-000000000001".into(),
            agent_id: "agent".into(),
            tool_name: "deploy".into(),
            arguments_json: r#"{"env":"prod"}"#.into(),
            action: "deploy\nto prod".into(),
            risk: pb::Risk::High.into(),
            state: pb::ApprovalState::Rejected.into(),
            created_at: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            resolution: Some(pb::Resolution {
                verdict: pb::Verdict::Reject.into(),
                resolved_by: pb::ResolvedBy::Decision.into(),
                deciders: vec![pb::Decider {
                    channel: "cli".into(),
                    user_id: "alice".into(),
                    display_name: "alice".into(),
                }],
                reason: "not today".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn json_uses_short_enum_names_parsed_arguments_and_rfc3339_times() {
        let value = approval_json(&sample());
        assert_eq!(value["state"], "REJECTED");
        assert_eq!(value["risk"], "HIGH");
        assert_eq!(value["arguments"]["env"], "prod");
        assert_eq!(value["created_at"], "2023-11-14T22:13:20Z");
        assert_eq!(value["resolution"]["verdict"], "REJECT");
        assert_eq!(value["resolution"]["deciders"][0]["user_id"], "alice");
        assert_eq!(value["expires_at"], Value::Null);
    }

    #[test]
    fn tables_align_columns_and_keep_cells_on_one_line() {
        let text = approvals_table(&[sample()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ID"));
        assert_eq!(lines[0].find("STATE"), lines[1].find("REJECTED"));
        assert!(lines[1].ends_with("deploy to prod"), "{}", lines[1]);
    }

    #[test]
    fn resolution_names_who_decided_and_why() {
        assert_eq!(
            resolution_text(&sample()).unwrap(),
            "by alice via cli: not today"
        );
    }

    #[test]
    fn long_cells_are_cut_with_an_ellipsis() {
        assert_eq!(cell("abcdef", 4), "abc…");
        assert_eq!(cell("abc", 4), "abc");
    }
}
