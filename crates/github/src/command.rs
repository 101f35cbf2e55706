//! The commands people write in comments: `/approve [id]` and `/reject [id] [reason…]`.
//!
//! A command is a line of prose of its own (up to three leading spaces, any letter case).
//! Lines that GitHub renders as code or as a quotation are not commands, as GitHub shows
//! them as code or quoted text and not as a request: fenced code blocks (``` or ~~~, also
//! opened inside a list item or a quote), indented code blocks (four spaces or a tab after a
//! blank line), `<pre>` and `<code>` blocks, block quotes (`>` and the lazy continuation lines
//! of a quoted paragraph) and HTML comments. The first command of a comment counts.
//!
//! Edit-on-approve: a fenced code block with the info string `json` that directly follows an
//! `/approve` line (only blank lines between) is not ignored but holds the edited arguments
//! the approval is for. Any other code block, and one after `/reject`, stays ignored.

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
    /// `/approve` followed by a ```json block: its content, the edited arguments (validated by
    /// the server).
    pub edited_arguments: Option<String>,
}

/// The shortest id prefix or suffix the worker shows and accepts (see `render::short_id`).
pub const SHORT_ID_LEN: usize = 8;

/// Where the scanner is: in prose, or inside a block whose lines are never commands.
enum Block {
    Prose,
    Fence { fence_char: char, len: usize },
    IndentedCode,
    Html { closing: &'static str },
    HtmlComment,
    Quote,
}

/// The first command in a comment body, if any.
pub fn parse_command(body: &str) -> Option<Command> {
    let mut block = Block::Prose;
    // Whether the previous line continues a paragraph (an indented line then is not code).
    let mut in_paragraph = false;
    let lines: Vec<&str> = body.lines().collect();
    for (index, line) in lines.iter().copied().enumerate() {
        let trimmed = line.trim();
        match block {
            Block::Fence { fence_char, len } => {
                if closes_fence(strip_containers(trimmed), fence_char, len) {
                    block = Block::Prose;
                }
                continue;
            }
            Block::Html { closing } => {
                if trimmed.to_ascii_lowercase().contains(closing) {
                    block = Block::Prose;
                }
                continue;
            }
            Block::HtmlComment => {
                if trimmed.contains("-->") {
                    block = Block::Prose;
                }
                continue;
            }
            Block::IndentedCode if trimmed.is_empty() || indent_of(line) >= 4 => continue,
            Block::Quote if !trimmed.is_empty() => {
                // Quoted lines and the lazy continuation lines of a quoted paragraph.
                if let Some(opened) = opens_fence(strip_containers(trimmed)) {
                    block = opened;
                }
                continue;
            }
            _ => block = Block::Prose,
        }
        if trimmed.is_empty() {
            in_paragraph = false;
            continue;
        }
        if indent_of(line) >= 4 && !in_paragraph {
            block = Block::IndentedCode;
            continue;
        }
        if let Some(opened) = opens_fence(strip_containers(trimmed)) {
            block = opened;
            in_paragraph = false;
            continue;
        }
        if trimmed.starts_with('>') {
            block = Block::Quote;
            in_paragraph = false;
            continue;
        }
        if let Some(opened) = opens_html_block(trimmed) {
            block = opened;
            in_paragraph = false;
            continue;
        }
        if indent_of(line) < 4 {
            if let Some(mut command) = parse_line(trimmed) {
                if command.verdict == Verdict::Approve {
                    command.edited_arguments = json_block_after(&lines[index + 1..]);
                }
                return Some(command);
            }
        }
        in_paragraph = true;
    }
    None
}

/// The content of a ```json (or ~~~json) fence opening on the first non-blank line of `lines`,
/// outside any container, up to its closing fence (or the end of the comment, as GitHub
/// renders an unclosed fence).
fn json_block_after(lines: &[&str]) -> Option<String> {
    let mut rest = lines.iter().skip_while(|line| line.trim().is_empty());
    let opening = rest.next()?;
    if indent_of(opening) >= 4 {
        return None;
    }
    let opening = opening.trim();
    let Some(Block::Fence { fence_char, len }) = opens_fence(opening) else {
        return None;
    };
    let info = opening[len * fence_char.len_utf8()..].trim();
    if !info
        .split_whitespace()
        .next()
        .is_some_and(|language| language.eq_ignore_ascii_case("json"))
    {
        return None;
    }
    let content: Vec<&str> = rest
        .take_while(|line| !closes_fence(line, fence_char, len))
        .copied()
        .collect();
    Some(content.join("\n"))
}

/// Leading whitespace in columns, a tab counting up to the next multiple of four.
fn indent_of(line: &str) -> usize {
    let mut columns = 0;
    for c in line.chars() {
        match c {
            ' ' => columns += 1,
            '\t' => columns += 4 - columns % 4,
            _ => break,
        }
    }
    columns
}

/// The line without the list markers and quote markers that may hold a block: `- `, `* `,
/// `+ `, `1. `, `1) `, `> `, nested.
fn strip_containers(mut line: &str) -> &str {
    loop {
        let before = line;
        line = line.trim_start();
        if let Some(rest) = line.strip_prefix('>') {
            line = rest;
        } else if let Some(rest) = ["- ", "* ", "+ "]
            .iter()
            .find_map(|marker| line.strip_prefix(marker))
        {
            line = rest;
        } else {
            let digits = line.chars().take_while(char::is_ascii_digit).count();
            if (1..=9).contains(&digits) {
                let rest = &line[digits..];
                if let Some(rest) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
                    line = rest;
                }
            }
        }
        if line == before {
            return line;
        }
    }
}

/// A fence opening: at least three backticks or tildes (an info string may follow; a backtick
/// fence's info string holds no backtick).
fn opens_fence(line: &str) -> Option<Block> {
    let fence_char = line.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = line.chars().take_while(|c| *c == fence_char).count();
    if len < 3 {
        return None;
    }
    if fence_char == '`' && line[len..].contains('`') {
        return None;
    }
    Some(Block::Fence { fence_char, len })
}

fn closes_fence(line: &str, fence_char: char, fence_len: usize) -> bool {
    let line = line.trim();
    let len = line.chars().take_while(|c| *c == fence_char).count();
    len >= fence_len && line[len * fence_char.len_utf8()..].trim().is_empty()
}

/// An HTML block whose content GitHub shows as code (`<pre>`, `<code>`) or hides (a
/// comment); it ends with its closing tag (on the same line or a later one).
fn opens_html_block(line: &str) -> Option<Block> {
    let lower = line.to_ascii_lowercase();
    if let Some(start) = lower.find("<!--") {
        return (!lower[start..].contains("-->")).then_some(Block::HtmlComment);
    }
    for (open, closing) in [("<pre", "</pre>"), ("<code", "</code>")] {
        if let Some(rest) = lower.strip_prefix(open) {
            if rest.starts_with(['>', ' ', '\t']) || rest.is_empty() {
                return (!rest.contains(closing)).then_some(Block::Html { closing });
            }
        }
    }
    None
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
        edited_arguments: None,
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
            edited_arguments: None,
        })
    }

    fn reject(id: Option<&str>, reason: &str) -> Option<Command> {
        Some(Command {
            verdict: Verdict::Reject,
            approval_id: id.map(str::to_string),
            reason: reason.to_string(),
            edited_arguments: None,
        })
    }

    #[test]
    fn a_json_fence_right_after_approve_is_the_edit() {
        let body = "/approve\n\n```json\n{\"env\": \"staging\",\n \"x\": 1}\n```\nthanks";
        let command = parse_command(body).unwrap();
        assert_eq!(command.verdict, Verdict::Approve);
        assert_eq!(
            command.edited_arguments.as_deref(),
            Some("{\"env\": \"staging\",\n \"x\": 1}")
        );
        let with_id = parse_command("/approve 0193abcd\n~~~ JSON\n{}\n~~~").unwrap();
        assert_eq!(with_id.approval_id.as_deref(), Some("0193abcd"));
        assert_eq!(with_id.edited_arguments.as_deref(), Some("{}"));
    }

    #[test]
    fn other_blocks_are_no_edit_and_commands_inside_code_stay_ignored() {
        // Not json, not right after the command, or after /reject: no edit.
        for body in [
            "/approve\n```\n{}\n```",
            "/approve\n```sh\n{}\n```",
            "/approve\nsee below\n```json\n{}\n```",
            "/approve\n    ```json\n    {}\n    ```",
        ] {
            assert_eq!(parse_command(body), approve(None), "{body:?}");
        }
        assert_eq!(
            parse_command("/reject no\n```json\n{}\n```"),
            reject(None, "no")
        );
        // A command inside a json block is still no command.
        assert_eq!(parse_command("```json\n/approve\n```"), None);
        assert_eq!(
            parse_command("```json\n{}\n```\n/approve"),
            approve(None),
            "a block before the command is not its edit"
        );
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
        assert_eq!(
            parse_command(" \t/ReJeCt"),
            None,
            "a tab indents by four: code"
        );
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
        assert_eq!(
            parse_command("<pre>\n/approve\n</pre>\n/reject"),
            reject(None, "")
        );
        assert_eq!(parse_command("```\n/reject\n```\n/approve"), approve(None));
        assert_eq!(parse_command("> quoted\n\n/approve"), approve(None));
        assert_eq!(parse_command("<!-- x -->\n/approve"), approve(None));
        // A backtick line with a backtick in its info string is not a fence.
        assert_eq!(parse_command("``` a`b\n/approve"), approve(None));
    }

    #[test]
    fn every_form_of_code_github_shows_is_ignored() {
        let bodies = [
            // Indented code blocks.
            "    /approve",
            "Some text\n\n    /approve",
            "\t/approve",
            // Fences inside list items and quotes.
            "- ```\n  /approve\n  ```",
            "1. ```sh\n   /approve\n   ```",
            "* item\n  ~~~\n  /approve\n  ~~~",
            "> ```\n> /approve\n> ```",
            // HTML code blocks.
            "<pre>\n/approve\n</pre>",
            "<PRE lang=\"sh\">\n/approve\n</PRE>",
            "<code>\n/approve\n</code>",
            "<pre>/approve\n</pre>",
        ];
        for body in bodies {
            assert_eq!(parse_command(body), None, "{body:?}");
        }
        // A lazy continuation of a paragraph is prose; a line after a closed block counts.
        assert_eq!(parse_command("- ```\n  x\n  ```\n/approve"), approve(None));
        assert_eq!(parse_command("<pre>x</pre>\n/approve"), approve(None));
    }

    #[test]
    fn the_first_command_counts() {
        assert_eq!(
            parse_command("/reject nope\n/approve"),
            reject(None, "nope")
        );
    }
}
