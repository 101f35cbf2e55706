//! The live picture of pending approvals, fed by one `WatchApprovals` stream (snapshot, then
//! events) and fanned out to every open page as numbered changes.
//!
//! Each change carries the server's event seq, which pages receive as the SSE event id: a
//! browser that reconnects sends `Last-Event-ID` and gets exactly the changes after it from
//! the recent-changes buffer, or one resync (the whole list) when that seq has left the
//! buffer. Nothing is missed and nothing is applied twice.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use countersign_client::{pb, Client, ClientError, WatchItem, WatchOptions};
use tokio::sync::{broadcast, watch};

use crate::config::CHANNEL;

/// How many recent changes a reconnecting page can resume from.
const RECENT_CHANGES: usize = 4096;

/// One change of the pending set.
#[derive(Debug)]
pub struct Change {
    /// The server's event seq (for a resync: the snapshot's head).
    pub seq: u64,
    pub kind: ChangeKind,
}

#[derive(Debug)]
pub enum ChangeKind {
    /// The approval as it is now (pending or not: a page showing it updates in place).
    Approval(Arc<pb::Approval>),
    /// The pending set was replaced (a watch snapshot): pages reload their list.
    Resync,
}

/// What a page resuming after a seq gets first.
pub enum Resume {
    /// The changes after the seq, in order.
    Changes(Vec<Arc<Change>>),
    /// The seq is no longer buffered: start from the whole pending set.
    Resync(u64),
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Arc<pb::Approval>>,
    /// Seq of the last applied change.
    seq: u64,
    recent: VecDeque<Arc<Change>>,
    /// Whether the first snapshot arrived.
    ready: bool,
}

/// Shared by the watch task and every request.
pub struct Live {
    state: RwLock<State>,
    changes: broadcast::Sender<Arc<Change>>,
    /// Whether the watch is connected to the server: while it is not, pages say that what
    /// they show may be out of date.
    linked: watch::Sender<bool>,
}

impl Default for Live {
    fn default() -> Self {
        Live {
            state: RwLock::default(),
            changes: broadcast::channel(RECENT_CHANGES).0,
            linked: watch::Sender::new(false),
        }
    }
}

impl Live {
    /// Every pending approval and the seq they are current at.
    pub fn pending(&self) -> (Vec<Arc<pb::Approval>>, u64) {
        let state = self.read();
        (state.pending.values().cloned().collect(), state.seq)
    }

    /// Whether the first snapshot has arrived.
    pub fn is_ready(&self) -> bool {
        self.read().ready
    }

    /// Whether the inbox is connected to the server now.
    pub fn is_linked(&self) -> bool {
        *self.linked.borrow()
    }

    /// Follows [`Live::is_linked`].
    pub fn link(&self) -> watch::Receiver<bool> {
        self.linked.subscribe()
    }

    /// Live changes from now on, and what to replay first for a page that has seen `after`.
    /// Subscribing before reading the buffer means no change falls between the two; the
    /// caller skips any change at or below the last seq it sent.
    pub fn subscribe(&self, after: u64) -> (broadcast::Receiver<Arc<Change>>, Resume) {
        let receiver = self.changes.subscribe();
        let state = self.read();
        let buffered = state
            .recent
            .front()
            .is_some_and(|oldest| oldest.seq <= after);
        let resume = if after > state.seq || !buffered {
            Resume::Resync(state.seq)
        } else {
            Resume::Changes(
                state
                    .recent
                    .iter()
                    .filter(|change| change.seq > after)
                    .cloned()
                    .collect(),
            )
        };
        (receiver, resume)
    }

    /// Replaces the pending set with a snapshot taken at `seq`.
    pub fn apply_snapshot(&self, approvals: Vec<pb::Approval>, seq: u64) {
        let mut state = self.write();
        state.pending = approvals
            .into_iter()
            .map(|approval| (approval.id.clone(), Arc::new(approval)))
            .collect();
        state.ready = true;
        // A resync invalidates what pages hold: the buffer restarts from it.
        state.recent.clear();
        self.publish(&mut state, seq, ChangeKind::Resync);
    }

    /// Applies one event carrying the approval's current state.
    pub fn apply_event(&self, seq: u64, approval: pb::Approval) {
        let mut state = self.write();
        if seq <= state.seq {
            return;
        }
        let approval = Arc::new(approval);
        if approval.state() == pb::ApprovalState::Pending {
            state
                .pending
                .insert(approval.id.clone(), Arc::clone(&approval));
        } else {
            state.pending.remove(&approval.id);
        }
        self.publish(&mut state, seq, ChangeKind::Approval(approval));
    }

    fn publish(&self, state: &mut State, seq: u64, kind: ChangeKind) {
        let change = Arc::new(Change { seq, kind });
        state.seq = seq;
        if state.recent.len() == RECENT_CHANGES {
            state.recent.pop_front();
        }
        state.recent.push_back(Arc::clone(&change));
        // No page listening is fine.
        let _ = self.changes.send(change);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Keeps `live` current from the server until the watch fails for good (bad token).
pub async fn follow(client: Client, live: Arc<Live>) -> Result<(), ClientError> {
    let mut watch = client.watch(WatchOptions::channel(CHANNEL));
    let mut connection = watch.connection();
    let linked = live.linked.clone();
    // Ends with the watch (its sender is dropped).
    tokio::spawn(async move {
        while connection.changed().await.is_ok() {
            let up = *connection.borrow_and_update();
            if linked.send_replace(up) && !up {
                tracing::warn!("lost the countersign server; open pages say so until it is back");
            }
        }
    });
    loop {
        match watch.next().await? {
            WatchItem::Snapshot(approvals) => {
                let seq = watch.cursor().map_or(0, |cursor| cursor.seq);
                tracing::info!(pending = approvals.len(), seq, "inbox snapshot");
                live.apply_snapshot(approvals, seq);
            }
            WatchItem::Event(event) => {
                if let Some(approval) = event.approval {
                    live.apply_event(event.seq, approval);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(id: &str, state: pb::ApprovalState) -> pb::Approval {
        pb::Approval {
            id: id.into(),
            state: state.into(),
            ..Default::default()
        }
    }

    fn seqs(resume: Resume) -> Vec<u64> {
        match resume {
            Resume::Changes(changes) => changes.iter().map(|c| c.seq).collect(),
            Resume::Resync(seq) => vec![u64::MAX, seq],
        }
    }

    #[test]
    fn a_resuming_page_gets_exactly_the_changes_after_its_seq() {
        let live = Live::default();
        live.apply_snapshot(vec![approval("a", pb::ApprovalState::Pending)], 10);
        live.apply_event(11, approval("b", pb::ApprovalState::Pending));
        live.apply_event(12, approval("a", pb::ApprovalState::Approved));
        live.apply_event(12, approval("a", pb::ApprovalState::Pending));
        assert_eq!(seqs(live.subscribe(10).1), vec![11, 12]);
        assert_eq!(seqs(live.subscribe(11).1), vec![12]);
        assert_eq!(seqs(live.subscribe(12).1), Vec::<u64>::new());
        // Older than the buffer, or from another server history: the whole list again.
        assert_eq!(seqs(live.subscribe(3).1), vec![u64::MAX, 12]);
        assert_eq!(seqs(live.subscribe(99).1), vec![u64::MAX, 12]);
        let (pending, seq) = live.pending();
        assert_eq!(seq, 12);
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].id, "b");
    }
}
