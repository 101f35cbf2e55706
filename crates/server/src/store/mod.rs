//! Durable storage behind one interface ([`backend::Backend`]): SQLite by default. This file
//! is the facade the application layer uses ([`Store`]); it imports the rest, never the
//! reverse:
//! - `error.rs`: [`StoreError`];
//! - `event.rs`: the stored event, its encoding, and the filters the log is read with;
//! - `records.rs`: what the store answers with (grants, snapshots, list filters) and its clock;
//! - `backend.rs`: the traits a backend implements (the writer's connection, the reads);
//! - `batch.rs`: a batch of changes planned in memory (the core decides, the plan records);
//! - `writer.rs`: the single writer and, on a shared database, the follower;
//! - `audit_sql.rs`: the audit chain's anchor, its SQL and the start-up checks;
//! - `reads.rs`: the reads both backends make with the same SQL, written once;
//! - `sqlite.rs`, `postgres.rs`: the two backends; `sqlite_writer.rs`: SQLite's writing connection;
//! - `hub.rs`: the fan-out of committed events to watch streams and waiters;
//! - `backup.rs`: online backups and their verification.
//!
//! One writer task owns the only writing connection. It takes every change waiting in its
//! queue as one batch (group commit), reads what the batch needs in a few statements, applies
//! the changes in queue order in memory, writes the result (on PostgreSQL with a fixed number
//! of set-based statements, on SQLite row by row with prepared statements) and commits; it
//! answers each caller only after that commit, and then publishes the events to the hub, so
//! seqs are assigned in commit order and nothing unpublished is ever visible. Each appended
//! event is chained to the one before it by a hash (see `audit`).
//!
//! On a database that several servers share (PostgreSQL), each batch reads the chain head
//! under the row lock that serializes the servers' writers, and the hub is fed by a follower
//! that reads the log in seq order, woken by this server's commits and by the others'
//! notifications, so that every server publishes every event once and in order.

pub(crate) mod audit_sql;
mod backend;
pub mod backup;
mod batch;
mod error;
mod event;
pub mod hub;
pub(crate) mod postgres;
mod reads;
mod records;
pub(crate) mod sqlite;
mod sqlite_writer;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::groups::Delegation;
use countersign_core::{
    Approval, ApprovalRequest, ConsumeOutcome, DecideOutcome, Decision, Delivery, Disposition,
    EditedVersion, Millis,
};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::audit::AuditReport;
use crate::config::{Database, StorageConfig};
use crate::receipts::ReceiptKeys;
use audit_sql::IntegrityError;
use backend::Backend;
use backup::{Backup, BackupError};
use batch::{Change, PreparedRequest, Reply};
pub use error::StoreError;
pub(crate) use event::{AuditedEvent, EventFilter, StoredEvent};
use hub::Hub;
use records::Snapshot;
pub(crate) use records::{
    now_millis, Grant, GrantFilter, ListFilter, Passkey, PasskeyWrite, Requested,
};
pub use writer::CommitObserver;
use writer::{follow, Job, Writer};

/// The handle the services use; cheap to clone.
#[derive(Clone)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
    backend: Arc<dyn Backend>,
    writable: watch::Receiver<bool>,
    /// Tells the writer to stop ([`Store::close`]).
    stop_writer: Arc<Notify>,
    /// Closed once the writer's thread has ended, its connection closed.
    writer_running: watch::Receiver<()>,
}

impl Store {
    /// Opens (creating if needed) the database, applies migrations and starts the writer (and,
    /// on a shared database, the follower that publishes every server's events).
    pub async fn open(
        database: &Path,
        config: &StorageConfig,
        hub: Hub,
        observer: Option<Arc<dyn CommitObserver>>,
        receipts: Option<Arc<ReceiptKeys>>,
    ) -> Result<Store, StoreError> {
        let (health, writable) = watch::channel(true);
        let (backend, conn, follower): (Arc<dyn Backend>, _, _) = match Database::of(database) {
            Database::Sqlite(path) => {
                let (backend, conn) =
                    sqlite::SqliteBackend::open(path, config, writable.clone()).await?;
                (Arc::new(backend), conn, None)
            }
            Database::Postgres(url) => {
                let wake = Arc::new(Notify::new());
                let (backend, conn) =
                    postgres::PostgresBackend::open(url, config, wake.clone(), writable.clone())
                        .await?;
                (Arc::new(backend), conn, Some(wake))
            }
        };
        let mut conn = conn;
        let chain = conn.chain_head().await?;
        if let Some(wake) = &follower {
            tokio::spawn(follow(
                backend.clone(),
                hub.clone(),
                wake.clone(),
                chain.seq,
                writable.clone(),
            ));
        }
        let (jobs, queue) = mpsc::channel(config.max_batch.max(1) * 4);
        let max_batch = if config.group_commit {
            config.max_batch.max(1)
        } else {
            1
        };
        // The writer opens its own connection on its own thread: a PostgreSQL connection's
        // socket is served by the runtime it was opened on.
        drop(conn);
        let writer = Writer {
            backend: backend.clone(),
            conn: None,
            chain: Some(chain),
            health,
            redact_arguments: config.redact_arguments,
            receipts,
            follower,
        };
        // The writer gets a thread of its own: on the server's runtime each of its awaits (a
        // statement, the commit) queued behind the calls' tasks, and every change waits for it.
        // (The runtime is built on that thread: one dropped inside the server's runtime, as
        // after a failed spawn, would panic.)
        let (started, on_start) = oneshot::channel();
        let stop_writer = Arc::new(Notify::new());
        let stop = stop_writer.clone();
        let (running, writer_running) = watch::channel(());
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                // Dropped when the thread ends, after the writer and its connection.
                let _running = running;
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        let _ = started.send(Ok(()));
                        runtime.block_on(writer.run(queue, max_batch, hub, observer, stop));
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                    }
                }
            })
            .map_err(StoreError::WriterThread)?;
        on_start
            .await
            .map_err(|_| StoreError::Closed)?
            .map_err(StoreError::WriterThread)?;
        Ok(Store {
            jobs,
            backend,
            writable,
            stop_writer,
            writer_running,
        })
    }

    /// Closes the store at a clean stop: the writer commits the changes already queued (later
    /// ones fail with [`StoreError::Closed`]) and closes its connection, then the backend
    /// closes the others. On SQLite the last one checkpoints the whole WAL into the database
    /// file (unless another process owns the checkpoints), so a copy of that file alone holds
    /// every change acknowledged.
    pub async fn close(&self) {
        self.stop_writer.notify_one();
        let mut writer_running = self.writer_running.clone();
        while writer_running.changed().await.is_ok() {}
        self.backend.close().await;
    }

    /// Whether the database accepts writes: false from a failed commit until a later write
    /// (a caller's or the writer's own probe) commits again.
    pub(crate) fn writable(&self) -> watch::Receiver<bool> {
        self.writable.clone()
    }

    async fn submit(&self, change: Change, now: Millis) -> Result<Reply, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { change, now, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Creates an approval (or returns the one with the same idempotency key). An approval
    /// that would wait for people is refused when its agent already has `max_pending` pending
    /// ones (0: no limit).
    pub(crate) async fn request(
        &self,
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        max_pending: u32,
        now: Millis,
    ) -> Result<Requested, StoreError> {
        // Made here, on the caller's task, while the writer commits other batches.
        let prepared = PreparedRequest::of(&request, ttl_seconds, &disposition, now)?.map(Box::new);
        let change = Change::Request {
            request,
            ttl_seconds,
            disposition,
            max_pending,
            prepared,
        };
        match self.submit(change, now).await? {
            Reply::Requested(requested) => Ok(requested),
            _ => Err(unexpected_reply()),
        }
    }

    /// Applies a decision. A session-scoped approval creates a grant that lasts
    /// `grant_ttl_seconds` (0: until revoked).
    pub(crate) async fn decide(
        &self,
        approval_id: &str,
        decision: Decision,
        edit: Option<EditedVersion>,
        grant_ttl_seconds: u32,
        now: Millis,
    ) -> Result<(DecideOutcome, Approval), StoreError> {
        let change = Change::Decide {
            approval_id: approval_id.to_string(),
            decision,
            edit,
            grant_ttl_seconds,
        };
        match self.submit(change, now).await? {
            Reply::Decided(outcome, approval) => Ok((outcome, approval)),
            _ => Err(unexpected_reply()),
        }
    }

    /// Puts a refused decision on the audit trail (a DECISION_REFUSED event); the approval
    /// stays as it is.
    pub(crate) async fn refuse_decision(
        &self,
        approval_id: &str,
        decision: Decision,
        why: &str,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        let change = Change::RefuseDecision {
            approval_id: approval_id.to_string(),
            decision,
            why: why.to_string(),
        };
        self.submit_for_approval(change, now).await
    }

    /// Revokes a session grant at once, with a GRANT_REVOKED event on its approval. Revoking a
    /// revoked grant changes nothing.
    pub(crate) async fn revoke_grant(
        &self,
        grant_id: &str,
        revoked_by: &str,
        reason: &str,
        now: Millis,
    ) -> Result<Grant, StoreError> {
        let change = Change::RevokeGrant {
            grant_id: grant_id.to_string(),
            revoked_by: revoked_by.to_string(),
            reason: reason.to_string(),
        };
        match self.submit(change, now).await? {
            Reply::Grant(grant) => Ok(grant),
            _ => Err(unexpected_reply()),
        }
    }

    /// Records a RULE_ACCEPTED event with `detail` on an approval (which stays as it is).
    pub(crate) async fn record_rule_accepted(
        &self,
        approval_id: &str,
        detail: &str,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        let change = Change::RecordRuleAccepted {
            approval_id: approval_id.to_string(),
            detail: detail.to_string(),
        };
        self.submit_for_approval(change, now).await
    }

    pub(crate) async fn cancel(
        &self,
        approval_id: &str,
        reason: &str,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        let change = Change::Cancel {
            approval_id: approval_id.to_string(),
            reason: reason.to_string(),
        };
        self.submit_for_approval(change, now).await
    }

    pub(crate) async fn consume(
        &self,
        approval_id: &str,
        outcome: ConsumeOutcome,
        detail: &str,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        let change = Change::Consume {
            approval_id: approval_id.to_string(),
            outcome,
            detail: detail.to_string(),
        };
        self.submit_for_approval(change, now).await
    }

    pub(crate) async fn record_delivery(
        &self,
        approval_id: &str,
        delivery: Delivery,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        let change = Change::RecordDelivery {
            approval_id: approval_id.to_string(),
            delivery,
        };
        self.submit_for_approval(change, now).await
    }

    async fn submit_for_approval(
        &self,
        change: Change,
        now: Millis,
    ) -> Result<Approval, StoreError> {
        match self.submit(change, now).await? {
            Reply::Approval(approval) => Ok(approval),
            _ => Err(unexpected_reply()),
        }
    }

    /// Uses the OpenID CIBA client assertion `jti` of `client_id`, remembered until
    /// `expires_at`: false when it was used before (a replay).
    pub(crate) async fn use_client_assertion(
        &self,
        client_id: &str,
        jti: &str,
        expires_at: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let change = Change::UseClientAssertion {
            client_id: client_id.to_owned(),
            jti: jti.to_owned(),
            expires_at,
        };
        match self.submit(change, now).await? {
            Reply::FirstUse(first) => Ok(first),
            _ => Err(unexpected_reply()),
        }
    }

    /// Expires, escalates and reminds the pending approvals whose next due time passed (at
    /// most [`batch::EXPIRY_SWEEP_LIMIT`] at a time); returns how many changed.
    pub(crate) async fn sweep_due(&self, now: Millis) -> Result<u64, StoreError> {
        self.submit_for_count(Change::FollowUpDue, now).await
    }

    /// Stores a new delegation.
    pub(crate) async fn create_delegation(
        &self,
        delegation: Delegation,
        now: Millis,
    ) -> Result<Delegation, StoreError> {
        self.submit_for_delegation(Change::CreateDelegation { delegation }, now)
            .await
    }

    /// Ends a delegation now; revoking a revoked one changes nothing.
    pub(crate) async fn revoke_delegation(
        &self,
        delegation_id: &str,
        now: Millis,
    ) -> Result<Delegation, StoreError> {
        let change = Change::RevokeDelegation {
            delegation_id: delegation_id.to_string(),
        };
        self.submit_for_delegation(change, now).await
    }

    async fn submit_for_delegation(
        &self,
        change: Change,
        now: Millis,
    ) -> Result<Delegation, StoreError> {
        match self.submit(change, now).await? {
            Reply::Delegation(delegation) => Ok(delegation),
            _ => Err(unexpected_reply()),
        }
    }

    /// Registers, counts or removes a passkey (see [`PasskeyWrite`]).
    pub(crate) async fn write_passkey(
        &self,
        write: PasskeyWrite,
        now: Millis,
    ) -> Result<(), StoreError> {
        self.submit(Change::WritePasskey(write), now).await?;
        Ok(())
    }

    /// The passkeys `approver` registered, oldest first.
    pub(crate) async fn list_passkeys(&self, approver: &str) -> Result<Vec<Passkey>, StoreError> {
        self.backend.list_passkeys(approver).await
    }

    /// Deletes events older than `before`; returns how many.
    pub(crate) async fn prune_events(
        &self,
        before: Millis,
        now: Millis,
    ) -> Result<u64, StoreError> {
        self.submit_for_count(Change::PruneEvents { before }, now)
            .await
    }

    async fn submit_for_count(&self, change: Change, now: Millis) -> Result<u64, StoreError> {
        match self.submit(change, now).await? {
            Reply::Count(n) => Ok(n),
            _ => Err(unexpected_reply()),
        }
    }

    pub(crate) async fn check_integrity(&self) -> Result<(), IntegrityError> {
        self.backend.check_integrity().await
    }

    pub(crate) async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        self.backend.get(approval_id).await
    }

    pub(crate) async fn count_pending(&self) -> Result<i64, StoreError> {
        self.backend.count_pending().await
    }

    pub(crate) async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
        self.backend.list(filter).await
    }

    pub(crate) async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        self.backend.snapshot(channel).await
    }

    pub(crate) async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.backend.events_after(after_seq, limit).await
    }

    pub(crate) async fn log_bounds(&self) -> Result<(i64, i64), StoreError> {
        self.backend.log_bounds().await
    }

    /// The event log's history id: a watch cursor is (history id, seq).
    pub fn history(&self) -> &str {
        self.backend.history()
    }

    pub(crate) async fn list_events(
        &self,
        filter: &EventFilter,
    ) -> Result<Vec<AuditedEvent>, StoreError> {
        self.backend.list_events(filter).await
    }

    pub(crate) async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        self.backend.verify_audit().await
    }

    /// See [`Backend::backup`].
    pub(crate) async fn backup(&self, into: &Path) -> Result<Backup, BackupError> {
        self.backend.backup(into).await
    }

    pub(crate) async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError> {
        self.backend.list_grants(filter, now).await
    }

    pub(crate) async fn list_delegations(
        &self,
        approver: &str,
        include_inactive: bool,
        now: Millis,
    ) -> Result<Vec<Delegation>, StoreError> {
        self.backend
            .list_delegations(approver, include_inactive, now)
            .await
    }

    /// See [`Backend::shared_by_replicas`].
    pub(crate) fn shared_by_replicas(&self) -> bool {
        self.backend.shared_by_replicas()
    }

    /// Whether this server runs the background sweeps now (see [`Backend::leads_sweeps`]).
    pub(crate) async fn leads_sweeps(&self) -> bool {
        self.backend.leads_sweeps().await
    }

    /// See [`Backend::take_token`].
    pub(crate) async fn take_token(
        &self,
        key: &str,
        per_ms: f64,
        burst: f64,
        now: Millis,
    ) -> Result<Option<Result<(), Duration>>, StoreError> {
        self.backend.take_token(key, per_ms, burst, now).await
    }
}

fn unexpected_reply() -> StoreError {
    StoreError::Corrupt("unexpected writer reply".into())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use countersign_core::{Decider, EventKind, ResolvedBy, Risk, Scope, Verdict};
    use sqlx::sqlite::SqliteConnection;
    use sqlx::Connection;

    use super::*;

    fn request(key: &str) -> ApprovalRequest {
        ApprovalRequest {
            agent_id: "agent".into(),
            session_id: String::new(),
            requester: "tester".into(),
            idempotency_key: key.into(),
            tool_name: "shell".into(),
            arguments_json: r#"{"cmd":"ls"}"#.into(),
            args_digest: countersign_core::digest::args_digest(&serde_json::json!({"cmd": "ls"})),
            action: "list files".into(),
            reason: String::new(),
            risk: Risk::Low,
            routes: Vec::new(),
            required_approvals: 1,
            ttl_seconds: None,
            labels: BTreeMap::new(),
            policy_rule: None,
            separation_of_duties: false,
            grant_scope: String::new(),
            approver_groups: Vec::new(),
            follow_up: None,
            withdraw_when_caller_leaves: false,
            step_up: None,
        }
    }

    fn auto_approved() -> Disposition {
        Disposition::Resolve {
            verdict: Verdict::Approve,
            resolved_by: ResolvedBy::Rule,
            rule: Some("allow-ls".into()),
            grant_id: None,
            reason: "policy".into(),
        }
    }

    #[tokio::test]
    async fn after_a_rolled_back_batch_the_chain_continues_from_the_committed_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = Store::open(&path, &StorageConfig::default(), Hub::new(16), None, None)
            .await
            .unwrap();
        let now = now_millis();
        store
            .request(request("first"), 60, Disposition::RequireHuman, 0, now)
            .await
            .unwrap();

        // A change whose first event is appended (advancing the writer's head) and whose
        // second one fails, so the whole batch rolls back.
        let mut admin = SqliteConnection::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse_resolved AFTER INSERT ON events WHEN NEW.kind = 'RESOLVED'
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        )
        .execute(&mut admin)
        .await
        .unwrap();
        let refused = store
            .request(request("auto"), 60, auto_approved(), 0, now)
            .await;
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{refused:?}"
        );
        sqlx::query("DROP TRIGGER refuse_resolved")
            .execute(&mut admin)
            .await
            .unwrap();

        store
            .request(request("second"), 60, Disposition::RequireHuman, 0, now)
            .await
            .unwrap();
        store
            .request(request("auto"), 60, auto_approved(), 0, now)
            .await
            .unwrap();
        let report = store.verify_audit().await.unwrap();
        assert_eq!(report.broken, None, "{report:?}");
        assert_eq!(
            (report.first_seq, report.last_seq, report.events_checked),
            (1, 4, 4)
        );
    }

    /// Records the size of every committed batch.
    #[derive(Default)]
    struct BatchSizes(Mutex<Vec<usize>>);

    impl CommitObserver for BatchSizes {
        fn committed(&self, batch_size: usize, _latency: Duration) {
            self.0.lock().unwrap().push(batch_size);
        }
    }

    fn approve_by(approver: &str) -> Decision {
        Decision {
            verdict: Verdict::Approve,
            scope: Scope::Once,
            reason: String::new(),
            decider: Decider {
                channel: "telegram".into(),
                user_id: approver.into(),
                display_name: approver.into(),
            },
            approver: approver.into(),
            idempotency_key: format!("tap-{approver}"),
            decided_at: 0,
            args_digest: String::new(),
            edited_arguments_json: String::new(),
            restarts_count: false,
            delegate: None,
            step_up: None,
        }
    }

    /// A store on `path` that records the size of every batch it commits.
    async fn observed_store(path: &Path) -> (Store, Arc<BatchSizes>) {
        let sizes = Arc::new(BatchSizes::default());
        let store = Store::open(
            path,
            &StorageConfig::default(),
            Hub::new(1024),
            Some(sizes.clone()),
            None,
        )
        .await
        .unwrap();
        (store, sizes)
    }

    /// Holds the database's write lock so that the writer waits on its next batch while the
    /// changes `spawn` starts queue up behind it and form one batch together; returns their
    /// results.
    async fn in_one_batch<T: Send + 'static>(
        path: &Path,
        store: &Store,
        spawn: impl FnOnce(&Store) -> Vec<tokio::task::JoinHandle<T>>,
    ) -> Vec<T> {
        let mut blocker = SqliteConnection::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut blocker)
            .await
            .unwrap();
        let stuck = tokio::spawn({
            let store = store.clone();
            async move { store.sweep_due(now_millis()).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let changes = spawn(store);
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        stuck.await.unwrap().unwrap();
        let mut results = Vec::with_capacity(changes.len());
        for change in changes {
            results.push(change.await.unwrap());
        }
        results
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_made_in_their_callers_tasks_keep_idempotency_and_the_chain_in_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let (store, sizes) = observed_store(&path).await;
        // Each key twice, and one request a policy resolves at once (its events are made by
        // the writer): all in one batch.
        let requested = in_one_batch(&path, &store, |store| {
            (0..11)
                .map(|i| {
                    let store = store.clone();
                    let (key, disposition) = match i {
                        10 => ("auto".to_string(), auto_approved()),
                        i => (format!("key-{}", i % 5), Disposition::RequireHuman),
                    };
                    tokio::spawn(async move {
                        store
                            .request(request(&key), 60, disposition, 0, now_millis())
                            .await
                    })
                })
                .collect()
        })
        .await;
        assert!(
            sizes.0.lock().unwrap().iter().any(|&size| size >= 11),
            "the requests did not land in one batch: {:?}",
            sizes.0.lock().unwrap()
        );
        let requested: Vec<Requested> = requested.into_iter().map(Result::unwrap).collect();
        for key in 0..5 {
            let (first, again) = (&requested[key], &requested[key + 5]);
            assert_eq!(first.approval.id, again.approval.id, "key-{key}");
            assert!(first.created != again.created, "key-{key}: one creates it");
        }
        for requested in &requested {
            let stored = store.get(&requested.approval.id).await.unwrap();
            assert_eq!(stored, requested.approval);
        }
        assert!(!requested[10].approval.is_pending());
        let report = store.verify_audit().await.unwrap();
        assert_eq!(report.broken, None, "{report:?}");
        // Five REQUESTED, and REQUESTED + RESOLVED of the resolved one.
        assert_eq!(report.events_checked, 7, "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_decisions_in_one_batch_have_exactly_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let (store, sizes) = observed_store(&path).await;
        let now = now_millis();
        let approval = store
            .request(request("contested"), 60, Disposition::RequireHuman, 0, now)
            .await
            .unwrap()
            .approval;

        let deciders = in_one_batch(&path, &store, |store| {
            (0..40)
                .map(|i| {
                    let store = store.clone();
                    let id = approval.id.clone();
                    tokio::spawn(async move {
                        let mut decision = approve_by(&format!("approver-{i}"));
                        if i % 2 == 1 {
                            decision.verdict = Verdict::Reject;
                        }
                        store.decide(&id, decision, None, 0, now_millis()).await
                    })
                })
                .collect()
        })
        .await;

        let mut resolved = 0;
        for decider in deciders {
            let (outcome, _) = decider.unwrap();
            match outcome {
                DecideOutcome::Resolved => resolved += 1,
                DecideOutcome::AlreadyResolved => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(resolved, 1, "exactly one decision resolves the approval");
        assert!(
            sizes.0.lock().unwrap().iter().any(|&size| size >= 40),
            "the decisions did not land in one batch: {:?}",
            sizes.0.lock().unwrap()
        );
        let stored = store.get(&approval.id).await.unwrap();
        assert_eq!(stored.decisions.len(), 1);
        let resolutions = store
            .list_events(&EventFilter {
                approval_id: approval.id.clone(),
                kinds: vec![EventKind::Resolved],
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(resolutions.len(), 1);
    }
}
