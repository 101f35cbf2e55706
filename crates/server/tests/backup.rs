//! Online backups and restores (issue 27). The real binary under load gets a backup through
//! the admin RPC in the middle, is killed with SIGKILL and restored from the copy: everything
//! acknowledged before the backup began is back, the chain verifies, the server serves, and a
//! watcher whose persisted cursor is ahead of the restored log re-lists and carries on. A
//! database whose chain is broken is not copied, a file is never overwritten, and on
//! PostgreSQL the command says that pg_dump is the way.

mod process;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_client::{Client, ClientConfig, WatchItem, WatchOptions};
use countersign_proto::v1 as pb;
use countersign_proto::v1::admin_service_client::AdminServiceClient;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_server::config::{Role, WalCheckpoints};
use countersign_testkit::postgres;
use countersign_testkit::server::{token, TestServer};
use countersign_worker::cursor::Cursor;
use process::{Server, SERVER};
use tonic::transport::Channel;
use tonic::{Code, Status};

const PATIENCE: Duration = Duration::from_secs(30);

fn request(writer: usize, n: usize) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: format!("agent-{writer}"),
        session_id: "backup-session".into(),
        idempotency_key: format!("w{writer}-n{n}"),
        tool_name: "bash".into(),
        arguments_json: format!(r#"{{"command": "deploy", "attempt": {n}}}"#),
        action: "deploy".into(),
        risk: pb::Risk::High as i32,
        routes: vec![pb::Route {
            channel: "telegram".into(),
            target: "ops".into(),
        }],
        ..Default::default()
    }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Waits until `done` holds, polling.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// The answer on PostgreSQL: the backup is pg_dump's job, and the status says so.
fn assert_names_pg_dump(status: &Status) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("pg_dump"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_taken_under_load_restores_after_sigkill() {
    if postgres::skip_unless_sqlite(
        "restores a SQLite file; PostgreSQL backups are pg_dump's (tested below)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("countersign.db");
    let mut server = Server::new(dir.path(), &database.display().to_string(), 0);
    server.start().await;
    let url = server.url();

    // A watcher that handles every event and keeps its cursor as the worker runtime does.
    let cursor_path = dir.path().join("watch-cursor");
    let (cursor, saved) = Cursor::open(&cursor_path);
    assert_eq!(saved, None);
    let watcher = {
        let cursor = cursor.clone();
        let client = Client::connect(ClientConfig::new(url.clone())).unwrap();
        tokio::spawn(async move {
            let mut watch = client.watch(WatchOptions::channel("telegram"));
            while let Ok(item) = watch.next().await {
                match item {
                    WatchItem::Snapshot(_) => {
                        cursor.begin_snapshot(&watch.cursor().unwrap()).done();
                    }
                    WatchItem::Event(event) => cursor.begin(event.seq).done(),
                }
            }
        })
    };

    // Writers that keep requesting until the server dies under them.
    let acknowledged: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..8 {
        let mut client = ApprovalServiceClient::new(channel(&url).await);
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match client.request_approval(request(writer, n)).await {
                    Ok(answer) => acknowledged
                        .lock()
                        .unwrap()
                        .push(answer.into_inner().approval.unwrap().id),
                    Err(_) => return,
                }
                n += 1;
            }
        }));
    }
    let count = || acknowledged.lock().unwrap().len();
    until("150 requests are acknowledged", || count() >= 150).await;

    let before_backup = acknowledged.lock().unwrap().clone();
    let mut admin = AdminServiceClient::new(channel(&url).await);
    let made = admin
        .backup_database(pb::BackupDatabaseRequest {
            file_name: "backup.db".into(),
        })
        .await
        .expect("the backup is written while the writers go on")
        .into_inner();
    let backup = dir.path().join("backup.db");
    assert_eq!(made.path, backup.display().to_string());
    assert_eq!(made.bytes, std::fs::metadata(&backup).unwrap().len());
    assert!(
        made.newest_seq >= before_backup.len() as u64,
        "the copy holds every request acknowledged before it began: {made:?}, {} before",
        before_backup.len()
    );
    assert_eq!(made.events_checked, made.newest_seq, "{made:?}");
    assert_eq!(made.first_seq, 1, "{made:?}");

    // The server goes on; the watcher handles events well past the backup, then SIGKILL.
    let past_backup = made.newest_seq + 150;
    until("the watcher is past the backup", || {
        cursor.safe() >= past_backup
    })
    .await;
    server.kill().await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    watcher.abort();
    cursor.flush().await.unwrap();
    let after_kill = acknowledged.lock().unwrap().len();
    assert!(after_kill > before_backup.len());

    // Restore: the copy in place of the database and its WAL, then start.
    restore(&database, &backup);
    server.start().await;

    let mut admin = AdminServiceClient::new(channel(&url).await);
    let audit = admin
        .verify_audit(pb::VerifyAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(audit.intact, "{audit:?}");
    assert_eq!(audit.last_seq, made.newest_seq, "{audit:?}");
    let mut approvals = ApprovalServiceClient::new(channel(&url).await);
    for id in &before_backup {
        let approval = approvals
            .get_approval(pb::GetApprovalRequest {
                approval_id: id.clone(),
            })
            .await
            .unwrap_or_else(|status| panic!("{id} was acknowledged before the backup: {status}"))
            .into_inner();
        assert_eq!(approval.state(), pb::ApprovalState::Pending);
    }

    // The watcher's cursor names a seq the restored log never reached.
    let (_, saved) = Cursor::open(&cursor_path);
    let saved = saved.expect("the watcher persisted its cursor");
    assert!(saved.seq > made.newest_seq, "{saved:?} vs {made:?}");
    let ahead = approvals
        .watch_approvals(pb::WatchApprovalsRequest {
            after_seq: saved.seq,
            channel: "telegram".into(),
            include_snapshot: false,
            history_id: String::new(),
        })
        .await
        .expect_err("a cursor ahead of the log is refused");
    assert_eq!(ahead.code(), Code::OutOfRange, "{ahead:?}");
    assert!(ahead.message().contains("ahead"), "{ahead:?}");

    // So the watcher re-lists: a snapshot with every pending approval, then live events.
    let client = Client::connect(ClientConfig::new(url.clone())).unwrap();
    let mut watch = client.watch(WatchOptions::channel("telegram").resume_after(Some(saved)));
    let first = tokio::time::timeout(PATIENCE, watch.next())
        .await
        .unwrap()
        .unwrap();
    let WatchItem::Snapshot(pending) = first else {
        panic!("expected a snapshot, got {first:?}");
    };
    let listed: std::collections::HashSet<String> = pending.into_iter().map(|a| a.id).collect();
    for id in &before_backup {
        assert!(
            listed.contains(id),
            "{id} is pending but not in the snapshot"
        );
    }
    let new = approvals
        .request_approval(request(99, 0))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let next = tokio::time::timeout(PATIENCE, watch.next())
        .await
        .unwrap()
        .unwrap();
    let WatchItem::Event(event) = next else {
        panic!("expected the new request, got {next:?}");
    };
    assert_eq!(event.kind(), pb::EventKind::Requested);
    assert_eq!(event.seq, made.newest_seq + 1);
    assert_eq!(event.approval.unwrap().id, new.id);
    server.kill().await;
}

/// Issue 44: a restored log whose new events have passed a watcher's cursor. The watcher read
/// up to seq N; the database is replaced by a backup taken before N, and agents then write
/// past N. The seqs between the backup's head and N now name other events than the ones the
/// watcher read: a watcher that resumed after N would never see them. The backup copy begins
/// a history of its own when served, so the cursor (old history, N) is answered like one
/// ahead of the log, and the SDK's watch, resumed from the persisted cursor, re-lists every
/// pending approval instead.
#[tokio::test]
async fn a_cursor_that_the_restored_log_has_passed_re_lists() {
    if postgres::skip_unless_sqlite(
        "restores a SQLite backup file; on PostgreSQL a restore is pg_restore, after which `audit new-history` renews the history (tests/watch.rs)",
    ) {
        return;
    }
    let mut server = TestServer::start().await;
    let url = server.url();
    let mut approvals = ApprovalServiceClient::new(channel(&url).await);
    let mut in_backup = Vec::new();
    for n in 0..2 {
        in_backup.push(request_one(&mut approvals, request(0, n)).await);
    }
    let made = AdminServiceClient::new(channel(&url).await)
        .backup_database(pb::BackupDatabaseRequest {
            file_name: "backup.db".into(),
        })
        .await
        .unwrap()
        .into_inner();
    for n in 2..5 {
        request_one(&mut approvals, request(0, n)).await;
    }

    // The watcher reads everything, up to N, and persists its cursor as a worker does.
    let dir = tempfile::tempdir().unwrap();
    let cursor_path = dir.path().join("watch-cursor");
    let (cursor, _) = Cursor::open(&cursor_path);
    let client = Client::connect(ClientConfig::new(url.clone())).unwrap();
    let mut watch = client.watch(WatchOptions::channel("telegram"));
    let first = tokio::time::timeout(PATIENCE, watch.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, WatchItem::Snapshot(ref pending) if pending.len() == 5));
    let read = watch.cursor().unwrap();
    cursor.begin_snapshot(&read).done();
    cursor.flush().await.unwrap();
    assert_eq!(read.seq, 5);
    assert!(made.newest_seq < read.seq, "{made:?}");

    // Restore, then agents write past N in the restored log.
    server.stop().await;
    let database = server.database_path();
    restore(&database, &database.with_file_name("backup.db"));
    server.restart().await;
    let mut approvals = ApprovalServiceClient::new(channel(&url).await);
    let mut after_restore = Vec::new();
    for n in 0..4 {
        after_restore.push(request_one(&mut approvals, request(1, n)).await);
    }

    // The watch that lived through the restore reconnects after (old history, N): it
    // re-lists too.
    let expected: BTreeSet<String> = in_backup.iter().chain(&after_restore).cloned().collect();
    let next = tokio::time::timeout(PATIENCE, watch.next())
        .await
        .unwrap()
        .unwrap();
    let WatchItem::Snapshot(pending) = next else {
        panic!(
            "the live watch resumed after seq {} of another log: {next:?}",
            read.seq
        );
    };
    assert_eq!(
        pending.into_iter().map(|a| a.id).collect::<BTreeSet<_>>(),
        expected
    );

    // Resumed from the persisted cursor: a snapshot with every pending approval.
    let (_, saved) = Cursor::open(&cursor_path);
    assert_eq!(saved.as_ref(), Some(&read));
    let mut resumed = client.watch(WatchOptions::channel("telegram").resume_after(saved));
    let next = tokio::time::timeout(PATIENCE, resumed.next())
        .await
        .unwrap()
        .unwrap();
    let WatchItem::Snapshot(pending) = next else {
        panic!(
            "the watch resumed after seq {} of another log: {next:?}",
            read.seq
        );
    };
    let listed: BTreeSet<String> = pending.into_iter().map(|a| a.id).collect();
    assert_eq!(listed, expected);
    let head = resumed.cursor().unwrap();
    assert_eq!(head.seq, made.newest_seq + 4);
    assert_ne!(
        head.history_id, read.history_id,
        "the restore began a new history"
    );

    // Each start on the backup file begins another history: a cursor of the first restore's
    // log is not taken for one of the second's.
    server.stop().await;
    restore(&database, &database.with_file_name("backup.db"));
    server.restart().await;
    let mut again =
        client.watch(WatchOptions::channel("telegram").resume_after(Some(head.clone())));
    let next = tokio::time::timeout(PATIENCE, again.next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(next, WatchItem::Snapshot(_)), "{next:?}");
    assert_ne!(again.cursor().unwrap().history_id, head.history_id);
}

/// The restore steps of docs/deployment.md, with the server stopped: the database and its
/// `-wal` and `-shm` moved aside, the backup copied in its place.
fn restore(database: &std::path::Path, backup: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", database.display()));
        if file.exists() {
            std::fs::remove_file(file).unwrap();
        }
    }
    std::fs::copy(backup, database).unwrap();
}

/// Requests one approval; its id.
async fn request_one(
    client: &mut ApprovalServiceClient<Channel>,
    request: pb::RequestApprovalRequest,
) -> String {
    client
        .request_approval(request)
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
        .id
}

const ADMIN: &str = "admin-secret";
const WORKER: &str = "worker-secret";

/// A test server (SQLite, or PostgreSQL with `COUNTERSIGN_TEST_BACKEND=postgres`) with an admin
/// and a worker token.
async fn server_with_tokens() -> TestServer {
    TestServer::start_with(|config| {
        config.tokens = vec![
            token("ops", Role::Admin, &[], ADMIN),
            token("bot", Role::Worker, &["telegram"], WORKER),
        ];
    })
    .await
}

fn with_token<T>(message: T, secret: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    request
}

async fn backup(
    server: &TestServer,
    secret: &str,
    file_name: &str,
) -> Result<pb::BackupDatabaseResponse, Status> {
    let request = pb::BackupDatabaseRequest {
        file_name: file_name.into(),
    };
    AdminServiceClient::new(channel(&server.url()).await)
        .backup_database(with_token(request, secret))
        .await
        .map(tonic::Response::into_inner)
}

/// Requests `count` approvals as the admin.
async fn request_some(server: &TestServer, count: usize) {
    let mut client = ApprovalServiceClient::new(channel(&server.url()).await);
    for n in 0..count {
        client
            .request_approval(with_token(request(0, n), ADMIN))
            .await
            .unwrap();
    }
}

/// Changes the content of the first event, as someone with the database file could.
async fn break_the_chain(server: &TestServer) {
    let changed = server
        .tamper("UPDATE events SET body = replace(body, 'deploy', 'destroy') WHERE seq = 1")
        .await;
    assert_eq!(changed, 1);
}

#[tokio::test]
async fn a_backup_through_the_server_is_verified_and_never_overwrites_a_file() {
    let server = server_with_tokens().await;
    request_some(&server, 3).await;
    if postgres::enabled() {
        assert_names_pg_dump(&backup(&server, ADMIN, "copy.db").await.unwrap_err());
        return;
    }
    let directory = server.database_path().parent().unwrap().to_path_buf();

    let made = backup(&server, ADMIN, "copy.db").await.unwrap();
    let copy = directory.join("copy.db");
    assert_eq!(made.path, copy.display().to_string());
    assert_eq!(
        (made.events_checked, made.first_seq, made.newest_seq),
        (3, 1, 3)
    );
    let written = std::fs::read(&copy).unwrap();
    assert_eq!(made.bytes, written.len() as u64);

    // Neither the copy just made nor any other file is ever overwritten.
    request_some(&server, 1).await;
    let again = backup(&server, ADMIN, "copy.db").await.unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    assert!(again.message().contains("never overwrites"), "{again:?}");
    assert_eq!(std::fs::read(&copy).unwrap(), written);
    std::fs::write(directory.join("notes.txt"), "keep me").unwrap();
    let other = backup(&server, ADMIN, "notes.txt").await.unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    assert_eq!(
        std::fs::read_to_string(directory.join("notes.txt")).unwrap(),
        "keep me"
    );

    // Only a plain name, in the backup directory; only an admin.
    for name in ["../escape.db", "/tmp/escape.db", ".hidden", ""] {
        let refused = backup(&server, ADMIN, name).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{name}: {refused:?}");
        assert!(refused.message().contains("file_name"), "{refused:?}");
    }
    assert!(!directory.parent().unwrap().join("escape.db").exists());
    let denied = backup(&server, WORKER, "worker.db").await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(!directory.join("worker.db").exists());

    // The copy is a database the server starts on, with the same chain.
    let restored = TestServer::start_with(|config| config.database = copy.clone()).await;
    let audit = AdminServiceClient::new(channel(&restored.url()).await)
        .verify_audit(pb::VerifyAuditRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(audit.intact, "{audit:?}");
    assert_eq!(audit.last_seq, 3);
}

#[tokio::test]
async fn a_database_whose_chain_is_broken_is_not_backed_up() {
    let server = server_with_tokens().await;
    request_some(&server, 2).await;
    break_the_chain(&server).await;
    let refused = backup(&server, ADMIN, "broken.db").await.unwrap_err();
    if postgres::enabled() {
        assert_names_pg_dump(&refused);
        return;
    }
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("does not verify at seq 1"),
        "{refused:?}"
    );
    let directory = server.database_path().parent().unwrap().to_path_buf();
    assert!(!directory.join("broken.db").exists(), "no copy is kept");
}

fn backup_command(database: &std::path::Path, file: &std::path::Path) -> std::process::Output {
    std::process::Command::new(SERVER)
        .arg("--database")
        .arg(database)
        .arg("backup")
        .arg(file)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn countersign_server_backup_copies_beside_a_running_server() {
    let server = server_with_tokens().await;
    request_some(&server, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("beside.db");
    let output = backup_command(&server.database_path(), &file);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if postgres::enabled() {
        assert!(!output.status.success());
        assert!(stderr.contains("pg_dump"), "{stderr}");
        assert!(!file.exists());
        return;
    }
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["newest_seq"], 2, "{report}");
    assert_eq!(report["events_checked"], 2, "{report}");
    assert_eq!(report["path"], file.display().to_string(), "{report}");
    let written = std::fs::read(&file).unwrap();

    let again = backup_command(&server.database_path(), &file);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), written);

    break_the_chain(&server).await;
    let broken = dir.path().join("broken.db");
    let refused = backup_command(&server.database_path(), &broken);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("does not verify at seq 1"), "{stderr}");
    assert!(!broken.exists());
}

/// With `wal_checkpoints = "external"` (for Litestream) the server leaves the WAL to another
/// process: commits stay in the WAL until that process checkpoints them.
#[tokio::test]
async fn with_external_checkpoints_the_server_never_checkpoints() {
    if postgres::skip_unless_sqlite("WAL checkpoints are SQLite's") {
        return;
    }
    let server = TestServer::start_with(|config| {
        config.storage.wal_checkpoints = WalCheckpoints::External;
    })
    .await;
    let database = server.database_path();
    let size = || std::fs::metadata(&database).unwrap().len();
    let mut client = ApprovalServiceClient::new(channel(&server.url()).await);
    client.request_approval(request(0, 0)).await.unwrap();
    let at_start = size();
    for n in 1..200 {
        client.request_approval(request(0, n)).await.unwrap();
    }
    // Ten times the server's checkpoint delay: its checkpointer would have run by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(size(), at_start, "the server checkpointed");
    let wal = std::fs::metadata(format!("{}-wal", database.display()))
        .unwrap()
        .len();
    assert!(wal > 0);

    // Another process checkpoints, as Litestream does.
    server.tamper("PRAGMA wal_checkpoint(PASSIVE)").await;
    assert!(size() > at_start, "the external checkpoint copied the WAL");
}

/// With `wal_checkpoints = "external"`, the commits in the WAL stay there across a stop and a
/// start: the server never closes the database's last connection in a way that checkpoints
/// (SQLite checkpoints on the last close unless told not to).
#[tokio::test]
async fn with_external_checkpoints_a_stop_and_a_start_leave_the_wal_as_they_found_it() {
    if postgres::skip_unless_sqlite("WAL checkpoints are SQLite's") {
        return;
    }
    let mut server = TestServer::start_with(|config| {
        config.storage.wal_checkpoints = WalCheckpoints::External;
    })
    .await;
    let database = server.database_path();
    let size = || std::fs::metadata(&database).unwrap().len();
    let wal = || {
        std::fs::metadata(format!("{}-wal", database.display()))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let mut client = ApprovalServiceClient::new(channel(&server.url()).await);
    for n in 0..50 {
        client.request_approval(request(0, n)).await.unwrap();
    }
    let (file_before, wal_before) = (size(), wal());
    assert!(wal_before > 0, "the commits are in the WAL");

    // The server's connections close after `stop` returns (the writer's on its own thread),
    // the last of them with nothing else open: watch long enough for all of them.
    server.stop().await;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(size(), file_before, "the stop checkpointed the WAL");
        assert_eq!(wal(), wal_before, "the stop removed the WAL");
    }

    server.restart().await;
    let mut client = ApprovalServiceClient::new(channel(&server.url()).await);
    client.request_approval(request(0, 50)).await.unwrap();
    assert_eq!(size(), file_before, "the start checkpointed the WAL");
    assert!(wal() > wal_before, "the WAL was started over");
}
