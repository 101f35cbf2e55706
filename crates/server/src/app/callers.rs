//! Withdrawing an approval whose caller left: for a request that asked for it
//! (`withdraw_when_caller_leaves`), the open WaitForDecision calls of each pending approval are
//! counted; once none has been open for the grace period (a call whose connection broke is
//! dropped, so it counts as closed), the approval is cancelled with a "withdrawn: " reason
//! through the store's cancellation, like CancelApproval. The grace starts at the request too,
//! so a caller gone before it waited is covered, and it lets a caller re-attach after a broken
//! connection without losing its approval.
//!
//! The count is this replica's. On a database of its own the server sees every call, so the
//! request and a wait that answered arm the grace too. On a database shared by replicas a
//! balancer may send the request and each wait to different replicas, so only a wait whose
//! call was dropped before it answered (its connection broke: the caller was killed or its
//! network went) arms it; a caller that re-attaches to another replica within the grace is
//! not seen, and its approval is withdrawn (the agent is told no). After a restart an approval
//! is watched again once its caller re-attaches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use countersign_core::WITHDRAWN_REASON_PREFIX;

use crate::store::{now_millis, Store, StoreError};

/// The reason recorded when the server withdraws an approval whose caller left.
pub(crate) fn caller_left_reason() -> String {
    format!("{WITHDRAWN_REASON_PREFIX}the caller left")
}

/// The open waits of the approvals whose callers are watched.
#[derive(Clone)]
pub(crate) struct Callers {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    grace: Duration,
    /// The database is shared by replicas (see the module comment).
    shared: bool,
    shutdown: tokio::sync::watch::Receiver<bool>,
    waits: Mutex<HashMap<String, Waits>>,
}

/// One approval's open waits; `round` changes whenever they change, so that a grace timer
/// armed earlier sees that a caller came back meanwhile.
#[derive(Default)]
struct Waits {
    open: usize,
    round: u64,
}

impl Callers {
    pub(crate) fn new(
        store: Store,
        grace: Duration,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Callers {
        Callers {
            inner: Arc::new(Inner {
                shared: store.shared_by_replicas(),
                store,
                grace,
                shutdown,
                waits: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A just-requested approval nobody waits for yet: withdrawn unless a wait opens within
    /// the grace (on a database of its own; see the module comment).
    pub(crate) fn requested(&self, approval_id: &str) {
        if self.inner.shared {
            return;
        }
        let round = {
            let mut waits = self.lock();
            let entry = waits.entry(approval_id.to_owned()).or_default();
            if entry.open > 0 {
                return;
            }
            entry.round += 1;
            entry.round
        };
        self.arm(approval_id.to_owned(), round);
    }

    /// A wait opens; the returned guard closes it when dropped (also when the call is dropped
    /// because its connection is gone).
    pub(crate) fn wait_opened(&self, approval_id: &str) -> OpenWait {
        let mut waits = self.lock();
        let entry = waits.entry(approval_id.to_owned()).or_default();
        entry.open += 1;
        entry.round += 1;
        OpenWait {
            callers: self.clone(),
            approval_id: approval_id.to_owned(),
            end: WaitEnd::Dropped,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waits>> {
        self.inner
            .waits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn closed(&self, approval_id: &str, end: WaitEnd) {
        let round = {
            let mut waits = self.lock();
            let Some(entry) = waits.get_mut(approval_id) else {
                return;
            };
            entry.open = entry.open.saturating_sub(1);
            entry.round += 1;
            if end == WaitEnd::Resolved {
                // Nothing left to withdraw.
                waits.remove(approval_id);
                return;
            }
            if entry.open > 0 || (end == WaitEnd::Answered && self.inner.shared) {
                return;
            }
            entry.round
        };
        self.arm(approval_id.to_owned(), round);
    }

    /// After the grace, withdraws the approval unless its waits changed since `round`.
    fn arm(&self, approval_id: String, round: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let callers = self.clone();
        let mut shutdown = self.inner.shutdown.clone();
        runtime.spawn(async move {
            // A stopping server withdraws nothing (its callers re-attach to the next one), and
            // lets go of the store at once.
            if *shutdown.borrow() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(callers.inner.grace) => {}
                _ = shutdown.changed() => return,
            }
            {
                let mut waits = callers.lock();
                match waits.get(&approval_id) {
                    Some(entry) if entry.open == 0 && entry.round == round => {
                        waits.remove(&approval_id);
                    }
                    _ => return,
                }
            }
            callers.withdraw(&approval_id).await;
        });
    }

    async fn withdraw(&self, approval_id: &str) {
        let reason = caller_left_reason();
        match self
            .inner
            .store
            .cancel(approval_id, &reason, now_millis())
            .await
        {
            Ok(_) => tracing::info!(
                approval_id,
                grace_ms = self.inner.grace.as_millis() as u64,
                "approval withdrawn: its caller left"
            ),
            // Decided, expired or cancelled meanwhile: nothing to withdraw.
            Err(StoreError::Domain(_)) => {}
            Err(error) => {
                tracing::warn!(%error, approval_id, "cannot withdraw an approval whose caller left")
            }
        }
    }
}

/// How a WaitForDecision call of a watched approval ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WaitEnd {
    /// It saw the approval resolved: no grace timer is needed.
    Resolved,
    /// It answered with the approval still pending; the caller may wait again.
    Answered,
    /// It was dropped before it answered: its connection is gone.
    Dropped,
}

/// An open WaitForDecision call of a watched approval.
pub(crate) struct OpenWait {
    callers: Callers,
    approval_id: String,
    end: WaitEnd,
}

impl OpenWait {
    /// The wait answered: with the approval resolved, or still pending.
    pub(crate) fn answered(mut self, resolved: bool) {
        self.end = if resolved {
            WaitEnd::Resolved
        } else {
            WaitEnd::Answered
        };
    }
}

impl Drop for OpenWait {
    fn drop(&mut self) {
        self.callers.closed(&self.approval_id, self.end);
    }
}
