//! Prometheus metrics, served on their own address (`[metrics] listen`), off when unset.
//!
//! Series (all prefixed `countersign_`):
//! - `pending_approvals` (gauge): approvals waiting for a decision, counted at scrape time;
//! - `requests_total{outcome}`: approvals created, by how they started: `pending` (waiting
//!   for people), `approved` or `rejected` (decided at once by policy or a session grant).
//!   Refused requests show up in `rpc_requests_total{method="…/RequestApproval", code}`;
//! - `decisions_total{verdict, channel}`: decisions applied to a pending approval;
//! - `time_to_decision_seconds` (histogram): from request to a resolution by people;
//! - `watch_streams` (gauge): open `WatchApprovals` streams;
//! - `policy_observed_total{decision}`: in observe mode, what the rules would have done with
//!   each request (`allow`, `deny`, `require`, `none`), and
//!   `policy_observed_disagreements_total{decision}`: the people's decisions that went the
//!   other way (a rejection of a call a rule would allow, an approval of one it would deny);
//! - `rpc_requests_total{method, code}`: finished gRPC calls by method and status code;
//! - `commit_batch_size` and `commit_latency_seconds` (histograms): the store's group commits.
//!
//! Nothing here touches the services: the domain series follow the hub (the committed event
//! log), the RPC series come from a tower layer around the gRPC server, and the commit series
//! from the store writer's [`CommitObserver`].

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use countersign_core::{Approval, EventKind, ResolvedBy, State as ApprovalState, Verdict};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use crate::app::observe::OBSERVED_LABEL;
use crate::store::{CommitObserver, Store, StoredEvent};

/// The path of the watch method, whose calls are the open streams.
const WATCH_PATH: &str = "/countersign.v1.ApprovalService/WatchApprovals";
/// Events read per page when the hub subscription fell behind and the log fills the gap.
const CATCH_UP_PAGE: u32 = 1000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    verdict: &'static str,
    channel: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObservedLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

/// Every series of one server.
pub struct Metrics {
    registry: Registry,
    pending: Gauge,
    requests: Family<OutcomeLabels, Counter>,
    decisions: Family<DecisionLabels, Counter>,
    policy_observed: Family<ObservedLabels, Counter>,
    policy_disagreements: Family<ObservedLabels, Counter>,
    time_to_decision: Histogram,
    watch_streams: Gauge,
    rpcs: Family<RpcLabels, Counter>,
    commit_batch_size: Histogram,
    commit_latency: Histogram,
    connections_open: Gauge,
    connections_closed_by_server: Counter,
    accept_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("countersign");
        let pending = Gauge::default();
        registry.register(
            "pending_approvals",
            "Approvals waiting for a decision",
            pending.clone(),
        );
        let requests = Family::<OutcomeLabels, Counter>::default();
        // Every outcome is a series from the start, so that rates work from the first scrape.
        for outcome in ["pending", "approved", "rejected"] {
            let _ = requests.get_or_create(&OutcomeLabels { outcome });
        }
        registry.register(
            "requests",
            "Approvals created, by how they started: pending, or approved/rejected at once by policy or a session grant",
            requests.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Decisions applied to a pending approval, by verdict and channel",
            decisions.clone(),
        );
        let policy_observed = Family::<ObservedLabels, Counter>::default();
        registry.register(
            "policy_observed",
            "In observe mode, what the rules would have done with each request",
            policy_observed.clone(),
        );
        let policy_disagreements = Family::<ObservedLabels, Counter>::default();
        registry.register(
            "policy_observed_disagreements",
            "In observe mode, people's decisions against what the rules would have done",
            policy_disagreements.clone(),
        );
        // From half a second to a day.
        let time_to_decision = Histogram::new([
            0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
            21600.0, 86400.0,
        ]);
        registry.register_with_unit(
            "time_to_decision",
            "Time from the request to its resolution by people",
            Unit::Seconds,
            time_to_decision.clone(),
        );
        let watch_streams = Gauge::default();
        registry.register(
            "watch_streams",
            "Open WatchApprovals streams",
            watch_streams.clone(),
        );
        let rpcs = Family::<RpcLabels, Counter>::default();
        registry.register(
            "rpc_requests",
            "Finished gRPC calls by method and status code",
            rpcs.clone(),
        );
        // 1, 2, 4, … 1024 changes per commit.
        let commit_batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register(
            "commit_batch_size",
            "Changes committed together in one transaction",
            commit_batch_size.clone(),
        );
        // 50 µs to about 1.6 s.
        let commit_latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register_with_unit(
            "commit_latency",
            "Time to apply and commit one group of changes, fsync included",
            Unit::Seconds,
            commit_latency.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "Open gRPC connections",
            connections_open.clone(),
        );
        let connections_closed_by_server = Counter::default();
        registry.register(
            "connections_closed_idle",
            "Connections the server closed because they finished no handshake in time, stayed idle too long, or were idle while the server was full",
            connections_closed_by_server.clone(),
        );
        let accept_failures = Counter::default();
        registry.register(
            "accept_failures",
            "Failed accepts for want of file descriptors or memory (each followed by a backoff)",
            accept_failures.clone(),
        );
        Metrics {
            registry,
            pending,
            requests,
            decisions,
            policy_observed,
            policy_disagreements,
            time_to_decision,
            watch_streams,
            rpcs,
            commit_batch_size,
            commit_latency,
            connections_open,
            connections_closed_by_server,
            accept_failures,
        }
    }

    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    pub fn connections_evicted(&self, count: u64) {
        self.connections_closed_by_server.inc_by(count);
    }

    pub fn accept_failed(&self) {
        self.accept_failures.inc();
    }

    /// The OpenMetrics text of every series.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// Counts one committed event of the log.
    fn observe(&self, event: &StoredEvent) {
        let approval = &event.approval;
        match event.kind {
            EventKind::Requested => {
                let outcome = match approval.state {
                    ApprovalState::Pending => "pending",
                    ApprovalState::Rejected => "rejected",
                    _ => "approved",
                };
                self.requests
                    .get_or_create(&OutcomeLabels { outcome })
                    .inc();
                if let Some(decision) = observed_decision(approval) {
                    self.policy_observed
                        .get_or_create(&ObservedLabels { decision })
                        .inc();
                }
            }
            EventKind::DecisionRecorded | EventKind::Resolved => {
                if let Some(decision) = &event.decision {
                    let labels = DecisionLabels {
                        verdict: verdict_label(decision.verdict),
                        channel: decision.decider.channel.clone(),
                    };
                    self.decisions.get_or_create(&labels).inc();
                }
                let by_people = approval
                    .resolution
                    .as_ref()
                    .is_some_and(|r| r.resolved_by == ResolvedBy::Decision);
                if event.kind == EventKind::Resolved && by_people {
                    let waited_ms = event.at.saturating_sub(approval.created_at).max(0);
                    self.time_to_decision.observe(waited_ms as f64 / 1000.0);
                    let disagreed = match observed_decision(approval) {
                        Some("allow") => approval.state == ApprovalState::Rejected,
                        Some("deny") => approval.state == ApprovalState::Approved,
                        _ => false,
                    };
                    if let (true, Some(decision)) = (disagreed, observed_decision(approval)) {
                        self.policy_disagreements
                            .get_or_create(&ObservedLabels { decision })
                            .inc();
                    }
                }
            }
            _ => {}
        }
    }

    fn record_rpc(&self, method: &str, code: tonic::Code) {
        // Unknown paths all answer UNIMPLEMENTED; one label keeps scanners from adding series.
        let method = if code == tonic::Code::Unimplemented {
            "unknown"
        } else {
            method.trim_start_matches('/')
        };
        let labels = RpcLabels {
            method: method.to_string(),
            code: format!("{code:?}"),
        };
        self.rpcs.get_or_create(&labels).inc();
    }
}

/// What the rules would have done with `approval`, as observe mode recorded it; `None` when
/// it was not observed (or the label holds no known value).
fn observed_decision(approval: &Approval) -> Option<&'static str> {
    let observed = approval.labels.get(OBSERVED_LABEL)?;
    ["allow", "deny", "require", "none"]
        .into_iter()
        .find(|known| known == observed)
}

fn verdict_label(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approve => "approve",
        Verdict::Reject => "reject",
    }
}

impl CommitObserver for Metrics {
    fn committed(&self, batch_size: usize, latency: Duration) {
        self.commit_batch_size.observe(batch_size as f64);
        self.commit_latency.observe(latency.as_secs_f64());
    }
}

/// Counts the events the hub publishes after `examined` (the log's head, read before the
/// server takes its first call: a head read later would pass over the first calls' events,
/// already in `live`). A subscription that falls behind the hub's ring reads the events it
/// missed from the log, so no count is lost.
pub async fn follow_events(
    metrics: Arc<Metrics>,
    store: Store,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
    mut examined: i64,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let received = tokio::select! {
            _ = stop.changed() => return,
            received = live.recv() => received,
        };
        match received {
            Ok(event) => {
                if event.seq > examined {
                    metrics.observe(&event);
                    examined = event.seq;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::debug!(missed, "metrics fell behind the hub; reading the log");
                loop {
                    match store.events_after(examined, CATCH_UP_PAGE).await {
                        Ok(page) if page.is_empty() => break,
                        Ok(page) => {
                            for event in &page {
                                metrics.observe(event);
                                examined = event.seq;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics: cannot read missed events; some counts are low");
                            break;
                        }
                    }
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    store: Store,
    /// The receipt keys' JWKS document.
    jwks: Arc<str>,
}

/// Serves `GET /metrics`, and the receipt keys as `GET /.well-known/jwks.json`, on
/// `listener` until `stop` turns true.
pub async fn serve_endpoint(
    metrics: Arc<Metrics>,
    store: Store,
    jwks: String,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/metrics", get(scrape))
        .route("/.well-known/jwks.json", get(jwks_document))
        .with_state(Endpoint {
            metrics,
            store,
            jwks: jwks.into(),
        });
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })
        .await
}

async fn jwks_document(State(endpoint): State<Endpoint>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/jwk-set+json")],
        endpoint.jwks.to_string(),
    )
        .into_response()
}

async fn scrape(State(endpoint): State<Endpoint>) -> Response {
    match endpoint.store.count_pending().await {
        Ok(pending) => {
            endpoint.metrics.pending.set(pending);
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics: cannot count pending approvals");
            return (StatusCode::SERVICE_UNAVAILABLE, "cannot read the store\n").into_response();
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        endpoint.metrics.encode(),
    )
        .into_response()
}

/// Binds the metrics address from the configuration, if any.
pub async fn bind(listen: Option<SocketAddr>) -> std::io::Result<Option<TcpListener>> {
    match listen {
        Some(addr) => TcpListener::bind(addr).await.map(Some),
        None => Ok(None),
    }
}

/// A tower layer that counts finished gRPC calls by method and status code, and open watch
/// streams. Without metrics it passes calls through untouched.
#[derive(Clone)]
pub struct RpcMetricsLayer {
    metrics: Option<Arc<Metrics>>,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Option<Arc<Metrics>>) -> Self {
        RpcMetricsLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: Option<Arc<Metrics>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for RpcMetricsService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = http::Response<ObservedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this call; the fresh one waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let call = self.metrics.clone().map(|metrics| {
            let path = request.uri().path();
            let stream = (path == WATCH_PATH).then(|| OpenStream::new(&metrics.watch_streams));
            CallRecord {
                metrics,
                method: path.to_string(),
                code: None,
                _stream: stream,
            }
        });
        Box::pin(async move {
            let response = inner.call(request).await?;
            let mut call = call;
            // An error answered at once travels in the headers (trailers-only response).
            if let Some(record) = call.as_mut() {
                if let Some(code) = grpc_status(response.headers()) {
                    record.code = Some(code);
                }
            }
            Ok(response.map(|inner| ObservedBody { inner, call }))
        })
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    headers
        .get("grpc-status")
        .map(|value| tonic::Code::from_bytes(value.as_bytes()))
}

/// One call in flight; counted when it is dropped, with the status it ended with (a call
/// dropped before its status was sent was cancelled by the client).
struct CallRecord {
    metrics: Arc<Metrics>,
    method: String,
    code: Option<tonic::Code>,
    _stream: Option<OpenStream>,
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        let code = self.code.unwrap_or(tonic::Code::Cancelled);
        self.metrics.record_rpc(&self.method, code);
    }
}

/// Holds the open-streams gauge up while a watch call lives.
struct OpenStream(Gauge);

impl OpenStream {
    fn new(gauge: &Gauge) -> OpenStream {
        gauge.inc();
        OpenStream(gauge.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pin_project_lite::pin_project! {
    /// A response body that reads the call's status from the trailers as they pass.
    pub struct ObservedBody<B> {
        #[pin]
        inner: B,
        call: Option<CallRecord>,
    }
}

impl<B: http_body::Body> http_body::Body for ObservedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                    if let Some(mut record) = this.call.take() {
                        record.code = Some(code);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut record) = this.call.take() {
                    record.code.get_or_insert(tonic::Code::Internal);
                }
            }
            // The end of the body: a trailers-only response has its status from the headers.
            Poll::Ready(None) => {
                if let Some(mut record) = this.call.take() {
                    record.code.get_or_insert(tonic::Code::Unknown);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
