//! The worker: approvals from the server become Telegram messages, taps and commands become
//! decisions, and every message is kept true to its approval's state.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use countersign_client::{pb, version, Client, ClientError, WatchItem, WatchOptions};
use countersign_worker::approval::{is_granted, pending_approvals, route_targets};
use countersign_worker::cursor::{Cursor, CursorError, Part};
use countersign_worker::lanes::Lanes;
use countersign_worker::outbox::{Entry, Outbox, OutboxError};
use countersign_worker::retry::{retry_in_line, Backoff, RetrySchedule};
use pb::{ApprovalState, EventKind, Scope, Verdict};
use teloxide::types::{CallbackQuery, InlineKeyboardButtonKind, Message, Update, UpdateKind, User};

use crate::bot_api::{BotApi, BotApiError, EditOutcome};
use crate::callback::{ButtonAction, CallbackData};
use crate::command::parse_command;
use crate::config::Settings;
use crate::render::{
    decision_outcome_text, escape, grant_notice_html, reminder_html, render_approval,
    status_reply_html, RenderedMessage, REPLACED_COPY_HTML,
};

/// The channel name this worker serves.
pub const CHANNEL: &str = "telegram";

/// Callback answers.
const ANSWER_UNKNOWN_BUTTON: &str = "Unknown or outdated button";
const ANSWER_DISABLED_BUTTON: &str = "This button is disabled";
const ANSWER_NOT_ALLOWED: &str = "Not allowed";
const ANSWER_NO_SUCH_APPROVAL: &str = "This approval does not exist";
const ANSWER_TRY_AGAIN: &str = "Could not record the decision, please try again";
// Edit-on-approve: the tapped message showed another version of the arguments than the
// current one (or, as a button from before the edit, named none).
const ANSWER_EDITED: &str =
    "The arguments were edited since this message was shown: look at the updated message and decide again";
const REPLY_HOW_TO: &str = "Reply to an approval request with /approve or /reject &lt;reason&gt;";
const REPLY_NOT_A_REQUEST: &str = "That message is not an approval request";

/// How often a failed RecordDelivery is retried before the worker moves on.
const RECORD_DELIVERY_ATTEMPTS: u32 = 5;

/// How many of the most recent resolved approvals are looked at after each snapshot, to
/// correct messages left showing buttons while the worker was not watching.
const RESOLVED_CORRECTED: u32 = 50;

/// Every state but pending.
const RESOLVED_STATES: [ApprovalState; 5] = [
    ApprovalState::Approved,
    ApprovalState::Rejected,
    ApprovalState::Expired,
    ApprovalState::Cancelled,
    ApprovalState::Consumed,
];

/// How many messages before a new request message are searched for an orphaned copy (one
/// whose sending a crash interrupted before its id was written down).
const ORPHAN_SEARCH: i32 = 20;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Telegram: {0}")]
    Telegram(#[from] BotApiError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Cursor(#[from] CursorError),
}

/// How far an approval has come; a copy that is behind the one already shown is stale (the
/// watch, a tap's Decide answer and the correction of resolved approvals race) and must not
/// overwrite it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Progress {
    stage: Stage,
    decisions: usize,
}

/// The stages of an approval's life, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Pending,
    Resolved,
    Consumed,
}

impl Progress {
    fn of(approval: &pb::Approval) -> Progress {
        let stage = match approval.state() {
            ApprovalState::Pending | ApprovalState::Unspecified => Stage::Pending,
            ApprovalState::Approved
            | ApprovalState::Rejected
            | ApprovalState::Expired
            | ApprovalState::Cancelled => Stage::Resolved,
            ApprovalState::Consumed => Stage::Consumed,
        };
        Progress {
            stage,
            decisions: approval.decisions.len(),
        }
    }
}

/// One Telegram message showing an approval.
#[derive(Debug)]
struct ShownMessage {
    chat_id: i64,
    message_id: i32,
    /// Fingerprint of what the worker last made it show; `None` when unknown (found in a
    /// delivery record).
    shown: Option<u64>,
}

/// What the worker knows about one approval's messages.
#[derive(Debug, Default)]
struct ApprovalMessages {
    messages: Vec<ShownMessage>,
    progress: Option<Progress>,
}

/// The approvals the worker has messages for. Each approval has its own lock, held while its
/// messages are sent or edited, so that two updates of one approval never interleave.
#[derive(Default)]
struct MessageBook {
    inner: Mutex<BookInner>,
}

#[derive(Default)]
struct BookInner {
    approvals: HashMap<String, Arc<tokio::sync::Mutex<ApprovalMessages>>>,
    /// (chat, message) → approval id, to find the approval a command replies to.
    by_message: HashMap<(i64, i32), String>,
    /// Resolved approvals, oldest first; only the last [`FINISHED_KEPT`] stay in the book
    /// (their messages are recorded on the server should they change again).
    finished: VecDeque<String>,
    finished_set: HashSet<String>,
    /// The newest message id seen in each chat (where a search for orphans starts).
    newest: HashMap<i64, i32>,
}

/// How many resolved approvals the book remembers, so that a late copy (a tap's Decide
/// answer racing the watch) is recognised as stale.
const FINISHED_KEPT: usize = 4096;

impl MessageBook {
    fn lock(&self) -> MutexGuard<'_, BookInner> {
        // The book stays consistent even if a holder panicked: every change is a few inserts
        // or removes that cannot fail half-way.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry(&self, approval_id: &str) -> Arc<tokio::sync::Mutex<ApprovalMessages>> {
        self.lock()
            .approvals
            .entry(approval_id.to_owned())
            .or_default()
            .clone()
    }

    /// The approvals shown as pending (not yet known to be resolved).
    fn unresolved_approvals(&self) -> Vec<String> {
        let book = self.lock();
        book.approvals
            .keys()
            .filter(|id| !book.finished_set.contains(*id))
            .cloned()
            .collect()
    }

    fn remember_message(&self, chat_id: i64, message_id: i32, approval_id: &str) {
        let mut book = self.lock();
        book.by_message
            .insert((chat_id, message_id), approval_id.to_owned());
        drop(book);
        self.saw_message(chat_id, message_id);
    }

    /// Notes a message id seen in a chat (sent by the bot or by a user).
    fn saw_message(&self, chat_id: i64, message_id: i32) {
        let mut book = self.lock();
        let newest = book.newest.entry(chat_id).or_insert(message_id);
        *newest = (*newest).max(message_id);
    }

    fn newest_message(&self, chat_id: i64) -> Option<i32> {
        self.lock().newest.get(&chat_id).copied()
    }

    fn approval_of_message(&self, chat_id: i64, message_id: i32) -> Option<String> {
        self.lock().by_message.get(&(chat_id, message_id)).cloned()
    }

    /// Notes that an approval is resolved, and forgets the oldest resolved ones beyond
    /// [`FINISHED_KEPT`].
    fn finish(&self, approval_id: &str) {
        let mut book = self.lock();
        if !book.finished_set.insert(approval_id.to_owned()) {
            return;
        }
        book.finished.push_back(approval_id.to_owned());
        while book.finished.len() > FINISHED_KEPT {
            let Some(oldest) = book.finished.pop_front() else {
                break;
            };
            book.finished_set.remove(&oldest);
            book.approvals.remove(&oldest);
            book.by_message.retain(|_, id| *id != oldest);
        }
    }
}

/// A fingerprint of a rendered message, to skip edits that would change nothing.
fn fingerprint(rendered: &RenderedMessage) -> u64 {
    let mut hasher = DefaultHasher::new();
    rendered.hash(&mut hasher);
    hasher.finish()
}

/// The running worker. Everything it does on Telegram for one approval runs in that
/// approval's lane, so one slow or failing approval never delays another.
pub struct Worker {
    client: Client,
    bot: BotApi,
    settings: Settings,
    bot_username: String,
    book: MessageBook,
    lanes: Lanes,
    retries: RetrySchedule,
    outbox: Outbox,
    /// Where the watch resumes, and what has been fully handled.
    cursor: Cursor,
    resume_after: Option<u64>,
    /// A part of each snapshot, sent after it was reconciled; wakes
    /// [`Worker::correct_resolved_messages`], which keeps the snapshot in flight until done.
    snapshot_taken: tokio::sync::mpsc::UnboundedSender<Part>,
    snapshots: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Part>>,
}

/// Where a worker keeps its watch cursor, and the seq it found there.
pub struct Resume {
    pub cursor: Cursor,
    pub after: Option<u64>,
}

impl Worker {
    pub fn new(
        client: Client,
        bot: BotApi,
        settings: Settings,
        bot_username: String,
        lanes: Lanes,
        outbox: Outbox,
        resume: Resume,
    ) -> Worker {
        let (snapshot_taken, snapshots) = tokio::sync::mpsc::unbounded_channel();
        let retries = RetrySchedule::new(Backoff::new(
            settings.retry_interval,
            settings.max_retry_wait,
        ));
        Worker {
            client,
            bot,
            settings,
            bot_username,
            book: MessageBook::default(),
            lanes,
            retries,
            outbox,
            cursor: resume.cursor,
            resume_after: resume.after,
            snapshot_taken,
            snapshots: tokio::sync::Mutex::new(snapshots),
        }
    }

    /// The end of a job of `approval_id` that was part of handling a watch item: when the
    /// approval waits for a retry, the item stays in flight until the retry succeeds;
    /// otherwise it (and every item waiting for this approval) is handled.
    fn job_over(&self, approval_id: &str, part: Option<Part>) {
        if self.retries.is_scheduled(approval_id) {
            if let Some(part) = part {
                self.cursor.park(approval_id, part);
            }
        } else {
            if let Some(part) = part {
                part.done();
            }
            self.cursor.release(approval_id);
        }
    }

    /// Queues showing `approval` in its lane; `tapped` is a message of it a user acted on
    /// (perhaps an orphaned copy the worker does not know), to be edited too.
    /// `part` is the share of a watch item this is.
    fn enqueue_show(
        self: &Arc<Self>,
        approval: pb::Approval,
        tapped: Option<(i64, i32)>,
        part: Option<Part>,
    ) {
        let worker = self.clone();
        let approval_id = approval.id.clone();
        self.lanes.push(&approval_id, async move {
            let approval = if part.is_some() {
                worker.current_before_first_send(approval).await
            } else {
                approval
            };
            worker.show(&approval, tapped).await;
            worker.job_over(&approval.id, part);
        });
    }

    /// A watch item's copy of an approval that has no message yet may be old (a resumed watch
    /// replays what happened while the worker was stopped): before a message is sent for it,
    /// the approval is read as it is now, so that none is sent for one resolved meanwhile.
    async fn current_before_first_send(&self, approval: pb::Approval) -> pb::Approval {
        let unsent = approval.state() == ApprovalState::Pending
            && recorded_messages(&approval).is_empty()
            && self.outbox.unsettled(&approval.id).is_empty()
            && self
                .book
                .entry(&approval.id)
                .lock()
                .await
                .messages
                .is_empty();
        if !unsent {
            return approval;
        }
        match self.client.get_approval(&approval.id).await {
            Ok(current) if Progress::of(&current) > Progress::of(&approval) => current,
            Ok(_) => approval,
            Err(error) => {
                tracing::debug!(approval_id = %approval.id, %error, "cannot read the approval before sending; using the watch's copy");
                approval
            }
        }
    }

    /// Queues showing the approval as the server has it now.
    fn enqueue_refresh(self: &Arc<Self>, approval_id: String, part: Option<Part>) {
        let worker = self.clone();
        let key = approval_id.clone();
        self.lanes.push(&key, async move {
            match worker.client.get_approval(&approval_id).await {
                Ok(approval) => worker.show(&approval, None).await,
                Err(error) if error.is_transient() => {
                    tracing::warn!(approval_id, %error, "cannot fetch an approval to update its messages; will retry");
                    worker.retries.failed(&approval_id, None);
                }
                Err(error) => {
                    tracing::warn!(approval_id, %error, "giving up on an approval's messages");
                    worker.retries.succeeded(&approval_id);
                }
            }
            worker.job_over(&approval_id, part);
        });
    }

    /// Follows the `telegram` channel: a message for each pending approval, kept up to date.
    /// Starts after the persisted cursor when there is one (no snapshot, no correction pass:
    /// every event after it is replayed), with a snapshot otherwise. Each item stays in
    /// flight for the cursor until all its work is over. Returns only on an error that
    /// reconnecting cannot fix.
    pub async fn follow_approvals(self: &Arc<Self>) -> Result<(), WorkerError> {
        let mut watch = self.client.watch(WatchOptions {
            channel: CHANNEL.to_owned(),
            heartbeat_timeout: self.settings.heartbeat_timeout,
            max_backoff: self.settings.max_backoff,
            resume_after: self.resume_after,
        });
        if let Some(after) = self.resume_after {
            tracing::info!(after, "resuming the watch after the persisted cursor");
            // No snapshot comes to fill the book: without the other approvals' messages in
            // it, a search for orphans would take their live requests for orphaned copies.
            let pending =
                pending_approvals(&self.client, CHANNEL, self.settings.max_backoff).await?;
            self.remember_known_messages(&pending);
            // Messages an earlier run sent and did not record: recorded now, not at the
            // approval's next event.
            for entry in self.outbox.all_unsettled() {
                self.enqueue_refresh(entry.key, None);
            }
        }
        loop {
            match watch.next().await? {
                WatchItem::Snapshot(pending) => {
                    let part = self.cursor.begin_snapshot(watch.cursor().unwrap_or(0));
                    self.reconcile(pending, &part).await;
                    // The correction pass finishes the snapshot.
                    if let Err(unsent) = self.snapshot_taken.send(part) {
                        unsent.0.done();
                    }
                }
                WatchItem::Event(event) => {
                    let part = self.cursor.begin(event.seq);
                    self.on_event(event, &part).await;
                    part.done();
                }
            }
        }
    }

    /// After a (re)start or a resync: every pending approval gets its message (an existing
    /// one is edited, found in the approval's delivery records), and approvals the worker was
    /// showing that are no longer pending are shown as resolved. Approvals resolved while the
    /// worker was not watching are for [`Worker::correct_resolved_messages`].
    async fn reconcile(self: &Arc<Self>, pending: Vec<pb::Approval>, part: &Part) {
        tracing::info!(pending = pending.len(), "snapshot of pending approvals");
        let known = self.book.unresolved_approvals();
        self.remember_known_messages(&pending);
        for approval_id in known {
            if !pending.iter().any(|approval| approval.id == approval_id) {
                self.enqueue_refresh(approval_id, Some(part.share()));
            }
        }
        for approval in pending {
            self.enqueue_show(approval, None, Some(part.share()));
        }
    }

    /// Puts every message the worker can know of in the book (the pending approvals' recorded
    /// deliveries, the outbox's sent entries) before any lane searches a chat for orphans, so
    /// that a search never mistakes a live request for one.
    fn remember_known_messages(&self, pending: &[pb::Approval]) {
        for approval in pending {
            for (chat_id, message_id) in recorded_messages(approval) {
                self.book
                    .remember_message(chat_id, message_id, &approval.id);
            }
        }
        for entry in self.outbox.all_unsettled() {
            if let Some((chat_id, message_id)) =
                entry.message_ref.as_deref().and_then(parse_message_ref)
            {
                self.book.remember_message(chat_id, message_id, &entry.key);
            }
        }
    }

    /// Corrects the messages of approvals resolved while the worker was not watching (stopped,
    /// or cut off longer than the server could replay): the snapshot after a (re)start or a
    /// resync lists only pending approvals, so those messages would keep live buttons. After
    /// each snapshot the [`RESOLVED_CORRECTED`] most recent resolved approvals of the channel
    /// are shown as they are now. A message this run already shows in its final state costs
    /// nothing; one found in a delivery record costs one edit, answered "not modified" if it
    /// was final already. Runs beside the watch, so that new approvals are not held up behind
    /// these edits.
    pub async fn correct_resolved_messages(self: &Arc<Self>) -> Result<(), WorkerError> {
        let mut snapshots = self.snapshots.lock().await;
        while let Some(first) = snapshots.recv().await {
            // Snapshots that came meanwhile are covered by one pass.
            let mut parts = vec![first];
            while let Ok(part) = snapshots.try_recv() {
                parts.push(part);
            }
            let newest = parts.last().map(Part::share);
            loop {
                match self.show_recently_resolved(newest.as_ref()).await {
                    Ok(()) => break,
                    Err(error) if error.is_transient() => {
                        tracing::warn!(%error, retry_in_ms = self.settings.retry_interval.as_millis() as u64, "cannot list the recently resolved approvals");
                        tokio::time::sleep(self.settings.retry_interval).await;
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot list the recently resolved approvals; messages of approvals resolved while the worker was away may keep their buttons");
                        break;
                    }
                }
            }
            parts.into_iter().chain(newest).for_each(Part::done);
        }
        Ok(())
    }

    async fn show_recently_resolved(
        self: &Arc<Self>,
        part: Option<&Part>,
    ) -> Result<(), ClientError> {
        let request = pb::ListApprovalsRequest {
            states: RESOLVED_STATES.into_iter().map(i32::from).collect(),
            channel: CHANNEL.to_owned(),
            page_size: RESOLVED_CORRECTED,
            ..Default::default()
        };
        let listed = self.client.list_approvals(request).await?;
        let with_messages: Vec<pb::Approval> = listed
            .approvals
            .into_iter()
            .filter(|approval| approval.deliveries.iter().any(|d| d.channel == CHANNEL))
            .collect();
        tracing::info!(
            resolved = with_messages.len(),
            "bringing the messages of recently resolved approvals up to date"
        );
        for approval in with_messages {
            self.enqueue_show(approval, None, part.map(Part::share));
        }
        Ok(())
    }

    async fn on_event(self: &Arc<Self>, event: pb::ApprovalEvent, part: &Part) {
        let kind = event.kind();
        let Some(approval) = event.approval else {
            return;
        };
        match kind {
            EventKind::Requested if is_granted(&approval) => {
                tracing::info!(approval_id = %approval.id, seq = event.seq, "a session grant approved a call; posting a notice");
                let worker = self.clone();
                let approval_id = approval.id.clone();
                let part = part.share();
                self.lanes.push(&approval_id, async move {
                    worker.post_grant_notice(&approval).await;
                    part.done();
                });
            }
            EventKind::Reminded => {
                tracing::info!(approval_id = %approval.id, seq = event.seq, "reminding the deciders");
                let worker = self.clone();
                let approval_id = approval.id.clone();
                let part = part.share();
                self.lanes.push(&approval_id, async move {
                    worker.post_reminder(&approval, &event.detail).await;
                    part.done();
                });
            }
            EventKind::Requested
            | EventKind::DecisionRecorded
            | EventKind::Resolved
            | EventKind::Expired
            | EventKind::Cancelled
            | EventKind::Consumed
            | EventKind::Escalated => {
                tracing::debug!(approval_id = %approval.id, seq = event.seq, ?kind, "approval event");
                self.enqueue_show(approval, None, Some(part.share()));
            }
            EventKind::DecisionRefused => {
                tracing::info!(approval_id = %approval.id, seq = event.seq, "the server refused a decision");
            }
            // Deliveries are this worker's own records; markers and heartbeats carry nothing.
            _ => {}
        }
    }
    /// Makes Telegram show `approval`: edits its messages (and `tapped`, a message of it a
    /// user acted on), and sends one to each target chat that has none while it is pending.
    /// A copy older than the one already shown is ignored. Runs in the approval's lane; a
    /// failure that may pass schedules a retry of the whole approval.
    async fn show(&self, approval: &pb::Approval, tapped: Option<(i64, i32)>) {
        if let Some(wait) = self.retries.holds(&approval.id) {
            // Telegram asked for a pause; the scheduled retry shows the latest state after it.
            tracing::debug!(approval_id = %approval.id, wait_ms = wait.as_millis() as u64, "in a flood wait; leaving the update to the scheduled retry");
            return;
        }
        let entry = self.book.entry(&approval.id);
        let mut known = entry.lock().await;
        let progress = Progress::of(approval);
        if known.progress.is_some_and(|shown| progress < shown) {
            tracing::debug!(approval_id = %approval.id, "skipping an older copy of the approval");
            return;
        }
        known.progress = Some(progress);
        let mut found = recorded_messages(approval);
        found.extend(tapped);
        for entry in self.outbox.unsettled(&approval.id) {
            found.extend(entry.message_ref.as_deref().and_then(parse_message_ref));
        }
        for (chat_id, message_id) in found {
            let already_known = known
                .messages
                .iter()
                .any(|m| m.chat_id == chat_id && m.message_id == message_id);
            if !already_known {
                known.messages.push(ShownMessage {
                    chat_id,
                    message_id,
                    shown: None,
                });
                self.book
                    .remember_message(chat_id, message_id, &approval.id);
            }
        }
        let mut retry_after = None;
        let mut failed = false;
        let mut fail = |error: Option<&BotApiError>| {
            failed = true;
            retry_after = retry_after.max(error.and_then(BotApiError::retry_after));
        };
        self.settle_outbox(approval).await;
        let rendered = render_approval(approval, &self.settings.buttons);
        let shown = fingerprint(&rendered);
        for message in known.messages.iter_mut() {
            if message.shown != Some(shown) {
                if let Err(error) = self.update_message(approval, message, &rendered).await {
                    fail(Some(&error));
                }
            }
        }
        if approval.state() != ApprovalState::Pending {
            self.book.finish(&approval.id);
        } else {
            for chat_id in self.target_chats(approval) {
                if known.messages.iter().any(|m| m.chat_id == chat_id) {
                    continue;
                }
                match self.send_request(approval, chat_id, &rendered).await {
                    Ok(message_id) => known.messages.push(ShownMessage {
                        chat_id,
                        message_id,
                        shown: Some(shown),
                    }),
                    Err(SendError::Telegram(error)) if error.is_transient() => {
                        tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot send the approval request now; will retry");
                        fail(Some(&error));
                    }
                    Err(SendError::Telegram(error)) => {
                        tracing::error!(approval_id = %approval.id, chat_id, %error, "Telegram refused the approval request message");
                    }
                    Err(SendError::Outbox(error)) => {
                        // Without the intent on disk a crash could repeat the message.
                        tracing::error!(approval_id = %approval.id, chat_id, %error, "cannot write the outbox; not sending, will retry");
                        fail(None);
                    }
                }
            }
        }
        if failed {
            let wait = self.retries.failed(&approval.id, retry_after);
            tracing::debug!(approval_id = %approval.id, retry_in_ms = wait.as_millis() as u64, "approval's messages scheduled for a retry");
        } else {
            self.retries.succeeded(&approval.id);
        }
    }

    /// Settles what the outbox says an earlier run left unfinished for this approval: a
    /// message Telegram created and the server never recorded is recorded now (it is among
    /// `messages`, adopted). Intents without an answer stay for [`Worker::send_request`].
    async fn settle_outbox(&self, approval: &pb::Approval) {
        for entry in self.outbox.unsettled(&approval.id) {
            let Some((chat_id, message_id)) =
                entry.message_ref.as_deref().and_then(parse_message_ref)
            else {
                continue;
            };
            let recorded = recorded_messages(approval).contains(&(chat_id, message_id));
            if recorded
                || self
                    .record_delivery(&approval.id, chat_id, message_id)
                    .await
            {
                tracing::info!(approval_id = %approval.id, chat_id, message_id, adopted = !recorded, "outbox entry settled");
                self.settle(&entry).await;
            }
        }
    }

    async fn settle(&self, entry: &Entry) {
        if let Err(error) = self.outbox.done(entry.id).await {
            tracing::warn!(approval_id = %entry.key, %error, "cannot settle an outbox entry; it is settled again after a restart");
        }
    }

    /// Sends the request message to a chat: the intent is on disk before the call and the
    /// message id right after, then the message is recorded on the server. When an earlier
    /// run left an intent here without an answer (it crashed during the call), the messages
    /// just before the new one are searched for the orphaned copy.
    async fn send_request(
        &self,
        approval: &pb::Approval,
        chat_id: i64,
        rendered: &RenderedMessage,
    ) -> Result<i32, SendError> {
        let chat = chat_id.to_string();
        let uncertain: Vec<Entry> = self
            .outbox
            .unsettled(&approval.id)
            .into_iter()
            .filter(|entry| entry.target == chat && entry.message_ref.is_none())
            .collect();
        let after = self.book.newest_message(chat_id).map(|id| id.to_string());
        let intent = self.outbox.intend(&approval.id, &chat, after).await?;
        let sent = self
            .bot
            .send_message(chat_id, &rendered.html, &rendered.keyboard, None)
            .await;
        let message_id = match sent {
            Ok(message_id) => message_id,
            Err(error) => {
                // Telegram answered with an error: it made no message, so the next attempt
                // has no orphan to search for. (No answer, or one a proxy wrote, is uncertain.)
                if matches!(error, BotApiError::Api { .. }) {
                    if let Err(error) = self.outbox.done(intent).await {
                        tracing::warn!(approval_id = %approval.id, %error, "cannot settle an outbox entry");
                    }
                }
                return Err(error.into());
            }
        };
        tracing::info!(approval_id = %approval.id, chat_id, message_id, "sent the approval request");
        self.book
            .remember_message(chat_id, message_id, &approval.id);
        self.outbox
            .sent(intent, &format!("{chat_id}:{message_id}"))
            .await?;
        if self
            .record_delivery(&approval.id, chat_id, message_id)
            .await
        {
            if let Err(error) = self.outbox.done(intent).await {
                tracing::warn!(approval_id = %approval.id, %error, "cannot settle an outbox entry");
            }
        }
        for entry in uncertain {
            let after = entry.after.as_deref().and_then(|id| id.parse::<i32>().ok());
            self.neutralise_orphans(chat_id, after, message_id).await;
            self.settle(&entry).await;
        }
        Ok(message_id)
    }

    /// Looks at the messages between `after` (the newest known when the interrupted send
    /// began; at most [`ORPHAN_SEARCH`] back) and `before` for request messages the worker
    /// does not know: removing buttons changes only a bot message that has some, and every
    /// bot message with buttons there that is not in the book is an orphaned copy. Its text
    /// then says that it was replaced. Users' messages cannot be edited and stay untouched.
    async fn neutralise_orphans(&self, chat_id: i64, after: Option<i32>, before: i32) {
        let lowest = before.saturating_sub(ORPHAN_SEARCH).max(0);
        let first = after.map_or(lowest, |after| after.max(lowest)) + 1;
        for message_id in first..before {
            if self.book.approval_of_message(chat_id, message_id).is_some() {
                continue;
            }
            match self.bot.remove_buttons(chat_id, message_id).await {
                Ok(EditOutcome::Edited) => {
                    tracing::info!(
                        chat_id,
                        message_id,
                        "found an orphaned copy of a request message; replacing its text"
                    );
                    if let Err(error) = self
                        .bot
                        .edit_message(chat_id, message_id, REPLACED_COPY_HTML, &[])
                        .await
                    {
                        tracing::warn!(chat_id, message_id, %error, "cannot mark the orphaned copy as replaced (its buttons are gone)");
                    }
                }
                Ok(EditOutcome::NotModified) => {}
                Err(error) if error.is_cant_edit() => {}
                Err(error) => {
                    tracing::warn!(chat_id, message_id, %error, "cannot check a message for an orphaned copy");
                }
            }
        }
    }

    /// Posts the notice of a call a session grant approved to the approval's chats.
    async fn post_grant_notice(&self, approval: &pb::Approval) {
        let html = grant_notice_html(approval);
        for chat_id in self.target_chats(approval) {
            let sent = retry_in_line(
                self.call_backoff(),
                5,
                self.settings.max_retry_wait,
                "sendMessage",
                || self.bot.send_message(chat_id, &html, &[], None),
            )
            .await;
            if let Err(error) = sent {
                tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot post the session grant notice");
            }
        }
    }

    /// Posts a reminder in every target chat, as a reply to the approval's first message there
    /// (a plain message where the worker has none).
    async fn post_reminder(&self, approval: &pb::Approval, detail: &str) {
        let html = reminder_html(approval, detail);
        let recorded = recorded_messages(approval);
        for chat_id in self.target_chats(approval) {
            let first = recorded
                .iter()
                .filter(|(chat, _)| *chat == chat_id)
                .map(|(_, message_id)| *message_id)
                .min();
            let sent = retry_in_line(
                self.call_backoff(),
                5,
                self.settings.max_retry_wait,
                "sendMessage",
                || self.bot.send_message(chat_id, &html, &[], first),
            )
            .await;
            if let Err(error) = sent {
                tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot post the reminder");
            }
        }
    }

    /// Edits one message; on a failure that may pass the error is returned (the approval is
    /// retried as a whole).
    async fn update_message(
        &self,
        approval: &pb::Approval,
        message: &mut ShownMessage,
        rendered: &RenderedMessage,
    ) -> Result<(), BotApiError> {
        let (chat_id, message_id) = (message.chat_id, message.message_id);
        match self
            .bot
            .edit_message(chat_id, message_id, &rendered.html, &rendered.keyboard)
            .await
        {
            Ok(outcome) => {
                tracing::debug!(approval_id = %approval.id, chat_id, message_id, not_modified = (outcome == EditOutcome::NotModified), "message up to date");
                message.shown = Some(fingerprint(rendered));
            }
            Err(error) if error.is_cant_edit() && message.shown.is_none() => {
                // Found in a delivery record after a restart: what it shows, and whether an
                // earlier run already replied with this state, is unknown. Replying at every
                // start would repeat the same reply; the next change of state gets one.
                tracing::info!(approval_id = %approval.id, chat_id, message_id, %error, "a recorded message cannot be edited; not replying with a state it may already have");
                message.shown = Some(fingerprint(rendered));
            }
            Err(error) if error.is_cant_edit() => {
                tracing::info!(approval_id = %approval.id, chat_id, message_id, %error, "message cannot be edited; replying with the state instead");
                match self
                    .bot
                    .send_message(chat_id, &status_reply_html(approval), &[], Some(message_id))
                    .await
                {
                    Ok(_) => message.shown = Some(fingerprint(rendered)),
                    Err(error) if error.is_transient() => return Err(error),
                    Err(error) => {
                        tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot reply with the state");
                    }
                }
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(approval_id = %approval.id, chat_id, message_id, %error, "cannot update the message now; will retry");
                return Err(error);
            }
            Err(error) => {
                tracing::error!(approval_id = %approval.id, chat_id, message_id, %error, "Telegram refused the update of the message");
            }
        }
        Ok(())
    }

    /// Records a sent message on the server, so that a restarted worker edits it instead of
    /// sending another. Returns whether it was recorded.
    async fn record_delivery(&self, approval_id: &str, chat_id: i64, message_id: i32) -> bool {
        let request = pb::RecordDeliveryRequest {
            approval_id: approval_id.to_owned(),
            channel: CHANNEL.to_owned(),
            target: chat_id.to_string(),
            message_ref: format!("{chat_id}:{message_id}"),
        };
        let mut pause = Duration::from_millis(100);
        for attempt in 1..=RECORD_DELIVERY_ATTEMPTS {
            match self.client.record_delivery(request.clone()).await {
                Ok(_) => return true,
                Err(error) if error.is_transient() && attempt < RECORD_DELIVERY_ATTEMPTS => {
                    tracing::warn!(approval_id, attempt, %error, "recording the delivery failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.settings.max_backoff);
                }
                Err(error) => {
                    tracing::error!(approval_id, %error, "cannot record the delivery; the outbox keeps it for the next start");
                    return false;
                }
            }
        }
        false
    }

    /// The chats an approval goes to: each `telegram` route's target (a chat id), the default
    /// chat for an empty target or an approval without routes.
    fn target_chats(&self, approval: &pb::Approval) -> Vec<i64> {
        let mut chats = Vec::new();
        for target in route_targets(approval, CHANNEL) {
            let chat = if target.is_empty() {
                self.settings.default_chat_id
            } else {
                target.trim().parse::<i64>().ok()
            };
            match chat {
                Some(chat_id) if !chats.contains(&chat_id) => chats.push(chat_id),
                Some(_) => {}
                None if target.is_empty() => {
                    tracing::warn!(approval_id = %approval.id, "approval has no Telegram target and no default chat is configured");
                }
                None => {
                    tracing::warn!(approval_id = %approval.id, "ignoring a Telegram route whose target is not a chat id");
                }
            }
        }
        chats
    }

    /// Backoff for calls retried in line (callback answers, notices).
    fn call_backoff(&self) -> Backoff {
        Backoff::new(Duration::from_millis(200), self.settings.max_retry_wait)
    }

    /// Tries again the approvals whose messages failed for a reason that may pass, each on
    /// its own schedule (exponential backoff, never before Telegram's retry_after).
    pub async fn retry_failed_messages(self: &Arc<Self>) -> Result<(), WorkerError> {
        loop {
            for approval_id in self.retries.next_due().await {
                self.enqueue_refresh(approval_id, None);
            }
        }
    }

    /// Polls Telegram for taps and commands and handles each batch concurrently. An update is
    /// confirmed (by the next poll's offset) only after it was handled, so a crash makes
    /// Telegram deliver it again; the decision's idempotency key makes that harmless.
    pub async fn follow_updates(self: &Arc<Self>) -> Result<(), WorkerError> {
        let mut offset: Option<i32> = None;
        let mut pause = self.settings.poll_error_backoff;
        loop {
            match self
                .bot
                .get_updates(offset, self.settings.poll_timeout_secs)
                .await
            {
                Ok(updates) => {
                    pause = self.settings.poll_error_backoff;
                    let next = updates.iter().map(next_offset).max();
                    futures::future::join_all(
                        updates.into_iter().map(|update| self.on_update(update)),
                    )
                    .await;
                    if next.is_some() {
                        offset = next;
                    }
                }
                Err(error) => {
                    let wait = pause.max(error.retry_after().unwrap_or_default());
                    let retry_in_ms = wait.as_millis() as u64;
                    if error.is_polling_conflict() {
                        tracing::error!(retry_in_ms, "Telegram refused getUpdates with 409 Conflict: another process polls updates with this bot token; run exactly one countersign-telegram per bot and no other bot program with its token");
                    } else {
                        tracing::warn!(retry_in_ms, %error, "polling Telegram for updates failed");
                    }
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(self.settings.max_backoff);
                }
            }
        }
    }

    async fn on_update(self: &Arc<Self>, update: Update) {
        match update.kind {
            UpdateKind::CallbackQuery(query) => self.on_callback(query).await,
            UpdateKind::Message(message) => self.on_message(message).await,
            UpdateKind::Error(_) => {
                tracing::warn!(
                    update_id = update.id.0,
                    "ignoring an update teloxide cannot read"
                );
            }
            _ => {}
        }
    }

    /// A tap: Decide, answer the tap at once with the outcome, then (in the approval's lane)
    /// edit the approval's messages, the tapped one included.
    async fn on_callback(self: &Arc<Self>, query: CallbackQuery) {
        let callback_id = query.id.0.clone();
        let user_id = query.from.id.0;
        let tapped = query
            .message
            .as_ref()
            .map(|message| (message.chat().id.0, message.id().0));
        if let Some((chat_id, message_id)) = tapped {
            self.book.saw_message(chat_id, message_id);
        }
        let data = match query
            .data
            .as_deref()
            .unwrap_or_default()
            .parse::<CallbackData>()
        {
            Ok(data) => data,
            Err(error) => {
                tracing::info!(user_id, %error, "refusing a button press with unusable data");
                self.answer(&callback_id, ANSWER_UNKNOWN_BUTTON).await;
                return;
            }
        };
        if !self.settings.buttons.contains(&data.action) {
            tracing::info!(user_id, approval_id = %data.approval_id, action = ?data.action, "refusing a press of a disabled button");
            self.answer(&callback_id, ANSWER_DISABLED_BUTTON).await;
            return;
        }
        if !self.is_allowed(user_id) {
            tracing::info!(user_id, approval_id = %data.approval_id, "refusing a press by a user not on the allowlist");
            self.answer(&callback_id, ANSWER_NOT_ALLOWED).await;
            return;
        }
        let (verdict, scope) = match data.action {
            ButtonAction::Approve => (Verdict::Approve, Scope::Once),
            ButtonAction::Reject => (Verdict::Reject, Scope::Once),
            ButtonAction::AllowSession => (Verdict::Approve, Scope::Session),
        };
        // An Approve button of an edited approval names the version its message showed.
        let expected_args_digest = match (&data.version, verdict) {
            (Some(shown), Verdict::Approve) => {
                match self.version_named(&data.approval_id, shown).await {
                    Ok(digest) => digest,
                    Err(answer) => {
                        self.answer(&callback_id, answer).await;
                        return;
                    }
                }
            }
            _ => String::new(),
        };
        let request = pb::DecideRequest {
            approval_id: data.approval_id.clone(),
            verdict: verdict.into(),
            scope: scope.into(),
            reason: String::new(),
            decider: Some(decider(&query.from)),
            idempotency_key: format!("telegram:callback:{callback_id}"),
            expected_args_digest,
            ..Default::default()
        };
        let (answer, approval) = self.decide(request, verdict, scope).await;
        self.answer(&callback_id, &answer).await;
        if let Some(approval) = approval {
            self.enqueue_show(approval, tapped, None);
        }
    }

    async fn on_message(self: &Arc<Self>, message: Message) {
        let chat_id = message.chat.id.0;
        self.book.saw_message(chat_id, message.id.0);
        let Some(command) = message
            .text()
            .and_then(|text| parse_command(text, &self.bot_username))
        else {
            return;
        };
        let Some(from) = message.from.as_ref() else {
            return;
        };
        let Some(original) = message.reply_to_message() else {
            self.reply(chat_id, message.id.0, REPLY_HOW_TO).await;
            return;
        };
        let approval_id = self
            .book
            .approval_of_message(chat_id, original.id.0)
            .or_else(|| approval_id_from_buttons(original));
        let Some(approval_id) = approval_id else {
            self.reply(chat_id, message.id.0, REPLY_NOT_A_REQUEST).await;
            return;
        };
        if !self.is_allowed(from.id.0) {
            tracing::info!(
                user_id = from.id.0,
                approval_id,
                "refusing a command by a user not on the allowlist"
            );
            self.reply(chat_id, message.id.0, ANSWER_NOT_ALLOWED).await;
            return;
        }
        let request = pb::DecideRequest {
            approval_id,
            verdict: command.verdict.into(),
            scope: Scope::Once.into(),
            reason: command.reason,
            decider: Some(decider(from)),
            idempotency_key: format!("telegram:message:{chat_id}:{}", message.id.0),
            ..Default::default()
        };
        let (answer, approval) = self.decide(request, command.verdict, Scope::Once).await;
        // The message first (in its lane), then the reply, which may have to wait.
        if let Some(approval) = approval {
            self.enqueue_show(approval, Some((chat_id, original.id.0)), None);
        }
        self.reply(chat_id, message.id.0, &escape(&answer)).await;
    }

    /// The full digest of the current version of the arguments when it starts with `shown`
    /// (the version a button's message showed), or what to answer the tap instead.
    async fn version_named(&self, approval_id: &str, shown: &str) -> Result<String, &'static str> {
        let approval = match self.client.get_approval(approval_id).await {
            Ok(approval) => approval,
            Err(ClientError::NotFound(_)) => return Err(ANSWER_NO_SUCH_APPROVAL),
            Err(error) => {
                tracing::warn!(approval_id, %error, "cannot read the approval of a tap");
                return Err(ANSWER_TRY_AGAIN);
            }
        };
        let (_, current) = version::current_arguments(&approval);
        if current.starts_with(shown) {
            Ok(current.to_owned())
        } else {
            tracing::info!(
                approval_id,
                "a tap on a message showing an earlier version of the arguments"
            );
            Err(ANSWER_EDITED)
        }
    }

    /// Calls Decide; returns the text to tell the decider and the approval as it is now.
    async fn decide(
        &self,
        request: pb::DecideRequest,
        verdict: Verdict,
        scope: Scope,
    ) -> (String, Option<pb::Approval>) {
        let approval_id = request.approval_id.clone();
        match self.client.decide(request).await {
            Ok(response) => {
                tracing::info!(approval_id, outcome = ?response.outcome(), "decision relayed");
                let answer = decision_outcome_text(&response, verdict, scope);
                (answer, response.approval)
            }
            Err(ClientError::PermissionDenied(reason)) => {
                tracing::info!(approval_id, %reason, "the server refused the decider");
                (refusal_answer(&reason), None)
            }
            Err(ClientError::NotFound(_)) => (ANSWER_NO_SUCH_APPROVAL.to_owned(), None),
            Err(ClientError::FailedPrecondition(reason)) => {
                tracing::info!(approval_id, %reason, "the server refused an approval of an unnamed version");
                (ANSWER_EDITED.to_owned(), None)
            }
            Err(error) => {
                tracing::warn!(approval_id, %error, "Decide failed");
                (ANSWER_TRY_AGAIN.to_owned(), None)
            }
        }
    }

    fn is_allowed(&self, user_id: u64) -> bool {
        let allowlist = &self.settings.allowed_user_ids;
        allowlist.is_empty()
            || i64::try_from(user_id).is_ok_and(|user_id| allowlist.contains(&user_id))
    }

    /// Answers a callback query, retrying briefly (Telegram stops the spinner itself after
    /// some seconds, so a late answer is worth little).
    async fn answer(&self, callback_id: &str, text: &str) {
        let answered = retry_in_line(
            self.call_backoff(),
            3,
            Duration::from_secs(2),
            "answerCallbackQuery",
            || self.bot.answer_callback(callback_id, text),
        )
        .await;
        if let Err(error) = answered {
            // A re-delivered callback was already answered; Telegram says the query is too old.
            tracing::info!(%error, "cannot answer the callback query");
        }
    }

    /// Replies to a command, retrying what may pass (a 5xx, a flood wait) a few times, briefly:
    /// the updates after this one wait meanwhile.
    async fn reply(&self, chat_id: i64, message_id: i32, html: &str) {
        let sent = retry_in_line(
            self.call_backoff(),
            3,
            self.settings.max_retry_wait.min(REPLY_MAX_WAIT),
            "sendMessage",
            || self.bot.send_message(chat_id, html, &[], Some(message_id)),
        )
        .await;
        if let Err(error) = sent {
            tracing::warn!(chat_id, %error, "cannot reply to a command");
        }
    }
}

/// The longest a command's reply waits before one more try.
const REPLY_MAX_WAIT: Duration = Duration::from_secs(5);

/// The most of a callback answer Telegram shows.
const MAX_ANSWER_CHARS: usize = 200;

/// A server refusal as the decider sees it: why, in the server's words (groups and approvers
/// from the configuration; a requester the agent named appears only quoted), cut to what
/// Telegram shows. A callback answer is plain text: nothing in it is markup.
fn refusal_answer(reason: &str) -> String {
    let text = format!("{ANSWER_NOT_ALLOWED}: {reason}");
    if text.chars().count() <= MAX_ANSWER_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_ANSWER_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Why a request message was not sent.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error(transparent)]
    Telegram(#[from] BotApiError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

/// The messages recorded on the server for an approval.
fn recorded_messages(approval: &pb::Approval) -> Vec<(i64, i32)> {
    approval
        .deliveries
        .iter()
        .filter(|delivery| delivery.channel == CHANNEL)
        .filter_map(|delivery| {
            let parsed = parse_message_ref(&delivery.message_ref);
            if parsed.is_none() {
                tracing::warn!(approval_id = %approval.id, "ignoring a delivery record with an unreadable message reference");
            }
            parsed
        })
        .collect()
}

/// The offset that confirms `update` on the next poll.
fn next_offset(update: &Update) -> i32 {
    i32::try_from(update.id.0)
        .ok()
        .and_then(|id| id.checked_add(1))
        .unwrap_or(i32::MAX)
}

fn decider(user: &User) -> pb::Decider {
    pb::Decider {
        channel: CHANNEL.to_owned(),
        user_id: user.id.0.to_string(),
        display_name: user.mention().unwrap_or_else(|| user.full_name()),
    }
}

/// `chat_id:message_id`, as this worker records deliveries.
fn parse_message_ref(message_ref: &str) -> Option<(i64, i32)> {
    let (chat, message) = message_ref.split_once(':')?;
    Some((chat.parse().ok()?, message.parse().ok()?))
}

/// The approval a request message is about, read from its buttons (a reply to a message the
/// worker has not seen since it started).
fn approval_id_from_buttons(message: &Message) -> Option<String> {
    message
        .reply_markup()?
        .inline_keyboard
        .iter()
        .flatten()
        .find_map(|button| match &button.kind {
            InlineKeyboardButtonKind::CallbackData(data) => data.parse::<CallbackData>().ok(),
            _ => None,
        })
        .map(|data| data.approval_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_refs_round_trip() {
        assert_eq!(parse_message_ref("-100123:42"), Some((-100123, 42)));
        assert_eq!(parse_message_ref("garbage"), None);
        assert_eq!(parse_message_ref("1:x"), None);
    }

    #[test]
    fn progress_orders_states_and_decisions() {
        let mut pending = pb::Approval {
            state: ApprovalState::Pending.into(),
            ..Default::default()
        };
        let before = Progress::of(&pending);
        pending.decisions.push(pb::Decision::default());
        let after = Progress::of(&pending);
        assert!(before < after);
        let resolved = pb::Approval {
            state: ApprovalState::Rejected.into(),
            ..Default::default()
        };
        assert!(after < Progress::of(&resolved));
    }
}
