//! The follow-up of an approval nobody answers: reminders, escalation, and what the deadline means.

use super::*;

#[tokio::test]
async fn reminders_then_escalation_let_the_escalation_group_decide() {
    let server = server_with(|c| {
        let migrations = c
            .rules
            .iter_mut()
            .find(|r| r.name == "migrations")
            .expect("the example's migrations rule");
        migrations.remind_after_seconds = Some(1);
        migrations.escalate_after_seconds = Some(2);
    })
    .await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, migration("e1")).await;
    let follow_up = approval.follow_up.clone().unwrap();
    assert_eq!(
        (
            follow_up.remind_after_seconds,
            follow_up.escalate_after_seconds,
            follow_up.escalate_to.as_str()
        ),
        (1, 2, "oncall")
    );

    let reminded = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.reminded_at.is_some())
    })
    .await;
    assert!(reminded.follow_up.unwrap().escalated_at.is_none());
    let escalated = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.escalated_at.is_some())
    })
    .await;
    assert_eq!(state(&escalated), pb::ApprovalState::Pending);
    // The on-call group's destination joined the routes.
    assert!(escalated.routes.iter().any(|r| r.target == "-100900900"));

    let kinds: Vec<(pb::EventKind, String)> = events_of(&server, &approval.id)
        .await
        .iter()
        .map(|e| (event_kind(e), e.detail.clone()))
        .collect();
    assert_eq!(kinds[1].0, pb::EventKind::Reminded, "{kinds:?}");
    assert_eq!(
        kinds[1].1,
        "reminder: no decision from db or security after 1s"
    );
    assert_eq!(kinds[2].0, pb::EventKind::Escalated, "{kinds:?}");
    assert!(
        kinds[2].1.starts_with("escalated to oncall after "),
        "{kinds:?}"
    );

    // erin (on-call) may now decide, and counts for both groups.
    let erin = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    assert_eq!(erin.outcome(), pb::DecideOutcome::Resolved);
    assert_eq!(
        progress(erin.approval.as_ref().unwrap()),
        [("db".to_string(), 1, 1), ("security".to_string(), 1, 1)]
    );
    let mut admin = admin(&channel(&server).await, None);
    assert!(verify(&mut admin).await.intact);
}

#[tokio::test]
async fn on_timeout_reject_tells_the_runtime_who_did_not_decide() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        pb::RequestApprovalRequest {
            ttl_seconds: 1,
            ..critical("t1", "someone-else")
        },
    )
    .await;
    let done = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 5000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&done), pb::ApprovalState::Expired);
    let resolution = done.resolution.unwrap();
    assert_eq!(resolution.resolved_by(), pb::ResolvedBy::Expiry);
    assert_eq!(resolution.reason, "no decision from security within 1s");
}

#[tokio::test]
async fn on_timeout_escalate_gives_the_escalation_group_a_fresh_deadline() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    // No rule matches a HIGH shell call: the request sets its own groups and timeout policy.
    let escalating = |key: &str| pb::RequestApprovalRequest {
        ttl_seconds: 1,
        approver_groups: vec![pb::GroupQuorum {
            group: "security".into(),
            required: 2,
            ..Default::default()
        }],
        follow_up: Some(pb::FollowUp {
            on_timeout: pb::OnTimeout::Escalate as i32,
            escalate_to: "oncall".into(),
            ..Default::default()
        }),
        ..request("agent-a", key)
    };
    let approval = create(&mut client, escalating("x1")).await;
    let escalated = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.escalated_at.is_some())
    })
    .await;
    assert_eq!(state(&escalated), pb::ApprovalState::Pending);
    let first_deadline = approval.expires_at.unwrap().seconds;
    assert!(escalated.expires_at.unwrap().seconds > first_deadline);
    let erin = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    assert_eq!(
        erin.outcome(),
        pb::DecideOutcome::Recorded,
        "2 of security: one more"
    );

    // Nobody answers the escalation either: then it expires, naming who was waited for.
    let ignored = create(&mut client, escalating("x2")).await;
    let done = until(&mut client, &ignored.id, Duration::from_secs(6), |a| {
        state(a) != pb::ApprovalState::Pending
    })
    .await;
    assert_eq!(state(&done), pb::ApprovalState::Expired);
    assert_eq!(
        done.resolution.unwrap().reason,
        "no decision from security or oncall within 2s"
    );
    let kinds: Vec<pb::EventKind> = events_of(&server, &ignored.id)
        .await
        .iter()
        .map(event_kind)
        .collect();
    assert_eq!(
        kinds,
        [
            pb::EventKind::Requested,
            pb::EventKind::Escalated,
            pb::EventKind::Expired
        ]
    );
}

/// After alice's approval of "2 of security" the reminder and the expiry say what is missing,
/// not "no decision from security".
#[tokio::test]
async fn a_reminder_after_one_of_two_approvals_says_what_is_missing() {
    let server = server_with(|c| {
        let critical = c
            .rules
            .iter_mut()
            .find(|r| r.name == "critical-needs-security")
            .expect("the example's critical rule");
        critical.remind_after_seconds = Some(1);
    })
    .await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        pb::RequestApprovalRequest {
            ttl_seconds: 3,
            ..critical("half", "someone-else")
        },
    )
    .await;
    let alice = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1001")
        .await
        .unwrap();
    assert_eq!(alice.outcome(), pb::DecideOutcome::Recorded);

    let expired = until(&mut client, &approval.id, Duration::from_secs(8), |a| {
        state(a) != pb::ApprovalState::Pending
    })
    .await;
    assert_eq!(state(&expired), pb::ApprovalState::Expired);
    assert_eq!(
        expired.resolution.unwrap().reason,
        "only 1 of 2 approvals from security within 3s"
    );
    let reminders: Vec<String> = events_of(&server, &approval.id)
        .await
        .into_iter()
        .filter(|e| event_kind(e) == pb::EventKind::Reminded)
        .map(|e| e.detail)
        .collect();
    assert_eq!(reminders.len(), 1, "{reminders:?}");
    assert!(
        reminders[0].starts_with("reminder: only 1 of 2 approvals from security after "),
        "{reminders:?}"
    );
}
