//! The two interfaces a storage backend implements: the writer's connection (a batch is
//! begin, load, write, commit) and the reads the services make. SQLite and PostgreSQL
//! implement both (`sqlite.rs`, `postgres.rs`); the store's facade (`mod.rs`) and writer
//! (`writer.rs`) use only these.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::groups::Delegation;
use countersign_core::{Approval, Millis};

use super::audit_sql::IntegrityError;
use super::batch::{BatchKeys, Loaded, WriteSet};
use super::error::StoreError;
use super::event::{AuditedEvent, EventFilter, StoredEvent};
use super::records::{ChainHead, Grant, GrantFilter, ListFilter, Passkey, Snapshot};
use crate::audit::AuditReport;
use crate::store::backup::{Backup, BackupError};

/// The writer's connection to a backend. A batch is: `begin`, `load`, `write`, `commit`; after
/// any error the store drops the connection and asks the backend for a new one, so no
/// transaction state of a failed batch survives.
#[async_trait]
pub trait WriterConnection: Send {
    /// Begins a batch's transaction. On a database that other servers write too, returns the
    /// chain head as committed, read under the lock that keeps their batches out until this
    /// one commits; None when this writer is the only one (it keeps the head itself).
    async fn begin(&mut self) -> Result<Option<ChainHead>, StoreError>;
    /// The newest event's seq and hash, as committed.
    async fn chain_head(&mut self) -> Result<ChainHead, StoreError>;
    /// Reads what the batch's changes need, inside the transaction.
    async fn load(&mut self, keys: &BatchKeys) -> Result<Loaded, StoreError>;
    /// Writes the batch; returns how many events were pruned.
    async fn write(&mut self, writes: &WriteSet) -> Result<u64, StoreError>;
    async fn commit(&mut self) -> Result<(), StoreError>;
    /// One small write outside any batch, to learn whether the database accepts writes.
    async fn probe(&mut self, now: Millis) -> Result<(), StoreError>;
}

/// The reads both backends make with the same SQL, implemented once for both by
/// `reads::sql_reads!`.
#[async_trait]
pub trait SharedReads: Send + Sync {
    /// How many approvals are waiting for a decision.
    async fn count_pending(&self) -> Result<i64, StoreError>;
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Approval>, StoreError>;
    /// Stored events with seq greater than `after_seq`, oldest first, at most `limit`.
    async fn events_after(
        &self,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<AuditedEvent>, StoreError>;
    /// Grants, newest first.
    async fn list_grants(
        &self,
        filter: &GrantFilter,
        now: Millis,
    ) -> Result<Vec<Grant>, StoreError>;
    /// Delegations, newest first: to or from `approver` (everyone when empty), only those
    /// active at `now` unless `include_inactive`.
    async fn list_delegations(
        &self,
        approver: &str,
        include_inactive: bool,
        now: Millis,
    ) -> Result<Vec<Delegation>, StoreError>;
    /// The passkeys `approver` registered, oldest first.
    async fn list_passkeys(&self, approver: &str) -> Result<Vec<Passkey>, StoreError>;
}

/// A storage backend: the writer's connections, and every read the services make (those of
/// [`SharedReads`] and the ones each database makes its own way).
#[async_trait]
pub trait Backend: SharedReads {
    async fn connect_writer(&self) -> Result<Box<dyn WriterConnection>, StoreError>;
    /// The checks before serving: the audit chain's anchor, and every approval against its
    /// events.
    async fn check_integrity(&self) -> Result<(), IntegrityError>;
    async fn get(&self, approval_id: &str) -> Result<Approval, StoreError>;
    /// The pending approvals routed to `channel` (all when empty) and the head seq, read in
    /// one transaction so that a stream can continue exactly after the snapshot.
    async fn snapshot(&self, channel: &str) -> Result<Snapshot, StoreError>;
    /// The highest seq ever assigned (0 when none), and the lowest seq still stored (head + 1
    /// when the log is empty).
    async fn log_bounds(&self) -> Result<(i64, i64), StoreError>;
    /// Walks the whole event log in seq order and checks the hash chain up to the first
    /// broken row.
    async fn verify_audit(&self) -> Result<AuditReport, StoreError>;
    /// Writes a consistent copy of the database to the new file `into` while serving goes on,
    /// and verifies the copy's audit chain; see [`crate::store::backup`].
    async fn backup(&self, into: &Path) -> Result<Backup, BackupError>;
    /// Closes the backend's connections at a clean stop, once the writer has closed its own
    /// (SQLite: ending with a full checkpoint, see `sqlite.rs`).
    async fn close(&self) {}
    /// The log's history id, read at start (it changes only while no server serves: a
    /// restore, `audit rechain`, `audit new-history`).
    fn history(&self) -> &str;
    /// Whether several servers (replicas) may serve this database at once.
    fn shared_by_replicas(&self) -> bool {
        false
    }
    /// Whether this server runs the background sweeps (expiry, pruning) now: always on a
    /// database of its own; on a shared one, only the server holding the sweep lock.
    async fn leads_sweeps(&self) -> bool {
        true
    }
    /// Takes one call from the shared token bucket `key` (refilled at `per_ms` calls a
    /// millisecond up to `burst`), or says how long until one is available. None when the
    /// backend keeps no shared buckets (each server then limits on its own).
    async fn take_token(
        &self,
        _key: &str,
        _per_ms: f64,
        _burst: f64,
        _now: Millis,
    ) -> Result<Option<Result<(), Duration>>, StoreError> {
        Ok(None)
    }
}
