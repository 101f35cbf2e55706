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

impl EventBody {
    /// The JSON to store for this event.
    pub(super) fn stored(&self, kind: EventKind) -> Result<serde_json::Value, StoreError> {
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
        Ok(serde_json::to_value(StoredBody {
            approval,
            after,
            decision,
            delivery: self.delivery.clone(),
            detail: self.detail.clone(),
        })?)
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
