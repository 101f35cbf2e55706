//! `countersign up` runs every channel worker its config file sets up, in one process, with
//! the workers' own code: GitHub (against the fake GitHub), the webhook worker (to a receiver
//! on loopback) and the web inbox; a worker that stops stops the others; SIGTERM stops all.

use crate::support;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use countersign_testkit::github::DEFAULT_TOKEN;
use serde_json::Value;

use support::github::GitHubRepo;
use support::home::{hook_answer, installed_hook, interrupt, spawn_hook, text, Home};
use support::STEP;

/// A signing secret of the Standard Webhooks form.
const WEBHOOK_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// An HTTP endpoint on loopback that keeps the bodies posted to it.
#[derive(Clone, Default)]
struct Receiver {
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let app = Router::new()
            .route(
                "/hook",
                post(|State(receiver): State<Receiver>, body: Bytes| async move {
                    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    receiver.bodies.lock().unwrap().push(body);
                }),
            )
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    /// Waits for an event of `kind`; returns its body.
    async fn event(&self, kind: &str) -> Value {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let found = self
                .bodies
                .lock()
                .unwrap()
                .iter()
                .find(|body| body["type"] == kind)
                .cloned();
            if let Some(body) = found {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {kind} event: {:?}",
                self.bodies.lock().unwrap()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

fn free_port() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().to_string()
}

/// The config file of a machine with the three channels: GitHub polling the fake, a webhook
/// endpoint, the web inbox.
fn write_config(home: &Home, github: &GitHubRepo, receiver: &str, links: &str, web: &str) {
    let (github_url, issue) = (github.fake.url(), github.issue);
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        format!(
            "[[approvers]]\nid = \"alice\"\nmax_risk = \"critical\"\n\
             identities = {{ github = [\"alice\"], webhook = [\"alice\"], web = [\"alice\"] }}\n\n\
             [github]\napi_url = \"{github_url}\"\nbot_login = \"countersign-bot\"\n\
             default_target = \"acme/widgets#{issue}\"\nwrite_interval_ms = 10\n\n\
             [github.polling]\ninterval_ms = 200\n\n\
             [webhook]\nlisten = \"{links}\"\ndefault_endpoints = [\"ops\"]\n\n\
             [[webhook.endpoints]]\nname = \"ops\"\nurl = \"{receiver}\"\n\
             secret_env = \"COUNTERSIGN_WEBHOOK_SECRET_OPS\"\napprover = \"alice\"\n\n\
             [web]\nlisten = \"{web}\"\n"
        ),
    )
    .unwrap();
}

/// The secrets `up` takes from the environment here: the GitHub token (`setup github` would
/// have stored it) and the endpoint's signing secret.
const UP_ENV: [(&str, &str); 2] = [
    ("COUNTERSIGN_GITHUB_TOKEN", DEFAULT_TOKEN),
    ("COUNTERSIGN_WEBHOOK_SECRET_OPS", WEBHOOK_SECRET),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_github_webhook_and_web_inbox_and_a_github_comment_decides() {
    let github = GitHubRepo::start().await;
    let (receiver, receiver_url) = Receiver::start().await;
    let home = Home::new("http://127.0.0.1:9");
    let (links, web) = (free_port(), free_port());
    write_config(&home, &github, &receiver_url, &links, &web);

    let mut up = home.up_with(&UP_ENV).await;
    let log = home.up_log();
    for line in [
        "the GitHub worker posts approvals as comments",
        "the webhook worker delivers approvals to your endpoints; decision links at http://",
        &format!("the web inbox is at http://{web}"),
    ] {
        assert!(log.contains(line), "{line:?} missing:\n{log}");
    }
    assert!(!log.contains(DEFAULT_TOKEN), "{log}");
    assert!(!log.contains(WEBHOOK_SECRET), "{log}");

    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_gh_1", "git push");

    // GitHub: the request is a comment on the default issue.
    let posted = github.request_comment("git push").await;
    assert_eq!(posted.user.login, "countersign-bot");
    // The webhook endpoint got the request, with decision links served by `up`.
    let requested = receiver.event("approval.requested").await;
    let approve_link = requested["data"]["decision_links"]["approve"]
        .as_str()
        .unwrap_or_else(|| panic!("no decision link: {requested}"));
    assert!(
        approve_link.starts_with(&format!("http://{links}/")),
        "{approve_link}"
    );
    // The web inbox answers where the log said (to nobody signed in: 401).
    let inbox = reqwest::get(format!("http://{web}/")).await.unwrap();
    assert_eq!(inbox.status(), 401);
    let css = reqwest::get(format!("http://{web}/assets/app.css"))
        .await
        .unwrap();
    assert_eq!(css.status(), 200);

    // A person with write access approves on GitHub; the hook allows.
    github.approve(&home, hook).await;
    // The webhook endpoint learns the outcome and who decided.
    let resolved = receiver.event("approval.resolved").await;
    assert_eq!(resolved["data"]["state"], "approved", "{resolved}");
    // Ctrl-C stops every piece: the process ends cleanly, nothing listens any more.
    interrupt(&home, &mut up).await;
    for address in [&links, &web, &home.listen] {
        assert!(
            std::net::TcpStream::connect(address).is_err(),
            "{address} still listens"
        );
    }
    let log = home.up_log();
    assert!(!log.contains(DEFAULT_TOKEN), "{log}");
}

/// `up` runs the Slack worker its config file sets up: a hook's request is posted to the
/// channel (the fake Slack), and the approver's tap on Approve, over Socket Mode, lets the
/// hook allow the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_the_slack_worker_and_a_tap_decides() {
    use countersign_testkit::slack::FakeSlack;

    let slack = FakeSlack::start("xoxb-up-bot", "xapp-up-app").await;
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        format!(
            "[[approvers]]\nid = \"alice\"\nmax_risk = \"critical\"\n\
             identities = {{ slack = [\"U0ALICE\"] }}\n\n\
             [slack]\napi_url = \"{}\"\nchannels = [\"C0OPS\"]\ndefault_channel = \"C0OPS\"\n",
            slack.api_url()
        ),
    )
    .unwrap();
    let mut up = home
        .up_with(&[
            ("SLACK_BOT_TOKEN", "xoxb-up-bot"),
            ("SLACK_APP_TOKEN", "xapp-up-app"),
        ])
        .await;
    let log = home.up_log();
    assert!(
        log.contains("the Slack worker posts approvals to your channels"),
        "{log}"
    );
    assert!(!log.contains("xoxb-up-bot"), "{log}");
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));

    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_slack_1", "git push");
    let shown = slack
        .wait_for("the request's message", |slack| {
            slack
                .messages("C0OPS")
                .into_iter()
                .find(|m| m.buttons().len() == 3)
        })
        .await;
    assert!(shown.shown().contains("git push"), "{}", shown.shown());
    slack
        .wait_for("the Socket Mode connection", |slack| {
            (slack.connections() > 0).then_some(())
        })
        .await;
    slack.tap("U0ALICE", &shown, "countersign_approve");
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    interrupt(&home, &mut up).await;
}

/// The webhook worker cannot listen (its port is taken): `up` does not keep serving without
/// it; the server and the other workers stop too, and the error says which piece and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_stops_up_and_says_which() {
    let github = GitHubRepo::start().await;
    let (_receiver, receiver_url) = Receiver::start().await;
    let home = Home::new("http://127.0.0.1:9");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let links = taken.local_addr().unwrap().to_string();
    write_config(&home, &github, &receiver_url, &links, &free_port());

    let mut command = home.countersign(&["up"]);
    for (name, value) in UP_ENV {
        command.env(name, value);
    }
    let output = tokio::time::timeout(STEP, command.output())
        .await
        .expect("up kept running without its webhook worker")
        .unwrap();
    let shown = text(&output);
    assert!(!output.status.success(), "{shown}");
    assert!(
        shown.contains("the webhook worker stopped: cannot serve the decision links on"),
        "{shown}"
    );
    assert!(shown.contains(&links), "{shown}");
}

/// A mistake in a worker's section stops `up` before anything starts, naming the file and
/// the section.
#[tokio::test]
async fn a_bad_worker_section_is_refused_with_the_file_and_the_fix() {
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    std::fs::write(
        home.config_file(),
        "[github]\nbot_login = \"countersign-bot\"\n[github.polling]\n",
    )
    .unwrap();
    let output = home.run(&["up"]).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(64), "{shown}");
    assert!(shown.contains("GitHub token"), "{shown}");
    assert!(shown.contains("countersign setup github"), "{shown}");
    assert!(shown.contains("countersign.toml"), "{shown}");
}
