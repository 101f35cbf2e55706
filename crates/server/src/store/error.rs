//! The store's error: what a read or a change can fail with.

use countersign_core::Error as DomainError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// From the SQLite writer's connection (`sqlite_writer.rs`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is unreadable: {0}")]
    Corrupt(String),
    /// The database refused to commit (disk full, I/O error); nothing of the change was kept.
    #[error("storage refuses writes ({0}); nothing was changed, retry later")]
    Unavailable(String),
    #[error("the store is shutting down")]
    Closed,
    #[error("cannot start the store's writer thread: {0}")]
    WriterThread(std::io::Error),
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}
