//! The approval's state machine: every transition is a method on [`Approval`] that either
//! refuses with an [`Error`] and leaves the approval untouched, or changes it and names the
//! event to append to the log.

use crate::approval::{
    Approval, ApprovalRequest, ArgsEdit, ConsumeOutcome, Consumption, DecideEffect, DecideOutcome,
    Decision, Delivery, Disposition, EditedVersion, EventKind, FollowUp, Millis, Resolution,
    ResolvedBy, Scope, State, Verdict,
};
use crate::step_up::StepUpProof;
use crate::Error;

impl Approval {
    /// A new approval from a validated request. `ttl_seconds` is the effective TTL.
    pub fn new(
        id: String,
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        now: Millis,
    ) -> Approval {
        let mut approval = Approval {
            id,
            agent_id: request.agent_id,
            session_id: request.session_id,
            requester: request.requester,
            idempotency_key: request.idempotency_key,
            tool_name: request.tool_name,
            arguments_json: request.arguments_json,
            args_digest: request.args_digest,
            action: request.action,
            reason: request.reason,
            risk: request.risk,
            routes: request.routes,
            required_approvals: request.required_approvals.max(1),
            labels: request.labels,
            state: State::Pending,
            decisions: Vec::new(),
            resolution: None,
            deliveries: Vec::new(),
            created_at: now,
            expires_at: now + i64::from(ttl_seconds) * 1000,
            consumption: None,
            policy_rule: request.policy_rule,
            separation_of_duties: request.separation_of_duties,
            grant_scope: request.grant_scope,
            edit: None,
            approver_groups: request.approver_groups,
            follow_up: request.follow_up.filter(FollowUp::is_active),
            withdraw_when_caller_leaves: request.withdraw_when_caller_leaves,
            receipt: None,
            step_up: request.step_up,
        };
        if let Disposition::Resolve {
            verdict,
            resolved_by,
            rule,
            grant_id,
            reason,
        } = disposition
        {
            approval.resolve(Resolution {
                verdict: Some(verdict),
                resolved_by,
                deciders: Vec::new(),
                rule,
                grant_id,
                reason,
                resolved_at: now,
                args_digest: String::new(),
            });
        }
        approval
    }

    /// Applies whatever is due of a pending approval at `now`: a timeout (expiry, or an
    /// escalation when the plan says so), an escalation or a reminder. Returns the event and
    /// its detail for the log, or `None` when nothing is due.
    pub fn follow_up_if_due(&mut self, now: Millis) -> Option<(EventKind, String)> {
        if !self.is_pending() || now < self.next_due() {
            return None;
        }
        if now >= self.expires_at && !self.escalates_on_timeout() {
            self.expire_if_due(now);
            let reason = self.resolution.as_ref().map(|r| r.reason.clone());
            return Some((EventKind::Expired, reason.unwrap_or_default()));
        }
        let waited = human_duration(now - self.created_at);
        let shortfall = self.shortfall();
        let ttl = self.expires_at - self.created_at;
        let follow_up = self.follow_up.as_mut()?;
        let escalation_due = follow_up.escalated_at.is_none()
            && follow_up.escalate_to.is_some()
            && (now >= self.expires_at
                || (follow_up.escalate_after_seconds > 0
                    && now
                        >= self.created_at + i64::from(follow_up.escalate_after_seconds) * 1000));
        if escalation_due {
            let target = follow_up.escalate_to.clone()?;
            follow_up.escalated_at = Some(now);
            if now >= self.expires_at {
                // On timeout: the escalation group gets a deadline as long as the first one.
                self.expires_at = now + ttl;
            }
            for route in &target.destinations {
                if !self.routes.is_empty() && !self.routes.contains(route) {
                    self.routes.push(route.clone());
                }
            }
            return Some((
                EventKind::Escalated,
                format!("escalated to {} after {waited}: {shortfall}", target.group),
            ));
        }
        follow_up.reminded_at = Some(now);
        Some((
            EventKind::Reminded,
            format!("reminder: {shortfall} after {waited}"),
        ))
    }

    fn resolve(&mut self, resolution: Resolution) {
        self.state = match (resolution.verdict, resolution.resolved_by) {
            (Some(Verdict::Approve), _) => State::Approved,
            (Some(Verdict::Reject), _) => State::Rejected,
            (None, ResolvedBy::Cancellation) => State::Cancelled,
            (None, _) => State::Expired,
        };
        self.resolution = Some(resolution);
    }

    /// The step-up rule: an approval a policy rule marked (`step_up`) is approved only by a
    /// decision that carries the second factor the server verified for it, and never with
    /// an edit (the factor signed the arguments as they are), and for this call only (a
    /// session grant would approve later calls without it). Rejecting needs nothing.
    pub fn check_step_up(
        &self,
        verdict: Verdict,
        scope: Scope,
        proof: Option<&StepUpProof>,
        edited: bool,
    ) -> Result<(), Error> {
        let Some(step_up) = self.step_up else {
            return Ok(());
        };
        if verdict != Verdict::Approve {
            return Ok(());
        }
        if edited {
            return Err(Error::PermissionDenied(format!(
                "approval {} needs a {} to approve, which signs the arguments as requested: it cannot be approved with edits (reject it and request the edited call anew)",
                self.id,
                step_up.as_str()
            )));
        }
        if scope == Scope::Session {
            return Err(Error::PermissionDenied(format!(
                "approval {} needs a {} to approve, for this call only: it cannot grant the session",
                self.id,
                step_up.as_str()
            )));
        }
        match proof {
            Some(proof) if proof.method == step_up => Ok(()),
            _ => Err(Error::PermissionDenied(format!(
                "approval {} can be approved only with a {}",
                self.id,
                step_up.as_str()
            ))),
        }
    }

    /// Expires a pending approval whose deadline has passed. Returns whether it changed.
    /// An approval whose plan escalates on timeout is left to the sweeper, which escalates
    /// it instead.
    pub fn expire_if_due(&mut self, now: Millis) -> bool {
        if !self.is_pending() || now < self.expires_at || self.escalates_on_timeout() {
            return false;
        }
        let reason = if self.approver_groups.is_empty()
            && self.follow_up.is_none()
            && self.approvals_so_far() == 0
        {
            "no decision before the approval expired".to_string()
        } else {
            format!(
                "{} within {}",
                self.shortfall(),
                human_duration(self.expires_at - self.created_at)
            )
        };
        self.resolve(Resolution {
            verdict: None,
            resolved_by: ResolvedBy::Expiry,
            deciders: Vec::new(),
            rule: None,
            grant_id: None,
            reason,
            resolved_at: now,
            args_digest: String::new(),
        });
        true
    }

    /// Applies a decision, with the arguments edited when `edit` is set (an approval of the
    /// edited version). Refusals of the decider (registry, ceiling, four-eyes) and policy on
    /// an edit happen before this, in the caller; here only the approval's own rules apply.
    ///
    /// Versions: an approval names the version the decider saw (`args_digest`); one naming
    /// another version than the current is refused. Naming none means the requested
    /// arguments, so once the approval has been edited an approval must name the version.
    /// Approvals count toward the quorum only for the current version: an edit that replaces
    /// a version with approvals restarts the count (`restarts_count`).
    pub fn decide(
        &mut self,
        mut decision: Decision,
        edit: Option<EditedVersion>,
        now: Millis,
    ) -> Result<DecideEffect, Error> {
        let unchanged = |outcome| DecideEffect {
            outcome,
            event: None,
            grants_session: false,
        };
        if self
            .decisions
            .iter()
            .any(|d| d.idempotency_key == decision.idempotency_key)
        {
            return Ok(unchanged(DecideOutcome::Duplicate));
        }
        if self.expire_if_due(now) {
            return Ok(DecideEffect {
                outcome: DecideOutcome::AlreadyResolved,
                event: Some(EventKind::Expired),
                grants_session: false,
            });
        }
        if !self.is_pending() {
            return Ok(unchanged(DecideOutcome::AlreadyResolved));
        }
        if decision.scope == Scope::Session && self.session_id.is_empty() {
            return Err(Error::invalid(
                "scope",
                "SCOPE_SESSION needs an approval with a session_id",
            ));
        }
        self.check_step_up(
            decision.verdict,
            decision.scope,
            decision.step_up.as_ref(),
            edit.is_some(),
        )?;
        let edit = self.place_version(&mut decision, edit)?;
        let same_vote_again = edit.is_none()
            && self.decisions.iter().any(|d| {
                d.approver == decision.approver
                    && d.verdict == decision.verdict
                    && (d.verdict == Verdict::Reject || self.version_of(d) == decision.args_digest)
            });
        if same_vote_again {
            return Ok(unchanged(DecideOutcome::Duplicate));
        }
        if let Some(edit) = edit {
            decision.restarts_count = self.approvals_so_far() > 0;
            decision.edited_arguments_json = edit.arguments_json.clone();
            self.edit = Some(edit);
        }

        let verdict = decision.verdict;
        let scope = decision.scope;
        let reason = decision.reason.clone();
        self.decisions.push(decision);
        let resolves = match verdict {
            Verdict::Reject => true,
            Verdict::Approve => {
                self.approvals_so_far() >= self.effective_required_approvals() as usize
                    && self
                        .group_progress()
                        .iter()
                        .all(|(g, n)| *n >= g.required as usize)
            }
        };
        if !resolves {
            return Ok(DecideEffect {
                outcome: DecideOutcome::Recorded,
                event: Some(EventKind::DecisionRecorded),
                grants_session: false,
            });
        }
        let deciders = match verdict {
            Verdict::Reject => self.decisions.last().map(|d| vec![d.decider.clone()]),
            Verdict::Approve => Some(
                self.decisions
                    .iter()
                    .filter(|d| {
                        d.verdict == Verdict::Approve && self.version_of(d) == self.current_digest()
                    })
                    .map(|d| d.decider.clone())
                    .collect(),
            ),
        }
        .unwrap_or_default();
        let args_digest = match verdict {
            Verdict::Approve => self.current_digest().to_owned(),
            Verdict::Reject => String::new(),
        };
        self.resolve(Resolution {
            verdict: Some(verdict),
            resolved_by: ResolvedBy::Decision,
            deciders,
            rule: None,
            grant_id: None,
            reason,
            resolved_at: now,
            args_digest,
        });
        Ok(DecideEffect {
            outcome: DecideOutcome::Resolved,
            event: Some(EventKind::Resolved),
            grants_session: verdict == Verdict::Approve && scope == Scope::Session,
        })
    }

    /// Checks the version `decision` is about against the current one and settles it in
    /// `decision.args_digest`; returns the edit to make, if `edit` is a new version.
    fn place_version(
        &self,
        decision: &mut Decision,
        edit: Option<EditedVersion>,
    ) -> Result<Option<ArgsEdit>, Error> {
        let current = self.current_digest().to_owned();
        // A rejection rejects whatever the version; an approval only the version named.
        if decision.verdict == Verdict::Approve
            && !decision.args_digest.is_empty()
            && decision.args_digest != current
        {
            return Err(Error::FailedPrecondition(format!(
                "approval {} now has arguments of version {current}, not {} which the decider saw (it was edited meanwhile); review the current arguments and decide again",
                self.id, decision.args_digest
            )));
        }
        match (decision.verdict, edit) {
            (Verdict::Reject, Some(_)) => Err(Error::invalid(
                "edited_arguments_json",
                "edited arguments go with VERDICT_APPROVE only; a rejection has nothing to edit",
            )),
            (Verdict::Approve, edit)
                if decision.scope == Scope::Session && (edit.is_some() || self.edit.is_some()) =>
            {
                Err(Error::invalid(
                    "scope",
                    "edited arguments are approved for this call only (SCOPE_ONCE), never for the session",
                ))
            }
            (Verdict::Reject, None) => {
                decision.args_digest = current;
                Ok(None)
            }
            (Verdict::Approve, None) => {
                if decision.args_digest.is_empty() {
                    if let Some(edit) = &self.edit {
                        return Err(Error::FailedPrecondition(format!(
                            "approval {} was edited by {} to version {}; an approval must name the version it approves (expected_args_digest) after reviewing the edited arguments",
                            self.id,
                            edit.editor.identity(),
                            edit.args_digest
                        )));
                    }
                    decision.args_digest = current;
                }
                Ok(None)
            }
            (Verdict::Approve, Some(version)) => {
                decision.args_digest = version.args_digest.clone();
                if version.args_digest == current {
                    // The edit is the current version: an approval of it, nothing to edit.
                    return Ok(None);
                }
                let edited = self.with_edit(&version, &decision.decider, decision.decided_at);
                Ok(edited.edit)
            }
        }
    }

    /// Cancels a pending approval (the requesting agent changed its mind).
    pub fn cancel(&mut self, reason: &str, now: Millis) -> Result<EventKind, Error> {
        if self.expire_if_due(now) {
            return Ok(EventKind::Expired);
        }
        if !self.is_pending() {
            return Err(Error::FailedPrecondition(format!(
                "approval {} is {}; only a pending approval can be cancelled",
                self.id,
                self.state.as_str()
            )));
        }
        self.resolve(Resolution {
            verdict: None,
            resolved_by: ResolvedBy::Cancellation,
            deciders: Vec::new(),
            rule: None,
            grant_id: None,
            reason: reason.to_string(),
            resolved_at: now,
            args_digest: String::new(),
        });
        Ok(EventKind::Cancelled)
    }

    /// Marks an approved call as executed. Exactly once.
    pub fn consume(
        &mut self,
        outcome: ConsumeOutcome,
        detail: &str,
        now: Millis,
    ) -> Result<EventKind, Error> {
        match self.state {
            State::Approved => {
                self.state = State::Consumed;
                self.consumption = Some(Consumption {
                    outcome,
                    detail: detail.to_string(),
                    consumed_at: now,
                });
                Ok(EventKind::Consumed)
            }
            State::Consumed => Err(Error::FailedPrecondition(format!(
                "approval {} was already consumed",
                self.id
            ))),
            other => Err(Error::FailedPrecondition(format!(
                "approval {} is {}; only an approved call can be consumed",
                self.id,
                other.as_str()
            ))),
        }
    }

    /// Refuses a consumption that reports running other arguments (`args_digest`, empty: not
    /// reported) than the approved version: the original ones after an approver edited them,
    /// or anything else. Only an approved call passes, so the version cannot change after.
    pub fn check_ran(&self, args_digest: &str) -> Result<(), Error> {
        if args_digest.is_empty() {
            return Ok(());
        }
        if self.state != State::Approved {
            return Err(Error::FailedPrecondition(format!(
                "approval {} is {}; only an approved call can be consumed",
                self.id,
                self.state.as_str()
            )));
        }
        if args_digest != self.current_digest() {
            return Err(Error::FailedPrecondition(format!(
                "approval {} approved the arguments with digest {}, not the {} reported as run",
                self.id,
                self.current_digest(),
                args_digest
            )));
        }
        Ok(())
    }

    /// Stores (or replaces) the platform message a worker created for this approval.
    pub fn record_delivery(&mut self, delivery: Delivery) -> EventKind {
        match self
            .deliveries
            .iter_mut()
            .find(|d| d.channel == delivery.channel && d.target == delivery.target)
        {
            Some(existing) => *existing = delivery,
            None => self.deliveries.push(delivery),
        }
        EventKind::Delivered
    }
}

/// A duration for people, in whole seconds rounded down: `45s`, `10m`, `2h`, `1h30m`.
pub fn human_duration(millis: Millis) -> String {
    let seconds = millis.max(0) / 1000;
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (hours, minutes, seconds) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

#[cfg(test)]
mod tests;
