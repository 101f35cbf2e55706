//! The commands people write in comments: `/approve [id]` and `/reject [id] [reason…]`.
//!
//! A command stands on its own line (leading spaces allowed, any letter case). Lines that
//! GitHub renders as code or as a quotation are not commands: fenced code blocks (``` or ~~~),
//! block quotes (`>` and the lazy continuation lines of a quoted paragraph) and HTML comments.
//! The first command of a comment counts.

/// What the commenter wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Reject,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub verdict: Verdict,
    /// The approval named (a full id or its short form), lower case; `None` for "the one
    /// pending here".
    pub approval_id: Option<String>,
    /// The reason given with `/reject` (empty when none).
    pub reason: String,
}

/// The shortest id prefix or suffix the worker shows and accepts (see `render::short_id`).
pub const SHORT_ID_LEN: usize = 8;

/// The first command in a comment body, if any.
pub fn parse_command(body: &str) -> Option<Command> {
    let mut fence: Option<(char, usize)> = None;
    let mut in_quote = false;
    let mut in_html_comment = false;
    for line in body.lines() {
        let trimmed = line.trim();
        if let Some((fence_char, fence_len)) = fence {
            if closes_fence(trimmed, fence_char, fence_len) {
                fence = None;
            }
            continue;
        }
        if in_html_comment {
            in_html_comment = !trimmed.contains("-->");
            continue;
        }
        if let Some(opened) = opens_fence(trimmed) {
            fence = Some(opened);
            in_quote = false;
            continue;
        }
        if trimmed.is_empty() {
            in_quote = false;
            continue;
        }
        if trimmed.starts_with('>') {
            in_quote = true;
            continue;
        }
        if in_quote {
            // A lazy continuation line: still part of the quoted paragraph.
            continue;
        }
        if let Some(start) = trimmed.find("<!--") {
            in_html_comment = !trimmed[start..].contains("-->");
            continue;
        }
        if let Some(command) = parse_line(trimmed) {
            return Some(command);
        }
    }
    None
}

/// A fence opening: at least three backticks or tildes (an info string may follow; a backtick
/// fence's info string holds no backtick).
fn opens_fence(line: &str) -> Option<(char, usize)> {
    let fence_char = line.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = line.chars().take_while(|c| *c == fence_char).count();
    if len < 3 {
        return None;
    }
    if fence_char == '`' && line[len..].contains('`') {
        return None;
    }
    Some((fence_char, len))
}

fn closes_fence(line: &str, fence_char: char, fence_len: usize) -> bool {
    let len = line.chars().take_while(|c| *c == fence_char).count();
    len >= fence_len && line[len * fence_char.len_utf8()..].trim().is_empty()
}

fn parse_line(line: &str) -> Option<Command> {
    let (word, rest) = match line.split_once(char::is_whitespace) {
        Some((word, rest)) => (word, rest.trim()),
        None => (line, ""),
    };
    let verdict = if word.eq_ignore_ascii_case("/approve") {
        Verdict::Approve
    } else if word.eq_ignore_ascii_case("/reject") {
        Verdict::Reject
    } else {
        return None;
    };
    let (first, after_first) = match rest.split_once(char::is_whitespace) {
        Some((first, after)) => (first, after.trim()),
        None => (rest, ""),
    };
    let (approval_id, reason) = if looks_like_id(first) {
        (Some(first.to_ascii_lowercase()), after_first)
    } else {
        (None, rest)
    };
    Some(Command {
        verdict,
        approval_id,
        reason: match verdict {
            Verdict::Reject => reason.to_string(),
            Verdict::Approve => String::new(),
        },
    })
}

/// An approval id (UUID) or its short form: hex digits and dashes, at least [`SHORT_ID_LEN`].
fn looks_like_id(word: &str) -> bool {
    word.len() >= SHORT_ID_LEN
        && word.len() <= 36
        && word.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && word.chars().filter(char::is_ascii_hexdigit).count() >= SHORT_ID_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approve(id: Option<&str>) -> Option<Command> {
        Some(Command {
            verdict: Verdict::Approve,
            approval_id: id.map(str::to_string),
            reason: String::new(),
        })
    }

    fn reject(id: Option<&str>, reason: &str) -> Option<Command> {
        Some(Command {
            verdict: Verdict::Reject,
            approval_id: id.map(str::to_string),
            reason: reason.to_string(),
        })
    }

    #[test]
    fn commands_on_their_own_line_any_case_leading_spaces() {
        assert_eq!(parse_command("/approve"), approve(None));
        assert_eq!(parse_command("   /APPROVE  "), approve(None));
        assert_eq!(
            parse_command("Looks fine to me.\n\n  /Approve\nthanks"),
            approve(None)
        );
        assert_eq!(
            parse_command("/reject looks wrong"),
            reject(None, "looks wrong")
        );
        assert_eq!(parse_command("\t/ReJeCt"), reject(None, ""));
    }

    #[test]
    fn ids_full_and_short() {
        let id = "01936f0e-7c1a-7d2b-9f3e-4a5b6c7d8e9f";
        assert_eq!(parse_command(&format!("/approve {id}")), approve(Some(id)));
        assert_eq!(
            parse_command("/approve 6C7D8E9F please"),
            approve(Some("6c7d8e9f"))
        );
        assert_eq!(
            parse_command(&format!("/reject {id} too risky, use staging")),
            reject(Some(id), "too risky, use staging")
        );
        assert_eq!(
            parse_command("/reject 6c7d8e9f"),
            reject(Some("6c7d8e9f"), "")
        );
        // Short hex-looking words are reason text, not ids.
        assert_eq!(parse_command("/reject bad idea"), reject(None, "bad idea"));
        assert_eq!(parse_command("/reject deadbee"), reject(None, "deadbee"));
    }

    #[test]
    fn not_commands() {
        for body in [
            "",
            "please /approve this",
            "/approved",
            "/approve-all",
            "`/approve`",
            "I would /reject it",
        ] {
            assert_eq!(parse_command(body), None, "{body:?}");
        }
    }

    #[test]
    fn code_blocks_quotes_and_html_comments_are_ignored() {
        let bodies = [
            "```\n/approve\n```",
            "  ~~~sh\n/approve\n  ~~~",
            "````\n```\n/approve\n```\n````",
            "```\nunclosed fence\n/approve",
            "> /approve",
            "   > /approve",
            "> I think we should\n/approve",
            "<!--\n/approve\n-->",
            "<!-- hidden --> \n> quoted\n/reject no",
        ];
        for body in bodies {
            assert_eq!(parse_command(body), None, "{body:?}");
        }
        // After the block ends, commands count again.
        assert_eq!(parse_command("```\n/reject\n```\n/approve"), approve(None));
        assert_eq!(parse_command("> quoted\n\n/approve"), approve(None));
        assert_eq!(parse_command("<!-- x -->\n/approve"), approve(None));
        // A backtick line with a backtick in its info string is not a fence.
        assert_eq!(parse_command("``` a`b\n/approve"), approve(None));
    }

    #[test]
    fn the_first_command_counts() {
        assert_eq!(
            parse_command("/reject nope\n/approve"),
            reject(None, "nope")
        );
    }
}
