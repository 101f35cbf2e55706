//! Facts about an approval that every channel acts on the same way.

use countersign_client::pb;

/// Whether a session grant approved the approval at once (no one was asked): channels post a
/// short notice, so approvers see every use of the grants they gave.
pub fn is_granted(approval: &pb::Approval) -> bool {
    approval.state() != pb::ApprovalState::Pending
        && approval
            .resolution
            .as_ref()
            .is_some_and(|resolution| resolution.resolved_by() == pb::ResolvedBy::Grant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_grant_s_resolution_counts() {
        let resolved_by = |by: pb::ResolvedBy, state: pb::ApprovalState| pb::Approval {
            state: state.into(),
            resolution: Some(pb::Resolution {
                resolved_by: by.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(is_granted(&resolved_by(
            pb::ResolvedBy::Grant,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&resolved_by(
            pb::ResolvedBy::Rule,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&resolved_by(
            pb::ResolvedBy::Decision,
            pb::ApprovalState::Approved
        )));
        assert!(!is_granted(&pb::Approval::default()));
    }
}
