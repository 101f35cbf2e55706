//! The state machine's unit tests: every transition, quorum and follow-up, on values built here.

use std::collections::BTreeMap;

use super::*;
use crate::{Decider, GroupQuorum, Risk};

fn request(required: u32) -> ApprovalRequest {
    ApprovalRequest {
        agent_id: "agent".into(),
        session_id: "s1".into(),
        requester: "alice".into(),
        idempotency_key: "call-1".into(),
        tool_name: "bash".into(),
        arguments_json: "{}".into(),
        args_digest: "d".into(),
        action: "run".into(),
        reason: String::new(),
        risk: Risk::High,
        routes: Vec::new(),
        required_approvals: required,
        ttl_seconds: None,
        labels: BTreeMap::new(),
        policy_rule: None,
        separation_of_duties: true,
        grant_scope: String::new(),
        approver_groups: Vec::new(),
        follow_up: None,
        withdraw_when_caller_leaves: false,
        step_up: None,
    }
}

fn decision(user: &str, verdict: Verdict, key: &str) -> Decision {
    let decider = Decider {
        channel: "telegram".into(),
        user_id: user.into(),
        display_name: user.into(),
    };
    Decision {
        verdict,
        scope: Scope::Once,
        reason: String::new(),
        approver: decider.identity(),
        decider,
        idempotency_key: key.into(),
        decided_at: 5,
        args_digest: String::new(),
        edited_arguments_json: String::new(),
        restarts_count: false,
        delegate: None,
        step_up: None,
    }
}

fn pending(required: u32) -> Approval {
    Approval::new(
        "a1".into(),
        request(required),
        60,
        Disposition::RequireHuman,
        0,
    )
}

#[test]
fn quorum_counts_distinct_approvers_and_one_reject_resolves() {
    let mut a = pending(2);
    let first = a
        .decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    assert_eq!(first.outcome, DecideOutcome::Recorded);
    assert_eq!(first.event, Some(EventKind::DecisionRecorded));
    let again = a
        .decide(decision("u1", Verdict::Approve, "k2"), None, 2)
        .unwrap();
    assert_eq!(again.outcome, DecideOutcome::Duplicate);
    let reject = a
        .decide(decision("u1", Verdict::Reject, "k3"), None, 3)
        .unwrap();
    assert_eq!(reject.outcome, DecideOutcome::Resolved);
    assert_eq!(a.state, State::Rejected);
    let late = a
        .decide(decision("u2", Verdict::Approve, "k4"), None, 4)
        .unwrap();
    assert_eq!(late.outcome, DecideOutcome::AlreadyResolved);
    assert_eq!(late.event, None);
    assert_eq!(a.decisions.len(), 2);
}

#[test]
fn a_repeated_idempotency_key_is_a_duplicate_even_after_resolution() {
    let mut a = pending(1);
    assert_eq!(
        a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
            .unwrap()
            .outcome,
        DecideOutcome::Resolved
    );
    assert_eq!(
        a.decide(decision("u1", Verdict::Approve, "k1"), None, 2)
            .unwrap()
            .outcome,
        DecideOutcome::Duplicate
    );
}

#[test]
fn an_approval_past_its_deadline_cannot_be_approved() {
    let mut a = pending(1);
    let effect = a
        .decide(decision("u1", Verdict::Approve, "k1"), None, 60_000)
        .unwrap();
    assert_eq!(effect.outcome, DecideOutcome::AlreadyResolved);
    assert_eq!(effect.event, Some(EventKind::Expired));
    assert_eq!(a.state, State::Expired);
    assert!(a.decisions.is_empty());
}

#[test]
fn session_scope_needs_a_session_and_grants_on_approval() {
    let mut a = pending(1);
    let mut d = decision("u1", Verdict::Approve, "k1");
    d.scope = Scope::Session;
    assert!(a.decide(d.clone(), None, 1).unwrap().grants_session);

    let mut no_session = pending(1);
    no_session.session_id.clear();
    let err = no_session.decide(d, None, 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { ref field, .. } if field == "scope"));
    assert!(no_session.decisions.is_empty());
}

#[test]
fn consume_only_once_and_only_after_approval() {
    let mut a = pending(1);
    assert!(a.consume(ConsumeOutcome::Succeeded, "", 1).is_err());
    a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    assert_eq!(
        a.consume(ConsumeOutcome::Succeeded, "ok", 2).unwrap(),
        EventKind::Consumed
    );
    assert!(matches!(
        a.consume(ConsumeOutcome::Succeeded, "", 3),
        Err(Error::FailedPrecondition(_))
    ));
}

fn version(arguments: &str, digest: &str) -> EditedVersion {
    EditedVersion {
        arguments_json: arguments.into(),
        args_digest: digest.into(),
        risk: Risk::High,
        required_approvals: 1,
        separation_of_duties: true,
    }
}

#[test]
fn an_edit_after_an_approval_restarts_the_count_and_stale_versions_are_refused() {
    let mut a = pending(2);
    a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    assert_eq!(a.approvals_so_far(), 1);
    let effect = a
        .decide(
            decision("u2", Verdict::Approve, "k2"),
            Some(version("{\"x\":1}", "e1")),
            2,
        )
        .unwrap();
    assert_eq!(effect.outcome, DecideOutcome::Recorded);
    assert!(a.decisions[1].restarts_count);
    assert_eq!(a.current_digest(), "e1");
    assert_eq!(a.approvals_so_far(), 1, "only u2's approval of e1 counts");

    // No version named after an edit, or the old one: refused, nothing changes.
    let before = a.clone();
    for named in ["", "d"] {
        let mut stale = decision("u1", Verdict::Approve, "k3");
        stale.args_digest = named.into();
        assert!(matches!(
            a.decide(stale, None, 3),
            Err(Error::FailedPrecondition(_))
        ));
        assert_eq!(a, before);
    }
    let mut current = decision("u1", Verdict::Approve, "k4");
    current.args_digest = "e1".into();
    assert_eq!(
        a.decide(current, None, 4).unwrap().outcome,
        DecideOutcome::Resolved
    );
    let resolution = a.resolution.as_ref().unwrap();
    assert_eq!(resolution.args_digest, "e1");
    assert_eq!(resolution.deciders.len(), 2);
}

#[test]
fn an_edit_goes_with_an_approval_of_this_call_only() {
    let mut a = pending(1);
    let reject = a.decide(
        decision("u1", Verdict::Reject, "k1"),
        Some(version("{}", "e1")),
        1,
    );
    assert!(
        matches!(reject, Err(Error::InvalidArgument { ref field, .. }) if field == "edited_arguments_json")
    );
    let mut session = decision("u1", Verdict::Approve, "k2");
    session.scope = Scope::Session;
    let refused = a.decide(session, Some(version("{}", "e1")), 2);
    assert!(matches!(refused, Err(Error::InvalidArgument { ref field, .. }) if field == "scope"));
    assert!(a.decisions.is_empty() && a.edit.is_none());
}

#[test]
fn cancel_only_while_pending() {
    let mut a = pending(1);
    assert_eq!(
        a.cancel("changed my mind", 1).unwrap(),
        EventKind::Cancelled
    );
    assert_eq!(a.state, State::Cancelled);
    assert!(a.cancel("again", 2).is_err());
}

#[test]
fn follow_up_reminds_then_escalates_then_expires_with_the_reason() {
    use crate::groups::{FollowUp, GroupQuorum, OnTimeout};
    let group = |name: &str, member: &str| GroupQuorum {
        group: name.into(),
        required: 1,
        members: vec![member.into()],
        ..Default::default()
    };
    let mut req = request(1);
    req.approver_groups = vec![group("security", "telegram:u1")];
    req.follow_up = Some(FollowUp {
        remind_after_seconds: 10,
        escalate_after_seconds: 20,
        escalate_to: Some(group("oncall", "telegram:u9")),
        on_timeout: OnTimeout::Escalate,
        ..Default::default()
    });
    let mut a = Approval::new("a1".into(), req, 60, Disposition::RequireHuman, 0);
    assert_eq!(a.next_due(), 10_000);
    assert_eq!(a.follow_up_if_due(9_999), None);
    assert!(!a.is_decider("telegram:u9"));
    let (kind, detail) = a.follow_up_if_due(10_000).unwrap();
    assert_eq!(kind, EventKind::Reminded);
    assert_eq!(detail, "reminder: no decision from security after 10s");
    assert_eq!(a.next_due(), 20_000);
    let (kind, _) = a.follow_up_if_due(20_000).unwrap();
    assert_eq!(kind, EventKind::Escalated);
    assert!(a.is_decider("telegram:u9"));
    // Escalated before the deadline: on_timeout = escalate gives no second deadline; the
    // deadline expires it, naming who was waited for.
    assert_eq!(a.expires_at, 60_000);
    assert_eq!(a.next_due(), 60_000);
    let (kind, reason) = a.follow_up_if_due(60_000).unwrap();
    assert_eq!(kind, EventKind::Expired);
    assert_eq!(reason, "no decision from security or oncall within 1m");
    assert_eq!(a.state, State::Expired);

    // The escalation group's member counts toward the group's quorum.
    let mut req = request(1);
    req.approver_groups = vec![group("security", "telegram:u1")];
    req.follow_up = Some(FollowUp {
        escalate_to: Some(group("oncall", "telegram:u9")),
        on_timeout: OnTimeout::Escalate,
        ..Default::default()
    });
    let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
    assert!(!b.expire_if_due(60_000), "escalates instead of expiring");
    assert_eq!(b.follow_up_if_due(60_000).unwrap().0, EventKind::Escalated);
    assert_eq!(b.expires_at, 120_000);
    let mut without_groups = b.clone();
    without_groups.approver_groups.clear();
    assert!(
        without_groups.is_decider("anyone"),
        "an escalation never narrows"
    );
    let mut d = decision("u9", Verdict::Approve, "k9");
    d.approver = "telegram:u9".into();
    assert_eq!(
        b.decide(d, None, 61_000).unwrap().outcome,
        DecideOutcome::Resolved
    );
}

fn quorum(name: &str, required: u32, members: &[&str]) -> GroupQuorum {
    GroupQuorum {
        group: name.into(),
        required,
        members: members.iter().map(|m| format!("telegram:{m}")).collect(),
        ..Default::default()
    }
}

#[test]
fn after_one_of_two_approvals_the_follow_up_says_what_is_missing() {
    let mut req = request(1);
    req.approver_groups = vec![quorum("security", 2, &["u1", "u2", "u3"])];
    req.follow_up = Some(FollowUp {
        remind_after_seconds: 10,
        escalate_after_seconds: 20,
        escalate_to: Some(quorum("oncall", 1, &["u9"])),
        ..Default::default()
    });
    let mut a = Approval::new("a1".into(), req, 60, Disposition::RequireHuman, 0);
    a.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    assert_eq!(
        a.follow_up_if_due(10_000).unwrap().1,
        "reminder: only 1 of 2 approvals from security after 10s"
    );
    assert_eq!(
        a.follow_up_if_due(20_000).unwrap().1,
        "escalated to oncall after 20s: only 1 of 2 approvals from security"
    );
    // Escalated: on-call members count for security too.
    assert_eq!(
        a.follow_up_if_due(60_000).unwrap(),
        (
            EventKind::Expired,
            "only 1 of 2 approvals from security or oncall within 1m".to_string()
        )
    );

    // Two groups: "no decision" from the one nobody of which approved, and the overall
    // quorum where it asks for more people than the groups do.
    let mut req = request(4);
    req.approver_groups = vec![
        quorum("db", 1, &["u4", "u3"]),
        quorum("security", 2, &["u1", "u2", "u3"]),
    ];
    let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
    b.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    let mut first = b.clone();
    first.expire_if_due(60_000);
    assert_eq!(
            first.resolution.unwrap().reason,
            "no decision from db and only 1 of 2 approvals from security and only 1 of 4 approvals in all within 1m"
        );
    b.decide(decision("u3", Verdict::Approve, "k3"), None, 2)
        .unwrap();
    b.expire_if_due(60_000);
    assert_eq!(
        b.resolution.unwrap().reason,
        "only 2 of 4 approvals within 1m"
    );

    // No groups, no plan: the quorum that was not reached.
    let mut c = pending(2);
    c.decide(decision("u1", Verdict::Approve, "k1"), None, 1)
        .unwrap();
    c.expire_if_due(60_000);
    assert_eq!(
        c.resolution.unwrap().reason,
        "only 1 of 2 approvals within 1m"
    );
}

#[test]
fn one_member_of_two_groups_counts_for_both() {
    let mut req = request(1);
    req.approver_groups = vec![
        quorum("db", 1, &["u4", "u3"]),
        quorum("security", 1, &["u1", "u3"]),
    ];
    let mut a = Approval::new("a1".into(), req.clone(), 60, Disposition::RequireHuman, 0);
    let effect = a
        .decide(decision("u3", Verdict::Approve, "k3"), None, 1)
        .unwrap();
    assert_eq!(effect.outcome, DecideOutcome::Resolved);
    let counted: Vec<usize> = a.group_progress().into_iter().map(|(_, n)| n).collect();
    assert_eq!(counted, [1, 1]);

    // Two people wanted: required_approvals says so.
    req.required_approvals = 2;
    let mut b = Approval::new("b1".into(), req, 60, Disposition::RequireHuman, 0);
    let effect = b
        .decide(decision("u3", Verdict::Approve, "k3"), None, 1)
        .unwrap();
    assert_eq!(effect.outcome, DecideOutcome::Recorded);
    assert_eq!(
        b.decide(decision("u1", Verdict::Approve, "k1"), None, 2)
            .unwrap()
            .outcome,
        DecideOutcome::Resolved
    );
}

#[test]
fn durations_read_like_people_write_them() {
    assert_eq!(human_duration(45_000), "45s");
    assert_eq!(human_duration(1_800_000), "30m");
    assert_eq!(human_duration(90_000), "1m30s");
    assert_eq!(human_duration(7_200_000), "2h");
    assert_eq!(human_duration(5_400_000), "1h30m");
}

fn step_up_approval() -> Approval {
    let mut request = request(1);
    request.step_up = Some(crate::StepUp::Passkey);
    Approval::new("a1".into(), request, 60, Disposition::RequireHuman, 0)
}

#[test]
fn a_step_up_approval_is_approved_only_with_its_second_factor() {
    let mut a = step_up_approval();
    let refused = a.decide(decision("u1", Verdict::Approve, "k1"), None, 1);
    assert!(
        matches!(&refused, Err(Error::PermissionDenied(why)) if why.contains("only with a passkey")),
        "{refused:?}"
    );
    assert!(a.is_pending() && a.decisions.is_empty());
    let proof = crate::StepUpProof {
        method: crate::StepUp::Passkey,
        credential_id: "Y3JlZA".into(),
    };
    let for_the_session = Decision {
        step_up: Some(proof.clone()),
        scope: Scope::Session,
        ..decision("u1", Verdict::Approve, "k1s")
    };
    assert!(matches!(
        a.decide(for_the_session, None, 1),
        Err(Error::PermissionDenied(why)) if why.contains("cannot grant the session")
    ));
    let with_passkey = Decision {
        step_up: Some(proof.clone()),
        ..decision("u1", Verdict::Approve, "k2")
    };
    let effect = a.decide(with_passkey, None, 2).unwrap();
    assert_eq!(effect.outcome, DecideOutcome::Resolved);
    assert_eq!(a.state, State::Approved);
    let claims = crate::receipt::ReceiptClaims::of(&a, 7, 60).unwrap();
    assert_eq!(
        claims.step_up,
        Some(serde_json::json!([{
            "method": "passkey", "credential_id": "Y3JlZA", "approver": "telegram:u1"
        }]))
    );
}

#[test]
fn rejecting_a_step_up_approval_needs_no_second_factor_and_editing_it_is_refused() {
    let mut a = step_up_approval();
    let edit = EditedVersion {
        arguments_json: r#"{"x":1}"#.into(),
        args_digest: "e".into(),
        risk: Risk::High,
        required_approvals: 1,
        separation_of_duties: true,
    };
    let proof = crate::StepUpProof {
        method: crate::StepUp::Passkey,
        credential_id: "Y3JlZA".into(),
    };
    let edited = Decision {
        step_up: Some(proof),
        ..decision("u1", Verdict::Approve, "k1")
    };
    assert!(matches!(
        a.decide(edited, Some(edit), 1),
        Err(Error::PermissionDenied(why)) if why.contains("cannot be approved with edits")
    ));
    let effect = a
        .decide(decision("u1", Verdict::Reject, "k2"), None, 2)
        .unwrap();
    assert_eq!(effect.outcome, DecideOutcome::Resolved);
    assert_eq!(a.state, State::Rejected);
    let claims = crate::receipt::ReceiptClaims::of(&a, 7, 60).unwrap();
    assert_eq!(claims.step_up, None);
}
