//! Online backups and restores (issue 27). The real binary under load gets a backup through
//! the admin RPC in the middle, is killed with SIGKILL and restored from the copy: everything
//! acknowledged before the backup began is back, the chain verifies, the server serves, and a
//! watcher whose persisted cursor is ahead of the restored log re-lists and carries on. A
//! database whose chain is broken is not copied, a file is never overwritten, and on
//! PostgreSQL the command says that pg_dump is the way.

use crate::process;

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

/// Every approval id stored in the SQLite file `database`.
async fn approval_ids(database: &std::path::Path) -> std::collections::HashSet<String> {
    use sqlx::Connection;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(database)
        .create_if_missing(false);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM approvals")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    ids.into_iter().collect()
}

/// The size of the WAL beside `database`; 0 when there is none.
fn wal_bytes(database: &std::path::Path) -> u64 {
    std::fs::metadata(format!("{}-wal", database.display()))
        .map(|m| m.len())
        .unwrap_or(0)
}

/// A connection to `database` that holds one read snapshot until [`unpin`]: the commits
/// after it stay in the WAL, whatever the checkpoints do.
async fn pin_the_wal(database: &std::path::Path) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(database);
    let mut reader = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut reader).await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals")
        .fetch_one(&mut reader)
        .await
        .unwrap();
    reader
}

async fn unpin(mut reader: sqlx::SqliteConnection) {
    use sqlx::Connection;
    sqlx::query("ROLLBACK").execute(&mut reader).await.unwrap();
    reader.close().await.unwrap();
}

/// A clean stop (SIGTERM) under load leaves everything acknowledged in the database file
/// itself: copied alone, as docs/deployment.md allows for a stopped server, the file holds
/// every acknowledged approval, and no WAL is left beside it (issue 44, item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_stop_under_load_leaves_every_acknowledged_approval_in_the_database_file() {
    if postgres::skip_unless_sqlite("a database file at rest is SQLite's") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("countersign.db");
    let mut server = Server::new(dir.path(), &database.display().to_string(), 0);
    server.start().await;
    let url = server.url();

    let acknowledged: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut writers = Vec::new();
    for writer in 0..8 {
        let mut client = ApprovalServiceClient::new(channel(&url).await);
        let acknowledged = acknowledged.clone();
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                match client.request_approval(request(writer, n)).await {
                    Ok(answer) => acknowledged
                        .lock()
                        .unwrap()
                        .push(answer.into_inner().approval.unwrap().id),
                    Err(_) => return,
                }
            }
        }));
    }
    let count = || acknowledged.lock().unwrap().len();
    until("100 requests are acknowledged", || count() >= 100).await;
    // A reader in another process that holds one snapshot meanwhile (a backup's copy, the
    // sqlite3 shell) keeps the commits after it in the WAL: the server's passive checkpoints
    // cannot copy them. It lets go only once the stop has begun.
    let reader = pin_the_wal(&database).await;
    until("400 requests are acknowledged", || count() >= 400).await;
    server.terminate();
    for writer in writers {
        writer.await.unwrap();
    }
    unpin(reader).await;
    let status = server.exited().await;
    assert!(status.success(), "a clean stop exits 0: {status}");
    let acknowledged = acknowledged.lock().unwrap().clone();
    let wal_left = wal_bytes(&database);

    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("countersign.db");
    std::fs::copy(&database, &copy).unwrap();
    let stored = approval_ids(&copy).await;
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !stored.contains(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged approvals are not in the copied file, e.g. {:?}",
        missing.len(),
        acknowledged.len(),
        missing.first()
    );
    assert_eq!(wal_left, 0, "a clean stop leaves no WAL");
}

/// The WAL does not stay at its largest: past a burst it shrinks back to
/// `storage.wal_size_limit_bytes` as commits go on, and a backup (whose long read keeps every
/// commit meanwhile in the WAL) ends with the WAL emptied (issue 44, item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_shrinks_back_to_its_limit_after_a_burst_and_a_backup() {
    if postgres::skip_unless_sqlite("the WAL is SQLite's") {
        return;
    }
    const LIMIT: u64 = 64 * 1024;
    let server = TestServer::start_with(|config| {
        config.tokens = vec![token("ops", Role::Admin, &[], ADMIN)];
        config.storage.wal_size_limit_bytes = LIMIT;
    })
    .await;
    let database = server.database_path();
    let mut client = ApprovalServiceClient::new(channel(&server.url()).await);
    let mut n = 0;
    let mut request_one = || {
        n += 1;
        with_token(request(0, n), ADMIN)
    };

    // A reader that holds one snapshot keeps every later commit in the WAL: it grows past the
    // limit whatever the checkpoints do.
    client.request_approval(request_one()).await.unwrap();
    let reader = pin_the_wal(&database).await;
    while wal_bytes(&database) <= 2 * LIMIT {
        client.request_approval(request_one()).await.unwrap();
    }
    unpin(reader).await;

    // With the reader gone, the checkpoints catch up and the next commits start the WAL over,
    // cut back to the limit.
    tokio::time::timeout(PATIENCE, async {
        while wal_bytes(&database) > LIMIT {
            client.request_approval(request_one()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the WAL stayed at {} bytes past its limit of {LIMIT}",
            wal_bytes(&database)
        )
    });

    // Again past the limit, then a backup: it ends with the WAL emptied.
    let reader = pin_the_wal(&database).await;
    while wal_bytes(&database) <= 2 * LIMIT {
        client.request_approval(request_one()).await.unwrap();
    }
    unpin(reader).await;
    backup(&server, ADMIN, "after-burst.db").await.unwrap();
    assert_eq!(wal_bytes(&database), 0, "the backup leaves the WAL empty");
    client.request_approval(request_one()).await.unwrap();
    assert!(wal_bytes(&database) <= LIMIT);
}

fn verify_command(file: &std::path::Path) -> (bool, String, String) {
    let output = std::process::Command::new(SERVER)
        .arg("verify")
        .arg(file)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `countersign-server verify FILE` checks a database file at rest in full: SQLite's own
/// integrity check, the whole hash chain event by event and every approval against its events.
/// A copy edited in the middle (which the start-up checks of the chain's ends let through)
/// fails, naming the first bad seq or approval; the untouched copy passes (issue 44, item 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn countersign_server_verify_names_what_was_edited_in_a_backup_file() {
    let server = server_with_tokens().await;
    if postgres::enabled() {
        // A file at rest is SQLite's; a PostgreSQL database is checked where it runs. The
        // message names the database without the credentials its URL may carry.
        let (passed, _, stderr) = verify_command(&server.database_path());
        assert!(!passed);
        assert!(stderr.contains("VerifyAudit"), "{stderr}");
        let url = server.database_path().display().to_string();
        let password_and_host = url.split("://").nth(1).unwrap();
        assert!(!stderr.contains(password_and_host), "{stderr}");
        return;
    }
    request_some(&server, 6).await;
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup.db");
    assert!(backup_command(&server.database_path(), &backup)
        .status
        .success());
    let untouched = std::fs::read(&backup).unwrap();

    let (passed, stdout, stderr) = verify_command(&backup);
    assert!(passed, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["events_checked"], 6, "{report}");
    assert_eq!(report["newest_seq"], 6, "{report}");
    assert_eq!(
        std::fs::read(&backup).unwrap(),
        untouched,
        "verify changes nothing"
    );
    for beside in ["-wal", "-shm"] {
        let beside = format!("{}{beside}", backup.display());
        assert!(
            !std::path::Path::new(&beside).exists(),
            "verify left {beside}"
        );
    }

    let approval_of_seq_4: String = {
        use sqlx::Connection;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&backup);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT approval_id FROM events WHERE seq = 4")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let edits = [
        (
            "UPDATE events SET body = replace(body, 'deploy', 'destroy') WHERE seq = 3",
            "seq 3".to_string(),
        ),
        (
            "DELETE FROM events WHERE seq = 3",
            "rows 3 to 3 are missing".to_string(),
        ),
        (
            "UPDATE approvals SET state = 'APPROVED', body = json_set(body, '$.state', 'APPROVED')
              WHERE id = (SELECT approval_id FROM events WHERE seq = 4)",
            format!("approval {approval_of_seq_4}"),
        ),
    ];
    for (number, (edit, named)) in edits.iter().enumerate() {
        let edited = dir.path().join(format!("edited-{number}.db"));
        std::fs::write(&edited, &untouched).unwrap();
        {
            use sqlx::Connection;
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&edited);
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let changed = sqlx::query(edit).execute(&mut conn).await.unwrap();
            assert_eq!(changed.rows_affected(), 1, "{edit}");
            conn.close().await.unwrap();
        }
        let (passed, _, stderr) = verify_command(&edited);
        assert!(!passed, "{edit}: the edited copy verified");
        assert!(stderr.contains(named.as_str()), "{edit}: {stderr}");
    }

    // The restore steps of docs/deployment.md begin with this check.
    let deployment = include_str!("../../../docs/deployment.md");
    let restore = deployment
        .split("**Restore.**")
        .nth(1)
        .and_then(|steps| steps.split("\n\n").nth(1))
        .expect("restore steps in docs/deployment.md");
    assert!(
        restore.starts_with("1. Verify the backup: `countersign-server verify "),
        "{restore}"
    );

    // A file whose pages were damaged fails SQLite's integrity check.
    let damaged = dir.path().join("damaged.db");
    let mut bytes = untouched.clone();
    let page = 4096;
    let last_page = bytes.len() - page;
    bytes[last_page + 8..last_page + 200].fill(0xA5);
    std::fs::write(&damaged, &bytes).unwrap();
    let (passed, _, stderr) = verify_command(&damaged);
    assert!(!passed, "the damaged copy verified");
    assert!(stderr.contains(&damaged.display().to_string()), "{stderr}");
}

/// The server's `--database` and `--config` are read after the subcommand as before it
/// (`backup FILE --database X` was refused as an unexpected argument).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_flags_work_after_the_subcommand() {
    let server = server_with_tokens().await;
    request_some(&server, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("countersign.toml");
    std::fs::write(
        &config,
        format!(
            "database = {:?}\n",
            server.database_path().display().to_string()
        ),
    )
    .unwrap();
    for (name, flag, value) in [
        ("database.db", "--database", server.database_path()),
        ("config.db", "--config", config.clone()),
    ] {
        let file = dir.path().join(name);
        let output = std::process::Command::new(SERVER)
            .arg("backup")
            .arg(&file)
            .arg(flag)
            .arg(&value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if postgres::enabled() {
            assert!(stderr.contains("pg_dump"), "{flag}: {stderr}");
            continue;
        }
        assert!(output.status.success(), "{flag}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["newest_seq"], 1, "{flag}: {report}");
        assert!(file.exists());
    }
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as `-`.
fn anchor_of(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown page's headings (code blocks left out).
fn anchors_of(page: &str) -> Vec<String> {
    let mut in_code = false;
    let mut anchors = Vec::new();
    for line in page.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            anchors.push(anchor_of(line));
        }
    }
    anchors
}

/// Every `docs/PAGE.md#anchor` the server's help texts point to is a heading of that page
/// (`backup --help` pointed to `#backup-and-restore`, the heading is "Backup and restore
/// (SQLite)").
#[test]
fn the_help_texts_point_to_headings_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut links = 0;
    for args in [
        &["--help"][..],
        &["backup", "--help"],
        &["audit", "--help"],
        &["healthcheck", "--help"],
    ] {
        let output = std::process::Command::new(SERVER)
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}");
        let help = String::from_utf8(output.stdout).unwrap();
        for word in help.split_whitespace() {
            let Some(at) = word.find("docs/") else {
                continue;
            };
            let link = word[at..].trim_end_matches(|c: char| !c.is_alphanumeric());
            let Some((page, anchor)) = link.split_once('#') else {
                continue;
            };
            links += 1;
            let text = std::fs::read_to_string(root.join(page)).unwrap();
            assert!(
                anchors_of(&text).iter().any(|found| found == anchor),
                "{args:?} points to {link}, a heading {page} does not have"
            );
        }
    }
    assert!(links > 0, "no help text points into the docs");
}

/// A `storage.backup_dir` that is missing, or not a directory, stops the server at start-up
/// with the option named, instead of failing the first backup.
#[tokio::test]
async fn a_backup_directory_that_is_not_there_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_directory = dir.path().join("a-file");
    std::fs::write(&not_a_directory, "").unwrap();
    for backup_dir in [dir.path().join("missing"), not_a_directory] {
        let config = dir.path().join("countersign.toml");
        std::fs::write(
            &config,
            format!(
                "[storage]\nbackup_dir = {:?}\n",
                backup_dir.display().to_string()
            ),
        )
        .unwrap();
        let output = tokio::time::timeout(
            PATIENCE,
            tokio::process::Command::new(SERVER)
                .arg("--config")
                .arg(&config)
                .arg("--listen")
                .arg("127.0.0.1:0")
                .arg("--database")
                .arg(dir.path().join("countersign.db"))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the server started instead of refusing its backup_dir")
        .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("storage.backup_dir {}", backup_dir.display())),
            "{stderr}"
        );
    }
}
