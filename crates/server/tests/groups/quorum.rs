//! Group quorums: members only, every group of an AND, groups named by a request or a rule, one member in two groups.

use super::*;

#[tokio::test]
async fn a_group_quorum_counts_members_only_and_refuses_others() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, critical("c1", "someone-else")).await;
    assert_eq!(approval.policy_rule, "critical-needs-security");
    assert_eq!(progress(&approval), [("security".to_string(), 0, 2)]);
    // Routed to the group's destinations: the request named no routes.
    let routes: Vec<(String, String)> = approval
        .routes
        .iter()
        .map(|r| (r.channel.clone(), r.target.clone()))
        .collect();
    assert_eq!(
        routes,
        [
            ("telegram".to_string(), "-100200300".to_string()),
            ("github".to_string(), "acme/infra#7".to_string())
        ]
    );

    // erin (on-call) is not in security: refused, nothing changes, the refusal is on the trail.
    let refused = refusal(&mut client, &approval.id, "1005").await;
    assert!(refused.contains("not a member of security"), "{}", refused);
    let refusals: Vec<_> = events_of(&server, &approval.id)
        .await
        .into_iter()
        .filter(|e| event_kind(e) == pb::EventKind::DecisionRefused)
        .collect();
    assert_eq!(refusals.len(), 1);
    assert!(refusals[0].detail.contains("not a member of security"));

    let first = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1001")
        .await
        .unwrap();
    assert_eq!(first.outcome(), pb::DecideOutcome::Recorded);
    let pending = first.approval.unwrap();
    assert_eq!(state(&pending), pb::ApprovalState::Pending);
    assert_eq!(progress(&pending), [("security".to_string(), 1, 2)]);
    // The same person again does not make two.
    let again = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "1001", "again"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), pb::DecideOutcome::Duplicate);

    let second = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1002")
        .await
        .unwrap();
    assert_eq!(second.outcome(), pb::DecideOutcome::Resolved);
    let approved = second.approval.unwrap();
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    assert_eq!(progress(&approved), [("security".to_string(), 2, 2)]);
}

#[tokio::test]
async fn every_group_of_an_and_must_reach_its_quorum() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, migration("m1")).await;
    assert_eq!(approval.policy_rule, "migrations");
    assert_eq!(
        progress(&approval),
        [("db".to_string(), 0, 1), ("security".to_string(), 0, 1)]
    );

    // dave approves for db: security still missing.
    let db = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1004")
        .await
        .unwrap();
    assert_eq!(db.outcome(), pb::DecideOutcome::Recorded);
    assert_eq!(
        progress(db.approval.as_ref().unwrap()),
        [("db".to_string(), 1, 1), ("security".to_string(), 0, 1)]
    );
    // erin (on-call) may not decide before an escalation.
    let erin = refusal(&mut client, &approval.id, "1005").await;
    assert!(erin.contains("db, security"), "{}", erin);

    let security = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1002")
        .await
        .unwrap();
    assert_eq!(security.outcome(), pb::DecideOutcome::Resolved);
    assert_eq!(
        state(security.approval.as_ref().unwrap()),
        pb::ApprovalState::Approved
    );

    // A reject by one member of one group rejects at once.
    let other = create(&mut client, migration("m2")).await;
    let rejected = decide_as(&mut client, &other.id, pb::Verdict::Reject, "1004")
        .await
        .unwrap();
    assert_eq!(
        state(rejected.approval.as_ref().unwrap()),
        pb::ApprovalState::Rejected
    );
}

#[tokio::test]
async fn a_request_names_its_groups_and_unknown_ones_are_refused() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let named = pb::RequestApprovalRequest {
        approver_groups: vec![pb::GroupQuorum {
            group: "db".into(),
            required: 2,
            ..Default::default()
        }],
        ..request("agent-a", "r1")
    };
    let approval = create(&mut client, named.clone()).await;
    assert_eq!(progress(&approval), [("db".to_string(), 0, 2)]);
    assert_eq!(approval.approver_groups[0].members, ["dave", "carol"]);
    assert_eq!(approval.routes[0].target, "-100400500");

    for (group, required, expected) in [
        ("nobody", 1, "approver_groups[0].group"),
        ("db", 3, "approver_groups[0].required"),
    ] {
        let status = client
            .request_approval(pb::RequestApprovalRequest {
                approver_groups: vec![pb::GroupQuorum {
                    group: group.into(),
                    required,
                    ..Default::default()
                }],
                ..request("agent-a", &format!("bad-{group}"))
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(expected), "{}", status.message());
    }
    assert_eq!(count_rows(&server, "approvals").await, 1, "nothing stored");
}

#[test]
fn groups_a_rule_cannot_satisfy_stop_the_start_naming_the_rule() {
    use countersign_server::security::Security;
    let listen = "127.0.0.1:0".parse().unwrap();
    assert!(Security::from_config(&example(), listen).is_ok());
    type Breakage = fn(&mut Config);
    let cases: [(Breakage, &str); 3] = [
        (
            |c| c.rules[1].approver_groups[0].group = "nobody".into(),
            "rule \"critical-needs-security\" names group \"nobody\", which is not configured",
        ),
        (
            |c| c.rules[1].approver_groups[0].required = 4,
            "asks for 4 approvals from group \"security\", which has 3 members",
        ),
        (
            |c| c.groups[0].members.push("mallory".into()),
            "member \"mallory\" is not the id of an approver",
        ),
    ];
    for (break_it, expected) in cases {
        let mut config = example();
        break_it(&mut config);
        let error = Security::from_config(&config, listen)
            .err()
            .expect("the start is refused")
            .to_string();
        assert!(error.contains(expected), "{error}");
    }
}

/// carol is in db and in security: her approval meets both groups of a migration. Asking for
/// two people (required_approvals = 2) makes her approval 1 of 2.
#[tokio::test]
async fn one_member_of_two_groups_meets_both_and_required_approvals_asks_for_two_people() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let alone = create(&mut client, migration("both-1")).await;
    let carol = decide_as(&mut client, &alone.id, pb::Verdict::Approve, "1003")
        .await
        .unwrap();
    assert_eq!(carol.outcome(), pb::DecideOutcome::Resolved);
    let approved = carol.approval.unwrap();
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    assert_eq!(
        progress(&approved),
        [("db".to_string(), 1, 1), ("security".to_string(), 1, 1)]
    );

    let two_people = create(
        &mut client,
        pb::RequestApprovalRequest {
            required_approvals: 2,
            ..migration("both-2")
        },
    )
    .await;
    let carol = decide_as(&mut client, &two_people.id, pb::Verdict::Approve, "1003")
        .await
        .unwrap();
    assert_eq!(carol.outcome(), pb::DecideOutcome::Recorded);
    let pending = carol.approval.unwrap();
    assert_eq!(state(&pending), pb::ApprovalState::Pending);
    assert_eq!(
        progress(&pending),
        [("db".to_string(), 1, 1), ("security".to_string(), 1, 1)]
    );
    let bob = decide_as(&mut client, &two_people.id, pb::Verdict::Approve, "1002")
        .await
        .unwrap();
    assert_eq!(bob.outcome(), pb::DecideOutcome::Resolved);
}
