//! What `countersign setup slack` needs of Slack beyond the worker's calls: the app manifest
//! to create the app from, and the pairing of an approver by a "This is me" button.
//!
//! Pairing posts a message with one button in the chosen channel; its value is a random
//! one-time nonce. The first person to tap that button on that message (over Socket Mode, the
//! same listener the worker uses) is the approver: their Slack user id comes from Slack, so
//! nobody types it. A tap of any other button or message pairs nobody. The message is then
//! updated to name who paired, without the button, so that nobody else can tap it.

use std::sync::Arc;
use std::time::Duration;

use slack_morphism::prelude::*;
use tokio::sync::mpsc;

use crate::api::{SlackApi, SlackError};
use crate::render::escape;
use crate::{connect_socket_mode, Interactions, WorkerError};

/// The action id of the pairing button.
pub const PAIR: &str = "countersign_pair";

/// The app manifest (YAML) for "Create New App → From an app manifest": a bot with the
/// scopes the worker and `setup slack` use, Socket Mode and interactivity on. No bot events
/// are needed: approvers reach countersign only by buttons and modals (interactivity).
pub fn manifest(app_name: &str) -> String {
    format!(
        "display_information:
  name: {app_name}
  description: Approve or reject what AI agents want to do
features:
  bot_user:
    display_name: {app_name}
    always_online: true
oauth_config:
  scopes:
    bot:
      - chat:write         # post and update approval requests
      - channels:history   # find a request message again after a restart
      - groups:history
      - channels:read      # list the channels the bot is in, find one by name
      - groups:read
      - channels:join      # join a public channel by name (setup slack)
settings:
  interactivity:
    is_enabled: true
  socket_mode_enabled: true
  org_deploy_enabled: false
  token_rotation_enabled: false
"
    )
}

/// Who tapped "This is me".
#[derive(Clone, Debug)]
pub struct Paired {
    pub user_id: String,
    /// Their name as Slack gave it with the tap (display only).
    pub name: String,
}

/// Why pairing paired nobody.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error("cannot post the pairing message: {0}")]
    Post(#[source] SlackError),
    #[error("cannot connect Socket Mode: {0}")]
    SocketMode(#[from] WorkerError),
    #[error("nobody tapped \"This is me\" within {0:?}")]
    NoTap(Duration),
}

/// Posts the "This is me" message in `channel` and waits (at most `wait`) for its button to
/// be tapped over Socket Mode (connected with `app_token` to the Slack at `api_url`); the
/// message then says who paired (or, when nobody did, that it expired) and has no button.
pub async fn pair(
    api: &SlackApi,
    api_url: &str,
    app_token: &str,
    channel: &str,
    wait: Duration,
) -> Result<Paired, PairError> {
    let (taps, mut tapped) = mpsc::unbounded_channel();
    let interactions: Interactions = Arc::new(move |event| {
        let _ = taps.send(event);
        Box::pin(async {})
    });
    // Connected before the button exists: a tap is never missed.
    let socket = connect_socket_mode(api_url, app_token, interactions).await?;
    let nonce = nonce();
    let waited = async {
        let ts = api
            .post(channel, pairing_message(&nonce))
            .await
            .map_err(PairError::Post)?;
        let paired = tokio::time::timeout(wait, async {
            while let Some(event) = tapped.recv().await {
                if let Some(paired) = pairing_tap(event, channel, &ts, &nonce) {
                    return Some(paired);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let after = match &paired {
            Some(paired) => format!(
                "Paired: <@{}> approves countersign requests posted here.",
                escape(&paired.user_id)
            ),
            None => "This pairing expired; run countersign setup slack again.".to_owned(),
        };
        if let Err(error) = api.update(channel, &ts, text_message(after)).await {
            tracing::warn!(%error, "cannot update the pairing message");
        }
        paired.ok_or(PairError::NoTap(wait))
    }
    .await;
    socket.shutdown().await;
    waited
}

/// The user who tapped the pairing button `nonce` on the message `ts` in `channel`, if
/// `event` is that tap.
fn pairing_tap(
    event: SlackInteractionEvent,
    channel: &str,
    ts: &str,
    nonce: &str,
) -> Option<Paired> {
    let SlackInteractionEvent::BlockActions(event) = event else {
        return None;
    };
    let SlackInteractionActionContainer::Message(container) = &event.container else {
        return None;
    };
    let tapped_channel = container
        .channel_id
        .clone()
        .or(event.channel.as_ref().map(|channel| channel.id.clone()))?;
    if tapped_channel.0 != channel || container.message_ts.0 != ts {
        return None;
    }
    let pressed = event
        .actions
        .iter()
        .flatten()
        .any(|action| action.action_id.0 == PAIR && action.value.as_deref() == Some(nonce));
    let user = event.user.filter(|_| pressed)?;
    Some(Paired {
        name: user
            .name
            .clone()
            .or(user.username.clone())
            .unwrap_or_else(|| user.id.0.clone()),
        user_id: user.id.0,
    })
}

fn pairing_message(nonce: &str) -> SlackMessageContent {
    let text =
        "*countersign setup*: the person who approves countersign requests taps *This is me*.";
    let button = SlackBlockButtonElement::new(PAIR.into(), pt!("This is me"))
        .with_value(nonce.to_owned())
        .with_style(SlackBlockButtonStyle::Primary);
    SlackMessageContent::new()
        .with_text(text.to_owned())
        .with_blocks(vec![
            SlackSectionBlock::new().with_text(md!(text)).into(),
            SlackActionsBlock::new(vec![button.into()]).into(),
        ])
}

fn text_message(text: String) -> SlackMessageContent {
    SlackMessageContent::new()
        .with_text(text.clone())
        .with_blocks(vec![SlackSectionBlock::new().with_text(md!(text)).into()])
}

/// 128 random bits, hex.
fn nonce() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
