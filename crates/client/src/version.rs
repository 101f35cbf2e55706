//! Edit-on-approve as channels and runtimes read it from an approval: which version of the
//! arguments is current (the edited one when an approver edited them) and which approvals
//! count for it.

use crate::{decider, pb};

/// The arguments to run and their digest: the edited ones when edited.
pub fn current_arguments(approval: &pb::Approval) -> (&str, &str) {
    if is_edited(approval) {
        (
            &approval.edited_arguments_json,
            &approval.edited_args_digest,
        )
    } else {
        (&approval.arguments_json, &approval.args_digest)
    }
}

/// Whether an approver edited the arguments.
pub fn is_edited(approval: &pb::Approval) -> bool {
    !approval.edited_args_digest.is_empty()
}

/// The approvals that count toward the quorum: those of the current version (an edit
/// restarts the count).
pub fn current_approvals(approval: &pb::Approval) -> impl Iterator<Item = &pb::Decision> {
    let (_, current) = current_arguments(approval);
    approval.decisions.iter().filter(move |decision| {
        let version = if decision.args_digest.is_empty() {
            approval.args_digest.as_str()
        } else {
            decision.args_digest.as_str()
        };
        decision.verdict() == pb::Verdict::Approve && version == current
    })
}

/// The edited arguments to run instead of the requested ones, parsed; `None` when not
/// edited (or the edit is not stored, being redacted).
pub fn edited_input(approval: &pb::Approval) -> Option<serde_json::Value> {
    if !is_edited(approval) {
        return None;
    }
    serde_json::from_str(&approval.edited_arguments_json).ok()
}

/// "Alice (telegram)": who made the current edit.
pub fn editor_name(approval: &pb::Approval) -> Option<String> {
    approval.editor.as_ref().map(decider::name_and_channel)
}
