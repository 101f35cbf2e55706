//! The loop every channel worker runs, around a [`Channel`] that holds only platform
//! operations:
//!
//! - **Watch** the channel's approvals. With a persisted [`Cursor`] a restarted worker resumes
//!   right after the last event it fully handled (every later event is replayed, so an
//!   approval resolved while it was down is corrected by its own events); without one, or when
//!   the server cannot resume from it (no longer retained, ahead of the log, or read from
//!   another history of the log: a restore), it starts with a snapshot and reconciles: every pending
//!   approval is shown, and every one the channel still shows unfinished that is no longer
//!   pending is shown as the server has it now.
//! - **Notices**: an event that changes no message (a reminder, a refused decision, the
//!   request of an approval a session grant approved at once) goes to [`Channel::notice`],
//!   in the approval's lane, after what came before it.
//! - **Lanes**: everything for one approval runs in its lane, in order; approvals run
//!   concurrently.
//! - **Rate limits**: a failure with a retry-after holds every call in the scope the channel
//!   names for it ([`Channel::rate_limit_scope`], by default the whole platform) until it has
//!   passed: other approvals' shows and notices wait too, not only the limited one.
//! - **Retries**: a failure that may pass schedules the approval on its own backoff, never
//!   before the platform's retry-after (and nothing else is tried for it meanwhile); the retry
//!   shows the approval as the server has it then. The item that led to it stays in flight for
//!   the cursor until the retry succeeds or the platform refuses for good.
//! - **Health and metrics**: with `metrics_listen` set, `/healthz` and `/metrics` are served
//!   there ([`crate::metrics`]).
//! - **Shutdown**: when asked, the work in flight may finish within the grace period; then
//!   the cursor is flushed. A worker dropped mid-flight (killed) keeps unfinished items ahead
//!   of its cursor, so the restarted worker handles them again.
//! - **Current copy before a first show**: with a cursor, a `Requested` event may be a replay
//!   of something long past (a restarted worker replays everything after its cursor), so the
//!   approval is read as the server has it now before it is shown: no request message goes out
//!   for an approval resolved meanwhile. (Without a cursor a start takes a snapshot, whose
//!   copies are current.)
//! - **Shows asked for beside the loop**: [`ShowRequests`] lets the handler of an approver's
//!   action have an approval shown in its lane now (the copy Decide answered with), or read
//!   and shown as it is now, instead of waiting for its event.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, Client, ClientError, Watch, WatchItem, WatchOptions};
use pb::EventKind;
use tokio::sync::mpsc;

use crate::approval::is_granted;
use crate::channel::Channel;
use crate::cursor::{Cursor, CursorError, Part};
use crate::lanes::Lanes;
use crate::metrics::{self, Counters, Gauges, ListenError, Metrics, ShowOutcome};
use crate::retry::{
    retry_in_line, Backoff, Classify, PlatformHold, RateLimitScope, RetrySchedule, Verdict,
};

/// How many times listing the channel's unfinished approvals is tried after a snapshot.
const UNFINISHED_ATTEMPTS: u32 = 5;
/// How many times a notice is tried (a notice past them is lost, and logged).
const NOTICE_ATTEMPTS: u32 = 5;

/// How the runtime watches, retries and stops.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// See [`WatchOptions::heartbeat_timeout`].
    pub heartbeat_timeout: Duration,
    /// See [`WatchOptions::max_backoff`].
    pub max_backoff: Duration,
    /// The backoff of an approval's retries (never shorter than the platform's retry-after).
    pub retry: Backoff,
    /// How long the work in flight may take to finish once a shutdown is asked for.
    pub shutdown_grace: Duration,
    /// Where the watch cursor is kept (it must survive restarts); `None`: every start takes a
    /// snapshot and reconciles.
    pub cursor_path: Option<PathBuf>,
    /// Where `/healthz` and `/metrics` are served (`[metrics] listen`); `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
}

/// Why the runtime stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error(transparent)]
    Cursor(#[from] CursorError),
    #[error(transparent)]
    Metrics(#[from] ListenError),
    #[error("{channel} channel: cannot list the approvals it shows unfinished: {message}")]
    Unfinished { channel: String, message: String },
}

/// What code beside the loop asks the runtime to show.
enum ShowRequest {
    /// This copy of the approval.
    Copy(Box<pb::Approval>),
    /// The approval as the server has it now.
    Current(String),
}

/// Lets code beside the loop (the handler of an approver's action on the platform) have
/// approvals shown in their lanes, like the runtime's own shows. Cloning gives another handle
/// to the same runtime; requests made before it runs wait for it.
#[derive(Clone)]
pub struct ShowRequests(mpsc::UnboundedSender<ShowRequest>);

/// The runtime's end of [`ShowRequests`], given to [`run_with_requests`].
pub struct ShowQueue(mpsc::UnboundedReceiver<ShowRequest>);

/// A handle for asking a runtime to show approvals, and the queue to run that runtime with.
pub fn show_requests() -> (ShowRequests, ShowQueue) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (ShowRequests(sender), ShowQueue(receiver))
}

impl ShowRequests {
    /// Shows this copy of the approval (one a Decide answer brought) in its lane. The channel
    /// sees it like any other copy: one older than what it shows must not undo a newer state.
    pub fn show(&self, approval: pb::Approval) {
        // Once the runtime stopped there is nothing left to show on.
        let _ = self.0.send(ShowRequest::Copy(Box::new(approval)));
    }

    /// Reads the approval as the server has it now and shows it in its lane.
    pub fn show_current(&self, approval_id: &str) {
        let _ = self.0.send(ShowRequest::Current(approval_id.to_owned()));
    }
}

/// Runs `channel` until `shutdown` completes (the work in flight then gets the grace period,
/// the cursor is flushed and `Ok` is returned) or an error that retrying cannot fix occurs.
/// Dropping the returned future stops everything at once, as a killed worker would.
pub async fn run<C: Channel>(
    client: Client,
    channel: C,
    options: RuntimeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RuntimeError> {
    let (_, queue) = show_requests();
    run_with_requests(client, channel, options, queue, shutdown).await
}

/// [`run`], also showing what is asked through the [`ShowRequests`] of `queue`.
pub async fn run_with_requests<C: Channel>(
    client: Client,
    channel: C,
    options: RuntimeOptions,
    queue: ShowQueue,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RuntimeError> {
    let (cursor, resume_after) = match &options.cursor_path {
        Some(path) => {
            let (cursor, saved) = Cursor::open(path);
            (Some(cursor), saved)
        }
        None => (None, None),
    };
    let metrics_listener = match options.metrics_listen {
        Some(listen) => Some(metrics::bind(listen).await?),
        None => None,
    };
    let metrics = Arc::new(Metrics::new(channel.name()));
    let lanes = Lanes::new();
    // The lanes' jobs hold the runtime; dropping this future stops them.
    let _stop_lanes = lanes.abort_on_drop();
    if let Some(after) = &resume_after {
        tracing::info!(
            channel = channel.name(),
            after = after.seq,
            history_id = %after.history_id,
            "resuming the watch after the persisted cursor"
        );
    }
    let watch = client.watch(WatchOptions {
        channel: channel.name().to_owned(),
        heartbeat_timeout: options.heartbeat_timeout,
        max_backoff: options.max_backoff,
        resume_after,
    });
    let connection = watch.connection();
    let runtime = Arc::new(Runtime {
        retries: RetrySchedule::new(options.retry),
        hold: PlatformHold::new(),
        client,
        channel,
        lanes: lanes.clone(),
        cursor: cursor.clone(),
        counters: metrics.counters(),
        options,
    });
    let serve_metrics = async {
        let Some(listener) = metrics_listener else {
            return std::future::pending().await;
        };
        let observed = runtime.clone();
        let gauges = Arc::new(move || Gauges {
            connected: *connection.borrow(),
            lanes_busy: observed.lanes.busy(),
            retries_waiting: observed.retries.len(),
            cursor_seq: observed.cursor.as_ref().map(Cursor::safe),
        });
        metrics::serve(listener, metrics, gauges).await
    };
    let persist = async {
        match &cursor {
            Some(cursor) => cursor.persist().await.map_err(RuntimeError::from),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = runtime.follow(watch) => result,
        // Serving ends only with an error.
        result = serve_metrics => result.map_err(RuntimeError::from),
        () = runtime.retry_due() => Ok(()),
        () = runtime.show_requested(queue) => Ok(()),
        result = persist => result,
        () = shutdown => {
            tracing::info!(channel = runtime.channel.name(), in_flight = lanes.busy(), "shutting down; finishing the work in flight");
            lanes.shutdown(runtime.options.shutdown_grace).await;
            if let Some(cursor) = &cursor {
                cursor.flush().await?;
            }
            Ok(())
        }
    }
}

struct Runtime<C> {
    client: Client,
    channel: C,
    options: RuntimeOptions,
    lanes: Lanes,
    retries: RetrySchedule,
    /// The platform's retry-after, for every call in its scope (not only the approval's).
    hold: PlatformHold,
    cursor: Option<Cursor>,
    counters: Counters,
}

/// This share of a watch item's work is over.
fn finish(part: Option<Part>) {
    if let Some(part) = part {
        part.done();
    }
}

/// Whether an event changes what an approval's message shows.
fn changes_message(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Requested
            | EventKind::DecisionRecorded
            | EventKind::Resolved
            | EventKind::Expired
            | EventKind::Cancelled
            | EventKind::Consumed
            | EventKind::Escalated
    )
}

impl<C: Channel> Runtime<C> {
    async fn follow(self: &Arc<Self>, mut watch: Watch) -> Result<(), RuntimeError> {
        loop {
            match watch.next().await? {
                WatchItem::Snapshot(pending) => {
                    let head = watch.cursor().unwrap_or_default();
                    let part = self
                        .cursor
                        .as_ref()
                        .map(|cursor| cursor.begin_snapshot(&head));
                    self.reconcile(pending, part.as_ref()).await?;
                    finish(part);
                }
                WatchItem::Event(event) => {
                    self.counters.event();
                    let part = self.begin(event.seq);
                    let kind = event.kind();
                    if let Some(approval) = &event.approval {
                        tracing::debug!(approval_id = %approval.id, seq = event.seq, ?kind, "approval event");
                        let granted = kind == EventKind::Requested && is_granted(approval);
                        if changes_message(kind) {
                            let share = part.as_ref().map(Part::share);
                            if kind == EventKind::Requested && self.cursor.is_some() {
                                self.enqueue_show_current(approval.clone(), share);
                            } else {
                                self.enqueue_show(approval.clone(), share);
                            }
                        }
                        if !changes_message(kind) || granted {
                            self.enqueue_notice(event, part.as_ref().map(Part::share));
                        }
                    }
                    finish(part);
                }
            }
        }
    }

    fn begin(&self, seq: u64) -> Option<Part> {
        self.cursor.as_ref().map(|cursor| cursor.begin(seq))
    }

    /// After a snapshot: every pending approval is shown, and every one the channel shows
    /// unfinished that is no longer pending is shown as it is now.
    async fn reconcile(
        self: &Arc<Self>,
        pending: Vec<pb::Approval>,
        part: Option<&Part>,
    ) -> Result<(), RuntimeError> {
        tracing::info!(
            channel = self.channel.name(),
            pending = pending.len(),
            "snapshot of pending approvals"
        );
        let unfinished = retry_in_line(
            self.options.retry,
            UNFINISHED_ATTEMPTS,
            self.options.retry.max,
            "listing the unfinished approvals",
            || self.limited(self.channel.unfinished()),
        )
        .await
        .map_err(|error| RuntimeError::Unfinished {
            channel: self.channel.name().to_owned(),
            message: error.to_string(),
        })?;
        for approval_id in unfinished {
            if !pending.iter().any(|approval| approval.id == approval_id) {
                self.enqueue_refresh(approval_id, part.map(Part::share));
            }
        }
        for approval in pending {
            self.enqueue_show(approval, part.map(Part::share));
        }
        Ok(())
    }

    /// Tries again the approvals whose last attempt failed for a reason that may pass.
    async fn retry_due(self: &Arc<Self>) {
        loop {
            for approval_id in self.retries.next_due().await {
                self.enqueue_refresh(approval_id, None);
            }
        }
    }

    /// Shows what [`ShowRequests`] ask for, until every handle is gone.
    async fn show_requested(self: &Arc<Self>, mut queue: ShowQueue) {
        while let Some(request) = queue.0.recv().await {
            match request {
                ShowRequest::Copy(approval) => self.enqueue_copy(*approval),
                ShowRequest::Current(approval_id) => self.enqueue_refresh(approval_id, None),
            }
        }
        std::future::pending().await
    }

    /// Shows the approval as the server has it now, or `approval` when it cannot be read.
    fn enqueue_show_current(self: &Arc<Self>, approval: pb::Approval, part: Option<Part>) {
        let runtime = self.clone();
        let key = approval.id.clone();
        self.lanes.push(&key, async move {
            let approval = match runtime.client.get_approval(&approval.id).await {
                Ok(current) => current,
                Err(error) => {
                    tracing::debug!(approval_id = %approval.id, %error, "cannot read the approval before showing it; showing the event's copy");
                    approval
                }
            };
            runtime.show(&approval).await;
            runtime.job_over(&approval.id, part);
        });
    }

    /// Shows a copy asked for beside the loop, unless the approval waits for a retry: the
    /// retry shows it as it is then, and a copy older than what failed (a Decide's answer
    /// overtaken by the watch) must not pass for its success and cancel it.
    fn enqueue_copy(self: &Arc<Self>, approval: pb::Approval) {
        let runtime = self.clone();
        let key = approval.id.clone();
        self.lanes.push(&key, async move {
            if runtime.retries.is_scheduled(&approval.id) {
                tracing::debug!(approval_id = %approval.id, "a retry is scheduled; leaving the copy to it");
                return;
            }
            runtime.show(&approval).await;
            runtime.job_over(&approval.id, None);
        });
    }

    fn enqueue_show(self: &Arc<Self>, approval: pb::Approval, part: Option<Part>) {
        let runtime = self.clone();
        let key = approval.id.clone();
        self.lanes.push(&key, async move {
            runtime.show(&approval).await;
            runtime.job_over(&approval.id, part);
        });
    }

    /// Tells the channel of an event that changes no message, retrying in the lane.
    fn enqueue_notice(self: &Arc<Self>, event: pb::ApprovalEvent, part: Option<Part>) {
        let runtime = self.clone();
        let key = event
            .approval
            .as_ref()
            .map(|approval| approval.id.clone())
            .unwrap_or_default();
        self.lanes.push(&key.clone(), async move {
            let retry = runtime.options.retry;
            let told = retry_in_line(retry, NOTICE_ATTEMPTS, retry.max, "a notice", || {
                runtime.limited(runtime.channel.notice(&event))
            })
            .await;
            if let Err(error) = told {
                tracing::error!(approval_id = %key, seq = event.seq, %error, "cannot tell the approvers of an event; giving up");
            }
            finish(part);
        });
    }

    /// Shows the approval as the server has it now.
    fn enqueue_refresh(self: &Arc<Self>, approval_id: String, part: Option<Part>) {
        let runtime = self.clone();
        let key = approval_id.clone();
        self.lanes.push(&key, async move {
            match runtime.client.get_approval(&approval_id).await {
                Ok(approval) => runtime.show(&approval).await,
                Err(error) if error.is_transient() => {
                    tracing::warn!(approval_id, %error, "cannot read an approval to show it; will retry");
                    runtime.retries.failed(&approval_id, None);
                }
                Err(error) => {
                    tracing::warn!(approval_id, %error, "cannot read an approval; giving up on showing it");
                    runtime.retries.succeeded(&approval_id);
                }
            }
            runtime.job_over(&approval_id, part);
        });
    }

    /// Shows the approval; a failure that may pass schedules a retry of it.
    async fn show(&self, approval: &pb::Approval) {
        if let Some(wait) = self.retries.holds(&approval.id) {
            // The platform asked for a pause; the scheduled retry shows the latest state.
            tracing::debug!(approval_id = %approval.id, wait_ms = wait.as_millis() as u64, "rate limited; leaving the update to the scheduled retry");
            return;
        }
        let Err(error) = self.limited(self.channel.show(approval)).await else {
            self.counters.show(ShowOutcome::Ok);
            self.retries.succeeded(&approval.id);
            return;
        };
        match error.verdict() {
            Verdict::Retry { after } => {
                self.counters.show(ShowOutcome::Retry);
                let wait = self.retries.failed(&approval.id, after);
                tracing::warn!(approval_id = %approval.id, %error, retry_in_ms = wait.as_millis() as u64, "cannot show the approval now; will retry");
            }
            Verdict::Final => {
                self.counters.show(ShowOutcome::Refused);
                tracing::error!(approval_id = %approval.id, %error, "the platform refused to show the approval");
                self.retries.succeeded(&approval.id);
            }
        }
    }

    /// Makes a platform call once the platform's retry-after has passed; a failure with a
    /// retry-after holds every call in the scope the channel names for it.
    async fn limited<T>(
        &self,
        call: impl Future<Output = Result<T, C::Error>>,
    ) -> Result<T, C::Error> {
        if let Some(wait) = self.hold.remaining() {
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                "rate limited; waiting for the platform's retry-after"
            );
        }
        self.hold.wait().await;
        let result = call.await;
        if let Err(error) = &result {
            if let Verdict::Retry { after: Some(after) } = error.verdict() {
                if self.channel.rate_limit_scope(error) == RateLimitScope::Platform {
                    tracing::info!(channel = self.channel.name(), retry_after_ms = after.as_millis() as u64, %error, "the platform asked for a pause; holding every call until it has passed");
                    self.hold.hold(after);
                }
            }
        }
        result
    }

    /// The end of a job of `approval_id` that was (`part`) part of handling a watch item:
    /// while the approval waits for a retry the item stays in flight; otherwise it, and every
    /// item that waited for this approval, is handled.
    fn job_over(&self, approval_id: &str, part: Option<Part>) {
        let Some(cursor) = &self.cursor else {
            return;
        };
        if self.retries.is_scheduled(approval_id) {
            if let Some(part) = part {
                cursor.park(approval_id, part);
            }
        } else {
            finish(part);
            cursor.release(approval_id);
        }
    }
}
