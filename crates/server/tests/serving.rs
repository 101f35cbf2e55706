//! The real `countersign-server` binary against hostile connections and an edited database:
//! more idle sockets than it has descriptors, a connection that never speaks at SIGTERM, a
//! non-loopback listen without tokens, and the audit anchor, rechain and new-history commands.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use sqlx::Connection;
use tonic::transport::Endpoint;

const SERVER: &str = env!("CARGO_BIN_EXE_countersign-server");

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Starts the binary with `config` (TOML) under `dir`, its open-file limit set to
/// `open_files` when given (soft and hard, in the child only).
fn spawn(dir: &Path, config: &str, open_files: Option<u64>) -> Child {
    let path = dir.join("countersign.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = Command::new(SERVER);
    command
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(limit) = open_files {
        // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
        unsafe {
            command.pre_exec(move || {
                let rlimit = libc::rlimit {
                    rlim_cur: limit as libc::rlim_t,
                    rlim_max: limit as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn().unwrap()
}

fn config(addr: SocketAddr, dir: &Path, extra: &str) -> String {
    format!(
        "listen = \"{addr}\"\ndatabase = \"{}\"\n{extra}",
        dir.join("countersign.db").display()
    )
}

async fn client(addr: SocketAddr) -> ApprovalServiceClient<tonic::transport::Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match endpoint.connect().await {
            Ok(channel) => return ApprovalServiceClient::new(channel),
            Err(e) if Instant::now() > deadline => panic!("the server never answered: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn request(key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "agent-a".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"ls"}"#.into(),
        risk: pb::Risk::High as i32,
        ..Default::default()
    }
}

/// A TCP connection to `addr` once the server listens there (within 30 s).
fn connect_when_listening(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(addr) {
            Ok(stream) => return stream,
            Err(e) if Instant::now() > deadline => panic!("the server never listened: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn terminate(child: &Child) {
    // SAFETY: kill with the id of a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
}

/// Waits for `child` to exit, up to `patience`; kills it and fails when it does not.
fn exit_within(mut child: Child, patience: Duration) -> (Output, Duration) {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), started.elapsed());
        }
        if started.elapsed() > patience {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!(
                "still running after {patience:?}; log:\n{}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_idle_sockets_than_descriptors_do_not_stop_a_well_behaved_client() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let metrics_addr = free_addr();
    let server = spawn(
        dir.path(),
        &config(
            addr,
            dir.path(),
            &format!("[metrics]\nlisten = \"{metrics_addr}\"\n"),
        ),
        Some(128),
    );
    let mut first = client(addr).await;
    first.request_approval(request("before")).await.unwrap();

    // Twice the descriptors the server has, connected and silent.
    let idle: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let answered = tokio::time::timeout(Duration::from_secs(1), async {
        let mut fresh = client(addr).await;
        fresh.request_approval(request("during")).await
    })
    .await;
    let elapsed = started.elapsed();
    let metrics = scrape(metrics_addr);
    drop(idle);
    terminate(&server);
    let (output, _) = exit_within(server, Duration::from_secs(10));
    let log = String::from_utf8_lossy(&output.stdout);
    let answered = answered.unwrap_or_else(|_| panic!("no answer within a second; log:\n{log}"));
    assert!(answered.is_ok(), "{answered:?}\n{log}");
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert!(log.contains("open-file limit"), "{log}");
    let closed = metric(&metrics, "countersign_connections_closed_idle_total");
    assert!(
        closed >= 100.0,
        "idle connections were closed to make room: {metrics}"
    );
}

/// The text of `/metrics` at `addr`.
fn scrape(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn sigterm_with_an_idle_pre_handshake_connection_exits_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let server = spawn(
        dir.path(),
        &config(
            addr,
            dir.path(),
            "[serving]\nhandshake_timeout_ms = 60000\nshutdown_grace_seconds = 2\n",
        ),
        None,
    );
    let silent = connect_when_listening(addr);
    std::thread::sleep(Duration::from_millis(300));
    terminate(&server);
    let (output, took) = exit_within(server, Duration::from_secs(4));
    assert!(output.status.success(), "{output:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(silent);
}

/// The port answers before the store is open; a SIGTERM in that window was the default
/// action's death by signal (status 15) until the handlers were registered before the bind.
#[test]
fn sigterm_as_soon_as_the_port_answers_is_a_clean_stop() {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_addr();
        let server = spawn(dir.path(), &config(addr, dir.path(), ""), None);
        drop(connect_when_listening(addr));
        terminate(&server);
        let (output, _) = exit_within(server, Duration::from_secs(20));
        assert!(output.status.success(), "{output:?}");
    }
}

#[test]
fn a_non_loopback_listen_without_tokens_is_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    // The port is taken: a server that bound first would fail with "address in use" instead.
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let server = spawn(
        dir.path(),
        &config(SocketAddr::from(([0, 0, 0, 0], port)), dir.path(), ""),
        None,
    );
    let (output, _) = exit_within(server, Duration::from_secs(10));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(said.contains("without tokens"), "{said}");
    assert!(!said.contains("cannot listen"), "{said}");
}

/// The JSON a command printed last (log lines may come before it).
fn printed_json(output: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn audit(dir: &Path, command: &str) -> Output {
    Command::new(SERVER)
        .args(["--config"])
        .arg(dir.join("countersign.toml"))
        .args(["audit", command])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anchor_is_printable_and_a_cleared_hash_needs_an_explicit_rechain() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let settings = config(addr, dir.path(), "");
    let server = spawn(dir.path(), &settings, None);
    let mut agent = client(addr).await;
    for key in ["a", "b", "c"] {
        agent.request_approval(request(key)).await.unwrap();
    }
    terminate(&server);
    exit_within(server, Duration::from_secs(10));

    let head = audit(dir.path(), "head");
    assert!(head.status.success(), "{head:?}");
    let anchor = printed_json(&head);
    assert_eq!(anchor["head_seq"], 3, "{anchor}");
    assert_eq!(anchor["head_hash"].as_str().unwrap().len(), 64, "{anchor}");
    assert_eq!(anchor["tail_seq"], 1, "{anchor}");

    // An edit whose traces were wiped by clearing the hashes.
    let url = format!("sqlite:{}", dir.path().join("countersign.db").display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("UPDATE events SET hash = NULL, prev_hash = NULL WHERE seq = 2")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let refused = exit_within(spawn(dir.path(), &settings, None), Duration::from_secs(10)).0;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("audit rechain"), "{said}");

    let rechained = audit(dir.path(), "rechain");
    assert!(rechained.status.success(), "{rechained:?}");
    let report = printed_json(&rechained);
    assert_eq!(report["rows_chained"], 1, "{report}");
    assert!(String::from_utf8_lossy(&rechained.stdout).contains("head_hash"));
    // The rechained log begins a new history (watch cursors read before re-list), and so does
    // one marked after a restore by other means than a backup file.
    let rechained_history = report["history_id"].as_str().unwrap().to_owned();
    assert_eq!(rechained_history.len(), 36, "{report}");
    let renewed = audit(dir.path(), "new-history");
    assert!(renewed.status.success(), "{renewed:?}");
    let renewed = printed_json(&renewed);
    assert_ne!(
        renewed["history_id"],
        rechained_history.as_str(),
        "{renewed}"
    );

    let server = spawn(dir.path(), &settings, None);
    let mut agent = client(addr).await;
    agent.request_approval(request("d")).await.unwrap();
    terminate(&server);
    exit_within(server, Duration::from_secs(10));
}

/// What a load balancer and clients see of a drain: health turns NOT_SERVING, a watch stream
/// ends (so its client resumes elsewhere), a waiter is answered instead of cut, and the
/// process exits within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_health_watch_streams_and_waits_then_exits() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let server = spawn(
        dir.path(),
        &config(addr, dir.path(), "[serving]\nshutdown_grace_seconds = 5\n"),
        None,
    );
    let approval = client(addr)
        .await
        .request_approval(request("drain"))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut statuses = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: "countersign.v1.ApprovalService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = statuses.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    let mut events = ApprovalServiceClient::new(channel.clone())
        .watch_approvals(pb::WatchApprovalsRequest {
            include_snapshot: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let event = events.message().await.unwrap().unwrap();
        if event.kind() == pb::EventKind::SnapshotComplete {
            break;
        }
    }
    let mut waiter = ApprovalServiceClient::new(channel);
    let approval_id = approval.id.clone();
    let wait = tokio::spawn(async move {
        waiter
            .wait_for_decision(pb::WaitForDecisionRequest {
                approval_id,
                timeout_ms: 60_000,
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!wait.is_finished(), "the wait is in flight at SIGTERM");

    terminate(&server);
    let patience = Duration::from_secs(5);
    let drained = tokio::time::timeout(patience, statuses.message())
        .await
        .expect("health says something within the grace");
    assert_eq!(
        drained.unwrap().unwrap().status(),
        ServingStatus::NotServing
    );
    let ended = tokio::time::timeout(patience, async {
        loop {
            match events.message().await {
                Ok(Some(event)) if event.kind() == pb::EventKind::Heartbeat => continue,
                other => return other.map(|event| event.map(|e| e.kind())),
            }
        }
    })
    .await
    .expect("the watch stream ends within the grace");
    assert!(matches!(ended, Ok(None) | Err(_)), "{ended:?}");
    let waited = tokio::time::timeout(patience, wait)
        .await
        .expect("the waiter is answered within the grace")
        .unwrap()
        .expect("answered, not cut");
    assert_eq!(
        waited.into_inner().state(),
        pb::ApprovalState::Pending,
        "still pending: the agent asks again elsewhere"
    );
    let (output, _) = exit_within(server, Duration::from_secs(7));
    assert!(output.status.success(), "{output:?}");
}

/// A connection that never sends the HTTP/2 preface is closed after the handshake timeout,
/// and one that finished its handshake but makes no call after the idle timeout.
#[test]
fn silent_and_idle_connections_are_closed_after_their_timeouts() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let server = spawn(
        dir.path(),
        &config(
            addr,
            dir.path(),
            "[serving]\nhandshake_timeout_ms = 300\nidle_timeout_seconds = 1\n",
        ),
        None,
    );
    // Reads until the server closes; how long that took.
    let closed_after = |mut stream: TcpStream| {
        let started = Instant::now();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => return started.elapsed(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return started.elapsed()
                }
                Err(e) => panic!("the server kept the connection open: {e}"),
            }
        }
    };

    let silent = connect_when_listening(addr);
    let took = closed_after(silent);
    assert!(took < Duration::from_secs(3), "silent connection: {took:?}");

    let mut idle = connect_when_listening(addr);
    // The client preface and an empty SETTINGS frame: a finished handshake, then nothing.
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let took = closed_after(idle);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "idle connection: {took:?}"
    );
    terminate(&server);
    exit_within(server, Duration::from_secs(10));
}
