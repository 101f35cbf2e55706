//! The parts of a worker's configuration every channel shares: the `[server]` and `[metrics]`
//! sections, the runtime's part of a channel's section ([`RuntimeSection`]), the one settings
//! shape every channel's `Settings` embed ([`RuntimeSettings`], turned into the runtime's
//! [`RuntimeOptions`] by [`RuntimeSettings::options`]), the defaults channel sections share,
//! how the TOML file is read, and the errors that name what is wrong.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::retry::Backoff;
use crate::runtime::RuntimeOptions;

/// The environment variable holding the worker's token for the countersign server.
pub const WORKER_TOKEN_ENV: &str = "COUNTERSIGN_WORKER_TOKEN";

/// When a worker needs its token, as every worker's `--help` says it: the server asks for
/// one only when it has `[[tokens]]`.
pub const WORKER_TOKEN_NEEDED: &str = "needed when the countersign server has [[tokens]]; a \
     server without tokens (which serves loopback only) takes a worker without one";

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration in {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// `name` from the process environment, when set and not empty (an empty variable is unset:
/// `VAR= command` must not replace a token in the file with nothing).
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// A worker's settings: its TOML file validated, secrets from the environment.
pub trait WorkerSettings: Sized {
    /// The file as written.
    type File: DeserializeOwned;

    /// Validates a parsed file; `env` looks up environment variables (a secret there wins
    /// over the file's).
    fn from_file(
        file: Self::File,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError>;

    /// Reads the file at `path`; secrets come from the process environment ([`env_var`]).
    fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file(read_toml(path)?, env_var)
    }
}

/// Reads and parses the TOML file at `path`.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The `[server]` section: where the countersign server is and how to reach it.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    /// Worker token; `COUNTERSIGN_WORKER_TOKEN` overrides it.
    pub token: Option<String>,
    /// PEM file of the CA that signs the server's certificate.
    pub ca_cert: Option<PathBuf>,
    /// The limit on connecting to the server, in seconds (default 5).
    pub connect_timeout_secs: Option<u64>,
    /// The GitHub worker's old name for the same limit, in milliseconds: still read, with a
    /// warning naming the new one.
    pub connect_timeout_ms: Option<u64>,
    /// A watch silent (not even heartbeats) for this long is reconnected.
    #[serde(default = "default_heartbeat_timeout_secs")]
    pub heartbeat_timeout_secs: u64,
    /// The longest pause between reconnection attempts to the server.
    #[serde(default = "default_max_backoff_secs")]
    pub max_backoff_secs: u64,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            url: String::new(),
            token: None,
            ca_cert: None,
            connect_timeout_secs: None,
            connect_timeout_ms: None,
            heartbeat_timeout_secs: default_heartbeat_timeout_secs(),
            max_backoff_secs: default_max_backoff_secs(),
        }
    }
}

/// Shows everything except the token.
impl std::fmt::Debug for ServerSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSection")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_cert", &self.ca_cert)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("heartbeat_timeout_secs", &self.heartbeat_timeout_secs)
            .field("max_backoff_secs", &self.max_backoff_secs)
            .finish()
    }
}

impl ServerSection {
    /// The limit on connecting to the server, from `connect_timeout_secs` or, with a warning,
    /// from its old name `connect_timeout_ms`; both at once are refused.
    pub fn connect_timeout(&self) -> Result<std::time::Duration, ConfigError> {
        match (self.connect_timeout_secs, self.connect_timeout_ms) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid(
                "server.connect_timeout_ms is the old name of server.connect_timeout_secs: \
                 keep only connect_timeout_secs"
                    .to_owned(),
            )),
            (Some(secs), None) => Ok(std::time::Duration::from_secs(secs)),
            (None, Some(ms)) => {
                tracing::warn!(
                    connect_timeout_ms = ms,
                    "server.connect_timeout_ms is an old name, still read: write \
                     connect_timeout_secs (in seconds) instead"
                );
                Ok(std::time::Duration::from_millis(ms))
            }
            (None, None) => Ok(DEFAULT_CONNECT_TIMEOUT),
        }
    }

    /// Checks that the URL is set and the limits are positive (a zero heartbeat timeout would
    /// reconnect without end), and reads the CA file, if any.
    pub fn ca_cert_pem(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::Invalid("server.url is required".to_owned()));
        }
        let zero = [
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("heartbeat_timeout_secs", Some(self.heartbeat_timeout_secs)),
            ("max_backoff_secs", Some(self.max_backoff_secs)),
        ]
        .into_iter()
        .find(|(_, value)| *value == Some(0));
        if let Some((name, _)) = zero {
            return Err(ConfigError::Invalid(format!(
                "server.{name} must be at least 1"
            )));
        }
        match &self.ca_cert {
            Some(path) => std::fs::read(path)
                .map(Some)
                .map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                }),
            None => Ok(None),
        }
    }
}

/// The server section resolved: how to connect, and how the watch behaves. (No `Debug`: it
/// holds the token.)
#[derive(Clone)]
pub struct ServerSettings {
    pub client: countersign_client::ClientConfig,
    /// A watch silent for this long is reconnected.
    pub heartbeat_timeout: std::time::Duration,
    /// The longest pause between reconnection attempts.
    pub max_backoff: std::time::Duration,
}

impl ServerSection {
    /// Resolves the section: the CA file read, `worker_token_env` (the value of
    /// [`WORKER_TOKEN_ENV`]) winning over the file's token.
    pub fn resolve(self, worker_token_env: Option<String>) -> Result<ServerSettings, ConfigError> {
        let ca_cert_pem = self.ca_cert_pem()?;
        let connect_timeout = self.connect_timeout()?;
        Ok(ServerSettings {
            client: countersign_client::ClientConfig {
                url: self.url.trim().to_owned(),
                token: worker_token_env.or(self.token),
                ca_cert_pem,
                connect_timeout,
            },
            heartbeat_timeout: std::time::Duration::from_secs(self.heartbeat_timeout_secs),
            max_backoff: std::time::Duration::from_secs(self.max_backoff_secs),
        })
    }
}

/// The `[metrics]` section, named and shaped as the server's: where the worker serves
/// `/healthz` and `/metrics` (plain HTTP, no auth: keep it on a private interface); off when
/// absent.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    pub listen: Option<std::net::SocketAddr>,
}

/// The runtime's part of a channel's section: how a failing platform write is retried and
/// where the watch cursor is kept. Each channel names the keys in its own section, in the units
/// its README documents (which differ between channels and stay as they were), and builds
/// this from them.
#[derive(Clone, Debug)]
pub struct RuntimeSection {
    /// The first pause before a failed write is tried again (doubling, per approval).
    pub retry_interval: Duration,
    /// The longest pause between two attempts (a platform's retry-after is always honoured).
    pub max_retry_wait: Duration,
    /// Where the watch cursor is kept; `None`: every start takes a snapshot and reconciles.
    pub cursor_path: Option<PathBuf>,
}

impl RuntimeSection {
    /// The section of a channel whose keys are `retry_interval_ms` (at least 1) and
    /// `max_retry_wait_ms`, without a cursor: every start takes a snapshot and reconciles.
    pub fn from_millis(retry_interval_ms: u64, max_retry_wait_ms: u64) -> RuntimeSection {
        RuntimeSection {
            retry_interval: Duration::from_millis(retry_interval_ms.max(1)),
            max_retry_wait: Duration::from_millis(max_retry_wait_ms),
            cursor_path: None,
        }
    }
}

/// What every channel's `Settings` embed (as their `runtime` field): the server resolved,
/// where `/healthz` and `/metrics` are served, and how the runtime retries, stops and
/// resumes. (No `Debug`: it holds the worker token.)
#[derive(Clone)]
pub struct RuntimeSettings {
    pub server: ServerSettings,
    /// Where `/healthz` and `/metrics` are served (`[metrics] listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// The backoff of an approval's retries.
    pub retry: Backoff,
    /// How long a shutdown waits for the platform writes in flight.
    pub shutdown_grace: Duration,
    /// The watch cursor file; `None`: every start takes a snapshot and reconciles.
    pub cursor_path: Option<PathBuf>,
}

/// Shows everything except the worker token.
impl std::fmt::Debug for RuntimeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeSettings")
            .field("server_url", &self.server.client.url)
            .field(
                "worker_token",
                &self.server.client.token.as_ref().map(|_| "<redacted>"),
            )
            .field("metrics_listen", &self.metrics_listen)
            .field("retry", &self.retry)
            .field("cursor_path", &self.cursor_path)
            .finish_non_exhaustive()
    }
}

impl RuntimeSettings {
    /// The `[server]` and `[metrics]` sections and the runtime's part of the channel's section
    /// resolved; `worker_token_env` (the value of [`WORKER_TOKEN_ENV`]) wins over the file's
    /// token.
    pub fn from_sections(
        server: ServerSection,
        worker_token_env: Option<String>,
        metrics: MetricsSection,
        runtime: RuntimeSection,
    ) -> Result<RuntimeSettings, ConfigError> {
        Ok(RuntimeSettings {
            server: server.resolve(worker_token_env)?,
            metrics_listen: metrics.listen,
            retry: Backoff::new(runtime.retry_interval, runtime.max_retry_wait),
            shutdown_grace: SHUTDOWN_GRACE,
            cursor_path: runtime.cursor_path,
        })
    }

    /// The options [`crate::runtime::run`] takes.
    pub fn options(&self) -> RuntimeOptions {
        RuntimeOptions {
            heartbeat_timeout: self.server.heartbeat_timeout,
            max_backoff: self.server.max_backoff,
            retry: self.retry,
            shutdown_grace: self.shutdown_grace,
            cursor_path: self.cursor_path.clone(),
            metrics_listen: self.metrics_listen,
        }
    }
}

/// How long a shutdown waits for the platform writes in flight, in every channel.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The defaults channel sections share (`#[serde(default = "…")]` names them), so that the
/// same key means the same in every channel that has it.
pub mod defaults {
    /// `request_timeout_ms`: one platform call's limit (connect, send, answer).
    pub fn request_timeout_ms() -> u64 {
        10_000
    }
    /// `retry_interval_ms`: the first pause after a failed write.
    pub fn retry_interval_ms() -> u64 {
        1_000
    }
    /// `max_retry_wait_ms`: the longest pause between two attempts.
    pub fn max_retry_wait_ms() -> u64 {
        60_000
    }
}

const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
fn default_heartbeat_timeout_secs() -> u64 {
    30
}
fn default_max_backoff_secs() -> u64 {
    10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_token_is_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.toml");
        std::fs::write(
            &path,
            "[server]\nurl = \"http://x\"\ntoken = \"s3cret\"\nnope = 1\n",
        )
        .unwrap();
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct File {
            server: ServerSection,
        }
        let error = read_toml::<File>(&path).err().unwrap().to_string();
        assert!(
            error.contains("worker.toml") && error.contains("nope"),
            "{error}"
        );
        let section = ServerSection {
            token: Some("s3cret".into()),
            ..ServerSection::default()
        };
        assert!(!format!("{section:?}").contains("s3cret"));
        assert!(section
            .ca_cert_pem()
            .unwrap_err()
            .to_string()
            .contains("server.url"));
        let resolved = ServerSection {
            url: "http://127.0.0.1:1".into(),
            token: Some("file".into()),
            ..ServerSection::default()
        }
        .resolve(Some("env".into()))
        .unwrap();
        assert_eq!(resolved.client.token.as_deref(), Some("env"));
    }

    #[test]
    fn the_connect_timeout_has_one_name_and_the_old_one_is_still_read() {
        let parse = |text: &str| toml::from_str::<ServerSection>(text).unwrap();
        let limit = |text: &str| parse(text).connect_timeout();
        assert_eq!(
            limit("url = \"http://x\"").unwrap(),
            std::time::Duration::from_secs(5)
        );
        assert_eq!(
            limit("url = \"http://x\"\nconnect_timeout_secs = 7").unwrap(),
            std::time::Duration::from_secs(7)
        );
        assert_eq!(
            limit("url = \"http://x\"\nconnect_timeout_ms = 2500").unwrap(),
            std::time::Duration::from_millis(2500)
        );
        let both = limit("url = \"http://x\"\nconnect_timeout_secs = 7\nconnect_timeout_ms = 1")
            .unwrap_err()
            .to_string();
        assert!(both.contains("keep only connect_timeout_secs"), "{both}");
        for zero in [
            "connect_timeout_secs = 0",
            "connect_timeout_ms = 0",
            "heartbeat_timeout_secs = 0",
            "max_backoff_secs = 0",
        ] {
            let error = parse(&format!("url = \"http://x\"\n{zero}"))
                .ca_cert_pem()
                .unwrap_err()
                .to_string();
            let name = zero.split(' ').next().unwrap();
            assert!(
                error.contains(&format!("server.{name} must be at least 1")),
                "{error}"
            );
        }
    }
}
