//! Withdrawals: an approval cancelled by its own caller, or by the server for it, because the
//! caller stopped or left while it waited (a hook killed by its host, an MCP server stopped).
//! The cancellation's reason starts with [`WITHDRAWN_REASON_PREFIX`]; channels show such an
//! approval as withdrawn rather than cancelled.

use countersign_proto::v1 as pb;

pub use countersign_core::{is_withdrawal, WITHDRAWN_REASON_PREFIX};

/// Whether `approval` was cancelled as a withdrawal.
pub fn is_withdrawn(approval: &pb::Approval) -> bool {
    approval.state() == pb::ApprovalState::Cancelled
        && approval
            .resolution
            .as_ref()
            .is_some_and(|resolution| is_withdrawal(&resolution.reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cancellation_with_a_withdrawal_reason_is_a_withdrawal() {
        let ended = |state: pb::ApprovalState, reason: &str| pb::Approval {
            state: state.into(),
            resolution: Some(pb::Resolution {
                reason: reason.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        use pb::ApprovalState::{Cancelled, Rejected};
        assert!(is_withdrawn(&ended(
            Cancelled,
            "withdrawn: the caller left"
        )));
        assert!(!is_withdrawn(&ended(Cancelled, "no longer needed")));
        assert!(!is_withdrawn(&ended(
            Rejected,
            "withdrawn: not a cancellation"
        )));
        assert!(!is_withdrawn(&pb::Approval::default()));
    }
}
