//! The PostgreSQL backend, for several servers (replicas) on one database. Schema from
//! `migrations/postgres/`.
//!
//! Every batch begins by locking the one row of `audit_anchor`, which holds the chain head:
//! the writers of all replicas take turns, so each batch reads (under the lock) the state the
//! previous one committed, first decisions win and idempotency keys hold across replicas, and
//! seqs are assigned gap-free in commit order. A commit notifies the other replicas
//! (`NOTIFY countersign_events`), whose followers then publish the new events. Sweeps run on
//! the replica that holds an advisory lock; rate limits are token buckets in `rate_buckets`.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::groups::Delegation;
use countersign_core::{Approval, EventKind, Millis};
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow, Postgres,
};
use sqlx::{Connection, Executor, QueryBuilder, Row};
use tokio::sync::{watch, Mutex, Notify};

use super::audit_sql::{self, AuditSql, IntegrityError};
use super::backend::{Backend, SharedReads, WriterConnection};
use super::batch::{BatchKeys, BoundedGrant, Loaded, WriteSet, EXPIRY_SWEEP_LIMIT};
use super::error::StoreError;
use super::event::{AuditedEvent, EventBody, EventFilter, StoredEvent};
use super::reads::readable_approvals;
use super::records::{
    channels_column, ChainHead, Grant, GrantFilter, ListFilter, Passkey, PasskeyWrite, Snapshot,
    GRANT_COLUMNS,
};
use crate::audit::AuditReport;
use crate::config::StorageConfig;
use crate::store::backup::{Backup, BackupError};

/// How long a session may sit idle inside a transaction before PostgreSQL ends it.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "10s";

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The channel commits are announced on.
const EVENTS_CHANNEL: &str = "countersign_events";
/// The advisory lock whose holder runs the sweeps ("counter" in ASCII).
const SWEEP_LOCK: i64 = 0x0063_6f75_6e74_6572;
/// Makes a transaction just begun read one snapshot.
const SNAPSHOT: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

pub struct PostgresBackend {
    options: PgConnectOptions,
    /// `options` for the writer's sessions: idle transactions end.
    writer_options: PgConnectOptions,
    reads: PgPool,
    /// The connection that holds the sweep lock (session-scoped: it ends with the connection).
    sweeper: Mutex<Option<PgConnection>>,
    /// The log's history id, as the database held it at start.
    history: String,
}

impl PostgresBackend {
    /// Connects, applies migrations (sqlx serializes replicas that start together with a lock
    /// of its own), starts listening for other replicas' commits (waking `wake` on each, until
    /// `writer_alive` closes) and returns the backend with the writer's connection.
    pub async fn open(
        url: &str,
        config: &StorageConfig,
        wake: Arc<Notify>,
        writer_alive: watch::Receiver<bool>,
    ) -> Result<(PostgresBackend, Box<dyn WriterConnection>), StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        // A writer that stops inside a transaction (a frozen VM, SIGSTOP) would hold the audit
        // anchor's row lock, and with it every replica's writes, until it ran again:
        // PostgreSQL ends such a session, which frees the lock. A writer's transactions are
        // never idle for more than milliseconds. (Reads may be: the start-up check compares
        // every approval inside one snapshot, so their sessions keep the default.)
        //
        // Every statement of the writer reaches its rows by a key. Prepared once, a statement
        // gets a generic plan from the statistics of the moment; a server that starts on empty
        // tables got sequential scans for the batch's reads (the approvals by id and by
        // idempotency key), and kept them while the tables grew, until autovacuum's ANALYZE:
        // 4,500-5,800 requests/s against ~10,500/s with index scans, run to run.
        let writer_options = options.clone().options([
            (
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            ),
            ("enable_seqscan", "off"),
        ]);
        let mut conn = PgConnection::connect_with(&writer_options).await?;
        MIGRATOR.run_direct(&mut conn).await?;
        let history = conn.history().await?;
        // The pool's only writes are the shared rate buckets, taken on every request: their
        // commits need not wait for the WAL flush. A crash of PostgreSQL may forget the last
        // moments of a bucket's level, which lets a few more calls through, never fewer.
        let reads = PgPoolOptions::new()
            .max_connections(config.read_connections.max(1) + 1)
            .connect_with(options.clone().options([("synchronous_commit", "off")]))
            .await?;
        let mut listener = PgListener::connect_with(&reads).await?;
        listener.listen(EVENTS_CHANNEL).await?;
        tokio::spawn(listen(listener, wake, writer_alive));
        let backend = PostgresBackend {
            options,
            writer_options,
            reads,
            sweeper: Mutex::new(None),
            history,
        };
        Ok((backend, Box::new(PgWriter { conn })))
    }
}

/// Wakes the follower on every notification of a commit; after a lost connection (the listener
/// reconnects and listens again by itself) too, since notifications may have been missed.
async fn listen(
    mut listener: PgListener,
    wake: Arc<Notify>,
    mut writer_alive: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            received = listener.try_recv() => match received {
                Ok(_) => wake.notify_one(),
                Err(e) => {
                    tracing::warn!(error = %e, "lost the notifications of other replicas' commits; reconnecting");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    wake.notify_one();
                }
            },
            changed = writer_alive.changed() => if changed.is_err() { break },
        }
    }
}

/// The writer's connection. Transactions are begun and committed with plain SQL: after any
/// failure the store drops the connection (closing it rolls back), so no transaction state
/// survives into the next batch.
struct PgWriter {
    conn: PgConnection,
}

/// Begins a batch's transaction and locks the chain head, in one round trip (the simple query
/// protocol takes both statements at once).
const BEGIN_AND_LOCK_HEAD: &str =
    "BEGIN; SELECT head_seq, head_hash FROM audit_anchor WHERE id = 1 FOR UPDATE";

/// What a batch reads of approvals: named by id, made by a revoked grant, and under a
/// requested idempotency key.
const LOAD_APPROVALS: &str = "
SELECT body FROM approvals WHERE id = ANY($1)
UNION ALL
SELECT body FROM approvals WHERE id IN (SELECT approval_id FROM grants WHERE id = ANY($2))
UNION ALL
SELECT body FROM approvals
 WHERE (agent_id, idempotency_key) IN (SELECT * FROM unnest($3::text[], $4::text[]))";

/// The approvals a follow-up sweep expires, escalates or reminds, earliest due first.
const LOAD_DUE: &str = "
SELECT body FROM approvals
 WHERE state = 'PENDING' AND due_at_ms <= $1 ORDER BY due_at_ms LIMIT $2";

const LOAD_PENDING: &str = "SELECT agent_id, expires_at_ms FROM approvals
 WHERE agent_id = ANY($1) AND state = 'PENDING'";

/// A batch's approvals and events in one statement (one round trip), which also tells the
/// other replicas when it wrote events: `pg_notify` is delivered when (and only if) the
/// transaction commits.
const WRITE_APPROVALS_AND_EVENTS: &str = "
WITH approval_rows AS (
    INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state, channels,
                           created_at_ms, expires_at_ms, body, due_at_ms)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::text[],
                         $11::bigint[])
        ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body,
           channels = excluded.channels, expires_at_ms = excluded.expires_at_ms,
           due_at_ms = excluded.due_at_ms
), event_rows AS (
    INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider, approver,
                        prev_hash, hash)
    SELECT * FROM unnest($12::bigint[], $13::text[], $14::text[], $15::bigint[], $16::text[],
                         $17::text[], $18::text[], $19::text[], $20::text[], $21::text[])
)
SELECT pg_notify($22, '') WHERE cardinality($12::bigint[]) > 0";

const WRITE_DELEGATIONS: &str = "
INSERT INTO delegations (id, delegator, delegate, created_at_ms, until_ms, revoked_at_ms, reason,
                         created_by)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                     $6::bigint[], $7::text[], $8::text[])
    ON CONFLICT (id) DO UPDATE SET revoked_at_ms = excluded.revoked_at_ms";

/// A credential id already stored keeps its row, whoever registered it.
const INSERT_PASSKEY: &str = "
INSERT INTO passkeys (credential_id, approver, name, cose_key, algorithm, sign_count,
                      created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (credential_id) DO NOTHING";
const COUNT_PASSKEY: &str = "
UPDATE passkeys SET sign_count = $3 WHERE credential_id = $1 AND approver = $2 AND sign_count < $3";
const REMOVE_PASSKEY: &str = "DELETE FROM passkeys WHERE credential_id = $1 AND approver = $2";

const WRITE_GRANTS: &str = "
INSERT INTO grants (id, agent_id, session_id, tool_name, approval_id, granted_by, created_at_ms,
                    expires_at_ms, max_risk_rank, max_required_approvals, scope)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                     $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::text[])";

const REVOKE_GRANTS: &str = "
UPDATE grants SET revoked_at_ms = revoked.at
  FROM unnest($1::text[], $2::bigint[]) AS revoked (id, at) WHERE grants.id = revoked.id";

const USED_CLIENT_ASSERTIONS: &str = "
SELECT client_id, jti FROM used_client_assertions
 WHERE (client_id, jti) IN (SELECT * FROM unnest($1::text[], $2::text[]))";

const INSERT_CLIENT_ASSERTIONS: &str = "
INSERT INTO used_client_assertions (client_id, jti, expires_at_ms)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])";

const REDACT_EVENTS: &str = "
UPDATE events SET body = jsonb_set(body::jsonb, '{approval,arguments_json}', '\"\"')::text
 WHERE approval_id = ANY($1) AND body::jsonb #>> '{approval,arguments_json}' <> ''";

#[async_trait]
impl WriterConnection for PgWriter {
    async fn begin(&mut self) -> Result<Option<ChainHead>, StoreError> {
        // Without arguments sqlx sends the text as a simple query: both statements at once.
        let head = (&mut self.conn).fetch_one(BEGIN_AND_LOCK_HEAD).await?;
        Ok(Some(ChainHead {
            seq: head.try_get(0)?,
            hash: head.try_get(1)?,
        }))
    }

    async fn chain_head(&mut self) -> Result<ChainHead, StoreError> {
        let anchor = self.conn.anchor().await?;
        Ok(ChainHead {
            seq: anchor.head_seq,
            hash: anchor.head_hash,
        })
    }

    async fn load(&mut self, keys: &BatchKeys) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut bodies: Vec<String> = Vec::new();
        if !keys.approval_ids.is_empty()
            || !keys.grant_ids.is_empty()
            || !keys.request_keys.is_empty()
        {
            let (agents, idempotency_keys): (Vec<&str>, Vec<&str>) = keys
                .request_keys
                .iter()
                .map(|(agent, key)| (agent.as_str(), key.as_str()))
                .unzip();
            bodies = sqlx::query_scalar(LOAD_APPROVALS)
                .bind(&keys.approval_ids)
                .bind(&keys.grant_ids)
                .bind(agents)
                .bind(idempotency_keys)
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
            let (agents, sessions): (Vec<&str>, Vec<&str>) = keys
                .grant_scopes
                .iter()
                .map(|(agent, session)| (agent.as_str(), session.as_str()))
                .unzip();
            let rows = sqlx::query(&format!(
                "SELECT {GRANT_COLUMNS} FROM grants WHERE id = ANY($1)
                 UNION
                 SELECT {GRANT_COLUMNS} FROM grants
                  WHERE (agent_id, session_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))
                    AND revoked_at_ms IS NULL"
            ))
            .bind(&keys.grant_ids)
            .bind(agents)
            .bind(sessions)
            .fetch_all(&mut self.conn)
            .await?;
            loaded.grants = rows
                .iter()
                .map(bounded_grant_from_row)
                .collect::<Result<_, _>>()?;
        }
        if !keys.delegation_ids.is_empty() {
            let rows = sqlx::query(&format!(
                "SELECT {DELEGATION_COLUMNS} FROM delegations WHERE id = ANY($1)"
            ))
            .bind(&keys.delegation_ids)
            .fetch_all(&mut self.conn)
            .await?;
            loaded.delegations = rows
                .iter()
                .map(delegation_from_row)
                .collect::<Result<_, _>>()?;
        }
        if !keys.client_assertions.is_empty() {
            let (clients, jtis): (Vec<&str>, Vec<&str>) = keys
                .client_assertions
                .iter()
                .map(|(client, jti)| (client.as_str(), jti.as_str()))
                .unzip();
            loaded.used_client_assertions = sqlx::query_as(USED_CLIENT_ASSERTIONS)
                .bind(clients)
                .bind(jtis)
                .fetch_all(&mut self.conn)
                .await?;
        }
        if !keys.pending_agents.is_empty() {
            loaded.pending = sqlx::query_as(LOAD_PENDING)
                .bind(&keys.pending_agents)
                .fetch_all(&mut self.conn)
                .await?;
        }
        Ok(loaded)
    }

    async fn write(&mut self, writes: &WriteSet) -> Result<u64, StoreError> {
        if !writes.approvals.is_empty() || !writes.events.is_empty() {
            let (approvals, bodies): (Vec<&Approval>, Vec<_>) =
                writes.approval_rows()?.into_iter().unzip();
            let bodies: Vec<&str> = bodies.iter().map(|body| body.as_ref()).collect();
            let events = &writes.events;
            sqlx::query(WRITE_APPROVALS_AND_EVENTS)
                .bind(column(&approvals, |a| a.id.as_str()))
                .bind(column(&approvals, |a| a.agent_id.as_str()))
                .bind(column(&approvals, |a| a.idempotency_key.as_str()))
                .bind(column(&approvals, |a| a.session_id.as_str()))
                .bind(column(&approvals, |a| a.tool_name.as_str()))
                .bind(column(&approvals, |a| a.state.as_str()))
                .bind(column(&approvals, |a| channels_column(a)))
                .bind(column(&approvals, |a| a.created_at))
                .bind(column(&approvals, |a| a.expires_at))
                .bind(bodies)
                .bind(column(&approvals, |a| a.next_due()))
                .bind(column(events, |e| e.seq))
                .bind(column(events, |e| e.approval_id.as_str()))
                .bind(column(events, |e| e.kind.as_str()))
                .bind(column(events, |e| e.at))
                .bind(column(events, |e| e.body.as_str()))
                .bind(column(events, |e| e.columns.agent_id.as_str()))
                .bind(column(events, |e| e.columns.decider.as_str()))
                .bind(column(events, |e| e.columns.approver.as_str()))
                .bind(column(events, |e| e.prev_hash.as_str()))
                .bind(column(events, |e| e.hash.as_str()))
                .bind(EVENTS_CHANNEL)
                .execute(&mut self.conn)
                .await?;
        }
        if !writes.new_grants.is_empty() {
            let grants = &writes.new_grants;
            sqlx::query(WRITE_GRANTS)
                .bind(column(grants, |g| g.grant.id.as_str()))
                .bind(column(grants, |g| g.grant.agent_id.as_str()))
                .bind(column(grants, |g| g.grant.session_id.as_str()))
                .bind(column(grants, |g| g.grant.tool_name.as_str()))
                .bind(column(grants, |g| g.grant.approval_id.as_str()))
                .bind(column(grants, |g| g.grant.granted_by.as_str()))
                .bind(column(grants, |g| g.grant.created_at))
                .bind(column(grants, |g| g.grant.expires_at))
                .bind(column(grants, |g| g.max_risk_rank))
                .bind(column(grants, |g| g.max_required_approvals))
                .bind(column(grants, |g| g.scope.as_str()))
                .execute(&mut self.conn)
                .await?;
        }
        if !writes.revoked_grants.is_empty() {
            let revoked = &writes.revoked_grants;
            sqlx::query(REVOKE_GRANTS)
                .bind(column(revoked, |(id, _)| id.as_str()))
                .bind(column(revoked, |(_, at)| *at))
                .execute(&mut self.conn)
                .await?;
        }
        if !writes.delegations.is_empty() {
            let delegations: Vec<&Delegation> = writes.delegations.values().collect();
            sqlx::query(WRITE_DELEGATIONS)
                .bind(column(&delegations, |d| d.id.as_str()))
                .bind(column(&delegations, |d| d.delegator.as_str()))
                .bind(column(&delegations, |d| d.delegate.as_str()))
                .bind(column(&delegations, |d| d.created_at))
                .bind(column(&delegations, |d| d.until))
                .bind(column(&delegations, |d| d.revoked_at))
                .bind(column(&delegations, |d| d.reason.as_str()))
                .bind(column(&delegations, |d| d.created_by.as_str()))
                .execute(&mut self.conn)
                .await?;
        }
        for write in &writes.passkeys {
            let query = match write {
                PasskeyWrite::Register(p) => sqlx::query(INSERT_PASSKEY)
                    .bind(&p.credential_id)
                    .bind(&p.approver)
                    .bind(&p.name)
                    .bind(&p.cose_key)
                    .bind(p.algorithm)
                    .bind(p.sign_count)
                    .bind(p.created_at),
                PasskeyWrite::Count {
                    credential_id,
                    approver,
                    sign_count,
                } => sqlx::query(COUNT_PASSKEY)
                    .bind(credential_id)
                    .bind(approver)
                    .bind(sign_count),
                PasskeyWrite::Remove {
                    credential_id,
                    approver,
                } => sqlx::query(REMOVE_PASSKEY)
                    .bind(credential_id)
                    .bind(approver),
            };
            query.execute(&mut self.conn).await?;
        }
        if let Some(before) = writes.forget_assertions_before {
            sqlx::query("DELETE FROM used_client_assertions WHERE expires_at_ms <= $1")
                .bind(before)
                .execute(&mut self.conn)
                .await?;
        }
        if !writes.client_assertions.is_empty() {
            let assertions = &writes.client_assertions;
            sqlx::query(INSERT_CLIENT_ASSERTIONS)
                .bind(column(assertions, |(client, _, _)| client.as_str()))
                .bind(column(assertions, |(_, jti, _)| jti.as_str()))
                .bind(column(assertions, |(_, _, expires_at)| *expires_at))
                .execute(&mut self.conn)
                .await?;
        }
        if !writes.redact.is_empty() {
            sqlx::query(REDACT_EVENTS)
                .bind(&writes.redact)
                .execute(&mut self.conn)
                .await?;
        }
        match writes.prune_before {
            Some(before) => self.conn.prune(before).await,
            None => Ok(0),
        }
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        sqlx::query("COMMIT").execute(&mut self.conn).await?;
        Ok(())
    }

    async fn probe(&mut self, now: Millis) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO storage_probe (id, at_ms) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms",
        )
        .bind(now)
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}

/// One column of rows, as an array to bind.
fn column<'a, T, V>(rows: &'a [T], value: impl Fn(&'a T) -> V) -> Vec<V> {
    rows.iter().map(value).collect()
}

/// Takes one call from a bucket, refilled for the time since it was last used: the row is
/// written only when a call is available, and then returns what is left.
const TAKE_TOKEN: &str = "
INSERT INTO rate_buckets AS b (key, available, updated_ms) VALUES ($1, $3 - 1, $4)
    ON CONFLICT (key) DO UPDATE
   SET available = least($3, b.available + greatest($4 - b.updated_ms, 0) * $2) - 1,
       updated_ms = greatest($4, b.updated_ms)
 WHERE least($3, b.available + greatest($4 - b.updated_ms, 0) * $2) >= 1
RETURNING available";

/// What a bucket holds now, refilled.
const BUCKET_LEVEL: &str = "
SELECT least($3, available + greatest($4 - updated_ms, 0) * $2) FROM rate_buckets WHERE key = $1";

#[async_trait]
impl Backend for PostgresBackend {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError> {
        let conn = PgConnection::connect_with(&self.writer_options).await?;
        Ok(Box::new(PgWriter { conn }))
    }

    /// In one snapshot: the other replicas keep writing while this one starts.
    async fn check_integrity(&self) -> Result<(), IntegrityError> {
        let mut tx = self.reads.begin().await.map_err(StoreError::from)?;
        sqlx::query(SNAPSHOT).execute(&mut *tx).await?;
        audit_sql::check_at_start(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        audit_sql::load_verified(&mut *self.reads.acquire().await?, approval_id).await
    }

    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        let mut tx = self.reads.begin().await?;
        sqlx::query(SNAPSHOT).execute(&mut *tx).await?;
        let head_seq = tx.anchor().await?.head_seq;
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
        sqlx::query(SNAPSHOT).execute(&mut *tx).await?;
        let head = tx.anchor().await?.head_seq;
        let oldest: Option<i64> = sqlx::query_scalar("SELECT MIN(seq) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((head, oldest.unwrap_or(head + 1)))
    }

    async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        self.reads.acquire().await?.verify().await
    }

    /// PostgreSQL has its own tools for consistent online copies.
    async fn backup(&self, _into: &Path) -> Result<Backup, BackupError> {
        Err(BackupError::Postgres)
    }

    fn history(&self) -> &str {
        &self.history
    }

    fn shared_by_replicas(&self) -> bool {
        true
    }

    /// Takes (or keeps) the sweep lock on a connection of its own; a lost connection loses
    /// the lock, and another replica takes it at its next sweep.
    async fn leads_sweeps(&self) -> bool {
        let mut sweeper = self.sweeper.lock().await;
        let mut conn = match sweeper.take() {
            Some(conn) => conn,
            None => match PgConnection::connect_with(&self.options).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot connect to take the sweep lock");
                    return false;
                }
            },
        };
        // Session locks nest: holding it already, this just confirms the connection is alive.
        match sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
            .bind(SWEEP_LOCK)
            .fetch_one(&mut conn)
            .await
        {
            Ok(leads) => {
                *sweeper = Some(conn);
                leads
            }
            Err(e) => {
                tracing::warn!(error = %e, "lost the connection that holds the sweep lock");
                false
            }
        }
    }

    async fn take_token(
        &self,
        key: &str,
        per_ms: f64,
        burst: f64,
        now: Millis,
    ) -> Result<Option<Result<(), Duration>>, StoreError> {
        let taken: Option<f64> = sqlx::query_scalar(TAKE_TOKEN)
            .bind(key)
            .bind(per_ms)
            .bind(burst)
            .bind(now)
            .fetch_optional(&self.reads)
            .await?;
        if taken.is_some() {
            return Ok(Some(Ok(())));
        }
        let level: Option<f64> = sqlx::query_scalar(BUCKET_LEVEL)
            .bind(key)
            .bind(per_ms)
            .bind(burst)
            .bind(now)
            .fetch_optional(&self.reads)
            .await?;
        let missing = 1.0 - level.unwrap_or(0.0);
        Ok(Some(Err(Duration::from_secs_f64(
            (missing / per_ms / 1000.0).max(0.001),
        ))))
    }
}

super::reads::sql_reads!(Postgres, PgPool, PgRow, PostgresBackend);

audit_sql::audit_sql!(PgConnection, Some(SNAPSHOT));

/// Connects and brings the schema up to date (for `audit` commands).
pub(crate) async fn connect_migrated(url: &str) -> Result<PgConnection, StoreError> {
    let mut conn = PgConnection::connect(url).await?;
    MIGRATOR.run_direct(&mut conn).await?;
    Ok(conn)
}

fn bounded_grant_from_row(row: &PgRow) -> Result<BoundedGrant, sqlx::Error> {
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
