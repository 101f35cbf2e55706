//! What a mail says, in plain text and in HTML (the two parts of one multipart/alternative
//! mail). It formats `ApprovalFacts` and computes no fact itself. Agent text is made visible
//! (hidden and reordering characters shown as `⟨U+XXXX⟩`) in both parts, HTML-escaped in the
//! HTML part, and put on one line wherever a line break could pass for the worker's own
//! line (the subject among them: no agent text can add a header).

use countersign_client::{decider, pb};
use countersign_links::pages::escape;
use countersign_worker::agent_text;
use countersign_worker::approval::prefix;
use countersign_worker::facts::{ApprovalFacts, Resolver};
use pb::ApprovalState;

const TOOL_LIMIT: usize = 80;
const LINE_LIMIT: usize = 500;
const IDENTITY_LIMIT: usize = 80;
/// How much of the arguments a mail shows (the page shows them again before deciding).
const ARGUMENTS_LIMIT: usize = 8000;

/// One mail's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    pub subject: String,
    pub plain: String,
    pub html: String,
}

/// The decision links of a request mail.
pub struct Links {
    pub approve: String,
    pub reject: String,
    pub allow_session: String,
}

/// The subject every mail of the approval's thread carries (follow-ups with `Re: `), so that
/// clients that thread by subject keep them together too.
pub fn subject(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    format!(
        "{}Approve {}? ({} risk, …{})",
        if facts.is_high_risk() { "⚠️ " } else { "" },
        agent_text::one_line(facts.tool, TOOL_LIMIT),
        facts.risk_word(),
        facts.short_id
    )
}

/// The first mail: the request with its three links.
pub fn request(approval: &pb::Approval, links: &Links) -> Mail {
    let facts = ApprovalFacts::of(approval);
    let waiting = facts.waiting_line(names);
    let choices = [
        ("Approve", &links.approve, "#1a7f37"),
        ("Reject…", &links.reject, "#cf222e"),
        ("Allow for session", &links.allow_session, "#0969da"),
    ];
    let mut plain = format!("{}\n\n{waiting}\n\n", lead(&facts));
    plain.push_str(&plain_facts(&facts));
    plain.push('\n');
    for (label, url, _) in choices {
        plain.push_str(&format!("{label}: {url}\n"));
    }
    plain.push_str(&format!("\n{}\nID: {}\n", LINKS_NOTE, facts.id));
    let mut html = format!(
        "<p>{}</p><p>{}</p>{}<p>",
        escape(&lead(&facts)),
        escape(&waiting),
        html_facts(&facts)
    );
    for (label, url, color) in choices {
        html.push_str(&format!(
            "<a href=\"{}\" style=\"display:inline-block;margin:0 .5em .5em 0;padding:.6em 1.1em;border-radius:6px;background:{color};color:#fff;text-decoration:none;font-weight:bold\">{label}</a>",
            escape(url)
        ));
    }
    html.push_str(&format!(
        "</p><p style=\"color:#57606a\">{}<br>ID: {}</p>",
        escape(LINKS_NOTE),
        escape(facts.id)
    ));
    Mail {
        subject: subject(approval),
        plain,
        html: document(&html),
    }
}

const LINKS_NOTE: &str = "Each link opens a page that shows the request again; nothing is decided until you press the button there. A link works once, and only until the request expires.";

/// A later change while the approval is still pending: quorum progress, edited arguments.
pub fn update(approval: &pb::Approval) -> Mail {
    let facts = ApprovalFacts::of(approval);
    let waiting = facts.waiting_line(names);
    let mut lines = vec![waiting];
    if let Some(edit) = &facts.edit {
        lines.push(format!(
            "The arguments were edited{} (SHA-256 {}…).",
            edit.editor.map_or(String::new(), |editor| format!(
                " by {}",
                agent_text::one_line(decider::name(editor), IDENTITY_LIMIT)
            )),
            prefix(facts.digest, 16)
        ));
    }
    lines.push("The links in the first mail still work.".to_owned());
    follow_up(approval, &facts, &lines)
}

/// The outcome: decided (here or elsewhere), expired or cancelled.
pub fn outcome(approval: &pb::Approval) -> Mail {
    let facts = ApprovalFacts::of(approval);
    let lines = vec![
        format!(
            "{}: {}",
            facts.outcome_word,
            agent_text::one_line(facts.tool, TOOL_LIMIT)
        ),
        resolution_line(&facts),
        "The links of this request no longer decide anything.".to_owned(),
    ];
    follow_up(approval, &facts, &lines)
}

fn follow_up(approval: &pb::Approval, facts: &ApprovalFacts<'_>, lines: &[String]) -> Mail {
    let mut plain = lines.join("\n");
    plain.push_str("\n\n");
    plain.push_str(&plain_facts(facts));
    plain.push_str(&format!("ID: {}\n", facts.id));
    let mut html: String = lines
        .iter()
        .map(|line| format!("<p>{}</p>", escape(line)))
        .collect();
    html.push_str(&html_facts(facts));
    html.push_str(&format!(
        "<p style=\"color:#57606a\">ID: {}</p>",
        escape(facts.id)
    ));
    Mail {
        subject: format!("Re: {}", subject(approval)),
        plain,
        html: document(&html),
    }
}

fn lead(facts: &ApprovalFacts<'_>) -> String {
    format!(
        "{} asks to run {} ({} risk).",
        agent_text::one_line(facts.agent_or_dash(), IDENTITY_LIMIT),
        agent_text::one_line(facts.tool, TOOL_LIMIT),
        facts.risk_word()
    )
}

fn names(deciders: &[&pb::Decider]) -> String {
    deciders
        .iter()
        .map(|d| agent_text::one_line(decider::name(d), IDENTITY_LIMIT))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Who or what resolved it, and the note that came with it (quoted).
fn resolution_line(facts: &ApprovalFacts<'_>) -> String {
    let mut line = match &facts.resolver {
        Some(Resolver::Deciders(deciders)) => format!(
            "By {}",
            deciders
                .iter()
                .map(|d| agent_text::one_line(&decider::name_and_channel(d), IDENTITY_LIMIT))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(Resolver::Rule(rule)) => format!(
            "By the policy rule {}",
            agent_text::one_line(rule, IDENTITY_LIMIT)
        ),
        Some(Resolver::Grant(_)) => "By a session grant".to_owned(),
        None => match facts.state {
            ApprovalState::Expired => "No one decided in time".to_owned(),
            ApprovalState::Cancelled => facts.cancelled_word.to_owned(),
            _ => "Resolved".to_owned(),
        },
    };
    if let Some(note) = facts.note {
        line.push_str(&format!(": “{}”", agent_text::one_line(note, LINE_LIMIT)));
    }
    line.push('.');
    line
}

/// The agent's words, the arguments and the identifiers, as plain text: the agent's lines
/// behind a bar, so that they cannot pass for the worker's.
fn plain_facts(facts: &ApprovalFacts<'_>) -> String {
    let mut text = String::new();
    if !facts.action.is_empty() || !facts.reason.is_empty() {
        text.push_str("The agent says:\n");
        if !facts.action.is_empty() {
            text.push_str(&format!(
                "│ Action: {}\n",
                agent_text::one_line(facts.action, LINE_LIMIT)
            ));
        }
        if !facts.reason.is_empty() {
            text.push_str(&format!(
                "│ Reason: {}\n",
                agent_text::one_line(facts.reason, LINE_LIMIT)
            ));
        }
        text.push('\n');
    }
    text.push_str(&format!(
        "Arguments (SHA-256 {}…):\n{}\n\n",
        prefix(facts.digest, 16),
        arguments(facts)
    ));
    text.push_str(&format!(
        "Agent: {} · session {}\n",
        agent_text::one_line(facts.agent_or_dash(), IDENTITY_LIMIT),
        agent_text::one_line(facts.session_or_dash(), IDENTITY_LIMIT)
    ));
    if let Some(expires) = facts.expires_text() {
        text.push_str(&format!("Expires: {expires}\n"));
    }
    text
}

fn html_facts(facts: &ApprovalFacts<'_>) -> String {
    let mut html = String::new();
    if !facts.action.is_empty() || !facts.reason.is_empty() {
        html.push_str("<p style=\"margin-bottom:.2em\">The agent says:</p><blockquote style=\"margin:0 0 1em;padding:.2em .8em;border-left:4px solid #d0d7de;color:#24292f\">");
        if !facts.action.is_empty() {
            html.push_str(&format!(
                "Action: {}<br>",
                escape(&agent_text::one_line(facts.action, LINE_LIMIT))
            ));
        }
        if !facts.reason.is_empty() {
            html.push_str(&format!(
                "Reason: {}",
                escape(&agent_text::one_line(facts.reason, LINE_LIMIT))
            ));
        }
        html.push_str("</blockquote>");
    }
    html.push_str(&format!(
        "<p style=\"margin-bottom:.2em\">Arguments (SHA-256 {}…):</p><pre style=\"white-space:pre-wrap;word-break:break-all;background:#f6f8fa;padding:.6em;border-radius:6px\">{}</pre>",
        escape(prefix(facts.digest, 16)),
        escape(&arguments(facts))
    ));
    html.push_str(&format!(
        "<p>Agent: {} · session {}",
        escape(&agent_text::one_line(facts.agent_or_dash(), IDENTITY_LIMIT)),
        escape(&agent_text::one_line(
            facts.session_or_dash(),
            IDENTITY_LIMIT
        ))
    ));
    if let Some(expires) = facts.expires_text() {
        html.push_str(&format!("<br>Expires: {}", escape(&expires)));
    }
    html.push_str("</p>");
    html
}

fn arguments(facts: &ApprovalFacts<'_>) -> String {
    agent_text::cap(&agent_text::visible(facts.arguments), ARGUMENTS_LIMIT)
}

fn document(body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"></head><body style=\"font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:15px;line-height:1.45;color:#24292f;max-width:40em;margin:0 auto;padding:.8em\">{body}</body></html>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> pb::Approval {
        pb::Approval {
            id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            agent_id: "coder-1".into(),
            tool_name: "bash".into(),
            action: "<b>tidy</b>\nRisk: low\u{202E}".into(),
            reason: "needed".into(),
            arguments_json: "{\"command\":\"echo '<script>'\"}".into(),
            args_digest: "ab".repeat(32),
            risk: pb::Risk::High.into(),
            state: ApprovalState::Pending.into(),
            ..Default::default()
        }
    }

    fn links() -> Links {
        Links {
            approve: "https://a.example/decide/A".into(),
            reject: "https://a.example/decide/R".into(),
            allow_session: "https://a.example/decide/S".into(),
        }
    }

    #[test]
    fn agent_text_is_escaped_in_html_and_stays_on_its_lines() {
        let mail = request(&approval(), &links());
        assert!(!mail.subject.contains('\n') && !mail.subject.contains('\r'));
        assert_eq!(mail.subject, "⚠️ Approve bash? (high risk, …2e3f4a5b)");
        assert!(!mail.html.contains("<b>tidy") && !mail.html.contains("<script>"));
        assert!(
            mail.html
                .contains("&lt;b&gt;tidy&lt;/b&gt; ⏎ Risk: low⟨U+202E⟩"),
            "{}",
            mail.html
        );
        assert!(mail
            .plain
            .contains("│ Action: <b>tidy</b> ⏎ Risk: low⟨U+202E⟩"));
        assert!(mail.plain.contains("Approve: https://a.example/decide/A"));
        assert!(mail.html.contains("href=\"https://a.example/decide/R\""));
    }

    #[test]
    fn the_outcome_names_who_decided_and_why() {
        let mut rejected = approval();
        rejected.state = ApprovalState::Rejected.into();
        rejected.resolution = Some(pb::Resolution {
            resolved_by: pb::ResolvedBy::Decision.into(),
            reason: "not <today>".into(),
            deciders: vec![pb::Decider {
                channel: "email".into(),
                user_id: "alice@example.com".into(),
                display_name: "alice@example.com".into(),
            }],
            ..Default::default()
        });
        let mail = outcome(&rejected);
        assert!(mail.subject.starts_with("Re: ⚠️ Approve bash"));
        assert!(
            mail.plain.starts_with("❌ Rejected: bash"),
            "{}",
            mail.plain
        );
        assert!(mail.html.contains("“not &lt;today&gt;”"), "{}", mail.html);
    }
}
