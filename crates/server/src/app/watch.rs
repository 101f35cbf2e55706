//! `WatchApprovals` as a use case: snapshot, then stored events after the cursor, then live events, with no
//! gap and no duplicate at the hand-over.
//!
//! The stream subscribes to the hub *before* it reads the store, so every event committed
//! after that read is also in its subscription; events it already sent from the store are
//! skipped by seq. Each stream has a bounded buffer and never makes the writer or another
//! stream wait: when its consumer falls `buffer_events` behind on live events, the stream
//! ends with a resource-exhausted error naming the seq to resume after. Replay from the store waits
//! for the consumer instead, since it holds nothing up.
//!
//! A cursor is (history id, seq): every item carries the log's history id, and a cursor of
//! another history (read before a restore or a rechain) is answered like one ahead of the
//! log, since the seqs after the restored log's head name other events than the ones it read.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::fields::validate_channel;
use countersign_core::{Approval, Error as DomainError, Millis};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::shared::App;
use super::AppError;
use crate::caller::Caller;
use crate::config::Role;
use crate::store::hub::Hub;
use crate::store::{now_millis, Store, StoredEvent};

const REPLAY_PAGE: u32 = 500;

/// One item of a watch, in the order its consumer sees them.
pub(crate) enum WatchItem {
    /// A pending approval of the snapshot.
    Snapshot { approval: Box<Approval>, at: Millis },
    /// The snapshot is complete; what follows comes after `head_seq`.
    SnapshotComplete { head_seq: i64, at: Millis },
    /// A committed event routed to the channel.
    Event(Arc<StoredEvent>),
    /// Nothing for a heartbeat interval; every matching event up to `examined` was sent.
    Heartbeat { examined: i64, at: Millis },
}

/// A started watch: its items, then the error it ended with, if it did not end quietly.
pub(crate) struct Watch {
    /// The event log's history id, carried by every item.
    pub history: String,
    pub items: mpsc::Receiver<WatchItem>,
    pub end: oneshot::Receiver<AppError>,
}

struct Settings {
    heartbeat: Duration,
    buffer_events: usize,
}

/// Where the stream starts.
pub(crate) enum Start {
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
    /// End with this error (after the events already buffered).
    Failed(AppError),
}

struct Stream {
    channel: String,
    out: mpsc::Sender<WatchItem>,
    shutdown: watch::Receiver<bool>,
    /// The highest seq this stream has examined: every matching event up to it was sent.
    examined: i64,
}

impl Stream {
    /// Queues one live item without waiting; a full buffer ends the stream.
    fn push(&mut self, item: WatchItem) -> Result<(), Stop> {
        self.out.try_send(item).map_err(|e| match e {
            mpsc::error::TrySendError::Closed(_) => Stop::Quiet,
            mpsc::error::TrySendError::Full(_) => Stop::Failed(AppError::Domain(DomainError::ResourceExhausted(format!(
                "watch consumer is too slow: more than its buffer of events waiting; resume with after_seq = {}",
                self.examined
            )))),
        })
    }

    /// Queues one replayed item, waiting for room: replay holds up no one else.
    async fn push_waiting(&mut self, item: WatchItem) -> Result<(), Stop> {
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

    fn offer_live(&mut self, event: &Arc<StoredEvent>) -> Result<(), Stop> {
        if self.wants(event) {
            // Marked examined only once queued, so the resume hint stays exact.
            self.push(WatchItem::Event(event.clone()))?;
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
                .map_err(|e| Stop::Failed(e.into()))?;
            if page.is_empty() {
                return Ok(());
            }
            for event in page {
                if self.wants(&event) {
                    let seq = event.seq;
                    self.push_waiting(WatchItem::Event(Arc::new(event))).await?;
                    self.examined = seq;
                }
            }
        }
    }
}

/// Starts the stream, once the request is validated.
async fn start_watch(
    store: Store,
    hub: &Hub,
    channel: String,
    start: Start,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
) -> Result<Watch, AppError> {
    let live = hub.subscribe();
    let history = store.history().to_owned();
    let examined = match &start {
        Start::After {
            seq,
            history: Some(read_from),
        } if *read_from != history => {
            return Err(AppError::CursorOutOfRange(format!(
                "after_seq {seq} was read from another history of the event log (restored or re-chained since; this log's history_id is {history}), so it is taken as ahead of the event log; re-list with include_snapshot"
            )));
        }
        &Start::After { seq, .. } => {
            let (head, oldest) = store.log_bounds().await?;
            if seq > head {
                return Err(AppError::CursorOutOfRange(format!(
                    "after_seq {seq} is ahead of the event log (head seq {head}); re-list with include_snapshot"
                )));
            }
            if seq + 1 < oldest {
                return Err(AppError::CursorOutOfRange(format!(
                    "after_seq {seq} is older than the oldest retained event (seq {oldest}); re-list with include_snapshot"
                )));
            }
            seq
        }
        Start::Now => store.log_bounds().await?.0,
        Start::Snapshot => 0,
    };
    let (out, items) = mpsc::channel(settings.buffer_events.max(1));
    let (end_tx, end) = oneshot::channel::<AppError>();
    let mut stream = Stream {
        channel,
        out,
        shutdown,
        examined,
    };
    let snapshot = matches!(start, Start::Snapshot);
    tokio::spawn(async move {
        let stop = run(&mut stream, &store, live, snapshot, settings.heartbeat).await;
        if let Stop::Failed(error) = stop {
            let _ = end_tx.send(error);
        }
    });
    Ok(Watch {
        history,
        items,
        end,
    })
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
            Err(e) => return Stop::Failed(e.into()),
        };
        for approval in snap.pending {
            let item = WatchItem::Snapshot {
                approval: Box::new(approval),
                at: now_millis(),
            };
            if let Err(stop) = stream.push_waiting(item).await {
                return stop;
            }
        }
        let complete = WatchItem::SnapshotComplete {
            head_seq: snap.head_seq,
            at: now_millis(),
        };
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
                let beat = WatchItem::Heartbeat { examined: stream.examined, at: now_millis() };
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

/// The longest history id a watch request may name (the server's are UUIDs, 36 characters).
const MAX_HISTORY_ID_CHARS: usize = 64;

impl App {
    /// Starts a watch of `channel`: checks the caller may serve it and that the start
    /// asked for makes sense (`after_seq` 0: now or, with `include_snapshot`, a snapshot;
    /// `history_id`: the log `after_seq` was read from, empty when the client does not say).
    pub async fn watch(
        &self,
        caller: &Caller,
        channel: String,
        after_seq: u64,
        history_id: String,
        include_snapshot: bool,
    ) -> Result<Watch, AppError> {
        caller.allow("WatchApprovals", &[Role::Worker])?;
        let channel = caller.channel_filter(channel)?;
        if !channel.is_empty() {
            validate_channel("channel", &channel)?;
        }
        let after_seq = i64::try_from(after_seq)
            .map_err(|_| DomainError::invalid("after_seq", "is out of range"))?;
        if history_id.chars().count() > MAX_HISTORY_ID_CHARS {
            return Err(DomainError::invalid(
                "history_id",
                format!("is longer than {MAX_HISTORY_ID_CHARS} characters: send the one the watch's events carry"),
            )
            .into());
        }
        let start = match (include_snapshot, after_seq) {
            (true, 0) => Start::Snapshot,
            (true, _) => return Err(DomainError::invalid(
                "include_snapshot",
                "cannot be combined with after_seq: a snapshot restarts the stream from the head",
            )
            .into()),
            (false, 0) => Start::Now,
            (false, seq) => Start::After {
                seq,
                history: Some(history_id).filter(|history| !history.is_empty()),
            },
        };
        let config = &self.config().watch;
        let settings = Settings {
            heartbeat: Duration::from_millis(config.heartbeat_interval_ms),
            buffer_events: config.buffer_events,
        };
        start_watch(
            self.store().clone(),
            self.hub(),
            channel,
            start,
            settings,
            self.shutdown(),
        )
        .await
    }
}
