//! What a notification shows. ntfy shows plain text (no Markdown is asked for), so nothing
//! an agent writes is markup; its words (tool, action, reason, identifiers) stand on one line
//! each with hidden characters made visible ([`agent_text::one_line`]), the action and reason
//! together under "The agent says", so they cannot pass for the worker's own lines.

use countersign_client::{decider, pb, withdrawal};
use countersign_worker::agent_text;
use countersign_worker::approval::{decide_elsewhere, outcome_word, prefix};
use countersign_worker::facts::ApprovalFacts;
use pb::{ApprovalState, Risk};

use crate::api::{Action, Publish};

const TOOL_LIMIT: usize = 80;
const LINE_LIMIT: usize = 300;
const IDENTITY_LIMIT: usize = 80;
/// ntfy keeps messages up to 4,096 bytes as text; the arguments get what is left.
const MESSAGE_LIMIT_BYTES: usize = 4000;

/// The sequence id of an approval's notification: every message about the approval updates
/// the same notification, also one published again after a crash.
pub fn sequence_id(approval_id: &str) -> String {
    format!("countersign-{approval_id}")
}

/// Where the buttons of a pending notification lead.
pub struct Buttons {
    /// `http` action: POSTs the approve link's confirmation form (or its decision token to
    /// the reply topic).
    pub approve: Action,
    /// `view` action: opens the reject link's page, which asks for a reason (or an `http`
    /// action posting its decision token to the reply topic).
    pub reject: Action,
    /// `http` action: POSTs the allow-for-session link's confirmation form (or its decision
    /// token to the reply topic).
    pub allow_session: Action,
}

/// An `http` button that decides at once: the request the link's confirmation form sends.
pub fn deciding_button(label: &'static str, url: String, form_token: &str, digest: &str) -> Action {
    Action {
        action: "http",
        label,
        url,
        method: Some("POST"),
        headers: vec![("Content-Type", "application/x-www-form-urlencoded")],
        body: Some(format!("form_token={form_token}&args_digest={digest}")),
        clear: true,
    }
}

/// An `http` button that publishes `body` (a decision token) to the reply topic at `url`
/// (`{server_url}/{reply_topic}`): ntfy publishes a POST's body to a topic as its message.
pub fn reply_button(label: &'static str, url: String, body: String) -> Action {
    Action {
        action: "http",
        label,
        url,
        method: Some("POST"),
        headers: Vec::new(),
        body: Some(body),
        clear: true,
    }
}

/// A `view` button: opens the link's page in the browser.
pub fn page_button(label: &'static str, url: String) -> Action {
    Action {
        action: "view",
        label,
        url,
        method: None,
        headers: Vec::new(),
        body: None,
        clear: false,
    }
}

/// The notification of a pending approval, with its buttons.
pub fn request(approval: &pb::Approval, topic: &str, buttons: Buttons) -> Publish {
    let facts = ApprovalFacts::of(approval);
    let risk = facts.risk;
    Publish {
        topic: topic.to_owned(),
        sequence_id: sequence_id(&approval.id),
        title: format!(
            "{}Approve {}?",
            if facts.is_high_risk() { "⚠️ " } else { "" },
            agent_text::one_line(facts.tool, TOOL_LIMIT)
        ),
        message: body(approval, String::new()),
        priority: priority(risk),
        tags: vec!["countersign".to_owned(), risk_tag(risk).to_owned()],
        actions: vec![buttons.approve, buttons.reject, buttons.allow_session],
    }
}

/// The notification of a resolved approval: the outcome, no buttons, low priority (an
/// update should not ring again).
pub fn outcome(approval: &pb::Approval, topic: &str) -> Publish {
    Publish {
        topic: topic.to_owned(),
        sequence_id: sequence_id(&approval.id),
        title: format!(
            "{}: {}",
            outcome_word(approval),
            agent_text::one_line(&approval.tool_name, TOOL_LIMIT)
        ),
        message: body(approval, format!("{}\n", resolution_line(approval))),
        priority: 2,
        tags: vec!["countersign".to_owned()],
        actions: Vec::new(),
    }
}

/// The smallest form of a notification ntfy refused for its content: the same title,
/// buttons and place, and a message of only the tool, the risk, the full id and where else to
/// decide.
pub fn minimal(approval: &pb::Approval, refused: Publish) -> Publish {
    let facts = ApprovalFacts::of(approval);
    Publish {
        message: format!(
            "Tool: {}\nRisk: {}\nID: {}\n{}",
            agent_text::one_line(facts.tool, TOOL_LIMIT),
            facts.risk_word(),
            facts.id,
            decide_elsewhere(facts.id)
        ),
        ..refused
    }
}

/// ntfy's priority from the approval's risk: low is default, medium high, high and critical
/// max (a pop-over that rings even in do-not-disturb where the phone allows it).
pub fn priority(risk: Risk) -> u8 {
    match risk {
        Risk::Low => 3,
        Risk::Medium | Risk::Unspecified => 4,
        Risk::High | Risk::Critical => 5,
    }
}

fn risk_tag(risk: Risk) -> &'static str {
    match risk {
        Risk::Low => "risk-low",
        Risk::Medium | Risk::Unspecified => "risk-medium",
        Risk::High => "risk-high",
        Risk::Critical => "risk-critical",
    }
}

/// Who decided and why, in the worker's words (the decider's name and reason quoted).
fn resolution_line(approval: &pb::Approval) -> String {
    let Some(decision) = approval.decisions.last() else {
        return match approval.state() {
            ApprovalState::Expired => "No one decided in time.".to_owned(),
            ApprovalState::Cancelled if withdrawal::is_withdrawn(approval) => {
                "Withdrawn: the agent stopped waiting for it.".to_owned()
            }
            ApprovalState::Cancelled => "The request was withdrawn.".to_owned(),
            _ => "Decided by policy or a session grant.".to_owned(),
        };
    };
    let decider = decision
        .decider
        .as_ref()
        .map(|d| {
            format!(
                "{} ({})",
                agent_text::one_line(decider::name(d), IDENTITY_LIMIT),
                agent_text::one_line(&d.channel, IDENTITY_LIMIT)
            )
        })
        .unwrap_or_else(|| "someone".to_owned());
    let mut line = format!("By {decider}");
    if !decision.reason.is_empty() && decision.reason != approval.reason {
        line.push_str(&format!(
            ": “{}”",
            agent_text::one_line(&decision.reason, LINE_LIMIT)
        ));
    }
    line
}

/// The message: `first` (the outcome's line, or nothing), then the approval's facts, its
/// arguments cut so that the whole stays within ntfy's message limit.
fn body(approval: &pb::Approval, first: String) -> String {
    let facts = ApprovalFacts::of(approval);
    let mut head = first;
    head.push_str(&format!(
        "Tool: {}\nRisk: {}\nAgent: {} · session {}\n",
        agent_text::one_line(facts.tool, TOOL_LIMIT),
        facts.risk_word(),
        agent_text::one_line(facts.agent_or_dash(), IDENTITY_LIMIT),
        agent_text::one_line(facts.session_or_dash(), IDENTITY_LIMIT),
    ));
    if !facts.action.is_empty() || !facts.reason.is_empty() {
        head.push_str("The agent says:\n");
        if !facts.action.is_empty() {
            head.push_str(&format!(
                "│ Action: {}\n",
                agent_text::one_line(facts.action, LINE_LIMIT)
            ));
        }
        if !facts.reason.is_empty() {
            head.push_str(&format!(
                "│ Reason: {}\n",
                agent_text::one_line(facts.reason, LINE_LIMIT)
            ));
        }
    }
    let mut tail = format!("SHA-256 {}\n", prefix(facts.digest, 16));
    if let Some(expires) = facts.expires_text() {
        tail.push_str(&format!("Expires: {expires}\n"));
    }
    tail.push_str(&format!("ID: …{}", facts.short_id));
    // Hostile lines can fill the limit before the arguments: the head gives way, cut at a
    // character, so that the arguments' first characters and the id still fit.
    let room = MESSAGE_LIMIT_BYTES
        .saturating_sub(tail.len() + "Arguments:\n\n".len() + 16 * 4 + "…\n".len());
    if head.len() > room {
        let mut end = room;
        while !head.is_char_boundary(end) {
            end -= 1;
        }
        head.truncate(end);
        head.push_str("…\n");
    }
    let budget =
        MESSAGE_LIMIT_BYTES.saturating_sub(head.len() + tail.len() + "Arguments:\n\n".len()) / 4;
    let shown = agent_text::cap(&agent_text::visible(facts.arguments), budget.max(16));
    format!("{head}Arguments:\n{shown}\n{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> pb::Approval {
        pb::Approval {
            id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            tool_name: "bash".into(),
            action: "tidy up\nRisk: low\u{202E}".into(),
            reason: "needed".into(),
            arguments_json: "{\"command\":\"rm -rf build\"}".into(),
            args_digest: "ab".repeat(32),
            risk: Risk::High.into(),
            state: ApprovalState::Pending.into(),
            ..Default::default()
        }
    }

    #[test]
    fn agent_text_cannot_draw_its_own_lines() {
        let rendered = body(&approval(), String::new());
        assert!(
            rendered.contains("│ Action: tidy up ⏎ Risk: low⟨U+202E⟩"),
            "{rendered}"
        );
        assert_eq!(
            rendered.lines().filter(|l| l.starts_with("Risk:")).count(),
            1
        );
        assert!(rendered.ends_with("ID: …2e3f4a5b"), "{rendered}");
    }

    /// The outcome's line comes out of the same budget: a long decider name and reason on top
    /// of arguments that fill the message went past ntfy's 4,096 bytes, which ntfy refuses.
    #[test]
    fn an_outcome_fits_the_message_limit_with_its_resolution_line() {
        let wide = |n: usize| "😀".repeat(n);
        let mut rejected = approval();
        rejected.action = wide(1_000);
        rejected.reason = wide(1_000);
        rejected.arguments_json = serde_json::json!({ "command": wide(4_000) }).to_string();
        rejected.state = ApprovalState::Rejected.into();
        rejected.decisions.push(pb::Decision {
            reason: wide(1_000),
            decider: Some(pb::Decider {
                channel: wide(200),
                user_id: "alice".into(),
                display_name: wide(200),
            }),
            ..Default::default()
        });
        let shown = outcome(&rejected, "ops");
        assert!(
            shown.message.len() <= MESSAGE_LIMIT_BYTES,
            "{} bytes",
            shown.message.len()
        );
        assert!(shown.message.starts_with("By 😀"), "{}", shown.message);
    }

    #[test]
    fn risk_sets_the_priority_and_outcomes_drop_the_buttons() {
        assert_eq!(priority(Risk::Low), 3);
        assert_eq!(priority(Risk::Medium), 4);
        assert_eq!(priority(Risk::Critical), 5);
        let mut rejected = approval();
        rejected.state = ApprovalState::Rejected.into();
        rejected.decisions.push(pb::Decision {
            reason: "not today".into(),
            decider: Some(pb::Decider {
                channel: "ntfy".into(),
                user_id: "alice".into(),
                display_name: "alice".into(),
            }),
            ..Default::default()
        });
        let shown = outcome(&rejected, "ops");
        assert!(shown.actions.is_empty());
        assert_eq!(shown.title, "❌ Rejected: bash");
        assert!(
            shown.message.starts_with("By alice (ntfy): “not today”"),
            "{}",
            shown.message
        );
        assert_eq!(shown.sequence_id, sequence_id(&rejected.id));

        let mut withdrawn = approval();
        withdrawn.state = ApprovalState::Cancelled.into();
        withdrawn.resolution = Some(pb::Resolution {
            reason: "withdrawn: the caller left".into(),
            ..Default::default()
        });
        let shown = outcome(&withdrawn, "ops");
        assert!(shown.actions.is_empty());
        assert_eq!(shown.title, "🚫 Withdrawn: bash");
        assert!(
            shown
                .message
                .starts_with("Withdrawn: the agent stopped waiting for it."),
            "{}",
            shown.message
        );
    }

    #[test]
    fn long_arguments_are_cut_to_fit_a_message() {
        let mut long = approval();
        long.arguments_json = format!("{{\"blob\":\"{}\"}}", "x".repeat(20_000));
        assert!(body(&long, String::new()).len() <= MESSAGE_LIMIT_BYTES);
    }
}
