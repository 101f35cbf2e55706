//! Which platform failures are retried, and when.
//!
//! Transport errors, 408, 429 and every 5xx (whatever the body says: Telegram answers a 502
//! with a JSON body `{"ok":false,"error_code":502,…}`) may pass and are retried; other 4xx are
//! the platform's final word. A retry never comes before the platform's retry-after, and
//! failures in a row back off exponentially (with jitter) up to a cap, per approval, so that
//! one failing approval is retried on its own schedule and never holds up another.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What to do after a failed platform call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same call may succeed later; not before `after` when the platform said so.
    Retry { after: Option<Duration> },
    /// The platform refused the call; repeating it would be refused again.
    Final,
}

impl Verdict {
    /// The verdict on an HTTP answer with `status` (and the platform's retry-after, if any).
    pub fn of_http_status(status: u16, retry_after: Option<Duration>) -> Verdict {
        match status {
            408 | 429 | 500..=599 => Verdict::Retry { after: retry_after },
            400..=499 => Verdict::Final,
            // Anything else where an error was expected (a redirect, a proxy's page).
            _ => Verdict::Retry { after: retry_after },
        }
    }

    pub fn is_retryable(self) -> bool {
        matches!(self, Verdict::Retry { .. })
    }
}

/// A platform error that knows whether it is worth retrying.
pub trait Classify {
    fn verdict(&self) -> Verdict;
}

/// Exponential backoff with jitter: `first`, doubling, at most `max`.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max: max.max(first),
        }
    }

    /// The pause after the `failures`-th failure in a row (1 for the first), jittered by up
    /// to a quarter so that many approvals failing together do not retry in lockstep.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        let base = self.first.saturating_mul(1 << doublings).min(self.max);
        let jitter = rand::thread_rng().gen_range(0.75..=1.0);
        base.mul_f64(jitter)
    }

    /// The pause before the next attempt: the backoff, but never before `retry_after`.
    pub fn wait(&self, failures: u32, retry_after: Option<Duration>) -> Duration {
        self.delay(failures).max(retry_after.unwrap_or_default())
    }
}

/// Which calls a platform's rate limit (an answer with a retry-after) holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimitScope {
    /// Every call to the platform: the default, since platforms limit whole methods, chats,
    /// workspaces or clients, never one approval (Slack per method and workspace, ntfy per
    /// client, Telegram per chat and globally, GitHub's secondary limits per account).
    Platform,
    /// Only the calls for the approval whose call was limited.
    Approval,
}

/// The pause a platform asked for with a retry-after, for every call in its scope: no call
/// starts before it has passed.
#[derive(Debug, Default)]
pub struct PlatformHold {
    until: Mutex<Option<Instant>>,
}

impl PlatformHold {
    pub fn new() -> PlatformHold {
        PlatformHold::default()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Instant>> {
        // Every change is one assignment; a panicking holder cannot leave it half-done.
        self.until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Holds every call for `after` from now (a later hold already in place stays).
    pub fn hold(&self, after: Duration) {
        let until = Instant::now() + after;
        let mut held = self.lock();
        *held = (*held).max(Some(until));
    }

    /// How long calls are still held; `None` when they may be made now.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.lock())?;
        let now = Instant::now();
        (until > now).then(|| until - now)
    }

    /// Waits until no hold is in place (one made while waiting is waited for too).
    pub async fn wait(&self) {
        while let Some(wait) = self.remaining() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Runs `call` until it succeeds, fails finally, or `attempts` calls failed; waits between
/// attempts as [`Backoff::wait`] says. A retry-after beyond `max_wait` is not waited for in
/// line: the error is returned for the caller to schedule (see [`RetrySchedule`]).
pub async fn retry_in_line<T, E, F, Fut>(
    backoff: Backoff,
    attempts: u32,
    max_wait: Duration,
    what: &'static str,
    mut call: F,
) -> Result<T, E>
where
    E: Classify + std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut failures = 0;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) => {
                failures += 1;
                let Verdict::Retry { after } = error.verdict() else {
                    return Err(error);
                };
                let wait = backoff.wait(failures, after);
                if failures >= attempts || wait > max_wait {
                    return Err(error);
                }
                tracing::info!(what, failures, retry_in_ms = wait.as_millis() as u64, %error, "call failed; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// When each key (an approval) may be tried again, after failures that may pass.
pub struct RetrySchedule {
    backoff: Backoff,
    entries: Mutex<HashMap<String, Scheduled>>,
    changed: Notify,
}

#[derive(Clone, Copy, Debug)]
struct Scheduled {
    failures: u32,
    due: Instant,
    /// The platform's retry-after: no call for this key before then, whatever asks.
    not_before: Option<Instant>,
}

impl RetrySchedule {
    pub fn new(backoff: Backoff) -> RetrySchedule {
        RetrySchedule {
            backoff,
            entries: Mutex::new(HashMap::new()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Scheduled>> {
        // Every change is one insert or remove; a panicking holder cannot leave it half-done.
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a failure of `key`; returns how long until it is due again (the backoff for its
    /// failures in a row, never before any retry-after the platform gave for it).
    pub fn failed(&self, key: &str, retry_after: Option<Duration>) -> Duration {
        let mut entries = self.lock();
        let failures = entries.get(key).map_or(0, |entry| entry.failures) + 1;
        let wait = self.backoff.wait(failures, retry_after);
        let now = Instant::now();
        let due = now + wait;
        let not_before = retry_after.map(|after| now + after);
        let entry = entries.entry(key.to_owned()).or_insert(Scheduled {
            failures,
            due,
            not_before,
        });
        entry.failures = failures;
        entry.not_before = entry.not_before.max(not_before);
        entry.due = entry
            .not_before
            .map_or(due, |not_before| due.max(not_before));
        drop(entries);
        self.changed.notify_one();
        wait
    }

    /// How long the platform still wants no call for `key` (its retry-after); `None` when
    /// calls may be made now. A caller with new work for `key` leaves it to the scheduled
    /// retry, which comes once the wait is over.
    pub fn holds(&self, key: &str) -> Option<Duration> {
        let not_before = self.lock().get(key)?.not_before?;
        let now = Instant::now();
        (not_before > now).then(|| not_before - now)
    }

    /// Whether `key` failed and waits for a retry.
    pub fn is_scheduled(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// Forgets the failures of `key` (it succeeded).
    pub fn succeeded(&self, key: &str) {
        self.lock().remove(key);
    }

    /// How many keys wait for a retry.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least one key is due and returns the due keys; they stay scheduled
    /// (with their failure count) until [`RetrySchedule::succeeded`] or the next failure.
    pub async fn next_due(&self) -> Vec<String> {
        loop {
            let notified = self.changed.notified();
            let (due, next) = {
                let mut entries = self.lock();
                let now = Instant::now();
                let due: Vec<String> = entries
                    .iter()
                    .filter(|(_, entry)| entry.due <= now)
                    .map(|(key, _)| key.clone())
                    .collect();
                // Not due again until it fails again or the longest backoff passed.
                for key in &due {
                    if let Some(entry) = entries.get_mut(key) {
                        entry.due = now + self.backoff.max;
                    }
                }
                (due, entries.values().map(|entry| entry.due).min())
            };
            if !due.is_empty() {
                return due;
            }
            match next {
                Some(next) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(next) => {}
                        () = notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

/// Keeps in `kept`, of the failures of one show (one per target) that may pass, the one with
/// the longest retry-after: the retry of the whole approval then waits for every target.
pub fn keep_longest<E: Classify>(kept: &mut Option<E>, error: E) {
    let after = |error: &E| match error.verdict() {
        Verdict::Retry { after } => after,
        Verdict::Final => None,
    };
    if kept.as_ref().is_none_or(|old| after(&error) > after(old)) {
        *kept = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_with_the_longest_retry_after_is_kept() {
        struct Failed(Option<u64>);
        impl Classify for Failed {
            fn verdict(&self) -> Verdict {
                Verdict::Retry {
                    after: self.0.map(Duration::from_secs),
                }
            }
        }
        let mut kept = None;
        for after in [None, Some(3), Some(1), None] {
            keep_longest(&mut kept, Failed(after));
        }
        assert_eq!(kept.and_then(|failed| failed.0), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_keeps_the_longest_pause_and_waits_for_it() {
        let hold = PlatformHold::new();
        assert_eq!(hold.remaining(), None);
        let start = Instant::now();
        hold.hold(Duration::from_millis(200));
        hold.hold(Duration::from_millis(50));
        assert!(hold.remaining() > Some(Duration::from_millis(50)));
        hold.wait().await;
        assert!(start.elapsed() >= Duration::from_millis(200));
        assert_eq!(hold.remaining(), None);
    }

    #[test]
    fn http_statuses() {
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert!(
                Verdict::of_http_status(status, None).is_retryable(),
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 409, 413, 422] {
            assert_eq!(
                Verdict::of_http_status(status, None),
                Verdict::Final,
                "{status}"
            );
        }
        assert_eq!(
            Verdict::of_http_status(429, Some(Duration::from_secs(7))),
            Verdict::Retry {
                after: Some(Duration::from_secs(7))
            }
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_honours_retry_after() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert!(backoff.delay(1) <= Duration::from_millis(100));
        assert!(backoff.delay(1) >= Duration::from_millis(75));
        assert!(backoff.delay(3) >= Duration::from_millis(300));
        assert!(backoff.delay(30) <= Duration::from_secs(1));
        assert_eq!(
            backoff.wait(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
    }

    /// The range the worker docs give: each pause is 0.75 to 1.0 of the doubled interval
    /// (capped), and the jitter uses all of it.
    #[test]
    fn each_pause_is_three_quarters_to_all_of_the_doubled_interval() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for (failures, doubled_ms) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (30, 1000),
        ] {
            let doubled = Duration::from_millis(doubled_ms);
            let pauses: Vec<Duration> = (0..2000).map(|_| backoff.delay(failures)).collect();
            let shortest = pauses.iter().min().copied().unwrap_or_default();
            let longest = pauses.iter().max().copied().unwrap_or_default();
            assert!(
                shortest >= doubled.mul_f64(0.75) && longest <= doubled,
                "failure {failures}: {shortest:?}..{longest:?} outside 0.75..1.0 of {doubled:?}"
            );
            // 2000 draws from the whole range come within 2.5% of both ends (a miss has a
            // chance below 1e-20).
            assert!(
                shortest < doubled.mul_f64(0.775) && longest > doubled.mul_f64(0.975),
                "failure {failures}: {shortest:?}..{longest:?} does not span 0.75..1.0 of {doubled:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_schedule_hands_out_keys_when_due_and_never_before_retry_after() {
        let schedule = RetrySchedule::new(Backoff::new(
            Duration::from_millis(10),
            Duration::from_secs(60),
        ));
        let start = Instant::now();
        schedule.failed("slow", Some(Duration::from_millis(300)));
        schedule.failed("fast", None);
        assert!(schedule.holds("slow").is_some());
        assert!(schedule.holds("fast").is_none());
        assert_eq!(schedule.next_due().await, vec!["fast".to_owned()]);
        schedule.succeeded("fast");
        assert_eq!(schedule.next_due().await, vec!["slow".to_owned()]);
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(schedule.len(), 1);
    }

    #[derive(Debug)]
    struct Failure(Verdict);

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }

    impl Classify for Failure {
        fn verdict(&self) -> Verdict {
            self.0
        }
    }

    #[tokio::test]
    async fn in_line_retries_stop_at_a_final_answer_or_a_long_retry_after() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
        let mut calls = 0;
        let result: Result<(), Failure> =
            retry_in_line(backoff, 5, Duration::from_secs(5), "test", || {
                calls += 1;
                let verdict = if calls < 3 {
                    Verdict::Retry { after: None }
                } else {
                    Verdict::Final
                };
                async move { Err(Failure(verdict)) }
            })
            .await;
        assert!(matches!(result, Err(Failure(Verdict::Final))));
        assert_eq!(calls, 3);

        let mut calls = 0;
        let result: Result<(), Failure> =
            retry_in_line(backoff, 5, Duration::from_secs(5), "test", || {
                calls += 1;
                async {
                    Err(Failure(Verdict::Retry {
                        after: Some(Duration::from_secs(30)),
                    }))
                }
            })
            .await;
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
