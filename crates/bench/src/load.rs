//! Load generation: closed loops at a fixed concurrency, latency samples and their summary.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::error::BenchError;

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

/// Runs `op(worker, iteration)` in `concurrency` loops, each starting its next call when the
/// previous one returned, for `warmup` then `duration`; only calls that start and finish
/// inside the measured window count.
pub async fn closed_loop<F, Fut>(
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    op: F,
) -> Summary
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let op = Arc::new(op);
    let start = Instant::now() + warmup;
    let end = start + duration;
    let mut workers = Vec::with_capacity(concurrency);
    for worker in 0..concurrency.max(1) {
        let op = op.clone();
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut iteration = 0u64;
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let result = op(worker, iteration).await;
                iteration += 1;
                let finished = Instant::now();
                if began < start || finished > end {
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
    all.summarize(duration)
}
