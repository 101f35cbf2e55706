//! What the use cases share: [`App`] (the store, the hub, the configuration, the approver
//! registry and policy, the rate limits) and the checks every use case on one approval makes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::fields::required;
use countersign_core::validate::Limits;
use countersign_core::Approval;

use super::callers::Callers;
use super::rates;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Config;
use crate::config::Role;
use crate::security::Security;
use crate::store::hub::Hub;
use crate::store::Store;

/// The longest approval id accepted.
const MAX_ID_CHARS: usize = 128;

/// The use cases and what they share: the store, the hub of committed events, the
/// configuration, the approver registry and policy, the rate limits.
pub struct App {
    pub(super) store: Store,
    pub(super) hub: Hub,
    pub(super) config: Arc<Config>,
    pub(super) limits: Limits,
    pub(super) security: Arc<Security>,
    pub(super) rates: rates::Rates,
    /// Where `BackupDatabase` writes; None on PostgreSQL.
    pub(super) backups: Option<PathBuf>,
    pub(super) shutdown: tokio::sync::watch::Receiver<bool>,
    /// The waits of approvals to withdraw when their caller leaves.
    pub(super) callers: Callers,
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
                .or_else(|| crate::store::backup::default_directory(&config.database)),
            callers: Callers::new(
                store.clone(),
                Duration::from_millis(config.approvals.caller_grace_ms),
                shutdown.clone(),
            ),
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
    pub(super) async fn load(&self, approval_id: &str) -> Result<Approval, AppError> {
        Ok(self.store.get(approval_id).await?)
    }

    /// The approval `approval_id`, if `caller` may see it.
    pub(super) async fn readable(
        &self,
        caller: &Caller,
        approval_id: &str,
    ) -> Result<Approval, AppError> {
        approval_id_of(approval_id)?;
        let approval = self.load(approval_id).await?;
        caller.may_read(&approval)?;
        Ok(approval)
    }

    /// Refuses `caller` unless it may act on approval `approval_id`; an admin may act on all,
    /// so that needs no read.
    pub(super) async fn check_readable(
        &self,
        caller: &Caller,
        approval_id: &str,
    ) -> Result<(), AppError> {
        approval_id_of(approval_id)?;
        if caller.role == Role::Admin {
            return Ok(());
        }
        self.readable(caller, approval_id).await.map(drop)
    }
}

/// Checks an approval id field.
pub(super) fn approval_id_of(value: &str) -> Result<(), AppError> {
    Ok(required("approval_id", value, MAX_ID_CHARS)?)
}
