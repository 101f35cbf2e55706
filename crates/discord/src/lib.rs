//! countersign's Discord worker.
//!
//! It watches the `discord` channel of a countersign server through the client SDK and posts
//! each pending approval to its Discord channels as a message with Approve, Reject… (a modal
//! asks for the reason) and Allow for session buttons; the message is edited on every change,
//! also when the approval is decided elsewhere, expires or is cancelled. Taps arrive over the
//! Gateway (twilight-gateway: no public URL) or, as an option, as Ed25519-signed POSTs to the
//! Interactions Endpoint URL the worker serves (`http.rs`); a Discord user decides as the approver whose
//! `identities` list their Discord user id. It is a `Channel` of the shared worker runtime
//! (`countersign_worker::runtime`), which owns the loop.
//!
//! [`run`] is the entry point of the `countersign-discord` binary, of `countersign up`, and of
//! the tests.

pub mod api;
mod channel;
pub mod config;
mod error;
pub mod http;
pub mod inbound;
pub mod render;
pub mod shown;

use std::future::Future;
use std::sync::Arc;

use countersign_client::Client;
use countersign_worker::runtime;
use twilight_gateway::Intents;

use crate::api::DiscordApi;
use crate::channel::DiscordChannel;
pub use crate::channel::CHANNEL;
pub use crate::config::Settings;
use crate::config::Taps;
pub use crate::error::WorkerError;
use crate::inbound::Inbound;
use crate::shown::Store;
/// The Gateway client, for `countersign setup discord` (pairing by a direct message).
pub use twilight_gateway;

/// Runs the worker until `shutdown` completes (the posts in flight are then finished, within
/// the grace period, and it returns `Ok`) or an error that retrying cannot fix occurs.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let store = Store::open(&settings.state_dir)?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let api = DiscordApi::new(
        &settings.api_url,
        &settings.bot_token,
        settings.request_timeout,
    )?;
    let inbound = Arc::new(Inbound {
        client: client.clone(),
        api: api.clone(),
        store: store.clone(),
    });
    tracing::info!(
        server = %settings.runtime.server.client.url,
        discord = %settings.api_url,
        channels = settings.channels.len(),
        "discord worker started"
    );
    let taps = async {
        match settings.taps.clone() {
            // Interactions reach a bot over the Gateway whatever its intents.
            Taps::Gateway => {
                let gateway = settings.gateway_url.as_deref();
                let shard = inbound::shard(&settings.bot_token, gateway, Intents::empty());
                inbound.listen(shard).await
            }
            Taps::Http { listen, public_key } => http::serve(listen, inbound, *public_key)
                .await
                .map_err(|source| WorkerError::Listen {
                    addr: listen,
                    source,
                }),
        }
    };
    let options = settings.runtime.options();
    let channel = DiscordChannel {
        client: client.clone(),
        api,
        store,
        settings: settings.clone(),
    };
    tokio::select! {
        result = runtime::run(client, channel, options, shutdown) => result.map_err(WorkerError::from),
        result = taps => result,
    }
}
