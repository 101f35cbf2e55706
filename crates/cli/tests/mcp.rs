//! `countersign mcp` driven by a client speaking newline-delimited JSON-RPC over the child's
//! stdin and stdout, against a real server.

use crate::support;

use std::process::Stdio;

use countersign_client::{pb, Client, Watch};
use countersign_testkit::server::TestServer;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// An MCP client on a `countersign mcp` child.
struct McpClient {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl McpClient {
    fn start(server: &str) -> McpClient {
        McpClient::start_with(server, &[])
    }

    fn start_with(server: &str, extra: &[&str]) -> McpClient {
        let mut command = countersign(server);
        command
            .args(["mcp", "--progress-interval", "100ms"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("start countersign mcp");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        McpClient {
            child,
            stdin,
            stdout,
        }
    }

    async fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        let line = format!("{message}\n");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn next(&mut self) -> Value {
        next_json_line(&mut self.stdout).await
    }

    /// Sends a request and returns its response (no notifications expected in between).
    async fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let response = self.next().await;
        assert_eq!(response["id"], json!(id), "{response}");
        response
    }

    async fn initialize(&mut self) {
        let response = self
            .call(
                0,
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
            )
            .await;
        assert_eq!(response["result"]["protocolVersion"], "2025-11-25");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    async fn call_tool(&mut self, id: i64, name: &str, arguments: Value, progress: Option<&str>) {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(token) = progress {
            params["_meta"] = json!({"progressToken": token});
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
            .await;
    }

    /// The next response, skipping progress notifications.
    async fn response(&mut self) -> Value {
        loop {
            let message = self.next().await;
            if message.get("method") != Some(&json!("notifications/progress")) {
                return message;
            }
        }
    }
}

/// A server, an approver's client, a watch of what gets requested and an initialized MCP
/// server on it.
async fn started() -> (TestServer, Client, Watch, McpClient) {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let watch = watch_requests(&server.url()).await;
    let mut mcp = McpClient::start(&server.url());
    mcp.initialize().await;
    (server, client, watch, mcp)
}

/// The JSON held by the single text block of a tool result.
#[track_caller]
fn tool_text(response: &Value) -> Value {
    let result = &response["result"];
    assert_eq!(result["isError"], json!(false), "{response}");
    let content = result["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{response}");
    assert_eq!(content[0]["type"], "text");
    serde_json::from_str(content[0]["text"].as_str().unwrap()).expect("JSON text")
}

#[tokio::test]
async fn the_handshake_lists_the_tools_and_answers_ping_and_unknown_methods() {
    let server = TestServer::start().await;
    let mut mcp = McpClient::start(&server.url());
    for (asked, agreed) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("1999-01-01", "2025-11-25"),
    ] {
        let response = mcp
            .call(1, "initialize", json!({"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))
            .await;
        assert_eq!(response["jsonrpc"], "2.0");
        assert_eq!(response["result"]["protocolVersion"], agreed);
        assert_eq!(response["result"]["serverInfo"]["name"], "countersign");
        assert!(response["result"]["capabilities"]["tools"].is_object());
    }
    mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let response = mcp.call(2, "ping", json!({})).await;
    assert_eq!(response["result"], json!({}));
    let response = mcp.call(3, "tools/list", json!({})).await;
    let names: Vec<&str> = response["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["approve", "request_approval", "check_approval"]);
    for tool in response["result"]["tools"].as_array().unwrap() {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }
    let response = mcp.call(4, "resources/list", json!({})).await;
    assert_eq!(response["error"]["code"], -32601);
    let response = mcp
        .call(5, "tools/call", json!({"name": "rm_rf", "arguments": {}}))
        .await;
    assert_eq!(response["error"]["code"], -32602);
    mcp.send_raw("{not json\n").await;
    let response = mcp.next().await;
    assert_eq!(response["error"]["code"], -32700);
    assert_eq!(response["id"], Value::Null);
    // The client closing stdin ends the server.
    drop(mcp.stdin.take());
    let status = tokio::time::timeout(STEP, mcp.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// An approver's edit (edit-on-approve) is the permission prompt's `updatedInput`.
#[tokio::test]
async fn approve_with_edits_answers_the_edited_input() {
    let (_server, client, mut watch, mut mcp) = started().await;
    let input = json!({"command": "git push --force"});
    mcp.call_tool(
        1,
        "approve",
        json!({"tool_name": "Bash", "input": input, "tool_use_id": "toolu_edit"}),
        None,
    )
    .await;
    let approval = next_pending(&mut watch).await;
    let edited = json!({"command": "git push --force-with-lease"});
    approve_with_edits(&client, &approval.id, &edited).await;
    let response = mcp.response().await;
    assert_eq!(response["id"], 1);
    assert_eq!(
        tool_text(&response),
        json!({"behavior": "allow", "updatedInput": edited})
    );
}

/// An agent that asked explicitly learns the edited arguments it may act with, whether it
/// waited or checks later: "approved" alone would let it run what nobody approved.
#[tokio::test]
async fn request_approval_with_edits_answers_the_edited_arguments() {
    let (_server, client, mut watch, mut mcp) = started().await;
    let edited = json!({"database": "staging-copy"});
    for (id, wait) in [(30, true), (31, false)] {
        mcp.call_tool(
            id,
            "request_approval",
            json!({"action": "drop a database", "arguments": {"database": "staging"}, "wait": wait}),
            None,
        )
        .await;
        let approval = next_pending(&mut watch).await;
        let answer = if wait {
            approve_with_edits(&client, &approval.id, &edited).await;
            tool_text(&mcp.response().await)
        } else {
            assert_eq!(
                tool_text(&mcp.response().await)["status"],
                "awaiting_approval"
            );
            approve_with_edits(&client, &approval.id, &edited).await;
            let check =
                json!({"name": "check_approval", "arguments": {"approval_id": approval.id}});
            tool_text(&mcp.call(id + 10, "tools/call", check).await)
        };
        assert_eq!(answer["status"], "approved", "{answer}");
        assert_eq!(answer["arguments"], edited, "{answer}");
        assert_eq!(answer["edited_by"], "Alice (telegram)", "{answer}");
    }
}

#[tokio::test]
async fn approve_answers_the_permission_prompt_and_reports_progress_while_waiting() {
    let (_server, client, mut watch, mut mcp) = started().await;

    let input = json!({"command": "git push --force", "description": "Publish the fix"});
    mcp.call_tool(
        10,
        "approve",
        json!({"tool_name": "Bash", "input": input, "tool_use_id": "toolu_01XYZ"}),
        Some("tok-10"),
    )
    .await;
    let approval = next_pending(&mut watch).await;
    assert_eq!(approval.agent_id, "claude-code");
    assert_eq!(approval.tool_name, "Bash");
    assert_eq!(approval.idempotency_key, "toolu_01XYZ");
    assert_eq!(approval.action, "run: git push --force");
    assert_eq!(approval.reason, "Publish the fix");
    assert!(
        approval.session_id.starts_with("mcp-"),
        "{}",
        approval.session_id
    );
    // Progress keeps coming while nobody decides.
    for expected in 1..=2 {
        let message = mcp.next().await;
        assert_eq!(message["method"], "notifications/progress", "{message}");
        assert_eq!(message["params"]["progressToken"], "tok-10");
        assert_eq!(message["params"]["progress"], expected);
    }
    approve(&client, &approval.id, pb::Scope::Once, "").await;
    let response = mcp.response().await;
    assert_eq!(response["id"], 10);
    assert_eq!(
        tool_text(&response),
        json!({"behavior": "allow", "updatedInput": input})
    );

    mcp.call_tool(
        11,
        "approve",
        json!({"tool_name": "mcp__db__query", "input": {"sql": "DROP TABLE users"}, "extra": 1}),
        None,
    )
    .await;
    let approval = next_pending(&mut watch).await;
    assert_eq!(
        approval.action,
        r#"MCP db/query {"sql":"DROP TABLE users"}"#
    );
    reject(&client, &approval.id, "no").await;
    let response = mcp.response().await;
    assert_eq!(
        tool_text(&response),
        json!({"behavior": "deny", "message": format!("countersign: rejected by {APPROVER}: no")})
    );

    // Bad input is a denial, never a JSON-RPC error.
    let response = mcp
        .call(
            12,
            "tools/call",
            json!({"name": "approve", "arguments": {"input": {}}}),
        )
        .await;
    assert_eq!(
        tool_text(&response),
        json!({"behavior": "deny", "message": "countersign: the approve tool was called without tool_name"})
    );
}

#[tokio::test]
async fn request_approval_waits_or_returns_an_id_to_check_later() {
    let (_server, client, mut watch, mut mcp) = started().await;

    mcp.call_tool(
        20,
        "request_approval",
        json!({
            "action": "delete the staging database",
            "tool_name": "drop_database",
            "reason": "it is rebuilt nightly",
            "risk_level": "critical",
            "arguments": {"database": "staging"},
        }),
        None,
    )
    .await;
    let approval = next_pending(&mut watch).await;
    assert_eq!(approval.action, "delete the staging database");
    assert_eq!(approval.reason, "it is rebuilt nightly");
    assert_eq!(approval.risk(), pb::Risk::Critical);
    assert_eq!(approval.agent_id, "mcp-agent");
    assert_eq!(approval.arguments_json, r#"{"database":"staging"}"#);
    approve(&client, &approval.id, pb::Scope::Session, "go").await;
    let response = mcp.response().await;
    assert_eq!(
        tool_text(&response),
        json!({"status": "approved", "approval_id": approval.id, "scope": "session", "reason": "go", "decider": APPROVER})
    );

    // Another action, without a tool name: the session approval above does not cover it.
    mcp.call_tool(
        21,
        "request_approval",
        json!({"action": "email the customer list", "wait": false}),
        None,
    )
    .await;
    let answer = tool_text(&mcp.response().await);
    let id = answer["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(
        answer,
        json!({"status": "awaiting_approval", "approval_id": id})
    );
    let response = mcp
        .call(
            22,
            "tools/call",
            json!({"name": "check_approval", "arguments": {"approval_id": id}}),
        )
        .await;
    assert_eq!(
        tool_text(&response),
        json!({"status": "awaiting_approval", "approval_id": id})
    );
    reject(&client, &id, "too late").await;
    let response = mcp
        .call(
            23,
            "tools/call",
            json!({"name": "check_approval", "arguments": {"approval_id": id}}),
        )
        .await;
    assert_eq!(
        tool_text(&response),
        json!({"status": "rejected", "approval_id": id, "reason": "too late", "decider": APPROVER})
    );

    // Bad arguments are a tool error naming the problem; nothing is requested.
    let response = mcp.call(24, "tools/call", json!({"name": "request_approval", "arguments": {"action": "x", "risk_level": "extreme"}})).await;
    assert_eq!(response["result"]["isError"], true);
    let text = response["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("risk_level \"extreme\""), "{text}");
    assert_eq!(
        client
            .list_approvals(pb::ListApprovalsRequest::default())
            .await
            .unwrap()
            .approvals
            .len(),
        2
    );
}

#[tokio::test]
async fn a_cancelled_call_or_a_closed_stdin_withdraws_the_approval() {
    let (_server, client, mut watch, mut mcp) = started().await;

    mcp.call_tool(
        30,
        "approve",
        json!({"tool_name": "Bash", "input": {"command": "make release"}}),
        None,
    )
    .await;
    let approval = next_pending(&mut watch).await;
    mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 30, "reason": "user pressed Esc"}}))
        .await;
    let cancelled = client
        .wait_until_resolved(&approval.id, STEP)
        .await
        .unwrap();
    assert_eq!(cancelled.state(), pb::ApprovalState::Cancelled);
    assert_eq!(
        cancelled.resolution.unwrap().reason,
        "the MCP client cancelled the call: user pressed Esc"
    );
    // The cancelled request gets no response: the next message answers the ping.
    let response = mcp.call(31, "ping", json!({})).await;
    assert_eq!(response["result"], json!({}));

    mcp.call_tool(
        32,
        "request_approval",
        json!({"action": "rotate the signing key"}),
        Some("tok-32"),
    )
    .await;
    let approval = next_pending(&mut watch).await;
    drop(mcp.stdin.take());
    let status = tokio::time::timeout(STEP, mcp.child.wait())
        .await
        .expect("the server stops when stdin closes")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let cancelled = client.get_approval(&approval.id).await.unwrap();
    assert_eq!(cancelled.state(), pb::ApprovalState::Cancelled);
    // A withdrawal, so the channels say "Withdrawn".
    assert_eq!(
        cancelled.resolution.unwrap().reason,
        "withdrawn: the MCP client disconnected"
    );
}

/// The caller of `approve` gives up while the server is down, so the approval cannot be
/// withdrawn: it expires with the wait (not with the server's default TTL of an hour), and
/// after the server is back nobody can approve a call that nobody waits for.
#[tokio::test]
async fn an_approval_whose_caller_gave_up_while_the_server_was_down_expires_with_the_wait() {
    let mut server = TestServer::start().await;
    let mut watch = watch_requests(&server.url()).await;
    let mut mcp = McpClient::start_with(&server.url(), &["--timeout", "4s"]);
    mcp.initialize().await;
    mcp.call_tool(
        40,
        "approve",
        json!({"tool_name": "Bash", "input": {"command": "terraform destroy"}}),
        None,
    )
    .await;
    let approval = next_pending(&mut watch).await;
    let lifetime = approval.expires_at.unwrap().seconds - approval.created_at.unwrap().seconds;
    assert!(lifetime <= 6, "expires {lifetime} s after it was made");
    server.stop().await;

    // Denied, whichever way the wait learns that the server is gone: the long-poll's error,
    // or the deadline and a withdrawal that cannot reach it.
    let response = mcp.response().await;
    let answer = tool_text(&response);
    assert_eq!(answer["behavior"], "deny", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.contains("could not be withdrawn; it expires unanswered")
            || message.contains("cannot reach the approval server"),
        "{answer}"
    );

    server.restart().await;
    let expired = client(&server.url())
        .wait_until_resolved(&approval.id, STEP)
        .await
        .unwrap();
    assert_eq!(expired.state(), pb::ApprovalState::Expired);
}

/// Claude Code stops a stdio MCP server with SIGINT, then SIGTERM, then SIGKILL, and never
/// closes its stdin: stopped by any of the signals, the server withdraws what it asked for
/// (a permission tool call and a relayed permission prompt) and exits.
#[tokio::test]
async fn a_server_stopped_by_a_signal_withdraws_what_it_asked_for_and_exits() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let mut watch = watch_requests(&server.url()).await;
    for signal in ["INT", "TERM", "HUP"] {
        let mut mcp = McpClient::start_with(&server.url(), &["--channel"]);
        mcp.initialize().await;
        mcp.call_tool(
            1,
            "approve",
            json!({"tool_name": "Bash", "input": {"command": format!("make release-{signal}")}}),
            None,
        )
        .await;
        let called = next_pending(&mut watch).await;
        mcp.send(json!({
            "jsonrpc": "2.0",
            "method": "notifications/claude/channel/permission_request",
            "params": {
                "request_id": format!("relay{signal}"),
                "tool_name": "Bash",
                "description": "Run make deploy",
                "input_preview": json!({"command": "make deploy"}).to_string(),
            },
        }))
        .await;
        let relayed = next_pending(&mut watch).await;
        send_signal(&mcp.child, signal);
        let status = tokio::time::timeout(STEP, mcp.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the server did not exit on SIG{signal}"))
            .unwrap();
        assert!(mcp.stdin.is_some(), "stdin stayed open");
        assert_eq!(status.code(), Some(0), "SIG{signal}");
        for approval in [called, relayed] {
            let withdrawn = client.get_approval(&approval.id).await.unwrap();
            assert!(withdrawn.withdraw_when_caller_leaves);
            assert_eq!(
                withdrawn.state(),
                pb::ApprovalState::Cancelled,
                "SIG{signal}"
            );
            assert_eq!(
                withdrawn.resolution.unwrap().reason,
                format!("withdrawn: countersign mcp was stopped (SIG{signal})")
            );
        }
    }
}
