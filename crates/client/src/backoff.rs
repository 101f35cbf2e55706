use std::time::Duration;

use rand::Rng;

/// The first retry delay; each failure doubles it up to the maximum.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Exponential backoff with jitter: each delay is drawn from [d/2, d] where d doubles after
/// every failure up to `max`, so that many clients cut off together do not reconnect in step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    max: Duration,
    current: Duration,
    /// Delays handed out since the last success.
    attempts: u32,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Self {
        let max = max.max(Duration::from_millis(1));
        Backoff {
            max,
            current: INITIAL_BACKOFF.min(max),
            attempts: 0,
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.current;
        self.current = (self.current * 2).min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        let half = ceiling / 2;
        half + rand::thread_rng().gen_range(Duration::ZERO..=ceiling - half)
    }

    /// After a success: the next failure starts from the initial delay again.
    pub(crate) fn reset(&mut self) {
        self.current = INITIAL_BACKOFF.min(self.max);
        self.attempts = 0;
    }

    /// True until the first delay after a success: the failure being handled starts a streak.
    pub(crate) fn first_failure(&self) -> bool {
        self.attempts == 0
    }
}

/// Logs a failure that will be retried: a warning for the first one since the last success,
/// debug for the retries that follow (they would only repeat it, every few seconds).
macro_rules! log_retry {
    ($backoff:expr, $($event:tt)+) => {
        if $backoff.first_failure() {
            tracing::warn!($($event)+)
        } else {
            tracing::debug!($($event)+)
        }
    };
}
pub(crate) use log_retry;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_maximum_with_jitter() {
        let max = Duration::from_millis(1_000);
        let mut backoff = Backoff::new(max);
        let ceilings = [100, 200, 400, 800, 1_000, 1_000];
        for ceiling in ceilings {
            let ceiling = Duration::from_millis(ceiling);
            let delay = backoff.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} vs {ceiling:?}"
            );
        }
        assert!(!backoff.first_failure());
        backoff.reset();
        assert!(backoff.first_failure());
        assert!(backoff.next_delay() <= INITIAL_BACKOFF);
    }

    #[test]
    fn a_maximum_below_the_initial_delay_caps_every_delay() {
        let max = Duration::from_millis(20);
        let mut backoff = Backoff::new(max);
        for _ in 0..5 {
            assert!(backoff.next_delay() <= max);
        }
    }
}
