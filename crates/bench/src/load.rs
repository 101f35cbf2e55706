//! Load generation: closed loops at a fixed concurrency, latency samples and their summary.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::error::BenchError;

/// What every figure is run with.
#[derive(Debug, Clone)]
pub struct Load {
    pub concurrency: usize,
    pub connections: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// A fixed number of calls (or the floor's changes) instead of `warmup` and `duration`:
    /// the instruction counts (`--instructions`) compare equal amounts of work.
    pub calls: Option<u64>,
}

/// `count` separate HTTP/2 connections to `url`: one connection would serialize every call
/// through one connection task, which no deployment with several agents does.
pub async fn connections(url: &str, count: usize) -> Result<Vec<Channel>, BenchError> {
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let channel = Endpoint::from_shared(url.to_string())
            .map_err(|e| BenchError::Setup(format!("bad URL {url}: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| BenchError::Setup(format!("cannot connect to {url}: {e}")))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// Latencies in microseconds and failed calls, collected by many tasks.
#[derive(Default)]
pub struct Samples {
    latencies_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Samples {
    pub fn record(&mut self, latency: Duration) {
        self.latencies_us
            .push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn fail(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn merge(&mut self, other: Samples) {
        self.latencies_us.extend(other.latencies_us);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    pub fn summarize(mut self, window: Duration) -> Summary {
        self.latencies_us.sort_unstable();
        let ops = self.latencies_us.len() as u64;
        let quantile = |q: f64| -> f64 {
            if self.latencies_us.is_empty() {
                return 0.0;
            }
            let index = ((self.latencies_us.len() - 1) as f64 * q).round() as usize;
            self.latencies_us[index] as f64 / 1000.0
        };
        Summary {
            ops,
            per_second: ops as f64 / window.as_secs_f64().max(f64::EPSILON),
            p50_ms: quantile(0.50),
            p99_ms: quantile(0.99),
            max_ms: quantile(1.0),
            errors: self.errors,
            first_error: self.first_error,
        }
    }
}

/// Shared samples for open-loop scenarios whose calls finish on their own tasks.
pub type SharedSamples = Arc<Mutex<Samples>>;

pub fn record(samples: &SharedSamples, latency: Duration) {
    if let Ok(mut samples) = samples.lock() {
        samples.record(latency);
    }
}

pub fn fail(samples: &SharedSamples, error: String) {
    if let Ok(mut samples) = samples.lock() {
        samples.fail(error);
    }
}

pub fn take(samples: &SharedSamples) -> Samples {
    samples
        .lock()
        .map(|mut samples| std::mem::take(&mut *samples))
        .unwrap_or_default()
}

#[derive(Debug, Clone)]
pub struct Summary {
    /// Operations completed inside the measured window.
    pub ops: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Runs `op(worker, iteration)` in `load.concurrency` loops, each starting its next call when
/// the previous one returned: for the load's warm-up and then its duration, counting only calls
/// that start and finish inside the measured window; or, with `load.calls`, exactly that many
/// calls, all counted.
pub async fn closed_loop<F, Fut>(load: &Load, op: F) -> Summary
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let op = Arc::new(op);
    let began_all = Instant::now();
    let (start, end) = match load.calls {
        Some(_) => (began_all, None),
        None => {
            let start = began_all + load.warmup;
            (start, Some(start + load.duration))
        }
    };
    let left = Arc::new(AtomicU64::new(load.calls.unwrap_or(u64::MAX)));
    let mut workers = Vec::with_capacity(load.concurrency);
    for worker in 0..load.concurrency.max(1) {
        let (op, left) = (op.clone(), left.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut iteration = 0u64;
            loop {
                let began = Instant::now();
                let more = left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if !more || end.is_some_and(|end| began >= end) {
                    break;
                }
                let result = op(worker, iteration).await;
                iteration += 1;
                let finished = Instant::now();
                if began < start || end.is_some_and(|end| finished > end) {
                    continue;
                }
                match result {
                    Ok(()) => samples.record(finished - began),
                    Err(error) => samples.fail(error),
                }
            }
            samples
        }));
    }
    let mut all = Samples::default();
    for worker in workers {
        match worker.await {
            Ok(samples) => all.merge(samples),
            Err(e) => all.fail(format!("load task failed: {e}")),
        }
    }
    let window = match load.calls {
        Some(_) => began_all.elapsed(),
        None => load.duration,
    };
    all.summarize(window)
}
