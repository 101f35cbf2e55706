//! Helpers shared by the SDK tests: request builders, decisions, watch readers, and a TCP
//! proxy on loopback that can freeze its connections (a dead connection that stays open) or
//! terminate TLS in front of a plaintext server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig, Watch, WatchItem, WatchOptions};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Generous bound on any single step, so that a bug fails the test instead of hanging it.
pub const STEP: Duration = Duration::from_secs(20);

pub fn client(url: &str) -> Client {
    Client::connect(ClientConfig::new(url)).unwrap()
}

pub fn request(idempotency_key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "agent-1".into(),
        session_id: "session-1".into(),
        requester: "bob".into(),
        idempotency_key: idempotency_key.into(),
        tool_name: "deploy".into(),
        arguments_json: r#"{"env":"prod","version":"1.2.3"}"#.into(),
        action: "deploy 1.2.3 to prod".into(),
        reason: "release day".into(),
        risk: pb::Risk::High.into(),
        ..Default::default()
    }
}

pub async fn decide(
    client: &Client,
    approval_id: &str,
    verdict: pb::Verdict,
) -> pb::DecideResponse {
    client
        .decide(pb::DecideRequest {
            approval_id: approval_id.into(),
            verdict: verdict.into(),
            scope: pb::Scope::Once.into(),
            reason: "checked".into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "alice".into(),
                display_name: "Alice".into(),
            }),
            idempotency_key: format!("decision-{approval_id}"),
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Short timeouts so that the tests reconnect quickly.
pub fn watch_options(channel: &str) -> WatchOptions {
    let mut options = WatchOptions::channel(channel);
    options.heartbeat_timeout = Duration::from_secs(2);
    options.max_backoff = Duration::from_millis(200);
    options
}

pub async fn next_item(watch: &mut Watch) -> WatchItem {
    tokio::time::timeout(STEP, watch.next())
        .await
        .expect("the watch delivered nothing in time")
        .expect("the watch failed")
}

pub async fn next_snapshot(watch: &mut Watch) -> Vec<pb::Approval> {
    match next_item(watch).await {
        WatchItem::Snapshot(pending) => pending,
        WatchItem::Event(event) => panic!("expected a snapshot, got event {event:?}"),
    }
}

pub async fn next_event(watch: &mut Watch) -> pb::ApprovalEvent {
    match next_item(watch).await {
        WatchItem::Event(event) => event,
        WatchItem::Snapshot(pending) => panic!("expected an event, got a snapshot of {pending:?}"),
    }
}

/// The stored events after `after_seq` as the server replays them to a new stream, read until
/// the stream is caught up (its first heartbeat).
pub async fn logged_events(url: &str, after_seq: u64) -> Vec<pb::ApprovalEvent> {
    let mut raw = pb::approval_service_client::ApprovalServiceClient::connect(url.to_owned())
        .await
        .unwrap();
    let request = pb::WatchApprovalsRequest {
        after_seq,
        channel: String::new(),
        include_snapshot: false,
        history_id: String::new(),
    };
    let mut stream = raw.watch_approvals(request).await.unwrap().into_inner();
    let mut events = Vec::new();
    loop {
        let event = tokio::time::timeout(STEP, stream.message())
            .await
            .expect("no heartbeat in time")
            .unwrap()
            .expect("stream ended");
        if event.kind() == pb::EventKind::Heartbeat {
            return events;
        }
        events.push(event);
    }
}

/// An address nothing listens on.
pub async fn unused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A TCP proxy on 127.0.0.1 in front of `target`. `freeze()` makes every connection open at
/// that moment stop forwarding in both directions while staying open: to its client it looks
/// like a server that went silent. Later connections are forwarded normally.
pub struct Proxy {
    addr: SocketAddr,
    generation: watch::Sender<u64>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        Proxy::start_inner(target, None).await
    }

    /// Terminates TLS (with ALPN h2, as gRPC needs) and forwards plaintext to `target`.
    pub async fn start_tls(target: SocketAddr, acceptor: TlsAcceptor) -> Proxy {
        Proxy::start_inner(target, Some(acceptor)).await
    }

    async fn start_inner(target: SocketAddr, tls: Option<TlsAcceptor>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (generation, _) = watch::channel(0u64);
        let frozen = generation.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let born = *frozen.borrow();
                let freeze = frozen.subscribe();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(inbound) = acceptor.accept(inbound).await {
                                pipe(inbound, target, born, freeze).await;
                            }
                        }
                        None => pipe(inbound, target, born, freeze).await,
                    }
                });
            }
        });
        Proxy { addr, generation }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn freeze(&self) {
        self.generation.send_modify(|generation| *generation += 1);
    }
}

async fn pipe<S>(mut inbound: S, target: SocketAddr, born: u64, mut freeze: watch::Receiver<u64>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let frozen = async move {
        // The guard wait_for returns must not live across the await below.
        let _ = freeze
            .wait_for(|generation| *generation > born)
            .await
            .map(|_| ());
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        () = frozen => {
            // Hold both sockets open and silent until the test ends.
            let _held = (inbound, outbound);
            std::future::pending::<()>().await;
        }
    }
}

/// A self-signed certificate for `localhost` and a TLS acceptor presenting it.
pub fn tls_acceptor() -> (TlsAcceptor, String) {
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio_rustls::rustls::{crypto, ServerConfig};

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    (TlsAcceptor::from(Arc::new(config)), certified.cert.pem())
}
