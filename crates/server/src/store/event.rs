//! The stored event: one committed entry of the event log, how it is encoded in
//! `events.body` and read back against the approval's row, and the filters operators and
//! auditors read the log with (the queries are the backends').

use countersign_core::groups::FollowUp;
use countersign_core::{
    Approval, ArgsEdit, Consumption, Decision, Delivery, EventKind, Millis, Resolution, Route,
    State,
};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use crate::audit::{Columns, ARGUMENT_VALUES};
use countersign_core::canonical::to_canonical_json_with_and_without;

/// One committed entry of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: i64,
    pub kind: EventKind,
    pub at: Millis,
    pub approval: Approval,
    pub decision: Option<Decision>,
    pub delivery: Option<Delivery>,
    /// DECISION_REFUSED: why; GRANT_REVOKED: which grant and why; RULE_ACCEPTED: which rule,
    /// by whom, on what evidence.
    pub detail: Option<String>,
}

/// An event as the writer makes it: the approval as it is right after the event.
pub(crate) struct EventBody {
    pub approval: Approval,
    pub decision: Option<Decision>,
    pub delivery: Option<Delivery>,
    pub detail: Option<String>,
}

/// The JSON stored in `events.body`. A REQUESTED event stores the approval as requested,
/// without its argument values (the approval's row holds them; `args_digest` stands for them
/// in the hash chain); every later event stores only what the approval's changing parts are
/// right after it ([`Progress`]), so an event costs what changed, not a copy of the approval.
/// Rows written before this format (migration 0007) store the whole approval in every event
/// and are read as they are.
#[derive(Serialize, Deserialize)]
struct StoredBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<Approval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery: Option<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl StoredBody {
    /// [`Columns::of`] the body's JSON, from the types.
    fn columns(&self) -> Columns {
        let agent_id = match &self.approval {
            Some(approval) if !approval.agent_id.is_empty() => approval.agent_id.clone(),
            _ => self
                .after
                .as_ref()
                .map(|after| after.agent_id.clone())
                .unwrap_or_default(),
        };
        match &self.decision {
            Some(decision) => Columns {
                agent_id,
                decider: decision.decider.identity(),
                approver: decision.approver.clone(),
            },
            None => Columns {
                agent_id,
                ..Columns::default()
            },
        }
    }
}

/// The parts of an approval that change after its request, right after an event. Decisions
/// are only ever appended (each is in the event that added it), so with the approval as it is
/// now they give back the approval as it was then.
#[derive(Serialize, Deserialize)]
struct Progress {
    agent_id: String,
    state: State,
    decisions: usize,
    deliveries: Vec<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    consumption: Option<Consumption>,
    /// The current edit of the arguments, without their values (the row's decisions hold
    /// them; the edit's digest stands for them in the hash chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edit: Option<ArgsEdit>,
    /// With a follow-up plan: how far it went, and the deadline (an escalation on timeout
    /// moves it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    follow_up: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<Millis>,
    /// With a follow-up plan: the routes (an escalation adds its group's destinations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routes: Option<Vec<Route>>,
}

/// An event's stored form: the text of its body, the canonical JSON of that body without the
/// argument values (what its chain hash covers) and its columns.
pub(super) struct StoredForm {
    pub text: String,
    pub hashed: String,
    pub columns: Columns,
}

impl EventBody {
    /// The stored form of this event, written straight from the types: the same text,
    /// canonical content and columns as from the body's `serde_json::Value` (the keys of its
    /// objects in order, no floats among its numbers).
    pub(super) fn stored_form(&self, kind: EventKind) -> Result<StoredForm, StoreError> {
        let stored = self.stored(kind);
        let (text, hashed) = to_canonical_json_with_and_without(&stored, &ARGUMENT_VALUES)?;
        Ok(StoredForm {
            text,
            hashed,
            columns: stored.columns(),
        })
    }

    /// The JSON to store for this event.
    fn stored(&self, kind: EventKind) -> StoredBody {
        let (approval, after) = if kind == EventKind::Requested {
            let mut requested = self.approval.clone();
            requested.clear_argument_values();
            (Some(requested), None)
        } else {
            let edit = without_values(&self.approval.edit);
            let progress = Progress {
                agent_id: self.approval.agent_id.clone(),
                state: self.approval.state,
                decisions: self.approval.decisions.len(),
                deliveries: self.approval.deliveries.clone(),
                resolution: self.approval.resolution.clone(),
                consumption: self.approval.consumption.clone(),
                edit,
                follow_up: self.approval.follow_up.clone(),
                expires_at: self
                    .approval
                    .follow_up
                    .is_some()
                    .then_some(self.approval.expires_at),
                routes: self
                    .approval
                    .follow_up
                    .is_some()
                    .then(|| self.approval.routes.clone()),
            };
            (None, Some(progress))
        };
        // Edited argument values stay out of events like requested ones: the row keeps them,
        // the decision's args_digest stands for them.
        let decision = self.decision.clone().map(|mut decision| {
            decision.edited_arguments_json.clear();
            decision
        });
        StoredBody {
            approval,
            after,
            decision,
            delivery: self.delivery.clone(),
            detail: self.detail.clone(),
        }
    }

    /// Reads a stored body back; `current` is the approval as stored now (its row).
    pub(super) fn from_stored(
        body: &str,
        current: Option<Approval>,
    ) -> Result<EventBody, StoreError> {
        let stored: StoredBody = serde_json::from_str(body)?;
        let mut decision = stored.decision;
        if let (Some(decision), Some(current)) = (&mut decision, &current) {
            if let Some(recorded) = current
                .decisions
                .iter()
                .find(|d| d.idempotency_key == decision.idempotency_key)
            {
                decision.edited_arguments_json = recorded.edited_arguments_json.clone();
            }
        }
        let approval = match (stored.approval, stored.after, current) {
            (Some(mut approval), _, current) => {
                if approval.arguments_json.is_empty() {
                    if let Some(current) = &current {
                        approval.arguments_json = current.arguments_json.clone();
                        approval.restore_edited_values(current);
                    }
                }
                approval
            }
            (None, Some(after), Some(mut approval)) => {
                approval.state = after.state;
                approval.decisions.truncate(after.decisions);
                approval.deliveries = after.deliveries;
                approval.resolution = after.resolution;
                approval.consumption = after.consumption;
                let current = approval.clone();
                approval.edit = after.edit;
                approval.restore_edited_values(&current);
                if after.follow_up.is_some() {
                    approval.follow_up = after.follow_up;
                }
                if let Some(expires_at) = after.expires_at {
                    approval.expires_at = expires_at;
                }
                if let Some(routes) = after.routes {
                    approval.routes = routes;
                }
                // The row's receipt was signed at the resolution: not before it.
                if approval.is_pending() {
                    approval.receipt = None;
                }
                approval
            }
            _ => {
                return Err(StoreError::Corrupt(
                    "an event names an approval that is not stored".into(),
                ))
            }
        };
        Ok(EventBody {
            approval,
            decision,
            delivery: stored.delivery,
            detail: stored.detail,
        })
    }
}

/// Where an approval's stored row disagrees with its newest stored event (`newest_event`, a
/// stored body), argument values aside (redaction blanks them; the digest stands for them):
/// with an event of the lean form, the parts it records (state, decisions, deliveries,
/// resolution, consumption) must be the row's.
pub(crate) fn disagreement(row: &Approval, newest_event: &str) -> Option<String> {
    let stored: StoredBody = match serde_json::from_str(newest_event) {
        Ok(stored) => stored,
        Err(e) => return Some(format!("its newest event is not readable: {e}")),
    };
    let agrees = match (&stored.approval, &stored.after) {
        (Some(logged), _) => {
            let without_arguments = |approval: &Approval| {
                let mut approval = approval.clone();
                approval.clear_argument_values();
                approval
            };
            without_arguments(logged) == without_arguments(row)
        }
        (None, Some(after)) => {
            after.agent_id == row.agent_id
                && after.state == row.state
                && after.decisions == row.decisions.len()
                && after.deliveries == row.deliveries
                && after.resolution == row.resolution
                && after.consumption == row.consumption
                && without_values(&after.edit) == without_values(&row.edit)
                && after
                    .follow_up
                    .as_ref()
                    .is_none_or(|f| Some(f) == row.follow_up.as_ref())
                && after.expires_at.is_none_or(|at| at == row.expires_at)
                && after.routes.as_ref().is_none_or(|r| *r == row.routes)
        }
        (None, None) => false,
    };
    let logged_state = stored
        .approval
        .as_ref()
        .map(|a| a.state)
        .or(stored.after.as_ref().map(|a| a.state));
    (!agrees).then(|| match logged_state {
        Some(state) => format!(
            "its row says {} but its newest event says {}",
            row.state.as_str(),
            state.as_str()
        ),
        None => "its newest event records no approval".to_string(),
    })
}

/// An edit with its argument values blanked, as events record it.
fn without_values(edit: &Option<ArgsEdit>) -> Option<ArgsEdit> {
    edit.clone().map(|mut edit| {
        edit.arguments_json.clear();
        edit
    })
}

#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub approval_id: String,
    pub kinds: Vec<EventKind>,
    pub agent_id: String,
    /// A decider identity `channel:user_id` or an approver id.
    pub decider: String,
    /// When `decider` is a registered approver's id: that approver's identities
    /// (`channel:value`), so that what they decided for someone else (a delegation) and what
    /// was refused to them (recorded under the identity they decided with) are found too.
    pub decider_identities: Vec<String>,
    /// Inclusive.
    pub since: Option<Millis>,
    /// Exclusive.
    pub until: Option<Millis>,
    pub newest_first: bool,
    /// The seq the previous page ended with.
    pub after_seq: Option<i64>,
    pub limit: u32,
}

/// One row of the audit trail with its place in the hash chain.
#[derive(Debug, Clone)]
pub struct AuditedEvent {
    pub event: StoredEvent,
    pub prev_hash: String,
    pub hash: String,
}

#[cfg(test)]
mod tests {
    use countersign_core::validate::{validate_request, Limits, RequestInput};
    use countersign_core::{Decider, Decision, Delivery, Disposition, Scope, Verdict};
    use serde_json::Value;

    use super::*;
    use crate::audit::{content_before_seq, content_before_seq_of};

    #[test]
    fn the_stored_form_from_the_types_is_the_one_of_the_json_value() {
        let input = RequestInput {
            agent_id: "agent-1".into(),
            session_id: "s1".into(),
            requester: "ève".into(),
            idempotency_key: "call-1".into(),
            tool_name: "bash".into(),
            risk: Some(countersign_core::Risk::High),
            arguments_json: r#"{"command": "rm -rf /tmp/x", "n": 1.5}"#.into(),
            labels: [("b".into(), "2".into()), ("a".into(), "1".into())].into(),
            ..RequestInput::default()
        };
        let request = validate_request(input, &Limits::default()).expect("valid request");
        let mut approval = Approval::new("a1".into(), request, 60, Disposition::RequireHuman, 5);
        // Text that needs every kind of escape (validation keeps controls out of the ids).
        approval.reason = "why \"now\"\n\u{1}\u{7f}\\ \u{202e}".into();
        approval.labels.insert("tab\there".into(), "é\u{8}".into());
        let decision = Decision {
            verdict: Verdict::Approve,
            scope: Scope::Once,
            reason: "ok\u{202e}".into(),
            decider: Decider {
                channel: "telegram".into(),
                user_id: "42".into(),
                display_name: "Ann".into(),
            },
            idempotency_key: "d1".into(),
            decided_at: 6,
            approver: "ann".into(),
            args_digest: String::new(),
            edited_arguments_json: "{\"x\":1}".into(),
            restarts_count: false,
            delegate: None,
            step_up: None,
        };
        let delivery = Delivery {
            channel: "telegram".into(),
            target: "ops".into(),
            message_ref: "m1".into(),
            recorded_at: 7,
        };
        for kind in EventKind::ALL {
            for (decision, delivery, detail) in [
                (None, None, None),
                (
                    Some(decision.clone()),
                    Some(delivery.clone()),
                    Some("why".into()),
                ),
            ] {
                let body = EventBody {
                    approval: approval.clone(),
                    decision,
                    delivery,
                    detail,
                };
                let form = body.stored_form(kind).expect("stored form");
                // What the server wrote before: the body's serde_json::Value.
                let mut json = serde_json::to_value(body.stored(kind)).expect("a value");
                assert_eq!(form.text, json.to_string(), "{kind:?}");
                assert_eq!(form.columns, Columns::of(&json), "{kind:?}");
                assert_eq!(
                    content_before_seq_of("a1", kind.as_str(), 5, &form.hashed),
                    content_before_seq("a1", kind.as_str(), 5, &mut json),
                    "{kind:?}"
                );
                let read: Value = serde_json::from_str(&form.text).expect("JSON");
                assert_eq!(read, json);
            }
        }
    }
}
