//! Crash loop: the real `countersign-server` binary under concurrent requests and decisions,
//! killed with SIGKILL at random moments and restarted on the same database: one server on
//! SQLite, and three replicas on one PostgreSQL database with the clients spread over them (a
//! client whose replica is down carries on with the next). Afterwards every request and
//! decision a client saw acknowledged is stored exactly once, the event seqs are contiguous
//! and no approval has two resolutions.
//!
//! Enough clients write at once that the server commits batches of a hundred changes and more
//! (the test reports the largest batch it saw, from the server's `/metrics`). CI runs a few
//! kills; `COUNTERSIGN_CRASH_KILLS=50` (and `COUNTERSIGN_CRASH_CLIENTS`) for long runs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_testkit::postgres::Cluster;
use rand::Rng;
use sqlx::Connection;
use tokio::process::Child;
use tonic::transport::Channel;
use tonic::Code;

use crate::process;

use process::{Server, START_PATIENCE};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

impl Server {
    /// The upper bound of the histogram bucket of the largest batch this server process has
    /// committed (0 when its metrics cannot be read).
    fn largest_batch(&self) -> u64 {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(self.metrics) else {
            return 0;
        };
        let mut text = String::new();
        if stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .and_then(|_| stream.read_to_string(&mut text))
            .is_err()
        {
            return 0;
        }
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|line| line.strip_prefix("countersign_commit_batch_size_bucket{le=\""))
            .filter_map(|rest| {
                let (le, count) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse().ok()?))
            })
            .collect();
        let total = buckets.iter().map(|&(_, n)| n).max().unwrap_or(0);
        // The smallest bound every batch stays under.
        buckets
            .iter()
            .filter(|&&(_, n)| n == total && total > 0)
            .map(|&(le, _)| le)
            .fold(f64::INFINITY, f64::min)
            .min(1e9) as u64
    }
}

/// What the clients saw acknowledged.
#[derive(Default)]
struct Acknowledged {
    /// idempotency key -> approval id
    requests: HashMap<String, String>,
    /// decision idempotency key -> approval id
    decisions: HashMap<String, String>,
}

/// Retries a call until a server acknowledges it, starting with replica `first` of `urls` and
/// going on with the next after each failure. Only failures that a restart explains
/// (connection lost, unavailable) are retried; anything else fails the test.
async fn until_acknowledged<T, F, Fut>(urls: &[String], first: usize, mut call: F) -> T
where
    F: FnMut(ApprovalServiceClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempt = first;
    loop {
        assert!(Instant::now() < deadline, "no acknowledgement in 120 s");
        let url = &urls[attempt % urls.len()];
        attempt += 1;
        let channel = match Channel::from_shared(url.to_string())
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
        {
            Ok(channel) => channel,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        match call(ApprovalServiceClient::new(channel)).await {
            Ok(answer) => return answer,
            Err(status)
                if matches!(
                    status.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
                ) =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // A limit (a busy decider's Decide rate): nothing was written; wait as told.
            Err(status) if status.code() == Code::ResourceExhausted => {
                let retry_after_ms = status
                    .metadata()
                    .get("retry-after-ms")
                    .and_then(|value| value.to_str().ok()?.parse().ok())
                    .unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
            }
            Err(status) => panic!("refused: {status:?}"),
        }
    }
}

fn request(client: usize, n: usize) -> pb::RequestApprovalRequest {
    let channel = if n.is_multiple_of(2) {
        "telegram"
    } else {
        "github"
    };
    pb::RequestApprovalRequest {
        agent_id: format!("agent-{client}"),
        session_id: "crash-session".into(),
        idempotency_key: format!("c{client}-n{n}"),
        tool_name: "bash".into(),
        arguments_json: format!(r#"{{"command": "deploy", "attempt": {n}}}"#),
        action: "deploy".into(),
        risk: pb::Risk::High as i32,
        required_approvals: 1 + (n % 2) as u32,
        routes: vec![pb::Route {
            channel: channel.into(),
            target: "ops".into(),
        }],
        ..Default::default()
    }
}

/// One client: requests, then decides each approval (two approvers when the quorum is 2,
/// approving or rejecting at random), until told to stop.
async fn client(
    number: usize,
    urls: Vec<String>,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Acknowledged>>,
) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let req = request(number, n);
        let quorum = req.required_approvals as usize;
        let key = req.idempotency_key.clone();
        let created = until_acknowledged(&urls, number, |mut client| {
            let req = req.clone();
            async move { client.request_approval(req).await }
        })
        .await
        .into_inner();
        let id = created.approval.unwrap().id;
        seen.lock()
            .unwrap()
            .requests
            .insert(key.clone(), id.clone());

        for approver in 0..quorum {
            let approve = rand::thread_rng().gen_bool(0.8);
            let decision = pb::DecideRequest {
                approval_id: id.clone(),
                verdict: if approve {
                    pb::Verdict::Approve
                } else {
                    pb::Verdict::Reject
                } as i32,
                scope: pb::Scope::Once as i32,
                reason: String::new(),
                decider: Some(pb::Decider {
                    channel: if approver == 0 { "telegram" } else { "github" }.into(),
                    user_id: format!("approver-{approver}"),
                    display_name: format!("Approver {approver}"),
                }),
                idempotency_key: format!("d-{key}-{approver}"),
                ..Default::default()
            };
            let decided = until_acknowledged(&urls, number + 1, |mut client| {
                let decision = decision.clone();
                async move { client.decide(decision).await }
            })
            .await
            .into_inner();
            let outcome = pb::DecideOutcome::try_from(decided.outcome).unwrap();
            // Votes stop at the resolution, so each one lands on a pending approval (or is
            // the retry of one that did: DUPLICATE).
            assert_ne!(outcome, pb::DecideOutcome::AlreadyResolved, "{decided:?}");
            seen.lock()
                .unwrap()
                .decisions
                .insert(decision.idempotency_key.clone(), id.clone());
            if !approve {
                break;
            }
        }
        n += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_work_survives_sigkill_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("countersign.db").display().to_string();
    let kills = knob("COUNTERSIGN_CRASH_KILLS", 5);
    let clients = knob("COUNTERSIGN_CRASH_CLIENTS", 160);
    crash_loop(dir.path(), &database, 1, kills, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_postgres_lose_and_duplicate_nothing_under_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let database = Cluster::shared().create_database().await;
    let kills = knob("COUNTERSIGN_CRASH_KILLS", 10);
    let clients = knob("COUNTERSIGN_CRASH_CLIENTS", 60);
    crash_loop(dir.path(), &database, 3, kills, clients).await;
}

/// A replica frozen (SIGSTOP) in the middle of a write transaction holds the audit anchor's
/// row lock, and with it every replica's writes: PostgreSQL ends its idle transaction, so the
/// other replica writes again within seconds; the frozen one acknowledged nothing it did not
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_frozen_inside_a_write_does_not_stall_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let database = Cluster::shared().create_database().await;
    let mut frozen = Server::new(dir.path(), &database, 0);
    let mut other = Server::new(dir.path(), &database, 1);
    frozen.start().await;
    other.start().await;
    let channel = |server: &Server| {
        Channel::from_shared(server.url())
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy()
    };
    let mut on_frozen = ApprovalServiceClient::new(channel(&frozen));
    let mut on_other = ApprovalServiceClient::new(channel(&other));
    let approval = on_frozen
        .request_approval(request(0, 0))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();

    // Hold the approval's row so that the frozen replica's Decide blocks inside its
    // transaction, after it took the anchor lock.
    let mut holder = sqlx::PgConnection::connect(&database).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT 1 FROM approvals WHERE id = $1 FOR UPDATE")
        .bind(&approval.id)
        .execute(&mut holder)
        .await
        .unwrap();
    let decision = tokio::spawn({
        let mut client = on_frozen.clone();
        let id = approval.id.clone();
        async move {
            client
                .decide(pb::DecideRequest {
                    approval_id: id,
                    verdict: pb::Verdict::Approve as i32,
                    decider: Some(pb::Decider {
                        channel: "telegram".into(),
                        user_id: "approver-0".into(),
                        display_name: String::new(),
                    }),
                    idempotency_key: "frozen-decision".into(),
                    ..Default::default()
                })
                .await
        }
    });
    let mut watcher = sqlx::PgConnection::connect(&database).await.unwrap();
    let deadline = Instant::now() + START_PATIENCE;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Decide never waited for the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = frozen.child.as_ref().and_then(Child::id).unwrap() as libc::pid_t;
    // SAFETY: signals to a child this test spawned and has not reaped.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // The row is free again: the frozen replica's statements finish on the database's side,
    // and its session then sits idle inside the transaction, holding the anchor lock.
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();

    let started = Instant::now();
    let created = tokio::time::timeout(
        Duration::from_secs(30),
        on_other.request_approval(request(1, 0)),
    )
    .await
    .expect("the other replica writes again while one is frozen")
    .unwrap();
    assert!(created.into_inner().created);
    eprintln!(
        "the other replica wrote again after {:?}",
        started.elapsed()
    );

    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let answered = tokio::time::timeout(START_PATIENCE, decision)
        .await
        .expect("the frozen replica answers once it runs again")
        .unwrap();
    let stored = on_other
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    match answered {
        // Acknowledged: it must be committed.
        Ok(_) => assert_eq!(stored.state(), pb::ApprovalState::Approved),
        Err(status) => assert_eq!(stored.state(), pb::ApprovalState::Pending, "{status:?}"),
    }
    frozen.kill().await;
    other.kill().await;
}

/// Runs `client_count` clients against `replicas` servers on `database` while `kills` times a
/// replica chosen at random is killed with SIGKILL and started again, then checks the
/// database against what the clients saw acknowledged.
async fn crash_loop(
    dir: &Path,
    database: &str,
    replicas: usize,
    kills: usize,
    client_count: usize,
) {
    let mut servers: Vec<Server> = (0..replicas)
        .map(|number| Server::new(dir, database, number))
        .collect();
    for server in &mut servers {
        server.start().await;
    }
    let urls: Vec<String> = servers.iter().map(Server::url).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Acknowledged::default()));
    let clients: Vec<_> = (0..client_count)
        .map(|number| tokio::spawn(client(number, urls.clone(), stop.clone(), seen.clone())))
        .collect();

    let started = Instant::now();
    let mut largest_batch = 0;
    for _ in 0..kills {
        let pause = rand::thread_rng().gen_range(100..400);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = &mut servers[rand::thread_rng().gen_range(0..replicas)];
        largest_batch = largest_batch.max(victim.largest_batch());
        victim.kill().await;
        victim.start().await;
    }
    // Let every client get at least one call through after the last restart.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    for server in &mut servers {
        // SIGTERM and a graceful shutdown.
        server.terminate();
        let exited = tokio::time::timeout(START_PATIENCE, server.exited())
            .await
            .expect("graceful shutdown in time");
        assert!(exited.success(), "{exited}");
    }
    let elapsed = started.elapsed();

    // Every client has finished: the record is final.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    sqlx::any::install_default_drivers();
    let url = if database.starts_with("postgres") {
        database.to_string()
    } else {
        format!("sqlite://{database}")
    };
    let mut db = sqlx::AnyConnection::connect(&url).await.unwrap();

    // Every acknowledged request: one approval, with the acknowledged id.
    for (key, id) in &seen.requests {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM approvals WHERE idempotency_key = $1")
                .bind(key)
                .fetch_all(&mut db)
                .await
                .unwrap();
        assert_eq!(ids, vec![id.clone()], "request {key}");
    }
    // Clients retried every request until it was acknowledged: nothing else is stored.
    let approvals: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(approvals as usize, seen.requests.len());
    let requested: Vec<(String, i64)> = sqlx::query_as(
        "SELECT approval_id, COUNT(*) FROM events WHERE kind = 'REQUESTED' GROUP BY approval_id",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(requested.len(), seen.requests.len());
    assert!(requested.iter().all(|(_, n)| *n == 1), "{requested:?}");

    // Every acknowledged decision: once on its approval and once in the log.
    for (decision_key, id) in &seen.decisions {
        let body: String = sqlx::query_scalar("SELECT body FROM approvals WHERE id = $1")
            .bind(id)
            .fetch_one(&mut db)
            .await
            .unwrap();
        let approval: serde_json::Value = serde_json::from_str(&body).unwrap();
        let on_approval = approval["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["idempotency_key"] == decision_key.as_str())
            .count();
        assert_eq!(on_approval, 1, "decision {decision_key}");
        let events: Vec<String> =
            sqlx::query_scalar("SELECT body FROM events WHERE approval_id = $1")
                .bind(id)
                .fetch_all(&mut db)
                .await
                .unwrap();
        let logged = events
            .iter()
            .map(|body| serde_json::from_str::<serde_json::Value>(body).unwrap())
            .filter(|body| body["decision"]["idempotency_key"] == decision_key.as_str())
            .count();
        assert_eq!(logged, 1, "decision {decision_key} in the log");
    }

    // The log has no gap: seqs run from 1 to the head.
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM events ORDER BY seq")
        .fetch_all(&mut db)
        .await
        .unwrap();
    assert!(!seqs.is_empty());
    for (i, seq) in seqs.iter().enumerate() {
        assert_eq!(*seq, i as i64 + 1, "seqs are not contiguous");
    }

    // No approval was resolved twice, and each resolved one is resolved in the log once.
    let twice: Vec<(String, i64)> = sqlx::query_as(
        "SELECT approval_id, COUNT(*) FROM events
          WHERE kind IN ('RESOLVED', 'EXPIRED', 'CANCELLED')
          GROUP BY approval_id HAVING COUNT(*) > 1",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(twice.is_empty(), "resolved more than once: {twice:?}");
    let unlogged: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM approvals a WHERE a.state != 'PENDING' AND NOT EXISTS
           (SELECT 1 FROM events e WHERE e.approval_id = a.id AND e.kind = 'RESOLVED')",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!(unlogged, 0, "resolved approvals without a RESOLVED event");

    eprintln!(
        "crash loop: {replicas} replicas, {kills} SIGKILLs in {:.1} s, {client_count} clients, batches of up to {largest_batch} changes, {} requests and {} decisions acknowledged, {} events, all present exactly once",
        elapsed.as_secs_f64(),
        seen.requests.len(),
        seen.decisions.len(),
        seqs.len()
    );
    assert!(
        seen.requests.len() >= client_count,
        "too little work to mean anything"
    );
}
