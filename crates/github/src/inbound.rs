//! Commands: the comments that webhooks, polling and catching up bring in, handled one at a
//! time. `/approve` and `/reject` by people with write access become decisions on the
//! approval their comment answers (by the [`Board`]); everything else gets a reaction and a
//! reply saying why nothing was decided. The decision's events then come back through the
//! watch, and the channel edits the request comment.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, Client, ClientError};
use countersign_worker::lanes::Lanes;
use tokio::sync::mpsc;

use crate::api::{ApiError, Author, GitHubApi, IssueComment, ReactionContent};
use crate::command::{parse_command, Command, Verdict};
use crate::incoming::IncomingComment;
use crate::recent::RecentSet;
use crate::render::{self, replied_comment_id, Reply};
use crate::shown::Board;
use crate::target::{IssueRef, RepoName, CHANNEL};

const REMEMBERED_COMMENTS: usize = 50_000;
/// How often a command that failed for a transient reason is tried.
const MAX_COMMAND_ATTEMPTS: u32 = 8;

pub enum Input {
    Comments(Vec<IncomingComment>),
    /// A command that failed for a transient reason, with the attempts made so far.
    RetryCommand(IncomingComment, u32),
    /// A request was posted (or failed to be): the commands parked for it go on.
    Posted,
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

pub struct Commands {
    pub client: Client,
    pub api: Arc<GitHubApi>,
    pub board: Arc<Board>,
    /// Where retried commands come back.
    pub inputs: mpsc::Sender<Input>,
    pub retry_interval: Duration,
    /// Replies, one lane per issue: a slow GitHub holds up no command.
    pub replies: Lanes,
    /// Comments whose handling is over.
    pub handled: RecentSet<u64>,
    /// Comments waiting for another attempt.
    pub retrying: HashSet<u64>,
    /// Commands on issues whose request is still being posted.
    pub parked: Vec<IncomingComment>,
}

impl Commands {
    pub fn new(
        client: Client,
        api: Arc<GitHubApi>,
        board: Arc<Board>,
        inputs: mpsc::Sender<Input>,
        retry_interval: Duration,
    ) -> Commands {
        Commands {
            client,
            api,
            board,
            inputs,
            retry_interval,
            replies: Lanes::new(),
            handled: RecentSet::new(REMEMBERED_COMMENTS),
            retrying: HashSet::new(),
            parked: Vec::new(),
        }
    }

    /// Handles inputs until the queue closes.
    pub async fn run(mut self, mut inputs: mpsc::Receiver<Input>) {
        let _stop_replies = self.replies.abort_on_drop();
        while let Some(input) = inputs.recv().await {
            match input {
                Input::Comments(comments) => self.handle_comments(comments).await,
                Input::RetryCommand(incoming, attempts) => {
                    self.retrying.remove(&incoming.comment.id);
                    self.handle_comment(incoming, attempts).await;
                }
                Input::Posted => {
                    for incoming in std::mem::take(&mut self.parked) {
                        self.handle_comment(incoming, 0).await;
                    }
                }
            }
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
        if self.board.posting_to(issue) {
            // Which approvals a command may name is known once every request on the issue
            // is posted.
            tracing::debug!(%issue, comment_id, "command on an issue whose request is being posted; handled once it is");
            self.parked.push(incoming);
            return;
        }
        if !self.board.knows_issue(issue) {
            // Not marked handled: right after a start the approval may not be shown yet, and
            // the same comment comes back by poll or catch-up once it is.
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

    /// The one approval a command answers, or the reply saying why there is none.
    fn chosen(
        &self,
        issue: &IssueRef,
        comment_id: u64,
        command: &Command,
    ) -> Result<pb::Approval, Reply> {
        let candidates = match &command.approval_id {
            Some(given) => self.board.named(issue, given),
            None => self.board.waiting(issue, comment_id),
        };
        let mut candidates = candidates.into_iter();
        match (candidates.next(), candidates.next()) {
            (Some(one), None) => Ok(one),
            (None, _) => Err(match &command.approval_id {
                Some(given) => Reply::UnknownId {
                    given: given.clone(),
                },
                None => Reply::NothingPending,
            }),
            (Some(first), Some(second)) => {
                let candidates = [first, second].into_iter().chain(candidates).collect();
                Err(Reply::Ambiguous { candidates })
            }
        }
    }

    async fn apply(
        &mut self,
        issue: &IssueRef,
        comment_id: u64,
        author: &Author,
        command: &Command,
    ) -> Result<(), CommandError> {
        let chosen = match self.chosen(issue, comment_id, command) {
            Ok(chosen) => chosen,
            Err(reply) => {
                self.explain(issue, comment_id, author, &reply).await;
                return Ok(());
            }
        };
        let repo = &issue.repo;
        let permission = self.api.permission(repo, &author.login).await?;
        if !permission.can_write {
            tracing::info!(%issue, comment_id, login = %author.login, level = permission.level.as_str(), "command refused: no write access");
            let reply = Reply::NotPermitted {
                repo: repo.clone(),
                level: permission.level.as_str().to_string(),
            };
            self.explain(issue, comment_id, author, &reply).await;
            return Ok(());
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
                self.explain(issue, comment_id, author, &reply).await;
                return Ok(());
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
            if let Some(approval) = response.approval {
                let reply = Reply::AlreadyResolved {
                    approval: Box::new(approval),
                };
                self.reply(issue, comment_id, author, &reply);
            }
        }
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

    /// Replies to a command, in the lane of the issue's replies.
    fn reply(&self, issue: &IssueRef, comment_id: u64, author: &Author, reply: &Reply) {
        let body = render::reply_body(&author.login, comment_id, reply);
        let (api, issue) = (self.api.clone(), issue.clone());
        self.replies.push(&format!("replies:{issue}"), async move {
            if let Err(error) = api.create_comment(&issue, &body).await {
                tracing::warn!(%issue, comment_id, %error, "replying to a command failed");
            }
        });
    }
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
