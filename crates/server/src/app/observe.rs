//! Observe mode (`[policy] mode = "observe"`): the rules are evaluated for every request and
//! what they would have decided is written on the approval as two labels, so it is on the
//! audit trail, counted in `/metrics` and read by `countersign policy report`; the request
//! itself is asked as if there were no rules.

use countersign_core::policy::Policy;
use countersign_core::{ApprovalRequest, Disposition, Verdict};

/// The label holding what the rules would have done: `allow`, `deny`, `require` or `none`.
pub const OBSERVED_LABEL: &str = "policy.observed";
/// The label holding the rule that would have decided (absent for `none`).
pub const OBSERVED_RULE_LABEL: &str = "policy.observed_rule";

/// What the rules would have done with `request`, recorded on it; the request goes on as if
/// there were no rules (a person is asked). The labels are the server's: whatever the agent
/// sent under those names is replaced.
pub fn observe(policy: &Policy, mut request: ApprovalRequest) -> (ApprovalRequest, Disposition) {
    let (shaped, disposition) = policy.apply(request.clone());
    let observed = match (&disposition, &shaped.policy_rule) {
        (
            Disposition::Resolve {
                verdict: Verdict::Approve,
                ..
            },
            _,
        ) => "allow",
        (
            Disposition::Resolve {
                verdict: Verdict::Reject,
                ..
            },
            _,
        ) => "deny",
        (Disposition::RequireHuman, Some(_)) => "require",
        (Disposition::RequireHuman, None) => "none",
    };
    request
        .labels
        .insert(OBSERVED_LABEL.to_owned(), observed.to_owned());
    match shaped.policy_rule {
        Some(rule) => request.labels.insert(OBSERVED_RULE_LABEL.to_owned(), rule),
        None => request.labels.remove(OBSERVED_RULE_LABEL),
    };
    (request, Disposition::RequireHuman)
}
