//! `countersign setup slack` through the real binary, against the fake Slack: the tokens
//! checked, the channel picked by name (a public one joined), the approver paired by tapping
//! "This is me" over Socket Mode, then `up` reading the stored tokens and a hook's request
//! decided in the channel by the paired approver; and the refusals, which leave the config
//! file byte for byte as it was and write no token.

use crate::support;

use countersign_testkit::slack::{FakeSlack, SlackMessage};
use tokio::io::AsyncWriteExt;
use tokio::process::Child;

use support::home::{hook_answer, installed_hook, spawn_hook, terminate, text, Home};
use support::STEP;

const BOT: &str = "xoxb-setup-bot-secret";
const APP: &str = "xapp-setup-app-secret";

/// A config file with the user's own comments and layout, which refusals must not touch.
const EXISTING: &str = "# my instance\n[[approvers]]\nid = \"tester\"   # me\nmax_risk = \"critical\"\nidentities = { cli = [\"tester\"] }\n";

/// `setup slack` with the tokens in the environment and `answer` typed at its prompt.
fn setup_slack(
    home: &Home,
    slack: &FakeSlack,
    tokens: (&str, &str),
    extra: &[&str],
    answer: &str,
) -> Child {
    let api_url = slack.api_url();
    let mut args = vec!["setup", "slack", "--api-url", api_url.as_str()];
    args.extend_from_slice(extra);
    let mut command = home.countersign(&args);
    command
        .env("SLACK_BOT_TOKEN", tokens.0)
        .env("SLACK_APP_TOKEN", tokens.1)
        .stdin(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let answer = answer.to_owned();
    tokio::spawn(async move {
        let _ = stdin.write_all(answer.as_bytes()).await;
    });
    child
}

/// The "This is me" message in `channel`, once posted and Socket Mode is connected.
async fn pairing_message(slack: &FakeSlack, channel: &str) -> SlackMessage {
    let message = slack
        .wait_for("the pairing message", |slack| {
            slack
                .messages(channel)
                .into_iter()
                .find(|m| m.buttons() == ["countersign_pair"])
        })
        .await;
    slack
        .wait_for("the Socket Mode connection", |slack| {
            (slack.connections() > 0).then_some(())
        })
        .await;
    message
}

async fn finished(child: Child) -> std::process::Output {
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("setup slack did not exit")
        .unwrap()
}

fn write_existing(home: &Home) {
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(home.config_file(), EXISTING).unwrap();
}

fn assert_untouched(home: &Home) {
    assert_eq!(
        std::fs::read_to_string(home.config_file()).unwrap(),
        EXISTING,
        "the config file changed"
    );
    for name in ["slack-bot-token", "slack-app-token"] {
        assert!(
            !home.data().join("secrets").join(name).exists(),
            "{name} was written"
        );
    }
}

/// The channel picked by name at the prompt, among more channels than one page of
/// `users.conversations` holds: a public one the bot is not in is joined; Alice taps "This is
/// me"; `up` (no token in its environment) posts a hook's request there and Alice's Approve
/// decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_slack_pairs_by_a_tap_then_up_posts_requests_the_approver_decides() {
    // Exactly what docs/quickstart.md tells the user to type for Slack.
    let doc = include_str!("../../../docs/quickstart.md");
    let section = doc
        .split("### Slack: `countersign setup slack`")
        .nth(1)
        .expect("the Slack section of docs/quickstart.md");
    assert!(
        section.contains(
            "```sh\ncountersign setup slack --manifest\ncountersign setup slack\ncountersign up\ncountersign install claude-code\n```"
        ),
        "{section}"
    );
    let slack = FakeSlack::start(BOT, APP).await;
    slack.add_channel("general", false, true);
    slack.add_channel("random", false, true);
    slack.add_channel("private-ops", true, true);
    let approvals = slack.add_channel("approvals", false, false);
    let home = Home::new("http://127.0.0.1:9");
    let manifest = home.run(&["setup", "slack", "--manifest"]).await;
    let manifest = text(&manifest);
    for needed in [
        "socket_mode_enabled: true",
        "interactivity:\n    is_enabled: true",
        "- chat:write",
        "- channels:read",
        "- channels:join",
    ] {
        assert!(manifest.contains(needed), "{needed}: {manifest}");
    }
    let setup = setup_slack(&home, &slack, (BOT, APP), &[], "#approvals\n");
    let message = pairing_message(&slack, &approvals).await;
    assert!(slack.bot_in(&approvals), "the bot did not join #approvals");
    assert!(!home.config_file().exists(), "written before the tap");
    slack.tap("U0ALICE", &message, "countersign_pair");
    let output = finished(setup).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    for listed in ["#general", "#random", "#private-ops (private)"] {
        assert!(shown.contains(listed), "{listed} not listed: {shown}");
    }
    assert!(shown.contains("The bot joined #approvals"), "{shown}");
    assert!(shown.contains("Slack is set up"), "{shown}");
    assert!(!shown.contains(BOT) && !shown.contains(APP), "{shown}");
    let after = slack.messages(&approvals)[0].clone();
    assert!(after.buttons().is_empty(), "the button is still there");
    assert!(after.shown().contains("<@U0ALICE>"), "{}", after.shown());

    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    let section = &config["slack"];
    assert_eq!(
        section["default_channel"].as_str(),
        Some(approvals.as_str())
    );
    assert_eq!(section["channels"][0].as_str(), Some(approvals.as_str()));
    let approver = &config["approvers"].as_array().unwrap()[0];
    assert_eq!(approver["identities"]["slack"][0].as_str(), Some("U0ALICE"));
    assert_eq!(home.secret("slack-bot-token"), BOT);
    assert_eq!(home.secret("slack-app-token"), APP);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let path = home.data().join("secrets").join("slack-app-token");
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let mut up = home.up().await;
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(
        &home,
        &installed_hook(&home),
        "toolu_slack_setup",
        "git push",
    );
    let request = slack
        .wait_for("the request's message", |slack| {
            slack
                .messages(&approvals)
                .into_iter()
                .find(|m| m.buttons().len() == 3)
        })
        .await;
    assert!(request.shown().contains("git push"), "{}", request.shown());
    slack
        .wait_for("up's Socket Mode connection", |slack| {
            (slack.connections() > 0).then_some(())
        })
        .await;
    slack.tap("U0ALICE", &request, "countersign_approve");
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    let doctor = home.run(&["doctor", "claude-code"]).await;
    let report = text(&doctor);
    assert!(
        report.contains(&format!("slack: channel {approvals} (default); the bot token and the app-level token are present")),
        "{report}"
    );
    assert!(!report.contains(BOT) && !report.contains(APP), "{report}");
    terminate(&home, &mut up).await;
    let log = home.up_log();
    assert!(!log.contains(BOT) && !log.contains(APP), "{log}");
}

/// Tokens Slack refuses, a token of the wrong kind, and a channel the bot is not in and cannot
/// join: refused before anything is written, saying why, the tokens never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_slack_refuses_bad_tokens_and_unknown_channels_and_writes_nothing() {
    let slack = FakeSlack::start(BOT, APP).await;
    let approvals = slack.add_channel("approvals", false, true);
    slack.add_channel("hidden", true, false);
    let home = Home::new("http://127.0.0.1:9");
    write_existing(&home);
    let cases: [((&str, &str), &str, &str); 5] = [
        (
            ("xoxb-wrong-secret", APP),
            "approvals\n",
            "Slack refused the bot token (invalid_auth)",
        ),
        (
            (BOT, "xapp-wrong-secret"),
            "approvals\n",
            "Slack refused the app-level token (invalid_auth)",
        ),
        ((APP, APP), "approvals\n", "the bot token starts with xoxb-"),
        ((BOT, APP), "nowhere\n", "no channel #nowhere"),
        ((BOT, APP), "hidden\n", "no channel #hidden"),
    ];
    for (tokens, answer, refusal) in cases {
        let output = finished(setup_slack(&home, &slack, tokens, &[], answer)).await;
        let shown = text(&output);
        assert_ne!(output.status.code(), Some(0), "{shown}");
        assert!(shown.contains(refusal), "{refusal}: {shown}");
        assert!(shown.contains("nothing was written"), "{shown}");
        assert!(
            !shown.contains("wrong-secret") && !shown.contains(BOT) && !shown.contains(APP),
            "{shown}"
        );
        assert_untouched(&home);
    }
    assert!(
        slack.messages(&approvals).is_empty(),
        "a pairing was posted"
    );

    // No token in the environment: the manifest is printed and the tokens asked for.
    let api_url = slack.api_url();
    let mut command = home.countersign(&["setup", "slack", "--api-url", &api_url]);
    command.stdin(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"xoxb-typed-wrong-secret\nxapp-typed-wrong-secret\n")
        .await
        .unwrap();
    drop(stdin);
    let output = finished(child).await;
    let shown = text(&output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("From an app manifest"), "{shown}");
    assert!(shown.contains("socket_mode_enabled: true"), "{shown}");
    assert!(
        shown.contains("Slack refused the bot token (invalid_auth)"),
        "{shown}"
    );
    assert!(!shown.contains("wrong-secret"), "{shown}");
    assert_untouched(&home);
}

/// No tap within --wait-secs, after a tap on a forged button value (not the one-time value
/// setup posted): nobody is paired, the message says the pairing expired, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_slack_without_the_tap_writes_nothing() {
    let slack = FakeSlack::start(BOT, APP).await;
    let approvals = slack.add_channel("approvals", false, true);
    let home = Home::new("http://127.0.0.1:9");
    write_existing(&home);
    let setup = setup_slack(
        &home,
        &slack,
        (BOT, APP),
        &["--channel", "approvals", "--wait-secs", "3"],
        "",
    );
    let message = pairing_message(&slack, &approvals).await;
    let (forged, _) = slack.tap_with_value("U0MALLORY", &message, "countersign_pair", "guessed");
    slack
        .wait_for("the forged tap's acknowledgement", |slack| {
            slack.acks().contains(&forged).then_some(())
        })
        .await;
    let output = finished(setup).await;
    let shown = text(&output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("nobody tapped \"This is me\""), "{shown}");
    assert_untouched(&home);
    let after = slack.messages(&approvals)[0].clone();
    assert!(after.buttons().is_empty());
    assert!(after.shown().contains("expired"), "{}", after.shown());
}
