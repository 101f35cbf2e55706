use std::time::Duration;

use countersign_proto::v1 as pb;
use pb::EventKind;
use tokio::time::Instant;
use tonic::{Code, Status, Streaming};

use crate::backoff::{log_retry, Backoff};
use crate::connection::Connector;
use crate::error::ClientError;

/// What to watch and how patiently.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Approvals routed to this channel, and those with no routes. Empty: every approval.
    pub channel: String,
    /// A connection that delivers nothing (not even a heartbeat) for this long is considered
    /// dead and replaced. Must exceed the server's heartbeat interval.
    pub heartbeat_timeout: Duration,
    /// The longest pause between reconnection attempts.
    pub max_backoff: Duration,
    /// Start after this cursor (one the caller persisted) instead of with a snapshot: the
    /// first item is then the event after it. When the server cannot resume from it
    /// (`OUT_OF_RANGE`: no longer retained, ahead of the log, or read from another history of
    /// the log) the watch takes a snapshot as usual. `None` or a seq of 0: snapshot.
    pub resume_after: Option<WatchCursor>,
}

/// Where a watch stands: the seq of the last item delivered and the history id of the event
/// log it belongs to. A restore or `audit rechain` gives the log a new history id; the
/// restored log's seqs after its head then name other events than the ones read before, so a
/// persisted cursor must keep both, and the server answers a cursor of another history like
/// one ahead of the log (the watch re-lists).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchCursor {
    /// `ApprovalEvent.history_id`; empty from a server without history ids (then not checked).
    pub history_id: String,
    pub seq: u64,
}

impl WatchOptions {
    /// Watch `channel` with a 30 s heartbeat timeout and at most 10 s between reconnects.
    pub fn channel(channel: impl Into<String>) -> Self {
        WatchOptions {
            channel: channel.into(),
            heartbeat_timeout: Duration::from_secs(30),
            max_backoff: Duration::from_secs(10),
            resume_after: None,
        }
    }

    /// The same watch, started after `cursor` instead of with a snapshot (see
    /// [`WatchOptions::resume_after`]).
    pub fn resume_after(self, cursor: Option<WatchCursor>) -> Self {
        WatchOptions {
            resume_after: cursor,
            ..self
        }
    }
}

/// One item of a [`Watch`].
// Items are handed over one at a time, never stored in bulk, so the size of an unboxed event
// costs nothing worth an extra allocation and a less direct `match` for every caller.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// First item, and again after a resync (server restart beyond retention / OUT_OF_RANGE /
    /// slow-consumer overflow when resume is impossible): every currently pending approval of
    /// the channel. The caller reconciles.
    Snapshot(Vec<pb::Approval>),
    /// A live or replayed event (never a heartbeat or snapshot marker), each seq delivered
    /// once, in order.
    Event(pb::ApprovalEvent),
}

/// A watch of the approvals of one channel that survives disconnects and server restarts.
///
/// It starts with a snapshot of the pending approvals (or, given
/// [`WatchOptions::resume_after`], right after that seq) and then delivers each event once, in
/// seq order. After a broken connection, an ended stream, a slow-consumer cut-off
/// (`RESOURCE_EXHAUSTED`) or a connection silent beyond the heartbeat timeout it reconnects
/// on a fresh connection, with exponential backoff and jitter, and resumes after the last seq
/// it delivered (skipping anything already delivered). When the server cannot resume from
/// there (`OUT_OF_RANGE`: the cursor is older than what it retains, ahead of its log, or of
/// another history of the log, after a restore) the watch takes a new snapshot and yields it
/// as [`WatchItem::Snapshot`]. A watch whose snapshot had head seq 0
/// (nothing had ever happened) cannot name a cursor and also re-snapshots after a reconnect.
///
/// ```no_run
/// use countersign_client::{Client, ClientConfig, WatchItem, WatchOptions};
///
/// # async fn run() -> Result<(), countersign_client::ClientError> {
/// let client = Client::connect(ClientConfig::new("http://127.0.0.1:50051"))?;
/// let mut watch = client.watch(WatchOptions::channel("telegram"));
/// loop {
///     match watch.next().await? {
///         WatchItem::Snapshot(pending) => {
///             // Reconcile: make sure each pending approval has its message.
///             println!("{} pending", pending.len());
///         }
///         WatchItem::Event(event) => println!("seq {} {:?}", event.seq, event.kind()),
///     }
/// }
/// # }
/// ```
pub struct Watch {
    connector: Connector,
    options: WatchOptions,
    /// The seq of the last delivered item; `None` until a snapshot completes (or the seq to
    /// resume after, when started from one).
    cursor: Option<u64>,
    /// The history id of the log `cursor` belongs to.
    history_id: String,
    stream: Option<Streaming<pb::ApprovalEvent>>,
    /// Snapshot items of the stream being read, yielded together once complete.
    snapshot: Vec<pb::Approval>,
    backoff: Backoff,
    /// When the next connection attempt may start (kept here so that a `next()` dropped
    /// mid-pause does not restart the pause).
    retry_at: Option<Instant>,
    /// When the current stream last delivered anything.
    last_message_at: Instant,
    /// Whether a stream is open now (see [`Watch::connection`]).
    connected: tokio::sync::watch::Sender<bool>,
}

impl Watch {
    pub(crate) fn new(connector: Connector, options: WatchOptions) -> Self {
        Watch {
            connector,
            backoff: Backoff::new(options.max_backoff),
            cursor: options
                .resume_after
                .as_ref()
                .map(|cursor| cursor.seq)
                .filter(|&seq| seq > 0),
            history_id: options
                .resume_after
                .as_ref()
                .map(|cursor| cursor.history_id.clone())
                .unwrap_or_default(),
            options,
            stream: None,
            snapshot: Vec::new(),
            retry_at: None,
            last_message_at: Instant::now(),
            connected: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Follows whether the watch has a stream open to the server: false until the first one
    /// opens, while it reconnects, and after a fatal error. A service can tell its users that
    /// what it shows may be out of date while the server is unreachable.
    pub fn connection(&self) -> tokio::sync::watch::Receiver<bool> {
        self.connected.subscribe()
    }

    /// The seq of the last delivered event (or of the last snapshot's head) and its log's
    /// history id; `None` before the first snapshot. Persist both to resume later.
    pub fn cursor(&self) -> Option<WatchCursor> {
        self.cursor.map(|seq| WatchCursor {
            history_id: self.history_id.clone(),
            seq,
        })
    }

    /// The next snapshot or event. Reconnects on its own; returns `Err` only for what retrying
    /// cannot fix: `UNAUTHENTICATED`, `PERMISSION_DENIED`, `INVALID_ARGUMENT`,
    /// `UNIMPLEMENTED`. After an `Err` the watch can be polled again (it then reconnects).
    ///
    /// Cancel-safe: a `next()` dropped before completing (e.g. in `tokio::select!`) loses no
    /// item.
    pub async fn next(&mut self) -> Result<WatchItem, ClientError> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                self.connect().await?;
                continue;
            };
            let silent_until = self.last_message_at + self.options.heartbeat_timeout;
            match tokio::time::timeout_at(silent_until, stream.message()).await {
                Ok(Ok(Some(event))) => {
                    self.last_message_at = Instant::now();
                    self.backoff.reset();
                    if let Some(item) = self.accept(event) {
                        return Ok(item);
                    }
                }
                Ok(Ok(None)) => {
                    tracing::info!(channel = %self.options.channel, cursor = ?self.cursor, "watch stream ended; reconnecting");
                    self.schedule_reconnect();
                }
                Ok(Err(status)) => self.fail(status)?,
                Err(_) => {
                    log_retry!(
                        self.backoff,
                        channel = %self.options.channel,
                        cursor = ?self.cursor,
                        silent_for = ?self.options.heartbeat_timeout,
                        "watch connection silent past the heartbeat timeout; reconnecting"
                    );
                    self.schedule_reconnect();
                }
            }
        }
    }

    /// Opens a stream on a fresh connection (the old one may be dead without knowing it):
    /// resuming after the cursor, or with a snapshot when there is none to resume from.
    async fn connect(&mut self) -> Result<(), ClientError> {
        if let Some(retry_at) = self.retry_at {
            tokio::time::sleep_until(retry_at).await;
        }
        // after_seq 0 means "from now on", not "from the beginning": a cursor of 0 cannot
        // resume without a gap, so it takes a snapshot instead.
        let resume_after = self.cursor.filter(|&seq| seq > 0);
        let request = pb::WatchApprovalsRequest {
            after_seq: resume_after.unwrap_or(0),
            channel: self.options.channel.clone(),
            include_snapshot: resume_after.is_none(),
            history_id: match resume_after {
                Some(_) => self.history_id.clone(),
                None => String::new(),
            },
        };
        tracing::debug!(channel = %request.channel, after_seq = request.after_seq, snapshot = request.include_snapshot, "opening watch");
        let mut rpc = self.connector.fresh_rpc();
        let opened =
            tokio::time::timeout(self.options.heartbeat_timeout, rpc.watch_approvals(request))
                .await;
        match opened {
            Ok(Ok(response)) => {
                self.stream = Some(response.into_inner());
                self.snapshot.clear();
                self.retry_at = None;
                self.last_message_at = Instant::now();
                self.connected
                    .send_if_modified(|connected| !std::mem::replace(connected, true));
                Ok(())
            }
            Ok(Err(status)) => self.fail(status),
            Err(_) => {
                log_retry!(self.backoff, channel = %self.options.channel, "opening the watch timed out; retrying");
                self.schedule_reconnect();
                Ok(())
            }
        }
    }

    /// Turns one message into at most one item, advancing the cursor.
    fn accept(&mut self, event: pb::ApprovalEvent) -> Option<WatchItem> {
        // Resumed from a cursor without a history id (the server did not check it): the
        // stream's is the one to resume with from now on.
        if self.history_id.is_empty() {
            self.history_id.clone_from(&event.history_id);
        }
        match event.kind() {
            EventKind::Snapshot => {
                if let Some(approval) = event.approval {
                    self.snapshot.push(approval);
                }
                None
            }
            EventKind::SnapshotComplete => {
                self.cursor = Some(event.seq);
                self.history_id = event.history_id;
                tracing::debug!(channel = %self.options.channel, head = event.seq, pending = self.snapshot.len(), "watch snapshot complete");
                Some(WatchItem::Snapshot(std::mem::take(&mut self.snapshot)))
            }
            EventKind::Heartbeat => {
                // The server has examined everything up to this seq for this stream: a safe
                // cursor even when none of it was for our channel.
                if let Some(cursor) = self.cursor.as_mut() {
                    *cursor = (*cursor).max(event.seq);
                }
                None
            }
            _ => match self.cursor {
                Some(cursor) if event.seq <= cursor => {
                    tracing::debug!(
                        seq = event.seq,
                        cursor,
                        "skipping an event already delivered"
                    );
                    None
                }
                _ => {
                    self.cursor = Some(event.seq);
                    Some(WatchItem::Event(event))
                }
            },
        }
    }

    /// Handles an error status from opening or reading the stream: fatal ones are returned,
    /// the rest schedule a reconnect.
    fn fail(&mut self, status: Status) -> Result<(), ClientError> {
        let channel = &self.options.channel;
        let message = status.message();
        match status.code() {
            Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::Unimplemented => {
                self.schedule_reconnect();
                return Err(ClientError::from(status));
            }
            Code::OutOfRange => {
                tracing::warn!(%channel, cursor = ?self.cursor, message, "watch cursor out of range; taking a new snapshot");
                self.cursor = None;
            }
            Code::ResourceExhausted => {
                tracing::warn!(%channel, cursor = ?self.cursor, message, "watch cut off as a slow consumer; resuming");
            }
            code => {
                log_retry!(self.backoff, %channel, cursor = ?self.cursor, ?code, message, "watch failed; reconnecting");
            }
        }
        self.schedule_reconnect();
        Ok(())
    }

    fn schedule_reconnect(&mut self) {
        self.connected
            .send_if_modified(|connected| std::mem::replace(connected, false));
        self.stream = None;
        self.snapshot.clear();
        self.retry_at = Some(Instant::now() + self.backoff.next_delay());
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("options", &self.options)
            .field("cursor", &self.cursor)
            .field("connected", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}
