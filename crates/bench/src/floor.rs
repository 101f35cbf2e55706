//! The storage floor, measured in the same run as the server: the server's request writes (an
//! idempotency lookup, the approval's row, its REQUESTED event) straight into the storage, on
//! one connection with the writer's settings, in transactions of as many changes as the
//! server's group commit gathered. No gRPC, no service, no JSON of the domain, no audit
//! hashing: what no server on this storage can beat on this machine.
//!
//! The database is one the server created and migrated (its schema, every migration), and the
//! rows are copies of an approval the server itself wrote there, so row sizes and indexes are
//! exactly the server's; agents and idempotency keys have the shape of the RequestApproval
//! figures' calls. The statements are the writer's: on SQLite prepared once and stepped row by
//! row on a rusqlite connection, as the server's writer does; on PostgreSQL arrays expanded by
//! `unnest` under the chain head's row lock.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::Connection;

use crate::error::BenchError;
use crate::load::Load;

/// Where the floor writes: the database a stopped server created.
pub enum Storage<'a> {
    Sqlite(&'a Path),
    Postgres(&'a str),
}

/// The approval the server wrote, whose rows the floor copies.
pub struct Template {
    pub id: String,
    pub key: String,
    pub agent: String,
}

/// Changes written in the measured window and their rate.
pub struct Floor {
    pub changes: u64,
    pub per_second: f64,
}

/// The template approval's row without its keys, in the server's column order.
#[derive(Deserialize)]
struct ApprovalColumns(
    String,      // session_id
    String,      // tool_name
    String,      // state
    String,      // channels
    i64,         // created_at_ms
    i64,         // expires_at_ms
    String,      // body
    Option<i64>, // due_at_ms
);

/// The template's REQUESTED event: kind, body, decider, approver.
#[derive(Deserialize)]
struct EventColumns(String, String, String, String);

/// One approval row as the writer binds it (`migrations/*`: approvals).
struct ApprovalRow<'a>(
    String,
    String,
    String,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    i64,
    i64,
    String,
    Option<i64>,
);

/// One event row as the writer binds it (events).
struct EventRow<'a>(
    i64,
    String,
    &'a str,
    i64,
    String,
    String,
    &'a str,
    &'a str,
    String,
    String,
);

/// A batch of new request rows, copies of the template.
struct Batch<'a> {
    approvals: Vec<ApprovalRow<'a>>,
    events: Vec<EventRow<'a>>,
}

impl Batch<'_> {
    fn keys(&self) -> (Vec<&str>, Vec<&str>) {
        self.approvals
            .iter()
            .map(|a| (a.1.as_str(), a.2.as_str()))
            .unzip()
    }
}

/// Makes the rows of each batch: agents and keys as the RequestApproval figures send them,
/// time-ordered approval ids, chained (random) hashes, seqs after the chain's head.
struct Rows<'a> {
    template: &'a Template,
    approval: ApprovalColumns,
    event: EventColumns,
    concurrency: usize,
    made: u64,
    prefix: String,
    hash: String,
    random: u64,
}

impl<'a> Rows<'a> {
    fn next_batch(&mut self, size: usize, head_seq: i64) -> Batch<'_> {
        let now = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(i64::MAX);
        let mut batch = Batch {
            approvals: Vec::with_capacity(size),
            events: Vec::with_capacity(size),
        };
        let template = self.template;
        let a = &self.approval;
        for seq in (head_seq + 1..).take(size) {
            let worker = self.made as usize % self.concurrency;
            let iteration = self.made / self.concurrency as u64;
            self.made += 1;
            let agent = format!("bench-agent-{worker:02}");
            let key = format!("{}-w{worker:02}-{iteration:010}", self.prefix);
            let id = uuid::Uuid::now_v7().to_string();
            let copy = |body: &str| {
                body.replace(&template.id, &id)
                    .replace(&template.key, &key)
                    .replace(&template.agent, &agent)
            };
            let hash = next_hash(&mut self.random);
            batch.events.push(EventRow(
                seq,
                id.clone(),
                &self.event.0,
                now,
                copy(&self.event.1),
                agent.clone(),
                &self.event.2,
                &self.event.3,
                std::mem::replace(&mut self.hash, hash.clone()),
                hash,
            ));
            batch.approvals.push(ApprovalRow(
                id.clone(),
                agent.clone(),
                key.clone(),
                &a.0,
                &a.1,
                &a.2,
                &a.3,
                now,
                now + (a.5 - a.4),
                copy(&a.6),
                a.7.map(|due| now + (due - a.4)),
            ));
        }
        batch
    }
}

/// 64 hex digits that look like a SHA-256 (xorshift: hashing is not the storage's cost).
fn next_hash(random: &mut u64) -> String {
    let mut hex = String::with_capacity(64);
    for _ in 0..4 {
        *random ^= *random << 13;
        *random ^= *random >> 7;
        *random ^= *random << 17;
        hex.push_str(&format!("{:016x}", *random));
    }
    hex
}

/// The idempotency lookup found none of the batch's keys, as for new requests.
fn keys_are_new(existing: Result<i64, sqlx::Error>) -> Result<(), BenchError> {
    match existing.map_err(db_error)? {
        0 => Ok(()),
        _ => Err(BenchError::Setup(
            "storage floor: an idempotency key repeated".into(),
        )),
    }
}

/// Runs one statement without arguments (BEGIN, COMMIT).
async fn statement<'c, E: sqlx::Executor<'c>>(
    conn: E,
    sql: &'static str,
) -> Result<(), BenchError> {
    conn.execute(sql).await.map(drop).map_err(db_error)
}

fn db_error(e: sqlx::Error) -> BenchError {
    BenchError::Setup(format!("storage floor: {e}"))
}

/// Writes request rows in transactions of `batch` changes for the load's warm-up and then its
/// measured duration.
pub async fn request_writes(
    storage: Storage<'_>,
    template: &Template,
    batch: usize,
    load: &Load,
) -> Result<Floor, BenchError> {
    match storage {
        Storage::Sqlite(path) => sqlite(path, template, batch, load).await,
        Storage::Postgres(url) => postgres(url, template, batch, load).await,
    }
}

/// Runs `write_batch` back to back: unmeasured for the warm-up, then counted; or, with
/// `load.calls`, batches until that many changes are written, all counted.
async fn timed<F>(load: &Load, batch: usize, mut write_batch: F) -> Result<Floor, BenchError>
where
    F: AsyncFnMut() -> Result<(), BenchError>,
{
    let warm = Instant::now();
    while load.calls.is_none() && warm.elapsed() < load.warmup {
        write_batch().await?;
    }
    let started = Instant::now();
    let mut changes = 0u64;
    while match load.calls {
        Some(calls) => changes < calls,
        None => started.elapsed() < load.duration,
    } {
        write_batch().await?;
        changes += batch as u64;
    }
    Ok(Floor {
        changes,
        per_second: changes as f64 / started.elapsed().as_secs_f64(),
    })
}

fn rows<'a>(
    template: &'a Template,
    approval: &str,
    event: &str,
    load: &Load,
) -> Result<Rows<'a>, BenchError> {
    let parse = |what: &str, json: &str| {
        BenchError::Setup(format!("storage floor: the template's {what} {json}"))
    };
    Ok(Rows {
        template,
        approval: serde_json::from_str(approval).map_err(|_| parse("approval", approval))?,
        event: serde_json::from_str(event).map_err(|_| parse("event", event))?,
        concurrency: load.concurrency.max(1),
        made: 0,
        prefix: uuid::Uuid::now_v7().simple().to_string()[..12].to_string(),
        hash: String::new(),
        random: 0x9E37_79B9_7F4A_7C15,
    })
}

/// The SQLite floor, on the writer's terms: a rusqlite connection used in place, the
/// writer's statements (`crates/server/src/store/sqlite_writer.rs`) prepared once and stepped
/// row by row, an idempotency lookup per key.
async fn sqlite(
    path: &Path,
    template: &Template,
    batch: usize,
    load: &Load,
) -> Result<Floor, BenchError> {
    let conn = open_sqlite(path)?;
    // The server's writer settings, durability full.
    conn.execute_batch(
        "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = memory;
         PRAGMA wal_autocheckpoint = 10000;",
    )
    .map_err(sqlite_error)?;
    let (approval, event): (String, String) = conn
        .query_row(
            "SELECT json_array(a.session_id, a.tool_name, a.state, a.channels, a.created_at_ms,
                               a.expires_at_ms, a.body, a.due_at_ms),
                    json_array(e.kind, e.body, e.decider, e.approver)
               FROM approvals AS a JOIN events AS e ON e.approval_id = a.id
              WHERE a.id = ?1 ORDER BY e.seq LIMIT 1",
            [&template.id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .map_err(sqlite_error)?;
    let mut rows = rows(template, &approval, &event, load)?;
    let mut head_seq: i64 = conn
        .query_row("SELECT coalesce(max(seq), 0) FROM events", [], |row| {
            row.get(0)
        })
        .map_err(sqlite_error)?;
    // The server's checkpointer: passive, on a connection of its own, every 200 ms of commits.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checkpointer = {
        let (stop, path) = (stop.clone(), path.to_path_buf());
        std::thread::spawn(move || -> Result<(), BenchError> {
            let conn = open_sqlite(&path)?;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    .map_err(sqlite_error)?;
            }
            Ok(())
        })
    };
    let floor = timed(load, batch, async || {
        let written = rows.next_batch(batch, head_seq);
        head_seq += batch as i64;
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(sqlite_error)?;
        let mut lookup = conn
            .prepare_cached(
                "SELECT body FROM approvals WHERE agent_id = ?1 AND idempotency_key = ?2",
            )
            .map_err(sqlite_error)?;
        for a in &written.approvals {
            if lookup.exists([&a.1, &a.2]).map_err(sqlite_error)? {
                return Err(BenchError::Setup(
                    "storage floor: an idempotency key repeated".into(),
                ));
            }
        }
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name,
                 state, channels, created_at_ms, expires_at_ms, body, due_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body,
                   channels = excluded.channels, expires_at_ms = excluded.expires_at_ms,
                   due_at_ms = excluded.due_at_ms",
            )
            .map_err(sqlite_error)?;
        for a in &written.approvals {
            insert
                .execute(rusqlite::params![
                    a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7, a.8, a.9, a.10
                ])
                .map_err(sqlite_error)?;
        }
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider,
                 approver, prev_hash, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .map_err(sqlite_error)?;
        for e in &written.events {
            insert
                .execute(rusqlite::params![
                    e.0, e.1, e.2, e.3, e.4, e.5, e.6, e.7, e.8, e.9
                ])
                .map_err(sqlite_error)?;
        }
        conn.execute_batch("COMMIT").map_err(sqlite_error)
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let checkpointed = checkpointer
        .join()
        .map_err(|_| BenchError::Setup("storage floor checkpointer panicked".into()))?;
    let floor = floor?;
    checkpointed?;
    Ok(floor)
}

fn open_sqlite(path: &Path) -> Result<rusqlite::Connection, BenchError> {
    let conn = rusqlite::Connection::open(path).map_err(sqlite_error)?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(sqlite_error)?;
    Ok(conn)
}

fn sqlite_error(e: rusqlite::Error) -> BenchError {
    BenchError::Setup(format!("storage floor: {e}"))
}

async fn postgres(
    url: &str,
    template: &Template,
    batch: usize,
    load: &Load,
) -> Result<Floor, BenchError> {
    // The server's writer session (crates/server/src/store/postgres.rs).
    let options = PgConnectOptions::from_str(url).map_err(db_error)?.options([
        ("idle_in_transaction_session_timeout", "10s"),
        ("enable_seqscan", "off"),
    ]);
    let mut conn = PgConnection::connect_with(&options)
        .await
        .map_err(db_error)?;
    let (approval, event): (String, String) = sqlx::query_as(
        "SELECT json_build_array(a.session_id, a.tool_name, a.state, a.channels,
                                 a.created_at_ms, a.expires_at_ms, a.body, a.due_at_ms)::text,
                json_build_array(e.kind, e.body, e.decider, e.approver)::text
           FROM approvals AS a JOIN events AS e ON e.approval_id = a.id
          WHERE a.id = $1 ORDER BY e.seq LIMIT 1",
    )
    .bind(&template.id)
    .fetch_one(&mut conn)
    .await
    .map_err(db_error)?;
    let mut rows = rows(template, &approval, &event, load)?;
    let floor = timed(load, batch, async || {
        // Writers of every replica take turns on the chain head's row, as the server's do.
        statement(&mut conn, "BEGIN").await?;
        let head_seq: i64 =
            sqlx::query_scalar("SELECT head_seq FROM audit_anchor WHERE id = 1 FOR UPDATE")
                .fetch_one(&mut conn)
                .await
                .map_err(db_error)?;
        let written = rows.next_batch(batch, head_seq);
        let (agents, keys) = written.keys();
        let existing = sqlx::query_scalar(
            "SELECT count(*) FROM approvals
              WHERE (agent_id, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[]))",
        )
        .bind(agents)
        .bind(keys)
        .fetch_one(&mut conn)
        .await;
        keys_are_new(existing)?;
        let (approvals, events) = (&written.approvals, &written.events);
        sqlx::query(
            "WITH approval_rows AS (
                INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name,
                                       state, channels, created_at_ms, expires_at_ms, body,
                                       due_at_ms)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
                                     $5::text[], $6::text[], $7::text[], $8::bigint[],
                                     $9::bigint[], $10::text[], $11::bigint[])
             )
             INSERT INTO events (seq, approval_id, kind, at_ms, body, agent_id, decider,
                                 approver, prev_hash, hash)
             SELECT * FROM unnest($12::bigint[], $13::text[], $14::text[], $15::bigint[],
                                  $16::text[], $17::text[], $18::text[], $19::text[],
                                  $20::text[], $21::text[])",
        )
        .bind(column(approvals, |a| a.0.as_str()))
        .bind(column(approvals, |a| a.1.as_str()))
        .bind(column(approvals, |a| a.2.as_str()))
        .bind(column(approvals, |a| a.3))
        .bind(column(approvals, |a| a.4))
        .bind(column(approvals, |a| a.5))
        .bind(column(approvals, |a| a.6))
        .bind(column(approvals, |a| a.7))
        .bind(column(approvals, |a| a.8))
        .bind(column(approvals, |a| a.9.as_str()))
        .bind(column(approvals, |a| a.10))
        .bind(column(events, |e| e.0))
        .bind(column(events, |e| e.1.as_str()))
        .bind(column(events, |e| e.2))
        .bind(column(events, |e| e.3))
        .bind(column(events, |e| e.4.as_str()))
        .bind(column(events, |e| e.5.as_str()))
        .bind(column(events, |e| e.6))
        .bind(column(events, |e| e.7))
        .bind(column(events, |e| e.8.as_str()))
        .bind(column(events, |e| e.9.as_str()))
        .execute(&mut conn)
        .await
        .map_err(db_error)?;
        statement(&mut conn, "COMMIT").await
    })
    .await?;
    conn.close().await.map_err(db_error)?;
    Ok(floor)
}

/// One column of rows, as an array to bind.
fn column<'a, T, V>(rows: &'a [T], value: impl Fn(&'a T) -> V) -> Vec<V> {
    rows.iter().map(value).collect()
}
