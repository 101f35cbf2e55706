//! The deliveries: the runtime (`countersign_worker::runtime`) hands each approval's state to
//! [`Queue`], which turns it into the event it calls for, a row in the store per endpoint;
//! each due row is POSTed to its endpoint in its approval's lane, signed, retried with
//! backoff on what may pass (transport errors, timeouts, 408, 429, 5xx; never before a
//! Retry-After) until the endpoint answers 2xx, refuses finally (other 4xx) or the retry
//! window is over; then it is a dead letter. Every event is delivered, not only the newest
//! state, so the rows, not the runtime's per-approval retries, carry the delivery attempts.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use countersign_client::pb;
use countersign_worker::approval::route_targets;
use countersign_worker::channel::Channel;
use countersign_worker::lanes::Lanes;
use countersign_worker::retry::{Backoff, Classify, Verdict};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};

use crate::config::{Endpoint, Settings};
use crate::error::WorkerError;
use crate::event::{self, REQUESTED, RESOLVED};
use crate::signature::signature_header;
use crate::store::{now_ms, Delivery, NewDelivery, Store, StoreError};

/// The channel name this worker serves.
pub const CHANNEL: &str = "webhook";

/// How often the queue is looked at even when nothing woke the dispatcher (a dead letter put
/// back by the `dead-letters retry` command).
const QUEUE_POLL: Duration = Duration::from_millis(500);

/// The webhook channel as the runtime drives it: showing an approval is queueing the event
/// its state calls for (a webhook-id already queued is not queued again).
pub struct Queue(pub Arc<Deliveries>);

impl Channel for Queue {
    type Error = StoreError;

    fn name(&self) -> &str {
        CHANNEL
    }

    async fn show(&self, approval: &pb::Approval) -> Result<(), StoreError> {
        self.0.queue(approval).await
    }

    /// Approvals this worker sent a request for and whose resolution event is not queued:
    /// the ones resolved while it was away, however long, once no longer pending.
    async fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let endpoints: Vec<&str> = self
            .0
            .settings
            .endpoints
            .iter()
            .map(|endpoint| endpoint.name.as_str())
            .collect();
        self.0.store.awaiting_resolution(&endpoints).await
    }
}

/// The state database may come back (a locked or full disk); until the event is queued, the
/// runtime keeps the approval on its retry schedule.
impl Classify for StoreError {
    fn verdict(&self) -> Verdict {
        Verdict::Retry { after: None }
    }
}

/// A failed attempt.
#[derive(Debug)]
struct AttemptError {
    verdict: Verdict,
    message: String,
}

pub struct Deliveries {
    store: Store,
    settings: Settings,
    http: reqwest::Client,
    lanes: Lanes,
    backoff: Backoff,
    in_flight: Mutex<HashSet<i64>>,
    wake: tokio::sync::Notify,
}

impl Deliveries {
    pub fn new(store: Store, settings: Settings, lanes: Lanes) -> Result<Deliveries, WorkerError> {
        let http = http_client(settings.request_timeout)
            .map_err(|error| WorkerError::Http(error.to_string()))?;
        Ok(Deliveries {
            backoff: settings.runtime.retry,
            store,
            settings,
            http,
            lanes,
            in_flight: Mutex::new(HashSet::new()),
            wake: tokio::sync::Notify::new(),
        })
    }

    fn in_flight(&self) -> MutexGuard<'_, HashSet<i64>> {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues the event the approval's state calls for, once per endpoint.
    async fn queue(&self, approval: &pb::Approval) -> Result<(), StoreError> {
        let resolved = event::is_resolved(approval);
        for endpoint in self.endpoints_of(approval) {
            let (event_type, body, links) = if resolved {
                (RESOLVED, event::resolved(approval), Vec::new())
            } else {
                let (body, links) = event::requested(approval, endpoint, &self.settings.public_url);
                (REQUESTED, body, links)
            };
            let webhook_id = event::webhook_id(&approval.id, event_type);
            let added = self
                .store
                .add(NewDelivery {
                    endpoint: &endpoint.name,
                    webhook_id: &webhook_id,
                    approval_id: &approval.id,
                    event_type,
                    body: &body,
                    links,
                })
                .await?;
            if added {
                tracing::info!(endpoint = %endpoint.name, webhook_id, "event queued");
                self.wake.notify_one();
            }
        }
        Ok(())
    }

    /// The endpoints an approval goes to: each `webhook` route's target (an endpoint name),
    /// the default endpoints for an empty target or an approval without routes.
    fn endpoints_of(&self, approval: &pb::Approval) -> Vec<&Endpoint> {
        let mut endpoints: Vec<&Endpoint> = Vec::new();
        for target in route_targets(approval, CHANNEL) {
            let names: Vec<&str> = if target.is_empty() {
                self.settings
                    .default_endpoints
                    .iter()
                    .map(String::as_str)
                    .collect()
            } else {
                vec![target]
            };
            for name in names {
                match self.settings.endpoint(name) {
                    Some(endpoint) if !endpoints.iter().any(|e| e.name == name) => {
                        endpoints.push(endpoint)
                    }
                    Some(_) => {}
                    None => {
                        tracing::warn!(approval_id = %approval.id, "ignoring a webhook route whose target is not a configured endpoint")
                    }
                }
            }
        }
        endpoints
    }

    /// Hands each due delivery to its approval's lane, as long as the worker runs.
    pub async fn dispatch(self: &Arc<Self>) -> Result<(), WorkerError> {
        loop {
            let woken = self.wake.notified();
            for delivery in self.store.due(100).await? {
                if !self.in_flight().insert(delivery.seq) {
                    continue;
                }
                let deliveries = self.clone();
                let key = delivery.approval_id.clone();
                self.lanes.push(&key, async move {
                    let seq = delivery.seq;
                    if let Err(error) = deliveries.attempt(delivery).await {
                        tracing::error!(%error, "cannot record a delivery attempt; it is tried again");
                    }
                    deliveries.in_flight().remove(&seq);
                    deliveries.wake.notify_one();
                });
            }
            // A row due already is in flight or waits behind one: the end of an attempt
            // wakes this loop.
            let pause = match self.store.next_due_ms().await? {
                Some(due) if due > now_ms() => Duration::from_millis((due - now_ms()) as u64),
                _ => QUEUE_POLL,
            };
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(pause.min(QUEUE_POLL)) => {}
            }
        }
    }

    /// One attempt of one delivery, and its outcome recorded. `queued` is the row as the
    /// dispatcher read it; an attempt that ended after that read (and before the row was
    /// marked in flight) may have delivered, failed or rescheduled it, so the attempt reads
    /// it again and goes on only while it is still pending and due.
    async fn attempt(&self, queued: Delivery) -> Result<(), StoreError> {
        let Some(delivery) = self.store.due_delivery(queued.seq).await? else {
            return Ok(());
        };
        let Some(endpoint) = self.settings.endpoint(&delivery.endpoint) else {
            tracing::warn!(endpoint = %delivery.endpoint, webhook_id = %delivery.webhook_id, "the endpoint is no longer configured; dead letter");
            self.store
                .failed(&delivery, "the endpoint is no longer configured", None)
                .await?;
            return Ok(());
        };
        match self.post(endpoint, &delivery).await {
            Ok(status) => {
                tracing::info!(endpoint = %endpoint.name, webhook_id = %delivery.webhook_id, status, "delivered");
                if !self.store.delivered(&delivery).await? {
                    tracing::warn!(endpoint = %endpoint.name, webhook_id = %delivery.webhook_id, "the delivery changed while it was sent; its record stands");
                }
                Ok(())
            }
            Err(failure) => {
                let failures = u32::try_from(delivery.attempts + 1).unwrap_or(u32::MAX);
                let retry_in = match failure.verdict {
                    Verdict::Retry { after } => {
                        let wait = self.backoff.wait(failures, after);
                        let window_ends = delivery.window_start_ms
                            + self.settings.give_up_after.as_millis() as i64;
                        (now_ms() + wait.as_millis() as i64 <= window_ends).then_some(wait)
                    }
                    Verdict::Final => None,
                };
                match retry_in {
                    Some(wait) => {
                        tracing::warn!(endpoint = %endpoint.name, webhook_id = %delivery.webhook_id, failures, retry_in_ms = wait.as_millis() as u64, error = %failure.message, "delivery failed; retrying")
                    }
                    None => {
                        tracing::error!(endpoint = %endpoint.name, webhook_id = %delivery.webhook_id, failures, error = %failure.message, "delivery failed for good; dead letter")
                    }
                }
                if !self
                    .store
                    .failed(&delivery, &failure.message, retry_in)
                    .await?
                {
                    tracing::warn!(endpoint = %endpoint.name, webhook_id = %delivery.webhook_id, "the delivery changed while it was sent; its record stands");
                }
                Ok(())
            }
        }
    }

    /// POSTs the event, signed now; the status on 2xx.
    async fn post(&self, endpoint: &Endpoint, delivery: &Delivery) -> Result<u16, AttemptError> {
        post_signed(&self.http, endpoint, &delivery.webhook_id, &delivery.body).await
    }
}

/// An HTTP client as deliveries use: `timeout` per attempt, no redirects.
fn http_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("countersign-webhook/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// POSTs one event to `endpoint` once, signed now, with no retry and nothing stored (a
/// notice: `countersign notify`); the status on 2xx, else what went wrong.
pub async fn send_once(
    endpoint: &Endpoint,
    webhook_id: &str,
    body: &str,
    timeout: Duration,
) -> Result<u16, String> {
    let http = http_client(timeout).map_err(|error| error.to_string())?;
    post_signed(&http, endpoint, webhook_id, body)
        .await
        .map_err(|error| error.message)
}

/// POSTs `body` as the event `webhook_id`, signed now; the status on 2xx.
async fn post_signed(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    webhook_id: &str,
    body: &str,
) -> Result<u16, AttemptError> {
    let timestamp = now_ms() / 1000;
    let signature = signature_header(&endpoint.secrets, webhook_id, timestamp, body);
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in [
        ("webhook-id", webhook_id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ] {
        let value = HeaderValue::from_str(&value).map_err(|error| AttemptError {
            verdict: Verdict::Final,
            message: format!("{name} is not a valid header value: {error}"),
        })?;
        headers.insert(name, value);
    }
    let response = http
        .post(&endpoint.url)
        .headers(headers)
        .body(body.to_owned())
        .send()
        .await
        .map_err(|error| AttemptError {
            verdict: Verdict::Retry { after: None },
            // Without the URL: an endpoint's URL may carry a secret of its own.
            message: if error.is_timeout() {
                "timed out".to_owned()
            } else {
                format!("transport error: {}", error.without_url())
            },
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    Err(AttemptError {
        verdict: Verdict::of_http_status(status.as_u16(), retry_after),
        message: format!("HTTP {status}"),
    })
}
