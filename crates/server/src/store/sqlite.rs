//! The SQLite backend: one file in WAL mode, schema from `migrations/`. The writer's
//! connection reads what a batch needs with at most three statements and writes the batch with
//! one multi-statement query whose statements take their rows as a JSON array expanded by
//! `json_each`, so the statement text never changes (prepared once) and the number of round
//! trips to SQLite's thread does not grow with the batch. Checkpoints (copying the WAL's
//! pages into the database file) run on a connection of their own, off the writer's path.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{Approval, EventKind, Millis};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, QueryBuilder, Row, Sqlite, SqliteExecutor};
use tokio::sync::{watch, Notify};

use super::audit_sql::{self, AuditSql, IntegrityError};
use super::backend::{Backend, SharedReads, WriterConnection};
use super::batch::{BatchKeys, BoundedGrant, Loaded, WriteSet, EXPIRY_SWEEP_LIMIT};
use super::error::StoreError;
use super::event::{AuditedEvent, EventBody, EventFilter, StoredEvent};
use super::reads::readable_approvals;
use super::records::{channels_column, ChainHead, Grant, GrantFilter, ListFilter, Snapshot};
use crate::audit::AuditReport;
use crate::backup::{self, Backup, BackupError};
use crate::config::{Durability, StorageConfig, WalCheckpoints};
use countersign_core::groups::Delegation;

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// WAL pages after which a commit of the writer checkpoints by itself: only a backstop for a
/// checkpointer that cannot keep up (SQLite's default is 1,000).
const WRITER_AUTOCHECKPOINT_PAGES: &str = "10000";
/// How long the checkpointer lets commits gather after one wakes it: a page that several
/// commits rewrote (the tail of a table or an index) is copied into the database once.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

pub struct SqliteBackend {
    /// The writer's (and the checkpointer's) options.
    options: SqliteConnectOptions,
    reads: SqlitePool,
    /// Woken by each commit of the writer.
    checkpointer: Arc<Notify>,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database, applies migrations, starts the checkpointer
    /// (until `writer_alive` closes) and returns the backend with the writer's connection.
    pub async fn open(
        path: &Path,
        config: &StorageConfig,
        writer_alive: watch::Receiver<bool>,
    ) -> Result<(SqliteBackend, Box<dyn WriterConnection>), StoreError> {
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
        let reads = options.clone().create_if_missing(false).read_only(true);
        let autocheckpoint = match config.wal_checkpoints {
            WalCheckpoints::Server => WRITER_AUTOCHECKPOINT_PAGES,
            WalCheckpoints::External => "0",
        };
        let options = options
            .pragma("wal_autocheckpoint", autocheckpoint)
            // A batch's statements change many rows; the journal that lets one of them fail
            // alone spilled to a temporary file (created, written, deleted) in every batch.
            .pragma("temp_store", "memory");
        let mut conn = SqliteConnection::connect_with(&options).await?;
        MIGRATOR.run_direct(&mut conn).await?;
        let checkpointer = Arc::new(Notify::new());
        if config.wal_checkpoints == WalCheckpoints::Server {
            tokio::spawn(checkpoint(
                options.clone(),
                checkpointer.clone(),
                writer_alive,
            ));
        }
        let reads = SqlitePoolOptions::new()
            .max_connections(config.read_connections)
            .connect_with(reads)
            .await?;
        let writer = SqliteWriter {
            conn,
            checkpointer: checkpointer.clone(),
        };
        let backend = SqliteBackend {
            options,
            reads,
            checkpointer,
        };
        Ok((backend, Box::new(writer)))
    }
}

/// Copies committed WAL pages into the database file, [`CHECKPOINT_INTERVAL`] after a commit
/// woke it, without ever blocking the writer (PASSIVE: it copies what no reader still needs;
/// the writer starts the WAL over once everything is copied). A failed checkpoint (a full
/// disk) loses nothing: the pages stay in the WAL for the next one.
async fn checkpoint(
    options: SqliteConnectOptions,
    commits: Arc<Notify>,
    mut writer_alive: watch::Receiver<bool>,
) {
    let mut conn: Option<SqliteConnection> = None;
    loop {
        tokio::select! {
            _ = commits.notified() => {}
            changed = writer_alive.changed() => if changed.is_err() { break },
        }
        tokio::time::sleep(CHECKPOINT_INTERVAL).await;
        let checkpointed = async {
            let conn = match conn.as_mut() {
                Some(conn) => conn,
                None => conn.insert(SqliteConnection::connect_with(&options).await?),
            };
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(conn)
                .await
        }
        .await;
        if let Err(e) = checkpointed {
            tracing::warn!(error = %e, "cannot checkpoint the WAL; the next commit tries again");
            conn = None;
        }
    }
    tracing::debug!("checkpointer stopped");
}

/// The only writing connection. Transactions are begun and committed with plain SQL: after
/// any failure the store drops the connection (closing it rolls back whatever SQLite still
/// holds), so no transaction state survives into the next batch.
struct SqliteWriter {
    conn: SqliteConnection,
    checkpointer: Arc<Notify>,
}

/// What a batch reads of approvals: named by id, made by a revoked grant, and under a
/// requested idempotency key.
const LOAD_APPROVALS: &str = "
SELECT body FROM approvals WHERE id IN (SELECT value FROM json_each(?))
UNION ALL
SELECT body FROM approvals
 WHERE id IN (SELECT approval_id FROM grants WHERE id IN (SELECT value FROM json_each(?)))
UNION ALL
SELECT body FROM approvals
 WHERE (agent_id, idempotency_key) IN (SELECT value->>0, value->>1 FROM json_each(?))";

/// The approvals a follow-up sweep expires, escalates or reminds, earliest due first. Only a
/// sweep's batch reads them: walking the pending approvals is not free when many wait.
const LOAD_DUE: &str = "
SELECT body FROM approvals INDEXED BY approvals_pending_by_due
 WHERE state = 'PENDING' AND due_at_ms <= ? ORDER BY due_at_ms LIMIT ?";

/// Every write of a batch, each statement taking its rows as one JSON array.
const WRITE_BATCH: &str = "
INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state, channels,
                       created_at_ms, expires_at_ms, body, due_at_ms)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7,
       value->>8, value->>9, value->>10
  FROM json_each(?) WHERE true
    ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body,
       channels = excluded.channels, expires_at_ms = excluded.expires_at_ms,
       due_at_ms = excluded.due_at_ms;
INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider, approver, prev_hash,
                    hash)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7,
       value->>8, value->>9
  FROM json_each(?);
INSERT INTO grants (id, agent_id, session_id, tool_name, approval_id, granted_by, created_at_ms,
                    expires_at_ms, max_risk_rank, max_required_approvals, scope)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7,
       value->>8, value->>9, value->>10
  FROM json_each(?);
UPDATE grants SET revoked_at_ms = revoked.value->>1
  FROM json_each(?) AS revoked WHERE grants.id = revoked.value->>0;
UPDATE events SET body = json_set(body, '$.approval.arguments_json', '')
 WHERE approval_id IN (SELECT value FROM json_each(?))
   AND json_extract(body, '$.approval.arguments_json') <> '';
INSERT INTO delegations (id, delegator, delegate, created_at_ms, until_ms, revoked_at_ms, reason,
                         created_by)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7
  FROM json_each(?) WHERE true
    ON CONFLICT (id) DO UPDATE SET revoked_at_ms = excluded.revoked_at_ms";

#[async_trait]
impl WriterConnection for SqliteWriter {
    async fn begin(&mut self) -> Result<Option<ChainHead>, StoreError> {
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut self.conn)
            .await?;
        Ok(None)
    }

    async fn chain_head(&mut self) -> Result<ChainHead, StoreError> {
        let newest: Option<(i64, Option<String>)> =
            sqlx::query_as("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&mut self.conn)
                .await?;
        let (newest_seq, hash) = newest
            .map(|(seq, hash)| (seq, hash.unwrap_or_default()))
            .unwrap_or_default();
        Ok(ChainHead {
            seq: head_seq(&mut self.conn).await?.max(newest_seq),
            hash,
        })
    }

    async fn load(&mut self, keys: &BatchKeys) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut bodies: Vec<String> = Vec::new();
        if !keys.approval_ids.is_empty()
            || !keys.grant_ids.is_empty()
            || !keys.request_keys.is_empty()
        {
            bodies = sqlx::query_scalar(LOAD_APPROVALS)
                .bind(serde_json::to_string(&keys.approval_ids)?)
                .bind(serde_json::to_string(&keys.grant_ids)?)
                .bind(serde_json::to_string(&keys.request_keys)?)
                .fetch_all(&mut self.conn)
                .await?;
        }
        if let Some(due_at) = keys.due_at {
            let due: Vec<String> = sqlx::query_scalar(LOAD_DUE)
                .bind(due_at)
                .bind(EXPIRY_SWEEP_LIMIT)
                .fetch_all(&mut self.conn)
                .await?;
            bodies.extend(due);
        }
        loaded.approvals = readable_approvals(&bodies);
        if !keys.grant_ids.is_empty() || !keys.grant_scopes.is_empty() {
            let rows = sqlx::query(&format!(
                "SELECT {GRANT_COLUMNS} FROM grants WHERE id IN (SELECT value FROM json_each(?))
                 UNION
                 SELECT {GRANT_COLUMNS} FROM grants
                  WHERE (agent_id, session_id) IN (SELECT value->>0, value->>1 FROM json_each(?))
                    AND revoked_at_ms IS NULL"
            ))
            .bind(serde_json::to_string(&keys.grant_ids)?)
            .bind(serde_json::to_string(&keys.grant_scopes)?)
            .fetch_all(&mut self.conn)
            .await?;
            loaded.grants = rows
                .iter()
                .map(bounded_grant_from_row)
                .collect::<Result<_, _>>()?;
        }
        if !keys.delegation_ids.is_empty() {
            let rows = sqlx::query(&format!(
                "SELECT {DELEGATION_COLUMNS} FROM delegations
                  WHERE id IN (SELECT value FROM json_each(?))"
            ))
            .bind(serde_json::to_string(&keys.delegation_ids)?)
            .fetch_all(&mut self.conn)
            .await?;
            loaded.delegations = rows
                .iter()
                .map(delegation_from_row)
                .collect::<Result<_, _>>()?;
        }
        if !keys.pending_agents.is_empty() {
            loaded.pending = sqlx::query_as(
                "SELECT agent_id, expires_at_ms FROM approvals
                  WHERE agent_id IN (SELECT value FROM json_each(?)) AND state = 'PENDING'",
            )
            .bind(serde_json::to_string(&keys.pending_agents)?)
            .fetch_all(&mut self.conn)
            .await?;
        }
        Ok(loaded)
    }

    async fn write(&mut self, writes: &WriteSet) -> Result<u64, StoreError> {
        // Each row is a tuple serialized straight into its statement's JSON array.
        let approvals: Vec<_> = writes
            .approval_rows()?
            .into_iter()
            .map(|(a, body)| {
                (
                    &a.id,
                    &a.agent_id,
                    &a.idempotency_key,
                    &a.session_id,
                    &a.tool_name,
                    a.state.as_str(),
                    channels_column(a),
                    a.created_at,
                    a.expires_at,
                    body,
                    a.next_due(),
                )
            })
            .collect();
        let events: Vec<_> = writes
            .events
            .iter()
            .map(|e| {
                (
                    e.seq,
                    &e.approval_id,
                    e.kind.as_str(),
                    e.at,
                    &e.body,
                    &e.columns.agent_id,
                    &e.columns.decider,
                    &e.columns.approver,
                    &e.prev_hash,
                    &e.hash,
                )
            })
            .collect();
        let grants: Vec<_> = writes
            .new_grants
            .iter()
            .map(|g| {
                (
                    &g.grant.id,
                    &g.grant.agent_id,
                    &g.grant.session_id,
                    &g.grant.tool_name,
                    &g.grant.approval_id,
                    &g.grant.granted_by,
                    g.grant.created_at,
                    g.grant.expires_at,
                    g.max_risk_rank,
                    g.max_required_approvals,
                    &g.scope,
                )
            })
            .collect();
        let delegations: Vec<_> = writes
            .delegations
            .values()
            .map(|d| {
                (
                    &d.id,
                    &d.delegator,
                    &d.delegate,
                    d.created_at,
                    d.until,
                    d.revoked_at,
                    &d.reason,
                    &d.created_by,
                )
            })
            .collect();
        sqlx::query(WRITE_BATCH)
            .bind(serde_json::to_string(&approvals)?)
            .bind(serde_json::to_string(&events)?)
            .bind(serde_json::to_string(&grants)?)
            .bind(serde_json::to_string(&writes.revoked_grants)?)
            .bind(serde_json::to_string(&writes.redact)?)
            .bind(serde_json::to_string(&delegations)?)
            .execute(&mut self.conn)
            .await?;
        match writes.prune_before {
            Some(before) => self.conn.prune(before).await,
            None => Ok(0),
        }
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        sqlx::query("COMMIT").execute(&mut self.conn).await?;
        self.checkpointer.notify_one();
        Ok(())
    }

    async fn probe(&mut self, now: Millis) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO storage_probe (id, at_ms) VALUES (1, ?)
             ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms",
        )
        .bind(now)
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError> {
        let conn = SqliteConnection::connect_with(&self.options).await?;
        Ok(Box::new(SqliteWriter {
            conn,
            checkpointer: self.checkpointer.clone(),
        }))
    }

    /// Refused (FAILED_PRECONDITION) when the approval's row disagrees with its newest
    /// event: an approval changed outside countersign is never served or acted on.
    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        audit_sql::load_verified(&mut *self.reads.acquire().await?, approval_id).await
    }

    async fn check_integrity(&self) -> Result<(), IntegrityError> {
        let mut conn = self.reads.acquire().await.map_err(StoreError::from)?;
        audit_sql::check_at_start(&mut *conn).await
    }

    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        let mut tx = self.reads.begin().await?;
        let head_seq = head_seq(&mut *tx).await?;
        let rows = sqlx::query(PENDING_ON_CHANNEL)
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

    async fn log_bounds(&self) -> Result<(i64, i64), StoreError> {
        let mut tx = self.reads.begin().await?;
        let head = head_seq(&mut *tx).await?;
        let oldest: Option<i64> = sqlx::query_scalar("SELECT MIN(seq) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((head, oldest.unwrap_or(head + 1)))
    }

    async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        self.reads.acquire().await?.verify().await
    }

    async fn backup(&self, into: &Path) -> Result<Backup, BackupError> {
        let mut conn = self.reads.acquire().await.map_err(StoreError::from)?;
        backup::copy(&mut conn, into).await
    }
}

super::reads::sql_reads!(Sqlite, SqlitePool, SqliteRow, SqliteBackend);

// A deferred SQLite transaction reads one snapshot from its first read on.
audit_sql::audit_sql!(SqliteConnection, None);

async fn head_seq<'e>(executor: impl SqliteExecutor<'e>) -> Result<i64, sqlx::Error> {
    let head: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            .fetch_optional(executor)
            .await?;
    Ok(head.unwrap_or(0))
}

/// Opens an existing database and brings its schema up to date (for `audit` commands).
pub(crate) async fn connect_migrated(database: &Path) -> Result<SqliteConnection, StoreError> {
    let options = SqliteConnectOptions::new()
        .filename(database)
        .create_if_missing(false);
    let mut conn = SqliteConnection::connect_with(&options).await?;
    MIGRATOR.run_direct(&mut conn).await?;
    Ok(conn)
}
