//! The book of the messages the worker sent or knows: which messages show which approval,
//! what each was last made to show, how far each approval's shown state has come, and the
//! newest message id of each chat. Shared by the channel and the inbound side; no I/O.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

use countersign_client::pb;
use pb::ApprovalState;

use crate::render::RenderedMessage;

/// How many resolved approvals the book remembers, so that a late copy (a Decide answer
/// racing the watch) is recognised as stale.
const FINISHED_KEPT: usize = 4096;

/// How far an approval has come; a copy behind the one already shown is stale (the watch
/// and a Decide answer race) and must not overwrite it.
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
            ApprovalState::Consumed => Stage::Consumed,
            _ => Stage::Resolved,
        };
        Progress {
            stage,
            decisions: approval.decisions.len(),
        }
    }
}

/// One Telegram message showing an approval.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShownMessage {
    pub(crate) chat_id: i64,
    pub(crate) message_id: i32,
    /// Fingerprint of what the worker last made it show; `None` when unknown (found in a
    /// delivery record, or tapped).
    pub(crate) shown: Option<u64>,
}

/// The messages the worker knows, shared with the inbound side (which looks up the approval
/// a command replies to, and adds the messages approvers act on). Each approval's messages
/// change only in its lane, except for messages added.
#[derive(Default)]
pub(crate) struct MessageBook {
    inner: Mutex<BookInner>,
}

#[derive(Default)]
struct BookInner {
    approvals: HashMap<String, Known>,
    /// (chat, message) → approval id.
    by_message: HashMap<(i64, i32), String>,
    /// Resolved approvals, oldest first; only the last [`FINISHED_KEPT`] stay.
    finished: VecDeque<String>,
    finished_set: HashSet<String>,
    /// The newest message id seen in each chat (where a search for orphans starts).
    newest: HashMap<i64, i32>,
}

#[derive(Default)]
struct Known {
    messages: Vec<ShownMessage>,
    progress: Option<Progress>,
}

impl MessageBook {
    fn lock(&self) -> MutexGuard<'_, BookInner> {
        // Every change is a few inserts or removes that cannot fail half-way.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a message of an approval (sent, recorded, in the outbox, or acted on).
    pub(crate) fn remember_message(&self, chat_id: i64, message_id: i32, approval_id: &str) {
        let mut book = self.lock();
        book.by_message
            .insert((chat_id, message_id), approval_id.to_owned());
        let known = book.approvals.entry(approval_id.to_owned()).or_default();
        if !known
            .messages
            .iter()
            .any(|m| m.chat_id == chat_id && m.message_id == message_id)
        {
            known.messages.push(ShownMessage {
                chat_id,
                message_id,
                shown: None,
            });
        }
        drop(book);
        self.saw_message(chat_id, message_id);
    }

    /// Notes a message id seen in a chat (sent by the bot or by a user).
    pub(crate) fn saw_message(&self, chat_id: i64, message_id: i32) {
        let mut book = self.lock();
        let newest = book.newest.entry(chat_id).or_insert(message_id);
        *newest = (*newest).max(message_id);
    }

    pub(crate) fn approval_of_message(&self, chat_id: i64, message_id: i32) -> Option<String> {
        self.lock().by_message.get(&(chat_id, message_id)).cloned()
    }

    pub(crate) fn newest_message(&self, chat_id: i64) -> Option<i32> {
        self.lock().newest.get(&chat_id).copied()
    }

    /// Notes that this copy of the approval is about to be shown; false when a newer copy
    /// already was.
    pub(crate) fn advance(&self, approval: &pb::Approval) -> bool {
        let progress = Progress::of(approval);
        let mut book = self.lock();
        let known = book.approvals.entry(approval.id.clone()).or_default();
        if known.progress.is_some_and(|shown| progress < shown) {
            return false;
        }
        known.progress = Some(progress);
        true
    }

    pub(crate) fn messages(&self, approval_id: &str) -> Vec<ShownMessage> {
        self.lock()
            .approvals
            .get(approval_id)
            .map(|known| known.messages.clone())
            .unwrap_or_default()
    }

    pub(crate) fn set_shown(&self, approval_id: &str, chat_id: i64, message_id: i32, shown: u64) {
        let mut book = self.lock();
        let message = book.approvals.get_mut(approval_id).and_then(|known| {
            known
                .messages
                .iter_mut()
                .find(|m| m.chat_id == chat_id && m.message_id == message_id)
        });
        if let Some(message) = message {
            message.shown = Some(shown);
        }
    }

    /// The approvals shown as pending (not yet known to be resolved).
    pub(crate) fn unresolved_approvals(&self) -> Vec<String> {
        let book = self.lock();
        book.approvals
            .keys()
            .filter(|id| !book.finished_set.contains(*id))
            .cloned()
            .collect()
    }

    /// Notes that an approval is resolved, and forgets the oldest resolved ones beyond
    /// [`FINISHED_KEPT`].
    pub(crate) fn finish(&self, approval_id: &str) {
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
pub(crate) fn fingerprint(rendered: &RenderedMessage) -> u64 {
    let mut hasher = DefaultHasher::new();
    rendered.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

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
