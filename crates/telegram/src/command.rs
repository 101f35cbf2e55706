//! `/approve` and `/reject <reason>` sent as a reply to a request message.

use countersign_client::pb::Verdict;

/// A decision typed as a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub verdict: Verdict,
    /// The rest of the message after the command (may be empty).
    pub reason: String,
}

/// Splits a bot command into its name (without the `/` and the `@<bot_username>` Telegram
/// clients add in groups) and the rest of the text, trimmed. `None` when `text` does not start
/// with a command, or with one addressed to another bot.
pub fn split_command<'a>(text: &'a str, bot_username: &str) -> Option<(&'a str, &'a str)> {
    let text = text.trim_start();
    let word_end = text.find(char::is_whitespace).unwrap_or(text.len());
    let (word, rest) = text.split_at(word_end);
    let name = word.strip_prefix('/')?;
    let name = match name.split_once('@') {
        Some((name, addressee)) if addressee.eq_ignore_ascii_case(bot_username) => name,
        Some(_) => return None,
        None => name,
    };
    Some((name, rest.trim()))
}

/// Parses the first word of `text` as `/approve` or `/reject` (optionally addressed as
/// `/reject@<bot_username>`, as Telegram clients do in groups); the rest is the reason.
/// Anything else, including commands addressed to another bot, is not a command.
pub fn parse_command(text: &str, bot_username: &str) -> Option<Command> {
    let (name, rest) = split_command(text, bot_username)?;
    let verdict = if name.eq_ignore_ascii_case("approve") {
        Verdict::Approve
    } else if name.eq_ignore_ascii_case("reject") {
        Verdict::Reject
    } else {
        return None;
    };
    Some(Command {
        verdict,
        reason: rest.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(verdict: Verdict, reason: &str) -> Option<Command> {
        Some(Command {
            verdict,
            reason: reason.to_owned(),
        })
    }

    #[test]
    fn commands_with_and_without_reason() {
        assert_eq!(
            parse_command("/approve", "SomeBot"),
            command(Verdict::Approve, "")
        );
        assert_eq!(
            parse_command("/reject too risky\non prod", "SomeBot"),
            command(Verdict::Reject, "too risky\non prod")
        );
        assert_eq!(
            parse_command("  /Reject@somebot   not now ", "SomeBot"),
            command(Verdict::Reject, "not now")
        );
    }

    #[test]
    fn other_texts_are_not_commands() {
        for text in [
            "",
            "approve",
            "/approved",
            "/start",
            "please /approve",
            "/approve@OtherBot",
            "/",
        ] {
            assert_eq!(parse_command(text, "SomeBot"), None, "{text:?}");
        }
    }
}
