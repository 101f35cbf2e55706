//! Configuration: one TOML file, the secrets also (and preferably) from the environment.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! # The address approvers open; login links start with it, and https here makes the session
//! # cookie Secure.
//! public_url = "https://approvals.example.com"
//! # Login tokens and sessions live here (SQLite).
//! state_dir = "/var/lib/countersign-web"
//! # Approver ids who may list and revoke session grants (needs [server] admin_token).
//! admins = ["alice"]
//!
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN (a worker token for channel "web"; the old name
//! # COUNTERSIGN_WEB_WORKER_TOKEN is still read, with a warning)
//! # admin_token: env COUNTERSIGN_WEB_ADMIN_TOKEN (optional: audit timeline and grants)
//!
//! [sign_in]
//! mode = "login"            # or "proxy"
//! session_ttl_secs = 43200
//! login_ttl_secs = 900
//! # proxy mode only:
//! identity_header = "X-Forwarded-User"
//! name_header = "X-Forwarded-Name"
//! trusted_proxies = ["127.0.0.1"]
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use countersign_client::ClientConfig;
use serde::Deserialize;

/// The environment variable holding the worker token (channel `web`): the same name in every
/// channel worker.
pub use countersign_worker::config::{WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED};
/// A name docs/web.md once gave the web worker token: still read when the canonical one is
/// not set, with a warning.
pub const OLD_WORKER_TOKEN_ENV: &str = "COUNTERSIGN_WEB_WORKER_TOKEN";
/// The environment variable holding the optional admin token (audit timeline, grants).
pub const ADMIN_TOKEN_ENV: &str = "COUNTERSIGN_WEB_ADMIN_TOKEN";

/// The channel the web inbox decides on: the server's approver registry lists web identities
/// under it.
pub const CHANNEL: &str = "web";

pub use countersign_worker::config::{ConfigError, WorkerSettings};

/// The file as written (also the `[web]` section of `countersign up`'s config file, with the
/// server filled in).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    public_url: Option<String>,
    #[serde(default = "default_state_dir")]
    state_dir: PathBuf,
    #[serde(default)]
    admins: Vec<String>,
    server: ServerSection,
    #[serde(default)]
    sign_in: SignInSection,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    url: String,
    token: Option<String>,
    admin_token: Option<String>,
    ca_cert: Option<PathBuf>,
    #[serde(default = "default_connect_timeout_secs")]
    connect_timeout_secs: u64,
}

/// Shows everything except the tokens.
impl std::fmt::Debug for ServerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSection")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_cert", &self.ca_cert)
            .finish()
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignInSection {
    #[serde(default)]
    mode: SignInModeName,
    #[serde(default = "default_session_ttl_secs")]
    session_ttl_secs: u64,
    #[serde(default = "default_login_ttl_secs")]
    login_ttl_secs: u64,
    identity_header: Option<String>,
    name_header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<IpAddr>,
}

impl Default for SignInSection {
    fn default() -> Self {
        SignInSection {
            mode: SignInModeName::Login,
            session_ttl_secs: default_session_ttl_secs(),
            login_ttl_secs: default_login_ttl_secs(),
            identity_header: None,
            name_header: None,
            trusted_proxies: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum SignInModeName {
    #[default]
    Login,
    Proxy,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-web-state")
}
fn default_connect_timeout_secs() -> u64 {
    5
}
fn default_session_ttl_secs() -> u64 {
    12 * 3600
}
fn default_login_ttl_secs() -> u64 {
    15 * 60
}

/// How approvers sign in.
#[derive(Clone, Debug)]
pub enum SignIn {
    /// One-time login links issued by `countersign-web issue-login`, exchanged for a session
    /// cookie.
    Login,
    /// An authenticating reverse proxy names the approver in a header; the header is trusted
    /// only on connections from `trusted_proxies`.
    Proxy {
        identity_header: axum::http::HeaderName,
        name_header: Option<axum::http::HeaderName>,
        trusted_proxies: Vec<IpAddr>,
    },
}

/// Everything the web worker needs, validated, secrets resolved.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    /// Without a trailing slash.
    pub public_url: String,
    pub state_dir: PathBuf,
    pub admins: Vec<String>,
    pub server: ClientConfig,
    /// The same server with the admin token, when one is configured.
    pub admin_server: Option<ClientConfig>,
    pub sign_in: SignIn,
    pub session_ttl: Duration,
    pub login_ttl: Duration,
}

impl Settings {
    /// Whether the session cookie must be `Secure` (the inbox is served over https).
    pub fn secure_cookies(&self) -> bool {
        self.public_url.starts_with("https://")
    }
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let (token, warning) = worker_token_from_env(&env);
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
        }
        let token = token.or(file.server.token.clone());
        let admin_token = env(ADMIN_TOKEN_ENV).or(file.server.admin_token.clone());
        let ca_cert_pem = match &file.server.ca_cert {
            Some(path) => Some(std::fs::read(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        let client = |token: Option<String>| ClientConfig {
            token,
            ca_cert_pem: ca_cert_pem.clone(),
            connect_timeout: Duration::from_secs(file.server.connect_timeout_secs),
            ..ClientConfig::new(file.server.url.clone())
        };
        let public_url = file
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", file.listen));
        if !(public_url.starts_with("http://") || public_url.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "public_url {public_url:?} must start with http:// or https://"
            )));
        }
        let sign_in = match file.sign_in.mode {
            SignInModeName::Login => SignIn::Login,
            SignInModeName::Proxy => {
                let header = |field: &str, value: &Option<String>| {
                    value
                        .as_deref()
                        .map(|name| {
                            axum::http::HeaderName::try_from(name).map_err(|_| {
                                ConfigError::Invalid(format!(
                                    "sign_in.{field} {name:?} is not a header name"
                                ))
                            })
                        })
                        .transpose()
                };
                let identity_header = header("identity_header", &file.sign_in.identity_header)?
                    .ok_or_else(|| {
                        ConfigError::Invalid("sign_in mode proxy needs identity_header".into())
                    })?;
                if file.sign_in.trusted_proxies.is_empty() {
                    return Err(ConfigError::Invalid(
                        "sign_in mode proxy needs trusted_proxies (the proxy's addresses)".into(),
                    ));
                }
                SignIn::Proxy {
                    identity_header,
                    name_header: header("name_header", &file.sign_in.name_header)?,
                    trusted_proxies: file.sign_in.trusted_proxies.clone(),
                }
            }
        };
        if file.sign_in.session_ttl_secs == 0 || file.sign_in.login_ttl_secs == 0 {
            return Err(ConfigError::Invalid(
                "sign_in.session_ttl_secs and sign_in.login_ttl_secs must be above 0".into(),
            ));
        }
        Ok(Settings {
            listen: file.listen,
            public_url: public_url.trim_end_matches('/').to_owned(),
            state_dir: file.state_dir,
            admins: file.admins,
            server: client(token),
            admin_server: admin_token.map(|token| client(Some(token))),
            sign_in,
            session_ttl: Duration::from_secs(file.sign_in.session_ttl_secs),
            login_ttl: Duration::from_secs(file.sign_in.login_ttl_secs),
        })
    }
}

/// The worker token from the environment, and a warning when the old name was used.
fn worker_token_from_env(
    env: &impl Fn(&str) -> Option<String>,
) -> (Option<String>, Option<String>) {
    match (env(WORKER_TOKEN_ENV), env(OLD_WORKER_TOKEN_ENV)) {
        (Some(token), None) => (Some(token), None),
        (Some(token), Some(_)) => (
            Some(token),
            Some(format!(
                "{OLD_WORKER_TOKEN_ENV} is ignored: the worker token is read from \
                 {WORKER_TOKEN_ENV}, which is also set; unset {OLD_WORKER_TOKEN_ENV}"
            )),
        ),
        (None, Some(token)) => (
            Some(token),
            Some(format!(
                "the worker token was read from {OLD_WORKER_TOKEN_ENV}, an old name: set \
                 {WORKER_TOKEN_ENV} instead (the name every countersign worker reads)"
            )),
        ),
        (None, None) => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, ConfigError> {
        let file: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Settings::from_file(file, |name| {
            (name == WORKER_TOKEN_ENV).then(|| "from-env".into())
        })
    }

    #[test]
    fn the_environment_token_wins_and_https_makes_cookies_secure() {
        let settings = parse(
            "public_url = \"https://inbox.example.com/\"\n[server]\nurl = \"http://127.0.0.1:1\"\ntoken = \"file\"\n",
        )
        .unwrap();
        assert_eq!(settings.server.token.as_deref(), Some("from-env"));
        assert_eq!(settings.public_url, "https://inbox.example.com");
        assert!(settings.secure_cookies());
        assert!(settings.admin_server.is_none());
    }

    #[test]
    fn the_old_token_variable_still_works_and_the_canonical_one_wins() {
        let file = || -> FileConfig {
            toml::from_str("[server]\nurl = \"http://127.0.0.1:1\"\n").unwrap()
        };
        let old_only = Settings::from_file(file(), |name| {
            (name == "COUNTERSIGN_WEB_WORKER_TOKEN").then(|| "old-name".into())
        })
        .unwrap();
        assert_eq!(old_only.server.token.as_deref(), Some("old-name"));
        let both = Settings::from_file(file(), |name| match name {
            "COUNTERSIGN_WEB_WORKER_TOKEN" => Some("old-name".into()),
            "COUNTERSIGN_WORKER_TOKEN" => Some("canonical".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(both.server.token.as_deref(), Some("canonical"));
        let warning = |env: &dyn Fn(&str) -> Option<String>| {
            worker_token_from_env(&|name: &str| env(name))
                .1
                .unwrap_or_default()
        };
        let old_only = warning(&|name| (name == OLD_WORKER_TOKEN_ENV).then(|| "old-name".into()));
        assert!(
            old_only.contains("set COUNTERSIGN_WORKER_TOKEN instead"),
            "{old_only}"
        );
        let both = warning(&|name| Some(name.to_owned()));
        assert!(
            both.contains("COUNTERSIGN_WEB_WORKER_TOKEN is ignored"),
            "{both}"
        );
        assert_eq!(
            warning(&|name| (name == WORKER_TOKEN_ENV).then(|| "canonical".into())),
            ""
        );
    }

    #[test]
    fn proxy_mode_needs_a_header_and_proxies() {
        let base = "[server]\nurl = \"http://127.0.0.1:1\"\n[sign_in]\nmode = \"proxy\"\n";
        let error = parse(base).unwrap_err().to_string();
        assert!(error.contains("identity_header"), "{error}");
        let error = parse(&format!("{base}identity_header = \"X-User\"\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("trusted_proxies"), "{error}");
        let ok = parse(&format!(
            "{base}identity_header = \"X-User\"\ntrusted_proxies = [\"10.0.0.1\"]\n"
        ))
        .unwrap();
        assert!(matches!(ok.sign_in, SignIn::Proxy { .. }));
    }
}
