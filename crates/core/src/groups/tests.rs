//! Groups, delegations and quorums over the approver registry.

use crate::approvers::tests::{approval, decider, spec};
use crate::approvers::*;
use crate::{Approval, ApprovalRequest, Decider, Risk, Verdict};

/// A valid high-risk request that names `group`, `required` of whose members must approve.
fn request_naming(group: &str, required: u32) -> ApprovalRequest {
    ApprovalRequest {
        approver_groups: vec![crate::groups::GroupQuorum {
            group: group.into(),
            required,
            ..Default::default()
        }],
        ..crate::validate::validate_request(
            crate::validate::RequestInput {
                agent_id: "a".into(),
                idempotency_key: "k".into(),
                tool_name: "t".into(),
                arguments_json: "{}".into(),
                risk: Some(Risk::High),
                ..Default::default()
            },
            &crate::validate::Limits::default(),
        )
        .unwrap()
    }
}

#[test]
fn groups_admit_members_and_delegates_of_members_only() {
    use crate::groups::{Delegation, GroupSpec, Groups};
    let registry = ApproverRegistry::compile(&[
        spec("alice", "critical", &[("cli", &["alice"])]),
        spec("bob", "critical", &[("cli", &["bob"])]),
        spec("erin", "critical", &[("cli", &["erin"])]),
    ])
    .unwrap();
    let groups = Groups::compile(
        &[GroupSpec {
            name: "security".into(),
            members: vec!["Alice".into(), "bob".into()],
            destinations: Vec::new(),
        }],
        &registry,
    )
    .unwrap();
    let mut approval = approval(Risk::High, "carol");
    let mut request = request_naming("security", 2);
    groups.resolve(&mut request).unwrap();
    approval.approver_groups = request.approver_groups;
    assert_eq!(approval.approver_groups[0].members, ["alice", "bob"]);

    let erin = decider("cli", "erin", "erin");
    let refused = registry
        .authorize(&erin, Verdict::Approve, &approval, &[])
        .unwrap_err();
    assert!(refused.to_string().contains("not a member of security"));

    let delegation = |delegator: &str| Delegation {
        id: "d1".into(),
        delegator: delegator.into(),
        delegate: "ERIN".into(),
        created_at: 0,
        until: 10,
        revoked_at: None,
        reason: String::new(),
        created_by: "admin".into(),
    };
    let on_behalf = registry
        .authorize(&erin, Verdict::Approve, &approval, &[delegation("alice")])
        .unwrap();
    assert_eq!(
        on_behalf,
        Authorized {
            approver: "alice".into(),
            delegate: Some("erin".into())
        }
    );
    // A delegation from someone outside the groups gives nothing.
    let outsider = ApproverRegistry::compile(&[
        spec("alice", "critical", &[("cli", &["alice"])]),
        spec("bob", "critical", &[("cli", &["bob"])]),
        spec("erin", "critical", &[("cli", &["erin"])]),
        spec("zed", "critical", &[("cli", &["zed"])]),
    ])
    .unwrap();
    assert!(outsider
        .authorize(&erin, Verdict::Approve, &approval, &[delegation("zed")])
        .is_err());

    // The delegator's own request: the delegate may not approve it for them.
    let mut own = approval.clone();
    own.requester = "alice".into();
    let refused = registry
        .authorize(&erin, Verdict::Approve, &own, &[delegation("alice")])
        .unwrap_err();
    assert!(
        refused.to_string().contains("on behalf of alice"),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("separation of duties"),
        "{refused}"
    );
}

#[test]
fn a_delegate_deciding_after_the_delegator_casts_the_same_vote_again() {
    use crate::groups::{Delegation, GroupQuorum};
    use crate::{DecideOutcome, Decision, Scope};
    let registry = ApproverRegistry::compile(&[
        spec("alice", "critical", &[("cli", &["alice"])]),
        spec("bob", "critical", &[("cli", &["bob"])]),
        spec("erin", "critical", &[("cli", &["erin"])]),
    ])
    .unwrap();
    let mut approval = approval(Risk::High, "carol");
    approval.approver_groups = vec![GroupQuorum {
        group: "security".into(),
        required: 2,
        members: vec!["alice".into(), "bob".into()],
        ..Default::default()
    }];
    let delegations = [Delegation {
        id: "d1".into(),
        delegator: "alice".into(),
        delegate: "erin".into(),
        created_at: 0,
        until: 10,
        revoked_at: None,
        reason: String::new(),
        created_by: "admin".into(),
    }];
    let vote = |who: &Decider, verdict: Verdict, approval: &Approval, key: &str| {
        let authorized = registry
            .authorize(who, verdict, approval, &delegations)
            .unwrap();
        Decision {
            verdict,
            scope: Scope::Once,
            reason: String::new(),
            decider: who.clone(),
            idempotency_key: key.into(),
            decided_at: 1,
            approver: authorized.approver,
            args_digest: String::new(),
            edited_arguments_json: String::new(),
            restarts_count: false,
            delegate: authorized.delegate,
            step_up: None,
        }
    };
    let alice = decider("cli", "alice", "alice");
    let erin = decider("cli", "erin", "erin");
    let own = vote(&alice, Verdict::Approve, &approval, "k1");
    assert_eq!(
        approval.decide(own, None, 1).unwrap().outcome,
        DecideOutcome::Recorded
    );
    // erin approves for alice, who approved already: the same vote again.
    let again = vote(&erin, Verdict::Approve, &approval, "k2");
    assert_eq!(
        (again.approver.as_str(), again.delegate.as_deref()),
        ("alice", Some("erin"))
    );
    assert_eq!(
        approval.decide(again, None, 2).unwrap().outcome,
        DecideOutcome::Duplicate
    );
    assert_eq!(approval.approvals_so_far(), 1);
    // A rejection for alice is another decision: it rejects.
    let reject = vote(&erin, Verdict::Reject, &approval, "k3");
    assert_eq!(
        approval.decide(reject, None, 3).unwrap().outcome,
        DecideOutcome::Resolved
    );
}

#[test]
fn an_approver_id_that_is_no_group_names_that_approver_alone() {
    use crate::groups::{GroupSpec, Groups};
    let registry = ApproverRegistry::compile(&[
        spec("alice", "critical", &[("cli", &["alice"])]),
        spec("bob", "critical", &[("cli", &["bob"])]),
    ])
    .unwrap();
    // A configured group of the same name as an approver wins.
    let groups = Groups::compile(
        &[GroupSpec {
            name: "bob".into(),
            members: vec!["alice".into(), "bob".into()],
            destinations: Vec::new(),
        }],
        &registry,
    )
    .unwrap();
    assert_eq!(groups.len(), 1, "only configured groups count as groups");
    let resolved = |name: &str| {
        let mut request = request_naming(name, 1);
        groups
            .resolve(&mut request)
            .map(|()| request.approver_groups)
    };
    let alice = resolved("alice").unwrap();
    assert_eq!(alice[0].members, ["alice"]);
    assert_eq!(alice[0].contacts[0].target, "alice");
    assert_eq!(resolved("bob").unwrap()[0].members, ["alice", "bob"]);
    let unknown = resolved("carol").unwrap_err().to_string();
    assert!(unknown.contains("no group \"carol\""), "{unknown}");

    let mut approval = approval(Risk::High, "carol");
    approval.approver_groups = alice;
    let bob = decider("cli", "bob", "bob");
    let refused = registry
        .authorize(&bob, Verdict::Approve, &approval, &[])
        .unwrap_err();
    assert!(
        refused.to_string().contains("not a member of alice"),
        "{refused}"
    );
}
