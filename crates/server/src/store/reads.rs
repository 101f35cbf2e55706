//! The reads both backends make with the same SQL: [`sql_reads`] writes them once, for a
//! backend's pool and row types, and implements `SharedReads` with them. (`QueryBuilder` numbers placeholders the way each database
//! wants; PostgreSQL gets SQLite's `instr` from its migration.)

use countersign_core::Approval;

/// The approvals of stored rows (`body` columns) a batch loaded. An unreadable row is skipped,
/// not fatal: failing here would stall every later batch (a change naming it gets NOT_FOUND).
pub(super) fn readable_approvals(bodies: &[String]) -> Vec<Approval> {
    bodies
        .iter()
        .filter_map(|body| {
            serde_json::from_str::<Approval>(body)
                .inspect_err(
                    |e| tracing::error!(error = %e, "skipping an unreadable stored approval"),
                )
                .ok()
        })
        .collect()
}

/// Defines, in the calling backend module, the shared reads over `$pool` (rows of `$row`,
/// database `$db`): `list`, `count_pending`, `events_after`, `list_events`, `list_grants`,
/// `list_delegations`, `event_from_row` and `delegation_from_row`;
/// and implements [`super::backend::SharedReads`] for `$backend` with them, on its `reads`
/// pool.
macro_rules! sql_reads {
    ($db:ty, $pool:ty, $row:ty, $backend:ty) => {
        #[async_trait]
        impl SharedReads for $backend {
            async fn count_pending(&self) -> Result<i64, StoreError> {
                count_pending(&self.reads).await
            }

            async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
                list(&self.reads, filter).await
            }

            async fn events_after(
                &self,
                after_seq: i64,
                limit: u32,
            ) -> Result<Vec<StoredEvent>, StoreError> {
                events_after(&self.reads, after_seq, limit).await
            }

            async fn list_events(
                &self,
                filter: &EventFilter,
            ) -> Result<Vec<AuditedEvent>, StoreError> {
                list_events(&self.reads, filter).await
            }

            async fn list_grants(
                &self,
                filter: &GrantFilter,
                now: Millis,
            ) -> Result<Vec<Grant>, StoreError> {
                list_grants(&self.reads, filter, now).await
            }

            async fn list_delegations(
                &self,
                approver: &str,
                include_inactive: bool,
                now: Millis,
            ) -> Result<Vec<Delegation>, StoreError> {
                list_delegations(&self.reads, approver, include_inactive, now).await
            }

            async fn list_passkeys(&self, approver: &str) -> Result<Vec<Passkey>, StoreError> {
                let rows = sqlx::query(
                    "SELECT credential_id, approver, name, cose_key, algorithm, sign_count,
                            created_at_ms FROM passkeys WHERE approver = $1
                      ORDER BY created_at_ms, credential_id LIMIT 100",
                )
                .bind(approver)
                .fetch_all(&self.reads)
                .await?;
                let passkey = |row: &$row| -> Result<Passkey, sqlx::Error> {
                    Ok(Passkey {
                        credential_id: row.try_get("credential_id")?,
                        approver: row.try_get("approver")?,
                        name: row.try_get("name")?,
                        cose_key: row.try_get("cose_key")?,
                        algorithm: row.try_get("algorithm")?,
                        sign_count: row.try_get("sign_count")?,
                        created_at: row.try_get("created_at_ms")?,
                    })
                };
                Ok(rows.iter().map(passkey).collect::<Result<_, _>>()?)
            }
        }

        /// An event row with its approval's current row, which lean events are read against.
        const EVENT_COLUMNS: &str = "e.seq, e.kind, e.at_ms, e.body, e.prev_hash, e.hash,
            a.body AS current
            FROM events AS e LEFT JOIN approvals AS a ON a.id = e.approval_id";

        const DELEGATION_COLUMNS: &str = "id, delegator, delegate, created_at_ms, until_ms,
            revoked_at_ms, reason, created_by";

        fn delegation_from_row(row: &$row) -> Result<Delegation, sqlx::Error> {
            Ok(Delegation {
                id: row.try_get("id")?,
                delegator: row.try_get("delegator")?,
                delegate: row.try_get("delegate")?,
                created_at: row.try_get("created_at_ms")?,
                until: row.try_get("until_ms")?,
                revoked_at: row.try_get("revoked_at_ms")?,
                reason: row.try_get("reason")?,
                created_by: row.try_get("created_by")?,
            })
        }

        /// Delegations, newest first: to or from `approver` (everyone when empty), only those
        /// active at `now` unless `include_inactive`.
        async fn list_delegations(
            pool: &$pool,
            approver: &str,
            include_inactive: bool,
            now: Millis,
        ) -> Result<Vec<Delegation>, StoreError> {
            let rows = sqlx::query(&format!(
                "SELECT {DELEGATION_COLUMNS} FROM delegations
                  WHERE ($1 = '' OR delegator = $1 OR delegate = $1)
                    AND ($2 OR (revoked_at_ms IS NULL AND until_ms > $3))
                  ORDER BY created_at_ms DESC, id DESC LIMIT 1000"
            ))
            .bind(approver)
            .bind(include_inactive)
            .bind(now)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(delegation_from_row)
                .collect::<Result<_, _>>()?)
        }

        /// The pending approvals routed to a channel (`$1`; all when empty), by id.
        const PENDING_ON_CHANNEL: &str = "SELECT body FROM approvals WHERE state = 'PENDING'
               AND ($1 = '' OR channels = '*' OR instr(channels, ',' || $1 || ',') > 0)
             ORDER BY id";

        async fn count_pending(pool: &$pool) -> Result<i64, StoreError> {
            Ok(
                sqlx::query_scalar("SELECT COUNT(*) FROM approvals WHERE state = 'PENDING'")
                    .fetch_one(pool)
                    .await?,
            )
        }

        async fn list(pool: &$pool, filter: &ListFilter) -> Result<Vec<Approval>, StoreError> {
            let mut query: QueryBuilder<$db> =
                QueryBuilder::new("SELECT body FROM approvals WHERE 1 = 1");
            if !filter.states.is_empty() {
                query.push(" AND state IN (");
                let mut states = query.separated(", ");
                for state in &filter.states {
                    states.push_bind(state.as_str());
                }
                query.push(")");
            }
            push_equal(
                &mut query,
                [
                    ("agent_id", &filter.agent_id),
                    ("session_id", &filter.session_id),
                    ("tool_name", &filter.tool_name),
                ],
            );
            if !filter.channel.is_empty() {
                query
                    .push(" AND (channels = '*' OR instr(channels, ")
                    .push_bind(format!(",{},", filter.channel))
                    .push(") > 0)");
            }
            if !filter.before_id.is_empty() {
                query.push(" AND id < ").push_bind(filter.before_id.clone());
            }
            query
                .push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::from(filter.limit));
            let rows = query.build().fetch_all(pool).await?;
            rows.iter()
                .map(|row| Ok(serde_json::from_str(row.try_get::<&str, _>("body")?)?))
                .collect()
        }

        async fn events_after(
            pool: &$pool,
            after_seq: i64,
            limit: u32,
        ) -> Result<Vec<StoredEvent>, StoreError> {
            let rows = sqlx::query(&format!(
                "SELECT {EVENT_COLUMNS} WHERE e.seq > $1 ORDER BY e.seq LIMIT $2"
            ))
            .bind(after_seq)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
            rows.iter().map(event_from_row).collect()
        }

        async fn list_events(
            pool: &$pool,
            filter: &EventFilter,
        ) -> Result<Vec<AuditedEvent>, StoreError> {
            let mut query: QueryBuilder<$db> =
                QueryBuilder::new(format!("SELECT {EVENT_COLUMNS} WHERE 1 = 1"));
            if !filter.approval_id.is_empty() {
                query
                    .push(" AND e.approval_id = ")
                    .push_bind(filter.approval_id.clone());
            }
            if !filter.kinds.is_empty() {
                query.push(" AND e.kind IN (");
                let mut kinds = query.separated(", ");
                for kind in &filter.kinds {
                    kinds.push_bind(kind.as_str());
                }
                query.push(")");
            }
            if !filter.agent_id.is_empty() {
                // Events have no index by agent: the agent's approvals (by the idempotency
                // index) lead to their events (events_by_approval).
                query
                    .push(" AND e.agent_id = ")
                    .push_bind(filter.agent_id.clone())
                    .push(" AND e.approval_id IN (SELECT id FROM approvals WHERE agent_id = ")
                    .push_bind(filter.agent_id.clone())
                    .push(")");
            }
            if !filter.decider.is_empty() {
                // The `<> ''` terms let each side use its partial index.
                query
                    .push(" AND ((e.decider = ")
                    .push_bind(filter.decider.clone())
                    .push(" AND e.decider <> '') OR (e.approver = ")
                    .push_bind(filter.decider.clone())
                    .push(" AND e.approver <> '')");
                if !filter.decider_identities.is_empty() {
                    query.push(" OR (e.decider <> '' AND e.decider IN (");
                    let mut identities = query.separated(", ");
                    for identity in &filter.decider_identities {
                        identities.push_bind(identity.clone());
                    }
                    query.push("))");
                }
                query.push(")");
            }
            if let Some(since) = filter.since {
                query.push(" AND e.at_ms >= ").push_bind(since);
            }
            if let Some(until) = filter.until {
                query.push(" AND e.at_ms < ").push_bind(until);
            }
            let (after, order) = if filter.newest_first {
                (" AND e.seq < ", " ORDER BY e.seq DESC LIMIT ")
            } else {
                (" AND e.seq > ", " ORDER BY e.seq LIMIT ")
            };
            if let Some(seq) = filter.after_seq {
                query.push(after).push_bind(seq);
            }
            query.push(order).push_bind(i64::from(filter.limit));
            let rows = query.build().fetch_all(pool).await?;
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

        async fn list_grants(
            pool: &$pool,
            filter: &GrantFilter,
            now: Millis,
        ) -> Result<Vec<Grant>, StoreError> {
            let mut query: QueryBuilder<$db> =
                QueryBuilder::new("SELECT * FROM grants WHERE 1 = 1");
            push_equal(
                &mut query,
                [
                    ("agent_id", &filter.agent_id),
                    ("session_id", &filter.session_id),
                    ("tool_name", &filter.tool_name),
                ],
            );
            if !filter.include_inactive {
                query
                    .push(
                        " AND revoked_at_ms IS NULL AND (expires_at_ms IS NULL OR expires_at_ms > ",
                    )
                    .push_bind(now)
                    .push(")");
            }
            if !filter.before_id.is_empty() {
                query.push(" AND id < ").push_bind(filter.before_id.clone());
            }
            query
                .push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::from(filter.limit));
            Ok(query.build_query_as().fetch_all(pool).await?)
        }

        /// Adds `AND column = value` for each filter that is set (not empty).
        fn push_equal(query: &mut QueryBuilder<'_, $db>, filters: [(&str, &String); 3]) {
            for (column, value) in filters {
                if !value.is_empty() {
                    query
                        .push(format!(" AND {column} = "))
                        .push_bind(value.clone());
                }
            }
        }

        /// An event row read with its approval's current row (`current`, from the join in
        /// `EVENT_COLUMNS`).
        fn event_from_row(row: &$row) -> Result<StoredEvent, StoreError> {
            let kind_name: &str = row.try_get("kind")?;
            let kind = EventKind::parse(kind_name)
                .ok_or_else(|| StoreError::Corrupt(format!("unknown event kind {kind_name}")))?;
            let current = row
                .try_get::<Option<&str>, _>("current")?
                .map(serde_json::from_str::<Approval>)
                .transpose()?;
            let body = EventBody::from_stored(row.try_get::<&str, _>("body")?, current)?;
            Ok(StoredEvent {
                seq: row.try_get("seq")?,
                kind,
                at: row.try_get("at_ms")?,
                approval: body.approval,
                decision: body.decision,
                delivery: body.delivery,
                detail: body.detail,
            })
        }
    };
}
pub(crate) use sql_reads;
