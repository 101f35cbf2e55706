//! End to end: a real countersign server (in process, loopback gRPC), the fake ntfy server,
//! the worker through its library entry point (and as the binary, killed with SIGKILL), the
//! client SDK as the agent, and the buttons tapped as the ntfy app does (the `http` action's
//! request, or the `view` action's page in a browser).

use std::path::Path;
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_ntfy::config::{FileConfig, ACCESS_TOKEN_ENV};
use countersign_ntfy::Settings;
use countersign_testkit::http;
use countersign_testkit::ntfy::{tap, FakeNtfy, NtfyFailure, NtfyMessage};
use countersign_testkit::server::TestServer;
use countersign_worker::config::WorkerSettings;
use serde_json::{json, Value};

const TOPIC: &str = "alice-approvals";
const ACCESS_TOKEN: &str = "tk_fakeaccesstoken0123456789abc";
const APPROVERS: &str = "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { ntfy = [\"alice\"] }\n\n[[approvers]]\nid = \"bob\"\nname = \"Bob\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"2002\"] }\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The reply topic of the reply-topic harness.
const REPLY_TOPIC: &str = "cs-reply-Qm7dX2kP9vR4tL8wZ3nB6yH1";

/// How the buttons of a harness decide.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Decision-link pages served by the worker (`public_url`).
    Links,
    /// A reply topic on the ntfy server (`reply_topic`): no inbound port.
    Replies,
}

fn config_toml(server_url: &str, ntfy_url: &str, state: &Path, port: u16, mode: Mode) -> String {
    let decisions = match mode {
        Mode::Links => {
            format!("listen = \"127.0.0.1:{port}\"\npublic_url = \"http://127.0.0.1:{port}\"\n")
        }
        Mode::Replies => format!("reply_topic = \"{REPLY_TOPIC}\"\n"),
    };
    format!(
        "[server]\nurl = \"{server_url}\"\nmax_backoff_secs = 1\n\
         [ntfy]\nserver_url = \"{ntfy_url}\"\ndefault_topic = \"{TOPIC}\"\n{decisions}\
         state_dir = \"{}\"\nrequest_timeout_ms = 2000\nretry_interval_ms = 50\nmax_retry_wait_ms = 500\n\
         [[topics]]\nname = \"{TOPIC}\"\napprover = \"alice\"\n",
        state.display()
    )
}

struct Harness {
    /// Kept running for the test.
    _server: TestServer,
    ntfy: FakeNtfy,
    agent: Client,
    settings: Settings,
    config: std::path::PathBuf,
    worker: Option<tokio::task::JoinHandle<Result<(), countersign_ntfy::WorkerError>>>,
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
        Harness::without_worker_in(Mode::Links).await
    }

    async fn without_worker_in(mode: Mode) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start_with_toml(APPROVERS).await;
        let ntfy = FakeNtfy::start_with_token(Some(ACCESS_TOKEN)).await;
        let state = tempfile::tempdir().unwrap();
        // The phone's buttons publish to the reply topic without the worker's token.
        ntfy.allow_anonymous_write(REPLY_TOPIC);
        let toml = config_toml(&server.url(), &ntfy.url(), state.path(), free_port(), mode);
        let config = state.path().join("ntfy.toml");
        std::fs::write(&config, &toml).unwrap();
        let file: FileConfig = toml::from_str(&toml).unwrap();
        let settings = Settings::from_file(file, |name| {
            (name == ACCESS_TOKEN_ENV).then(|| ACCESS_TOKEN.to_owned())
        })
        .unwrap();
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        Harness {
            _server: server,
            ntfy,
            agent,
            settings,
            config,
            worker: None,
            _state: state,
        }
    }

    async fn start() -> Harness {
        let mut harness = Harness::without_worker().await;
        harness.start_worker();
        harness
    }

    fn start_worker(&mut self) {
        self.worker = Some(tokio::spawn(countersign_ntfy::run(
            self.settings.clone(),
            std::future::pending(),
        )));
    }

    async fn request(&self, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_to("", key, ttl_seconds).await
    }

    /// An approval routed to the ntfy topic `target` (empty: the default topic).
    async fn request_to(&self, target: &str, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_with(
            target,
            key,
            ttl_seconds,
            r#"{"command":"rm -rf build/"}"#,
            "delete the build directory\nRisk: LOW",
        )
        .await
    }

    async fn request_with(
        &self,
        target: &str,
        key: &str,
        ttl_seconds: u32,
        arguments_json: &str,
        action: &str,
    ) -> pb::Approval {
        self.agent
            .request_approval(pb::RequestApprovalRequest {
                agent_id: "coder-1".into(),
                session_id: "session-7".into(),
                idempotency_key: key.into(),
                tool_name: "bash".into(),
                arguments_json: arguments_json.into(),
                action: action.into(),
                reason: "clean rebuild".into(),
                risk: pb::Risk::High.into(),
                routes: vec![pb::Route {
                    channel: "ntfy".into(),
                    target: target.into(),
                }],
                ttl_seconds,
                ..Default::default()
            })
            .await
            .unwrap()
            .approval
            .unwrap()
    }

    /// The approval's notification as subscribers see it, once `check` holds.
    async fn notification_where(
        &self,
        approval_id: &str,
        what: &str,
        check: impl Fn(&NtfyMessage) -> bool,
    ) -> NtfyMessage {
        let sequence_id = format!("countersign-{approval_id}");
        self.ntfy
            .wait_for(what, |ntfy| {
                ntfy.notifications(TOPIC)
                    .into_iter()
                    .find(|m| m.sequence_id.as_deref() == Some(sequence_id.as_str()))
                    .filter(|m| check(m))
            })
            .await
    }

    async fn request_notification(&self, approval_id: &str) -> NtfyMessage {
        self.notification_where(approval_id, "the request notification", |m| {
            m.actions.len() == 3
        })
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
}

fn request_posts(ntfy: &FakeNtfy) -> usize {
    ntfy.requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count()
}

/// A browser's GET of a `view` action's page.
async fn open_page(url: &str) -> (u16, String) {
    tap(&json!({"method": "GET", "url": url})).await
}

/// A browser's POST of a page's form.
async fn submit(url: &str, form: &str) -> (u16, String) {
    tap(&json!({
        "method": "POST",
        "url": url,
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        "body": form,
    }))
    .await
}

fn hidden_field(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page.find(&marker).expect("the field") + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

fn action<'a>(message: &'a NtfyMessage, label: &str) -> &'a Value {
    message
        .action(label)
        .unwrap_or_else(|| panic!("no {label} button on {message:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_is_shown_with_three_buttons_and_priority_from_risk() {
    let harness = Harness::start().await;
    let approval = harness.request("shown", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    assert_eq!(shown.title, "⚠️ Approve bash?");
    assert_eq!(shown.priority, 5, "high risk is max priority");
    assert_eq!(shown.labels(), ["Approve", "Reject…", "Allow for session"]);
    assert_eq!(action(&shown, "Approve")["action"], "http");
    assert_eq!(action(&shown, "Reject…")["action"], "view");
    // The agent's words on one line each, under "The agent says", and nothing more.
    assert!(
        shown
            .message
            .contains("│ Action: delete the build directory ⏎ Risk: LOW\n"),
        "{}",
        shown.message
    );
    assert_eq!(
        shown
            .message
            .lines()
            .filter(|l| l.starts_with("Risk:"))
            .count(),
        1
    );
    assert!(shown.message.contains("rm -rf build/"));
    assert!(shown
        .message
        .ends_with(&approval.id[approval.id.len() - 8..]));
    // The access token was required; the delivery is on the server.
    assert!(harness.ntfy.requests().iter().all(|r| r.status != 401));
    for _ in 0..200 {
        if !harness.state_of(&approval.id).await.deliveries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let delivery = &harness.state_of(&approval.id).await.deliveries[0];
    assert_eq!(delivery.channel, "ntfy");
    // The topic by its fingerprint: an agent reading its approval cannot learn the topic.
    assert_eq!(delivery.target, countersign_ntfy::topic_fingerprint(TOPIC));
    assert!(
        !delivery.message_ref.contains(TOPIC),
        "{}",
        delivery.message_ref
    );
}

/// A route naming a topic the worker does not publish to still reaches approvers: on the
/// default topic, never on the topic named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_a_topic_not_configured_is_published_to_the_default_topic() {
    let harness = Harness::start().await;
    let approval = harness
        .request_to("someone-elses-phone", "elsewhere", 600)
        .await;
    harness.request_notification(&approval.id).await;
    assert!(harness.ntfy.notifications("someone-elses-phone").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_decides_once_and_updates_the_notification() {
    let harness = Harness::start().await;
    let approval = harness.request("approve", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    let (status, page) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 200, "{page}");
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    let decision = &resolved.decisions[0];
    assert_eq!(decision.decider.as_ref().unwrap().channel, "ntfy");
    assert_eq!(decision.approver, "alice");
    assert_eq!(decision.scope(), pb::Scope::Once);
    let updated = harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "✅ Approved: bash");
    assert!(
        updated.message.starts_with("By alice (ntfy)"),
        "{}",
        updated.message
    );
    assert_eq!(
        harness.ntfy.notifications(TOPIC).len(),
        1,
        "updated in place"
    );
    // The link decided once; it and its siblings are spent.
    let (again, _) = tap(action(&shown, "Approve")).await;
    assert_eq!(again, 409);
    let (sibling, _) = tap(action(&shown, "Allow for session")).await;
    assert_eq!(sibling, 409);
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_asks_for_a_reason_on_its_page() {
    let harness = Harness::start().await;
    let approval = harness.request("reject", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    let url = action(&shown, "Reject…")["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, page) = open_page(&url).await;
    assert_eq!(status, 200);
    assert!(page.contains("<textarea name=\"reason\""), "{page}");
    // The page only shows: nothing is decided by opening it.
    assert_eq!(
        harness.state_of(&approval.id).await.state(),
        pb::ApprovalState::Pending
    );
    let form = format!(
        "form_token={}&args_digest={}&reason=not+on+a+Friday",
        hidden_field(&page, "form_token"),
        hidden_field(&page, "args_digest")
    );
    let (status, page) = submit(&url, &form).await;
    assert_eq!(status, 200, "{page}");
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions[0].reason, "not on a Friday");
    let updated = harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "❌ Rejected: bash");
    assert!(
        updated.message.contains("“not on a Friday”"),
        "{}",
        updated.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_for_session_approves_with_a_session_grant() {
    let harness = Harness::start().await;
    let approval = harness.request("session-1", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    let (status, page) = tap(action(&shown, "Allow for session")).await;
    assert_eq!(status, 200, "{page}");
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions[0].scope(), pb::Scope::Session);
    // The grant approves the session's next call of the tool at once.
    let next = harness.request("session-2", 600).await;
    assert_eq!(next.state(), pb::ApprovalState::Approved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_elsewhere_updates_the_notification_and_its_buttons_decide_nothing() {
    let harness = Harness::start().await;
    let approval = harness.request("elsewhere", 600).await;
    let shown = harness.request_notification(&approval.id).await;
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
    let updated = harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "✅ Approved: bash");
    assert!(
        updated.message.starts_with("By Bob (telegram)"),
        "{}",
        updated.message
    );
    assert_eq!(updated.priority, 2, "an update does not ring again");
    let (status, page) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 409, "{page}");
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Approved);
    assert_eq!(after.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_is_shown_expired_and_its_links_expire() {
    let harness = Harness::start().await;
    let approval = harness.request("expires", 1).await;
    let shown = harness.request_notification(&approval.id).await;
    let updated = harness
        .notification_where(&approval.id, "the expiry", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "⌛ Expired: bash");
    let (status, page) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 410, "{page}");
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    harness.ntfy.fail_next(NtfyFailure {
        status: 429,
        retry_after: Some(2),
    });
    harness.start_worker();
    let approval = harness.request("limited", 600).await;
    harness.request_notification(&approval.id).await;
    let posts: Vec<_> = harness
        .ntfy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].status, 429);
    assert_eq!(posts[1].status, 200);
    assert!(
        posts[1].at.duration_since(posts[0].at) >= Duration::from_secs(2),
        "retried before the Retry-After: {:?}",
        posts[1].at.duration_since(posts[0].at)
    );
    assert_eq!(harness.ntfy.notifications(TOPIC).len(), 1);
}

/// ntfy limits per client (visitor), not per approval: after a 429 no other approval's
/// notification may be published before the `Retry-After` either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_every_approval_until_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    harness.ntfy.fail_next(NtfyFailure {
        status: 429,
        retry_after: Some(3),
    });
    harness.start_worker();
    let first = harness.request("limited-1", 600).await;
    let limited_at = harness
        .ntfy
        .wait_for("the 429", |ntfy| {
            ntfy.requests()
                .into_iter()
                .find(|r| r.method == "POST")
                .map(|r| r.at)
        })
        .await;
    let second = harness.request("limited-2", 600).await;
    harness.request_notification(&first.id).await;
    harness.request_notification(&second.id).await;
    let posts: Vec<Duration> = harness
        .ntfy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.at.duration_since(limited_at))
        .collect();
    assert_eq!(posts.len(), 3, "{posts:?}");
    assert!(
        posts[1..]
            .iter()
            .all(|since| *since >= Duration::from_secs(3)),
        "publishes {posts:?} after the 429, before its Retry-After"
    );
}

/// Arguments that grow when made visible (a bidirectional control becomes `⟨U+202E⟩`, 11
/// bytes) and an action of 4 bytes a character still fit ntfy's 4,096-byte message,
/// which the fake enforces as ntfy does (a longer one is refused: no attachment cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_grows_when_made_visible_fits_ntfy_s_4096_bytes() {
    let harness = Harness::start().await;
    let hostile = "\u{202E}😀".repeat(2_000);
    let approval = harness
        .request_with(
            "",
            "hostile",
            600,
            &serde_json::json!({ "command": hostile }).to_string(),
            // The server refuses hidden characters in the action; 4 bytes a character it takes.
            &"😀".repeat(1_000),
        )
        .await;
    let shown = harness.request_notification(&approval.id).await;
    assert!(shown.message.len() < 4_096, "{} bytes", shown.message.len());
    assert!(shown.message.contains("⟨U+202E⟩😀"), "{}", shown.message);
    assert!(!shown.message.contains('\u{202E}'), "{}", shown.message);
}

/// A notification ntfy refuses for its content (400, as for a message it takes for a file)
/// is replaced by its minimal form, with the buttons, instead of nothing (issue 44, item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_refused_for_its_content_is_replaced_by_a_minimal_one() {
    let mut harness = Harness::without_worker().await;
    harness.ntfy.fail_next(NtfyFailure {
        status: 400,
        retry_after: None,
    });
    harness.start_worker();
    let approval = harness.request("refused", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    assert!(shown.message.contains(&approval.id), "{}", shown.message);
    assert!(
        shown.message.contains("decide in the web inbox"),
        "{}",
        shown.message
    );
    assert!(!shown.message.contains("rm -rf"), "{}", shown.message);
    let statuses: Vec<u16> = harness
        .ntfy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [400, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_until_the_notification_is_published() {
    let mut harness = Harness::without_worker().await;
    for status in [503, 500] {
        harness.ntfy.fail_next(NtfyFailure {
            status,
            retry_after: None,
        });
    }
    harness.start_worker();
    let approval = harness.request("flaky", 600).await;
    harness.request_notification(&approval.id).await;
    let statuses: Vec<u16> = harness
        .ntfy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [503, 500, 200]);
    assert_eq!(harness.ntfy.notifications(TOPIC).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_altered_links_are_refused_and_decide_nothing() {
    let harness = Harness::start().await;
    let approval = harness.request("forged", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    let approve = action(&shown, "Approve").clone();
    let url = approve["url"].as_str().unwrap().to_owned();
    let base = url.rsplit_once('/').unwrap().0.to_owned();
    // A token never handed out.
    let mut forged = approve.clone();
    forged["url"] = json!(format!("{base}/{}", "A".repeat(43)));
    assert_eq!(tap(&forged).await.0, 404);
    // The real token with one character changed.
    let token = url.rsplit_once('/').unwrap().1;
    let flipped = if token.starts_with('A') { "B" } else { "A" };
    let mut altered = approve.clone();
    altered["url"] = json!(format!("{base}/{flipped}{}", &token[1..]));
    assert_eq!(tap(&altered).await.0, 404);
    // The real link with a form token of its own making.
    let mut wrong_form = approve.clone();
    wrong_form["body"] = json!(format!(
        "form_token={}&args_digest={}",
        "00".repeat(32),
        approval.args_digest
    ));
    assert_eq!(tap(&wrong_form).await.0, 403);
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Pending);
    assert!(after.decisions.is_empty());
    // The real button still works afterwards.
    assert_eq!(tap(&approve).await.0, 200);
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
}

#[path = "e2e/replies.rs"]
mod replies;

fn spawn_worker(config: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-ntfy"))
        .arg("--config")
        .arg(config)
        .env(ACCESS_TOKEN_ENV, ACCESS_TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The binary is killed with SIGKILL after ntfy stored the notification but before the
/// worker heard back (so before it recorded anything). The restarted worker finds the
/// message in the topic's cache and adopts it: no second publish, and the buttons of the
/// notification the phone shows decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_publishing_and_recording_neither_duplicates_nor_loses() {
    let harness = Harness::without_worker().await;
    harness.ntfy.hold_publishes(Duration::from_secs(3600));
    let mut worker = spawn_worker(&harness.config);
    let approval = harness.request("crash", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    worker.kill().await.unwrap(); // SIGKILL, ntfy's answer still held
    harness.ntfy.hold_publishes(Duration::ZERO);
    assert!(harness.state_of(&approval.id).await.deliveries.is_empty());

    let mut worker = spawn_worker(&harness.config);
    for _ in 0..400 {
        if !harness.state_of(&approval.id).await.deliveries.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        harness.state_of(&approval.id).await.deliveries.len(),
        1,
        "adopted"
    );
    assert_eq!(request_posts(&harness.ntfy), 1, "not published again");
    let (status, page) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(harness.ntfy.notifications(TOPIC).len(), 1);
    worker.kill().await.unwrap();
}

/// The binary with `[metrics] listen` serves `/healthz` and the runtime's series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_health_and_metrics_on_its_metrics_address() {
    let harness = Harness::without_worker().await;
    let addr = http::free_addr();
    let config = harness.config.with_file_name("ntfy-metrics.toml");
    let toml = std::fs::read_to_string(&harness.config).unwrap();
    std::fs::write(&config, format!("{toml}[metrics]\nlisten = \"{addr}\"\n")).unwrap();
    let mut worker = spawn_worker(&config);
    let approval = harness.request("observed", 600).await;
    harness.request_notification(&approval.id).await;
    let mut last = None;
    for _ in 0..400 {
        if let (Ok(health), Ok(metrics)) = (
            http::get(addr, "/healthz").await,
            http::get(addr, "/metrics").await,
        ) {
            let shown = metrics.body.lines().any(|line| {
                line.starts_with("countersign_worker_shows_total{")
                    && line.contains("outcome=\"ok\"")
                    && line.contains("channel=\"ntfy\"")
                    && !line.ends_with(" 0")
            });
            if health.status == 200 && shown {
                worker.kill().await.unwrap();
                return;
            }
            last = Some((health, metrics));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no healthy worker with a counted show: {last:?}");
}

#[test]
fn the_binary_has_help() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_countersign-ntfy"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--config"), "{help}");
    assert!(help.contains("NTFY_TOKEN"), "{help}");
    assert!(help.contains("COUNTERSIGN_WORKER_TOKEN"), "{help}");
}
