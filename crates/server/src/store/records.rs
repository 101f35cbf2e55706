//! What the store hands back and is asked with: the answer to a request, list filters, a
//! channel's snapshot, session grants, the head of the audit chain, and the store's clock.

use countersign_core::{Approval, Millis, State};

/// The answer to a request for approval.
#[derive(Debug, Clone)]
pub struct Requested {
    pub approval: Approval,
    pub created: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub states: Vec<State>,
    pub agent_id: String,
    pub channel: String,
    pub session_id: String,
    pub tool_name: String,
    /// The id the previous page ended with; the list continues with older approvals.
    pub before_id: String,
    pub limit: u32,
}

/// The pending approvals of a channel and the head of the log they are consistent with.
pub struct Snapshot {
    pub head_seq: i64,
    pub pending: Vec<Approval>,
}

/// A passkey an approver registered (step-up), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passkey {
    /// base64url.
    pub credential_id: String,
    /// The approver's id in the registry (or their channel identity when there is none).
    pub approver: String,
    pub name: String,
    /// The COSE_Key public key, base64url.
    pub cose_key: String,
    pub algorithm: i64,
    pub sign_count: i64,
    pub created_at: Millis,
}

/// A change to the stored passkeys. Kept in one list in the order made, so that a removal
/// and a registration or a sign counter of the same credential in one batch apply in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasskeyWrite {
    /// A new passkey; a credential id already stored (for anyone) is left as it is.
    Register(Passkey),
    /// A newer sign counter for an approver's credential (never a lower one; nothing when
    /// the credential was removed meanwhile).
    Count {
        credential_id: String,
        approver: String,
        sign_count: i64,
    },
    /// The approver's credential removed.
    Remove {
        credential_id: String,
        approver: String,
    },
}

/// A session grant as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Grant {
    pub id: String,
    pub agent_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub approval_id: String,
    pub granted_by: String,
    #[sqlx(rename = "created_at_ms")]
    pub created_at: Millis,
    #[sqlx(rename = "expires_at_ms")]
    pub expires_at: Option<Millis>,
    #[sqlx(rename = "revoked_at_ms")]
    pub revoked_at: Option<Millis>,
}

impl Grant {
    pub fn is_active(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
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

/// The head of the audit hash chain: the single writer appends every event, so it keeps the
/// head in memory instead of reading it before each batch.
#[derive(Debug, Clone)]
pub struct ChainHead {
    /// The highest seq ever assigned (pruning never frees a seq).
    pub seq: i64,
    /// The hash of the newest stored row; empty when the log is empty.
    pub hash: String,
}

/// A grant's columns, with the bounds of the approval that made it, in the order the writers
/// read them.
pub(super) const GRANT_COLUMNS: &str = "id, agent_id, session_id, tool_name, approval_id,
    granted_by, created_at_ms, expires_at_ms, revoked_at_ms, max_risk_rank,
    max_required_approvals, scope";

/// The `channels` column: where an approval is shown.
pub(crate) fn channels_column(approval: &Approval) -> String {
    if approval.routes.is_empty() {
        return "*".to_string();
    }
    let mut channels: Vec<&str> = approval.routes.iter().map(|r| r.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    format!(",{},", channels.join(","))
}

/// Now, in milliseconds since the Unix epoch: the time every change and read is stamped with.
pub fn now_millis() -> Millis {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}
