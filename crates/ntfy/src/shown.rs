//! The worker's durable local state (SQLite in `state_dir`): what each notification shows,
//! the decision links beside it (`countersign-links`), and how far the reply topic was read.
//!
//! A notification's row is written before its publish (`shown` unset: the publish may or may
//! not have reached ntfy) and marked with what it shows after ntfy answered. After a crash in
//! between, the restarted worker looks for the message in the topic's cache before
//! publishing again, and a publish again is an update of the same notification (same
//! sequence id), never a second one.

use std::path::Path;

use countersign_links::store::{now_ms, open_database, LinkStore, LinkStoreError, NewLink};
use sqlx::{Row, SqlitePool};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("ntfy worker state database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Links(#[from] LinkStoreError),
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS notifications (
        approval_id TEXT NOT NULL,
        topic TEXT NOT NULL,
        intended TEXT NOT NULL,
        shown TEXT,
        started_ms INTEGER NOT NULL,
        PRIMARY KEY (approval_id, topic))",
    "CREATE TABLE IF NOT EXISTS reply_cursor (topic TEXT PRIMARY KEY, message_id TEXT NOT NULL)",
];

/// What the worker knows of one notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// What the last publish was to show.
    pub intended: String,
    /// What ntfy confirmed it shows; `None`: a publish whose answer never came.
    pub shown: Option<String>,
    /// When that publish started (ms since the epoch).
    pub started_ms: i64,
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

    pub async fn notification(
        &self,
        approval_id: &str,
        topic: &str,
    ) -> Result<Option<Notification>, StoreError> {
        let row = sqlx::query(
            "SELECT intended, shown, started_ms FROM notifications WHERE approval_id = ? AND topic = ?",
        )
        .bind(approval_id)
        .bind(topic)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|row| {
                Ok::<_, sqlx::Error>(Notification {
                    intended: row.try_get("intended")?,
                    shown: row.try_get("shown")?,
                    started_ms: row.try_get("started_ms")?,
                })
            })
            .transpose()?)
    }

    /// Records, durably, a publish about to show `intended`, with the links it carries.
    pub async fn intend(
        &self,
        approval_id: &str,
        topic: &str,
        intended: &str,
        links: Vec<NewLink>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO notifications (approval_id, topic, intended, shown, started_ms) VALUES (?, ?, ?, NULL, ?)
             ON CONFLICT (approval_id, topic) DO UPDATE SET intended = excluded.intended, shown = NULL, started_ms = excluded.started_ms",
        )
        .bind(approval_id)
        .bind(topic)
        .bind(intended)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        LinkStore::insert(&mut tx, approval_id, topic, links).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records that ntfy shows `shown` (the publish's answer came, or its message was found).
    pub async fn shown(
        &self,
        approval_id: &str,
        topic: &str,
        shown: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE notifications SET shown = ? WHERE approval_id = ? AND topic = ?")
            .bind(shown)
            .bind(approval_id)
            .bind(topic)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The id of the last message of the reply topic `topic` that was dealt with; `None`
    /// before the first (a new reply topic is read from its oldest cached message).
    pub async fn reply_cursor(&self, topic: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT message_id FROM reply_cursor WHERE topic = ?")
            .bind(topic)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| row.try_get("message_id")).transpose()?)
    }

    /// Records that the reply topic's message `message_id` was dealt with.
    pub async fn set_reply_cursor(&self, topic: &str, message_id: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO reply_cursor (topic, message_id) VALUES (?, ?) ON CONFLICT (topic) DO UPDATE SET message_id = excluded.message_id")
            .bind(topic)
            .bind(message_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Approvals with a notification not known to show a final state: the ones to look at
    /// after the worker was away.
    pub async fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT approval_id FROM notifications WHERE shown IS NULL OR shown NOT LIKE 'final:%'",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|row| row.get("approval_id")).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_links::LinkVerdict;

    #[tokio::test]
    async fn a_publish_is_uncertain_until_shown_and_final_ones_are_finished() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state/ntfy.db"))
            .await
            .unwrap();
        let (_, link) = NewLink::mint(LinkVerdict::Approve, "alice", i64::MAX);
        store
            .intend("a1", "ops", "pending:d1", vec![link])
            .await
            .unwrap();
        let uncertain = store.notification("a1", "ops").await.unwrap().unwrap();
        assert_eq!(uncertain.intended, "pending:d1");
        assert_eq!(uncertain.shown, None);
        assert_eq!(store.unfinished().await.unwrap(), vec!["a1".to_owned()]);
        store.shown("a1", "ops", "pending:d1").await.unwrap();
        store
            .intend("a1", "ops", "final:approved", Vec::new())
            .await
            .unwrap();
        assert_eq!(
            store
                .notification("a1", "ops")
                .await
                .unwrap()
                .unwrap()
                .shown,
            None
        );
        store.shown("a1", "ops", "final:approved").await.unwrap();
        assert!(store.unfinished().await.unwrap().is_empty());
        assert!(store.notification("a2", "ops").await.unwrap().is_none());
    }
}
