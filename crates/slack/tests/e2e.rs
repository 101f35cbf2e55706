//! End to end: a real countersign server (in process, loopback gRPC), the fake Slack (Web API
//! and Socket Mode WebSocket), the worker through its library entry point (and as the binary,
//! killed with SIGKILL), the client SDK as the agent, and approvers' taps pushed as Slack
//! pushes them (`block_actions`, `view_submission` envelopes).

use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_slack::config::{
    FileConfig, Taps, APP_TOKEN_ENV, BOT_TOKEN_ENV, SIGNING_SECRET_ENV,
};
use countersign_slack::http::INTERACTIONS_PATH;
use countersign_slack::render::{ALLOW_SESSION, APPROVE, REJECT};
use countersign_slack::Settings;
use countersign_testkit::server::TestServer;
use countersign_testkit::slack::{
    now_secs, post_interaction, FakeSlack, SlackFailure, SlackMessage,
};
use countersign_worker::config::WorkerSettings;

const CHANNEL: &str = "C0APPROVALS";
const BOT_TOKEN: &str = "xoxb-fake-bot-token";
const APP_TOKEN: &str = "xapp-fake-app-token";
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const ALICE: &str = "U0ALICE";
/// Allowed by the worker's list, but no approver's identity.
const CAROL: &str = "U0CAROL";
/// Neither.
const MALLORY: &str = "U0MALLORY";
const APPROVERS: &str = "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { slack = [\"U0ALICE\"] }\n\n[[approvers]]\nid = \"bob\"\nname = \"Bob\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"2002\"] }\n";

fn config_toml(server_url: &str, api_url: &str, state: &Path) -> String {
    format!(
        "[server]\nurl = \"{server_url}\"\nmax_backoff_secs = 1\n\
         [slack]\napi_url = \"{api_url}\"\nchannels = [\"{CHANNEL}\"]\ndefault_channel = \"{CHANNEL}\"\n\
         allowed_user_ids = [\"{ALICE}\", \"{CAROL}\"]\nstate_dir = \"{}\"\n\
         request_timeout_ms = 2000\nretry_interval_ms = 50\nmax_retry_wait_ms = 500\n",
        state.display()
    )
}

fn env(name: &str) -> Option<String> {
    match name {
        BOT_TOKEN_ENV => Some(BOT_TOKEN.to_owned()),
        APP_TOKEN_ENV => Some(APP_TOKEN.to_owned()),
        SIGNING_SECRET_ENV => Some(SIGNING_SECRET.to_owned()),
        _ => None,
    }
}

struct Harness {
    /// Kept running for the test.
    _server: TestServer,
    slack: FakeSlack,
    agent: Client,
    settings: Settings,
    config: PathBuf,
    worker: Option<tokio::task::JoinHandle<Result<(), countersign_slack::WorkerError>>>,
    _state: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

impl Harness {
    async fn without_worker() -> Harness {
        Harness::without_worker_with("").await
    }

    /// With `extra` lines in the `[slack]` section.
    async fn without_worker_with(extra: &str) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start_with_toml(APPROVERS).await;
        let slack = FakeSlack::start(BOT_TOKEN, APP_TOKEN).await;
        let state = tempfile::tempdir().unwrap();
        let toml = config_toml(&server.url(), &slack.api_url(), state.path()) + extra;
        let config = state.path().join("slack.toml");
        std::fs::write(&config, &toml).unwrap();
        let file: FileConfig = toml::from_str(&toml).unwrap();
        let settings = Settings::from_file(file, env).unwrap();
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        Harness {
            _server: server,
            slack,
            agent,
            settings,
            config,
            worker: None,
            _state: state,
        }
    }

    async fn start() -> Harness {
        let mut harness = Harness::without_worker().await;
        harness.start_worker().await;
        harness
    }

    async fn start_worker(&mut self) {
        self.worker = Some(tokio::spawn(countersign_slack::run(
            self.settings.clone(),
            std::future::pending(),
        )));
        match &self.settings.taps {
            Taps::Socket { .. } => {
                self.slack
                    .wait_for("the Socket Mode connection", |slack| {
                        (slack.connections() > 0).then_some(())
                    })
                    .await
            }
            Taps::Http { listen, .. } => {
                for _ in 0..400 {
                    if tokio::net::TcpStream::connect(listen).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        }
    }

    async fn request(&self, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_with(request(key, ttl_seconds)).await
    }

    async fn request_with(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        self.agent
            .request_approval(request)
            .await
            .unwrap()
            .approval
            .unwrap()
    }

    /// The approval's message, once `check` holds.
    async fn message_where(
        &self,
        approval_id: &str,
        what: &str,
        check: impl Fn(&SlackMessage) -> bool,
    ) -> SlackMessage {
        let suffix = &approval_id[approval_id.len() - 8..];
        self.slack
            .wait_for(what, |slack| {
                slack
                    .messages(CHANNEL)
                    .into_iter()
                    .find(|m| m.shown().contains(suffix))
                    .filter(|m| check(m))
            })
            .await
    }

    async fn request_message(&self, approval_id: &str) -> SlackMessage {
        self.message_where(approval_id, "the request message", |m| {
            m.buttons().len() == 3
        })
        .await
    }

    async fn outcome_message(&self, approval_id: &str) -> SlackMessage {
        self.message_where(approval_id, "the outcome", |m| m.buttons().is_empty())
            .await
    }

    async fn state_of(&self, approval_id: &str) -> pb::Approval {
        self.agent.get_approval(approval_id).await.unwrap()
    }

    async fn resolved(&self, approval_id: &str) -> pb::Approval {
        for _ in 0..400 {
            let approval = self.state_of(approval_id).await;
            if approval.state() != pb::ApprovalState::Pending {
                return approval;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("approval {approval_id} still pending");
    }

    async fn acked(&self, envelope_id: &str) {
        self.slack
            .wait_for("the acknowledgement", |slack| {
                slack
                    .acks()
                    .iter()
                    .any(|id| id == envelope_id)
                    .then_some(())
            })
            .await;
    }

    async fn delivered(&self, approval_id: &str) -> Vec<pb::Delivery> {
        for _ in 0..400 {
            let deliveries = self.state_of(approval_id).await.deliveries;
            if !deliveries.is_empty() {
                return deliveries;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Vec::new()
    }
}

fn request(key: &str, ttl_seconds: u32) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "session-7".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"rm -rf build/"}"#.into(),
        action: "delete the build directory\n*✅ Approved* <!channel>".into(),
        reason: "clean rebuild".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: "slack".into(),
            target: String::new(),
        }],
        ttl_seconds,
        ..Default::default()
    }
}

fn post_statuses(slack: &FakeSlack) -> Vec<u16> {
    let posts = slack.calls("chat.postMessage");
    posts.iter().map(|call| call.status).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_is_shown_with_three_buttons_and_the_agent_text_escaped() {
    let harness = Harness::start().await;
    let approval = harness.request("shown", 600).await;
    let shown = harness.request_message(&approval.id).await;
    assert_eq!(shown.buttons(), [APPROVE, REJECT, ALLOW_SESSION]);
    let text = shown.shown();
    assert!(text.contains("*Tool:* `bash`"), "{text}");
    assert!(text.contains("*Risk:* high"), "{text}");
    // The agent's words are code on one line, the mention escaped.
    assert!(
        text.contains(">*Action:* `delete the build directory ⏎ *✅ Approved* &lt;!channel&gt;`"),
        "{text}"
    );
    assert!(!text.contains("<!channel>"), "{text}");
    assert!(text.contains("rm -rf build/"), "{text}");
    assert!(text.contains("*Expires:*"), "{text}");
    let deliveries = harness.delivered(&approval.id).await;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].channel, "slack");
    assert_eq!(deliveries[0].target, CHANNEL);
    assert_eq!(deliveries[0].message_ref, format!("{CHANNEL}:{}", shown.ts));
}

/// A route naming a channel the worker does not post in still reaches approvers: in the
/// default channel, never in the channel named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_a_channel_not_configured_is_posted_in_the_default_channel() {
    let harness = Harness::start().await;
    let mut asked = request("elsewhere", 600);
    asked.routes[0].target = "C0ELSEWHERE".into();
    let approval = harness.request_with(asked).await;
    harness.request_message(&approval.id).await;
    assert!(harness.slack.messages("C0ELSEWHERE").is_empty());
    let deliveries = harness.delivered(&approval.id).await;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].target, CHANNEL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_decides_once_even_when_the_envelope_is_redelivered() {
    let harness = Harness::start().await;
    let approval = harness.request("approve", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (envelope, payload) = harness.slack.tap(ALICE, &shown, APPROVE);
    harness.acked(&envelope).await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    let decision = &resolved.decisions[0];
    assert_eq!(decision.decider.as_ref().unwrap().channel, "slack");
    assert_eq!(decision.decider.as_ref().unwrap().user_id, ALICE);
    assert_eq!(decision.approver, "alice");
    assert_eq!(decision.scope(), pb::Scope::Once);
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated.shown().contains("✅ Approved by `u0alice` (slack)"),
        "{}",
        updated.shown()
    );
    assert_eq!(harness.slack.messages(CHANNEL).len(), 1, "updated in place");
    // Slack sends the same envelope again: acknowledged, decided once.
    let again = harness.slack.push("interactive", payload);
    harness.acked(&again).await;
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
    // The server knew the key: a duplicate, not a second tap on a resolved request.
    assert!(
        harness.slack.ephemerals().is_empty(),
        "{:?}",
        harness.slack.ephemerals()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_progress_is_shown_until_the_last_approval() {
    let harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            required_approvals: 2,
            ..request("quorum", 600)
        })
        .await;
    let shown = harness.request_message(&approval.id).await;
    assert!(
        shown.shown().contains("⏳ Waiting: 0 of 2 approvals"),
        "{}",
        shown.shown()
    );
    harness.slack.tap(ALICE, &shown, APPROVE);
    let progress = harness
        .message_where(&approval.id, "the progress", |m| {
            m.shown()
                .contains("1 of 2 approvals (by `u0alice` (slack))")
        })
        .await;
    assert_eq!(
        progress.buttons().len(),
        3,
        "still open for the second approver"
    );
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Once.into(),
            decider: Some(pb::Decider {
                channel: "telegram".into(),
                user_id: "2002".into(),
                display_name: "Bob".into(),
            }),
            idempotency_key: "telegram:callback:quorum".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let done = harness.outcome_message(&approval.id).await;
    assert!(done.shown().contains("✅ Approved by"), "{}", done.shown());
    assert_eq!(harness.slack.messages(CHANNEL).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_asks_for_a_reason_in_a_modal() {
    let harness = Harness::start().await;
    let approval = harness.request("reject", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (envelope, _) = harness.slack.tap(ALICE, &shown, REJECT);
    harness.acked(&envelope).await;
    let view = harness
        .slack
        .wait_for("the reject modal", |slack| slack.views().pop())
        .await;
    assert_eq!(view.view["title"]["text"], "Reject the request");
    // Opening the modal decides nothing.
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
    let submitted = harness.slack.submit_reason(ALICE, &view, "not on a Friday");
    harness.acked(&submitted).await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions[0].reason, "not on a Friday");
    let updated = harness.outcome_message(&approval.id).await;
    let text = updated.shown();
    assert!(text.contains("❌ Rejected by `u0alice` (slack)"), "{text}");
    assert!(text.contains("*Note:* `not on a Friday`"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_for_session_approves_with_a_session_grant() {
    let harness = Harness::start().await;
    let approval = harness.request("session-1", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness.slack.tap(ALICE, &shown, ALLOW_SESSION);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions[0].scope(), pb::Scope::Session);
    let updated = harness.outcome_message(&approval.id).await;
    assert!(updated.shown().contains("for this session"));
    let next = harness.request("session-2", 600).await;
    assert_eq!(next.state(), pb::ApprovalState::Approved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_elsewhere_updates_the_message_and_its_buttons_decide_nothing() {
    let harness = Harness::start().await;
    let approval = harness.request("elsewhere", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Once.into(),
            decider: Some(pb::Decider {
                channel: "telegram".into(),
                user_id: "2002".into(),
                display_name: "Bob".into(),
            }),
            idempotency_key: "telegram:callback:1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated.shown().contains("✅ Approved by `Bob` (telegram)"),
        "{}",
        updated.shown()
    );
    // A tap on the old buttons (a client that has not refreshed) is told, and decides nothing.
    harness.slack.tap(ALICE, &shown, APPROVE);
    let told = harness
        .slack
        .wait_for("the answer", |slack| slack.ephemerals().pop())
        .await;
    assert_eq!(told.user, ALICE);
    assert!(told.text.contains("already resolved"), "{}", told.text);
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_is_shown_expired() {
    let harness = Harness::start().await;
    let approval = harness.request("expires", 1).await;
    harness.request_message(&approval.id).await;
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated.shown().contains("⌛ Expired"),
        "{}",
        updated.shown()
    );
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    harness.slack.fail_next(SlackFailure {
        status: 429,
        retry_after: Some(2),
    });
    harness.start_worker().await;
    let approval = harness.request("limited", 600).await;
    harness.request_message(&approval.id).await;
    let posts = harness.slack.calls("chat.postMessage");
    assert_eq!(post_statuses(&harness.slack), [429, 200]);
    assert!(
        posts[1].at.duration_since(posts[0].at) >= Duration::from_secs(2),
        "retried before the Retry-After: {:?}",
        posts[1].at.duration_since(posts[0].at)
    );
    assert_eq!(harness.slack.messages(CHANNEL).len(), 1);
}

/// Slack limits per method and workspace, not per approval: after a 429 no other approval's
/// message may be posted before the `Retry-After` either (it was posted 20–50 ms later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_every_approval_until_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    harness.slack.fail_next(SlackFailure {
        status: 429,
        retry_after: Some(3),
    });
    harness.start_worker().await;
    let first = harness.request("limited-1", 600).await;
    let limited = harness
        .slack
        .wait_for("the 429", |slack| {
            slack.calls("chat.postMessage").first().map(|call| call.at)
        })
        .await;
    let second = harness.request("limited-2", 600).await;
    harness.request_message(&first.id).await;
    harness.request_message(&second.id).await;
    let posts = harness.slack.calls("chat.postMessage");
    assert_eq!(post_statuses(&harness.slack), [429, 200, 200]);
    for post in &posts[1..] {
        assert!(
            post.at.duration_since(limited) >= Duration::from_secs(3),
            "a post {:?} after the 429, before its Retry-After",
            post.at.duration_since(limited)
        );
    }
}

/// Socket Mode's `apps.connections.open` answered 429: the worker connects again once the
/// `Retry-After` has passed, not after slack-morphism's fixed 30 s (taps fail meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_connects_again_after_the_retry_after_of_a_429() {
    let mut harness = Harness::without_worker().await;
    harness.slack.fail_next_connect(SlackFailure {
        status: 429,
        retry_after: Some(1),
    });
    // Waits (at most 20 s) for the Socket Mode connection.
    harness.start_worker().await;
    let opens = harness.slack.calls("apps.connections.open");
    assert_eq!(opens[0].status, 429);
    assert_eq!(opens.last().map(|call| call.status), Some(200));
    assert!(
        opens[1].at.duration_since(opens[0].at) >= Duration::from_secs(1),
        "connected again before the Retry-After"
    );
    let approval = harness.request("after-reconnect", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (envelope, _) = harness.slack.tap(ALICE, &shown, APPROVE);
    harness.acked(&envelope).await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
}

/// Arguments full of `<`, `>` and `&` grow fivefold when escaped: they were cut before
/// escaping, the section went past Block Kit's 3,000 characters, Slack answered
/// `invalid_blocks` and the approval was never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_characters_are_fitted_after_escaping() {
    let harness = Harness::start().await;
    let hostile = "<&>".repeat(2_000);
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            arguments_json: serde_json::json!({ "command": hostile }).to_string(),
            // The server's limits: action 1,024 characters, reason 4,096.
            action: "<&>".repeat(300),
            reason: "<&>".repeat(1_300),
            ..request("hostile", 600)
        })
        .await;
    let shown = harness.request_message(&approval.id).await;
    let errors: Vec<Option<String>> = harness
        .slack
        .calls("chat.postMessage")
        .into_iter()
        .map(|call| call.error)
        .collect();
    assert_eq!(errors, [None], "posted whole at the first try");
    let text = shown.shown();
    assert!(text.contains("&lt;&amp;&gt;&lt;&amp;&gt;"), "{text}");
    assert!(
        !text.contains("web inbox"),
        "the full message, not the minimal one"
    );
    for block in shown.blocks.as_array().unwrap() {
        let section = block["text"]["text"].as_str().unwrap_or_default();
        assert!(section.chars().count() <= 3_000, "{section}");
        // No escape is cut in half.
        let tail = section.trim_end_matches(['`', '…', '\n']);
        assert!(!tail.ends_with('&') && !tail.ends_with("&l") && !tail.ends_with("&am"));
    }
}

/// When Slack still refuses a message for its content, a minimal one is shown instead of
/// nothing: the tool, the risk, the id, where else to decide, and the buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_refused_for_its_content_is_replaced_by_a_minimal_one() {
    let harness = Harness::start().await;
    harness.slack.refuse_next("msg_too_long");
    let approval = harness.request("refused", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let errors: Vec<Option<String>> = harness
        .slack
        .calls("chat.postMessage")
        .into_iter()
        .map(|call| call.error)
        .collect();
    assert_eq!(errors, [Some("msg_too_long".to_owned()), None]);
    let text = shown.shown();
    assert!(text.contains("`bash`"), "{text}");
    assert!(text.contains("high"), "{text}");
    assert!(text.contains(&approval.id), "{text}");
    assert!(text.contains("web inbox"), "{text}");
    assert!(
        text.contains(&format!("countersign approve {}", approval.id)),
        "{text}"
    );
    let (envelope, _) = harness.slack.tap(ALICE, &shown, APPROVE);
    harness.acked(&envelope).await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_until_the_message_is_posted() {
    let mut harness = Harness::without_worker().await;
    for status in [503, 500] {
        harness.slack.fail_next(SlackFailure {
            status,
            retry_after: None,
        });
    }
    harness.start_worker().await;
    let approval = harness.request("flaky", 600).await;
    harness.request_message(&approval.id).await;
    assert_eq!(post_statuses(&harness.slack), [503, 500, 200]);
    assert_eq!(harness.slack.messages(CHANNEL).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_unauthorised_actions_are_refused_and_decide_nothing() {
    let harness = Harness::start().await;
    let first = harness.request("forged-1", 600).await;
    let second = harness.request("forged-2", 600).await;
    let shown = harness.request_message(&first.id).await;
    harness.request_message(&second.id).await;
    // A user the worker does not allow: refused before Decide.
    let (envelope, _) = harness.slack.tap(MALLORY, &shown, APPROVE);
    harness.acked(&envelope).await;
    // An allowed Slack user who is no approver's identity: the server refuses.
    let (envelope, _) = harness.slack.tap(CAROL, &shown, APPROVE);
    harness.acked(&envelope).await;
    // An approver's tap on the first message with a value naming the second approval.
    let forged = format!("{} {}", second.id, second.args_digest);
    let (envelope, _) = harness
        .slack
        .tap_with_value(ALICE, &shown, APPROVE, &forged);
    harness.acked(&envelope).await;
    let told = harness
        .slack
        .wait_for("three refusals", |slack| {
            let told = slack.ephemerals();
            (told.len() == 3).then_some(told)
        })
        .await;
    assert_eq!(
        told.iter().map(|t| t.user.as_str()).collect::<Vec<_>>(),
        [MALLORY, CAROL, ALICE]
    );
    assert!(told[0].text.contains("not allowed"), "{}", told[0].text);
    assert!(told[1].text.contains("not know you"), "{}", told[1].text);
    assert!(
        told[2].text.contains("not on a message"),
        "{}",
        told[2].text
    );
    for id in [&first.id, &second.id] {
        let after = harness.state_of(id).await;
        assert_eq!(after.state(), pb::ApprovalState::Pending);
        assert!(after.decisions.is_empty());
    }
    // The real button still works.
    harness.slack.tap(ALICE, &shown, APPROVE);
    assert_eq!(
        harness.resolved(&first.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(
        harness.state_of(&second.id).await.state(),
        pb::ApprovalState::Pending
    );
}

/// Slack stored the message and the approver tapped it before the worker heard back from
/// `chat.postMessage` (so before it recorded the message's `ts`): the tap is checked against
/// Slack's history and decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_before_the_post_is_answered_decides() {
    let harness = Harness::start().await;
    harness.slack.hold_posts(Duration::from_secs(3600));
    let approval = harness.request("early-tap", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (envelope, _) = harness.slack.tap(ALICE, &shown, APPROVE);
    harness.acked(&envelope).await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert!(harness.slack.ephemerals().is_empty());
}

/// HTTP mode: Slack POSTs the interaction to the Request URL. A request whose signature is
/// made with another secret, or whose timestamp is more than five minutes old, is refused
/// and decides nothing; the correctly signed one decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_mode_decides_only_on_requests_signed_within_five_minutes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let extra = format!("mode = \"http\"\nlisten = \"127.0.0.1:{port}\"\n");
    let mut harness = Harness::without_worker_with(&extra).await;
    harness.start_worker().await;
    assert_eq!(
        harness.slack.connections(),
        0,
        "no Socket Mode in HTTP mode"
    );
    let approval = harness.request("http", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let url = format!("http://127.0.0.1:{port}{INTERACTIONS_PATH}");
    let value = shown.button_value(APPROVE).unwrap();
    let tap = harness.slack.block_actions(ALICE, &shown, APPROVE, &value);
    let now = now_secs();
    assert_eq!(
        post_interaction(&url, "another-secret", now, &tap).await,
        401
    );
    assert_eq!(
        post_interaction(&url, SIGNING_SECRET, now - 301, &tap).await,
        401,
        "older than five minutes"
    );
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
    assert_eq!(post_interaction(&url, SIGNING_SECRET, now, &tap).await, 200);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions.len(), 1);
    harness.outcome_message(&approval.id).await;
}

fn spawn_worker(config: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-slack"))
        .arg("--config")
        .arg(config)
        .env(BOT_TOKEN_ENV, BOT_TOKEN)
        .env(APP_TOKEN_ENV, APP_TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The binary is killed with SIGKILL after Slack stored the message but before the worker
/// heard back (so before it recorded anything). The restarted worker finds the message by its
/// metadata and adopts it: no second post, and the buttons of that message decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_posting_and_recording_neither_duplicates_nor_loses() {
    let harness = Harness::without_worker().await;
    harness.slack.hold_posts(Duration::from_secs(3600));
    let mut worker = spawn_worker(&harness.config);
    let approval = harness.request("crash", 600).await;
    let shown = harness.request_message(&approval.id).await;
    worker.kill().await.unwrap(); // SIGKILL, Slack's answer still held
    harness.slack.hold_posts(Duration::ZERO);
    assert!(harness.state_of(&approval.id).await.deliveries.is_empty());

    let mut worker = spawn_worker(&harness.config);
    assert_eq!(harness.delivered(&approval.id).await.len(), 1, "adopted");
    assert_eq!(post_statuses(&harness.slack), [200], "not posted again");
    harness
        .slack
        .wait_for("the new Socket Mode connection", |slack| {
            (slack.connections() > 0).then_some(())
        })
        .await;
    harness.slack.tap(ALICE, &shown, APPROVE);
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    harness.outcome_message(&approval.id).await;
    assert_eq!(harness.slack.messages(CHANNEL).len(), 1);
    worker.kill().await.unwrap();
}

#[test]
fn the_binary_has_help() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_countersign-slack"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "--config",
        BOT_TOKEN_ENV,
        APP_TOKEN_ENV,
        "COUNTERSIGN_WORKER_TOKEN",
    ] {
        assert!(help.contains(needle), "{help}");
    }
}

/// What `setup slack` asks of Slack, answered as Slack does: the bot's channels over several
/// pages of `users.conversations`, a public channel found by name and joined, and the
/// refusals of `conversations.join` (a private channel, an archived one, an unknown id) and of
/// `apps.connections.open` (a bot token instead of the app-level one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_calls_list_find_and_join_channels_and_refuse_what_slack_refuses() {
    use countersign_slack::api::{client, SlackApi};
    use std::sync::Arc;

    let slack = FakeSlack::start(BOT_TOKEN, APP_TOKEN).await;
    let general = slack.add_channel("general", false, true);
    let ops = slack.add_channel("ops", true, true);
    let random = slack.add_channel("random", false, true);
    let approvals = slack.add_channel("approvals", false, false);
    let hidden = slack.add_channel("hidden", true, false);
    let old = slack.add_channel("old", false, false);
    slack.archive_channel(&old);
    let http = Arc::new(client(&slack.api_url()).unwrap());
    let bot = SlackApi::new(http.clone(), BOT_TOKEN, Duration::from_secs(5));

    let member: Vec<String> = bot
        .member_channels()
        .await
        .unwrap()
        .into_iter()
        .map(|channel| channel.id)
        .collect();
    assert_eq!(member, [general, ops.clone(), random]);
    assert!(
        slack.calls("users.conversations").len() >= 2,
        "one page only"
    );
    let found = bot.public_channel("approvals").await.unwrap().unwrap();
    assert_eq!(found.id, approvals);
    assert!(bot.public_channel("hidden").await.unwrap().is_none());
    assert!(bot.public_channel("old").await.unwrap().is_none());
    assert_eq!(bot.join(&approvals).await.unwrap().id, approvals);
    assert!(slack.bot_in(&approvals));
    assert_eq!(bot.join(&approvals).await.unwrap().id, approvals);

    let code = |result: Result<_, countersign_slack::api::SlackError>| {
        result
            .err()
            .and_then(|error| error.code().map(str::to_owned))
    };
    assert_eq!(
        code(bot.join(&hidden).await.map(drop)).as_deref(),
        Some("method_not_supported_for_channel_type")
    );
    assert_eq!(
        code(bot.join(&old).await.map(drop)).as_deref(),
        Some("is_archived")
    );
    assert_eq!(
        code(bot.join("C0NOWHERE").await.map(drop)).as_deref(),
        Some("channel_not_found")
    );
    let owner = bot.owner().await.unwrap();
    assert_eq!(owner.user_id, "U0BOT");
    let wrong = SlackApi::new(http.clone(), "xoxb-wrong", Duration::from_secs(5));
    assert_eq!(
        code(wrong.owner().await.map(drop)).as_deref(),
        Some("invalid_auth")
    );
    assert_eq!(
        code(bot.open_connection().await).as_deref(),
        Some("not_allowed_token_type")
    );
    let app = SlackApi::new(http, APP_TOKEN, Duration::from_secs(5));
    app.open_connection().await.unwrap();
}
