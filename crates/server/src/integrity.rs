//! The operator's commands on the audit trail's anchor: `countersign-server audit head`
//! prints it, `audit rechain` accepts the event log as it is, `audit new-history` marks a log
//! restored by other means than a countersign backup file. The anchor itself, the SQL behind
//! them and the start-up checks are the store's (`store/audit_sql.rs`).

use std::path::Path;

use crate::config::Database;
use crate::receipts::ReceiptKeys;
use crate::store::audit_sql::AuditSql;
pub use crate::store::audit_sql::{Anchor, IntegrityError, Rechained};
use crate::store::StoreError;

/// `countersign-server audit rechain`: chains the rows without a hash (oldest first, each to
/// the row before it) and anchors the chain to the rows as they now are. An operator's
/// explicit acceptance of the log, logged with what changed.
pub async fn rechain(database: &Path) -> Result<Rechained, StoreError> {
    let rechained = match Database::of(database) {
        Database::Sqlite(path) => {
            crate::store::sqlite::connect_migrated(path)
                .await?
                .rechain()
                .await?
        }
        Database::Postgres(url) => {
            crate::store::postgres::connect_migrated(url)
                .await?
                .rechain()
                .await?
        }
    };
    tracing::warn!(
        rows_chained = rechained.rows_chained,
        before_head_seq = rechained.before.head_seq,
        before_tail_seq = rechained.before.tail_seq,
        head_seq = rechained.after.head_seq,
        head_hash = %rechained.after.head_hash,
        tail_seq = rechained.after.tail_seq,
        history_id = %rechained.history_id,
        "audit rechain: the operator accepted the event log as it is now"
    );
    Ok(rechained)
}

/// `countersign-server audit new-history`: gives the event log a new history id, so that watch
/// cursors read before are answered like cursors ahead of the log and their readers re-list.
/// For a log restored by other means than a countersign backup file (pg_restore, Litestream),
/// which holds the history id of the log it was copied from.
pub async fn new_history(database: &Path) -> Result<String, StoreError> {
    let history_id = match Database::of(database) {
        Database::Sqlite(path) => {
            crate::store::sqlite::connect_migrated(path)
                .await?
                .new_history()
                .await?
        }
        Database::Postgres(url) => {
            crate::store::postgres::connect_migrated(url)
                .await?
                .new_history()
                .await?
        }
    };
    tracing::warn!(%history_id, "audit new-history: the event log begins a new history; watchers re-list");
    Ok(history_id)
}

/// `countersign-server audit head`: the anchor of the database at `database`.
/// `countersign-server audit checkpoint`: the chain's head (seq and hash) signed with the
/// receipt key, a compact JWS of type `countersign-checkpoint+jwt` that a backup or an export
/// is checked against offline (`countersign-server verify FILE --checkpoint`).
pub async fn checkpoint(
    database: &Path,
    keys: &ReceiptKeys,
    now_ms: i64,
) -> Result<String, StoreError> {
    let anchor = head(database).await?;
    Ok(keys.checkpoint(&serde_json::json!({
        "iss": countersign_core::receipt::ISSUER,
        "iat": now_ms.div_euclid(1000),
        "head_seq": anchor.head_seq,
        "head_hash": anchor.head_hash,
    })))
}

pub async fn head(database: &Path) -> Result<Anchor, StoreError> {
    match Database::of(database) {
        Database::Sqlite(path) => {
            crate::store::sqlite::connect_migrated(path)
                .await?
                .anchor()
                .await
        }
        Database::Postgres(url) => {
            crate::store::postgres::connect_migrated(url)
                .await?
                .anchor()
                .await
        }
    }
}

/// Logs a signed checkpoint of the audit chain's head (`integrity::checkpoint`) every
/// `interval`, until `stop` turns true: the log, kept outside the server, then holds heads a
/// backup is verified against offline.
pub(crate) async fn log_checkpoints(
    database: std::path::PathBuf,
    keys: std::sync::Arc<ReceiptKeys>,
    interval: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        match checkpoint(&database, &keys, crate::store::now_millis()).await {
            Ok(checkpoint) => tracing::info!(%checkpoint, "signed audit checkpoint"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot sign an audit checkpoint; trying at the next one")
            }
        }
    }
}
