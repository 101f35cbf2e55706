//! Polling, for installations GitHub cannot reach with webhooks: every interval, the comments
//! of each issue with a pending approval are listed with `since`.
//!
//! `since` is inclusive and to the second, and it matches comments *updated* since, so the
//! same comment comes back more than once: the worker deduplicates by comment id. Comments
//! edited after they were written are skipped (only new comments count, and polling can only
//! see the current text). The cursor of an issue starts at its request message's creation and
//! moves to the newest `updated_at` seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use crate::api::{GitHubApi, IssueComment};
use crate::target::IssueRef;
use crate::worker::{IncomingComment, Input};

/// The issues to poll and the `since` cursor of each, shared by the worker (which adds and
/// removes issues) and the poller.
#[derive(Default)]
pub struct PollTargets {
    cursors: Mutex<BTreeMap<IssueRef, OffsetDateTime>>,
}

impl PollTargets {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<IssueRef, OffsetDateTime>> {
        self.cursors
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Polls `issue` from `since` on, unless it is polled already.
    pub fn watch(&self, issue: &IssueRef, since: OffsetDateTime) {
        self.lock().entry(issue.clone()).or_insert(since);
    }

    pub fn unwatch(&self, issue: &IssueRef) {
        self.lock().remove(issue);
    }

    fn snapshot(&self) -> Vec<(IssueRef, OffsetDateTime)> {
        self.lock()
            .iter()
            .map(|(issue, since)| (issue.clone(), *since))
            .collect()
    }

    /// Moves the cursor forward, if the issue is still polled.
    fn advance(&self, issue: &IssueRef, seen: OffsetDateTime) {
        if let Some(cursor) = self.lock().get_mut(issue) {
            *cursor = (*cursor).max(seen);
        }
    }
}

pub async fn run(
    api: Arc<GitHubApi>,
    targets: Arc<PollTargets>,
    interval: Duration,
    inputs: mpsc::Sender<Input>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        for (issue, since) in targets.snapshot() {
            let comments = match api.list_comments(&issue, Some(since)).await {
                Ok(comments) => comments,
                Err(error) => {
                    tracing::warn!(%issue, %error, "polling comments failed");
                    continue;
                }
            };
            let Some(newest) = comments.iter().map(|c| c.updated_at).max() else {
                continue;
            };
            let new = unedited(&issue, comments);
            if !new.is_empty() && inputs.send(Input::Comments(new)).await.is_err() {
                return;
            }
            targets.advance(&issue, newest);
        }
    }
}

/// The comments of `issue` never edited: a listing shows only the current text, and only new
/// comments count as commands.
pub fn unedited(issue: &IssueRef, comments: Vec<IssueComment>) -> Vec<IncomingComment> {
    comments
        .into_iter()
        .filter(|comment| comment.updated_at == comment.created_at)
        .map(|comment| IncomingComment {
            issue: issue.clone(),
            comment,
        })
        .collect()
}
