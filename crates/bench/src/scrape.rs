//! Reading the server's Prometheus endpoint.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::BenchError;
use crate::process::Served;

/// The body of `GET /metrics`, over plain HTTP/1.1.
pub async fn get(addr: SocketAddr) -> Result<String, BenchError> {
    let failed = |e: std::io::Error| BenchError::Setup(format!("scraping {addr}: {e}"));
    let mut stream = TcpStream::connect(addr).await.map_err(failed)?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: countersign\r\nConnection: close\r\n\r\n")
        .await
        .map_err(failed)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(failed)?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(BenchError::Setup(format!(
            "scraping {addr}: unexpected answer {:?}",
            response.lines().next().unwrap_or_default()
        ))),
    }
}

/// The value of the sample named exactly `series` (name and labels).
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Mean changes per group commit, and the writer's time per change (a batch's time from
/// taking it off the queue to its commit, over its changes) in microseconds, since the server
/// started, from its `/metrics`.
pub async fn commit_figures(served: &Served) -> Option<(f64, f64)> {
    let text = get(served.metrics?).await.ok()?;
    let commits = value(&text, "countersign_commit_batch_size_count")?;
    let changes = value(&text, "countersign_commit_batch_size_sum")?;
    let seconds = value(&text, "countersign_commit_latency_seconds_sum")?;
    (commits > 0.0 && changes > 0.0).then(|| (changes / commits, seconds * 1e6 / changes))
}
