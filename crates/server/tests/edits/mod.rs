//! Edit-on-approve through gRPC over a real socket: an approver approves edited arguments,
//! policy is evaluated again on them, the quorum counts one version, the waiting runtime gets
//! the edited arguments and the audit trail keeps both versions.

use crate::common;
mod policy;
mod trail;
mod versions;

use std::time::Duration;

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::Config;
use countersign_testkit::server::TestServer;
use tonic::Code;

const CONFIG: &str = r#"
[[approvers]]
id = "alice"
name = "Alice"
max_risk = "critical"
identities = { telegram = ["1001"] }

[[approvers]]
id = "bob"
name = "Bob"
max_risk = "medium"
identities = { telegram = ["2002"] }

[[approvers]]
id = "carol"
name = "Carol"
max_risk = "critical"
identities = { telegram = ["3003"] }

[[rules]]
name = "production-is-critical"
action = "classify"
risk = "critical"
[rules.match]
arguments = [{ pointer = "/cwd", glob = "/prod*" }]

[[rules]]
name = "never-wipe-root"
action = "deny"
reason = "wiping / is never allowed"
[rules.match]
tool = "bash"
arguments = [{ pointer = "/command", regex = "rm -rf /\\s*$" }]

[[rules]]
name = "self-service-dev"
action = "require"
separation_of_duties = false
[rules.match]
tool = "selfserve"
arguments = [{ pointer = "/env", glob = "dev*" }]

[[rules]]
name = "prod-deploys"
action = "require"
required_approvals = 2
[rules.match]
tool = "deploy"
arguments = [{ pointer = "/env", glob = "prod*" }]
"#;

async fn edit_server() -> TestServer {
    server_redacting(false).await
}

/// The server of these tests, with `storage.redact_arguments` as `redact`.
async fn server_redacting(redact: bool) -> TestServer {
    TestServer::start_with(|c| {
        let parsed = Config::parse(CONFIG).unwrap();
        c.approvers = parsed.approvers;
        c.rules = parsed.rules;
        c.storage.redact_arguments = redact;
    })
    .await
}

async fn consume(client: &mut Client, id: &str) -> pb::Approval {
    client
        .consume(pb::ConsumeRequest {
            approval_id: id.into(),
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            detail: String::new(),
            ..Default::default()
        })
        .await
        .expect("consume")
        .into_inner()
}

async fn verify(server: &TestServer) -> pb::VerifyAuditResponse {
    admin(&channel(server).await, None)
        .verify_audit(pb::VerifyAuditRequest {})
        .await
        .expect("verify")
        .into_inner()
}

fn call(key: &str, tool: &str, arguments: &str, required: u32) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        requester: "dave".into(),
        risk: pb::Risk::Medium as i32,
        required_approvals: required,
        ..request("agent-e", key)
    }
}

/// An approval by `user` (a Telegram id of the registry above) of the version `expected`
/// (empty: none named), with `edit` (empty: none).
fn approve(id: &str, user: &str, key: &str, expected: &str, edit: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        edited_arguments_json: edit.into(),
        expected_args_digest: expected.into(),
        ..decide(id, pb::Verdict::Approve, user, key)
    }
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

fn digest_of(json: &str) -> String {
    countersign_core::digest::args_digest(&serde_json::from_str(json).unwrap())
}

async fn refused(client: &mut Client, request: pb::DecideRequest) -> tonic::Status {
    client
        .decide(request)
        .await
        .expect_err("the decision is refused")
}

/// Groups for the test below, beside the approvers and rules of [`CONFIG`].
const GROUPS: &str = r#"
[[groups]]
name = "dev"
members = ["alice", "carol"]

[[groups]]
name = "ops"
members = ["carol"]

[[rules]]
name = "production-releases-need-ops"
action = "require"
approver_groups = [{ group = "ops", required = 1 }]
[rules.match]
tool = "release"
arguments = [{ pointer = "/target", glob = "prod*" }]
"#;
