//! Historical approvals, bulk-inserted into a stopped server's SQLite file: copies of one real
//! resolved approval that the server itself created, so rows, bodies and indexes are exactly
//! what the server writes.

use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteSynchronous};
use sqlx::Connection;

use crate::error::BenchError;

/// Copies the approval `template_id` (idempotency key `template_key`) `count` times with
/// ids that sort before every real UUIDv7 (they are older), new idempotency keys and earlier
/// timestamps.
pub async fn insert_copies(
    database: &Path,
    template_id: &str,
    template_key: &str,
    count: u64,
) -> Result<(), BenchError> {
    let db_error = |e: sqlx::Error| BenchError::Setup(format!("history insert: {e}"));
    let options = SqliteConnectOptions::from_str("sqlite:")
        .map_err(db_error)?
        .filename(database)
        // A bulk load the bench can redo: no need to wait for the disk on each page.
        .synchronous(SqliteSynchronous::Off);
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(db_error)?;
    let count = i64::try_from(count)
        .map_err(|_| BenchError::Setup(format!("{count} historical approvals is too many")))?;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO approvals (id, agent_id, idempotency_key, session_id, tool_name, state,
                                channels, created_at_ms, expires_at_ms, body)
         SELECT printf('00000000-0000-7000-8000-%012d', n.i), t.agent_id, 'history-' || n.i,
                t.session_id, t.tool_name, t.state, t.channels,
                t.created_at_ms - n.i * 1000, t.expires_at_ms - n.i * 1000,
                replace(replace(t.body, t.id, printf('00000000-0000-7000-8000-%012d', n.i)),
                        '\"' || ?3 || '\"', '\"history-' || n.i || '\"')
         FROM n, (SELECT * FROM approvals WHERE id = ?2) AS t",
    )
    .bind(count)
    .bind(template_id)
    .bind(template_key)
    .execute(&mut conn)
    .await
    .map_err(db_error)?;
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .map_err(db_error)?;
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM approvals")
        .fetch_one(&mut conn)
        .await
        .map_err(db_error)?;
    if stored < count {
        return Err(BenchError::Setup(format!(
            "history insert: {stored} approvals stored, {count} expected (template {template_id} missing?)"
        )));
    }
    conn.close().await.map_err(db_error)?;
    Ok(())
}
