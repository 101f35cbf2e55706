//! `countersign setup ntfy` through the real binary, against the fake ntfy server: the
//! subscription shown as a link and a QR code, the test notification whose Confirm (tapped
//! as the ntfy app does: a POST to the reply topic) must come back before anything is
//! written, the refusals that leave the config file byte for byte as it was, and the
//! quickstart with ntfy: `setup ntfy`, `up`, `install claude-code`, and a first approval from
//! the phone with no inbound port.

use crate::support;

use countersign_testkit::ntfy::{tap, FakeNtfy, NtfyMessage};
use serde_json::json;
use tokio::process::Child;

use support::home::{hook_answer, installed_hook, spawn_hook, terminate, text, Home};
use support::STEP;

/// A config file with the user's own comments and layout, which refusals must not touch.
const EXISTING: &str = "# my instance\n[[approvers]]\nid = \"tester\"   # me\nmax_risk = \"critical\"\nidentities = { cli = [\"tester\"] }\n";

fn setup_ntfy(home: &Home, ntfy: &FakeNtfy, extra: &[&str]) -> Child {
    let server = ntfy.url();
    let mut args = vec!["setup", "ntfy", "--server", server.as_str()];
    args.extend_from_slice(extra);
    home.countersign(&args).spawn().unwrap()
}

/// The test notification, once published.
async fn test_notification(ntfy: &FakeNtfy) -> NtfyMessage {
    ntfy.wait_for("the test notification", |ntfy| {
        ntfy.messages()
            .into_iter()
            .find(|m| m.action("Confirm").is_some())
    })
    .await
}

async fn finished(child: Child) -> std::process::Output {
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("setup ntfy did not exit")
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
}

/// What docs/quickstart.md shows for ntfy, run as written: `setup ntfy` (subscribe, tap
/// Confirm), `up`, `install claude-code`; the hook's request reaches the phone and its
/// Approve button decides through the reply topic — `up` listens on no port for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_ntfy_then_up_and_install_reach_a_first_approval_with_no_inbound_port() {
    // Exactly what docs/quickstart.md tells the user to type for ntfy.
    let doc = include_str!("../../../docs/quickstart.md");
    let section = doc
        .split("### Push notifications: ntfy")
        .nth(1)
        .expect("the ntfy section of docs/quickstart.md");
    assert!(
        section.contains(
            "```sh\ncountersign setup ntfy\ncountersign up\ncountersign install claude-code\n```"
        ),
        "{section}"
    );
    let ntfy = FakeNtfy::start().await;
    let home = Home::new("http://127.0.0.1:9");
    let setup = setup_ntfy(&home, &ntfy, &[]);
    let test = test_notification(&ntfy).await;
    assert!(
        !home.config_file().exists(),
        "written before the Confirm came back"
    );
    let confirm = test.action("Confirm").unwrap();
    assert_eq!(confirm["action"], "http");
    let reply_url = confirm["url"].as_str().unwrap().to_owned();
    assert!(reply_url.starts_with(&format!("{}/cs-reply-", ntfy.url())));
    assert_eq!(tap(confirm).await.0, 200);
    let output = finished(setup).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    let topic = test.topic.clone();
    assert!(topic.starts_with("cs-") && topic.len() >= 40, "{topic}");
    assert!(
        shown.contains(&format!("  link:   {}/{topic}", ntfy.url())),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "ntfy://{}/{topic}?secure=false",
            ntfy.url().trim_start_matches("http://")
        )),
        "{shown}"
    );
    assert!(
        shown.contains('█') || shown.contains('▀'),
        "no QR code: {shown}"
    );
    assert!(shown.contains("ntfy is set up"), "{shown}");
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(home.config_file()).unwrap()).unwrap();
    let section = &config["ntfy"];
    assert_eq!(section["default_topic"].as_str(), Some(topic.as_str()));
    let reply = section["reply_topic"].as_str().unwrap();
    assert_eq!(reply_url, format!("{}/{reply}", ntfy.url()));
    assert!(section.get("public_url").is_none());
    assert_eq!(section["topics"][0]["approver"].as_str(), Some("tester"));
    let approver = &config["approvers"].as_array().unwrap()[0];
    assert_eq!(approver["identities"]["ntfy"][0].as_str(), Some("tester"));

    let mut up = home.up().await;
    assert!(
        home.up_log()
            .contains("through the reply topic (no inbound port)"),
        "{}",
        home.up_log()
    );
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_ntfy_1", "git push");
    let request = ntfy
        .wait_for("the request's notification", |ntfy| {
            ntfy.notifications(&topic)
                .into_iter()
                .find(|m| m.action("Approve").is_some())
        })
        .await;
    assert!(request.message.contains("git push"), "{}", request.message);
    let approve = request.action("Approve").unwrap();
    assert_eq!(approve["url"].as_str(), Some(reply_url.as_str()));
    assert_eq!(tap(approve).await.0, 200);
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    let doctor = home.run(&["doctor", "claude-code"]).await;
    assert!(
        text(&doctor).contains("ntfy: 1 topic(s); the buttons decide through the reply topic"),
        "{}",
        text(&doctor)
    );
    terminate(&home, &mut up).await;
    assert!(
        !home.up_log().contains(reply),
        "the reply topic reached up's log"
    );
}

/// No Confirm within --wait-secs, and a message on the reply topic that is not the code: no
/// change to the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_ntfy_without_the_confirm_writes_nothing() {
    let ntfy = FakeNtfy::start().await;
    let home = Home::new("http://127.0.0.1:9");
    write_existing(&home);
    let setup = setup_ntfy(&home, &ntfy, &["--wait-secs", "3"]);
    let test = test_notification(&ntfy).await;
    let mut forged = test.action("Confirm").unwrap().clone();
    forged["body"] = json!("countersign-setup not-the-code");
    assert_eq!(tap(&forged).await.0, 200);
    let output = finished(setup).await;
    let shown = text(&output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("no Confirm came back within 3 s"), "{shown}");
    assert_untouched(&home);
}

/// The server down (its proxy answers 502), and an access token it refuses: refused before
/// anything is written, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_ntfy_refuses_a_server_down_or_refusing_the_token_and_writes_nothing() {
    let ntfy = FakeNtfy::start().await;
    let home = Home::new("http://127.0.0.1:9");
    write_existing(&home);
    ntfy.set_down(true);
    let output = finished(setup_ntfy(&home, &ntfy, &["--wait-secs", "20"])).await;
    let shown = text(&output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("cannot use the ntfy server"), "{shown}");
    assert_untouched(&home);

    let guarded = FakeNtfy::start_with_token(Some("tk_right")).await;
    let server = guarded.url();
    let mut command = home.countersign(&["setup", "ntfy", "--server", &server]);
    command.env("NTFY_TOKEN", "tk_wrong");
    let output = tokio::time::timeout(STEP, command.output())
        .await
        .unwrap()
        .unwrap();
    let shown = text(&output);
    assert_ne!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("refused the access token"), "{shown}");
    assert!(!shown.contains("tk_wrong"), "{shown}");
    assert_untouched(&home);

    let output = home
        .run(&[
            "setup",
            "ntfy",
            "--server",
            "ntfy.example",
            "--wait-secs",
            "1",
        ])
        .await;
    assert_ne!(output.status.code(), Some(0), "{}", text(&output));
    assert_untouched(&home);
}
