//! A database written by the previous schema (tests/fixtures/store-schema-6.db, made by the
//! server at migration 0006 whose events store the whole approval; see the .sh beside it) is
//! upgraded at start: every approval, event and audit hash is intact, and new lean events
//! join the same chain.

mod common;

use std::collections::BTreeMap;

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/store-schema-6.db"
);

/// (tool, state, arguments) of each approval in the fixture, by idempotency key.
fn expected() -> BTreeMap<&'static str, (&'static str, pb::ApprovalState, &'static str)> {
    use pb::ApprovalState::*;
    BTreeMap::from([
        (
            "call-a",
            (
                "bash",
                Consumed,
                r#"{"command":"rm -rf build","cwd":"/srv"}"#,
            ),
        ),
        ("call-b", ("bash", Approved, r#"{"command":"rm -rf dist"}"#)),
        (
            "call-c",
            (
                "deploy",
                Rejected,
                r#"{"env":"prod","unicode":"héllo ✓","n":12345678901234}"#,
            ),
        ),
        ("call-d", ("email", Cancelled, r#"{"to":"x@example.com"}"#)),
        (
            "call-e",
            ("web_fetch", Expired, r#"{"url":"https://example.com"}"#),
        ),
        ("call-f", ("ls", Consumed, r#"{"path":"/"}"#)),
        ("call-g", ("bash", Pending, r#"{"command":"make"}"#)),
    ])
}

#[tokio::test]
async fn a_database_of_the_previous_schema_is_upgraded_with_everything_intact() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("countersign.db");
    std::fs::copy(FIXTURE, &database).expect("copy the fixture");
    let server = TestServer::start_with(|config| config.database = database.clone()).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);

    // Every approval, as it was.
    let listed = client
        .list_approvals(pb::ListApprovalsRequest {
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    let found: BTreeMap<String, pb::Approval> = listed
        .into_iter()
        .map(|a| (a.idempotency_key.clone(), a))
        .collect();
    assert_eq!(found.len(), expected().len());
    for (key, (tool, wanted_state, arguments)) in expected() {
        let approval = &found[key];
        assert_eq!(approval.tool_name, tool, "{key}");
        assert_eq!(state(approval), wanted_state, "{key}");
        let stored: serde_json::Value = serde_json::from_str(&approval.arguments_json).unwrap();
        let wanted: serde_json::Value = serde_json::from_str(arguments).unwrap();
        assert_eq!(stored, wanted, "{key}");
    }

    // Every event, in the old form, with its hash chain intact.
    let before = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert_eq!(before.len(), 16);
    assert_eq!(
        before
            .iter()
            .map(|e| e.event.as_ref().unwrap().seq)
            .collect::<Vec<_>>(),
        (1..=16).collect::<Vec<u64>>()
    );
    for event in &before {
        let approval = event.event.as_ref().unwrap().approval.as_ref().unwrap();
        assert!(!approval.arguments_json.is_empty(), "{event:?}");
    }
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    assert_eq!(report.events_checked, 16);

    // New changes write lean events onto the same chain, and read back whole.
    let pending = &found["call-g"];
    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    let snapshot = next_event(&mut events, PATIENCE).await;
    assert_eq!(snapshot.approval.as_ref().unwrap().id, pending.id);
    client
        .decide(decide(
            &pending.id,
            pb::Verdict::Approve,
            "42",
            "k-after-upgrade",
        ))
        .await
        .unwrap();
    let fresh = create(&mut client, request("agent-new", "call-new")).await;
    let mut live = Vec::new();
    while live.len() < 2 {
        let event = next_event(&mut events, PATIENCE).await;
        if kind(&event) != pb::EventKind::SnapshotComplete {
            live.push(event);
        }
    }
    let after = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert_eq!(after.len(), 18);
    for (watched, listed) in live.iter().zip(&after[16..]) {
        assert_eq!(Some(watched), listed.event.as_ref());
    }
    let resolved = after[16].event.as_ref().unwrap().approval.as_ref().unwrap();
    assert_eq!(state(resolved), pb::ApprovalState::Approved);
    assert_eq!(resolved.arguments_json, pending.arguments_json);
    assert_eq!(resolved.decisions.len(), 1);
    let requested = after[17].event.as_ref().unwrap().approval.as_ref().unwrap();
    assert_eq!(requested, &fresh);
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    assert_eq!(report.events_checked, 18);
}
