//! A man in the middle for the tests of decision receipts: a TCP proxy on loopback that passes
//! what the client sends untouched and rewrites what the server answers, byte pattern for byte
//! pattern of the same length (plaintext gRPC has no integrity of its own: an HTTP/2 DATA frame
//! carries the protobuf as it is, so `state: REJECTED` becomes `state: APPROVED` by one byte).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `Approval.state` (field 15, varint) = APPROVAL_STATE_REJECTED (3), as protobuf encodes it.
pub const STATE_REJECTED: &[u8] = &[0x78, 0x03];
/// `Approval.state` = APPROVAL_STATE_APPROVED (2).
pub const STATE_APPROVED: &[u8] = &[0x78, 0x02];

pub struct RewritingProxy {
    addr: SocketAddr,
    rewritten: Arc<AtomicUsize>,
}

impl RewritingProxy {
    /// Listens on an ephemeral loopback port and forwards to `target`, replacing each `from`
    /// with `to` (the same length) in the server's answers.
    pub async fn start(
        target: SocketAddr,
        from: &'static [u8],
        to: &'static [u8],
    ) -> RewritingProxy {
        assert_eq!(from.len(), to.len(), "a rewrite keeps the length");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let rewritten = Arc::new(AtomicUsize::new(0));
        let count = rewritten.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = inbound.into_split();
                    let (mut server_read, mut server_write) = outbound.into_split();
                    let upstream = tokio::io::copy(&mut client_read, &mut server_write);
                    let downstream = async {
                        let mut held: Vec<u8> = Vec::new();
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            // Bytes held back (the start of a pattern) wait a moment for the
                            // rest; the server writes a frame at once, so this only delays.
                            let read = if held.is_empty() {
                                server_read.read(&mut buffer).await
                            } else {
                                match tokio::time::timeout(
                                    std::time::Duration::from_millis(50),
                                    server_read.read(&mut buffer),
                                )
                                .await
                                {
                                    Ok(read) => read,
                                    Err(_) => {
                                        if client_write.write_all(&held).await.is_err() {
                                            break;
                                        }
                                        held.clear();
                                        continue;
                                    }
                                }
                            };
                            let read = match read {
                                Ok(0) | Err(_) => break,
                                Ok(read) => read,
                            };
                            held.extend_from_slice(&buffer[..read]);
                            count.fetch_add(replace_all(&mut held, from, to), Ordering::SeqCst);
                            // Hold back a tail that could begin a pattern the next read ends.
                            let keep = (1..from.len())
                                .rev()
                                .find(|&n| held.len() >= n && held.ends_with(&from[..n]))
                                .unwrap_or(0);
                            let send = held.len() - keep;
                            if client_write.write_all(&held[..send]).await.is_err() {
                                break;
                            }
                            held.drain(..send);
                        }
                        let _ = client_write.write_all(&held).await;
                        let _ = client_write.shutdown().await;
                    };
                    let _ = tokio::join!(upstream, downstream);
                });
            }
        });
        RewritingProxy { addr, rewritten }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many times a pattern was replaced so far.
    pub fn rewrites(&self) -> usize {
        self.rewritten.load(Ordering::SeqCst)
    }
}

fn replace_all(data: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    let mut replaced = 0;
    let mut at = 0;
    while at + from.len() <= data.len() {
        if &data[at..at + from.len()] == from {
            data[at..at + from.len()].copy_from_slice(to);
            replaced += 1;
            at += from.len();
        } else {
            at += 1;
        }
    }
    replaced
}
