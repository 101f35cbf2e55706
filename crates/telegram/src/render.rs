//! What the worker shows on Telegram: the approval message (HTML parse mode), its buttons, and
//! the short texts that answer taps and commands.
//!
//! Everything here is pure, so that the same approval always renders to the same message:
//! an edit that changes nothing is recognised (and Telegram's "message is not modified" is
//! expected, not an error).

use countersign_client::{decider, groups, pb, version};
use pb::{ApprovalState, Risk, Scope, Verdict};

use countersign_worker::agent_text::{self, Measure};
use countersign_worker::approval::{
    decide_elsewhere, first_deciders, format_time, reminder_detail, short_id,
};
use countersign_worker::facts::{ApprovalFacts, Resolver};

use crate::callback::{ButtonAction, CallbackData};

/// Telegram's limit on a message text, in UTF-16 code units. The source HTML is kept within
/// it, which bounds the visible text too (markup and escapes only ever shrink when parsed).
pub const MAX_MESSAGE_UTF16: usize = 4096;
/// Telegram's limit on the text of a callback answer.
const MAX_ANSWER_CHARS: usize = 200;

// Limits on single fields, in UTF-16 code units of escaped HTML, so that the arguments always
// keep a good part of the message.
const TOOL_LIMIT: usize = 120;
const ACTION_LIMIT: usize = 400;
const REASON_LIMIT: usize = 600;
const IDENTITY_LIMIT: usize = 120;
const NAME_LIMIT: usize = 64;
const RESOLUTION_REASON_LIMIT: usize = 400;
/// At most this many approvers are named in a quorum's progress line.
const NAMED_APPROVERS: usize = 5;

/// An inline button.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Button {
    pub label: &'static str,
    pub callback_data: String,
}

/// A message as the worker wants Telegram to show it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RenderedMessage {
    /// HTML parse mode text, at most [`MAX_MESSAGE_UTF16`] UTF-16 code units.
    pub html: String,
    /// Rows of inline buttons; empty once the approval is no longer pending.
    pub keyboard: Vec<Vec<Button>>,
}

/// Renders an approval. Buttons (in the order of `buttons`) are shown while it is pending.
pub fn render_approval(approval: &pb::Approval, buttons: &[ButtonAction]) -> RenderedMessage {
    let facts = ApprovalFacts::of(approval);
    let head = render_head(&facts);
    let tail = render_tail(approval, &facts);
    let arguments_budget = MAX_MESSAGE_UTF16.saturating_sub(utf16_len(&head) + utf16_len(&tail));
    let arguments = render_arguments(&facts, arguments_budget);
    RenderedMessage {
        html: format!("{head}{arguments}{tail}"),
        keyboard: keyboard(approval, buttons),
    }
}

/// The smallest message of an approval, for when Telegram refused the full one for its
/// content: the header, the tool, the risk, the id, where else to decide, and the buttons.
pub fn render_minimal(approval: &pb::Approval, buttons: &[ButtonAction]) -> RenderedMessage {
    let facts = ApprovalFacts::of(approval);
    RenderedMessage {
        html: format!(
            "{}\n<b>Tool:</b> <code>{}</code>\n<b>Risk:</b> {}\n<b>ID:</b> <code>{}</code>\n<i>{}</i>",
            header_html(&facts),
            agent_html(facts.tool, TOOL_LIMIT),
            risk_label(facts.risk),
            escape_within(facts.id, IDENTITY_LIMIT),
            escape(&decide_elsewhere(facts.id)),
        ),
        keyboard: keyboard(approval, buttons),
    }
}

fn render_head(facts: &ApprovalFacts) -> String {
    let mut head = String::new();
    head.push_str(&header_html(facts));
    head.push('\n');
    head.push_str(&format!(
        "<b>Tool:</b> <code>{}</code>\n",
        agent_html(facts.tool, TOOL_LIMIT)
    ));
    head.push_str(&format!("<b>Risk:</b> {}\n", risk_label(facts.risk)));
    head.push_str(&format!(
        "<b>Agent:</b> {} · <b>Session:</b> {}\n",
        agent_html(facts.agent_or_dash(), IDENTITY_LIMIT),
        agent_html(facts.session_or_dash(), IDENTITY_LIMIT)
    ));
    if !facts.requester.is_empty() {
        head.push_str(&format!(
            "<b>Requester:</b> {}\n",
            agent_html(facts.requester, IDENTITY_LIMIT)
        ));
    }
    head.push_str(&agent_says_html(facts));
    head
}

/// The first line: what the message is about now. A decided approval is no longer a
/// request, so its header states the outcome.
fn header_html(facts: &ApprovalFacts) -> String {
    match facts.state {
        ApprovalState::Pending | ApprovalState::Unspecified if facts.is_high_risk() => {
            "⚠️ <b>Approval request</b>".to_owned()
        }
        ApprovalState::Pending | ApprovalState::Unspecified => "<b>Approval request</b>".to_owned(),
        ApprovalState::Approved => "✅ <b>Approved</b>".to_owned(),
        ApprovalState::Consumed => "▶️ <b>Approved and executed</b>".to_owned(),
        ApprovalState::Rejected => "❌ <b>Rejected</b>".to_owned(),
        ApprovalState::Expired => "⌛ <b>Expired</b> without a decision".to_owned(),
        ApprovalState::Cancelled => format!("🚫 <b>{}</b>", facts.cancelled_word),
    }
}

/// What the agent wrote in its own words (action, reason), each on one line, together in
/// one quote block, so that nothing it wrote can pass for the worker's own lines.
fn agent_says_html(facts: &ApprovalFacts) -> String {
    let mut lines = Vec::new();
    if !facts.action.is_empty() {
        lines.push(format!(
            "<b>Action:</b> {}",
            agent_html(facts.action, ACTION_LIMIT)
        ));
    }
    if !facts.reason.is_empty() {
        lines.push(format!(
            "<b>Reason:</b> {}",
            agent_html(facts.reason, REASON_LIMIT)
        ));
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "<i>The agent says:</i>\n<blockquote>{}</blockquote>\n",
        lines.join("\n")
    )
}

/// Agent-supplied text as escaped HTML on one line (see [`agent_text::one_line`]), at most
/// `limit` UTF-16 code units.
fn agent_html(text: &str, limit: usize) -> String {
    escape_within(&agent_text::one_line(text, limit), limit)
}

fn render_tail(approval: &pb::Approval, facts: &ApprovalFacts) -> String {
    let mut tail = String::new();
    if let Some(expires) = facts.expires_text() {
        tail.push_str(&format!("<b>Expires:</b> {expires}\n"));
    }
    tail.push_str(&format!(
        "<b>ID:</b> <code>{}</code>\n",
        escape(facts.short_id)
    ));
    tail.push_str(&who_decides_html(approval));
    tail.push('\n');
    tail.push_str(&status_html(facts));
    tail
}

/// The groups that decide with their progress, the escalation, and the decisions made on
/// someone's behalf; empty for an approval without groups, follow-up or delegation.
fn who_decides_html(approval: &pb::Approval) -> String {
    let mut html = String::new();
    let progress = groups::group_progress(approval);
    if !progress.is_empty() {
        html.push_str(&format!(
            "<b>Groups:</b> {}\n",
            escape_within(&progress.join(" · "), IDENTITY_LIMIT * 2)
        ));
    }
    if let Some(state) = groups::follow_up_state(approval) {
        html.push_str(&format!(
            "<b>Follow-up:</b> {}\n",
            escape_within(&state, IDENTITY_LIMIT)
        ));
    }
    for behalf in approval.decisions.iter().filter_map(groups::on_behalf_of) {
        html.push_str(&format!(
            "<b>Delegated:</b> {}\n",
            escape_within(&behalf, IDENTITY_LIMIT)
        ));
    }
    html
}

/// The reminder posted as a reply to the request message: who is still awaited (`detail`,
/// written by the server) and the approval's id.
pub fn reminder_html(approval: &pb::Approval, detail: &str) -> String {
    let mut html = format!(
        "⏰ <b>Reminder</b>: {}\n<b>Tool:</b> <code>{}</code> · <b>ID:</b> <code>{}</code>",
        escape_within(reminder_detail(detail), RESOLUTION_REASON_LIMIT),
        agent_html(&approval.tool_name, TOOL_LIMIT),
        escape(short_id(&approval.id))
    );
    let progress = groups::group_progress(approval);
    if !progress.is_empty() {
        html.push_str(&format!(
            "\n<b>Groups:</b> {}",
            escape_within(&progress.join(" · "), IDENTITY_LIMIT * 2)
        ));
    }
    html
}

/// The arguments, pretty-printed in a `pre` block, truncated with a note to fit `budget`.
/// When an approver edited them (edit-on-approve), the edited arguments, which the agent
/// runs, with who edited them.
fn render_arguments(facts: &ApprovalFacts, budget: usize) -> String {
    let (arguments, digest) = (facts.arguments, facts.digest);
    let fingerprint = digest.get(..12).unwrap_or(digest);
    let mut heading = if let Some(edit) = &facts.edit {
        let editor = edit
            .editor
            .map(|editor| agent_html(&decider_name(editor), NAME_LIMIT))
            .unwrap_or_default();
        let restarted = if edit.restarted_count {
            " · the edit restarted the approval count"
        } else {
            ""
        };
        let requested = edit.requested_digest;
        format!(
            "✏️ <b>Arguments edited by</b> {editor}{restarted} (requested sha256 <code>{}</code>); the agent runs these:\n",
            escape(requested.get(..12).unwrap_or(requested))
        )
    } else {
        String::new()
    };
    heading.push_str(&if fingerprint.is_empty() {
        "<b>Arguments:</b>\n".to_owned()
    } else {
        format!(
            "<b>Arguments</b> (sha256 <code>{}</code>):\n",
            escape(fingerprint)
        )
    });
    if arguments.is_empty() {
        return format!("{heading}<i>not stored (redacted)</i>\n");
    }
    let pretty = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| arguments.to_owned());
    let pretty = agent_text::visible(&pretty);
    const OPEN: &str = "<pre><code class=\"language-json\">";
    const CLOSE: &str = "</code></pre>\n";
    let total_chars = pretty.chars().count();
    let frame = utf16_len(&heading) + utf16_len(OPEN) + utf16_len(CLOSE);
    let escaped = escape(&pretty);
    if frame + utf16_len(&escaped) <= budget {
        return format!("{heading}{OPEN}{escaped}{CLOSE}");
    }
    // The note is sized for the largest count it can show, so the result always fits.
    let note_reserve = utf16_len(&truncation_note(total_chars, total_chars));
    let room = budget.saturating_sub(frame + note_reserve);
    let (shown, shown_chars) = escape_prefix(&pretty, room);
    format!(
        "{heading}{OPEN}{shown}{CLOSE}{}",
        truncation_note(shown_chars, total_chars)
    )
}

fn truncation_note(shown: usize, total: usize) -> String {
    format!("<i>… arguments truncated: {shown} of {total} characters shown</i>\n")
}

fn keyboard(approval: &pb::Approval, buttons: &[ButtonAction]) -> Vec<Vec<Button>> {
    if approval.state() != ApprovalState::Pending {
        return Vec::new();
    }
    // An edited approval: Approve names the version shown; the session button goes (edits
    // are approved for one call only).
    let edited = version::is_edited(approval);
    let button = |action: ButtonAction| Button {
        label: action.label(),
        callback_data: if edited {
            CallbackData::for_version(action, &approval.id, &approval.edited_args_digest)
        } else {
            CallbackData::new(action, &approval.id)
        }
        .to_string(),
    };
    // Approve and Reject side by side, the wider session button on its own row.
    let first_row: Vec<Button> = buttons
        .iter()
        .filter(|action| **action != ButtonAction::AllowSession)
        .map(|action| button(*action))
        .collect();
    let mut rows = vec![first_row];
    if buttons.contains(&ButtonAction::AllowSession) && !edited {
        rows.push(vec![button(ButtonAction::AllowSession)]);
    }
    rows.retain(|row| !row.is_empty());
    rows
}

/// The state line(s) at the bottom of the message.
fn status_html(facts: &ApprovalFacts) -> String {
    match facts.state {
        ApprovalState::Pending => facts.waiting_line(names_html),
        ApprovalState::Approved => approved_html(facts),
        ApprovalState::Consumed => {
            let outcome = facts
                .execution
                .as_ref()
                .and_then(|execution| execution.word())
                .map(|word| format!(" ({word})"))
                .unwrap_or_default();
            format!("{}\n▶️ Executed{outcome}", approved_html(facts))
        }
        ApprovalState::Rejected => {
            let mut html = format!("❌ <b>Rejected</b> by {}", resolver_html(facts));
            html.push_str(&at_html(facts));
            html.push_str(&resolution_reason_html(facts));
            html
        }
        ApprovalState::Expired => format!(
            "⌛ <b>Expired</b>{}{}",
            at_html(facts),
            resolution_reason_html(facts)
        ),
        ApprovalState::Cancelled => {
            let mut html = format!("🚫 <b>{}</b>{}", facts.cancelled_word, at_html(facts));
            html.push_str(&resolution_reason_html(facts));
            html
        }
        ApprovalState::Unspecified => "❔ Unknown state".to_owned(),
    }
}

fn approved_html(facts: &ApprovalFacts) -> String {
    let mut html = format!("✅ <b>Approved</b> by {}", resolver_html(facts));
    if facts.for_session {
        html.push_str(" for this session");
    }
    html.push_str(&at_html(facts));
    html.push_str(&resolution_reason_html(facts));
    html
}

/// Who or what resolved the approval, as HTML.
fn resolver_html(facts: &ApprovalFacts) -> String {
    match &facts.resolver {
        Some(Resolver::Rule(rule)) => {
            format!("rule <code>{}</code>", agent_html(rule, NAME_LIMIT))
        }
        Some(Resolver::Grant(_)) => "a session grant".to_owned(),
        Some(Resolver::Deciders(deciders)) => names_html(deciders),
        None => "unknown".to_owned(),
    }
}

fn names_html(deciders: &[&pb::Decider]) -> String {
    first_deciders(deciders, NAMED_APPROVERS, |decider| {
        agent_html(&decider_name(decider), NAME_LIMIT)
    })
}

fn at_html(facts: &ApprovalFacts) -> String {
    facts
        .resolved_at
        .map(|seconds| format!(" at {}", format_time(seconds)))
        .unwrap_or_default()
}

/// The note that came with the resolution (a decider's reason, a cancellation's).
fn resolution_reason_html(facts: &ApprovalFacts) -> String {
    facts
        .note
        .map(|note| {
            format!(
                "\n<b>Note:</b> {}",
                agent_html(note, RESOLUTION_REASON_LIMIT)
            )
        })
        .unwrap_or_default()
}

/// A decider as people know them: the display name, else the user id; with the channel when
/// the decision came from elsewhere.
pub fn decider_name(decider: &pb::Decider) -> String {
    let name = decider::name(decider).to_owned();
    if decider.channel.is_empty() || decider.channel == "telegram" {
        name
    } else {
        format!("{name} ({})", decider.channel)
    }
}

/// A short HTML summary of the state, for a reply when the message cannot be edited.
pub fn status_reply_html(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    format!(
        "{} · <b>{}</b> <code>{}</code>",
        status_html(&facts),
        agent_html(facts.tool, TOOL_LIMIT),
        escape(facts.short_id)
    )
}

/// The short notice posted when a session grant approved a call at once, so that approvers
/// see every use of the grants they gave.
pub fn grant_notice_html(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    let mut html = format!(
        "🔓 <b>Approved by a session grant</b>, no one was asked\n<b>Tool:</b> <code>{}</code> · <b>Agent:</b> {} · <b>Session:</b> {}\n",
        agent_html(facts.tool, TOOL_LIMIT),
        agent_html(facts.agent_or_dash(), IDENTITY_LIMIT),
        agent_html(facts.session_or_dash(), IDENTITY_LIMIT),
    );
    if !facts.action.is_empty() {
        html.push_str(&format!(
            "<i>The agent says:</i>\n<blockquote><b>Action:</b> {}</blockquote>\n",
            agent_html(facts.action, ACTION_LIMIT)
        ));
    }
    html.push_str(&format!(
        "<b>ID:</b> <code>{}</code>",
        escape(facts.short_id)
    ));
    html
}

/// What an orphaned copy of a request message (sent before a crash, its id never written
/// down) is turned into once found.
pub const REPLACED_COPY_HTML: &str =
    "↪️ <i>This copy of an approval request was replaced by a newer message after the worker restarted.</i>";

/// What a tap or command achieved, for the callback answer or the reply to a command.
pub fn decision_outcome_text(
    response: &pb::DecideResponse,
    verdict: Verdict,
    scope: Scope,
) -> String {
    let Some(approval) = &response.approval else {
        return "Done".to_owned();
    };
    let text = match response.outcome() {
        pb::DecideOutcome::Resolved | pb::DecideOutcome::Recorded
            if approval.state() == ApprovalState::Pending =>
        {
            let approvals = approval
                .decisions
                .iter()
                .filter(|decision| decision.verdict() == Verdict::Approve)
                .count();
            format!(
                "Approval recorded: {approvals} of {}",
                approval.required_approvals.max(1)
            )
        }
        pb::DecideOutcome::Resolved | pb::DecideOutcome::Recorded => match (verdict, scope) {
            (Verdict::Reject, _) => "Rejected".to_owned(),
            (_, Scope::Session) => "Approved for this session".to_owned(),
            _ => "Approved".to_owned(),
        },
        pb::DecideOutcome::AlreadyResolved => already_resolved_text(approval),
        pb::DecideOutcome::Duplicate => "Your decision was already recorded".to_owned(),
        pb::DecideOutcome::Unspecified => "Done".to_owned(),
    };
    limit_chars(&text, MAX_ANSWER_CHARS)
}

/// "Already approved by …", "Expired", … for a decision on an approval no longer pending.
pub fn already_resolved_text(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    let by = || match &facts.resolver {
        Some(Resolver::Rule(rule)) => format!(" by rule {rule}"),
        Some(Resolver::Grant(_)) => " by a session grant".to_owned(),
        Some(Resolver::Deciders(deciders)) => {
            let names: Vec<String> = deciders.iter().copied().map(decider_name).collect();
            format!(" by {}", names.join(", "))
        }
        None => String::new(),
    };
    let text = match facts.state {
        ApprovalState::Approved | ApprovalState::Consumed => format!("Already approved{}", by()),
        ApprovalState::Rejected => format!("Already rejected{}", by()),
        ApprovalState::Expired => "Expired".to_owned(),
        ApprovalState::Cancelled => facts.cancelled_word.to_owned(),
        ApprovalState::Pending | ApprovalState::Unspecified => "Still pending".to_owned(),
    };
    limit_chars(&text, MAX_ANSWER_CHARS)
}

fn risk_label(risk: Risk) -> &'static str {
    match risk {
        Risk::Low => "🟢 low",
        Risk::Medium => "🟡 medium",
        Risk::High => "🟠 ⚠️ HIGH",
        Risk::Critical => "🔴 ⚠️ CRITICAL",
        Risk::Unspecified => "unspecified",
    }
}

/// Escapes text for Telegram's HTML parse mode.
pub fn escape(text: &str) -> String {
    agent_text::escape_with(text, push_escaped)
}

fn push_escaped(out: &mut String, character: char) {
    match character {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '"' => out.push_str("&quot;"),
        other => out.push(other),
    }
}

/// Escapes `text`, cut (with "…") so that the result takes at most `limit` UTF-16 code units.
fn escape_within(text: &str, limit: usize) -> String {
    agent_text::escape_within(text, limit, Measure::Utf16, push_escaped)
}

/// The escaped form of the longest prefix of `text` that fits `limit` UTF-16 code units, and
/// how many characters of `text` it holds. Never cuts inside a character or an escape.
fn escape_prefix(text: &str, limit: usize) -> (String, usize) {
    agent_text::escape_prefix(text, limit, Measure::Utf16, push_escaped)
}

fn limit_chars(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(limit - 1).collect();
    cut.push('…');
    cut
}

pub fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::ResolvedBy;

    const ID: &str = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b";

    fn approval(arguments_json: &str) -> pb::Approval {
        pb::Approval {
            id: ID.into(),
            agent_id: "coder-1".into(),
            session_id: "session-7".into(),
            requester: "alice".into(),
            tool_name: "bash".into(),
            arguments_json: arguments_json.into(),
            args_digest: "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90".into(),
            action: "delete the build directory".into(),
            reason: "clean rebuild".into(),
            risk: Risk::High.into(),
            required_approvals: 1,
            state: ApprovalState::Pending.into(),
            expires_at: Some(prost_types::Timestamp {
                seconds: 1_735_732_800,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    fn decider(name: &str, channel: &str) -> pb::Decider {
        pb::Decider {
            channel: channel.into(),
            user_id: "42".into(),
            display_name: name.into(),
        }
    }

    #[test]
    fn an_edit_made_elsewhere_shows_the_edited_arguments_and_the_editor_escaped() {
        let mut edited = approval(r#"{"command":"rm -rf build/"}"#);
        edited.edited_arguments_json = r#"{"command":"rm -rf build/<b>tmp</b>"}"#.into();
        edited.edited_args_digest =
            "ffeeddccbbaa00112233445566778899ffeeddccbbaa00112233445566778899".into();
        edited.editor = Some(decider("<i>Mallory</i>", "github"));
        edited.required_approvals = 2;
        edited.decisions = vec![pb::Decision {
            verdict: Verdict::Approve.into(),
            decider: edited.editor.clone(),
            args_digest: edited.edited_args_digest.clone(),
            edited_arguments_json: edited.edited_arguments_json.clone(),
            restarts_count: true,
            ..Default::default()
        }];
        let html = render_approval(&edited, &ButtonAction::ALL).html;
        assert!(
            html.contains("✏️ <b>Arguments edited by</b> &lt;i&gt;Mallory&lt;/i&gt;"),
            "{html}"
        );
        assert!(
            html.contains("the edit restarted the approval count"),
            "{html}"
        );
        assert!(
            html.contains("requested sha256 <code>a1b2c3d4e5f6</code>"),
            "{html}"
        );
        assert!(
            html.contains("(sha256 <code>ffeeddccbbaa</code>)"),
            "{html}"
        );
        assert!(
            html.contains("rm -rf build/&lt;b&gt;tmp&lt;/b&gt;"),
            "{html}"
        );
        assert!(
            !html.contains("\"rm -rf build/\""),
            "the requested version is not shown as current"
        );
        assert!(html.contains("Waiting: 1 of 2 approvals"), "{html}");
    }

    #[test]
    fn a_pending_approval_shows_every_field_and_three_buttons() {
        let message = render_approval(
            &approval(r#"{"command":"rm -rf build/"}"#),
            &ButtonAction::ALL,
        );
        for expected in [
            "⚠️ <b>Approval request</b>",
            "<code>bash</code>",
            "delete the build directory",
            "clean rebuild",
            "HIGH",
            "coder-1",
            "session-7",
            "alice",
            "sha256 <code>a1b2c3d4e5f6</code>",
            "&quot;command&quot;: &quot;rm -rf build/&quot;",
            "2025-01-01 12:00 UTC",
            "<code>3e4f5a6b</code>",
            "Waiting for a decision",
        ] {
            assert!(
                message.html.contains(expected),
                "{expected:?} missing in {}",
                message.html
            );
        }
        let labels: Vec<Vec<&str>> = message
            .keyboard
            .iter()
            .map(|row| row.iter().map(|button| button.label).collect())
            .collect();
        assert_eq!(
            labels,
            vec![
                vec!["✅ Approve", "❌ Reject"],
                vec!["🔓 Allow for session"]
            ]
        );
        assert_eq!(message.keyboard[1][0].callback_data, format!("cs1:s:{ID}"));
    }

    #[test]
    fn only_configured_buttons_are_shown() {
        let message = render_approval(&approval("{}"), &[ButtonAction::Reject]);
        assert_eq!(message.keyboard.len(), 1);
        assert_eq!(message.keyboard[0].len(), 1);
        assert_eq!(message.keyboard[0][0].callback_data, format!("cs1:r:{ID}"));
    }

    #[test]
    fn low_risk_has_no_warning_marker() {
        let mut low = approval("{}");
        low.risk = Risk::Low.into();
        let message = render_approval(&low, &ButtonAction::ALL);
        assert!(!message.html.contains("⚠️"), "{}", message.html);
    }

    #[test]
    fn special_characters_are_escaped_everywhere() {
        let mut nasty = approval(r#"{"html":"<b>&amp;</b> \"q\" 'a' <tg-spoiler>"}"#);
        nasty.action = "<script>&".into();
        nasty.tool_name = "a<b".into();
        let message = render_approval(&nasty, &ButtonAction::ALL);
        assert!(
            message.html.contains("&lt;script&gt;&amp;"),
            "{}",
            message.html
        );
        assert!(message.html.contains("a&lt;b"), "{}", message.html);
        assert!(!message.html.contains("<script>"));
        assert!(!message.html.contains("<tg-spoiler>"));
    }

    #[test]
    fn huge_arguments_are_truncated_to_fit_with_a_note() {
        let big = serde_json::json!({ "blob": "&<>\"".repeat(4000), "text": "x".repeat(10_000) });
        let message = render_approval(&approval(&big.to_string()), &ButtonAction::ALL);
        assert!(
            utf16_len(&message.html) <= MAX_MESSAGE_UTF16,
            "{}",
            utf16_len(&message.html)
        );
        assert!(
            message.html.contains("arguments truncated"),
            "{}",
            message.html
        );
        assert!(message.html.contains("</code></pre>"));
        // The state stays visible below the arguments.
        assert!(message.html.ends_with("Waiting for a decision"));
    }

    #[test]
    fn long_fields_are_cut_so_the_message_always_fits() {
        let mut long = approval(&serde_json::json!({ "a": "😀".repeat(5000) }).to_string());
        long.action = "&".repeat(5000);
        long.reason = "<".repeat(5000);
        long.agent_id = "a".repeat(5000);
        long.session_id = "s".repeat(5000);
        long.requester = "r".repeat(5000);
        long.tool_name = "t".repeat(5000);
        long.state = ApprovalState::Rejected.into();
        long.resolution = Some(pb::Resolution {
            verdict: Verdict::Reject.into(),
            resolved_by: ResolvedBy::Decision.into(),
            deciders: (0..50)
                .map(|i| decider(&format!("user{i}{}", "n".repeat(100)), "cli"))
                .collect(),
            reason: "why".repeat(1000),
            ..Default::default()
        });
        let message = render_approval(&long, &ButtonAction::ALL);
        assert!(
            utf16_len(&message.html) <= MAX_MESSAGE_UTF16,
            "{}",
            utf16_len(&message.html)
        );
        assert!(message.html.contains("45 more"));
    }

    #[test]
    fn a_quorum_shows_progress_and_keeps_the_buttons() {
        let mut quorum = approval("{}");
        quorum.required_approvals = 2;
        quorum.decisions.push(pb::Decision {
            verdict: Verdict::Approve.into(),
            decider: Some(decider("@alice", "telegram")),
            ..Default::default()
        });
        let message = render_approval(&quorum, &ButtonAction::ALL);
        assert!(
            message.html.contains("1 of 2 approvals (by @alice)"),
            "{}",
            message.html
        );
        assert_eq!(message.keyboard.len(), 2);
    }

    #[test]
    fn resolved_states_say_who_and_drop_the_buttons() {
        let mut approved = approval("{}");
        approved.state = ApprovalState::Approved.into();
        approved.decisions.push(pb::Decision {
            verdict: Verdict::Approve.into(),
            scope: Scope::Session.into(),
            ..Default::default()
        });
        approved.resolution = Some(pb::Resolution {
            verdict: Verdict::Approve.into(),
            resolved_by: ResolvedBy::Decision.into(),
            deciders: vec![decider("bob", "cli")],
            resolved_at: Some(prost_types::Timestamp {
                seconds: 1_735_732_900,
                nanos: 0,
            }),
            ..Default::default()
        });
        let message = render_approval(&approved, &ButtonAction::ALL);
        assert!(
            message.html.contains(
                "✅ <b>Approved</b> by bob (cli) for this session at 2025-01-01 12:01 UTC"
            ),
            "{}",
            message.html
        );
        assert!(message.keyboard.is_empty());

        let mut expired = approval("{}");
        expired.state = ApprovalState::Expired.into();
        assert!(render_approval(&expired, &ButtonAction::ALL)
            .html
            .contains("⌛ <b>Expired</b>"));

        let mut cancelled = approval("{}");
        cancelled.state = ApprovalState::Cancelled.into();
        cancelled.resolution = Some(pb::Resolution {
            resolved_by: ResolvedBy::Cancellation.into(),
            reason: "agent gave up".into(),
            ..Default::default()
        });
        let html = render_approval(&cancelled, &ButtonAction::ALL).html;
        assert!(html.contains("🚫 <b>Cancelled</b>"), "{html}");
        assert!(html.contains("agent gave up"), "{html}");

        // A caller that stopped or left withdrew it: the message says so.
        if let Some(resolution) = cancelled.resolution.as_mut() {
            resolution.reason = "withdrawn: the caller left".into();
        }
        let message = render_approval(&cancelled, &ButtonAction::ALL);
        assert!(
            message.html.contains("🚫 <b>Withdrawn</b>"),
            "{}",
            message.html
        );
        assert!(!message.html.contains("Cancelled"), "{}", message.html);
        assert!(message.keyboard.is_empty());
    }

    #[test]
    fn outcome_texts_name_the_result() {
        let mut rejected = approval("{}");
        rejected.state = ApprovalState::Rejected.into();
        rejected.resolution = Some(pb::Resolution {
            resolved_by: ResolvedBy::Decision.into(),
            deciders: vec![decider("@carol", "telegram")],
            ..Default::default()
        });
        let response = |outcome: pb::DecideOutcome, approval: &pb::Approval| pb::DecideResponse {
            outcome: outcome.into(),
            approval: Some(approval.clone()),
        };
        assert_eq!(
            decision_outcome_text(
                &response(pb::DecideOutcome::AlreadyResolved, &rejected),
                Verdict::Approve,
                Scope::Once
            ),
            "Already rejected by @carol"
        );
        assert_eq!(
            decision_outcome_text(
                &response(pb::DecideOutcome::Resolved, &rejected),
                Verdict::Reject,
                Scope::Once
            ),
            "Rejected"
        );
        let mut expired = approval("{}");
        expired.state = ApprovalState::Expired.into();
        assert_eq!(already_resolved_text(&expired), "Expired");
        let mut pending = approval("{}");
        pending.required_approvals = 2;
        pending.decisions.push(pb::Decision {
            verdict: Verdict::Approve.into(),
            ..Default::default()
        });
        assert_eq!(
            decision_outcome_text(
                &response(pb::DecideOutcome::Recorded, &pending),
                Verdict::Approve,
                Scope::Once
            ),
            "Approval recorded: 1 of 2"
        );
    }
}
