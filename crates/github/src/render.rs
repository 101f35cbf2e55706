//! The Markdown the worker posts: the request comment (kept true as the approval moves on) and
//! short replies to commands it refuses.
//!
//! Everything that comes from the agent is inert here: one-line fields are flattened (line
//! breaks shown as ⏎, bidirectional and zero-width characters as their code points) and
//! backslash-escaped so they cannot add links, HTML, mentions or markers; the agent's own
//! words (action, reason) stand together in one quote block; the arguments go into a code
//! block whose fence is longer than any backtick run inside. The whole comment, fences and
//! all, stays under GitHub's 65,536-character limit, truncation shown with the digest of the
//! full arguments. The first line of the request comment is a hidden marker with the
//! approval id, which is how the worker recognises its own comment after a crash.

use countersign_client::{decider, groups, pb, version};
use countersign_worker::agent_text;
pub use countersign_worker::approval::short_id;
use countersign_worker::approval::{format_time, reminder_detail};
use countersign_worker::facts::{ApprovalFacts, Resolver};

use crate::target::RepoName;

const APPROVAL_MARKER_PREFIX: &str = "<!-- countersign:approval:";
const REPLY_MARKER_PREFIX: &str = "<!-- countersign:reply-to:";
const MARKER_SUFFIX: &str = " -->";
/// What stands in for the arguments in a body GitHub refused whole.
const ARGUMENTS_NOT_SHOWN: &str =
    "_(arguments not shown: GitHub refused the full comment; the digest above identifies them)_\n";
/// GitHub refuses comment and issue bodies over 65,536 characters.
pub const MAX_BODY_CHARS: usize = 65_536;

/// The hidden first line of a request comment.
pub fn approval_marker(approval_id: &str) -> String {
    format!("{APPROVAL_MARKER_PREFIX}{approval_id}{MARKER_SUFFIX}")
}

/// The approval id in a request comment's marker. Only the first line counts, so text quoted
/// from elsewhere cannot pose as a marker.
pub fn marked_approval_id(body: &str) -> Option<&str> {
    marked(body, APPROVAL_MARKER_PREFIX)
}

/// The id of the comment a refusal reply answers, from the reply's marker.
pub fn replied_comment_id(body: &str) -> Option<u64> {
    marked(body, REPLY_MARKER_PREFIX)?.parse().ok()
}

fn marked<'a>(body: &'a str, prefix: &str) -> Option<&'a str> {
    let first_line = body.lines().next()?.trim_end();
    first_line
        .strip_prefix(prefix)?
        .strip_suffix(MARKER_SUFFIX)
        .filter(|value| !value.is_empty())
}

/// True when `given` (lower case, from a command) names `approval_id`: the full id or its
/// short form.
pub fn names_approval(given: &str, approval_id: &str) -> bool {
    given.eq_ignore_ascii_case(approval_id) || given.eq_ignore_ascii_case(short_id(approval_id))
}

/// The title of the issue opened for an approval when the target is a repository.
pub fn issue_title(approval: &pb::Approval) -> String {
    format!(
        "Approval requested: {} ({})",
        flatten(&approval.tool_name, 80),
        flatten(&approval.action, 120)
    )
}

/// The request comment for the approval in its current state, under [`MAX_BODY_CHARS`].
pub fn request_body(approval: &pb::Approval) -> String {
    let head = request_head(approval);
    let tail = request_tail(approval);
    let budget = MAX_BODY_CHARS - 1 - head.chars().count() - tail.chars().count();
    let facts = ApprovalFacts::of(approval);
    format!(
        "{head}{}{tail}",
        arguments_block(facts.arguments, facts.digest, budget)
    )
}

/// The smallest request comment: everything but the arguments (their digest stays), for when
/// GitHub refused the full one (422).
pub fn minimal_request_body(approval: &pb::Approval) -> String {
    format!(
        "{}{ARGUMENTS_NOT_SHOWN}{}",
        request_head(approval),
        request_tail(approval)
    )
}

/// [`minimal_request_body`] from an already rendered body: the part above the arguments and
/// the part below them, with the arguments block replaced by a note.
pub fn minimal_request_body_of(body: &str) -> String {
    const ARGUMENTS: &str = "**Arguments**\n\n";
    const ANSWER: &str = "\nTo answer,";
    let Some(start) = body.find(ARGUMENTS).map(|at| at + ARGUMENTS.len()) else {
        return body.chars().take(MAX_BODY_CHARS - 1).collect();
    };
    let tail = body[start..]
        .rfind(ANSWER)
        .map_or("", |at| &body[start + at..]);
    format!("{}{ARGUMENTS_NOT_SHOWN}{tail}", &body[..start])
}

/// The reminder comment: who is still awaited (`detail`, written by the server), mentioning
/// the GitHub logins of the members of the groups still waited for.
pub fn reminder(approval: &pb::Approval, detail: &str) -> String {
    let mentions: Vec<String> = groups::awaited_contacts(approval, "github")
        .into_iter()
        .filter(|login| is_github_login(login))
        .map(|login| format!("@{login}"))
        .collect();
    let mut body = format!(
        "⏰ **Reminder**: {} · approval `{}` ({})",
        inline(reminder_detail(detail), 500),
        short_id(&approval.id),
        inline(&approval.tool_name, 200)
    );
    let progress = groups::group_progress(approval);
    if !progress.is_empty() {
        body.push_str(&format!(" · {}", inline(&progress.join(" · "), 500)));
    }
    if !mentions.is_empty() {
        body.push_str(&format!("\n\n{}", mentions.join(" ")));
    }
    body.push('\n');
    body
}

/// The short comment posted when a session grant approved a call at once.
pub fn grant_notice(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    format!(
        "🔓 **Approved by a session grant**, no one was asked: **Tool:** {} · **Agent:** {} · **Session:** {} · approval `{}`\n\n> **The agent says** — **Action:** {}\n",
        inline(facts.tool, 200),
        inline(facts.agent, 200),
        inline(facts.session, 200),
        facts.short_id,
        inline(facts.action, 500),
    )
}

/// The title line: what the comment is about now. A decided approval is no longer a
/// request, so the title states the outcome.
fn title(facts: &ApprovalFacts) -> String {
    use pb::ApprovalState as State;
    let what = match facts.state {
        State::Pending | State::Unspecified => "Approval requested",
        State::Consumed => "✅ Approved and executed",
        _ => facts.outcome_word,
    };
    format!("### {what}: {}\n\n", inline(facts.tool, 200))
}

/// What the agent wrote in its own words, in one quote block, each field on one line.
fn agent_says(facts: &ApprovalFacts) -> String {
    let mut block = format!(
        "> **The agent says**\n>\n> **Action:** {}\n",
        inline(facts.action, 500)
    );
    if !facts.reason.is_empty() {
        block.push_str(&format!("> **Reason:** {}\n", inline(facts.reason, 1000)));
    }
    block.push('\n');
    block
}

/// Everything above the arguments.
fn request_head(approval: &pb::Approval) -> String {
    let facts = ApprovalFacts::of(approval);
    let mut body = String::new();
    body.push_str(&approval_marker(facts.id));
    body.push('\n');
    body.push_str(&status_line(&facts));
    body.push_str("\n\n");
    body.push_str(&title(&facts));
    body.push_str(&agent_says(&facts));
    body.push_str(&format!("- **Risk:** {}\n", risk_label(facts.risk)));
    let mut who = format!("- **Agent:** {}", inline(facts.agent, 200));
    if !facts.session.is_empty() {
        who.push_str(&format!(" · **Session:** {}", inline(facts.session, 200)));
    }
    if !facts.requester.is_empty() {
        who.push_str(&format!(
            " · **Requested by:** {}",
            inline(facts.requester, 200)
        ));
    }
    body.push_str(&who);
    body.push('\n');
    if let Some(expires) = facts.expires_text() {
        body.push_str(&format!("- **Expires:** {expires}\n"));
    }
    if facts.progress.required > 1 {
        body.push_str(&format!(
            "- **Approvals needed:** {}\n",
            facts.progress.required
        ));
    }
    let progress = groups::group_progress(approval);
    if !progress.is_empty() {
        body.push_str(&format!(
            "- **Groups:** {}\n",
            inline(&progress.join(" · "), 500)
        ));
    }
    if let Some(state) = groups::follow_up_state(approval) {
        body.push_str(&format!("- **Follow-up:** {}\n", inline(&state, 200)));
    }
    for behalf in approval.decisions.iter().filter_map(groups::on_behalf_of) {
        body.push_str(&format!("- **Delegated:** {}\n", inline(&behalf, 200)));
    }
    // The digest as requested: an edit's own digest is named on its line.
    let edit = facts.edit.as_ref();
    body.push_str(&format!(
        "- **Arguments digest:** `sha256:{}`\n",
        hex_only(edit.map_or(facts.digest, |edit| edit.requested_digest))
    ));
    if let Some((edit, editor)) = edit.and_then(|edit| Some((edit, edit.editor?))) {
        body.push_str(&format!(
            "- **Edited by** {}: the arguments below are the edited version `sha256:{}`, which the agent runs instead of the requested ones{}\n",
            decider_name(editor),
            hex_only(facts.digest),
            if edit.restarted_count {
                " (the edit restarted the approval count: approvals of an earlier version no longer count)"
            } else {
                ""
            }
        ));
    }
    body.push_str(&format!(
        "- **Approval:** `{}` (`{}`)\n\n",
        facts.short_id,
        hex_only(facts.id)
    ));
    body.push_str("**Arguments**\n\n");
    body
}

/// Everything below the arguments.
fn request_tail(approval: &pb::Approval) -> String {
    let short = short_id(&approval.id);
    let mut body = String::from("\n");
    if approval.state() == pb::ApprovalState::Pending {
        body.push_str(&format!(
            "\nTo answer, comment on this issue with one of these on its own line (write access to the repository needed):\n`/approve {short}` or `/reject {short} <reason>`\n"
        ));
        let edited = if version::is_edited(approval) {
            " To approve the edited version shown, repeat its arguments the same way."
        } else {
            ""
        };
        body.push_str(&format!(
            "To approve different arguments, follow the `/approve` line with a fenced ```` ```json ```` block holding the edited arguments (a JSON object); policy is checked again on them.{edited}\n"
        ));
    }
    body
}

/// The first line under the marker: where the approval stands.
fn status_line(facts: &ApprovalFacts) -> String {
    use pb::ApprovalState as State;
    let at = facts
        .resolved_at
        .map(|at| format!(" · {}", format_time(at)))
        .unwrap_or_default();
    let reason = facts
        .note
        .map(|note| format!(": {}", inline(note, 1000)))
        .unwrap_or_default();
    match facts.state {
        State::Pending => {
            let progress = &facts.progress;
            if progress.approvers.is_empty() {
                "⏳ **Waiting for approval**".to_string()
            } else {
                let names: Vec<String> = progress
                    .approvers
                    .iter()
                    .copied()
                    .map(decider_name)
                    .collect();
                format!(
                    "⏳ **Waiting for approval**: {} of {} approvals ({})",
                    names.len(),
                    progress.required,
                    names.join(", ")
                )
            }
        }
        State::Approved => format!("✅ **Approved**{}{reason}{at}", by(facts)),
        State::Consumed => {
            let executed = facts
                .execution
                .as_ref()
                .map(|execution| {
                    let outcome = execution.word().unwrap_or("reported");
                    let detail = if execution.detail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", inline(execution.detail, 300))
                    };
                    format!(" · executed: {outcome}{detail}")
                })
                .unwrap_or_default();
            format!("✅ **Approved**{}{reason}{at}{executed}", by(facts))
        }
        State::Rejected => format!("❌ **Rejected**{}{reason}{at}", by(facts)),
        State::Expired => format!("⌛ **Expired** without a decision{reason}{at}"),
        State::Cancelled => format!("🚫 **{}**{reason}{at}", facts.cancelled_word),
        State::Unspecified => "❔ **Unknown state**".to_string(),
    }
}

/// " by …": the deciders, the policy rule or the session grant that resolved it. Deciders
/// are named only for a resolution by decision.
fn by(facts: &ApprovalFacts) -> String {
    match &facts.resolver {
        Some(Resolver::Deciders(deciders)) if facts.resolved_by == pb::ResolvedBy::Decision => {
            let names: Vec<String> = deciders.iter().copied().map(decider_name).collect();
            format!(" by {}", names.join(", "))
        }
        Some(Resolver::Rule(rule)) => format!(" by policy rule {}", inline(rule, 200)),
        Some(Resolver::Grant(grant_id)) => format!(
            " by an earlier session approval ({})",
            inline(grant_id, 100)
        ),
        _ => String::new(),
    }
}

/// `@login` for GitHub deciders (logins are plain), "name (channel)" for the others.
fn decider_name(decider: &pb::Decider) -> String {
    if decider.channel == "github" && is_github_login(&decider.display_name) {
        format!("@{}", decider.display_name)
    } else {
        format!(
            "{} ({})",
            inline(decider::name(decider), 100),
            inline(&decider.channel, 50)
        )
    }
}

fn is_github_login(login: &str) -> bool {
    !login.is_empty()
        && login.len() <= 39
        && login.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn risk_label(risk: pb::Risk) -> &'static str {
    match risk {
        pb::Risk::Low => "🟢 LOW",
        pb::Risk::Medium => "🟡 MEDIUM",
        pb::Risk::High => "🟠 HIGH",
        pb::Risk::Critical => "🔴 CRITICAL",
        pb::Risk::Unspecified => "unspecified",
    }
}

/// Ids and digests are hex with dashes; anything else is dropped rather than rendered.
fn hex_only(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_hexdigit() || *c == '-')
        .take(128)
        .collect()
}

/// The arguments, pretty-printed, in a code block nothing inside can close, at most `budget`
/// characters in all (fences, note and newlines counted): cut when needed, with a note that
/// says so and names the digest of the full arguments.
fn arguments_block(arguments_json: &str, digest: &str, budget: usize) -> String {
    if arguments_json.is_empty() {
        return "_(not stored: the server redacts arguments; the digest above identifies them)_\n"
            .to_string();
    }
    let pretty = serde_json::from_str::<serde_json::Value>(arguments_json)
        .and_then(|value| serde_json::to_string_pretty(&value))
        .unwrap_or_else(|_| arguments_json.to_string());
    let pretty = agent_text::visible(&pretty);
    let total = pretty.chars().count();
    let block = |shown: &str, note: &str| {
        let fence = code_fence(shown);
        format!("{fence}json\n{shown}\n{fence}\n{note}")
    };
    let whole = block(&pretty, "");
    if whole.chars().count() <= budget {
        return whole;
    }
    let note = |shown: usize| {
        format!(
            "\n_(truncated: {shown} of {total} characters shown; the full arguments have digest `sha256:{}`)_\n",
            hex_only(digest)
        )
    };
    // Cutting can only shorten the fence, so shrinking by the excess converges.
    let mut keep = budget.saturating_sub(note(total).chars().count() + 16);
    loop {
        let shown: String = pretty.chars().take(keep).collect();
        let candidate = block(&shown, &note(keep));
        let excess = candidate.chars().count().saturating_sub(budget);
        if excess == 0 || keep == 0 {
            return candidate;
        }
        keep = keep.saturating_sub(excess);
    }
}

/// A backtick fence longer than the longest run of backticks in `content` (at least three).
pub fn code_fence(content: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in content.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

/// One line of plain text, at most `max_chars` characters: line breaks shown as ⏎, hidden
/// characters as their code points, runs of spaces collapsed.
fn flatten(text: &str, max_chars: usize) -> String {
    let line = agent_text::one_line(text, usize::MAX);
    let words: Vec<&str> = line.split_whitespace().collect();
    agent_text::cap(&words.join(" "), max_chars)
}

/// One line of literal Markdown text: flattened, and every ASCII punctuation character
/// backslash-escaped, so it renders as typed and cannot form links, HTML, emphasis or mentions.
fn inline(text: &str, max_chars: usize) -> String {
    let flat = flatten(text, max_chars);
    if flat.is_empty() {
        return "_(none)_".to_string();
    }
    let mut escaped = String::with_capacity(flat.len() * 2);
    for c in flat.chars() {
        if c.is_ascii_punctuation() {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Why a command was not applied, or what happened instead.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// The commenter lacks write access.
    NotPermitted { repo: RepoName, level: String },
    /// A bare command while several approvals are pending here.
    Ambiguous { candidates: Vec<pb::Approval> },
    /// The id names no approval of this issue.
    UnknownId { given: String },
    /// A bare command with nothing pending here.
    NothingPending,
    /// The approval was resolved before this command.
    AlreadyResolved { approval: Box<pb::Approval> },
    /// The server refused the decision (approver list, risk ceiling, own request…).
    Refused { message: String },
    /// The server or GitHub failed (for good, or through every attempt); the worker gave up.
    NotRecorded,
}

/// A reply to the command in comment `comment_id` by `login`, with a hidden marker naming
/// that comment (so a restarted worker does not answer it twice).
pub fn reply_body(login: &str, comment_id: u64, reply: &Reply) -> String {
    let mention = if is_github_login(login) {
        format!("@{login}")
    } else {
        inline(login, 50)
    };
    let text = match reply {
        Reply::NotPermitted { repo, level } => format!(
            "deciding needs write access to `{repo}`; your permission is {}. Nothing was decided.",
            inline(level, 50)
        ),
        Reply::Ambiguous { candidates } => {
            let mut text = "several approvals are pending on this issue, so this decided nothing. Name one, for example `/approve ID` or `/reject ID <reason>`:\n".to_string();
            for approval in candidates {
                text.push_str(&format!(
                    "- `{}`: {} ({})\n",
                    hex_only(short_id(&approval.id)),
                    inline(&approval.tool_name, 100),
                    inline(&approval.action, 200)
                ));
            }
            text
        }
        Reply::UnknownId { given } => format!(
            "no approval `{}` belongs to this issue. Nothing was decided.",
            hex_only(given)
        ),
        Reply::NothingPending => "no approval is waiting on this issue.".to_string(),
        Reply::AlreadyResolved { approval } => format!(
            "approval `{}` was already resolved: {}",
            hex_only(short_id(&approval.id)),
            status_line(&ApprovalFacts::of(approval))
        ),
        Reply::Refused { message } => format!(
            "countersign refused this decision: {}. Nothing was decided.",
            inline(message, 500)
        ),
        Reply::NotRecorded => "this command could not be recorded because countersign or GitHub failed. Please repeat it.".to_string(),
    };
    format!("{REPLY_MARKER_PREFIX}{comment_id}{MARKER_SUFFIX}\n{mention} {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> pb::Approval {
        pb::Approval {
            id: "01936f0e-7c1a-7d2b-9f3e-4a5b6c7d8e9f".to_string(),
            agent_id: "coder-1".to_string(),
            session_id: "s-7".to_string(),
            tool_name: "bash".to_string(),
            arguments_json: r#"{"command":"rm -rf build/"}"#.to_string(),
            args_digest: "ab".repeat(32),
            action: "delete the build directory".to_string(),
            reason: "clean rebuild".to_string(),
            risk: pb::Risk::High.into(),
            state: pb::ApprovalState::Pending.into(),
            required_approvals: 1,
            expires_at: Some(prost_types::Timestamp {
                seconds: 1_767_225_600,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn markers_round_trip_on_the_first_line_only() {
        let body = request_body(&approval());
        assert_eq!(
            marked_approval_id(&body),
            Some("01936f0e-7c1a-7d2b-9f3e-4a5b6c7d8e9f")
        );
        assert_eq!(marked_approval_id(&format!("hi\n{body}")), None);
        assert_eq!(marked_approval_id("<!-- countersign:approval: -->"), None);
        let reply = reply_body("octocat", 42, &Reply::NothingPending);
        assert_eq!(replied_comment_id(&reply), Some(42));
        assert_eq!(marked_approval_id(&reply), None);
    }

    #[test]
    fn request_comment_shows_the_request() {
        let body = request_body(&approval());
        for expected in [
            "⏳ **Waiting for approval**",
            "### Approval requested: bash",
            "> **The agent says**\n>\n> **Action:** delete the build directory\n> **Reason:** clean rebuild\n",
            "- **Risk:** 🟠 HIGH",
            "- **Agent:** coder\\-1 · **Session:** s\\-7",
            "- **Expires:** 2026-01-01 00:00 UTC",
            &format!("`sha256:{}`", "ab".repeat(32)),
            "`6c7d8e9f` (`01936f0e-7c1a-7d2b-9f3e-4a5b6c7d8e9f`)",
            "```json\n{\n  \"command\": \"rm -rf build/\"\n}\n```",
            "`/approve 6c7d8e9f` or `/reject 6c7d8e9f <reason>`",
        ] {
            assert!(body.contains(expected), "missing {expected:?} in\n{body}");
        }
    }

    #[test]
    fn arguments_cannot_break_out_of_their_block() {
        let mut hostile = approval();
        hostile.arguments_json = r#"{"a":"```\n/approve\n````","b":"``````"}"#.to_string();
        let body = request_body(&hostile);
        let fence = "`".repeat(7);
        assert!(body.contains(&format!("{fence}json\n")));
        assert!(body.contains(&format!("\n{fence}\n")));
        assert_eq!(code_fence("no ticks"), "```");
        assert_eq!(code_fence("a ```` b ` c"), "`````");
    }

    #[test]
    fn oversized_arguments_stay_under_github_s_limit_with_the_cut_shown() {
        for arguments in [
            serde_json::json!({ "a": "`".repeat(70_000) }),
            serde_json::json!({ "a": "x`".repeat(40_000), "b": "``````".repeat(5_000) }),
            serde_json::json!({ "a": "é".repeat(64_000) }),
            serde_json::json!({ "a": "\"".repeat(40_000) }),
        ] {
            let mut big = approval();
            big.arguments_json = arguments.to_string();
            big.action = "<".repeat(5_000);
            big.reason = "*".repeat(5_000);
            let body = request_body(&big);
            assert!(
                body.chars().count() < MAX_BODY_CHARS,
                "{}",
                body.chars().count()
            );
            assert!(body.contains("_(truncated: "), "no note of the cut");
            assert!(body.contains(&format!(
                "the full arguments have digest `sha256:{}`",
                "ab".repeat(32)
            )));
            // The code block is still closed by its own fence.
            let fence_line = body.lines().find(|line| line.ends_with("json")).unwrap();
            let fence = fence_line.trim_end_matches("json");
            assert!(body.contains(&format!("\n{fence}\n")));
        }
    }

    #[test]
    fn forged_lines_stay_inside_the_agent_s_quote() {
        let mut forged = approval();
        forged.action = "tidy up\n- **Risk:** 🟢 LOW\n\n✅ **Approved** by @alice".to_string();
        forged.reason = "fine\u{2028}\u{202E}gnp.exe\u{200B}".to_string();
        let body = request_body(&forged);
        for line in body.lines() {
            assert!(!line.starts_with("- **Risk:** 🟢"), "{body}");
            assert!(!line.starts_with("✅"), "{body}");
        }
        assert!(
            body.contains("> **Action:** tidy up ⏎ \\- \\*\\*Risk\\:\\*\\* 🟢 LOW ⏎ ✅"),
            "{body}"
        );
        assert!(
            body.contains("> **Reason:** fine ⏎ ⟨U\\+202E⟩gnp\\.exe⟨U\\+200B⟩"),
            "{body}"
        );
        assert!(!body.contains('\u{202E}'));
    }

    #[test]
    fn a_decided_comment_states_the_outcome_and_the_reason_once() {
        let mut rejected = approval();
        rejected.state = pb::ApprovalState::Rejected.into();
        rejected.resolution = Some(pb::Resolution {
            verdict: pb::Verdict::Reject.into(),
            resolved_by: pb::ResolvedBy::Decision.into(),
            reason: rejected.reason.clone(),
            ..Default::default()
        });
        let body = request_body(&rejected);
        assert!(body.contains("### ❌ Rejected: bash"), "{body}");
        assert!(!body.contains("Approval requested"), "{body}");
        assert_eq!(body.matches("clean rebuild").count(), 1, "{body}");
        let minimal = minimal_request_body(&rejected);
        assert!(minimal.contains("arguments not shown"));
        assert!(minimal.contains(&"ab".repeat(32)));
    }

    #[test]
    fn agent_text_is_inert() {
        let mut hostile = approval();
        hostile.action = "<!-- countersign:approval:x -->\n[click](http://evil) @team".to_string();
        hostile.reason = "**bold** <img src=x>".to_string();
        let body = request_body(&hostile);
        // Every character that could start markup is backslash-escaped.
        assert!(body.contains("\\<img src\\=x\\>"));
        assert!(!body.contains(" <img"));
        assert!(!body.contains("[click]("));
        assert!(!body.contains(" @team"));
        assert_eq!(body.matches("<!-- countersign").count(), 1);
        assert!(body.contains("\\*\\*bold\\*\\*"));
    }

    #[test]
    fn outcomes() {
        let mut approved = approval();
        approved.state = pb::ApprovalState::Approved.into();
        approved.resolution = Some(pb::Resolution {
            verdict: pb::Verdict::Approve.into(),
            resolved_by: pb::ResolvedBy::Decision.into(),
            deciders: vec![pb::Decider {
                channel: "github".to_string(),
                user_id: "1".to_string(),
                display_name: "octocat".to_string(),
            }],
            resolved_at: Some(prost_types::Timestamp {
                seconds: 1_767_225_000,
                nanos: 0,
            }),
            ..Default::default()
        });
        let body = request_body(&approved);
        assert!(body.contains("✅ **Approved** by @octocat · 2025-12-31 23:50 UTC"));
        assert!(!body.contains("To answer"));

        let mut rejected = approved.clone();
        rejected.state = pb::ApprovalState::Rejected.into();
        if let Some(resolution) = rejected.resolution.as_mut() {
            resolution.reason = "looks wrong".to_string();
            resolution.deciders[0] = pb::Decider {
                channel: "telegram".to_string(),
                user_id: "777".to_string(),
                display_name: "Alice".to_string(),
            };
        }
        assert!(
            request_body(&rejected).contains("❌ **Rejected** by Alice (telegram): looks wrong")
        );

        let mut expired = approval();
        expired.state = pb::ApprovalState::Expired.into();
        assert!(request_body(&expired).contains("⌛ **Expired** without a decision"));

        let mut cancelled = approval();
        cancelled.state = pb::ApprovalState::Cancelled.into();
        cancelled.resolution = Some(pb::Resolution {
            resolved_by: pb::ResolvedBy::Cancellation.into(),
            reason: "agent stopped".to_string(),
            ..Default::default()
        });
        assert!(request_body(&cancelled).contains("🚫 **Cancelled**: agent stopped"));

        if let Some(resolution) = cancelled.resolution.as_mut() {
            resolution.reason = "withdrawn: the hook was stopped (SIGINT)".to_string();
        }
        let body = request_body(&cancelled);
        assert!(body.contains("### 🚫 Withdrawn: "), "{body}");
        assert!(
            body.contains(r"🚫 **Withdrawn**: withdrawn\: the hook was stopped \(SIGINT\)"),
            "{body}"
        );
    }

    #[test]
    fn quorum_progress() {
        let mut pending = approval();
        pending.required_approvals = 2;
        pending.decisions = vec![pb::Decision {
            verdict: pb::Verdict::Approve.into(),
            decider: Some(pb::Decider {
                channel: "github".to_string(),
                user_id: "5".to_string(),
                display_name: "alice".to_string(),
            }),
            ..Default::default()
        }];
        let body = request_body(&pending);
        assert!(body.contains("1 of 2 approvals (@alice)"), "{body}");
        assert!(body.contains("- **Approvals needed:** 2"));
    }

    #[test]
    fn short_ids() {
        let id = "01936f0e-7c1a-7d2b-9f3e-4a5b6c7d8e9f";
        assert_eq!(short_id(id), "6c7d8e9f");
        assert!(names_approval("6c7d8e9f", id));
        assert!(names_approval("01936F0E-7C1A-7D2B-9F3E-4A5B6C7D8E9F", id));
        assert!(!names_approval("01936f0e", id));
        assert!(!names_approval("c7d8e9f", id));
    }

    #[test]
    fn replies() {
        let denied = reply_body(
            "dude",
            7,
            &Reply::NotPermitted {
                repo: "acme/widgets".parse().unwrap(),
                level: "read".to_string(),
            },
        );
        assert!(denied.starts_with(
            "<!-- countersign:reply-to:7 -->\n@dude deciding needs write access to `acme/widgets`"
        ));
        assert!(denied.contains("your permission is read"));

        let mut other = approval();
        other.id = "01936f0e-7c1a-7d2b-9f3e-000000000001".to_string();
        let ambiguous = reply_body(
            "octocat",
            8,
            &Reply::Ambiguous {
                candidates: vec![approval(), other],
            },
        );
        assert!(ambiguous.contains("- `6c7d8e9f`: bash"));
        assert!(ambiguous.contains("- `00000001`: bash"));
    }
}
