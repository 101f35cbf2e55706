//! The Discord REST calls the worker makes (API v10, `Authorization: Bot <token>`), each
//! bounded by the request timeout, and what a failure means for a retry: a 429's
//! `retry_after` (its body's, in seconds with a fraction, else the `Retry-After` header) is
//! honoured whether the limit was the route's bucket or global (`X-RateLimit-Global`); 5xx
//! and transport errors are retried; other 4xx are final.

use std::time::Duration;

use countersign_worker::retry::{Classify, Verdict};
use serde::Deserialize;
use serde_json::Value;

/// A failed REST call.
#[derive(Debug, thiserror::Error)]
pub enum DiscordError {
    #[error("Discord: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("Discord did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Discord answered {status}{}: {message}", if *.global { " (global rate limit)" } else { "" })]
    Refused {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
        global: bool,
    },
}

impl Classify for DiscordError {
    fn verdict(&self) -> Verdict {
        match self {
            DiscordError::Transport(_) | DiscordError::Timeout(_) => Verdict::Retry { after: None },
            DiscordError::Refused {
                status,
                retry_after,
                ..
            } => Verdict::of_http_status(*status, *retry_after),
        }
    }
}

/// Discord's error body (`{"message", "code"}`; a 429's also `retry_after`, `global`).
#[derive(Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    retry_after: Option<f64>,
    #[serde(default)]
    global: bool,
}

/// A message as Discord returns it: its id, and the `custom_id`s of its buttons.
#[derive(Deserialize)]
pub struct PostedMessage {
    pub id: String,
    #[serde(default)]
    components: Vec<Value>,
}

impl PostedMessage {
    fn custom_ids(&self) -> impl Iterator<Item = &str> {
        let rows = self.components.iter();
        let buttons = rows.flat_map(|row| row["components"].as_array().into_iter().flatten());
        buttons.filter_map(|button| button["custom_id"].as_str())
    }
}

/// Discord's REST API as the bot.
#[derive(Clone)]
pub struct DiscordApi {
    http: reqwest::Client,
    base: String,
    authorization: String,
    timeout: Duration,
}

impl DiscordApi {
    pub fn new(
        base: &str,
        bot_token: &str,
        timeout: Duration,
    ) -> Result<DiscordApi, reqwest::Error> {
        let http = reqwest::Client::builder()
            .user_agent(concat!(
                "DiscordBot (https://github.com/countersign, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()?;
        Ok(DiscordApi {
            http,
            base: base.trim_end_matches('/').to_owned(),
            authorization: format!("Bot {bot_token}"),
            timeout,
        })
    }

    /// Sends one request; the answer's JSON (`null` for 204).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DiscordError> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("Authorization", &self.authorization);
        if let Some(body) = body {
            request = request.json(body);
        }
        let send = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let header = |name: &str| {
                let value = response.headers().get(name)?.to_str().ok()?;
                Some(value.to_owned())
            };
            let global = header("x-ratelimit-global").is_some_and(|v| v == "true");
            let retry_header = header("retry-after").and_then(|v| v.parse::<f64>().ok());
            let bytes = response.bytes().await?;
            if (200..300).contains(&status) {
                return Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
            }
            let body: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_default();
            let seconds = body
                .retry_after
                .or(retry_header)
                .filter(|s| s.is_finite() && *s >= 0.0);
            Err(DiscordError::Refused {
                status,
                message: body.message,
                retry_after: seconds.map(Duration::from_secs_f64),
                global: global || body.global,
            })
        };
        tokio::time::timeout(self.timeout, send)
            .await
            .map_err(|_| DiscordError::Timeout(self.timeout))?
    }

    /// Posts a message in `channel`; its id.
    pub async fn post(&self, channel: &str, message: &Value) -> Result<String, DiscordError> {
        let path = format!("/channels/{channel}/messages");
        let answer = self
            .call(reqwest::Method::POST, &path, Some(message))
            .await?;
        let posted: PostedMessage = serde_json::from_value(answer).map_err(|_| unexpected())?;
        Ok(posted.id)
    }

    pub async fn edit(
        &self,
        channel: &str,
        message_id: &str,
        message: &Value,
    ) -> Result<(), DiscordError> {
        let path = format!("/channels/{channel}/messages/{message_id}");
        self.call(reqwest::Method::PATCH, &path, Some(message))
            .await?;
        Ok(())
    }

    /// The id of the approval's request message in `channel` posted after the snowflake
    /// `after` (found by its buttons, which name the approval), if Discord has one.
    pub async fn find(
        &self,
        channel: &str,
        after: u64,
        approval_id: &str,
    ) -> Result<Option<String>, DiscordError> {
        let path = format!("/channels/{channel}/messages?after={after}&limit=100");
        let answer = self.call(reqwest::Method::GET, &path, None).await?;
        let messages: Vec<PostedMessage> =
            serde_json::from_value(answer).map_err(|_| unexpected())?;
        let named = |id: &str| id.split(':').nth(2) == Some(approval_id);
        let found = messages.into_iter().find(|m| m.custom_ids().any(named));
        Ok(found.map(|message| message.id))
    }

    /// Answers an interaction (`POST /interactions/{id}/{token}/callback`).
    pub async fn respond(
        &self,
        interaction_id: &str,
        token: &str,
        response: &Value,
    ) -> Result<(), DiscordError> {
        let path = format!("/interactions/{interaction_id}/{token}/callback");
        self.call(reqwest::Method::POST, &path, Some(response))
            .await?;
        Ok(())
    }

    /// Sends a follow-up message of an answered interaction (`POST /webhooks/{application
    /// id}/{token}`).
    pub async fn follow_up(
        &self,
        application_id: &str,
        token: &str,
        message: &Value,
    ) -> Result<(), DiscordError> {
        let path = format!("/webhooks/{application_id}/{token}");
        self.call(reqwest::Method::POST, &path, Some(message))
            .await?;
        Ok(())
    }

    /// The bot's own user (`GET /users/@me`): whether the token works, and its name.
    pub async fn me(&self) -> Result<Value, DiscordError> {
        self.call(reqwest::Method::GET, "/users/@me", None).await
    }
}

fn unexpected() -> DiscordError {
    DiscordError::Refused {
        status: 200,
        message: "an answer without the expected fields".to_owned(),
        retry_after: None,
        global: false,
    }
}

/// The snowflake of a Unix time in milliseconds (for `after=`: messages posted since then).
pub fn snowflake_at(unix_ms: i64) -> u64 {
    const DISCORD_EPOCH_MS: i64 = 1_420_070_400_000;
    (unix_ms.saturating_sub(DISCORD_EPOCH_MS).max(0) as u64) << 22
}
