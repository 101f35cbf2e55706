//! Configuration: a TOML file, with the secrets also (and preferably) from the environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//! # ca_cert = "/etc/countersign/ca.pem"
//!
//! [telegram]
//! # bot_token: env TELEGRAM_BOT_TOKEN
//! api_url = "https://api.telegram.org"
//! default_chat_id = -1001234567890
//! allowed_user_ids = [11111111, 22222222]
//! buttons = ["approve", "reject", "allow_session"]
//! # The worker's outbox (intents of messages being sent) and watch cursor (where a restarted
//! # worker resumes) live here; keep it across restarts.
//! state_dir = "/var/lib/countersign/telegram"
//!
//! # [metrics]: where /healthz and /metrics are served (plain HTTP); off when absent
//! # listen = "127.0.0.1:9091"
//! ```

use std::path::PathBuf;
use std::time::Duration;

pub use countersign_worker::config::{
    ConfigError, MetricsSection, RuntimeSection, RuntimeSettings, ServerSection, WorkerSettings,
    WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED,
};
use serde::Deserialize;

use crate::callback::ButtonAction;

/// The environment variable holding the Telegram bot token.
pub const BOT_TOKEN_ENV: &str = "TELEGRAM_BOT_TOKEN";

/// The configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    #[serde(default)]
    pub telegram: TelegramSection,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramSection {
    /// Bot token; `TELEGRAM_BOT_TOKEN` overrides it.
    pub bot_token: Option<String>,
    /// The Bot API server (a self-hosted one, or a fake in tests).
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// Where approvals without a Telegram target go.
    pub default_chat_id: Option<i64>,
    /// Telegram user ids allowed to decide; empty: anyone the server's approver registry
    /// accepts. Checked before calling the server, which stays authoritative.
    #[serde(default)]
    pub allowed_user_ids: Vec<i64>,
    /// The buttons under each request, in this order.
    #[serde(default = "default_buttons")]
    pub buttons: Vec<ButtonAction>,
    /// Long-polling timeout of getUpdates (below teloxide's 17 s HTTP timeout).
    #[serde(default = "default_poll_timeout_secs")]
    pub poll_timeout_secs: u32,
    /// The longest pause between two attempts of a failing call (Telegram's own 429
    /// `retry_after` is always honoured, even when longer).
    #[serde(default = "default_max_retry_wait_secs")]
    pub max_retry_wait_secs: u64,
    /// The first pause after a call failed for a reason that may pass (doubling up to
    /// `max_retry_wait_secs`, per approval).
    #[serde(default = "default_retry_interval_secs")]
    pub retry_interval_secs: u64,
    /// Where the worker keeps its outbox and watch cursor; must survive restarts.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
}

impl Default for TelegramSection {
    fn default() -> Self {
        TelegramSection {
            bot_token: None,
            api_url: default_api_url(),
            default_chat_id: None,
            allowed_user_ids: Vec::new(),
            buttons: default_buttons(),
            poll_timeout_secs: default_poll_timeout_secs(),
            max_retry_wait_secs: default_max_retry_wait_secs(),
            retry_interval_secs: default_retry_interval_secs(),
            state_dir: default_state_dir(),
        }
    }
}

/// Shows everything except the bot token.
impl std::fmt::Debug for TelegramSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramSection")
            .field("bot_token", &self.bot_token.as_ref().map(|_| "<redacted>"))
            .field("api_url", &self.api_url)
            .field("default_chat_id", &self.default_chat_id)
            .field("allowed_user_ids", &self.allowed_user_ids)
            .field("buttons", &self.buttons)
            .field("poll_timeout_secs", &self.poll_timeout_secs)
            .field("max_retry_wait_secs", &self.max_retry_wait_secs)
            .field("retry_interval_secs", &self.retry_interval_secs)
            .field("state_dir", &self.state_dir)
            .finish()
    }
}

fn default_api_url() -> String {
    "https://api.telegram.org".to_owned()
}
fn default_buttons() -> Vec<ButtonAction> {
    ButtonAction::ALL.to_vec()
}
fn default_poll_timeout_secs() -> u32 {
    10
}
fn default_max_retry_wait_secs() -> u64 {
    30
}
fn default_retry_interval_secs() -> u64 {
    1
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-telegram-state")
}

/// Everything the worker needs, validated, secrets resolved.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]`, retries (`retry_interval_secs`, `max_retry_wait_secs`) and the
    /// watch cursor (`state_dir/watch-cursor`).
    pub runtime: RuntimeSettings,
    pub bot_token: String,
    pub api_url: String,
    pub default_chat_id: Option<i64>,
    pub allowed_user_ids: Vec<i64>,
    pub buttons: Vec<ButtonAction>,
    pub poll_timeout_secs: u32,
    /// The first pause after a failed Bot API poll (doubling up to `max_backoff`).
    pub poll_error_backoff: Duration,
    /// The outbox file.
    pub outbox_path: PathBuf,
}

impl Settings {
    /// Settings with the defaults of the configuration file.
    pub fn new(server_url: &str, bot_token: &str) -> Result<Settings, ConfigError> {
        let file = FileConfig {
            server: ServerSection {
                url: server_url.to_owned(),
                ..ServerSection::default()
            },
            telegram: TelegramSection {
                bot_token: Some(bot_token.to_owned()),
                ..TelegramSection::default()
            },
            metrics: MetricsSection::default(),
        };
        Settings::from_file(file, |_| None)
    }
}

/// `COUNTERSIGN_WORKER_TOKEN` and `TELEGRAM_BOT_TOKEN` override the tokens in the file.
impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            telegram,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection {
                retry_interval: Duration::from_secs(telegram.retry_interval_secs.max(1)),
                max_retry_wait: Duration::from_secs(telegram.max_retry_wait_secs),
                cursor_path: Some(telegram.state_dir.join("watch-cursor")),
            },
        )?;
        let bot_token = env(BOT_TOKEN_ENV).or(telegram.bot_token).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "no bot token: set {BOT_TOKEN_ENV} (or telegram.bot_token)"
            ))
        })?;
        if telegram.buttons.is_empty() {
            return Err(ConfigError::Invalid(
                "telegram.buttons must name at least one button".to_owned(),
            ));
        }
        if telegram.poll_timeout_secs >= 17 {
            return Err(ConfigError::Invalid(
                "telegram.poll_timeout_secs must be below 17 (the Bot API HTTP timeout)".to_owned(),
            ));
        }
        let mut buttons = Vec::new();
        for button in telegram.buttons {
            if !buttons.contains(&button) {
                buttons.push(button);
            }
        }
        Ok(Settings {
            runtime,
            bot_token,
            api_url: telegram.api_url,
            default_chat_id: telegram.default_chat_id,
            allowed_user_ids: telegram.allowed_user_ids,
            buttons,
            poll_timeout_secs: telegram.poll_timeout_secs,
            poll_error_backoff: Duration::from_secs(1),
            outbox_path: telegram.state_dir.join("outbox.jsonl"),
        })
    }
}

/// Shows everything except the tokens.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("api_url", &self.api_url)
            .field("default_chat_id", &self.default_chat_id)
            .field("allowed_user_ids", &self.allowed_user_ids)
            .field("buttons", &self.buttons)
            .field("outbox_path", &self.outbox_path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_full_file_is_read_and_env_tokens_win() {
        let file = parse(
            r#"
            [server]
            url = "http://127.0.0.1:50051"
            token = "file-worker-token"
            [telegram]
            bot_token = "file-bot-token"
            api_url = "http://127.0.0.1:8081"
            default_chat_id = -100123
            allowed_user_ids = [1, 2]
            buttons = ["reject", "approve"]
            poll_timeout_secs = 5
            "#,
        );
        let settings = Settings::from_file(file, |name| match name {
            WORKER_TOKEN_ENV => Some("env-worker".into()),
            BOT_TOKEN_ENV => Some("env-bot".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            settings.runtime.server.client.token.as_deref(),
            Some("env-worker")
        );
        assert_eq!(settings.bot_token, "env-bot");
        assert_eq!(settings.api_url, "http://127.0.0.1:8081");
        assert_eq!(settings.default_chat_id, Some(-100123));
        assert_eq!(settings.allowed_user_ids, vec![1, 2]);
        assert_eq!(
            settings.buttons,
            vec![ButtonAction::Reject, ButtonAction::Approve]
        );
        assert_eq!(settings.poll_timeout_secs, 5);
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("env-worker") && !shown.contains("env-bot"),
            "{shown}"
        );
    }

    #[test]
    fn defaults_apply_and_the_file_tokens_are_used_without_env() {
        let file = parse(
            r#"
            [server]
            url = "http://127.0.0.1:50051"
            token = "file-worker-token"
            [telegram]
            bot_token = "file-bot-token"
            "#,
        );
        let settings = Settings::from_file(file, |_| None).unwrap();
        assert_eq!(
            settings.runtime.server.client.token.as_deref(),
            Some("file-worker-token")
        );
        assert_eq!(settings.bot_token, "file-bot-token");
        assert_eq!(settings.api_url, "https://api.telegram.org");
        assert_eq!(settings.buttons, ButtonAction::ALL.to_vec());
        assert!(settings.allowed_user_ids.is_empty());
    }

    #[test]
    fn mistakes_are_refused_with_a_reason() {
        let no_token = parse("[server]\nurl = \"http://127.0.0.1:1\"\n");
        let error = Settings::from_file(no_token, |_| None).unwrap_err();
        assert!(error.to_string().contains(BOT_TOKEN_ENV), "{error}");

        let unknown_button: Result<FileConfig, _> =
            toml::from_str("[server]\nurl = \"http://x\"\n[telegram]\nbuttons = [\"maybe\"]\n");
        assert!(unknown_button.is_err());

        let typo: Result<FileConfig, _> =
            toml::from_str("[server]\nurl = \"http://x\"\n[telegram]\ndefault_chat = 1\n");
        assert!(typo.is_err());

        let no_buttons = parse("[server]\nurl = \"http://x\"\n[telegram]\nbuttons = []\n");
        let bot_token = |name: &str| (name == BOT_TOKEN_ENV).then(|| "t".to_owned());
        assert!(Settings::from_file(no_buttons, bot_token).is_err());
    }
}
