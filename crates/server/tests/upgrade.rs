//! A database written by the previous schema (tests/fixtures/store-schema-6.db, made by the
//! server at migration 0006 whose events store the whole approval; see the .sh beside it) is
//! upgraded at start: every approval, event and audit hash is intact, and new lean events
//! join the same chain.

use crate::common;

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
        // Pending in the fixture with the default hour to live: its deadline passed long ago,
        // so the start-up sweep expires it, the first event written in the new form.
        ("call-g", ("bash", Expired, r#"{"command":"make"}"#)),
    ])
}

#[tokio::test]
async fn a_database_of_the_previous_schema_is_upgraded_with_everything_intact() {
    if countersign_testkit::postgres::skip_unless_sqlite("upgrades a SQLite file of schema 6") {
        return;
    }
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

    // The fixture's events in the old form, and the start-up expiry in the new one, on one
    // intact hash chain.
    let before = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert_eq!(
        before
            .iter()
            .map(|e| e.event.as_ref().unwrap().seq)
            .collect::<Vec<_>>(),
        (1..=17).collect::<Vec<u64>>()
    );
    for event in &before {
        let approval = event.event.as_ref().unwrap().approval.as_ref().unwrap();
        assert!(!approval.arguments_json.is_empty(), "{event:?}");
    }
    let expiry = before[16].event.as_ref().unwrap();
    assert_eq!(kind(expiry), pb::EventKind::Expired);
    assert_eq!(expiry.approval.as_ref(), Some(&found["call-g"]));
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    assert_eq!(report.events_checked, 17);

    // New changes write lean events onto the same chain, and read back whole.
    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        kind(&next_event(&mut events, PATIENCE).await),
        pb::EventKind::SnapshotComplete
    );
    let fresh = create(&mut client, request("agent-new", "call-new")).await;
    client
        .decide(decide(
            &fresh.id,
            pb::Verdict::Approve,
            "42",
            "k-after-upgrade",
        ))
        .await
        .unwrap();
    let live = [
        next_event(&mut events, PATIENCE).await,
        next_event(&mut events, PATIENCE).await,
    ];
    let after = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    assert_eq!(after.len(), 19);
    for (watched, listed) in live.iter().zip(&after[17..]) {
        // The watch's items carry the log's history id; ListEvents leaves it empty.
        let watched = pb::ApprovalEvent {
            history_id: String::new(),
            ..watched.clone()
        };
        assert_eq!(Some(&watched), listed.event.as_ref());
    }
    let requested = after[17].event.as_ref().unwrap().approval.as_ref().unwrap();
    assert_eq!(requested, &fresh);
    let resolved = after[18].event.as_ref().unwrap().approval.as_ref().unwrap();
    assert_eq!(state(resolved), pb::ApprovalState::Approved);
    assert_eq!(resolved.arguments_json, fresh.arguments_json);
    assert_eq!(resolved.decisions.len(), 1);
    let report = verify(&mut admin).await;
    assert!(report.intact, "{report:?}");
    assert_eq!(report.events_checked, 19);
}
