//! Configuration: one TOML file, with every secret also settable by environment variable
//! (which wins over the file).
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token = "..."                 # or COUNTERSIGN_WORKER_TOKEN
//! # ca_cert = "/etc/countersign/ca.pem"
//!
//! [github]
//! api_url = "https://api.github.com"
//! bot_login = "countersign-bot"
//! # token = "github_pat_..."        # or COUNTERSIGN_GITHUB_TOKEN
//! # app_id = 123456                 # a GitHub App instead of a token:
//! # installation_id = 7654321
//! # private_key_path = "/etc/countersign/app.pem"   # or COUNTERSIGN_GITHUB_APP_PRIVATE_KEY (PEM text)
//! default_target = "acme/ops#42"     # for routes without a target; "acme/ops" opens an issue each
//! write_interval_ms = 1000
//! # Where the worker keeps its watch cursor (a restarted worker resumes after it) and the outbox
//! # of its posts; without it every start takes a snapshot and corrects only the 50 newest
//! # resolved approvals.
//! state_dir = "/var/lib/countersign/github"
//!
//! [webhook]                          # optional
//! listen = "0.0.0.0:8080"
//! # secret = "..."                  # or COUNTERSIGN_GITHUB_WEBHOOK_SECRET
//!
//! [polling]                          # optional
//! interval_ms = 30000
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

pub use countersign_worker::config::{
    ConfigError, MetricsSection, RuntimeSettings, ServerSection, WorkerSettings,
};
use countersign_worker::config::{RuntimeSection, WORKER_TOKEN_ENV};

use crate::api::{GitHubAuth, GitHubSettings};
use crate::target::Target;

pub const ENV_WORKER_TOKEN: &str = WORKER_TOKEN_ENV;
pub const ENV_GITHUB_TOKEN: &str = "COUNTERSIGN_GITHUB_TOKEN";
pub const ENV_APP_PRIVATE_KEY: &str = "COUNTERSIGN_GITHUB_APP_PRIVATE_KEY";
pub const ENV_WEBHOOK_SECRET: &str = "COUNTERSIGN_GITHUB_WEBHOOK_SECRET";

/// The file as written. (No `Debug`: it holds secrets.)
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub github: GitHubSection,
    pub webhook: Option<WebhookSection>,
    pub polling: Option<PollingSection>,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitHubSection {
    pub api_url: Option<String>,
    pub token: Option<String>,
    pub app_id: Option<u64>,
    pub installation_id: Option<u64>,
    pub private_key_path: Option<PathBuf>,
    pub bot_login: String,
    pub default_target: Option<String>,
    pub write_interval_ms: Option<u64>,
    pub secondary_limit_wait_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub request_timeout_ms: Option<u64>,
    /// How often deliveries and edits that failed are tried again.
    pub retry_interval_ms: Option<u64>,
    /// Where the watch cursor is kept; must survive restarts.
    pub state_dir: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    pub listen: SocketAddr,
    pub secret: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollingSection {
    pub interval_ms: Option<u64>,
}

/// The validated configuration the worker runs with.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]`, retries (`github.retry_interval_ms`, at most 16 times it) and
    /// the watch cursor (in the state directory), if one is configured.
    pub runtime: RuntimeSettings,
    pub github: GitHubSettings,
    pub default_target: Option<Target>,
    pub webhook: Option<WebhookSettings>,
    pub polling: Option<PollingSettings>,
    /// The outbox of request posts (in the state directory), if one is configured.
    pub outbox_path: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("github", &self.github)
            .field("default_target", &self.default_target)
            .field("webhook", &self.webhook)
            .field("polling", &self.polling)
            .field("outbox_path", &self.outbox_path)
            .finish()
    }
}

#[derive(Clone)]
pub struct WebhookSettings {
    pub listen: SocketAddr,
    pub secret: String,
}

impl std::fmt::Debug for WebhookSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSettings")
            .field("listen", &self.listen)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[derive(Clone, Debug)]
pub struct PollingSettings {
    pub interval: Duration,
}

/// Secrets in the environment win over those in the file.
impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid(message);
        let retry_interval =
            Duration::from_millis(file.github.retry_interval_ms.unwrap_or(30_000).max(1));
        let runtime = RuntimeSettings::from_sections(
            file.server,
            env(ENV_WORKER_TOKEN),
            file.metrics,
            RuntimeSection {
                retry_interval,
                max_retry_wait: retry_interval.saturating_mul(16),
                cursor_path: file
                    .github
                    .state_dir
                    .as_ref()
                    .map(|dir| dir.join("watch-cursor")),
            },
        )?;

        let github = file.github;
        let bot_login = github.bot_login.trim().to_string();
        if bot_login.is_empty() {
            return Err(invalid(
                "github.bot_login is required (the account the worker comments as)".to_string(),
            ));
        }
        let token = env(ENV_GITHUB_TOKEN).or(github.token);
        let auth = match (token, github.app_id, github.installation_id) {
            (Some(_), Some(_), _) => {
                return Err(invalid(
                    "give either a GitHub token or GitHub App credentials, not both".to_string(),
                ))
            }
            (Some(token), None, _) => {
                // The token becomes an HTTP header value.
                if !token.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(invalid("the GitHub token holds invalid characters".to_string()));
                }
                GitHubAuth::Token(token)
            }
            (None, Some(app_id), Some(installation_id)) => {
                let private_key_pem = match env(ENV_APP_PRIVATE_KEY) {
                    Some(pem) => pem,
                    None => {
                        let path = github.private_key_path.ok_or_else(|| {
                            invalid(format!(
                                "github.private_key_path or {ENV_APP_PRIVATE_KEY} is required with github.app_id"
                            ))
                        })?;
                        std::fs::read_to_string(&path)
                            .map_err(|source| ConfigError::Read { path, source })?
                    }
                };
                GitHubAuth::App {
                    app_id,
                    private_key_pem,
                    installation_id,
                }
            }
            (None, Some(_), None) => {
                return Err(invalid(
                    "github.installation_id is required with github.app_id".to_string(),
                ))
            }
            (None, None, _) => {
                return Err(invalid(format!(
                    "a GitHub token (github.token or {ENV_GITHUB_TOKEN}) or GitHub App credentials are required"
                )))
            }
        };
        let default_target = github
            .default_target
            .as_deref()
            .map(str::parse::<Target>)
            .transpose()
            .map_err(|error| invalid(format!("github.default_target: {error}")))?;
        let max_attempts = github.max_attempts.unwrap_or(5);
        if max_attempts == 0 {
            return Err(invalid(
                "github.max_attempts must be at least 1".to_string(),
            ));
        }
        let request_timeout = Duration::from_millis(github.request_timeout_ms.unwrap_or(30_000));
        let github_settings = GitHubSettings {
            api_url: github
                .api_url
                .unwrap_or_else(|| "https://api.github.com".to_string())
                .trim_end_matches('/')
                .to_string(),
            auth,
            bot_login,
            write_interval: Duration::from_millis(github.write_interval_ms.unwrap_or(1000)),
            secondary_limit_wait: Duration::from_millis(
                github.secondary_limit_wait_ms.unwrap_or(60_000),
            ),
            max_attempts,
            connect_timeout: request_timeout,
            read_timeout: request_timeout,
        };

        let webhook = match file.webhook {
            Some(section) => {
                let secret = env(ENV_WEBHOOK_SECRET)
                    .or(section.secret)
                    .filter(|secret| !secret.is_empty())
                    .ok_or_else(|| {
                        invalid(format!(
                            "webhook.secret or {ENV_WEBHOOK_SECRET} is required: unsigned deliveries are refused"
                        ))
                    })?;
                Some(WebhookSettings {
                    listen: section.listen,
                    secret,
                })
            }
            None => None,
        };
        let polling = file.polling.map(|section| PollingSettings {
            interval: Duration::from_millis(section.interval_ms.unwrap_or(30_000).max(1)),
        });
        if webhook.is_none() && polling.is_none() {
            return Err(invalid(
                "enable [webhook], [polling] or both: otherwise no command would ever be read"
                    .to_string(),
            ));
        }
        Ok(Settings {
            runtime,
            github: github_settings,
            default_target,
            webhook,
            polling,
            outbox_path: github
                .state_dir
                .as_ref()
                .map(|dir| dir.join("outbox.jsonl")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(text: &str, env: &[(&'static str, &'static str)]) -> Result<Settings, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("test.toml"),
            source,
        })?;
        let env: HashMap<&str, &str> = env.iter().copied().collect();
        Settings::from_file(file, |name| env.get(name).map(|value| value.to_string()))
    }

    const MINIMAL: &str = r#"
        [server]
        url = "http://127.0.0.1:50051"
        [github]
        bot_login = "countersign-bot"
        token = "ghp_fromfile"
        default_target = "Acme/Ops#42"
        [polling]
    "#;

    #[test]
    fn minimal_file_with_defaults() {
        let config = parse(MINIMAL, &[]).unwrap();
        assert_eq!(config.github.api_url, "https://api.github.com");
        assert!(matches!(&config.github.auth, GitHubAuth::Token(token) if token == "ghp_fromfile"));
        assert_eq!(config.github.write_interval, Duration::from_secs(1));
        assert_eq!(config.default_target.unwrap().to_string(), "acme/ops#42");
        assert_eq!(config.polling.unwrap().interval, Duration::from_secs(30));
        assert!(config.webhook.is_none());
        assert_eq!(config.runtime.server.client.token, None);
    }

    #[test]
    fn the_server_section_is_the_one_every_worker_reads() {
        let with = |line: &str| MINIMAL.replace("[github]", &format!("{line}\n        [github]"));
        let config = parse(
            &with("connect_timeout_secs = 7\nheartbeat_timeout_secs = 9"),
            &[],
        )
        .unwrap();
        assert_eq!(
            config.runtime.server.client.connect_timeout,
            Duration::from_secs(7)
        );
        assert_eq!(
            config.runtime.server.heartbeat_timeout,
            Duration::from_secs(9)
        );
        // The name this worker used before is still read.
        let old_name = parse(&with("connect_timeout_ms = 2500"), &[]).unwrap();
        assert_eq!(
            old_name.runtime.server.client.connect_timeout,
            Duration::from_millis(2500)
        );
        assert!(parse(
            &with("connect_timeout_secs = 1\nconnect_timeout_ms = 1"),
            &[]
        )
        .is_err());
    }

    #[test]
    fn environment_secrets_win() {
        let text = format!("{MINIMAL}\n[webhook]\nlisten = \"127.0.0.1:0\"\nsecret = \"file\"\n");
        let config = parse(
            &text,
            &[
                (ENV_GITHUB_TOKEN, "ghp_fromenv"),
                (ENV_WEBHOOK_SECRET, "envsecret"),
                (ENV_WORKER_TOKEN, "worker"),
            ],
        )
        .unwrap();
        assert!(matches!(&config.github.auth, GitHubAuth::Token(token) if token == "ghp_fromenv"));
        assert_eq!(
            config.webhook.as_ref().map(|w| w.secret.as_str()),
            Some("envsecret")
        );
        assert_eq!(
            config.runtime.server.client.token.as_deref(),
            Some("worker")
        );
        let printed = format!("{config:?}");
        assert!(!printed.contains("worker\"") && !printed.contains("envsecret"));
        assert!(!printed.contains("ghp_fromenv"));
    }

    #[test]
    fn app_credentials() {
        let text = r#"
            [server]
            url = "http://127.0.0.1:50051"
            [github]
            bot_login = "countersign[bot]"
            app_id = 12
            installation_id = 34
            [polling]
        "#;
        let config = parse(
            text,
            &[(ENV_APP_PRIVATE_KEY, "-----BEGIN RSA PRIVATE KEY-----")],
        )
        .unwrap();
        assert!(matches!(
            config.github.auth,
            GitHubAuth::App {
                app_id: 12,
                installation_id: 34,
                ..
            }
        ));
        assert!(!format!("{config:?}").contains("BEGIN"));
    }

    #[test]
    fn refusals() {
        let no_mode = MINIMAL.replace("[polling]", "");
        let cases = [
            (no_mode.as_str(), "enable [webhook]"),
            (
                &*MINIMAL.replace("token = \"ghp_fromfile\"", ""),
                "GitHub token",
            ),
            (&*MINIMAL.replace("Acme/Ops#42", "nope"), "default_target"),
            (
                &*MINIMAL.replace("bot_login = \"countersign-bot\"", "bot_login = \" \""),
                "bot_login",
            ),
            (
                &*format!("{MINIMAL}\n[webhook]\nlisten = \"127.0.0.1:0\"\n"),
                "webhook.secret",
            ),
            (
                &*MINIMAL.replace("ghp_fromfile", "ghp with space"),
                "invalid characters",
            ),
        ];
        for (text, expected) in cases {
            let error = parse(text, &[]).unwrap_err().to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
        assert!(matches!(
            parse(&format!("{MINIMAL}\nunknown = 1\n"), &[]),
            Err(ConfigError::Parse { .. })
        ));
    }
}
