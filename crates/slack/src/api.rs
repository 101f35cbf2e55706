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
    /// Slack's error code (`invalid_auth`, `channel_not_found`…) when it answered `ok: false`.
    pub fn code(&self) -> Option<&str> {
        match self {
            SlackError::Api(SlackClientError::ApiError(error)) => Some(&error.code),
            _ => None,
        }
    }

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

/// A channel, by id and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub id: String,
    pub name: String,
    pub private: bool,
}

impl From<SlackChannelInfo> for Conversation {
    fn from(info: SlackChannelInfo) -> Conversation {
        Conversation {
            name: info.name.unwrap_or_else(|| info.id.0.clone()),
            private: info.flags.is_private == Some(true),
            id: info.id.0,
        }
    }
}

/// Who a token belongs to (`auth.test`).
#[derive(Clone, Debug)]
pub struct TokenOwner {
    pub team: String,
    pub user: Option<String>,
    pub user_id: String,
    pub bot_id: Option<String>,
}

/// The channel kinds a bot posts approvals in.
fn channel_types() -> Vec<SlackConversationType> {
    vec![
        SlackConversationType::Public,
        SlackConversationType::Private,
    ]
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

    /// Who the token belongs to (`auth.test`).
    pub async fn owner(&self) -> Result<TokenOwner, SlackError> {
        let session = self.client.open_session(&self.token);
        let response = self.call(session.auth_test()).await?;
        Ok(TokenOwner {
            team: response.team,
            user: response.user,
            user_id: response.user_id.0,
            bot_id: response.bot_id.map(|id| id.0),
        })
    }

    /// With an app-level token: opens a Socket Mode connection URL (`apps.connections.open`),
    /// which proves the token may connect and that Socket Mode is on.
    pub async fn open_connection(&self) -> Result<(), SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiAppsConnectionOpenRequest::new();
        self.call(session.apps_connections_open(&request)).await?;
        Ok(())
    }

    /// The channels (public and private, not archived) the bot is in (`users.conversations`,
    /// every page).
    pub async fn member_channels(&self) -> Result<Vec<Conversation>, SlackError> {
        let mut channels = Vec::new();
        let mut cursor: Option<SlackCursorId> = None;
        loop {
            let session = self.client.open_session(&self.token);
            let request = SlackApiUsersConversationsRequest::new()
                .with_types(channel_types())
                .with_exclude_archived(true)
                .with_limit(200)
                .opt_cursor(cursor.take());
            let response = self.call(session.users_conversations(&request)).await?;
            channels.extend(response.channels.into_iter().map(Conversation::from));
            match next_cursor(response.response_metadata) {
                Some(next) => cursor = Some(next),
                None => return Ok(channels),
            }
        }
    }

    /// The public channel named `name` (`conversations.list`, every page until found).
    pub async fn public_channel(&self, name: &str) -> Result<Option<Conversation>, SlackError> {
        let mut cursor: Option<SlackCursorId> = None;
        loop {
            let session = self.client.open_session(&self.token);
            let request = SlackApiConversationsListRequest::new()
                .with_types(vec![SlackConversationType::Public])
                .with_exclude_archived(true)
                .with_limit(200)
                .opt_cursor(cursor.take());
            let response = self.call(session.conversations_list(&request)).await?;
            let found = response
                .channels
                .into_iter()
                .map(Conversation::from)
                .find(|channel| channel.name == name);
            if found.is_some() {
                return Ok(found);
            }
            match next_cursor(response.response_metadata) {
                Some(next) => cursor = Some(next),
                None => return Ok(None),
            }
        }
    }

    /// The bot joins the public channel `id` (`conversations.join`).
    pub async fn join(&self, id: &str) -> Result<Conversation, SlackError> {
        let session = self.client.open_session(&self.token);
        let request = SlackApiConversationsJoinRequest::new(id.into());
        let response = self.call(session.conversations_join(&request)).await?;
        Ok(response.channel.into())
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

/// The cursor of the next page, if there is one (Slack says "none" with an empty one).
fn next_cursor(metadata: Option<SlackResponseMetadata>) -> Option<SlackCursorId> {
    metadata
        .and_then(|metadata| metadata.next_cursor)
        .filter(|cursor| !cursor.0.is_empty())
}
