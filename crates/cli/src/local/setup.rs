//! `setup telegram`: connects a Telegram bot to the local instance without anyone typing a
//! numeric id. The bot token is checked (getMe); a random pairing code is shown; whoever sends
//! the bot `/start <code>` becomes an approver (`telegram:<user id>`), and their chat the
//! default target of approvals, in the config file.
//!
//! Codes are single-use and expire. Every code issued is remembered (its SHA-256, expiry and
//! whether it was used) in the data directory, so that a used, expired or replaced code is
//! refused with the reason, by the bot, in the chat it was sent to; a refused code registers
//! nothing. A new `setup telegram` replaces the codes of earlier runs.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use countersign_telegram::api::{BotApi, BotApiError};
use countersign_telegram::command::split_command;
use countersign_telegram::config::BOT_TOKEN_ENV;
use countersign_telegram::render::escape;
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use teloxide::types::{Message, UpdateKind};
use toml_edit::{value, Array, DocumentMut, Item};

use crate::args::SetupTelegramArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::{replace_file, Instance, Secret};

const DEFAULT_API_URL: &str = "https://api.telegram.org";

/// Pairing codes use letters and digits that cannot be mistaken for one another.
const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
const CODE_LENGTH: usize = 10;

/// The longest single getUpdates long poll.
const POLL_SECONDS: u64 = 10;

pub async fn telegram(instance: &Instance, args: SetupTelegramArgs) -> Result<Exit, CliError> {
    let existing = config_file::read(instance)?;
    let configured_api_url = existing
        .get("telegram")
        .and_then(|telegram| telegram.get("api_url"))
        .and_then(Item::as_str)
        .map(str::to_owned);
    let api_url = args
        .api_url
        .clone()
        .or(configured_api_url)
        .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
    let token = bot_token(instance, args.add)?;
    let bot = BotApi::new(&token, &api_url).map_err(|error| CliError::Usage(error.to_string()))?;
    let username = bot.bot_username().await.map_err(|error| match error {
        BotApiError::Api { status, .. } if status == 401 || status == 404 => CliError::Usage(
            format!("Telegram refused the bot token ({error}): copy it again from @BotFather"),
        ),
        error => CliError::Failure(format!("cannot check the bot token: {error}")),
    })?;
    bot.ensure_polling_mode().await.map_err(telegram_error)?;

    // Messages sent before the code is shown cannot carry it: confirm them unread.
    let offset = skip_earlier_messages(&bot).await?;
    let mut codes = Codes::load(instance)?;
    let code = new_code();
    let ttl = args.code_ttl;
    codes.issue(&code, ttl);
    codes.save(instance)?;
    println!("Bot @{username} is ready. In Telegram, send it this message (in a private chat with the bot, or in a group it is in):\n\n    /start {code}\n");
    println!(
        "Waiting for it (the code works once, for {})...",
        humantime::format_duration(ttl)
    );
    let _ = std::io::stdout().flush();

    let paired = wait_for_code(&bot, &username, offset, instance, &mut codes, &code).await?;
    instance.write_secret(Secret::TelegramBotToken, &token)?;
    let registered = register(instance, existing, &paired, &api_url, args.add)?;
    let reply = match &registered {
        Registered::Added(id) | Registered::Joined(id) => format!(
            "Paired: you approve countersign requests as {}, and they are shown in this chat. Start (or restart) countersign up on your computer.",
            escape(id)
        ),
        Registered::Already(id) => {
            format!("You were already an approver ({}); nothing changed.", escape(id))
        }
    };
    reply_in_chat(&bot, &paired.message, &reply).await;
    registered.announce(&paired.name, &format!("chat {}", paired.chat_id), instance);
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// The bot token: `TELEGRAM_BOT_TOKEN`, the one stored by an earlier setup (`--add`), or typed
/// at the prompt.
fn bot_token(instance: &Instance, add: bool) -> Result<String, CliError> {
    if let Some(token) = std::env::var(BOT_TOKEN_ENV)
        .ok()
        .filter(|token| !token.is_empty())
    {
        return Ok(token);
    }
    if add {
        if let Some(token) = instance.read_secret(Secret::TelegramBotToken)? {
            return Ok(token);
        }
    }
    let token = prompt_secret("Telegram bot token (from @BotFather)")?;
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "no bot token: type it at the prompt or set {BOT_TOKEN_ENV} (create a bot with @BotFather)"
        )));
    }
    Ok(token)
}

/// Asks on stderr and reads one line of the answer from stdin (trimmed; empty at its end).
pub fn prompt(question: &str) -> Result<String, CliError> {
    ask(question, false)
}

/// Like [`prompt`] for a secret: on a terminal what is typed is not shown.
pub fn prompt_secret(question: &str) -> Result<String, CliError> {
    ask(question, true)
}

fn ask(question: &str, secret: bool) -> Result<String, CliError> {
    eprint!("{question}: ");
    let _ = std::io::stderr().flush();
    let cannot_read = |error: std::io::Error| {
        CliError::Failure(format!("cannot read the answer to {question:?}: {error}"))
    };
    if secret && std::io::stdin().is_terminal() {
        return rpassword::read_password()
            .map(|typed| typed.trim().to_owned())
            .map_err(cannot_read);
    }
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(cannot_read)?;
    Ok(line.trim().to_owned())
}

fn telegram_error(error: BotApiError) -> CliError {
    if error.is_polling_conflict() {
        return CliError::Failure(
            "another program reads this bot's messages (is countersign up running? stop it, pair, then start it again)".into(),
        );
    }
    CliError::Failure(format!("Telegram: {error}"))
}

/// Who sent the valid code, and where.
struct Paired {
    user_id: u64,
    name: String,
    chat_id: i64,
    message: Message,
}

/// Reads the bot's messages until one carries `code` (then it is used up) or `code` expires;
/// answers every other `/start` with why it pairs nothing.
async fn wait_for_code(
    bot: &BotApi,
    username: &str,
    mut offset: Option<i32>,
    instance: &Instance,
    codes: &mut Codes,
    code: &str,
) -> Result<Paired, CliError> {
    loop {
        let left = codes.time_left(code);
        if left.is_zero() {
            return Err(CliError::Failure(
                "the pairing code expired before anyone sent it; run countersign setup telegram again for a new one".into(),
            ));
        }
        let poll = left.as_secs().clamp(1, POLL_SECONDS) as u32;
        let updates = bot
            .get_updates(offset, poll)
            .await
            .map_err(telegram_error)?;
        for update in updates {
            offset = Some(update.id.0 as i32 + 1);
            let UpdateKind::Message(message) = update.kind else {
                continue;
            };
            let Some((name, sent)) = message
                .text()
                .and_then(|text| split_command(text, username))
            else {
                continue;
            };
            if !name.eq_ignore_ascii_case("start") {
                continue;
            }
            let sender = message.from.as_ref().filter(|user| !user.is_bot);
            let refusal = match (codes.check(sent), sender) {
                (_, None) => Some("Only a person can pair with countersign."),
                (CodeState::Valid, Some(_)) if sent.eq_ignore_ascii_case(code) => None,
                (CodeState::Valid | CodeState::Expired, _) => Some(
                    "This pairing code expired; run countersign setup telegram again for a new one.",
                ),
                (CodeState::Used, _) => Some(
                    "This pairing code was already used; run countersign setup telegram --add to pair someone else.",
                ),
                (CodeState::Unknown, _) if sent.is_empty() => Some(
                    "Send /start followed by the code countersign setup telegram shows on your computer.",
                ),
                (CodeState::Unknown, _) => Some(
                    "That is not a valid pairing code; check the code countersign setup telegram shows.",
                ),
            };
            if let Some(refusal) = refusal {
                tracing::info!(chat_id = message.chat.id.0, "refused a pairing message");
                reply_in_chat(bot, &message, refusal).await;
                continue;
            }
            let Some(user) = sender else { continue };
            // Used up before anything is registered: a failure later never makes it reusable.
            codes.use_up(code);
            codes.save(instance)?;
            // This message is handled: confirm it, so a later poll does not see it again.
            let _ = bot.get_updates(offset, 0).await;
            let name = match &user.username {
                Some(login) => format!("{} (@{login})", user.first_name),
                None => user.first_name.clone(),
            };
            return Ok(Paired {
                user_id: user.id.0,
                name,
                chat_id: message.chat.id.0,
                message,
            });
        }
    }
}

/// Confirms the updates waiting now; returns the offset of the next one.
async fn skip_earlier_messages(bot: &BotApi) -> Result<Option<i32>, CliError> {
    let earlier = bot.get_updates(None, 0).await.map_err(telegram_error)?;
    let offset = earlier.iter().map(|update| update.id.0 as i32 + 1).max();
    if offset.is_some() {
        bot.get_updates(offset, 0).await.map_err(telegram_error)?;
    }
    Ok(offset)
}

async fn reply_in_chat(bot: &BotApi, to: &Message, text: &str) {
    // Texts without markup; an approver id in them is escaped by the caller.
    if let Err(error) = bot
        .send_message(to.chat.id.0, text, &[], Some(to.id.0))
        .await
    {
        tracing::warn!(%error, "cannot answer in Telegram");
    }
}

pub(crate) fn new_code() -> String {
    let mut rng = rand::rngs::OsRng;
    (0..CODE_LENGTH)
        .map(|_| char::from(CODE_ALPHABET[rng.gen_range(0..CODE_ALPHABET.len())]))
        .collect()
}

fn code_digest(code: &str) -> String {
    hex::encode(Sha256::digest(code.trim().to_ascii_uppercase().as_bytes()))
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CodeState {
    Valid,
    Used,
    Expired,
    Unknown,
}

/// The pairing codes ever issued, by digest (the codes themselves are never stored).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Codes {
    codes: Vec<IssuedCode>,
}

#[derive(Debug, Serialize, Deserialize)]
struct IssuedCode {
    sha256: String,
    expires_at_ms: u64,
    used: bool,
}

impl Codes {
    fn path(instance: &Instance) -> std::path::PathBuf {
        instance.data_dir.join("pairing-codes.json")
    }

    fn load(instance: &Instance) -> Result<Codes, CliError> {
        let path = Codes::path(instance);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|error| {
                CliError::Failure(format!(
                    "{} is unreadable ({error}); delete it",
                    path.display()
                ))
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Codes::default()),
            Err(error) => Err(CliError::Failure(format!(
                "cannot read {}: {error}",
                path.display()
            ))),
        }
    }

    fn save(&self, instance: &Instance) -> Result<(), CliError> {
        let path = Codes::path(instance);
        std::fs::create_dir_all(&instance.data_dir).map_err(|error| {
            CliError::Failure(format!(
                "cannot create {}: {error}",
                instance.data_dir.display()
            ))
        })?;
        let text = serde_json::to_vec_pretty(self)
            .map_err(|error| CliError::Failure(format!("cannot encode the codes: {error}")))?;
        replace_file(&path, &text, Some(0o600))
    }

    /// Adds `code`; the codes of earlier runs that were still valid expire now.
    fn issue(&mut self, code: &str, ttl: Duration) {
        let now = now_millis();
        for earlier in &mut self.codes {
            earlier.expires_at_ms = earlier.expires_at_ms.min(now);
        }
        self.codes.push(IssuedCode {
            sha256: code_digest(code),
            expires_at_ms: now.saturating_add(ttl.as_millis() as u64),
            used: false,
        });
    }

    fn find(&self, code: &str) -> Option<&IssuedCode> {
        let digest = code_digest(code);
        self.codes.iter().find(|issued| issued.sha256 == digest)
    }

    fn check(&self, code: &str) -> CodeState {
        match self.find(code) {
            None => CodeState::Unknown,
            Some(issued) if issued.used => CodeState::Used,
            Some(issued) if issued.expires_at_ms <= now_millis() => CodeState::Expired,
            Some(_) => CodeState::Valid,
        }
    }

    fn time_left(&self, code: &str) -> Duration {
        let now = now_millis();
        self.find(code)
            .filter(|issued| !issued.used)
            .map_or(Duration::ZERO, |issued| {
                Duration::from_millis(issued.expires_at_ms.saturating_sub(now))
            })
    }

    fn use_up(&mut self, code: &str) {
        let digest = code_digest(code);
        for issued in &mut self.codes {
            if issued.sha256 == digest {
                issued.used = true;
            }
        }
    }
}

/// Writes the paired approver into the config file: an `[[approvers]]` entry, the user on the
/// Telegram worker's allowlist, and (unless adding one more) the chat as the default target.
/// Nothing is written when the user was an approver already.
fn register(
    instance: &Instance,
    mut doc: DocumentMut,
    paired: &Paired,
    api_url: &str,
    add: bool,
) -> Result<Registered, CliError> {
    let user_id = paired.user_id.to_string();
    let approver = NewApprover {
        id: format!("telegram:{user_id}"),
        name: &paired.name,
        channel: "telegram",
        identity: &user_id,
    };
    let registered =
        config_file::register_identity(&mut doc, instance, &approver, Owner::pairing(add))?;
    if let Registered::Already(_) = registered {
        return Ok(registered);
    }
    let telegram = config_file::table(&mut doc, instance, "telegram")?;
    if !add || !telegram.contains_key("default_chat_id") {
        telegram["default_chat_id"] = value(paired.chat_id);
    }
    let allowed = telegram
        .entry("allowed_user_ids")
        .or_insert(value(Array::new()))
        .as_array_mut()
        .ok_or_else(|| {
            config_file::invalid(instance, "telegram.allowed_user_ids is not an array")
        })?;
    let user = i64::try_from(paired.user_id)
        .map_err(|_| config_file::invalid(instance, "user id out of range"))?;
    if !allowed.iter().any(|id| id.as_integer() == Some(user)) {
        allowed.push(user);
    }
    if api_url != DEFAULT_API_URL {
        telegram["api_url"] = value(api_url);
    }
    config_file::write(instance, &doc)?;
    Ok(registered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_single_use_expire_and_replace_earlier_ones() {
        let mut codes = Codes::default();
        codes.issue("FIRSTCODE2", Duration::from_secs(600));
        assert_eq!(codes.check("firstcode2"), CodeState::Valid);
        codes.use_up("FIRSTCODE2");
        assert_eq!(codes.check("FIRSTCODE2"), CodeState::Used);
        codes.issue("SECONDCODE", Duration::from_secs(600));
        codes.issue("THIRDCODE3", Duration::from_secs(600));
        assert_eq!(codes.check("SECONDCODE"), CodeState::Expired);
        assert_eq!(codes.check("THIRDCODE3"), CodeState::Valid);
        assert_eq!(codes.check("NEVERISSUE"), CodeState::Unknown);
        assert!(!format!("{codes:?}").contains("THIRDCODE3"));
        assert_eq!(new_code().len(), CODE_LENGTH);
        assert_ne!(new_code(), new_code());
    }
}
