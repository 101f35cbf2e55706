//! Plain HTTP/1.1 GETs of the loopback endpoints countersign serves (`/metrics`, `/healthz`)
//! and reading Prometheus samples, for the suites that check them.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An answer: its status, its content type (empty when absent) and its body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// `GET path` at `addr` with `Connection: close`.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, response.clone());
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(invalid)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(invalid)?;
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    Ok(Answer {
        status,
        content_type,
        body: body.to_string(),
    })
}

/// The value of the sample named exactly `series` (name and labels) in a Prometheus text,
/// if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// A loopback address with a port that was free a moment ago (another process may still take
/// it before the caller binds it).
pub fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener
        .local_addr()
        .expect("a bound listener has an address")
}
