//! `WatchApprovals`: snapshot, then stored events after the cursor, then live events, with no
//! gap and no duplicate at the hand-over.
//!
//! The stream subscribes to the hub *before* it reads the store, so every event committed
//! after that read is also in its subscription; events it already sent from the store are
//! skipped by seq. Each stream has a bounded buffer and never makes the writer or another
//! stream wait: when its consumer falls `buffer_events` behind, the stream ends with
//! RESOURCE_EXHAUSTED naming the seq to resume after.

use std::sync::Arc;
use std::time::Duration;

use countersign_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::convert::{approval_to_pb, event_to_pb, timestamp};
use crate::hub::Hub;
use crate::store::{now_millis, Store, StoredEvent};

const REPLAY_PAGE: u32 = 500;

pub type WatchStream = ReceiverStream<Result<pb::ApprovalEvent, Status>>;

pub struct WatchSettings {
    pub heartbeat: Duration,
    pub buffer_events: usize,
}

/// Where the stream starts.
pub enum Start {
    /// Send the pending approvals of the channel, then continue after the snapshot's head.
    Snapshot,
    /// Replay stored events after this seq, then continue live.
    After(i64),
    /// Only what is committed from now on.
    Now,
}

/// Why a stream stopped early.
enum Stop {
    /// The consumer went away or the server is shutting down: end quietly.
    Quiet,
    /// End with this status (after the events already buffered).
    Status(Status),
}

struct Stream {
    channel: String,
    out: mpsc::Sender<Result<pb::ApprovalEvent, Status>>,
    /// The highest seq this stream has examined: every matching event up to it was sent.
    examined: i64,
}

impl Stream {
    /// Queues one item without waiting. One slot is always kept for the final status.
    fn push(&mut self, item: pb::ApprovalEvent) -> Result<(), Stop> {
        if self.out.is_closed() {
            return Err(Stop::Quiet);
        }
        if self.out.capacity() <= 1 {
            return Err(Stop::Status(Status::resource_exhausted(format!(
                "watch consumer is too slow: more than its buffer of events waiting; resume with after_seq = {}",
                self.examined
            ))));
        }
        self.out.try_send(Ok(item)).map_err(|_| Stop::Quiet)
    }

    fn offer(&mut self, event: &StoredEvent) -> Result<(), Stop> {
        if event.seq <= self.examined {
            return Ok(());
        }
        if event.approval.is_routed_to(&self.channel) {
            // Mark as examined only once it is queued, so the resume hint stays exact.
            self.push(event_to_pb(event))?;
        }
        self.examined = event.seq;
        Ok(())
    }

    /// Sends stored events after `examined` until the store has no more.
    async fn catch_up(&mut self, store: &Store) -> Result<(), Stop> {
        loop {
            let page = store
                .events_after(self.examined, REPLAY_PAGE)
                .await
                .map_err(|e| Stop::Status(crate::error::status_of(e)))?;
            if page.is_empty() {
                return Ok(());
            }
            for event in &page {
                self.offer(event)?;
            }
        }
    }

    fn marker(&self, kind: pb::EventKind, seq: i64) -> pb::ApprovalEvent {
        pb::ApprovalEvent {
            seq: seq.max(0) as u64,
            kind: kind as i32,
            approval: None,
            at: Some(timestamp(now_millis())),
            decision: None,
            delivery: None,
        }
    }
}

/// Starts a watch stream. Validation of the request happens before this.
pub async fn start(
    store: Store,
    hub: &Hub,
    channel: String,
    start: Start,
    settings: WatchSettings,
    shutdown: watch::Receiver<bool>,
) -> Result<WatchStream, Status> {
    let live = hub.subscribe();
    let examined = match start {
        Start::After(seq) => {
            let (head, oldest) = store.log_bounds().await.map_err(crate::error::status_of)?;
            if seq > head {
                return Err(Status::out_of_range(format!(
                    "after_seq {seq} is ahead of the event log (head seq {head}); re-list with include_snapshot"
                )));
            }
            if seq + 1 < oldest {
                return Err(Status::out_of_range(format!(
                    "after_seq {seq} is older than the oldest retained event (seq {oldest}); re-list with include_snapshot"
                )));
            }
            seq
        }
        Start::Now => store.log_bounds().await.map_err(crate::error::status_of)?.0,
        Start::Snapshot => 0,
    };
    let (out, receiver) = mpsc::channel(settings.buffer_events.max(2));
    let mut stream = Stream {
        channel,
        out,
        examined,
    };
    let snapshot = matches!(start, Start::Snapshot);
    tokio::spawn(async move {
        let stop = run(&mut stream, &store, live, snapshot, settings.heartbeat, shutdown).await;
        if let Stop::Status(status) = stop {
            // The slot kept free in `push` makes room for this.
            let _ = stream.out.try_send(Err(status));
        }
    });
    Ok(ReceiverStream::new(receiver))
}

async fn run(
    stream: &mut Stream,
    store: &Store,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
    snapshot: bool,
    heartbeat: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Stop {
    if snapshot {
        let snap = match store.snapshot(&stream.channel).await {
            Ok(snap) => snap,
            Err(e) => return Stop::Status(crate::error::status_of(e)),
        };
        for approval in &snap.pending {
            let mut item = stream.marker(pb::EventKind::Snapshot, 0);
            item.approval = Some(approval_to_pb(approval));
            if let Err(stop) = stream.push(item) {
                return stop;
            }
        }
        let complete = stream.marker(pb::EventKind::SnapshotComplete, snap.head_seq);
        if let Err(stop) = stream.push(complete) {
            return stop;
        }
        stream.examined = snap.head_seq;
    }
    if let Err(stop) = stream.catch_up(store).await {
        return stop;
    }

    let mut idle = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Stop::Quiet,
            _ = stream.out.closed() => return Stop::Quiet,
            _ = idle.tick() => {
                let beat = stream.marker(pb::EventKind::Heartbeat, stream.examined);
                if let Err(stop) = stream.push(beat) {
                    return stop;
                }
            }
            received = live.recv() => {
                let result = match received {
                    Ok(event) => stream.offer(&event),
                    // Fell behind the hub's ring (not the consumer's fault): the log has it all.
                    Err(broadcast::error::RecvError::Lagged(_)) => stream.catch_up(store).await,
                    Err(broadcast::error::RecvError::Closed) => return Stop::Quiet,
                };
                if let Err(stop) = result {
                    return stop;
                }
                idle.reset();
            }
        }
    }
}
