//! Decision receipts through gRPC over a real socket (docs/security.md#decision-receipts): the
//! server signs each verdict with its Ed25519 key, returns the receipt with the approval
//! (GetApproval, WaitForDecision, the watch), serves its public keys, and a rotation keeps
//! the old receipts verifiable.

use std::time::Duration;

use crate::common::*;
use countersign_core::receipt::{verify_receipt, KeySet, ReceiptError};
use countersign_proto::v1 as pb;
use countersign_server::receipts::ReceiptKeys;
use countersign_testkit::server::TestServer;

const RULES: &str = r#"
[[rules]]
name = "reads-are-fine"
action = "allow"
[rules.match]
tool = "read_file"
"#;

async fn key_set(client: &mut Client) -> (KeySet, String) {
    let keys = client
        .get_signing_keys(pb::GetSigningKeysRequest {})
        .await
        .expect("signing keys")
        .into_inner();
    (
        KeySet::from_jwks(&keys.jwks_json).expect("a valid key set"),
        keys.fingerprint,
    )
}

async fn resolved_seq(server: &TestServer, approval_id: &str) -> i64 {
    let mut admin = admin(&channel(server).await, None);
    let events = admin
        .list_events(pb::ListEventsRequest {
            approval_id: approval_id.to_owned(),
            kinds: vec![pb::EventKind::Resolved as i32],
            ..Default::default()
        })
        .await
        .expect("list events")
        .into_inner()
        .events;
    let event = events
        .first()
        .and_then(|e| e.event.as_ref())
        .expect("a RESOLVED event");
    event.seq as i64
}

#[tokio::test]
async fn an_approval_carries_a_receipt_signed_over_its_decision() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-a", "call-1")).await;
    assert!(approval.receipt.is_empty(), "no receipt while pending");
    let mut events = watch(
        &mut client,
        pb::WatchApprovalsRequest {
            channel: "telegram".into(),
            ..Default::default()
        },
    )
    .await;
    client
        .decide(decide(&approval.id, pb::Verdict::Approve, "1001", "tap-1"))
        .await
        .expect("decide");
    let got = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let waited = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 1000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.receipt.is_empty());
    assert_eq!(waited.receipt, got.receipt, "one stored receipt");
    let resolved = loop {
        let event = next_event(&mut events, Duration::from_secs(10)).await;
        if kind(&event) == pb::EventKind::Resolved {
            break event;
        }
    };
    assert_eq!(resolved.approval.expect("approval").receipt, got.receipt);

    let (keys, fingerprint) = key_set(&mut client).await;
    assert_eq!(keys.fingerprint(), Some(fingerprint.as_str()));
    let claims = verify_receipt(&got.receipt, &keys).expect("the receipt verifies");
    assert_eq!(claims.approval_id, approval.id);
    assert_eq!(claims.tool, "bash");
    assert_eq!(claims.args_digest, approval.args_digest);
    assert_eq!(claims.verdict, "APPROVE");
    assert_eq!(claims.resolved_by, "DECISION");
    assert_eq!(claims.scope, "ONCE");
    assert_eq!(claims.deciders.len(), 1);
    assert_eq!(claims.deciders[0].channel, "telegram");
    assert_eq!(claims.deciders[0].user_id, "1001");
    assert_eq!(claims.seq, resolved_seq(&server, &approval.id).await);
    assert!(claims.exp > claims.iat);
    claims
        .allows(&approval.id, &approval.args_digest, claims.iat * 1000)
        .expect("it allows exactly this call");
    assert!(matches!(
        claims.allows(&approval.id, &"0".repeat(64), claims.iat * 1000),
        Err(ReceiptError::ArgsDigest { .. })
    ));
}

#[tokio::test]
async fn a_rejection_and_a_rule_are_signed_too() {
    let server = TestServer::start_with_toml(RULES).await;
    let mut client = connect(&server).await;
    let (keys, _) = key_set(&mut client).await;

    let rejected = create(&mut client, request("agent-a", "call-1")).await;
    client
        .decide(decide(&rejected.id, pb::Verdict::Reject, "1001", "tap-1"))
        .await
        .expect("decide");
    let rejected = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: rejected.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let claims = verify_receipt(&rejected.receipt, &keys).expect("verifies");
    assert_eq!(claims.verdict, "REJECT");
    assert!(matches!(
        claims.allows(&rejected.id, &rejected.args_digest, claims.iat * 1000),
        Err(ReceiptError::Verdict(_))
    ));

    let mut read = request("agent-a", "call-2");
    read.tool_name = "read_file".into();
    let allowed = create(&mut client, read).await;
    assert_eq!(state(&allowed), pb::ApprovalState::Approved);
    let claims = verify_receipt(&allowed.receipt, &keys).expect("verifies");
    assert_eq!(claims.resolved_by, "RULE");
    assert_eq!(claims.rule.as_deref(), Some("reads-are-fine"));
    assert!(claims.deciders.is_empty());
}

#[tokio::test]
async fn a_rotation_keeps_old_receipts_verifiable_and_the_fingerprint() {
    let mut server = TestServer::start().await;
    let mut client = connect(&server).await;
    let first = create(&mut client, request("agent-a", "call-1")).await;
    client
        .decide(decide(&first.id, pb::Verdict::Approve, "1001", "tap-1"))
        .await
        .expect("decide");
    let (before, fingerprint) = key_set(&mut client).await;

    server.stop().await;
    let dir = server
        .config()
        .receipts
        .keys_dir
        .clone()
        .expect("the test's keys dir");
    let (retired, current) = ReceiptKeys::rotate(&dir, 0).expect("rotate");
    assert_ne!(retired, current);
    server.restart().await;

    let mut client = connect(&server).await;
    let (after, fingerprint_after) = key_set(&mut client).await;
    assert_eq!(fingerprint_after, fingerprint, "the pin stays");
    assert_eq!(after.keys.len(), 2);
    let second = create(&mut client, request("agent-a", "call-2")).await;
    client
        .decide(decide(&second.id, pb::Verdict::Approve, "1001", "tap-2"))
        .await
        .expect("decide");
    let receipt = |id: String| {
        let mut client = client.clone();
        async move {
            client
                .get_approval(pb::GetApprovalRequest { approval_id: id })
                .await
                .unwrap()
                .into_inner()
                .receipt
        }
    };
    let old = receipt(first.id.clone()).await;
    let new = receipt(second.id.clone()).await;
    assert_eq!(verify_receipt(&old, &after).unwrap().approval_id, first.id);
    assert_eq!(verify_receipt(&new, &after).unwrap().approval_id, second.id);
    assert!(
        matches!(
            verify_receipt(&new, &before),
            Err(ReceiptError::UnknownKey(_))
        ),
        "the new key is not in the set read before the rotation"
    );
}

#[tokio::test]
async fn a_signed_checkpoint_verifies_a_backup_offline_and_names_a_changed_history() {
    let mut server = TestServer::start().await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-a", "call-1")).await;
    client
        .decide(decide(&approval.id, pb::Verdict::Approve, "1001", "tap-1"))
        .await
        .expect("decide");
    server.stop().await;
    let dir = server
        .config()
        .receipts
        .keys_dir
        .clone()
        .expect("the test's keys dir");
    let keys = ReceiptKeys::load_or_create(&dir, 3600).expect("the server's keys");
    let database = server.database_path();
    let checkpoint = countersign_server::integrity::checkpoint(&database, &keys, 0)
        .await
        .expect("checkpoint");
    let set = KeySet::from_jwks(&keys.jwks()).unwrap();
    let claims = countersign_core::receipt::verify_checkpoint(&checkpoint, &set).unwrap();
    assert_eq!(claims["head_seq"], resolved_seq_offline(&database).await);
    if countersign_testkit::postgres::skip_unless_sqlite(
        "the checkpoint is checked against a SQLite file (PostgreSQL is backed up with pg_dump)",
    ) {
        return;
    }
    let seq = countersign_server::store::backup::check_checkpoint(&database, &checkpoint, &set)
        .await
        .expect("the file passes through the checkpoint");
    assert_eq!(Some(seq), claims["head_seq"].as_i64());
    let other = ReceiptKeys::load_or_create(tempfile::tempdir().unwrap().path(), 3600).unwrap();
    let forged = countersign_server::integrity::checkpoint(&database, &other, 0)
        .await
        .unwrap();
    assert!(matches!(
        countersign_server::store::backup::check_checkpoint(&database, &forged, &set).await,
        Err(countersign_server::store::backup::VerifyError::Checkpoint(
            ReceiptError::UnknownKey(_)
        ))
    ));
    tamper(
        &server,
        &format!("UPDATE events SET hash = 'rewritten' WHERE seq = {seq}"),
    )
    .await;
    assert!(matches!(
        countersign_server::store::backup::check_checkpoint(&database, &checkpoint, &set).await,
        Err(countersign_server::store::backup::VerifyError::NotAtCheckpoint { .. })
    ));
}

/// The newest seq of the stopped server's log.
async fn resolved_seq_offline(database: &std::path::Path) -> serde_json::Value {
    countersign_server::integrity::head(database)
        .await
        .unwrap()
        .head_seq
        .into()
}

/// What the test's log subscriber wrote.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_server_logs_signed_checkpoints_of_the_chain_head() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let server = TestServer::start_with(|config| {
        config.receipts.checkpoint_interval_seconds = 1;
    })
    .await;
    let mut client = connect(&server).await;
    create(&mut client, request("agent-a", "call-1")).await;
    let (keys, _) = key_set(&mut client).await;
    // The first checkpoint may come before the request; a later one covers it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        let covering = text
            .lines()
            .filter(|line| line.contains("signed audit checkpoint"))
            .filter_map(|line| line.split("checkpoint=").nth(1))
            .filter_map(|token| token.split_whitespace().next())
            .map(|token| {
                countersign_core::receipt::verify_checkpoint(token, &keys).expect("signed")
            })
            .any(|claims| claims["head_seq"].as_i64() >= Some(1));
        if covering {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint covering the request:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
