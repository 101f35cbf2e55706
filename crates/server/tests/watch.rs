//! WatchApprovals: resume, restart, load, slow consumers, retention, heartbeats; and the
//! standard health and reflection services.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;
use rand::Rng;
use tonic::Code;

#[tokio::test]
async fn restart_keeps_pending_replays_missed_events_and_expires_overdue() {
    let mut server = TestServer::start().await;
    let mut client = connect(&server).await;
    let pending = create(&mut client, request("agent-1", "call-1")).await;
    let mut short = request("agent-1", "call-2");
    short.ttl_seconds = 1;
    let short = create(&mut client, short).await;
    let decided = create(&mut client, request("agent-1", "call-3")).await;

    // A watcher that has processed everything so far.
    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            after_seq: 1,
            ..Default::default()
        },
    )
    .await;
    let mut cursor = 1;
    for _ in 0..2 {
        cursor = next_event(&mut events, PATIENCE).await.seq;
    }
    assert_eq!(cursor, 3);

    server.stop().await;
    // The watch stream ends cleanly with the server.
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match events.message().await {
                Ok(Some(e)) if kind(&e) == pb::EventKind::Heartbeat => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    assert!(
        matches!(end, Ok(None) | Err(_)),
        "stream should end: {end:?}"
    );

    // Expire `short` while the server is down.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    server.restart().await;
    let mut client = connect(&server).await;

    let still = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: pending.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&still), pb::ApprovalState::Pending);
    let expired = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: short.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&expired), pb::ApprovalState::Expired);

    client
        .decide(decide(&decided.id, pb::Verdict::Approve, "u1", "k1"))
        .await
        .unwrap();

    // Resuming from the cursor yields exactly the events it missed: expiry at start, then the decision.
    let mut resumed = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            after_seq: cursor,
            ..Default::default()
        },
    )
    .await;
    let first = next_event(&mut resumed, PATIENCE).await;
    assert_eq!((first.seq, kind(&first)), (4, pb::EventKind::Expired));
    assert_eq!(first.approval.unwrap().id, short.id);
    let second = next_event(&mut resumed, PATIENCE).await;
    assert_eq!((second.seq, kind(&second)), (5, pb::EventKind::Resolved));
    assert_eq!(second.approval.unwrap().id, decided.id);
    let nothing_more = tokio::time::timeout(
        Duration::from_millis(700),
        next_event(&mut resumed, Duration::from_secs(2)),
    )
    .await;
    assert!(nothing_more.is_err(), "no further event expected");
}

#[tokio::test]
async fn watch_under_load_with_random_resumes_sees_every_seq_once_in_order() {
    let server = TestServer::start().await;
    let client = connect(&server).await;

    // Subscribed before any write: after_seq 0 means "from now", which is seq 1 onwards.
    let mut watcher = client.clone();
    let mut events = watch(&mut watcher, pb::WatchApprovalsRequest::default()).await;

    const WRITERS: usize = 8;
    const PER_WRITER: usize = 125;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = client.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..PER_WRITER {
                let approval = create(
                    &mut client,
                    request(&format!("agent-{w}"), &format!("call-{i}")),
                )
                .await;
                if i % 2 == 0 {
                    client
                        .decide(decide(
                            &approval.id,
                            pb::Verdict::Approve,
                            "u",
                            &format!("k-{w}-{i}"),
                        ))
                        .await
                        .unwrap();
                }
            }
        }));
    }
    let total_events = (WRITERS * PER_WRITER + WRITERS * PER_WRITER / 2) as u64;

    let mut received: Vec<u64> = Vec::new();
    let mut cursor = 0u64;
    let mut rng = rand::thread_rng();
    while cursor < total_events {
        let budget = rng.gen_range(1..200);
        for _ in 0..budget {
            if cursor >= total_events {
                break;
            }
            let event = next_event(&mut events, PATIENCE).await;
            received.push(event.seq);
            cursor = event.seq;
        }
        // Disconnect and resume from the cursor.
        drop(events);
        events = watch(
            &mut watcher,
            pb::WatchApprovalsRequest {
                after_seq: cursor,
                ..Default::default()
            },
        )
        .await;
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let expected: Vec<u64> = (1..=total_events).collect();
    assert_eq!(received, expected);
}

#[tokio::test]
async fn a_watcher_that_never_reads_does_not_slow_another_and_ends_exhausted() {
    let server = TestServer::start_with(|c| c.watch.buffer_events = 16).await;
    let mut client = connect(&server).await;
    // The stalled watcher gets its own connection, so only its stream stops reading.
    let mut stalled_client = connect(&server).await;
    let mut stalled = watch(&mut stalled_client, pb::WatchApprovalsRequest::default()).await;
    let mut reader = watch(&mut client, pb::WatchApprovalsRequest::default()).await;

    // 300 events of ~16 KB: more than HTTP/2 flow control windows absorb (2 MB per stream).
    const N: usize = 300;
    let mut big = request("agent-1", "x");
    big.arguments_json = format!(r#"{{"payload": "{}"}}"#, "y".repeat(16 * 1024));
    for i in 0..N {
        let mut req = big.clone();
        req.idempotency_key = format!("call-{i}");
        create(&mut client, req).await;
        let event = next_event(&mut reader, PATIENCE).await;
        assert_eq!(event.seq, i as u64 + 1, "the reading watcher keeps up");
    }

    // Now read the stalled stream: some events, then RESOURCE_EXHAUSTED with a resume hint.
    let mut last = 0;
    let mut heartbeats = 0;
    let status = loop {
        match tokio::time::timeout(PATIENCE, stalled.message())
            .await
            .unwrap()
        {
            Ok(Some(event)) => {
                if kind(&event) == pb::EventKind::Heartbeat {
                    heartbeats += 1;
                    assert!(
                        heartbeats < 10,
                        "caught up after seq {last} without being cut off"
                    );
                } else {
                    assert_eq!(event.seq, last + 1, "no gap before the end");
                    last = event.seq;
                }
            }
            Ok(None) => panic!("stream ended without RESOURCE_EXHAUSTED after seq {last}"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(last < N as u64, "the stalled stream was cut short");
    assert!(
        status.message().contains(&format!("after_seq = {last}")),
        "{}",
        status.message()
    );

    // Resuming from the hint delivers the rest.
    let mut resumed = watch(
        &mut stalled_client,
        pb::WatchApprovalsRequest {
            after_seq: last,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(next_event(&mut resumed, PATIENCE).await.seq, last + 1);
}

#[tokio::test]
async fn snapshot_filters_by_channel_and_hands_over_without_gap() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let mut to_github = request("agent-1", "call-1");
    to_github.routes = vec![pb::Route {
        channel: "github".into(),
        target: "o/r#1".into(),
    }];
    create(&mut client, to_github).await;
    let everywhere = create(&mut client, request("agent-1", "call-2")).await;
    let mut to_telegram = request("agent-1", "call-3");
    to_telegram.routes = vec![pb::Route {
        channel: "telegram".into(),
        target: "1".into(),
    }];
    let telegram_one = create(&mut client, to_telegram.clone()).await;
    let decided = create(&mut client, {
        let mut r = to_telegram.clone();
        r.idempotency_key = "call-4".into();
        r
    })
    .await;
    client
        .decide(decide(&decided.id, pb::Verdict::Reject, "u", "k"))
        .await
        .unwrap();

    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            channel: "telegram".into(),
            include_snapshot: true,
            after_seq: 0,
            history_id: String::new(),
        },
    )
    .await;
    let mut snapshot = BTreeSet::new();
    let marker = loop {
        let event = next_event(&mut events, PATIENCE).await;
        match kind(&event) {
            pb::EventKind::Snapshot => {
                assert_eq!(event.seq, 0);
                snapshot.insert(event.approval.unwrap().id);
            }
            pb::EventKind::SnapshotComplete => break event,
            other => panic!("unexpected {other:?} in snapshot"),
        }
    };
    assert_eq!(
        snapshot,
        BTreeSet::from([everywhere.id.clone(), telegram_one.id.clone()])
    );
    assert_eq!(marker.seq, 5);

    let mut later = to_telegram.clone();
    later.idempotency_key = "call-5".into();
    let later = create(&mut client, later).await;
    let next = next_event(&mut events, PATIENCE).await;
    assert_eq!((next.seq, next.approval.unwrap().id), (6, later.id));
}

#[tokio::test]
async fn a_cursor_older_than_retention_is_out_of_range() {
    let server = TestServer::start_with(|c| c.watch.retention_seconds = 1).await;
    let mut client = connect(&server).await;
    for i in 0..3 {
        create(&mut client, request("agent-1", &format!("call-{i}"))).await;
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    create(&mut client, request("agent-1", "call-late")).await;
    // Wait for the sweeper to prune seqs 1-3 (it keeps the newest).
    let mut status = None;
    for _ in 0..40 {
        match client
            .watch_approvals(pb::WatchApprovalsRequest {
                after_seq: 1,
                ..Default::default()
            })
            .await
        {
            Err(s) if s.message().contains("(seq 4)") => {
                status = Some(s);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let status = status.expect("OUT_OF_RANGE naming seq 4 once seqs 1-3 are pruned");
    assert_eq!(status.code(), Code::OutOfRange);
    assert!(
        status
            .message()
            .contains("older than the oldest retained event"),
        "{}",
        status.message()
    );

    let ahead = client
        .watch_approvals(pb::WatchApprovalsRequest {
            after_seq: 99,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(ahead.code(), Code::OutOfRange);
    // A cursor at the retained edge is fine.
    let mut ok = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            after_seq: 3,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(next_event(&mut ok, PATIENCE).await.seq, 4);
}

/// The history id of the log a watch reads, from its snapshot (issue 44): every item carries
/// it.
async fn history_of(client: &mut Client) -> String {
    let mut items = watch(
        client,
        pb::WatchApprovalsRequest {
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    let mut histories = BTreeSet::new();
    loop {
        let item = tokio::time::timeout(PATIENCE, items.message())
            .await
            .expect("a snapshot item in time")
            .expect("stream ok")
            .expect("stream open");
        histories.insert(item.history_id.clone());
        if kind(&item) == pb::EventKind::SnapshotComplete {
            break;
        }
    }
    assert_eq!(histories.len(), 1, "one history per stream: {histories:?}");
    let history = histories.pop_first().unwrap();
    assert!(!history.is_empty(), "the snapshot names its log's history");
    history
}

/// A cursor is (history id, seq). A rechain, or `audit new-history` after a restore by other
/// means than a backup file, gives the log a new history id; a cursor of the old one is then
/// answered like a cursor ahead of the log, whatever its seq, so its reader re-lists. A cursor
/// without a history id (a client from before them) is served as before.
#[tokio::test]
async fn a_cursor_of_another_history_is_answered_like_one_ahead_of_the_log() {
    let mut server = TestServer::start().await;
    let mut client = connect(&server).await;
    for i in 0..3 {
        create(&mut client, request("agent-1", &format!("call-{i}"))).await;
    }
    let first = history_of(&mut client).await;
    let mut resumed = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            after_seq: 1,
            history_id: first.clone(),
            ..Default::default()
        },
    )
    .await;
    let event = next_event(&mut resumed, PATIENCE).await;
    assert_eq!((event.seq, event.history_id.as_str()), (2, first.as_str()));
    drop(resumed);

    server.restart().await;
    let mut client = connect(&server).await;
    assert_eq!(history_of(&mut client).await, first, "a restart keeps it");

    server.stop().await;
    let rechained = countersign_server::integrity::rechain(&server.database_path())
        .await
        .unwrap();
    server.restart().await;
    let mut client = connect(&server).await;
    let second = history_of(&mut client).await;
    assert_eq!(second, rechained.history_id);
    assert_ne!(second, first, "a rechain begins a new history");
    answered_like_ahead(&mut client, &first, &second).await;

    server.stop().await;
    let third = countersign_server::integrity::new_history(&server.database_path())
        .await
        .unwrap();
    server.restart().await;
    let mut client = connect(&server).await;
    assert_eq!(history_of(&mut client).await, third);
    assert_ne!(third, second, "audit new-history begins a new history");
    answered_like_ahead(&mut client, &second, &third).await;
}

/// A resume after seq 1 of the `old` history is refused like a cursor ahead of the log; of the
/// `current` one, or without a history id, it is served.
async fn answered_like_ahead(client: &mut Client, old: &str, current: &str) {
    let refused = client
        .watch_approvals(pb::WatchApprovalsRequest {
            after_seq: 1,
            history_id: old.into(),
            ..Default::default()
        })
        .await
        .expect_err("a cursor of the old history is refused");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(
        refused.message().contains("ahead of the event log")
            && refused.message().contains("include_snapshot"),
        "{refused:?}"
    );
    for history_id in [current, ""] {
        let mut served = watch(
            client,
            pb::WatchApprovalsRequest {
                after_seq: 1,
                history_id: history_id.into(),
                ..Default::default()
            },
        )
        .await;
        let event = next_event(&mut served, PATIENCE).await;
        assert_eq!((event.seq, event.history_id.as_str()), (2, current));
    }
}

#[tokio::test]
async fn idle_streams_get_heartbeats_carrying_a_safe_cursor() {
    let server = TestServer::start_with(|c| c.watch.heartbeat_interval_ms = 100).await;
    let mut client = connect(&server).await;
    let mut to_github = request("agent-1", "call-1");
    to_github.routes = vec![pb::Route {
        channel: "github".into(),
        target: String::new(),
    }];
    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            channel: "telegram".into(),
            ..Default::default()
        },
    )
    .await;
    create(&mut client, to_github).await;
    // The telegram stream sees no event, but its heartbeat cursor moves past seq 1.
    let beat = loop {
        let item = tokio::time::timeout(PATIENCE, events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(kind(&item), pb::EventKind::Heartbeat);
        if item.seq == 1 {
            break item;
        }
    };
    assert!(beat.approval.is_none());
}

/// The names of the services the server at `$url` lists through reflection protocol
/// `$version` (`v1` or `v1alpha`: the two are the same messages in different packages).
macro_rules! list_services {
    ($version:ident, $url:expr) => {{
        use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$version::{
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
            ServerReflectionRequest,
        };
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let channel = tonic::transport::Channel::from_shared($url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut answers = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter(vec![request]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("unexpected reflection answer");
        };
        list.service
            .into_iter()
            .map(|service| service.name)
            .collect::<Vec<String>>()
    }};
}

#[tokio::test]
async fn health_and_reflection_services_answer() {
    use tonic_health::pb::health_client::HealthClient;
    let server = TestServer::start().await;
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "countersign.v1.ApprovalService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let names = list_services!(v1, server.url());
    assert!(
        names.contains(&"countersign.v1.ApprovalService".to_string()),
        "{names:?}"
    );
}

/// Older tools (grpcio's reflection client, some grpcurl builds) speak only v1alpha.
#[tokio::test]
async fn reflection_v1alpha_lists_the_services() {
    let server = TestServer::start().await;
    let names = list_services!(v1alpha, server.url());
    for service in [
        "countersign.v1.ApprovalService",
        "countersign.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&service.to_string()), "{names:?}");
    }
}
