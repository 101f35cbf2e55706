//! Shared helpers for the end-to-end tests: a raw gRPC client and request builders.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_testkit::server::TestServer;
use tonic::transport::Channel;

pub type Client = ApprovalServiceClient<Channel>;

pub async fn connect(server: &TestServer) -> Client {
    ApprovalServiceClient::connect(server.url())
        .await
        .expect("connect to test server")
}

pub fn request(agent: &str, key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: agent.to_string(),
        session_id: "session-1".to_string(),
        requester: "alice".to_string(),
        idempotency_key: key.to_string(),
        tool_name: "bash".to_string(),
        arguments_json: r#"{"command": "rm -rf /tmp/build", "cwd": "/srv"}"#.to_string(),
        action: "delete the build directory".to_string(),
        reason: "clean rebuild".to_string(),
        risk: pb::Risk::High as i32,
        ..Default::default()
    }
}

pub fn decide(id: &str, verdict: pb::Verdict, user: &str, key: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        approval_id: id.to_string(),
        verdict: verdict as i32,
        scope: pb::Scope::Once as i32,
        reason: String::new(),
        decider: Some(pb::Decider {
            channel: "telegram".to_string(),
            user_id: user.to_string(),
            display_name: format!("@{user}"),
        }),
        idempotency_key: key.to_string(),
    }
}

pub async fn create(client: &mut Client, req: pb::RequestApprovalRequest) -> pb::Approval {
    client
        .request_approval(req)
        .await
        .expect("request approval")
        .into_inner()
        .approval
        .expect("approval in response")
}

pub fn state(approval: &pb::Approval) -> pb::ApprovalState {
    pb::ApprovalState::try_from(approval.state).expect("known state")
}

pub fn kind(event: &pb::ApprovalEvent) -> pb::EventKind {
    pb::EventKind::try_from(event.kind).expect("known kind")
}

pub type Events = tonic::Streaming<pb::ApprovalEvent>;

pub async fn watch(client: &mut Client, req: pb::WatchApprovalsRequest) -> Events {
    client
        .watch_approvals(req)
        .await
        .expect("watch")
        .into_inner()
}

/// The next event that is not a heartbeat, within `wait`.
pub async fn next_event(events: &mut Events, wait: Duration) -> pb::ApprovalEvent {
    loop {
        let item = tokio::time::timeout(wait, events.message())
            .await
            .expect("an event in time")
            .expect("stream ok")
            .expect("stream open");
        if kind(&item) != pb::EventKind::Heartbeat {
            return item;
        }
    }
}

pub async fn count_rows(server: &TestServer, table: &str) -> i64 {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=ro", server.database_path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open database");
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&mut conn)
        .await
        .expect("count")
}

pub const SECOND: Duration = Duration::from_secs(1);
pub const PATIENCE: Duration = Duration::from_secs(10);
