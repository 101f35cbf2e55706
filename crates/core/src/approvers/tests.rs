//! The approver registry's unit tests, apart so that the ones with groups (which use
//! `groups.rs`, itself built on the registry) do not tie the two files in a circle.

use super::*;
use crate::{ApprovalRequest, Disposition};

fn spec(id: &str, max_risk: &str, identities: &[(&str, &[&str])]) -> ApproverSpec {
    ApproverSpec {
        id: id.into(),
        name: id.to_uppercase(),
        max_risk: max_risk.into(),
        identities: identities
            .iter()
            .map(|(channel, values)| {
                (
                    channel.to_string(),
                    values.iter().map(|v| v.to_string()).collect(),
                )
            })
            .collect(),
        aliases: Vec::new(),
    }
}

fn decider(channel: &str, user_id: &str, display_name: &str) -> Decider {
    Decider {
        channel: channel.into(),
        user_id: user_id.into(),
        display_name: display_name.into(),
    }
}

fn approval(risk: Risk, requester: &str) -> Approval {
    let request = ApprovalRequest {
        agent_id: "a".into(),
        session_id: String::new(),
        requester: requester.into(),
        idempotency_key: "k".into(),
        tool_name: "t".into(),
        arguments_json: "{}".into(),
        args_digest: "d".into(),
        action: String::new(),
        reason: String::new(),
        risk,
        routes: Vec::new(),
        required_approvals: 1,
        ttl_seconds: None,
        labels: BTreeMap::new(),
        policy_rule: None,
        separation_of_duties: true,
        grant_scope: String::new(),
        approver_groups: Vec::new(),
        follow_up: None,
        withdraw_when_caller_leaves: false,
    };
    Approval::new("id-1".into(), request, 60, Disposition::RequireHuman, 0)
}

fn registry() -> ApproverRegistry {
    let mut alice = spec(
        "alice",
        "critical",
        &[("telegram", &["1001"]), ("github", &["Alice-GH", "583231"])],
    );
    alice.aliases = vec!["alice@example.com".into()];
    ApproverRegistry::compile(&[alice, spec("bob", "medium", &[("cli", &["bob"])])]).unwrap()
}

#[test]
fn one_person_on_two_channels_is_one_approver() {
    let registry = registry();
    let high = approval(Risk::High, "carol");
    let telegram = decider("telegram", "1001", "@alice");
    let by_login = decider("github", "999", "alice-gh");
    let by_id = decider("github", "583231", "renamed");
    for d in [telegram, by_login, by_id] {
        assert_eq!(
            registry
                .authorize(&d, Verdict::Approve, &high, &[])
                .unwrap()
                .approver,
            "alice"
        );
    }
}

#[test]
fn strangers_ceilings_and_own_requests_are_refused() {
    let registry = registry();
    let refused = |d: Decider, verdict: Verdict, a: &Approval| match registry.authorize(
        &d,
        verdict,
        a,
        &[],
    ) {
        Err(Error::PermissionDenied(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let high = approval(Risk::High, "carol");
    assert!(refused(
        decider("telegram", "7", "@mallory"),
        Verdict::Approve,
        &high
    )
    .contains("not a registered approver"));
    // A Telegram display name is not an identity.
    assert!(
        refused(decider("telegram", "7", "1001"), Verdict::Approve, &high)
            .contains("not a registered approver")
    );
    assert!(refused(decider("cli", "bob", "bob"), Verdict::Reject, &high).contains("up to MEDIUM"));

    for requester in [
        "alice",
        "Alice",
        "ＡＬＩＣＥ",
        "ALICE@example.com",
        "1001",
        "telegram:1001",
        "alice-gh",
        "github:ALICE-GH",
        "github:583231",
    ] {
        let own = approval(Risk::Low, requester);
        let alice = decider("telegram", "1001", "@alice");
        assert!(
            refused(alice.clone(), Verdict::Approve, &own).contains("separation of duties"),
            "{requester}"
        );
        assert!(registry
            .authorize(&alice, Verdict::Reject, &own, &[])
            .is_ok());
        let mut exempt = own.clone();
        exempt.separation_of_duties = false;
        assert!(registry
            .authorize(&alice, Verdict::Approve, &exempt, &[])
            .is_ok());
    }
}

#[test]
fn an_empty_registry_accepts_any_decider_by_channel_identity() {
    let anyone = decider("telegram", "7", "@x");
    let own = approval(Risk::Critical, "7");
    assert_eq!(
        ApproverRegistry::default()
            .authorize(&anyone, Verdict::Approve, &own, &[])
            .unwrap()
            .approver,
        "telegram:7"
    );
    let shouting = decider("cli", "BOB", "BOB");
    assert_eq!(
        ApproverRegistry::default()
            .authorize(&shouting, Verdict::Approve, &own, &[])
            .unwrap()
            .approver,
        "cli:bob",
        "one person in two spellings counts once"
    );
}

#[test]
fn malformed_entries_are_named() {
    let cases = [
        (spec("x", "huge", &[("cli", &["x"])]), "max_risk"),
        (spec("x", "", &[("cli", &["x"])]), "max_risk is required"),
        (spec("x", "low", &[]), "no identity"),
        (
            spec("x", "low", &[("Tele gram", &["1"])]),
            "identities.Tele gram",
        ),
        (spec("x", "low", &[("cli", &[""])]), "identities.cli"),
        (spec("alice", "low", &[("cli", &["other"])]), "same id"),
        (spec("ALICE", "low", &[("cli", &["other"])]), "same id"),
        (
            ApproverSpec {
                aliases: vec!["Alice".into()],
                ..spec("z", "low", &[("cli", &["z"])])
            },
            "also an id or alias",
        ),
        (
            spec("y", "low", &[("github", &["alice-gh"])]),
            "also listed",
        ),
    ];
    for (broken, expected) in cases {
        let id = broken.id.clone();
        let error = ApproverRegistry::compile(&[
            spec("alice", "high", &[("github", &["Alice-GH"])]),
            broken,
        ])
        .unwrap_err();
        assert_eq!(error.subject, format!("approver {id:?} (approvers[1])"));
        assert!(error.message.contains(expected), "{expected}: {error}");
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
    let mut request = ApprovalRequest {
        approver_groups: vec![crate::groups::GroupQuorum {
            group: "security".into(),
            required: 2,
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
    };
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
