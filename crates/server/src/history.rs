//! Reads for operators and auditors: the event history, its verification and the grants.

use countersign_core::{EventKind, Millis};
use futures::TryStreamExt;
use sqlx::{QueryBuilder, Row, Sqlite};

use crate::audit::{AuditReport, Columns, EventRow, Verifier};
use crate::store::{event_from_row, Grant, Store, StoreError, StoredEvent};

#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub approval_id: String,
    pub kinds: Vec<EventKind>,
    pub agent_id: String,
    /// A decider identity `channel:user_id` or an approver id.
    pub decider: String,
    /// Inclusive.
    pub since: Option<Millis>,
    /// Exclusive.
    pub until: Option<Millis>,
    pub newest_first: bool,
    /// The seq the previous page ended with.
    pub after_seq: Option<i64>,
    pub limit: u32,
}

/// One row of the audit trail with its place in the hash chain.
#[derive(Debug, Clone)]
pub struct AuditedEvent {
    pub event: StoredEvent,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, Default)]
pub struct GrantFilter {
    pub agent_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub include_inactive: bool,
    /// The id the previous page ended with; the list continues with older grants.
    pub before_id: String,
    pub limit: u32,
}

impl Store {
    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditedEvent>, StoreError> {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT seq, kind, at_ms, body, prev_hash, hash FROM events WHERE 1 = 1",
        );
        if !filter.approval_id.is_empty() {
            query
                .push(" AND approval_id = ")
                .push_bind(filter.approval_id.clone());
        }
        if !filter.kinds.is_empty() {
            query.push(" AND kind IN (");
            let mut kinds = query.separated(", ");
            for kind in &filter.kinds {
                kinds.push_bind(kind.as_str());
            }
            query.push(")");
        }
        if !filter.agent_id.is_empty() {
            query
                .push(" AND agent_id = ")
                .push_bind(filter.agent_id.clone());
        }
        if !filter.decider.is_empty() {
            query
                .push(" AND (decider = ")
                .push_bind(filter.decider.clone())
                .push(" OR approver = ")
                .push_bind(filter.decider.clone())
                .push(")");
        }
        if let Some(since) = filter.since {
            query.push(" AND at_ms >= ").push_bind(since);
        }
        if let Some(until) = filter.until {
            query.push(" AND at_ms < ").push_bind(until);
        }
        let (after, order) = if filter.newest_first {
            (" AND seq < ", " ORDER BY seq DESC LIMIT ")
        } else {
            (" AND seq > ", " ORDER BY seq LIMIT ")
        };
        if let Some(seq) = filter.after_seq {
            query.push(after).push_bind(seq);
        }
        query.push(order).push_bind(i64::from(filter.limit));
        let rows = query.build().fetch_all(&self.reads).await?;
        rows.iter()
            .map(|row| {
                Ok(AuditedEvent {
                    event: event_from_row(row)?,
                    prev_hash: row
                        .try_get::<Option<String>, _>("prev_hash")?
                        .unwrap_or_default(),
                    hash: row
                        .try_get::<Option<String>, _>("hash")?
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Walks the whole event log in seq order, in one read transaction, and checks the hash
    /// chain up to the first broken row.
    pub async fn verify_audit(&self) -> Result<AuditReport, StoreError> {
        let mut tx = self.reads.begin().await?;
        let mut verifier = Verifier::default();
        {
            let mut rows = sqlx::query(
                "SELECT seq, approval_id, kind, at_ms, body, agent_id, decider, approver, prev_hash, hash
                 FROM events ORDER BY seq",
            )
            .fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                let row = EventRow {
                    seq: row.try_get("seq")?,
                    approval_id: row.try_get("approval_id")?,
                    kind: row.try_get("kind")?,
                    at_ms: row.try_get("at_ms")?,
                    body: row.try_get("body")?,
                    columns: Columns {
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
        let mut report = verifier.finish();
        if report.broken.is_none() {
            report.broken = crate::integrity::check_ends(&mut tx).await?;
        }
        if report.broken.is_none() {
            report.broken = crate::integrity::disagreeing_approvals(&mut tx)
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

    /// Grants, newest first.
    pub async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError> {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT * FROM grants WHERE 1 = 1");
        for (column, value) in [
            ("agent_id", &filter.agent_id),
            ("session_id", &filter.session_id),
            ("tool_name", &filter.tool_name),
        ] {
            if !value.is_empty() {
                query
                    .push(format!(" AND {column} = "))
                    .push_bind(value.clone());
            }
        }
        if !filter.include_inactive {
            query
                .push(" AND revoked_at_ms IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > ")
                .push_bind(now)
                .push(")");
        }
        if !filter.before_id.is_empty() {
            query.push(" AND id < ").push_bind(filter.before_id.clone());
        }
        query
            .push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit));
        Ok(query.build_query_as().fetch_all(&self.reads).await?)
    }
}
