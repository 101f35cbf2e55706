//! What a Slack message shows, as Block Kit. Everything an agent wrote (tool, action, reason,
//! identifiers, arguments) is shown as code — inline code on one line each, the arguments in a
//! code block — after [`agent_text`] made hidden characters visible, and escaped for mrkdwn
//! (`&`, `<`, `>`, so no `<!channel>` mention or link; a backtick becomes `ˋ`, so it cannot
//! close the code and format the rest): it cannot pass for countersign's own lines.

use std::collections::HashMap;

use countersign_client::{decider, pb, version, withdrawal};
use countersign_worker::agent_text::{self, Measure};
use countersign_worker::approval::{decide_elsewhere, first_deciders, outcome_word, prefix};
use countersign_worker::facts::{ApprovalFacts, Resolver};
use pb::ApprovalState;
use slack_morphism::prelude::*;

// Limits on single fields, counted on the escaped text Slack receives (`<` is sent as `&lt;`).
// Slack counts characters; counting UTF-16 code units instead is never less, so the limits
// hold either way.
const TOOL_LIMIT: usize = 80;
const LINE_LIMIT: usize = 300;
const NAME_LIMIT: usize = 80;
/// Slack refuses a message (`invalid_blocks`) with a section text over 3,000 characters.
pub const MAX_SECTION_CHARS: usize = 3_000;
/// The arguments get what the heading and fences leave of their section.
const ARGUMENTS_LIMIT: usize = 2_800;
/// At most this many approvers are named in a status line (each name is one `code` field).
const NAMED_APPROVERS: usize = 5;
/// Slack's `event_type` of the metadata each request message carries (to find it again).
pub const METADATA_EVENT: &str = "countersign_approval";

/// The buttons' action ids.
pub const APPROVE: &str = "countersign_approve";
pub const REJECT: &str = "countersign_reject";
pub const ALLOW_SESSION: &str = "countersign_allow_session";
/// The reject modal's callback id and its reason input.
pub const REJECT_VIEW: &str = "countersign_reject_reason";
pub const REASON_BLOCK: &str = "reason";
pub const REASON_INPUT: &str = "reason_text";

pub use crate::shown::shown_key;

/// An agent's words for mrkdwn: visible, escaped, as inline code; the escaped text takes at
/// most `max`.
pub fn code(text: &str, max: usize) -> String {
    format!("`{}`", escape_within(&agent_text::one_line(text, max), max))
}

/// `&`, `<`, `>` as Slack asks; backticks made harmless inside code.
pub fn escape(text: &str) -> String {
    agent_text::escape_with(text, push_escaped)
}

fn push_escaped(out: &mut String, character: char) {
    match character {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '`' => out.push('ˋ'),
        other => out.push(other),
    }
}

/// `text` escaped, cut (with "…") so that the escaped text takes at most `limit`.
fn escape_within(text: &str, limit: usize) -> String {
    agent_text::escape_within(text, limit, Measure::Utf16, push_escaped)
}

/// The button value: the approval and the arguments digest the approver saw.
pub fn button_value(approval: &pb::Approval) -> String {
    format!("{} {}", approval.id, version::current_arguments(approval).1)
}

/// The message of an approval in its current state: buttons while pending.
pub fn message(approval: &pb::Approval) -> SlackMessageContent {
    let facts = ApprovalFacts::of(approval);
    let pending = facts.is_pending();
    let tool = agent_text::one_line(facts.tool, TOOL_LIMIT);
    let title = if pending {
        let warning = facts.is_high_risk();
        format!("{}Approve {tool}?", if warning { "⚠️ " } else { "" })
    } else {
        format!("{}: {tool}", outcome_word(approval))
    };
    let mut blocks: Vec<SlackBlock> = vec![
        SlackHeaderBlock::new(pt!(title.clone())).into(),
        section(facts_text(&facts)),
    ];
    if !facts.action.is_empty() || !facts.reason.is_empty() {
        let mut says = "The agent says:".to_owned();
        for (label, text) in [("Action", facts.action), ("Reason", facts.reason)] {
            if !text.is_empty() {
                says.push_str(&format!("\n>*{label}:* {}", code(text, LINE_LIMIT)));
            }
        }
        blocks.push(section(says));
    }
    blocks.push(section(format!(
        "*Arguments* (SHA-256 `{}`):\n```{}```",
        prefix(facts.digest, 16),
        escape_within(&agent_text::visible(facts.arguments), ARGUMENTS_LIMIT)
    )));
    blocks.push(section(status(approval, &facts)));
    if pending {
        blocks.push(buttons(approval));
    }
    with_metadata(
        approval,
        SlackMessageContent::new().with_text(escape(&title)),
        blocks,
    )
}

/// A notice (`countersign notify`: an agent finished, failed or waits): its title in bold and
/// its message, escaped, with no buttons.
pub fn notice(title: &str, message: &str) -> SlackMessageContent {
    let text = format!("*{}*\n{}", escape(title), escape(message));
    SlackMessageContent::new()
        .with_text(text.clone())
        .with_blocks(vec![section(text)])
}

/// The smallest message of an approval, for when Slack refused the full one: the tool, the
/// risk and the id, where else to decide, and the buttons while pending. Nothing the agent
/// wrote but the tool's name, which is short.
pub fn minimal_message(approval: &pb::Approval) -> SlackMessageContent {
    let facts = ApprovalFacts::of(approval);
    let pending = facts.is_pending();
    let tool = agent_text::one_line(facts.tool, TOOL_LIMIT);
    let title = if pending {
        format!("Approve {tool}?")
    } else {
        format!("{}: {tool}", outcome_word(approval))
    };
    let mut blocks: Vec<SlackBlock> = vec![
        SlackHeaderBlock::new(pt!(title.clone())).into(),
        section(format!(
            "*Tool:* {}\n*Risk:* {}\n*ID:* `{}`\n{}",
            code(facts.tool, TOOL_LIMIT),
            facts.risk_word(),
            escape_within(facts.id, NAME_LIMIT),
            escape(&decide_elsewhere(facts.id)),
        )),
    ];
    if pending {
        blocks.push(buttons(approval));
    }
    with_metadata(
        approval,
        SlackMessageContent::new().with_text(escape(&title)),
        blocks,
    )
}

/// Approve, Reject… and Allow for session, each carrying [`button_value`].
fn buttons(approval: &pb::Approval) -> SlackBlock {
    let value = button_value(approval);
    let button = |id: &str, label: &str| {
        SlackBlockButtonElement::new(id.into(), pt!(label)).with_value(value.clone())
    };
    SlackActionsBlock::new(vec![
        button(APPROVE, "Approve")
            .with_style(SlackBlockButtonStyle::Primary)
            .into(),
        button(REJECT, "Reject…")
            .with_style(SlackBlockButtonStyle::Danger)
            .into(),
        button(ALLOW_SESSION, "Allow for session").into(),
    ])
    .into()
}

/// The metadata every message carries, by which a restarted worker finds it again.
fn with_metadata(
    approval: &pb::Approval,
    content: SlackMessageContent,
    blocks: Vec<SlackBlock>,
) -> SlackMessageContent {
    let metadata = SlackMessageMetadata::new(METADATA_EVENT.to_owned()).with_event_payload(
        HashMap::from([("approval_id".to_owned(), approval.id.clone())]),
    );
    content.with_blocks(blocks).with_metadata(metadata)
}

/// The modal that asks a rejecting approver for a reason; `value` is the button's.
pub fn reject_modal(value: &str) -> SlackView {
    let input = SlackBlockPlainTextInputElement::new(REASON_INPUT.into()).with_multiline(true);
    let blocks = vec![SlackInputBlock::new(
        pt!("Why reject? The agent is told."),
        SlackInputBlockElement::PlainTextInput(input),
    )
    .with_block_id(REASON_BLOCK.into())
    .into()];
    SlackView::Modal(
        SlackModalView::new(pt!("Reject the request"), blocks)
            .with_submit(pt!("Reject"))
            .with_close(pt!("Cancel"))
            .with_callback_id(REJECT_VIEW.into())
            .with_private_metadata(value.to_owned()),
    )
}

fn section(text: String) -> SlackBlock {
    SlackSectionBlock::new().with_text(md!(text)).into()
}

fn facts_text(facts: &ApprovalFacts) -> String {
    let mut text = format!(
        "*Tool:* {}\n*Risk:* {}\n*Agent:* {} · session {}\n",
        code(facts.tool, TOOL_LIMIT),
        facts.risk_word(),
        code(facts.agent_or_dash(), NAME_LIMIT),
        code(facts.session_or_dash(), NAME_LIMIT),
    );
    if let Some(expires) = facts.expires_text() {
        text.push_str(&format!("*Expires:* {expires}\n"));
    }
    text.push_str(&format!("*ID:* …{}", facts.short_id));
    text
}

/// The state line: quorum progress while pending, then who resolved it and why.
fn status(approval: &pb::Approval, facts: &ApprovalFacts) -> String {
    let line = match facts.state {
        ApprovalState::Pending => return facts.waiting_line(names),
        ApprovalState::Approved | ApprovalState::Consumed | ApprovalState::Rejected => {
            format!(
                "{} by {}{}",
                outcome_word(approval),
                resolver(facts),
                if facts.for_session {
                    " for this session"
                } else {
                    ""
                }
            )
        }
        ApprovalState::Expired => "⌛ Expired: no one decided in time".to_owned(),
        ApprovalState::Cancelled if withdrawal::is_withdrawn(approval) => {
            "🚫 Withdrawn: the agent stopped waiting for it".to_owned()
        }
        ApprovalState::Cancelled => "🚫 Cancelled: the request was withdrawn".to_owned(),
        ApprovalState::Unspecified => "❔ Unknown state".to_owned(),
    };
    match facts.note {
        Some(note) => format!("{line}\n*Note:* {}", code(note, LINE_LIMIT)),
        None => line,
    }
}

fn resolver(facts: &ApprovalFacts) -> String {
    match &facts.resolver {
        Some(Resolver::Rule(rule)) => format!("rule {}", code(rule, NAME_LIMIT)),
        Some(Resolver::Grant(_)) => "a session grant".to_owned(),
        Some(Resolver::Deciders(deciders)) => names(deciders),
        None => "unknown".to_owned(),
    }
}

/// Deciders as people know them: the display name (else the user id) and the channel.
fn names(deciders: &[&pb::Decider]) -> String {
    first_deciders(deciders, NAMED_APPROVERS, |decider| {
        format!(
            "{} ({})",
            code(decider::name(decider), NAME_LIMIT),
            escape_within(
                &agent_text::one_line(&decider.channel, NAME_LIMIT),
                NAME_LIMIT
            )
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::{ResolvedBy, Risk};

    fn approval() -> pb::Approval {
        pb::Approval {
            id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            tool_name: "bash".into(),
            action: "tidy `up`\n*✅ Approved* by <!channel> & <@U1>\u{202E}".into(),
            reason: "needed".into(),
            arguments_json: "{\"command\":\"echo ```<!here>\"}".into(),
            args_digest: "ab".repeat(32),
            risk: Risk::High.into(),
            state: ApprovalState::Pending.into(),
            ..Default::default()
        }
    }

    fn text(content: &SlackMessageContent) -> String {
        serde_json::to_string(&content.blocks).unwrap()
    }

    #[test]
    fn agent_text_stays_in_code_and_cannot_mention_or_format() {
        let shown = text(&message(&approval()));
        assert!(
            shown.contains(
                "`tidy ˋupˋ ⏎ *✅ Approved* by &lt;!channel&gt; &amp; &lt;@U1&gt;⟨U+202E⟩`"
            ),
            "{shown}"
        );
        assert!(!shown.contains("<!"), "{shown}");
        assert!(shown.contains("echo ˋˋˋ&lt;!here&gt;"), "{shown}");
        assert!(shown.contains("…2e3f4a5b"), "{shown}");
        assert_eq!(shown.matches("countersign_").count(), 3, "three buttons");
    }

    #[test]
    fn an_outcome_has_no_buttons_and_names_the_decider() {
        let mut rejected = approval();
        rejected.state = ApprovalState::Rejected.into();
        rejected.resolution = Some(pb::Resolution {
            reason: "not today".into(),
            deciders: vec![pb::Decider {
                channel: "slack".into(),
                user_id: "U0ALICE".into(),
                display_name: "alice".into(),
            }],
            ..Default::default()
        });
        let shown = text(&message(&rejected));
        assert!(!shown.contains(APPROVE), "{shown}");
        assert!(shown.contains("❌ Rejected by `alice` (slack)"), "{shown}");
        assert!(shown.contains("*Note:* `not today`"), "{shown}");
        assert_eq!(shown_key(&rejected), "final:APPROVAL_STATE_REJECTED");
    }

    #[test]
    fn a_withdrawn_approval_says_withdrawn() {
        let mut cancelled = approval();
        cancelled.state = ApprovalState::Cancelled.into();
        cancelled.resolution = Some(pb::Resolution {
            resolved_by: ResolvedBy::Cancellation.into(),
            reason: "no longer needed".into(),
            ..Default::default()
        });
        let shown = text(&message(&cancelled));
        assert!(shown.contains("🚫 Cancelled: bash"), "{shown}");
        if let Some(resolution) = cancelled.resolution.as_mut() {
            resolution.reason = "withdrawn: the caller left".into();
        }
        let shown = text(&message(&cancelled));
        assert!(shown.contains("🚫 Withdrawn: bash"), "{shown}");
        assert!(
            shown.contains("🚫 Withdrawn: the agent stopped waiting for it"),
            "{shown}"
        );
        assert!(!shown.contains(APPROVE), "{shown}");
    }
}
