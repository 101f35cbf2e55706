//! Approver groups, delegation, reminders, escalation and the on-timeout policy through gRPC
//! over a real socket, with the worked example of docs/configuration.md as the configuration.

mod common;

use std::time::Duration;

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::Config;
use countersign_testkit::server::TestServer;
use tonic::Code;

fn example() -> Config {
    Config::parse(countersign_testkit::docs::groups_example()).expect("the worked example parses")
}

/// The example as the server's configuration; `adjust` shortens durations where a test waits.
async fn server_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
    let mut parsed = example();
    adjust(&mut parsed);
    TestServer::start_with(|c| {
        c.approvers = parsed.approvers;
        c.groups = parsed.groups;
        c.rules = parsed.rules;
    })
    .await
}

fn critical(key: &str, requester: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        requester: requester.into(),
        risk: pb::Risk::Critical as i32,
        ..request("agent-a", key)
    }
}

fn migration(key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        requester: "someone-else".into(),
        tool_name: "db_migrate".into(),
        arguments_json: r#"{"migration":"0042_add_index"}"#.into(),
        risk: pb::Risk::High as i32,
        ..request("agent-a", key)
    }
}

async fn decide_as(
    client: &mut Client,
    id: &str,
    verdict: pb::Verdict,
    telegram_user: &str,
) -> Result<pb::DecideResponse, tonic::Status> {
    client
        .decide(decide(
            id,
            verdict,
            telegram_user,
            &format!("{telegram_user}-{id}-{verdict:?}"),
        ))
        .await
        .map(|r| r.into_inner())
}

/// Approves as `telegram_user`, which the server must refuse; returns its reason.
async fn refusal(client: &mut Client, id: &str, telegram_user: &str) -> String {
    let status = decide_as(client, id, pb::Verdict::Approve, telegram_user)
        .await
        .expect_err("the server refuses the decision");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    status.message().to_string()
}

fn progress(approval: &pb::Approval) -> Vec<(String, u32, u32)> {
    approval
        .approver_groups
        .iter()
        .map(|g| (g.group.clone(), g.approved, g.required))
        .collect()
}

async fn events_of(server: &TestServer, approval_id: &str) -> Vec<pb::AuditEvent> {
    let mut admin = admin(&channel(server).await, None);
    all_events(
        &mut admin,
        pb::ListEventsRequest {
            approval_id: approval_id.into(),
            ..Default::default()
        },
    )
    .await
}

/// Lets `delegate` decide for `delegator` for the next hour.
async fn delegate_for_an_hour(admin: &mut AdminClient, delegator: &str, delegate: &str) {
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    admin
        .create_delegation(pb::CreateDelegationRequest {
            delegator: delegator.into(),
            delegate: delegate.into(),
            until: Some(countersign_proto::Timestamp {
                seconds: until as i64,
                nanos: 0,
            }),
            reason: "holiday".into(),
        })
        .await
        .unwrap();
}

async fn get(client: &mut Client, id: &str) -> pb::Approval {
    client
        .get_approval(pb::GetApprovalRequest {
            approval_id: id.into(),
        })
        .await
        .expect("get approval")
        .into_inner()
}

/// Waits (polling, at most `within`) until the approval satisfies `done`.
async fn until(
    client: &mut Client,
    id: &str,
    within: Duration,
    done: impl Fn(&pb::Approval) -> bool,
) -> pb::Approval {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let approval = get(client, id).await;
        if done(&approval) {
            return approval;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in time: {approval:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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

#[tokio::test]
async fn reminders_then_escalation_let_the_escalation_group_decide() {
    let server = server_with(|c| {
        let migrations = c
            .rules
            .iter_mut()
            .find(|r| r.name == "migrations")
            .expect("the example's migrations rule");
        migrations.remind_after_seconds = Some(1);
        migrations.escalate_after_seconds = Some(2);
    })
    .await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, migration("e1")).await;
    let follow_up = approval.follow_up.clone().unwrap();
    assert_eq!(
        (
            follow_up.remind_after_seconds,
            follow_up.escalate_after_seconds,
            follow_up.escalate_to.as_str()
        ),
        (1, 2, "oncall")
    );

    let reminded = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.reminded_at.is_some())
    })
    .await;
    assert!(reminded.follow_up.unwrap().escalated_at.is_none());
    let escalated = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.escalated_at.is_some())
    })
    .await;
    assert_eq!(state(&escalated), pb::ApprovalState::Pending);
    // The on-call group's destination joined the routes.
    assert!(escalated.routes.iter().any(|r| r.target == "-100900900"));

    let kinds: Vec<(pb::EventKind, String)> = events_of(&server, &approval.id)
        .await
        .iter()
        .map(|e| (event_kind(e), e.detail.clone()))
        .collect();
    assert_eq!(kinds[1].0, pb::EventKind::Reminded, "{kinds:?}");
    assert_eq!(
        kinds[1].1,
        "reminder: no decision from db or security after 1s"
    );
    assert_eq!(kinds[2].0, pb::EventKind::Escalated, "{kinds:?}");
    assert!(
        kinds[2].1.starts_with("escalated to oncall after "),
        "{kinds:?}"
    );

    // erin (on-call) may now decide, and counts for both groups.
    let erin = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    assert_eq!(erin.outcome(), pb::DecideOutcome::Resolved);
    assert_eq!(
        progress(erin.approval.as_ref().unwrap()),
        [("db".to_string(), 1, 1), ("security".to_string(), 1, 1)]
    );
    let mut admin = admin(&channel(&server).await, None);
    assert!(verify(&mut admin).await.intact);
}

#[tokio::test]
async fn on_timeout_reject_tells_the_runtime_who_did_not_decide() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        pb::RequestApprovalRequest {
            ttl_seconds: 1,
            ..critical("t1", "someone-else")
        },
    )
    .await;
    let done = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 5000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&done), pb::ApprovalState::Expired);
    let resolution = done.resolution.unwrap();
    assert_eq!(resolution.resolved_by(), pb::ResolvedBy::Expiry);
    assert_eq!(resolution.reason, "no decision from security within 1s");
}

#[tokio::test]
async fn on_timeout_escalate_gives_the_escalation_group_a_fresh_deadline() {
    let server = server_with(|_| {}).await;
    let mut client = connect(&server).await;
    // No rule matches a HIGH shell call: the request sets its own groups and timeout policy.
    let escalating = |key: &str| pb::RequestApprovalRequest {
        ttl_seconds: 1,
        approver_groups: vec![pb::GroupQuorum {
            group: "security".into(),
            required: 2,
            ..Default::default()
        }],
        follow_up: Some(pb::FollowUp {
            on_timeout: pb::OnTimeout::Escalate as i32,
            escalate_to: "oncall".into(),
            ..Default::default()
        }),
        ..request("agent-a", key)
    };
    let approval = create(&mut client, escalating("x1")).await;
    let escalated = until(&mut client, &approval.id, Duration::from_secs(5), |a| {
        a.follow_up
            .as_ref()
            .is_some_and(|f| f.escalated_at.is_some())
    })
    .await;
    assert_eq!(state(&escalated), pb::ApprovalState::Pending);
    let first_deadline = approval.expires_at.unwrap().seconds;
    assert!(escalated.expires_at.unwrap().seconds > first_deadline);
    let erin = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1005")
        .await
        .unwrap();
    assert_eq!(
        erin.outcome(),
        pb::DecideOutcome::Recorded,
        "2 of security: one more"
    );

    // Nobody answers the escalation either: then it expires, naming who was waited for.
    let ignored = create(&mut client, escalating("x2")).await;
    let done = until(&mut client, &ignored.id, Duration::from_secs(6), |a| {
        state(a) != pb::ApprovalState::Pending
    })
    .await;
    assert_eq!(state(&done), pb::ApprovalState::Expired);
    assert_eq!(
        done.resolution.unwrap().reason,
        "no decision from security or oncall within 2s"
    );
    let kinds: Vec<pb::EventKind> = events_of(&server, &ignored.id)
        .await
        .iter()
        .map(event_kind)
        .collect();
    assert_eq!(
        kinds,
        [
            pb::EventKind::Requested,
            pb::EventKind::Escalated,
            pb::EventKind::Expired
        ]
    );
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

/// After alice's approval of "2 of security" the reminder and the expiry say what is missing,
/// not "no decision from security".
#[tokio::test]
async fn a_reminder_after_one_of_two_approvals_says_what_is_missing() {
    let server = server_with(|c| {
        let critical = c
            .rules
            .iter_mut()
            .find(|r| r.name == "critical-needs-security")
            .expect("the example's critical rule");
        critical.remind_after_seconds = Some(1);
    })
    .await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        pb::RequestApprovalRequest {
            ttl_seconds: 3,
            ..critical("half", "someone-else")
        },
    )
    .await;
    let alice = decide_as(&mut client, &approval.id, pb::Verdict::Approve, "1001")
        .await
        .unwrap();
    assert_eq!(alice.outcome(), pb::DecideOutcome::Recorded);

    let expired = until(&mut client, &approval.id, Duration::from_secs(8), |a| {
        state(a) != pb::ApprovalState::Pending
    })
    .await;
    assert_eq!(state(&expired), pb::ApprovalState::Expired);
    assert_eq!(
        expired.resolution.unwrap().reason,
        "only 1 of 2 approvals from security within 3s"
    );
    let reminders: Vec<String> = events_of(&server, &approval.id)
        .await
        .into_iter()
        .filter(|e| event_kind(e) == pb::EventKind::Reminded)
        .map(|e| e.detail)
        .collect();
    assert_eq!(reminders.len(), 1, "{reminders:?}");
    assert!(
        reminders[0].starts_with("reminder: only 1 of 2 approvals from security after "),
        "{reminders:?}"
    );
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
