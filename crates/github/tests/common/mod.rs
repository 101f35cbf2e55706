//! The setting of the end-to-end tests: a real countersign server (in process), the fake
//! GitHub REST API on loopback, the worker configured against both, and an agent-side client.

use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_github::config::{
    FileConfig, GitHubSection, PollingSection, ServerSection, WebhookSection, WorkerSettings,
};
use countersign_github::render::marked_approval_id;
use countersign_github::{Settings, Worker};
use countersign_testkit::github::{
    issue_comment_payload, post_webhook, sign_webhook, Comment, CommentAction, FakeGitHub,
    PermissionShape, Role, User, UserKind, DEFAULT_BOT_LOGIN, DEFAULT_TOKEN,
};
use countersign_testkit::server::TestServer;

pub const REPO: &str = "acme/widgets";
pub const SECRET: &str = "It's a Secret to Everybody";
/// The longest any single wait may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Webhook,
    Polling,
    Both,
}

/// Test settings take no secret from the environment.
pub fn no_environment(_name: &str) -> Option<String> {
    None
}

pub struct Harness {
    pub mode: Mode,
    pub server: TestServer,
    pub github: FakeGitHub,
    pub agent: Client,
    pub worker: Option<Worker>,
    /// The default target's issue.
    pub issue: u64,
    /// `write` on the repository (modern shape).
    pub writer: User,
    /// `maintain`, answered as `"permission": "maintain"` like the 2023 recording.
    pub maintainer: User,
    /// `read` on the repository (legacy shape).
    pub reader: User,
    /// The worker's state directory (its watch cursor); none: it takes a snapshot each start.
    pub state_dir: Option<std::path::PathBuf>,
    /// Attempts per GitHub request (the API's own retries); none: the default.
    pub max_attempts: Option<u32>,
    deliveries: std::sync::atomic::AtomicU64,
}

impl Harness {
    pub async fn start(mode: Mode) -> Harness {
        let mut harness = Harness::start_without_worker(mode).await;
        harness.start_worker().await;
        harness
    }

    /// The server, the fake and the users, but no worker yet.
    pub async fn start_without_worker(mode: Mode) -> Harness {
        Harness::with_server(mode, TestServer::start().await).await
    }

    /// Like [`Harness::start`], against a server configured by `server_toml` (e.g. approvers).
    pub async fn start_with_server_toml(mode: Mode, server_toml: &str) -> Harness {
        let mut harness =
            Harness::with_server(mode, TestServer::start_with_toml(server_toml).await).await;
        harness.start_worker().await;
        harness
    }

    /// Against `server`, without a worker yet.
    pub async fn with_server_without_worker(mode: Mode, server: TestServer) -> Harness {
        Harness::with_server(mode, server).await
    }

    async fn with_server(mode: Mode, server: TestServer) -> Harness {
        let github = FakeGitHub::start().await;
        let issue = github.add_issue(REPO, "Deploy approvals");
        let writer = github.add_user("alice", UserKind::User);
        github.set_permission(REPO, "alice", Role::Write, PermissionShape::Modern);
        let maintainer = github.add_user("alecharp", UserKind::User);
        github.set_permission(
            REPO,
            "alecharp",
            Role::Maintain,
            PermissionShape::ModernUnmapped,
        );
        let reader = github.add_user("dude", UserKind::User);
        github.set_permission(REPO, "dude", Role::Read, PermissionShape::Legacy);
        let agent = Client::connect(ClientConfig::new(server.url())).expect("agent client");
        Harness {
            mode,
            server,
            github,
            agent,
            worker: None,
            issue,
            writer,
            maintainer,
            reader,
            state_dir: None,
            max_attempts: None,
            deliveries: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn file_config(&self) -> FileConfig {
        FileConfig {
            server: ServerSection {
                url: self.server.url(),
                ..Default::default()
            },
            github: GitHubSection {
                api_url: Some(self.github.url()),
                token: Some(DEFAULT_TOKEN.to_string()),
                bot_login: DEFAULT_BOT_LOGIN.to_string(),
                default_target: Some(format!("{REPO}#{}", self.issue)),
                write_interval_ms: Some(20),
                secondary_limit_wait_ms: Some(1000),
                retry_interval_ms: Some(200),
                request_timeout_ms: Some(5000),
                state_dir: self.state_dir.clone(),
                max_attempts: self.max_attempts,
                ..Default::default()
            },
            webhook: matches!(self.mode, Mode::Webhook | Mode::Both).then(|| WebhookSection {
                listen: "127.0.0.1:0".parse().expect("address"),
                secret: Some(SECRET.to_string()),
            }),
            polling: matches!(self.mode, Mode::Polling | Mode::Both).then_some(PollingSection {
                interval_ms: Some(100),
            }),
            metrics: Default::default(),
        }
    }

    pub fn config(&self) -> Settings {
        Settings::from_file(self.file_config(), no_environment).expect("worker config")
    }

    pub async fn start_worker(&mut self) {
        let worker = Worker::start(self.config())
            .await
            .expect("start the worker");
        self.worker = Some(worker);
    }

    /// Shuts the worker down (as a deployment stop would); the fake and the server stay.
    pub async fn stop_worker(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.shutdown().await;
        }
    }

    pub fn webhook_url(&self) -> String {
        let addr = self
            .worker
            .as_ref()
            .and_then(Worker::webhook_addr)
            .expect("the worker listens for webhooks");
        format!("http://{addr}/webhook")
    }

    /// An approval request routed to `target` (empty: the worker's default target).
    pub fn request(&self, key: &str, target: &str) -> pb::RequestApprovalRequest {
        pb::RequestApprovalRequest {
            agent_id: "coder-1".to_string(),
            session_id: "session-7".to_string(),
            idempotency_key: key.to_string(),
            tool_name: "bash".to_string(),
            arguments_json:
                r#"{"command":"kubectl rollout restart deploy/api","namespace":"prod"}"#.to_string(),
            action: "restart the production API".to_string(),
            reason: "a config change needs a restart".to_string(),
            risk: pb::Risk::High.into(),
            routes: vec![pb::Route {
                channel: "github".to_string(),
                target: target.to_string(),
            }],
            ..Default::default()
        }
    }

    pub async fn request_approval(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        self.agent
            .request_approval(request)
            .await
            .expect("request approval")
            .approval
            .expect("approval in the answer")
    }

    /// The worker's request comment for `approval_id` on the default issue, once it exists.
    pub async fn request_comment(&self, approval_id: &str) -> Comment {
        self.request_comment_on(self.issue, approval_id).await
    }

    pub async fn request_comment_on(&self, issue: u64, approval_id: &str) -> Comment {
        self.github
            .wait_for("the request comment", PATIENCE, |github| {
                github
                    .comments(REPO, issue)
                    .into_iter()
                    .find(|c| marked_approval_id(&c.body) == Some(approval_id))
            })
            .await
    }

    /// Waits until the request comment's body satisfies `check`.
    pub async fn request_comment_where(
        &self,
        comment_id: u64,
        what: &str,
        check: impl Fn(&str) -> bool,
    ) -> Comment {
        self.github
            .wait_for(what, PATIENCE, |github| {
                github.comment(comment_id).filter(|c| check(&c.body))
            })
            .await
    }

    /// `user` writes `body` on the default issue; in webhook mode GitHub delivers it.
    pub async fn say(&self, user: &User, body: &str) -> Comment {
        self.say_on(self.issue, user, body).await
    }

    pub async fn say_on(&self, issue: u64, user: &User, body: &str) -> Comment {
        let comment = self.github.add_comment(REPO, issue, user, body);
        if self.mode != Mode::Polling {
            let payload =
                issue_comment_payload(&self.github, CommentAction::Created, &comment, None);
            let (status, _) = self.deliver("issue_comment", &payload).await;
            assert_eq!(status, 202, "the worker accepts the delivery");
        }
        comment
    }

    /// Posts a correctly signed delivery with a fresh delivery id.
    pub async fn deliver(&self, event: &str, payload: &[u8]) -> (u16, String) {
        let number = self
            .deliveries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let delivery = format!("72d3162e-cc78-11e3-81ab-{number:012}");
        let signature = sign_webhook(SECRET, payload);
        post_webhook(
            &self.webhook_url(),
            event,
            &delivery,
            payload,
            Some(&signature),
        )
        .await
    }

    /// Waits until the approval is no longer pending.
    pub async fn resolved(&self, approval_id: &str) -> pb::Approval {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let approval = self
                .agent
                .wait_for_decision(approval_id, Duration::from_secs(5))
                .await
                .expect("wait for decision");
            if approval.state() != pb::ApprovalState::Pending {
                return approval;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "approval {approval_id} still pending"
            );
        }
    }

    pub async fn approval(&self, approval_id: &str) -> pb::Approval {
        self.agent
            .get_approval(approval_id)
            .await
            .expect("get approval")
    }

    /// The worker's reply to comment `comment_id`, once it exists.
    pub async fn reply_to(&self, issue: u64, comment_id: u64) -> Comment {
        let marker = format!("<!-- countersign:reply-to:{comment_id} -->");
        self.github
            .wait_for("the worker's reply", PATIENCE, |github| {
                github
                    .comments(REPO, issue)
                    .into_iter()
                    .find(|c| c.body.starts_with(&marker))
            })
            .await
    }

    /// The reactions on a comment, once there are `count` of them.
    pub async fn reactions(&self, comment_id: u64, count: usize) -> Vec<String> {
        self.github
            .wait_for("reactions", PATIENCE, |github| {
                let reactions = github.reactions(comment_id);
                (reactions.len() >= count)
                    .then(|| reactions.into_iter().map(|r| r.content).collect())
            })
            .await
    }

    pub fn requests_comments(&self, issue: u64) -> Vec<Comment> {
        self.github.comments(REPO, issue)
    }
}

/// The decider the worker must send for `user`.
pub fn github_decider(user: &User) -> pb::Decider {
    pb::Decider {
        channel: "github".to_string(),
        user_id: user.id.to_string(),
        display_name: user.login.clone(),
    }
}
