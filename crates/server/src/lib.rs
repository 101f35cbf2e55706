//! The countersign approval server: SQLite or PostgreSQL store, event log and hub, gRPC services.

pub(crate) mod admin;
pub(crate) mod app;
pub(crate) mod audit;
pub mod auth;
pub(crate) mod caller;
pub mod config;
pub(crate) mod convert;
pub(crate) mod error;
pub mod integrity;
pub(crate) mod limits;
pub mod logging;
pub(crate) mod metrics;
pub mod receipts;
pub mod security;
pub(crate) mod service;
pub mod serving;
pub(crate) mod standards;
pub mod store;
pub(crate) mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use countersign_proto::v1::admin_service_server::AdminServiceServer;
use countersign_proto::v1::approval_service_server::ApprovalServiceServer;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tonic::service::interceptor::InterceptedService;
use tonic_health::server::HealthReporter;

use crate::admin::AdminApi;
use crate::app::App;
use crate::auth::Authenticator;
use crate::config::{Config, ConfigError, Database};
use crate::integrity::IntegrityError;
use crate::limits::MessageSizeStatusLayer;
use crate::metrics::{Metrics, RpcMetricsLayer};
use crate::receipts::{KeysError, ReceiptKeys};
use crate::security::Security;
use crate::service::ApprovalApi;
use crate::store::hub::Hub;
use crate::store::{now_millis, CommitObserver, Store, StoreError};

#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open the database: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error("cannot listen for metrics: {0}")]
    MetricsListen(std::io::Error),
    #[error("cannot listen on http.listen: {0}")]
    HttpListen(std::io::Error),
    #[error("the gRPC listener has no local address: {0}")]
    Listener(std::io::Error),
}

/// Serves the API on `listener` until `shutdown` completes, then ends watch streams and
/// long-polls and lets in-flight calls finish. Serves `/metrics` on `metrics.listen` and the
/// standards endpoints on `http.listen`, where set.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics_listener = metrics::bind(config.metrics.listen)
        .await
        .map_err(ServeError::MetricsListen)?;
    serve_with_metrics(config, listener, metrics_listener, shutdown).await
}

/// [`serve`], with the `/metrics` endpoint on `metrics_listener` (none: no metrics) instead
/// of the configured address.
pub async fn serve_with_metrics(
    config: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    config.validate()?;
    config.check_backup_dir()?;
    let listen = listener.local_addr().map_err(ServeError::Listener)?;
    let http_listener = metrics::bind(config.http.listen)
        .await
        .map_err(ServeError::HttpListen)?;
    let security = Arc::new(Security::from_config(&config, listen)?);
    let ciba_clients =
        standards::Clients::from_config(&config.http.clients, |v| std::env::var(v).ok())?;
    let tls = config.tls.as_ref().map(security::server_tls).transpose()?;
    let config = Arc::new(config);
    let hub = Hub::new(config.watch.buffer_events.max(1024));
    let metrics = metrics_listener.as_ref().map(|_| Arc::new(Metrics::new()));
    let observer = metrics
        .clone()
        .map(|metrics| metrics as Arc<dyn CommitObserver>);
    let keys = Arc::new(ReceiptKeys::load_or_create(
        &config.receipt_keys_dir(),
        config.receipts.ttl_seconds,
    )?);
    let store = Store::open(
        &config.database,
        &config.storage,
        hub.clone(),
        observer,
        Some(keys.clone()),
    )
    .await?;
    {
        store.check_integrity().await?;
    }

    // Approvals that expired while the server was down are expired before the first call.
    let expired = store.sweep_due(now_millis()).await?;
    if expired > 0 {
        tracing::info!(
            expired,
            "expired approvals whose deadline passed while the server was down"
        );
    }

    let (stop_tx, stop_rx) = signal::channel(false);
    let sweeper = tokio::spawn(app::sweep(store.clone(), config.clone(), stop_rx.clone()));
    let checkpoints = (config.receipts.checkpoint_interval_seconds > 0).then(|| {
        tokio::spawn(integrity::log_checkpoints(
            config.database.clone(),
            keys.clone(),
            Duration::from_secs(config.receipts.checkpoint_interval_seconds.into()),
            stop_rx.clone(),
        ))
    });
    let metrics_tasks = match metrics.clone().zip(metrics_listener) {
        Some((metrics, listener)) => {
            let head = store.log_bounds().await?.0;
            Some(spawn_metrics(
                metrics,
                store.clone(),
                keys.jwks(),
                &hub,
                head,
                listener,
                stop_rx.clone(),
            ))
        }
        None => None,
    };

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(health_reporter);
    health.storage_writable(true).await;
    let health_follower = tokio::spawn(follow_storage_health(store.writable(), health.clone()));
    // v1alpha beside v1: grpcurl, grpcio's reflection client and other older tools only
    // speak v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(countersign_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    // Health and reflection stay open; the countersign services need a token when any is
    // configured.
    let auth = Authenticator::new(security.tokens.clone());
    let app = Arc::new(App::new(
        store.clone(),
        hub,
        config.clone(),
        security.clone(),
        stop_rx,
    ));
    let standards_task = http_listener.map(|listener| {
        let ciba = Arc::new(standards::Ciba::new(
            ciba_clients,
            keys.clone(),
            config.http.poll_interval_seconds,
            config.receipts.ttl_seconds,
        ));
        spawn_standards(app.clone(), auth.clone(), &config, ciba, listener)
    });
    let api = ApprovalServiceServer::new(ApprovalApi::new(app.clone(), keys))
        .max_decoding_message_size(config.limits.max_message_bytes);
    let admin = AdminServiceServer::new(AdminApi::new(app))
        .max_decoding_message_size(config.limits.max_message_bytes);

    tracing::info!(listen = %listen, tls = tls.is_some(), database = %Database::of(&config.database), "countersign-server listening");
    let mut server =
        tonic::transport::Server::builder().http2_keepalive_interval(Some(Duration::from_secs(30)));
    if let Some(tls) = tls {
        server = server.tls_config(tls)?;
    }
    let connections = serving::Registry::new(&config.serving, metrics.clone());
    tracing::info!(
        max_connections = serving::connection_cap(&config.serving),
        "connection limit"
    );
    let incoming = serving::incoming(listener, connections.clone());
    let (draining_tx, draining) = tokio::sync::oneshot::channel::<()>();
    let serving = server
        .layer(serving::ActivityLayer)
        .layer(RpcMetricsLayer::new(metrics))
        .layer(MessageSizeStatusLayer)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(InterceptedService::new(api, auth.clone()))
        .add_service(InterceptedService::new(admin, auth))
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            tracing::info!(
                "shutting down: ending watch streams and waits, finishing calls in flight"
            );
            // A load balancer that checks health sends the next calls to another replica.
            health.drain().await;
            let _ = stop_tx.send(true);
            connections.shut_down();
            let _ = draining_tx.send(());
        });
    // A hard deadline: calls that outlive the grace period are dropped with their connections.
    let grace = Duration::from_secs(config.serving.shutdown_grace_seconds);
    let served = tokio::select! {
        served = serving => served,
        () = async {
            if draining.await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(grace_seconds = grace.as_secs(), "shutdown deadline passed; closing the connections still open");
            Ok(())
        }
    };
    sweeper.abort();
    if let Some(checkpoints) = checkpoints {
        checkpoints.abort();
    }
    health_follower.abort();
    for task in metrics_tasks.into_iter().flatten().chain(standards_task) {
        task.abort();
    }
    // Also after a failed serve: what was acknowledged goes into the database file.
    store.close().await;
    tracing::info!("the store is closed");
    served?;
    Ok(())
}

/// The services' health as load balancers see it: serving while storage takes writes, and
/// never again once a drain began (a storage recovery during the drain must not undo it).
#[derive(Clone)]
struct Health {
    reporter: HealthReporter,
    draining: Arc<tokio::sync::Mutex<bool>>,
}

impl Health {
    fn new(reporter: HealthReporter) -> Health {
        Health {
            reporter,
            draining: Arc::default(),
        }
    }

    async fn storage_writable(&self, writable: bool) {
        let draining = self.draining.lock().await;
        if !*draining {
            set_health(&self.reporter, writable).await;
        }
    }

    async fn drain(&self) {
        let mut draining = self.draining.lock().await;
        *draining = true;
        set_health(&self.reporter, false).await;
    }
}

async fn set_health(reporter: &HealthReporter, serving: bool) {
    if serving {
        reporter
            .set_serving::<ApprovalServiceServer<ApprovalApi>>()
            .await;
        reporter.set_serving::<AdminServiceServer<AdminApi>>().await;
    } else {
        reporter
            .set_not_serving::<ApprovalServiceServer<ApprovalApi>>()
            .await;
        reporter
            .set_not_serving::<AdminServiceServer<AdminApi>>()
            .await;
    }
}

/// The services are NOT_SERVING while the database refuses writes (e.g. its disk is full).
async fn follow_storage_health(mut writable: signal::Receiver<bool>, health: Health) {
    while writable.changed().await.is_ok() {
        let serving = *writable.borrow_and_update();
        health.storage_writable(serving).await;
    }
}

/// Starts the metrics endpoint and the follower of the event log (after `head`) that feeds it.
fn spawn_metrics(
    metrics: Arc<Metrics>,
    store: Store,
    jwks: String,
    hub: &Hub,
    head: i64,
    listener: TcpListener,
    stop: signal::Receiver<bool>,
) -> [tokio::task::JoinHandle<()>; 2] {
    let follower = tokio::spawn(metrics::follow_events(
        metrics.clone(),
        store.clone(),
        hub.subscribe(),
        head,
        stop.clone(),
    ));
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(listen = %address, "metrics endpoint listening");
    let endpoint = tokio::spawn(async move {
        if let Err(e) = metrics::serve_endpoint(metrics, store, jwks, listener, stop).await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    [follower, endpoint]
}

/// Starts the standards endpoints (`crate::standards`) on the `[http]` listener.
fn spawn_standards(
    app: Arc<App>,
    auth: Authenticator,
    config: &Config,
    ciba: Arc<standards::Ciba>,
    listener: TcpListener,
) -> tokio::task::JoinHandle<()> {
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let base_url = match &config.http.public_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => format!("http://{address}"),
    };
    let stop = app.shutdown();
    tracing::info!(listen = %address, base_url = %base_url, "standards endpoints listening");
    tokio::spawn(async move {
        if let Err(e) = standards::serve(app, auth, base_url, ciba, listener, stop).await {
            tracing::error!(error = %e, "the standards endpoints stopped");
        }
    })
}
