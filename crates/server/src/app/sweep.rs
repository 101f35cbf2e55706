//! The follow-ups no caller asks for: expiry, reminders and escalation when due, and the
//! pruning of events past retention.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as signal;

use crate::config::Config;
use crate::store::{now_millis, Store};

/// Expires, reminds and escalates approvals when they are due, and prunes events past
/// retention; on a database shared by several servers, only the one that leads the sweeps does.
pub(crate) async fn sweep(store: Store, config: Arc<Config>, mut stop: signal::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(config.approvals.sweep_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retention_ms =
        i64::try_from(config.watch.retention_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        if !store.leads_sweeps().await {
            continue;
        }
        let now = now_millis();
        if let Err(e) = store.sweep_due(now).await {
            tracing::warn!(error = %e, "follow-up sweep failed; retrying at the next tick");
        }
        if retention_ms > 0 {
            if let Err(e) = store.prune_events(now - retention_ms, now).await {
                tracing::warn!(error = %e, "event pruning failed; retrying at the next tick");
            }
        }
    }
}
