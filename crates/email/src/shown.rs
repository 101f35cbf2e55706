//! The worker's durable local state (SQLite in `state_dir`): what the thread of each approval
//! at each address shows, and beside it the decision links (`countersign-links`).
//!
//! A mail's intent is written before its SMTP session (with the links it carries, and the
//! state it shows): `shown` unset means the session may or may not have reached the relay's
//! acceptance. SMTP has no way to ask a relay whether it took a mail, so after a crash in
//! between the mail is sent again with the same Message-ID (mail stores and clients that
//! see the same Message-ID twice show one mail) and links of its own, siblings of the first
//! ones: only one of them can ever decide. A crash before the mail's data was complete (its
//! final `.`) leaves no mail at the relay, and the new send is the only one.

use std::path::Path;

use countersign_links::store::{now_ms, open_database, LinkStore, LinkStoreError, NewLink};
use sqlx::{Row, SqlitePool};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("email worker state database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Links(#[from] LinkStoreError),
}

const SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS threads (
        approval_id TEXT NOT NULL,
        address TEXT NOT NULL,
        intended TEXT NOT NULL,
        shown TEXT,
        request_sent INTEGER NOT NULL DEFAULT 0,
        started_ms INTEGER NOT NULL,
        PRIMARY KEY (approval_id, address))"];

/// What the worker knows of one approval's thread at one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    /// What the last mail was to show.
    pub intended: String,
    /// What the relay accepted the last mail for; `None`: a send whose answer never came.
    pub shown: Option<String>,
    /// Whether the relay accepted the request (the thread's first mail).
    pub request_sent: bool,
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

    pub async fn thread(
        &self,
        approval_id: &str,
        address: &str,
    ) -> Result<Option<Thread>, StoreError> {
        let row = sqlx::query(
            "SELECT intended, shown, request_sent FROM threads WHERE approval_id = ? AND address = ?",
        )
        .bind(approval_id)
        .bind(address)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|row| {
                Ok::<_, sqlx::Error>(Thread {
                    intended: row.try_get("intended")?,
                    shown: row.try_get("shown")?,
                    request_sent: row.try_get::<i64, _>("request_sent")? != 0,
                })
            })
            .transpose()?)
    }

    /// Records, durably, a mail about to show `intended`, with the links it carries.
    pub async fn intend(
        &self,
        approval_id: &str,
        address: &str,
        intended: &str,
        links: Vec<NewLink>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO threads (approval_id, address, intended, shown, started_ms) VALUES (?, ?, ?, NULL, ?)
             ON CONFLICT (approval_id, address) DO UPDATE SET intended = excluded.intended, shown = NULL, started_ms = excluded.started_ms",
        )
        .bind(approval_id)
        .bind(address)
        .bind(intended)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        LinkStore::insert(&mut tx, approval_id, address, links).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records that the relay accepted the mail showing `shown` (the request among them when
    /// `request` is set).
    pub async fn sent(
        &self,
        approval_id: &str,
        address: &str,
        shown: &str,
        request: bool,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE threads SET shown = ?, request_sent = MAX(request_sent, ?) WHERE approval_id = ? AND address = ?")
            .bind(shown)
            .bind(i64::from(request))
            .bind(approval_id)
            .bind(address)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Approvals with a thread not known to show a final state: the ones to look at after
    /// the worker was away.
    pub async fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT approval_id FROM threads WHERE shown IS NULL OR shown NOT LIKE 'final:%'",
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
    async fn a_send_is_uncertain_until_accepted_and_final_ones_are_finished() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state/email.db"))
            .await
            .unwrap();
        let (_, link) = NewLink::mint(LinkVerdict::Approve, "a@x.example", i64::MAX);
        store
            .intend("a1", "a@x.example", "pending:d1:0", vec![link])
            .await
            .unwrap();
        let uncertain = store.thread("a1", "a@x.example").await.unwrap().unwrap();
        assert_eq!(uncertain.shown, None);
        assert!(!uncertain.request_sent);
        assert_eq!(store.unfinished().await.unwrap(), vec!["a1".to_owned()]);
        store
            .sent("a1", "a@x.example", "pending:d1:0", true)
            .await
            .unwrap();
        store
            .intend("a1", "a@x.example", "final:APPROVED", Vec::new())
            .await
            .unwrap();
        store
            .sent("a1", "a@x.example", "final:APPROVED", false)
            .await
            .unwrap();
        let done = store.thread("a1", "a@x.example").await.unwrap().unwrap();
        assert!(done.request_sent);
        assert!(store.unfinished().await.unwrap().is_empty());
    }
}
