//! Approver groups, delegation, reminders, escalation and the on-timeout policy through gRPC
//! over a real socket, with the worked example of docs/configuration.md as the configuration.

use crate::common;
mod delegation;
mod follow_up;
mod quorum;

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
