//! Fan-out of committed events to watch streams and waiters.
//!
//! A broadcast ring: publishing never waits for a subscriber. A subscriber that falls more
//! than the ring's capacity behind learns it (`Lagged`) instead of silently missing events.

use std::sync::Arc;

use tokio::sync::broadcast;

use super::StoredEvent;

#[derive(Clone)]
pub struct Hub {
    sender: broadcast::Sender<Arc<StoredEvent>>,
}

impl Hub {
    pub fn new(capacity: usize) -> Hub {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Hub { sender }
    }

    /// Called by the store writer after the event's transaction committed.
    pub(crate) fn publish(&self, event: StoredEvent) {
        // No subscriber is not an error: the event is in the log.
        let _ = self.sender.send(Arc::new(event));
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.sender.subscribe()
    }
}
