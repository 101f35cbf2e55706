//! Configuration: one TOML file; the worker token and the ntfy access token come from the
//! environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//!
//! [ntfy]
//! # A self-hosted ntfy server, or the public one. Access token: env NTFY_TOKEN.
//! server_url = "https://ntfy.example.com"
//! # Approvals routed to `ntfy` without a target (or without any route) go here.
//! default_topic = "alice-approvals"
//! # The buttons post a one-time decision token to this topic on the same ntfy server, which
//! # the worker reads: no inbound address needed. Random and long: whoever knows it can post.
//! reply_topic = "cs-reply-…"
//! # Or: the buttons call decision-link pages served here (plain HTTP: put them behind a TLS
//! # proxy), which phones reach at public_url.
//! # listen = "127.0.0.1:8788"
//! # public_url = "https://approvals.example.com"
//! # Decision links and what each notification shows live here; keep it across restarts.
//! state_dir = "/var/lib/countersign/ntfy"
//!
//! [[topics]]
//! name = "alice-approvals"
//! # Buttons of this topic decide as this approver (channel `ntfy`, user id "alice").
//! approver = "alice"
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

/// The environment variable holding the ntfy access token (as ntfy's own CLI names it).
pub const ACCESS_TOKEN_ENV: &str = "NTFY_TOKEN";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub ntfy: NtfySection,
    #[serde(default)]
    pub topics: Vec<TopicSection>,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NtfySection {
    #[serde(default = "default_server_url")]
    pub server_url: String,
    pub default_topic: Option<String>,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How the phones reach the decision-link pages (the buttons' URLs start with it).
    pub public_url: Option<String>,
    /// The topic the buttons post their decision token to (on `server_url`), which the worker
    /// subscribes to; instead of `public_url`.
    pub reply_topic: Option<String>,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// One call's limit (connect, send, answer).
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The first pause after a failed publish, doubling up to `max_retry_wait_ms` (never
    /// before ntfy's `Retry-After`).
    #[serde(default = "defaults::retry_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "defaults::max_retry_wait_ms")]
    pub max_retry_wait_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSection {
    /// The ntfy topic; what routes name as their `ntfy` target.
    pub name: String,
    /// The approver the topic's buttons decide as; without one they decide as the topic
    /// (user id = its name), for the server's approver registry to accept or refuse.
    pub approver: Option<String>,
}

fn default_server_url() -> String {
    "https://ntfy.sh".to_owned()
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8788))
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-ntfy-state")
}

/// One configured topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topic {
    pub name: String,
    /// The user id decisions through its buttons carry (channel `ntfy`).
    pub approver: String,
}

/// How a button's decision reaches the worker.
#[derive(Clone, PartialEq, Eq)]
pub enum DecisionPath {
    /// The buttons post a one-time decision token to this topic on the ntfy server; the
    /// worker follows the topic's JSON stream. Needs no inbound address.
    ReplyTopic(String),
    /// The buttons call the decision-link pages the worker serves on `listen`, which phones
    /// reach at this URL.
    PublicUrl(String),
}

/// The reply topic is as good as a password: never shown.
impl std::fmt::Debug for DecisionPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecisionPath::ReplyTopic(_) => f.write_str("ReplyTopic(<redacted>)"),
            DecisionPath::PublicUrl(url) => f.debug_tuple("PublicUrl").field(url).finish(),
        }
    }
}

/// Everything the worker needs, validated, secrets resolved.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]` and retries (`retry_interval_ms`, `max_retry_wait_ms`); no
    /// cursor: every start reconciles with a snapshot, the store knows what was shown.
    pub runtime: RuntimeSettings,
    pub ntfy_url: String,
    pub access_token: Option<String>,
    pub topics: Vec<Topic>,
    pub default_topic: Option<String>,
    pub listen: SocketAddr,
    pub decisions: DecisionPath,
    pub state_dir: PathBuf,
    pub request_timeout: Duration,
}

/// Shows everything except the tokens.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("ntfy_url", &self.ntfy_url)
            .field(
                "access_token",
                &self.access_token.as_ref().map(|_| "<redacted>"),
            )
            .field("topics", &self.topics)
            .field("default_topic", &self.default_topic)
            .field("listen", &self.listen)
            .field("decisions", &self.decisions)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

/// A fresh topic name: `prefix` and 256 random bits (43 URL-safe characters), as hard to
/// guess as a password.
pub fn random_topic(prefix: &str) -> String {
    format!("{prefix}{}", countersign_links::new_token())
}

/// ntfy's topic names: 1-64 of `A-Za-z0-9_-`.
pub fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn is_http_url(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            ntfy,
            topics,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection::from_millis(ntfy.retry_interval_ms, ntfy.max_retry_wait_ms),
        )?;
        if !is_http_url(&ntfy.server_url) {
            return Err(ConfigError::Invalid(
                "ntfy.server_url must start with http:// or https://".to_owned(),
            ));
        }
        let decisions = match (ntfy.reply_topic, ntfy.public_url) {
            (Some(reply), None) if valid_topic(&reply) => DecisionPath::ReplyTopic(reply),
            (Some(_), None) => {
                return Err(ConfigError::Invalid(
                    "ntfy.reply_topic: ntfy topics are 1-64 letters, digits, '_' or '-'"
                        .to_owned(),
                ))
            }
            (None, Some(url)) if is_http_url(&url) => {
                DecisionPath::PublicUrl(url.trim_end_matches('/').to_owned())
            }
            (None, Some(_)) => return Err(ConfigError::Invalid(
                "ntfy.public_url (how phones reach the decision links, e.g. https://approvals.example.com) must start with http:// or https://".to_owned(),
            )),
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "ntfy.reply_topic and ntfy.public_url both set: the buttons decide through one of them; keep one".to_owned(),
                ))
            }
            (None, None) => {
                return Err(ConfigError::Invalid(
                    "ntfy.reply_topic (a random topic the buttons post their decisions to; `countersign setup ntfy` makes one) or ntfy.public_url (how phones reach the decision-link pages) is needed".to_owned(),
                ))
            }
        };
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for topic in topics {
            if !valid_topic(&topic.name) {
                return Err(ConfigError::Invalid(format!(
                    "topic {:?}: ntfy topics are 1-64 letters, digits, '_' or '-'",
                    topic.name
                )));
            }
            if !names.insert(topic.name.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "topic {:?} is configured twice",
                    topic.name
                )));
            }
            if decisions == DecisionPath::ReplyTopic(topic.name.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "topic {:?} is also the reply topic: phones must not be able to read the decisions, nor the worker take its own notifications for them",
                    topic.name
                )));
            }
            resolved.push(Topic {
                approver: topic.approver.unwrap_or_else(|| topic.name.clone()),
                name: topic.name,
            });
        }
        if resolved.is_empty() {
            return Err(ConfigError::Invalid(
                "no topics: add a [[topics]] section with the topic's name and its approver"
                    .to_owned(),
            ));
        }
        if let Some(default) = &ntfy.default_topic {
            if !names.contains(default) {
                return Err(ConfigError::Invalid(format!(
                    "ntfy.default_topic names {default:?}, which is not a [[topics]] entry"
                )));
            }
        }
        Ok(Settings {
            runtime,
            ntfy_url: ntfy.server_url.trim_end_matches('/').to_owned(),
            access_token: env(ACCESS_TOKEN_ENV),
            topics: resolved,
            default_topic: ntfy.default_topic,
            listen: ntfy.listen,
            decisions,
            state_dir: ntfy.state_dir,
            request_timeout: Duration::from_millis(ntfy.request_timeout_ms),
        })
    }
}

impl Settings {
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("ntfy.db")
    }

    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.iter().find(|topic| topic.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_worker::config::read_toml;
    use std::path::Path;

    const CONFIG: &str = "[server]\nurl = \"http://127.0.0.1:1\"\ntoken = \"file-token\"\n[ntfy]\nserver_url = \"https://ntfy.example/\"\npublic_url = \"https://a.example/\"\ndefault_topic = \"ops\"\n[[topics]]\nname = \"ops\"\napprover = \"alice\"\n[[topics]]\nname = \"bob-phone\"\n";

    fn parse(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn the_readme_table_gives_each_key_its_default() {
        let documented =
            countersign_testkit::docs::table_defaults(include_str!("../README.md"), "ntfy.");
        let ntfy = parse(
            "[server]\nurl = \"http://127.0.0.1:1\"\n[ntfy]\npublic_url = \"https://a.example/\"\n",
        )
        .ntfy;
        let actual = [
            ("public_url", "—".to_owned()),
            ("reply_topic", "—".to_owned()),
            ("server_url", ntfy.server_url),
            ("default_topic", "—".to_owned()),
            ("listen", ntfy.listen.to_string()),
            ("state_dir", ntfy.state_dir.display().to_string()),
            ("request_timeout_ms", ntfy.request_timeout_ms.to_string()),
            ("retry_interval_ms", ntfy.retry_interval_ms.to_string()),
            ("max_retry_wait_ms", ntfy.max_retry_wait_ms.to_string()),
        ];
        let actual: Vec<(String, String)> = actual
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        assert_eq!(documented, actual);
    }

    #[test]
    fn a_file_is_read_and_tokens_come_from_the_environment() {
        let env = |name: &str| match name {
            ACCESS_TOKEN_ENV => Some("tk_secret".to_owned()),
            WORKER_TOKEN_ENV => Some("env-worker".to_owned()),
            _ => None,
        };
        let settings = Settings::from_file(parse(CONFIG), env).unwrap();
        assert_eq!(settings.ntfy_url, "https://ntfy.example");
        assert_eq!(
            settings.decisions,
            DecisionPath::PublicUrl("https://a.example".to_owned())
        );
        assert_eq!(settings.access_token.as_deref(), Some("tk_secret"));
        assert_eq!(
            settings.runtime.server.client.token.as_deref(),
            Some("env-worker")
        );
        assert_eq!(settings.topic("ops").unwrap().approver, "alice");
        assert_eq!(settings.topic("bob-phone").unwrap().approver, "bob-phone");
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("tk_secret") && !shown.contains("env-worker"),
            "{shown}"
        );
    }

    #[test]
    fn a_reply_topic_needs_no_public_url_and_is_never_shown() {
        let text = CONFIG.replace(
            "public_url = \"https://a.example/\"",
            "reply_topic = \"cs-reply-0123456789abcdef\"",
        );
        let settings = Settings::from_file(parse(&text), |_| None).unwrap();
        assert_eq!(
            settings.decisions,
            DecisionPath::ReplyTopic("cs-reply-0123456789abcdef".to_owned())
        );
        let shown = format!("{settings:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
    }

    #[test]
    fn the_example_configuration_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/ntfy.example.toml");
        let file: FileConfig = read_toml(&path).unwrap();
        let settings = Settings::from_file(file, |_| None).unwrap();
        assert_eq!(settings.default_topic.as_deref(), Some("alice-approvals"));
        assert_eq!(settings.topic("alice-approvals").unwrap().approver, "alice");
        assert_eq!(settings.access_token, None);
    }

    #[test]
    fn mistakes_are_refused_naming_what_is_wrong() {
        let refused = |text: &str| {
            Settings::from_file(parse(text), |_| None)
                .unwrap_err()
                .to_string()
        };
        let bad_topic = CONFIG.replace("name = \"bob-phone\"", "name = \"bob phone\"");
        assert!(refused(&bad_topic).contains("bob phone"));
        let unknown_default = CONFIG.replace("default_topic = \"ops\"", "default_topic = \"x\"");
        assert!(refused(&unknown_default).contains("default_topic"));
        let no_public_url = CONFIG.replace(
            "public_url = \"https://a.example/\"",
            "public_url = \"a.example\"",
        );
        assert!(refused(&no_public_url).contains("public_url"));
        let no_topics = "[server]\nurl = \"http://x\"\n[ntfy]\npublic_url = \"https://a\"\n";
        assert!(refused(no_topics).contains("[[topics]]"));
        let neither = CONFIG.replace("public_url = \"https://a.example/\"\n", "");
        assert!(refused(&neither).contains("reply_topic"));
        let both = CONFIG.replace(
            "public_url = \"https://a.example/\"",
            "public_url = \"https://a.example/\"\nreply_topic = \"r\"",
        );
        assert!(refused(&both).contains("both set"));
        let reply_is_a_topic = CONFIG.replace(
            "public_url = \"https://a.example/\"",
            "reply_topic = \"ops\"",
        );
        assert!(refused(&reply_is_a_topic).contains("also the reply topic"));
        let typo: Result<FileConfig, _> =
            toml::from_str(&CONFIG.replace("default_topic", "default_topik"));
        assert!(typo.unwrap_err().to_string().contains("default_topik"));
    }
}
