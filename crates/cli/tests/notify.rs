//! "It's done" notices (issue 43 item 7) through the real binary: `countersign install
//! claude-code --notify` adds Claude Code's Stop, StopFailure and Notification hooks (Gemini
//! CLI: AfterAgent and Notification), and the installed command, fed the host's own hook
//! input, publishes a notice without buttons to the fake ntfy server (and Telegram, Slack),
//! except in the quiet hours.

use crate::support;

use std::path::Path;
use std::process::{Output, Stdio};

use countersign_testkit::ntfy::FakeNtfy;
use serde_json::Value;
use support::*;
use tokio::io::AsyncWriteExt;

/// The local instance's config file (under `config_home`), with ntfy and `extra`.
fn write_config(config_home: &Path, ntfy: &FakeNtfy, extra: &str) {
    let dir = config_home.join("countersign");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("countersign.toml"),
        format!(
            "{extra}\n[ntfy]\nserver_url = \"{}\"\npublic_url = \"http://127.0.0.1:9\"\n\n[[ntfy.topics]]\nname = \"phone\"\n",
            ntfy.url()
        ),
    )
    .unwrap();
}

/// Runs the shell command `command` as Claude Code runs a hook: `sh -c`, the input on stdin,
/// with `env` set too.
async fn run_hook(command: &str, input: &Value, home: &Path, env: &[(&str, &str)]) -> Output {
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .envs(env.iter().copied())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env_remove("COUNTERSIGN_CONFIG")
        .env_remove("NTFY_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("the hook hung")
        .unwrap()
}

/// The installed notify command for `host` under `event`, checking there is exactly one.
fn notify_command(settings: &Value, event: &str, host: &str) -> String {
    let groups = settings["hooks"][event].as_array().unwrap();
    let ours: Vec<&str> = groups
        .iter()
        .filter_map(|group| group["hooks"][0]["command"].as_str())
        .filter(|command| command.contains(&format!(" notify {host}")))
        .collect();
    assert_eq!(ours.len(), 1, "{event}: {settings}");
    ours[0].to_owned()
}

#[tokio::test]
async fn installed_notify_hooks_send_claude_code_s_stop_and_notification_events_as_notices() {
    let ntfy = FakeNtfy::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    write_config(&home.path().join(".config"), &ntfy, "");

    // Installed twice: the groups are replaced, never duplicated.
    for _ in 0..2 {
        let mut install = countersign("http://127.0.0.1:9");
        install
            .current_dir(project.path())
            .env("HOME", home.path())
            .args(["install", "claude-code", "--project", "--notify"]);
        let output = install.output().await.unwrap();
        assert_exit(&output, 0);
    }
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(project.path().join(".claude/settings.json")).unwrap(),
    )
    .unwrap();
    assert!(settings["hooks"]["PreToolUse"].is_array(), "{settings}");
    let stop = notify_command(&settings, "Stop", "claude-code");
    assert_eq!(
        notify_command(&settings, "StopFailure", "claude-code"),
        stop
    );
    assert_eq!(
        notify_command(&settings, "Notification", "claude-code"),
        stop
    );

    let cases = [
        (
            "claude-code/stop.json",
            "Claude Code finished in shop",
            "It is waiting for your next prompt.",
        ),
        (
            "claude-code/stop-failure.json",
            "Claude Code failed in shop",
            "rate_limit: Rate limit exceeded: 100 requests per minute",
        ),
        (
            "claude-code/notification.json",
            "Claude Code needs you in shop",
            "Claude is waiting for your input",
        ),
    ];
    for (n, (payload, title, message)) in cases.into_iter().enumerate() {
        let output = run_hook(&stop, &fixture(payload), home.path(), &[]).await;
        assert_exit(&output, 0);
        let shown = ntfy.notifications("phone");
        assert_eq!(shown.len(), n + 1, "{payload}: {shown:#?}");
        let notice = &shown[n];
        assert_eq!(notice.title, title);
        assert_eq!(notice.message, message);
        assert!(notice.actions.is_empty(), "a notice has no buttons");
    }

    // In the quiet hours (the hour around now, UTC), nothing is sent.
    let now = time::OffsetDateTime::now_utc();
    let minute = i32::from(now.hour()) * 60 + i32::from(now.minute());
    let at = |m: i32| {
        let m = m.rem_euclid(24 * 60);
        format!("{:02}:{:02}", m / 60, m % 60)
    };
    write_config(
        &home.path().join(".config"),
        &ntfy,
        &format!(
            "[notify]\nquiet_hours = \"{}-{}\"\n",
            at(minute - 30),
            at(minute + 30)
        ),
    );
    let output = run_hook(&stop, &fixture("claude-code/stop.json"), home.path(), &[]).await;
    assert_exit(&output, 0);
    assert!(
        stderr(&output).contains("quiet hours"),
        "{}",
        stderr(&output)
    );
    assert_eq!(ntfy.messages().len(), 3);
}

/// Codex's `notify` program, set by `install codex --notify` in Codex's user config, gets the
/// `agent-turn-complete` event as its last argument.
#[tokio::test]
async fn codex_s_notify_program_sends_a_finished_turn_as_a_notice() {
    let ntfy = FakeNtfy::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    write_config(&home.path().join(".config"), &ntfy, "");
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(codex_home.join("config.toml"), "model = \"o3\"\n").unwrap();

    for _ in 0..2 {
        let mut install = countersign("http://127.0.0.1:9");
        install
            .current_dir(project.path())
            .env("HOME", home.path())
            .env("CODEX_HOME", &codex_home)
            .args(["install", "codex", "--project", "--notify"]);
        let output = install.output().await.unwrap();
        assert_exit(&output, 0);
    }
    let config: toml::Table = std::fs::read_to_string(codex_home.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(config["model"].as_str(), Some("o3"), "the rest is kept");
    let argv: Vec<String> = config["notify"]
        .as_array()
        .unwrap()
        .iter()
        .map(|word| word.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(argv[1..], ["notify", "codex"]);

    // As Codex runs it: the program, its arguments, then the event's JSON.
    let event = fixture("codex/notify.json");
    let mut run = tokio::process::Command::new(&argv[0]);
    run.args(&argv[1..])
        .arg(event.to_string())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("XDG_DATA_HOME", home.path().join(".local/share"))
        .env_remove("COUNTERSIGN_CONFIG")
        .stdin(Stdio::null());
    let output = tokio::time::timeout(STEP, run.output())
        .await
        .unwrap()
        .unwrap();
    assert_exit(&output, 0);
    let shown = ntfy.notifications("phone");
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert_eq!(shown[0].title, "Codex finished in shop");
    assert_eq!(
        shown[0].message,
        "The tests pass now; I fixed the cart total."
    );
    assert!(shown[0].actions.is_empty());

    // Another notify program the person set is left alone.
    std::fs::write(
        codex_home.join("config.toml"),
        "notify = [\"notify-send\", \"Codex\"]\n",
    )
    .unwrap();
    let mut install = countersign("http://127.0.0.1:9");
    install
        .current_dir(project.path())
        .env("HOME", home.path())
        .env("CODEX_HOME", &codex_home)
        .args(["install", "codex", "--project", "--notify"]);
    let output = install.output().await.unwrap();
    assert_exit(&output, 64);
    assert_eq!(
        std::fs::read_to_string(codex_home.join("config.toml")).unwrap(),
        "notify = [\"notify-send\", \"Codex\"]\n"
    );
}

/// With Telegram set up too, the notice also reaches its default chat: escaped HTML, no
/// buttons.
#[tokio::test]
async fn a_notice_also_reaches_telegram_s_default_chat_without_buttons() {
    const BOT_TOKEN: &str = "123456:notice-test-token";
    let ntfy = FakeNtfy::start().await;
    let telegram = countersign_testkit::telegram::FakeTelegram::start(BOT_TOKEN).await;
    let home = tempfile::tempdir().unwrap();
    write_config(
        &home.path().join(".config"),
        &ntfy,
        &format!(
            "[telegram]\napi_url = \"{}\"\ndefault_chat_id = 4242\n",
            telegram.api_url()
        ),
    );
    let mut input = fixture("claude-code/notification.json");
    input["message"] = Value::from("Claude needs your permission to use Bash <script>");
    let mut notify = countersign("http://127.0.0.1:9");
    notify
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("XDG_DATA_HOME", home.path().join(".local/share"))
        .env("TELEGRAM_BOT_TOKEN", BOT_TOKEN)
        .args(["notify", "claude-code"]);
    let output = run_with_input(notify, input.to_string().as_bytes()).await;
    assert_exit(&output, 0);
    let sent = telegram.requests_of("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(sent[0].param_i64("chat_id"), Some(4242));
    assert_eq!(
        sent[0].param_str("text"),
        Some("<b>Claude Code needs you in shop</b>\nClaude needs your permission to use Bash &lt;script&gt;")
    );
    assert!(sent[0].params.get("reply_markup").is_none(), "no buttons");
    assert_eq!(ntfy.notifications("phone").len(), 1);
}

/// `install gemini --notify` adds Gemini CLI's AfterAgent (a turn's final answer) and
/// Notification (a tool waits for confirmation) hooks; fed Gemini CLI's payloads, the
/// command sends notices to ntfy and to Slack's default channel, escaped, without buttons.
#[tokio::test]
async fn gemini_cli_s_after_agent_and_notification_hooks_send_notices_to_ntfy_and_slack() {
    const BOT_TOKEN: &str = "xoxb-notice-test";
    let ntfy = FakeNtfy::start().await;
    let slack = countersign_testkit::slack::FakeSlack::start(BOT_TOKEN, "xapp-unused").await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    write_config(
        &home.path().join(".config"),
        &ntfy,
        &format!(
            "[slack]\napi_url = \"{}\"\nchannels = [\"C0DEV\", \"C0OPS\"]\ndefault_channel = \"C0OPS\"\n",
            slack.api_url()
        ),
    );
    for _ in 0..2 {
        let mut install = countersign("http://127.0.0.1:9");
        install
            .current_dir(project.path())
            .env("HOME", home.path())
            .args(["install", "gemini", "--project", "--notify"]);
        let output = install.output().await.unwrap();
        assert_exit(&output, 0);
        assert!(
            stdout(&output).contains("notify hooks (AfterAgent, Notification)"),
            "{}",
            stdout(&output)
        );
    }
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(project.path().join(".gemini/settings.json")).unwrap(),
    )
    .unwrap();
    assert!(settings["hooks"]["BeforeTool"].is_array(), "{settings}");
    let after = notify_command(&settings, "AfterAgent", "gemini");
    assert_eq!(notify_command(&settings, "Notification", "gemini"), after);
    // Gemini CLI's timeouts are milliseconds.
    assert_eq!(
        settings["hooks"]["AfterAgent"][0]["hooks"][0]["timeout"],
        30_000
    );

    let mut waiting = fixture("gemini/notification.json");
    waiting["message"] = Value::from("Tool Shell requires execution <!channel>");
    let cases = [
        (
            fixture("gemini/after-agent.json"),
            "Gemini CLI finished in shop",
            "The cart total is fixed and the tests pass.",
            "*Gemini CLI finished in shop*\nThe cart total is fixed and the tests pass.",
        ),
        (
            waiting,
            "Gemini CLI needs you in shop",
            "Tool Shell requires execution <!channel>",
            "*Gemini CLI needs you in shop*\nTool Shell requires execution &lt;!channel&gt;",
        ),
    ];
    for (n, (payload, title, message, posted)) in cases.into_iter().enumerate() {
        let output = run_hook(
            &after,
            &payload,
            home.path(),
            &[("SLACK_BOT_TOKEN", BOT_TOKEN)],
        )
        .await;
        assert_exit(&output, 0);
        assert_eq!(
            stdout(&output),
            "",
            "Gemini CLI reads stdout as the hook's JSON"
        );
        let shown = ntfy.notifications("phone");
        assert_eq!(shown.len(), n + 1, "{shown:#?}");
        assert_eq!(
            (shown[n].title.as_str(), shown[n].message.as_str()),
            (title, message)
        );
        let messages = slack.messages("C0OPS");
        assert_eq!(messages.len(), n + 1, "{messages:#?}");
        assert_eq!(messages[n].text, posted);
        assert!(messages[n].buttons().is_empty(), "a notice has no buttons");
    }
    assert!(slack.messages("C0DEV").is_empty());

    // An event that sends nothing.
    let mut other = fixture("gemini/before-tool.json");
    other["hook_event_name"] = Value::from("SessionStart");
    let output = run_hook(
        &after,
        &other,
        home.path(),
        &[("SLACK_BOT_TOKEN", BOT_TOKEN)],
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(ntfy.notifications("phone").len(), 2);
}

/// With webhook endpoints configured, the notice is POSTed once to each default endpoint as an
/// `agent.notice` event signed as the webhook channel signs its events (Standard Webhooks).
#[tokio::test]
async fn a_notice_is_posted_signed_to_the_default_webhook_endpoints() {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use std::sync::{Arc, Mutex};

    type Received = Arc<Mutex<Vec<(HeaderMap, String)>>>;
    async fn receive(State(received): State<Received>, headers: HeaderMap, body: String) {
        received.lock().unwrap().push((headers, body));
    }
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .route("/other", axum::routing::post(receive))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let ntfy = FakeNtfy::start().await;
    let home = tempfile::tempdir().unwrap();
    write_config(
        &home.path().join(".config"),
        &ntfy,
        &format!(
            "[webhook]\ndefault_endpoints = [\"ops\"]\n\n[[webhook.endpoints]]\nname = \"ops\"\nurl = \"{url}\"\nsecret_env = \"OPS_WEBHOOK_SECRET\"\n\n[[webhook.endpoints]]\nname = \"audit\"\nurl = \"{}\"\nsecret_env = \"AUDIT_WEBHOOK_SECRET\"\n",
            url.replace("/hook", "/other")
        ),
    );
    let mut notify = countersign("http://127.0.0.1:9");
    notify
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("XDG_DATA_HOME", home.path().join(".local/share"))
        .env("OPS_WEBHOOK_SECRET", SECRET)
        .args(["notify", "claude-code"]);
    let output = run_with_input(
        notify,
        fixture("claude-code/stop.json").to_string().as_bytes(),
    )
    .await;
    assert_exit(&output, 0);

    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "only the default endpoint: {received:?}");
    let (headers, body) = &received[0];
    let event: Value = serde_json::from_str(body).unwrap();
    assert_eq!(event["type"], "agent.notice");
    assert_eq!(event["data"]["title"], "Claude Code finished in shop");
    assert_eq!(
        event["data"]["message"],
        "It is waiting for your next prompt."
    );
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    let secret = countersign_webhook::signature::Secret::parse(SECRET).unwrap();
    let timestamp: i64 = header("webhook-timestamp").parse().unwrap();
    assert_eq!(
        header("webhook-signature"),
        secret.sign(&header("webhook-id"), timestamp, body)
    );
    assert!(header("webhook-id").starts_with("msg_notice_"));
    assert_eq!(ntfy.notifications("phone").len(), 1);
}
