//! Lists with their filters and pages, bad input refused with the field named, and committed approvals in the database file.

use super::*;

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
            history_id: String::new(),
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
