//! The rate limits of requests and decisions: a token bucket per key, per agent and token
//! (requests), per decider and token (decisions); shared through the store when several
//! servers share the database.

use std::time::Instant;

use crate::app::AppError;
use crate::config::LimitsConfig;
use crate::limits::RateLimiter;
use crate::store::Store;

/// The rate limits, each a token bucket per key; `None` where the limit is off.
pub(super) struct Rates {
    pub requests_per_agent: Option<RateLimiter>,
    pub requests_per_token: Option<RateLimiter>,
    pub decisions_per_decider: Option<RateLimiter>,
    pub decisions_per_token: Option<RateLimiter>,
}

impl Rates {
    pub fn of(limits: &LimitsConfig) -> Rates {
        Rates {
            requests_per_agent: RateLimiter::new(limits.requests_per_minute, limits.request_burst),
            requests_per_token: RateLimiter::new(
                limits
                    .requests_per_minute_per_token
                    .unwrap_or(limits.requests_per_minute.saturating_mul(10)),
                0,
            ),
            decisions_per_decider: RateLimiter::new(limits.decisions_per_minute, 0),
            decisions_per_token: RateLimiter::new(
                limits
                    .decisions_per_minute_per_token
                    .unwrap_or(limits.decisions_per_minute.saturating_mul(10)),
                0,
            ),
        }
    }
}

/// Takes one call from `key`'s bucket of `limiter` (shared by every server on the database
/// when it keeps shared buckets), or refuses naming who (`who`) went over which setting, and
/// when to retry.
pub(super) async fn check_rate(
    store: &Store,
    limiter: &Option<RateLimiter>,
    key: &str,
    who: &str,
    setting: &str,
) -> Result<(), AppError> {
    let Some(limiter) = limiter else {
        return Ok(());
    };
    let bucket = format!("{setting}:{key}");
    limiter
        .check_shared(store, &bucket, Instant::now())
        .await
        .map_err(|wait| {
            let retry_ms = wait.as_millis().max(1);
            tracing::warn!(
                who,
                setting,
                retry_ms = retry_ms as u64,
                "rate limit reached"
            );
            AppError::RateLimited {
                message: format!(
                    "{who} exceeded its rate (limits.{setting} = {}); retry in {:.1} s",
                    limiter.per_minute(),
                    wait.as_secs_f64()
                ),
                retry_ms,
            }
        })
}
