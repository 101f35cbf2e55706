//! The SQLite backend: one file in WAL mode, schema from `migrations/`. The writer's
//! connection reads what a batch needs with at most three statements and writes the batch with
//! one multi-statement query whose statements take their rows as a JSON array expanded by
//! `json_each`, so the statement text never changes (prepared once) and the number of round
//! trips to SQLite's thread does not grow with the batch.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{Approval, EventKind, Millis};
use futures::TryStreamExt;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, QueryBuilder, Row, Sqlite, SqliteExecutor};

use super::batch::{BatchKeys, BoundedGrant, Loaded, WriteSet, EXPIRY_SWEEP_LIMIT};
use super::{
    Backend, ChainHead, EventBody, Grant, ListFilter, Snapshot, StoreError, StoredEvent,
    WriterConnection,
};
use crate::audit::{AuditReport, Columns, EventRow, Verifier};
use crate::config::{Durability, StorageConfig};
use crate::history::{AuditedEvent, EventFilter, GrantFilter};
use crate::integrity::{self, IntegrityError};

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

pub struct SqliteBackend {
    options: SqliteConnectOptions,
    reads: SqlitePool,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database, applies migrations and returns the backend
    /// with the writer's connection.
    pub async fn open(
        path: &Path,
        config: &StorageConfig,
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
        let mut conn = SqliteConnection::connect_with(&options).await?;
        MIGRATOR.run_direct(&mut conn).await?;
        let reads = SqlitePoolOptions::new()
            .max_connections(config.read_connections)
            .connect_with(options.clone().create_if_missing(false).read_only(true))
            .await?;
        let backend = SqliteBackend { options, reads };
        Ok((backend, Box::new(SqliteWriter { conn })))
    }
}

/// The only writing connection. Transactions are begun and committed with plain SQL: after
/// any failure the store drops the connection (closing it rolls back whatever SQLite still
/// holds), so no transaction state survives into the next batch.
struct SqliteWriter {
    conn: SqliteConnection,
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

/// The approvals an expiry sweep expires, oldest deadline first. Only a sweep's batch reads
/// them: walking the pending approvals is not free when many wait.
const LOAD_DUE: &str = "
SELECT body FROM approvals INDEXED BY approvals_pending_by_expiry
 WHERE state = 'PENDING' AND expires_at_ms <= ? ORDER BY expires_at_ms LIMIT ?";

/// An event row with its approval's current row, which lean events are read against.
const EVENT_COLUMNS: &str = "e.seq, e.kind, e.at_ms, e.body, e.prev_hash, e.hash, a.body AS current
    FROM events AS e LEFT JOIN approvals AS a ON a.id = e.approval_id";

const GRANT_COLUMNS: &str = "id, agent_id, session_id, tool_name, approval_id, granted_by,
    created_at_ms, expires_at_ms, revoked_at_ms, max_risk_rank, max_required_approvals, scope";

/// Every write of a batch, each statement taking its rows as one JSON array.
const WRITE_BATCH: &str = "
INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state, channels,
                       created_at_ms, expires_at_ms, body)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7,
       value->>8, value->>9
  FROM json_each(?) WHERE true
    ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body;
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
   AND json_extract(body, '$.approval.arguments_json') <> ''";

#[async_trait]
impl WriterConnection for SqliteWriter {
    async fn begin(&mut self) -> Result<(), StoreError> {
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut self.conn)
            .await?;
        Ok(())
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
        // An unreadable row is skipped, not fatal: failing here would stall every later batch
        // (a change naming it gets NOT_FOUND).
        loaded.approvals = bodies
            .iter()
            .filter_map(|body| {
                serde_json::from_str::<Approval>(body)
                    .inspect_err(
                        |e| tracing::error!(error = %e, "skipping an unreadable stored approval"),
                    )
                    .ok()
            })
            .collect();
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
        let approvals = writes
            .approvals
            .values()
            .map(|a| {
                Ok(serde_json::json!([
                    a.id,
                    a.agent_id,
                    a.idempotency_key,
                    a.session_id,
                    a.tool_name,
                    a.state.as_str(),
                    channels_column(a),
                    a.created_at,
                    a.expires_at,
                    serde_json::to_string(a)?,
                ]))
            })
            .collect::<Result<Vec<Value>, serde_json::Error>>()?;
        let events: Vec<Value> = writes
            .events
            .iter()
            .map(|e| {
                serde_json::json!([
                    e.seq,
                    e.approval_id,
                    e.kind.as_str(),
                    e.at,
                    e.body.to_string(),
                    e.columns.agent_id,
                    e.columns.decider,
                    e.columns.approver,
                    e.prev_hash,
                    e.hash,
                ])
            })
            .collect();
        let grants: Vec<Value> = writes
            .new_grants
            .iter()
            .map(|g| {
                serde_json::json!([
                    g.grant.id,
                    g.grant.agent_id,
                    g.grant.session_id,
                    g.grant.tool_name,
                    g.grant.approval_id,
                    g.grant.granted_by,
                    g.grant.created_at,
                    g.grant.expires_at,
                    g.max_risk_rank,
                    g.max_required_approvals,
                    g.scope,
                ])
            })
            .collect();
        sqlx::query(WRITE_BATCH)
            .bind(Value::from(approvals).to_string())
            .bind(Value::from(events).to_string())
            .bind(Value::from(grants).to_string())
            .bind(serde_json::to_string(&writes.revoked_grants)?)
            .bind(serde_json::to_string(&writes.redact)?)
            .execute(&mut self.conn)
            .await?;
        match writes.prune_before {
            Some(before) => Ok(integrity::prune(&mut self.conn, before).await?),
            None => Ok(0),
        }
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        sqlx::query("COMMIT").execute(&mut self.conn).await?;
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

fn bounded_grant_from_row(row: &SqliteRow) -> Result<BoundedGrant, sqlx::Error> {
    Ok(BoundedGrant {
        grant: Grant {
            id: row.try_get("id")?,
            agent_id: row.try_get("agent_id")?,
            session_id: row.try_get("session_id")?,
            tool_name: row.try_get("tool_name")?,
            approval_id: row.try_get("approval_id")?,
            granted_by: row.try_get("granted_by")?,
            created_at: row.try_get("created_at_ms")?,
            expires_at: row.try_get("expires_at_ms")?,
            revoked_at: row.try_get("revoked_at_ms")?,
        },
        max_risk_rank: row.try_get("max_risk_rank")?,
        max_required_approvals: row.try_get("max_required_approvals")?,
        scope: row.try_get("scope")?,
    })
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError> {
        let conn = SqliteConnection::connect_with(&self.options).await?;
        Ok(Box::new(SqliteWriter { conn }))
    }

    /// Refused (FAILED_PRECONDITION) when the approval's row disagrees with its newest
    /// event: an approval changed outside countersign is never served or acted on.
    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        integrity::load_verified(&self.reads, approval_id).await
    }

    async fn check_integrity(&self) -> Result<(), IntegrityError> {
        let mut conn = self.reads.acquire().await.map_err(StoreError::from)?;
        integrity::check_at_start(&mut conn).await
    }

    async fn count_pending(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COUNT(*) FROM approvals WHERE state = 'PENDING'")
                .fetch_one(&self.reads)
                .await?,
        )
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
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
        push_equal(
            &mut query,
            [
                ("agent_id", &filter.agent_id),
                ("session_id", &filter.session_id),
                ("tool_name", &filter.tool_name),
            ],
        );
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

    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
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

    async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} WHERE e.seq > ? ORDER BY e.seq LIMIT ?"
        ))
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(event_from_row).collect()
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

    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditedEvent>, StoreError> {
        let mut query: QueryBuilder<Sqlite> =
            QueryBuilder::new(format!("SELECT {EVENT_COLUMNS} WHERE 1 = 1"));
        if !filter.approval_id.is_empty() {
            query
                .push(" AND e.approval_id = ")
                .push_bind(filter.approval_id.clone());
        }
        if !filter.kinds.is_empty() {
            query.push(" AND e.kind IN (");
            let mut kinds = query.separated(", ");
            for kind in &filter.kinds {
                kinds.push_bind(kind.as_str());
            }
            query.push(")");
        }
        if !filter.agent_id.is_empty() {
            query
                .push(" AND e.agent_id = ")
                .push_bind(filter.agent_id.clone());
        }
        if !filter.decider.is_empty() {
            // The `<> ''` terms let each side use its partial index.
            query
                .push(" AND ((e.decider = ")
                .push_bind(filter.decider.clone())
                .push(" AND e.decider <> '') OR (e.approver = ")
                .push_bind(filter.decider.clone())
                .push(" AND e.approver <> ''))");
        }
        if let Some(since) = filter.since {
            query.push(" AND e.at_ms >= ").push_bind(since);
        }
        if let Some(until) = filter.until {
            query.push(" AND e.at_ms < ").push_bind(until);
        }
        let (after, order) = if filter.newest_first {
            (" AND e.seq < ", " ORDER BY e.seq DESC LIMIT ")
        } else {
            (" AND e.seq > ", " ORDER BY e.seq LIMIT ")
        };
        if let Some(seq) = filter.after_seq {
            query.push(after).push_bind(seq);
        }
        query.push(order).push_bind(i64::from(filter.limit));
        let rows = query.build().fetch_all(&self.reads).await?;
        rows.iter()
            .map(|row| {
                Ok(AuditedEvent {
                    event: event_from_row(row)?,
                    prev_hash: row
                        .try_get::<Option<String>, _>("prev_hash")?
                        .unwrap_or_default(),
                    hash: row
                        .try_get::<Option<String>, _>("hash")?
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        let mut tx = self.reads.begin().await?;
        let mut verifier = Verifier::default();
        {
            let mut rows = sqlx::query(
                "SELECT seq, approval_id, kind, at_ms, body, agent_id, decider, approver, prev_hash, hash
                 FROM events ORDER BY seq",
            )
            .fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                let row = EventRow {
                    seq: row.try_get("seq")?,
                    approval_id: row.try_get("approval_id")?,
                    kind: row.try_get("kind")?,
                    at_ms: row.try_get("at_ms")?,
                    body: row.try_get("body")?,
                    columns: Columns {
                        agent_id: row.try_get("agent_id")?,
                        decider: row.try_get("decider")?,
                        approver: row.try_get("approver")?,
                    },
                    prev_hash: row.try_get("prev_hash")?,
                    hash: row.try_get("hash")?,
                };
                if !verifier.check(row) {
                    break;
                }
            }
        }
        {
            let mut rows = sqlx::query(
                "SELECT a.body AS approval, e.seq, e.body AS requested
                   FROM approvals AS a
                   JOIN events AS e ON e.approval_id = a.id AND e.kind = 'REQUESTED'",
            )
            .fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                if !verifier.check_approval(
                    row.try_get("seq")?,
                    row.try_get("approval")?,
                    row.try_get("requested")?,
                ) {
                    break;
                }
            }
        }
        let mut report = verifier.finish();
        if report.broken.is_none() {
            report.broken = integrity::check_ends(&mut tx).await?;
        }
        if report.broken.is_none() {
            report.broken = integrity::disagreeing_approvals(&mut tx)
                .await?
                .into_iter()
                .next()
                .map(|(approval_id, seq, problem)| {
                    (seq.max(1), format!("approval {approval_id}: {problem}"))
                });
        }
        tx.commit().await?;
        Ok(report)
    }

    async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError> {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT * FROM grants WHERE 1 = 1");
        push_equal(
            &mut query,
            [
                ("agent_id", &filter.agent_id),
                ("session_id", &filter.session_id),
                ("tool_name", &filter.tool_name),
            ],
        );
        if !filter.include_inactive {
            query
                .push(" AND revoked_at_ms IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > ")
                .push_bind(now)
                .push(")");
        }
        if !filter.before_id.is_empty() {
            query.push(" AND id < ").push_bind(filter.before_id.clone());
        }
        query
            .push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit));
        Ok(query.build_query_as().fetch_all(&self.reads).await?)
    }
}

/// Adds `AND column = value` for each filter that is set (not empty).
fn push_equal<'a>(query: &mut QueryBuilder<'a, Sqlite>, filters: [(&str, &String); 3]) {
    for (column, value) in filters {
        if !value.is_empty() {
            query
                .push(format!(" AND {column} = "))
                .push_bind(value.clone());
        }
    }
}

async fn head_seq<'e>(executor: impl SqliteExecutor<'e>) -> Result<i64, sqlx::Error> {
    let head: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            .fetch_optional(executor)
            .await?;
    Ok(head.unwrap_or(0))
}

/// An event row read with its approval's current row (`current`, from the join in
/// [`EVENT_COLUMNS`]).
fn event_from_row(row: &SqliteRow) -> Result<StoredEvent, StoreError> {
    let kind_name: &str = row.try_get("kind")?;
    let kind = EventKind::parse(kind_name)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown event kind {kind_name}")))?;
    let current = row
        .try_get::<Option<&str>, _>("current")?
        .map(serde_json::from_str::<Approval>)
        .transpose()?;
    let body = EventBody::from_stored(row.try_get::<&str, _>("body")?, current)?;
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
