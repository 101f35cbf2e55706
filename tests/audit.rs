//! The audit trail through gRPC over a real socket: the event history with its filters and
//! pages, the hash chain that VerifyAudit checks (also against hand edits of the SQLite file),
//! and redaction of argument values.

mod common;

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;

/// Two agents' approvals, decided by two people, one consumed: five events.
async fn history(server: &TestServer) -> (pb::Approval, pb::Approval) {
    let mut client = connect(server).await;
    let first = create(&mut client, request("agent-a", "call-1")).await;
    let second = create(&mut client, request("agent-b", "call-1")).await;
    client
        .decide(decide(&first.id, pb::Verdict::Approve, "42", "k1"))
        .await
        .unwrap();
    client
        .decide(decide(&second.id, pb::Verdict::Reject, "77", "k2"))
        .await
        .unwrap();
    client
        .consume(pb::ConsumeRequest {
            approval_id: first.id.clone(),
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            detail: "done".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    (first, second)
}

fn seqs(events: &[pb::AuditEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.event.as_ref().unwrap().seq)
        .collect()
}

#[tokio::test]
async fn the_history_is_filtered_and_paginated() {
    let server = TestServer::start().await;
    let (first, second) = history(&server).await;
    let mut admin = admin(&channel(&server).await, None);

    let everything = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert_eq!(seqs(&everything), [1, 2, 3, 4, 5]);
    assert_eq!(everything[0].prev_hash, "");
    for pair in everything.windows(2) {
        assert_eq!(
            pair[1].prev_hash, pair[0].hash,
            "each row chains to the one before"
        );
    }
    let paged = all_events(
        &mut admin,
        pb::ListEventsRequest {
            page_size: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(seqs(&paged), seqs(&everything));
    let newest_first = all_events(
        &mut admin,
        pb::ListEventsRequest {
            page_size: 2,
            newest_first: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(seqs(&newest_first), [5, 4, 3, 2, 1]);

    let of_first = all_events(
        &mut admin,
        pb::ListEventsRequest {
            approval_id: first.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        of_first.iter().map(event_kind).collect::<Vec<_>>(),
        [
            pb::EventKind::Requested,
            pb::EventKind::Resolved,
            pb::EventKind::Consumed
        ]
    );
    let by_agent = all_events(
        &mut admin,
        pb::ListEventsRequest {
            agent_id: "agent-b".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(by_agent
        .iter()
        .all(|e| e.event.as_ref().unwrap().approval.as_ref().unwrap().id == second.id));
    assert_eq!(by_agent.len(), 2);
    let by_decider = all_events(
        &mut admin,
        pb::ListEventsRequest {
            decider: "telegram:77".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(seqs(&by_decider), [4]);
    let by_kind = all_events(
        &mut admin,
        pb::ListEventsRequest {
            kinds: vec![
                pb::EventKind::Requested as i32,
                pb::EventKind::Consumed as i32,
            ],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(seqs(&by_kind), [1, 2, 5]);

    let millis = |event: &pb::AuditEvent| {
        let at = event.event.as_ref().unwrap().at.unwrap();
        at.seconds * 1000 + i64::from(at.nanos) / 1_000_000
    };
    let (since, until) = (&everything[2], &everything[4]);
    let window = all_events(
        &mut admin,
        pb::ListEventsRequest {
            since: since.event.as_ref().unwrap().at,
            until: until.event.as_ref().unwrap().at,
            ..Default::default()
        },
    )
    .await;
    let expected: Vec<pb::AuditEvent> = everything
        .iter()
        .filter(|e| millis(e) >= millis(since) && millis(e) < millis(until))
        .cloned()
        .collect();
    assert_eq!(seqs(&window), seqs(&expected));
    assert!(!seqs(&window).contains(&5), "until is exclusive");

    let bad_token = admin
        .list_events(pb::ListEventsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn editing_one_event_row_by_hand_makes_verify_audit_name_that_row() {
    // The true digest of the edited arguments, set in place of the requested one.
    let edited_digest = if countersign_testkit::postgres::enabled() {
        "regexp_replace(replace(body, 'rm -rf', 'ls -la'), '\"args_digest\":\"[0-9a-f]+\"',
             '\"args_digest\":\"6449a137daeef8933820008d4120aebef023f2b8eeed51581fa944e32fa00734\"')"
    } else {
        "json_set(replace(body, 'rm -rf', 'ls -la'), '$.args_digest',
             '6449a137daeef8933820008d4120aebef023f2b8eeed51581fa944e32fa00734')"
    };
    let edited_arguments_and_digest = format!(
        "UPDATE approvals SET body = {edited_digest}
          WHERE id = (SELECT approval_id FROM events WHERE seq = 1)"
    );
    let cases = [
        // The decider of the decision in row 3.
        (
            "UPDATE events SET body = replace(body, '\"user_id\":\"42\"', '\"user_id\":\"43\"') WHERE seq = 3",
            3,
            "edited",
        ),
        // The time of row 2.
        ("UPDATE events SET at_ms = at_ms + 1 WHERE seq = 2", 2, "edited"),
        // The arguments of the approval requested in row 1, which the hash covers through
        // their digest (the approval's row holds them; events do not repeat them).
        (
            "UPDATE approvals SET body = replace(body, 'rm -rf', 'ls -la')
              WHERE id = (SELECT approval_id FROM events WHERE seq = 1)",
            1,
            "args_digest",
        ),
        // The arguments and the digest of that approval, edited together (the digest is the
        // true one of the edited arguments).
        (
            edited_arguments_and_digest.as_str(),
            1,
            "differs from the one requested",
        ),
        // A column the history is filtered by.
        (
            "UPDATE events SET agent_id = 'someone-else' WHERE seq = 4",
            4,
            "edited",
        ),
        // A removed row: the next one no longer links.
        ("DELETE FROM events WHERE seq = 2", 3, "missing"),
    ];
    for (sql, row, problem) in cases {
        let server = TestServer::start().await;
        history(&server).await;
        let mut admin = admin(&channel(&server).await, None);
        let intact = verify(&mut admin).await;
        assert!(intact.intact, "{intact:?}");
        assert_eq!(
            (intact.events_checked, intact.first_seq, intact.last_seq),
            (5, 1, 5)
        );

        assert_eq!(tamper(&server, sql).await, 1, "{sql}");
        let report = verify(&mut admin).await;
        assert!(!report.intact, "{sql}");
        assert_eq!(report.broken_seq, row, "{sql}: {report:?}");
        assert!(report.problem.contains(problem), "{sql}: {report:?}");
    }
}

#[tokio::test]
async fn the_chain_continues_across_restarts_and_chains_rows_from_before_it_existed() {
    let mut server = TestServer::start().await;
    history(&server).await;
    // Rows as a database from before the hash chain holds them.
    tamper(
        &server,
        "UPDATE events SET hash = NULL, prev_hash = NULL WHERE seq > 2",
    )
    .await;
    server.stop().await;
    // The server refuses such a database until an operator chains the rows explicitly
    // (`countersign-server audit rechain`).
    let refused = countersign_server::serve(
        server.config().clone(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        std::future::pending(),
    )
    .await
    .expect_err("unchained rows refuse the start");
    assert!(refused.to_string().contains("audit rechain"), "{refused}");
    let rechained = countersign_server::integrity::rechain(&server.database_path())
        .await
        .unwrap();
    assert_eq!(rechained.rows_chained, 3);
    server.restart().await;
    let mut client = connect(&server).await;
    create(&mut client, request("agent-c", "call-1")).await;

    let mut admin = admin(&channel(&server).await, None);
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    assert_eq!((report.first_seq, report.last_seq), (1, 6));
    let everything = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert!(everything.iter().all(|e| e.hash.len() == 64));
}

/// `text` is the test's own constant, safe to quote.
async fn stored_mentions(server: &TestServer, text: &str) -> i64 {
    let events = count(
        server,
        &format!("SELECT COUNT(*) FROM events WHERE body LIKE '%{text}%'"),
    )
    .await;
    let approvals = count(
        server,
        &format!("SELECT COUNT(*) FROM approvals WHERE body LIKE '%{text}%'"),
    )
    .await;
    events + approvals
}

#[tokio::test]
async fn redaction_removes_argument_values_after_resolution_but_keeps_the_digest() {
    const SECRET: &str = "hunter2-database-password";
    for redact in [false, true] {
        let server = TestServer::start_with(|c| c.storage.redact_arguments = redact).await;
        let mut client = connect(&server).await;
        let mut req = request("agent-a", "call-1");
        req.arguments_json = format!(r#"{{"password":"{SECRET}"}}"#);
        let approval = create(&mut client, req).await;
        let digest = approval.args_digest.clone();

        // Pending: the approvers need to see the arguments.
        let pending = client
            .get_approval(pb::GetApprovalRequest {
                approval_id: approval.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(pending.arguments_json.contains(SECRET));

        let decided = client
            .decide(decide(&approval.id, pb::Verdict::Approve, "42", "k1"))
            .await
            .unwrap()
            .into_inner()
            .approval
            .unwrap();
        let stored = client
            .get_approval(pb::GetApprovalRequest {
                approval_id: approval.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stored.args_digest, digest);
        let mut admin = admin(&channel(&server).await, None);
        let events = all_events(&mut admin, pb::ListEventsRequest::default()).await;
        assert_eq!(events.len(), 2);
        if redact {
            assert_eq!(stored_mentions(&server, SECRET).await, 0);
            assert_eq!(decided.arguments_json, "");
            assert_eq!(stored.arguments_json, "");
            for event in &events {
                let approval = event.event.as_ref().unwrap().approval.as_ref().unwrap();
                assert_eq!(approval.arguments_json, "");
                assert_eq!(approval.args_digest, digest);
            }
        } else {
            // Once, in the approval's row: events do not repeat the arguments.
            assert_eq!(stored_mentions(&server, SECRET).await, 1);
            assert!(stored.arguments_json.contains(SECRET));
        }
        let report = verify(&mut admin).await;
        assert!(report.intact, "redact {redact}: {report:?}");
    }
}
