//! The worker's loop: one task that owns all state and handles, in order, what the watch of
//! the `github` channel delivers and the comments that webhooks and polling bring in.
//!
//! Nothing here needs to survive a restart but the watch cursor (when a state directory is
//! configured): pending approvals come back in the watch's snapshot (or, when the watch
//! resumes after the cursor, from a list of the pending approvals), their comments are found through the deliveries recorded on the server (or, when
//! the worker died before recording one, through the marker in the comment), and a command
//! already answered is recognised by the marker of the reply or by the server's idempotency
//! key (the comment id).

use countersign_worker::approval::{is_granted, pending_approvals, route_targets};
use countersign_worker::cursor::{Cursor, Part};
use countersign_worker::lanes::Lanes;
use countersign_worker::retry::{Backoff, RetrySchedule};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, Client, ClientError, WatchItem};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::api::{ApiError, Author, GitHubApi, IssueComment, ReactionContent};
use crate::command::{parse_command, Command, Verdict};
use crate::incoming::{unedited, IncomingComment, PollTargets};
use crate::recent::RecentSet;
use crate::render::{self, names_approval, replied_comment_id, Reply};
use crate::target::{IssueRef, RepoName, Target};

pub const CHANNEL: &str = "github";
const REMEMBERED_COMMENTS: usize = 50_000;
const REMEMBERED_RESOLVED: usize = 256;
/// Resolved approvals looked at on start, to correct comments left pending by a restart.
const STARTUP_RESYNC_PAGE: u32 = 50;
/// How often a command that failed for a transient reason is tried again.
const MAX_COMMAND_ATTEMPTS: u32 = 8;

pub enum Input {
    /// A watch item, with its share of the cursor when one is kept.
    Watch(Box<WatchItem>, Option<Part>),
    Comments(Vec<IncomingComment>),
    /// A command that failed for a transient reason, with the attempts made so far.
    RetryCommand(IncomingComment, u32),
    /// A delivery that ran in its approval's lane is over.
    Delivered(Box<Delivered>),
    /// An edit that ran in its approval's lane is over.
    Written(Box<Written>),
}

/// The outcome of rewriting one message of an approval.
pub struct Written {
    approval_id: String,
    message_ref: String,
    /// The message as the edit left it (its body, or stale when the edit failed).
    message: Message,
}

/// The outcome of posting an approval's request on one target.
pub struct Delivered {
    approval_id: String,
    target: Target,
    /// `Ok(None)`: the approval was resolved before its request was posted; nothing was.
    result: Result<Option<Posted>, CommandError>,
}

/// A request message in place on a target.
pub struct Posted {
    message: Message,
    /// Found from an earlier attempt or run rather than posted now: commands may have been
    /// written under it while no one was listening.
    found: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    GitHub(#[from] ApiError),
    #[error(transparent)]
    Server(#[from] ClientError),
}

impl CommandError {
    fn is_transient(&self) -> bool {
        match self {
            CommandError::GitHub(error) => error.is_transient(),
            CommandError::Server(error) => error.is_transient(),
        }
    }
}

/// Where the request for an approval lives on GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
enum MessageKind {
    /// A comment on the target issue.
    Comment(u64),
    /// The body of the issue the worker opened for the approval.
    IssueBody,
}

#[derive(Clone, Debug)]
pub struct Message {
    issue: IssueRef,
    kind: MessageKind,
    /// When GitHub created it: polling for commands starts there.
    created_at: OffsetDateTime,
    /// The body as last written.
    rendered: String,
    /// The last edit failed; it is tried again when the approval's retry is due.
    stale: bool,
    /// An edit is queued or running in the approval's lane.
    writing: bool,
}

impl Message {
    fn message_ref(&self) -> String {
        match self.kind {
            MessageKind::Comment(id) => format!("comment/{id}"),
            MessageKind::IssueBody => format!("issue/{}", self.issue.number),
        }
    }

    /// Commands count in comments written after the request.
    fn precedes(&self, comment_id: u64) -> bool {
        match self.kind {
            MessageKind::Comment(id) => comment_id > id,
            MessageKind::IssueBody => true,
        }
    }
}

/// An approval the worker has put on GitHub.
struct Tracked {
    approval: pb::Approval,
    messages: Vec<Message>,
    /// Targets not delivered yet because of a transient failure.
    undelivered: Vec<Target>,
    /// Targets being delivered in the approval's lane.
    in_flight: Vec<Target>,
    /// Every target the approval was routed to so far (an escalation adds some).
    routed: Vec<Target>,
}

impl Tracked {
    fn message_on(&self, issue: &IssueRef) -> Option<&Message> {
        self.messages.iter().find(|message| &message.issue == issue)
    }
}

pub struct Relay {
    client: Client,
    api: Arc<GitHubApi>,
    default_target: Option<Target>,
    poll_targets: Option<Arc<PollTargets>>,
    inputs: mpsc::Sender<Input>,
    retry_interval: Duration,
    /// Pending approvals, by id.
    pending: BTreeMap<String, Tracked>,
    /// Recently resolved approvals, for late commands and edits to try again.
    resolved: VecDeque<Tracked>,
    /// Comments whose handling is over.
    handled: RecentSet<u64>,
    /// Comments waiting for another attempt.
    retrying: HashSet<u64>,
    /// Commands on issues whose request is still being posted; handled once it is.
    parked: Vec<IncomingComment>,
    /// Deliveries run here, one lane per approval, so that a slow or failing approval never
    /// delays another's request.
    lanes: Lanes,
    /// The persisted watch cursor: an item stays in flight until its approval's messages are
    /// all delivered and up to date.
    cursor: Option<Cursor>,
    /// When each approval with a failed delivery or edit is tried again.
    retries: Arc<RetrySchedule>,
    /// The watch resumes after the cursor: no snapshot comes, the pending approvals are
    /// listed at the start instead.
    resumed: bool,
}

/// What a relay uses of the shared worker runtime.
pub struct Runtime {
    pub lanes: Lanes,
    /// The watch cursor, when a state directory is configured.
    pub resume: Option<Resume>,
}

/// Where a relay's watch resumes.
pub struct Resume {
    pub cursor: Cursor,
    /// The persisted seq; `None`: the watch starts with a snapshot.
    pub after: Option<u64>,
}

impl Relay {
    pub fn new(
        client: Client,
        api: Arc<GitHubApi>,
        default_target: Option<Target>,
        poll_targets: Option<Arc<PollTargets>>,
        inputs: mpsc::Sender<Input>,
        retry_interval: Duration,
        runtime: Runtime,
    ) -> Relay {
        let Runtime { lanes, resume } = runtime;
        Relay {
            client,
            api,
            default_target,
            poll_targets,
            inputs,
            retry_interval,
            pending: BTreeMap::new(),
            resolved: VecDeque::new(),
            handled: RecentSet::new(REMEMBERED_COMMENTS),
            retrying: HashSet::new(),
            parked: Vec::new(),
            lanes,
            resumed: resume.as_ref().is_some_and(|resume| resume.after.is_some()),
            cursor: resume.map(|resume| resume.cursor),
            retries: Arc::new(RetrySchedule::new(Backoff::new(
                retry_interval,
                retry_interval.saturating_mul(16),
            ))),
        }
    }

    /// Takes an approval out of the pending or recently resolved ones, to change it.
    fn take_tracked(&mut self, approval_id: &str) -> Option<Tracked> {
        if let Some(tracked) = self.pending.remove(approval_id) {
            return Some(tracked);
        }
        let index = self
            .resolved
            .iter()
            .position(|tracked| tracked.approval.id == approval_id)?;
        self.resolved.remove(index)
    }

    /// Puts back an approval taken out by [`Relay::take_tracked`], where its state says.
    fn put_tracked(&mut self, tracked: Tracked) {
        if tracked.approval.state() == pb::ApprovalState::Pending {
            self.pending.insert(tracked.approval.id.clone(), tracked);
        } else {
            self.resolved.push_back(tracked);
        }
    }

    /// Whether the approval still has work under way or waiting for a retry on GitHub.
    fn unfinished(&self, approval_id: &str) -> bool {
        self.pending
            .get(approval_id)
            .into_iter()
            .chain(
                self.resolved
                    .iter()
                    .filter(|tracked| tracked.approval.id == approval_id),
            )
            .any(|tracked| {
                !tracked.in_flight.is_empty()
                    || !tracked.undelivered.is_empty()
                    || tracked
                        .messages
                        .iter()
                        .any(|message| message.stale || message.writing)
            })
    }

    /// The end of handling a watch item's part for `approval_id`: it stays in flight while
    /// the approval's messages are not all written.
    fn hold_until_written(&self, approval_id: &str, part: Option<Part>) {
        let (Some(cursor), Some(part)) = (&self.cursor, part) else {
            return;
        };
        if self.unfinished(approval_id) {
            cursor.park(approval_id, part);
        } else {
            part.done();
            cursor.release(approval_id);
        }
    }

    /// Once the approval's messages are all written: no retry is due for it any more, and
    /// the watch items waiting for it are handled.
    fn release_if_written(&self, approval_id: &str) {
        if self.unfinished(approval_id) {
            return;
        }
        self.retries.succeeded(approval_id);
        if let Some(cursor) = &self.cursor {
            cursor.release(approval_id);
        }
    }

    /// After a start that resumes the watch: the pending approvals, as a snapshot would have
    /// brought them (retried until the server answers).
    async fn adopt_pending(&mut self) {
        let approvals = pending_approvals(&self.client, CHANNEL, self.retry_interval)
            .await
            .unwrap_or_else(|error| {
                tracing::error!(%error, "cannot list the pending approvals; their comments wait for their next event");
                Vec::new()
            });
        tracing::info!(
            pending = approvals.len(),
            "resuming the watch after the persisted cursor"
        );
        for approval in approvals {
            self.update(approval).await;
        }
        self.catch_up().await;
    }

    /// Handles inputs until the channel closes; retries failed deliveries and edits when due.
    pub async fn run(mut self, mut inputs: mpsc::Receiver<Input>) {
        if self.resumed {
            self.adopt_pending().await;
        }
        let retries = self.retries.clone();
        loop {
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(input) => self.handle(input).await,
                    None => return,
                },
                due = retries.next_due() => {
                    for approval_id in due {
                        self.retry_failed(&approval_id);
                    }
                }
            }
        }
    }

    async fn handle(&mut self, input: Input) {
        match input {
            Input::Watch(item, part) => match *item {
                WatchItem::Snapshot(approvals) => {
                    self.reconcile(approvals, part.as_ref()).await;
                    if let Some(part) = part {
                        part.done();
                    }
                }
                WatchItem::Event(event) => {
                    let kind = event.kind();
                    if let Some(approval) = event.approval {
                        if kind == pb::EventKind::Requested && is_granted(&approval) {
                            tracing::info!(approval_id = %approval.id, seq = event.seq, "a session grant approved a call; posting a notice");
                            let notice = render::grant_notice(&approval);
                            self.post_notice(&approval, notice, part.as_ref().map(Part::share));
                        }
                        if kind == pb::EventKind::Reminded {
                            tracing::info!(approval_id = %approval.id, seq = event.seq, "reminding the deciders");
                            let reminder = render::reminder(&approval, &event.detail);
                            self.post_notice(&approval, reminder, part.as_ref().map(Part::share));
                        }
                        let approval_id = approval.id.clone();
                        self.update(approval).await;
                        self.hold_until_written(&approval_id, part);
                    } else if let Some(part) = part {
                        part.done();
                    }
                }
            },
            Input::Comments(comments) => self.handle_comments(comments).await,
            Input::RetryCommand(incoming, attempts) => {
                self.retrying.remove(&incoming.comment.id);
                self.handle_comment(incoming, attempts).await;
            }
            Input::Delivered(delivered) => self.delivered(*delivered).await,
            Input::Written(written) => self.written(*written),
        }
    }

    async fn handle_comments(&mut self, comments: Vec<IncomingComment>) {
        // The worker's earlier replies first: the commands they answer are done.
        for incoming in &comments {
            if let Some(answered) = self.replied_by_bot(&incoming.comment) {
                self.handled.insert(answered);
            }
        }
        for incoming in comments {
            self.handle_comment(incoming, 0).await;
        }
    }

    fn replied_by_bot(&self, comment: &IssueComment) -> Option<u64> {
        let author = comment.user.as_ref()?;
        if !author.login.eq_ignore_ascii_case(self.api.bot_login()) {
            return None;
        }
        replied_comment_id(comment.text())
    }

    /// A snapshot: every pending approval of the channel. Approvals tracked as pending but
    /// absent were resolved meanwhile.
    async fn reconcile(&mut self, approvals: Vec<pb::Approval>, part: Option<&Part>) {
        let present: HashSet<&str> = approvals.iter().map(|a| a.id.as_str()).collect();
        let gone: Vec<String> = self
            .pending
            .keys()
            .filter(|id| !present.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            match self.client.get_approval(&id).await {
                Ok(approval) => {
                    self.update(approval).await;
                    self.hold_until_written(&id, part.map(Part::share));
                }
                Err(error) => {
                    tracing::warn!(approval_id = %id, %error, "cannot read an approval that left the snapshot")
                }
            }
        }
        for approval in approvals {
            let approval_id = approval.id.clone();
            self.update(approval).await;
            self.hold_until_written(&approval_id, part.map(Part::share));
        }
        self.catch_up().await;
        // Whatever resolved while the watch was not following (a start, or a cursor the
        // server no longer retained).
        self.resync_recently_resolved(part).await;
    }

    /// Commands written while the worker was away or out of touch: GitHub does not redeliver
    /// webhooks, so after each snapshot the comments of every issue with a pending request
    /// are listed once, from the earliest such request on (polling or not). Comments seen
    /// before are recognised by id, answered ones by the marker of the reply.
    async fn catch_up(&mut self) {
        let mut since: BTreeMap<IssueRef, OffsetDateTime> = BTreeMap::new();
        for message in self.pending.values().flat_map(|tracked| &tracked.messages) {
            since
                .entry(message.issue.clone())
                .and_modify(|earliest| *earliest = (*earliest).min(message.created_at))
                .or_insert(message.created_at);
        }
        for (issue, since) in since {
            self.catch_up_on(&issue, since).await;
        }
    }

    /// Lists the comments written on `issue` since `since` and handles them.
    async fn catch_up_on(&mut self, issue: &IssueRef, since: OffsetDateTime) {
        match self.api.list_comments(issue, Some(since)).await {
            Ok(comments) => self.handle_comments(unedited(issue, comments)).await,
            Err(error) => {
                tracing::warn!(%issue, %error, "cannot list the comments written while away")
            }
        }
    }

    /// After a restart: approvals resolved while the worker was away still show "waiting" on
    /// GitHub. Look at the most recent resolved ones and correct their messages.
    async fn resync_recently_resolved(&mut self, part: Option<&Part>) {
        use pb::ApprovalState as State;
        let request = pb::ListApprovalsRequest {
            states: [
                State::Approved,
                State::Rejected,
                State::Expired,
                State::Cancelled,
                State::Consumed,
            ]
            .into_iter()
            .map(i32::from)
            .collect(),
            channel: CHANNEL.to_string(),
            page_size: STARTUP_RESYNC_PAGE,
            ..Default::default()
        };
        match self.client.list_approvals(request).await {
            Ok(listed) => {
                for approval in listed.approvals {
                    if approval.deliveries.iter().any(|d| d.channel == CHANNEL) {
                        let approval_id = approval.id.clone();
                        self.update(approval).await;
                        self.hold_until_written(&approval_id, part.map(Part::share));
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot list resolved approvals to resync"),
        }
    }

    /// Brings GitHub in line with the approval's current state.
    async fn update(&mut self, approval: pb::Approval) {
        let pending = approval.state() == pb::ApprovalState::Pending;
        if let Some(mut tracked) = self.pending.remove(&approval.id) {
            tracked.approval = approval;
            if pending {
                // An escalation routes the approval to its group's destinations as well.
                let added: Vec<Target> = self
                    .targets_of(&tracked.approval)
                    .into_iter()
                    .filter(|target| !tracked.routed.contains(target))
                    .collect();
                if !added.is_empty() {
                    tracked.routed.extend(added.iter().cloned());
                    tracked.undelivered.extend(added);
                    self.deliver(&mut tracked);
                }
            }
            self.sync_messages(&mut tracked);
            if pending {
                self.pending.insert(tracked.approval.id.clone(), tracked);
            } else {
                self.finish(tracked);
            }
            return;
        }
        if let Some(index) = self
            .resolved
            .iter()
            .position(|tracked| tracked.approval.id == approval.id)
        {
            if let Some(mut tracked) = self.resolved.remove(index) {
                tracked.approval = approval;
                self.sync_messages(&mut tracked);
                self.resolved.push_back(tracked);
            }
            return;
        }
        let routed = self.targets_of(&approval);
        let mut tracked = Tracked {
            undelivered: if pending { routed.clone() } else { Vec::new() },
            approval,
            messages: Vec::new(),
            in_flight: Vec::new(),
            routed,
        };
        self.adopt_recorded(&mut tracked).await;
        self.deliver(&mut tracked);
        if pending {
            self.pending.insert(tracked.approval.id.clone(), tracked);
        } else {
            self.finish(tracked);
        }
    }

    fn finish(&mut self, tracked: Tracked) {
        if tracked.messages.is_empty() && tracked.in_flight.is_empty() {
            return;
        }
        for message in &tracked.messages {
            self.stop_polling_if_idle(&message.issue);
        }
        self.resolved.push_back(tracked);
        while self.resolved.len() > REMEMBERED_RESOLVED {
            self.resolved.pop_front();
        }
    }

    fn stop_polling_if_idle(&self, issue: &IssueRef) {
        let Some(poll_targets) = &self.poll_targets else {
            return;
        };
        let still_pending = self
            .pending
            .values()
            .any(|tracked| tracked.message_on(issue).is_some());
        if !still_pending {
            poll_targets.unwatch(issue);
        }
    }

    /// The GitHub targets of an approval: its `github` routes (an empty target means the
    /// default), or the default when it has no routes at all (and, once escalated, its
    /// escalation group's destinations).
    fn targets_of(&self, approval: &pb::Approval) -> Vec<Target> {
        let mut targets = Vec::new();
        for target in route_targets(approval, CHANNEL) {
            let parsed = if target.is_empty() {
                if self.default_target.is_none() {
                    tracing::warn!(approval_id = %approval.id, "approval for the default GitHub target, but none is configured");
                }
                self.default_target.clone()
            } else {
                match target.parse::<Target>() {
                    Ok(target) => Some(target),
                    Err(error) => {
                        tracing::warn!(approval_id = %approval.id, %error, "route target not usable");
                        None
                    }
                }
            };
            if let Some(target) = parsed {
                if !targets.contains(&target) {
                    targets.push(target);
                }
            }
        }
        targets
    }

    /// Takes over the messages recorded on the server for this approval (after a restart).
    async fn adopt_recorded(&mut self, tracked: &mut Tracked) {
        let recorded: Vec<(IssueRef, MessageKind)> = tracked
            .approval
            .deliveries
            .iter()
            .filter(|delivery| delivery.channel == CHANNEL)
            .filter_map(|delivery| {
                let issue: IssueRef = delivery.target.parse().ok()?;
                let kind = parse_message_ref(&delivery.message_ref)?;
                Some((issue, kind))
            })
            .collect();
        for (issue, kind) in recorded {
            if tracked.message_on(&issue).is_some() {
                continue;
            }
            let current = match &kind {
                MessageKind::Comment(id) => self
                    .api
                    .get_comment(&issue.repo, *id)
                    .await
                    .map(|found| found.map(|c| (c.text().to_string(), c.created_at))),
                MessageKind::IssueBody => self
                    .api
                    .get_issue(&issue)
                    .await
                    .map(|found| found.map(|i| (i.body.unwrap_or_default(), i.created_at))),
            };
            let (rendered, message_created_at) = match current {
                Ok(Some(found)) => found,
                Ok(None) => {
                    tracing::warn!(%issue, approval_id = %tracked.approval.id, "the recorded request message is gone");
                    continue;
                }
                Err(error) => {
                    tracing::warn!(%issue, approval_id = %tracked.approval.id, %error, "cannot read the recorded request message");
                    // Assume it is current; the next change of the approval rewrites it.
                    (
                        render::request_body(&tracked.approval),
                        created_at(&tracked.approval),
                    )
                }
            };
            // This target is delivered.
            tracked
                .undelivered
                .retain(|target| !target_covers(target, &issue, &kind));
            let message = Message {
                issue,
                kind,
                created_at: message_created_at,
                rendered,
                stale: false,
                writing: false,
            };
            self.poll(&message, &tracked.approval);
            tracked.messages.push(message);
        }
        self.sync_messages(tracked);
    }

    /// Posts (or finds) the request on each undelivered target and records the delivery, in
    /// the approval's lane; [`Relay::delivered`] takes the outcome.
    fn deliver(&mut self, tracked: &mut Tracked) {
        for target in std::mem::take(&mut tracked.undelivered) {
            tracked.in_flight.push(target.clone());
            let (api, client, inputs) =
                (self.api.clone(), self.client.clone(), self.inputs.clone());
            let approval = tracked.approval.clone();
            self.lanes.push(&approval.id.clone(), async move {
                let result = match still_pending(&client, &approval).await {
                    Ok(true) => deliver_to(&api, &client, &approval, &target)
                        .await
                        .map(Some),
                    Ok(false) => Ok(None),
                    Err(error) => Err(error.into()),
                };
                let delivered = Delivered {
                    approval_id: approval.id,
                    target,
                    result,
                };
                // A closed queue means the worker is stopping; the delivery is recorded.
                let _ = inputs.send(Input::Delivered(Box::new(delivered))).await;
            });
        }
    }

    /// Takes the outcome of a delivery: the message joins its approval (and is brought up to
    /// the approval's state, which may have moved on meanwhile), or the target waits for the
    /// approval's retry. Commands parked for its issue are handled now.
    async fn delivered(&mut self, delivered: Delivered) {
        let Delivered {
            approval_id,
            target,
            result,
        } = delivered;
        let Some(mut tracked) = self.take_tracked(&approval_id) else {
            tracing::debug!(approval_id, %target, "a delivery ended for an approval no longer tracked");
            self.release_if_written(&approval_id);
            return;
        };
        tracked.in_flight.retain(|t| t != &target);
        let mut catch_up = None;
        match result {
            Ok(Some(Posted { message, found })) => {
                if found && tracked.approval.state() == pb::ApprovalState::Pending {
                    catch_up = Some((message.issue.clone(), message.created_at));
                }
                self.poll(&message, &tracked.approval);
                tracked.messages.push(message);
                self.sync_messages(&mut tracked);
            }
            Ok(None) => {
                tracing::info!(approval_id, %target, "resolved before its request was posted; not posting it");
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(approval_id, %target, %error, "delivery failed; will try again");
                tracked.undelivered.push(target);
                self.retries.failed(&approval_id, None);
            }
            Err(error) => {
                tracing::error!(approval_id, %target, %error, "delivery failed");
            }
        }
        self.put_tracked(tracked);
        self.release_if_written(&approval_id);
        for incoming in std::mem::take(&mut self.parked) {
            self.handle_comment(incoming, 0).await;
        }
        // A request an earlier run posted and did not record: the catch-up after the
        // snapshot could not know its issue, and a command written under it while the worker
        // was down reaches no webhook again.
        if let Some((issue, since)) = catch_up {
            self.catch_up_on(&issue, since).await;
        }
    }

    /// Polls the message's issue for commands, from the message's creation on.
    fn poll(&self, message: &Message, approval: &pb::Approval) {
        if approval.state() != pb::ApprovalState::Pending {
            return;
        }
        if let Some(poll_targets) = &self.poll_targets {
            poll_targets.watch(&message.issue, message.created_at);
        }
    }

    /// Rewrites, in the approval's lane, every message whose text no longer matches the
    /// approval; [`Relay::written`] takes the outcome. A message with an edit under way is
    /// rewritten again once it is over, if the approval moved on meanwhile.
    fn sync_messages(&self, tracked: &mut Tracked) {
        let body = render::request_body(&tracked.approval);
        for message in &mut tracked.messages {
            if message.writing || (message.rendered == body && !message.stale) {
                continue;
            }
            message.writing = true;
            let (api, inputs) = (self.api.clone(), self.inputs.clone());
            let approval_id = tracked.approval.id.clone();
            let mut copy = message.clone();
            let body = body.clone();
            self.lanes.push(&approval_id.clone(), async move {
                let message_ref = copy.message_ref();
                write_message(&api, &mut copy, body).await;
                let written = Written {
                    approval_id,
                    message_ref,
                    message: copy,
                };
                // A closed queue means the worker is stopping.
                let _ = inputs.send(Input::Written(Box::new(written))).await;
            });
        }
    }

    /// Takes the outcome of an edit: the message now shows what was written (or is stale,
    /// and its approval's retry is scheduled), and is brought up to the approval's state if it
    /// moved on.
    fn written(&mut self, written: Written) {
        let Written {
            approval_id,
            message_ref,
            message: outcome,
        } = written;
        let Some(mut tracked) = self.take_tracked(&approval_id) else {
            self.release_if_written(&approval_id);
            return;
        };
        if let Some(message) = tracked
            .messages
            .iter_mut()
            .find(|message| message.issue == outcome.issue && message.message_ref() == message_ref)
        {
            message.rendered = outcome.rendered;
            message.stale = outcome.stale;
            message.writing = false;
        }
        if outcome.stale {
            self.retries.failed(&approval_id, None);
        } else {
            self.sync_messages(&mut tracked);
        }
        self.put_tracked(tracked);
        self.release_if_written(&approval_id);
    }

    /// Posts a short comment on the approval's issues: the notice that a session grant
    /// approved it at once (approvers see every use of the grants they gave), or a reminder.
    /// Repository targets (an issue per approval) get none: it would open an issue per use.
    /// Posted in the approval's lane; `part` (the watch item's share) is done once it is.
    fn post_notice(&self, approval: &pb::Approval, notice: String, part: Option<Part>) {
        let issues: Vec<IssueRef> = self
            .targets_of(approval)
            .into_iter()
            .filter_map(|target| match target {
                Target::Issue(issue) => Some(issue),
                Target::Repo(_) => None,
            })
            .collect();
        let (api, approval_id) = (self.api.clone(), approval.id.clone());
        self.lanes.push(&approval.id, async move {
            for issue in issues {
                if let Err(error) = api.create_comment(&issue, &notice).await {
                    tracing::warn!(approval_id, %issue, %error, "cannot post a notice");
                }
            }
            if let Some(part) = part {
                part.done();
            }
        });
    }

    /// Tries again, in its lane, what failed for an approval for a reason that may pass: its
    /// undelivered targets and stale messages. Due per approval on the runtime's schedule
    /// (exponential backoff with jitter from `retry_interval`).
    fn retry_failed(&mut self, approval_id: &str) {
        let Some(mut tracked) = self.take_tracked(approval_id) else {
            self.release_if_written(approval_id);
            return;
        };
        self.deliver(&mut tracked);
        self.sync_messages(&mut tracked);
        self.put_tracked(tracked);
        self.release_if_written(approval_id);
    }

    async fn handle_comment(&mut self, incoming: IncomingComment, attempts: u32) {
        let comment_id = incoming.comment.id;
        if self.handled.contains(&comment_id) || self.retrying.contains(&comment_id) {
            return;
        }
        let Some(author) = incoming.comment.user.clone() else {
            self.handled.insert(comment_id);
            return;
        };
        if self.api.is_bot(&author) {
            self.handled.insert(comment_id);
            if author.login.eq_ignore_ascii_case(self.api.bot_login()) {
                tracing::debug!(comment_id, "ignoring the worker's own comment");
            } else if parse_command(incoming.comment.text()).is_some() {
                tracing::info!(comment_id, author = %author.login, issue = %incoming.issue, "ignoring a command by a bot account: only people decide");
            }
            return;
        }
        let Some(command) = parse_command(incoming.comment.text()) else {
            self.handled.insert(comment_id);
            return;
        };
        let issue = &incoming.issue;
        if self.delivering_to(issue) {
            // Which approvals a command may name is known once every request on the issue
            // is posted.
            tracing::debug!(%issue, comment_id, "command on an issue whose request is being posted; handled once it is");
            self.parked.push(incoming);
            return;
        }
        if !self.knows_issue(issue) {
            // Not marked handled: right after a start the watch snapshot may not have been
            // adopted yet, and the same comment comes back by poll or catch-up once it is.
            tracing::debug!(%issue, comment_id, "command on an issue without known approvals; ignored for now");
            return;
        }
        match self.apply(issue, comment_id, &author, &command).await {
            Ok(()) => {
                self.handled.insert(comment_id);
            }
            Err(error) if error.is_transient() && attempts + 1 < MAX_COMMAND_ATTEMPTS => {
                tracing::warn!(%issue, comment_id, %error, "command failed; will try again");
                self.retrying.insert(comment_id);
                let inputs = self.inputs.clone();
                let delay = self
                    .retry_interval
                    .min(Duration::from_secs(1 << attempts.min(5)));
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    // A closed queue means the worker is stopping.
                    let _ = inputs
                        .send(Input::RetryCommand(incoming, attempts + 1))
                        .await;
                });
            }
            Err(error) => {
                tracing::error!(%issue, comment_id, attempts = attempts + 1, %error, "command failed; giving up");
                self.handled.insert(comment_id);
                // Silence would read as "not seen": say it must be repeated.
                self.explain(issue, comment_id, &author, &Reply::NotRecorded)
                    .await;
            }
        }
    }

    /// Whether a request is being posted on `issue` (or a repository target may open it).
    fn delivering_to(&self, issue: &IssueRef) -> bool {
        self.pending
            .values()
            .chain(self.resolved.iter())
            .flat_map(|tracked| &tracked.in_flight)
            .any(|target| match target {
                Target::Issue(wanted) => wanted == issue,
                Target::Repo(repo) => repo == &issue.repo,
            })
    }

    fn knows_issue(&self, issue: &IssueRef) -> bool {
        self.pending
            .values()
            .chain(self.resolved.iter())
            .any(|tracked| tracked.message_on(issue).is_some())
    }

    async fn apply(
        &mut self,
        issue: &IssueRef,
        comment_id: u64,
        author: &Author,
        command: &Command,
    ) -> Result<(), CommandError> {
        let repo = &issue.repo;
        let waiting: Vec<&pb::Approval> = self
            .pending
            .values()
            .filter(|t| t.message_on(issue).is_some_and(|m| m.precedes(comment_id)))
            .map(|t| &t.approval)
            .collect();
        let chosen: pb::Approval = match &command.approval_id {
            Some(given) => {
                let named: Vec<&pb::Approval> = self
                    .pending
                    .values()
                    .chain(self.resolved.iter())
                    .filter(|t| t.message_on(issue).is_some())
                    .map(|t| &t.approval)
                    .filter(|approval| names_approval(given, &approval.id))
                    .collect();
                match named.as_slice() {
                    [one] => (*one).clone(),
                    [] => {
                        let reply = Reply::UnknownId {
                            given: given.clone(),
                        };
                        return self.refuse(issue, comment_id, author, &reply).await;
                    }
                    several => {
                        let candidates = several.iter().map(|a| (*a).clone()).collect();
                        let reply = Reply::Ambiguous { candidates };
                        return self.refuse(issue, comment_id, author, &reply).await;
                    }
                }
            }
            None => match waiting.as_slice() {
                [one] => (*one).clone(),
                [] => {
                    return self
                        .refuse(issue, comment_id, author, &Reply::NothingPending)
                        .await
                }
                several => {
                    let candidates = several.iter().map(|a| (*a).clone()).collect();
                    let reply = Reply::Ambiguous { candidates };
                    return self.refuse(issue, comment_id, author, &reply).await;
                }
            },
        };

        let permission = self.api.permission(repo, &author.login).await?;
        if !permission.can_write {
            tracing::info!(%issue, comment_id, login = %author.login, level = permission.level.as_str(), "command refused: no write access");
            let reply = Reply::NotPermitted {
                repo: repo.clone(),
                level: permission.level.as_str().to_string(),
            };
            return self.refuse(issue, comment_id, author, &reply).await;
        }

        let verdict = match command.verdict {
            Verdict::Approve => pb::Verdict::Approve,
            Verdict::Reject => pb::Verdict::Reject,
        };
        let decided = self
            .client
            .decide(pb::DecideRequest {
                approval_id: chosen.id.clone(),
                verdict: verdict.into(),
                scope: pb::Scope::Once.into(),
                reason: command.reason.clone(),
                decider: Some(pb::Decider {
                    channel: CHANNEL.to_string(),
                    user_id: author.id.to_string(),
                    display_name: author.login.clone(),
                }),
                idempotency_key: comment_id.to_string(),
                edited_arguments_json: command.edited_arguments.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await;
        let response = match decided {
            Ok(response) => response,
            Err(
                error @ (ClientError::PermissionDenied(_)
                | ClientError::FailedPrecondition(_)
                | ClientError::InvalidArgument(_)
                | ClientError::NotFound(_)),
            ) => {
                tracing::info!(%issue, comment_id, approval_id = %chosen.id, %error, "decision refused by the server");
                let reply = Reply::Refused {
                    message: server_message(&error),
                };
                return self.refuse(issue, comment_id, author, &reply).await;
            }
            Err(error) => return Err(error.into()),
        };
        let outcome = response.outcome();
        tracing::info!(%issue, comment_id, approval_id = %chosen.id, ?outcome, verdict = ?command.verdict, "decision sent");
        let reaction = match (outcome, command.verdict) {
            (pb::DecideOutcome::AlreadyResolved, _) => ReactionContent::Confused,
            (_, Verdict::Approve) => ReactionContent::ThumbsUp,
            (_, Verdict::Reject) => ReactionContent::ThumbsDown,
        };
        self.react(repo, comment_id, reaction).await;
        if outcome == pb::DecideOutcome::AlreadyResolved {
            if let Some(approval) = response.approval.clone() {
                let reply = Reply::AlreadyResolved {
                    approval: Box::new(approval),
                };
                self.reply(issue, comment_id, author, &reply);
            }
        }
        if let Some(approval) = response.approval {
            let approval_id = approval.id.clone();
            self.update(approval).await;
            self.release_if_written(&approval_id);
        }
        Ok(())
    }

    /// A command not applied: a confused reaction and a reply saying why.
    async fn refuse(
        &self,
        issue: &IssueRef,
        comment_id: u64,
        author: &Author,
        reply: &Reply,
    ) -> Result<(), CommandError> {
        self.explain(issue, comment_id, author, reply).await;
        Ok(())
    }

    /// A confused reaction on the command and a reply saying why it was not applied.
    async fn explain(&self, issue: &IssueRef, comment_id: u64, author: &Author, reply: &Reply) {
        self.react(&issue.repo, comment_id, ReactionContent::Confused)
            .await;
        self.reply(issue, comment_id, author, reply);
    }

    async fn react(&self, repo: &RepoName, comment_id: u64, reaction: ReactionContent) {
        if let Err(error) = self.api.add_reaction(repo, comment_id, reaction).await {
            tracing::warn!(%repo, comment_id, ?reaction, %error, "adding a reaction failed");
        }
    }

    /// Replies to a command, in the lane of the issue's replies: a slow or failing GitHub
    /// holds up neither the relay nor any approval's comment.
    fn reply(&self, issue: &IssueRef, comment_id: u64, author: &Author, reply: &Reply) {
        let body = render::reply_body(&author.login, comment_id, reply);
        let (api, issue) = (self.api.clone(), issue.clone());
        self.lanes.push(&format!("replies:{issue}"), async move {
            if let Err(error) = api.create_comment(&issue, &body).await {
                tracing::warn!(%issue, comment_id, %error, "replying to a command failed");
            }
        });
    }
}

/// Whether `approval` is still pending as the server has it now: a watch's copy may be old (a
/// resumed watch replays what happened while the worker was stopped), and no request is
/// posted for an approval resolved meanwhile.
async fn still_pending(client: &Client, approval: &pb::Approval) -> Result<bool, ClientError> {
    if approval.deliveries.iter().any(|d| d.channel == CHANNEL) {
        return Ok(approval.state() == pb::ApprovalState::Pending);
    }
    let current = client.get_approval(&approval.id).await?;
    Ok(current.state() == pb::ApprovalState::Pending)
}

/// Posts (or finds, after a crash) the request for `approval` on `target` and records the
/// delivery on the server.
async fn deliver_to(
    api: &GitHubApi,
    client: &Client,
    approval: &pb::Approval,
    target: &Target,
) -> Result<Posted, CommandError> {
    let body = render::request_body(approval);
    let not_before = created_at(approval);
    let (issue, kind, current, message_created_at, found) = match target {
        Target::Issue(issue) => {
            let posted = api
                .find_or_post_comment(issue, &approval.id, not_before, &body)
                .await;
            let placed = match posted {
                Err(error) if error.status() == Some(422) => {
                    tracing::warn!(approval_id = %approval.id, %issue, %error, "GitHub refused the request comment (422); posting it once more without the arguments");
                    let minimal = render::minimal_request_body(approval);
                    api.find_or_post_comment(issue, &approval.id, not_before, &minimal)
                        .await?
                }
                other => other?,
            };
            let comment = placed.item;
            let current = comment.text().to_string();
            (
                issue.clone(),
                MessageKind::Comment(comment.id),
                current,
                comment.created_at,
                placed.found,
            )
        }
        Target::Repo(repo) => {
            let title = render::issue_title(approval);
            let placed = match api
                .find_or_open_issue(repo, &approval.id, not_before, &title, &body)
                .await
            {
                Err(error) if error.status() == Some(422) => {
                    tracing::warn!(approval_id = %approval.id, %repo, %error, "GitHub refused the request issue (422); opening it once more without the arguments");
                    let minimal = render::minimal_request_body(approval);
                    api.find_or_open_issue(repo, &approval.id, not_before, &title, &minimal)
                        .await?
                }
                other => other?,
            };
            let opened = placed.item;
            let issue = IssueRef {
                repo: repo.clone(),
                number: opened.number,
            };
            (
                issue,
                MessageKind::IssueBody,
                opened.body.unwrap_or_default(),
                opened.created_at,
                placed.found,
            )
        }
    };
    let mut message = Message {
        issue,
        kind,
        created_at: message_created_at,
        rendered: current,
        stale: false,
        writing: false,
    };
    client
        .record_delivery(pb::RecordDeliveryRequest {
            approval_id: approval.id.clone(),
            channel: CHANNEL.to_string(),
            target: message.issue.to_string(),
            message_ref: message.message_ref(),
        })
        .await?;
    tracing::info!(approval_id = %approval.id, issue = %message.issue, message_ref = %message.message_ref(), "request delivered");
    // A message found from an earlier run may show an older state.
    if message.rendered != body {
        write_message(api, &mut message, body).await;
    }
    Ok(Posted { message, found })
}

/// Rewrites one message; when GitHub refuses the body (422) it is retried once without
/// the arguments, and counts as written so that it is not tried again and again.
async fn write_message(api: &GitHubApi, message: &mut Message, body: String) {
    let mut written = write_body(api, message, &body).await;
    if let Err(error) = &written {
        if error.status() == Some(422) {
            tracing::warn!(issue = %message.issue, message_ref = %message.message_ref(), %error, "GitHub refused the edit (422); writing it once more without the arguments");
            let minimal = render::minimal_request_body_of(&body);
            written = write_body(api, message, &minimal).await;
        }
    }
    match written {
        Ok(()) => {
            message.rendered = body;
            message.stale = false;
        }
        Err(error) => {
            tracing::warn!(issue = %message.issue, message_ref = %message.message_ref(), %error, "editing the request message failed");
            message.stale = true;
        }
    }
}

async fn write_body(api: &GitHubApi, message: &Message, body: &str) -> Result<(), ApiError> {
    match message.kind {
        MessageKind::Comment(id) => api.update_comment(&message.issue.repo, id, body).await,
        MessageKind::IssueBody => api.update_issue_body(&message.issue, body).await,
    }
}

fn parse_message_ref(message_ref: &str) -> Option<MessageKind> {
    match message_ref.split_once('/')? {
        ("comment", id) => id.parse().ok().map(MessageKind::Comment),
        ("issue", _) => Some(MessageKind::IssueBody),
        _ => None,
    }
}

/// Whether a recorded message on `issue` delivers `target`.
fn target_covers(target: &Target, issue: &IssueRef, kind: &MessageKind) -> bool {
    match (target, kind) {
        (Target::Issue(wanted), MessageKind::Comment(_)) => wanted == issue,
        (Target::Repo(repo), MessageKind::IssueBody) => repo == &issue.repo,
        _ => false,
    }
}

fn created_at(approval: &pb::Approval) -> OffsetDateTime {
    approval
        .created_at
        .as_ref()
        .and_then(|at| OffsetDateTime::from_unix_timestamp(at.seconds).ok())
        .unwrap_or_else(OffsetDateTime::now_utc)
}

/// The server's own words, without the SDK's prefix.
fn server_message(error: &ClientError) -> String {
    match error {
        ClientError::PermissionDenied(message)
        | ClientError::FailedPrecondition(message)
        | ClientError::InvalidArgument(message)
        | ClientError::NotFound(message) => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_refs_round_trip() {
        let issue: IssueRef = "acme/widgets#3".parse().unwrap();
        let comment = Message {
            issue: issue.clone(),
            kind: MessageKind::Comment(99),
            created_at: OffsetDateTime::UNIX_EPOCH,
            rendered: String::new(),
            stale: false,
            writing: false,
        };
        assert_eq!(comment.message_ref(), "comment/99");
        assert_eq!(
            parse_message_ref("comment/99"),
            Some(MessageKind::Comment(99))
        );
        assert_eq!(parse_message_ref("issue/3"), Some(MessageKind::IssueBody));
        assert_eq!(parse_message_ref("chat:1"), None);
        assert!(comment.precedes(100));
        assert!(!comment.precedes(99));
        assert!(target_covers(
            &Target::Issue(issue.clone()),
            &issue,
            &MessageKind::Comment(1)
        ));
        assert!(target_covers(
            &Target::Repo(issue.repo.clone()),
            &issue,
            &MessageKind::IssueBody
        ));
        assert!(!target_covers(
            &Target::Repo(issue.repo.clone()),
            &issue,
            &MessageKind::Comment(1)
        ));
    }
}
