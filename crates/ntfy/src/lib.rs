//! countersign's ntfy worker.
//!
//! It watches the `ntfy` channel of a countersign server through the client SDK and publishes
//! each pending approval to its topics on an ntfy server (self-hosted or public, with an
//! access token) as a notification whose priority follows the risk, with three buttons:
//! Approve and Allow for session (`http` actions that decide at once) and Reject… (opens a
//! page that asks for a reason). The buttons decide through one-time decision links
//! (`countersign-links`, the webhook channel's links): a link decides once, expires with the
//! approval, and a forged or altered one decides nothing. With a reply topic (`replies`)
//! every button is an `http` action that publishes its link's token to that topic on the
//! same ntfy server, which the worker follows: no inbound port or public address. The notification is updated in
//! place (same sequence id) when the approval is decided, also elsewhere, expires or is
//! cancelled. It is a `Channel` of the shared worker runtime (`countersign_worker::runtime`),
//! which owns the loop: one lane per approval, retries honouring `Retry-After`, graceful
//! shutdown.
//!
//! [`run`] is the entry point of the `countersign-ntfy` binary, of tests, and of anything
//! that runs the worker in its own process.

pub mod api;
mod channel;
pub mod config;
mod error;
pub mod render;
pub mod replies;
pub mod shown;

use std::future::Future;
use std::pin::Pin;

use countersign_client::Client;
use countersign_links::pages::Pages;
use countersign_worker::runtime;

use crate::api::NtfyApi;
use crate::channel::NtfyChannel;
pub use crate::channel::{topic_fingerprint, CHANNEL};
use crate::config::DecisionPath;
pub use crate::config::Settings;
pub use crate::error::WorkerError;
use crate::shown::{Store, StoreError};

/// Runs the worker until `shutdown` completes (the publishes in flight are then finished,
/// within the grace period, and it returns `Ok`) or an error that retrying cannot fix occurs.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let store = Store::open(&settings.database_path()).await?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let api = NtfyApi::new(
        &settings.ntfy_url,
        settings.access_token.clone(),
        settings.request_timeout,
    )?;
    let form_key = store.links().form_key().await.map_err(StoreError::from)?;
    let pages = Pages::new(client.clone(), store.links().clone(), form_key, CHANNEL);
    let options = settings.runtime.options();
    tracing::info!(
        server = %settings.runtime.server.client.url,
        ntfy = %settings.ntfy_url,
        topics = settings.topics.len(),
        "ntfy worker started"
    );
    let decisions: Pin<Box<dyn Future<Output = Result<(), WorkerError>> + Send>> =
        match &settings.decisions {
            DecisionPath::ReplyTopic(reply) => {
                tracing::info!("the buttons decide through the reply topic (no inbound port)");
                let follow = replies::follow(
                    api.clone(),
                    reply.clone(),
                    store.clone(),
                    pages.clone(),
                    settings.runtime.retry,
                );
                Box::pin(async move {
                    follow.await;
                    Ok(())
                })
            }
            DecisionPath::PublicUrl(_) => {
                let listen = settings.listen;
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .map_err(|source| WorkerError::Listen {
                        addr: listen,
                        source,
                    })?;
                tracing::info!(%listen, "the buttons decide through the decision-link pages");
                let router = pages.clone().router();
                Box::pin(async move {
                    axum::serve(listener, router)
                        .await
                        .map_err(|source| WorkerError::Listen {
                            addr: listen,
                            source,
                        })
                })
            }
        };
    let channel = NtfyChannel::new(client.clone(), api, store, pages, settings);
    tokio::select! {
        result = runtime::run(client, channel, options, shutdown) => Ok(result?),
        result = decisions => result,
    }
}
