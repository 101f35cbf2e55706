//! An approval from request to consume: watch, decide and wait, idempotent repeats, expiry, long-polls, cancel and consume, deliveries.

use super::*;

#[tokio::test]
async fn request_watch_decide_and_wait() {
    let server = TestServer::start().await;
    let mut agent = connect(&server).await;
    let mut worker = connect(&server).await;
    let mut events = watch(
        &mut worker,
        pb::WatchApprovalsRequest {
            channel: "telegram".into(),
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    let marker = next_event(&mut events, PATIENCE).await;
    assert_eq!(kind(&marker), pb::EventKind::SnapshotComplete);

    let mut req = request("agent-1", "call-1");
    req.routes = vec![pb::Route {
        channel: "telegram".into(),
        target: "-100123".into(),
    }];
    let approval = create(&mut agent, req).await;
    assert_eq!(state(&approval), pb::ApprovalState::Pending);
    assert_eq!(approval.args_digest.len(), 64);

    let requested = next_event(&mut events, PATIENCE).await;
    assert_eq!(kind(&requested), pb::EventKind::Requested);
    assert_eq!(requested.approval.as_ref().unwrap().id, approval.id);
    assert!(requested.seq > marker.seq);

    let waiter = {
        let mut agent = agent.clone();
        let id = approval.id.clone();
        tokio::spawn(async move {
            agent
                .wait_for_decision(pb::WaitForDecisionRequest {
                    approval_id: id,
                    timeout_ms: 30_000,
                })
                .await
                .unwrap()
                .into_inner()
        })
    };
    // Let the waiter start waiting before the decision lands.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let decided = worker
        .decide(decide(&approval.id, pb::Verdict::Approve, "42", "cb-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decided.outcome, pb::DecideOutcome::Resolved as i32);

    let waited = tokio::time::timeout(PATIENCE, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state(&waited), pb::ApprovalState::Approved);
    let resolution = waited.resolution.unwrap();
    assert_eq!(resolution.resolved_by, pb::ResolvedBy::Decision as i32);
    assert_eq!(resolution.deciders[0].user_id, "42");

    let resolved = next_event(&mut events, PATIENCE).await;
    assert_eq!(kind(&resolved), pb::EventKind::Resolved);
    assert_eq!(resolved.seq, requested.seq + 1);
    assert_eq!(
        state(resolved.approval.as_ref().unwrap()),
        pb::ApprovalState::Approved
    );
}

#[tokio::test]
async fn idempotent_repeat_and_changed_arguments() {
    let server = TestServer::start().await;
    let mut agent = connect(&server).await;
    let first = agent
        .request_approval(request("agent-1", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);

    // Same arguments with other key order and spacing: the same call.
    let mut again = request("agent-1", "call-1");
    again.arguments_json = r#"{"cwd":"/srv","command":"rm -rf /tmp/build"}"#.into();
    let repeat = agent.request_approval(again).await.unwrap().into_inner();
    assert!(!repeat.created);
    assert_eq!(
        repeat.approval.unwrap().id,
        first.approval.as_ref().unwrap().id
    );

    let events_before = count_rows(&server, "events").await;
    let mut changed = request("agent-1", "call-1");
    changed.arguments_json = r#"{"command": "rm -rf /"}"#.into();
    let err = agent.request_approval(changed).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(
        err.message().contains("idempotency_key"),
        "{}",
        err.message()
    );
    assert_eq!(count_rows(&server, "approvals").await, 1);
    assert_eq!(count_rows(&server, "events").await, events_before);

    // The same key for another tool or session is another call, not a repeat.
    let mut other_tool = request("agent-1", "call-1");
    other_tool.tool_name = "delete_file".into();
    let err = agent.request_approval(other_tool).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let mut other_session = request("agent-1", "call-1");
    other_session.session_id = "session-9".into();
    let err = agent.request_approval(other_session).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(count_rows(&server, "approvals").await, 1);

    // The same key from another agent is another call.
    let other = agent
        .request_approval(request("agent-2", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(other.created);
}

#[tokio::test]
async fn ttl_expiry_reaches_watchers_waiters_and_deciders() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let mut events = watch(&mut client, pb::WatchApprovalsRequest::default()).await;
    let mut req = request("agent-1", "call-1");
    req.ttl_seconds = 1;
    let approval = create(&mut client, req).await;
    assert_eq!(
        kind(&next_event(&mut events, PATIENCE).await),
        pb::EventKind::Requested
    );

    let waited = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 10_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&waited), pb::ApprovalState::Expired);
    assert_eq!(
        waited.resolution.unwrap().resolved_by,
        pb::ResolvedBy::Expiry as i32
    );

    let expired = next_event(&mut events, PATIENCE).await;
    assert_eq!(kind(&expired), pb::EventKind::Expired);

    let late = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "u1", "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.outcome, pb::DecideOutcome::AlreadyResolved as i32);
    assert_eq!(
        state(late.approval.as_ref().unwrap()),
        pb::ApprovalState::Expired
    );
}

#[tokio::test]
async fn wait_returns_still_pending_when_its_time_is_up() {
    let server = TestServer::start_with(|c| c.approvals.max_wait_seconds = 1).await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-1", "call-1")).await;
    // Asks for 30 s; the server caps the wait at 1 s.
    let waited = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 30_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&waited), pb::ApprovalState::Pending);
}

#[tokio::test]
async fn consume_once_cancel_and_not_found() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-1", "call-1")).await;

    let early = client
        .consume(pb::ConsumeRequest {
            approval_id: approval.id.clone(),
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            detail: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(early.code(), Code::FailedPrecondition);

    client
        .decide(decide(&approval.id, pb::Verdict::Approve, "u1", "k1"))
        .await
        .unwrap();
    let consume = pb::ConsumeRequest {
        approval_id: approval.id.clone(),
        outcome: pb::ConsumeOutcome::Succeeded as i32,
        detail: "exit 0".into(),
        ..Default::default()
    };
    let consumed = client.consume(consume.clone()).await.unwrap().into_inner();
    assert_eq!(state(&consumed), pb::ApprovalState::Consumed);
    assert_eq!(consumed.consumption.unwrap().detail, "exit 0");
    let twice = client.consume(consume).await.unwrap_err();
    assert_eq!(twice.code(), Code::FailedPrecondition);

    let other = create(&mut client, request("agent-1", "call-2")).await;
    let cancelled = client
        .cancel_approval(pb::CancelApprovalRequest {
            approval_id: other.id.clone(),
            reason: "no longer needed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&cancelled), pb::ApprovalState::Cancelled);
    let late = client
        .decide(decide(&other.id, pb::Verdict::Approve, "u1", "k2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.outcome, pb::DecideOutcome::AlreadyResolved as i32);
    let again = client
        .cancel_approval(pb::CancelApprovalRequest {
            approval_id: other.id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);

    let missing = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: "0190-nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn deliveries_are_recorded_once_per_target() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-1", "call-1")).await;
    for message in ["chat:1", "chat:2"] {
        client
            .record_delivery(pb::RecordDeliveryRequest {
                approval_id: approval.id.clone(),
                channel: "telegram".into(),
                target: "-100".into(),
                message_ref: message.into(),
            })
            .await
            .unwrap();
    }
    let stored = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.deliveries.len(), 1);
    assert_eq!(stored.deliveries[0].message_ref, "chat:2");
}
