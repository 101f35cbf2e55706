//! The open-standards front door on the `[http]` listener: the AuthZEN Access Evaluation API
//! called over HTTP with an agent's bearer token, answered by the server's policy rules.

use countersign_proto::v1 as pb;
use countersign_server::config::{Config, Role};
use countersign_testkit::http::free_addr;
use countersign_testkit::server::{token, TestServer};
use serde_json::{json, Value};

use crate::common;

const AGENT_SECRET: &str = "agent-secret-0123456789";
const RULES: &str = r#"
[[rules]]
name = "production-is-critical"
action = "classify"
risk = "critical"
[rules.match]
arguments = [{ pointer = "/env", glob = "prod*" }]

[[rules]]
name = "no-table-drops"
action = "deny"
reason = "dropping tables is never allowed"
[rules.match]
tool = "sql.*"
arguments = [{ pointer = "/query", regex = "(?i)\\bdrop\\s+table\\b" }]

[[rules]]
name = "reads-are-fine"
action = "allow"
reason = "reading is harmless"
[rules.match]
tool = "read_file"

[[rules]]
name = "deploys-need-two"
action = "require"
required_approvals = 2
[rules.match]
tool = "deploy"
"#;

struct Front {
    server: TestServer,
    base: String,
    http: reqwest::Client,
}

async fn start() -> Front {
    let listen = free_addr();
    let server = TestServer::start_with(|config| {
        let rules = Config::parse(RULES).expect("rules");
        config.rules = rules.rules;
        config.tokens = vec![token("agent", Role::Agent, &["agent-1"], AGENT_SECRET)];
        config.http.listen = Some(listen);
    })
    .await;
    let front = Front {
        server,
        base: format!("http://{listen}"),
        http: reqwest::Client::new(),
    };
    front
}

impl Front {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(AGENT_SECRET)
            .json(body)
            .send()
            .await
            .expect("POST");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }
}

fn call(tool: &str, arguments: Value) -> Value {
    json!({
        "subject": {"type": "agent", "id": "agent-1"},
        "resource": {"type": "tool", "id": tool, "properties": {"arguments": arguments, "risk": "medium"}},
        "action": {"name": "call"},
    })
}

#[tokio::test]
async fn the_metadata_names_both_evaluation_endpoints() {
    let front = start().await;
    let metadata: Value = front
        .http
        .get(format!("{}/.well-known/authzen-configuration", front.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["policy_decision_point"], front.base);
    assert_eq!(
        metadata["access_evaluation_endpoint"],
        format!("{}/access/v1/evaluation", front.base)
    );
    assert_eq!(
        metadata["access_evaluations_endpoint"],
        format!("{}/access/v1/evaluations", front.base)
    );
}

#[tokio::test]
async fn an_evaluation_is_the_policy_allow_deny_or_a_person() {
    let front = start().await;
    let path = "/access/v1/evaluation";

    let (status, allowed) = front
        .post(path, &call("read_file", json!({"path": "/etc/motd"})))
        .await;
    assert_eq!(status, 200, "{allowed}");
    assert_eq!(allowed["decision"], true, "{allowed}");
    assert_eq!(allowed["context"]["rule"], "reads-are-fine");

    let (_, denied) = front
        .post(
            path,
            &call("sql.exec", json!({"query": "DROP TABLE users"})),
        )
        .await;
    assert_eq!(denied["decision"], false, "{denied}");
    assert_eq!(denied["context"]["rule"], "no-table-drops");
    assert_eq!(
        denied["context"]["reason"],
        "dropping tables is never allowed"
    );

    let (_, human) = front
        .post(path, &call("deploy", json!({"env": "prod"})))
        .await;
    assert_eq!(human["decision"], false, "{human}");
    let context = &human["context"];
    assert_eq!(context["require_human"], true, "{human}");
    assert_eq!(context["rule"], "deploys-need-two");
    let approval = &context["ask"]["approval"];
    assert_eq!(approval["tool_name"], "deploy");
    assert_eq!(approval["arguments"], json!({"env": "prod"}));
    assert_eq!(approval["required_approvals"], 2);

    // No rule matches: a person decides.
    let (_, unmatched) = front
        .post(path, &call("sql.exec", json!({"query": "SELECT 1"})))
        .await;
    assert_eq!(unmatched["decision"], false);
    assert_eq!(unmatched["context"]["require_human"], true);
    assert_eq!(unmatched["context"]["rule"], Value::Null);
}

#[tokio::test]
async fn a_batch_takes_defaults_and_stops_as_its_semantic_says() {
    let front = start().await;
    let path = "/access/v1/evaluations";
    let mut batch = call("read_file", json!({}));
    batch["evaluations"] = json!([
        {},
        {"resource": {"type": "tool", "id": "sql.exec", "properties": {"arguments": {"query": "drop table t"}, "risk": "low"}}},
        {"resource": {"type": "tool", "id": "deploy", "properties": {"risk": "high"}}},
        {"resource": {"type": "tool", "id": "read_file"}},
    ]);
    let (status, all) = front.post(path, &batch).await;
    assert_eq!(status, 200, "{all}");
    let decisions: Vec<&Value> = all["evaluations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["decision"])
        .collect();
    assert_eq!(
        decisions,
        [&json!(true), &json!(false), &json!(false), &json!(false)]
    );
    // The fourth item's own resource has no risk: it alone is refused, naming the field.
    let error = &all["evaluations"][3]["context"]["error"];
    assert_eq!(error["status"], 400, "{all}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("evaluations[3].resource.properties.risk:"),
        "{error}"
    );

    batch["options"] = json!({"evaluations_semantic": "deny_on_first_deny"});
    let (_, stopped) = front.post(path, &batch).await;
    assert_eq!(
        stopped["evaluations"].as_array().unwrap().len(),
        2,
        "{stopped}"
    );

    batch["options"] = json!({"evaluations_semantic": "permit_on_first_permit"});
    let (_, permitted) = front.post(path, &batch).await;
    assert_eq!(permitted["evaluations"].as_array().unwrap().len(), 1);

    // Without items the batch endpoint answers the one evaluation of its top level.
    let (_, single) = front.post(path, &call("read_file", json!({}))).await;
    assert_eq!(single["decision"], true, "{single}");
}

#[tokio::test]
async fn bad_evaluations_are_refused_naming_the_field() {
    let front = start().await;
    let path = "/access/v1/evaluation";
    let mut no_risk = call("read_file", json!({}));
    no_risk["resource"]["properties"] = json!({});
    let mut bad_arguments = call("read_file", json!({}));
    bad_arguments["resource"]["properties"]["arguments"] = json!("rm -rf /");
    let mut user = call("read_file", json!({}));
    user["subject"]["type"] = json!("user");
    let mut bad_tool = call("read_file", json!({}));
    bad_tool["resource"]["id"] = json!("no spaces allowed");
    for (body, field) in [
        (no_risk, "resource.properties.risk"),
        (bad_arguments, "resource.properties.arguments"),
        (user, "subject.type"),
        (bad_tool, "resource.id"),
        (json!({"resource": {}}), "subject"),
    ] {
        let (status, answer) = front.post(path, &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"], "invalid_request");
        let description = answer["error_description"].as_str().unwrap();
        assert!(
            description.starts_with(&format!("{field}:")),
            "{description}"
        );
    }
}

#[tokio::test]
async fn evaluations_need_an_agent_token_bound_to_the_subject() {
    let front = start().await;
    let path = format!("{}/access/v1/evaluation", front.base);
    let body = call("read_file", json!({}));
    let anonymous = front.http.post(&path).json(&body).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let wrong = front
        .http
        .post(&path)
        .bearer_auth("not-a-token-0123456789")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);

    let mut other_agent = body.clone();
    other_agent["subject"]["id"] = json!("agent-2");
    let (status, answer) = front.post("/access/v1/evaluation", &other_agent).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["error"], "access_denied");

    // The caller's request id comes back.
    let echoed = front
        .http
        .post(&path)
        .bearer_auth(AGENT_SECRET)
        .header("x-request-id", "req-42")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "req-42");
}

#[tokio::test]
async fn an_evaluation_answers_as_request_approval_then_does() {
    let front = start().await;
    let channel = common::channel(&front.server).await;
    let mut agent = common::with_token(&channel, Some(AGENT_SECRET));
    for (tool, arguments) in [
        ("read_file", json!({"path": "README"})),
        ("sql.exec", json!({"query": "drop table t"})),
        ("deploy", json!({"env": "prod-eu"})),
    ] {
        let (_, evaluated) = front
            .post("/access/v1/evaluation", &call(tool, arguments.clone()))
            .await;
        let requested = agent
            .request_approval(pb::RequestApprovalRequest {
                agent_id: "agent-1".into(),
                idempotency_key: format!("cross-check-{tool}"),
                tool_name: tool.into(),
                arguments_json: arguments.to_string(),
                action: "call".into(),
                risk: pb::Risk::Medium as i32,
                ..Default::default()
            })
            .await
            .expect("RequestApproval")
            .into_inner()
            .approval
            .expect("an approval");
        let state = pb::ApprovalState::try_from(requested.state).unwrap();
        let expected = match evaluated["decision"].as_bool() {
            Some(true) => pb::ApprovalState::Approved,
            _ if evaluated["context"]["require_human"] == true => pb::ApprovalState::Pending,
            _ => pb::ApprovalState::Rejected,
        };
        assert_eq!(state, expected, "{tool}: {evaluated}");
        if state == pb::ApprovalState::Pending {
            // The classify rule raised the risk in both answers.
            let risk = pb::Risk::try_from(requested.risk).unwrap();
            assert_eq!(risk, pb::Risk::Critical);
            assert_eq!(evaluated["context"]["ask"]["approval"]["risk"], "critical");
            assert_eq!(
                evaluated["context"]["ask"]["approval"]["required_approvals"],
                requested.required_approvals
            );
        }
    }
}
