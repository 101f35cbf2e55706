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
//! event was fully handled, so a restarted worker resumes after it and misses nothing. It runs on the shared worker runtime (`countersign-worker`): one lane per
//! approval, retries per approval honouring `retry_after`, graceful shutdown.
//!
//! [`run`] is the entry point used by the `countersign-telegram` binary and by tests.

pub mod bot_api;
pub mod callback;
pub mod command;
pub mod config;
pub mod render;
mod worker;

use std::future::Future;
use std::sync::Arc;

use countersign_client::{Client, ClientConfig};
use countersign_worker::cursor::Cursor;
use countersign_worker::lanes::Lanes;
use countersign_worker::outbox::Outbox;

use crate::bot_api::{BotApi, BotApiError};
pub use crate::config::Settings;
use crate::worker::{Resume, Worker};
pub use crate::worker::{WorkerError, CHANNEL};

/// Runs the worker until `shutdown` completes (then the messages being sent or edited are
/// finished, within the configured grace, and it returns `Ok`) or an error that retrying
/// cannot fix occurs (wrong bot token, refused worker token, unusable outbox, ...).
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let bot = BotApi::new(&settings.bot_token, &settings.api_url)?;
    let outbox = Outbox::open(&settings.outbox_path)?;
    let (cursor, after) = Cursor::open(&settings.cursor_path);
    let client = Client::connect(ClientConfig {
        url: settings.server_url.clone(),
        token: settings.worker_token.clone(),
        ca_cert_pem: settings.ca_cert_pem.clone(),
        connect_timeout: settings.connect_timeout,
    })?;
    let lanes = Lanes::new();
    // The lanes' jobs hold the worker; dropping this future (a kill in tests) stops them.
    let _stop_lanes = lanes.abort_on_drop();
    let grace = settings.shutdown_grace;
    tokio::select! {
        result = start_and_serve(client, bot, settings, lanes.clone(), outbox, Resume { cursor: cursor.clone(), after }) => result,
        result = cursor.persist() => result.map_err(WorkerError::from),
        () = shutdown => {
            tracing::info!(in_flight = lanes.busy(), "shutting down; finishing the messages being sent or edited");
            lanes.shutdown(grace).await;
            cursor.flush().await?;
            Ok(())
        }
    }
}

async fn start_and_serve(
    client: Client,
    bot: BotApi,
    settings: Settings,
    lanes: Lanes,
    outbox: Outbox,
    resume: Resume,
) -> Result<(), WorkerError> {
    let bot_username = connect_to_telegram(&bot, &settings).await?;
    tracing::info!(
        bot = %bot_username,
        server = %settings.server_url,
        default_chat_id = ?settings.default_chat_id,
        allowlisted_users = settings.allowed_user_ids.len(),
        unsettled_outbox_entries = outbox.all_unsettled().len(),
        "Telegram worker started"
    );
    let worker = Arc::new(Worker::new(
        client,
        bot,
        settings,
        bot_username,
        lanes,
        outbox,
        resume,
    ));
    tokio::select! {
        result = worker.follow_approvals() => result,
        result = worker.follow_updates() => result,
        result = worker.retry_failed_messages() => result,
        result = worker.correct_resolved_messages() => result,
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
                pause = (pause * 2).min(settings.max_backoff);
            }
            Err(error) => return Err(error),
        }
    }
}
