//! The GitHub channel on the shared worker runtime: each pending approval of the `github`
//! channel gets a request comment on its issue (or an issue of its own in a repository
//! target), edited on every change — decided here or elsewhere, expired, cancelled — and
//! reminders and session-grant notices as short comments.
//!
//! Crash safety: with a state directory, the intent of each post is in the outbox before the
//! POST and the comment's id right after; the server's delivery record follows. A restart
//! that finds an intent without an id looks for the comment by its hidden marker and adopts
//! it instead of posting a second one (without a state directory every post looks first).
//! A comment adopted rather than posted now may have commands under it that no webhook will
//! bring again: its issue's comments are listed once from it on.

use std::sync::Arc;

use countersign_client::{pb, Client, ClientError};
use countersign_worker::approval::{
    is_granted, pending_approvals, recently_resolved_with_deliveries, route_targets,
};
use countersign_worker::channel::Channel;
use countersign_worker::outbox::{Outbox, OutboxError};
use countersign_worker::retry::{Classify, Verdict};
use pb::ApprovalState;
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use crate::api::{ApiError, GitHubApi, IssueComment, IssueSummary, Placed};
use crate::inbound::Input;
use crate::incoming::{unedited, PollTargets};
use crate::render;
use crate::shown::{Board, Message, MessageKind};
use crate::target::{IssueRef, RepoName, Target, CHANNEL};

/// Resolved approvals looked at after a snapshot, to correct comments left pending.
const RESYNC_PAGE: u32 = 50;

/// Why an approval's messages could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error(transparent)]
    GitHub(#[from] ApiError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error("cannot write the outbox, so not posting: {0}")]
    Outbox(#[from] OutboxError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::GitHub(error) => error.verdict(),
            ShowError::Server(error) if error.is_transient() => Verdict::Retry { after: None },
            ShowError::Server(_) => Verdict::Final,
            // Without the intent on disk a crash could post twice.
            ShowError::Outbox(_) => Verdict::Retry { after: None },
        }
    }
}

#[derive(Clone)]
pub struct GitHubChannel {
    pub client: Client,
    pub api: Arc<GitHubApi>,
    pub board: Arc<Board>,
    pub outbox: Option<Outbox>,
    pub default_target: Option<Target>,
    pub poll_targets: Option<Arc<PollTargets>>,
    /// Where comments found by catching up go (the commands' queue).
    pub inputs: mpsc::Sender<Input>,
    /// True once the start-up adoption ([`GitHubChannel::adopt_pending`]) has put every
    /// pending approval on the board.
    pub adopted: watch::Receiver<bool>,
}

impl Channel for GitHubChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Posts the request on every target not delivered yet (while pending) and edits every
    /// message that does not show the approval as it is.
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        if self.board.get(&approval.id).is_none() {
            // The start-up adoption may be reading this approval's messages: not twice. A
            // start-up adoption that ended without a word lets it go too.
            let _ = self.adopted.clone().wait_for(|adopted| *adopted).await;
        }
        let (approval, mut messages) = match self.board.get(&approval.id) {
            Some(shown) => (approval.clone(), shown.messages),
            // First seen in this run: as the server has it now (a replayed event's copy may be
            // old), with the messages recorded on the server or left in the outbox.
            None => {
                let current = self.client.get_approval(&approval.id).await?;
                let adopted = self.adopt(&current).await?;
                self.board.put(&current, adopted.clone());
                if current.state() == ApprovalState::Pending {
                    self.follow(&adopted, true);
                }
                (current, adopted)
            }
        };
        let pending = approval.state() == ApprovalState::Pending;
        let mut failed = None;
        if pending {
            // Owed by this adoption, or by an earlier one whose listing failed.
            if let Err(error) = self.catch_up(&messages).await {
                failed = failed.or(keep(&approval, error.into()));
            }
        }
        if pending {
            for target in self.targets_of(&approval) {
                if messages.iter().any(|message| message.covers(&target)) {
                    continue;
                }
                self.board.posting(&target, true);
                let placed = self.place(&approval, &target).await;
                if let Ok((message, _)) = &placed {
                    // Known before the issue is no longer being posted on: a command
                    // checked in between must find it.
                    messages.push(message.clone());
                    self.board.put(&approval, messages.clone());
                }
                self.board.posting(&target, false);
                // Commands parked while the request was being posted.
                let _ = self.inputs.send(Input::Posted).await;
                match placed {
                    Ok((message, found)) => {
                        let message = std::slice::from_ref(&message);
                        self.follow(message, found);
                        if let Err(error) = self.catch_up(message).await {
                            failed = failed.or(keep(&approval, error.into()));
                        }
                    }
                    Err(error) => failed = failed.or(keep(&approval, error)),
                }
            }
        }
        if !pending {
            if let Err(error) = self.find_unfinished_posts(&approval, &mut messages).await {
                failed = failed.or(keep(&approval, error));
            }
        }
        let body = render::request_body(&approval);
        for message in messages.iter_mut().filter(|m| m.rendered != body) {
            match write_message(&self.api, message, &body).await {
                Ok(()) => message.rendered = body.clone(),
                Err(error) => failed = failed.or(keep(&approval, error.into())),
            }
        }
        self.board.put(&approval, messages.clone());
        if !pending {
            for message in &messages {
                self.stop_polling_if_idle(&message.issue, &approval.id);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// The approvals left in the outbox, those shown as pending (after a snapshot in mid-run
    /// one may have been resolved in the gap, behind any number of newer ones), and the most
    /// recently resolved ones with a request on GitHub: their messages may still say
    /// "waiting".
    async fn unfinished(&self) -> Result<Vec<String>, ShowError> {
        let mut ids: Vec<String> = self
            .outbox
            .iter()
            .flat_map(Outbox::all_unsettled)
            .map(|e| e.key)
            .collect();
        ids.extend(self.board.pending_ids());
        ids.extend(recently_resolved_with_deliveries(&self.client, CHANNEL, RESYNC_PAGE).await?);
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// A reminder, or the notice that a session grant approved a call at once (approvers see
    /// every use of the grants they gave), as a comment on the approval's issues. Repository
    /// targets get none: it would open an issue each time.
    async fn notice(&self, event: &pb::ApprovalEvent) -> Result<(), ShowError> {
        let Some(approval) = &event.approval else {
            return Ok(());
        };
        let notice = match event.kind() {
            pb::EventKind::Reminded => render::reminder(approval, &event.detail),
            pb::EventKind::Requested if is_granted(approval) => render::grant_notice(approval),
            _ => return Ok(()),
        };
        tracing::info!(approval_id = %approval.id, kind = ?event.kind(), "posting a notice");
        for target in self.targets_of(approval) {
            if let Target::Issue(issue) = target {
                if let Err(error) = self.api.create_comment(&issue, &notice).await {
                    tracing::warn!(approval_id = %approval.id, %issue, %error, "cannot post a notice");
                }
            }
        }
        Ok(())
    }
}

/// An error worth a retry is kept for the runtime; one that is final is logged and dropped.
fn keep(approval: &pb::Approval, error: ShowError) -> Option<ShowError> {
    match error.verdict() {
        Verdict::Retry { .. } => {
            tracing::warn!(approval_id = %approval.id, %error, "cannot bring GitHub up to date now; will retry");
            Some(error)
        }
        Verdict::Final => {
            tracing::error!(approval_id = %approval.id, %error, "GitHub refused the request message");
            None
        }
    }
}

impl GitHubChannel {
    /// The messages recorded on the server for the approval, and those an earlier run posted
    /// (the outbox knows their ids) without recording them.
    async fn adopt(&self, approval: &pb::Approval) -> Result<Vec<Message>, ShowError> {
        let mut recorded: Vec<(IssueRef, MessageKind)> = approval
            .deliveries
            .iter()
            .filter(|delivery| delivery.channel == CHANNEL)
            .filter_map(|d| Some((d.target.parse().ok()?, MessageKind::parse(&d.message_ref)?)))
            .collect();
        let unrecorded = self.outbox.iter().flat_map(|o| o.unsettled(&approval.id));
        for entry in unrecorded {
            let Some(message_ref) = entry.message_ref.as_deref() else {
                continue;
            };
            let issue = match entry.target.parse::<Target>() {
                Ok(Target::Issue(issue)) => Some(issue),
                Ok(Target::Repo(repo)) => {
                    issue_number(message_ref).map(|number| IssueRef { repo, number })
                }
                Err(_) => None,
            };
            if let (Some(issue), Some(kind)) = (issue, MessageKind::parse(message_ref)) {
                recorded.push((issue, kind));
            }
        }
        let mut messages: Vec<Message> = Vec::new();
        for (issue, kind) in recorded {
            if messages.iter().any(|m| m.issue == issue && m.kind == kind) {
                continue;
            }
            let read = match &kind {
                MessageKind::Comment(id) => (self.api.get_comment(&issue.repo, *id).await)
                    .map(|found| found.map(|c| (c.text().to_owned(), c.created_at))),
                MessageKind::IssueBody => (self.api.get_issue(&issue).await)
                    .map(|found| found.map(|i| (i.body.unwrap_or_default(), i.created_at))),
            };
            let (rendered, created_at) = match read {
                Ok(Some(found)) => found,
                Ok(None) => {
                    tracing::warn!(%issue, approval_id = %approval.id, "the recorded request message is gone");
                    self.settle_gone(approval, &issue, &kind).await?;
                    continue;
                }
                Err(error) if matches!(error.verdict(), Verdict::Final) => {
                    tracing::warn!(%issue, approval_id = %approval.id, %error, "the recorded request message cannot be read; left alone");
                    self.settle_gone(approval, &issue, &kind).await?;
                    continue;
                }
                // Kept as unknown: the next show rewrites it, and commands under it count
                // from the approval's creation on (no later than the message).
                Err(error) => {
                    tracing::warn!(%issue, approval_id = %approval.id, %error, "cannot read the recorded request message now; it is rewritten at the next change");
                    (String::new(), created_at(approval))
                }
            };
            let message = Message {
                issue,
                kind,
                created_at,
                rendered,
            };
            self.settle(approval, &message).await?;
            messages.push(message);
        }
        Ok(messages)
    }

    /// At a start: the messages of every pending approval, and the commands written under
    /// them meanwhile. A watch that resumes after its cursor replays only what came after
    /// it, so without this a command on a request posted before the restart would find no
    /// approval it answers. `ready` is sent once every pending approval is on the board: a
    /// command checked before then could miss the approval it names, or take the only one
    /// adopted so far for the only one pending. Then each issue's comments are listed once,
    /// from its earliest request on.
    pub async fn adopt_pending(
        &self,
        max_backoff: std::time::Duration,
        ready: watch::Sender<bool>,
    ) {
        let pending = match pending_approvals(&self.client, CHANNEL, max_backoff).await {
            Ok(pending) => pending,
            Err(error) => {
                tracing::error!(%error, "cannot list the pending approvals; their comments are adopted at their next event");
                ready.send_replace(true);
                return;
            }
        };
        let mut adopted = Vec::new();
        for approval in pending {
            if self.board.get(&approval.id).is_some() {
                continue;
            }
            match self.adopt(&approval).await {
                Ok(messages) if self.board.put_if_unknown(&approval, messages.clone()) => {
                    adopted.extend(messages);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(approval_id = %approval.id, %error, "cannot adopt the messages of a pending approval; adopted at its next event")
                }
            }
        }
        self.follow(&adopted, true);
        ready.send_replace(true);
        // Lost commands otherwise: tried until it works (or GitHub refuses for good).
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            match self.catch_up(&adopted).await {
                Ok(()) => return,
                Err(error) if error.is_transient() => {
                    tracing::warn!(%error, "cannot list the comments written while away; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(max_backoff);
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot list the comments written while away; listed at the approval's next change");
                    return;
                }
            }
        }
    }

    /// A post cut off (by a crash) before GitHub's answer leaves only its intent in the
    /// outbox. Once the approval is no longer pending nothing is posted for it; the comment
    /// (or issue) that post may have left is looked for by its marker, adopted and recorded,
    /// so that it gets edited to the outcome. The intent is settled either way.
    async fn find_unfinished_posts(
        &self,
        approval: &pb::Approval,
        messages: &mut Vec<Message>,
    ) -> Result<(), ShowError> {
        let Some(outbox) = &self.outbox else {
            return Ok(());
        };
        let cut_off = outbox.unsettled(&approval.id);
        for entry in cut_off.iter().filter(|e| e.message_ref.is_none()) {
            let since = created_at(approval);
            let found = match entry.target.parse::<Target>() {
                Ok(Target::Issue(issue)) => self
                    .api
                    .find_marked_comment(&issue, &approval.id, since)
                    .await
                    .map(|found| found.map(|comment| comment_message(&issue, comment))),
                Ok(Target::Repo(repo)) => self
                    .api
                    .find_marked_issue(&repo, &approval.id, since)
                    .await
                    .map(|found| found.map(|opened| issue_message(&repo, opened))),
                Err(_) => Ok(None),
            };
            match found {
                Ok(Some(message)) => {
                    tracing::info!(approval_id = %approval.id, issue = %message.issue, message_ref = %message.message_ref(), "adopted a request left by a cut-off post");
                    self.settle(approval, &message).await?;
                    if !messages
                        .iter()
                        .any(|m| m.issue == message.issue && m.kind == message.kind)
                    {
                        messages.push(message);
                    }
                }
                Ok(None) => {}
                Err(error) if error.is_transient() => return Err(error.into()),
                Err(error) => {
                    tracing::warn!(approval_id = %approval.id, target = %entry.target, %error, "cannot look for the request of a cut-off post");
                }
            }
            outbox.done(entry.id).await?;
        }
        Ok(())
    }

    /// Posts the request on `target`, or finds the one an earlier attempt or run posted.
    /// Returns the message and whether it was found rather than posted now.
    async fn place(
        &self,
        approval: &pb::Approval,
        target: &Target,
    ) -> Result<(Message, bool), ShowError> {
        let key = target.to_string();
        let earlier = self
            .outbox
            .iter()
            .flat_map(|o| o.unsettled(&approval.id))
            .find(|e| e.target == key);
        // Only an earlier intent (or no outbox to know of one) can have left a comment.
        let search = earlier.is_some() || self.outbox.is_none();
        let intent = match (&self.outbox, &earlier) {
            (Some(_), Some(entry)) => Some(entry.id),
            (Some(outbox), None) => Some(outbox.intend(&approval.id, &key, None).await?),
            (None, _) => None,
        };
        let full = render::request_body(approval);
        let placed = match self.put(approval, target, search, &full).await {
            Err(error) if error.status() == Some(422) => {
                tracing::warn!(approval_id = %approval.id, %target, %error, "GitHub refused the request (422); posting it once more without the arguments");
                let minimal = render::minimal_request_body(approval);
                let (mut message, found) = self.put(approval, target, true, &minimal).await?;
                // Shows all it can: not edited to the full body again.
                message.rendered = full;
                (message, found)
            }
            other => other?,
        };
        let (message, found) = placed;
        if let (Some(outbox), Some(id)) = (&self.outbox, intent) {
            outbox.sent(id, &message.message_ref()).await?;
        }
        self.settle(approval, &message).await?;
        tracing::info!(approval_id = %approval.id, issue = %message.issue, message_ref = %message.message_ref(), found, "request delivered");
        Ok((message, found))
    }

    async fn put(
        &self,
        approval: &pb::Approval,
        target: &Target,
        search: bool,
        body: &str,
    ) -> Result<(Message, bool), ApiError> {
        let (api, id, since) = (&self.api, &approval.id, created_at(approval));
        Ok(match target {
            Target::Issue(issue) => {
                let placed = if search {
                    api.find_or_post_comment(issue, id, since, body).await?
                } else {
                    let item = api.create_comment(issue, body).await?;
                    Placed { item, found: false }
                };
                (comment_message(issue, placed.item), placed.found)
            }
            Target::Repo(repo) => {
                let title = render::issue_title(approval);
                let placed = if search {
                    api.find_or_open_issue(repo, id, since, &title, body)
                        .await?
                } else {
                    let item = api.create_issue(repo, &title, body).await?;
                    Placed { item, found: false }
                };
                (issue_message(repo, placed.item), placed.found)
            }
        })
    }

    /// Records the message on the server (unless it is already), then settles its outbox
    /// entries: from then on the server's record is what a restart goes by.
    async fn settle(&self, approval: &pb::Approval, message: &Message) -> Result<(), ShowError> {
        let (target, message_ref) = (message.issue.to_string(), message.message_ref());
        let recorded = approval
            .deliveries
            .iter()
            .any(|d| d.channel == CHANNEL && d.target == target && d.message_ref == message_ref);
        if !recorded {
            self.client
                .record_delivery(pb::RecordDeliveryRequest {
                    approval_id: approval.id.clone(),
                    channel: CHANNEL.to_string(),
                    target,
                    message_ref: message_ref.clone(),
                })
                .await?;
        }
        if let Some(outbox) = &self.outbox {
            for entry in outbox.unsettled(&approval.id) {
                let posted_here = entry.message_ref.as_deref() == Some(message_ref.as_str());
                let delivers = entry
                    .target
                    .parse::<Target>()
                    .is_ok_and(|target| message.covers(&target));
                if posted_here || delivers {
                    outbox.done(entry.id).await?;
                }
            }
        }
        Ok(())
    }

    /// The outbox entries of a message that is gone are settled: nothing is left to adopt.
    async fn settle_gone(
        &self,
        approval: &pb::Approval,
        issue: &IssueRef,
        kind: &MessageKind,
    ) -> Result<(), OutboxError> {
        let Some(outbox) = &self.outbox else {
            return Ok(());
        };
        let gone = Message {
            issue: issue.clone(),
            kind: kind.clone(),
            created_at: created_at(approval),
            rendered: String::new(),
        }
        .message_ref();
        for entry in outbox.unsettled(&approval.id) {
            if entry.message_ref.as_deref() == Some(gone.as_str()) {
                outbox.done(entry.id).await?;
            }
        }
        Ok(())
    }

    /// Commands for a pending approval's messages: their issues are polled (when polling),
    /// and, when the messages were `found` from an earlier attempt or run, the comments
    /// written under them meanwhile are owed a listing (GitHub does not deliver a webhook
    /// again): see [`Self::catch_up`].
    fn follow(&self, messages: &[Message], found: bool) {
        for message in messages {
            if let Some(poll_targets) = &self.poll_targets {
                poll_targets.watch(&message.issue, message.created_at);
            }
            if found {
                self.board.owe_catch_up(message);
            }
        }
    }

    /// Lists the comments owed under `messages`, once per issue from the earliest of them,
    /// for the commands. Those not listed (the first error is returned) stay owed.
    async fn catch_up(&self, messages: &[Message]) -> Result<(), ApiError> {
        let mut since: Vec<(IssueRef, OffsetDateTime, Vec<&Message>)> = Vec::new();
        for message in messages {
            if !self.board.claim_catch_up(message) {
                continue;
            }
            match since.iter_mut().find(|(issue, ..)| *issue == message.issue) {
                Some((_, at, claimed)) => {
                    *at = (*at).min(message.created_at);
                    claimed.push(message);
                }
                None => since.push((message.issue.clone(), message.created_at, vec![message])),
            }
        }
        let mut failed = None;
        for (issue, at, claimed) in since {
            match self.api.list_comments(&issue, Some(at)).await {
                Ok(comments) => {
                    let _ = self
                        .inputs
                        .send(Input::Comments(unedited(&issue, comments)))
                        .await;
                }
                Err(error) => {
                    for message in claimed {
                        self.board.unclaim_catch_up(message);
                    }
                    failed = failed.or(Some(error));
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    fn stop_polling_if_idle(&self, issue: &IssueRef, approval_id: &str) {
        if let Some(poll_targets) = &self.poll_targets {
            if !self.board.pending_on(issue, approval_id) {
                poll_targets.unwatch(issue);
            }
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
                target
                    .parse::<Target>()
                    .inspect_err(|error| tracing::warn!(approval_id = %approval.id, %error, "route target not usable"))
                    .ok()
            };
            if let Some(target) = parsed.filter(|t| !targets.contains(t)) {
                targets.push(target);
            }
        }
        targets
    }
}

fn comment_message(issue: &IssueRef, comment: IssueComment) -> Message {
    Message {
        issue: issue.clone(),
        kind: MessageKind::Comment(comment.id),
        created_at: comment.created_at,
        rendered: comment.text().to_owned(),
    }
}

fn issue_message(repo: &RepoName, opened: IssueSummary) -> Message {
    Message {
        issue: IssueRef {
            repo: repo.clone(),
            number: opened.number,
        },
        kind: MessageKind::IssueBody,
        created_at: opened.created_at,
        rendered: opened.body.unwrap_or_default(),
    }
}

/// The issue number in an `issue/N` message reference.
fn issue_number(message_ref: &str) -> Option<u64> {
    message_ref.strip_prefix("issue/")?.parse().ok()
}

/// Rewrites one message; when GitHub refuses the body (422) it is written once more without
/// the arguments.
async fn write_message(api: &GitHubApi, message: &Message, body: &str) -> Result<(), ApiError> {
    match write_body(api, message, body).await {
        Err(error) if error.status() == Some(422) => {
            tracing::warn!(issue = %message.issue, message_ref = %message.message_ref(), %error, "GitHub refused the edit (422); writing it once more without the arguments");
            write_body(api, message, &render::minimal_request_body_of(body)).await
        }
        written => {
            if written.is_ok() {
                tracing::info!(issue = %message.issue, message_ref = %message.message_ref(), "request message updated");
            }
            written
        }
    }
}

async fn write_body(api: &GitHubApi, message: &Message, body: &str) -> Result<(), ApiError> {
    match message.kind {
        MessageKind::Comment(id) => api.update_comment(&message.issue.repo, id, body).await,
        MessageKind::IssueBody => api.update_issue_body(&message.issue, body).await,
    }
}

fn created_at(approval: &pb::Approval) -> OffsetDateTime {
    approval
        .created_at
        .as_ref()
        .and_then(|at| OffsetDateTime::from_unix_timestamp(at.seconds).ok())
        .unwrap_or_else(OffsetDateTime::now_utc)
}
