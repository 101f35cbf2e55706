//! The Slack Web API calls the worker makes, through slack-morphism's client, each bounded
//! by the request timeout, and what a failure means for a retry.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use countersign_worker::retry::{Classify, Verdict};
use slack_morphism::errors::SlackClientError;
use slack_morphism::prelude::*;

use crate::render::METADATA_EVENT;

/// The client type: slack-morphism over hyper with rustls (HTTPS, and plain HTTP for a
/// loopback fake).
pub type Client = SlackClient<SlackClientHyperHttpsConnector>;

/// A failed Web API call.
#[derive(Debug, thiserror::Error)]
pub enum SlackError {
    #[error("Slack: {0}")]
    Api(#[from] SlackClientError),
    #[error("Slack did not answer within {0:?}")]
    Timeout(Duration),
}

/// Slack's error codes that say "try again later" with HTTP 200.
const TRANSIENT_CODES: [&str; 5] = [
    "ratelimited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

/// Slack's error codes that refuse a message for its content (too long, too many blocks, a
/// block it does not take): the same message is refused again, a smaller one may pass.
const CONTENT_CODES: [&str; 4] = [
    "invalid_blocks",
    "invalid_blocks_format",
    "msg_too_long",
    "msg_blocks_too_long",
];

impl SlackError {
    /// Whether Slack refused the message for its content.
    pub fn is_content_refused(&self) -> bool {
        matches!(self, SlackError::Api(SlackClientError::ApiError(error)) if CONTENT_CODES.contains(&error.code.as_str()))
    }
}

impl Classify for SlackError {
    fn verdict(&self) -> Verdict {
        match self {
            SlackError::Timeout(_) => Verdict::Retry { after: None },
            SlackError::Api(SlackClientError::RateLimitError(error)) => Verdict::Retry {
                after: error.retry_after,
            },
            SlackError::Api(SlackClientError::HttpError(error)) => {
                Verdict::of_http_status(error.status_code.as_u16(), None)
            }
            SlackError::Api(SlackClientError::ApiError(error))
                if TRANSIENT_CODES.contains(&error.code.as_str()) =>
            {
                Verdict::Retry { after: None }
            }
            SlackError::Api(
                SlackClientError::HttpProtocolError(_)
                | SlackClientError::EndOfStream(_)
                | SlackClientError::SystemError(_),
            ) => Verdict::Retry { after: None },
            SlackError::Api(_) => Verdict::Final,
        }
    }
}

/// The Web API as the bot.
#[derive(Clone)]
pub struct SlackApi {
    client: Arc<Client>,
    token: SlackApiToken,
    timeout: Duration,
}

/// A client for `api_url` (`https://slack.com/api`, or a fake's).
pub fn client(api_url: &str) -> std::io::Result<Client> {
    Ok(SlackClient::new(connector(api_url)?))
}

fn connector(api_url: &str) -> std::io::Result<SlackClientHyperHttpsConnector> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build();
    Ok(SlackClientHyperConnector::from(https).with_slack_api_url(api_url))
}

/// How many times in a row Socket Mode's `apps.connections.open` is tried again after a 429
/// (each after its `Retry-After`) before slack-morphism's own reconnect pause takes over.
const CONNECT_RATE_LIMIT_RETRIES: usize = 20;

/// The client Socket Mode connects with: a 429 from `apps.connections.open` is tried again
/// once its `Retry-After` has passed, instead of after slack-morphism's fixed 30 s reconnect
/// pause (during which taps would go unheard). It adds no throttling of its own: no global,
/// workspace or method limit is configured, so the only pause is Slack's `Retry-After`.
pub fn socket_mode_client(api_url: &str) -> std::io::Result<Client> {
    let rate_control =
        SlackApiRateControlConfig::new().with_max_retries(CONNECT_RATE_LIMIT_RETRIES);
    Ok(SlackClient::new(
        connector(api_url)?.with_rate_control(rate_control),
    ))
}

impl SlackApi {
    pub fn new(client: Arc<Client>, bot_token: &str, timeout: Duration) -> SlackApi {
        SlackApi {
            client,
            token: SlackApiToken::new(bot_token.to_owned().into()),
            timeout,
        }
    }

    async fn call<T>(&self, call: impl Future<Output = ClientResult<T>>) -> Result<T, SlackError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(SlackError::Timeout(self.timeout)),
        }
    }

    /// Posts a message; its `ts`.
    pub async fn post(
        &self,
        channel: &str,
        content: SlackMessageContent,
    ) -> Result<String, SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiChatPostMessageRequest::new(channel.into(), content);
        let response = self.call(session.chat_post_message(&request)).await?;
        Ok(response.ts.0)
    }

    pub async fn update(
        &self,
        channel: &str,
        ts: &str,
        content: SlackMessageContent,
    ) -> Result<(), SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiChatUpdateRequest::new(channel.into(), content, ts.into());
        self.call(session.chat_update(&request)).await?;
        Ok(())
    }

    /// The `ts` of the approval's request message in `channel` posted since `oldest_secs`
    /// (found by the metadata every request message carries), if Slack has one.
    pub async fn find(
        &self,
        channel: &str,
        oldest_secs: i64,
        approval_id: &str,
    ) -> Result<Option<String>, SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiConversationsHistoryRequest::new()
            .with_channel(channel.into())
            .with_oldest(format!("{oldest_secs}.000000").into())
            .with_include_all_metadata(true)
            .with_limit(200);
        let response = self.call(session.conversations_history(&request)).await?;
        Ok(response
            .messages
            .into_iter()
            .find(|message| {
                message.content.metadata.as_ref().is_some_and(|metadata| {
                    metadata.event_type == METADATA_EVENT
                        && metadata
                            .event_payload
                            .as_ref()
                            .and_then(|payload| payload.get("approval_id"))
                            .is_some_and(|id| id == approval_id)
                })
            })
            .map(|message| message.origin.ts.0))
    }

    pub async fn open_view(&self, trigger_id: &str, view: SlackView) -> Result<(), SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiViewsOpenRequest::new(trigger_id.into(), view);
        self.call(session.views_open(&request)).await?;
        Ok(())
    }

    /// A message only `user` sees.
    pub async fn tell(&self, channel: &str, user: &str, text: &str) -> Result<(), SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiChatPostEphemeralRequest::new(
            channel.into(),
            user.into(),
            SlackMessageContent::new().with_text(text.to_owned()),
        );
        self.call(session.chat_post_ephemeral(&request)).await?;
        Ok(())
    }
}
