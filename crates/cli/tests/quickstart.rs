//! The quickstart (docs/quickstart.md) as a new user runs it, from an empty home directory:
//! `countersign setup telegram` (the bot token typed at its prompt, the pairing code sent from
//! the phone), `countersign up`, `countersign install claude-code`; then Claude Code's hook
//! asks and the phone decides. Against the fake Bot API, with the real binary.
//!
//! Also: pairing refuses wrong, reused and expired codes; `up` keeps the server's crash
//! guarantees under SIGKILL; `doctor` names what is missing; no secret reaches a log line or
//! doctor's output.

use crate::support;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_client::{pb, ClientError};
use countersign_testkit::telegram::{ChatMessage, FakeTelegram, RecordedRequest, TestUser};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout};

use support::home::{hook_answer, installed_hook, spawn_hook, terminate, text, Home};
use support::STEP;

const BOT_TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

/// A running `setup telegram`, past the line that shows the pairing code.
struct Setup {
    child: Child,
    stdout: BufReader<ChildStdout>,
    code: String,
    shown: String,
}

impl Setup {
    /// Starts `countersign setup telegram <args>`, types `typed` at its prompt (if any), and
    /// reads the pairing code it shows.
    async fn start(home: &Home, args: &[&str], typed: Option<&str>) -> Setup {
        let mut all = vec!["setup", "telegram"];
        all.extend_from_slice(args);
        let mut command = home.countersign(&all);
        command.stdin(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(typed) = typed {
            stdin.write_all(typed.as_bytes()).await.unwrap();
        }
        drop(stdin);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut shown = String::new();
        let code = tokio::time::timeout(STEP, async {
            loop {
                let mut line = String::new();
                if stdout.read_line(&mut line).await.unwrap() == 0 {
                    let mut stderr = String::new();
                    let _ = child
                        .stderr
                        .take()
                        .unwrap()
                        .read_to_string(&mut stderr)
                        .await;
                    panic!("setup ended without a code:\n{shown}\n{stderr}");
                }
                shown.push_str(&line);
                if let Some(code) = line.trim().strip_prefix("/start ") {
                    return code.to_owned();
                }
            }
        })
        .await
        .expect("no pairing code shown");
        Setup {
            child,
            stdout,
            code,
            shown,
        }
    }

    /// Waits for the exit; returns the exit code, the rest of stdout, and stderr.
    async fn finish(mut self) -> (Option<i32>, String, String) {
        let mut rest = String::new();
        let mut stderr = String::new();
        let mut err_pipe = self.child.stderr.take().unwrap();
        tokio::time::timeout(STEP, async {
            let _ = self.stdout.read_to_string(&mut rest).await;
            let _ = err_pipe.read_to_string(&mut stderr).await;
        })
        .await
        .expect("setup did not finish");
        let status = self.child.wait().await.unwrap();
        (status.code(), format!("{}{rest}", self.shown), stderr)
    }
}

fn alice() -> TestUser {
    TestUser::new(1001, "Alice", Some("alice"))
}

/// The bot's text answers to a message of `chat` that replied to `message_id`.
async fn reply_to(telegram: &FakeTelegram, chat: i64, message_id: i64) -> String {
    let is_reply = |request: &RecordedRequest| {
        request.method == "sendMessage"
            && request.param_i64("chat_id") == Some(chat)
            && request
                .params
                .get("reply_parameters")
                .and_then(|reply| reply.get("message_id"))
                .and_then(Value::as_i64)
                == Some(message_id)
    };
    let requests = telegram
        .wait_for_requests("the bot's reply", |requests| requests.iter().any(is_reply))
        .await;
    let reply = requests.into_iter().find(|r| is_reply(r)).unwrap();
    reply.param_str("text").unwrap_or_default().to_owned()
}

/// The `nth` (from 0) approval request message, while the hook `asking` waits for its answer.
/// A hook that ends first, or no message in time, fails the test with the hook's output and
/// `up`'s log: they say which of the hook, the server and the worker lost the request.
async fn shown_while_asking(
    telegram: &FakeTelegram,
    home: &Home,
    asking: &mut Child,
    nth: usize,
) -> ChatMessage {
    use futures::FutureExt as _;
    let shown = std::panic::AssertUnwindSafe(request_message(telegram, alice().id, nth));
    let failure = tokio::select! {
        shown = shown.catch_unwind() => match shown {
            Ok(message) => return message,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "the wait for the message panicked".into()),
        },
        status = asking.wait() => format!("the hook ended first ({status:?})"),
    };
    let _ = asking.start_kill();
    let mut output = String::new();
    if let Some(mut stdout) = asking.stdout.take() {
        let _ = tokio::time::timeout(STEP, stdout.read_to_string(&mut output)).await;
    }
    if let Some(mut stderr) = asking.stderr.take() {
        let _ = tokio::time::timeout(STEP, stderr.read_to_string(&mut output)).await;
    }
    panic!(
        "request message {nth}: {failure}\nthe hook's output:\n{output}\nup's log:\n{}",
        home.up_log()
    );
}

/// The `nth` (from 0) approval request message with buttons in `chat`, as it shows now.
async fn request_message(telegram: &FakeTelegram, chat: i64, nth: usize) -> ChatMessage {
    let is_request = |request: &RecordedRequest| {
        request.method == "sendMessage"
            && request.succeeded()
            && request.param_i64("chat_id") == Some(chat)
            && !request.callback_data().is_empty()
    };
    let requests = telegram
        .wait_for_requests("an approval request message", |requests| {
            requests.iter().filter(|r| is_request(r)).count() > nth
        })
        .await;
    let id = requests
        .iter()
        .filter(|r| is_request(r))
        .nth(nth)
        .and_then(RecordedRequest::result_message_id)
        .unwrap();
    telegram.message(chat, id).unwrap()
}

fn button(message: &ChatMessage, label: &str) -> String {
    let index = message
        .button_texts()
        .iter()
        .position(|text| text.contains(label))
        .unwrap_or_else(|| panic!("no {label:?} button in {message:?}"));
    message.callback_data()[index].clone()
}

fn assert_no_secret(home: &Home, shown: &str, what: &str) {
    for name in ["worker-token", "agent-token", "admin-token"] {
        let secret = home.secret(name);
        assert!(
            !shown.contains(&secret),
            "{what} shows the {name}:\n{shown}"
        );
    }
    assert!(!shown.contains(BOT_TOKEN), "{what} shows the bot token");
    // Nor the secret part of it alone.
    assert!(!shown.contains(BOT_TOKEN.split_once(':').unwrap().1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_from_an_empty_home_to_a_phone_approval_and_a_rejection() {
    // Exactly what docs/quickstart.md tells the user to type.
    assert_eq!(
        countersign_testkit::docs::quickstart_commands(),
        [
            "countersign setup telegram",
            "countersign up",
            "countersign install claude-code"
        ]
    );
    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let home = Home::new(&telegram.api_url());
    let alice = alice();

    // 1. countersign setup telegram: the token typed at the prompt, the code sent by phone.
    let setup = Setup::start(&home, &[], Some(&format!("{BOT_TOKEN}\n"))).await;
    assert!(setup.shown.contains("@SomeBot"), "{}", setup.shown);
    let (_, start) = telegram.send_text(&alice, alice.id, &format!("/start {}", setup.code), None);
    let (code, stdout, stderr) = setup.finish().await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Paired Alice (@alice) as approver telegram:1001"),
        "{stdout}"
    );
    assert!(reply_to(&telegram, alice.id, start)
        .await
        .starts_with("Paired"));
    assert_no_secret_but_bot_token_is_private(&home);

    // 2. countersign up. Its generated tokens are readable by the user only.
    let mut up = home.up().await;
    for name in ["worker-token", "agent-token", "admin-token"] {
        let path = home.data().join("secrets").join(name);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    }

    // 3. countersign install claude-code.
    let installed = home.run(&["install", "claude-code"]).await;
    assert_eq!(installed.status.code(), Some(0), "{}", text(&installed));
    let hook = installed_hook(&home);
    assert!(hook.contains("--token-file"), "{hook}");
    // The hook alone, installed beside `countersign` (by cargo, the archive, the wheel and the
    // npm package's platform binary: scripts/test-packages runs this test with each).
    let program = hook.split_whitespace().next().unwrap();
    assert!(
        program.ends_with("/countersign-hook") && Path::new(program).is_file(),
        "{hook}"
    );

    // Claude Code asks; Alice taps Approve; the hook allows.
    let mut asking = spawn_hook(&home, &hook, "toolu_01", "rm -rf build");
    let message = shown_while_asking(&telegram, &home, &mut asking, 0).await;
    assert!(message.text.contains("rm -rf build"), "{}", message.text);
    // The picture in docs/quickstart.md (docs/quickstart-telegram.png) is this one.
    let picture = countersign_testkit::phone::screenshot(
        &message,
        "SomeBot",
        &std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("phone-screenshots"),
        "quickstart-request",
    )
    .await
    .unwrap();
    eprintln!("the phone shows {}", picture.display());
    telegram.tap_button(
        &alice,
        alice.id,
        message.message_id,
        &button(&message, "Approve"),
    );
    let answer = hook_answer(asking).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );

    // Again; Alice rejects with a reason, replying to the request; the hook denies with it.
    let mut asking = spawn_hook(&home, &hook, "toolu_02", "rm -rf /srv/data");
    let message = shown_while_asking(&telegram, &home, &mut asking, 1).await;
    assert!(
        message.text.contains("rm -rf /srv/data"),
        "{}",
        message.text
    );
    telegram.send_text(
        &alice,
        alice.id,
        "/reject not the data directory",
        Some(message.message_id),
    );
    let answer = hook_answer(asking).await;
    let output = &answer["hookSpecificOutput"];
    assert_eq!(output["permissionDecision"], "deny", "{answer}");
    assert!(
        output["permissionDecisionReason"]
            .as_str()
            .unwrap()
            .contains("not the data directory"),
        "{answer}"
    );

    // doctor: everything in place, and no secret on its screen.
    let doctor = home.run(&["doctor", "claude-code"]).await;
    assert_eq!(doctor.status.code(), Some(0), "{}", text(&doctor));
    assert!(!text(&doctor).contains("FAIL"), "{}", text(&doctor));
    assert_no_secret(&home, &text(&doctor), "doctor");

    // Ctrl-C (SIGTERM here) stops everything cleanly.
    terminate(&home, &mut up).await;
    // The Telegram worker kept where it stopped, for the next start.
    assert!(home.data().join("telegram/watch-cursor").exists());
    let log = home.up_log();
    assert!(
        log.contains(&format!("listens on http://{}", home.listen)),
        "{log}"
    );
    assert!(log.contains("countersign install claude-code"), "{log}");
    assert_no_secret(&home, &log, "up's log");
}

/// The generated files are readable by their owner only.
fn assert_no_secret_but_bot_token_is_private(home: &Home) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let secrets = home.data().join("secrets");
    assert_eq!(mode(&secrets), 0o700);
    assert_eq!(mode(&secrets.join("telegram-bot-token")), 0o600);
    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert!(!config.contains(BOT_TOKEN), "{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_refuses_wrong_reused_and_expired_codes_and_registers_nothing() {
    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let home = Home::new(&telegram.api_url());
    let alice = alice();
    let mallory = TestUser::new(6666, "Mallory", Some("mallory"));
    let bob = TestUser::new(1002, "Bob", None);
    let typed = format!("{BOT_TOKEN}\n");

    // A code nobody sends expires, and setup says so.
    let setup = Setup::start(&home, &["--code-ttl", "1s"], Some(&typed)).await;
    let expired = setup.code.clone();
    let (code, _, stderr) = setup.finish().await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains("expired"), "{stderr}");

    let setup = Setup::start(&home, &[], Some(&typed)).await;
    let refusals = [
        (format!("/start {expired}"), "expired"),
        ("/start WRONGCODE2".to_owned(), "not a valid pairing code"),
        ("/start".to_owned(), "followed by the code"),
    ];
    for (message, why) in refusals {
        let (_, sent) = telegram.send_text(&mallory, mallory.id, &message, None);
        let reply = reply_to(&telegram, mallory.id, sent).await;
        assert!(reply.contains(why), "{message}: {reply}");
    }
    assert!(
        !home.config_file().exists(),
        "a refused code registered something"
    );
    let first = setup.code.clone();
    telegram.send_text(&alice, alice.id, &format!("/start {first}"), None);
    let (code, stdout, stderr) = setup.finish().await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    // --add: the stored bot token, no prompt. The used code is refused.
    let setup = Setup::start(&home, &["--add"], None).await;
    let before = std::fs::read_to_string(home.config_file()).unwrap();
    let (_, sent) = telegram.send_text(&mallory, mallory.id, &format!("/start {first}"), None);
    let reply = reply_to(&telegram, mallory.id, sent).await;
    assert!(reply.contains("already used"), "{reply}");
    assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
    telegram.send_text(&bob, bob.id, &format!("/start {}", setup.code), None);
    let (code, stdout, stderr) = setup.finish().await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    let ids: Vec<&str> = config["approvers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|approver| approver["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["telegram:1001", "telegram:1002"]);
    // The terminal's user is not made an approver: hooks name them as the requester.
    assert!(config["approvers"][0]["identities"].get("cli").is_none());
    let telegram_section = &config["telegram"];
    assert_eq!(telegram_section["default_chat_id"].as_integer(), Some(1001));
    let allowed: Vec<i64> = telegram_section["allowed_user_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_integer().unwrap())
        .collect();
    assert_eq!(allowed, [1001, 1002]);
    // The codes themselves are stored nowhere.
    let codes = std::fs::read_to_string(home.data().join("pairing-codes.json")).unwrap();
    assert!(!codes.contains(&first) && !codes.contains(&expired));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_on_an_empty_home_names_what_is_missing_and_the_fix() {
    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let home = Home::new(&telegram.api_url());
    let doctor = home.run(&["doctor"]).await;
    let shown = text(&doctor);
    assert_ne!(doctor.status.code(), Some(0), "{shown}");
    assert!(shown.contains("countersign setup telegram"), "{shown}");
    assert!(shown.contains("countersign install claude-code"), "{shown}");

    // Configured but not started: each missing piece with its command.
    let setup = Setup::start(&home, &[], Some(&format!("{BOT_TOKEN}\n"))).await;
    let alice = alice();
    telegram.send_text(&alice, alice.id, &format!("/start {}", setup.code), None);
    assert_eq!(setup.finish().await.0, Some(0));
    let doctor = home.run(&["doctor"]).await;
    let shown = text(&doctor);
    assert!(shown.contains("ok    config file"), "{shown}");
    assert!(shown.contains("(run countersign up)"), "{shown}");
    assert!(
        shown.contains("start the local instance: countersign up"),
        "{shown}"
    );
    assert!(!shown.contains(BOT_TOKEN), "{shown}");

    // Asked about another server, doctor leaves the local instance out.
    let elsewhere = home
        .run(&["--server", "http://127.0.0.1:9", "doctor"])
        .await;
    let shown = text(&elsewhere);
    assert!(shown.contains("server http://127.0.0.1:9"), "{shown}");
    assert!(
        !shown.contains("config file") && !shown.contains("Telegram"),
        "{shown}"
    );
}

/// What the clients saw acknowledged: request key -> approval id, decision key -> approval id.
#[derive(Default)]
struct Acknowledged {
    requests: Vec<(String, String)>,
    decisions: Vec<(String, String)>,
}

/// Retries `call` until the server acknowledges it; only failures a restart explains are
/// retried (the SDK's transient errors: a lost connection, an unreachable server).
async fn until_acknowledged<T, F, Fut>(mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(error) if error.is_transient() => {
                assert!(tokio::time::Instant::now() < deadline, "never acknowledged");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // A rate limit: nothing was written; wait and try again.
            Err(ClientError::ResourceExhausted(_) | ClientError::RateLimited { .. }) => {
                assert!(tokio::time::Instant::now() < deadline, "never acknowledged");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("refused: {error:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn up_loses_and_duplicates_nothing_acknowledged_across_sigkill() {
    use rand::Rng;
    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let home = Home::new(&telegram.api_url());
    let mut up = home.up().await;
    let agent = home.client(&home.secret("agent-token"));
    let admin = home.client(&home.secret("admin-token"));

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Acknowledged::default()));
    let clients: Vec<_> = (0..16)
        .map(|number| {
            let (agent, admin, stop, seen) =
                (agent.clone(), admin.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("c{number}-n{n}");
                    let request = pb::RequestApprovalRequest {
                        agent_id: format!("agent-{number}"),
                        idempotency_key: key.clone(),
                        tool_name: "bash".into(),
                        arguments_json: format!(r#"{{"command": "deploy", "n": {n}}}"#),
                        action: "deploy".into(),
                        risk: pb::Risk::High as i32,
                        ..Default::default()
                    };
                    let created =
                        until_acknowledged(|| agent.request_approval(request.clone())).await;
                    let id = created.approval.unwrap().id;
                    seen.lock()
                        .unwrap()
                        .requests
                        .push((key.clone(), id.clone()));
                    let decision = pb::DecideRequest {
                        approval_id: id.clone(),
                        verdict: pb::Verdict::Approve as i32,
                        scope: pb::Scope::Once as i32,
                        decider: Some(pb::Decider {
                            channel: "cli".into(),
                            user_id: format!("approver-{number}"),
                            display_name: format!("Approver {number}"),
                        }),
                        idempotency_key: format!("d-{key}"),
                        ..Default::default()
                    };
                    until_acknowledged(|| admin.decide(decision.clone())).await;
                    seen.lock()
                        .unwrap()
                        .decisions
                        .push((decision.idempotency_key, id));
                    n += 1;
                }
            })
        })
        .collect();

    for _ in 0..5 {
        let pause = rand::thread_rng().gen_range(200..600);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        up.kill().await.unwrap(); // SIGKILL
        up = home.up().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.requests.len() >= 6,
        "too little load: {}",
        seen.requests.len()
    );
    let mut stored = 0;
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_approvals(pb::ListApprovalsRequest {
                page_size: 500,
                page_token,
                ..Default::default()
            })
            .await
            .unwrap();
        stored += page.approvals.len();
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(
        stored,
        seen.requests.len(),
        "an acknowledged request is missing, or one is stored twice"
    );
    for (key, id) in &seen.requests {
        let approval = admin.get_approval(id).await.unwrap();
        assert_eq!(&approval.idempotency_key, key);
    }
    for (key, id) in &seen.decisions {
        let approval = admin.get_approval(id).await.unwrap();
        let applied = approval
            .decisions
            .iter()
            .filter(|decision| &decision.idempotency_key == key)
            .count();
        assert_eq!(applied, 1, "decision {key}");
        assert_eq!(approval.state(), pb::ApprovalState::Approved);
    }
    terminate(&home, &mut up).await;
    eprintln!(
        "up under SIGKILL: {} requests and {} decisions acknowledged, each stored once",
        seen.requests.len(),
        seen.decisions.len()
    );
}

/// Pairs Alice through `setup telegram` and starts `up`.
async fn paired_and_up(home: &Home, telegram: &FakeTelegram) -> Child {
    let alice = alice();
    let setup = Setup::start(home, &[], Some(&format!("{BOT_TOKEN}\n"))).await;
    telegram.send_text(&alice, alice.id, &format!("/start {}", setup.code), None);
    let (code, stdout, stderr) = setup.finish().await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    home.up().await
}

/// `countersign mcp --channel` as Claude Code starts a channel.
struct Channel {
    _child: Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Channel {
    /// Installs the channel (`install claude-code --channel`) and starts it as Claude Code
    /// would, from the project's `.mcp.json`.
    async fn start(home: &Home) -> Channel {
        let installed = home.run(&["install", "claude-code", "--channel"]).await;
        assert_eq!(installed.status.code(), Some(0), "{}", text(&installed));
        assert!(
            text(&installed).contains("--dangerously-load-development-channels server:countersign"),
            "{}",
            text(&installed)
        );
        let servers: Value = serde_json::from_str(
            &std::fs::read_to_string(home.path().join("project/.mcp.json")).unwrap(),
        )
        .unwrap();
        let server = &servers["mcpServers"]["countersign"];
        let args: Vec<&str> = server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|arg| arg.as_str().unwrap())
            .collect();
        assert_eq!(args[..2], ["mcp", "--channel"]);
        let mut command = home.command(server["command"].as_str().unwrap(), &args);
        command.stdin(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut channel = Channel {
            _child: child,
            stdin,
            stdout,
        };
        channel
            .send(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "claude-code", "version": "2.1.81"}}}),
            )
            .await;
        let answer = channel.next().await;
        let experimental = &answer["result"]["capabilities"]["experimental"];
        assert!(
            experimental.get("claude/channel/permission").is_some(),
            "{answer}"
        );
        assert!(experimental.get("claude/channel").is_some(), "{answer}");
        channel
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        channel
    }

    async fn send(&mut self, message: Value) {
        self.stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Claude Code showing a permission dialog.
    async fn permission_request(&mut self, request_id: &str, command: &str) {
        self.permission_preview(request_id, &json!({"command": command}).to_string())
            .await;
    }

    /// Claude Code showing a permission dialog whose input it previews as `input_preview`.
    async fn permission_preview(&mut self, request_id: &str, input_preview: &str) {
        self.send(json!({
            "jsonrpc": "2.0",
            "method": "notifications/claude/channel/permission_request",
            "params": {
                "request_id": request_id,
                "tool_name": "Bash",
                "description": "Run a command",
                "input_preview": input_preview,
            },
        }))
        .await;
    }

    async fn next(&mut self) -> Value {
        support::next_json_line(&mut self.stdout).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permission_relay_answers_from_the_phone_and_supersedes_stale_prompts() {
    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let home = Home::new(&telegram.api_url());
    let alice = alice();
    let mut up = paired_and_up(&home, &telegram).await;
    let mut channel = Channel::start(&home).await;

    // Approve on the phone: the verdict comes back with the same request_id. The phone shows
    // the tool's input, as a hook's request does, not the preview's JSON text inside JSON.
    channel.permission_request("abcde", "make deploy").await;
    let message = request_message(&telegram, alice.id, 0).await;
    assert!(
        message.text.contains("run: make deploy"),
        "{}",
        message.text
    );
    assert!(!message.text.contains("input_preview"), "{}", message.text);
    telegram.tap_button(
        &alice,
        alice.id,
        message.message_id,
        &button(&message, "Approve"),
    );
    let verdict = channel.next().await;
    assert_eq!(
        verdict,
        json!({"jsonrpc": "2.0", "method": "notifications/claude/channel/permission",
               "params": {"request_id": "abcde", "behavior": "allow"}})
    );

    // Reject: deny.
    channel.permission_request("fghij", "rm -rf /").await;
    let message = request_message(&telegram, alice.id, 1).await;
    telegram.tap_button(
        &alice,
        alice.id,
        message.message_id,
        &button(&message, "Reject"),
    );
    let verdict = channel.next().await;
    assert_eq!(
        verdict["params"],
        json!({"request_id": "fghij", "behavior": "deny"})
    );

    // Answered in the terminal: Claude Code goes on to its next prompt. The stale one is
    // withdrawn on the phone, and only the new one gets a verdict.
    channel.permission_request("klmno", "git push").await;
    let stale = request_message(&telegram, alice.id, 2).await;
    channel
        .permission_request("pqrst", "git push --force")
        .await;
    let withdrawn = telegram
        .wait_for_message(
            "the stale prompt withdrawn",
            alice.id,
            stale.message_id,
            |m| m.reply_markup.is_none(),
        )
        .await;
    assert!(withdrawn.text.contains("superseded"), "{}", withdrawn.text);
    let current = request_message(&telegram, alice.id, 3).await;
    assert!(current.text.contains("--force"), "{}", current.text);
    telegram.tap_button(
        &alice,
        alice.id,
        current.message_id,
        &button(&current, "Approve"),
    );
    let verdict = channel.next().await;
    assert_eq!(
        verdict["params"],
        json!({"request_id": "pqrst", "behavior": "allow"})
    );

    // A preview Claude Code cut short is no JSON: shown as the text it sent, escaped once.
    channel
        .permission_preview("uvwxy", r#"{"command":"make release && make pub…"#)
        .await;
    let cut = request_message(&telegram, alice.id, 4).await;
    assert!(
        cut.text
            .contains(r#"Bash {"command":"make release && make pub…"#),
        "{}",
        cut.text
    );
    terminate(&home, &mut up).await;
}

/// `up` runs the ntfy worker its config file sets up, beside the server: a hook's request is
/// published to the topic, and the notification's Approve button (tapped as the ntfy app
/// does) lets the hook allow the call.
#[tokio::test]
async fn up_runs_the_ntfy_worker_of_its_config_and_its_button_decides() {
    use countersign_testkit::ntfy::{tap, FakeNtfy};

    let telegram = FakeTelegram::start(BOT_TOKEN).await;
    let ntfy = FakeNtfy::start().await;
    let home = Home::new(&telegram.api_url());
    let links = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        format!(
            "[[approvers]]\nid = \"alice\"\nmax_risk = \"critical\"\nidentities = {{ ntfy = [\"alice\"] }}\n\n\
             [ntfy]\nserver_url = \"{}\"\ndefault_topic = \"alice-phone\"\nlisten = \"{links}\"\n\
             public_url = \"http://{links}\"\ntopics = [{{ name = \"alice-phone\", approver = \"alice\" }}]\n",
            ntfy.url()
        ),
    )
    .unwrap();
    let mut up = home.up().await;
    assert!(
        home.up_log()
            .contains("the ntfy worker publishes approvals"),
        "{}",
        home.up_log()
    );
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));

    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_ntfy_1", "git push");
    let shown = ntfy
        .wait_for("the request's notification", |ntfy| {
            ntfy.notifications("alice-phone")
                .into_iter()
                .find(|m| m.action("Approve").is_some())
        })
        .await;
    assert!(shown.message.contains("git push"), "{}", shown.message);
    let (status, page) = tap(shown.action("Approve").unwrap()).await;
    assert_eq!(status, 200, "{page}");
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    terminate(&home, &mut up).await;
}

/// An instance with no channel, whose approvers decide in a terminal (`countersign watch`,
/// `approve ID`), is a valid set-up: `doctor` notes it and passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_notes_an_instance_decided_in_the_terminal_only_and_passes() {
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        "[[approvers]]\nid = \"tester\"\nmax_risk = \"critical\"\nidentities = { cli = [\"tester\"] }\n",
    )
    .unwrap();
    let mut up = home.up().await;
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let doctor = home.run(&["doctor", "claude-code"]).await;
    let shown = text(&doctor);
    assert_eq!(doctor.status.code(), Some(0), "{shown}");
    assert!(!shown.contains("FAIL"), "{shown}");
    assert!(
        shown.contains("--    no channel is set up: approvals are decided in a terminal only"),
        "{shown}"
    );
    terminate(&home, &mut up).await;
}
