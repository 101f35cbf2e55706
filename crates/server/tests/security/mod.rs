//! Security through gRPC over a real socket: tokens with roles and scopes on every RPC, the
//! loopback rule, TLS, and the approver registry on Decide.

mod approvers;
use crate::common;
mod tokens;
mod transport;

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::{Config, Role, TokenConfig};
use countersign_testkit::server::{token, TestCertificates, TestServer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

const CODER: &str = "coder-token-0123456789";
const OTHER_AGENT: &str = "other-agent-token-0123456789";
const TELEGRAM_WORKER: &str = "telegram-worker-token-0123456789";
const GITHUB_WORKER: &str = "github-worker-token-0123456789";
const ROOT: &str = "root-token-0123456789";

fn tokens() -> Vec<TokenConfig> {
    vec![
        token("coder", Role::Agent, &["agent-a"], CODER),
        token("other-agent", Role::Agent, &["agent-b"], OTHER_AGENT),
        token(
            "telegram-worker",
            Role::Worker,
            &["telegram"],
            TELEGRAM_WORKER,
        ),
        token("github-worker", Role::Worker, &["github"], GITHUB_WORKER),
        token("root", Role::Admin, &[], ROOT),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Rpc {
    RequestApproval,
    GetApproval,
    WaitForDecision,
    ListApprovals,
    CancelApproval,
    Consume,
    WatchApprovals,
    Decide,
    RecordDelivery,
    ListEvents,
    VerifyAudit,
    ListGrants,
    RevokeGrant,
    CreateDelegation,
    ListDelegations,
    RevokeDelegation,
    ListApprovers,
}

/// The tokens that may not make `rpc` on approval `id`: for their role, and for their scope
/// (agent id or channel).
fn refused_tokens(rpc: Rpc) -> (Vec<&'static str>, Vec<&'static str>) {
    use Rpc::*;
    match rpc {
        RequestApproval | WaitForDecision | CancelApproval | Consume => {
            (vec![TELEGRAM_WORKER], vec![OTHER_AGENT])
        }
        GetApproval | ListApprovals => (vec![], vec![OTHER_AGENT, GITHUB_WORKER]),
        WatchApprovals | Decide | RecordDelivery => (vec![CODER], vec![GITHUB_WORKER]),
        ListEvents | VerifyAudit | ListGrants | RevokeGrant | CreateDelegation
        | ListDelegations | RevokeDelegation | ListApprovers => {
            (vec![CODER, TELEGRAM_WORKER], vec![])
        }
    }
}

/// Makes `rpc` about approval `id` (agent-a, routed to telegram) with `token`.
async fn call(
    channel: &tonic::transport::Channel,
    rpc: Rpc,
    id: &str,
    token: Option<&str>,
) -> Result<(), Status> {
    let mut client = with_token(channel, token);
    let mut admin = admin(channel, token);
    let approval_id = id.to_string();
    match rpc {
        Rpc::RequestApproval => {
            let mut req = request("agent-a", "call-refused");
            req.routes = vec![pb::Route {
                channel: "telegram".into(),
                target: String::new(),
            }];
            client.request_approval(req).await.map(drop)
        }
        Rpc::GetApproval => client
            .get_approval(pb::GetApprovalRequest { approval_id })
            .await
            .map(drop),
        Rpc::WaitForDecision => client
            .wait_for_decision(pb::WaitForDecisionRequest {
                approval_id,
                timeout_ms: 1,
            })
            .await
            .map(drop),
        Rpc::ListApprovals => {
            // Each token asks for what it is bound to, or for what it wants to see.
            let (agent_id, channel) = match token {
                Some(OTHER_AGENT) => ("agent-a", ""),
                Some(GITHUB_WORKER) => ("", "telegram"),
                _ => ("", ""),
            };
            client
                .list_approvals(pb::ListApprovalsRequest {
                    agent_id: agent_id.into(),
                    channel: channel.into(),
                    ..Default::default()
                })
                .await
                .map(drop)
        }
        Rpc::CancelApproval => client
            .cancel_approval(pb::CancelApprovalRequest {
                approval_id,
                reason: "no".into(),
            })
            .await
            .map(drop),
        Rpc::Consume => client
            .consume(pb::ConsumeRequest {
                approval_id,
                outcome: pb::ConsumeOutcome::Succeeded as i32,
                detail: String::new(),
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::WatchApprovals => client
            .watch_approvals(pb::WatchApprovalsRequest {
                channel: "telegram".into(),
                include_snapshot: true,
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::Decide => {
            let mut req = decide(&approval_id, pb::Verdict::Approve, "42", "refused-decision");
            if token == Some(GITHUB_WORKER) {
                // Its own channel, on an approval routed elsewhere.
                req.decider.as_mut().unwrap().channel = "github".into();
            }
            client.decide(req).await.map(drop)
        }
        Rpc::RecordDelivery => client
            .record_delivery(pb::RecordDeliveryRequest {
                approval_id,
                channel: if token == Some(GITHUB_WORKER) {
                    "github".into()
                } else {
                    "telegram".into()
                },
                target: "t".into(),
                message_ref: "m".into(),
            })
            .await
            .map(drop),
        Rpc::ListEvents => admin
            .list_events(pb::ListEventsRequest::default())
            .await
            .map(drop),
        Rpc::VerifyAudit => admin
            .verify_audit(pb::VerifyAuditRequest {})
            .await
            .map(drop),
        Rpc::ListGrants => admin
            .list_grants(pb::ListGrantsRequest::default())
            .await
            .map(drop),
        Rpc::RevokeGrant => admin
            .revoke_grant(pb::RevokeGrantRequest {
                grant_id: "no-such-grant".into(),
                reason: String::new(),
            })
            .await
            .map(drop),
        // Names no configured approver: past authorization it is refused as invalid, so
        // nothing is stored whoever calls.
        Rpc::CreateDelegation => admin
            .create_delegation(pb::CreateDelegationRequest {
                delegator: "nobody".into(),
                delegate: "nobody-else".into(),
                until: None,
                reason: String::new(),
            })
            .await
            .map(drop),
        Rpc::ListDelegations => admin
            .list_delegations(pb::ListDelegationsRequest::default())
            .await
            .map(drop),
        Rpc::RevokeDelegation => admin
            .revoke_delegation(pb::RevokeDelegationRequest {
                delegation_id: "no-such-delegation".into(),
            })
            .await
            .map(drop),
        Rpc::ListApprovers => admin
            .list_approvers(pb::ListApproversRequest {})
            .await
            .map(drop),
    }
}

/// A token that may make `rpc` on approval `id`.
fn allowed_token(rpc: Rpc) -> &'static str {
    use Rpc::*;
    match rpc {
        RequestApproval | GetApproval | WaitForDecision | ListApprovals | CancelApproval
        | Consume => CODER,
        WatchApprovals | Decide | RecordDelivery => TELEGRAM_WORKER,
        ListEvents | VerifyAudit | ListGrants | RevokeGrant | CreateDelegation
        | ListDelegations | RevokeDelegation | ListApprovers => ROOT,
    }
}

const ALL_RPCS: [Rpc; 17] = [
    Rpc::RequestApproval,
    Rpc::GetApproval,
    Rpc::WaitForDecision,
    Rpc::ListApprovals,
    Rpc::CancelApproval,
    Rpc::Consume,
    Rpc::WatchApprovals,
    Rpc::Decide,
    Rpc::RecordDelivery,
    Rpc::ListEvents,
    Rpc::VerifyAudit,
    Rpc::ListGrants,
    Rpc::RevokeGrant,
    Rpc::CreateDelegation,
    Rpc::ListDelegations,
    Rpc::RevokeDelegation,
    Rpc::ListApprovers,
];

const APPROVERS: &str = r#"
[[approvers]]
id = "alice"
name = "Alice"
max_risk = "critical"
identities = { telegram = ["1001"], github = ["alice-gh"] }

[[approvers]]
id = "bob"
name = "Bob"
max_risk = "medium"
identities = { telegram = ["2002"], cli = ["bob"] }

[[rules]]
name = "self-service"
action = "require"
separation_of_duties = false
[rules.match]
tool = "self-service.*"
"#;

async fn registry_server() -> TestServer {
    TestServer::start_with(|c| {
        let parsed = Config::parse(APPROVERS).unwrap();
        c.approvers = parsed.approvers;
        c.rules = parsed.rules;
    })
    .await
}

fn decision(id: &str, channel: &str, user_id: &str, login: &str, key: &str) -> pb::DecideRequest {
    let mut req = decide(id, pb::Verdict::Approve, user_id, key);
    req.decider = Some(pb::Decider {
        channel: channel.into(),
        user_id: user_id.into(),
        display_name: login.into(),
    });
    req
}

async fn refused_decisions(admin: &mut AdminClient, approval_id: &str) -> Vec<pb::AuditEvent> {
    all_events(
        admin,
        pb::ListEventsRequest {
            approval_id: approval_id.into(),
            kinds: vec![pb::EventKind::DecisionRefused as i32],
            ..Default::default()
        },
    )
    .await
}
