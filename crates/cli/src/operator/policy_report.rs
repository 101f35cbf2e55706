//! `policy report`: what the rules would have decided over a period of observe mode
//! (`[policy] mode = "observe"`), read from the audit trail, and where a person decided
//! otherwise.
//!
//! The server records the rules' verdict on each approval it asks about in observe mode as the
//! labels `policy.observed` (`allow`, `deny`, `require`, `none`) and `policy.observed_rule`;
//! the audit trail's events carry the approval as it was, so the newest event of each approval
//! says how people answered.

use std::collections::BTreeMap;

use countersign_client::pb;
use serde_json::{json, Value};

use crate::render::{self, cell, table};

/// The label holding what the rules would have done (written by the server).
const OBSERVED_LABEL: &str = "policy.observed";
/// The label holding the rule that would have decided.
const OBSERVED_RULE_LABEL: &str = "policy.observed_rule";

/// The calls one rule (or no rule) would have decided, and how people answered them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RuleTally {
    /// `allow`, `deny`, `require` or `none`.
    pub would: String,
    pub calls: u32,
    pub approved: u32,
    pub rejected: u32,
    /// Still pending, expired or cancelled.
    pub undecided: u32,
    /// People rejected a call the rule would allow, or approved one it would deny.
    pub disagreed: u32,
}

/// What the report shows.
#[derive(Debug, Default)]
pub struct PolicyReport {
    /// By rule name; calls no rule matched are under "".
    pub rules: BTreeMap<String, RuleTally>,
    /// The approvals people decided against the rules, oldest first.
    pub disagreements: Vec<pb::Approval>,
}

/// The report of the approvals in `events` that were asked in observe mode: each approval as
/// its newest event shows it.
pub fn summarize(events: &[pb::AuditEvent]) -> PolicyReport {
    let mut newest: BTreeMap<&str, (u64, &pb::Approval)> = BTreeMap::new();
    for event in events.iter().filter_map(|audit| audit.event.as_ref()) {
        let Some(approval) = event.approval.as_ref() else {
            continue;
        };
        if !approval.labels.contains_key(OBSERVED_LABEL) {
            continue;
        }
        let entry = newest
            .entry(approval.id.as_str())
            .or_insert((event.seq, approval));
        if event.seq >= entry.0 {
            *entry = (event.seq, approval);
        }
    }
    let mut report = PolicyReport::default();
    // Approval ids are UUIDv7: in id order is in time order.
    for (_, approval) in newest.into_values() {
        let would = label(approval, OBSERVED_LABEL);
        let rule = label(approval, OBSERVED_RULE_LABEL);
        let tally = report.rules.entry(rule.to_owned()).or_default();
        would.clone_into(&mut tally.would);
        tally.calls += 1;
        let by_people = approval
            .resolution
            .as_ref()
            .is_some_and(|r| r.resolved_by() == pb::ResolvedBy::Decision);
        let state = approval.state();
        let approved = by_people
            && matches!(
                state,
                pb::ApprovalState::Approved | pb::ApprovalState::Consumed
            );
        let rejected = by_people && state == pb::ApprovalState::Rejected;
        match (approved, rejected) {
            (true, _) => tally.approved += 1,
            (_, true) => tally.rejected += 1,
            _ => tally.undecided += 1,
        }
        if (would == "allow" && rejected) || (would == "deny" && approved) {
            tally.disagreed += 1;
            report.disagreements.push(approval.clone());
        }
    }
    report
}

fn label<'a>(approval: &'a pb::Approval, key: &str) -> &'a str {
    approval.labels.get(key).map_or("", String::as_str)
}

/// The rule's name as the report shows it.
fn rule_name(rule: &str) -> &str {
    if rule.is_empty() {
        "(no rule)"
    } else {
        rule
    }
}

/// The report as text: a table by rule, then the disagreements.
pub fn text(report: &PolicyReport) -> String {
    if report.rules.is_empty() {
        return "no observed calls in this period (is the server's [policy] mode \"observe\"?)\n"
            .to_owned();
    }
    let rows: Vec<Vec<String>> = report
        .rules
        .iter()
        .map(|(rule, tally)| {
            vec![
                cell(rule_name(rule), 40),
                tally.would.clone(),
                tally.calls.to_string(),
                tally.approved.to_string(),
                tally.rejected.to_string(),
                tally.undecided.to_string(),
                tally.disagreed.to_string(),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "RULE",
            "WOULD",
            "CALLS",
            "APPROVED",
            "REJECTED",
            "UNDECIDED",
            "DISAGREED",
        ],
        &rows,
    );
    if report.disagreements.is_empty() {
        out.push_str("\npeople decided as the rules would have, every time\n");
        return out;
    }
    out.push_str("\npeople decided against the rules:\n");
    let rows: Vec<Vec<String>> = report
        .disagreements
        .iter()
        .map(|approval| {
            vec![
                approval.id.clone(),
                render::state(approval).to_owned(),
                cell(
                    &format!(
                        "{} {}",
                        label(approval, OBSERVED_LABEL),
                        rule_name(label(approval, OBSERVED_RULE_LABEL))
                    ),
                    60,
                ),
                cell(&approval.tool_name, 24),
                cell(&approval.action, 60),
                cell(&render::resolution_text(approval).unwrap_or_default(), 60),
            ]
        })
        .collect();
    out.push_str(&table(
        &["APPROVAL", "STATE", "RULES", "TOOL", "ACTION", "DECIDED"],
        &rows,
    ));
    out
}

/// The report as JSON.
pub fn json(report: &PolicyReport) -> Value {
    let rules: Vec<Value> = report
        .rules
        .iter()
        .map(|(rule, tally)| {
            json!({
                "rule": rule,
                "would": tally.would,
                "calls": tally.calls,
                "approved": tally.approved,
                "rejected": tally.rejected,
                "undecided": tally.undecided,
                "disagreed": tally.disagreed,
            })
        })
        .collect();
    let disagreements: Vec<Value> = report
        .disagreements
        .iter()
        .map(render::approval_json)
        .collect();
    json!({ "rules": rules, "disagreements": disagreements })
}
