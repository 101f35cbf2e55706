//! The end-to-end setup: a real countersign server (in process, loopback gRPC), the fake
//! Telegram Bot API, the worker through its library entry point, and the client SDK as the
//! agent.

use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_telegram::{Settings, WorkerError};
use countersign_testkit::server::TestServer;
use countersign_testkit::telegram::{ChatMessage, FakeTelegram, RecordedRequest, TestUser};
use tokio::task::JoinHandle;

pub const BOT_TOKEN: &str = "364329248:AAE-fake-token-for-tests";
/// The worker's default chat (a group).
pub const CHAT: i64 = -1001234567890;

pub fn alice() -> TestUser {
    TestUser::new(111_111_111, "Alice", Some("alice"))
}

pub fn bob() -> TestUser {
    TestUser::new(222_222_222, "Bob", Some("bob"))
}

/// Not on the worker's allowlist.
pub fn mallory() -> TestUser {
    TestUser::new(666_666_666, "Mallory", None)
}

pub struct Harness {
    pub server: TestServer,
    pub telegram: FakeTelegram,
    pub agent: Client,
    pub settings: Settings,
    worker: Option<JoinHandle<Result<(), WorkerError>>>,
    /// The worker's state directory (its outbox), kept across restarts of the worker.
    _state: tempfile::TempDir,
}

impl Harness {
    /// The worker's watch cursor file (the test settings always have one).
    pub fn cursor_path(&self) -> &std::path::Path {
        self.settings
            .runtime
            .cursor_path
            .as_deref()
            .expect("the test settings keep a cursor")
    }

    /// Server, fake Telegram and a running worker with test settings.
    pub async fn start() -> Harness {
        let mut harness = Harness::without_worker().await;
        harness.start_worker();
        harness
    }

    /// Server and fake Telegram only; `settings` are what [`Harness::start_worker`] would use.
    pub async fn without_worker() -> Harness {
        Harness::with_server(TestServer::start().await).await
    }

    /// Like [`Harness::start`], against a server configured by `server_toml` (e.g. approvers).
    pub async fn start_with_server_toml(server_toml: &str) -> Harness {
        let mut harness =
            Harness::with_server(TestServer::start_with_toml(server_toml).await).await;
        harness.start_worker();
        harness
    }

    /// Server configured by `server_toml` and fake Telegram, without a worker: the test
    /// adjusts `settings` and then calls [`Harness::start_worker`].
    pub async fn without_worker_with_server_toml(server_toml: &str) -> Harness {
        Harness::with_server(TestServer::start_with_toml(server_toml).await).await
    }

    async fn with_server(server: TestServer) -> Harness {
        // The worker's logs, when RUST_LOG asks for them.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let telegram = FakeTelegram::start(BOT_TOKEN).await;
        let mut settings = Settings::new(&server.url(), BOT_TOKEN).expect("test settings");
        settings.api_url = telegram.api_url();
        settings.default_chat_id = Some(CHAT);
        settings.allowed_user_ids = vec![alice().id, bob().id];
        settings.poll_timeout_secs = 5;
        settings.runtime.server.heartbeat_timeout = Duration::from_secs(5);
        settings.runtime.server.max_backoff = Duration::from_millis(500);
        settings.poll_error_backoff = Duration::from_millis(50);
        settings.runtime.retry.first = Duration::from_millis(100);
        let state = tempfile::tempdir().expect("a state directory");
        settings.outbox_path = state.path().join("outbox.jsonl");
        settings.runtime.cursor_path = Some(state.path().join("watch-cursor"));
        let agent = Client::connect(ClientConfig::new(server.url())).expect("agent client");
        Harness {
            server,
            telegram,
            agent,
            settings,
            worker: None,
            _state: state,
        }
    }

    pub fn start_worker(&mut self) {
        let settings = self.settings.clone();
        self.worker = Some(tokio::spawn(countersign_telegram::run(
            settings,
            std::future::pending(),
        )));
    }

    /// Starts the worker with a shutdown signal (as SIGTERM gives the binary); sending on
    /// the returned channel asks it to stop, and [`Harness::worker_ended`] waits for that.
    pub fn start_worker_with_shutdown(&mut self) -> tokio::sync::oneshot::Sender<()> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = self.settings.clone();
        self.worker = Some(tokio::spawn(countersign_telegram::run(settings, async {
            let _ = stopped.await;
        })));
        stop
    }

    /// Waits for the worker to end by itself and returns how it ended.
    pub async fn worker_ended(&mut self) -> Result<(), WorkerError> {
        let worker = self.worker.take().expect("a running worker");
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("the worker ends within 30 s")
            .expect("the worker task did not panic")
    }

    /// Kills the worker the hard way (its task is dropped mid-flight, nothing is flushed).
    pub async fn kill_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
            let ended = worker.await;
            assert!(
                ended.as_ref().is_err_and(|error| error.is_cancelled()),
                "the worker ended by itself before it was killed: {ended:?}"
            );
        }
    }

    /// Requests an approval routed to Telegram's default chat.
    pub async fn request(&self, key: &str, arguments_json: &str) -> pb::Approval {
        self.request_with(pb::RequestApprovalRequest {
            idempotency_key: key.into(),
            arguments_json: arguments_json.into(),
            ..request(key)
        })
        .await
    }

    pub async fn request_with(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        self.agent
            .request_approval(request)
            .await
            .expect("RequestApproval")
            .approval
            .expect("an approval")
    }

    /// Waits for the `nth` (from 0) approval request message the bot sent to `chat` (a
    /// message with buttons; replies have none) and returns it as the chat shows it now.
    pub async fn request_message_in(&self, chat: i64, nth: usize) -> ChatMessage {
        let is_request = |request: &RecordedRequest| {
            request.method == "sendMessage"
                && request.succeeded()
                && request.param_i64("chat_id") == Some(chat)
                && !request.callback_data().is_empty()
        };
        let requests = self
            .telegram
            .wait_for_requests("an approval request message", |requests| {
                requests.iter().filter(|r| is_request(r)).count() > nth
            })
            .await;
        let message_id = requests
            .iter()
            .filter(|r| is_request(r))
            .nth(nth)
            .and_then(RecordedRequest::result_message_id)
            .expect("a sent message");
        self.telegram
            .message(chat, message_id)
            .expect("the fake keeps every message")
    }

    /// The id of the first request message Telegram made in the default chat, as soon as it
    /// made it (its answer to the worker may still be held back).
    pub async fn first_request_id(&self) -> i64 {
        let is_request = |r: &RecordedRequest| {
            r.method == "sendMessage"
                && r.param_i64("chat_id") == Some(CHAT)
                && !r.callback_data().is_empty()
        };
        self.telegram
            .wait_for_requests("the request message", |requests| {
                requests.iter().any(is_request)
            })
            .await
            .iter()
            .find(|r| is_request(r))
            .and_then(RecordedRequest::result_message_id)
            .expect("Telegram made the message")
    }

    /// [`Harness::request_message_in`] the default chat.
    pub async fn request_message(&self, nth: usize) -> ChatMessage {
        self.request_message_in(CHAT, nth).await
    }

    /// Waits until the worker recorded its message for the approval on the server.
    pub async fn wait_for_delivery(&self, approval_id: &str) -> pb::Delivery {
        for _ in 0..500 {
            let approval = self
                .agent
                .get_approval(approval_id)
                .await
                .expect("GetApproval");
            if let Some(delivery) = approval
                .deliveries
                .into_iter()
                .find(|d| d.channel == "telegram")
            {
                return delivery;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the worker never recorded a delivery for {approval_id}");
    }

    /// Waits until the approval is no longer pending (as the agent does).
    pub async fn agent_waits(&self, approval_id: &str) -> pb::Approval {
        self.agent
            .wait_until_resolved(approval_id, Duration::from_secs(30))
            .await
            .expect("WaitForDecision")
    }

    /// How many messages (requests and replies) the bot sent successfully.
    pub fn sent_count(&self) -> usize {
        self.telegram
            .requests_of("sendMessage")
            .iter()
            .filter(|request| request.succeeded())
            .count()
    }
}

/// A request from agent `coder-1`, session `session-7`, routed to Telegram's default chat.
pub fn request(key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "session-7".into(),
        requester: "dev@example.com".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"rm -rf build/"}"#.into(),
        action: "delete the build directory".into(),
        reason: "clean rebuild".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: "telegram".into(),
            target: String::new(),
        }],
        ..Default::default()
    }
}

/// The callback data of the message's button whose label contains `label`.
pub fn button(message: &ChatMessage, label: &str) -> String {
    let labels = message.button_texts();
    let index = labels
        .iter()
        .position(|text| text.contains(label))
        .unwrap_or_else(|| panic!("no {label:?} button in {labels:?}"));
    message.callback_data()[index].clone()
}
