//! Observe mode (`[policy] mode = "observe"`) through gRPC over a real socket, on SQLite and
//! (with `COUNTERSIGN_TEST_BACKEND=postgres`) on PostgreSQL: the rules are evaluated and what
//! they would have decided is on the approval, the audit trail and `/metrics`, while every
//! call is asked as if there were no rules.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::{Config, PolicyMode};
use countersign_testkit::http::{self, sample};
use countersign_testkit::server::TestServer;

const RULES: &str = r#"
[[rules]]
name = "no-table-drops"
action = "deny"
[rules.match]
tool = "sql.*"
arguments = [{ pointer = "/query", regex = "(?i)\\bdrop\\s+table\\b" }]

[[rules]]
name = "prod-deploys"
action = "require"
required_approvals = 2
[rules.match]
tool = "deploy"

[[rules]]
name = "reads"
action = "allow"
[rules.match]
tool = "read"
"#;

fn call(key: &str, tool: &str, arguments: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        ..request("agent-a", key)
    }
}

fn observed(approval: &pb::Approval) -> (Option<&str>, Option<&str>) {
    (
        approval.labels.get("policy.observed").map(String::as_str),
        approval
            .labels
            .get("policy.observed_rule")
            .map(String::as_str),
    )
}

/// Scrapes `/metrics` until every expected sample has its value (the counts follow the event
/// log a moment after the calls return).
async fn scrape_until(addr: std::net::SocketAddr, expected: &[(&str, f64)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = http::get(addr, "/metrics").await.unwrap().body;
        let missing: Vec<_> = expected
            .iter()
            .filter(|(series, want)| sample(&text, series) != Some(*want))
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still not as expected: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn observed_rules_are_recorded_and_counted_but_every_call_is_asked() {
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let server = TestServer::start_with(|c| {
        c.rules = Config::parse(RULES).unwrap().rules;
        c.policy.mode = PolicyMode::Observe;
        c.metrics.listen = Some(metrics_addr);
    })
    .await;
    let mut agent = connect(&server).await;

    let read = create(&mut agent, call("read-1", "read", r#"{"path":"a"}"#)).await;
    let drop = create(
        &mut agent,
        call("drop-1", "sql.query", r#"{"query":"DROP TABLE users"}"#),
    )
    .await;
    let deploy = create(&mut agent, call("deploy-1", "deploy", r#"{"env":"prod"}"#)).await;
    let other = create(&mut agent, call("other-1", "bash", r#"{"command":"make"}"#)).await;
    // An agent cannot write what the rules would have done: labels under `policy.` are the
    // server's, and a request naming one is refused, nothing stored.
    refuses_policy_labels(&mut agent).await;
    let spoofed = create(&mut agent, call("read-2", "read", r#"{"path":"b"}"#)).await;

    for approval in [&read, &drop, &deploy, &other, &spoofed] {
        assert_eq!(state(approval), pb::ApprovalState::Pending, "{approval:?}");
        assert!(approval.resolution.is_none(), "{approval:?}");
    }
    assert_eq!(observed(&read), (Some("allow"), Some("reads")));
    assert_eq!(observed(&spoofed), (Some("allow"), Some("reads")));
    assert_eq!(observed(&drop), (Some("deny"), Some("no-table-drops")));
    assert_eq!(observed(&deploy), (Some("require"), Some("prod-deploys")));
    assert_eq!(observed(&other), (Some("none"), None));
    // A require rule does not shape the call either: asked as without rules.
    assert_eq!(deploy.required_approvals, 1);

    // People decide: against the rules twice, with them once.
    for (approval, verdict) in [
        (&read, pb::Verdict::Reject),
        (&drop, pb::Verdict::Approve),
        (&spoofed, pb::Verdict::Approve),
    ] {
        agent
            .decide(decide(&approval.id, verdict, "bob", &approval.id))
            .await
            .expect("decide");
    }

    // The audit trail holds what the rules would have done.
    let mut admin = admin(&channel(&server).await, None);
    let events = all_events(&mut admin, pb::ListEventsRequest::default()).await;
    let requested = events
        .iter()
        .filter(|event| event_kind(event) == pb::EventKind::Requested)
        .filter_map(|event| event.event.as_ref()?.approval.as_ref())
        .find(|approval| approval.id == drop.id)
        .expect("the drop's requested event");
    assert_eq!(observed(requested), (Some("deny"), Some("no-table-drops")));

    scrape_until(
        metrics_addr,
        &[
            ("countersign_policy_observed_total{decision=\"allow\"}", 2.0),
            ("countersign_policy_observed_total{decision=\"deny\"}", 1.0),
            (
                "countersign_policy_observed_total{decision=\"require\"}",
                1.0,
            ),
            ("countersign_policy_observed_total{decision=\"none\"}", 1.0),
            (
                "countersign_policy_observed_disagreements_total{decision=\"allow\"}",
                1.0,
            ),
            (
                "countersign_policy_observed_disagreements_total{decision=\"deny\"}",
                1.0,
            ),
            ("countersign_requests_total{outcome=\"pending\"}", 5.0),
        ],
    )
    .await;
}

#[tokio::test]
async fn enforced_rules_record_nothing_observed() {
    let server = TestServer::start_with(|c| c.rules = Config::parse(RULES).unwrap().rules).await;
    let mut agent = connect(&server).await;
    let read = create(&mut agent, call("read-1", "read", r#"{"path":"a"}"#)).await;
    assert_eq!(state(&read), pb::ApprovalState::Approved);
    assert_eq!(observed(&read), (None, None));
    // Nor can an agent write them itself, which the report and /metrics would count.
    refuses_policy_labels(&mut agent).await;
}

/// A request carrying `policy.observed` or `policy.observed_rule` is refused, naming the key.
async fn refuses_policy_labels(agent: &mut Client) {
    for key in ["policy.observed", "policy.observed_rule"] {
        let mut spoofed = call(&format!("spoof-{key}"), "read", r#"{"path":"b"}"#);
        spoofed.labels.insert(key.into(), "allow".into());
        let refused = agent
            .request_approval(spoofed)
            .await
            .expect_err("a policy. label is refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(key), "{refused:?}");
    }
}
