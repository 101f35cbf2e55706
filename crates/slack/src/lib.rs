//! countersign's Slack worker.
//!
//! It watches the `slack` channel of a countersign server through the client SDK and posts
//! each pending approval to its Slack channels as a Block Kit message with Approve, Reject…
//! (a modal asks for the reason) and Allow for session buttons; the message is updated on
//! every change, also when the approval is decided elsewhere, expires or is cancelled. Taps
//! arrive over Socket Mode (slack-morphism's listener: no public URL); a Slack user decides
//! as the approver whose `identities` list their Slack user id. It is a `Channel` of the
//! shared worker runtime (`countersign_worker::runtime`), which owns the loop.
//!
//! [`run`] is the entry point of the `countersign-slack` binary, of tests, and of anything
//! that runs the worker in its own process.

pub mod api;
mod channel;
pub mod config;
mod error;
pub mod http;
mod inbound;
pub mod render;
pub mod setup;
pub mod shown;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use countersign_client::Client;
use countersign_worker::runtime;
use slack_morphism::prelude::*;

use crate::api::SlackApi;
use crate::channel::SlackChannel;
pub use crate::channel::CHANNEL;
pub use crate::config::Settings;
use crate::config::Taps;
pub use crate::error::WorkerError;
use crate::inbound::Inbound;
use crate::shown::Store;

/// Runs the worker until `shutdown` completes (the posts in flight are then finished, within
/// the grace period, and it returns `Ok`) or an error that retrying cannot fix occurs.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let store = Store::open(&settings.state_dir)?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let slack = Arc::new(api::client(&settings.api_url)?);
    let api = SlackApi::new(slack.clone(), &settings.bot_token, settings.request_timeout);
    let inbound = Arc::new(Inbound::new(
        client.clone(),
        api.clone(),
        store.clone(),
        settings.clone(),
    ));
    let socket = match &settings.taps {
        Taps::Socket { app_token } => {
            let inbound = inbound.clone();
            let handler: Interactions = Arc::new(move |event| {
                let inbound = inbound.clone();
                Box::pin(async move { inbound.handle(event).await })
            });
            Some(connect_socket_mode(&settings.api_url, app_token, handler).await?)
        }
        Taps::Http { .. } => None,
    };
    let http = async {
        match &settings.taps {
            Taps::Http {
                listen,
                signing_secret,
            } => http::serve(*listen, inbound, signing_secret)
                .await
                .map_err(|source| WorkerError::Listen {
                    addr: *listen,
                    source,
                }),
            Taps::Socket { .. } => std::future::pending().await,
        }
    };
    tracing::info!(
        server = %settings.runtime.server.client.url,
        slack = %settings.api_url,
        channels = settings.channels.len(),
        "slack worker started"
    );
    let options = settings.runtime.options();
    let channel = SlackChannel::new(client.clone(), api, store, settings.clone());
    let result = tokio::select! {
        result = runtime::run(client, channel, options, shutdown) => result.map_err(WorkerError::from),
        result = http => result,
    };
    if let Some(socket) = socket {
        socket.shutdown().await;
    }
    result
}

/// What to do with each interaction (a tap, a modal's submission) Socket Mode delivers; its
/// envelope is acknowledged once the returned future completes.
pub type Interactions =
    Arc<dyn Fn(SlackInteractionEvent) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A running Socket Mode connection; `shutdown` closes it.
pub type SocketMode = SlackClientSocketModeListener<SlackClientHyperHttpsConnector>;

/// Connects Socket Mode to the Slack at `api_url` with the app-level token; each interaction
/// is handed to `interactions` as it arrives (the worker's taps, `setup slack`'s pairing).
pub async fn connect_socket_mode(
    api_url: &str,
    app_token: &str,
    interactions: Interactions,
) -> Result<SocketMode, WorkerError> {
    let slack = Arc::new(api::socket_mode_client(api_url)?);
    let environment =
        Arc::new(SlackClientEventsListenerEnvironment::new(slack).with_user_state(interactions));
    let callbacks = SlackSocketModeListenerCallbacks::new().with_interaction_events(on_interaction);
    // One connection: every envelope arrives once (Slack spreads them over connections).
    let config = SlackClientSocketModeConfig::new().with_max_connections_count(1);
    let socket = SlackClientSocketModeListener::new(&config, environment, callbacks);
    socket
        .listen_for(&SlackApiToken::new(app_token.to_owned().into()))
        .await?;
    socket.start().await;
    Ok(socket)
}

/// Socket Mode's callback: the envelope is acknowledged when this returns (always `Ok`: a
/// failure is answered to the user, and a redelivery would not fix it).
async fn on_interaction(
    event: SlackInteractionEvent,
    _client: Arc<api::Client>,
    state: SlackClientEventsUserState,
) -> UserCallbackResult<()> {
    let interactions = state.read().await.get_user_state::<Interactions>().cloned();
    if let Some(interactions) = interactions {
        interactions(event).await;
    }
    Ok(())
}
