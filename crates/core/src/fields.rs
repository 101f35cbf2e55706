//! The vocabulary the configuration and the input checks share, at the bottom of the crate:
//! the error naming a configuration entry that cannot be used, the checks of one field
//! (length, characters, identifiers, channel names), and the form identities compare in.
//! `policy.rs`, `approvers.rs`, `groups.rs` and `validate.rs` import these; none of them
//! imports another for a helper.

use unicode_normalization::{is_nfc, UnicodeNormalization};

use crate::Error;

/// A configuration entry (a rule, an approver) that cannot be used, named so that the operator
/// finds it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject}: {message}")]
pub struct SpecError {
    /// Which entry: `rule "deploys" (rules[2])`.
    pub subject: String,
    pub message: String,
}

/// The name of the `index`th entry of `list` in messages: `rule "x" (rules[2])`.
pub(crate) fn subject(kind: &str, list: &str, index: usize, name: &str) -> String {
    if name.is_empty() {
        format!("{list}[{index}]")
    } else {
        format!("{kind} {name:?} ({list}[{index}])")
    }
}

/// The form identities are compared in: NFKC, case-folded, without surrounding whitespace.
pub fn identity_key(text: &str) -> String {
    text.trim().nfkc().flat_map(char::to_lowercase).collect()
}

/// A channel name: 1–64 of `[a-z0-9_-]`.
pub fn validate_channel(field: &str, channel: &str) -> Result<(), Error> {
    required(field, channel, 64)?;
    if !channel
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err(Error::invalid(field, "may hold only a-z, 0-9, '_' and '-'"));
    }
    Ok(())
}

/// A field that must be present: 1 to `max` characters.
pub fn required(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    optional(field, value, max)
}

/// Free text that may be empty: at most `max` characters; newlines and tabs are kept, other
/// control characters and the invisible characters of [`is_invisible`] (which reorder or hide
/// what a reader sees) are refused.
pub fn optional(field: &str, value: &str, max: usize) -> Result<(), Error> {
    length(field, value, max)?;
    if value
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(Error::invalid(field, "may not hold control characters"));
    }
    no_invisible(field, value)
}

/// A name as a platform shows it, on one line: no control characters and no bidirectional
/// controls; joiners and variation selectors stay (people's names hold emoji).
pub fn single_line(field: &str, value: &str, max: usize) -> Result<(), Error> {
    length(field, value, max)?;
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            field,
            "must be a single line without control characters",
        ));
    }
    match value.chars().find(|&c| is_bidi_control(c)) {
        Some(c) => Err(refused(
            field,
            "may not hold bidirectional control characters",
            c,
        )),
        None => Ok(()),
    }
}

/// The refusal of `field` for holding `c`, which the message names by code point.
fn refused(field: &str, rule: &str, c: char) -> Error {
    Error::invalid(field, format!("{rule} (found U+{:04X})", u32::from(c)))
}

/// Marks, embeddings, overrides and isolates that change the order text is shown in.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// An identifier that must be present; see [`identifier`].
pub fn required_identifier(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    identifier(field, value, max)
}

/// An identifier that may be empty: printable characters and plain spaces only (no control,
/// invisible or bidirectional-override characters, no other whitespace, no space at either
/// end), in Unicode normalization form C, so that one identifier has one spelling.
pub fn identifier(field: &str, value: &str, max: usize) -> Result<(), Error> {
    length(field, value, max)?;
    if let Some(c) = value
        .chars()
        .find(|&c| c.is_control() || (c.is_whitespace() && c != ' '))
    {
        return Err(refused(field, "may hold only printable characters", c));
    }
    no_invisible(field, value)?;
    if value.starts_with(' ') || value.ends_with(' ') {
        return Err(Error::invalid(field, "may not start or end with a space"));
    }
    if !is_nfc(value) {
        return Err(Error::invalid(
            field,
            "must be in Unicode normalization form C (NFC)",
        ));
    }
    Ok(())
}

fn length(field: &str, value: &str, max: usize) -> Result<(), Error> {
    let chars = value.chars().count();
    if chars > max {
        return Err(Error::invalid(
            field,
            format!("is {chars} characters long, at most {max} are allowed"),
        ));
    }
    Ok(())
}

fn no_invisible(field: &str, value: &str) -> Result<(), Error> {
    match value.chars().find(|&c| is_invisible(c)) {
        Some(c) => Err(refused(
            field,
            "may not hold invisible or bidirectional control characters",
            c,
        )),
        None => Ok(()),
    }
}

/// Characters that show nothing or change the order in which the text around them is shown:
/// bidirectional marks, embeddings, overrides and isolates, zero-width characters, joiners,
/// invisible operators, variation selectors, fillers, tags, the soft hyphen and the BOM.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}
