//! Durable storage behind one interface ([`Backend`]): SQLite by default.
//!
//! One writer task owns the only writing connection. It takes every change waiting in its
//! queue as one batch (group commit), reads what the batch needs in a few statements, applies
//! the changes in queue order in memory ([`batch`]), writes the result with a fixed number of
//! set-based statements and commits; it answers each caller only after that commit, and then
//! publishes the events to the hub, so seqs are assigned in commit order and nothing
//! unpublished is ever visible. Each appended event is chained to the one before it by a hash
//! (see `audit`).
//!
//! On a database that several servers share (PostgreSQL), each batch reads the chain head
//! under the row lock that serializes the servers' writers, and the hub is fed by a follower
//! that reads the log in seq order, woken by this server's commits and by the others'
//! notifications, so that every server publishes every event once and in order.

pub mod batch;
pub mod postgres;
mod reads;
pub mod sqlite;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use countersign_core::groups::{Delegation, FollowUp};
use countersign_core::{
    Approval, ApprovalRequest, ArgsEdit, ConsumeOutcome, Consumption, DecideOutcome, Decision,
    Delivery, Disposition, EditedVersion, Error as DomainError, EventKind, Millis, Resolution,
    Route, State,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::audit::AuditReport;
use crate::backup::{Backup, BackupError};
use crate::config::{Database, StorageConfig};
use crate::history::{AuditedEvent, EventFilter, GrantFilter};
use crate::hub::Hub;
use crate::integrity::IntegrityError;
use batch::{BatchKeys, Change, Loaded, Plan, WriteSet};

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    /// The database refused to commit (disk full, I/O error); nothing of the change was kept.
    #[error("storage refuses writes ({0}); nothing was changed, retry later")]
    Unavailable(String),
    #[error("the store is shutting down")]
    Closed,
    #[error("cannot start the store's writer thread: {0}")]
    WriterThread(std::io::Error),
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

/// One committed entry of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: i64,
    pub kind: EventKind,
    pub at: Millis,
    pub approval: Approval,
    pub decision: Option<Decision>,
    pub delivery: Option<Delivery>,
    /// DECISION_REFUSED: why; GRANT_REVOKED: which grant and why.
    pub detail: Option<String>,
}

/// An event as the writer makes it: the approval as it is right after the event.
pub(crate) struct EventBody {
    pub approval: Approval,
    pub decision: Option<Decision>,
    pub delivery: Option<Delivery>,
    pub detail: Option<String>,
}

/// The JSON stored in `events.body`. A REQUESTED event stores the approval as requested,
/// without its argument values (the approval's row holds them; `args_digest` stands for them
/// in the hash chain); every later event stores only what the approval's changing parts are
/// right after it ([`Progress`]), so an event costs what changed, not a copy of the approval.
/// Rows written before this format (migration 0007) store the whole approval in every event
/// and are read as they are.
#[derive(Serialize, Deserialize)]
struct StoredBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<Approval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery: Option<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

/// The parts of an approval that change after its request, right after an event. Decisions
/// are only ever appended (each is in the event that added it), so with the approval as it is
/// now they give back the approval as it was then.
#[derive(Serialize, Deserialize)]
struct Progress {
    agent_id: String,
    state: State,
    decisions: usize,
    deliveries: Vec<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    consumption: Option<Consumption>,
    /// The current edit of the arguments, without their values (the row's decisions hold
    /// them; the edit's digest stands for them in the hash chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    edit: Option<ArgsEdit>,
    /// With a follow-up plan: how far it went, and the deadline (an escalation on timeout
    /// moves it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    follow_up: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<Millis>,
    /// With a follow-up plan: the routes (an escalation adds its group's destinations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routes: Option<Vec<Route>>,
}

impl EventBody {
    /// The JSON to store for this event.
    fn stored(&self, kind: EventKind) -> Result<serde_json::Value, StoreError> {
        let (approval, after) = if kind == EventKind::Requested {
            let mut requested = self.approval.clone();
            requested.clear_argument_values();
            (Some(requested), None)
        } else {
            let edit = without_values(&self.approval.edit);
            let progress = Progress {
                agent_id: self.approval.agent_id.clone(),
                state: self.approval.state,
                decisions: self.approval.decisions.len(),
                deliveries: self.approval.deliveries.clone(),
                resolution: self.approval.resolution.clone(),
                consumption: self.approval.consumption.clone(),
                edit,
                follow_up: self.approval.follow_up.clone(),
                expires_at: self
                    .approval
                    .follow_up
                    .is_some()
                    .then_some(self.approval.expires_at),
                routes: self
                    .approval
                    .follow_up
                    .is_some()
                    .then(|| self.approval.routes.clone()),
            };
            (None, Some(progress))
        };
        // Edited argument values stay out of events like requested ones: the row keeps them,
        // the decision's args_digest stands for them.
        let decision = self.decision.clone().map(|mut decision| {
            decision.edited_arguments_json.clear();
            decision
        });
        Ok(serde_json::to_value(StoredBody {
            approval,
            after,
            decision,
            delivery: self.delivery.clone(),
            detail: self.detail.clone(),
        })?)
    }

    /// Reads a stored body back; `current` is the approval as stored now (its row).
    fn from_stored(body: &str, current: Option<Approval>) -> Result<EventBody, StoreError> {
        let stored: StoredBody = serde_json::from_str(body)?;
        let mut decision = stored.decision;
        if let (Some(decision), Some(current)) = (&mut decision, &current) {
            if let Some(recorded) = current
                .decisions
                .iter()
                .find(|d| d.idempotency_key == decision.idempotency_key)
            {
                decision.edited_arguments_json = recorded.edited_arguments_json.clone();
            }
        }
        let approval = match (stored.approval, stored.after, current) {
            (Some(mut approval), _, current) => {
                if approval.arguments_json.is_empty() {
                    if let Some(current) = &current {
                        approval.arguments_json = current.arguments_json.clone();
                        approval.restore_edited_values(current);
                    }
                }
                approval
            }
            (None, Some(after), Some(mut approval)) => {
                approval.state = after.state;
                approval.decisions.truncate(after.decisions);
                approval.deliveries = after.deliveries;
                approval.resolution = after.resolution;
                approval.consumption = after.consumption;
                let current = approval.clone();
                approval.edit = after.edit;
                approval.restore_edited_values(&current);
                if after.follow_up.is_some() {
                    approval.follow_up = after.follow_up;
                }
                if let Some(expires_at) = after.expires_at {
                    approval.expires_at = expires_at;
                }
                if let Some(routes) = after.routes {
                    approval.routes = routes;
                }
                approval
            }
            _ => {
                return Err(StoreError::Corrupt(
                    "an event names an approval that is not stored".into(),
                ))
            }
        };
        Ok(EventBody {
            approval,
            decision,
            delivery: stored.delivery,
            detail: stored.detail,
        })
    }
}

/// Where an approval's stored row disagrees with its newest stored event (`newest_event`, a
/// stored body), argument values aside (redaction blanks them; the digest stands for them):
/// with an event of the lean form, the parts it records (state, decisions, deliveries,
/// resolution, consumption) must be the row's.
pub(crate) fn disagreement(row: &Approval, newest_event: &str) -> Option<String> {
    let stored: StoredBody = match serde_json::from_str(newest_event) {
        Ok(stored) => stored,
        Err(e) => return Some(format!("its newest event is not readable: {e}")),
    };
    let agrees = match (&stored.approval, &stored.after) {
        (Some(logged), _) => {
            let without_arguments = |approval: &Approval| {
                let mut approval = approval.clone();
                approval.clear_argument_values();
                approval
            };
            without_arguments(logged) == without_arguments(row)
        }
        (None, Some(after)) => {
            after.agent_id == row.agent_id
                && after.state == row.state
                && after.decisions == row.decisions.len()
                && after.deliveries == row.deliveries
                && after.resolution == row.resolution
                && after.consumption == row.consumption
                && without_values(&after.edit) == without_values(&row.edit)
                && after
                    .follow_up
                    .as_ref()
                    .is_none_or(|f| Some(f) == row.follow_up.as_ref())
                && after.expires_at.is_none_or(|at| at == row.expires_at)
                && after.routes.as_ref().is_none_or(|r| *r == row.routes)
        }
        (None, None) => false,
    };
    let logged_state = stored
        .approval
        .as_ref()
        .map(|a| a.state)
        .or(stored.after.as_ref().map(|a| a.state));
    (!agrees).then(|| match logged_state {
        Some(state) => format!(
            "its row says {} but its newest event says {}",
            row.state.as_str(),
            state.as_str()
        ),
        None => "its newest event records no approval".to_string(),
    })
}

/// An edit with its argument values blanked, as events record it.
fn without_values(edit: &Option<ArgsEdit>) -> Option<ArgsEdit> {
    edit.clone().map(|mut edit| {
        edit.arguments_json.clear();
        edit
    })
}

/// The answer to a request for approval.
#[derive(Debug, Clone)]
pub struct Requested {
    pub approval: Approval,
    pub created: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub states: Vec<State>,
    pub agent_id: String,
    pub channel: String,
    pub session_id: String,
    pub tool_name: String,
    /// The id the previous page ended with; the list continues with older approvals.
    pub before_id: String,
    pub limit: u32,
}

/// The pending approvals of a channel and the head of the log they are consistent with.
pub struct Snapshot {
    pub head_seq: i64,
    pub pending: Vec<Approval>,
}

pub(crate) enum Reply {
    Requested(Requested),
    Decided(DecideOutcome, Approval),
    Approval(Approval),
    Grant(Grant),
    Delegation(Delegation),
    Count(u64),
    /// Events were pruned; how many is known once the batch is written.
    Pruned,
}

struct Job {
    change: Change,
    now: Millis,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// What one change produced in its batch.
pub(crate) struct Applied {
    reply: Reply,
    events: Vec<StoredEvent>,
}

/// Commit statistics, observed after every group commit.
pub trait CommitObserver: Send + Sync {
    fn committed(&self, batch_size: usize, latency: Duration);
}

/// A session grant as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Grant {
    pub id: String,
    pub agent_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub approval_id: String,
    pub granted_by: String,
    #[sqlx(rename = "created_at_ms")]
    pub created_at: Millis,
    #[sqlx(rename = "expires_at_ms")]
    pub expires_at: Option<Millis>,
    #[sqlx(rename = "revoked_at_ms")]
    pub revoked_at: Option<Millis>,
}

impl Grant {
    pub fn is_active(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

/// The head of the audit hash chain: the single writer appends every event, so it keeps the
/// head in memory instead of reading it before each batch.
#[derive(Debug, Clone)]
pub struct ChainHead {
    /// The highest seq ever assigned (pruning never frees a seq).
    pub seq: i64,
    /// The hash of the newest stored row; empty when the log is empty.
    pub hash: String,
}

/// The writer's connection to a backend. A batch is: `begin`, `load`, `write`, `commit`; after
/// any error the store drops the connection and asks the backend for a new one, so no
/// transaction state of a failed batch survives.
#[async_trait]
pub trait WriterConnection: Send {
    /// Begins a batch's transaction. On a database that other servers write too, returns the
    /// chain head as committed, read under the lock that keeps their batches out until this
    /// one commits; None when this writer is the only one (it keeps the head itself).
    async fn begin(&mut self) -> Result<Option<ChainHead>, StoreError>;
    /// The newest event's seq and hash, as committed.
    async fn chain_head(&mut self) -> Result<ChainHead, StoreError>;
    /// Reads what the batch's changes need, inside the transaction.
    async fn load(&mut self, keys: &BatchKeys) -> Result<Loaded, StoreError>;
    /// Writes the batch; returns how many events were pruned.
    async fn write(&mut self, writes: &WriteSet) -> Result<u64, StoreError>;
    async fn commit(&mut self) -> Result<(), StoreError>;
    /// One small write outside any batch, to learn whether the database accepts writes.
    async fn probe(&mut self, now: Millis) -> Result<(), StoreError>;
}

/// A storage backend: the writer's connections, and every read the services make.
#[async_trait]
pub trait Backend: Send + Sync {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError>;
    /// The checks before serving: the audit chain's anchor, and every approval against its
    /// events.
    async fn check_integrity(&self) -> Result<(), IntegrityError>;
    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError>;
    /// How many approvals are waiting for a decision.
    async fn count_pending(&self) -> Result<i64, StoreError>;
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError>;
    /// The pending approvals routed to `channel` (all when empty) and the head seq, read in
    /// one transaction so that a stream can continue exactly after the snapshot.
    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError>;
    /// Stored events with seq greater than `after_seq`, oldest first, at most `limit`.
    async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    /// The highest seq ever assigned (0 when none), and the lowest seq still stored (head + 1
    /// when the log is empty).
    async fn log_bounds(&self) -> Result<(i64, i64), StoreError>;
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditedEvent>, StoreError>;
    /// Walks the whole event log in seq order and checks the hash chain up to the first
    /// broken row.
    async fn verify_audit(&self) -> Result<AuditReport, StoreError>;
    /// Writes a consistent copy of the database to the new file `into` while serving goes on,
    /// and verifies the copy's audit chain; see [`crate::backup`].
    async fn backup(&self, into: &Path) -> Result<Backup, BackupError>;
    /// Grants, newest first.
    async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError>;
    /// Whether this server runs the background sweeps (expiry, pruning) now: always on a
    /// database of its own; on a shared one, only the server holding the sweep lock.
    async fn leads_sweeps(&self) -> bool {
        true
    }
    /// Takes one call from the shared token bucket `key` (refilled at `per_ms` calls a
    /// millisecond up to `burst`), or says how long until one is available. None when the
    /// backend keeps no shared buckets (each server then limits on its own).
    async fn take_token(
        &self,
        _key: &str,
        _per_ms: f64,
        _burst: f64,
        _now: Millis,
    ) -> Result<Option<Result<(), Duration>>, StoreError> {
        Ok(None)
    }
    /// Delegations, newest first: to or from `approver` (everyone when empty), only those
    /// active at `now` unless `include_inactive`.
    async fn list_delegations(
        &self,
        approver: &str,
        include_inactive: bool,
        now: Millis,
    ) -> Result<Vec<Delegation>, StoreError>;
}

/// The handle the services use; cheap to clone.
#[derive(Clone)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
    backend: Arc<dyn Backend>,
    writable: watch::Receiver<bool>,
}

pub fn now_millis() -> Millis {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Opens (creating if needed) the database, applies migrations and starts the writer (and,
    /// on a shared database, the follower that publishes every server's events).
    pub async fn open(
        database: &Path,
        config: &StorageConfig,
        hub: Hub,
        observer: Option<Arc<dyn CommitObserver>>,
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
            follower,
        };
        // The writer gets a thread of its own: on the server's runtime each of its awaits (a
        // statement, the commit) queued behind the calls' tasks, and every change waits for it.
        // (The runtime is built on that thread: one dropped inside the server's runtime, as
        // after a failed spawn, would panic.)
        let (started, on_start) = oneshot::channel();
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        let _ = started.send(Ok(()));
                        runtime.block_on(writer.run(queue, max_batch, hub, observer));
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
        })
    }

    /// Whether the database accepts writes: false from a failed commit until a later write
    /// (a caller's or the writer's own probe) commits again.
    pub fn writable(&self) -> watch::Receiver<bool> {
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
    pub async fn request(
        &self,
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        max_pending: u32,
        now: Millis,
    ) -> Result<Requested, StoreError> {
        let change = Change::Request {
            request,
            ttl_seconds,
            disposition,
            max_pending,
        };
        match self.submit(change, now).await? {
            Reply::Requested(requested) => Ok(requested),
            _ => Err(unexpected_reply()),
        }
    }

    /// Applies a decision. A session-scoped approval creates a grant that lasts
    /// `grant_ttl_seconds` (0: until revoked).
    pub async fn decide(
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
    pub async fn refuse_decision(
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
    pub async fn revoke_grant(
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

    pub async fn cancel(
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

    pub async fn consume(
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

    pub async fn record_delivery(
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

    /// Expires, escalates and reminds the pending approvals whose next due time passed (at
    /// most [`batch::EXPIRY_SWEEP_LIMIT`] at a time); returns how many changed.
    pub async fn sweep_due(&self, now: Millis) -> Result<u64, StoreError> {
        self.submit_for_count(Change::FollowUpDue, now).await
    }

    /// Stores a new delegation.
    pub async fn create_delegation(
        &self,
        delegation: Delegation,
        now: Millis,
    ) -> Result<Delegation, StoreError> {
        self.submit_for_delegation(Change::CreateDelegation { delegation }, now)
            .await
    }

    /// Ends a delegation now; revoking a revoked one changes nothing.
    pub async fn revoke_delegation(
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

    /// Deletes events older than `before`; returns how many.
    pub async fn prune_events(&self, before: Millis, now: Millis) -> Result<u64, StoreError> {
        self.submit_for_count(Change::PruneEvents { before }, now)
            .await
    }

    async fn submit_for_count(&self, change: Change, now: Millis) -> Result<u64, StoreError> {
        match self.submit(change, now).await? {
            Reply::Count(n) => Ok(n),
            _ => Err(unexpected_reply()),
        }
    }

    pub async fn check_integrity(&self) -> Result<(), IntegrityError> {
        self.backend.check_integrity().await
    }

    pub async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        self.backend.get(approval_id).await
    }

    pub async fn count_pending(&self) -> Result<i64, StoreError> {
        self.backend.count_pending().await
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
        self.backend.list(filter).await
    }

    pub async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        self.backend.snapshot(channel).await
    }

    pub async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.backend.events_after(after_seq, limit).await
    }

    pub async fn log_bounds(&self) -> Result<(i64, i64), StoreError> {
        self.backend.log_bounds().await
    }

    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditedEvent>, StoreError> {
        self.backend.list_events(filter).await
    }

    pub async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        self.backend.verify_audit().await
    }

    /// See [`Backend::backup`].
    pub async fn backup(&self, into: &Path) -> Result<Backup, BackupError> {
        self.backend.backup(into).await
    }

    pub async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError> {
        self.backend.list_grants(filter, now).await
    }

    pub async fn list_delegations(
        &self,
        approver: &str,
        include_inactive: bool,
        now: Millis,
    ) -> Result<Vec<Delegation>, StoreError> {
        self.backend
            .list_delegations(approver, include_inactive, now)
            .await
    }

    /// Whether this server runs the background sweeps now (see [`Backend::leads_sweeps`]).
    pub async fn leads_sweeps(&self) -> bool {
        self.backend.leads_sweeps().await
    }

    /// See [`Backend::take_token`].
    pub async fn take_token(
        &self,
        key: &str,
        per_ms: f64,
        burst: f64,
        now: Millis,
    ) -> Result<Option<Result<(), Duration>>, StoreError> {
        self.backend.take_token(key, per_ms, burst, now).await
    }
}

/// How often the follower reads the log when no commit woke it: the bound on how late an event
/// whose notification was lost reaches this server's watchers.
const CATCH_UP_POLL: Duration = Duration::from_millis(500);
/// Events the follower reads at a time.
const FOLLOW_PAGE: u32 = 1000;

/// Publishes every committed event after `cursor`, whichever server wrote it, in seq order:
/// woken by this server's commits and the database's notifications, and every
/// [`CATCH_UP_POLL`] in case a notification was lost. Ends with the writer (`writer_alive`
/// closes).
async fn follow(
    backend: Arc<dyn Backend>,
    hub: Hub,
    wake: Arc<Notify>,
    mut cursor: i64,
    mut writer_alive: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(CATCH_UP_POLL) => {}
            changed = writer_alive.changed() => if changed.is_err() { break },
        }
        loop {
            match backend.events_after(cursor, FOLLOW_PAGE).await {
                Ok(events) => {
                    let full = events.len() == FOLLOW_PAGE as usize;
                    for event in events {
                        cursor = event.seq;
                        hub.publish(event);
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, after_seq = cursor, "cannot read the event log to publish it; retrying");
                    break;
                }
            }
        }
    }
    tracing::debug!("event follower stopped");
}

/// The `channels` column: where an approval is shown.
pub(crate) fn channels_column(approval: &Approval) -> String {
    if approval.routes.is_empty() {
        return "*".to_string();
    }
    let mut channels: Vec<&str> = approval.routes.iter().map(|r| r.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    format!(",{},", channels.join(","))
}

fn unexpected_reply() -> StoreError {
    StoreError::Corrupt("unexpected writer reply".into())
}

/// How often the writer, while the database refuses writes, tries a write of its own, so that
/// health recovers when space returns even if no caller writes (a load balancer sends none to
/// a replica that is NOT_SERVING).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The single writer: owns the only writing connection and the head of the audit chain.
struct Writer {
    backend: Arc<dyn Backend>,
    /// None until the first batch and after a failed one: the next batch connects.
    conn: Option<Box<dyn WriterConnection>>,
    /// The head of the audit chain as committed; None when it must be read again from the
    /// database (after a failed batch).
    chain: Option<ChainHead>,
    health: watch::Sender<bool>,
    redact_arguments: bool,
    /// On a shared database: the follower to wake after a commit, which publishes the events
    /// (the writer then publishes none itself).
    follower: Option<Arc<Notify>>,
}

type Outcomes = Vec<Result<Applied, StoreError>>;

impl Writer {
    async fn run(
        mut self,
        mut queue: mpsc::Receiver<Job>,
        max_batch: usize,
        hub: Hub,
        observer: Option<Arc<dyn CommitObserver>>,
    ) {
        let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
        let mut next_probe = Instant::now();
        loop {
            if !*self.health.borrow() && Instant::now() >= next_probe {
                self.probe().await;
                next_probe = Instant::now() + PROBE_INTERVAL;
            }
            let received = if *self.health.borrow() {
                queue.recv_many(&mut batch, max_batch).await
            } else {
                let deadline = tokio::time::Instant::from_std(next_probe);
                match tokio::time::timeout_at(deadline, queue.recv_many(&mut batch, max_batch))
                    .await
                {
                    Ok(received) => received,
                    Err(_) => continue,
                }
            };
            if received == 0 {
                break;
            }
            let started = Instant::now();
            let size = batch.len();
            let (work, replies): (Vec<(Change, Millis)>, Vec<_>) = batch
                .drain(..)
                .map(|job| ((job.change, job.now), job.reply))
                .unzip();
            let outcome = self.commit(work).await;
            if let Some(observer) = &observer {
                observer.committed(size, started.elapsed());
            }
            match outcome {
                Ok(results) => {
                    if let Some(follower) = &self.follower {
                        follower.notify_one();
                    }
                    let direct = self.follower.is_none();
                    for (reply, result) in replies.into_iter().zip(results) {
                        let answer = result.map(|applied| {
                            if direct {
                                for event in applied.events {
                                    hub.publish(event);
                                }
                            }
                            applied.reply
                        });
                        // A caller that went away does not undo a committed change.
                        let _ = reply.send(answer);
                    }
                }
                Err(e) => {
                    next_probe = Instant::now() + PROBE_INTERVAL;
                    let reason = e.to_string();
                    for reply in replies {
                        let _ = reply.send(Err(StoreError::Unavailable(reason.clone())));
                    }
                }
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Commits a batch. On any failure the connection is dropped: after a failed COMMIT
    /// (SQLITE_FULL, an I/O error) the database has already rolled the transaction back, and
    /// a connection whose transaction state is unknown must not take the next batch (with
    /// sqlx's own transactions it turned every later BEGIN into a SAVEPOINT of a transaction
    /// that never committed, acknowledging writes that were never stored).
    async fn commit(&mut self, work: Vec<(Change, Millis)>) -> Result<Outcomes, StoreError> {
        match self.commit_connected(work).await {
            Ok((results, wrote)) => {
                // Only a commit that wrote something shows that writes are accepted again
                // (an empty expiry sweep commits even on a full disk).
                if wrote {
                    self.set_writable(true);
                }
                Ok(results)
            }
            Err(e) => {
                tracing::error!(error = %e, "storage refused a batch; every change of it was rolled back and answered with an error; reconnecting");
                self.set_writable(false);
                self.chain = None;
                Err(e)
            }
        }
    }

    /// Commits a batch on the writer's connection, opening one first when there is none.
    async fn commit_connected(
        &mut self,
        work: Vec<(Change, Millis)>,
    ) -> Result<(Outcomes, bool), StoreError> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.backend.connect_writer().await?,
        };
        let committed = self.commit_on(conn.as_mut(), work).await?;
        self.conn = Some(conn);
        Ok(committed)
    }

    /// Reads what the batch needs, applies its changes in queue order, writes and commits.
    /// A change refused by the domain changes nothing, and its refusal is its answer; the
    /// others still commit. Returns the outcomes and whether anything was written.
    async fn commit_on(
        &mut self,
        conn: &mut dyn WriterConnection,
        work: Vec<(Change, Millis)>,
    ) -> Result<(Outcomes, bool), StoreError> {
        let head = match (conn.begin().await?, self.chain.take()) {
            (Some(shared), _) => shared,
            (None, Some(head)) => head,
            (None, None) => conn.chain_head().await?,
        };
        let keys = BatchKeys::of(work.iter().map(|(change, now)| (change, *now)));
        let loaded = conn.load(&keys).await?;
        let mut plan = Plan::new(loaded, head, self.redact_arguments);
        let mut results: Outcomes = work
            .into_iter()
            .map(|(change, now)| plan.apply(change, now))
            .collect();
        let (head, writes) = plan.finish();
        let wrote = !writes.is_empty();
        let pruned = if wrote { conn.write(&writes).await? } else { 0 };
        conn.commit().await?;
        self.chain = Some(head);
        for applied in results.iter_mut().flatten() {
            if matches!(applied.reply, Reply::Pruned) {
                applied.reply = Reply::Count(pruned);
            }
        }
        Ok((results, wrote))
    }

    /// Tries one small write; health follows its outcome.
    async fn probe(&mut self) {
        let written = async {
            let mut conn = match self.conn.take() {
                Some(conn) => conn,
                None => self.backend.connect_writer().await?,
            };
            conn.probe(now_millis()).await?;
            self.conn = Some(conn);
            Ok::<(), StoreError>(())
        }
        .await;
        match written {
            Ok(()) => {
                tracing::info!("storage accepts writes again");
                self.set_writable(true);
            }
            Err(e) => tracing::warn!(error = %e, "storage still refuses writes"),
        }
    }

    fn set_writable(&self, writable: bool) {
        self.health.send_if_modified(|current| {
            let changed = *current != writable;
            *current = writable;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use countersign_core::{Decider, ResolvedBy, Risk, Scope, Verdict};
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
        let store = Store::open(&path, &StorageConfig::default(), Hub::new(16), None)
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
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_decisions_in_one_batch_have_exactly_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let sizes = Arc::new(BatchSizes::default());
        let store = Store::open(
            &path,
            &StorageConfig::default(),
            Hub::new(1024),
            Some(sizes.clone()),
        )
        .await
        .unwrap();
        let now = now_millis();
        let approval = store
            .request(request("contested"), 60, Disposition::RequireHuman, 0, now)
            .await
            .unwrap()
            .approval;

        // Hold the database's write lock so that the writer waits on its next batch while
        // the decisions queue up behind it and form one batch together.
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
        let deciders: Vec<_> = (0..40)
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
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
        stuck.await.unwrap().unwrap();

        let mut resolved = 0;
        for decider in deciders {
            let (outcome, _) = decider.await.unwrap().unwrap();
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
