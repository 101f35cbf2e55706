//! Limits at the edge: the per-agent request rate (a token bucket per agent id: in the database
//! when several servers share it, else in memory), and the status of a request over the message
//! size cap.

use std::collections::HashMap;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tonic::{Code, Status};

use crate::store::{now_millis, Store};

/// Buckets kept before idle (full) ones are dropped, so that many agent ids cannot grow the
/// map without bound.
const MAX_TRACKED_AGENTS: usize = 10_000;

pub struct RateLimiter {
    /// Calls per second refilled.
    rate: f64,
    /// Calls available at once.
    burst: f64,
    per_minute: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    available: f64,
    updated: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant, rate: f64, burst: f64) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.available = (self.available + elapsed * rate).min(burst);
        self.updated = now;
    }
}

impl RateLimiter {
    /// `None` when `per_minute` is 0 (no limit). A `burst` of 0 means `per_minute`.
    pub fn new(per_minute: u32, burst: u32) -> Option<RateLimiter> {
        if per_minute == 0 {
            return None;
        }
        let burst = if burst == 0 { per_minute } else { burst };
        Some(RateLimiter {
            rate: f64::from(per_minute) / 60.0,
            burst: f64::from(burst),
            per_minute,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// Takes one call from `agent_id`'s bucket, or says how long until one is available.
    pub fn check(&self, agent_id: &str, now: Instant) -> Result<(), Duration> {
        // A poisoned lock only means another call panicked mid-update; the counts stay usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_TRACKED_AGENTS && !buckets.contains_key(agent_id) {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, bucket| {
                bucket.refill(now, rate, burst);
                bucket.available < burst
            });
        }
        let bucket = buckets.entry(agent_id.to_owned()).or_insert(Bucket {
            available: self.burst,
            updated: now,
        });
        bucket.refill(now, self.rate, self.burst);
        if bucket.available >= 1.0 {
            bucket.available -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.available) / self.rate,
            ))
        }
    }

    /// Takes one call from the bucket `bucket` that every server on `store`'s database shares;
    /// from this server's own bucket when the database keeps none, or cannot be reached.
    pub async fn check_shared(
        &self,
        store: &Store,
        bucket: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        match store
            .take_token(bucket, self.rate / 1000.0, self.burst, now_millis())
            .await
        {
            Ok(Some(taken)) => taken,
            Ok(None) => self.check(bucket, now),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach the shared rate limits; limiting on this server alone");
                self.check(bucket, now)
            }
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }
}

/// How tonic words its refusal of a request over `max_decoding_message_size`.
const TONIC_SIZE_REFUSAL: &str = "Error, decoded message length too large";
/// How tonic words a request it cannot decode (a string field that is not UTF-8, a wire type
/// that does not fit): prost's error, which names the message and field.
const TONIC_DECODE_REFUSAL: &str = "failed to decode Protobuf message: ";

/// Makes a request over the message size cap (`limits.max_message_bytes`) end with
/// RESOURCE_EXHAUSTED, the code the contract names for size limits (tonic answers
/// OUT_OF_RANGE), and a request that does not decode end with INVALID_ARGUMENT naming the field
/// (tonic answers INTERNAL).
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageSizeStatusLayer;

impl<S> tower_layer::Layer<S> for MessageSizeStatusLayer {
    type Service = MessageSizeStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageSizeStatus { inner }
    }
}

#[derive(Debug, Clone)]
pub struct MessageSizeStatus<S> {
    inner: S,
}

type Relabel<B, E> = fn(Result<http::Response<B>, E>) -> Result<http::Response<B>, E>;

impl<S, Req, B> tower_service::Service<Req> for MessageSizeStatus<S>
where
    S: tower_service::Service<Req, Response = http::Response<B>>,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = futures::future::Map<S::Future, Relabel<B, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.inner.call(request).map(relabel_size_refusal)
    }
}

/// A refusal before the handler ran has its status in the response headers.
fn relabel_size_refusal<B, E>(
    result: Result<http::Response<B>, E>,
) -> Result<http::Response<B>, E> {
    result.map(|mut response| {
        let relabelled = Status::from_header_map(response.headers()).and_then(|refused| {
            let message = refused.message();
            match refused.code() {
                Code::OutOfRange if message.starts_with(TONIC_SIZE_REFUSAL) => {
                    Some(Status::resource_exhausted(format!(
                        "the request is larger than the server accepts (limits.max_message_bytes){}",
                        message.strip_prefix(TONIC_SIZE_REFUSAL).unwrap_or_default()
                    )))
                }
                Code::Internal if message.starts_with(TONIC_DECODE_REFUSAL) => {
                    Some(Status::invalid_argument(format!(
                        "the request is not a valid message: {}",
                        message.strip_prefix(TONIC_DECODE_REFUSAL).unwrap_or_default()
                    )))
                }
                _ => None,
            }
        });
        if let Some(status) = relabelled {
            // Only fails for a message that cannot be a header; the original status then stays.
            let _ = status.add_header(response.headers_mut());
        }
        response
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate_per_agent() {
        let limiter = RateLimiter::new(60, 2).unwrap();
        let start = Instant::now();
        assert!(limiter.check("a", start).is_ok());
        assert!(limiter.check("a", start).is_ok());
        let wait = limiter.check("a", start).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        assert!(
            limiter.check("b", start).is_ok(),
            "agents have their own buckets"
        );
        assert!(limiter.check("a", start + Duration::from_secs(1)).is_ok());
        assert!(limiter.check("a", start + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn zero_means_no_limit() {
        assert!(RateLimiter::new(0, 5).is_none());
    }
}
