//! The Bot API calls the worker makes, as plain HTTPS calls (teloxide provides the types), so
//! that every failure keeps what the worker needs to decide about it:
//!
//! - the HTTP status and Telegram's `error_code`: every 5xx is worth retrying, whatever its
//!   body (Telegram answers `{"ok":false,"error_code":502,…}`), and 4xx are final;
//! - `parameters.retry_after` of a 429, which the caller's retry schedule honours;
//! - "message is not modified" is success (matched by substring, Telegram has two wordings);
//! - a message that can no longer be edited is recognisable, so the caller can reply instead.
//!
//! No call waits or retries here: the worker's lanes do, per approval, so that one approval's
//! flood wait never holds up another's call.

use std::time::Duration;

use countersign_worker::retry::{Classify, Verdict};
use serde_json::{json, Value};
use teloxide::types::Update;

use crate::render::Button;

/// The longest a call other than a long poll may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How a call to the Bot API failed.
#[derive(Debug, thiserror::Error)]
pub enum BotApiError {
    /// Telegram answered with an error.
    #[error("{method}: Telegram answered {status}: {description}")]
    Api {
        method: &'static str,
        status: u16,
        description: String,
        retry_after: Option<Duration>,
    },
    /// Telegram answered something that is not a Bot API answer (a proxy's error page).
    #[error("{method}: unreadable answer with HTTP status {status}: {reason}")]
    Unreadable {
        method: &'static str,
        status: u16,
        reason: String,
    },
    /// The Bot API could not be reached (the text never contains the bot token).
    #[error("cannot reach the Telegram Bot API: {0}")]
    Network(String),
    #[error("invalid Bot API URL {url:?}: {reason}")]
    InvalidApiUrl { url: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
}

impl Classify for BotApiError {
    fn verdict(&self) -> Verdict {
        match self {
            BotApiError::Api {
                status,
                retry_after,
                ..
            } => Verdict::of_http_status(*status, *retry_after),
            BotApiError::Unreadable { status, .. } => Verdict::of_http_status(*status, None),
            BotApiError::Network(_) => Verdict::Retry { after: None },
            BotApiError::InvalidApiUrl { .. } | BotApiError::HttpClient(_) => Verdict::Final,
        }
    }
}

impl BotApiError {
    /// True when the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        self.verdict().is_retryable()
    }

    /// How long Telegram asked to wait before the call may be made again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BotApiError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    fn description(&self) -> &str {
        match self {
            BotApiError::Api { description, .. } => description,
            _ => "",
        }
    }

    /// "message is not modified", in any of Telegram's wordings.
    pub fn is_not_modified(&self) -> bool {
        self.description().contains("message is not modified")
    }

    /// The message cannot be edited any more: too old, deleted, or not the bot's own.
    pub fn is_cant_edit(&self) -> bool {
        let description = self.description();
        description.contains("message can't be edited")
            || description.contains("message to edit not found")
    }

    /// Telegram refused the message for its content (too long, or markup it cannot parse):
    /// the same message is refused again, a smaller one may pass.
    pub fn is_content_refused(&self) -> bool {
        let description = self.description();
        matches!(self, BotApiError::Api { status: 400, .. })
            && (description.contains("message is too long")
                || description.contains("can't parse entities"))
    }

    /// Another process polls updates with the same bot token (409 Conflict).
    pub fn is_polling_conflict(&self) -> bool {
        matches!(self, BotApiError::Api { status: 409, .. })
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
    http: reqwest::Client,
    /// `<api_url>/bot<token>/`; never logged.
    base: String,
    token: String,
}

impl BotApi {
    /// A Bot API client for `token` at `api_url` (`https://api.telegram.org`, or a
    /// self-hosted Bot API server).
    pub fn new(token: &str, api_url: &str) -> Result<BotApi, BotApiError> {
        let invalid = |reason: &str| BotApiError::InvalidApiUrl {
            url: api_url.to_owned(),
            reason: reason.to_owned(),
        };
        let url = url::Url::parse(api_url.trim_end_matches('/'))
            .map_err(|error| invalid(&error.to_string()))?;
        if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("not an http(s) base URL"));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|error| BotApiError::HttpClient(error.to_string()))?;
        Ok(BotApi {
            http,
            base: format!("{}/bot{token}/", url.as_str().trim_end_matches('/')),
            token: token.to_owned(),
        })
    }

    /// The bot's username (to recognise `/command@username`).
    pub async fn bot_username(&self) -> Result<String, BotApiError> {
        let me = self.call("getMe", json!({}), CALL_TIMEOUT).await?;
        Ok(me["username"].as_str().unwrap_or_default().to_owned())
    }

    /// Removes a webhook left by another deployment: Telegram refuses getUpdates while one is
    /// set.
    pub async fn ensure_polling_mode(&self) -> Result<(), BotApiError> {
        let info = self.call("getWebhookInfo", json!({}), CALL_TIMEOUT).await?;
        let webhook = info["url"].as_str().unwrap_or_default();
        if !webhook.is_empty() {
            let host = url::Url::parse(webhook)
                .ok()
                .and_then(|url| url.host_str().map(str::to_owned))
                .unwrap_or_default();
            tracing::warn!(webhook = %host, "a webhook is set for this bot; deleting it to receive updates by polling");
            self.call("deleteWebhook", json!({}), CALL_TIMEOUT).await?;
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
        let mut params = json!({
            "timeout": timeout_secs,
            "allowed_updates": ["message", "callback_query"],
        });
        if let Some(offset) = offset {
            params["offset"] = json!(offset);
        }
        let wait = Duration::from_secs(u64::from(timeout_secs)) + CALL_TIMEOUT;
        let result = self.call("getUpdates", params, wait).await?;
        let Value::Array(items) = result else {
            return Err(unreadable("getUpdates", 200, "result is not a list"));
        };
        // One update teloxide cannot read must not block the others behind it. teloxide's
        // types borrow strings while parsing, so they are read from text, not from a Value.
        Ok(items
            .into_iter()
            .filter_map(
                |item| match serde_json::from_str::<Update>(&item.to_string()) {
                    Ok(update) => Some(update),
                    Err(error) => {
                        tracing::warn!(%error, "ignoring an update that cannot be read");
                        None
                    }
                },
            )
            .collect())
    }

    /// Sends an HTML message, optionally with buttons and as a reply; returns its id.
    pub async fn send_message(
        &self,
        chat_id: i64,
        html: &str,
        keyboard: &[Vec<Button>],
        reply_to: Option<i32>,
    ) -> Result<i32, BotApiError> {
        let mut params = json!({
            "chat_id": chat_id,
            "text": html,
            "parse_mode": "HTML",
            "link_preview_options": { "is_disabled": true },
        });
        if !keyboard.is_empty() {
            params["reply_markup"] = inline_keyboard(keyboard);
        }
        if let Some(message_id) = reply_to {
            params["reply_parameters"] =
                json!({ "message_id": message_id, "allow_sending_without_reply": true });
        }
        let message = self.call("sendMessage", params, CALL_TIMEOUT).await?;
        message["message_id"]
            .as_i64()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| unreadable("sendMessage", 200, "no message_id in the result"))
    }

    /// Replaces a message's text and keyboard (an empty keyboard removes the buttons).
    pub async fn edit_message(
        &self,
        chat_id: i64,
        message_id: i32,
        html: &str,
        keyboard: &[Vec<Button>],
    ) -> Result<EditOutcome, BotApiError> {
        let mut params = json!({
            "chat_id": chat_id,
            "message_id": message_id,
            "text": html,
            "parse_mode": "HTML",
            "link_preview_options": { "is_disabled": true },
        });
        if !keyboard.is_empty() {
            params["reply_markup"] = inline_keyboard(keyboard);
        }
        edit_outcome(self.call("editMessageText", params, CALL_TIMEOUT).await)
    }

    /// Removes a message's buttons and nothing else: answered "not modified" for a message
    /// without buttons, refused for a message that is not the bot's.
    pub async fn remove_buttons(
        &self,
        chat_id: i64,
        message_id: i32,
    ) -> Result<EditOutcome, BotApiError> {
        let params = json!({ "chat_id": chat_id, "message_id": message_id });
        edit_outcome(
            self.call("editMessageReplyMarkup", params, CALL_TIMEOUT)
                .await,
        )
    }

    /// Answers a callback query (the text pops up on the tapper's screen).
    pub async fn answer_callback(&self, callback_id: &str, text: &str) -> Result<(), BotApiError> {
        let params = json!({ "callback_query_id": callback_id, "text": text });
        self.call("answerCallbackQuery", params, CALL_TIMEOUT)
            .await?;
        Ok(())
    }

    /// One call: the `result` of a successful answer, or the error with everything needed to
    /// decide about it.
    async fn call(
        &self,
        method: &'static str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, BotApiError> {
        let response = self
            .http
            .post(format!("{}{method}", self.base))
            .timeout(timeout)
            .json(&params)
            .send()
            .await
            .map_err(|error| self.network_error(error))?;
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|error| self.network_error(error))?;
        let Ok(answer) = serde_json::from_slice::<Value>(&body) else {
            return Err(unreadable(method, status, "the body is not JSON"));
        };
        if answer["ok"].as_bool() == Some(true) && (200..300).contains(&status) {
            return Ok(answer["result"].clone());
        }
        // Telegram's error_code is the HTTP status; an error inside a 2xx keeps its code.
        let status = if status >= 400 {
            status
        } else {
            answer["error_code"]
                .as_u64()
                .and_then(|code| u16::try_from(code).ok())
                .unwrap_or(500)
        };
        Err(BotApiError::Api {
            method,
            status,
            description: answer["description"]
                .as_str()
                .unwrap_or("no description")
                .to_owned(),
            retry_after: answer["parameters"]["retry_after"]
                .as_u64()
                .map(Duration::from_secs),
        })
    }

    fn network_error(&self, error: reqwest::Error) -> BotApiError {
        BotApiError::Network(redacted_chain(&error.without_url(), &self.token))
    }
}

fn unreadable(method: &'static str, status: u16, reason: &str) -> BotApiError {
    BotApiError::Unreadable {
        method,
        status,
        reason: reason.to_owned(),
    }
}

fn edit_outcome(result: Result<Value, BotApiError>) -> Result<EditOutcome, BotApiError> {
    match result {
        Ok(_) => Ok(EditOutcome::Edited),
        Err(error) if error.is_not_modified() => Ok(EditOutcome::NotModified),
        Err(error) => Err(error),
    }
}

/// An error and its sources as one line, with the token removed: the Bot API puts the token
/// in the URL path.
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

fn inline_keyboard(rows: &[Vec<Button>]) -> Value {
    let rows: Vec<Vec<Value>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(
                    |button| json!({ "text": button.label, "callback_data": button.callback_data }),
                )
                .collect()
        })
        .collect();
    json!({ "inline_keyboard": rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, description: &str) -> BotApiError {
        BotApiError::Api {
            method: "editMessageText",
            status,
            description: description.to_owned(),
            retry_after: None,
        }
    }

    #[test]
    fn both_not_modified_wordings_are_recognised() {
        assert!(api(400, "Bad Request: message is not modified").is_not_modified());
        assert!(api(400, "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message").is_not_modified());
        assert!(!api(400, "Bad Request: message is too long").is_not_modified());
    }

    #[test]
    fn messages_that_cannot_be_edited_are_recognised() {
        assert!(api(400, "Bad Request: message can't be edited").is_cant_edit());
        assert!(api(400, "Bad Request: message to edit not found").is_cant_edit());
        assert!(!api(400, "Bad Request: chat not found").is_cant_edit());
    }

    #[test]
    fn every_5xx_and_429_is_retried_and_4xx_are_final() {
        assert!(api(502, "Bad Gateway").is_transient());
        assert!(api(500, "Internal Server Error: restart").is_transient());
        assert!(!api(400, "Bad Request: chat not found").is_transient());
        let flood = BotApiError::Api {
            method: "sendMessage",
            status: 429,
            description: "Too Many Requests: retry after 30".into(),
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(
            flood.verdict(),
            Verdict::Retry {
                after: Some(Duration::from_secs(30))
            }
        );
        assert!(unreadable("getMe", 504, "html").is_transient());
        assert!(BotApiError::Network("refused".into()).is_transient());
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
            BotApi::new("1:x", "not a url"),
            Err(BotApiError::InvalidApiUrl { .. })
        ));
    }
}
