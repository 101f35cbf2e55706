//! Policy through gRPC over a real socket: ordered rules, session grants, and the limits on
//! what an agent may ask for.

use crate::common;

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::Config;
use countersign_testkit::server::TestServer;
use tonic::Code;

const RULES: &str = r#"
[[rules]]
name = "no-table-drops"
action = "deny"
reason = "dropping tables is never allowed"
[rules.match]
tool = "sql.*"
arguments = [{ pointer = "/query", regex = "(?i)\\bdrop\\s+table\\b" }]

[[rules]]
name = "prod-deploys"
action = "require"
risk = "critical"
ttl_seconds = 600
required_approvals = 2
routes = [{ channel = "github", target = "acme/ops#1" }]
[rules.match]
tool = "deploy"
arguments = [{ pointer = "/target/env", glob = "prod*" }]

[[rules]]
name = "auto-approve-low"
action = "allow"
[rules.match]
risk = ["low"]

[[rules]]
name = "never-reached"
action = "deny"
[rules.match]
risk = ["low"]
"#;

async fn policy_server() -> TestServer {
    TestServer::start_with(|c| c.rules = Config::parse(RULES).unwrap().rules).await
}

fn call(key: &str, tool: &str, arguments: &str, risk: pb::Risk) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        risk: risk as i32,
        ..request("agent-a", key)
    }
}

fn resolution(approval: &pb::Approval) -> (pb::ApprovalState, String, pb::ResolvedBy) {
    let resolution = approval.resolution.clone().unwrap_or_default();
    let resolved_by = resolution.resolved_by();
    (state(approval), resolution.rule, resolved_by)
}

#[tokio::test]
async fn rules_allow_deny_or_require_and_the_first_match_wins() {
    let server = policy_server().await;
    let mut agent = connect(&server).await;

    // Glob on the tool and a regex on an argument: denied at once, naming the rule, although
    // the low risk would also match the allow rule further down.
    let drop = create(
        &mut agent,
        call(
            "c1",
            "sql.query",
            r#"{"query":"DROP TABLE users"}"#,
            pb::Risk::Low,
        ),
    )
    .await;
    assert_eq!(
        resolution(&drop),
        (
            pb::ApprovalState::Rejected,
            "no-table-drops".into(),
            pb::ResolvedBy::Rule
        )
    );
    assert_eq!(
        drop.resolution.as_ref().unwrap().reason,
        "dropping tables is never allowed"
    );
    assert_eq!(drop.policy_rule, "no-table-drops");

    // The same tool with a harmless argument falls through to the allow rule; the tool glob
    // does not match a tool that merely starts alike.
    for (key, tool) in [("c2", "sql.query"), ("c3", "sqlite")] {
        let query = if tool == "sqlite" {
            r#"{"query":"drop table users"}"#
        } else {
            r#"{"query":"select 1"}"#
        };
        let allowed = create(&mut agent, call(key, tool, query, pb::Risk::Low)).await;
        assert_eq!(
            resolution(&allowed),
            (
                pb::ApprovalState::Approved,
                "auto-approve-low".into(),
                pb::ResolvedBy::Rule
            ),
            "{tool} {query}"
        );
    }

    // A pointer into nested arguments and a glob on its value: require, shaped by the rule.
    let prod = create(
        &mut agent,
        call(
            "c4",
            "deploy",
            r#"{"target":{"env":"production"}}"#,
            pb::Risk::Low,
        ),
    )
    .await;
    assert_eq!(state(&prod), pb::ApprovalState::Pending);
    assert_eq!(prod.policy_rule, "prod-deploys");
    assert_eq!(prod.risk, pb::Risk::Critical as i32);
    assert_eq!(prod.required_approvals, 2);
    assert_eq!(
        prod.routes,
        [pb::Route {
            channel: "github".into(),
            target: "acme/ops#1".into()
        }]
    );
    let ttl = prod.expires_at.unwrap().seconds - prod.created_at.unwrap().seconds;
    assert_eq!(ttl, 600);

    let staging = create(
        &mut agent,
        call(
            "c5",
            "deploy",
            r#"{"target":{"env":"staging"}}"#,
            pb::Risk::Low,
        ),
    )
    .await;
    assert_eq!(resolution(&staging).1, "auto-approve-low");

    // The risk match: the allow rule takes only low risk; no match leaves it to a human.
    let medium = create(&mut agent, call("c6", "bash", "{}", pb::Risk::Medium)).await;
    assert_eq!(state(&medium), pb::ApprovalState::Pending);
    assert_eq!(medium.policy_rule, "");
    assert!(medium.resolution.is_none());

    // Decided by policy is on the audit trail as requested, then resolved.
    let mut audit = admin(&channel(&server).await, None);
    let kinds: Vec<pb::EventKind> = all_events(
        &mut audit,
        pb::ListEventsRequest {
            approval_id: drop.id.clone(),
            ..Default::default()
        },
    )
    .await
    .iter()
    .map(event_kind)
    .collect();
    assert_eq!(kinds, [pb::EventKind::Requested, pb::EventKind::Resolved]);
}

#[tokio::test]
async fn a_malformed_rule_stops_the_server_with_a_message_naming_it() {
    let cases = [
        ("bad-glob", "[rules.match]\ntool = \"deploy[\"", "glob"),
        (
            "bad-regex",
            "[rules.match]\narguments = [{ pointer = \"/q\", regex = \"(unclosed\" }]",
            "regex",
        ),
        (
            "bad-pointer",
            "[rules.match]\narguments = [{ pointer = \"q\", glob = \"*\" }]",
            "pointer",
        ),
        ("bad-risk", "[rules.match]\nrisk = [\"severe\"]", "risk"),
    ];
    for (name, body, problem) in cases {
        let text = format!(
            "[[rules]]\nname = \"fine\"\naction = \"allow\"\n\n[[rules]]\nname = \"{name}\"\naction = \"deny\"\n{body}\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            database: dir.path().join("countersign.db"),
            ..Config::parse(&text).unwrap()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let outcome = tokio::time::timeout(
            PATIENCE,
            countersign_server::serve(config, listener, std::future::pending()),
        )
        .await
        .expect("the server refuses to start");
        let error = outcome.unwrap_err().to_string();
        assert!(
            error.contains(&format!("rule \"{name}\" (rules[1])")),
            "{name}: {error}"
        );
        assert!(error.contains(problem), "{name}: {error}");
    }
    let unknown_action =
        Config::parse("[[rules]]\nname = \"maybe\"\naction = \"perhaps\"\n").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = countersign_server::serve(unknown_action, listener, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("rule \"maybe\" (rules[0])"), "{error}");
}

/// Approves `approval` for the whole session (no registry: any decider counts).
async fn approve_for_session(client: &mut Client, approval: &pb::Approval) {
    let mut req = decide(&approval.id, pb::Verdict::Approve, "42", "session-ok");
    req.scope = pb::Scope::Session as i32;
    let decided = client.decide(req).await.unwrap().into_inner();
    assert_eq!(decided.outcome, pb::DecideOutcome::Resolved as i32);
}

async fn active_grants(admin: &mut AdminClient) -> Vec<pb::Grant> {
    admin
        .list_grants(pb::ListGrantsRequest {
            agent_id: "agent-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .grants
}

#[tokio::test]
async fn a_revoked_grant_stops_approving_at_once() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    let first = create(&mut client, request("agent-a", "call-1")).await;
    approve_for_session(&mut client, &first).await;

    let granted = create(&mut client, request("agent-a", "call-2")).await;
    assert_eq!(state(&granted), pb::ApprovalState::Approved);
    let resolution = granted.resolution.unwrap();
    assert_eq!(resolution.resolved_by, pb::ResolvedBy::Grant as i32);
    let grants = active_grants(&mut admin).await;
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].id, resolution.grant_id);
    assert_eq!(grants[0].approval_id, first.id);
    assert!(grants[0].active);

    let revoked = admin
        .revoke_grant(pb::RevokeGrantRequest {
            grant_id: grants[0].id.clone(),
            reason: "session looked odd".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!revoked.active);
    assert!(revoked.revoked_at.is_some());

    let after = create(&mut client, request("agent-a", "call-3")).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert!(active_grants(&mut admin).await.is_empty());
    let all = admin
        .list_grants(pb::ListGrantsRequest {
            include_inactive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .grants;
    assert_eq!(all.len(), 1);

    let revocations = all_events(
        &mut admin,
        pb::ListEventsRequest {
            kinds: vec![pb::EventKind::GrantRevoked as i32],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(revocations.len(), 1);
    assert!(revocations[0].detail.contains(&grants[0].id));
    assert!(revocations[0].detail.contains("session looked odd"));
}

#[tokio::test]
async fn an_expired_grant_stops_approving() {
    let server = TestServer::start_with(|c| c.grants.ttl_seconds = 1).await;
    let mut client = connect(&server).await;
    let mut admin = admin(&channel(&server).await, None);
    let first = create(&mut client, request("agent-a", "call-1")).await;
    approve_for_session(&mut client, &first).await;
    let grant = active_grants(&mut admin).await.remove(0);
    let expires_at = grant.expires_at.expect("the grant carries its TTL");
    assert_eq!(expires_at.seconds - grant.created_at.unwrap().seconds, 1);

    let granted = create(&mut client, request("agent-a", "call-2")).await;
    assert_eq!(state(&granted), pb::ApprovalState::Approved);

    // Wait out the grant's TTL.
    let expiry = std::time::UNIX_EPOCH
        + std::time::Duration::new(expires_at.seconds as u64, expires_at.nanos as u32);
    if let Ok(left) = expiry.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left + std::time::Duration::from_millis(20)).await;
    }
    let after = create(&mut client, request("agent-a", "call-3")).await;
    assert_eq!(state(&after), pb::ApprovalState::Pending);
    assert!(active_grants(&mut admin).await.is_empty());
}

#[tokio::test]
async fn the_request_rate_is_limited_per_agent_and_refusals_store_nothing() {
    let server = TestServer::start_with(|c| c.limits.requests_per_minute = 2).await;
    let mut client = connect(&server).await;
    create(&mut client, request("agent-a", "call-1")).await;
    create(&mut client, request("agent-a", "call-2")).await;
    let before = stored_state(&server).await;

    let refused = client
        .request_approval(request("agent-a", "call-3"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("requests_per_minute"),
        "{refused:?}"
    );
    assert!(refused.message().contains("retry in"), "{refused:?}");
    assert!(refused.metadata().get("retry-after-ms").is_some());
    assert_eq!(stored_state(&server).await, before);

    create(&mut client, request("agent-b", "call-1")).await;
}

/// The per-agent limit is for calls that ask a person: calls a rule allows or denies do not
/// count against it (issue 43: every Claude Code session on a machine shares one agent id).
#[tokio::test]
async fn calls_a_rule_decides_do_not_count_against_the_agent_s_rate() {
    let server = TestServer::start_with(|c| {
        c.rules = Config::parse(RULES).unwrap().rules;
        c.limits.requests_per_minute = 2;
        // The per-token limit (default ten times the per-agent one) still counts every call.
        c.limits.requests_per_minute_per_token = Some(1000);
    })
    .await;
    let mut agent = connect(&server).await;
    for n in 0..20 {
        let allowed = create(
            &mut agent,
            call(
                &format!("low-{n}"),
                "read",
                r#"{"path":"a"}"#,
                pb::Risk::Low,
            ),
        )
        .await;
        assert_eq!(state(&allowed), pb::ApprovalState::Approved);
        let denied = create(
            &mut agent,
            call(
                &format!("drop-{n}"),
                "sql.query",
                r#"{"query":"drop table t"}"#,
                pb::Risk::Low,
            ),
        )
        .await;
        assert_eq!(state(&denied), pb::ApprovalState::Rejected);
    }
    // The two calls a person must see still fit; the third is over the limit.
    for key in ["human-1", "human-2"] {
        let asked = create(
            &mut agent,
            call(key, "deploy", r#"{"target":{"env":"dev"}}"#, pb::Risk::High),
        )
        .await;
        assert_eq!(state(&asked), pb::ApprovalState::Pending);
    }
    let refused = agent
        .request_approval(call(
            "human-3",
            "deploy",
            r#"{"target":{"env":"dev"}}"#,
            pb::Risk::High,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
}

#[tokio::test]
async fn max_pending_per_agent_refuses_more_and_stores_nothing() {
    let server = TestServer::start_with(|c| c.limits.max_pending_per_agent = 2).await;
    let mut client = connect(&server).await;
    let first = create(&mut client, request("agent-a", "call-1")).await;
    create(&mut client, request("agent-a", "call-2")).await;
    let before = stored_state(&server).await;

    let refused = client
        .request_approval(request("agent-a", "call-3"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_pending_per_agent"),
        "{refused:?}"
    );
    assert!(refused.message().contains("retry"), "{refused:?}");
    assert_eq!(stored_state(&server).await, before);

    // A repeat of a stored request is no new approval; another agent has its own limit.
    let repeat = client
        .request_approval(request("agent-a", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(!repeat.created);
    create(&mut client, request("agent-b", "call-1")).await;

    client
        .cancel_approval(pb::CancelApprovalRequest {
            approval_id: first.id,
            reason: String::new(),
        })
        .await
        .unwrap();
    create(&mut client, request("agent-a", "call-3")).await;
}

#[tokio::test]
async fn a_request_over_the_message_size_cap_is_refused_with_resource_exhausted() {
    let server = TestServer::start_with(|c| c.limits.max_message_bytes = 4096).await;
    let mut client = connect(&server).await;
    let mut big = request("agent-a", "call-1");
    big.arguments_json = format!(r#"{{"blob":"{}"}}"#, "x".repeat(8192));
    let refused = client.request_approval(big).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("limits.max_message_bytes"),
        "{refused:?}"
    );
    assert_eq!(count_rows(&server, "approvals").await, 0);
    create(&mut client, request("agent-a", "call-2")).await;
}
