//! The facts of an approval that every renderer formats, worked out once: who asked, what,
//! the risk, the arguments shown and their digest, the quorum's progress, when it expires,
//! and how it ended (who or what resolved it, when, with which note). Every text here is the
//! approval's own, raw: each renderer makes agent text visible and escapes it for its markup,
//! and words it in its own way.

use countersign_client::{pb, version};

use crate::approval::{self, Progress};

/// An approval's facts, borrowed from it ([`ApprovalFacts::of`]).
pub struct ApprovalFacts<'a> {
    pub id: &'a str,
    /// The last 8 characters of the id ([`approval::short_id`]).
    pub short_id: &'a str,
    pub state: pb::ApprovalState,
    /// The state in a word with its sign, for headings ([`approval::outcome_word`]).
    pub outcome_word: &'static str,
    /// "Withdrawn" or "Cancelled" ([`approval::cancelled_word`]).
    pub cancelled_word: &'static str,
    /// The tool the agent asked to call.
    pub tool: &'a str,
    /// The agent's own words: what it wants to do and why (either may be empty).
    pub action: &'a str,
    pub reason: &'a str,
    /// The person the agent acts for; empty when the request did not say.
    pub requester: &'a str,
    /// The agent and its session; empty when the request did not name them.
    pub agent: &'a str,
    pub session: &'a str,
    pub risk: pb::Risk,
    /// The arguments shown (the edited version once an approver edited them) and their
    /// SHA-256 digest.
    pub arguments: &'a str,
    pub digest: &'a str,
    /// Set when an approver edited the arguments.
    pub edit: Option<Edit<'a>>,
    /// The quorum's progress (meaningful while pending).
    pub progress: Progress<'a>,
    /// When the approval expires (Unix seconds).
    pub expires_at: Option<i64>,
    /// How the approval was resolved; `None` while pending or when the server did not say.
    pub resolver: Option<Resolver<'a>>,
    /// The resolution's kind as the server recorded it.
    pub resolved_by: pb::ResolvedBy,
    /// When it was resolved (Unix seconds).
    pub resolved_at: Option<i64>,
    /// Whether an approval was given for the whole session.
    pub for_session: bool,
    /// The note that came with the resolution (a decider's reason, a cancellation's), unless
    /// it only repeats the request's reason.
    pub note: Option<&'a str>,
    /// What the agent reported after running an approved call.
    pub execution: Option<Execution<'a>>,
}

/// An approver's edit of the arguments.
pub struct Edit<'a> {
    /// Who edited them, when the server said.
    pub editor: Option<&'a pb::Decider>,
    /// The digest of the arguments as requested (the shown ones are the edit's).
    pub requested_digest: &'a str,
    /// Whether the edit restarted the approval count (approvals of the requested version no
    /// longer count).
    pub restarted_count: bool,
}

/// Who or what resolved an approval.
#[derive(Debug, PartialEq)]
pub enum Resolver<'a> {
    /// A policy rule, by name.
    Rule(&'a str),
    /// A session grant, by id.
    Grant(&'a str),
    /// The deciders whose decisions resolved it.
    Deciders(Vec<&'a pb::Decider>),
}

/// The outcome the agent reported for an approved call it ran.
pub struct Execution<'a> {
    pub outcome: pb::ConsumeOutcome,
    pub detail: &'a str,
}

impl Execution<'_> {
    /// The outcome in words (`succeeded`); `None` when the agent did not say.
    pub fn word(&self) -> Option<&'static str> {
        match self.outcome {
            pb::ConsumeOutcome::Succeeded => Some("succeeded"),
            pb::ConsumeOutcome::Failed => Some("failed"),
            pb::ConsumeOutcome::HandedOff => Some("handed to the agent"),
            pb::ConsumeOutcome::Unspecified => None,
        }
    }
}

impl<'a> ApprovalFacts<'a> {
    /// The facts of `approval` in its current state.
    pub fn of(approval: &'a pb::Approval) -> Self {
        let (arguments, digest) = version::current_arguments(approval);
        let resolution = approval.resolution.as_ref();
        let edit = version::is_edited(approval).then(|| Edit {
            editor: approval.editor.as_ref(),
            requested_digest: &approval.args_digest,
            restarted_count: approval.decisions.iter().any(|d| d.restarts_count),
        });
        ApprovalFacts {
            id: &approval.id,
            short_id: approval::short_id(&approval.id),
            state: approval.state(),
            outcome_word: approval::outcome_word(approval),
            cancelled_word: approval::cancelled_word(approval),
            tool: &approval.tool_name,
            action: &approval.action,
            reason: &approval.reason,
            requester: &approval.requester,
            agent: &approval.agent_id,
            session: &approval.session_id,
            risk: approval.risk(),
            arguments,
            digest,
            edit,
            progress: approval::progress(approval),
            expires_at: approval.expires_at.as_ref().map(|at| at.seconds),
            resolver: resolution.and_then(resolver),
            resolved_by: resolution.map_or(pb::ResolvedBy::Unspecified, |r| r.resolved_by()),
            resolved_at: resolution
                .and_then(|r| r.resolved_at.as_ref())
                .or(approval.resolved_at.as_ref())
                .map(|at| at.seconds),
            for_session: approval.decisions.iter().any(|decision| {
                decision.verdict() == pb::Verdict::Approve && decision.scope() == pb::Scope::Session
            }),
            note: resolution
                .map(|r| r.reason.as_str())
                .filter(|note| !note.is_empty() && *note != approval.reason),
            execution: approval.consumption.as_ref().map(|c| Execution {
                outcome: c.outcome(),
                detail: &c.detail,
            }),
        }
    }

    pub fn is_pending(&self) -> bool {
        self.state == pb::ApprovalState::Pending
    }

    /// High or critical risk: renderers mark the request with a warning.
    pub fn is_high_risk(&self) -> bool {
        matches!(self.risk, pb::Risk::High | pb::Risk::Critical)
    }

    /// The risk in a lowercase word ([`approval::risk_word`]).
    pub fn risk_word(&self) -> &'static str {
        approval::risk_word(self.risk)
    }

    /// The agent, `-` when the request did not name it.
    pub fn agent_or_dash(&self) -> &'a str {
        approval::or_dash(self.agent)
    }

    /// The session, `-` when the request did not name it.
    pub fn session_or_dash(&self) -> &'a str {
        approval::or_dash(self.session)
    }

    /// The expiry as channels show it ([`approval::format_time`]).
    pub fn expires_text(&self) -> Option<String> {
        self.expires_at.map(approval::format_time)
    }

    /// The quorum's progress line while pending: `⏳ Waiting for a decision` when one approval
    /// does, else `⏳ Waiting: 1 of 2 approvals (by …)`, the approvers named by `names` (which
    /// escapes them for the renderer's markup).
    pub fn waiting_line(&self, names: impl Fn(&[&pb::Decider]) -> String) -> String {
        let Progress {
            required,
            approvers,
        } = &self.progress;
        if *required == 1 {
            return "⏳ Waiting for a decision".to_owned();
        }
        let mut line = format!("⏳ Waiting: {} of {required} approvals", approvers.len());
        if !approvers.is_empty() {
            line.push_str(&format!(" (by {})", names(approvers)));
        }
        line
    }

    /// The seconds left before the approval expires at `now` (Unix seconds), never below 0;
    /// `None` for an approval without expiry.
    pub fn seconds_left(&self, now: i64) -> Option<i64> {
        self.expires_at.map(|at| at.saturating_sub(now).max(0))
    }
}

/// Who or what a resolution names: its rule, its grant, else its deciders (`None` without).
fn resolver(resolution: &pb::Resolution) -> Option<Resolver<'_>> {
    match resolution.resolved_by() {
        pb::ResolvedBy::Rule => Some(Resolver::Rule(&resolution.rule)),
        pb::ResolvedBy::Grant => Some(Resolver::Grant(&resolution.grant_id)),
        _ if resolution.deciders.is_empty() => None,
        _ => Some(Resolver::Deciders(resolution.deciders.iter().collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decider(name: &str) -> pb::Decider {
        pb::Decider {
            channel: "telegram".into(),
            user_id: "42".into(),
            display_name: name.into(),
        }
    }

    fn approval() -> pb::Approval {
        pb::Approval {
            id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            tool_name: "<b>bash</b>".into(),
            action: "tidy up\nRisk: low\u{202E} & <!channel>".into(),
            reason: "needed".into(),
            arguments_json: "{\"command\":\"echo ```<b>\"}".into(),
            args_digest: "ab".repeat(32),
            risk: pb::Risk::High.into(),
            required_approvals: 2,
            state: pb::ApprovalState::Pending.into(),
            expires_at: Some(countersign_client::Timestamp {
                seconds: 1_000,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn agent_text_stays_raw_for_each_renderer_to_escape() {
        let approval = approval();
        let facts = ApprovalFacts::of(&approval);
        assert_eq!(facts.tool, "<b>bash</b>");
        assert_eq!(facts.action, "tidy up\nRisk: low\u{202E} & <!channel>");
        assert_eq!(facts.arguments, "{\"command\":\"echo ```<b>\"}");
        assert_eq!(facts.digest, "ab".repeat(32));
        assert_eq!(facts.short_id, "2e3f4a5b");
        assert_eq!((facts.agent_or_dash(), facts.session_or_dash()), ("-", "-"));
        assert_eq!(facts.risk_word(), "high");
        assert!(facts.is_high_risk() && facts.is_pending());
        assert!(facts.edit.is_none() && facts.resolver.is_none());
    }

    #[test]
    fn time_left_counts_down_to_zero() {
        let approval = approval();
        let facts = ApprovalFacts::of(&approval);
        assert_eq!(facts.seconds_left(400), Some(600));
        assert_eq!(facts.seconds_left(2_000), Some(0));
        assert_eq!(
            facts.expires_text().as_deref(),
            Some("1970-01-01 00:16 UTC")
        );
        assert_eq!(
            ApprovalFacts::of(&pb::Approval::default()).seconds_left(0),
            None
        );
    }

    #[test]
    fn the_waiting_line_names_approvers_only_for_a_quorum() {
        let mut quorum = approval();
        let names = |deciders: &[&pb::Decider]| -> String {
            let names: Vec<&str> = deciders.iter().map(|d| d.display_name.as_str()).collect();
            names.join(", ")
        };
        assert_eq!(
            ApprovalFacts::of(&quorum).waiting_line(names),
            "⏳ Waiting: 0 of 2 approvals"
        );
        quorum.decisions.push(pb::Decision {
            verdict: pb::Verdict::Approve.into(),
            decider: Some(decider("<alice>")),
            ..Default::default()
        });
        assert_eq!(
            ApprovalFacts::of(&quorum).waiting_line(names),
            "⏳ Waiting: 1 of 2 approvals (by <alice>)"
        );
        quorum.required_approvals = 0;
        assert_eq!(
            ApprovalFacts::of(&quorum).waiting_line(names),
            "⏳ Waiting for a decision"
        );
    }

    #[test]
    fn an_edit_shows_the_edited_arguments_and_restarts_the_count() {
        let mut edited = approval();
        edited.edited_arguments_json = "{}".into();
        edited.edited_args_digest = "cd".repeat(32);
        edited.editor = Some(decider("mallory"));
        edited.decisions.push(pb::Decision {
            verdict: pb::Verdict::Approve.into(),
            decider: Some(decider("alice")),
            args_digest: "ab".repeat(32),
            ..Default::default()
        });
        edited.decisions.push(pb::Decision {
            verdict: pb::Verdict::Approve.into(),
            decider: Some(decider("mallory")),
            args_digest: "cd".repeat(32),
            restarts_count: true,
            ..Default::default()
        });
        let facts = ApprovalFacts::of(&edited);
        assert_eq!(
            (facts.arguments, facts.digest),
            ("{}", "cd".repeat(32).as_str())
        );
        let edit = facts.edit.as_ref().map(|edit| {
            (
                edit.editor.map(|d| d.display_name.as_str()),
                edit.requested_digest,
                edit.restarted_count,
            )
        });
        assert_eq!(
            edit,
            Some((Some("mallory"), "ab".repeat(32).as_str(), true))
        );
        let approvers: Vec<&str> = facts
            .progress
            .approvers
            .iter()
            .map(|d| d.display_name.as_str())
            .collect();
        assert_eq!((facts.progress.required, approvers), (2, vec!["mallory"]));
    }

    #[test]
    fn a_resolution_names_its_resolver_time_and_a_note_that_is_not_the_request_s_reason() {
        let mut approved = approval();
        approved.state = pb::ApprovalState::Consumed.into();
        approved.decisions.push(pb::Decision {
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Session.into(),
            ..Default::default()
        });
        approved.resolution = Some(pb::Resolution {
            resolved_by: pb::ResolvedBy::Decision.into(),
            deciders: vec![decider("bob")],
            reason: "needed".into(),
            resolved_at: Some(countersign_client::Timestamp {
                seconds: 900,
                nanos: 0,
            }),
            ..Default::default()
        });
        approved.consumption = Some(pb::Consumption {
            outcome: pb::ConsumeOutcome::Failed.into(),
            detail: "exit 1".into(),
            ..Default::default()
        });
        let facts = ApprovalFacts::of(&approved);
        let bob = decider("bob");
        assert_eq!(facts.resolver, Some(Resolver::Deciders(vec![&bob])));
        assert_eq!(facts.resolved_at, Some(900));
        assert!(facts.for_session);
        assert_eq!(facts.note, None, "the request's own reason is not repeated");
        let execution = facts.execution.as_ref().map(|e| (e.word(), e.detail));
        assert_eq!(execution, Some((Some("failed"), "exit 1")));

        let mut by_rule = approval();
        by_rule.state = pb::ApprovalState::Rejected.into();
        by_rule.resolution = Some(pb::Resolution {
            resolved_by: pb::ResolvedBy::Rule.into(),
            rule: "no-prod".into(),
            reason: "not on Fridays".into(),
            ..Default::default()
        });
        let facts = ApprovalFacts::of(&by_rule);
        assert_eq!(facts.resolver, Some(Resolver::Rule("no-prod")));
        assert_eq!(facts.note, Some("not on Fridays"));
    }
}
