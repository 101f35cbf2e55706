//! The per-agent request limit against the real `countersign hook` binary (issue 43 item 6):
//! calls a rule answers never count against it, and a call over it waits for the server's
//! retry-after within the hook's budget instead of being denied at once.

use crate::support;

use std::sync::Arc;

use countersign_client::pb;
use countersign_testkit::server::TestServer;
use serde_json::{json, Value};
use support::*;
use tokio::sync::Semaphore;

/// Claude Code's PreToolUse payload for `tool_input` in `session`, with its own call id.
fn pre_tool_use(session: &str, call: &str, tool: &str, tool_input: Value) -> Vec<u8> {
    let mut payload = fixture("claude-code/pre-tool-use.json");
    payload["session_id"] = json!(session);
    payload["tool_use_id"] = json!(call);
    payload["tool_name"] = json!(tool);
    payload["tool_input"] = tool_input;
    serde_json::to_vec(&payload).unwrap()
}

fn answer_of(output: &std::process::Output) -> Value {
    serde_json::from_str(stdout(output).trim()).unwrap_or_else(|error| {
        panic!(
            "not JSON ({error}): {}; stderr: {}",
            stdout(output),
            stderr(output)
        )
    })
}

fn decision_of(output: &std::process::Output) -> String {
    answer_of(output)["hookSpecificOutput"]["permissionDecision"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Every Claude Code session on a machine is agent `claude-code`: 1,000 reads the rules allow,
/// from 8 sessions at once, are all allowed although the agent's limit is 100 a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_rule_allowed_hook_calls_from_several_sessions_are_all_allowed() {
    const CALLS: usize = 1000;
    const SESSIONS: usize = 8;
    let server = TestServer::start_with_toml(
        r#"
        [limits]
        requests_per_minute = 100
        requests_per_minute_per_token = 6000

        [[rules]]
        name = "reads"
        action = "allow"
        [rules.match]
        tool = "Read"
        "#,
    )
    .await;
    let url = server.url();
    let slots = Arc::new(Semaphore::new(16));
    let started = std::time::Instant::now();
    let hooks: Vec<_> = (0..CALLS)
        .map(|n| {
            let (url, slots) = (url.clone(), slots.clone());
            tokio::spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let input = pre_tool_use(
                    &format!("session-{}", n % SESSIONS),
                    &format!("toolu_read_{n}"),
                    "Read",
                    json!({"file_path": format!("/home/dev/shop/src/{n}.rs")}),
                );
                let mut command = countersign(&url);
                command.args(["hook", "claude-code"]);
                run_with_input(command, &input).await
            })
        })
        .collect();
    let mut denied = Vec::new();
    for hook in hooks {
        let output = hook.await.unwrap();
        assert_exit(&output, 0);
        if decision_of(&output) != "allow" {
            denied.push(answer_of(&output));
        }
    }
    // Measured, not asserted: how long the 1,000 hook processes took on this machine.
    eprintln!("{CALLS} hook calls in {:?}", started.elapsed());
    assert!(
        denied.is_empty(),
        "{} of {CALLS} denied, e.g. {}",
        denied.len(),
        denied[0]
    );
}

/// A call a person must see, over the agent's limit: the hook waits for the retry-after the
/// server names, asks again, and the approval reaches the host.
#[tokio::test]
async fn a_hook_over_the_limit_waits_for_the_retry_after_and_is_asked() {
    // One call at once, then one every 10 s: the hook below meets the limit however slowly
    // this machine starts it.
    let server = TestServer::start_with_toml(
        r#"
        [limits]
        requests_per_minute = 6
        request_burst = 1
        requests_per_minute_per_token = 600
        "#,
    )
    .await;
    let url = server.url();
    let approver = client(&url);
    let mut watch = watch_requests(&url).await;
    let first = approver
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "claude-code".into(),
            idempotency_key: "takes-the-burst".into(),
            tool_name: "Bash".into(),
            arguments_json: r#"{"command":"make"}"#.into(),
            action: "run: make".into(),
            risk: pb::Risk::High.into(),
            ..Default::default()
        })
        .await
        .expect("the first call fits the burst");
    let first = first.approval.unwrap();
    assert_eq!(next_pending(&mut watch).await.id, first.id);

    let input = pre_tool_use(
        "limited",
        "toolu_limited",
        "Bash",
        json!({"command": "npm publish"}),
    );
    let hook = tokio::spawn({
        let url = url.clone();
        async move {
            let mut command = countersign(&url);
            command.args(["hook", "claude-code"]);
            run_with_input(command, &input).await
        }
    });
    let asked = next_pending(&mut watch).await;
    assert_eq!(asked.idempotency_key, "toolu_limited");
    approve(&approver, &asked.id, pb::Scope::Once, "").await;
    let output = hook.await.unwrap();
    assert_exit(&output, 0);
    assert_eq!(decision_of(&output), "allow", "{}", stderr(&output));
    assert!(
        stderr(&output).contains("rate limited"),
        "the hook met the limit and waited: {}",
        stderr(&output)
    );
}
