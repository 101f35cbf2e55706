//! Login tokens and browser sessions, in a small SQLite file in the worker's state directory.
//!
//! Only SHA-256 hashes of tokens and session ids are stored, so the file alone signs nobody
//! in. A login token is used once; a session expires and can be revoked (per approver).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

/// The signed-in approver: the decider recorded on channel `web`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approver {
    /// The approver's web identity in the server's registry.
    pub id: String,
    /// Display name.
    pub name: String,
}

/// A live browser session.
#[derive(Clone, Debug)]
pub struct Session {
    pub approver: Approver,
    /// The token every form of this session carries.
    pub csrf: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
    #[error("cannot create the state directory {path}: {source}")]
    StateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid approver id {0:?}: use 1 to 128 letters, digits and . _ @ -")]
    ApproverId(String),
    #[error("the stored CSRF key in web.db is unreadable; delete its row in table secrets to make a new one")]
    CsrfKey,
}

#[derive(Clone, Debug)]
pub struct Sessions {
    pool: SqlitePool,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS login_tokens (
    token_hash TEXT PRIMARY KEY,
    approver_id TEXT NOT NULL,
    name TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at INTEGER
);
CREATE TABLE IF NOT EXISTS sessions (
    session_hash TEXT PRIMARY KEY,
    approver_id TEXT NOT NULL,
    name TEXT NOT NULL,
    csrf TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX IF NOT EXISTS sessions_by_approver ON sessions (approver_id);
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
";

impl Sessions {
    /// Opens (creating when missing) `web.db` in `state_dir`.
    pub async fn open(state_dir: &Path) -> Result<Sessions, SessionError> {
        std::fs::create_dir_all(state_dir).map_err(|source| SessionError::StateDir {
            path: state_dir.display().to_string(),
            source,
        })?;
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(state_dir.join("web.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        Ok(Sessions { pool })
    }

    /// The key of proxy sign-in's CSRF tokens: made once and kept, so that forms a page
    /// showed before a restart still work after it.
    pub async fn csrf_key(&self) -> Result<[u8; 32], SessionError> {
        let mut fresh = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut fresh);
        sqlx::query("INSERT OR IGNORE INTO secrets (name, value) VALUES ('csrf_key', ?)")
            .bind(hex::encode(fresh))
            .execute(&self.pool)
            .await?;
        let stored: String =
            sqlx::query_scalar("SELECT value FROM secrets WHERE name = 'csrf_key'")
                .fetch_one(&self.pool)
                .await?;
        let mut key = [0u8; 32];
        hex::decode_to_slice(stored, &mut key).map_err(|_| SessionError::CsrfKey)?;
        Ok(key)
    }

    /// A one-time login token for `approver`, valid for `ttl`.
    pub async fn issue_login(
        &self,
        approver: &Approver,
        ttl: Duration,
    ) -> Result<String, SessionError> {
        validate_approver_id(&approver.id)?;
        let token = random_token();
        sqlx::query(
            "INSERT INTO login_tokens (token_hash, approver_id, name, expires_at) VALUES (?, ?, ?, ?)",
        )
        .bind(hash(&token))
        .bind(&approver.id)
        .bind(&approver.name)
        .bind(now() + secs(ttl))
        .execute(&self.pool)
        .await?;
        Ok(token)
    }

    /// Uses a login token (once) and opens a session; returns the session id for the cookie.
    /// `None` when the token is unknown, used or expired.
    pub async fn redeem_login(
        &self,
        token: &str,
        session_ttl: Duration,
    ) -> Result<Option<(String, Session)>, SessionError> {
        let now = now();
        let row = sqlx::query(
            "UPDATE login_tokens SET used_at = ? WHERE token_hash = ? AND used_at IS NULL \
             AND expires_at > ? RETURNING approver_id, name",
        )
        .bind(now)
        .bind(hash(token))
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let approver = Approver {
            id: row.try_get("approver_id")?,
            name: row.try_get("name")?,
        };
        let session_id = random_token();
        let csrf = random_token();
        sqlx::query(
            "INSERT INTO sessions (session_hash, approver_id, name, csrf, expires_at) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(hash(&session_id))
        .bind(&approver.id)
        .bind(&approver.name)
        .bind(&csrf)
        .bind(now + secs(session_ttl))
        .execute(&self.pool)
        .await?;
        Ok(Some((session_id, Session { approver, csrf })))
    }

    /// The session behind a cookie value, when it exists, has not expired and is not revoked.
    pub async fn session(&self, session_id: &str) -> Result<Option<Session>, SessionError> {
        let row = sqlx::query(
            "SELECT approver_id, name, csrf FROM sessions WHERE session_hash = ? \
             AND revoked_at IS NULL AND expires_at > ?",
        )
        .bind(hash(session_id))
        .bind(now())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(Session {
                approver: Approver {
                    id: row.try_get("approver_id")?,
                    name: row.try_get("name")?,
                },
                csrf: row.try_get("csrf")?,
            })
        })
        .transpose()
    }

    /// Ends one session (sign out).
    pub async fn end(&self, session_id: &str) -> Result<(), SessionError> {
        sqlx::query("UPDATE sessions SET revoked_at = ? WHERE session_hash = ?")
            .bind(now())
            .bind(hash(session_id))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Revokes every session and unused login token of an approver; returns how many
    /// sessions were live.
    pub async fn revoke_approver(&self, approver_id: &str) -> Result<u64, SessionError> {
        let now = now();
        let revoked = sqlx::query(
            "UPDATE sessions SET revoked_at = ? WHERE approver_id = ? AND revoked_at IS NULL \
             AND expires_at > ?",
        )
        .bind(now)
        .bind(approver_id)
        .bind(now)
        .execute(&self.pool)
        .await?
        .rows_affected();
        sqlx::query(
            "UPDATE login_tokens SET used_at = ? WHERE approver_id = ? AND used_at IS NULL",
        )
        .bind(now)
        .bind(approver_id)
        .execute(&self.pool)
        .await?;
        Ok(revoked)
    }
}

/// Approver ids are identifiers, not free text: they end up in cookies' sessions, logs and
/// the server's decider.
pub fn validate_approver_id(id: &str) -> Result<(), SessionError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(SessionError::ApproverId(id.to_owned()))
    }
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn secs(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Approver {
        Approver {
            id: "alice".into(),
            name: "Alice".into(),
        }
    }

    #[tokio::test]
    async fn a_login_token_works_once_and_sessions_can_be_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Sessions::open(dir.path()).await.unwrap();
        let token = sessions
            .issue_login(&alice(), Duration::from_secs(60))
            .await
            .unwrap();
        let (id, session) = sessions
            .redeem_login(&token, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("first use signs in");
        assert_eq!(session.approver, alice());
        assert!(sessions
            .redeem_login(&token, Duration::from_secs(60))
            .await
            .unwrap()
            .is_none());
        assert!(sessions.session(&id).await.unwrap().is_some());
        assert_eq!(sessions.revoke_approver("alice").await.unwrap(), 1);
        assert!(sessions.session(&id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn bad_approver_ids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Sessions::open(dir.path()).await.unwrap();
        let bad = Approver {
            id: "alice\nbob".into(),
            name: "x".into(),
        };
        let error = sessions
            .issue_login(&bad, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(matches!(error, SessionError::ApproverId(_)), "{error}");
    }
}
