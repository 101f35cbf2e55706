//! What the worker has on GitHub, as far as this run knows: each approval it showed, with its
//! request messages, and the targets a request is being posted on. The channel (which posts
//! and edits) writes it; the commands (which decide) read it to know what a comment answers.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use countersign_client::pb;
use time::OffsetDateTime;

use crate::render::names_approval;
use crate::target::{IssueRef, Target};

/// Resolved approvals remembered, for late commands that name them.
const REMEMBERED_RESOLVED: usize = 256;

/// Where the request for an approval lives on GitHub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// A comment on the target issue.
    Comment(u64),
    /// The body of the issue the worker opened for the approval.
    IssueBody,
}

impl MessageKind {
    /// The reference recorded on the server (`comment/ID`, `issue/N`).
    pub fn parse(message_ref: &str) -> Option<MessageKind> {
        match message_ref.split_once('/')? {
            ("comment", id) => id.parse().ok().map(MessageKind::Comment),
            ("issue", _) => Some(MessageKind::IssueBody),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Message {
    pub issue: IssueRef,
    pub kind: MessageKind,
    /// When GitHub created it: catching up and polling for commands start there.
    pub created_at: OffsetDateTime,
    /// The body as last written (empty when it could not be read: rewritten at the next show).
    pub rendered: String,
}

impl Message {
    pub fn message_ref(&self) -> String {
        match self.kind {
            MessageKind::Comment(id) => format!("comment/{id}"),
            MessageKind::IssueBody => format!("issue/{}", self.issue.number),
        }
    }

    /// Commands count in comments written after the request.
    pub fn precedes(&self, comment_id: u64) -> bool {
        match self.kind {
            MessageKind::Comment(id) => comment_id > id,
            MessageKind::IssueBody => true,
        }
    }

    /// Whether this message delivers `target`.
    pub fn covers(&self, target: &Target) -> bool {
        match (target, &self.kind) {
            (Target::Issue(wanted), MessageKind::Comment(_)) => *wanted == self.issue,
            (Target::Repo(repo), MessageKind::IssueBody) => *repo == self.issue.repo,
            _ => false,
        }
    }
}

/// An approval the worker showed, as last shown, with its messages.
#[derive(Clone)]
pub struct Shown {
    pub approval: pb::Approval,
    pub messages: Vec<Message>,
}

#[derive(Default)]
struct State {
    shown: BTreeMap<String, Shown>,
    /// Resolved approvals, oldest first, to forget the oldest.
    resolved: VecDeque<String>,
    /// Targets a request is being posted on.
    posting: Vec<Target>,
    /// Messages found from an earlier run whose comments are yet to be listed.
    owed: HashSet<(IssueRef, String)>,
    /// Messages whose comments were listed in this run (or are being listed).
    caught_up: HashSet<(IssueRef, String)>,
}

#[derive(Default)]
pub struct Board {
    state: Mutex<State>,
}

impl Board {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change is a single insert or remove; a panicking holder leaves no half-change.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn get(&self, approval_id: &str) -> Option<Shown> {
        self.lock().shown.get(approval_id).cloned()
    }

    /// Records the approval as shown with `messages`; a resolved one is remembered a while.
    pub fn put(&self, approval: &pb::Approval, messages: Vec<Message>) {
        let mut state = self.lock();
        let id = approval.id.clone();
        let was_pending = state
            .shown
            .get(&id)
            .is_none_or(|shown| shown.approval.state() == pb::ApprovalState::Pending);
        let shown = Shown {
            approval: approval.clone(),
            messages,
        };
        state.shown.insert(id.clone(), shown);
        if was_pending && approval.state() != pb::ApprovalState::Pending {
            state.resolved.push_back(id);
            while state.resolved.len() > REMEMBERED_RESOLVED {
                if let Some(oldest) = state.resolved.pop_front() {
                    state.shown.remove(&oldest);
                }
            }
        }
    }

    /// Records the approval as shown with `messages` unless it is known already; whether it
    /// was recorded.
    pub fn put_if_unknown(&self, approval: &pb::Approval, messages: Vec<Message>) -> bool {
        if self.lock().shown.contains_key(&approval.id) {
            return false;
        }
        self.put(approval, messages);
        true
    }

    /// The comments under `message` (found from an earlier run) are to be listed, unless
    /// they were in this run.
    pub fn owe_catch_up(&self, message: &Message) {
        let mut state = self.lock();
        let key = catch_up_key(message);
        if !state.caught_up.contains(&key) {
            state.owed.insert(key);
        }
    }

    /// Whether the comments under `message` are owed; if so, they are now being listed.
    pub fn claim_catch_up(&self, message: &Message) -> bool {
        let mut state = self.lock();
        let key = catch_up_key(message);
        state.owed.remove(&key) && state.caught_up.insert(key)
    }

    /// Listing the comments under `message` failed: they are owed again.
    pub fn unclaim_catch_up(&self, message: &Message) {
        let mut state = self.lock();
        let key = catch_up_key(message);
        state.caught_up.remove(&key);
        state.owed.insert(key);
    }

    pub fn posting(&self, target: &Target, now: bool) {
        let mut state = self.lock();
        if now {
            state.posting.push(target.clone());
        } else if let Some(at) = state.posting.iter().position(|t| t == target) {
            state.posting.remove(at);
        }
    }

    /// Whether a request is being posted on `issue` (or a repository target may open it).
    pub fn posting_to(&self, issue: &IssueRef) -> bool {
        self.lock().posting.iter().any(|target| match target {
            Target::Issue(wanted) => wanted == issue,
            Target::Repo(repo) => *repo == issue.repo,
        })
    }

    pub fn knows_issue(&self, issue: &IssueRef) -> bool {
        self.lock()
            .shown
            .values()
            .any(|shown| shown.messages.iter().any(|m| m.issue == *issue))
    }

    /// The approvals shown as pending.
    pub fn pending_ids(&self) -> Vec<String> {
        self.lock()
            .shown
            .values()
            .filter(|shown| shown.approval.state() == pb::ApprovalState::Pending)
            .map(|shown| shown.approval.id.clone())
            .collect()
    }

    /// Whether a pending approval other than `except` has a request on `issue`.
    pub fn pending_on(&self, issue: &IssueRef, except: &str) -> bool {
        self.lock().shown.values().any(|shown| {
            shown.approval.id != except
                && shown.approval.state() == pb::ApprovalState::Pending
                && shown.messages.iter().any(|m| m.issue == *issue)
        })
    }

    /// The pending approvals whose request on `issue` was written before `comment_id`.
    pub fn waiting(&self, issue: &IssueRef, comment_id: u64) -> Vec<pb::Approval> {
        self.lock()
            .shown
            .values()
            .filter(|shown| shown.approval.state() == pb::ApprovalState::Pending)
            .filter(|shown| {
                shown
                    .messages
                    .iter()
                    .any(|m| m.issue == *issue && m.precedes(comment_id))
            })
            .map(|shown| shown.approval.clone())
            .collect()
    }

    /// The approvals with a request on `issue` that `given` (an id or short id) names.
    pub fn named(&self, issue: &IssueRef, given: &str) -> Vec<pb::Approval> {
        self.lock()
            .shown
            .values()
            .filter(|shown| shown.messages.iter().any(|m| m.issue == *issue))
            .filter(|shown| names_approval(given, &shown.approval.id))
            .map(|shown| shown.approval.clone())
            .collect()
    }
}

fn catch_up_key(message: &Message) -> (IssueRef, String) {
    (message.issue.clone(), message.message_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_refs_round_trip_and_targets_are_covered() {
        let issue: IssueRef = "acme/widgets#3".parse().unwrap();
        let comment = Message {
            issue: issue.clone(),
            kind: MessageKind::Comment(99),
            created_at: OffsetDateTime::UNIX_EPOCH,
            rendered: String::new(),
        };
        assert_eq!(comment.message_ref(), "comment/99");
        assert_eq!(
            MessageKind::parse("comment/99"),
            Some(MessageKind::Comment(99))
        );
        assert_eq!(MessageKind::parse("issue/3"), Some(MessageKind::IssueBody));
        assert_eq!(MessageKind::parse("chat:1"), None);
        assert!(comment.precedes(100));
        assert!(!comment.precedes(99));
        assert!(comment.covers(&Target::Issue(issue.clone())));
        assert!(!comment.covers(&Target::Repo(issue.repo.clone())));
        let opened = Message {
            kind: MessageKind::IssueBody,
            ..comment
        };
        assert!(opened.covers(&Target::Repo(issue.repo.clone())));
    }
}
