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
    fn length_is_capped() {
        assert_eq!(one_line(&"é".repeat(10), 4), "ééé…");
        assert_eq!(one_line("short", 5), "short");
    }
}
