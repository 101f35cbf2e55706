//! The approval lifecycle through gRPC over a real socket.

mod common;

use std::time::{Duration, Instant};

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;
use sqlx::Connection;
use tonic::Code;

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
async fn list_filters_and_pages() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut req = request(
            if i < 5 { "agent-a" } else { "agent-b" },
            &format!("call-{i}"),
        );
        if i % 2 == 0 {
            req.routes = vec![pb::Route {
                channel: "github".into(),
                target: "o/r#1".into(),
            }];
        } else if i != 5 {
            req.routes = vec![pb::Route {
                channel: "telegram".into(),
                target: String::new(),
            }];
        }
        ids.push(create(&mut client, req).await.id);
    }
    client
        .decide(decide(&ids[0], pb::Verdict::Reject, "u", "k"))
        .await
        .unwrap();

    let list = |req: pb::ListApprovalsRequest| {
        let mut client = client.clone();
        async move { client.list_approvals(req).await.unwrap().into_inner() }
    };
    // Pages of 3 over agent-a's five approvals, newest first.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(pb::ListApprovalsRequest {
            agent_id: "agent-a".into(),
            page_size: 3,
            page_token: token.clone(),
            ..Default::default()
        })
        .await;
        assert!(page.approvals.len() <= 3);
        seen.extend(page.approvals.into_iter().map(|a| a.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut expected: Vec<String> = ids[..5].to_vec();
    expected.reverse();
    assert_eq!(seen, expected);

    let pending = list(pb::ListApprovalsRequest {
        states: vec![pb::ApprovalState::Pending as i32],
        ..Default::default()
    })
    .await;
    assert_eq!(pending.approvals.len(), 6);

    // github: routed there (0, 2, 4, 6) or nowhere (5); 0 is rejected.
    let github = list(pb::ListApprovalsRequest {
        channel: "github".into(),
        states: vec![pb::ApprovalState::Pending as i32],
        ..Default::default()
    })
    .await;
    let mut got: Vec<String> = github.approvals.into_iter().map(|a| a.id).collect();
    got.sort();
    let mut want = vec![
        ids[2].clone(),
        ids[4].clone(),
        ids[5].clone(),
        ids[6].clone(),
    ];
    want.sort();
    assert_eq!(got, want);

    let bad = client
        .list_approvals(pb::ListApprovalsRequest {
            page_size: 10_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("page_size"));
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named_and_stores_nothing() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    type Mutation = Box<dyn Fn(&mut pb::RequestApprovalRequest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("agent_id", Box::new(|r| r.agent_id.clear())),
        ("idempotency_key", Box::new(|r| r.idempotency_key.clear())),
        ("tool_name", Box::new(|r| r.tool_name = "rm -rf".into())),
        ("tool_name", Box::new(|r| r.tool_name = "t".repeat(129))),
        ("tool_name", Box::new(|r| r.tool_name.clear())),
        (
            "arguments_json",
            Box::new(|r| r.arguments_json = "not json".into()),
        ),
        (
            "arguments_json",
            Box::new(|r| r.arguments_json = "[1,2]".into()),
        ),
        (
            "arguments_json",
            Box::new(|r| r.arguments_json = format!(r#"{{"blob":"{}"}}"#, "x".repeat(70 * 1024))),
        ),
        ("risk", Box::new(|r| r.risk = pb::Risk::Unspecified as i32)),
        ("risk", Box::new(|r| r.risk = 99)),
        (
            "routes",
            Box::new(|r| {
                r.routes = vec![
                    pb::Route {
                        channel: "cli".into(),
                        target: String::new()
                    };
                    17
                ]
            }),
        ),
        (
            "routes[0].channel",
            Box::new(|r| {
                r.routes = vec![pb::Route {
                    channel: String::new(),
                    target: "x".into(),
                }]
            }),
        ),
        ("ttl_seconds", Box::new(|r| r.ttl_seconds = 30 * 24 * 3600)),
        (
            "required_approvals",
            Box::new(|r| r.required_approvals = 100),
        ),
        ("action", Box::new(|r| r.action = "a".repeat(2000))),
        ("session_id", Box::new(|r| r.session_id = "s".repeat(200))),
        (
            "labels",
            Box::new(|r| r.labels = (0..40).map(|i| (format!("k{i}"), "v".into())).collect()),
        ),
    ];
    for (field, mutate) in cases {
        let mut req = request("agent-1", "call-1");
        mutate(&mut req);
        let err = client.request_approval(req).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{field}: {}",
            err.message()
        );
        assert!(
            err.message().starts_with(field),
            "expected {field}, got: {}",
            err.message()
        );
    }
    assert_eq!(count_rows(&server, "approvals").await, 0);
    assert_eq!(count_rows(&server, "events").await, 0);

    // Decide, consume, cancel and record-delivery inputs.
    let approval = create(&mut client, request("agent-1", "call-ok")).await;
    let events = count_rows(&server, "events").await;
    let mut no_verdict = decide(&approval.id, pb::Verdict::Approve, "u", "k");
    no_verdict.verdict = pb::Verdict::Unspecified as i32;
    let mut no_decider = decide(&approval.id, pb::Verdict::Approve, "u", "k");
    no_decider.decider = None;
    let mut no_key = decide(&approval.id, pb::Verdict::Approve, "u", "k");
    no_key.idempotency_key.clear();
    for (field, req) in [
        ("verdict", no_verdict),
        ("decider.channel", no_decider),
        ("idempotency_key", no_key),
    ] {
        let err = client.decide(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().starts_with(field),
            "expected {field}, got: {}",
            err.message()
        );
    }
    let err = client
        .decide(decide("", pb::Verdict::Approve, "u", "k"))
        .await
        .unwrap_err();
    assert!(err.message().starts_with("approval_id"));
    let err = client
        .decide(decide("missing", pb::Verdict::Approve, "u", "k"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = client
        .record_delivery(pb::RecordDeliveryRequest {
            approval_id: approval.id.clone(),
            channel: "telegram".into(),
            target: "1".into(),
            message_ref: String::new(),
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("message_ref"));
    let err = client
        .consume(pb::ConsumeRequest {
            approval_id: approval.id.clone(),
            outcome: 0,
            detail: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("outcome"));
    let err = client
        .watch_approvals(pb::WatchApprovalsRequest {
            after_seq: 1,
            include_snapshot: true,
            channel: String::new(),
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("include_snapshot"));
    assert_eq!(count_rows(&server, "events").await, events);
    let unchanged = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unchanged.decisions.is_empty() && unchanged.deliveries.is_empty());
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

/// Commits reach the database file itself within moments, not only its WAL: the checkpointer
/// copies them in the background (SQLite alone would wait for 1,000 pages of WAL), so the WAL
/// stays short and the writer never copies a large backlog itself.
#[tokio::test]
async fn committed_approvals_reach_the_database_file_while_the_server_runs() {
    if countersign_testkit::postgres::skip_unless_sqlite("checkpoints a SQLite WAL") {
        return;
    }
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let created = create(&mut client, request("agent", "checkpointed")).await;
    let copies = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + PATIENCE;
    for attempt in 0.. {
        // The database file alone, without its WAL: what is in it has been checkpointed.
        let copy = copies.path().join(format!("copy-{attempt}.db"));
        std::fs::copy(server.database_path(), &copy).unwrap();
        let found = async {
            let mut conn = sqlx::SqliteConnection::connect(&format!(
                "sqlite://{}?mode=ro&immutable=1",
                copy.display()
            ))
            .await?;
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM approvals WHERE id = ?")
                .bind(&created.id)
                .fetch_one(&mut conn)
                .await
        }
        .await;
        // A copy taken during a checkpoint may be torn: try again.
        if matches!(found, Ok(1)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "approval {} is still only in the WAL after 10 s ({found:?})",
            created.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
