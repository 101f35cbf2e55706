//! The SQLite writer's connection: the only one that writes, opened with rusqlite on the
//! writer's own thread and used synchronously there. sqlx runs each statement on a worker
//! thread of its own, so every statement of a batch was a round trip between two threads, and
//! a batch's rows had to travel as one JSON array per statement (which SQLite parsed again
//! with `json_each`) to keep those round trips few. Here a batch is prepared statements
//! stepped in place, one row at a time: no thread hop, no JSON of the rows. The migrations,
//! the reads and the checkpointer stay on sqlx (`sqlite.rs`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::groups::Delegation;
use countersign_core::Millis;
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::Notify;

use super::audit_sql::sql::{DELETE_UP_TO, MOVE_TAIL, PRUNE_CUT};
use super::backend::WriterConnection;
use super::batch::{BatchKeys, BoundedGrant, Loaded, WriteSet, EXPIRY_SWEEP_LIMIT};
use super::error::StoreError;
use super::reads::readable_approvals;
use super::records::{channels_column, ChainHead, Grant, PasskeyWrite, GRANT_COLUMNS};
use crate::config::{Durability, WalCheckpoints};

/// Statements kept prepared on the connection (every one below fits).
const PREPARED_STATEMENTS: usize = 32;

const NEWEST_EVENT: &str = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1";
const HEAD_SEQ: &str = "SELECT seq FROM sqlite_sequence WHERE name = 'events'";
const APPROVAL_BY_ID: &str = "SELECT body FROM approvals WHERE id = ?1";
const APPROVAL_OF_GRANT: &str =
    "SELECT a.body FROM grants g JOIN approvals a ON a.id = g.approval_id WHERE g.id = ?1";
const APPROVAL_BY_KEY: &str =
    "SELECT body FROM approvals WHERE agent_id = ?1 AND idempotency_key = ?2";
/// The approvals a follow-up sweep expires, escalates or reminds, earliest due first. Only a
/// sweep's batch reads them: walking the pending approvals is not free when many wait.
const DUE: &str = "SELECT body FROM approvals INDEXED BY approvals_pending_by_due
 WHERE state = 'PENDING' AND due_at_ms <= ?1 ORDER BY due_at_ms LIMIT ?2";
const PENDING_OF_AGENT: &str =
    "SELECT expires_at_ms FROM approvals WHERE agent_id = ?1 AND state = 'PENDING'";
const DELEGATION_BY_ID: &str = "SELECT id, delegator, delegate, created_at_ms, until_ms,
 revoked_at_ms, reason, created_by FROM delegations WHERE id = ?1";

const UPSERT_APPROVAL: &str = "INSERT INTO approvals (id, agent_id, idempotency_key, session_id,
 tool_name, state, channels, created_at_ms, expires_at_ms, body, due_at_ms)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
 ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body,
   channels = excluded.channels, expires_at_ms = excluded.expires_at_ms,
   due_at_ms = excluded.due_at_ms";
const INSERT_EVENT: &str = "INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id,
 decider, approver, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
const INSERT_GRANT: &str = "INSERT INTO grants (id, agent_id, session_id, tool_name, approval_id,
 granted_by, created_at_ms, expires_at_ms, max_risk_rank, max_required_approvals, scope)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";
const REVOKE_GRANT: &str = "UPDATE grants SET revoked_at_ms = ?2 WHERE id = ?1";
/// Blanks the argument values still stored in an approval's events.
const REDACT_EVENTS: &str =
    "UPDATE events SET body = json_set(body, '$.approval.arguments_json', '')
 WHERE approval_id = ?1 AND json_extract(body, '$.approval.arguments_json') <> ''";
const UPSERT_DELEGATION: &str = "INSERT INTO delegations (id, delegator, delegate, created_at_ms,
 until_ms, revoked_at_ms, reason, created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
 ON CONFLICT (id) DO UPDATE SET revoked_at_ms = excluded.revoked_at_ms";
/// A credential id already stored keeps its row, whoever registered it.
const INSERT_PASSKEY: &str = "INSERT INTO passkeys (credential_id, approver, name, cose_key,
 algorithm, sign_count, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
 ON CONFLICT (credential_id) DO NOTHING";
const COUNT_PASSKEY: &str = "UPDATE passkeys SET sign_count = ?3
 WHERE credential_id = ?1 AND approver = ?2 AND sign_count < ?3";
const REMOVE_PASSKEY: &str = "DELETE FROM passkeys WHERE credential_id = ?1 AND approver = ?2";
const USED_CLIENT_ASSERTION: &str =
    "SELECT 1 FROM used_client_assertions WHERE client_id = ?1 AND jti = ?2";
const INSERT_CLIENT_ASSERTION: &str =
    "INSERT INTO used_client_assertions (client_id, jti, expires_at_ms) VALUES (?1, ?2, ?3)";
const FORGET_CLIENT_ASSERTIONS: &str =
    "DELETE FROM used_client_assertions WHERE expires_at_ms <= ?1";
const PROBE: &str = "INSERT INTO storage_probe (id, at_ms) VALUES (1, ?1)
 ON CONFLICT (id) DO UPDATE SET at_ms = excluded.at_ms";

/// WAL pages after which a commit checkpoints by itself ("0": never). With the server's
/// checkpointer only a backstop for one that cannot keep up (SQLite's default is 1,000).
pub(super) fn autocheckpoint_pages(checkpoints: WalCheckpoints) -> &'static str {
    match checkpoints {
        WalCheckpoints::Server => "10000",
        WalCheckpoints::External => "0",
    }
}

/// How the writer's connection is opened.
#[derive(Clone)]
pub(super) struct WriterSettings {
    pub path: PathBuf,
    pub durability: Durability,
    pub wal_checkpoints: WalCheckpoints,
    /// The size the WAL is cut back to when this connection starts it over.
    pub wal_size_limit_bytes: u64,
}

/// The only writing connection. Transactions are begun and committed with plain SQL: after
/// any failure the store drops the connection (closing it rolls back whatever SQLite still
/// holds), so no transaction state survives into the next batch.
pub(super) struct SqliteWriter {
    conn: Connection,
    /// Woken by each commit.
    checkpointer: Arc<Notify>,
}

impl SqliteWriter {
    /// Opens the writer's connection to a database the migrations already made.
    pub(super) fn open(
        settings: &WriterSettings,
        checkpointer: Arc<Notify>,
    ) -> Result<SqliteWriter, StoreError> {
        let conn = open_connection(&settings.path)?;
        let synchronous = match settings.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        // A batch's statements change many rows; the journal that lets one of them fail alone
        // would spill to a temporary file (created, written, deleted) in every batch.
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON;
             PRAGMA temp_store = memory; PRAGMA wal_autocheckpoint = {};",
            autocheckpoint_pages(settings.wal_checkpoints)
        ))?;
        // SQLite checkpoints when a database's last connection closes; the writer's is often
        // the last (the reads' are read-only and cannot), and may close after the server has
        // returned from its shutdown.
        match settings.wal_checkpoints {
            WalCheckpoints::External => {
                conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            }
            // The WAL keeps its largest size otherwise: a burst, or a backup's long read,
            // would leave it at tens of megabytes for good. (The process that owns the
            // checkpoints also owns the WAL's size.)
            WalCheckpoints::Server => conn.execute_batch(&format!(
                "PRAGMA journal_size_limit = {};",
                i64::try_from(settings.wal_size_limit_bytes).unwrap_or(i64::MAX)
            ))?,
        }
        conn.set_prepared_statement_cache_capacity(PREPARED_STATEMENTS);
        Ok(SqliteWriter { conn, checkpointer })
    }

    fn run(&self, sql: &str) -> Result<(), StoreError> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    /// Each body one statement's rows hold, in order.
    fn bodies(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        into: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        let mut statement = self.conn.prepare_cached(sql)?;
        let rows = statement.query_map(params, |row| row.get::<_, String>(0))?;
        for body in rows {
            into.push(body?);
        }
        Ok(())
    }

    fn load_grants(&self, keys: &BatchKeys) -> Result<Vec<BoundedGrant>, StoreError> {
        let mut grants = Vec::new();
        let mut seen = HashSet::new();
        let mut by_id = self
            .conn
            .prepare_cached(&format!("SELECT {GRANT_COLUMNS} FROM grants WHERE id = ?1"))?;
        for id in &keys.grant_ids {
            for grant in by_id.query_map([id], bounded_grant)? {
                let grant = grant?;
                if seen.insert(grant.grant.id.clone()) {
                    grants.push(grant);
                }
            }
        }
        let mut of_session = self.conn.prepare_cached(&format!(
            "SELECT {GRANT_COLUMNS} FROM grants
              WHERE agent_id = ?1 AND session_id = ?2 AND revoked_at_ms IS NULL"
        ))?;
        for (agent, session) in &keys.grant_scopes {
            for grant in of_session.query_map([agent, session], bounded_grant)? {
                let grant = grant?;
                if seen.insert(grant.grant.id.clone()) {
                    grants.push(grant);
                }
            }
        }
        Ok(grants)
    }

    fn write_rows(&self, writes: &WriteSet) -> Result<(), StoreError> {
        let mut upsert = self.conn.prepare_cached(UPSERT_APPROVAL)?;
        for (a, body) in writes.approval_rows()? {
            upsert.execute(params![
                a.id,
                a.agent_id,
                a.idempotency_key,
                a.session_id,
                a.tool_name,
                a.state.as_str(),
                channels_column(a),
                a.created_at,
                a.expires_at,
                body.as_ref(),
                a.next_due(),
            ])?;
        }
        let mut insert = self.conn.prepare_cached(INSERT_EVENT)?;
        for e in &writes.events {
            insert.execute(params![
                e.seq,
                e.approval_id,
                e.kind.as_str(),
                e.at,
                e.body,
                e.columns.agent_id,
                e.columns.decider,
                e.columns.approver,
                e.prev_hash,
                e.hash,
            ])?;
        }
        if !writes.new_grants.is_empty() {
            let mut insert = self.conn.prepare_cached(INSERT_GRANT)?;
            for g in &writes.new_grants {
                insert.execute(params![
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
                ])?;
            }
        }
        if !writes.revoked_grants.is_empty() {
            let mut revoke = self.conn.prepare_cached(REVOKE_GRANT)?;
            for (id, at) in &writes.revoked_grants {
                revoke.execute(params![id, at])?;
            }
        }
        if !writes.redact.is_empty() {
            let mut redact = self.conn.prepare_cached(REDACT_EVENTS)?;
            for approval_id in &writes.redact {
                redact.execute([approval_id])?;
            }
        }
        if !writes.delegations.is_empty() {
            let mut upsert = self.conn.prepare_cached(UPSERT_DELEGATION)?;
            for d in writes.delegations.values() {
                upsert.execute(params![
                    d.id,
                    d.delegator,
                    d.delegate,
                    d.created_at,
                    d.until,
                    d.revoked_at,
                    d.reason,
                    d.created_by,
                ])?;
            }
        }
        for write in &writes.passkeys {
            match write {
                PasskeyWrite::Register(p) => {
                    self.conn.prepare_cached(INSERT_PASSKEY)?.execute(params![
                        p.credential_id,
                        p.approver,
                        p.name,
                        p.cose_key,
                        p.algorithm,
                        p.sign_count,
                        p.created_at,
                    ])?
                }
                PasskeyWrite::Count {
                    credential_id,
                    approver,
                    sign_count,
                } => self.conn.prepare_cached(COUNT_PASSKEY)?.execute(params![
                    credential_id,
                    approver,
                    sign_count
                ])?,
                PasskeyWrite::Remove {
                    credential_id,
                    approver,
                } => self
                    .conn
                    .prepare_cached(REMOVE_PASSKEY)?
                    .execute(params![credential_id, approver])?,
            };
        }
        if let Some(before) = writes.forget_assertions_before {
            self.conn
                .prepare_cached(FORGET_CLIENT_ASSERTIONS)?
                .execute([before])?;
        }
        if !writes.client_assertions.is_empty() {
            let mut insert = self.conn.prepare_cached(INSERT_CLIENT_ASSERTION)?;
            for (client_id, jti, expires_at) in &writes.client_assertions {
                insert.execute(params![client_id, jti, expires_at])?;
            }
        }
        Ok(())
    }

    /// Deletes the events older than `before` but the newest, moving the chain's tail past
    /// them; returns how many were deleted.
    fn prune(&self, before: Millis) -> Result<u64, StoreError> {
        let cut: Option<(i64, Option<String>)> = self
            .conn
            .prepare_cached(PRUNE_CUT)?
            .query_row([before], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let Some((cut, hash)) = cut else {
            return Ok(0);
        };
        self.conn
            .prepare_cached(MOVE_TAIL)?
            .execute(params![cut + 1, hash.unwrap_or_default()])?;
        let deleted = self.conn.prepare_cached(DELETE_UP_TO)?.execute([cut])?;
        Ok(deleted as u64)
    }
}

/// Opens a read-write connection to an existing database.
fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

fn bounded_grant(row: &Row<'_>) -> rusqlite::Result<BoundedGrant> {
    Ok(BoundedGrant {
        grant: Grant {
            id: row.get(0)?,
            agent_id: row.get(1)?,
            session_id: row.get(2)?,
            tool_name: row.get(3)?,
            approval_id: row.get(4)?,
            granted_by: row.get(5)?,
            created_at: row.get(6)?,
            expires_at: row.get(7)?,
            revoked_at: row.get(8)?,
        },
        max_risk_rank: row.get(9)?,
        max_required_approvals: row.get(10)?,
        scope: row.get(11)?,
    })
}

fn delegation(row: &Row<'_>) -> rusqlite::Result<Delegation> {
    Ok(Delegation {
        id: row.get(0)?,
        delegator: row.get(1)?,
        delegate: row.get(2)?,
        created_at: row.get(3)?,
        until: row.get(4)?,
        revoked_at: row.get(5)?,
        reason: row.get(6)?,
        created_by: row.get(7)?,
    })
}

// Every method runs to completion without awaiting: the connection is used in place, on the
// writer's thread (which runs nothing else).
#[async_trait]
impl WriterConnection for SqliteWriter {
    async fn begin(&mut self) -> Result<Option<ChainHead>, StoreError> {
        self.run("BEGIN IMMEDIATE")?;
        Ok(None)
    }

    async fn chain_head(&mut self) -> Result<ChainHead, StoreError> {
        let newest: Option<(i64, Option<String>)> = self
            .conn
            .prepare_cached(NEWEST_EVENT)?
            .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let (newest_seq, hash) = newest
            .map(|(seq, hash)| (seq, hash.unwrap_or_default()))
            .unwrap_or_default();
        let head_seq: Option<i64> = self
            .conn
            .prepare_cached(HEAD_SEQ)?
            .query_row([], |row| row.get(0))
            .optional()?;
        Ok(ChainHead {
            seq: head_seq.unwrap_or(0).max(newest_seq),
            hash,
        })
    }

    async fn load(&mut self, keys: &BatchKeys) -> Result<Loaded, StoreError> {
        let mut bodies = Vec::new();
        for id in &keys.approval_ids {
            self.bodies(APPROVAL_BY_ID, [id], &mut bodies)?;
        }
        for id in &keys.grant_ids {
            self.bodies(APPROVAL_OF_GRANT, [id], &mut bodies)?;
        }
        for (agent, key) in &keys.request_keys {
            self.bodies(APPROVAL_BY_KEY, [agent, key], &mut bodies)?;
        }
        if let Some(due_at) = keys.due_at {
            self.bodies(DUE, params![due_at, EXPIRY_SWEEP_LIMIT], &mut bodies)?;
        }
        let mut loaded = Loaded {
            approvals: readable_approvals(&bodies),
            grants: self.load_grants(keys)?,
            ..Loaded::default()
        };
        if !keys.delegation_ids.is_empty() {
            let mut by_id = self.conn.prepare_cached(DELEGATION_BY_ID)?;
            for id in &keys.delegation_ids {
                if let Some(found) = by_id.query_row([id], delegation).optional()? {
                    loaded.delegations.push(found);
                }
            }
        }
        if !keys.client_assertions.is_empty() {
            let mut used = self.conn.prepare_cached(USED_CLIENT_ASSERTION)?;
            for (client_id, jti) in &keys.client_assertions {
                if used.exists([client_id, jti])? {
                    loaded
                        .used_client_assertions
                        .push((client_id.clone(), jti.clone()));
                }
            }
        }
        if !keys.pending_agents.is_empty() {
            let mut pending = self.conn.prepare_cached(PENDING_OF_AGENT)?;
            for agent in &keys.pending_agents {
                for expires_at in pending.query_map([agent], |row| row.get::<_, Millis>(0))? {
                    loaded.pending.push((agent.clone(), expires_at?));
                }
            }
        }
        Ok(loaded)
    }

    async fn write(&mut self, writes: &WriteSet) -> Result<u64, StoreError> {
        self.write_rows(writes)?;
        match writes.prune_before {
            Some(before) => self.prune(before),
            None => Ok(0),
        }
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        self.run("COMMIT")?;
        self.checkpointer.notify_one();
        Ok(())
    }

    async fn probe(&mut self, now: Millis) -> Result<(), StoreError> {
        self.conn.prepare_cached(PROBE)?.execute([now])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Closed as the database's only connection, the writer leaves the WAL to the process
    /// that checkpoints it; with the server's own checkpoints, SQLite's close may copy it.
    #[test]
    fn with_external_checkpoints_the_last_close_leaves_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writer.db");
        let setup = Connection::open(&path).unwrap();
        setup
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER);")
            .unwrap();
        drop(setup);
        let wal = || std::fs::metadata(dir.path().join("writer.db-wal")).map(|m| m.len());

        for (checkpoints, kept) in [
            (WalCheckpoints::External, true),
            (WalCheckpoints::Server, false),
        ] {
            let settings = WriterSettings {
                path: path.clone(),
                durability: Durability::Full,
                wal_checkpoints: checkpoints,
                wal_size_limit_bytes: 0,
            };
            let writer = SqliteWriter::open(&settings, Arc::new(Notify::new())).unwrap();
            writer.run("INSERT INTO t (x) VALUES (1)").unwrap();
            let wal_before = wal().unwrap();
            assert!(wal_before > 0);
            drop(writer);
            // A checkpoint on close copies the WAL and deletes it.
            assert_eq!(wal().ok() == Some(wal_before), kept, "{checkpoints:?}");
        }
    }
}
