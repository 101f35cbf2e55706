//! One typed method per RPC, against a real server.

use std::time::Duration;

use countersign_client::pb;
use countersign_testkit::server::TestServer;

use crate::support::{client, decide, request};

#[tokio::test]
async fn cancel_resolves_a_pending_approval_as_cancelled() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("c1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let cancelled = client
        .cancel_approval(&approval.id, "not needed")
        .await
        .unwrap();
    assert_eq!(cancelled.state(), pb::ApprovalState::Cancelled);
    assert_eq!(
        cancelled.resolution.unwrap().resolved_by(),
        pb::ResolvedBy::Cancellation
    );
    let fetched = client.get_approval(&approval.id).await.unwrap();
    assert_eq!(fetched.state(), pb::ApprovalState::Cancelled);
}

#[tokio::test]
async fn a_recorded_delivery_is_kept_on_the_approval_and_replaced_by_a_repeat() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("d1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let delivery = |message_ref: &str| pb::RecordDeliveryRequest {
        approval_id: approval.id.clone(),
        channel: "telegram".into(),
        target: "-1001".into(),
        message_ref: message_ref.into(),
    };
    client.record_delivery(delivery("-1001:7")).await.unwrap();
    let updated = client.record_delivery(delivery("-1001:8")).await.unwrap();
    assert_eq!(updated.deliveries.len(), 1);
    assert_eq!(updated.deliveries[0].message_ref, "-1001:8");
    let fetched = client.get_approval(&approval.id).await.unwrap();
    assert_eq!(fetched.deliveries[0].message_ref, "-1001:8");
}

#[tokio::test]
async fn list_filters_and_pages() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let first = client
        .request_approval(request("l1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let mut other_tool = request("l2");
    other_tool.tool_name = "send_email".into();
    client.request_approval(other_tool).await.unwrap();
    let third = client
        .request_approval(request("l3"))
        .await
        .unwrap()
        .approval
        .unwrap();
    decide(&client, &first.id, pb::Verdict::Reject).await;

    let pending_deploys = client
        .list_approvals(pb::ListApprovalsRequest {
            states: vec![pb::ApprovalState::Pending.into()],
            tool_name: "deploy".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = pending_deploys
        .approvals
        .iter()
        .map(|a| a.id.as_str())
        .collect();
    assert_eq!(ids, [third.id.as_str()]);

    let page = client
        .list_approvals(pb::ListApprovalsRequest {
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.approvals.len(), 2);
    assert_eq!(page.approvals[0].id, third.id, "newest first");
    let rest = client
        .list_approvals(pb::ListApprovalsRequest {
            page_size: 2,
            page_token: page.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = rest.approvals.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, [first.id.as_str()]);
    assert!(rest.next_page_token.is_empty());
}

#[tokio::test]
async fn one_wait_returns_the_pending_approval_when_its_timeout_ends() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("w1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let waited = client
        .wait_for_decision(&approval.id, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(waited.state(), pb::ApprovalState::Pending);
}

#[tokio::test]
async fn decide_reports_duplicates_and_approvals_already_resolved() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("x1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    assert_eq!(
        decide(&client, &approval.id, pb::Verdict::Approve)
            .await
            .outcome(),
        pb::DecideOutcome::Resolved
    );
    // Same idempotency key (the helper derives it from the id) again.
    assert_eq!(
        decide(&client, &approval.id, pb::Verdict::Approve)
            .await
            .outcome(),
        pb::DecideOutcome::Duplicate
    );
    let late = client
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: pb::Verdict::Reject.into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "carol".into(),
                display_name: "Carol".into(),
            }),
            idempotency_key: "late".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(late.outcome(), pb::DecideOutcome::AlreadyResolved);
    assert_eq!(late.approval.unwrap().state(), pb::ApprovalState::Approved);
}

#[tokio::test]
async fn the_audit_trail_and_grants_through_the_admin_methods() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let approval = client
        .request_approval(request("g1"))
        .await
        .unwrap()
        .approval
        .unwrap();
    let mut for_the_session = pb::DecideRequest {
        approval_id: approval.id.clone(),
        verdict: pb::Verdict::Approve.into(),
        scope: pb::Scope::Session.into(),
        decider: Some(pb::Decider {
            channel: "cli".into(),
            user_id: "alice".into(),
            display_name: "Alice".into(),
        }),
        idempotency_key: "session".into(),
        ..Default::default()
    };
    client.decide(for_the_session.clone()).await.unwrap();

    let grants = client
        .list_grants(pb::ListGrantsRequest::default())
        .await
        .unwrap()
        .grants;
    assert_eq!(grants.len(), 1);
    assert!(grants[0].active);
    let revoked = client
        .revoke_grant(&grants[0].id, "end of session")
        .await
        .unwrap();
    assert!(!revoked.active);
    let missing = client.revoke_grant("no-such-grant", "").await.unwrap_err();
    assert!(
        matches!(missing, countersign_client::ClientError::NotFound(_)),
        "{missing:?}"
    );

    let events = client
        .list_events(pb::ListEventsRequest {
            approval_id: approval.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .events;
    let kinds: Vec<pb::EventKind> = events
        .iter()
        .map(|e| e.event.as_ref().unwrap().kind())
        .collect();
    assert_eq!(
        kinds,
        [
            pb::EventKind::Requested,
            pb::EventKind::Resolved,
            pb::EventKind::GrantRevoked
        ]
    );
    let report = client.verify_audit().await.unwrap();
    assert!(report.intact);
    assert_eq!(report.events_checked, 3);

    // The decision repeated changes nothing, and the grant stays revoked.
    for_the_session.idempotency_key = "session-again".into();
    client.decide(for_the_session).await.unwrap();
    assert!(client
        .list_grants(pb::ListGrantsRequest::default())
        .await
        .unwrap()
        .grants
        .is_empty());
}
