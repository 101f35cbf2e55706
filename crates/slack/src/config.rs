//! Configuration: one TOML file; the Slack tokens and the worker token come from the
//! environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//!
//! [slack]
//! # Bot token (xoxb-…): env SLACK_BOT_TOKEN; app-level token (xapp-…, connections:write)
//! # for Socket Mode: env SLACK_APP_TOKEN.
//! # The channels approvals may be posted in (their ids); routes name one as their target.
//! channels = ["C0123456789"]
//! # Approvals routed to `slack` without a target (or without any route) go here.
//! default_channel = "C0123456789"
//! # Slack users allowed to decide (ids); empty: whoever the server's approver registry
//! # lists under `identities = { slack = ["U…"] }`.
//! allowed_user_ids = []
//! # What each message shows; keep it across restarts.
//! state_dir = "/var/lib/countersign/slack"
//! # How taps arrive: "socket" (Socket Mode, the default: no public URL) or "http" (Slack
//! # POSTs them to the Interactivity Request URL, served on `listen`, signed with the
//! # signing secret from env SLACK_SIGNING_SECRET).
//! mode = "socket"
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use countersign_worker::config::defaults;
pub use countersign_worker::config::{
    ConfigError, MetricsSection, RuntimeSection, RuntimeSettings, ServerSection, WorkerSettings,
    WORKER_TOKEN_ENV,
};
use serde::Deserialize;

/// The bot token (`xoxb-…`), as Slack's own tools name it.
pub const BOT_TOKEN_ENV: &str = "SLACK_BOT_TOKEN";
/// The app-level token (`xapp-…`) Socket Mode connects with.
pub const APP_TOKEN_ENV: &str = "SLACK_APP_TOKEN";
/// The signing secret that authenticates Slack's HTTP requests (HTTP mode).
pub const SIGNING_SECRET_ENV: &str = "SLACK_SIGNING_SECRET";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub slack: SlackSection,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSection {
    /// The Web API's base URL (a test points it at a fake).
    #[serde(default = "default_api_url")]
    pub api_url: String,
    pub channels: Vec<String>,
    pub default_channel: Option<String>,
    #[serde(default)]
    pub allowed_user_ids: Vec<String>,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub mode: Mode,
    /// Where HTTP mode serves Slack's requests (put it behind a TLS proxy).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// One Web API call's limit.
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The first pause after a failed post or update, doubling up to `max_retry_wait_ms`
    /// (never before Slack's `Retry-After`).
    #[serde(default = "defaults::retry_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "defaults::max_retry_wait_ms")]
    pub max_retry_wait_ms: u64,
}

/// How approvers' taps reach the worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Socket Mode: the worker connects to Slack (no public URL).
    #[default]
    Socket,
    /// Slack POSTs interactions to the worker's Request URL.
    Http,
}

/// Where taps come from, with its secret.
#[derive(Clone)]
pub enum Taps {
    Socket {
        app_token: String,
    },
    Http {
        listen: SocketAddr,
        signing_secret: String,
    },
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8789))
}
fn default_api_url() -> String {
    "https://slack.com/api".to_owned()
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-slack-state")
}

/// Everything the worker needs, validated, secrets resolved.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]` and retries (`retry_interval_ms`, `max_retry_wait_ms`).
    pub runtime: RuntimeSettings,
    pub api_url: String,
    pub bot_token: String,
    pub taps: Taps,
    pub channels: Vec<String>,
    pub default_channel: Option<String>,
    pub allowed_user_ids: Vec<String>,
    pub state_dir: PathBuf,
    pub request_timeout: Duration,
}

/// Shows everything except the tokens.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("api_url", &self.api_url)
            .field("channels", &self.channels)
            .field("default_channel", &self.default_channel)
            .field("allowed_user_ids", &self.allowed_user_ids)
            .field("state_dir", &self.state_dir)
            .field(
                "taps",
                &match &self.taps {
                    Taps::Socket { .. } => "socket mode".to_owned(),
                    Taps::Http { listen, .. } => format!("http on {listen}"),
                },
            )
            .finish_non_exhaustive()
    }
}

/// Slack's conversation ids: `C…` (channel), `G…` (private), `D…` (direct message).
fn valid_channel_id(id: &str) -> bool {
    id.len() >= 3
        && id.starts_with(['C', 'G', 'D'])
        && id
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            slack,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection::from_millis(slack.retry_interval_ms, slack.max_retry_wait_ms),
        )?;
        let token = |name: &str, prefix: &str, what: &str| match env(name) {
            Some(token) if token.starts_with(prefix) => Ok(token),
            Some(_) => Err(ConfigError::Invalid(format!(
                "{name} must be the {what} ({prefix}…)"
            ))),
            None => Err(ConfigError::Invalid(format!(
                "{name} is not set: export the Slack app's {what} ({prefix}…)"
            ))),
        };
        let bot_token = token(BOT_TOKEN_ENV, "xoxb-", "bot token")?;
        let taps = match slack.mode {
            Mode::Socket => Taps::Socket {
                app_token: token(
                    APP_TOKEN_ENV,
                    "xapp-",
                    "app-level token with connections:write",
                )?,
            },
            Mode::Http => Taps::Http {
                listen: slack.listen,
                signing_secret: env(SIGNING_SECRET_ENV).ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "{SIGNING_SECRET_ENV} is not set: slack.mode = \"http\" needs the app's \
                         signing secret (Basic Information → App Credentials)"
                    ))
                })?,
            },
        };
        if !(slack.api_url.starts_with("http://") || slack.api_url.starts_with("https://")) {
            return Err(ConfigError::Invalid(
                "slack.api_url must start with http:// or https://".to_owned(),
            ));
        }
        let mut seen = HashSet::new();
        for id in &slack.channels {
            if !valid_channel_id(id) {
                return Err(ConfigError::Invalid(format!(
                    "slack.channels: {id:?} is not a Slack channel id (like C0123456789; \
                     Slack shows it under the channel's details)"
                )));
            }
            if !seen.insert(id) {
                return Err(ConfigError::Invalid(format!(
                    "slack.channels: {id:?} is listed twice"
                )));
            }
        }
        if slack.channels.is_empty() {
            return Err(ConfigError::Invalid(
                "slack.channels is empty: list the ids of the channels approvals go to".to_owned(),
            ));
        }
        if let Some(default) = &slack.default_channel {
            if !seen.contains(default) {
                return Err(ConfigError::Invalid(format!(
                    "slack.default_channel names {default:?}, which is not in slack.channels"
                )));
            }
        }
        Ok(Settings {
            runtime,
            api_url: slack.api_url.trim_end_matches('/').to_owned(),
            bot_token,
            taps,
            channels: slack.channels,
            default_channel: slack.default_channel,
            allowed_user_ids: slack.allowed_user_ids,
            state_dir: slack.state_dir,
            request_timeout: Duration::from_millis(slack.request_timeout_ms.max(1)),
        })
    }
}

impl Settings {
    /// Whether `user_id` may decide here (before the server's own check).
    pub fn may_decide(&self, user_id: &str) -> bool {
        self.allowed_user_ids.is_empty() || self.allowed_user_ids.iter().any(|id| id == user_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_worker::config::read_toml;
    use std::path::Path;

    const CONFIG: &str = "[server]\nurl = \"http://127.0.0.1:1\"\n[slack]\nchannels = [\"C0OPS\", \"G0PRIV\"]\ndefault_channel = \"C0OPS\"\n";

    fn env(name: &str) -> Option<String> {
        match name {
            BOT_TOKEN_ENV => Some("xoxb-secret-bot".to_owned()),
            APP_TOKEN_ENV => Some("xapp-secret-app".to_owned()),
            _ => None,
        }
    }

    fn refused(text: &str, env: impl Fn(&str) -> Option<String>) -> String {
        Settings::from_file(toml::from_str(text).unwrap(), env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_file_is_read_and_tokens_come_from_the_environment_unlogged() {
        let settings = Settings::from_file(toml::from_str(CONFIG).unwrap(), env).unwrap();
        assert_eq!(settings.api_url, "https://slack.com/api");
        assert_eq!(settings.default_channel.as_deref(), Some("C0OPS"));
        assert!(
            settings.may_decide("U0ANYONE"),
            "no list: the server decides"
        );
        let shown = format!("{settings:?}");
        assert!(!shown.contains("secret"), "{shown}");
        let http = CONFIG.replace("[slack]\n", "[slack]\nmode = \"http\"\n");
        let with_secret = |name: &str| match name {
            SIGNING_SECRET_ENV => Some("signing-secret".to_owned()),
            _ => env(name),
        };
        let settings = Settings::from_file(toml::from_str(&http).unwrap(), with_secret).unwrap();
        assert!(matches!(settings.taps, Taps::Http { .. }));
        assert!(!format!("{settings:?}").contains("secret"));
        assert!(refused(&http, env).contains(SIGNING_SECRET_ENV));
    }

    #[test]
    fn the_readme_table_gives_each_key_its_default() {
        let documented =
            countersign_testkit::docs::table_defaults(include_str!("../README.md"), "slack.");
        let file: FileConfig = toml::from_str(
            "[server]\nurl = \"http://127.0.0.1:1\"\n[slack]\nchannels = [\"C0OPS\"]\n",
        )
        .unwrap();
        let slack = file.slack;
        let actual = [
            ("channels", "—".to_owned()),
            ("default_channel", "—".to_owned()),
            ("allowed_user_ids", format!("{:?}", slack.allowed_user_ids)),
            ("state_dir", slack.state_dir.display().to_string()),
            ("mode", format!("{:?}", slack.mode).to_lowercase()),
            ("listen", slack.listen.to_string()),
            ("api_url", slack.api_url),
            ("request_timeout_ms", slack.request_timeout_ms.to_string()),
            ("retry_interval_ms", slack.retry_interval_ms.to_string()),
            ("max_retry_wait_ms", slack.max_retry_wait_ms.to_string()),
        ];
        let actual: Vec<(String, String)> = actual
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        assert_eq!(documented, actual);
    }

    #[test]
    fn the_example_configuration_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/slack.example.toml");
        let settings = Settings::from_file(read_toml(&path).unwrap(), env).unwrap();
        assert_eq!(settings.default_channel.as_deref(), Some("C0123456789"));
    }

    #[test]
    fn mistakes_are_refused_naming_what_is_wrong() {
        assert!(refused(CONFIG, |_| None).contains(BOT_TOKEN_ENV));
        let swapped = |name: &str| env(name).map(|token| token.replace("xoxb", "xapp"));
        assert!(refused(CONFIG, swapped).contains("bot token"));
        assert!(refused(&CONFIG.replace("C0OPS\",", "#ops\","), env).contains("#ops"));
        assert!(refused(&CONFIG.replace("\"C0OPS\"\n", "\"C0X\"\n"), env).contains("C0X"));
        let typo: Result<FileConfig, _> = toml::from_str(&CONFIG.replace("channels", "chanels"));
        assert!(typo.unwrap_err().to_string().contains("chanels"));
    }
}
