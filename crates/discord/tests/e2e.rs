//! End to end: a real countersign server (in process, loopback gRPC), the fake Discord (REST
//! and Gateway WebSocket), the worker through its library entry point (and as the binary,
//! killed with SIGKILL), the client SDK as the agent, and approvers' taps dispatched as Discord
//! dispatches them (INTERACTION_CREATE over the Gateway, or signed POSTs to the worker's
//! Interactions Endpoint URL).

use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_discord::config::{FileConfig, Taps, BOT_TOKEN_ENV};
use countersign_discord::http::INTERACTIONS_PATH;
use countersign_discord::render::{ALLOW_SESSION, APPROVE, REJECT};
use countersign_discord::Settings;
use countersign_testkit::discord::{
    DiscordFailure, DiscordMessage, DiscordUser, FakeDiscord, InteractionAnswer,
};
use countersign_testkit::server::TestServer;
use countersign_worker::config::WorkerSettings;
use ed25519_dalek::{Signer, SigningKey};

const CHANNEL: &str = "1300000000000000001";
const BOT_TOKEN: &str = "fake-discord-bot-token";
const ALICE_ID: &str = "1400000000000000001";
/// No approver's identity.
const MALLORY_ID: &str = "1400000000000000666";
const APPROVERS: &str = "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { discord = [\"1400000000000000001\"] }\n\n[[approvers]]\nid = \"bob\"\nname = \"Bob\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"2002\"] }\n";

fn alice() -> DiscordUser {
    DiscordUser::new(ALICE_ID, "alice")
}

fn mallory() -> DiscordUser {
    DiscordUser::new(MALLORY_ID, "mallory")
}

fn config_toml(server_url: &str, discord: &FakeDiscord, state: &Path, extra: &str) -> String {
    format!(
        "[server]\nurl = \"{server_url}\"\nmax_backoff_secs = 1\n\
         [discord]\napi_url = \"{}\"\ngateway_url = \"{}\"\nchannels = [\"{CHANNEL}\"]\n\
         default_channel = \"{CHANNEL}\"\nstate_dir = \"{}\"\n\
         request_timeout_ms = 2000\nretry_interval_ms = 50\nmax_retry_wait_ms = 500\n{extra}",
        discord.api_url(),
        discord.gateway_url(),
        state.display()
    )
}

fn env(name: &str) -> Option<String> {
    (name == BOT_TOKEN_ENV).then(|| BOT_TOKEN.to_owned())
}

struct Harness {
    _server: TestServer,
    discord: FakeDiscord,
    agent: Client,
    settings: Settings,
    config: PathBuf,
    worker: Option<tokio::task::JoinHandle<Result<(), countersign_discord::WorkerError>>>,
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

    /// With `extra` lines in the `[discord]` section.
    async fn without_worker_with(extra: &str) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start_with_toml(APPROVERS).await;
        let discord = FakeDiscord::start(BOT_TOKEN).await;
        let state = tempfile::tempdir().unwrap();
        let toml = config_toml(&server.url(), &discord, state.path(), extra);
        let config = state.path().join("discord.toml");
        std::fs::write(&config, &toml).unwrap();
        let file: FileConfig = toml::from_str(&toml).unwrap();
        let settings = Settings::from_file(file, env).unwrap();
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        Harness {
            _server: server,
            discord,
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
        self.worker = Some(tokio::spawn(countersign_discord::run(
            self.settings.clone(),
            std::future::pending(),
        )));
        match &self.settings.taps {
            Taps::Gateway => self.gateway_ready().await,
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

    async fn gateway_ready(&self) {
        self.discord
            .wait_for("the Gateway session", |discord| {
                discord.connected().then_some(())
            })
            .await;
    }

    async fn request(&self, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_with(request(key, ttl_seconds)).await
    }

    async fn request_with(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        let response = self.agent.request_approval(request).await.unwrap();
        response.approval.unwrap()
    }

    /// The approval's message, once `check` holds.
    async fn message_where(
        &self,
        approval_id: &str,
        what: &str,
        check: impl Fn(&DiscordMessage) -> bool,
    ) -> DiscordMessage {
        let suffix = &approval_id[approval_id.len() - 8..];
        self.discord
            .wait_for(what, |discord| {
                let messages = discord.messages(CHANNEL).into_iter();
                messages
                    .filter(|m| m.content.contains(suffix))
                    .find(|m| check(m))
            })
            .await
    }

    async fn request_message(&self, approval_id: &str) -> DiscordMessage {
        self.message_where(approval_id, "the request message", |m| {
            m.buttons().len() == 3
        })
        .await
    }

    async fn outcome_message(&self, approval_id: &str) -> DiscordMessage {
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

    /// The answer the interaction `id` got.
    async fn answer(&self, id: &str) -> InteractionAnswer {
        self.discord
            .wait_for("the interaction's answer", |discord| {
                discord
                    .answers()
                    .into_iter()
                    .find(|a| a.interaction_id == id)
            })
            .await
    }

    /// What the user was told ephemerally about the interaction `id`.
    async fn told(&self, id: &str) -> String {
        self.discord
            .wait_for("the ephemeral answer", |discord| discord.told(id))
            .await
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

    async fn decide_on_telegram(&self, approval_id: &str, key: &str) {
        self.agent
            .decide(pb::DecideRequest {
                approval_id: approval_id.to_owned(),
                verdict: pb::Verdict::Approve.into(),
                scope: pb::Scope::Once.into(),
                decider: Some(pb::Decider {
                    channel: "telegram".into(),
                    user_id: "2002".into(),
                    display_name: "Bob".into(),
                }),
                idempotency_key: key.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

fn request(key: &str, ttl_seconds: u32) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "session-7".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"echo `whoami` @everyone"}"#.into(),
        action:
            "delete the build directory\n**✅ Approved** @everyone <@1400000000000000001> <@&99>"
                .into(),
        reason: "clean rebuild".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: "discord".into(),
            target: String::new(),
        }],
        ttl_seconds,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_is_shown_with_three_buttons_escaped_and_mentioning_no_one() {
    let harness = Harness::start().await;
    let approval = harness.request("shown", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let verbs: Vec<String> = shown
        .buttons()
        .iter()
        .map(|id| id.split(':').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(verbs, [APPROVE, REJECT, ALLOW_SESSION]);
    let text = &shown.content;
    assert!(text.contains("**Tool:** `bash` · **Risk:** high"), "{text}");
    // The agent's words are code on one line: no bold, no mention rendered.
    assert!(
        text.contains("> **Action:** `delete the build directory ⏎ **✅ Approved** @everyone <@1400000000000000001> <@&99>`"),
        "{text}"
    );
    assert!(
        text.contains("echo ˋwhoamiˋ @everyone"),
        "a backtick cannot close the code: {text}"
    );
    assert_eq!(
        shown.allowed_mentions,
        serde_json::json!({"parse": []}),
        "no mention notifies"
    );
    let deliveries = harness.delivered(&approval.id).await;
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].channel, "discord");
    assert_eq!(deliveries[0].message_ref, format!("{CHANNEL}:{}", shown.id));
    assert!(harness.discord.identifies() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_decides_once_even_when_the_interaction_is_redelivered() {
    let harness = Harness::start().await;
    let approval = harness.request("approve", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let tap = harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.answer(&tap).await.body,
        serde_json::json!({"type": 6})
    );
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    let decider = resolved.decisions[0].decider.clone().unwrap();
    assert_eq!(
        (decider.channel.as_str(), decider.user_id.as_str()),
        ("discord", ALICE_ID)
    );
    assert_eq!(resolved.decisions[0].approver, "alice");
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated
            .content
            .contains("✅ Approved by `alice` (`discord`)"),
        "{}",
        updated.content
    );
    assert_eq!(
        harness.discord.messages(CHANNEL).len(),
        1,
        "edited in place"
    );
    // The same interaction dispatched again: decided once.
    harness.discord.redeliver(&tap);
    harness
        .discord
        .wait_for("the second answer", |discord| {
            let statuses = discord
                .requests()
                .into_iter()
                .filter(|r| r.path.contains(&tap));
            (statuses.count() == 2).then_some(())
        })
        .await;
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_progress_is_shown_until_the_last_approval() {
    let harness = Harness::start().await;
    let asked = pb::RequestApprovalRequest {
        required_approvals: 2,
        ..request("quorum", 600)
    };
    let approval = harness.request_with(asked).await;
    let shown = harness.request_message(&approval.id).await;
    assert!(
        shown.content.contains("⏳ Waiting: 0 of 2 approvals"),
        "{}",
        shown.content
    );
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    let progress = harness
        .message_where(&approval.id, "the progress", |m| {
            m.content
                .contains("1 of 2 approvals (by `alice` (`discord`))")
        })
        .await;
    assert_eq!(
        progress.buttons().len(),
        3,
        "still open for the second approver"
    );
    harness
        .decide_on_telegram(&approval.id, "telegram:callback:quorum")
        .await;
    let done = harness.outcome_message(&approval.id).await;
    assert!(done.content.contains("✅ Approved by"), "{}", done.content);
    assert_eq!(harness.discord.messages(CHANNEL).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_asks_for_a_reason_in_a_modal() {
    let harness = Harness::start().await;
    let approval = harness.request("reject", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let tap = harness.discord.tap(&alice(), &shown, &shown.button(REJECT));
    let modal = harness.answer(&tap).await;
    assert_eq!(modal.body["type"], 9, "a modal: {:?}", modal.body);
    assert_eq!(modal.body["data"]["title"], "Reject the request");
    assert!(
        harness.state_of(&approval.id).await.decisions.is_empty(),
        "opening it decides nothing"
    );
    let submitted = harness
        .discord
        .submit_modal(&alice(), &modal, &shown, "not on a Friday");
    assert_eq!(harness.answer(&submitted).await.body["type"], 6);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions[0].reason, "not on a Friday");
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated
            .content
            .contains("❌ Rejected by `alice` (`discord`)"),
        "{}",
        updated.content
    );
    assert!(
        updated.content.contains("**Note:** `not on a Friday`"),
        "{}",
        updated.content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_for_session_approves_with_a_session_grant() {
    let harness = Harness::start().await;
    let approval = harness.request("session-1", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(ALLOW_SESSION));
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions[0].scope(), pb::Scope::Session);
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated.content.contains("for this session"),
        "{}",
        updated.content
    );
    let next = harness.request("session-2", 600).await;
    assert_eq!(next.state(), pb::ApprovalState::Approved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_elsewhere_edits_the_message_and_its_old_buttons_decide_nothing() {
    let harness = Harness::start().await;
    let approval = harness.request("elsewhere", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness
        .decide_on_telegram(&approval.id, "telegram:callback:1")
        .await;
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated
            .content
            .contains("✅ Approved by `Bob` (`telegram`)"),
        "{}",
        updated.content
    );
    // A tap on the old buttons (a client that has not refreshed) is told, and decides nothing.
    let tap = harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    let told = harness.told(&tap).await;
    assert!(told.contains("already resolved"), "{told}");
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_is_shown_expired() {
    let harness = Harness::start().await;
    let approval = harness.request("expires", 1).await;
    harness.request_message(&approval.id).await;
    let updated = harness.outcome_message(&approval.id).await;
    assert!(
        updated.content.contains("⌛ Expired"),
        "{}",
        updated.content
    );
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
}

/// A tap from a Discord user who is no approver's identity, and an approver's tap on one
/// approval's message whose `custom_id` names another approval: both told ephemerally, neither
/// decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_forged_taps_are_answered_ephemerally_and_decide_nothing() {
    let harness = Harness::start().await;
    let first = harness.request("forged-1", 600).await;
    let second = harness.request("forged-2", 600).await;
    let shown = harness.request_message(&first.id).await;
    let other = harness.request_message(&second.id).await;
    let foreign = harness
        .discord
        .tap(&mallory(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.answer(&foreign).await.body["type"],
        6,
        "acknowledged at once"
    );
    let told = harness.told(&foreign).await;
    assert!(told.contains("not know you"), "{told}");
    let forged = harness
        .discord
        .tap(&alice(), &shown, &other.button(APPROVE));
    let told = harness.told(&forged).await;
    assert!(told.contains("not on the message"), "{told}");
    for id in [&first.id, &second.id] {
        let after = harness.state_of(id).await;
        assert_eq!(after.state(), pb::ApprovalState::Pending);
        assert!(after.decisions.is_empty());
    }
    // The real button still works.
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.resolved(&first.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(
        harness.state_of(&second.id).await.state(),
        pb::ApprovalState::Pending
    );
}

/// A 429 of the route's bucket and then of the global limit: each retried no sooner than its
/// `retry_after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    for global in [false, true] {
        harness.discord.fail_next(DiscordFailure {
            status: 429,
            retry_after: Some(1.5),
            global,
        });
    }
    harness.start_worker().await;
    let approval = harness.request("limited", 600).await;
    harness.request_message(&approval.id).await;
    assert_eq!(harness.discord.post_statuses(), [429, 429, 200]);
    let posts = harness.discord.posts();
    for pair in posts.windows(2) {
        let waited = pair[1].at.duration_since(pair[0].at);
        assert!(
            waited >= Duration::from_millis(1500),
            "retried before the retry_after: {waited:?}"
        );
    }
    assert_eq!(harness.discord.messages(CHANNEL).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_until_the_message_is_posted() {
    let mut harness = Harness::without_worker().await;
    for status in [503, 500] {
        harness.discord.fail_next(DiscordFailure {
            status,
            retry_after: None,
            global: false,
        });
    }
    harness.start_worker().await;
    let approval = harness.request("flaky", 600).await;
    harness.request_message(&approval.id).await;
    assert_eq!(harness.discord.post_statuses(), [503, 500, 200]);
    assert_eq!(harness.discord.messages(CHANNEL).len(), 1);
}

/// The Gateway connection drops; a tap made meanwhile is replayed after the worker RESUMEs the
/// session (not a new IDENTIFY), and decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_drop_is_resumed_and_a_tap_made_meanwhile_decides() {
    let harness = Harness::start().await;
    let approval = harness.request("resume", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness
        .discord
        .wait_for("a heartbeat", |discord| {
            (discord.heartbeats() > 0).then_some(())
        })
        .await;
    harness.discord.drop_gateway();
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(
        (harness.discord.identifies(), harness.discord.resumes()),
        (1, 1)
    );
    harness.outcome_message(&approval.id).await;
}

/// The session is gone when the worker comes back (Discord answers its RESUME with
/// INVALID_SESSION): it identifies again, and the next tap decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_session_after_a_drop_identifies_again() {
    let harness = Harness::start().await;
    let approval = harness.request("invalid-session", 600).await;
    let shown = harness.request_message(&approval.id).await;
    harness.discord.drop_gateway_and_forget_sessions();
    harness
        .discord
        .wait_for("a new session", |discord| {
            (discord.identifies() == 2 && discord.connected()).then_some(())
        })
        .await;
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
}

/// The application's key in the HTTP interactions tests (the worker gets its public half).
fn application_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// A worker taking interactions over HTTP: the harness and the endpoint's URL.
async fn http_harness() -> (Harness, String) {
    let listen = countersign_testkit::http::free_addr();
    let public_key = hex::encode(application_key().verifying_key().as_bytes());
    let extra =
        format!("interactions = \"http\"\nlisten = \"{listen}\"\npublic_key = \"{public_key}\"\n");
    let mut harness = Harness::without_worker_with(&extra).await;
    harness.start_worker().await;
    (harness, format!("http://{listen}{INTERACTIONS_PATH}"))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// POSTs `body` as Discord does, signed by `key` at `timestamp` (no headers: unsigned): the
/// status and the body of the answer.
async fn post_interaction(
    url: &str,
    key: Option<&SigningKey>,
    timestamp: u64,
    body: &str,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        let signature = key.sign(format!("{timestamp}{body}").as_bytes());
        request = request
            .header("X-Signature-Ed25519", hex::encode(signature.to_bytes()))
            .header("X-Signature-Timestamp", timestamp.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// HTTP interactions: a signed PING is answered PONG; a request unsigned, signed with another
/// key, whose body was changed after signing, or signed more than five minutes ago (replayed)
/// is answered 401 and decides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_interactions_answer_a_ping_and_refuse_unsigned_forged_tampered_and_replayed_requests()
{
    let (harness, url) = http_harness().await;
    assert!(!harness.discord.connected(), "no Gateway session");
    let key = application_key();
    let now = now_secs();
    let ping =
        r#"{"id":"1500000000000000001","application_id":"1","type":1,"token":"t","version":1}"#;
    assert_eq!(
        post_interaction(&url, Some(&key), now, ping).await,
        (200, serde_json::json!({"type": 1}))
    );
    let approval = harness.request("http-refused", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (_, tap) = harness
        .discord
        .tap_over_http(&alice(), &shown, &shown.button(APPROVE));
    let body = tap.to_string();
    let forger = SigningKey::from_bytes(&[9; 32]);
    assert_eq!(
        post_interaction(&url, None, now, &body).await.0,
        401,
        "unsigned"
    );
    assert_eq!(
        post_interaction(&url, Some(&forger), now, &body).await.0,
        401,
        "another key"
    );
    assert_eq!(
        post_interaction(&url, Some(&forger), now, ping).await.0,
        401
    );
    assert_eq!(
        post_interaction(&url, Some(&key), now - 301, &body).await.0,
        401,
        "replayed: older than five minutes"
    );
    // Signed, then changed on the way.
    let signature = key.sign(format!("{now}{body}").as_bytes());
    let tampered = body.replace(ALICE_ID, MALLORY_ID);
    let status = reqwest::Client::new()
        .post(&url)
        .header("X-Signature-Ed25519", hex::encode(signature.to_bytes()))
        .header("X-Signature-Timestamp", now.to_string())
        .body(tampered)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401, "tampered");
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Pending);
    assert!(after.decisions.is_empty());
    assert!(harness.discord.answers().is_empty());
}

/// HTTP interactions: a signed tap is answered in the response itself — Reject… with its
/// modal (type 9), Approve with type 6 — and Approve decides as the tapping user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_interactions_a_signed_tap_is_answered_in_the_response_and_approves() {
    let (harness, url) = http_harness().await;
    let key = application_key();
    let approval = harness.request("http-approve", 600).await;
    let shown = harness.request_message(&approval.id).await;
    let (_, reject) = harness
        .discord
        .tap_over_http(&alice(), &shown, &shown.button(REJECT));
    let (status, answer) =
        post_interaction(&url, Some(&key), now_secs(), &reject.to_string()).await;
    assert_eq!(
        (status, &answer["type"]),
        (200, &serde_json::json!(9)),
        "{answer}"
    );
    let (_, approve) = harness
        .discord
        .tap_over_http(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        post_interaction(&url, Some(&key), now_secs(), &approve.to_string()).await,
        (200, serde_json::json!({"type": 6}))
    );
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(resolved.decisions[0].approver, "alice");
    harness.outcome_message(&approval.id).await;
    assert!(
        harness.discord.answers().is_empty(),
        "nothing through the callback endpoint"
    );
}

fn spawn_worker(config: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-discord"))
        .arg("--config")
        .arg(config)
        .env(BOT_TOKEN_ENV, BOT_TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The binary is killed with SIGKILL after Discord stored the message but before the worker
/// heard back (so before it recorded anything). The restarted worker finds the message by its
/// buttons and adopts it: no second post, and the buttons of that message decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_posting_and_recording_neither_duplicates_nor_loses() {
    let harness = Harness::without_worker().await;
    harness.discord.hold_posts(Duration::from_secs(3600));
    let mut worker = spawn_worker(&harness.config);
    let approval = harness.request("crash", 600).await;
    let shown = harness.request_message(&approval.id).await;
    worker.kill().await.unwrap(); // SIGKILL, Discord's answer still held
    harness.discord.hold_posts(Duration::ZERO);
    assert!(harness.state_of(&approval.id).await.deliveries.is_empty());

    let identified = harness.discord.identifies();
    let mut worker = spawn_worker(&harness.config);
    assert_eq!(harness.delivered(&approval.id).await.len(), 1, "adopted");
    assert_eq!(harness.discord.post_statuses(), [200], "not posted again");
    harness
        .discord
        .wait_for("the new Gateway session", |discord| {
            (discord.identifies() > identified && discord.connected()).then_some(())
        })
        .await;
    harness
        .discord
        .tap(&alice(), &shown, &shown.button(APPROVE));
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    harness.outcome_message(&approval.id).await;
    assert_eq!(harness.discord.messages(CHANNEL).len(), 1);
    worker.kill().await.unwrap();
}

#[test]
fn the_binary_has_help() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_countersign-discord"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in ["--config", BOT_TOKEN_ENV, "COUNTERSIGN_WORKER_TOKEN"] {
        assert!(help.contains(needle), "{help}");
    }
}

/// The picture in docs/quickstart.md (docs/quickstart-discord.png) is this one: the request
/// message as the fake received it, rendered by headless Chromium at a phone's width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_message_as_a_phone_shows_it() {
    let harness = Harness::start().await;
    let asked = pb::RequestApprovalRequest {
        arguments_json: r#"{"command":"rm -rf build"}"#.into(),
        action: "Delete the build directory".into(),
        reason: "A clean rebuild".into(),
        agent_id: "claude-code".into(),
        ..request("picture", 600)
    };
    let approval = harness.request_with(asked).await;
    let message = harness.request_message(&approval.id).await;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("phone-screenshots");
    let page = countersign_testkit::phone::discord_html(&message, "countersign");
    assert!(
        page.contains("<div class=\"button s3\">Approve</div>"),
        "{page}"
    );
    let picture = countersign_testkit::phone::discord_screenshot(
        &message,
        "countersign",
        &dir,
        "discord-request",
    )
    .await
    .unwrap();
    eprintln!("the phone shows {}", picture.display());
}
