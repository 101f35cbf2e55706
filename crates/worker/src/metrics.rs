//! The runtime's health and Prometheus metrics, served on the worker's own address
//! (`[metrics] listen`, plain HTTP, no auth: keep it on a private interface), off when unset —
//! the same section and series style as the server's.
//!
//! - `GET /healthz`: `200` while the watch on the countersign server is connected, `503`
//!   (with the reason) while it is not — a worker that cannot see approvals shows none.
//! - `GET /metrics`, series prefixed `countersign_worker_`, labelled with the `channel`:
//!   - `watch_connected` (gauge, 0 or 1);
//!   - `events_total`: watch events received;
//!   - `shows_total{outcome}`: attempts to bring the platform in line with an approval, by
//!     `ok`, `retry` (failed for a reason that may pass) and `refused` (the platform's final
//!     word);
//!   - `retries_waiting` (gauge): approvals waiting for a retry;
//!   - `lanes_busy` (gauge): approvals with work in flight;
//!   - `cursor_seq` (gauge): the persisted watch cursor (every event up to it fully handled),
//!     for workers that keep one.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The figures read at scrape time rather than counted as they happen.
pub(crate) struct Gauges {
    pub connected: bool,
    pub lanes_busy: usize,
    pub retries_waiting: usize,
    pub cursor_seq: Option<u64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// How a show ended, as `shows_total` counts it.
#[derive(Clone, Copy)]
pub(crate) enum ShowOutcome {
    Ok,
    Retry,
    Refused,
}

/// The runtime's counters; cheap to clone (every clone counts into the same series).
#[derive(Clone)]
pub(crate) struct Counters {
    events: Counter,
    shows: Family<OutcomeLabels, Counter>,
}

impl Counters {
    pub fn event(&self) {
        self.events.inc();
    }

    pub fn show(&self, outcome: ShowOutcome) {
        let outcome = match outcome {
            ShowOutcome::Ok => "ok",
            ShowOutcome::Retry => "retry",
            ShowOutcome::Refused => "refused",
        };
        self.shows.get_or_create(&OutcomeLabels { outcome }).inc();
    }
}

/// The registry of one runtime, labelled with its channel.
pub(crate) struct Metrics {
    registry: Registry,
    counters: Counters,
    connected: Gauge,
    lanes_busy: Gauge,
    retries_waiting: Gauge,
    cursor_seq: Gauge,
}

impl Metrics {
    pub fn new(channel: &str) -> Metrics {
        let mut registry = Registry::with_prefix_and_labels(
            "countersign_worker",
            [("channel".into(), channel.to_owned().into())].into_iter(),
        );
        let counters = Counters {
            events: Counter::default(),
            shows: Family::default(),
        };
        let (connected, lanes_busy, retries_waiting, cursor_seq) = Default::default();
        let gauges: [(&str, &str, &Gauge); 4] = [
            (
                "watch_connected",
                "Whether the watch on the countersign server is connected (1) or not (0)",
                &connected,
            ),
            (
                "retries_waiting",
                "Approvals waiting for a retry",
                &retries_waiting,
            ),
            ("lanes_busy", "Approvals with work in flight", &lanes_busy),
            (
                "cursor_seq",
                "The persisted watch cursor: every event up to it was fully handled",
                &cursor_seq,
            ),
        ];
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.clone());
        }
        registry.register("events", "Watch events received", counters.events.clone());
        registry.register(
            "shows",
            "Attempts to bring the platform in line with an approval, by outcome",
            counters.shows.clone(),
        );
        Metrics {
            registry,
            counters,
            connected,
            lanes_busy,
            retries_waiting,
            cursor_seq,
        }
    }

    pub fn counters(&self) -> Counters {
        self.counters.clone()
    }

    fn encode(&self, gauges: &Gauges) -> Result<String, std::fmt::Error> {
        self.connected.set(i64::from(gauges.connected));
        self.lanes_busy
            .set(saturating_i64(gauges.lanes_busy as u64));
        self.retries_waiting
            .set(saturating_i64(gauges.retries_waiting as u64));
        if let Some(seq) = gauges.cursor_seq {
            self.cursor_seq.set(saturating_i64(seq));
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The listener could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for metrics on {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

type ReadGauges = Arc<dyn Fn() -> Gauges + Send + Sync>;

#[derive(Clone)]
struct Served {
    metrics: Arc<Metrics>,
    gauges: ReadGauges,
}

/// Opens `listen` for `/healthz` and `/metrics`.
pub(crate) async fn bind(listen: SocketAddr) -> Result<TcpListener, ListenError> {
    TcpListener::bind(listen)
        .await
        .map_err(|source| ListenError {
            addr: listen,
            source,
        })
}

/// Serves `/healthz` and `/metrics` on `listener` until the future is dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    gauges: ReadGauges,
) -> Result<(), ListenError> {
    let addr = listener.local_addr().map_err(|source| ListenError {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    tracing::info!(%addr, "serving /healthz and /metrics");
    let router = Router::new()
        .route("/healthz", get(health))
        .route("/metrics", get(scrape))
        .with_state(Served { metrics, gauges });
    axum::serve(listener, router)
        .await
        .map_err(|source| ListenError { addr, source })
}

async fn health(State(served): State<Served>) -> Response {
    if (served.gauges)().connected {
        (StatusCode::OK, "ok: watching the countersign server\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the countersign server; reconnecting (see the worker's log)\n",
        )
            .into_response()
    }
}

async fn scrape(State(served): State<Served>) -> Response {
    match served.metrics.encode(&(served.gauges)()) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
