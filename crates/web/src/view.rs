//! What the pages show of an approval, computed from the SDK's types. Every string here is
//! plain text: the templates escape it (askama escapes HTML by default), so agent text can
//! never become markup.

use countersign_client::{decider, groups, pb, version, Timestamp};
use countersign_worker::agent_text::one_line;
use countersign_worker::approval::{cancelled_word, risk_word};
use countersign_worker::facts::{ApprovalFacts, Resolver};
use serde_json::Value;

/// The longest action shown in a list row.
const ROW_ACTION_CHARS: usize = 200;

pub fn state_label(state: pb::ApprovalState) -> &'static str {
    match state {
        pb::ApprovalState::Unspecified => "unknown",
        pb::ApprovalState::Pending => "pending",
        pb::ApprovalState::Approved => "approved",
        pb::ApprovalState::Rejected => "rejected",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Cancelled => "cancelled",
        pb::ApprovalState::Consumed => "consumed",
    }
}

pub fn millis(at: Option<&Timestamp>) -> i64 {
    at.map_or(0, |at| at.seconds * 1000 + i64::from(at.nanos) / 1_000_000)
}

pub fn time_text(at: Option<&Timestamp>) -> String {
    let Some(at) = at else {
        return String::new();
    };
    let format =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
    time::OffsetDateTime::from_unix_timestamp(at.seconds)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_default()
}

fn decider_text(decider: Option<&pb::Decider>) -> String {
    match decider {
        Some(d) => decider::name_and_channel(d),
        None => "unknown".into(),
    }
}

/// Approvals counted so far against the quorum.
pub fn approvals_so_far(approval: &pb::Approval) -> usize {
    version::current_approvals(approval).count()
}

/// Whether `approver_id` already approved this approval on the web (it then waits for
/// others and leaves this approver's inbox).
pub fn approved_by(approval: &pb::Approval, approver_id: &str) -> bool {
    // Approvals of an earlier version (before an edit) no longer count.
    version::current_approvals(approval).any(|d| {
        d.decider
            .as_ref()
            .is_some_and(|who| who.channel == crate::config::CHANNEL && who.user_id == approver_id)
    })
}

/// One line of the inbox, the history or a batch.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: String,
    pub agent: String,
    pub session: String,
    pub tool: String,
    pub action: String,
    pub risk: &'static str,
    pub risk_rank: u8,
    pub state: &'static str,
    pub created_ms: i64,
    pub created: String,
    pub expires_ms: i64,
    pub expires: String,
    pub quorum: String,
}

impl Row {
    pub fn of(approval: &pb::Approval) -> Row {
        let facts = ApprovalFacts::of(approval);
        Row {
            id: facts.id.to_owned(),
            agent: one_line(facts.agent, 128),
            session: one_line(facts.session, 128),
            tool: one_line(facts.tool, 128),
            action: one_line(facts.action, ROW_ACTION_CHARS),
            risk: facts.risk_word(),
            risk_rank: facts.risk as u8,
            state: state_label(facts.state),
            created_ms: millis(approval.created_at.as_ref()),
            created: time_text(approval.created_at.as_ref()),
            expires_ms: millis(approval.expires_at.as_ref()),
            expires: time_text(approval.expires_at.as_ref()),
            quorum: format!("{}/{}", approvals_so_far(approval), facts.progress.required),
        }
    }
}

/// Riskiest first, then oldest first.
pub fn sort_inbox(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        b.risk_rank
            .cmp(&a.risk_rank)
            .then(a.created_ms.cmp(&b.created_ms))
            .then(a.id.cmp(&b.id))
    });
}

/// The inbox filters (empty: no filter).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct Filters {
    pub agent: String,
    pub tool: String,
    pub risk: String,
}

impl Filters {
    /// Whether any filter narrows the list (the page then shows them open).
    pub fn is_set(&self) -> bool {
        !(self.agent.is_empty() && self.tool.is_empty() && self.risk.is_empty())
    }

    pub fn admit(&self, approval: &pb::Approval) -> bool {
        (self.agent.is_empty() || self.agent == approval.agent_id)
            && (self.tool.is_empty() || self.tool == approval.tool_name)
            && (self.risk.is_empty() || self.risk == risk_word(approval.risk()))
    }
}

/// Where an approval stands and who moved it: the part of the approval page that updates
/// live.
#[derive(Clone, Debug)]
pub struct Status {
    pub state: &'static str,
    pub pending: bool,
    /// "Approved by Alice (web)", "Rejected by Bob (telegram): too broad", ...
    pub outcome: String,
    pub quorum: String,
    pub decisions: Vec<TimelineEntry>,
}

#[derive(Clone, Debug)]
pub struct TimelineEntry {
    pub at: String,
    pub what: String,
}

impl Status {
    pub fn of(approval: &pb::Approval) -> Status {
        let state = approval.state();
        let outcome = match (&approval.resolution, state) {
            (_, pb::ApprovalState::Pending) => "Waiting for a decision".to_owned(),
            (Some(resolution), _) => outcome_text(approval, resolution),
            (None, _) => state_label(state).to_owned(),
        };
        Status {
            state: state_label(state),
            pending: state == pb::ApprovalState::Pending,
            outcome,
            quorum: quorum_text(approval),
            decisions: approval.decisions.iter().map(decision_entry).collect(),
        }
    }
}

/// "1 of 2 approvals", then each group's progress and the follow-up state when there are.
fn quorum_text(approval: &pb::Approval) -> String {
    let mut parts = vec![format!(
        "{} of {} approvals",
        approvals_so_far(approval),
        approval.required_approvals.max(1)
    )];
    parts.extend(groups::group_progress(approval));
    parts.extend(groups::follow_up_state(approval));
    parts.join(" · ")
}

fn outcome_text(approval: &pb::Approval, resolution: &pb::Resolution) -> String {
    let verdict = match (approval.state(), resolution.verdict()) {
        (pb::ApprovalState::Expired, _) => return "Expired without a decision".into(),
        (pb::ApprovalState::Cancelled, _) => {
            return format!(
                "{} by the agent{}",
                cancelled_word(approval),
                reason_suffix(&resolution.reason)
            )
        }
        (_, pb::Verdict::Reject) => "Rejected",
        _ => "Approved",
    };
    let by = match ApprovalFacts::of(approval).resolver {
        Some(Resolver::Rule(rule)) => format!("rule {}", one_line(rule, 128)),
        Some(Resolver::Grant(grant_id)) => format!("session grant {grant_id}"),
        Some(Resolver::Deciders(deciders)) => deciders
            .into_iter()
            .map(|d| decider_text(Some(d)))
            .collect::<Vec<_>>()
            .join(", "),
        None => String::new(),
    };
    format!("{verdict} by {by}{}", reason_suffix(&resolution.reason))
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {}", one_line(reason, 500))
    }
}

fn decision_entry(decision: &pb::Decision) -> TimelineEntry {
    let verdict = match decision.verdict() {
        pb::Verdict::Reject => "rejected",
        _ => "approved",
    };
    let scope = if decision.scope() == pb::Scope::Session {
        " for the session"
    } else {
        ""
    };
    let edited = match (
        decision.edited_arguments_json.is_empty(),
        decision.restarts_count,
    ) {
        (true, _) => "",
        (false, false) => " with edited arguments",
        (false, true) => " with edited arguments (the approval count restarted)",
    };
    TimelineEntry {
        at: time_text(decision.decided_at.as_ref()),
        what: format!(
            "{} {verdict}{scope}{}{edited}{}",
            decider_text(decision.decider.as_ref()),
            groups::on_behalf_of(decision)
                .map(|behalf| format!(" ({behalf})"))
                .unwrap_or_default(),
            reason_suffix(&decision.reason)
        ),
    }
}

pub fn delivery_entry(delivery: &pb::Delivery) -> TimelineEntry {
    TimelineEntry {
        at: time_text(delivery.recorded_at.as_ref()),
        what: format!(
            "delivered on {} to {} ({})",
            delivery.channel, delivery.target, delivery.message_ref
        ),
    }
}

pub fn event_entry(event: &pb::AuditEvent) -> Option<TimelineEntry> {
    let inner = event.event.as_ref()?;
    let kind = match inner.kind() {
        pb::EventKind::Requested => "requested".to_owned(),
        pb::EventKind::DecisionRecorded | pb::EventKind::DecisionRefused => {
            let decision = inner.decision.as_ref().map(decision_entry);
            let prefix = if inner.kind() == pb::EventKind::DecisionRefused {
                "refused: "
            } else {
                ""
            };
            format!(
                "{prefix}{}",
                decision
                    .map(|d| d.what)
                    .unwrap_or_else(|| "decision".into())
            )
        }
        pb::EventKind::Delivered => inner
            .delivery
            .as_ref()
            .map(|d| delivery_entry(d).what)
            .unwrap_or_else(|| "delivered".into()),
        other => other
            .as_str_name()
            .trim_start_matches("EVENT_KIND_")
            .to_lowercase()
            .replace('_', " "),
    };
    let detail = if event.detail.is_empty() {
        String::new()
    } else {
        format!(" — {}", one_line(&event.detail, 300))
    };
    Some(TimelineEntry {
        at: time_text(inner.at.as_ref()),
        what: format!("#{} {kind}{detail}", inner.seq),
    })
}

/// One line of a diff.
#[derive(Clone, Debug)]
pub struct DiffLine {
    /// `add`, `del`, `ctx` or `hunk`: the CSS class.
    pub class: &'static str,
    pub text: String,
}

/// A file edit found in the arguments, as a diff.
#[derive(Clone, Debug)]
pub struct Diff {
    pub title: String,
    pub lines: Vec<DiffLine>,
}

/// The full arguments pretty-printed (as sent when not JSON, which the server refuses anyway).
pub fn pretty_arguments(arguments_json: &str) -> String {
    serde_json::from_str::<Value>(arguments_json)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| arguments_json.to_owned())
}

/// The file edits in the arguments: `old_string`/`new_string` pairs (also inside an `edits`
/// list, as multi-edit tools send them) and unified patches (`patch` or `diff` strings).
pub fn diffs(arguments_json: &str) -> Vec<Diff> {
    let Ok(value) = serde_json::from_str::<Value>(arguments_json) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    collect_diffs(&value, &mut found);
    found
}

fn collect_diffs(value: &Value, found: &mut Vec<Diff>) {
    let Value::Object(map) = value else {
        if let Value::Array(items) = value {
            items.iter().for_each(|item| collect_diffs(item, found));
        }
        return;
    };
    let file = ["file_path", "path", "file"]
        .iter()
        .find_map(|key| map.get(*key).and_then(Value::as_str))
        .unwrap_or("");
    if let (Some(old), Some(new)) = (
        map.get("old_string").and_then(Value::as_str),
        map.get("new_string").and_then(Value::as_str),
    ) {
        found.push(Diff {
            title: format!("edit {file}"),
            lines: string_diff(old, new),
        });
    }
    for key in ["patch", "diff"] {
        if let Some(patch) = map.get(key).and_then(Value::as_str) {
            found.push(Diff {
                title: format!("{key} {file}"),
                lines: patch_lines(patch),
            });
        }
    }
    for (key, child) in map {
        if matches!(child, Value::Object(_) | Value::Array(_)) && key != "arguments_json" {
            collect_diffs(child, found);
        }
    }
}

fn string_diff(old: &str, new: &str) -> Vec<DiffLine> {
    use similar::{ChangeTag, TextDiff};
    TextDiff::from_lines(old, new)
        .iter_all_changes()
        .map(|change| {
            let (class, sign) = match change.tag() {
                ChangeTag::Delete => ("del", '-'),
                ChangeTag::Insert => ("add", '+'),
                ChangeTag::Equal => ("ctx", ' '),
            };
            DiffLine {
                class,
                text: format!("{sign}{}", change.value().trim_end_matches('\n')),
            }
        })
        .collect()
}

fn patch_lines(patch: &str) -> Vec<DiffLine> {
    patch
        .lines()
        .map(|line| DiffLine {
            class: if line.starts_with("@@") {
                "hunk"
            } else if line.starts_with('+') && !line.starts_with("+++") {
                "add"
            } else if line.starts_with('-') && !line.starts_with("---") {
                "del"
            } else {
                "ctx"
            },
            text: line.to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_and_patches_become_diffs() {
        let found = diffs(
            r#"{"file_path":"src/a.rs","old_string":"let a = 1;\nkeep\n","new_string":"let a = 2;\nkeep\n",
                "edits":[{"old_string":"x","new_string":"y"}],"patch":"@@ -1 +1 @@\n-old\n+new"}"#,
        );
        assert_eq!(found.len(), 3, "{found:?}");
        let classes: Vec<_> = found[0].lines.iter().map(|l| l.class).collect();
        assert_eq!(classes, ["del", "add", "ctx"]);
        assert_eq!(found[0].lines[0].text, "-let a = 1;");
        assert_eq!(found[0].title, "edit src/a.rs");
        let patch: Vec<_> = found
            .iter()
            .find(|d| d.title.starts_with("patch"))
            .unwrap()
            .lines
            .iter()
            .map(|l| l.class)
            .collect();
        assert_eq!(patch, ["hunk", "del", "add"]);
    }

    #[test]
    fn the_inbox_puts_risk_before_age() {
        let row = |id: &str, risk: u8, created_ms: i64| Row {
            id: id.into(),
            risk_rank: risk,
            created_ms,
            ..Row::of(&pb::Approval::default())
        };
        let mut rows = vec![
            row("old-low", 1, 1),
            row("new-high", 3, 9),
            row("old-high", 3, 2),
        ];
        sort_inbox(&mut rows);
        let ids: Vec<_> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["old-high", "new-high", "old-low"]);
    }

    #[test]
    fn a_withdrawn_approval_says_withdrawn() {
        let cancelled = |reason: &str| pb::Approval {
            state: pb::ApprovalState::Cancelled.into(),
            resolution: Some(pb::Resolution {
                resolved_by: pb::ResolvedBy::Cancellation.into(),
                reason: reason.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(Status::of(&cancelled("no longer needed"))
            .outcome
            .starts_with("Cancelled by the agent"));
        let withdrawn = Status::of(&cancelled("withdrawn: the caller left")).outcome;
        assert!(
            withdrawn.starts_with("Withdrawn by the agent"),
            "{withdrawn}"
        );
    }
}
