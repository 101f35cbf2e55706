//! The approval and its state machine.
//!
//! Every transition is a method on [`Approval`] that either refuses with an [`Error`] and
//! leaves the approval untouched, or changes it and names the event to append to the log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::groups::{human_duration, FollowUp, GroupQuorum, OnTimeout};
use crate::Error;

/// Milliseconds since the Unix epoch. The server supplies the clock.
pub type Millis = i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Risk {
    Low,
    Medium,
    High,
    Critical,
}

impl Risk {
    pub const ALL: [Risk; 4] = [Risk::Low, Risk::Medium, Risk::High, Risk::Critical];

    /// LOW = 1 … CRITICAL = 4, for comparisons in storage.
    pub fn rank(self) -> i64 {
        match self {
            Risk::Low => 1,
            Risk::Medium => 2,
            Risk::High => 3,
            Risk::Critical => 4,
        }
    }

    /// The name used in storage and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "LOW",
            Risk::Medium => "MEDIUM",
            Risk::High => "HIGH",
            Risk::Critical => "CRITICAL",
        }
    }

    /// A risk level by name, in any case (`high`, `HIGH`), as configuration files write it.
    pub fn parse(name: &str) -> Option<Risk> {
        Risk::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(name))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    Pending,
    Approved,
    Rejected,
    Expired,
    Cancelled,
    Consumed,
}

impl State {
    pub const ALL: [State; 6] = [
        State::Pending,
        State::Approved,
        State::Rejected,
        State::Expired,
        State::Cancelled,
        State::Consumed,
    ];

    /// The name used in storage and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "PENDING",
            State::Approved => "APPROVED",
            State::Rejected => "REJECTED",
            State::Expired => "EXPIRED",
            State::Cancelled => "CANCELLED",
            State::Consumed => "CONSUMED",
        }
    }

    pub fn parse(name: &str) -> Option<State> {
        State::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Approve,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Scope {
    Once,
    Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResolvedBy {
    Decision,
    Rule,
    Grant,
    Expiry,
    Cancellation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConsumeOutcome {
    Succeeded,
    Failed,
    /// Handed to the host that runs it (a coding agent's hook); how it went is not reported.
    HandedOff,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Route {
    pub channel: String,
    /// Empty: the channel worker's default target.
    #[serde(default)]
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Decider {
    pub channel: String,
    pub user_id: String,
    pub display_name: String,
}

impl Decider {
    /// The identity quorum counts when no approver registry maps it to a person.
    pub fn identity(&self) -> String {
        format!("{}:{}", self.channel, self.user_id)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub scope: Scope,
    pub reason: String,
    pub decider: Decider,
    pub idempotency_key: String,
    pub decided_at: Millis,
    /// Who this decider is for quorum purposes: a registry approver id, or the decider's
    /// channel identity. The same person on two channels counts once.
    pub approver: String,
    /// The version of the arguments decided on (their digest). On the way in: the version the
    /// decider saw, empty when they named none; stored: the version decided. Empty in
    /// decisions stored before edits existed: the requested arguments.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub args_digest: String,
    /// Set when this decision edited the arguments (see [`ArgsEdit`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub edited_arguments_json: String,
    /// This edit replaced a version that had approvals, which stopped counting.
    #[serde(default, skip_serializing_if = "is_false")]
    pub restarts_count: bool,
    /// The approver id of the person who decided for `approver` under a delegation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate: Option<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The arguments an approver edited, as the server validated them and what policy requires
/// for them (never less than the approval required before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditedVersion {
    pub arguments_json: String,
    pub args_digest: String,
    pub risk: Risk,
    pub required_approvals: u32,
    pub separation_of_duties: bool,
}

/// The current edit of an approval's arguments (edit-on-approve). The requested arguments
/// stay in [`Approval::arguments_json`]; the runtime executes these instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgsEdit {
    pub arguments_json: String,
    pub args_digest: String,
    pub editor: Decider,
    pub edited_at: Millis,
    /// What policy requires for the edited arguments, at least what the approval required.
    pub risk: Risk,
    pub required_approvals: u32,
    pub separation_of_duties: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolution {
    pub verdict: Option<Verdict>,
    pub resolved_by: ResolvedBy,
    pub deciders: Vec<Decider>,
    pub rule: Option<String>,
    pub grant_id: Option<String>,
    pub reason: String,
    pub resolved_at: Millis,
    /// An approval by people: the digest of the version approved (the edited one when
    /// edited), which the execution is bound to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub args_digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub channel: String,
    pub target: String,
    pub message_ref: String,
    pub recorded_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumption {
    pub outcome: ConsumeOutcome,
    pub detail: String,
    pub consumed_at: Millis,
}

/// A validated request for approval, before policy and storage give it an id and a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    pub agent_id: String,
    pub session_id: String,
    pub requester: String,
    pub idempotency_key: String,
    pub tool_name: String,
    /// The caller's JSON text, kept as given.
    pub arguments_json: String,
    pub args_digest: String,
    pub action: String,
    pub reason: String,
    pub risk: Risk,
    pub routes: Vec<Route>,
    pub required_approvals: u32,
    /// Seconds; `None` means the server default.
    pub ttl_seconds: Option<u32>,
    pub labels: BTreeMap<String, String>,
    /// The policy rule that matched the request, if any.
    pub policy_rule: Option<String>,
    /// Whether the requester is barred from approving it (four-eyes rule).
    pub separation_of_duties: bool,
    /// What a session grant made from it is bound to, beyond agent, session and tool: the
    /// argument parts a policy rule names, as canonical JSON; empty: any arguments.
    pub grant_scope: String,
    /// Groups that must each approve (all of them); see [`crate::groups::Groups::resolve`].
    pub approver_groups: Vec<GroupQuorum>,
    /// Reminder, escalation and timeout plan; `None`: expire at the deadline.
    pub follow_up: Option<FollowUp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub agent_id: String,
    pub session_id: String,
    pub requester: String,
    pub idempotency_key: String,
    pub tool_name: String,
    pub arguments_json: String,
    pub args_digest: String,
    pub action: String,
    pub reason: String,
    pub risk: Risk,
    pub routes: Vec<Route>,
    pub required_approvals: u32,
    pub labels: BTreeMap<String, String>,
    pub state: State,
    pub decisions: Vec<Decision>,
    pub resolution: Option<Resolution>,
    pub deliveries: Vec<Delivery>,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub consumption: Option<Consumption>,
    /// The policy rule that matched the request; `None` when none did (a human decides).
    #[serde(default)]
    pub policy_rule: Option<String>,
    /// Whether an approver identified as the requester is barred from approving it.
    /// Approvals stored before this field existed get the safe default.
    #[serde(default = "separation_of_duties_default")]
    pub separation_of_duties: bool,
    /// See [`ApprovalRequest::grant_scope`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub grant_scope: String,
    /// The arguments as an approver edited them; `None`: as requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit: Option<ArgsEdit>,
    /// Groups that must each approve with their quorum, as they were when requested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approver_groups: Vec<GroupQuorum>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up: Option<FollowUp>,
}

fn separation_of_duties_default() -> bool {
    true
}

/// What a change appends to the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    Requested,
    DecisionRecorded,
    DecisionRefused,
    Resolved,
    Expired,
    Cancelled,
    Consumed,
    Delivered,
    GrantRevoked,
    /// Nobody decided within the reminder time: the channels remind the deciders.
    Reminded,
    /// The approval went to the escalation group.
    Escalated,
}

impl EventKind {
    pub const ALL: [EventKind; 11] = [
        EventKind::Requested,
        EventKind::DecisionRecorded,
        EventKind::DecisionRefused,
        EventKind::Resolved,
        EventKind::Expired,
        EventKind::Cancelled,
        EventKind::Consumed,
        EventKind::Delivered,
        EventKind::GrantRevoked,
        EventKind::Reminded,
        EventKind::Escalated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Requested => "REQUESTED",
            EventKind::DecisionRecorded => "DECISION_RECORDED",
            EventKind::DecisionRefused => "DECISION_REFUSED",
            EventKind::Resolved => "RESOLVED",
            EventKind::Expired => "EXPIRED",
            EventKind::Cancelled => "CANCELLED",
            EventKind::Consumed => "CONSUMED",
            EventKind::Delivered => "DELIVERED",
            EventKind::GrantRevoked => "GRANT_REVOKED",
            EventKind::Reminded => "REMINDED",
            EventKind::Escalated => "ESCALATED",
        }
    }

    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecideOutcome {
    Recorded,
    Resolved,
    AlreadyResolved,
    Duplicate,
}

/// The result of [`Approval::decide`]: the answer for the caller and the event to append,
/// if the approval changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideEffect {
    pub outcome: DecideOutcome,
    pub event: Option<EventKind>,
    /// Set when this decision resolved the approval as approved for the whole session.
    pub grants_session: bool,
}

/// How a new approval starts: waiting for people, or already decided by policy or a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    RequireHuman,
    Resolve {
        verdict: Verdict,
        resolved_by: ResolvedBy,
        rule: Option<String>,
        grant_id: Option<String>,
        reason: String,
    },
}

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

    /// Whether `request` asks for the same call as this approval, so that it is an idempotent
    /// repeat: the same tool, session and arguments. Anything else under the same idempotency
    /// key is another call and must not inherit this approval's decision.
    pub fn is_same_call(&self, request: &ApprovalRequest) -> bool {
        self.tool_name == request.tool_name
            && self.session_id == request.session_id
            && self.args_digest == request.args_digest
    }

    pub fn is_pending(&self) -> bool {
        self.state == State::Pending
    }

    /// Whether this approval is shown on `channel`: routed there, or routed nowhere.
    pub fn is_routed_to(&self, channel: &str) -> bool {
        channel.is_empty()
            || self.routes.is_empty()
            || self.routes.iter().any(|r| r.channel == channel)
    }

    /// Blanks every argument value this approval holds, requested and edited (for redaction
    /// and for the event log, where the digests stand for them).
    pub fn clear_argument_values(&mut self) {
        self.arguments_json.clear();
        if let Some(edit) = &mut self.edit {
            edit.arguments_json.clear();
        }
        for decision in &mut self.decisions {
            decision.edited_arguments_json.clear();
        }
    }

    /// Puts back edited argument values blanked by [`Approval::clear_argument_values`] from
    /// `source`, the same approval as stored with them (its decisions hold every version).
    pub fn restore_edited_values(&mut self, source: &Approval) {
        let edited = |digest: &str| {
            source
                .decisions
                .iter()
                .find(|d| d.args_digest == digest && !d.edited_arguments_json.is_empty())
                .map(|d| d.edited_arguments_json.clone())
        };
        if let Some(edit) = &mut self.edit {
            if let Some(text) = edited(&edit.args_digest) {
                edit.arguments_json = text;
            }
        }
        for decision in &mut self.decisions {
            if decision.edited_arguments_json.is_empty() {
                if let Some(original) = source
                    .decisions
                    .iter()
                    .find(|d| d.idempotency_key == decision.idempotency_key)
                {
                    decision.edited_arguments_json = original.edited_arguments_json.clone();
                }
            }
        }
    }

    /// The digest of the arguments to execute: the edited ones when edited.
    pub fn current_digest(&self) -> &str {
        self.edit
            .as_ref()
            .map_or(&self.args_digest, |edit| &edit.args_digest)
    }

    /// The arguments to execute: the edited ones when edited.
    pub fn current_arguments(&self) -> &str {
        self.edit
            .as_ref()
            .map_or(&self.arguments_json, |edit| &edit.arguments_json)
    }

    /// The risk deciders are checked against: raised by an edit, never lowered.
    pub fn effective_risk(&self) -> Risk {
        self.edit
            .as_ref()
            .map_or(self.risk, |edit| edit.risk.max(self.risk))
    }

    /// The distinct approvers of the current version needed to approve.
    pub fn effective_required_approvals(&self) -> u32 {
        self.edit.as_ref().map_or(self.required_approvals, |edit| {
            edit.required_approvals.max(self.required_approvals)
        })
    }

    pub fn effective_separation_of_duties(&self) -> bool {
        self.separation_of_duties || self.edit.as_ref().is_some_and(|e| e.separation_of_duties)
    }

    /// Whether `decision` is about the current version of the arguments.
    pub fn is_current(&self, decision: &Decision) -> bool {
        self.version_of(decision) == self.current_digest()
    }

    /// The version `decision` is about (decisions stored before edits name none: the
    /// requested arguments).
    fn version_of<'a>(&'a self, decision: &'a Decision) -> &'a str {
        if decision.args_digest.is_empty() {
            &self.args_digest
        } else {
            &decision.args_digest
        }
    }

    /// This approval as it would be with `version` applied by `editor`: what the approver
    /// registry checks an edit against (the raised risk, the four-eyes rule).
    pub fn with_edit(&self, version: &EditedVersion, editor: &Decider, now: Millis) -> Approval {
        let mut edited = self.clone();
        edited.edit = Some(ArgsEdit {
            arguments_json: version.arguments_json.clone(),
            args_digest: version.args_digest.clone(),
            editor: editor.clone(),
            edited_at: now,
            risk: version.risk.max(self.effective_risk()),
            required_approvals: version
                .required_approvals
                .max(self.effective_required_approvals()),
            separation_of_duties: version.separation_of_duties
                || self.effective_separation_of_duties(),
        });
        edited
    }

    /// The distinct approvers who approved the current version so far.
    pub fn approvals_so_far(&self) -> usize {
        self.current_approvers().len()
    }

    /// Who approved the current version, each once.
    fn current_approvers(&self) -> Vec<&str> {
        let mut approvers: Vec<&str> = self
            .decisions
            .iter()
            .filter(|d| d.verdict == Verdict::Approve && self.is_current(d))
            .map(|d| d.approver.as_str())
            .collect();
        approvers.sort_unstable();
        approvers.dedup();
        approvers
    }

    /// The group the approval was escalated to, once it was.
    fn escalation_group(&self) -> Option<&GroupQuorum> {
        self.follow_up
            .as_ref()
            .filter(|f| f.escalated_at.is_some())
            .and_then(|f| f.escalate_to.as_ref())
    }

    /// The groups that decide this approval: its own and, once escalated, the escalation
    /// group. Empty: any registered approver decides.
    pub fn deciding_groups(&self) -> impl Iterator<Item = &GroupQuorum> {
        self.approver_groups.iter().chain(self.escalation_group())
    }

    /// Whether `approver` belongs to a group that decides this approval. Without group
    /// requirements every approver may decide, escalated or not: an escalation widens who is
    /// asked, it never narrows it.
    pub fn is_decider(&self, approver: &str) -> bool {
        self.approver_groups.is_empty()
            || self
                .deciding_groups()
                .any(|g| g.members.iter().any(|m| m == approver))
    }

    /// For each group requirement: the distinct approvers who approved the current version
    /// and count for it (its members and, after an escalation, the escalation group's members).
    pub fn group_progress(&self) -> Vec<(&GroupQuorum, usize)> {
        let escalation = self.escalation_group().map_or(&[][..], |g| &g.members[..]);
        let approvers = self.current_approvers();
        self.approver_groups
            .iter()
            .map(|group| {
                let counted = approvers
                    .iter()
                    .filter(|a| group.members.iter().chain(escalation).any(|m| m == *a))
                    .count();
                (group, counted)
            })
            .collect()
    }

    /// What the approval still lacks, for the reminder, escalation and expiry messages. While
    /// nobody has approved the current version: who it waits for (`no decision from db or
    /// security`; the escalation group too once escalated). After an approval, what is
    /// missing, group by group: `only 1 of 2 approvals from security` where members approved,
    /// `no decision from db` where none did, `… or oncall` once escalated (its members count
    /// for every group), and `only 1 of 2 approvals (in all)` when `required_approvals` asks
    /// for more people than the groups still need. Never "no decision" from a group a member
    /// of which approved.
    fn shortfall(&self) -> String {
        let escalation = self.escalation_group().map(|g| g.group.as_str());
        let unmet: Vec<(&GroupQuorum, usize)> = self
            .group_progress()
            .into_iter()
            .filter(|(g, n)| *n < g.required as usize)
            .collect();
        let approved = self.approvals_so_far();
        if approved == 0 {
            let waited: Vec<&str> = unmet
                .iter()
                .map(|(g, _)| g.group.as_str())
                .chain(escalation)
                .collect();
            return format!("no decision from {}", either_of(&waited, "an approver"));
        }
        let counted = |group: &str| match escalation {
            Some(escalation) => format!("{group} or {escalation}"),
            None => group.to_owned(),
        };
        let mut missing: Vec<String> = unmet
            .iter()
            .map(|(g, n)| match n {
                0 => format!("no decision from {}", counted(&g.group)),
                n => format!(
                    "only {n} of {} approvals from {}",
                    g.required,
                    counted(&g.group)
                ),
            })
            .collect();
        let required = self.effective_required_approvals() as usize;
        let groups_still_need: usize = unmet.iter().map(|(g, n)| g.required as usize - n).sum();
        if approved + groups_still_need < required {
            let in_all = if missing.is_empty() { "" } else { " in all" };
            missing.push(format!("only {approved} of {required} approvals{in_all}"));
        }
        missing.join(" and ")
    }

    /// When the approval next needs the sweeper: its deadline, or an earlier reminder or
    /// escalation.
    pub fn next_due(&self) -> Millis {
        let mut due = self.expires_at;
        if let Some(f) = &self.follow_up {
            if f.remind_after_seconds > 0 && f.reminded_at.is_none() && f.escalated_at.is_none() {
                due = due.min(self.created_at + i64::from(f.remind_after_seconds) * 1000);
            }
            if f.escalate_after_seconds > 0 && f.escalate_to.is_some() && f.escalated_at.is_none() {
                due = due.min(self.created_at + i64::from(f.escalate_after_seconds) * 1000);
            }
        }
        due
    }

    /// Whether the deadline escalates instead of expiring (once).
    fn escalates_on_timeout(&self) -> bool {
        self.follow_up.as_ref().is_some_and(|f| {
            f.on_timeout == OnTimeout::Escalate
                && f.escalate_to.is_some()
                && f.escalated_at.is_none()
        })
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

    pub fn resolved_at(&self) -> Option<Millis> {
        self.resolution.as_ref().map(|r| r.resolved_at)
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

/// `db`, `db or security`, `db, security or oncall`; `none` when there are no names.
fn either_of(names: &[&str], none: &str) -> String {
    match names {
        [] => none.to_owned(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(required: u32) -> ApprovalRequest {
        ApprovalRequest {
            agent_id: "agent".into(),
            session_id: "s1".into(),
            requester: "alice".into(),
            idempotency_key: "call-1".into(),
            tool_name: "bash".into(),
            arguments_json: "{}".into(),
            args_digest: "d".into(),
            action: "run".into(),
            reason: String::new(),
            risk: Risk::High,
            routes: Vec::new(),
            required_approvals: required,
            ttl_seconds: None,
            labels: BTreeMap::new(),
            policy_rule: None,
            separation_of_duties: true,
            grant_scope: String::new(),
            approver_groups: Vec::new(),
            follow_up: None,
        }
    }

    fn decision(user: &str, verdict: Verdict, key: &str) -> Decision {
        let decider = Decider {
            channel: "telegram".into(),
            user_id: user.into(),
            display_name: user.into(),
        };
        Decision {
            verdict,
            scope: Scope::Once,
            reason: String::new(),
            approver: decider.identity(),
            decider,
            idempotency_key: key.into(),
            decided_at: 5,
            args_digest: String::new(),
            edited_arguments_json: String::new(),
            restarts_count: false,
            delegate: None,
        }
    }

    fn pending(required: u32) -> Approval {
        Approval::new(
            "a1".into(),
            request(required),
            60,
            Disposition::RequireHuman,
            0,
        )
    }

    #[test]
    fn quorum_counts_distinct_approvers_and_one_reject_resolves() {
        let mut a = pending(2);
        let first = a
            .decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        assert_eq!(first.outcome, DecideOutcome::Recorded);
        assert_eq!(first.event, Some(EventKind::DecisionRecorded));
        let again = a
            .decide(decision("u1", Verdict::Approve, "k2"), None, 2)
            .unwrap();
        assert_eq!(again.outcome, DecideOutcome::Duplicate);
        let reject = a
            .decide(decision("u1", Verdict::Reject, "k3"), None, 3)
            .unwrap();
        assert_eq!(reject.outcome, DecideOutcome::Resolved);
        assert_eq!(a.state, State::Rejected);
        let late = a
            .decide(decision("u2", Verdict::Approve, "k4"), None, 4)
            .unwrap();
        assert_eq!(late.outcome, DecideOutcome::AlreadyResolved);
        assert_eq!(late.event, None);
        assert_eq!(a.decisions.len(), 2);
    }

    #[test]
    fn a_repeated_idempotency_key_is_a_duplicate_even_after_resolution() {
        let mut a = pending(1);
        assert_eq!(
            a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
                .unwrap()
                .outcome,
            DecideOutcome::Resolved
        );
        assert_eq!(
            a.decide(decision("u1", Verdict::Approve, "k1"), None, 2)
                .unwrap()
                .outcome,
            DecideOutcome::Duplicate
        );
    }

    #[test]
    fn an_approval_past_its_deadline_cannot_be_approved() {
        let mut a = pending(1);
        let effect = a
            .decide(decision("u1", Verdict::Approve, "k1"), None, 60_000)
            .unwrap();
        assert_eq!(effect.outcome, DecideOutcome::AlreadyResolved);
        assert_eq!(effect.event, Some(EventKind::Expired));
        assert_eq!(a.state, State::Expired);
        assert!(a.decisions.is_empty());
    }

    #[test]
    fn session_scope_needs_a_session_and_grants_on_approval() {
        let mut a = pending(1);
        let mut d = decision("u1", Verdict::Approve, "k1");
        d.scope = Scope::Session;
        assert!(a.decide(d.clone(), None, 1).unwrap().grants_session);

        let mut no_session = pending(1);
        no_session.session_id.clear();
        let err = no_session.decide(d, None, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { ref field, .. } if field == "scope"));
        assert!(no_session.decisions.is_empty());
    }

    #[test]
    fn consume_only_once_and_only_after_approval() {
        let mut a = pending(1);
        assert!(a.consume(ConsumeOutcome::Succeeded, "", 1).is_err());
        a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        assert_eq!(
            a.consume(ConsumeOutcome::Succeeded, "ok", 2).unwrap(),
            EventKind::Consumed
        );
        assert!(matches!(
            a.consume(ConsumeOutcome::Succeeded, "", 3),
            Err(Error::FailedPrecondition(_))
        ));
    }

    fn version(arguments: &str, digest: &str) -> EditedVersion {
        EditedVersion {
            arguments_json: arguments.into(),
            args_digest: digest.into(),
            risk: Risk::High,
            required_approvals: 1,
            separation_of_duties: true,
        }
    }

    #[test]
    fn an_edit_after_an_approval_restarts_the_count_and_stale_versions_are_refused() {
        let mut a = pending(2);
        a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        assert_eq!(a.approvals_so_far(), 1);
        let effect = a
            .decide(
                decision("u2", Verdict::Approve, "k2"),
                Some(version("{\"x\":1}", "e1")),
                2,
            )
            .unwrap();
        assert_eq!(effect.outcome, DecideOutcome::Recorded);
        assert!(a.decisions[1].restarts_count);
        assert_eq!(a.current_digest(), "e1");
        assert_eq!(a.approvals_so_far(), 1, "only u2's approval of e1 counts");

        // No version named after an edit, or the old one: refused, nothing changes.
        let before = a.clone();
        for named in ["", "d"] {
            let mut stale = decision("u1", Verdict::Approve, "k3");
            stale.args_digest = named.into();
            assert!(matches!(
                a.decide(stale, None, 3),
                Err(Error::FailedPrecondition(_))
            ));
            assert_eq!(a, before);
        }
        let mut current = decision("u1", Verdict::Approve, "k4");
        current.args_digest = "e1".into();
        assert_eq!(
            a.decide(current, None, 4).unwrap().outcome,
            DecideOutcome::Resolved
        );
        let resolution = a.resolution.as_ref().unwrap();
        assert_eq!(resolution.args_digest, "e1");
        assert_eq!(resolution.deciders.len(), 2);
    }

    #[test]
    fn an_edit_goes_with_an_approval_of_this_call_only() {
        let mut a = pending(1);
        let reject = a.decide(
            decision("u1", Verdict::Reject, "k1"),
            Some(version("{}", "e1")),
            1,
        );
        assert!(
            matches!(reject, Err(Error::InvalidArgument { ref field, .. }) if field == "edited_arguments_json")
        );
        let mut session = decision("u1", Verdict::Approve, "k2");
        session.scope = Scope::Session;
        let refused = a.decide(session, Some(version("{}", "e1")), 2);
        assert!(
            matches!(refused, Err(Error::InvalidArgument { ref field, .. }) if field == "scope")
        );
        assert!(a.decisions.is_empty() && a.edit.is_none());
    }

    #[test]
    fn cancel_only_while_pending() {
        let mut a = pending(1);
        assert_eq!(
            a.cancel("changed my mind", 1).unwrap(),
            EventKind::Cancelled
        );
        assert_eq!(a.state, State::Cancelled);
        assert!(a.cancel("again", 2).is_err());
    }

    #[test]
    fn follow_up_reminds_then_escalates_then_expires_with_the_reason() {
        use crate::groups::{FollowUp, GroupQuorum, OnTimeout};
        let group = |name: &str, member: &str| GroupQuorum {
            group: name.into(),
            required: 1,
            members: vec![member.into()],
            ..Default::default()
        };
        let mut req = request(1);
        req.approver_groups = vec![group("security", "telegram:u1")];
        req.follow_up = Some(FollowUp {
            remind_after_seconds: 10,
            escalate_after_seconds: 20,
            escalate_to: Some(group("oncall", "telegram:u9")),
            on_timeout: OnTimeout::Escalate,
            ..Default::default()
        });
        let mut a = Approval::new("a1".into(), req, 60, Disposition::RequireHuman, 0);
        assert_eq!(a.next_due(), 10_000);
        assert_eq!(a.follow_up_if_due(9_999), None);
        assert!(!a.is_decider("telegram:u9"));
        let (kind, detail) = a.follow_up_if_due(10_000).unwrap();
        assert_eq!(kind, EventKind::Reminded);
        assert_eq!(detail, "reminder: no decision from security after 10s");
        assert_eq!(a.next_due(), 20_000);
        let (kind, _) = a.follow_up_if_due(20_000).unwrap();
        assert_eq!(kind, EventKind::Escalated);
        assert!(a.is_decider("telegram:u9"));
        // Escalated before the deadline: on_timeout = escalate gives no second deadline; the
        // deadline expires it, naming who was waited for.
        assert_eq!(a.expires_at, 60_000);
        assert_eq!(a.next_due(), 60_000);
        let (kind, reason) = a.follow_up_if_due(60_000).unwrap();
        assert_eq!(kind, EventKind::Expired);
        assert_eq!(reason, "no decision from security or oncall within 1m");
        assert_eq!(a.state, State::Expired);

        // The escalation group's member counts toward the group's quorum.
        let mut req = request(1);
        req.approver_groups = vec![group("security", "telegram:u1")];
        req.follow_up = Some(FollowUp {
            escalate_to: Some(group("oncall", "telegram:u9")),
            on_timeout: OnTimeout::Escalate,
            ..Default::default()
        });
        let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
        assert!(!b.expire_if_due(60_000), "escalates instead of expiring");
        assert_eq!(b.follow_up_if_due(60_000).unwrap().0, EventKind::Escalated);
        assert_eq!(b.expires_at, 120_000);
        let mut without_groups = b.clone();
        without_groups.approver_groups.clear();
        assert!(
            without_groups.is_decider("anyone"),
            "an escalation never narrows"
        );
        let mut d = decision("u9", Verdict::Approve, "k9");
        d.approver = "telegram:u9".into();
        assert_eq!(
            b.decide(d, None, 61_000).unwrap().outcome,
            DecideOutcome::Resolved
        );
    }

    fn quorum(name: &str, required: u32, members: &[&str]) -> GroupQuorum {
        GroupQuorum {
            group: name.into(),
            required,
            members: members.iter().map(|m| format!("telegram:{m}")).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn after_one_of_two_approvals_the_follow_up_says_what_is_missing() {
        let mut req = request(1);
        req.approver_groups = vec![quorum("security", 2, &["u1", "u2", "u3"])];
        req.follow_up = Some(FollowUp {
            remind_after_seconds: 10,
            escalate_after_seconds: 20,
            escalate_to: Some(quorum("oncall", 1, &["u9"])),
            ..Default::default()
        });
        let mut a = Approval::new("a1".into(), req, 60, Disposition::RequireHuman, 0);
        a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        assert_eq!(
            a.follow_up_if_due(10_000).unwrap().1,
            "reminder: only 1 of 2 approvals from security after 10s"
        );
        assert_eq!(
            a.follow_up_if_due(20_000).unwrap().1,
            "escalated to oncall after 20s: only 1 of 2 approvals from security"
        );
        // Escalated: on-call members count for security too.
        assert_eq!(
            a.follow_up_if_due(60_000).unwrap(),
            (
                EventKind::Expired,
                "only 1 of 2 approvals from security or oncall within 1m".to_string()
            )
        );

        // Two groups: "no decision" from the one nobody of which approved, and the overall
        // quorum where it asks for more people than the groups do.
        let mut req = request(4);
        req.approver_groups = vec![
            quorum("db", 1, &["u4", "u3"]),
            quorum("security", 2, &["u1", "u2", "u3"]),
        ];
        let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
        b.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        let mut first = b.clone();
        first.expire_if_due(60_000);
        assert_eq!(
            first.resolution.unwrap().reason,
            "no decision from db and only 1 of 2 approvals from security and only 1 of 4 approvals in all within 1m"
        );
        b.decide(decision("u3", Verdict::Approve, "k3"), None, 2)
            .unwrap();
        b.expire_if_due(60_000);
        assert_eq!(
            b.resolution.unwrap().reason,
            "only 2 of 4 approvals within 1m"
        );

        // No groups, no plan: the quorum that was not reached.
        let mut c = pending(2);
        c.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap();
        c.expire_if_due(60_000);
        assert_eq!(
            c.resolution.unwrap().reason,
            "only 1 of 2 approvals within 1m"
        );
    }

    #[test]
    fn one_member_of_two_groups_counts_for_both() {
        let mut req = request(1);
        req.approver_groups = vec![
            quorum("db", 1, &["u4", "u3"]),
            quorum("security", 1, &["u1", "u3"]),
        ];
        let mut a = Approval::new("a1".into(), req.clone(), 60, Disposition::RequireHuman, 0);
        let effect = a
            .decide(decision("u3", Verdict::Approve, "k3"), None, 1)
            .unwrap();
        assert_eq!(effect.outcome, DecideOutcome::Resolved);
        let counted: Vec<usize> = a.group_progress().into_iter().map(|(_, n)| n).collect();
        assert_eq!(counted, [1, 1]);

        // Two people wanted: required_approvals says so.
        req.required_approvals = 2;
        let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
        let effect = b
            .decide(decision("u3", Verdict::Approve, "k3"), None, 1)
            .unwrap();
        assert_eq!(effect.outcome, DecideOutcome::Recorded);
        assert_eq!(
            b.decide(decision("u1", Verdict::Approve, "k1"), None, 2)
                .unwrap()
                .outcome,
            DecideOutcome::Resolved
        );
    }
}
