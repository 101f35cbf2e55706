//! The comments that come in, by webhook or by polling, and the issues the poller reads with
//! the `since` cursor of each: what the worker, the webhook receiver and the poller share.

use std::collections::BTreeMap;
use std::sync::Mutex;

use time::OffsetDateTime;

use crate::api::IssueComment;
use crate::target::IssueRef;

/// A comment on an issue or pull request, from a webhook delivery or a poll.
#[derive(Clone, Debug)]
pub struct IncomingComment {
    pub issue: IssueRef,
    pub comment: IssueComment,
}

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

    pub(crate) fn snapshot(&self) -> Vec<(IssueRef, OffsetDateTime)> {
        self.lock()
            .iter()
            .map(|(issue, since)| (issue.clone(), *since))
            .collect()
    }

    /// Moves the cursor forward, if the issue is still polled.
    pub(crate) fn advance(&self, issue: &IssueRef, seen: OffsetDateTime) {
        if let Some(cursor) = self.lock().get_mut(issue) {
            *cursor = (*cursor).max(seen);
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
