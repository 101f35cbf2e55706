//! countersign's Telegram worker.
//!
//! It watches the `telegram` channel of a countersign server through the client SDK and shows
//! each pending approval as a message with inline buttons (Approve, Reject, Allow for
//! session). A tap, or a `/approve` / `/reject <reason>` reply to the message, becomes a
//! `Decide` call; the message is then edited to show the outcome, and it is kept true when the
//! approval is decided elsewhere, expires or is cancelled, also while the worker was down.
//! Sent messages are recorded on the server (`RecordDelivery`), so a restarted worker edits
//! them instead of sending new ones; a local outbox covers a crash between Telegram's answer
//! and that record. A watch cursor in the state directory names the last seq up to which every
//! event was fully handled, so a restarted worker resumes after it and misses nothing.
//!
//! The approval side is a `Channel` of the shared worker runtime
//! (`countersign_worker::runtime`), which owns the loop: the watch and its cursor, one lane
//! per approval, retries per approval honouring `retry_after`, graceful shutdown. This crate
//! keeps the platform's parts: rendering, the Bot API calls, the book of sent messages and
//! the outbox records (`worker`), and the polling of taps and commands (`inbound`).
//!
//! [`run`] is the entry point used by the `countersign-telegram` binary and by tests.

pub mod api;
pub mod callback;
mod channel;
pub mod command;
pub mod config;
mod error;
mod inbound;
pub mod render;
mod shown;

use std::future::Future;
use std::sync::Arc;

use countersign_client::Client;
use countersign_worker::outbox::Outbox;
use countersign_worker::runtime;

use crate::api::{BotApi, BotApiError};
use crate::channel::TelegramChannel;
pub use crate::channel::CHANNEL;
pub use crate::config::Settings;
pub use crate::error::WorkerError;
use crate::inbound::Inbound;
use crate::shown::MessageBook;

/// Runs the worker until `shutdown` completes (then the messages being sent or edited are
/// finished, within the configured grace, and it returns `Ok`) or an error that retrying
/// cannot fix occurs (wrong bot token, refused worker token, unusable outbox, ...).
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let bot = BotApi::new(&settings.bot_token, &settings.api_url)?;
    let outbox = Outbox::open(&settings.outbox_path)?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let book = Arc::new(MessageBook::default());
    let (shows, queue) = runtime::show_requests();
    let unsettled = outbox.all_unsettled().len();
    let channel = TelegramChannel::new(
        client.clone(),
        bot.clone(),
        settings.clone(),
        book.clone(),
        outbox,
    );
    let start = async {
        let bot_username = connect_to_telegram(&bot, &settings).await?;
        channel.prepare(&shows).await?;
        Ok::<_, WorkerError>(bot_username)
    };
    tokio::pin!(shutdown);
    let bot_username = tokio::select! {
        started = start => started?,
        () = &mut shutdown => return Ok(()),
    };
    tracing::info!(
        bot = %bot_username,
        server = %settings.runtime.server.client.url,
        default_chat_id = ?settings.default_chat_id,
        allowlisted_users = settings.allowed_user_ids.len(),
        unsettled_outbox_entries = unsettled,
        "Telegram worker started"
    );
    let options = settings.runtime.options();
    let inbound = Arc::new(Inbound {
        client: client.clone(),
        bot,
        settings,
        bot_username,
        book,
        shows,
    });
    tokio::select! {
        result = runtime::run_with_requests(client, channel, options, queue, shutdown) => Ok(result?),
        () = inbound.follow_updates() => Ok(()),
    }
}

/// Checks the bot token (getMe) and switches the bot to polling; retries while Telegram is
/// unreachable or failing, fails at once when Telegram refuses (a wrong token).
async fn connect_to_telegram(bot: &BotApi, settings: &Settings) -> Result<String, BotApiError> {
    let mut pause = settings.poll_error_backoff;
    loop {
        let attempt = async {
            let username = bot.bot_username().await?;
            bot.ensure_polling_mode().await?;
            Ok::<_, BotApiError>(username)
        };
        match attempt.await {
            Ok(username) => return Ok(username),
            Err(error) if error.is_transient() => {
                let wait = pause.max(error.retry_after().unwrap_or_default());
                tracing::warn!(%error, retry_in_ms = wait.as_millis() as u64, "cannot reach the Telegram Bot API");
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(settings.runtime.server.max_backoff);
            }
            Err(error) => return Err(error),
        }
    }
}
