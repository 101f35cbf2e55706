//! What a use case can fail with, free of gRPC; the edge maps it to a status once
//! (`crate::error`).

use countersign_core::Error as DomainError;

use crate::store::backup::BackupError;
use crate::store::StoreError;

/// What a use case of the application layer (`crate::app`) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Bad input, not found, refused by the domain's rules or the caller's rights.
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Backup(#[from] BackupError),
    /// A watch's cursor names no place in the event log (ahead of it, pruned, or read from
    /// another history); the message says how to start again.
    #[error("{0}")]
    CursorOutOfRange(String),
    /// A rate limit: the message names who went over which setting; retry after `retry_ms`.
    #[error("{message}")]
    RateLimited { message: String, retry_ms: u128 },
}
