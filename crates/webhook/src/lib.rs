//! countersign's webhook worker.
//!
//! It watches the `webhook` channel of a countersign server through the client SDK and
//! delivers each approval's events (`approval.requested`, `approval.resolved`) to the
//! configured HTTP endpoints, signed as Standard Webhooks specifies (`webhook-id`,
//! `webhook-timestamp`, `webhook-signature`, rotatable `whsec_` secrets). Deliveries are
//! durable (SQLite in the state directory), retried with backoff for hours on what may pass,
//! at-least-once with a stable webhook-id, and end as dead letters the `dead-letters` command
//! lists and re-queues. Request events carry one-time decision links served by the worker's
//! own small HTTP endpoint: a confirmation page first, then `Decide` as the link's approver.
//! It is a `Channel` of the shared worker runtime (`countersign_worker::runtime`), which owns
//! the watch (a snapshot at every start, then reconciling against the queue), one lane per
//! approval and graceful shutdown; the deliveries use its retry verdicts and backoff
//! honouring Retry-After.

pub mod channel;
pub mod config;
mod error;
pub mod event;
pub mod signature;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use countersign_client::Client;
use countersign_links::pages::Pages;
use countersign_worker::lanes::Lanes;
use countersign_worker::runtime;

pub use crate::channel::CHANNEL;
use crate::channel::{Deliveries, Queue};
pub use crate::config::Settings;
pub use crate::error::WorkerError;
use crate::store::{Store, StoreError};

/// Opens the worker's state database (also for the `dead-letters` and `revoke-links`
/// commands).
pub async fn open_store(settings: &Settings) -> Result<Store, StoreError> {
    Store::open(&settings.database_path()).await
}

/// Runs the worker until `shutdown` completes (the deliveries in flight are then finished,
/// within the grace period) or an error that retrying cannot fix occurs.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let store = open_store(&settings).await?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let form_key = store.links().form_key().await.map_err(StoreError::from)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| WorkerError::Listen {
            addr: settings.listen,
            source,
        })?;
    let pages = Pages::new(client.clone(), store.links().clone(), form_key, CHANNEL).router();
    let lanes = Lanes::new();
    // The lanes' jobs hold the deliveries; dropping this future (a kill in tests) stops them.
    let _stop_lanes = lanes.abort_on_drop();
    let grace = settings.runtime.shutdown_grace;
    tracing::info!(
        server = %settings.runtime.server.client.url,
        endpoints = settings.endpoints.len(),
        listen = %settings.listen,
        "webhook worker started"
    );
    let options = settings.runtime.options();
    let deliveries = Arc::new(Deliveries::new(store, settings, lanes.clone())?);
    let serve = async {
        axum::serve(listener, pages)
            .await
            .map_err(|source| WorkerError::Listen {
                addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })
    };
    let queue = Queue(deliveries.clone());
    // One grace period for the whole stop: the deliveries get what the runtime left of it.
    let asked_to_stop = std::sync::OnceLock::new();
    let shutdown = async {
        shutdown.await;
        let _ = asked_to_stop.set(tokio::time::Instant::now());
    };
    tokio::select! {
        result = runtime::run(client, queue, options, shutdown) => {
            result?;
            let left = asked_to_stop
                .get()
                .map_or(grace, |asked| grace.saturating_sub(asked.elapsed()));
            tracing::info!(in_flight = lanes.busy(), "shutting down; finishing the deliveries in flight");
            lanes.shutdown(left).await;
            Ok(())
        }
        result = deliveries.dispatch() => result,
        result = serve => result,
    }
}
