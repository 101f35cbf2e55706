//! The server's use cases, free of gRPC: request, decide, wait, cancel, consume, record a
//! delivery, read and list; and the admin's (audit trail, backups, grants, delegations). Each takes domain inputs and the caller (a token's name, role and
//! scope), checks what the caller may do, the limits and the domain's rules, has the store
//! persist the change and returns domain values or an [`AppError`]. The gRPC services
//! (`crate::service`) only convert wire types and map that one error to a status.

mod admin;
mod decide;
mod lifecycle;
mod rates;
mod reads;
mod request;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use countersign_core::validate::{required, Limits};
use countersign_core::Approval;

use crate::auth::{Caller, Role};
use crate::config::Config;
use crate::error::AppError;
use crate::hub::Hub;
use crate::security::Security;
use crate::store::Store;

pub use admin::{ApproverSummary, EventsQuery, GrantsQuery, NewDelegation};
pub use decide::DecideInput;
pub use lifecycle::{ConsumeInput, DeliveryInput};
pub use reads::ListQuery;

/// The longest approval id accepted.
const MAX_ID_CHARS: usize = 128;

/// The use cases and what they share: the store, the hub of committed events, the
/// configuration, the approver registry and policy, the rate limits.
pub struct App {
    store: Store,
    hub: Hub,
    config: Arc<Config>,
    limits: Limits,
    security: Arc<Security>,
    rates: rates::Rates,
    /// Where `BackupDatabase` writes; None on PostgreSQL.
    backups: Option<PathBuf>,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl App {
    pub fn new(
        store: Store,
        hub: Hub,
        config: Arc<Config>,
        security: Arc<Security>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> App {
        App {
            limits: config.request_limits(),
            rates: rates::Rates::of(&config.limits),
            backups: config
                .storage
                .backup_dir
                .clone()
                .or_else(|| crate::backup::default_directory(&config.database)),
            store,
            hub,
            config,
            security,
            shutdown,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn shutdown(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// The approval `approval_id` as its audit trail confirms it (refused when the stored row
    /// disagrees with its newest event).
    async fn load(&self, approval_id: &str) -> Result<Approval, AppError> {
        Ok(self.store.get(approval_id).await?)
    }

    /// The approval `approval_id`, if `caller` may see it.
    async fn readable(&self, caller: &Caller, approval_id: &str) -> Result<Approval, AppError> {
        approval_id_of(approval_id)?;
        let approval = self.load(approval_id).await?;
        caller.may_read(&approval)?;
        Ok(approval)
    }

    /// Refuses `caller` unless it may act on approval `approval_id`; an admin may act on all,
    /// so that needs no read.
    async fn check_readable(&self, caller: &Caller, approval_id: &str) -> Result<(), AppError> {
        approval_id_of(approval_id)?;
        if caller.role == Role::Admin {
            return Ok(());
        }
        self.readable(caller, approval_id).await.map(drop)
    }
}

/// Checks an approval id field.
fn approval_id_of(value: &str) -> Result<(), AppError> {
    Ok(required("approval_id", value, MAX_ID_CHARS)?)
}
