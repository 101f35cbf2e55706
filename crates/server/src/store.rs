//! Durable storage: SQLite through sqlx, WAL mode, schema from `migrations/`.
//!
//! One writer task owns the only writing connection. Every change is applied inside a
//! transaction that updates the current-state tables and appends to `events`; the writer
//! takes every change waiting in its queue and commits them together (group commit), answers
//! each caller only after that commit, and then publishes the events to the hub, so seqs are
//! assigned in commit order and nothing unpublished is ever visible. Each appended event is
//! chained to the one before it by a hash (see `audit`).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::{
    Approval, ApprovalRequest, ConsumeOutcome, DecideOutcome, Decision, Delivery, Disposition,
    Error as DomainError, EventKind, Millis, ResolvedBy, State, Verdict,
};
use serde::{Deserialize, Serialize};
use sqlx::error::BoxDynError;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Arguments, Connection, QueryBuilder, Row, Sqlite, SqliteExecutor};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use crate::audit::{chain_hash, Columns};
use crate::config::{Durability, StorageConfig};
use crate::hub::Hub;

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

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
    #[error("the store is shutting down")]
    Closed,
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

/// The JSON stored in `events.body`.
#[derive(Serialize, Deserialize)]
struct EventBody {
    approval: Approval,
    decision: Option<Decision>,
    delivery: Option<Delivery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
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

// Each change is built once and moved into the writer's queue; boxing the request would add
// an allocation per call for no gain.
#[allow(clippy::large_enum_variant)]
enum Change {
    Request {
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        max_pending: u32,
    },
    Decide {
        approval_id: String,
        decision: Decision,
        grant_ttl_seconds: u32,
    },
    RefuseDecision {
        approval_id: String,
        decision: Decision,
        why: String,
    },
    RevokeGrant {
        grant_id: String,
        revoked_by: String,
        reason: String,
    },
    Cancel {
        approval_id: String,
        reason: String,
    },
    Consume {
        approval_id: String,
        outcome: ConsumeOutcome,
        detail: String,
    },
    RecordDelivery {
        approval_id: String,
        delivery: Delivery,
    },
    ExpireDue,
    PruneEvents {
        before: Millis,
    },
}

enum Reply {
    Requested(Requested),
    Decided(DecideOutcome, Approval),
    Approval(Approval),
    Grant(Grant),
    Count(u64),
}

struct Job {
    change: Change,
    now: Millis,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// What one change produced inside its transaction.
struct Applied {
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

/// The handle the services use; cheap to clone.
#[derive(Clone)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
    pub(crate) reads: SqlitePool,
}

pub fn now_millis() -> Millis {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Opens (creating if needed) the database, applies migrations and starts the writer.
    pub async fn open(
        path: &Path,
        config: &StorageConfig,
        hub: Hub,
        observer: Option<Arc<dyn CommitObserver>>,
    ) -> Result<Store, StoreError> {
        let synchronous = match config.durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Normal => SqliteSynchronous::Normal,
        };
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let mut writer = SqliteConnection::connect_with(&options).await?;
        MIGRATOR.run_direct(&mut writer).await?;
        let chain = ChainHead::load(&mut writer).await?;
        let reads = SqlitePoolOptions::new()
            .max_connections(config.read_connections)
            .connect_with(options.create_if_missing(false).read_only(true))
            .await?;

        let (jobs, queue) = mpsc::channel(config.max_batch.max(1) * 4);
        let max_batch = if config.group_commit {
            config.max_batch
        } else {
            1
        };
        tokio::spawn(run_writer(
            writer,
            chain,
            queue,
            max_batch,
            config.redact_arguments,
            hub,
            observer,
        ));
        Ok(Store { jobs, reads })
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
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    /// Applies a decision. A session-scoped approval creates a grant that lasts
    /// `grant_ttl_seconds` (0: until revoked).
    pub async fn decide(
        &self,
        approval_id: &str,
        decision: Decision,
        grant_ttl_seconds: u32,
        now: Millis,
    ) -> Result<(DecideOutcome, Approval), StoreError> {
        let change = Change::Decide {
            approval_id: approval_id.to_string(),
            decision,
            grant_ttl_seconds,
        };
        match self.submit(change, now).await? {
            Reply::Decided(outcome, approval) => Ok((outcome, approval)),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
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
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
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
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    /// Expires every pending approval past its deadline; returns how many.
    pub async fn expire_due(&self, now: Millis) -> Result<u64, StoreError> {
        self.submit_for_count(Change::ExpireDue, now).await
    }

    /// Deletes events older than `before`; returns how many.
    pub async fn prune_events(&self, before: Millis, now: Millis) -> Result<u64, StoreError> {
        self.submit_for_count(Change::PruneEvents { before }, now)
            .await
    }

    async fn submit_for_count(&self, change: Change, now: Millis) -> Result<u64, StoreError> {
        match self.submit(change, now).await? {
            Reply::Count(n) => Ok(n),
            _ => Err(StoreError::Corrupt("unexpected writer reply".into())),
        }
    }

    pub async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        load_approval(&self.reads, approval_id).await
    }

    /// How many approvals are waiting for a decision.
    pub async fn count_pending(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM approvals WHERE state = 'PENDING'")
                .fetch_one(&self.reads)
                .await?,
        )
    }

    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
        let mut query: QueryBuilder<Sqlite> =
            QueryBuilder::new("SELECT body FROM approvals WHERE 1 = 1");
        if !filter.states.is_empty() {
            query.push(" AND state IN (");
            let mut states = query.separated(", ");
            for state in &filter.states {
                states.push_bind(state.as_str());
            }
            query.push(")");
        }
        if !filter.agent_id.is_empty() {
            query
                .push(" AND agent_id = ")
                .push_bind(filter.agent_id.clone());
        }
        if !filter.session_id.is_empty() {
            query
                .push(" AND session_id = ")
                .push_bind(filter.session_id.clone());
        }
        if !filter.tool_name.is_empty() {
            query
                .push(" AND tool_name = ")
                .push_bind(filter.tool_name.clone());
        }
        if !filter.channel.is_empty() {
            query
                .push(" AND (channels = '*' OR instr(channels, ")
                .push_bind(format!(",{},", filter.channel))
                .push(") > 0)");
        }
        if !filter.before_id.is_empty() {
            query.push(" AND id < ").push_bind(filter.before_id.clone());
        }
        query
            .push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit));
        let rows = query.build().fetch_all(&self.reads).await?;
        rows.iter()
            .map(|row| Ok(serde_json::from_str(row.try_get::<&str, _>("body")?)?))
            .collect()
    }

    /// The pending approvals routed to `channel` (all when empty) and the head seq, read in
    /// one transaction so that the stream can continue exactly after the snapshot.
    pub async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        let mut tx = self.reads.begin().await?;
        let head_seq = head_seq(&mut *tx).await?;
        let rows = sqlx::query(
            "SELECT body FROM approvals WHERE state = 'PENDING'
               AND (?1 = '' OR channels = '*' OR instr(channels, ',' || ?1 || ',') > 0)
             ORDER BY id",
        )
        .bind(channel)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let pending = rows
            .iter()
            .map(|row| Ok(serde_json::from_str(row.try_get::<&str, _>("body")?)?))
            .collect::<Result<Vec<Approval>, StoreError>>()?;
        Ok(Snapshot { head_seq, pending })
    }

    /// Stored events with seq greater than `after_seq`, oldest first, at most `limit`.
    pub async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, kind, at_ms, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// The highest seq ever assigned (0 when none), and the lowest seq still stored (head + 1
    /// when the log is empty).
    pub async fn log_bounds(&self) -> Result<(i64, i64), StoreError> {
        let mut tx = self.reads.begin().await?;
        let head = head_seq(&mut *tx).await?;
        let oldest: Option<i64> = sqlx::query_scalar("SELECT MIN(seq) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((head, oldest.unwrap_or(head + 1)))
    }
}

/// The newest link of the audit hash chain. The single writer appends every event, so it
/// keeps the head in memory instead of reading it before each insert.
#[derive(Debug, Clone)]
struct ChainHead {
    /// The highest seq ever assigned (AUTOINCREMENT's counter: pruning never frees a seq).
    seq: i64,
    /// The hash of the newest stored row; empty when the log is empty.
    hash: String,
}

impl ChainHead {
    async fn load(conn: &mut SqliteConnection) -> Result<ChainHead, sqlx::Error> {
        let newest: Option<(i64, Option<String>)> =
            sqlx::query_as("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&mut *conn)
                .await?;
        let (newest_seq, hash) = newest
            .map(|(seq, hash)| (seq, hash.unwrap_or_default()))
            .unwrap_or_default();
        Ok(ChainHead {
            seq: head_seq(&mut *conn).await?.max(newest_seq),
            hash,
        })
    }
}

async fn head_seq<'e>(executor: impl SqliteExecutor<'e>) -> Result<i64, sqlx::Error> {
    let head: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            .fetch_optional(executor)
            .await?;
    Ok(head.unwrap_or(0))
}

pub(crate) fn event_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<StoredEvent, StoreError> {
    let kind_name: &str = row.try_get("kind")?;
    let kind = EventKind::parse(kind_name)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown event kind {kind_name}")))?;
    let body: EventBody = serde_json::from_str(row.try_get::<&str, _>("body")?)?;
    Ok(StoredEvent {
        seq: row.try_get("seq")?,
        kind,
        at: row.try_get("at_ms")?,
        approval: body.approval,
        decision: body.decision,
        delivery: body.delivery,
        detail: body.detail,
    })
}

async fn load_approval<'e>(
    executor: impl SqliteExecutor<'e>,
    approval_id: &str,
) -> Result<Approval, StoreError> {
    let body: Option<String> = sqlx::query_scalar("SELECT body FROM approvals WHERE id = ?")
        .bind(approval_id)
        .fetch_optional(executor)
        .await?;
    match body {
        Some(body) => Ok(serde_json::from_str(&body)?),
        None => Err(DomainError::NotFound(format!("approval {approval_id} not found")).into()),
    }
}

/// The `channels` column: where an approval is shown.
fn channels_column(approval: &Approval) -> String {
    if approval.routes.is_empty() {
        return "*".to_string();
    }
    let mut channels: Vec<&str> = approval.routes.iter().map(|r| r.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    format!(",{},", channels.join(","))
}

async fn run_writer(
    mut conn: SqliteConnection,
    chain: ChainHead,
    mut queue: mpsc::Receiver<Job>,
    max_batch: usize,
    redact_arguments: bool,
    hub: Hub,
    observer: Option<Arc<dyn CommitObserver>>,
) {
    let mut chain = Some(chain);
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    while queue.recv_many(&mut batch, max_batch).await > 0 {
        let started = Instant::now();
        let size = batch.len();
        let outcome = commit_batch(&mut conn, &mut chain, &mut batch, redact_arguments).await;
        if let Some(observer) = &observer {
            observer.committed(size, started.elapsed());
        }
        match outcome {
            Ok(results) => {
                for (job, result) in batch.drain(..).zip(results) {
                    let answer = result.map(|applied| {
                        for event in applied.events {
                            hub.publish(event);
                        }
                        applied.reply
                    });
                    // A caller that went away does not undo a committed change.
                    let _ = job.reply.send(answer);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = size, "group commit failed; every change in it was rolled back");
                for job in batch.drain(..) {
                    let _ = job
                        .reply
                        .send(Err(StoreError::Corrupt(format!("commit failed: {e}"))));
                }
            }
        }
    }
    tracing::debug!("store writer stopped");
}

/// Applies each job in one transaction. A job refused by the domain changes nothing (the
/// domain refuses before any write), so its refusal is its answer and the others still commit.
///
/// `chain` is the head of the audit chain as committed. It is taken for the batch and given
/// back only when the batch commits, so after a rollback the next batch reads it again.
async fn commit_batch(
    conn: &mut SqliteConnection,
    chain: &mut Option<ChainHead>,
    batch: &mut [Job],
    redact_arguments: bool,
) -> Result<Vec<Result<Applied, StoreError>>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let mut head = match chain.take() {
        Some(head) => head,
        None => ChainHead::load(&mut tx).await?,
    };
    let mut results = Vec::with_capacity(batch.len());
    for job in batch.iter_mut() {
        let change = std::mem::replace(&mut job.change, Change::ExpireDue);
        let mut writes = Writes::new(head);
        let mut result = apply(&mut tx, &mut writes, change, job.now).await;
        if let Ok(applied) = &mut result {
            if redact_arguments {
                redact_resolved(&mut writes, applied);
            }
            if let Err(e) = writes.flush(&mut tx).await {
                result = Err(e);
            }
        }
        head = writes.written();
        match result {
            Err(StoreError::Database(e)) => return Err(e),
            other => results.push(other),
        }
    }
    tx.commit().await?;
    *chain = Some(head);
    Ok(results)
}

/// The writes of one change, sent to SQLite as one multi-statement query when the change is
/// done. Each statement through sqlx is a round trip to the connection's own thread (two
/// thread wake-ups), which costs far more than SQLite's work for it, and no write of a change
/// returns anything the change needs.
struct Writes {
    sql: String,
    arguments: SqliteArguments<'static>,
    /// The first value that could not be bound; `flush` reports it.
    bind_error: Option<BoxDynError>,
    /// The head of the audit chain after the statements written so far.
    written: ChainHead,
    /// The head after the statements still waiting for `flush`.
    pending: ChainHead,
}

impl Writes {
    fn new(head: ChainHead) -> Writes {
        Writes {
            sql: String::new(),
            arguments: SqliteArguments::default(),
            bind_error: None,
            written: head.clone(),
            pending: head,
        }
    }

    /// Adds a statement; its `?` parameters take the values bound next, in order.
    fn statement(&mut self, sql: &str) -> &mut Writes {
        if !self.sql.is_empty() {
            self.sql.push_str(";\n");
        }
        self.sql.push_str(sql);
        self
    }

    fn bind<T>(&mut self, value: T) -> &mut Writes
    where
        T: 'static + sqlx::Encode<'static, Sqlite> + sqlx::Type<Sqlite>,
    {
        if let Err(e) = self.arguments.add(value) {
            self.bind_error.get_or_insert(e);
        }
        self
    }

    /// Runs the statements added since the last flush.
    async fn flush(&mut self, conn: &mut SqliteConnection) -> Result<(), StoreError> {
        if self.sql.is_empty() {
            return Ok(());
        }
        let sql = std::mem::take(&mut self.sql);
        let arguments = std::mem::take(&mut self.arguments);
        if let Some(e) = self.bind_error.take() {
            return Err(sqlx::Error::Encode(e).into());
        }
        sqlx::query_with(&sql, arguments)
            .execute(&mut *conn)
            .await?;
        self.written = self.pending.clone();
        Ok(())
    }

    /// The head of the audit chain as the database has it (statements never flushed are not
    /// in it).
    fn written(self) -> ChainHead {
        self.written
    }

    fn insert_approval(&mut self, approval: &Approval) -> Result<(), StoreError> {
        let body = serde_json::to_string(approval)?;
        self.statement(
            "INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state, channels, created_at_ms, expires_at_ms, body)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(approval.id.clone())
        .bind(approval.agent_id.clone())
        .bind(approval.idempotency_key.clone())
        .bind(approval.session_id.clone())
        .bind(approval.tool_name.clone())
        .bind(approval.state.as_str())
        .bind(channels_column(approval))
        .bind(approval.created_at)
        .bind(approval.expires_at)
        .bind(body);
        Ok(())
    }

    fn save_approval(&mut self, approval: &Approval) -> Result<(), StoreError> {
        let body = serde_json::to_string(approval)?;
        self.statement("UPDATE approvals SET state = ?, body = ? WHERE id = ?")
            .bind(approval.state.as_str())
            .bind(body)
            .bind(approval.id.clone());
        Ok(())
    }

    fn append_event(
        &mut self,
        kind: EventKind,
        at: Millis,
        approval: &Approval,
        decision: Option<Decision>,
        delivery: Option<Delivery>,
    ) -> Result<StoredEvent, StoreError> {
        let body = EventBody {
            approval: approval.clone(),
            decision,
            delivery,
            detail: None,
        };
        self.append(kind, at, body)
    }

    /// Appends an event, chained to the newest row by its hash.
    fn append(
        &mut self,
        kind: EventKind,
        at: Millis,
        body: EventBody,
    ) -> Result<StoredEvent, StoreError> {
        let seq = self.pending.seq + 1;
        let mut json = serde_json::to_value(&body)?;
        let columns = Columns::of(&json);
        let hash = chain_hash(
            &self.pending.hash,
            seq,
            &body.approval.id,
            kind.as_str(),
            at,
            &mut json,
        );
        let next = ChainHead {
            seq,
            hash: hash.clone(),
        };
        let prev_hash = std::mem::replace(&mut self.pending, next).hash;
        self.statement(
            "INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider, approver, prev_hash, hash)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(seq)
        .bind(body.approval.id.clone())
        .bind(kind.as_str())
        .bind(at)
        .bind(json.to_string())
        .bind(columns.agent_id)
        .bind(columns.decider)
        .bind(columns.approver)
        .bind(prev_hash)
        .bind(hash);
        Ok(StoredEvent {
            seq,
            kind,
            at,
            approval: body.approval,
            decision: body.decision,
            delivery: body.delivery,
            detail: body.detail,
        })
    }

    /// Saves a changed approval and logs the event that changed it.
    fn save_and_log(
        &mut self,
        approval: Approval,
        kind: EventKind,
        now: Millis,
        delivery: Option<Delivery>,
    ) -> Result<Applied, StoreError> {
        self.save_approval(&approval)?;
        let event = self.append_event(kind, now, &approval, None, delivery)?;
        Ok(Applied {
            reply: Reply::Approval(approval),
            events: vec![event],
        })
    }
}

async fn apply(
    conn: &mut SqliteConnection,
    writes: &mut Writes,
    change: Change,
    now: Millis,
) -> Result<Applied, StoreError> {
    match change {
        Change::Request {
            request,
            ttl_seconds,
            disposition,
            max_pending,
        } => {
            apply_request(
                conn,
                writes,
                request,
                ttl_seconds,
                disposition,
                max_pending,
                now,
            )
            .await
        }
        Change::Decide {
            approval_id,
            decision,
            grant_ttl_seconds,
        } => {
            let mut approval = load_approval(&mut *conn, &approval_id).await?;
            let effect = approval.decide(decision.clone(), now)?;
            let mut events = Vec::new();
            if let Some(kind) = effect.event {
                let recorded = (kind != EventKind::Expired).then_some(decision.clone());
                writes.save_approval(&approval)?;
                events.push(writes.append_event(kind, now, &approval, recorded, None)?);
            }
            if effect.grants_session {
                let expires_at =
                    (grant_ttl_seconds > 0).then(|| now + i64::from(grant_ttl_seconds) * 1000);
                writes
                    .statement(
                        "INSERT INTO grants (id, agent_id, session_id, tool_name, approval_id, granted_by, created_at_ms, expires_at_ms, max_risk_rank, max_required_approvals, scope)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    )
                    .bind(uuid::Uuid::now_v7().to_string())
                    .bind(approval.agent_id.clone())
                    .bind(approval.session_id.clone())
                    .bind(approval.tool_name.clone())
                    .bind(approval.id.clone())
                    .bind(decision.approver)
                    .bind(now)
                    .bind(expires_at)
                    .bind(approval.risk.rank())
                    .bind(i64::from(approval.required_approvals))
                    .bind(approval.grant_scope.clone());
            }
            Ok(Applied {
                reply: Reply::Decided(effect.outcome, approval),
                events,
            })
        }
        Change::RefuseDecision {
            approval_id,
            decision,
            why,
        } => {
            let approval = load_approval(&mut *conn, &approval_id).await?;
            let body = EventBody {
                approval,
                decision: Some(decision),
                delivery: None,
                detail: Some(why),
            };
            let event = writes.append(EventKind::DecisionRefused, now, body)?;
            Ok(Applied {
                reply: Reply::Approval(event.approval.clone()),
                events: vec![event],
            })
        }
        Change::RevokeGrant {
            grant_id,
            revoked_by,
            reason,
        } => revoke_grant(conn, writes, &grant_id, &revoked_by, &reason, now).await,
        Change::Cancel {
            approval_id,
            reason,
        } => {
            let mut approval = load_approval(&mut *conn, &approval_id).await?;
            let kind = approval.cancel(&reason, now)?;
            writes.save_and_log(approval, kind, now, None)
        }
        Change::Consume {
            approval_id,
            outcome,
            detail,
        } => {
            let mut approval = load_approval(&mut *conn, &approval_id).await?;
            if approval.expire_if_due(now) {
                return writes.save_and_log(approval, EventKind::Expired, now, None);
            }
            let kind = approval.consume(outcome, &detail, now)?;
            writes.save_and_log(approval, kind, now, None)
        }
        Change::RecordDelivery {
            approval_id,
            delivery,
        } => {
            let mut approval = load_approval(&mut *conn, &approval_id).await?;
            let kind = approval.record_delivery(delivery.clone());
            writes.save_and_log(approval, kind, now, Some(delivery))
        }
        Change::ExpireDue => {
            let bodies: Vec<String> = sqlx::query_scalar(
                "SELECT body FROM approvals WHERE state = 'PENDING' AND expires_at_ms <= ? ORDER BY expires_at_ms LIMIT 1000",
            )
            .bind(now)
            .fetch_all(&mut *conn)
            .await?;
            let mut events = Vec::with_capacity(bodies.len());
            // An unreadable row is skipped, not fatal: failing here would leave the expiries
            // already written committed but unpublished, and stall every later sweep.
            let approvals = bodies.iter().filter_map(|body| {
                serde_json::from_str::<Approval>(body)
                    .inspect_err(|e| tracing::error!(error = %e, "skipping an unreadable pending approval in the expiry sweep"))
                    .ok()
            });
            for mut approval in approvals {
                if approval.expire_if_due(now) {
                    writes.save_approval(&approval)?;
                    events.push(writes.append_event(
                        EventKind::Expired,
                        now,
                        &approval,
                        None,
                        None,
                    )?);
                    // One approval's writes at a time: the same statements every sweep, so
                    // sqlx's statement cache keeps them prepared whatever the count.
                    writes.flush(conn).await?;
                }
            }
            Ok(Applied {
                reply: Reply::Count(events.len() as u64),
                events,
            })
        }
        Change::PruneEvents { before } => {
            let pruned = crate::integrity::prune(&mut *conn, before).await?;
            Ok(Applied {
                reply: Reply::Count(pruned),
                events: Vec::new(),
            })
        }
    }
}

/// What a request depends on, read in one statement: the approval stored under its
/// idempotency key (?1, ?2); the session grant that approves it, when ?5 asks (?3 session,
/// ?4 tool; a grant covers no more risk (?8 rank) and no larger quorum (?9) than the approval
/// that made it, and only arguments in its scope (?10)); and when ?6 asks, the agent's pending approvals that have not expired at ?7
/// (count and next expiry; an aggregate always yields one row).
const REQUEST_LOOKUP: &str = "SELECT
    (SELECT body FROM approvals WHERE agent_id = ?1 AND idempotency_key = ?2),
    (SELECT id FROM grants
      WHERE ?5 AND agent_id = ?1 AND session_id = ?3 AND tool_name = ?4
        AND revoked_at_ms IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > ?7)
        AND max_risk_rank >= ?8 AND max_required_approvals >= ?9 AND scope = ?10
      ORDER BY created_at_ms LIMIT 1),
    COUNT(*), MIN(expires_at_ms)
  FROM approvals WHERE ?6 AND agent_id = ?1 AND state = 'PENDING' AND expires_at_ms > ?7";

async fn apply_request(
    conn: &mut SqliteConnection,
    writes: &mut Writes,
    request: ApprovalRequest,
    ttl_seconds: u32,
    disposition: Disposition,
    max_pending: u32,
    now: Millis,
) -> Result<Applied, StoreError> {
    let needs_human = disposition == Disposition::RequireHuman;
    let (existing, grant_id, pending, next_expiry): (
        Option<String>,
        Option<String>,
        i64,
        Option<Millis>,
    ) = sqlx::query_as(REQUEST_LOOKUP)
        .bind(&request.agent_id)
        .bind(&request.idempotency_key)
        .bind(&request.session_id)
        .bind(&request.tool_name)
        .bind(needs_human && !request.session_id.is_empty())
        .bind(needs_human && max_pending > 0)
        .bind(now)
        .bind(request.risk.rank())
        .bind(i64::from(request.required_approvals))
        .bind(&request.grant_scope)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(body) = existing {
        let approval: Approval = serde_json::from_str(&body)?;
        if !approval.is_same_call(&request) {
            return Err(DomainError::AlreadyExists(format!(
                "idempotency_key {:?} of agent {:?} was used for approval {} of another call (tool {:?}, session {:?}, arguments digest {}); a changed call needs a new idempotency_key",
                request.idempotency_key, request.agent_id, approval.id, approval.tool_name, approval.session_id, approval.args_digest
            ))
            .into());
        }
        return Ok(Applied {
            reply: Reply::Requested(Requested {
                approval,
                created: false,
            }),
            events: Vec::new(),
        });
    }

    let disposition = match grant_id {
        Some(grant_id) => Disposition::Resolve {
            verdict: Verdict::Approve,
            resolved_by: ResolvedBy::Grant,
            rule: None,
            reason: format!("session grant {grant_id}"),
            grant_id: Some(grant_id),
        },
        None => disposition,
    };
    if max_pending > 0 && disposition == Disposition::RequireHuman {
        check_pending_limit(&request.agent_id, pending, next_expiry, max_pending, now)?;
    }
    let approval = Approval::new(
        uuid::Uuid::now_v7().to_string(),
        request,
        ttl_seconds,
        disposition,
        now,
    );
    writes.insert_approval(&approval)?;
    let mut events = vec![writes.append_event(EventKind::Requested, now, &approval, None, None)?];
    if !approval.is_pending() {
        events.push(writes.append_event(EventKind::Resolved, now, &approval, None, None)?);
    }
    Ok(Applied {
        reply: Reply::Requested(Requested {
            approval,
            created: true,
        }),
        events,
    })
}

/// Refuses a new pending approval for an agent that has `max_pending` pending already, saying
/// when one of them expires at the latest.
fn check_pending_limit(
    agent_id: &str,
    pending: i64,
    next_expiry: Option<Millis>,
    max_pending: u32,
    now: Millis,
) -> Result<(), StoreError> {
    if pending < i64::from(max_pending) {
        return Ok(());
    }
    let retry = next_expiry
        .map(|at| {
            format!(
                ", or in {} s when the next one expires",
                (at - now + 999) / 1000
            )
        })
        .unwrap_or_default();
    Err(DomainError::ResourceExhausted(format!(
        "agent {agent_id:?} has {pending} pending approvals, the limit (limits.max_pending_per_agent) is {max_pending}; retry once one of them is decided or cancelled{retry}"
    ))
    .into())
}

async fn revoke_grant(
    conn: &mut SqliteConnection,
    writes: &mut Writes,
    grant_id: &str,
    revoked_by: &str,
    reason: &str,
    now: Millis,
) -> Result<Applied, StoreError> {
    let found: Option<Grant> = sqlx::query_as("SELECT * FROM grants WHERE id = ?")
        .bind(grant_id)
        .fetch_optional(&mut *conn)
        .await?;
    let mut grant =
        found.ok_or_else(|| DomainError::NotFound(format!("grant {grant_id} not found")))?;
    if grant.revoked_at.is_some() {
        return Ok(Applied {
            reply: Reply::Grant(grant),
            events: Vec::new(),
        });
    }
    writes
        .statement("UPDATE grants SET revoked_at_ms = ? WHERE id = ?")
        .bind(now)
        .bind(grant_id.to_owned());
    grant.revoked_at = Some(now);
    let approval = load_approval(&mut *conn, &grant.approval_id).await?;
    let mut detail = format!(
        "grant {grant_id} (agent {:?}, session {:?}, tool {:?}) revoked by {revoked_by}",
        grant.agent_id, grant.session_id, grant.tool_name
    );
    if !reason.is_empty() {
        detail.push_str(": ");
        detail.push_str(reason);
    }
    let body = EventBody {
        approval,
        decision: None,
        delivery: None,
        detail: Some(detail),
    };
    let event = writes.append(EventKind::GrantRevoked, now, body)?;
    Ok(Applied {
        reply: Reply::Grant(grant),
        events: vec![event],
    })
}

/// With `storage.redact_arguments`: blanks the argument values of every approval this change
/// resolved, in the approval, in all its stored events (the change's own included: these
/// statements run after its writes), and in what the change returns and publishes. The digest
/// stays; the hash chain does not cover argument values.
fn redact_resolved(writes: &mut Writes, applied: &mut Applied) {
    let reply_approval = match &mut applied.reply {
        Reply::Requested(requested) => Some(&mut requested.approval),
        Reply::Decided(_, approval) | Reply::Approval(approval) => Some(approval),
        Reply::Grant(_) | Reply::Count(_) => None,
    };
    let resolved = applied
        .events
        .iter_mut()
        .map(|event| &mut event.approval)
        .chain(reply_approval)
        .filter(|approval| !approval.is_pending());
    let mut redacted: Vec<String> = Vec::new();
    for approval in resolved {
        if approval.arguments_json.is_empty() {
            continue;
        }
        approval.arguments_json.clear();
        if redacted.contains(&approval.id) {
            continue;
        }
        writes
            .statement(
                "UPDATE approvals SET body = json_set(body, '$.arguments_json', '') WHERE id = ?",
            )
            .bind(approval.id.clone())
            .statement(
                "UPDATE events SET body = json_set(body, '$.approval.arguments_json', '')
                 WHERE approval_id = ? AND json_extract(body, '$.approval.arguments_json') <> ''",
            )
            .bind(approval.id.clone());
        redacted.push(approval.id.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use countersign_core::Risk;

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
            matches!(refused, Err(StoreError::Corrupt(_))),
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
}
