//! Decisions: one winner among concurrent ones, a quorum of distinct deciders, session grants.

use super::*;

#[tokio::test]
async fn fifty_concurrent_decisions_resolve_once() {
    let server = TestServer::start().await;
    let mut agent = connect(&server).await;
    let approval = create(&mut agent, request("agent-1", "call-1")).await;

    let mut calls = Vec::new();
    for i in 0..50 {
        let mut client = agent.clone();
        let verdict = if i % 2 == 0 {
            pb::Verdict::Approve
        } else {
            pb::Verdict::Reject
        };
        let req = decide(
            &approval.id,
            verdict,
            &format!("user-{}", i % 10),
            &format!("key-{i}"),
        );
        calls.push(tokio::spawn(async move {
            client.decide(req).await.unwrap().into_inner()
        }));
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    let resolved: Vec<_> = answers
        .iter()
        .filter(|a| a.outcome == pb::DecideOutcome::Resolved as i32)
        .collect();
    assert_eq!(resolved.len(), 1);
    let winner = resolved[0].approval.as_ref().unwrap();
    let final_state = state(winner);
    for answer in &answers {
        let outcome = pb::DecideOutcome::try_from(answer.outcome).unwrap();
        assert!(
            matches!(
                outcome,
                pb::DecideOutcome::Resolved
                    | pb::DecideOutcome::AlreadyResolved
                    | pb::DecideOutcome::Duplicate
            ),
            "unexpected {outcome:?}"
        );
        if outcome == pb::DecideOutcome::AlreadyResolved {
            assert_eq!(state(answer.approval.as_ref().unwrap()), final_state);
        }
    }
    let stored = agent
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&stored), final_state);
    assert_eq!(stored.decisions.len(), 1);

    let mut log = watch(
        &mut agent,
        pb::WatchApprovalsRequest {
            after_seq: 1,
            ..Default::default()
        },
    )
    .await;
    let only = next_event(&mut log, PATIENCE).await;
    assert_eq!(kind(&only), pb::EventKind::Resolved);
    assert_eq!(
        count_rows(&server, "events").await,
        2,
        "one request and one resolution event"
    );
}

#[tokio::test]
async fn quorum_of_two_distinct_deciders() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let mut req = request("agent-1", "call-1");
    req.required_approvals = 2;
    let approval = create(&mut client, req).await;

    let first = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "u1", "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.outcome, pb::DecideOutcome::Recorded as i32);
    assert_eq!(
        state(first.approval.as_ref().unwrap()),
        pb::ApprovalState::Pending
    );

    let same = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "u1", "k2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.outcome, pb::DecideOutcome::Duplicate as i32);

    let second = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "u2", "k3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.outcome, pb::DecideOutcome::Resolved as i32);
    let approved = second.approval.unwrap();
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    assert_eq!(approved.resolution.unwrap().deciders.len(), 2);

    // Any reject resolves a quorum approval as rejected.
    let mut req = request("agent-1", "call-2");
    req.required_approvals = 2;
    let other = create(&mut client, req).await;
    client
        .decide(decide(&other.id, pb::Verdict::Approve, "u1", "k4"))
        .await
        .unwrap();
    let rejected = client
        .decide(decide(&other.id, pb::Verdict::Reject, "u2", "k5"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rejected.outcome, pb::DecideOutcome::Resolved as i32);
    assert_eq!(
        state(rejected.approval.as_ref().unwrap()),
        pb::ApprovalState::Rejected
    );
}

#[tokio::test]
async fn session_grant_covers_same_tool_in_same_session_only() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let first = create(&mut client, request("agent-1", "call-1")).await;
    let mut grant = decide(&first.id, pb::Verdict::Approve, "u1", "k1");
    grant.scope = pb::Scope::Session as i32;
    client.decide(grant).await.unwrap();

    let mut next = request("agent-1", "call-2");
    next.arguments_json = r#"{"command": "ls"}"#.into();
    let covered = create(&mut client, next).await;
    assert_eq!(state(&covered), pb::ApprovalState::Approved);
    let resolution = covered.resolution.unwrap();
    assert_eq!(resolution.resolved_by, pb::ResolvedBy::Grant as i32);
    assert!(!resolution.grant_id.is_empty());

    let mut other_session = request("agent-1", "call-3");
    other_session.session_id = "session-2".into();
    assert_eq!(
        state(&create(&mut client, other_session).await),
        pb::ApprovalState::Pending
    );

    let mut other_tool = request("agent-1", "call-4");
    other_tool.tool_name = "deploy".into();
    assert_eq!(
        state(&create(&mut client, other_tool).await),
        pb::ApprovalState::Pending
    );

    let other_agent = request("agent-2", "call-5");
    assert_eq!(
        state(&create(&mut client, other_agent).await),
        pb::ApprovalState::Pending
    );

    // A session grant needs a session.
    let mut sessionless = request("agent-1", "call-6");
    sessionless.session_id.clear();
    let sessionless = create(&mut client, sessionless).await;
    let mut bad = decide(&sessionless.id, pb::Verdict::Approve, "u1", "k2");
    bad.scope = pb::Scope::Session as i32;
    let err = client.decide(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("scope"));
}
