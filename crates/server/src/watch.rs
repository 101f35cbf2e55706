//! `WatchApprovals`: snapshot, then stored events after the cursor, then live events, with no
//! gap and no duplicate at the hand-over.
//!
//! The stream subscribes to the hub *before* it reads the store, so every event committed
//! after that read is also in its subscription; events it already sent from the store are
//! skipped by seq. Each stream has a bounded buffer and never makes the writer or another
//! stream wait: when its consumer falls `buffer_events` behind on live events, the stream
//! ends with RESOURCE_EXHAUSTED naming the seq to resume after. Replay from the store waits
//! for the consumer instead, since it holds nothing up.
//!
//! A cursor is (history id, seq): every item carries the log's history id, and a cursor of
//! another history (read before a restore or a rechain) is answered like one ahead of the
//! log, since the seqs after the restored log's head name other events than the ones it read.

use std::pin::Pin;

use std::sync::Arc;
use std::time::Duration;

use countersign_proto::v1 as pb;
use futures::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::convert::{approval_to_pb, event_to_pb, timestamp};
use crate::error::AppError;
use crate::hub::Hub;
use crate::store::{now_millis, Store, StoredEvent};

const REPLAY_PAGE: u32 = 500;

pub type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

pub struct WatchSettings {
    pub heartbeat: Duration,
    pub buffer_events: usize,
}

/// Where the stream starts.
pub enum Start {
    /// Send the pending approvals of the channel, then continue after the snapshot's head.
    Snapshot,
    /// Replay stored events after `seq`, then continue live. `history`: the log the seq was
    /// read from, when the client said.
    After { seq: i64, history: Option<String> },
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
    out: mpsc::Sender<pb::ApprovalEvent>,
    shutdown: watch::Receiver<bool>,
    /// The highest seq this stream has examined: every matching event up to it was sent.
    examined: i64,
    /// The log's history id, carried by every item.
    history: String,
}

impl Stream {
    /// Queues one live item without waiting; a full buffer ends the stream.
    fn push(&mut self, item: pb::ApprovalEvent) -> Result<(), Stop> {
        self.out.try_send(item).map_err(|e| match e {
            mpsc::error::TrySendError::Closed(_) => Stop::Quiet,
            mpsc::error::TrySendError::Full(_) => Stop::Status(Status::resource_exhausted(format!(
                "watch consumer is too slow: more than its buffer of events waiting; resume with after_seq = {}",
                self.examined
            ))),
        })
    }

    /// Queues one replayed item, waiting for room: replay holds up no one else.
    async fn push_waiting(&mut self, item: pb::ApprovalEvent) -> Result<(), Stop> {
        tokio::select! {
            sent = self.out.send(item) => sent.map_err(|_| Stop::Quiet),
            _ = self.shutdown.changed() => Err(Stop::Quiet),
        }
    }

    /// Whether `event` is new to this stream and shown on its channel. Advances the cursor
    /// past events of other channels.
    fn wants(&mut self, event: &StoredEvent) -> bool {
        if event.seq <= self.examined {
            return false;
        }
        if event.approval.is_routed_to(&self.channel) {
            return true;
        }
        self.examined = event.seq;
        false
    }

    fn offer_live(&mut self, event: &StoredEvent) -> Result<(), Stop> {
        if self.wants(event) {
            // Marked examined only once queued, so the resume hint stays exact.
            self.push(self.item(event))?;
            self.examined = event.seq;
        }
        Ok(())
    }

    /// Sends stored events after `examined` until the store has no more.
    async fn catch_up(&mut self, store: &Store) -> Result<(), Stop> {
        loop {
            let page = store
                .events_after(self.examined, REPLAY_PAGE)
                .await
                .map_err(|e| Stop::Status(Status::from(AppError::from(e))))?;
            if page.is_empty() {
                return Ok(());
            }
            for event in &page {
                if self.wants(event) {
                    self.push_waiting(self.item(event)).await?;
                    self.examined = event.seq;
                }
            }
        }
    }

    fn item(&self, event: &StoredEvent) -> pb::ApprovalEvent {
        pb::ApprovalEvent {
            history_id: self.history.clone(),
            ..event_to_pb(event)
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
            detail: String::new(),
            history_id: self.history.clone(),
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
    let history = store.history().to_owned();
    let examined = match &start {
        Start::After {
            seq,
            history: Some(read_from),
        } if *read_from != history => {
            return Err(Status::out_of_range(format!(
                "after_seq {seq} was read from another history of the event log (restored or re-chained since; this log's history_id is {history}), so it is taken as ahead of the event log; re-list with include_snapshot"
            )));
        }
        &Start::After { seq, .. } => {
            let (head, oldest) = store.log_bounds().await.map_err(AppError::from)?;
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
        Start::Now => store.log_bounds().await.map_err(AppError::from)?.0,
        Start::Snapshot => 0,
    };
    let (out, receiver) = mpsc::channel(settings.buffer_events.max(1));
    let (end_tx, end_rx) = oneshot::channel::<Status>();
    let mut stream = Stream {
        channel,
        out,
        shutdown,
        examined,
        history,
    };
    let snapshot = matches!(start, Start::Snapshot);
    tokio::spawn(async move {
        let stop = run(&mut stream, &store, live, snapshot, settings.heartbeat).await;
        if let Stop::Status(status) = stop {
            let _ = end_tx.send(status);
        }
    });
    // The buffered events first, then the status the stream ended with, if any.
    let events = ReceiverStream::new(receiver).map(Ok);
    let end = futures::stream::once(end_rx).filter_map(|ended| async move { ended.ok().map(Err) });
    Ok(Box::pin(events.chain(end)))
}

async fn run(
    stream: &mut Stream,
    store: &Store,
    mut live: broadcast::Receiver<Arc<StoredEvent>>,
    snapshot: bool,
    heartbeat: Duration,
) -> Stop {
    let mut shutdown = stream.shutdown.clone();
    if snapshot {
        let snap = match store.snapshot(&stream.channel).await {
            Ok(snap) => snap,
            Err(e) => return Stop::Status(Status::from(AppError::from(e))),
        };
        for approval in &snap.pending {
            let mut item = stream.marker(pb::EventKind::Snapshot, 0);
            item.approval = Some(approval_to_pb(approval));
            if let Err(stop) = stream.push_waiting(item).await {
                return stop;
            }
        }
        let complete = stream.marker(pb::EventKind::SnapshotComplete, snap.head_seq);
        if let Err(stop) = stream.push_waiting(complete).await {
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
                // A full buffer needs no heartbeat: the consumer has events to read.
                let beat = stream.marker(pb::EventKind::Heartbeat, stream.examined);
                if let Err(mpsc::error::TrySendError::Closed(_)) = stream.out.try_send(beat) {
                    return Stop::Quiet;
                }
            }
            received = live.recv() => {
                let result = match received {
                    Ok(event) => stream.offer_live(&event),
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
