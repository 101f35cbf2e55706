//! The approver registry's unit tests; those with groups are `groups/tests.rs`, which uses
//! the helpers here (`groups.rs` is built on the registry, never the reverse).

use super::*;
use crate::{ApprovalRequest, Disposition};

pub(crate) fn spec(id: &str, max_risk: &str, identities: &[(&str, &[&str])]) -> ApproverSpec {
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

pub(crate) fn decider(channel: &str, user_id: &str, display_name: &str) -> Decider {
    Decider {
        channel: channel.into(),
        user_id: user_id.into(),
        display_name: display_name.into(),
    }
}

pub(crate) fn approval(risk: Risk, requester: &str) -> Approval {
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
        step_up: None,
    };
    Approval::new("id-1".into(), request, 60, Disposition::RequireHuman, 0)
}

pub(crate) fn registry() -> ApproverRegistry {
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
