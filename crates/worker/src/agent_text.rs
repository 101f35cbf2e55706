//! Text an agent wrote (action, reason, argument values, identifiers) shown to an approver.
//!
//! Whatever an agent sends must not pass for the worker's own lines: a newline would let it
//! draw a fake "Risk: LOW" or "Approved by …" line, bidirectional controls reorder what is
//! shown, and zero-width characters hide text. [`one_line`] returns plain text on a single
//! line with every such character made visible and its length capped; the channel then
//! escapes it for its markup and shows it in its quoted agent block.

/// What a line break becomes: visible, and unlike anything the workers write themselves.
pub const LINE_BREAK_MARK: &str = " ⏎ ";

/// `text` on one line, at most `max_chars` characters (cut with "…"): line breaks become
/// [`LINE_BREAK_MARK`], tabs spaces, and invisible or reordering characters their code point
/// (`⟨U+202E⟩`).
pub fn one_line(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    let mut in_break = false;
    for character in text.chars() {
        if is_line_break(character) {
            if !in_break {
                out.push_str(LINE_BREAK_MARK);
            }
            in_break = true;
            continue;
        }
        in_break = false;
        if character == '\t' {
            out.push(' ');
        } else if is_hidden(character) {
            out.push_str(&format!("⟨U+{:04X}⟩", u32::from(character)));
        } else {
            out.push(character);
        }
    }
    cap(&out, max_chars)
}

/// `text` cut to at most `max_chars` characters, ending in "…" when cut.
pub fn cap(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// How a platform counts a text against its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Unicode scalar values (GitHub's comment body, Slack's text objects).
    Chars,
    /// UTF-16 code units (Telegram).
    Utf16,
    /// UTF-8 bytes (ntfy's message).
    Bytes,
}

impl Measure {
    /// How long `text` is, counted this way.
    pub fn of(self, text: &str) -> usize {
        match self {
            Measure::Chars => text.chars().count(),
            Measure::Utf16 => text.encode_utf16().count(),
            Measure::Bytes => text.len(),
        }
    }
}

/// `text` with each character written by `escape` (a platform's markup escaping).
pub fn escape_with(text: &str, escape: impl Fn(&mut String, char)) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        escape(&mut escaped, character);
    }
    escaped
}

/// The escaped form of the longest prefix of `text` whose escaped form takes at most `limit`
/// (counted by `measure`), and how many characters of `text` it holds. `escape` appends one
/// character's escaped form; the cut never falls inside a character or its escape, and the
/// limit is met by what the platform receives, not by the text before escaping (a text of
/// `<` grows fourfold as `&lt;`).
pub fn escape_prefix(
    text: &str,
    limit: usize,
    measure: Measure,
    escape: impl Fn(&mut String, char),
) -> (String, usize) {
    let mut escaped = String::new();
    let mut used = 0;
    let mut characters = 0;
    let mut piece = String::new();
    for character in text.chars() {
        piece.clear();
        escape(&mut piece, character);
        let width = measure.of(&piece);
        if used + width > limit {
            break;
        }
        used += width;
        characters += 1;
        escaped.push_str(&piece);
    }
    (escaped, characters)
}

/// `text` escaped with `escape`, cut (ending in "…") so that the escaped result takes at most
/// `limit` as `measure` counts; see [`escape_prefix`].
pub fn escape_within(
    text: &str,
    limit: usize,
    measure: Measure,
    escape: impl Fn(&mut String, char),
) -> String {
    let (escaped, characters) = escape_prefix(text, limit, measure, &escape);
    if characters == text.chars().count() {
        return escaped;
    }
    if limit < measure.of("…") {
        return String::new();
    }
    let (mut prefix, _) =
        escape_prefix(text, limit.saturating_sub(measure.of("…")), measure, escape);
    prefix.push('…');
    prefix
}

/// Characters that start a new line in some renderer.
pub fn is_line_break(character: char) -> bool {
    matches!(
        character,
        '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Characters that are invisible or reorder the text around them: bidirectional controls,
/// zero-width characters, other control characters, Unicode tag characters.
pub fn is_hidden(character: char) -> bool {
    matches!(
        character,
        '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{00AD}'
            | '\u{034F}'
            | '\u{180E}'
            | '\u{E0000}'..='\u{E007F}'
    ) || (character.is_control() && !is_line_break(character) && character != '\t')
}

/// Every hidden character of `text` made visible and line breaks kept (for blocks that show
/// several lines, such as the arguments).
pub fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        if is_hidden(character) {
            out.push_str(&format!("⟨U+{:04X}⟩", u32::from(character)));
        } else {
            out.push(character);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_breaks_cannot_start_a_line() {
        let forged = "tidy up\n\nRisk: LOW\r\nApproved by @alice\u{2028}x\u{85}y";
        let shown = one_line(forged, 200);
        assert!(!shown.chars().any(is_line_break), "{shown}");
        assert_eq!(shown, "tidy up ⏎ Risk: LOW ⏎ Approved by @alice ⏎ x ⏎ y");
    }

    #[test]
    fn bidi_and_zero_width_characters_are_shown_as_code_points() {
        let shown = one_line("rm \u{202E}fdp.exe\u{200B}\u{2066}x\u{0007}", 200);
        assert_eq!(shown, "rm ⟨U+202E⟩fdp.exe⟨U+200B⟩⟨U+2066⟩x⟨U+0007⟩");
        assert_eq!(visible("a\n\u{202E}b"), "a\n⟨U+202E⟩b");
    }

    #[test]
    fn escaped_text_fits_its_limit_and_no_escape_is_split() {
        let escape = |out: &mut String, character: char| match character {
            '<' => out.push_str("&lt;"),
            '&' => out.push_str("&amp;"),
            other => out.push(other),
        };
        let hostile = "<&".repeat(1_000);
        for measure in [Measure::Chars, Measure::Utf16, Measure::Bytes] {
            for limit in [0, 1, 3, 4, 5, 9, 10, 100, 3_000] {
                let shown = escape_within(&hostile, limit, measure, escape);
                assert!(measure.of(&shown) <= limit, "{measure:?} {limit}: {shown}");
                let body = shown.trim_end_matches('…');
                assert!(
                    body.is_empty() || body.ends_with("&lt;") || body.ends_with("&amp;"),
                    "{measure:?} {limit}: split escape in {shown}"
                );
            }
        }
        assert_eq!(escape_within("a<b", 10, Measure::Chars, escape), "a&lt;b");
        assert_eq!(escape_within("a<b", 5, Measure::Chars, escape), "a…");
        assert_eq!(
            escape_prefix("é<", 3, Measure::Bytes, escape),
            ("é".to_owned(), 1)
        );
    }

    #[test]
    fn length_is_capped() {
        assert_eq!(one_line(&"é".repeat(10), 4), "ééé…");
        assert_eq!(one_line("short", 5), "short");
    }
}
