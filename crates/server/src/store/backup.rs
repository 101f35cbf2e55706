//! Online backups of the SQLite store: a consistent copy while the server keeps serving
//! (`VACUUM INTO`, one read transaction, so the events, the approvals and the audit anchor
//! are of one moment), flushed to disk, then verified with the same audit verification as
//! `VerifyAudit`. A file that exists is never touched, and a copy whose chain does not verify
//! is removed and reported instead of kept. The copy leaves the log's history id behind, so a
//! restore of it begins a history of its own. PostgreSQL is backed up with pg_dump.
//!
//! A database file at rest (a backup before it is restored) is checked in full by
//! [`verify_file`]: SQLite's own integrity check, then the same audit verification.

use std::path::{Path, PathBuf};

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use thiserror::Error;

use super::audit_sql::AuditSql;
use super::StoreError;
use crate::audit::AuditReport;
use crate::config::Database;
use countersign_core::receipt::{verify_checkpoint, KeySet, ReceiptError};

/// A verified copy.
#[derive(Debug, Clone)]
pub struct Backup {
    pub path: PathBuf,
    pub bytes: u64,
    /// The copy's audit chain, intact.
    pub report: AuditReport,
}

#[derive(Debug, Error)]
pub enum BackupError {
    #[error("{0} already exists; a backup never overwrites a file: name a new one")]
    Exists(PathBuf),
    #[error("the database is PostgreSQL: back it up with pg_dump (it holds the approvals, the event log and the audit anchor); see docs/deployment.md")]
    Postgres,
    #[error("file_name {0:?} is not a plain file name: use letters, digits, '.', '_' and '-', not starting with '.'")]
    FileName(String),
    #[error("there is no SQLite database at {0}")]
    NoDatabase(PathBuf),
    #[error("the audit chain does not verify at seq {seq}: {problem}; no backup was kept. Look at the database (VerifyAudit, `countersign verify-audit`) before backing it up")]
    Broken { seq: i64, problem: String },
    #[error("cannot write the backup {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a database file at rest does not verify.
#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("there is no SQLite database file at {0}")]
    NoDatabase(PathBuf),
    #[error("this checks a SQLite file; a PostgreSQL database is checked where it runs, with VerifyAudit (`countersign verify-audit`)")]
    Postgres,
    #[error("SQLite's integrity check fails: {0}")]
    Damaged(String),
    #[error("the audit trail does not verify at seq {seq}: {problem}")]
    Broken { seq: i64, problem: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the signed checkpoint: {0}")]
    Checkpoint(#[from] ReceiptError),
    #[error("event {seq} has hash {found:?}, not the signed checkpoint's {signed}: the history up to the checkpoint is not the one signed")]
    NotAtCheckpoint {
        seq: i64,
        found: Option<String>,
        signed: String,
    },
}

/// `countersign-server verify FILE`: checks a SQLite database file in full without changing
/// it: SQLite's `PRAGMA integrity_check` (every page, index and constraint), then the audit
/// verification `VerifyAudit` makes (every event's hash in seq order, the chain's ends against
/// the anchor, every approval against its events). The start-up checks read only the chain's
/// ends; this is the check for a file about to be restored.
pub async fn verify_file(file: &Path) -> Result<AuditReport, VerifyError> {
    let path = match Database::of(file) {
        Database::Postgres(_) => return Err(VerifyError::Postgres),
        Database::Sqlite(path) => path,
    };
    if !path.is_file() {
        return Err(VerifyError::NoDatabase(path.to_path_buf()));
    }
    // Without a WAL beside it the file is read as immutable: no lock, and no `-wal` or `-shm`
    // created beside it (a read-only connection would leave both behind). A WAL beside it
    // holds commits of the database, so then it is read as SQLite reads it, WAL included.
    let wal = wal_of(path);
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .read_only(true)
        .immutable(!wal.exists());
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(StoreError::from)?;
    let problems: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .map_err(StoreError::from)?;
    if problems != ["ok"] {
        return Err(VerifyError::Damaged(problems.join("; ")));
    }
    let report = conn.verify().await?;
    conn.close().await.map_err(StoreError::from)?;
    match report.broken {
        Some((seq, problem)) => Err(VerifyError::Broken { seq, problem }),
        None => Ok(report),
    }
}

/// Checks the SQLite file `file` against a signed audit checkpoint (`audit checkpoint`):
/// the checkpoint's signature with `keys`, and that the file's event at its seq has its
/// hash, so the file's history up to the checkpoint is the one signed. The checkpoint's seq.
pub async fn check_checkpoint(
    file: &Path,
    checkpoint: &str,
    keys: &KeySet,
) -> Result<i64, VerifyError> {
    let claims = verify_checkpoint(checkpoint, keys)?;
    let seq = claims["head_seq"].as_i64().unwrap_or(-1);
    let signed = claims["head_hash"].as_str().unwrap_or_default().to_owned();
    let options = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(false)
        .read_only(true)
        .immutable(!wal_of(file).exists());
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(StoreError::from)?;
    let found: Option<Option<String>> =
        sqlx::query_scalar("SELECT hash FROM events WHERE seq = $1")
            .bind(seq)
            .fetch_optional(&mut conn)
            .await
            .map_err(StoreError::from)?;
    conn.close().await.map_err(StoreError::from)?;
    match found.flatten() {
        Some(hash) if hash == signed => Ok(seq),
        found => Err(VerifyError::NotAtCheckpoint { seq, found, signed }),
    }
}

/// The WAL file of the SQLite database at `path`.
pub fn wal_of(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The longest file name `file_in` accepts.
const MAX_FILE_NAME_CHARS: usize = 200;

/// The path of the new backup `file_name` in `directory`. Only a plain name is accepted, so a
/// caller of the RPC can create files in that one directory and nowhere else.
pub(crate) fn file_in(directory: &Path, file_name: &str) -> Result<PathBuf, BackupError> {
    let plain = !file_name.is_empty()
        && file_name.len() <= MAX_FILE_NAME_CHARS
        && !file_name.starts_with('.')
        && file_name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !plain {
        return Err(BackupError::FileName(file_name.to_owned()));
    }
    Ok(directory.join(file_name))
}

/// The directory backups of `database` go to when `storage.backup_dir` is not set: the
/// database file's own. None for PostgreSQL.
pub(crate) fn default_directory(database: &Path) -> Option<PathBuf> {
    match Database::of(database) {
        Database::Postgres(_) => None,
        Database::Sqlite(path) => Some(match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        }),
    }
}

/// `countersign-server backup FILE`: a verified copy of the database the configuration names,
/// made beside a server that may be running (a read-only connection of its own).
pub async fn backup_database(database: &Path, into: &Path) -> Result<Backup, BackupError> {
    let path = match Database::of(database) {
        Database::Postgres(_) => return Err(BackupError::Postgres),
        Database::Sqlite(path) => path,
    };
    if !path.is_file() {
        return Err(BackupError::NoDatabase(path.to_path_buf()));
    }
    let mut conn = open_existing(path, true).await?;
    copy(&mut conn, into).await
}

/// Copies the database `source` reads to the new file `into`, flushes it to disk and verifies
/// it; a copy that does not verify is removed.
pub(crate) async fn copy(
    source: &mut SqliteConnection,
    into: &Path,
) -> Result<Backup, BackupError> {
    let write_error = |source: std::io::Error| BackupError::Write {
        path: into.to_path_buf(),
        source,
    };
    // Created empty first, atomically, so that an existing file (or one that appears
    // meanwhile) is never touched, and the file is ours to remove on any failure. SQLite
    // writes into an empty file; the copy holds every approval, so only the owner reads it.
    let mut new_file = std::fs::OpenOptions::new();
    new_file.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut new_file, 0o600);
    match new_file.open(into) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(BackupError::Exists(into.to_path_buf()))
        }
        Err(e) => return Err(write_error(e)),
    }
    let verified = async {
        vacuum_into(source, into).await?;
        let mut copy = open_existing(into, false).await?;
        leave_history_behind(&mut copy).await?;
        let report = copy.verify().await?;
        copy.close().await.map_err(StoreError::from)?;
        // SQLite does not flush what VACUUM INTO wrote.
        let bytes = flush(into).map_err(write_error)?;
        match report.broken.clone() {
            Some((seq, problem)) => Err(BackupError::Broken { seq, problem }),
            None => Ok(Backup {
                path: into.to_path_buf(),
                bytes,
                report,
            }),
        }
    }
    .await;
    if verified.is_err() {
        let _ = std::fs::remove_file(into);
    }
    verified
}

/// Writes the database `conn` reads to the new file `into` with `VACUUM INTO`: one read
/// transaction, so the copy is one consistent snapshot (the WAL's committed pages included)
/// and the writer carries on meanwhile. SQLite refuses a file that exists and is not empty.
async fn vacuum_into(conn: &mut SqliteConnection, into: &Path) -> Result<(), StoreError> {
    let into = into.to_str().ok_or_else(|| {
        countersign_core::Error::invalid("file_name", "the backup path is not valid UTF-8")
    })?;
    sqlx::query("VACUUM INTO ?")
        .bind(into)
        .execute(conn)
        .await?;
    Ok(())
}

/// Removes the source's history id from the copy. The server that serves the copy (a restore)
/// then gives it one of its own at start, so a watch cursor read from the source, which has
/// gone on past the copy, is told apart from the restored log's cursors even once the restored
/// log has passed its seq; and each restore of the same copy begins another history. A source
/// from before history ids has none to leave behind.
async fn leave_history_behind(copy: &mut SqliteConnection) -> Result<(), StoreError> {
    let has_history: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'log_history')",
    )
    .fetch_one(&mut *copy)
    .await?;
    if has_history {
        sqlx::query("DELETE FROM log_history")
            .execute(&mut *copy)
            .await?;
    }
    Ok(())
}

/// Opens an existing database file as it is: no schema change, nothing created; read-only when
/// asked.
async fn open_existing(path: &Path, read_only: bool) -> Result<SqliteConnection, StoreError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        .read_only(read_only);
    Ok(SqliteConnection::connect_with(&options).await?)
}

/// Flushes the file and its directory entry to disk; the file's size.
fn flush(path: &Path) -> std::io::Result<u64> {
    let file = std::fs::File::open(path)?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(bytes)
}
