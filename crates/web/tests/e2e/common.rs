//! A real countersign server (in process, on loopback), the real `countersign-web` binary in
//! front of it, and the SDK on the agent and admin side.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_testkit::server::TestServer;
use sha2::{Digest, Sha256};
use tokio::process::{Child, Command};

pub const WEB_TOKEN: &str = "web-worker-token-0123456789";
pub const AGENT_TOKEN: &str = "agent-token-0123456789abcdef";
pub const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";

fn sha(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Alice and Bob approve on the web and on Telegram; Carol only up to medium risk.
/// `more`: further sections.
fn server_toml(more: &str) -> String {
    format!(
        r#"
[[tokens]]
name = "web"
role = "worker"
channels = ["web"]
sha256 = "{web}"

[[tokens]]
name = "agents"
role = "agent"
agents = ["*"]
sha256 = "{agent}"

[[tokens]]
name = "admin"
role = "admin"
sha256 = "{admin}"

[[approvers]]
id = "alice"
name = "Alice"
max_risk = "critical"
identities = {{ web = ["alice"], telegram = ["1111"] }}

[[approvers]]
id = "bob"
name = "Bob"
max_risk = "critical"
identities = {{ web = ["bob"], telegram = ["2222"] }}

[[approvers]]
id = "carol"
name = "Carol"
max_risk = "medium"
identities = {{ web = ["carol"] }}

{more}
"#,
        web = sha(WEB_TOKEN),
        agent = sha(AGENT_TOKEN),
        admin = sha(ADMIN_TOKEN),
    )
}

/// How the web inbox signs approvers in for a test.
pub enum Mode {
    Login,
    /// Proxy sign-in trusting these addresses.
    Proxy(&'static [&'static str]),
}

pub struct Setup {
    pub server: TestServer,
    pub web: Web,
    pub agent: Client,
    pub admin: Client,
}

pub struct Web {
    pub url: String,
    pub config: PathBuf,
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Setup {
    pub async fn start(mode: Mode) -> Setup {
        Setup::start_with(mode, free_port(), "", None).await
    }

    /// With passkey step-up: the inbox at `http://localhost:PORT` (WebAuthn needs a domain,
    /// not an IP address, as its relying party), the server's `[passkeys]` pointing there, and
    /// a rule asking every call of agent `deployer` for a passkey.
    pub async fn start_with_step_up() -> Setup {
        let port = free_port();
        let url = format!("http://localhost:{port}");
        let more = format!(
            "[passkeys]\ninbox_url = \"{url}\"\n\n[[rules]]\nname = \"deploys need a passkey\"\naction = \"require\"\nstep_up = \"passkey\"\n[rules.match]\nagent = \"deployer\"\n"
        );
        Setup::start_with(Mode::Login, port, &more, Some(url)).await
    }

    async fn start_with(mode: Mode, port: u16, more: &str, public_url: Option<String>) -> Setup {
        let server = TestServer::start_with_toml(&server_toml(more)).await;
        let web = Web::start(&server.url(), mode, port, public_url).await;
        let client = |token: &str| {
            let mut config = ClientConfig::new(server.url());
            config.token = Some(token.to_owned());
            Client::connect(config).expect("client")
        };
        let agent = client(AGENT_TOKEN);
        let admin = client(ADMIN_TOKEN);
        Setup {
            server,
            web,
            agent,
            admin,
        }
    }

    /// A pending approval routed to the web channel.
    pub async fn request(&self, agent: &str, action: &str, risk: pb::Risk) -> pb::Approval {
        self.agent
            .request_approval(request(agent, action, risk))
            .await
            .expect("request approval")
            .approval
            .expect("approval")
    }

    /// Decides as `approver` on Telegram (another channel than the web).
    pub async fn decide_on_telegram(&self, approval_id: &str, user_id: &str, name: &str) {
        self.admin
            .decide(pb::DecideRequest {
                approval_id: approval_id.to_owned(),
                verdict: pb::Verdict::Approve.into(),
                scope: pb::Scope::Once.into(),
                decider: Some(pb::Decider {
                    channel: "telegram".into(),
                    user_id: user_id.into(),
                    display_name: name.into(),
                }),
                idempotency_key: format!("tg-{approval_id}"),
                ..Default::default()
            })
            .await
            .expect("decide on telegram");
    }
}

pub fn request(agent: &str, action: &str, risk: pb::Risk) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: agent.into(),
        session_id: format!("{agent}-session"),
        idempotency_key: uuid::Uuid::now_v7().to_string(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"make deploy","file_path":"deploy.sh","old_string":"env=staging\n","new_string":"env=prod\n"}"#.into(),
        action: action.into(),
        reason: "release 1.2".into(),
        risk: risk.into(),
        routes: vec![pb::Route {
            channel: "web".into(),
            target: String::new(),
        }],
        ttl_seconds: 600,
        ..Default::default()
    }
}

fn spawn_web(config: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_countersign-web"))
        .arg("--config")
        .arg(config)
        .env("COUNTERSIGN_WORKER_TOKEN", WEB_TOKEN)
        .env("COUNTERSIGN_WEB_ADMIN_TOKEN", ADMIN_TOKEN)
        .env(
            "RUST_LOG",
            std::env::var("WEB_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start countersign-web")
}

/// A free loopback port (the binary binds it right after).
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("free port")
}

impl Web {
    async fn start(server_url: &str, mode: Mode, port: u16, public_url: Option<String>) -> Web {
        let dir = tempfile::tempdir().expect("temporary directory");
        let sign_in = match mode {
            Mode::Login => "mode = \"login\"\n".to_owned(),
            Mode::Proxy(proxies) => format!(
                "mode = \"proxy\"\nidentity_header = \"X-Forwarded-User\"\nname_header = \"X-Forwarded-Name\"\ntrusted_proxies = {proxies:?}\n"
            ),
        };
        let config = dir.path().join("web.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nstate_dir = {state:?}\nadmins = [\"alice\"]\n{public}\n[server]\nurl = \"{server_url}\"\n\n[sign_in]\n{sign_in}",
                state = dir.path().join("state"),
                public = public_url
                    .as_ref()
                    .map(|url| format!("public_url = \"{url}\"\n"))
                    .unwrap_or_default(),
            ),
        )
        .expect("write config");
        let web = Web {
            url: public_url.unwrap_or_else(|| format!("http://127.0.0.1:{port}")),
            child: spawn_web(&config),
            config,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        };
        web.wait_until_listening().await;
        web
    }

    /// Kills the binary (SIGKILL) and starts it again on the same port and state.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.relaunch().await;
    }

    /// Kills the binary (SIGKILL); [`Web::relaunch`] starts it again.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Starts the binary again on the same port and state.
    pub async fn relaunch(&mut self) {
        self.child = spawn_web(&self.config);
        self.wait_until_listening().await;
    }

    async fn wait_until_listening(&self) {
        let addr = self.addr;
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("countersign-web did not listen on {addr}");
    }

    /// A one-time login link, from the binary's `issue-login` command.
    pub async fn issue_login(&self, approver: &str, name: &str) -> String {
        let output = Command::new(env!("CARGO_BIN_EXE_countersign-web"))
            .arg("--config")
            .arg(&self.config)
            .args(["issue-login", "--approver", approver, "--name", name])
            .output()
            .await
            .expect("run issue-login");
        assert!(output.status.success(), "{output:?}");
        let link = String::from_utf8(output.stdout).expect("utf-8 link");
        let link = link.trim().to_owned();
        assert!(link.starts_with(&format!("{}/login/", self.url)), "{link}");
        link
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM; the exit status, or `None` when the process did not exit within 10 s.
    pub async fn terminate(mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().expect("running").to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("kill");
        assert!(sent.success());
        let exited = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        exited.ok().map(|status| status.expect("wait"))
    }
}

/// Waits until `check` holds, for at most 10 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}
