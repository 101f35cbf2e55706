//! Policy again on an edit: refused edits change nothing, a raised risk or quorum needs what it asks for, other groups and a lost exemption are refused.

use super::*;

#[tokio::test]
async fn an_edit_the_policy_denies_or_that_is_malformed_is_refused_and_changes_nothing() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        call("k1", "bash", r#"{"command": "rm -rf /tmp/build"}"#, 1),
    )
    .await;
    let before = get(&mut client, &approval.id).await;

    let denied = refused(
        &mut client,
        approve(&approval.id, "1001", "d1", "", r#"{"command": "rm -rf /"}"#),
    )
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("never-wipe-root"), "{denied:?}");

    let mut reject = decide(&approval.id, pb::Verdict::Reject, "1001", "d2");
    reject.edited_arguments_json = r#"{"command": "ls"}"#.into();
    let with_reject = refused(&mut client, reject).await;
    assert_eq!(with_reject.code(), Code::InvalidArgument);
    assert!(with_reject.message().contains("edited_arguments_json"));
    assert!(with_reject.message().contains("VERDICT_APPROVE"));

    for (edit, says) in [
        (r#"{"command": "ls", "command": "rm -rf /"}"#, "twice"),
        (r#"["ls"]"#, "must be a json object"),
        (
            r#"{"n": 123456789012345678901234567890}"#,
            "edited_arguments_json",
        ),
        ("{not json", "edited_arguments_json"),
    ] {
        let status = refused(&mut client, approve(&approval.id, "1001", "d3", "", edit)).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{edit}: {status:?}");
        assert!(
            status.message().contains("edited_arguments_json"),
            "{status:?}"
        );
        assert!(status.message().to_lowercase().contains(says), "{status:?}");
    }
    let bad_digest = refused(&mut client, approve(&approval.id, "1001", "d4", "abc", "")).await;
    assert_eq!(bad_digest.code(), Code::InvalidArgument);
    assert!(bad_digest.message().contains("expected_args_digest"));

    let after = get(&mut client, &approval.id).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert!(after.decisions.is_empty());
    assert!(after.edited_arguments_json.is_empty());
    assert_eq!(after.arguments_json, before.arguments_json);
    assert_eq!(after.risk, before.risk);
}

#[tokio::test]
async fn an_edit_that_raises_the_risk_needs_a_decider_with_that_ceiling_and_the_waiter_runs_it() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let original = r#"{"command": "make deploy", "cwd": "/srv/staging"}"#;
    let approval = create(&mut client, call("k1", "bash", original, 1)).await;
    assert_eq!(approval.risk, pb::Risk::Medium as i32);

    let mut waiter = client.clone();
    let id = approval.id.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .wait_for_decision(pb::WaitForDecisionRequest {
                approval_id: id,
                timeout_ms: 20_000,
            })
            .await
            .expect("wait")
            .into_inner()
    });

    // Bob may decide up to MEDIUM; the edit moves the call to production: CRITICAL.
    let edited = r#"{"cwd": "/prod/app", "command": "make deploy"}"#;
    let over_ceiling = refused(&mut client, approve(&approval.id, "2002", "b1", "", edited)).await;
    assert_eq!(over_ceiling.code(), Code::PermissionDenied);
    assert!(
        over_ceiling.message().contains("edited arguments"),
        "{over_ceiling:?}"
    );
    let unchanged = get(&mut client, &approval.id).await;
    assert_eq!(state(&unchanged), pb::ApprovalState::Pending);
    assert!(unchanged.edited_arguments_json.is_empty());
    assert_eq!(unchanged.risk, pb::Risk::Medium as i32);

    let decided = client
        .decide(approve(&approval.id, "1001", "a1", "", edited))
        .await
        .expect("alice may approve a critical call")
        .into_inner();
    assert_eq!(decided.outcome(), pb::DecideOutcome::Resolved);

    let seen = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is woken")
        .expect("waiter task");
    assert_eq!(state(&seen), pb::ApprovalState::Approved);
    assert_eq!(seen.edited_arguments_json, edited);
    assert_eq!(seen.edited_args_digest, digest_of(edited));
    assert_eq!(seen.arguments_json, original, "the request stays as it was");
    assert_eq!(seen.args_digest, digest_of(original));
    assert_eq!(seen.risk, pb::Risk::Critical as i32);
    let editor = seen.editor.clone().expect("the editor");
    assert_eq!(
        (editor.channel.as_str(), editor.user_id.as_str()),
        ("telegram", "1001")
    );
    let resolution = seen.resolution.clone().expect("resolution");
    assert_eq!(resolution.args_digest, digest_of(edited));
    let decision = seen.decisions.last().expect("the decision");
    assert_eq!(decision.edited_arguments_json, edited);
    assert_eq!(decision.args_digest, digest_of(edited));
    assert!(!decision.restarts_count);

    // Consume binds the execution to the edited version.
    let consumed = consume(&mut client, &approval.id).await;
    assert_eq!(state(&consumed), pb::ApprovalState::Consumed);
    assert_eq!(consumed.edited_args_digest, digest_of(edited));
    assert_eq!(
        consumed.resolution.expect("resolution").args_digest,
        digest_of(edited)
    );

    // The audit trail keeps both versions with their digests, and still verifies.
    let mut admin = admin(&channel(&server).await, None);
    let events = admin
        .list_events(pb::ListEventsRequest {
            approval_id: approval.id.clone(),
            ..Default::default()
        })
        .await
        .expect("list events")
        .into_inner()
        .events;
    let kinds: Vec<pb::EventKind> = events
        .iter()
        .map(|e| kind(e.event.as_ref().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            pb::EventKind::Requested,
            pb::EventKind::DecisionRefused,
            pb::EventKind::Resolved,
            pb::EventKind::Consumed
        ]
    );
    let requested = events[0].event.as_ref().unwrap().approval.as_ref().unwrap();
    assert_eq!(requested.arguments_json, original);
    assert!(requested.edited_arguments_json.is_empty());
    let resolved = events[2].event.as_ref().unwrap();
    let logged = resolved.decision.as_ref().expect("the decision");
    assert_eq!(logged.edited_arguments_json, edited);
    assert_eq!(logged.args_digest, digest_of(edited));
    let then = resolved.approval.as_ref().unwrap();
    assert_eq!(then.arguments_json, original);
    assert_eq!(then.edited_arguments_json, edited);
    let verified = verify(&server).await;
    assert!(verified.intact, "{verified:?}");
}

#[tokio::test]
async fn an_edit_that_raises_the_quorum_needs_the_higher_quorum_on_the_same_version() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        call("k1", "deploy", r#"{"env": "staging"}"#, 1),
    )
    .await;
    assert_eq!(approval.required_approvals, 1);

    let edited = r#"{"env": "production"}"#;
    let edit = client
        .decide(approve(
            &approval.id,
            "1001",
            "a1",
            &approval.args_digest,
            edited,
        ))
        .await
        .expect("alice approves an edit to production")
        .into_inner();
    assert_eq!(edit.outcome(), pb::DecideOutcome::Recorded);
    let now = edit.approval.expect("approval");
    assert_eq!(
        now.required_approvals, 2,
        "the prod-deploys rule asks for two"
    );
    assert!(
        !now.decisions[0].restarts_count,
        "nothing was approved before"
    );

    // Approving the same edit again is an approval of that version, not another edit.
    let second = client
        .decide(approve(&approval.id, "3003", "c1", "", edited))
        .await
        .expect("carol approves the same edited arguments")
        .into_inner();
    assert_eq!(second.outcome(), pb::DecideOutcome::Resolved);
    let approved = second.approval.expect("approval");
    assert_eq!(approved.edited_arguments_json, edited);
    assert_eq!(approved.editor.expect("editor").user_id, "1001");
    assert!(approved.decisions[1].edited_arguments_json.is_empty());
}

/// docs/edits.md: separation of duties applies when either version needs it. A call exempt
/// from it (`dev`) edited into one that no rule exempts (`staging`, the default) may not be
/// approved by its requester, whether she made the edit or another approver did.
#[tokio::test]
async fn an_edit_out_of_a_separation_of_duties_exemption_cannot_be_approved_by_the_requester() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let own_call = |key: &str, required: u32| pb::RequestApprovalRequest {
        requester: "alice".into(),
        ..call(key, "selfserve", r#"{"env": "dev"}"#, required)
    };
    let staging = r#"{"env": "staging"}"#;

    // Exempt as requested: alice may approve her own dev call.
    let exempt = create(&mut client, own_call("sod-0", 1)).await;
    let approved = client
        .decide(approve(&exempt.id, "1001", "s0", "", ""))
        .await
        .expect("the exempt call is approved by its requester")
        .into_inner();
    assert_eq!(
        state(approved.approval.as_ref().unwrap()),
        pb::ApprovalState::Approved
    );

    // Her own edit to staging, approved in the same decision.
    let edited_by_her = create(&mut client, own_call("sod-1", 1)).await;
    let status = refused(
        &mut client,
        approve(&edited_by_her.id, "1001", "s1", "", staging),
    )
    .await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("separation of duties"),
        "{status:?}"
    );
    let after = get(&mut client, &edited_by_her.id).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert!(after.decisions.is_empty());
    assert!(after.edited_arguments_json.is_empty());

    // Carol edits to staging and approves (1 of 2); alice then approves that version.
    let edited_by_carol = create(&mut client, own_call("sod-2", 2)).await;
    client
        .decide(approve(&edited_by_carol.id, "3003", "s2", "", staging))
        .await
        .expect("carol's edit and approval are recorded");
    let status = refused(
        &mut client,
        approve(&edited_by_carol.id, "1001", "s3", &digest_of(staging), ""),
    )
    .await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("separation of duties"),
        "{status:?}"
    );
    let after = get(&mut client, &edited_by_carol.id).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert_eq!(after.decisions.len(), 1);
}

/// An edit that a rule would send to a group the approval does not ask (its deciders were
/// chosen for the call as requested) is refused, recorded as refused, and changes nothing;
/// an edit the approval's own groups cover is approved.
#[tokio::test]
async fn an_edit_a_rule_would_send_to_other_groups_is_refused() {
    let server = TestServer::start_with(|c| {
        let parsed = Config::parse(&format!("{CONFIG}{GROUPS}")).unwrap();
        c.approvers = parsed.approvers;
        c.groups = parsed.groups;
        c.rules = parsed.rules;
    })
    .await;
    let mut client = connect(&server).await;
    let release = |key: &str| pb::RequestApprovalRequest {
        approver_groups: vec![pb::GroupQuorum {
            group: "dev".into(),
            required: 1,
            ..Default::default()
        }],
        ..call(key, "release", r#"{"target": "staging"}"#, 1)
    };
    let approval = create(&mut client, release("g1")).await;
    let before = get(&mut client, &approval.id).await;

    let status = refused(
        &mut client,
        approve(
            &approval.id,
            "1001",
            "to-prod",
            "",
            r#"{"target": "production"}"#,
        ),
    )
    .await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("need approval from 1 of ops, which this approval does not ask for"),
        "{status:?}"
    );
    let after = get(&mut client, &approval.id).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert!(after.decisions.is_empty() && after.edited_arguments_json.is_empty());
    assert_eq!(after.args_digest, before.args_digest);
    let refusals = all_events(
        &mut admin(&channel(&server).await, None),
        pb::ListEventsRequest {
            approval_id: approval.id.clone(),
            ..Default::default()
        },
    )
    .await
    .into_iter()
    .filter(|e| event_kind(e) == pb::EventKind::DecisionRefused)
    .count();
    assert_eq!(refusals, 1);

    let within = client
        .decide(approve(
            &approval.id,
            "1001",
            "to-staging-2",
            "",
            r#"{"target": "staging-2"}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(within.outcome(), pb::DecideOutcome::Resolved);
}
