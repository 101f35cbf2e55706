//! The Bot API calls the worker makes, on top of teloxide, with Telegram's faults handled:
//!
//! - HTTP 429 `retry_after` is honoured for every call (sends, edits, answers, polls) by
//!   waiting and retrying; teloxide's Throttle adaptor would pace only sends.
//! - "message is not modified" is success (matched by substring: teloxide maps only one of
//!   Telegram's wordings to `ApiError::MessageNotModified`, the others to `ApiError::Unknown`).
//! - a message that can no longer be edited is reported as [`BotApiError::CantEdit`], so the
//!   caller can post a short reply instead.

use std::future::Future;
use std::time::Duration;

use teloxide::payloads::{
    AnswerCallbackQuerySetters, EditMessageTextSetters, GetUpdatesSetters, SendMessageSetters,
};
use teloxide::requests::Requester;
use teloxide::types::{
    AllowedUpdate, CallbackQueryId, ChatId, InlineKeyboardButton, InlineKeyboardMarkup,
    LinkPreviewOptions, MessageId, ParseMode, ReplyParameters, Update,
};
use teloxide::{ApiError, Bot, RequestError};

use crate::render::Button;

/// How a call to the Bot API failed.
#[derive(Debug, thiserror::Error)]
pub enum BotApiError {
    /// The message can no longer be edited (too old, deleted, or not the bot's).
    #[error("the message can no longer be edited: {0}")]
    CantEdit(String),
    /// Telegram asked to wait longer than the worker is configured to wait.
    #[error("Telegram asked to retry after {0:?}, longer than the configured limit")]
    FloodWaitTooLong(Duration),
    /// Another process polls updates with the same bot token.
    #[error("another process is polling updates with this bot token (409 Conflict: terminated by other getUpdates)")]
    PollingConflict,
    /// The Bot API could not be reached (the text never contains the bot token).
    #[error("cannot reach the Telegram Bot API: {0}")]
    Network(String),
    #[error("Telegram Bot API call failed: {0}")]
    Request(#[source] RequestError),
    #[error("invalid Bot API URL {url:?}: {reason}")]
    InvalidApiUrl { url: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
}

impl BotApiError {
    /// True when the same call may succeed later: Telegram was unreachable or answered
    /// something unreadable (a proxy's error page), or asked for a longer flood wait than the
    /// worker waits. Refusals (4xx) are final.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BotApiError::Network(_)
                | BotApiError::FloodWaitTooLong(_)
                | BotApiError::Request(RequestError::InvalidJson { .. } | RequestError::Io(_))
        )
    }

    /// How long Telegram asked to wait before the call may be made again.
    pub fn retry_after(&self) -> Duration {
        match self {
            BotApiError::FloodWaitTooLong(wait) => *wait,
            _ => Duration::ZERO,
        }
    }
}

/// The result of an edit that did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EditOutcome {
    Edited,
    /// Telegram already shows exactly this text and keyboard.
    NotModified,
}

/// The worker's view of the Bot API.
#[derive(Clone)]
pub struct BotApi {
    bot: Bot,
    /// The longest `retry_after` the worker waits for before giving up on a call.
    max_retry_wait: Duration,
}

impl BotApi {
    /// A Bot API client for `token` at `api_url` (`https://api.telegram.org`, or a
    /// self-hosted Bot API server).
    pub fn new(
        token: &str,
        api_url: &str,
        max_retry_wait: Duration,
    ) -> Result<BotApi, BotApiError> {
        let url = url::Url::parse(api_url.trim_end_matches('/')).map_err(|error| {
            BotApiError::InvalidApiUrl {
                url: api_url.to_owned(),
                reason: error.to_string(),
            }
        })?;
        if url.cannot_be_a_base() {
            return Err(BotApiError::InvalidApiUrl {
                url: api_url.to_owned(),
                reason: "not a base URL".to_owned(),
            });
        }
        // teloxide's own constructor panics when the client cannot be built.
        let client = teloxide::net::default_reqwest_settings()
            .build()
            .map_err(|error| BotApiError::HttpClient(error.to_string()))?;
        Ok(BotApi {
            bot: Bot::with_client(token, client).set_api_url(url),
            max_retry_wait,
        })
    }

    /// The bot's username (to recognise `/command@username`).
    pub async fn bot_username(&self) -> Result<String, BotApiError> {
        let me = self.call("getMe", || self.bot.get_me()).await?;
        Ok(me.user.username.unwrap_or_default())
    }

    /// Removes a webhook left by another deployment: Telegram refuses getUpdates while one is
    /// set.
    pub async fn ensure_polling_mode(&self) -> Result<(), BotApiError> {
        let info = self
            .call("getWebhookInfo", || self.bot.get_webhook_info())
            .await?;
        if let Some(webhook) = info.url {
            tracing::warn!(webhook = %webhook.host_str().unwrap_or_default(), "a webhook is set for this bot; deleting it to receive updates by polling");
            self.call("deleteWebhook", || self.bot.delete_webhook())
                .await?;
        }
        Ok(())
    }

    /// Long-polls for message and callback updates after `offset` (which confirms earlier
    /// ones).
    pub async fn get_updates(
        &self,
        offset: Option<i32>,
        timeout_secs: u32,
    ) -> Result<Vec<Update>, BotApiError> {
        self.call("getUpdates", || {
            let request = self
                .bot
                .get_updates()
                .timeout(timeout_secs)
                .allowed_updates([AllowedUpdate::Message, AllowedUpdate::CallbackQuery]);
            match offset {
                Some(offset) => request.offset(offset),
                None => request,
            }
        })
        .await
        .map_err(|error| match error {
            BotApiError::Request(RequestError::Api(ApiError::TerminatedByOtherGetUpdates)) => {
                BotApiError::PollingConflict
            }
            other => other,
        })
    }

    /// Sends an HTML message, optionally with buttons and as a reply; returns its id.
    pub async fn send_message(
        &self,
        chat_id: i64,
        html: &str,
        keyboard: &[Vec<Button>],
        reply_to: Option<i32>,
    ) -> Result<i32, BotApiError> {
        let message = self
            .call("sendMessage", || {
                let mut request = self
                    .bot
                    .send_message(ChatId(chat_id), html)
                    .parse_mode(ParseMode::Html)
                    .link_preview_options(no_link_preview());
                if !keyboard.is_empty() {
                    request = request.reply_markup(inline_keyboard(keyboard));
                }
                if let Some(message_id) = reply_to {
                    request = request.reply_parameters(ReplyParameters {
                        allow_sending_without_reply: Some(true),
                        ..ReplyParameters::new(MessageId(message_id))
                    });
                }
                request
            })
            .await?;
        Ok(message.id.0)
    }

    /// Replaces a message's text and keyboard (an empty keyboard removes the buttons).
    pub async fn edit_message(
        &self,
        chat_id: i64,
        message_id: i32,
        html: &str,
        keyboard: &[Vec<Button>],
    ) -> Result<EditOutcome, BotApiError> {
        let result = self
            .call("editMessageText", || {
                let request = self
                    .bot
                    .edit_message_text(ChatId(chat_id), MessageId(message_id), html)
                    .parse_mode(ParseMode::Html)
                    .link_preview_options(no_link_preview());
                if keyboard.is_empty() {
                    request
                } else {
                    request.reply_markup(inline_keyboard(keyboard))
                }
            })
            .await;
        match result {
            Ok(_) => Ok(EditOutcome::Edited),
            Err(BotApiError::Request(error)) if is_not_modified(&error) => {
                Ok(EditOutcome::NotModified)
            }
            Err(BotApiError::Request(error)) if is_cant_edit(&error) => {
                Err(BotApiError::CantEdit(error.to_string()))
            }
            Err(error) => Err(error),
        }
    }

    /// Answers a callback query (the text pops up on the tapper's screen).
    pub async fn answer_callback(&self, callback_id: &str, text: &str) -> Result<(), BotApiError> {
        self.call("answerCallbackQuery", || {
            self.bot
                .answer_callback_query(CallbackQueryId(callback_id.to_owned()))
                .text(text)
        })
        .await?;
        Ok(())
    }

    /// Runs a call, waiting and retrying as long as Telegram answers 429 with a `retry_after`
    /// within the configured limit.
    async fn call<T, R, F>(&self, method: &'static str, mut request: F) -> Result<T, BotApiError>
    where
        F: FnMut() -> R,
        R: std::future::IntoFuture<Output = Result<T, RequestError>>,
        R::IntoFuture: Future<Output = Result<T, RequestError>>,
    {
        loop {
            match request().await {
                Ok(value) => return Ok(value),
                Err(RequestError::RetryAfter(seconds)) => {
                    let wait = seconds.duration();
                    if wait > self.max_retry_wait {
                        tracing::warn!(method, retry_after_secs = wait.as_secs(), "Telegram flood limit beyond the configured wait; giving up on this call");
                        return Err(BotApiError::FloodWaitTooLong(wait));
                    }
                    tracing::info!(
                        method,
                        retry_after_secs = wait.as_secs(),
                        "Telegram flood limit; waiting before retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
                Err(RequestError::Network(error)) => {
                    return Err(BotApiError::Network(redacted_chain(
                        error.as_ref(),
                        self.bot.token(),
                    )))
                }
                Err(error) => return Err(BotApiError::Request(error)),
            }
        }
    }
}

/// An error and its sources as one line, with the token removed: HTTP client errors name the
/// request URL, and the Bot API puts the token in the URL path.
fn redacted_chain(error: &(dyn std::error::Error + 'static), token: &str) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if token.is_empty() {
        text
    } else {
        text.replace(token, "<redacted>")
    }
}

fn no_link_preview() -> LinkPreviewOptions {
    LinkPreviewOptions {
        is_disabled: true,
        url: None,
        prefer_small_media: false,
        prefer_large_media: false,
        show_above_text: false,
    }
}

fn inline_keyboard(rows: &[Vec<Button>]) -> InlineKeyboardMarkup {
    InlineKeyboardMarkup::new(rows.iter().map(|row| {
        row.iter()
            .map(|button| {
                InlineKeyboardButton::callback(button.label, button.callback_data.clone())
            })
            .collect::<Vec<_>>()
    }))
}

/// "message is not modified", in any of Telegram's wordings.
fn is_not_modified(error: &RequestError) -> bool {
    match error {
        RequestError::Api(ApiError::MessageNotModified) => true,
        RequestError::Api(ApiError::Unknown(text)) => text.contains("message is not modified"),
        _ => false,
    }
}

/// The message cannot be edited any more: too old, deleted, or not the bot's own.
fn is_cant_edit(error: &RequestError) -> bool {
    match error {
        RequestError::Api(ApiError::MessageCantBeEdited | ApiError::MessageToEditNotFound) => true,
        RequestError::Api(ApiError::Unknown(text)) => {
            text.contains("message can't be edited") || text.contains("message to edit not found")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(description: &str) -> RequestError {
        RequestError::Api(serde_json::from_value(serde_json::json!(description)).unwrap())
    }

    #[test]
    fn both_not_modified_wordings_are_recognised() {
        assert!(is_not_modified(&api_error(
            "Bad Request: message is not modified"
        )));
        assert!(is_not_modified(&api_error("Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message")));
        assert!(!is_not_modified(&api_error(
            "Bad Request: message is too long"
        )));
    }

    #[test]
    fn messages_that_cannot_be_edited_are_recognised() {
        assert!(is_cant_edit(&api_error(
            "Bad Request: message can't be edited"
        )));
        assert!(is_cant_edit(&api_error(
            "Bad Request: message to edit not found"
        )));
        assert!(!is_cant_edit(&api_error("Bad Request: chat not found")));
    }

    #[derive(Debug)]
    struct Failure(&'static str, Option<Box<Failure>>);

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Failure {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|cause| cause as _)
        }
    }

    #[test]
    fn network_errors_never_show_the_token() {
        let error = Failure(
            "error sending request for url (http://127.0.0.1:1/bot123:SECRET/GetMe)",
            Some(Box::new(Failure("connection refused", None))),
        );
        assert_eq!(
            redacted_chain(&error, "123:SECRET"),
            "error sending request for url (http://127.0.0.1:1/bot<redacted>/GetMe): connection refused"
        );
    }

    #[test]
    fn a_bad_api_url_is_a_clear_error() {
        assert!(matches!(
            BotApi::new("1:x", "not a url", Duration::from_secs(1)),
            Err(BotApiError::InvalidApiUrl { .. })
        ));
    }
}
