//! What operators and auditors read: filters of the event history and of grants (the
//! queries are the storage backend's).

use countersign_core::{EventKind, Millis};

use crate::store::StoredEvent;

#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub approval_id: String,
    pub kinds: Vec<EventKind>,
    pub agent_id: String,
    /// A decider identity `channel:user_id` or an approver id.
    pub decider: String,
    /// When `decider` is a registered approver's id: that approver's identities
    /// (`channel:value`), so that what they decided for someone else (a delegation) and what
    /// was refused to them (recorded under the identity they decided with) are found too.
    pub decider_identities: Vec<String>,
    /// Inclusive.
    pub since: Option<Millis>,
    /// Exclusive.
    pub until: Option<Millis>,
    pub newest_first: bool,
    /// The seq the previous page ended with.
    pub after_seq: Option<i64>,
    pub limit: u32,
}

/// One row of the audit trail with its place in the hash chain.
#[derive(Debug, Clone)]
pub struct AuditedEvent {
    pub event: StoredEvent,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, Default)]
pub struct GrantFilter {
    pub agent_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub include_inactive: bool,
    /// The id the previous page ended with; the list continues with older grants.
    pub before_id: String,
    pub limit: u32,
}
