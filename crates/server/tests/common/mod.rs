//! Shared helpers for the end-to-end tests: a raw gRPC client and request builders.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use countersign_proto::v1 as pb;
use countersign_proto::v1::admin_service_client::AdminServiceClient;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_testkit::server::TestServer;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;

pub type Client = ApprovalServiceClient<Channel>;

/// Sends `authorization: Bearer <token>` with every call, when it has a token.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Bearer {
        Bearer(token.map(|t| format!("Bearer {t}").parse().expect("header value")))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

pub type TokenClient = ApprovalServiceClient<InterceptedService<Channel, Bearer>>;
pub type AdminClient = AdminServiceClient<InterceptedService<Channel, Bearer>>;

pub async fn channel(server: &TestServer) -> Channel {
    Channel::from_shared(server.url())
        .expect("server URL")
        .connect()
        .await
        .expect("connect to test server")
}

/// An ApprovalService client on `channel` calling with `token` (none: no header).
pub fn with_token(channel: &Channel, token: Option<&str>) -> TokenClient {
    ApprovalServiceClient::with_interceptor(channel.clone(), Bearer::new(token))
}

/// An AdminService client on `channel` calling with `token` (none: no header).
pub fn admin(channel: &Channel, token: Option<&str>) -> AdminClient {
    AdminServiceClient::with_interceptor(channel.clone(), Bearer::new(token))
}

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
        ..Default::default()
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

/// A connection to the server's database, whichever backend it runs on.
enum Stored {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Stored {
    /// Read-only on SQLite.
    async fn open(server: &TestServer) -> Stored {
        use sqlx::Connection;
        let database = server.database_path();
        let database = database.to_string_lossy();
        if database.starts_with("postgres") {
            Stored::Postgres(
                sqlx::PgConnection::connect(&database)
                    .await
                    .expect("open database"),
            )
        } else {
            Stored::Sqlite(
                sqlx::SqliteConnection::connect(&format!("sqlite://{database}?mode=ro"))
                    .await
                    .expect("open database"),
            )
        }
    }

    async fn count(&mut self, sql: &str) -> i64 {
        match self {
            Stored::Sqlite(conn) => sqlx::query_scalar(sql).fetch_one(conn).await,
            Stored::Postgres(conn) => sqlx::query_scalar(sql).fetch_one(conn).await,
        }
        .expect("count")
    }

    async fn texts(&mut self, sql: &str) -> Vec<String> {
        match self {
            Stored::Sqlite(conn) => sqlx::query_scalar(sql).fetch_all(conn).await,
            Stored::Postgres(conn) => sqlx::query_scalar(sql).fetch_all(conn).await,
        }
        .expect("read")
    }
}

pub async fn count_rows(server: &TestServer, table: &str) -> i64 {
    count(server, &format!("SELECT COUNT(*) FROM {table}")).await
}

/// The number a `SELECT COUNT(*)` query gives on the server's database.
pub async fn count(server: &TestServer, sql: &str) -> i64 {
    Stored::open(server).await.count(sql).await
}

/// Runs `sql` on the server's database by hand, as an attacker with access to it would;
/// returns how many rows it changed.
pub async fn tamper(server: &TestServer, sql: &str) -> u64 {
    server.tamper(sql).await
}

/// Everything a refused call must leave alone: every approval as stored, and the number of
/// events and grants.
pub async fn stored_state(server: &TestServer) -> (Vec<String>, i64, i64) {
    let mut stored = Stored::open(server).await;
    (
        stored.texts("SELECT body FROM approvals ORDER BY id").await,
        stored.count("SELECT COUNT(*) FROM events").await,
        stored.count("SELECT COUNT(*) FROM grants").await,
    )
}

/// Every event of the history matching `filter`, through all its pages of `page_size`.
pub async fn all_events(
    admin: &mut AdminClient,
    mut filter: pb::ListEventsRequest,
) -> Vec<pb::AuditEvent> {
    let mut events = Vec::new();
    loop {
        let page = admin
            .list_events(filter.clone())
            .await
            .expect("list events")
            .into_inner();
        events.extend(page.events);
        if page.next_page_token.is_empty() {
            return events;
        }
        filter.page_token = page.next_page_token;
    }
}

pub fn event_kind(event: &pb::AuditEvent) -> pb::EventKind {
    kind(event.event.as_ref().expect("event"))
}

pub async fn verify(admin: &mut AdminClient) -> pb::VerifyAuditResponse {
    admin
        .verify_audit(pb::VerifyAuditRequest {})
        .await
        .expect("verify audit")
        .into_inner()
}

pub const SECOND: Duration = Duration::from_secs(1);
pub const PATIENCE: Duration = Duration::from_secs(10);
