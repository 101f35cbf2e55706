//! The built `countersign` binary against a real server on an ephemeral port: each
//! subcommand's output and exit code.

use std::path::Path;
use std::process::{Output, Stdio};

use crate::support;

use countersign_client::{pb, Watch, WatchItem};
use countersign_testkit::server::TestServer;
use serde_json::Value;
use support::{assert_exit, countersign, stderr, stdout, watch_requests, STEP};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

async fn run(server: &str, args: &[&str]) -> Output {
    let output = countersign(server).args(args).output();
    tokio::time::timeout(STEP, output)
        .await
        .expect("countersign hung")
        .unwrap()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stdout(output)))
}

async fn request_id(server: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "request",
        "--tool",
        "deploy",
        "--args",
        r#"{"env":"prod"}"#,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let output = run(server, &args).await;
    assert_exit(&output, 0);
    json(&output)["id"].as_str().unwrap().to_owned()
}

async fn next_requested(watch: &mut Watch) -> pb::Approval {
    loop {
        match tokio::time::timeout(STEP, watch.next())
            .await
            .unwrap()
            .unwrap()
        {
            WatchItem::Event(event) if event.kind() == pb::EventKind::Requested => {
                return event.approval.unwrap()
            }
            _ => {}
        }
    }
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("countersign did not exit")
        .unwrap()
}

#[tokio::test]
async fn help_documents_every_subcommand_and_the_exit_codes() {
    let output = run("http://127.0.0.1:1", &["--help"]).await;
    assert_exit(&output, 0);
    let help = stdout(&output);
    for word in [
        "request",
        "get",
        "list",
        "watch",
        "approve",
        "reject",
        "cancel",
        "consume",
        "exec",
        "events",
        "grants",
        "delegate",
        "delegations",
        "verify-audit",
        "backup",
        "COUNTERSIGN_SERVER",
        "COUNTERSIGN_TOKEN",
        "Exit codes",
    ] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
    let output = run("http://127.0.0.1:1", &["exec", "--help"]).await;
    assert_exit(&output, 0);
    let help = stdout(&output);
    for code in ["65", "66", "67", "68", "69", "126", "127"] {
        assert!(help.contains(code), "exec --help lacks exit code {code}");
    }
    // The agent ids the MCP tools use by default (crates/cli/tests/mcp.rs sees them used).
    let output = run("http://127.0.0.1:1", &["mcp", "--help"]).await;
    assert_exit(&output, 0);
    let help = stdout(&output);
    for default in [
        "claude-code for `approve`",
        "mcp-agent for `request_approval`",
    ] {
        assert!(
            help.contains(default),
            "mcp --help lacks {default}:\n{help}"
        );
    }
}

#[tokio::test]
async fn help_never_shows_the_token_from_the_environment() {
    let output = countersign("http://127.0.0.1:1")
        .env("COUNTERSIGN_TOKEN", "s3cret-t0ken")
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert_exit(&output, 0);
    assert!(!stdout(&output).contains("s3cret-t0ken"));
}

#[tokio::test]
async fn bad_usage_exits_64_without_calling_the_server() {
    let unreachable = "http://127.0.0.1:1";
    for args in [
        &["list", "--bogus"][..],
        &["request"],
        &["request", "--tool", "x", "--args", "[1, 2]"],
        &["request", "--tool", "x", "--args", "{not json"],
        &["request", "--tool", "x", "--ttl", "soon"],
        &["exec"],
        &["--config", "/nonexistent/countersign.toml", "list"],
    ] {
        let output = run(unreachable, args).await;
        assert_exit(&output, 64);
        assert!(!stderr(&output).is_empty(), "{args:?} explained nothing");
    }
    let output = run("not-a-url", &["list"]).await;
    assert_exit(&output, 64);
}

#[tokio::test]
async fn approve_without_user_in_the_environment_decides_as_the_os_account() {
    let server = TestServer::start().await;
    let url = server.url();
    let id = request_id(&url, &[]).await;
    let account = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let account = String::from_utf8(account.stdout).unwrap().trim().to_owned();
    assert!(!account.is_empty());
    let output = countersign(&url)
        .env_remove("USER")
        .args(["approve", &id])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 0);
    assert!(
        stdout(&output).contains(&format!("APPROVED by {account} via cli")),
        "{}",
        stdout(&output)
    );
}

#[tokio::test]
async fn an_unreachable_server_exits_69() {
    let output = run(
        "http://127.0.0.1:1",
        &["get", "0190a1b2-0000-7000-8000-000000000001"],
    )
    .await;
    assert_exit(&output, 69);
    assert!(
        stderr(&output).contains("unavailable"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn request_get_and_list_print_tables_or_json() {
    let server = TestServer::start().await;
    let url = server.url();

    let output = run(
        &url,
        &[
            "request",
            "--tool",
            "deploy",
            "--args",
            r#"{"env":"prod"}"#,
            "--action",
            "deploy to prod",
            "--risk",
            "high",
            "--route",
            "telegram:-1001",
            "--label",
            "team=infra",
        ],
    )
    .await;
    assert_exit(&output, 0);
    let table = stdout(&output);
    assert!(table.contains("state:        PENDING"), "{table}");
    assert!(table.contains("routes:       telegram:-1001"), "{table}");
    let id = table
        .lines()
        .next()
        .unwrap()
        .strip_prefix("id:")
        .unwrap()
        .trim()
        .to_owned();

    let output = run(&url, &["get", &id, "--output", "json"]).await;
    assert_exit(&output, 0);
    let approval = json(&output);
    assert_eq!(approval["id"], id.as_str());
    assert_eq!(approval["state"], "PENDING");
    assert_eq!(approval["risk"], "HIGH");
    assert_eq!(approval["arguments"]["env"], "prod");
    assert_eq!(approval["requester"], "tester");
    assert_eq!(approval["agent_id"], "countersign-cli");
    assert_eq!(approval["labels"]["team"], "infra");
    assert_eq!(approval["routes"][0]["target"], "-1001");

    let other = request_id(&url, &["--agent", "other-agent"]).await;
    let output = run(&url, &["list"]).await;
    assert_exit(&output, 0);
    let table = stdout(&output);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("STATE"));
    assert!(lines[1].starts_with(&other), "newest first: {table}");
    assert!(lines[2].starts_with(&id) && lines[2].contains("deploy to prod"));

    let output = run(&url, &["list", "--agent", "other-agent", "-o", "json"]).await;
    assert_exit(&output, 0);
    let listed = json(&output);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [other.as_str()]);

    let output = run(&url, &["list", "--limit", "1", "-o", "json"]).await;
    assert_eq!(json(&output).as_array().unwrap().len(), 1);
    let output = run(&url, &["list", "--state", "approved", "-o", "json"]).await;
    assert_eq!(json(&output), Value::Array(vec![]));

    let output = run(&url, &["get", "0190a1b2-0000-7000-8000-000000000001"]).await;
    assert_exit(&output, 70);
    assert!(stderr(&output).contains("not found"), "{}", stderr(&output));
}

#[tokio::test]
async fn approve_resolves_a_waiting_request_and_a_late_decision_is_not_applied() {
    let server = TestServer::start().await;
    let url = server.url();
    let mut watch = watch_requests(&url).await;
    let waiting = countersign(&url)
        .args(["request", "--tool", "deploy", "--wait", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = next_requested(&mut watch).await.id;

    let output = run(&url, &["approve", &id, "--reason", "looks fine"]).await;
    assert_exit(&output, 0);
    assert!(
        stdout(&output).starts_with("RESOLVED: approval"),
        "{}",
        stdout(&output)
    );
    assert!(
        stdout(&output).contains("APPROVED by tester via cli: looks fine"),
        "{}",
        stdout(&output)
    );

    let waited = finish(waiting).await;
    assert_exit(&waited, 0);
    assert_eq!(json(&waited)["state"], "APPROVED");
    assert!(stderr(&waited).contains(&format!("waiting for a decision on approval {id}")));

    let output = run(&url, &["reject", &id, "--as", "mallory", "-o", "json"]).await;
    assert_exit(&output, 71);
    let answer = json(&output);
    assert_eq!(answer["outcome"], "ALREADY_RESOLVED");
    assert_eq!(answer["approval"]["state"], "APPROVED");
}

#[tokio::test]
async fn a_rejected_request_exits_65_and_a_cancelled_one_67() {
    let server = TestServer::start().await;
    let url = server.url();
    let mut watch = watch_requests(&url).await;

    let waiting = countersign(&url)
        .args(["request", "--tool", "deploy", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = next_requested(&mut watch).await.id;
    let output = run(
        &url,
        &["reject", &id, "--as", "alice", "--reason", "not now"],
    )
    .await;
    assert_exit(&output, 0);
    let waited = finish(waiting).await;
    assert_exit(&waited, 65);
    assert!(
        stdout(&waited).contains("state:        REJECTED"),
        "{}",
        stdout(&waited)
    );

    let waiting = countersign(&url)
        .args(["request", "--tool", "deploy", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = next_requested(&mut watch).await.id;
    let output = run(
        &url,
        &["cancel", &id, "--reason", "changed my mind", "-o", "json"],
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(json(&output)["state"], "CANCELLED");
    assert_exit(&finish(waiting).await, 67);
}

#[tokio::test]
async fn consume_marks_an_approved_call_executed_once() {
    let server = TestServer::start().await;
    let url = server.url();
    let id = request_id(&url, &[]).await;
    assert_exit(&run(&url, &["approve", &id]).await, 0);

    let output = run(
        &url,
        &[
            "consume",
            &id,
            "--outcome",
            "failed",
            "--detail",
            "disk full",
            "-o",
            "json",
        ],
    )
    .await;
    assert_exit(&output, 0);
    let approval = json(&output);
    assert_eq!(approval["state"], "CONSUMED");
    assert_eq!(approval["consumption"]["outcome"], "FAILED");
    assert_eq!(approval["consumption"]["detail"], "disk full");

    let output = run(&url, &["consume", &id]).await;
    assert_exit(&output, 70);
}

#[tokio::test]
async fn settings_come_from_the_config_file_below_flags_and_environment() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("countersign.toml");
    std::fs::write(
        &config,
        format!(
            "server = \"{}\"\nagent_id = \"ci-pipeline\"\nuser = \"carol\"\n",
            server.url()
        ),
    )
    .unwrap();
    let mut command = countersign("unused");
    command
        .env_remove("COUNTERSIGN_SERVER")
        .arg("--config")
        .arg(&config);
    let output = command
        .args(["request", "--tool", "deploy", "-o", "json"])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 0);
    let approval = json(&output);
    assert_eq!(approval["agent_id"], "ci-pipeline");
    let id = approval["id"].as_str().unwrap();

    let output = countersign(&server.url())
        .arg("--config")
        .arg(&config)
        .args(["approve", id])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 0);
    assert!(
        stdout(&output).contains("by carol via cli"),
        "{}",
        stdout(&output)
    );

    std::fs::write(&config, "serverr = \"typo\"\n").unwrap();
    let output = countersign(&server.url())
        .arg("--config")
        .arg(&config)
        .arg("list")
        .output()
        .await
        .unwrap();
    assert_exit(&output, 64);
    assert!(stderr(&output).contains("serverr"), "{}", stderr(&output));
}

async fn next_json_line(lines: &mut Lines<BufReader<ChildStdout>>) -> Value {
    let line = tokio::time::timeout(STEP, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// `watch` prints the snapshot, then each event as it happens, and carries on across a
/// server restart.
#[tokio::test]
async fn watch_tails_events_as_json_lines_across_a_server_restart() {
    let mut server = TestServer::start().await;
    let url = server.url();
    let earlier = request_id(&url, &[]).await;
    let mut watching = countersign(&url)
        .args(["watch", "-o", "json", "--heartbeat-timeout", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watching.stdout.take().unwrap()).lines();

    let snapshot = next_json_line(&mut lines).await;
    assert_eq!(snapshot["type"], "snapshot");
    assert_eq!(snapshot["approvals"][0]["id"], earlier.as_str());

    let first = request_id(&url, &[]).await;
    let event = next_json_line(&mut lines).await;
    assert_eq!(
        (event["type"].as_str(), event["kind"].as_str()),
        (Some("event"), Some("REQUESTED"))
    );
    assert_eq!(event["approval"]["id"], first.as_str());
    let first_seq = event["seq"].as_u64().unwrap();

    server.restart().await;
    assert_exit(&run(&url, &["approve", &first]).await, 0);
    let event = next_json_line(&mut lines).await;
    assert_eq!(event["kind"], "RESOLVED");
    assert_eq!(event["approval"]["id"], first.as_str());
    assert_eq!(event["decision"]["decider"]["user_id"], "tester");
    assert!(event["seq"].as_u64().unwrap() > first_seq);

    watching.kill().await.unwrap();
}

#[tokio::test]
async fn watch_prints_a_table_line_per_event() {
    let server = TestServer::start().await;
    let url = server.url();
    let mut watching = countersign(&url)
        .args(["watch", "--channel", "telegram"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watching.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(STEP, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, "snapshot: 0 pending");
    let id = request_id(&url, &["--route", "telegram", "--action", "restart the db"]).await;
    let line = tokio::time::timeout(STEP, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        line.contains("REQUESTED") && line.contains(&id) && line.contains("restart the db"),
        "{line}"
    );
    watching.kill().await.unwrap();
}

/// Starts `countersign exec ARGS` in `dir`, with its output captured.
fn spawn_exec(url: &str, dir: &Path, args: &[&str]) -> Child {
    countersign(url)
        .arg("exec")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A shell command that leaves a file behind, so a test can tell whether it ran.
const LEAVE_MARK: [&str; 4] = ["--", "sh", "-c", "echo ran > mark; echo hello; exit 3"];

#[tokio::test]
async fn exec_runs_the_command_only_after_approval_and_exits_with_its_status() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let mut args = vec!["--reason", "tidy up", "--risk", "low"];
    args.extend(LEAVE_MARK);
    let exec = spawn_exec(&url, dir.path(), &args);

    let pending = next_requested(&mut watch).await;
    assert_eq!(pending.tool_name, "exec");
    assert_eq!(pending.risk(), pb::Risk::Low);
    assert_eq!(
        pending.action,
        "run: sh -c 'echo ran > mark; echo hello; exit 3'"
    );
    let arguments: Value = serde_json::from_str(&pending.arguments_json).unwrap();
    assert_eq!(
        arguments["argv"],
        serde_json::json!(["sh", "-c", "echo ran > mark; echo hello; exit 3"])
    );
    assert_eq!(
        Path::new(arguments["cwd"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        dir.path().canonicalize().unwrap()
    );
    assert!(!dir.path().join("mark").exists(), "ran before approval");

    assert_exit(&run(&url, &["approve", &pending.id]).await, 0);
    let output = finish(exec).await;
    assert_exit(&output, 3);
    assert_eq!(
        stdout(&output),
        "hello\n",
        "the command's output, and only it, on stdout"
    );
    assert!(dir.path().join("mark").exists());

    let output = run(&url, &["get", &pending.id, "-o", "json"]).await;
    let approval = json(&output);
    assert_eq!(approval["state"], "CONSUMED");
    assert_eq!(approval["consumption"]["outcome"], "FAILED");
    assert_eq!(approval["consumption"]["detail"], "exit status 3");
}

#[tokio::test]
async fn exec_of_a_succeeding_command_exits_0_and_records_success() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(&url, dir.path(), &["--", "echo", "hello"]);
    let pending = next_requested(&mut watch).await;
    assert_exit(&run(&url, &["approve", &pending.id]).await, 0);
    let output = finish(exec).await;
    assert_exit(&output, 0);
    assert_eq!(stdout(&output), "hello\n");
    let approval = json(&run(&url, &["get", &pending.id, "-o", "json"]).await);
    assert_eq!(approval["consumption"]["outcome"], "SUCCEEDED");
}

/// The approved LEAVE_MARK command ran (exit 3, mark left) and its approval is the only one,
/// consumed.
async fn assert_ran_once_on_one_approval(url: &str, exec: Child, dir: &Path) {
    let output = finish(exec).await;
    assert_exit(&output, 3);
    assert!(dir.join("mark").exists());
    let listed = json(&run(url, &["list", "-o", "json"]).await);
    assert_eq!(listed.as_array().unwrap().len(), 1, "no second approval");
    assert_eq!(listed[0]["state"], "CONSUMED");
}

#[tokio::test]
async fn exec_keeps_waiting_across_a_server_restart() {
    let mut server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(&url, dir.path(), &LEAVE_MARK);
    let pending = next_requested(&mut watch).await;
    server.restart().await;
    assert_exit(&run(&url, &["approve", &pending.id]).await, 0);
    assert_ran_once_on_one_approval(&url, exec, dir.path()).await;
}

/// A TCP proxy in front of a server: on its first connection it forwards the server's HTTP/2
/// frames until the first response HEADERS of a call, then closes both sides instead (the
/// server has done the call; its answer never arrives, as when a restart cuts it). Later
/// connections pass through.
async fn answer_cutting_proxy(server: std::net::SocketAddr) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut cut = true;
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::TcpStream::connect(server).await.unwrap();
            tokio::spawn(relay(client, upstream, std::mem::take(&mut cut)));
        }
    });
    url
}

async fn relay(client: tokio::net::TcpStream, upstream: tokio::net::TcpStream, cut: bool) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let requests = tokio::io::copy(&mut client_read, &mut upstream_write);
    let responses = async {
        if !cut {
            let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
            return;
        }
        loop {
            let mut header = [0u8; 9];
            if upstream_read.read_exact(&mut header).await.is_err() {
                return;
            }
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let mut payload = vec![0u8; length];
            if upstream_read.read_exact(&mut payload).await.is_err() {
                return;
            }
            let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
            const HEADERS: u8 = 0x1;
            if header[3] == HEADERS && stream & 0x7fff_ffff != 0 {
                return;
            }
            if client_write.write_all(&header).await.is_err()
                || client_write.write_all(&payload).await.is_err()
            {
                return;
            }
        }
    };
    // Whichever direction ends first closes both connections.
    tokio::select! {
        _ = requests => {}
        _ = responses => {}
    }
}

/// The request reached the server but its answer was lost (the connection broke): exec sends
/// it again under the same idempotency key, finds the approval the server made, waits for it
/// and runs the command once approved; there is still one approval.
#[tokio::test]
async fn exec_resends_a_request_whose_answer_was_lost() {
    let server = TestServer::start().await;
    let url = server.url();
    let proxy = answer_cutting_proxy(server.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(&proxy, dir.path(), &LEAVE_MARK);
    let pending = next_requested(&mut watch).await;
    assert_exit(&run(&url, &["approve", &pending.id]).await, 0);
    assert_ran_once_on_one_approval(&url, exec, dir.path()).await;
}

#[tokio::test]
async fn exec_does_not_run_a_rejected_command() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(&url, dir.path(), &LEAVE_MARK);
    let pending = next_requested(&mut watch).await;
    assert_exit(
        &run(&url, &["reject", &pending.id, "--reason", "no"]).await,
        0,
    );
    let output = finish(exec).await;
    assert_exit(&output, 65);
    assert!(stdout(&output).is_empty());
    assert!(
        stderr(&output).contains("not running the command"),
        "{}",
        stderr(&output)
    );
    assert!(!dir.path().join("mark").exists());
}

#[tokio::test]
async fn exec_does_not_run_an_expired_command() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--ttl", "1s"];
    args.extend(LEAVE_MARK);
    let output = finish(spawn_exec(&server.url(), dir.path(), &args)).await;
    assert_exit(&output, 66);
    assert!(!dir.path().join("mark").exists());
}

#[tokio::test]
async fn exec_does_not_run_a_cancelled_command() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(&url, dir.path(), &LEAVE_MARK);
    let pending = next_requested(&mut watch).await;
    assert_exit(&run(&url, &["cancel", &pending.id]).await, 0);
    assert_exit(&finish(exec).await, 67);
    assert!(!dir.path().join("mark").exists());
}

#[tokio::test]
async fn exec_gives_up_at_its_timeout_and_cancels_the_request() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--timeout", "300ms"];
    args.extend(LEAVE_MARK);
    let output = finish(spawn_exec(&url, dir.path(), &args)).await;
    assert_exit(&output, 68);
    assert!(!dir.path().join("mark").exists());
    let listed = json(&run(&url, &["list", "-o", "json"]).await);
    assert_eq!(listed[0]["state"], "CANCELLED");
}

#[tokio::test]
async fn exec_does_not_run_anything_when_the_server_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let output = finish(spawn_exec("http://127.0.0.1:1", dir.path(), &LEAVE_MARK)).await;
    assert_exit(&output, 69);
    assert!(!dir.path().join("mark").exists());
}

#[tokio::test]
async fn exec_of_an_approved_but_missing_command_exits_127() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let exec = spawn_exec(
        &url,
        dir.path(),
        &["--", "countersign-test-no-such-command"],
    );
    let pending = next_requested(&mut watch).await;
    assert_exit(&run(&url, &["approve", &pending.id]).await, 0);
    assert_exit(&finish(exec).await, 127);
    let approval = json(&run(&url, &["get", &pending.id, "-o", "json"]).await);
    assert_eq!(approval["consumption"]["outcome"], "FAILED");
}

#[tokio::test]
async fn events_grants_and_verify_audit_show_and_check_the_audit_trail() {
    let server = TestServer::start().await;
    let url = server.url();
    let id = request_id(&url, &["--session", "s1"]).await;
    assert_exit(&run(&url, &["approve", &id, "--scope", "session"]).await, 0);

    let output = run(&url, &["events", "--approval", &id]).await;
    assert_exit(&output, 0);
    let table = stdout(&output);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("SEQ"), "{table}");
    assert!(lines[1].contains("REQUESTED"), "{table}");
    assert!(lines[2].contains("RESOLVED") && lines[2].contains("APPROVE by tester via cli"));

    let output = run(&url, &["grants", "list", "-o", "json"]).await;
    assert_exit(&output, 0);
    let grants = json(&output);
    assert_eq!(grants[0]["state"], "ACTIVE");
    assert_eq!(grants[0]["approval_id"], id.as_str());
    let grant_id = grants[0]["id"].as_str().unwrap().to_owned();
    let output = run(&url, &["grants", "revoke", &grant_id, "--reason", "done"]).await;
    assert_exit(&output, 0);
    assert!(stdout(&output).contains("REVOKED"), "{}", stdout(&output));

    let output = run(
        &url,
        &[
            "events",
            "--kind",
            "grant-revoked",
            "--since",
            "1h",
            "-o",
            "json",
        ],
    )
    .await;
    assert_exit(&output, 0);
    let events = json(&output);
    assert_eq!(events.as_array().unwrap().len(), 1);
    assert_eq!(events[0]["kind"], "GRANT_REVOKED");
    assert!(events[0]["detail"].as_str().unwrap().contains("done"));
    assert_eq!(events[0]["hash"].as_str().unwrap().len(), 64);

    let output = run(&url, &["verify-audit"]).await;
    assert_exit(&output, 0);
    assert!(
        stdout(&output).contains("intact: 3 events"),
        "{}",
        stdout(&output)
    );

    // A hand edit of the database is found.
    assert_eq!(
        server
            .tamper("UPDATE events SET at_ms = at_ms - 1 WHERE seq = 2")
            .await,
        1
    );
    let output = run(&url, &["verify-audit", "-o", "json"]).await;
    assert_exit(&output, 72);
    assert_eq!(json(&output)["broken_seq"], 2);
}

#[tokio::test]
async fn backup_has_the_server_write_a_verified_copy() {
    let server = TestServer::start().await;
    let url = server.url();
    request_id(&url, &[]).await;
    let output = run(&url, &["backup", "nightly.db", "-o", "json"]).await;
    if countersign_testkit::postgres::enabled() {
        assert_exit(&output, 70);
        assert!(stderr(&output).contains("pg_dump"), "{}", stderr(&output));
        return;
    }
    assert_exit(&output, 0);
    let made = json(&output);
    let copy = server.database_path().with_file_name("nightly.db");
    assert_eq!(made["path"], copy.display().to_string());
    assert_eq!(made["newest_seq"], 1);
    assert_eq!(made["bytes"], std::fs::metadata(&copy).unwrap().len());

    let output = run(&url, &["backup", "nightly.db"]).await;
    assert_exit(&output, 70);
    assert!(
        stderr(&output).contains("already exists"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn admin_commands_need_an_admin_token() {
    use countersign_server::config::Role;
    use countersign_testkit::server::token;
    const AGENT_TOKEN: &str = "cli-agent-token-0123456789";
    let server = TestServer::start_with(|c| {
        c.tokens = vec![token("cli-agent", Role::Agent, &["*"], AGENT_TOKEN)];
    })
    .await;
    let output = countersign(&server.url())
        .env("COUNTERSIGN_TOKEN", AGENT_TOKEN)
        .args(["events"])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 77);
    assert!(
        stderr(&output).contains("may not call ListEvents"),
        "{}",
        stderr(&output)
    );
    assert_exit(&run(&server.url(), &["verify-audit"]).await, 77);
}

/// `approve --edit` opens $VISUAL/$EDITOR on the pretty-printed arguments: a malformed or empty
/// edit decides nothing; a valid one approves the edited arguments.
#[tokio::test]
async fn approve_with_edit_opens_the_editor_and_approves_what_was_saved() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    // The "editor": keeps a copy of what it was shown, then writes $NEW_ARGUMENTS over it.
    let editor = dir.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\ncp \"$1\" \"$SHOWN\"\nprintf '%s' \"$NEW_ARGUMENTS\" > \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let shown = dir.path().join("shown.json");
    let id = request_id(&url, &[]).await;
    let edit = |arguments: &str| {
        let mut command = countersign(&url);
        command
            .args(["approve", &id, "--edit", "-o", "json"])
            .env_remove("VISUAL")
            .env("EDITOR", &editor)
            .env("SHOWN", &shown)
            .env("NEW_ARGUMENTS", arguments)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        tokio::time::timeout(STEP, command.output())
    };

    let duplicate = edit(r#"{"env": "staging", "env": "prod"}"#)
        .await
        .unwrap()
        .unwrap();
    assert_exit(&duplicate, 70);
    assert!(
        stderr(&duplicate).contains("edited_arguments_json"),
        "{}",
        stderr(&duplicate)
    );
    assert_eq!(
        std::fs::read_to_string(&shown).unwrap(),
        "{\n  \"env\": \"prod\"\n}\n",
        "the editor shows the arguments pretty-printed"
    );
    let empty = edit("  ").await.unwrap().unwrap();
    assert_exit(&empty, 64);
    assert!(stderr(&empty).contains("empty"), "{}", stderr(&empty));
    let unchanged = json(&run(&url, &["get", &id, "-o", "json"]).await);
    assert_eq!(unchanged["state"], "PENDING");
    assert_eq!(unchanged["decisions"], serde_json::json!([]));

    let approved = edit(r#"{"env": "staging"}"#).await.unwrap().unwrap();
    assert_exit(&approved, 0);
    let answer = json(&approved);
    assert_eq!(answer["outcome"], "RESOLVED");
    assert_eq!(answer["approval"]["state"], "APPROVED");
    assert_eq!(answer["approval"]["arguments"]["env"], "prod");
    assert_eq!(answer["approval"]["edited_arguments"]["env"], "staging");
    assert_eq!(answer["approval"]["editor"]["user_id"], "tester");

    let text = run(&url, &["get", &id]).await;
    assert!(stdout(&text).contains("edited args:"), "{}", stdout(&text));
    assert!(
        stdout(&text).contains("with edited arguments"),
        "{}",
        stdout(&text)
    );
}

/// `approve --args-digest` names the version reviewed: another version is refused and
/// decides nothing; the current one approves.
#[tokio::test]
async fn approve_with_args_digest_approves_only_the_version_named() {
    let server = TestServer::start().await;
    let url = server.url();
    let id = request_id(&url, &[]).await;
    let stale = "0".repeat(64);
    let refused = run(&url, &["approve", &id, "--args-digest", &stale]).await;
    assert_exit(&refused, 70);
    assert!(stderr(&refused).contains(&stale), "{}", stderr(&refused));
    let shown = json(&run(&url, &["get", &id, "-o", "json"]).await);
    assert_eq!(shown["state"], "PENDING");
    let digest = shown["args_digest"].as_str().unwrap();
    let approved = run(
        &url,
        &["approve", &id, "--args-digest", digest, "-o", "json"],
    )
    .await;
    assert_exit(&approved, 0);
    assert_eq!(json(&approved)["approval"]["state"], "APPROVED");
    assert_eq!(
        json(&approved)["approval"]["decisions"][0]["args_digest"],
        digest
    );
}

/// An approval a rule marks `step_up = "passkey"`: `get` shows it, and `approve` from the CLI
/// is refused with where to approve instead (the inbox page), deciding nothing.
#[tokio::test]
async fn get_shows_a_passkey_step_up_and_approve_says_where_to_give_it() {
    let server = TestServer::start_with_toml(
        "[passkeys]\ninbox_url = \"http://localhost:8080\"\n\n[[rules]]\nname = \"deploys need a passkey\"\naction = \"require\"\nstep_up = \"passkey\"\n[rules.match]\ntool = \"deploy\"\n",
    )
    .await;
    let url = server.url();
    let id = request_id(&url, &[]).await;
    let shown = json(&run(&url, &["get", &id, "-o", "json"]).await);
    assert_eq!(shown["step_up"], "passkey", "{shown}");
    let text = run(&url, &["get", &id]).await;
    assert!(
        stdout(&text).contains("\nstep-up:      passkey\n"),
        "{}",
        stdout(&text)
    );

    let refused = run(&url, &["approve", &id]).await;
    assert_exit(&refused, 77);
    assert!(
        stderr(&refused).contains(&format!(
            "approve it in the web inbox, http://localhost:8080/approvals/{id}"
        )),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        json(&run(&url, &["get", &id, "-o", "json"]).await)["state"],
        "PENDING"
    );
    // Without a step-up rule the field stays out of the text and is null in JSON.
    let plain = TestServer::start().await;
    let id = request_id(&plain.url(), &[]).await;
    assert_eq!(
        json(&run(&plain.url(), &["get", &id, "-o", "json"]).await)["step_up"],
        Value::Null
    );
    assert!(!stdout(&run(&plain.url(), &["get", &id]).await).contains("step-up"));
}

#[tokio::test]
async fn delegate_then_approve_on_behalf_and_show_group_progress() {
    let server = TestServer::start_with_toml(countersign_testkit::docs::groups_example()).await;
    let url = server.url();
    let output = run(
        &url,
        &[
            "delegate", "--from", "alice", "--to", "erin", "--until", "1h", "--reason", "holiday",
            "-o", "json",
        ],
    )
    .await;
    assert_exit(&output, 0);
    let created = json(&output);
    assert_eq!(created[0]["state"], "ACTIVE");
    assert_eq!(created[0]["delegate"], "erin");
    let delegation_id = created[0]["id"].as_str().unwrap().to_owned();

    let id = request_id(&url, &["--risk", "high", "--group", "security=2"]).await;
    let approve_as = |user: &'static str| {
        let mut command = support::countersign(&url);
        command.env("USER", user).args(["approve", &id]);
        async move {
            tokio::time::timeout(STEP, command.output())
                .await
                .expect("countersign hung")
                .unwrap()
        }
    };
    // dave is in no group of the approval: refused, with the reason.
    let refused = approve_as("dave").await;
    assert!(
        stderr(&refused).contains("not a member of security"),
        "{}",
        stderr(&refused)
    );
    assert_ne!(refused.status.code(), Some(0));
    assert_exit(&approve_as("erin").await, 0);

    let output = run(&url, &["get", &id]).await;
    assert_exit(&output, 0);
    let shown = stdout(&output);
    assert!(shown.contains("1 of 2 from security"), "{shown}");
    assert!(shown.contains("(erin on behalf of alice)"), "{shown}");
    let output = run(&url, &["events", "--approval", &id]).await;
    assert_exit(&output, 0);
    assert!(
        stdout(&output).contains("APPROVE by erin via cli (erin on behalf of alice)"),
        "{}",
        stdout(&output)
    );

    let output = run(&url, &["delegations", "list"]).await;
    assert_exit(&output, 0);
    assert!(stdout(&output).contains(&delegation_id));
    let output = run(
        &url,
        &["delegations", "revoke", &delegation_id, "-o", "json"],
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(json(&output)[0]["state"], "REVOKED");
    let output = run(&url, &["delegations", "list", "-o", "json"]).await;
    assert_eq!(json(&output), serde_json::json!([]));
}

/// `countersign delegate --to … --until …` delegates the CLI user's own vote: the server maps
/// the user through the approvers' `cli` identities.
#[tokio::test]
async fn delegate_without_from_delegates_the_cli_users_own_vote() {
    let server = TestServer::start_with_toml(countersign_testkit::docs::groups_example()).await;
    let delegate_as = |user: &'static str| {
        let mut command = support::countersign(&server.url());
        command
            .env("USER", user)
            .args(["delegate", "--to", "dave", "--until", "2h", "-o", "json"]);
        async move {
            tokio::time::timeout(STEP, command.output())
                .await
                .expect("countersign hung")
                .unwrap()
        }
    };
    let output = delegate_as("bob").await;
    assert_exit(&output, 0);
    let created = json(&output);
    assert_eq!(created[0]["delegator"], "bob");
    assert_eq!(created[0]["delegate"], "dave");

    // Someone who is no approver has no vote to delegate: refused, naming the field.
    let refused = delegate_as("mallory").await;
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        stderr(&refused).contains("delegator") && stderr(&refused).contains("mallory"),
        "{}",
        stderr(&refused)
    );
}

/// An approver who edits an `exec` call approves another command: exec runs exactly that one
/// (never the one typed), and its consumption names the edited version.
#[tokio::test]
async fn exec_runs_the_command_as_an_approver_edited_it() {
    let server = TestServer::start().await;
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&url).await;
    let mut args = vec!["--risk", "low"];
    args.extend(LEAVE_MARK);
    let exec = spawn_exec(&url, dir.path(), &args);
    let pending = next_requested(&mut watch).await;
    let cwd = dir.path().to_string_lossy().to_string();
    let edited = serde_json::json!({"argv": ["sh", "-c", "echo edited > mark"], "cwd": cwd});
    support::approve_with_edits(&support::client(&url), &pending.id, &edited).await;
    let output = finish(exec).await;
    assert_exit(&output, 0);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("mark")).unwrap(),
        "edited\n",
        "the edited command ran, not the typed one"
    );
    assert!(
        stderr(&output).contains("edited the command"),
        "{}",
        stderr(&output)
    );
    let approval = json(&run(&url, &["get", &pending.id, "-o", "json"]).await);
    assert_eq!(approval["state"], "CONSUMED");
    assert_eq!(approval["consumption"]["outcome"], "SUCCEEDED");
}
