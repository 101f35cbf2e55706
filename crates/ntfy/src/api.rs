//! The ntfy calls the worker makes: publish a message as JSON (`POST /`), read a topic's
//! cached messages (`GET /{topic}/json?poll=1`) and follow a topic's JSON stream
//! (`GET /{topic}/json?since=…`: the cached messages after `since`, then each new one as it
//! comes, with `open` and `keepalive` events between). The access token goes in `Authorization: Bearer`
//! and never into a log. Failures are classified by the runtime's rules (transport errors,
//! 408, 429 and 5xx may pass; ntfy's `Retry-After` is kept).

use std::time::Duration;

use countersign_worker::retry::{Classify, Verdict};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde::{Deserialize, Serialize};

/// A message to publish, as ntfy's JSON publishing takes it.
#[derive(Clone, Debug, Serialize)]
pub struct Publish {
    pub topic: String,
    /// Messages with the same sequence id are one notification: a later one updates it.
    pub sequence_id: String,
    pub title: String,
    pub message: String,
    /// 1 (min) to 5 (max).
    pub priority: u8,
    pub tags: Vec<String>,
    pub actions: Vec<Action>,
}

/// An action button (`view` opens `url`; `http` sends the request itself).
#[derive(Clone, Debug, Serialize)]
pub struct Action {
    pub action: &'static str,
    pub label: &'static str,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "header_map")]
    pub headers: Vec<(&'static str, &'static str)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Dismiss the notification once the action succeeded.
    pub clear: bool,
}

fn header_map<S: serde::Serializer>(
    headers: &[(&'static str, &'static str)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(headers.iter().copied())
}

/// A cached message, as far as the worker reads it.
#[derive(Debug, Deserialize)]
struct CachedMessage {
    #[serde(default)]
    event: String,
    #[serde(default)]
    sequence_id: Option<String>,
}

/// Why an ntfy call failed.
#[derive(Debug, thiserror::Error)]
pub enum NtfyError {
    #[error("ntfy answered {status}: {message}")]
    Status {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("ntfy unreachable: {0}")]
    Transport(String),
}

impl Classify for NtfyError {
    fn verdict(&self) -> Verdict {
        match self {
            NtfyError::Status {
                status,
                retry_after,
                ..
            } => Verdict::of_http_status(*status, *retry_after),
            NtfyError::Transport(_) => Verdict::Retry { after: None },
        }
    }
}

/// One event of a topic's JSON stream: `open`, `keepalive`, `message` or `poll_request`.
#[derive(Debug, Deserialize)]
pub struct StreamEvent {
    /// A message's id is what `since=` takes to read on after it.
    pub id: String,
    pub event: String,
    #[serde(default)]
    pub message: String,
}

/// How long a stream may stay silent: ntfy sends a keepalive every 45 s by default
/// (`keepalive-interval`); a stream silent for longer is taken for dead and opened again.
const STREAM_SILENCE_LIMIT: Duration = Duration::from_secs(120);

/// An open JSON stream of one topic.
pub struct Subscription {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Subscription {
    /// The next event; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, NtfyError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<StreamEvent>(&line) {
                    Ok(event) => return Ok(Some(event)),
                    Err(error) => {
                        tracing::debug!(%error, "skipping a stream line that is no ntfy event");
                        continue;
                    }
                }
            }
            let chunk = tokio::time::timeout(STREAM_SILENCE_LIMIT, self.response.chunk())
                .await
                .map_err(|_| {
                    NtfyError::Transport(format!(
                        "the stream was silent for {}s (no keepalive)",
                        STREAM_SILENCE_LIMIT.as_secs()
                    ))
                })?
                .map_err(|error| NtfyError::Transport(error.without_url().to_string()))?;
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => return Ok(None),
            }
        }
    }
}

/// The ntfy server of one worker.
#[derive(Clone)]
pub struct NtfyApi {
    http: reqwest::Client,
    /// Without an overall timeout: a stream stays open for as long as it lasts.
    streaming: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl NtfyApi {
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<NtfyApi, NtfyError> {
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(timeout)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("countersign-ntfy/", env!("CARGO_PKG_VERSION")))
        };
        let built = |client: reqwest::Result<reqwest::Client>| {
            client.map_err(|error| NtfyError::Transport(error.to_string()))
        };
        let http = built(builder().timeout(timeout).build())?;
        let streaming = built(builder().build())?;
        Ok(NtfyApi {
            http,
            streaming,
            base: base.to_owned(),
            token,
        })
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<String, NtfyError> {
        let response = self.answered(request).await?;
        response
            .text()
            .await
            .map_err(|error| NtfyError::Transport(error.without_url().to_string()))
    }

    /// Sends `request`; a response of 2xx, or the error ntfy's answer says.
    async fn answered(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, NtfyError> {
        let response = self
            .authorized(request)
            .send()
            .await
            .map_err(|error| NtfyError::Transport(error.without_url().to_string()))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response
            .text()
            .await
            .map_err(|error| NtfyError::Transport(error.without_url().to_string()))?;
        // ntfy answers {"code":42901,"http":429,"error":"limit reached: ..."}; a proxy may
        // answer anything.
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|json| json["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("a non-JSON answer of {} bytes", text.len()));
        Err(NtfyError::Status {
            status,
            message,
            retry_after,
        })
    }

    /// Publishes `message` (a new notification, or an update of the one with its sequence id).
    pub async fn publish(&self, message: &Publish) -> Result<(), NtfyError> {
        let body =
            serde_json::to_vec(message).map_err(|error| NtfyError::Transport(error.to_string()))?;
        let request = self
            .http
            .post(format!("{}/", self.base))
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        self.send(request).await.map(|_| ())
    }

    /// Opens `topic`'s JSON stream from after `since` (a message id, a Unix time, or `all`).
    pub async fn subscribe(&self, topic: &str, since: &str) -> Result<Subscription, NtfyError> {
        let request = self
            .streaming
            .get(format!("{}/{topic}/json", self.base))
            .query(&[("since", since)]);
        let response = self.answered(request).await?;
        Ok(Subscription {
            response,
            buffer: Vec::new(),
        })
    }

    /// Whether `topic`'s cache holds a message of `sequence_id` published at or after
    /// `since_secs` (Unix time): finds a publish whose answer a crash lost.
    pub async fn has_message(
        &self,
        topic: &str,
        sequence_id: &str,
        since_secs: i64,
    ) -> Result<bool, NtfyError> {
        let request = self
            .http
            .get(format!("{}/{topic}/json", self.base))
            .query(&[("poll", "1"), ("since", &since_secs.to_string())]);
        let text = self.send(request).await?;
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<CachedMessage>(line).ok())
            .any(|message| {
                message.event == "message" && message.sequence_id.as_deref() == Some(sequence_id)
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_serialize_as_ntfy_reads_them() {
        let action = Action {
            action: "http",
            label: "Approve",
            url: "https://a.example/decide/t".into(),
            method: Some("POST"),
            headers: vec![("Content-Type", "application/x-www-form-urlencoded")],
            body: Some("form_token=x".into()),
            clear: true,
        };
        let json = serde_json::to_value(&action).unwrap();
        assert_eq!(
            json["headers"]["Content-Type"],
            "application/x-www-form-urlencoded"
        );
        assert_eq!(json["clear"], true);
        let view = Action {
            action: "view",
            label: "Reject…",
            url: "https://a.example/decide/u".into(),
            method: None,
            headers: Vec::new(),
            body: None,
            clear: false,
        };
        let json = serde_json::to_value(&view).unwrap();
        assert!(json.get("headers").is_none() && json.get("method").is_none());
    }

    #[test]
    fn failures_are_classified_and_keep_retry_after() {
        let limited = NtfyError::Status {
            status: 429,
            message: "limit reached: too many requests".into(),
            retry_after: Some(Duration::from_secs(3)),
        };
        assert_eq!(
            limited.verdict(),
            Verdict::Retry {
                after: Some(Duration::from_secs(3))
            }
        );
        let refused = NtfyError::Status {
            status: 403,
            message: "forbidden".into(),
            retry_after: None,
        };
        assert_eq!(refused.verdict(), Verdict::Final);
        assert!(NtfyError::Transport("reset".into())
            .verdict()
            .is_retryable());
    }
}
