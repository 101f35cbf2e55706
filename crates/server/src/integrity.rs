//! What keeps the audit trail honest beyond the hash of each row: the chain's anchor (its
//! newest and oldest rows, kept in `audit_anchor`, apart from the rows), the start-up checks
//! that refuse a database whose chain was truncated or has unchained rows, the explicit
//! `audit rechain` that an operator runs to accept such a database, and the check that an
//! approval's stored row says what its newest event says.

use std::path::Path;

use countersign_core::{Approval, Millis, State};
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{Connection, SqliteExecutor};
use thiserror::Error;

use crate::audit::chain_hash;
use crate::store::StoreError;

/// The two ends of the chain as anchored.
#[derive(Debug, Clone, PartialEq, Eq, Default, sqlx::FromRow)]
pub struct Anchor {
    /// The newest row's seq (0: no row was ever written) and hash.
    pub head_seq: i64,
    pub head_hash: String,
    /// The oldest row that must be stored and the hash it links to.
    pub tail_seq: i64,
    pub tail_prev_hash: String,
}

/// Why a database does not match its anchor or its events; serving it stays refused until an
/// operator looks.
#[derive(Debug, Error)]
pub enum IntegrityError {
    #[error("{rows} event rows have no hash (the first is seq {first}); start refused so that no edited row is chained silently. Check the database, then run `countersign-server audit rechain` to chain them")]
    Unchained { rows: i64, first: i64 },
    #[error("the audit chain does not match its anchor at seq {seq}: {problem}; start refused. Compare with a head you exported (`countersign-server audit head`), then run `countersign-server audit rechain` to accept the log as it is")]
    Anchor { seq: i64, problem: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for IntegrityError {
    fn from(e: sqlx::Error) -> Self {
        IntegrityError::Store(e.into())
    }
}

pub async fn anchor<'e>(executor: impl SqliteExecutor<'e>) -> Result<Anchor, StoreError> {
    Ok(sqlx::query_as(
        "SELECT head_seq, head_hash, tail_seq, tail_prev_hash FROM audit_anchor WHERE id = 1",
    )
    .fetch_one(executor)
    .await?)
}

/// Compares the anchor with the newest and oldest stored rows: the seq and the hash where the
/// chain does not match it, if anywhere.
pub async fn check_ends(conn: &mut SqliteConnection) -> Result<Option<(i64, String)>, StoreError> {
    let anchor = anchor(&mut *conn).await?;
    let newest: Option<(i64, Option<String>)> =
        sqlx::query_as("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let oldest: Option<(i64, Option<String>)> =
        sqlx::query_as("SELECT seq, prev_hash FROM events ORDER BY seq LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let problem = match (newest, oldest) {
        (None, _) | (_, None) if anchor.head_seq >= anchor.tail_seq => Some((
            anchor.head_seq,
            format!(
                "the log is empty but rows {} to {} are anchored: they were removed",
                anchor.tail_seq, anchor.head_seq
            ),
        )),
        (None, _) | (_, None) => None,
        (Some((newest_seq, hash)), Some((oldest_seq, prev_hash))) => {
            if newest_seq < anchor.head_seq {
                Some((
                    anchor.head_seq,
                    format!(
                        "the newest row is {newest_seq} but {} is anchored: rows at the end were removed",
                        anchor.head_seq
                    ),
                ))
            } else if newest_seq > anchor.head_seq || hash.unwrap_or_default() != anchor.head_hash {
                Some((
                    newest_seq,
                    "the newest row is not the anchored head: it was replaced or added by hand"
                        .to_string(),
                ))
            } else if oldest_seq > anchor.tail_seq {
                Some((
                    anchor.tail_seq,
                    format!(
                        "the oldest row is {oldest_seq} but {} is anchored: rows at the start were removed",
                        anchor.tail_seq
                    ),
                ))
            } else if oldest_seq < anchor.tail_seq
                || prev_hash.unwrap_or_default() != anchor.tail_prev_hash
            {
                Some((
                    oldest_seq,
                    "the oldest row does not link to the anchored tail: it was replaced or added by hand"
                        .to_string(),
                ))
            } else {
                None
            }
        }
    };
    Ok(problem)
}

/// The checks before serving: no unchained rows and both ends as anchored (either refuses the
/// start), and every approval as its events say (a disagreeing one is logged; it is refused
/// when asked for).
pub async fn check_at_start(conn: &mut SqliteConnection) -> Result<(), IntegrityError> {
    let (rows, first): (i64, Option<i64>) =
        sqlx::query_as("SELECT COUNT(*), MIN(seq) FROM events WHERE hash IS NULL")
            .fetch_one(&mut *conn)
            .await?;
    if rows > 0 {
        return Err(IntegrityError::Unchained {
            rows,
            first: first.unwrap_or_default(),
        });
    }
    if let Some((seq, problem)) = check_ends(conn).await? {
        return Err(IntegrityError::Anchor { seq, problem });
    }
    let disagreeing = disagreeing_approvals(conn).await?;
    for (approval_id, seq, problem) in &disagreeing {
        tracing::error!(approval_id = %approval_id, seq, problem = %problem, "an approval disagrees with its audit trail; it is refused until repaired");
    }
    Ok(())
}

/// An approval row beside its newest event: id, row body, event seq and body, anchored tail.
type ApprovalAndEvent = (String, String, Option<i64>, Option<String>, i64);

/// Every approval whose stored row disagrees with its events: id, the seq to name, problem.
pub async fn disagreeing_approvals(
    conn: &mut SqliteConnection,
) -> Result<Vec<(String, i64, String)>, StoreError> {
    let rows: Vec<ApprovalAndEvent> = sqlx::query_as(
        "SELECT a.id, a.body, e.seq, e.body, (SELECT tail_seq FROM audit_anchor WHERE id = 1)
         FROM approvals a
         LEFT JOIN events e ON e.seq = (SELECT MAX(seq) FROM events WHERE approval_id = a.id)
         ORDER BY a.id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut disagreeing = Vec::new();
    for (id, row, seq, event, tail_seq) in rows {
        if let Err(problem) = compare(&row, event.as_deref(), tail_seq) {
            disagreeing.push((id, seq.unwrap_or_default(), problem));
        }
    }
    Ok(disagreeing)
}

/// Reads approval `approval_id`, refusing it unless its newest event holds the same approval
/// (row and event are read in one statement, so one snapshot).
pub async fn load_verified<'e>(
    executor: impl SqliteExecutor<'e>,
    approval_id: &str,
) -> Result<Approval, StoreError> {
    let found: Option<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT a.body,
                (SELECT e.body FROM events e WHERE e.approval_id = a.id ORDER BY e.seq DESC LIMIT 1),
                (SELECT tail_seq FROM audit_anchor WHERE id = 1)
         FROM approvals a WHERE a.id = ?",
    )
    .bind(approval_id)
    .fetch_optional(executor)
    .await?;
    let Some((row, event, tail_seq)) = found else {
        return Err(
            countersign_core::Error::NotFound(format!("approval {approval_id} not found")).into(),
        );
    };
    match compare(&row, event.as_deref(), tail_seq) {
        Ok(approval) => Ok(approval),
        Err(problem) => {
            tracing::error!(approval_id = %approval_id, problem = %problem, "refused an approval that disagrees with its audit trail");
            Err(countersign_core::Error::FailedPrecondition(format!(
                "approval {approval_id} is refused: {problem}; the database was changed outside countersign"
            ))
            .into())
        }
    }
}

/// The approval of a stored row (`row`, JSON) when its newest event (`event`, an event body)
/// holds the same approval. Argument values are left out: redaction blanks them, and the
/// digest stands for them.
fn compare(row: &str, event: Option<&str>, tail_seq: i64) -> Result<Approval, String> {
    let stored: Approval =
        serde_json::from_str(row).map_err(|e| format!("its row is not readable: {e}"))?;
    let Some(event) = event else {
        let usable = matches!(stored.state, State::Pending | State::Approved);
        // Retention may have pruned the events of an old, finished approval; one that can
        // still be approved or consumed must have its trail.
        return if usable || tail_seq <= 1 {
            Err(format!(
                "it is {} but has no event in the audit trail",
                stored.state.as_str()
            ))
        } else {
            Ok(stored)
        };
    };
    match crate::store::disagreement(&stored, event) {
        None => Ok(stored),
        Some(problem) => Err(problem),
    }
}

/// Deletes the oldest events written before `before` (the newest row always stays), as one
/// run from the start of the log, and moves the anchored tail past them.
pub async fn prune(conn: &mut SqliteConnection, before: Millis) -> Result<u64, sqlx::Error> {
    let cut: Option<(i64, Option<String>)> = sqlx::query_as(
        "SELECT seq, hash FROM events
         WHERE seq = (SELECT MAX(seq) FROM events WHERE at_ms < ? AND seq < (SELECT MAX(seq) FROM events))",
    )
    .bind(before)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((cut, hash)) = cut else {
        return Ok(0);
    };
    sqlx::query("UPDATE audit_anchor SET tail_seq = ?, tail_prev_hash = ? WHERE id = 1")
        .bind(cut + 1)
        .bind(hash.unwrap_or_default())
        .execute(&mut *conn)
        .await?;
    Ok(sqlx::query("DELETE FROM events WHERE seq <= ?")
        .bind(cut)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

/// What `audit rechain` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rechained {
    pub rows_chained: usize,
    pub before: Anchor,
    pub after: Anchor,
}

/// `countersign-server audit rechain`: chains the rows without a hash (oldest first, each to
/// the row before it) and anchors the chain to the rows as they now are. An operator's
/// explicit acceptance of the log, logged with what changed.
pub async fn rechain(database: &Path) -> Result<Rechained, StoreError> {
    let mut conn = open(database).await?;
    let mut tx = conn.begin().await?;
    let before = anchor(&mut *tx).await?;
    let unhashed: Vec<(i64, String, String, i64, String)> = sqlx::query_as(
        "SELECT seq, approval_id, kind, at_ms, body FROM events WHERE hash IS NULL ORDER BY seq",
    )
    .fetch_all(&mut *tx)
    .await?;
    for (seq, approval_id, kind, at_ms, body) in &unhashed {
        let prev_hash: String = sqlx::query_scalar(
            "SELECT coalesce(hash, '') FROM events WHERE seq < ? ORDER BY seq DESC LIMIT 1",
        )
        .bind(seq)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or_default();
        let mut json: Value = serde_json::from_str(body)?;
        let hash = chain_hash(&prev_hash, *seq, approval_id, kind, *at_ms, &mut json);
        sqlx::query("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?")
            .bind(&prev_hash)
            .bind(&hash)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "UPDATE audit_anchor SET
            head_seq = coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), head_seq),
            head_hash = coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), ''),
            tail_seq = coalesce((SELECT seq FROM events ORDER BY seq LIMIT 1), head_seq + 1),
            tail_prev_hash = coalesce((SELECT prev_hash FROM events ORDER BY seq LIMIT 1), '')
         WHERE id = 1",
    )
    .execute(&mut *tx)
    .await?;
    let after = anchor(&mut *tx).await?;
    tx.commit().await?;
    tracing::warn!(
        rows_chained = unhashed.len(),
        before_head_seq = before.head_seq,
        before_tail_seq = before.tail_seq,
        head_seq = after.head_seq,
        head_hash = %after.head_hash,
        tail_seq = after.tail_seq,
        "audit rechain: the operator accepted the event log as it is now"
    );
    Ok(Rechained {
        rows_chained: unhashed.len(),
        before,
        after,
    })
}

/// `countersign-server audit head`: the anchor of the database at `database`.
pub async fn head(database: &Path) -> Result<Anchor, StoreError> {
    let mut conn = open(database).await?;
    anchor(&mut conn).await
}

/// Opens an existing database and brings its schema up to date.
async fn open(database: &Path) -> Result<SqliteConnection, StoreError> {
    let options = SqliteConnectOptions::new()
        .filename(database)
        .create_if_missing(false);
    let mut conn = SqliteConnection::connect_with(&options).await?;
    crate::store::sqlite::MIGRATOR.run_direct(&mut conn).await?;
    Ok(conn)
}
