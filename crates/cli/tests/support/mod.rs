//! What the tests of the agent integrations share: the `countersign` binary with a clean
//! environment, a watch that reports what a child requested, and an approver deciding over
//! gRPC as Telegram's worker would.

#![allow(dead_code)]

pub mod github;
pub mod home;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig, Watch, WatchItem, WatchOptions};
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

/// Generous bound on any single step, so that a bug fails the test instead of hanging it.
pub const STEP: Duration = Duration::from_secs(30);

/// The approver the tests decide as.
pub const APPROVER: &str = "Alice (telegram)";

/// The `countersign` under test: cargo's build, or the one a package installed
/// (`COUNTERSIGN_TEST_BIN`: scripts/test-packages runs the quickstart with the binary a wheel
/// or the npm package put on PATH).
pub fn countersign_binary() -> PathBuf {
    std::env::var_os("COUNTERSIGN_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_countersign")))
}

/// The cache directory the tests' `countersign` runs use (`$XDG_CACHE_HOME`): not the
/// machine's. Its contents are per key set (each test server has its own), so tests share it.
pub fn cache_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cache")
}

/// `countersign` talking to `server`, as user `tester`, with no settings from the machine.
pub fn countersign(server: &str) -> Command {
    client_command(countersign_binary(), server)
}

/// `countersign-hook` (beside `countersign`), like [`countersign`].
pub fn countersign_hook(server: &str) -> Command {
    client_command(
        countersign_binary().with_file_name("countersign-hook"),
        server,
    )
}

fn client_command(program: PathBuf, server: &str) -> Command {
    let mut command = Command::new(program);
    command
        .env("COUNTERSIGN_SERVER", server)
        .env("XDG_CACHE_HOME", cache_home())
        .env("USER", "tester")
        .env_remove("COUNTERSIGN_TOKEN")
        .env_remove("COUNTERSIGN_CONFIG")
        .env_remove("COUNTERSIGN_CA_CERT")
        .env_remove("COUNTERSIGN_AGENT_ID")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `command` with `input` on stdin (then closed) and collects its output.
pub async fn run_with_input(mut command: Command, input: &[u8]) -> Output {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("start countersign");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).await.expect("write stdin");
    drop(stdin);
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("countersign did not exit")
        .expect("countersign output")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
pub fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(output),
        stderr(output)
    );
}

pub fn client(server: &str) -> Client {
    Client::connect(ClientConfig::new(server)).expect("client")
}

/// A watch on all channels, past its (empty) snapshot: the next events tell what a child
/// process just requested.
pub async fn watch_requests(server: &str) -> Watch {
    let mut watch = client(server).watch(WatchOptions::channel(""));
    match tokio::time::timeout(STEP, watch.next())
        .await
        .expect("snapshot in time")
        .expect("snapshot")
    {
        WatchItem::Snapshot(pending) => assert!(pending.is_empty(), "{pending:?}"),
        WatchItem::Event(event) => panic!("expected the snapshot, got {event:?}"),
    }
    watch
}

/// The next approval requested and left pending for a human.
pub async fn next_pending(watch: &mut Watch) -> pb::Approval {
    loop {
        let item = tokio::time::timeout(STEP, watch.next())
            .await
            .expect("a request in time")
            .expect("watch");
        if let WatchItem::Event(event) = item {
            let approval = event.approval.clone().unwrap_or_default();
            if event.kind() == pb::EventKind::Requested
                && approval.state() == pb::ApprovalState::Pending
            {
                return approval;
            }
        }
    }
}

pub async fn approve(client: &Client, approval_id: &str, scope: pb::Scope, reason: &str) {
    decide(client, approval_id, pb::Verdict::Approve, scope, reason).await;
}

pub async fn reject(client: &Client, approval_id: &str, reason: &str) {
    decide(
        client,
        approval_id,
        pb::Verdict::Reject,
        pb::Scope::Once,
        reason,
    )
    .await;
}

/// Decides as Alice on Telegram, the way the Telegram worker calls `Decide`.
pub async fn decide(
    client: &Client,
    approval_id: &str,
    verdict: pb::Verdict,
    scope: pb::Scope,
    reason: &str,
) {
    resolve(
        client,
        pb::DecideRequest {
            verdict: verdict.into(),
            scope: scope.into(),
            reason: reason.to_owned(),
            ..by_alice(approval_id)
        },
    )
    .await;
}

/// Approves as Alice on Telegram with the arguments edited to `edited` (edit-on-approve).
pub async fn approve_with_edits(client: &Client, approval_id: &str, edited: &Value) {
    resolve(
        client,
        pb::DecideRequest {
            verdict: pb::Verdict::Approve.into(),
            edited_arguments_json: edited.to_string(),
            ..by_alice(approval_id)
        },
    )
    .await;
}

/// A decision on `approval_id` by Alice on Telegram, with a fresh idempotency key.
fn by_alice(approval_id: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        approval_id: approval_id.to_owned(),
        decider: Some(pb::Decider {
            channel: "telegram".into(),
            user_id: "1001".into(),
            display_name: "Alice".into(),
        }),
        idempotency_key: format!("cb-{}", uuid::Uuid::now_v7()),
        ..Default::default()
    }
}

/// Sends `request`, which must resolve the approval.
async fn resolve(client: &Client, request: pb::DecideRequest) {
    let response = client.decide(request).await.expect("decide");
    assert_eq!(response.outcome(), pb::DecideOutcome::Resolved);
}

/// The approvals of a session, newest first.
pub async fn approvals_of(client: &Client, session_id: &str) -> Vec<pb::Approval> {
    client
        .list_approvals(pb::ListApprovalsRequest {
            session_id: session_id.to_owned(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .expect("list approvals")
        .approvals
}

pub fn fixture(path: &str) -> Value {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

/// The next line a child wrote to stdout, as JSON (an MCP message); fails after [`STEP`].
pub async fn next_json_line(stdout: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let line = tokio::time::timeout(STEP, stdout.next_line())
        .await
        .expect("a message in time")
        .unwrap()
        .expect("stdout closed");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Sends `signal` ("INT", "TERM", "HUP", "KILL") to `child`, as its host would.
pub fn send_signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("the child runs");
    let sent = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// An agent's request for `tool` with `arguments` (its action the two joined), as Claude
/// Code's hook would send it, with `key` as its idempotency key.
pub async fn ask(
    client: &Client,
    risk: pb::Risk,
    key: &str,
    tool: &str,
    arguments: Value,
) -> pb::Approval {
    client
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "claude-code".into(),
            idempotency_key: key.into(),
            tool_name: tool.into(),
            arguments_json: arguments.to_string(),
            action: format!("{tool} {arguments}"),
            risk: risk.into(),
            ..Default::default()
        })
        .await
        .expect("request")
        .approval
        .expect("approval")
}
