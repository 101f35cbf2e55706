//! The SQLite backend: one file in WAL mode, schema from `migrations/`. The writer's
//! connection is rusqlite's, used in place on the writer's thread (`sqlite_writer.rs`); the
//! migrations, the reads and the checkpointer are sqlx's. Checkpoints (copying the WAL's pages
//! into the database file) run on a connection of their own, off the writer's path. A clean
//! stop ends with a full checkpoint on the database's last connection, so that the database
//! file alone holds every commit (unless another process owns the checkpoints).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::{Approval, EventKind, Millis};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow,
};
use sqlx::{Connection, QueryBuilder, Row, Sqlite, SqliteExecutor};
use tokio::sync::{watch, Mutex, Notify};
use tokio::task::JoinHandle;

use super::audit_sql::{self, AuditSql, IntegrityError};
use super::backend::{Backend, SharedReads, WriterConnection};
use super::error::StoreError;
use super::event::{AuditedEvent, EventBody, EventFilter, StoredEvent};
use super::records::{Grant, GrantFilter, ListFilter, Passkey, Snapshot};
use super::sqlite_writer::{autocheckpoint_pages, SqliteWriter, WriterSettings};
use crate::audit::AuditReport;
use crate::config::{StorageConfig, WalCheckpoints};
use crate::store::backup::{self, Backup, BackupError};
use countersign_core::groups::Delegation;

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// How long the checkpointer lets commits gather after one wakes it: a page that several
/// commits rewrote (the tail of a table or an index) is copied into the database once.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

pub struct SqliteBackend {
    /// How the writer's connection is opened.
    writer: WriterSettings,
    reads: SqlitePool,
    /// Woken by each commit of the writer.
    checkpointer: Arc<Notify>,
    /// The server's checkpoints; None with `wal_checkpoints = "external"`, where another
    /// process owns them.
    checkpoints: Option<Arc<Checkpoints>>,
    /// The log's history id, as the database held it at start.
    history: String,
}

impl SqliteBackend {
    /// Opens (creating if needed) the database, applies migrations, starts the checkpointer
    /// (until `writer_alive` closes) and returns the backend with the writer's connection.
    pub async fn open(
        path: &Path,
        config: &StorageConfig,
        writer_alive: watch::Receiver<bool>,
    ) -> Result<(SqliteBackend, Box<dyn WriterConnection>), StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let reads = options.clone().create_if_missing(false).read_only(true);
        // The migrations' writes follow the same checkpoint setting as the writer's.
        let options = options.pragma(
            "wal_autocheckpoint",
            autocheckpoint_pages(config.wal_checkpoints),
        );
        let mut migrations = SqliteConnection::connect_with(&options).await?;
        MIGRATOR.run_direct(&mut migrations).await?;
        let history = migrations.history().await?;
        let checkpointer = Arc::new(Notify::new());
        let checkpoints = (config.wal_checkpoints == WalCheckpoints::Server).then(|| {
            let checkpoints = Arc::new(Checkpoints {
                options: options.clone(),
                conn: Mutex::new(None),
                after_commits: std::sync::Mutex::new(None),
            });
            let task = tokio::spawn(checkpoint(
                checkpoints.clone(),
                checkpointer.clone(),
                writer_alive,
            ));
            *checkpoints
                .after_commits
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(task);
            checkpoints
        });
        let reads = SqlitePoolOptions::new()
            .max_connections(config.read_connections)
            .connect_with(reads)
            .await?;
        let writer = WriterSettings {
            path: path.to_path_buf(),
            durability: config.durability,
            wal_checkpoints: config.wal_checkpoints,
            wal_size_limit_bytes: config.wal_size_limit_bytes,
        };
        let first = SqliteWriter::open(&writer, checkpointer.clone())?;
        // Closed only now that other connections are open: the last connection to close
        // checkpoints the WAL, which `wal_checkpoints = "external"` leaves to another process.
        migrations.close().await?;
        let backend = SqliteBackend {
            writer,
            reads,
            checkpointer,
            checkpoints,
            history,
        };
        Ok((backend, Box::new(first)))
    }
}

/// The connection the server checkpoints on, used by one checkpoint at a time: SQLite answers
/// a second checkpoint at once with SQLITE_BUSY instead of waiting for the first.
struct Checkpoints {
    options: SqliteConnectOptions,
    conn: Mutex<Option<SqliteConnection>>,
    /// The task that checkpoints after commits ([`checkpoint`]).
    after_commits: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// How far a checkpoint went.
enum Checkpointed {
    /// Every frame of the WAL is in the database file.
    Fully,
    /// A reader or a writer kept some frames in the WAL; they stay there for the next one.
    Partly,
}

impl Checkpoints {
    /// Runs `PRAGMA wal_checkpoint(mode)` with each of `modes` in turn; how far the last went.
    async fn run(&self, modes: &[&str]) -> Result<Checkpointed, sqlx::Error> {
        let mut conn = self.conn.lock().await;
        let ran = async {
            let conn = match conn.as_mut() {
                Some(conn) => conn,
                None => conn.insert(SqliteConnection::connect_with(&self.options).await?),
            };
            let mut last = Checkpointed::Fully;
            for mode in modes {
                let (busy, log, copied): (i64, i64, i64) =
                    sqlx::query_as(&format!("PRAGMA wal_checkpoint({mode})"))
                        .fetch_one(&mut *conn)
                        .await?;
                last = if busy == 0 && log == copied {
                    Checkpointed::Fully
                } else {
                    Checkpointed::Partly
                };
            }
            Ok(last)
        }
        .await;
        if ran.is_err() {
            *conn = None;
        }
        ran
    }

    /// Closes the connection. As the database's last, SQLite checkpoints on the close and
    /// removes the WAL.
    async fn close(&self) {
        if let Some(conn) = self.conn.lock().await.take() {
            if let Err(e) = conn.close().await {
                tracing::warn!(error = %e, "cannot close the checkpoints' connection");
            }
        }
    }
}

/// Copies committed WAL pages into the database file, [`CHECKPOINT_INTERVAL`] after a commit
/// woke it, without ever blocking the writer (PASSIVE: it copies what no reader still needs;
/// the writer starts the WAL over once everything is copied, cutting it back to
/// `wal_size_limit_bytes`). A failed checkpoint (a full disk) loses nothing: the pages stay in
/// the WAL for the next one.
async fn checkpoint(
    checkpoints: Arc<Checkpoints>,
    commits: Arc<Notify>,
    mut writer_alive: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = commits.notified() => {}
            changed = writer_alive.changed() => if changed.is_err() { break },
        }
        tokio::time::sleep(CHECKPOINT_INTERVAL).await;
        if let Err(e) = checkpoints.run(&["PASSIVE"]).await {
            tracing::warn!(error = %e, "cannot checkpoint the WAL; the next commit tries again");
        }
    }
    tracing::debug!("checkpointer stopped");
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError> {
        let writer = SqliteWriter::open(&self.writer, self.checkpointer.clone())?;
        Ok(Box::new(writer))
    }

    /// Refused (FAILED_PRECONDITION) when the approval's row disagrees with its newest
    /// event: an approval changed outside countersign is never served or acted on.
    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError> {
        audit_sql::load_verified(&mut *self.reads.acquire().await?, approval_id).await
    }

    async fn check_integrity(&self) -> Result<(), IntegrityError> {
        let mut conn = self.reads.acquire().await.map_err(StoreError::from)?;
        audit_sql::check_at_start(&mut *conn).await
    }

    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError> {
        let mut tx = self.reads.begin().await?;
        let head_seq = head_seq(&mut *tx).await?;
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
        let head = head_seq(&mut *tx).await?;
        let oldest: Option<i64> = sqlx::query_scalar("SELECT MIN(seq) FROM events")
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((head, oldest.unwrap_or(head + 1)))
    }

    async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        self.reads.acquire().await?.verify().await
    }

    /// After the copy, the commits its long read kept in the WAL are checkpointed and the WAL
    /// emptied (PASSIVE first, which never blocks the writer, then TRUNCATE for the rest):
    /// otherwise the WAL would stay at the size the backup let it grow to.
    async fn backup(&self, into: &Path) -> Result<Backup, BackupError> {
        let made = {
            let mut conn = self.reads.acquire().await.map_err(StoreError::from)?;
            backup::copy(&mut conn, into).await?
        };
        if let Some(checkpoints) = &self.checkpoints {
            match checkpoints.run(&["PASSIVE", "TRUNCATE"]).await {
                Ok(Checkpointed::Fully) => {}
                Ok(Checkpointed::Partly) => tracing::info!(
                    "after the backup a reader or writer kept part of the WAL; the next checkpoints copy it"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot checkpoint the WAL after the backup"),
            }
        }
        Ok(made)
    }

    /// Runs once the writer has closed its connection: the checkpointer ends, the reads close,
    /// and a last TRUNCATE checkpoint on the database's last connection copies the whole WAL
    /// into the database file and empties it, so that the file alone holds every commit.
    /// With `wal_checkpoints = "external"` the WAL is left to the process that owns it.
    async fn close(&self) {
        let Some(checkpoints) = &self.checkpoints else {
            self.reads.close().await;
            return;
        };
        let checkpointer = checkpoints
            .after_commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(checkpointer) = checkpointer {
            // It ends when the writer does; joined so that no checkpoint runs beside the last.
            let _ = checkpointer.await;
        }
        self.reads.close().await;
        match checkpoints.run(&["TRUNCATE"]).await {
            Ok(Checkpointed::Fully) => tracing::info!("the WAL is checkpointed into the database file"),
            Ok(Checkpointed::Partly) => tracing::error!(
                "at the stop another process kept part of the WAL: copy the database with its -wal file, or with `countersign-server backup`"
            ),
            Err(e) => tracing::error!(error = %e, "cannot checkpoint the WAL at the stop: copy the database with its -wal file, or with `countersign-server backup`"),
        }
        checkpoints.close().await;
    }

    fn history(&self) -> &str {
        &self.history
    }
}

super::reads::sql_reads!(Sqlite, SqlitePool, SqliteRow, SqliteBackend);

// A deferred SQLite transaction reads one snapshot from its first read on.
audit_sql::audit_sql!(SqliteConnection, None);

async fn head_seq<'e>(executor: impl SqliteExecutor<'e>) -> Result<i64, sqlx::Error> {
    let head: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            .fetch_optional(executor)
            .await?;
    Ok(head.unwrap_or(0))
}

/// Opens an existing database and brings its schema up to date (for `audit` commands).
pub(crate) async fn connect_migrated(database: &Path) -> Result<SqliteConnection, StoreError> {
    let options = SqliteConnectOptions::new()
        .filename(database)
        .create_if_missing(false);
    let mut conn = SqliteConnection::connect_with(&options).await?;
    MIGRATOR.run_direct(&mut conn).await?;
    Ok(conn)
}
