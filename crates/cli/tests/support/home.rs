//! An empty home directory and the `countersign` binary run in it as a new user would: the
//! local instance (`setup`, `up`, `install`), and the hooks Claude Code runs.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use countersign_client::{Client, ClientConfig, ClientError};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use super::STEP;

/// An empty home directory, and the `countersign` binary run in it as a new user would.
pub struct Home {
    dir: tempfile::TempDir,
    /// Where `up` listens (a free port).
    pub listen: String,
    api_url: String,
}

impl Home {
    /// A new home; the test's fake Bot API is at `telegram_api_url`.
    pub fn new(telegram_api_url: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("project")).unwrap();
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Home {
            listen: probe.local_addr().unwrap().to_string(),
            dir,
            api_url: telegram_api_url.to_owned(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn data(&self) -> PathBuf {
        self.path().join(".local/share/countersign")
    }

    pub fn config_file(&self) -> PathBuf {
        self.path().join(".config/countersign/countersign.toml")
    }

    pub fn secret(&self, name: &str) -> String {
        std::fs::read_to_string(self.data().join("secrets").join(name))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// `countersign <args>` in the project directory. The test's plumbing (where the fake Bot
    /// API and a free port are) comes from the environment; the user types nothing of it.
    pub fn countersign(&self, args: &[&str]) -> Command {
        self.command(super::countersign_binary(), args)
    }

    /// `program <args>` in the project directory, with the user's environment.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(self.path().join("project"))
            .env("HOME", self.path())
            .env("USER", "tester")
            .env("TELEGRAM_API_URL", &self.api_url)
            .env("COUNTERSIGN_LISTEN", &self.listen);
        for variable in [
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "COUNTERSIGN_SERVER",
            "COUNTERSIGN_TOKEN",
            "COUNTERSIGN_TOKEN_FILE",
            "COUNTERSIGN_CONFIG",
            "COUNTERSIGN_CA_CERT",
            "COUNTERSIGN_AGENT_ID",
            "TELEGRAM_BOT_TOKEN",
            "GITHUB_TOKEN",
            "GITHUB_API_URL",
            "COUNTERSIGN_GITHUB_TOKEN",
            "NTFY_TOKEN",
            "SLACK_BOT_TOKEN",
            "SLACK_APP_TOKEN",
            "RUST_LOG",
        ] {
            command.env_remove(variable);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    pub async fn run(&self, args: &[&str]) -> Output {
        tokio::time::timeout(STEP, self.countersign(args).output())
            .await
            .expect("countersign did not exit")
            .unwrap()
    }

    /// `countersign up`, its log in a file; returns once its server answers.
    pub async fn up(&self) -> Child {
        self.up_with(&[]).await
    }

    /// `countersign up` with these environment variables set.
    pub async fn up_with(&self, env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join("up.log"))
            .unwrap();
        let mut child = self
            .countersign(&["up"])
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("countersign up exited ({status}):\n{}", self.up_log());
            }
            if let Ok(token) = std::fs::read_to_string(self.data().join("secrets/admin-token")) {
                let client = self.client(token.trim());
                match client
                    .get_approval("00000000-0000-7000-8000-000000000000")
                    .await
                {
                    Err(ClientError::NotFound(_)) => return child,
                    Err(ClientError::Unavailable(_)) => {}
                    other => panic!("unexpected answer: {other:?}"),
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "up did not serve in time:\n{}",
                self.up_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn up_log(&self) -> String {
        std::fs::read_to_string(self.path().join("up.log")).unwrap_or_default()
    }

    pub fn client(&self, token: &str) -> Client {
        let mut config = ClientConfig::new(format!("http://{}", self.listen));
        config.token = Some(token.to_owned());
        Client::connect(config).unwrap()
    }
}

/// The hook command `install` wrote into the project's Claude Code settings.
pub fn installed_hook(home: &Home) -> String {
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(home.path().join("project/.claude/settings.json")).unwrap(),
    )
    .unwrap();
    settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Runs the installed hook command line as Claude Code does: through the shell, the
/// PreToolUse payload on stdin.
pub fn spawn_hook(home: &Home, command_line: &str, tool_use_id: &str, shell: &str) -> Child {
    let payload = json!({
        "session_id": "quickstart-session",
        "transcript_path": home.path().join("transcript.jsonl"),
        "cwd": home.path().join("project"),
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": shell, "description": "clean the build"},
        "tool_use_id": tool_use_id,
    });
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command_line)
        .current_dir(home.path().join("project"))
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_DATA_HOME")
        .env_remove("COUNTERSIGN_SERVER")
        .env_remove("COUNTERSIGN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        stdin
            .write_all(payload.to_string().as_bytes())
            .await
            .unwrap();
    });
    child
}

pub async fn hook_answer(child: Child) -> Value {
    let output = tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("the hook did not answer")
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {output:?}"))
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// SIGTERM to `up`; it must stop cleanly.
pub async fn terminate(home: &Home, child: &mut Child) {
    stop(home, child, "TERM").await;
}

/// SIGINT (Ctrl-C) to `up`; it must stop cleanly.
pub async fn interrupt(home: &Home, child: &mut Child) {
    stop(home, child, "INT").await;
}

async fn stop(home: &Home, child: &mut Child, signal: &str) {
    let pid = child.id().unwrap();
    let sent = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::time::timeout(STEP, child.wait())
        .await
        .unwrap_or_else(|_| panic!("up did not stop on SIG{signal}"))
        .unwrap();
    assert!(status.success(), "{status}:\n{}", home.up_log());
}
