//! The approval and the values it is made of: the request, decisions, deciders, routes,
//! resolutions, deliveries, group quorums and follow-up plans, the event kinds, and what an
//! approval says about itself (its current version, its quorum progress, when it is next due).
//! How an approval changes is `state_machine.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::step_up::{StepUp, StepUpProof};

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
    /// The second factor the server verified for this decision (passkey step-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_up: Option<StepUpProof>,
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

/// How a cancellation's reason starts when the caller withdrew its own request because it
/// stopped or left (a signal, a lost connection): channels then say "withdrawn".
pub const WITHDRAWN_REASON_PREFIX: &str = "withdrawn: ";

/// Whether a cancellation's reason marks a withdrawal by the caller
/// ([`WITHDRAWN_REASON_PREFIX`]).
pub fn is_withdrawal(cancellation_reason: &str) -> bool {
    cancellation_reason.starts_with(WITHDRAWN_REASON_PREFIX)
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
    /// The server withdraws the approval, while pending, once its caller no longer waits for
    /// it (its waits' connections are gone for a grace period).
    pub withdraw_when_caller_leaves: bool,
    /// The second factor an approval needs (a policy rule's `step_up`); `None`: none.
    pub step_up: Option<StepUp>,
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
    /// See [`ApprovalRequest::withdraw_when_caller_leaves`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withdraw_when_caller_leaves: bool,
    /// The decision receipt the server signed when a verdict resolved it (a compact JWS, see
    /// [`crate::receipt`]); `None` before, and when it ended without a verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// See [`ApprovalRequest::step_up`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_up: Option<StepUp>,
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
    /// An operator accepted a rule suggested from this and earlier approvals.
    RuleAccepted,
    /// Nobody decided within the reminder time: the channels remind the deciders.
    Reminded,
    /// The approval went to the escalation group.
    Escalated,
}

impl EventKind {
    pub const ALL: [EventKind; 12] = [
        EventKind::Requested,
        EventKind::DecisionRecorded,
        EventKind::DecisionRefused,
        EventKind::Resolved,
        EventKind::Expired,
        EventKind::Cancelled,
        EventKind::Consumed,
        EventKind::Delivered,
        EventKind::GrantRevoked,
        EventKind::RuleAccepted,
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
            EventKind::RuleAccepted => "RULE_ACCEPTED",
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

/// How many distinct members of a group must approve, with the group as it was when the
/// approval was requested. A request or a rule names only `group` and `required`; the server
/// fills in the rest from the configuration ([`crate::groups::Groups::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupQuorum {
    pub group: String,
    pub required: u32,
    /// Approver ids.
    pub members: Vec<String>,
    pub destinations: Vec<Route>,
    /// The members' identities on each channel (`github` / `alice-gh`), for mentions.
    pub contacts: Vec<Route>,
}

/// What a deadline without a decision means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// The approval expires: the runtime is told no (fail closed).
    #[default]
    Reject,
    /// The approval goes to the escalation group with a fresh deadline (once); when that one
    /// passes too, it expires.
    Escalate,
}

impl OnTimeout {
    pub fn parse(name: &str) -> Option<OnTimeout> {
        match name.to_ascii_lowercase().as_str() {
            "reject" => Some(OnTimeout::Reject),
            "escalate" => Some(OnTimeout::Escalate),
            _ => None,
        }
    }
}

/// The reminder, escalation and timeout plan of an approval, and how far it went.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FollowUp {
    /// Seconds after the request at which the channels remind the deciders (0: never).
    pub remind_after_seconds: u32,
    /// Seconds after the request at which the approval goes to `escalate_to` (0: only on
    /// timeout, when `on_timeout` is `escalate`).
    pub escalate_after_seconds: u32,
    /// The group an escalation hands the approval to; its members may then decide, and count
    /// toward every group requirement.
    pub escalate_to: Option<GroupQuorum>,
    pub on_timeout: OnTimeout,
    pub reminded_at: Option<Millis>,
    pub escalated_at: Option<Millis>,
}

impl FollowUp {
    /// Whether this plan does anything at all.
    pub fn is_active(&self) -> bool {
        self.remind_after_seconds > 0
            || self.escalate_to.is_some()
            || self.on_timeout != OnTimeout::Reject
    }
}

/// A person deciding for another one until a time: the delegate's decisions count as the
/// delegator's, for the delegator's groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    pub id: String,
    /// Approver id of the person who is away.
    pub delegator: String,
    /// Approver id of the person deciding for them.
    pub delegate: String,
    pub created_at: Millis,
    pub until: Millis,
    pub revoked_at: Option<Millis>,
    pub reason: String,
    /// Who created it (the admin token's name).
    pub created_by: String,
}

impl Delegation {
    pub fn is_active(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && now < self.until
    }
}

impl Approval {
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
    pub(crate) fn version_of<'a>(&'a self, decision: &'a Decision) -> &'a str {
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
    pub(crate) fn current_approvers(&self) -> Vec<&str> {
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
    pub(crate) fn escalation_group(&self) -> Option<&GroupQuorum> {
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
    pub(crate) fn shortfall(&self) -> String {
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
    pub(crate) fn escalates_on_timeout(&self) -> bool {
        self.follow_up.as_ref().is_some_and(|f| {
            f.on_timeout == OnTimeout::Escalate
                && f.escalate_to.is_some()
                && f.escalated_at.is_none()
        })
    }

    pub fn resolved_at(&self) -> Option<Millis> {
        self.resolution.as_ref().map(|r| r.resolved_at)
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
