//! The store's side of keeping the audit trail honest beyond the hash of each row: the chain's
//! anchor (its newest and oldest rows, kept in `audit_anchor`, apart from the rows), the SQL
//! that reads and moves it ([`AuditSql`], written once for both backends), the start-up checks
//! that refuse a database whose chain was truncated or has unchained rows, and the check that
//! an approval's stored row says what its newest event says; and the log's history id, which
//! a rechain (here) and a restore (`crate::store::backup`, `audit new-history`) change. The
//! operator's commands on the anchor (`audit head`, `audit rechain`, `audit new-history`) are
//! `crate::integrity`.

use async_trait::async_trait;
use countersign_core::{Approval, Millis, State};
use thiserror::Error;

use super::error::StoreError;
use crate::audit::AuditReport;

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

/// The newest row: (seq, hash); the oldest row: (seq, prev_hash).
pub type ChainEnds = (Option<(i64, Option<String>)>, Option<(i64, Option<String>)>);

/// An approval row beside its newest event: id, row body, event seq and body, anchored tail.
pub type ApprovalAndEvent = (String, String, Option<i64>, Option<String>, i64);

/// The audit chain's SQL on one backend's connection. The statements are written once, in the
/// `$1` placeholder form that both sqlx drivers read, and [`audit_sql`] implements this trait
/// for each backend's connection type with them.
#[async_trait]
pub trait AuditSql: Send {
    async fn anchor(&mut self) -> Result<Anchor, StoreError>;
    async fn chain_ends(&mut self) -> Result<ChainEnds, StoreError>;
    /// How many rows have no hash, and the first of them.
    async fn unchained(&mut self) -> Result<(i64, Option<i64>), StoreError>;
    /// Every approval beside its newest event, by id.
    async fn approvals_beside_events(&mut self) -> Result<Vec<ApprovalAndEvent>, StoreError>;
    /// Approval `approval_id`'s row, its newest event's body and the anchored tail, read in one
    /// statement (so one snapshot).
    async fn approval_beside_event(
        &mut self,
        approval_id: &str,
    ) -> Result<Option<(String, Option<String>, i64)>, StoreError>;
    /// Deletes the oldest events written before `before` (the newest row always stays), as one
    /// run from the start of the log, and moves the anchored tail past them; inside the
    /// caller's transaction.
    async fn prune(&mut self, before: Millis) -> Result<u64, StoreError>;
    /// Chains the rows without a hash and anchors the chain to the rows as they are, in a
    /// transaction of its own, and begins a new history of the log: what a cursor read before
    /// names may no longer be what the log holds.
    async fn rechain(&mut self) -> Result<Rechained, StoreError>;
    /// The log's history id, written first when the database has none (a new database, or a
    /// backup copy).
    async fn history(&mut self) -> Result<String, StoreError>;
    /// Gives the log a new history id: watch cursors read before it are answered like cursors
    /// ahead of the log, so their readers re-list.
    async fn new_history(&mut self) -> Result<String, StoreError>;
    /// Walks the whole event log in seq order and checks the hash chain up to the first broken
    /// row, then its ends against the anchor and every approval against its events, all in one
    /// snapshot.
    async fn verify(&mut self) -> Result<AuditReport, StoreError>;
}

/// The statements of [`AuditSql`].
pub(crate) mod sql {
    pub const ANCHOR: &str =
        "SELECT head_seq, head_hash, tail_seq, tail_prev_hash FROM audit_anchor WHERE id = 1";
    pub const NEWEST: &str = "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1";
    pub const OLDEST: &str = "SELECT seq, prev_hash FROM events ORDER BY seq LIMIT 1";
    pub const UNCHAINED: &str = "SELECT COUNT(*), MIN(seq) FROM events WHERE hash IS NULL";
    pub const APPROVALS_BESIDE_EVENTS: &str =
        "SELECT a.id, a.body, e.seq, e.body, (SELECT tail_seq FROM audit_anchor WHERE id = 1)
         FROM approvals a
         LEFT JOIN events e ON e.seq = (SELECT MAX(seq) FROM events WHERE approval_id = a.id)
         ORDER BY a.id";
    pub const APPROVAL_BESIDE_EVENT: &str = "SELECT a.body,
            (SELECT e.body FROM events e WHERE e.approval_id = a.id ORDER BY e.seq DESC LIMIT 1),
            (SELECT tail_seq FROM audit_anchor WHERE id = 1)
         FROM approvals a WHERE a.id = $1";
    pub const PRUNE_CUT: &str = "SELECT seq, hash FROM events
         WHERE seq = (SELECT MAX(seq) FROM events
                       WHERE at_ms < $1 AND seq < (SELECT MAX(seq) FROM events))";
    pub const MOVE_TAIL: &str =
        "UPDATE audit_anchor SET tail_seq = $1, tail_prev_hash = $2 WHERE id = 1";
    pub const DELETE_UP_TO: &str = "DELETE FROM events WHERE seq <= $1";
    pub const UNHASHED_ROWS: &str =
        "SELECT seq, approval_id, kind, at_ms, body FROM events WHERE hash IS NULL ORDER BY seq";
    pub const HASH_BEFORE: &str =
        "SELECT coalesce(hash, '') FROM events WHERE seq < $1 ORDER BY seq DESC LIMIT 1";
    pub const SET_HASH: &str = "UPDATE events SET prev_hash = $1, hash = $2 WHERE seq = $3";
    pub const ANCHOR_TO_ROWS: &str = "UPDATE audit_anchor SET
            head_seq = coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), head_seq),
            head_hash = coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), ''),
            tail_seq = coalesce((SELECT seq FROM events ORDER BY seq LIMIT 1), head_seq + 1),
            tail_prev_hash = coalesce((SELECT prev_hash FROM events ORDER BY seq LIMIT 1), '')
         WHERE id = 1";
    pub const HISTORY: &str = "SELECT history_id FROM log_history WHERE id = 1";
    pub const FIRST_HISTORY: &str =
        "INSERT INTO log_history (id, history_id) VALUES (1, $1) ON CONFLICT (id) DO NOTHING";
    pub const NEW_HISTORY: &str = "INSERT INTO log_history (id, history_id) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET history_id = excluded.history_id";
    pub const EVERY_EVENT: &str = "SELECT seq, approval_id, kind, at_ms, body, agent_id, decider,
            approver, prev_hash, hash
         FROM events ORDER BY seq";
    pub const EVERY_APPROVAL_BESIDE_REQUEST: &str =
        "SELECT a.body AS approval, e.seq, e.body AS requested
         FROM approvals AS a
         JOIN events AS e ON e.approval_id = a.id AND e.kind = 'REQUESTED'";
}

/// Implements [`AuditSql`] for a backend's connection type with the statements of [`sql`].
/// `$snapshot` is the statement (if any) that makes a transaction just begun read one
/// consistent snapshot.
macro_rules! audit_sql {
    ($connection:ty, $snapshot:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::audit_sql::AuditSql for $connection {
            async fn anchor(
                &mut self,
            ) -> Result<$crate::store::audit_sql::Anchor, $crate::store::error::StoreError> {
                Ok(sqlx::query_as($crate::store::audit_sql::sql::ANCHOR)
                    .fetch_one(&mut *self)
                    .await?)
            }

            async fn chain_ends(
                &mut self,
            ) -> Result<$crate::store::audit_sql::ChainEnds, $crate::store::error::StoreError> {
                let newest = sqlx::query_as($crate::store::audit_sql::sql::NEWEST)
                    .fetch_optional(&mut *self)
                    .await?;
                let oldest = sqlx::query_as($crate::store::audit_sql::sql::OLDEST)
                    .fetch_optional(&mut *self)
                    .await?;
                Ok((newest, oldest))
            }

            async fn unchained(
                &mut self,
            ) -> Result<(i64, Option<i64>), $crate::store::error::StoreError> {
                Ok(sqlx::query_as($crate::store::audit_sql::sql::UNCHAINED)
                    .fetch_one(&mut *self)
                    .await?)
            }

            async fn approvals_beside_events(
                &mut self,
            ) -> Result<
                Vec<$crate::store::audit_sql::ApprovalAndEvent>,
                $crate::store::error::StoreError,
            > {
                Ok(
                    sqlx::query_as($crate::store::audit_sql::sql::APPROVALS_BESIDE_EVENTS)
                        .fetch_all(&mut *self)
                        .await?,
                )
            }

            async fn approval_beside_event(
                &mut self,
                approval_id: &str,
            ) -> Result<Option<(String, Option<String>, i64)>, $crate::store::error::StoreError>
            {
                Ok(
                    sqlx::query_as($crate::store::audit_sql::sql::APPROVAL_BESIDE_EVENT)
                        .bind(approval_id)
                        .fetch_optional(&mut *self)
                        .await?,
                )
            }

            async fn prune(
                &mut self,
                before: countersign_core::Millis,
            ) -> Result<u64, $crate::store::error::StoreError> {
                let cut: Option<(i64, Option<String>)> =
                    sqlx::query_as($crate::store::audit_sql::sql::PRUNE_CUT)
                        .bind(before)
                        .fetch_optional(&mut *self)
                        .await?;
                let Some((cut, hash)) = cut else {
                    return Ok(0);
                };
                sqlx::query($crate::store::audit_sql::sql::MOVE_TAIL)
                    .bind(cut + 1)
                    .bind(hash.unwrap_or_default())
                    .execute(&mut *self)
                    .await?;
                Ok(sqlx::query($crate::store::audit_sql::sql::DELETE_UP_TO)
                    .bind(cut)
                    .execute(&mut *self)
                    .await?
                    .rows_affected())
            }

            async fn rechain(
                &mut self,
            ) -> Result<$crate::store::audit_sql::Rechained, $crate::store::error::StoreError> {
                use sqlx::Connection;
                let mut tx = self.begin().await?;
                let before = $crate::store::audit_sql::AuditSql::anchor(&mut *tx).await?;
                let unhashed: Vec<(i64, String, String, i64, String)> =
                    sqlx::query_as($crate::store::audit_sql::sql::UNHASHED_ROWS)
                        .fetch_all(&mut *tx)
                        .await?;
                for (seq, approval_id, kind, at_ms, body) in &unhashed {
                    let prev_hash: String =
                        sqlx::query_scalar($crate::store::audit_sql::sql::HASH_BEFORE)
                            .bind(seq)
                            .fetch_optional(&mut *tx)
                            .await?
                            .unwrap_or_default();
                    let mut json: serde_json::Value = serde_json::from_str(body)?;
                    let hash = $crate::audit::chain_hash(
                        &prev_hash,
                        *seq,
                        approval_id,
                        kind,
                        *at_ms,
                        &mut json,
                    );
                    sqlx::query($crate::store::audit_sql::sql::SET_HASH)
                        .bind(&prev_hash)
                        .bind(&hash)
                        .bind(seq)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query($crate::store::audit_sql::sql::ANCHOR_TO_ROWS)
                    .execute(&mut *tx)
                    .await?;
                let after = $crate::store::audit_sql::AuditSql::anchor(&mut *tx).await?;
                let history_id = $crate::store::audit_sql::AuditSql::new_history(&mut *tx).await?;
                tx.commit().await?;
                Ok($crate::store::audit_sql::Rechained {
                    rows_chained: unhashed.len(),
                    before,
                    after,
                    history_id,
                })
            }

            async fn history(&mut self) -> Result<String, $crate::store::error::StoreError> {
                sqlx::query($crate::store::audit_sql::sql::FIRST_HISTORY)
                    .bind($crate::store::audit_sql::fresh_history())
                    .execute(&mut *self)
                    .await?;
                Ok(sqlx::query_scalar($crate::store::audit_sql::sql::HISTORY)
                    .fetch_one(&mut *self)
                    .await?)
            }

            async fn new_history(&mut self) -> Result<String, $crate::store::error::StoreError> {
                let history_id = $crate::store::audit_sql::fresh_history();
                sqlx::query($crate::store::audit_sql::sql::NEW_HISTORY)
                    .bind(&history_id)
                    .execute(&mut *self)
                    .await?;
                Ok(history_id)
            }

            async fn verify(
                &mut self,
            ) -> Result<$crate::audit::AuditReport, $crate::store::error::StoreError> {
                use futures::TryStreamExt;
                use sqlx::{Connection, Row};
                let mut tx = self.begin().await?;
                let snapshot: Option<&str> = $snapshot;
                if let Some(snapshot) = snapshot {
                    sqlx::query(snapshot).execute(&mut *tx).await?;
                }
                let mut verifier = $crate::audit::Verifier::default();
                {
                    let mut rows =
                        sqlx::query($crate::store::audit_sql::sql::EVERY_EVENT).fetch(&mut *tx);
                    while let Some(row) = rows.try_next().await? {
                        let row = $crate::audit::EventRow {
                            seq: row.try_get("seq")?,
                            approval_id: row.try_get("approval_id")?,
                            kind: row.try_get("kind")?,
                            at_ms: row.try_get("at_ms")?,
                            body: row.try_get("body")?,
                            columns: $crate::audit::Columns {
                                agent_id: row.try_get("agent_id")?,
                                decider: row.try_get("decider")?,
                                approver: row.try_get("approver")?,
                            },
                            prev_hash: row.try_get("prev_hash")?,
                            hash: row.try_get("hash")?,
                        };
                        if !verifier.check(row) {
                            break;
                        }
                    }
                }
                {
                    let mut rows =
                        sqlx::query($crate::store::audit_sql::sql::EVERY_APPROVAL_BESIDE_REQUEST)
                            .fetch(&mut *tx);
                    while let Some(row) = rows.try_next().await? {
                        if !verifier.check_approval(
                            row.try_get("seq")?,
                            row.try_get("approval")?,
                            row.try_get("requested")?,
                        ) {
                            break;
                        }
                    }
                }
                let mut report = verifier.finish();
                if report.broken.is_none() {
                    report.broken = $crate::store::audit_sql::check_ends(&mut *tx).await?;
                }
                if report.broken.is_none() {
                    report.broken = $crate::store::audit_sql::disagreeing_approvals(&mut *tx)
                        .await?
                        .into_iter()
                        .next()
                        .map(|(approval_id, seq, problem)| {
                            (seq.max(1), format!("approval {approval_id}: {problem}"))
                        });
                }
                tx.commit().await?;
                Ok(report)
            }
        }
    };
}
pub(crate) use audit_sql;

/// Compares the anchor with the newest and oldest stored rows: the seq and the hash where the
/// chain does not match it, if anywhere.
pub async fn check_ends<C: AuditSql + ?Sized>(
    conn: &mut C,
) -> Result<Option<(i64, String)>, StoreError> {
    let anchor = conn.anchor().await?;
    let (newest, oldest) = conn.chain_ends().await?;
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
pub async fn check_at_start<C: AuditSql + ?Sized>(conn: &mut C) -> Result<(), IntegrityError> {
    let (rows, first) = conn.unchained().await?;
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

/// Every approval whose stored row disagrees with its events: id, the seq to name, problem.
pub async fn disagreeing_approvals<C: AuditSql + ?Sized>(
    conn: &mut C,
) -> Result<Vec<(String, i64, String)>, StoreError> {
    let mut disagreeing = Vec::new();
    for (id, row, seq, event, tail_seq) in conn.approvals_beside_events().await? {
        if let Err(problem) = compare(&row, event.as_deref(), tail_seq) {
            disagreeing.push((id, seq.unwrap_or_default(), problem));
        }
    }
    Ok(disagreeing)
}

/// Reads approval `approval_id`, refusing it unless its newest event holds the same approval.
pub async fn load_verified<C: AuditSql + ?Sized>(
    conn: &mut C,
    approval_id: &str,
) -> Result<Approval, StoreError> {
    let Some((row, event, tail_seq)) = conn.approval_beside_event(approval_id).await? else {
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
    match super::event::disagreement(&stored, event) {
        None => Ok(stored),
        Some(problem) => Err(problem),
    }
}

/// What `audit rechain` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rechained {
    pub rows_chained: usize,
    pub before: Anchor,
    pub after: Anchor,
    /// The log's new history id.
    pub history_id: String,
}

/// A new history id: random (a UUIDv7's 74 random bits beside its time), so no two databases,
/// restores or rechains share one.
pub fn fresh_history() -> String {
    uuid::Uuid::now_v7().to_string()
}
