//! `request_and_wait` and the typed errors, against a real server.

use std::time::Duration;

use countersign_client::{pb, ClientError, WatchItem};
use countersign_testkit::server::TestServer;

use crate::support::{
    client, decide, logged_events, next_event, next_snapshot, request, unused_addr, watch_options,
    STEP,
};

/// Starts `request_and_wait` in the background, lets a human decide once the approval exists,
/// and returns what the wait returned, with the approval's id.
async fn wait_with_decision(verdict: pb::Verdict) -> (pb::Approval, String) {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let mut watch = client.watch(watch_options(""));
    assert!(next_snapshot(&mut watch).await.is_empty());

    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.request_and_wait(request("call-1"), STEP).await })
    };
    let requested = next_event(&mut watch).await;
    assert_eq!(requested.kind(), pb::EventKind::Requested);
    let id = requested.approval.unwrap().id;
    let response = decide(&client, &id, verdict).await;
    assert_eq!(response.outcome(), pb::DecideOutcome::Resolved);

    let approval = tokio::time::timeout(STEP, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    (approval, id)
}

#[tokio::test]
async fn the_wait_returns_the_approval_once_a_human_approves() {
    let (approval, id) = wait_with_decision(pb::Verdict::Approve).await;
    assert_eq!(approval.id, id);
    assert_eq!(approval.state(), pb::ApprovalState::Approved);
    let resolution = approval.resolution.unwrap();
    assert_eq!(resolution.deciders[0].user_id, "alice");
}

#[tokio::test]
async fn the_wait_returns_the_rejection() {
    let (approval, id) = wait_with_decision(pb::Verdict::Reject).await;
    assert_eq!(approval.id, id);
    assert_eq!(approval.state(), pb::ApprovalState::Rejected);
}

#[tokio::test]
async fn the_wait_returns_the_expiry_when_nobody_decides() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let mut short_lived = request("call-expiring");
    short_lived.ttl_seconds = 1;
    let approval = client.request_and_wait(short_lived, STEP).await.unwrap();
    assert_eq!(approval.state(), pb::ApprovalState::Expired);
    assert!(approval.decisions.is_empty());
}

#[tokio::test]
async fn a_wait_that_outlives_its_deadline_returns_the_still_pending_approval() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_and_wait(request("call-slow"), Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(approval.state(), pb::ApprovalState::Pending);
}

#[tokio::test]
async fn a_repeated_request_re_attaches_to_the_same_approval() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let first = client.request_approval(request("call-same")).await.unwrap();
    assert!(first.created);
    let id = first.approval.unwrap().id;
    decide(&client, &id, pb::Verdict::Approve).await;
    let again = client
        .request_and_wait(request("call-same"), STEP)
        .await
        .unwrap();
    assert_eq!(again.id, id);
    assert_eq!(again.state(), pb::ApprovalState::Approved);
}

/// The server restarts while a `request_and_wait` and a watch are open: the wait still returns
/// the decision on the same approval (no second one is created) and the watch delivers every
/// event once, in order.
#[tokio::test]
async fn a_server_restart_interrupts_neither_the_wait_nor_the_watch() {
    let mut server = TestServer::start().await;
    let client = client(&server.url());
    // Something in the log first: a watch can only resume after a cursor above 0.
    let earlier = client
        .request_approval(request("call-earlier"))
        .await
        .unwrap();
    let mut watch = client.watch(watch_options(""));
    assert_eq!(next_snapshot(&mut watch).await.len(), 1);
    let head = watch.cursor().unwrap().seq;
    assert!(head > 0);

    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.request_and_wait(request("call-restart"), STEP).await })
    };
    let requested = next_event(&mut watch).await;
    let id = requested.approval.as_ref().unwrap().id.clone();

    server.restart().await;
    // A new connection: the shared one may still be the broken one.
    let approver = crate::support::client(&server.url());
    assert_eq!(
        decide(&approver, &id, pb::Verdict::Approve).await.outcome(),
        pb::DecideOutcome::Resolved
    );

    let approval = tokio::time::timeout(STEP, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(approval.id, id);
    assert_eq!(approval.state(), pb::ApprovalState::Approved);
    let all = approver
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .unwrap();
    let ids: Vec<&str> = all.approvals.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(
        ids,
        [id.as_str(), earlier.approval.unwrap().id.as_str()],
        "no second approval"
    );

    let mut delivered = vec![requested];
    while delivered.last().unwrap().kind() != pb::EventKind::Resolved {
        match crate::support::next_item(&mut watch).await {
            WatchItem::Event(event) => delivered.push(event),
            WatchItem::Snapshot(pending) => {
                panic!("the watch re-snapshotted instead of resuming: {pending:?}")
            }
        }
    }
    let logged = logged_events(&server.url(), head).await;
    let seqs = |events: &[pb::ApprovalEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(&delivered),
        seqs(&logged),
        "every logged event once, in order"
    );
    let kinds: Vec<_> = delivered.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, [pb::EventKind::Requested, pb::EventKind::Resolved]);
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_never_an_approval() {
    let client = client(&format!("http://{}", unused_addr().await));
    let error = client
        .request_approval(request("call-down"))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Unavailable(_)), "{error:?}");
    let error = client
        .get_approval("0190a1b2-0000-7000-8000-000000000001")
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Unavailable(_)), "{error:?}");
    let error = client
        .request_and_wait(request("call-down"), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Unavailable(_)), "{error:?}");
}

#[tokio::test]
async fn a_server_that_goes_away_mid_wait_is_an_error_never_an_approval() {
    let mut server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("call-gone"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let waiter = {
        let client = client.clone();
        let id = approval.id.clone();
        tokio::spawn(async move {
            client
                .wait_until_resolved(&id, Duration::from_secs(2))
                .await
        })
    };
    server.stop().await;
    let error = tokio::time::timeout(STEP, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, ClientError::Unavailable(_)), "{error:?}");
}

#[tokio::test]
async fn refusals_are_typed() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let error = client
        .get_approval("0190a1b2-0000-7000-8000-000000000001")
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::NotFound(_)), "{error:?}");

    let mut bad = request("call-bad");
    bad.arguments_json = "[1, 2]".into();
    let error = client.request_approval(bad).await.unwrap_err();
    assert!(
        matches!(error, ClientError::InvalidArgument(_)),
        "{error:?}"
    );

    let approval = client
        .request_approval(request("call-twice"))
        .await
        .unwrap()
        .approval
        .unwrap();
    decide(&client, &approval.id, pb::Verdict::Approve).await;
    let consumed = client
        .consume(&approval.id, pb::ConsumeOutcome::Succeeded, "done")
        .await
        .unwrap();
    assert_eq!(consumed.state(), pb::ApprovalState::Consumed);
    let error = client
        .consume(&approval.id, pb::ConsumeOutcome::Succeeded, "again")
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClientError::FailedPrecondition(_)),
        "{error:?}"
    );
}
