//! The approver registry on Decide: strangers and ceilings refused on the record, separation of duties, one person on two channels counted once.

use super::*;

#[tokio::test]
async fn deciders_outside_the_registry_or_above_their_ceiling_are_refused_on_the_record() {
    let server = registry_server().await;
    let channel = channel(&server).await;
    let mut client = with_token(&channel, None);
    let mut audit = admin(&channel, None);
    let mut req = request("agent-a", "call-1");
    req.requester = "carol".into();
    let approval = create(&mut connect(&server).await, req).await;
    assert_eq!(approval.risk, pb::Risk::High as i32);

    let stranger = client
        .decide(decision(&approval.id, "telegram", "9999", "@mallory", "k1"))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), Code::PermissionDenied);
    assert!(
        stranger.message().contains("not a registered approver"),
        "{stranger:?}"
    );
    let ceiling = client
        .decide(decision(&approval.id, "telegram", "2002", "@bob", "k2"))
        .await
        .unwrap_err();
    assert_eq!(ceiling.code(), Code::PermissionDenied);
    assert!(ceiling.message().contains("up to MEDIUM"), "{ceiling:?}");

    let unchanged = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&unchanged), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());

    let refusals = refused_decisions(&mut audit, &approval.id).await;
    let deciders: Vec<String> = refusals
        .iter()
        .map(|e| {
            let decision = e.event.as_ref().unwrap().decision.as_ref().unwrap();
            decision.decider.as_ref().unwrap().user_id.clone()
        })
        .collect();
    assert_eq!(deciders, ["9999", "2002"]);
    assert!(refusals[0].detail.contains("not a registered approver"));
    assert!(refusals[1].detail.contains("up to MEDIUM"));

    let alice = client
        .decide(decision(&approval.id, "telegram", "1001", "@alice", "k3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alice.outcome, pb::DecideOutcome::Resolved as i32);
}

#[tokio::test]
async fn the_requester_cannot_approve_their_own_request_unless_a_rule_allows_it() {
    let server = registry_server().await;
    let channel = channel(&server).await;
    let mut client = with_token(&channel, None);
    let mut agent = connect(&server).await;
    let mut req = request("agent-a", "call-1");
    req.requester = "alice".into();
    let own = create(&mut agent, req.clone()).await;

    let refused = client
        .decide(decision(&own.id, "github", "583231", "Alice-GH", "k1"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("separation of duties"),
        "{refused:?}"
    );
    let rejected = client
        .decide(pb::DecideRequest {
            verdict: pb::Verdict::Reject as i32,
            ..decision(&own.id, "telegram", "1001", "@alice", "k2")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rejected.outcome,
        pb::DecideOutcome::Resolved as i32,
        "withdrawing one's own request is allowed"
    );

    req.idempotency_key = "call-2".into();
    req.tool_name = "self-service.reset-password".into();
    let exempt = create(&mut agent, req).await;
    assert_eq!(exempt.policy_rule, "self-service");
    let approved = client
        .decide(decision(&exempt.id, "telegram", "1001", "@alice", "k3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(approved.outcome, pb::DecideOutcome::Resolved as i32);
}

#[tokio::test]
async fn quorum_counts_one_person_on_telegram_and_github_once() {
    let server = registry_server().await;
    let channel = channel(&server).await;
    let mut client = with_token(&channel, None);
    let mut req = request("agent-a", "call-1");
    req.requester = "carol".into();
    req.risk = pb::Risk::Medium as i32;
    req.required_approvals = 2;
    let approval = create(&mut connect(&server).await, req).await;

    let on_telegram = client
        .decide(decision(&approval.id, "telegram", "1001", "@alice", "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(on_telegram.outcome, pb::DecideOutcome::Recorded as i32);
    let on_github = client
        .decide(decision(&approval.id, "github", "583231", "alice-gh", "k2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(on_github.outcome, pb::DecideOutcome::Duplicate as i32);
    let still = on_github.approval.unwrap();
    assert_eq!(state(&still), pb::ApprovalState::Pending);
    assert_eq!(still.decisions.len(), 1);

    let bob = client
        .decide(decision(&approval.id, "cli", "bob", "bob", "k3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bob.outcome, pb::DecideOutcome::Resolved as i32);
    let deciders: Vec<String> = bob
        .approval
        .unwrap()
        .resolution
        .unwrap()
        .deciders
        .into_iter()
        .map(|d| d.channel)
        .collect();
    assert_eq!(deciders, ["telegram", "cli"]);
}
