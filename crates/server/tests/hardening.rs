//! Issue #16 through gRPC over a real socket: one meaning per argument, identifiers that
//! cannot be spoofed, computed risk and scoped grants, rate limits per token and decider, and
//! an audit trail whose ends and approvals cannot be edited unseen.

use crate::common;

use common::*;
use countersign_proto::v1 as pb;
use countersign_server::config::Config;
use countersign_testkit::server::TestServer;
use tonic::Code;

fn refusal(
    result: Result<tonic::Response<pb::RequestApprovalResponse>, tonic::Status>,
) -> tonic::Status {
    result.expect_err("the request is refused")
}

#[tokio::test]
async fn arguments_with_two_meanings_are_refused_naming_the_key_and_store_nothing() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    create(&mut client, request("agent-a", "call-0")).await;
    let before = stored_state(&server).await;
    for (arguments, expected) in [
        (r#"{"cmd":"ls","cmd":"rm -rf /"}"#, "/cmd appears twice"),
        (
            r#"{"opts":{"force":false,"force":true}}"#,
            "/opts/force appears twice",
        ),
        (
            r#"{"amount":18446744073709551616}"#,
            "does not fit in 64 bits",
        ),
        (r#"{"amount":1e999}"#, "beyond the range of a double"),
    ] {
        let status = refusal(
            client
                .request_approval(pb::RequestApprovalRequest {
                    arguments_json: arguments.into(),
                    ..request("agent-a", "call-1")
                })
                .await,
        );
        assert_eq!(status.code(), Code::InvalidArgument, "{arguments}");
        assert!(status.message().contains("arguments_json"), "{status:?}");
        assert!(status.message().contains(expected), "{status:?}");
    }
    assert_eq!(stored_state(&server).await, before);
}

#[tokio::test]
async fn identifier_fields_refuse_controls_invisible_and_unnormalised_characters() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    type Mutation = Box<dyn Fn(&mut pb::RequestApprovalRequest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "agent_id",
            Box::new(|r| r.agent_id = "agent\nINFO forged line".into()),
        ),
        (
            "session_id",
            Box::new(|r| r.session_id = "s\u{202E}1".into()),
        ),
        (
            "requester",
            Box::new(|r| r.requester = "alice\u{200B}".into()),
        ),
        ("requester", Box::new(|r| r.requester = "e\u{301}ve".into())),
        (
            "idempotency_key",
            Box::new(|r| r.idempotency_key = "k\u{2066}1".into()),
        ),
        (
            "routes[0].target",
            Box::new(|r| {
                r.routes = vec![pb::Route {
                    channel: "github".into(),
                    target: "acme/ops#1\n".into(),
                }]
            }),
        ),
        (
            "labels key",
            Box::new(|r| {
                r.labels.insert("team\u{FEFF}".into(), "ops".into());
            }),
        ),
        (
            "action",
            Box::new(|r| r.action = "list \u{202E}fr- mr".into()),
        ),
        ("reason", Box::new(|r| r.reason = "safe\u{200D}".into())),
    ];
    create(&mut client, request("agent-a", "call-0")).await;
    let before = stored_state(&server).await;
    for (field, mutate) in cases {
        let mut bad = request("agent-a", "call-1");
        mutate(&mut bad);
        let status = refusal(client.request_approval(bad).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(status.message().starts_with(field), "{field}: {status:?}");
    }
    assert_eq!(stored_state(&server).await, before);
    // Free text keeps its newlines.
    let created = create(
        &mut client,
        pb::RequestApprovalRequest {
            reason: "step one\nstep two".into(),
            ..request("agent-a", "call-2")
        },
    )
    .await;
    assert_eq!(created.reason, "step one\nstep two");
}

const ALICE: &str = r#"
[[approvers]]
id = "alice"
max_risk = "critical"
identities = { telegram = ["1001"], github = ["alice-gh"] }
"#;

/// Requests naming the approver in each of `spellings`; approving any of them as telegram
/// user 1001 is refused.
async fn self_approval_refused(server: &TestServer, spellings: &[&str]) {
    let mut client = connect(server).await;
    for requester in spellings {
        let approval = create(
            &mut client,
            pb::RequestApprovalRequest {
                requester: requester.to_string(),
                ..request("agent-a", &format!("call-{requester}"))
            },
        )
        .await;
        let refused = client
            .decide(decide(
                &approval.id,
                pb::Verdict::Approve,
                "1001",
                &format!("cb-{requester}"),
            ))
            .await
            .expect_err("self-approval is refused");
        assert_eq!(refused.code(), Code::PermissionDenied, "{requester}");
        assert!(
            refused.message().contains("separation of duties"),
            "{refused:?}"
        );
    }
}

#[tokio::test]
async fn an_approver_named_in_another_spelling_cannot_approve_their_own_request() {
    let server = TestServer::start_with_toml(ALICE).await;
    self_approval_refused(
        &server,
        &["Alice", "ＡＬＩＣＥ", "telegram:1001", "GITHUB:Alice-GH"],
    )
    .await;
}

#[tokio::test]
async fn an_approver_named_by_an_alias_cannot_approve_their_own_request() {
    let server =
        TestServer::start_with_toml(&format!("{ALICE}aliases = [\"alice@example.com\"]\n")).await;
    self_approval_refused(&server, &["ALICE@example.com", "alice@EXAMPLE.com"]).await;
}

/// The rules of the documented example configuration.
fn documented_rules() -> String {
    let doc = include_str!("../../../docs/configuration.md");
    let example = doc
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a TOML example in docs/configuration.md");
    let config = Config::parse(example).expect("the documented example parses");
    assert!(!config.rules.is_empty());
    example[example.find("[[rules]]").expect("rules in the example")..].to_string()
}

#[tokio::test]
async fn an_agent_cannot_declare_its_way_past_a_human_with_the_documented_rules() {
    let server = TestServer::start_with_toml(&documented_rules()).await;
    let mut client = connect(&server).await;
    let call = |key: &str, tool: &str, arguments: &str| pb::RequestApprovalRequest {
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        risk: pb::Risk::Low as i32,
        ..request("coder-1", key)
    };
    let rm = create(&mut client, call("rm", "bash", r#"{"command":"rm -rf /"}"#)).await;
    assert_eq!(state(&rm), pb::ApprovalState::Pending);
    assert_eq!(
        rm.risk,
        pb::Risk::Critical as i32,
        "raised from the declared LOW"
    );
    let ls = create(&mut client, call("ls", "bash", r#"{"command":"ls"}"#)).await;
    assert_eq!(state(&ls), pb::ApprovalState::Pending);
    assert_eq!(ls.risk, pb::Risk::High as i32);
    let read = create(
        &mut client,
        call("read", "read_file", r#"{"path":"README.md"}"#),
    )
    .await;
    assert_eq!(state(&read), pb::ApprovalState::Approved);
}

#[tokio::test]
async fn a_session_grant_covers_only_calls_in_its_argument_scope() {
    let server = TestServer::start_with_toml(&documented_rules()).await;
    let mut client = connect(&server).await;
    let call = |key: &str, command: &str| pb::RequestApprovalRequest {
        arguments_json: serde_json::json!({ "command": command }).to_string(),
        risk: pb::Risk::High as i32,
        ..request("coder-1", key)
    };
    let first = create(&mut client, call("c1", "git status")).await;
    let mut session = decide(&first.id, pb::Verdict::Approve, "42", "cb-1");
    session.scope = pb::Scope::Session as i32;
    client.decide(session).await.unwrap();

    let same_prefix = create(&mut client, call("c2", "git log -1")).await;
    assert_eq!(state(&same_prefix), pb::ApprovalState::Approved);
    let other = create(&mut client, call("c3", "curl http://example.com")).await;
    assert_eq!(
        state(&other),
        pb::ApprovalState::Pending,
        "outside the grant's scope"
    );
}

#[tokio::test]
async fn decisions_are_rate_limited_per_decider_and_per_worker_token() {
    let server = TestServer::start_with_toml(
        "[limits]\ndecisions_per_minute = 3\ndecisions_per_minute_per_token = 5\n",
    )
    .await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-a", "call-1")).await;
    for i in 0..3 {
        let reject = decide(
            &approval.id,
            pb::Verdict::Reject,
            "mallory",
            &format!("m-{i}"),
        );
        client.decide(reject).await.unwrap();
    }
    let over = client
        .decide(decide(&approval.id, pb::Verdict::Approve, "mallory", "m-9"))
        .await
        .expect_err("over the decider's rate");
    assert_eq!(over.code(), Code::ResourceExhausted);
    assert!(over.message().contains("decisions_per_minute"), "{over:?}");

    // Other deciders share the token's bucket: 3 calls above, 2 more, then refused.
    let mut refused = None;
    for i in 0..3 {
        let outcome = client
            .decide(decide(
                &approval.id,
                pb::Verdict::Reject,
                &format!("user-{i}"),
                "k",
            ))
            .await;
        if let Err(status) = outcome {
            if status.code() == Code::ResourceExhausted {
                refused = Some(status);
            }
        }
    }
    let refused = refused.expect("the token's rate applies across deciders");
    assert!(
        refused.message().contains("decisions_per_minute_per_token"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn requests_are_rate_limited_per_token_across_agent_ids() {
    let server = TestServer::start_with_toml("[limits]\nrequests_per_minute_per_token = 2\n").await;
    let mut client = connect(&server).await;
    create(&mut client, request("agent-a", "call-1")).await;
    create(&mut client, request("agent-b", "call-1")).await;
    let before = stored_state(&server).await;
    let refused = refusal(client.request_approval(request("agent-c", "call-1")).await);
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("requests_per_minute_per_token"),
        "{refused:?}"
    );
    assert_eq!(stored_state(&server).await, before);
}

#[tokio::test]
async fn removing_the_newest_or_the_oldest_event_row_is_detected() {
    for (sql, problem) in [
        (
            "DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events)",
            "at the end were removed",
        ),
        (
            "DELETE FROM events WHERE seq = (SELECT MIN(seq) FROM events)",
            "at the start were removed",
        ),
    ] {
        let server = TestServer::start().await;
        let mut client = connect(&server).await;
        let approval = create(&mut client, request("agent-a", "call-1")).await;
        client
            .decide(decide(&approval.id, pb::Verdict::Reject, "42", "cb-1"))
            .await
            .unwrap();
        create(&mut client, request("agent-b", "call-1")).await;
        let mut admin = admin(&channel(&server).await, None);
        assert!(verify(&mut admin).await.intact);
        tamper(&server, sql).await;
        let report = verify(&mut admin).await;
        assert!(!report.intact, "{sql}");
        assert!(report.problem.contains(problem), "{sql}: {report:?}");
    }
}

#[tokio::test]
async fn an_approval_row_flipped_by_hand_is_refused_and_reported() {
    let server = TestServer::start().await;
    let mut client = connect(&server).await;
    let approval = create(&mut client, request("agent-a", "call-1")).await;
    tamper(
        &server,
        &format!(
            "UPDATE approvals SET state = 'APPROVED', body = replace(body, '\"state\":\"PENDING\"', '\"state\":\"APPROVED\"') WHERE id = '{}'",
            approval.id
        ),
    )
    .await;
    let got = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .expect_err("a tampered approval is not served");
    assert_eq!(got.code(), Code::FailedPrecondition, "{got:?}");
    let consumed = client
        .consume(pb::ConsumeRequest {
            approval_id: approval.id.clone(),
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            ..Default::default()
        })
        .await
        .expect_err("a tampered approval is not consumed");
    assert_eq!(consumed.code(), Code::FailedPrecondition, "{consumed:?}");
    let waited = client
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval.id.clone(),
            timeout_ms: 100,
        })
        .await
        .expect_err("nor waited for");
    assert_eq!(waited.code(), Code::FailedPrecondition);

    let report = verify(&mut admin(&channel(&server).await, None)).await;
    assert!(!report.intact);
    assert!(report.problem.contains(&approval.id), "{report:?}");
}

/// GetApprovalRequest with `approval_id` as raw bytes, to send text that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetApproval {
    #[prost(bytes = "vec", tag = "1")]
    approval_id: Vec<u8>,
}

#[tokio::test]
async fn a_string_field_that_is_not_utf8_is_an_invalid_argument() {
    let server = TestServer::start().await;
    let mut grpc = tonic::client::Grpc::new(channel(&server).await);
    grpc.ready().await.unwrap();
    let refused = grpc
        .unary::<_, pb::Approval, _>(
            tonic::Request::new(RawGetApproval {
                approval_id: vec![b'a', 0xff, 0xfe],
            }),
            http::uri::PathAndQuery::from_static("/countersign.v1.ApprovalService/GetApproval"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("approval_id"), "{refused:?}");
}
