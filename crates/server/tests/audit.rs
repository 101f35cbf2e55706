//! The audit trail through gRPC over a real socket: the event history with its filters and
//! pages, the hash chain that VerifyAudit checks (also against hand edits of the SQLite file),
//! and redaction of argument values.

use crate::common;

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

/// The events docs/security.md says `situation` writes: the backticked kinds of the row whose
/// first cell is `situation` in the table of its "Audit trail" section.
fn documented(situation: &str) -> Vec<pb::EventKind> {
    let row = documented_rows()
        .into_iter()
        .find(|(first, _)| first == situation)
        .unwrap_or_else(|| panic!("docs/security.md has no audit row {situation:?}"));
    row.1
}

/// The table of what is written when, in docs/security.md: each row's situation and events.
fn documented_rows() -> Vec<(String, Vec<pb::EventKind>)> {
    let doc = include_str!("../../../docs/security.md");
    let section = doc
        .split("## Audit trail")
        .nth(1)
        .expect("docs/security.md has an \"Audit trail\" section");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| what happens |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let kinds = cells[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|name| {
                    pb::EventKind::from_str_name(&format!("EVENT_KIND_{name}"))
                        .unwrap_or_else(|| panic!("{name:?} is not an event kind: {line}"))
                })
                .collect();
            (cells[1].to_string(), kinds)
        })
        .collect()
}

/// The kinds of the events written for `approval_id` after the first `seen` of them.
async fn new_events(
    admin: &mut AdminClient,
    approval_id: &str,
    seen: &mut usize,
) -> Vec<pb::AuditEvent> {
    let events = all_events(
        admin,
        pb::ListEventsRequest {
            approval_id: approval_id.into(),
            ..Default::default()
        },
    )
    .await;
    let new = events[*seen..].to_vec();
    *seen = events.len();
    new
}

fn kinds_of(events: &[pb::AuditEvent]) -> Vec<pb::EventKind> {
    events.iter().map(event_kind).collect()
}

/// An approval's life step by step (request, a delivery, a refused decision, a decision of a
/// quorum of two, the same decision again, the decision that resolves it, a late one,
/// consumption; a rule's decision; a cancellation; an expiry) writes exactly the events the
/// table in docs/security.md lists, and that table names every kind of event there is.
#[tokio::test]
async fn every_step_writes_the_events_the_security_guide_lists() {
    let server = TestServer::start_with_toml(
        r#"
[[approvers]]
id = "alice"
max_risk = "critical"
identities = { telegram = ["42"] }

[[approvers]]
id = "bob"
max_risk = "critical"
identities = { telegram = ["77"] }

[[rules]]
name = "read-only"
action = "allow"
[rules.match]
tool = "read_file"
"#,
    )
    .await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);

    let mut documented_kinds: Vec<&str> = documented_rows()
        .iter()
        .flat_map(|(_, kinds)| kinds.iter().map(|k| k.as_str_name()))
        .collect();
    documented_kinds.sort_unstable();
    documented_kinds.dedup();
    let mut written_kinds: Vec<String> = countersign_core::EventKind::ALL
        .iter()
        .map(|k| format!("EVENT_KIND_{}", k.as_str()))
        .collect();
    written_kinds.sort_unstable();
    assert_eq!(documented_kinds, written_kinds, "every kind is documented");

    // One life: requested by carol (not an approver), approved by two, consumed.
    let approval = create(
        &mut client,
        pb::RequestApprovalRequest {
            requester: "carol".into(),
            required_approvals: 2,
            ..request("agent-a", "life")
        },
    )
    .await;
    let id = approval.id.clone();
    let mut seen = 0;
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("a request that waits for people")
    );

    client
        .record_delivery(pb::RecordDeliveryRequest {
            approval_id: id.clone(),
            channel: "telegram".into(),
            target: "-100".into(),
            message_ref: "7".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("a worker records the message it posted")
    );

    let stranger = client
        .decide(decide(&id, pb::Verdict::Approve, "13", "stranger"))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), tonic::Code::PermissionDenied);
    let refused = new_events(&mut admin, &id, &mut seen).await;
    assert_eq!(
        kinds_of(&refused),
        documented("a decision the server refuses")
    );
    assert!(
        refused[0].detail.contains("not a registered approver"),
        "{refused:?}"
    );

    client
        .decide(decide(&id, pb::Verdict::Approve, "42", "alice-1"))
        .await
        .unwrap();
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("a decision that leaves the approval pending")
    );

    let again = client
        .decide(decide(&id, pb::Verdict::Approve, "42", "alice-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), pb::DecideOutcome::Duplicate);
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("a decision that changes nothing")
    );

    let resolving = client
        .decide(decide(&id, pb::Verdict::Approve, "77", "bob-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolving.outcome(), pb::DecideOutcome::Resolved);
    let resolved = new_events(&mut admin, &id, &mut seen).await;
    assert_eq!(
        kinds_of(&resolved),
        documented("the decision that resolves the approval")
    );
    let carried = resolved[0].event.as_ref().unwrap().decision.as_ref();
    assert_eq!(
        carried.map(|d| d.approver.as_str()),
        Some("bob"),
        "the RESOLVED event carries the resolving decision"
    );

    let late = client
        .decide(decide(&id, pb::Verdict::Reject, "42", "alice-late"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(late.outcome(), pb::DecideOutcome::AlreadyResolved);
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("a decision that changes nothing")
    );

    client
        .consume(pb::ConsumeRequest {
            approval_id: id.clone(),
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            detail: "done".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        kinds_of(&new_events(&mut admin, &id, &mut seen).await),
        documented("the runtime reports the call ran")
    );

    // Decided by a rule at once.
    let read = create(
        &mut client,
        pb::RequestApprovalRequest {
            tool_name: "read_file".into(),
            risk: pb::Risk::Low as i32,
            ..request("agent-a", "read")
        },
    )
    .await;
    assert_eq!(
        kinds_of(&new_events(&mut admin, &read.id, &mut 0).await),
        documented("a request a rule or a session grant decides at once")
    );

    // Cancelled by the runtime.
    let cancelled = create(&mut client, request("agent-a", "cancel")).await;
    client
        .cancel_approval(pb::CancelApprovalRequest {
            approval_id: cancelled.id.clone(),
            reason: "not needed".into(),
        })
        .await
        .unwrap();
    let mut cancelled_seen = 1;
    assert_eq!(
        kinds_of(&new_events(&mut admin, &cancelled.id, &mut cancelled_seen).await),
        documented("the runtime cancels the approval")
    );

    // Nobody decides before the deadline.
    let expiring = create(
        &mut client,
        pb::RequestApprovalRequest {
            ttl_seconds: 1,
            ..request("agent-a", "expire")
        },
    )
    .await;
    let done = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: expiring.id.clone(),
            timeout_ms: 5000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&done), pb::ApprovalState::Expired);
    let mut expiring_seen = 1;
    assert_eq!(
        kinds_of(&new_events(&mut admin, &expiring.id, &mut expiring_seen).await),
        documented("the deadline passes without a resolution")
    );
    assert!(verify(&mut admin).await.intact);
}
