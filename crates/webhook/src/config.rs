//! Configuration: one TOML file; the worker token and the endpoints' signing secrets come
//! from the environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//! # ca_cert = "/etc/countersign/ca.pem"
//!
//! [webhook]
//! # Deliveries, dead letters and decision links live here; keep it across restarts.
//! state_dir = "/var/lib/countersign/webhook"
//! # The decision-link pages (plain HTTP: put them behind a TLS proxy).
//! listen = "127.0.0.1:8787"
//! public_url = "https://approvals.example.com"
//! # Approvals routed to `webhook` without a target (or without any route) go here.
//! default_endpoints = ["ops"]
//!
//! [[endpoints]]
//! name = "ops"
//! url = "https://hooks.example.com/countersign"
//! # whsec_… secrets, space-separated while rotating
//! secret_env = "COUNTERSIGN_WEBHOOK_SECRET_OPS"
//! # Decision links decide as this approver (channel `webhook`, user id "alice").
//! approver = "alice"
//! ```

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use countersign_worker::config::defaults;
pub use countersign_worker::config::{
    ConfigError, MetricsSection, RuntimeSection, RuntimeSettings, ServerSection, WorkerSettings,
    WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED,
};
use serde::Deserialize;

use crate::signature::Secret;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    #[serde(default)]
    pub webhook: WebhookSection,
    #[serde(default)]
    pub endpoints: Vec<EndpointSection>,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Where the decision-link pages listen.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How approvers reach those pages (the links in the events start with it).
    #[serde(default)]
    pub public_url: String,
    #[serde(default)]
    pub default_endpoints: Vec<String>,
    /// One delivery attempt's limit (connect, send, answer).
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The first pause after a failed attempt, doubling up to `max_retry_wait_ms`.
    #[serde(default = "default_retry_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "default_max_retry_wait_ms")]
    pub max_retry_wait_ms: u64,
    /// A delivery still failing this long after its first attempt becomes a dead letter.
    #[serde(default = "default_give_up_after_secs")]
    pub give_up_after_secs: u64,
}

impl Default for WebhookSection {
    fn default() -> Self {
        WebhookSection {
            state_dir: default_state_dir(),
            listen: default_listen(),
            public_url: String::new(),
            default_endpoints: Vec::new(),
            request_timeout_ms: defaults::request_timeout_ms(),
            retry_interval_ms: default_retry_interval_ms(),
            max_retry_wait_ms: default_max_retry_wait_ms(),
            give_up_after_secs: default_give_up_after_secs(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSection {
    /// What routes name as their `webhook` target.
    pub name: String,
    pub url: String,
    /// The environment variable holding the endpoint's `whsec_…` secrets.
    pub secret_env: String,
    /// The approver the decision links decide as; without one they decide as the endpoint
    /// (user id = its name), for the server's approver registry to accept or refuse.
    pub approver: Option<String>,
    /// Send decision links with request events (default true).
    #[serde(default = "default_true")]
    pub decision_links: bool,
}

impl EndpointSection {
    /// The endpoint with its signing secrets read from `env` (`secret_env`).
    pub fn resolve(self, env: impl Fn(&str) -> Option<String>) -> Result<Endpoint, ConfigError> {
        let secrets = env(&self.secret_env)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "endpoint {}: no signing secret in {}",
                    self.name, self.secret_env
                ))
            })
            .and_then(|text| {
                Secret::parse_list(&text).map_err(|error| {
                    ConfigError::Invalid(format!(
                        "endpoint {}: {} : {error}",
                        self.name, self.secret_env
                    ))
                })
            })?;
        if secrets.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "endpoint {}: {} holds no secret",
                self.name, self.secret_env
            )));
        }
        Ok(Endpoint {
            approver: self.approver.unwrap_or_else(|| self.name.clone()),
            name: self.name,
            url: self.url,
            secrets,
            decision_links: self.decision_links,
        })
    }
}

fn default_true() -> bool {
    true
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-webhook-state")
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8787))
}
fn default_retry_interval_ms() -> u64 {
    5_000
}
fn default_max_retry_wait_ms() -> u64 {
    600_000
}
fn default_give_up_after_secs() -> u64 {
    24 * 3600
}

/// One configured endpoint, its secrets resolved.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub name: String,
    pub url: String,
    pub secrets: Vec<Secret>,
    /// The user id decisions through its links carry (channel `webhook`).
    pub approver: String,
    pub decision_links: bool,
}

/// Everything the worker needs, validated, secrets resolved.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]` and retries (`retry_interval_ms`, `max_retry_wait_ms`, also the
    /// deliveries' backoff); no cursor: every start reconciles with a snapshot against the
    /// queue.
    pub runtime: RuntimeSettings,
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    pub public_url: String,
    pub endpoints: Vec<Endpoint>,
    pub default_endpoints: Vec<String>,
    pub request_timeout: Duration,
    pub give_up_after: Duration,
}

/// Shows everything except secrets.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("state_dir", &self.state_dir)
            .field("listen", &self.listen)
            .field("public_url", &self.public_url)
            .field(
                "endpoints",
                &self.endpoints.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            webhook,
            endpoints,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection::from_millis(webhook.retry_interval_ms, webhook.max_retry_wait_ms),
        )?;
        let mut names = HashSet::new();
        let mut resolved = Vec::new();
        for endpoint in endpoints {
            if endpoint.name.is_empty() || !names.insert(endpoint.name.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "endpoint names must be non-empty and unique: {:?}",
                    endpoint.name
                )));
            }
            if !(endpoint.url.starts_with("http://") || endpoint.url.starts_with("https://")) {
                return Err(ConfigError::Invalid(format!(
                    "endpoint {}: url must start with http:// or https://",
                    endpoint.name
                )));
            }
            resolved.push(endpoint.resolve(&env)?);
        }
        for name in &webhook.default_endpoints {
            if !names.contains(name) {
                return Err(ConfigError::Invalid(format!(
                    "webhook.default_endpoints names {name:?}, which is not an endpoint"
                )));
            }
        }
        if resolved.iter().any(|e| e.decision_links) && webhook.public_url.is_empty() {
            return Err(ConfigError::Invalid(
                "webhook.public_url is required for decision links (or set decision_links = false on every endpoint)".to_owned(),
            ));
        }
        Ok(Settings {
            runtime,
            state_dir: webhook.state_dir,
            listen: webhook.listen,
            public_url: webhook.public_url.trim_end_matches('/').to_owned(),
            endpoints: resolved,
            default_endpoints: webhook.default_endpoints,
            request_timeout: Duration::from_millis(webhook.request_timeout_ms),
            give_up_after: Duration::from_secs(webhook.give_up_after_secs),
        })
    }
}

impl Settings {
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("webhook.db")
    }

    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|endpoint| endpoint.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, secret: Option<&str>) -> Result<Settings, ConfigError> {
        let file: FileConfig = toml::from_str(text).unwrap();
        let secret = secret.map(str::to_owned);
        Settings::from_file(file, move |_| secret.clone())
    }

    const CONFIG: &str = "[server]\nurl = \"http://127.0.0.1:1\"\n[webhook]\npublic_url = \"https://a.example/\"\ndefault_endpoints = [\"ops\"]\n[[endpoints]]\nname = \"ops\"\nurl = \"https://hooks.example/x\"\nsecret_env = \"S\"\napprover = \"alice\"\n";

    #[test]
    fn a_valid_file() {
        let settings = parse(CONFIG, Some("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")).unwrap();
        assert_eq!(settings.public_url, "https://a.example");
        assert_eq!(settings.endpoint("ops").unwrap().approver, "alice");
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let error = parse(CONFIG, None).err().unwrap().to_string();
        assert!(error.contains("no signing secret in S"), "{error}");
        let error = parse(CONFIG, Some("whsec_c2hvcnQ="))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("24 to 64 bytes"), "{error}");
        let error = parse(
            &CONFIG.replace("[\"ops\"]", "[\"nope\"]"),
            Some("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(error.contains("\"nope\""), "{error}");
    }
}
