//! `countersign policy report` through the real binary, against a server in observe mode
//! (issue 43 item 4): what the rules would have decided over a period, and where a person
//! decided otherwise.

use crate::support;

use std::process::Output;

use countersign_client::pb;
use countersign_testkit::server::TestServer;
use serde_json::{json, Value};
use support::*;

const OBSERVED: &str = r#"
[policy]
mode = "observe"

[[rules]]
name = "reads"
action = "allow"
[rules.match]
tool = "Read"

[[rules]]
name = "no-force-push"
action = "deny"
[rules.match]
tool = "Bash"
arguments = [{ pointer = "/command", regex = "git push .*--force" }]
"#;

async fn report(server: &TestServer, extra: &[&str]) -> Output {
    let mut command = countersign(&server.url());
    command.args(["policy", "report"]).args(extra);
    tokio::time::timeout(STEP, command.output())
        .await
        .expect("countersign hung")
        .expect("countersign ran")
}

#[tokio::test]
async fn the_report_shows_what_observed_rules_would_have_decided_and_where_people_disagreed() {
    let server = TestServer::start_with_toml(OBSERVED).await;
    let client = client(&server.url());
    // Observe mode asks about every call, also the ones a rule would decide.
    let read_1 = ask(
        &client,
        pb::Risk::Medium,
        "r1",
        "Read",
        json!({"file_path": "a.rs"}),
    )
    .await;
    let read_2 = ask(
        &client,
        pb::Risk::Medium,
        "r2",
        "Read",
        json!({"file_path": "b.rs"}),
    )
    .await;
    let read_3 = ask(
        &client,
        pb::Risk::Medium,
        "r3",
        "Read",
        json!({"file_path": ".env"}),
    )
    .await;
    let push = ask(
        &client,
        pb::Risk::Medium,
        "p1",
        "Bash",
        json!({"command": "git push origin main --force"}),
    )
    .await;
    let make = ask(
        &client,
        pb::Risk::Medium,
        "m1",
        "Bash",
        json!({"command": "make"}),
    )
    .await;
    for approval in [&read_1, &read_2, &read_3, &push, &make] {
        assert_eq!(approval.state(), pb::ApprovalState::Pending);
    }
    approve(&client, &read_1.id, pb::Scope::Once, "").await;
    approve(&client, &read_2.id, pb::Scope::Once, "").await;
    reject(&client, &read_3.id, "not the secrets").await;
    approve(&client, &push.id, pb::Scope::Once, "release branch rewrite").await;

    let output = report(&server, &["--since", "1h", "-o", "json"]).await;
    assert_exit(&output, 0);
    let answer: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        answer["rules"],
        json!([
            {"rule": "", "would": "none", "calls": 1, "approved": 0, "rejected": 0, "undecided": 1, "disagreed": 0},
            {"rule": "no-force-push", "would": "deny", "calls": 1, "approved": 1, "rejected": 0, "undecided": 0, "disagreed": 1},
            {"rule": "reads", "would": "allow", "calls": 3, "approved": 2, "rejected": 1, "undecided": 0, "disagreed": 1},
        ])
    );
    let disagreed: Vec<&str> = answer["disagreements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|approval| approval["id"].as_str().unwrap())
        .collect();
    assert_eq!(disagreed, [read_3.id.as_str(), push.id.as_str()]);

    let output = report(&server, &["--since", "1h"]).await;
    assert_exit(&output, 0);
    let text = stdout(&output);
    let row = |rule: &str| {
        text.lines()
            .find(|line| line.starts_with(rule))
            .unwrap_or_else(|| panic!("no row for {rule}: {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row("reads"), ["reads", "allow", "3", "2", "1", "0", "1"]);
    assert_eq!(
        row("no-force-push"),
        ["no-force-push", "deny", "1", "1", "0", "0", "1"]
    );
    assert_eq!(
        row("(no rule)"),
        ["(no", "rule)", "none", "1", "0", "0", "1", "0"]
    );
    assert!(text.contains("people decided against the rules:"), "{text}");
    let line = text
        .lines()
        .find(|line| line.starts_with(&read_3.id))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("REJECTED")
            && line.contains("allow reads")
            && line.contains("not the secrets"),
        "{line}"
    );

    // A period with nothing observed in it.
    let output = report(&server, &["--since", "2999-01-01T00:00:00Z"]).await;
    assert_exit(&output, 0);
    assert!(
        stdout(&output).starts_with("no observed calls"),
        "{}",
        stdout(&output)
    );
}
