//! The countersign approval server: SQLite store, event log and hub, gRPC services.

pub mod config;
pub mod convert;
pub mod error;
pub mod hub;
pub mod service;
pub mod store;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use countersign_proto::v1::approval_service_server::ApprovalServiceServer;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio_stream::wrappers::TcpListenerStream;

use crate::config::{Config, ConfigError};
use crate::hub::Hub;
use crate::service::ApprovalApi;
use crate::store::{now_millis, Store, StoreError};

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open the database: {0}")]
    Store(#[from] StoreError),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves the API on `listener` until `shutdown` completes, then ends watch streams and
/// long-polls and lets in-flight calls finish.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    config.validate()?;
    let config = Arc::new(config);
    let hub = Hub::new(config.watch.buffer_events.max(1024));
    let store = Store::open(&config.database, &config.storage, hub.clone(), None).await?;

    // Approvals that expired while the server was down are expired before the first call.
    let expired = store.expire_due(now_millis()).await?;
    if expired > 0 {
        tracing::info!(
            expired,
            "expired approvals whose deadline passed while the server was down"
        );
    }

    let (stop_tx, stop_rx) = signal::channel(false);
    let sweeper = tokio::spawn(sweep(store.clone(), config.clone(), stop_rx.clone()));

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ApprovalServiceServer<ApprovalApi>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(countersign_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let api = ApprovalServiceServer::new(ApprovalApi::new(store, hub, config.clone(), stop_rx))
        .max_decoding_message_size(config.limits.max_message_bytes);

    tracing::info!(listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), database = %config.database.display(), "countersign-server listening");
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(api)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            shutdown.await;
            tracing::info!(
                "shutting down: ending watch streams and waits, finishing calls in flight"
            );
            let _ = stop_tx.send(true);
        })
        .await?;
    sweeper.abort();
    Ok(())
}

/// Expires approvals past their deadline and prunes events past retention.
async fn sweep(store: Store, config: Arc<Config>, mut stop: signal::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(config.approvals.sweep_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retention_ms =
        i64::try_from(config.watch.retention_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let now = now_millis();
        if let Err(e) = store.expire_due(now).await {
            tracing::warn!(error = %e, "expiry sweep failed; retrying at the next tick");
        }
        if retention_ms > 0 {
            if let Err(e) = store.prune_events(now - retention_ms, now).await {
                tracing::warn!(error = %e, "event pruning failed; retrying at the next tick");
            }
        }
    }
}
