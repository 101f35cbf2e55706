//! What a Discord message shows: markdown `content` (at most 2,000 characters) and, while
//! pending, one row of buttons. Everything an agent wrote (tool, action, reason, identifiers,
//! arguments) is inline code on one line — the arguments a code block — after [`agent_text`]
//! made hidden characters visible, with each backtick shown as `ˋ` so that it cannot close
//! the code and format the rest; every message is sent with `allowed_mentions` empty, so no
//! `@everyone`, `<@id>` or `<@&role>` the agent wrote notifies anyone.

use countersign_client::{decider, pb, version, withdrawal};
use countersign_worker::agent_text::{self, Measure};
use countersign_worker::approval::{first_deciders, outcome_word, prefix};
use countersign_worker::facts::{ApprovalFacts, Resolver};
use pb::ApprovalState;
use serde_json::{json, Value};
use twilight_model::channel::message::component::{
    ActionRow, Button, ButtonStyle, Component, TextInput, TextInputStyle,
};
use twilight_model::channel::message::AllowedMentions;

// Limits counted on the escaped text, chosen so that the whole content stays under Discord's
// 2,000 characters (counted in UTF-16 units here, never fewer than Discord's count).
const TOOL_LIMIT: usize = 60;
const NAME_LIMIT: usize = 60;
const LINE_LIMIT: usize = 200;
const ARGUMENTS_LIMIT: usize = 600;
const NAMED_APPROVERS: usize = 3;

/// The buttons' and the modal's `custom_id` verbs: `countersign:<verb>:<approval id>:<digest
/// prefix>` (at most 100 characters, as Discord allows).
pub const APPROVE: &str = "approve";
pub const REJECT: &str = "reject";
pub const ALLOW_SESSION: &str = "session";
pub const REASON: &str = "reason";
/// The reject modal's text input.
pub const REASON_INPUT: &str = "reason_text";
/// How much of the arguments digest a `custom_id` carries.
pub const DIGEST_PREFIX: usize = 16;

pub use crate::shown::shown_key;

/// An agent's words as inline code: visible, one line, its escaped text at most `max`.
pub fn code(text: &str, max: usize) -> String {
    let escaped = agent_text::escape_within(
        &agent_text::one_line(text, max),
        max,
        Measure::Utf16,
        push_escaped,
    );
    format!("`{escaped}`")
}

fn push_escaped(out: &mut String, character: char) {
    out.push(if character == '`' { 'ˋ' } else { character });
}

/// A button's `custom_id`.
pub fn custom_id(verb: &str, approval: &pb::Approval) -> String {
    let digest = version::current_arguments(approval).1;
    format!(
        "countersign:{verb}:{}:{}",
        approval.id,
        prefix(digest, DIGEST_PREFIX)
    )
}

/// The body of a post or an edit: the content, the buttons while pending (none once final),
/// and no mention allowed.
pub fn message(approval: &pb::Approval) -> Value {
    let components = if approval.state() == ApprovalState::Pending {
        let button = |verb: &str, label: &str, style| {
            Component::Button(Button {
                custom_id: Some(custom_id(verb, approval)),
                disabled: false,
                emoji: None,
                label: Some(label.to_owned()),
                style,
                url: None,
                sku_id: None,
            })
        };
        vec![Component::ActionRow(ActionRow {
            components: vec![
                button(APPROVE, "Approve", ButtonStyle::Success),
                button(REJECT, "Reject…", ButtonStyle::Danger),
                button(ALLOW_SESSION, "Allow for session", ButtonStyle::Secondary),
            ],
        })]
    } else {
        Vec::new()
    };
    json!({
        "content": content(approval),
        "components": components,
        "allowed_mentions": AllowedMentions::default(),
    })
}

/// A message only the tapping user sees (flag 64, EPHEMERAL), as an interaction's answer
/// (type 4, CHANNEL_MESSAGE_WITH_SOURCE).
pub fn ephemeral(text: &str) -> Value {
    json!({"type": 4, "data": ephemeral_message(text)})
}

/// A message only the tapping user sees (flag 64), as a follow-up of an answered interaction.
pub fn ephemeral_message(text: &str) -> Value {
    json!({"content": text, "flags": 64, "allowed_mentions": AllowedMentions::default()})
}

/// The modal (type 9) that asks a rejecting approver for the reason; its `custom_id` is the
/// tapped button's with the verb `reason`.
pub fn reject_modal(button_custom_id: &str) -> Value {
    let input = Component::TextInput(TextInput {
        custom_id: REASON_INPUT.to_owned(),
        label: "Why reject? The agent is told.".to_owned(),
        max_length: Some(1000),
        min_length: None,
        placeholder: None,
        required: Some(false),
        style: TextInputStyle::Paragraph,
        value: None,
    });
    let custom_id = button_custom_id.replacen(&format!(":{REJECT}:"), &format!(":{REASON}:"), 1);
    json!({"type": 9, "data": {
        "custom_id": custom_id,
        "title": "Reject the request",
        "components": [Component::ActionRow(ActionRow { components: vec![input] })],
    }})
}

/// The markdown content: the facts, what the agent says, the arguments, the state line.
pub fn content(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    let tool = code(facts.tool, TOOL_LIMIT);
    let mut text = if facts.is_pending() {
        let warning = if facts.is_high_risk() { "⚠️ " } else { "" };
        format!("**{warning}Approve {tool}?**\n")
    } else {
        format!("**{}: {tool}**\n", outcome_word(approval))
    };
    text.push_str(&format!(
        "**Tool:** {tool} · **Risk:** {}\n**Agent:** {} · session {}\n",
        facts.risk_word(),
        code(facts.agent_or_dash(), NAME_LIMIT),
        code(facts.session_or_dash(), NAME_LIMIT),
    ));
    if let Some(expires) = facts.expires_text() {
        text.push_str(&format!("**Expires:** {expires}\n"));
    }
    text.push_str(&format!("**ID:** …{}\n", facts.short_id));
    if !facts.action.is_empty() || !facts.reason.is_empty() {
        text.push_str("The agent says:\n");
        for (label, said) in [("Action", facts.action), ("Reason", facts.reason)] {
            if !said.is_empty() {
                text.push_str(&format!("> **{label}:** {}\n", code(said, LINE_LIMIT)));
            }
        }
    }
    let arguments = agent_text::escape_within(
        &agent_text::visible(facts.arguments),
        ARGUMENTS_LIMIT,
        Measure::Utf16,
        push_escaped,
    );
    text.push_str(&format!(
        "**Arguments** (SHA-256 `{}`):\n```\n{arguments}\n```\n{}",
        prefix(facts.digest, 16),
        status(approval, &facts)
    ));
    text
}

/// The state line: quorum progress while pending, then who resolved it and why.
fn status(approval: &pb::Approval, facts: &ApprovalFacts) -> String {
    let line = match facts.state {
        ApprovalState::Pending => return facts.waiting_line(names),
        ApprovalState::Approved | ApprovalState::Consumed | ApprovalState::Rejected => {
            let session = if facts.for_session {
                " for this session"
            } else {
                ""
            };
            format!("{} by {}{session}", outcome_word(approval), resolver(facts))
        }
        ApprovalState::Expired => "⌛ Expired: no one decided in time".to_owned(),
        ApprovalState::Cancelled if withdrawal::is_withdrawn(approval) => {
            "🚫 Withdrawn: the agent stopped waiting for it".to_owned()
        }
        ApprovalState::Cancelled => "🚫 Cancelled: the request was withdrawn".to_owned(),
        ApprovalState::Unspecified => "❔ Unknown state".to_owned(),
    };
    match facts.note {
        Some(note) => format!("{line}\n**Note:** {}", code(note, LINE_LIMIT)),
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
    first_deciders(deciders, NAMED_APPROVERS, |d| {
        format!(
            "{} ({})",
            code(decider::name(d), NAME_LIMIT),
            code(&d.channel, 20)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_message_fits_discords_2000_characters() {
        let long = "`<@&1>".repeat(400);
        let approval = pb::Approval {
            id: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into(),
            tool_name: long.clone(),
            action: long.clone(),
            reason: long.clone(),
            agent_id: long.clone(),
            session_id: long.clone(),
            arguments_json: long.clone(),
            state: ApprovalState::Rejected.into(),
            resolution: Some(pb::Resolution {
                reason: long.clone(),
                deciders: (0..9)
                    .map(|_| pb::Decider {
                        channel: long.clone(),
                        user_id: long.clone(),
                        display_name: long.clone(),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = content(&approval);
        assert!(shown.encode_utf16().count() <= 2000, "{}", shown.len());
        assert!(
            !shown.contains("`<@&1>"),
            "a backtick the agent wrote closes no code"
        );
        assert!(custom_id(REJECT, &approval).len() <= 100);
    }
}
