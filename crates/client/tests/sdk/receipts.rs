//! The SDK returns an approval to act on only with a decision receipt that verifies for the
//! call it asked about (docs/security.md#decision-receipts).

use countersign_client::{pb, ClientError, ReceiptError};
use countersign_testkit::mitm::{RewritingProxy, STATE_APPROVED, STATE_REJECTED};
use countersign_testkit::server::TestServer;

use crate::support::{client, decide, next_event, next_snapshot, request, watch_options, STEP};

/// `request_and_wait` through `url` while a human decides `verdict` on the server itself.
async fn wait_through(
    server: &TestServer,
    url: &str,
    key: &str,
    verdict: pb::Verdict,
    pin: Option<String>,
) -> Result<pb::Approval, ClientError> {
    let direct = client(&server.url());
    let mut watch = direct.watch(watch_options(""));
    assert!(next_snapshot(&mut watch).await.is_empty());
    let through = client(url).with_receipt_pin(pin);
    let key = key.to_owned();
    let waiter = tokio::spawn(async move { through.request_and_wait(request(&key), STEP).await });
    let id = next_event(&mut watch).await.approval.unwrap().id;
    decide(&direct, &id, verdict).await;
    tokio::time::timeout(STEP, waiter).await.unwrap().unwrap()
}

#[tokio::test]
async fn an_approval_comes_back_with_a_receipt_that_verifies_under_the_pin() {
    let server = TestServer::start().await;
    let pin = client(&server.url())
        .signing_keys()
        .await
        .unwrap()
        .fingerprint;
    let approval = wait_through(
        &server,
        &server.url(),
        "call-1",
        pb::Verdict::Approve,
        Some(pin),
    )
    .await
    .expect("approved, with a receipt that verifies");
    assert_eq!(approval.state(), pb::ApprovalState::Approved);
    assert!(!approval.receipt.is_empty());
}

#[tokio::test]
async fn a_rejection_rewritten_into_an_approval_on_the_way_is_refused() {
    let server = TestServer::start().await;
    let proxy = RewritingProxy::start(server.addr(), STATE_REJECTED, STATE_APPROVED).await;
    let waited = wait_through(&server, &proxy.url(), "call-1", pb::Verdict::Reject, None).await;
    assert!(proxy.rewrites() > 0);
    match waited {
        Err(ClientError::Receipt(ReceiptError::Verdict(verdict))) => assert_eq!(verdict, "REJECT"),
        other => panic!("expected a refused receipt, got {other:?}"),
    }
}

#[tokio::test]
async fn another_approvals_receipt_does_not_approve_this_one() {
    let server = TestServer::start().await;
    let sdk = client(&server.url());
    let first = wait_through(&server, &server.url(), "call-1", pb::Verdict::Approve, None)
        .await
        .unwrap();
    let mut second = wait_through(&server, &server.url(), "call-2", pb::Verdict::Approve, None)
        .await
        .unwrap();
    second.receipt = first.receipt.clone();
    match sdk.verify_receipt(&second, &second.args_digest).await {
        Err(ClientError::Receipt(ReceiptError::ApprovalId { expected, found })) => {
            assert_eq!((expected, found), (second.id.clone(), first.id.clone()));
        }
        other => panic!("expected the approval id to differ, got {other:?}"),
    }
    sdk.verify_receipt(&first, &first.args_digest)
        .await
        .unwrap();
    second.receipt.clear();
    assert!(matches!(
        sdk.verify_receipt(&second, &second.args_digest).await,
        Err(ClientError::Receipt(ReceiptError::Missing))
    ));
}
