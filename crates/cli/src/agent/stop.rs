//! Being stopped while an approval waits: `hook` and `mcp` withdraw what they asked for when
//! SIGINT, SIGTERM or SIGHUP arrives, then exit. Claude Code stops a stdio MCP server with
//! SIGINT, then SIGTERM 100 ms later, then SIGKILL, and kills a hook when the user presses
//! Esc: the withdrawal must be sent within those 100 ms. A SIGKILL cannot be caught; for it the
//! server withdraws the approval once the caller's connection is gone
//! (`withdraw_when_caller_leaves`).

use std::time::Duration;

use countersign_client::gate::{self, Verdict};
use countersign_client::withdrawal::WITHDRAWN_REASON_PREFIX;
use countersign_client::Client;

/// How long a stopped process waits for the server to confirm its withdrawals before it exits.
/// The cancellation is sent at once, well within the 100 ms between Claude Code's SIGINT and
/// SIGTERM (the SIGTERM is caught too); waiting for the answer beyond them costs nothing, as a
/// SIGKILL meanwhile cannot take back a request already sent, and whatever the server never
/// got it withdraws itself once the connection is gone.
pub const WITHDRAW_LIMIT: Duration = Duration::from_secs(1);

/// The signals that stop `hook` and `mcp` after a withdrawal; a missing one (it could not be
/// installed) never arrives, and that signal then stops the process as it would anyway.
pub struct StopSignals {
    #[cfg(unix)]
    signals: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

impl StopSignals {
    /// Takes over SIGINT, SIGTERM and SIGHUP from now on.
    pub fn install() -> StopSignals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let kinds = [
                ("SIGINT", SignalKind::interrupt()),
                ("SIGTERM", SignalKind::terminate()),
                ("SIGHUP", SignalKind::hangup()),
            ];
            let signals = kinds
                .into_iter()
                .filter_map(|(name, kind)| match signal(kind) {
                    Ok(signal) => Some((name, signal)),
                    Err(error) => {
                        tracing::warn!(%error, signal = name, "cannot handle the signal; it stops without withdrawing");
                        None
                    }
                })
                .collect();
            StopSignals { signals }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// The name of the next stop signal received.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        if !self.signals.is_empty() {
            let arrivals = self.signals.iter_mut().map(|(name, signal)| {
                Box::pin(async move {
                    signal.recv().await;
                    *name
                })
            });
            return futures::future::select_all(arrivals).await.0;
        }
        std::future::pending().await
    }
}

/// The cancellation reason of an approval withdrawn because `who` was stopped by `signal`.
pub fn withdrawn_reason(who: &str, signal: &str) -> String {
    format!("{WITHDRAWN_REASON_PREFIX}{who} was stopped ({signal})")
}

/// Withdraws approval `approval_id`, giving up after [`WITHDRAW_LIMIT`]: the verdict
/// [`gate::withdraw`] gives (a decision that came first stands), or `None` when the server did
/// not answer in time.
pub async fn withdraw(client: &Client, approval_id: &str, reason: &str) -> Option<Verdict> {
    let withdrawn =
        tokio::time::timeout(WITHDRAW_LIMIT, gate::withdraw(client, approval_id, reason)).await;
    if withdrawn.is_err() {
        tracing::warn!(approval_id, "withdrawing on a stop signal took too long; the server withdraws it once the connection closes");
    }
    withdrawn.ok()
}
