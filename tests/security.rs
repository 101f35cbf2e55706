//! Security through gRPC over a real socket: tokens with roles and scopes on every RPC, the
//! loopback rule, TLS, and the approver registry on Decide.

mod common;

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

#[tokio::test]
async fn every_rpc_refuses_missing_unknown_wrong_role_and_out_of_scope_tokens_and_changes_nothing()
{
    let server = TestServer::start_with(|c| c.tokens = tokens()).await;
    let channel = channel(&server).await;
    let mut req = request("agent-a", "call-1");
    req.routes = vec![pb::Route {
        channel: "telegram".into(),
        target: String::new(),
    }];
    let approval = with_token(&channel, Some(CODER))
        .request_approval(req)
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    let before = stored_state(&server).await;

    for rpc in ALL_RPCS {
        for (token, expected) in [
            (None, Code::Unauthenticated),
            (Some("not-a-configured-token-42"), Code::Unauthenticated),
        ] {
            let status = call(&channel, rpc, &approval.id, token).await.unwrap_err();
            assert_eq!(
                status.code(),
                expected,
                "{rpc:?} with {token:?}: {status:?}"
            );
        }
        let (wrong_role, out_of_scope) = refused_tokens(rpc);
        for token in wrong_role.into_iter().chain(out_of_scope) {
            let status = call(&channel, rpc, &approval.id, Some(token))
                .await
                .unwrap_err();
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{rpc:?} with {token}: {status:?}"
            );
        }
    }
    assert_eq!(
        stored_state(&server).await,
        before,
        "a refused call changed something"
    );

    // The same calls with the right tokens get past authorization.
    for rpc in ALL_RPCS {
        if let Err(status) = call(&channel, rpc, &approval.id, Some(allowed_token(rpc))).await {
            assert!(
                !matches!(
                    status.code(),
                    Code::Unauthenticated | Code::PermissionDenied
                ),
                "{rpc:?} with its own token: {status:?}"
            );
        }
    }
    // An admin token may do what agents and workers do.
    assert!(call(&channel, Rpc::GetApproval, &approval.id, Some(ROOT))
        .await
        .is_ok());
}

#[tokio::test]
async fn health_and_reflection_stay_open_when_tokens_are_required() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start_with(|c| c.tokens = tokens()).await;
    let channel = channel(&server).await;
    for service in [
        "countersign.v1.ApprovalService",
        "countersign.v1.AdminService",
    ] {
        let answer = HealthClient::new(channel.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status, ServingStatus::Serving as i32, "{service}");
    }
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"countersign.v1.AdminService".to_string()),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_token_may_come_from_an_environment_variable() {
    const VARIABLE: &str = "COUNTERSIGN_TEST_SECURITY_ENV_TOKEN";
    const SECRET: &str = "env-secret-token-0123456789";
    std::env::set_var(VARIABLE, SECRET);
    let server = TestServer::start_with(|c| {
        c.tokens = vec![TokenConfig {
            name: "from-env".into(),
            role: Role::Agent,
            agents: vec!["*".into()],
            channels: Vec::new(),
            value_env: Some(VARIABLE.into()),
            sha256: None,
        }]
    })
    .await;
    let channel = channel(&server).await;
    let created = with_token(&channel, Some(SECRET))
        .request_approval(request("any-agent", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    let refused = with_token(&channel, Some(VARIABLE))
        .request_approval(request("any-agent", "call-2"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn a_non_loopback_address_needs_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let open = Config {
        database: dir.path().join("open.db"),
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = tokio::time::timeout(
        PATIENCE,
        countersign_server::serve(open, listener, std::future::pending()),
    )
    .await
    .expect("the server refuses to start instead of serving");
    let error = refused.unwrap_err().to_string();
    assert!(error.contains("without tokens"), "{error}");
    assert!(
        !dir.path().join("open.db").exists(),
        "refused before opening the database"
    );

    // With tokens it serves on any address.
    let guarded = Config {
        database: dir.path().join("guarded.db"),
        tokens: tokens(),
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(countersign_server::serve(guarded, listener, async {
        let _ = stopped.await;
    }));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let created = with_token(&channel, Some(CODER))
        .request_approval(request("agent-a", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn tls_clients_with_the_ca_connect_and_plaintext_clients_fail() {
    let certificates = TestCertificates::generate();
    let server = TestServer::start_with(|c| c.tls = Some(certificates.tls_config())).await;

    let trusted = Endpoint::from_shared(server.https_url())
        .unwrap()
        .tls_config(
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&certificates.ca_pem)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let created = with_token(&trusted, None)
        .request_approval(request("agent-a", "tls-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);

    let plaintext = Endpoint::from_shared(server.url()).unwrap().connect().await;
    let refused = match plaintext {
        Err(_) => true,
        Ok(channel) => with_token(&channel, None)
            .request_approval(request("agent-a", "tls-2"))
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext client got an answer");

    let untrusting = Endpoint::from_shared(server.https_url())
        .unwrap()
        .tls_config(ClientTlsConfig::new())
        .unwrap()
        .connect()
        .await;
    assert!(untrusting.is_err(), "a client without the CA connected");
    assert_eq!(count_rows(&server, "approvals").await, 1);
}

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
