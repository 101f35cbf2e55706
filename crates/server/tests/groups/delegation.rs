//! Delegations: a delegate decides for a member until it ends, is found in the history, and never fills two places of a quorum.

use super::*;

#[tokio::test]
async fn a_delegate_decides_on_behalf_of_a_member_until_it_ends() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    // From the time of the call: the short delegation below is made seconds into the test.
    let in_secs = |secs: u64| countersign_proto::Timestamp {
        seconds: (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + secs) as i64,
        nanos: 0,
    };
    let delegation = admin
        .create_delegation(pb::CreateDelegationRequest {
            delegator: "Alice".into(),
            delegate: "erin".into(),
            until: Some(in_secs(3600)),
            reason: "holiday".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(delegation.delegator, "alice");
    assert!(delegation.active);

    // erin, in no security role of her own, approves for alice: it counts for security.
    let approval = create(&mut client, critical("d1", "someone-else")).await;
    let recorded = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    assert_eq!(recorded.outcome(), pb::DecideOutcome::Recorded);
    let pending = recorded.approval.unwrap();
    let decision = pending.decisions.last().unwrap();
    assert_eq!(
        (decision.approver.as_str(), decision.delegate.as_str()),
        ("alice", "erin")
    );
    assert_eq!(progress(&pending), [("security".to_string(), 1, 2)]);
    // alice herself cannot add a second vote for the same person.
    let alice = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1001")
        .await
        .unwrap();
    assert_eq!(alice.outcome(), pb::DecideOutcome::Duplicate);
    let resolved = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1003")
        .await
        .unwrap();
    assert_eq!(resolved.outcome(), pb::DecideOutcome::Resolved);

    // No self-approval through a delegation, whichever side made the request.
    for requester in ["alice", "ERIN"] {
        let own = create(
            &mut client,
            critical(&format!("own-{requester}"), requester),
        )
        .await;
        let refused = refusal(&mut client, &own.id, "1005").await;
        assert!(
            refused.contains("separation of duties"),
            "{requester}: {}",
            refused
        );
    }

    // Revoked: erin is back to deciding nothing for security.
    let revoked = admin
        .revoke_delegation(pb::RevokeDelegationRequest {
            delegation_id: delegation.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!revoked.active);
    let later = create(&mut client, critical("d2", "someone-else")).await;
    let refused = refusal(&mut client, &later.id, "1005").await;
    assert!(refused.contains("decides for no member"), "{refused}");

    // A delegation expires by itself.
    admin
        .create_delegation(pb::CreateDelegationRequest {
            delegator: "bob".into(),
            delegate: "erin".into(),
            until: Some(in_secs(2)),
            reason: String::new(),
        })
        .await
        .unwrap();
    let listed = admin
        .list_delegations(pb::ListDelegationsRequest {
            approver: "erin".into(),
            include_inactive: true,
        })
        .await
        .unwrap()
        .into_inner()
        .delegations;
    assert_eq!(listed.len(), 2);
    let short = create(&mut client, critical("d3", "someone-else")).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let expired = refusal(&mut client, &short.id, "1005").await;
    assert!(expired.contains("decides for no member"), "{expired}");
    let active = admin
        .list_delegations(pb::ListDelegationsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .delegations;
    assert!(active.is_empty(), "{active:?}");

    // Bad delegations change nothing.
    for (delegator, delegate, until, field) in [
        ("alice", "alice", in_secs(60), "delegate"),
        ("mallory", "bob", in_secs(60), "delegator"),
        ("alice", "bob", in_secs(0), "until"),
    ] {
        let status = admin
            .create_delegation(pb::CreateDelegationRequest {
                delegator: delegator.into(),
                delegate: delegate.into(),
                until: Some(until),
                reason: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    assert_eq!(count_rows(&server, "delegations").await, 2);
}

/// The history filtered by a registry approver id finds everything that person did: what
/// counted for them, what they decided for a delegator, and what was refused to them (both
/// recorded under the platform identity they decided with).
#[tokio::test]
async fn the_history_by_approver_id_finds_a_delegate_s_decisions_and_refusals() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    delegate_for_an_hour(&mut admin, "alice", "erin").await;
    let for_alice = create(&mut client, critical("h1", "someone-else")).await;
    decide_as(&mut client, &for_alice.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    let own = create(&mut client, critical("h2", "erin")).await;
    refusal(&mut client, &own.id, "1005").await;

    let decided_by = |decider: &str| {
        let filter = pb::ListEventsRequest {
            decider: decider.into(),
            ..Default::default()
        };
        let mut admin = admin.clone();
        async move {
            all_events(&mut admin, filter)
                .await
                .iter()
                .map(|e| {
                    let event = e.event.as_ref().unwrap();
                    (event.approval.as_ref().unwrap().id.clone(), event_kind(e))
                })
                .collect::<Vec<_>>()
        }
    };
    let erin = vec![
        (for_alice.id.clone(), pb::EventKind::DecisionRecorded),
        (own.id.clone(), pb::EventKind::DecisionRefused),
    ];
    assert_eq!(decided_by("erin").await, erin, "by erin's approver id");
    assert_eq!(decided_by("ERIN").await, erin, "ids compare as identities");
    assert_eq!(decided_by("telegram:1005").await, erin, "by her identity");
    assert_eq!(
        decided_by("alice").await,
        vec![(for_alice.id.clone(), pb::EventKind::DecisionRecorded)],
        "by the delegator's id: what counted for her"
    );
    assert!(decided_by("bob").await.is_empty());
}

/// A member who also holds another member's delegation is still one person: a second
/// approval from them is a duplicate, and "2 of security" needs a second human.
#[tokio::test]
async fn a_delegation_never_lets_one_person_fill_two_places_of_a_quorum() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    delegate_for_an_hour(&mut admin, "alice", "bob").await;
    let approval = create(&mut client, critical("q1", "someone-else")).await;
    for attempt in ["first", "second"] {
        let answer = client
            .decide(decide(
                &approval.id,
                pb::Verdict::Approve,
                "1002",
                &format!("bob-{attempt}"),
            ))
            .await
            .unwrap()
            .into_inner();
        let expected = match attempt {
            "first" => pb::DecideOutcome::Recorded,
            _ => pb::DecideOutcome::Duplicate,
        };
        assert_eq!(answer.outcome(), expected, "{attempt}");
        assert_eq!(
            progress(answer.approval.as_ref().unwrap()),
            [("security".to_string(), 1, 2)]
        );
    }
    // Another person completes the quorum.
    let carol = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1003")
        .await
        .unwrap();
    assert_eq!(carol.outcome(), pb::DecideOutcome::Resolved);
}

/// erin holds alice's delegation; alice approved herself. erin's approval for alice is the
/// same vote again: DUPLICATE, nothing recorded and no refusal on the trail.
#[tokio::test]
async fn a_delegate_voting_after_the_delegator_gets_a_duplicate() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    delegate_for_an_hour(&mut admin, "alice", "erin").await;
    let approval = create(&mut client, critical("late-delegate", "someone-else")).await;
    let alice = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1001")
        .await
        .unwrap();
    assert_eq!(alice.outcome(), pb::DecideOutcome::Recorded);

    let erin = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .expect("the same vote again, not a refusal");
    assert_eq!(erin.outcome(), pb::DecideOutcome::Duplicate);
    let unchanged = erin.approval.unwrap();
    assert_eq!(unchanged.decisions.len(), 1);
    assert_eq!(progress(&unchanged), [("security".to_string(), 1, 2)]);
    let kinds: Vec<pb::EventKind> = events_of(&server, &approval.id)
        .await
        .iter()
        .map(event_kind)
        .collect();
    assert_eq!(
        kinds,
        [pb::EventKind::Requested, pb::EventKind::DecisionRecorded]
    );
}
