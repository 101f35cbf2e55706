//! What a channel (a platform approvers see approvals on) gives the runtime: only platform
//! operations. The loop around them — the watch and its cursor, snapshots, lanes, retries,
//! shutdown — is the runtime's ([`crate::runtime`]).

use std::future::Future;

use countersign_client::pb;

use crate::retry::{Classify, RateLimitScope};

/// A platform approvals are shown on.
pub trait Channel: Send + Sync + 'static {
    /// A failed platform operation; its [`Classify::verdict`] says whether it may pass (and
    /// not before when, from the platform's retry-after) or is the platform's final word.
    type Error: Classify + std::fmt::Display + Send;

    /// The channel name approvals are routed by (`ntfy`, `webhook`); the runtime watches it.
    fn name(&self) -> &str;

    /// Brings what the platform shows for `approval` in line with the approval as it is
    /// given: its request while pending (with whatever an approver acts through), its outcome
    /// once decided (here or elsewhere), expired or cancelled.
    ///
    /// Must be idempotent: the runtime calls it again for the same state after a retry, a
    /// crash (the watch replays what was not fully handled) or a snapshot, and it must then
    /// neither show a second copy nor undo a newer state. Runs in the approval's lane: never
    /// concurrently with another call for the same approval.
    fn show(&self, approval: &pb::Approval)
        -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Which calls a failure with a retry-after holds back until it has passed. By default
    /// every call to the platform (a rate limit is the platform's, per method, chat, workspace
    /// or client, never one approval's); a channel whose platform limits one approval's calls
    /// alone says [`RateLimitScope::Approval`] for those.
    fn rate_limit_scope(&self, error: &Self::Error) -> RateLimitScope {
        let _ = error;
        RateLimitScope::Platform
    }

    /// The approvals whose messages, as far as the channel knows, do not show a final state
    /// yet. After a snapshot, each one the snapshot does not list as pending is shown as the
    /// server has it now: it was resolved while the worker was not watching.
    fn unfinished(&self) -> impl Future<Output = Result<Vec<String>, Self::Error>> + Send;

    /// Tells approvers of an event that changes no message: a reminder, a refused decision,
    /// a grant revoked, or the request of an approval a session grant approved at once (no
    /// one was asked, so nothing was shown). Runs in the approval's lane; a failure that may
    /// pass is retried (never before the platform's retry-after). By default nothing is told.
    fn notice(
        &self,
        event: &pb::ApprovalEvent,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = event;
        async { Ok(()) }
    }
}
