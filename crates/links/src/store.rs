//! The decision links, in the worker's own SQLite database (its other tables are the
//! worker's business). Only a token's SHA-256 is stored.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, SqliteConnection, SqlitePool};

use crate::{new_token, token_hash, LinkVerdict};

#[derive(Debug, thiserror::Error)]
#[error("decision links database: {0}")]
pub struct LinkStoreError(#[from] sqlx::Error);

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Opens (or creates, with its directory) a worker's state database at `path`, with `schema`
/// applied: WAL, so that operator commands can read it while the worker runs.
pub async fn open_database(path: &Path, schema: &[&str]) -> Result<SqlitePool, sqlx::Error> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(sqlx::Error::Io)?;
    }
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    for statement in schema {
        sqlx::query(statement).execute(&pool).await?;
    }
    Ok(pool)
}

/// The tables the links need; [`LinkStore::attach`] creates them.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS links (
        token_hash TEXT PRIMARY KEY,
        approval_id TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        verdict TEXT NOT NULL,
        approver TEXT NOT NULL,
        expires_ms INTEGER NOT NULL,
        used_ms INTEGER,
        revoked_ms INTEGER)",
    "CREATE INDEX IF NOT EXISTS links_approval ON links (approval_id)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    // The link that took itself and its siblings: its decision may be sent again (same
    // idempotency key) when a crash came between the claim and the server's answer.
    "CREATE TABLE IF NOT EXISTS claims (token_hash TEXT PRIMARY KEY, approval_id TEXT NOT NULL, endpoint TEXT NOT NULL)",
];

/// A link about to be handed out, by its token's hash.
pub struct NewLink {
    pub token_hash: String,
    pub verdict: LinkVerdict,
    pub approver: String,
    pub expires_ms: i64,
}

impl NewLink {
    /// A fresh token and the link it opens, deciding `verdict` as `approver` until
    /// `expires_ms`.
    pub fn mint(verdict: LinkVerdict, approver: &str, expires_ms: i64) -> (String, NewLink) {
        let token = new_token();
        let link = NewLink {
            token_hash: token_hash(&token),
            verdict,
            approver: approver.to_owned(),
            expires_ms,
        };
        (token, link)
    }
}

/// A decision link as stored.
#[derive(Clone, Debug)]
pub struct Link {
    pub approval_id: String,
    /// Where it was sent (an endpoint, a topic): its siblings share it.
    pub endpoint: String,
    pub verdict: String,
    pub approver: String,
    pub expires_ms: i64,
    pub used_ms: Option<i64>,
    pub revoked_ms: Option<i64>,
}

/// Why a link cannot be used (now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    Usable,
    Used,
    Revoked,
    Expired,
}

impl Link {
    pub fn state(&self, now_ms: i64) -> LinkState {
        if self.revoked_ms.is_some() {
            LinkState::Revoked
        } else if self.used_ms.is_some() {
            LinkState::Used
        } else if self.expires_ms <= now_ms {
            LinkState::Expired
        } else {
            LinkState::Usable
        }
    }
}

/// The links of one worker.
#[derive(Clone)]
pub struct LinkStore {
    pool: SqlitePool,
}

impl LinkStore {
    /// The links in the database behind `pool`, their tables created if missing.
    pub async fn attach(pool: SqlitePool) -> Result<LinkStore, LinkStoreError> {
        for statement in SCHEMA {
            sqlx::query(statement).execute(&pool).await?;
        }
        Ok(LinkStore { pool })
    }

    /// Stores `links` of `approval_id` sent to `endpoint`, inside the caller's transaction
    /// (so that they exist exactly when what carries them is queued).
    pub async fn insert(
        connection: &mut SqliteConnection,
        approval_id: &str,
        endpoint: &str,
        links: Vec<NewLink>,
    ) -> Result<(), LinkStoreError> {
        for link in links {
            sqlx::query("INSERT INTO links (token_hash, approval_id, endpoint, verdict, approver, expires_ms) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(link.token_hash)
                .bind(approval_id)
                .bind(endpoint)
                .bind(link.verdict.as_str())
                .bind(link.approver)
                .bind(link.expires_ms)
                .execute(&mut *connection)
                .await?;
        }
        Ok(())
    }

    /// Stores `links` on their own.
    pub async fn add(
        &self,
        approval_id: &str,
        endpoint: &str,
        links: Vec<NewLink>,
    ) -> Result<(), LinkStoreError> {
        let mut tx = self.pool.begin().await?;
        LinkStore::insert(&mut tx, approval_id, endpoint, links).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn link(&self, token_hash: &str) -> Result<Option<Link>, LinkStoreError> {
        let row = sqlx::query("SELECT * FROM links WHERE token_hash = ?")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(Link {
                approval_id: row.try_get("approval_id")?,
                endpoint: row.try_get("endpoint")?,
                verdict: row.try_get("verdict")?,
                approver: row.try_get("approver")?,
                expires_ms: row.try_get("expires_ms")?,
                used_ms: row.try_get("used_ms")?,
                revoked_ms: row.try_get("revoked_ms")?,
            })
        })
        .transpose()
        .map_err(LinkStoreError)
    }

    /// Takes a usable link, and with it its siblings (the other verdicts sent to the same
    /// endpoint for the same approval): only one of them can ever decide. Returns false when
    /// the link was not usable any more (used, revoked or expired meanwhile).
    pub async fn claim(&self, token_hash: &str, link: &Link) -> Result<bool, LinkStoreError> {
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let claimed = sqlx::query("UPDATE links SET used_ms = ? WHERE token_hash = ? AND used_ms IS NULL AND revoked_ms IS NULL AND expires_ms > ?")
            .bind(now)
            .bind(token_hash)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if claimed {
            sqlx::query("UPDATE links SET used_ms = ? WHERE approval_id = ? AND endpoint = ? AND used_ms IS NULL")
                .bind(now)
                .bind(&link.approval_id)
                .bind(&link.endpoint)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT OR REPLACE INTO claims (token_hash, approval_id, endpoint) VALUES (?, ?, ?)")
                .bind(token_hash)
                .bind(&link.approval_id)
                .bind(&link.endpoint)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Gives back a claimed link and its siblings (the decision could not be recorded).
    pub async fn release(&self, link: &Link, claimed_ms: i64) -> Result<(), LinkStoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE links SET used_ms = NULL WHERE approval_id = ? AND endpoint = ? AND used_ms >= ?")
            .bind(&link.approval_id)
            .bind(&link.endpoint)
            .bind(claimed_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM claims WHERE approval_id = ? AND endpoint = ?")
            .bind(&link.approval_id)
            .bind(&link.endpoint)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether the link with `token_hash` is the one that took itself and its siblings (not
    /// a sibling taken with another).
    pub async fn claimed_by(&self, token_hash: &str) -> Result<bool, LinkStoreError> {
        let row = sqlx::query("SELECT 1 FROM claims WHERE token_hash = ?")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Revokes every unused link of an approval; returns how many.
    pub async fn revoke(&self, approval_id: &str) -> Result<u64, LinkStoreError> {
        let revoked = sqlx::query("UPDATE links SET revoked_ms = ? WHERE approval_id = ? AND used_ms IS NULL AND revoked_ms IS NULL")
            .bind(now_ms())
            .bind(approval_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(revoked)
    }

    /// The key of the confirmation forms' tokens: made once and kept, so that a restart keeps
    /// open pages (and forms handed out with a link) working.
    pub async fn form_key(&self) -> Result<Vec<u8>, LinkStoreError> {
        let fresh = {
            let mut key = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut key);
            hex::encode(key)
        };
        sqlx::query("INSERT OR IGNORE INTO meta (key, value) VALUES ('form_key', ?)")
            .bind(fresh)
            .execute(&self.pool)
            .await?;
        let row = sqlx::query("SELECT value FROM meta WHERE key = 'form_key'")
            .fetch_one(&self.pool)
            .await?;
        let key: String = row.try_get(0)?;
        hex::decode(key).map_err(|error| LinkStoreError(sqlx::Error::Decode(Box::new(error))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (tempfile::TempDir, LinkStore) {
        let dir = tempfile::tempdir().unwrap();
        let pool = open_database(&dir.path().join("state/links.db"), &[])
            .await
            .unwrap();
        (dir, LinkStore::attach(pool).await.unwrap())
    }

    #[tokio::test]
    async fn a_link_decides_once_and_takes_its_siblings_with_it() {
        let (_dir, store) = store().await;
        let (approve, approve_link) = NewLink::mint(LinkVerdict::Approve, "alice", i64::MAX);
        let (reject, reject_link) = NewLink::mint(LinkVerdict::Reject, "alice", i64::MAX);
        let (other, other_link) = NewLink::mint(LinkVerdict::Reject, "alice", i64::MAX);
        store
            .add("a1", "topic-1", vec![approve_link, reject_link])
            .await
            .unwrap();
        store.add("a1", "topic-2", vec![other_link]).await.unwrap();
        let link = store.link(&token_hash(&approve)).await.unwrap().unwrap();
        assert_eq!(link.state(now_ms()), LinkState::Usable);
        assert!(store.claim(&token_hash(&approve), &link).await.unwrap());
        assert!(!store.claim(&token_hash(&approve), &link).await.unwrap());
        let sibling = store.link(&token_hash(&reject)).await.unwrap().unwrap();
        assert_eq!(sibling.state(now_ms()), LinkState::Used);
        assert!(store.claimed_by(&token_hash(&approve)).await.unwrap());
        assert!(!store.claimed_by(&token_hash(&reject)).await.unwrap());
        let elsewhere = store.link(&token_hash(&other)).await.unwrap().unwrap();
        assert_eq!(elsewhere.state(now_ms()), LinkState::Usable);
        assert!(store.link(&token_hash("forged")).await.unwrap().is_none());
        assert_eq!(
            store.form_key().await.unwrap(),
            store.form_key().await.unwrap()
        );
    }

    #[tokio::test]
    async fn an_expired_link_cannot_be_claimed() {
        let (_dir, store) = store().await;
        let (token, link) = NewLink::mint(LinkVerdict::Approve, "alice", now_ms() - 1);
        store.add("a1", "t", vec![link]).await.unwrap();
        let link = store.link(&token_hash(&token)).await.unwrap().unwrap();
        assert_eq!(link.state(now_ms()), LinkState::Expired);
        assert!(!store.claim(&token_hash(&token), &link).await.unwrap());
    }
}
