//! The worker's durable local state (SQLite in `state_dir`): the deliveries (pending, done,
//! dead letters) and, beside them, the decision links (`countersign-links`). The
//! `dead-letters` and `revoke-links` commands open the same database while the worker runs
//! (WAL, busy timeout).
//!
//! A delivery row is written once per (endpoint, webhook-id) — a replayed or re-snapshotted
//! event finds it there and adds nothing — and is marked delivered only after the endpoint's
//! 2xx: a crash in between re-sends it with the same webhook-id (at-least-once). A delivered
//! row's body (it holds the plaintext decision links) is erased.

use std::path::Path;
use std::time::Duration;

pub use countersign_links::store::now_ms;
use countersign_links::store::{open_database, LinkStore, LinkStoreError, NewLink};
use sqlx::{Row, SqlitePool};

use crate::event::{REQUESTED, RESOLVED};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("webhook state database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Links(#[from] LinkStoreError),
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS deliveries (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        endpoint TEXT NOT NULL,
        webhook_id TEXT NOT NULL,
        approval_id TEXT NOT NULL,
        event_type TEXT NOT NULL,
        body TEXT,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        window_start_ms INTEGER NOT NULL,
        next_attempt_ms INTEGER NOT NULL,
        last_error TEXT,
        UNIQUE (endpoint, webhook_id))",
    "CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_attempt_ms)",
    "CREATE INDEX IF NOT EXISTS deliveries_approval ON deliveries (approval_id, endpoint, state)",
];

/// A delivery to attempt, or a dead letter to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub seq: i64,
    pub endpoint: String,
    pub webhook_id: String,
    pub approval_id: String,
    pub event_type: String,
    pub body: String,
    pub attempts: i64,
    pub window_start_ms: i64,
    pub last_error: Option<String>,
}

/// A new delivery and the decision links its body carries (by token hash).
pub struct NewDelivery<'a> {
    pub endpoint: &'a str,
    pub webhook_id: &'a str,
    pub approval_id: &'a str,
    pub event_type: &'a str,
    pub body: &'a str,
    pub links: Vec<NewLink>,
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    links: LinkStore,
}

impl Store {
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let pool = open_database(path, SCHEMA).await?;
        let links = LinkStore::attach(pool.clone()).await?;
        Ok(Store { pool, links })
    }

    /// The decision links, in the same database.
    pub fn links(&self) -> &LinkStore {
        &self.links
    }

    /// Writes a delivery and its links, unless the endpoint already has this webhook-id.
    /// Returns whether it was new.
    pub async fn add(&self, new: NewDelivery<'_>) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT OR IGNORE INTO deliveries (endpoint, webhook_id, approval_id, event_type, body, state, window_start_ms, next_attempt_ms)
             VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
        )
        .bind(new.endpoint)
        .bind(new.webhook_id)
        .bind(new.approval_id)
        .bind(new.event_type)
        .bind(new.body)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if inserted {
            LinkStore::insert(&mut tx, new.approval_id, new.endpoint, new.links).await?;
        }
        tx.commit().await?;
        Ok(inserted)
    }

    /// Approvals whose request event was queued for one of `endpoints` (those configured now:
    /// a removed endpoint is owed nothing) and whose resolution event was not (yet): the ones
    /// to look at after the worker was away.
    pub async fn awaiting_resolution(&self, endpoints: &[&str]) -> Result<Vec<String>, StoreError> {
        let endpoints = serde_json::to_string(endpoints).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(
            "SELECT DISTINCT d.approval_id FROM deliveries d WHERE d.event_type = ?
               AND d.endpoint IN (SELECT value FROM json_each(?))
               AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.approval_id = d.approval_id
                 AND e.endpoint = d.endpoint AND e.event_type = ?)",
        )
        .bind(REQUESTED)
        .bind(endpoints)
        .bind(RESOLVED)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|row| row.get("approval_id")).collect())
    }

    /// Whether an event of this approval was ever queued for an endpoint.
    pub async fn knows_approval(&self, approval_id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT 1 FROM deliveries WHERE approval_id = ? LIMIT 1")
            .bind(approval_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Pending deliveries due now, oldest first, each the oldest pending one of its
    /// (endpoint, approval) so that a receiver sees an approval's events in order.
    pub async fn due(&self, limit: i64) -> Result<Vec<Delivery>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= ?
               AND NOT EXISTS (SELECT 1 FROM deliveries e WHERE e.state = 'pending'
                 AND e.endpoint = d.endpoint AND e.approval_id = d.approval_id AND e.seq < d.seq)
             ORDER BY d.seq LIMIT ?",
        )
        .bind(now_ms())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(delivery_of).collect())
    }

    /// When the next pending delivery is due (ms since the epoch).
    pub async fn next_due_ms(&self) -> Result<Option<i64>, StoreError> {
        let row =
            sqlx::query("SELECT MIN(next_attempt_ms) FROM deliveries WHERE state = 'pending'")
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }

    /// The delivery `seq` as it is now, if it is still pending and due: what an attempt
    /// sends (a row read earlier may have been delivered, failed or rescheduled since).
    pub async fn due_delivery(&self, seq: i64) -> Result<Option<Delivery>, StoreError> {
        let row = sqlx::query(
            "SELECT * FROM deliveries WHERE seq = ? AND state = 'pending' AND next_attempt_ms <= ?",
        )
        .bind(seq)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(delivery_of))
    }

    /// Marks the attempt of `delivery` delivered. Only the attempt that read the row as it
    /// is (pending, with as many attempts) changes it; returns whether it did.
    pub async fn delivered(&self, delivery: &Delivery) -> Result<bool, StoreError> {
        let changed = sqlx::query("UPDATE deliveries SET state = 'delivered', body = NULL, attempts = attempts + 1, last_error = NULL WHERE seq = ? AND state = 'pending' AND attempts = ?")
            .bind(delivery.seq)
            .bind(delivery.attempts)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(changed == 1)
    }

    /// Notes a failed attempt of `delivery`: tried again in `retry_in`, or a dead letter when
    /// none. Like [`Store::delivered`], only for the row as the attempt read it: a late
    /// failure never puts a delivered row (whose body is erased) back in the queue.
    pub async fn failed(
        &self,
        delivery: &Delivery,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let (state, next) = match retry_in {
            Some(wait) => ("pending", now_ms() + wait.as_millis() as i64),
            None => ("dead", now_ms()),
        };
        let changed = sqlx::query("UPDATE deliveries SET state = ?, next_attempt_ms = ?, attempts = attempts + 1, last_error = ? WHERE seq = ? AND state = 'pending' AND attempts = ?")
            .bind(state)
            .bind(next)
            .bind(error)
            .bind(delivery.seq)
            .bind(delivery.attempts)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(changed == 1)
    }

    pub async fn dead_letters(&self) -> Result<Vec<Delivery>, StoreError> {
        let rows = sqlx::query("SELECT * FROM deliveries WHERE state = 'dead' ORDER BY seq")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(delivery_of).collect())
    }

    /// Puts a dead letter back in the queue (due now, a fresh retry window). Returns whether
    /// there was such a dead letter.
    pub async fn retry_dead_letter(&self, seq: i64) -> Result<bool, StoreError> {
        let now = now_ms();
        let changed = sqlx::query("UPDATE deliveries SET state = 'pending', next_attempt_ms = ?, window_start_ms = ? WHERE seq = ? AND state = 'dead'")
            .bind(now)
            .bind(now)
            .bind(seq)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(changed == 1)
    }

    /// The webhook-ids (with their state) queued for an approval, oldest first.
    pub async fn deliveries_of(
        &self,
        approval_id: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT webhook_id, state FROM deliveries WHERE approval_id = ? ORDER BY seq",
        )
        .bind(approval_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("webhook_id")?, row.try_get("state")?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}

fn delivery_of(row: &sqlx::sqlite::SqliteRow) -> Delivery {
    Delivery {
        seq: row.get("seq"),
        endpoint: row.get("endpoint"),
        webhook_id: row.get("webhook_id"),
        approval_id: row.get("approval_id"),
        event_type: row.get("event_type"),
        body: row.get::<Option<String>, _>("body").unwrap_or_default(),
        attempts: row.get("attempts"),
        window_start_ms: row.get("window_start_ms"),
        last_error: row.get("last_error"),
    }
}
