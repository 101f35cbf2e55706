//! Server configuration: one TOML file, overridden by flags and environment variables.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use countersign_core::approvers::ApproverSpec;
use countersign_core::groups::GroupSpec;
use countersign_core::policy::RuleSpec;
use countersign_core::validate::Limits;
use countersign_core::webauthn::RelyingParty;
use serde::Deserialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// SQLite database file, created with its schema when missing; or a PostgreSQL URL
    /// (`postgres://user:password@host/db`), which several replicas may share.
    pub database: PathBuf,
    pub log: LogConfig,
    pub approvals: ApprovalsConfig,
    pub watch: WatchConfig,
    pub storage: StorageConfig,
    pub limits: LimitsConfig,
    pub metrics: MetricsConfig,
    /// The open-standards front door (AuthZEN) on its own HTTP listener; off when unset.
    pub http: HttpConfig,
    pub serving: ServingConfig,
    /// TLS for the gRPC listener; plaintext when absent.
    pub tls: Option<TlsConfig>,
    pub grants: GrantsConfig,
    /// Bearer tokens. None: the server serves only on a loopback address, to anyone there.
    pub tokens: Vec<TokenConfig>,
    /// Who may decide. None: any decider a worker sends is accepted.
    pub approvers: Vec<ApproverSpec>,
    /// Approver groups: who must decide an approval that names them, and where it is shown.
    pub groups: Vec<GroupSpec>,
    /// Policy rules, in order; the first match wins and no match requires a human.
    pub rules: Vec<RuleSpec>,
    /// Whether the rules decide or are only observed.
    pub policy: PolicyConfig,
    /// Decision receipts: where the signing keys are, how long a receipt is good for.
    pub receipts: ReceiptsConfig,
    /// Passkey step-up: where approvers register and use their passkeys.
    pub passkeys: PasskeysConfig,
}

/// `[passkeys]`: passkey step-up (docs/security.md#passkey-step-up).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PasskeysConfig {
    /// The web inbox's public URL (its `public_url`, e.g. `https://inbox.example.com`): the
    /// relying party passkeys are made for (id: the host; origin: scheme, host and port),
    /// and where a chat tap on a step-up approval is sent to approve it. Required when a rule
    /// sets `step_up`.
    pub inbox_url: Option<String>,
}

impl PasskeysConfig {
    /// The relying party of the inbox's URL; None when no URL is set.
    pub fn relying_party(&self) -> Result<Option<RelyingParty>, ConfigError> {
        self.inbox_url
            .as_deref()
            .map(RelyingParty::from_url)
            .transpose()
            .map_err(|e| ConfigError::Invalid(format!("passkeys.inbox_url: {e}")))
    }
}

/// `[receipts]`: the server signs each verdict (docs/security.md#decision-receipts).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReceiptsConfig {
    /// Directory of the signing key set, `receipt-keys.json` (mode 0600), made with a new key
    /// on first start. Unset: the SQLite database's directory; with PostgreSQL, the working
    /// directory. Replicas of one PostgreSQL database must all read the same file (one
    /// mounted secret): the first replica to start creates it, the others read it.
    pub keys_dir: Option<PathBuf>,
    /// How long after the resolution a receipt may be acted on (its `exp`).
    pub ttl_seconds: u32,
    /// How often the server logs a signed checkpoint of the audit chain's head (0: never).
    pub checkpoint_interval_seconds: u32,
}

impl Default for ReceiptsConfig {
    fn default() -> Self {
        ReceiptsConfig {
            keys_dir: None,
            ttl_seconds: 3600,
            checkpoint_interval_seconds: 3600,
        }
    }
}

impl Config {
    /// The directory of the receipt signing keys ([`ReceiptsConfig::keys_dir`]).
    pub fn receipt_keys_dir(&self) -> PathBuf {
        if let Some(dir) = &self.receipts.keys_dir {
            return dir.clone();
        }
        match Database::of(&self.database) {
            Database::Sqlite(path) => path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
            Database::Postgres(_) => PathBuf::from("."),
        }
    }
}

/// `[policy]`: how the rules are used.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub mode: PolicyMode,
}

/// `enforce` (the default): the rules decide. `observe`: the rules are evaluated and what they
/// would have decided is recorded on the approval (labels `policy.observed` and
/// `policy.observed_rule`, so on the audit trail) and counted in `/metrics`, but every call is
/// asked as if there were no rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    #[default]
    Enforce,
    Observe,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            database: PathBuf::from("./countersign.db"),
            log: LogConfig::default(),
            approvals: ApprovalsConfig::default(),
            watch: WatchConfig::default(),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            metrics: MetricsConfig::default(),
            http: HttpConfig::default(),
            serving: ServingConfig::default(),
            tls: None,
            grants: GrantsConfig::default(),
            tokens: Vec::new(),
            approvers: Vec::new(),
            groups: Vec::new(),
            rules: Vec::new(),
            policy: PolicyConfig::default(),
            receipts: ReceiptsConfig::default(),
            passkeys: PasskeysConfig::default(),
        }
    }
}

/// Without tokens only a loopback address is allowed: anyone who reaches the server could
/// approve. Checked before the address is bound.
pub fn refuse_open_listen(listen: SocketAddr, no_tokens: bool) -> Result<(), ConfigError> {
    if no_tokens && !listen.ip().is_loopback() {
        return Err(ConfigError::Invalid(format!(
            "refusing to serve on {listen} without tokens: anyone who can reach it could approve; configure [[tokens]] or listen on a loopback address"
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `countersign_server=debug`; `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".to_string(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// TTL of a request that does not ask for one.
    pub default_ttl_seconds: u32,
    pub min_ttl_seconds: u32,
    pub max_ttl_seconds: u32,
    /// Upper bound of one `WaitForDecision` call.
    pub max_wait_seconds: u32,
    /// How often the sweeper expires approvals past their deadline.
    pub sweep_interval_ms: u64,
    /// How long an approval requested with `withdraw_when_caller_leaves` stays pending with
    /// no WaitForDecision call open for it (its caller's connection gone) before it is
    /// withdrawn: time for a caller to re-attach after a broken connection.
    pub caller_grace_ms: u64,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            default_ttl_seconds: 3600,
            min_ttl_seconds: 1,
            max_ttl_seconds: 7 * 24 * 3600,
            max_wait_seconds: 60,
            sweep_interval_ms: 1000,
            caller_grace_ms: 5000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchConfig {
    /// A heartbeat is sent on a watch stream idle for this long.
    pub heartbeat_interval_ms: u64,
    /// Events a watch stream may have waiting for its consumer; beyond that the stream ends
    /// with RESOURCE_EXHAUSTED and the consumer resumes from its last seq.
    pub buffer_events: usize,
    /// Events older than this are pruned (0: keep forever). A cursor older than the oldest
    /// retained event gets OUT_OF_RANGE.
    pub retention_seconds: u64,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            heartbeat_interval_ms: 15_000,
            buffer_events: 4096,
            retention_seconds: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `synchronous=FULL`: a power loss loses nothing that was acknowledged.
    Full,
    /// `synchronous=NORMAL`: a power loss may lose the last commits (a crash does not).
    Normal,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub durability: Durability,
    /// Commit every change waiting in the writer's queue in one transaction.
    pub group_commit: bool,
    /// The most changes one group commit takes.
    pub max_batch: usize,
    /// Connections for reads (WAL lets them run beside the writer).
    pub read_connections: u32,
    /// Once an approval is resolved, blank its argument values in the approval and in every
    /// stored event of it; the digest stays, and so does the audit hash chain.
    pub redact_arguments: bool,
    /// Who checkpoints the SQLite WAL (copies its pages into the database file).
    pub wal_checkpoints: WalCheckpoints,
    /// The size the SQLite WAL is cut back to when it starts over after a checkpoint (SQLite's
    /// `journal_size_limit`); it grows past it only between two checkpoints.
    pub wal_size_limit_bytes: u64,
    /// The directory where `BackupDatabase` writes its copies. None: the database file's
    /// directory.
    pub backup_dir: Option<PathBuf>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            durability: Durability::Full,
            group_commit: true,
            max_batch: 512,
            read_connections: 4,
            redact_arguments: false,
            wal_checkpoints: WalCheckpoints::Server,
            wal_size_limit_bytes: 16 * 1024 * 1024,
            backup_dir: None,
        }
    }
}

/// Who checkpoints the SQLite WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalCheckpoints {
    /// The server: a passive checkpoint shortly after commits, and SQLite's automatic one as a
    /// backstop.
    Server,
    /// Another process that follows the WAL (Litestream): the server never checkpoints, and
    /// the WAL grows until that process does.
    External,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_arguments_bytes: usize,
    pub max_routes: usize,
    pub max_labels: usize,
    pub max_required_approvals: u32,
    /// Largest gRPC message the server accepts.
    pub max_message_bytes: usize,
    /// Sustained `RequestApproval` calls per agent id and minute (0: no limit).
    pub requests_per_minute: u32,
    /// Calls an agent may make at once before the rate applies (0: `requests_per_minute`).
    pub request_burst: u32,
    /// Sustained `RequestApproval` calls per token and minute, whatever agent ids it names
    /// (0: no limit; unset: ten times `requests_per_minute`). Without tokens configured, every
    /// caller shares one bucket.
    pub requests_per_minute_per_token: Option<u32>,
    /// Sustained `Decide` calls per decider (channel and user id) and minute, refused ones
    /// included (0: no limit).
    pub decisions_per_minute: u32,
    /// Sustained `Decide` calls per worker token and minute (0: no limit; unset: ten times
    /// `decisions_per_minute`).
    pub decisions_per_minute_per_token: Option<u32>,
    /// Pending approvals one agent id may have (0: no limit).
    pub max_pending_per_agent: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let limits = Limits::default();
        LimitsConfig {
            max_arguments_bytes: limits.max_arguments_bytes,
            max_routes: limits.max_routes,
            max_labels: limits.max_labels,
            max_required_approvals: limits.max_required_approvals,
            max_message_bytes: 256 * 1024,
            requests_per_minute: 600,
            request_burst: 0,
            requests_per_minute_per_token: None,
            decisions_per_minute: 600,
            decisions_per_minute_per_token: None,
            max_pending_per_agent: 1000,
        }
    }
}

/// How the server treats connections (see the `serving` module).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServingConfig {
    /// A connection that has not sent the HTTP/2 preface within this time is closed.
    pub handshake_timeout_ms: u64,
    /// A connection with no call in flight for this long is closed (clients reconnect).
    pub idle_timeout_seconds: u64,
    /// After SIGTERM, calls in flight get this long to finish; then the server exits anyway.
    pub shutdown_grace_seconds: u64,
    /// Connections held at once (0: the open-file limit minus `reserved_descriptors`).
    pub max_connections: usize,
    /// Descriptors kept free for the database, the metrics endpoint and logs.
    pub reserved_descriptors: u64,
}

impl Default for ServingConfig {
    fn default() -> Self {
        ServingConfig {
            handshake_timeout_ms: 10_000,
            idle_timeout_seconds: 300,
            shutdown_grace_seconds: 30,
            max_connections: 0,
            reserved_descriptors: 64,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the Prometheus `/metrics` endpoint (plain HTTP, no auth: keep it on an
    /// internal interface); no endpoint when unset.
    pub listen: Option<SocketAddr>,
}

/// `[http]`: the standards endpoints (docs/standards.md). Agents call them with their bearer
/// tokens, so they are not on the metrics listener, which has no authentication and is meant
/// for an internal interface.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of the plain HTTP listener (put TLS in front of it off loopback).
    pub listen: Option<SocketAddr>,
    /// The base URL callers reach the listener at, as published in the metadata documents
    /// (behind a proxy: the proxy's URL). Unset: `http://` and the listen address.
    pub public_url: Option<String>,
    /// OpenID CIBA: the seconds a client waits between polls of the token endpoint (the
    /// `interval` of `/bc-authorize`'s answer). Unset: 5.
    pub poll_interval_seconds: Option<u32>,
    /// OpenID CIBA clients; none: `/bc-authorize` and `/token` refuse every client.
    pub clients: Vec<CibaClientConfig>,
}

/// One `[[http.clients]]` entry: an OpenID CIBA client, which acts for one agent with the
/// rights of an agent token bound to it. It authenticates with a secret
/// (`client_secret_basic`: `secret_env` or `secret_file`) or with a JWT signed by one of its
/// keys (`private_key_jwt`: `jwks` or `jwks_file`), or either.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CibaClientConfig {
    pub client_id: String,
    /// The agent id the client's approvals are asked for.
    pub agent: String,
    /// Environment variable that holds the client secret.
    pub secret_env: Option<String>,
    /// File that holds the client secret (surrounding whitespace is ignored).
    pub secret_file: Option<PathBuf>,
    /// The client's public keys as JSON: one JWK or a JWKS (`{"keys": [...]}`).
    pub jwks: Option<String>,
    /// File that holds the client's public keys, as `jwks`.
    pub jwks_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the server.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate.
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrantsConfig {
    /// How long a session grant approves later calls (0: until revoked).
    pub ttl_seconds: u32,
}

impl Default for GrantsConfig {
    fn default() -> Self {
        GrantsConfig {
            ttl_seconds: 8 * 3600,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Request, get, wait, cancel, consume and list the approvals of its agent ids.
    Agent,
    /// Watch, decide, record deliveries, get and list, on its channels.
    Worker,
    /// Everything, including the audit trail and grants.
    Admin,
}

/// One `[[tokens]]` entry. The secret comes from an environment variable or is given as its
/// SHA-256; it never appears in the file itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Names the token in logs and audit messages.
    pub name: String,
    pub role: Role,
    /// `agent` tokens: the agent ids it may act for (`"*"`: any).
    #[serde(default)]
    pub agents: Vec<String>,
    /// `worker` tokens: the channels it serves (`"*"`: any).
    #[serde(default)]
    pub channels: Vec<String>,
    /// Environment variable that holds the token.
    pub value_env: Option<String>,
    /// Hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
    pub sha256: Option<String>,
}

/// Where the data lives, as `database` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database<'a> {
    Sqlite(&'a Path),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(&'a str),
}

impl<'a> Database<'a> {
    pub fn of(database: &'a Path) -> Database<'a> {
        match database.to_str() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Database::Postgres(url)
            }
            _ => Database::Sqlite(database),
        }
    }
}

impl std::fmt::Display for Database<'_> {
    /// The database without the password a URL may carry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => match (url.find("://"), url.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    write!(f, "{}://…{}", &url[..scheme], &url[at..])
                }
                _ => f.write_str(url),
            },
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The request limits the domain validates against.
    pub fn request_limits(&self) -> Limits {
        Limits {
            max_arguments_bytes: self.limits.max_arguments_bytes,
            max_routes: self.limits.max_routes,
            max_labels: self.limits.max_labels,
            max_required_approvals: self.limits.max_required_approvals,
            min_ttl_seconds: self.approvals.min_ttl_seconds,
            max_ttl_seconds: self.approvals.max_ttl_seconds,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        refuse_open_listen(self.listen, self.tokens.is_empty())?;
        if let Some(listen) = self.http.listen {
            refuse_open_listen(listen, self.tokens.is_empty())?;
        }
        if let Some(url) = &self.http.public_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(ConfigError::Invalid(format!(
                    "http.public_url {url:?} must start with https:// or http://"
                )));
            }
        }
        if self.http.poll_interval_seconds == Some(0) {
            return Err(ConfigError::Invalid(
                "http.poll_interval_seconds must be at least 1".into(),
            ));
        }
        let s = &self.serving;
        if s.handshake_timeout_ms == 0
            || s.idle_timeout_seconds == 0
            || s.shutdown_grace_seconds == 0
        {
            return Err(ConfigError::Invalid(
                "serving.handshake_timeout_ms, serving.idle_timeout_seconds and serving.shutdown_grace_seconds must be positive".into(),
            ));
        }
        let a = &self.approvals;
        if a.min_ttl_seconds == 0 || a.min_ttl_seconds > a.max_ttl_seconds {
            return Err(ConfigError::Invalid(
                "approvals.min_ttl_seconds must be at least 1 and at most max_ttl_seconds".into(),
            ));
        }
        if a.default_ttl_seconds < a.min_ttl_seconds || a.default_ttl_seconds > a.max_ttl_seconds {
            return Err(ConfigError::Invalid(
                "approvals.default_ttl_seconds must lie between min_ttl_seconds and max_ttl_seconds"
                    .into(),
            ));
        }
        if a.max_wait_seconds == 0 || a.sweep_interval_ms == 0 || a.caller_grace_ms == 0 {
            return Err(ConfigError::Invalid(
                "approvals.max_wait_seconds, approvals.sweep_interval_ms and approvals.caller_grace_ms must be positive"
                    .into(),
            ));
        }
        if self.watch.heartbeat_interval_ms == 0 || self.watch.buffer_events == 0 {
            return Err(ConfigError::Invalid(
                "watch.heartbeat_interval_ms and watch.buffer_events must be positive".into(),
            ));
        }
        let relying_party = self.passkeys.relying_party()?;
        if let Some(rule) = self.rules.iter().find(|r| r.step_up.is_some()) {
            if relying_party.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "rule {:?} sets step_up: set passkeys.inbox_url (the web inbox's public URL), where approvers register and use their passkeys",
                    rule.name
                )));
            }
        }
        if self.storage.max_batch == 0 || self.storage.read_connections == 0 {
            return Err(ConfigError::Invalid(
                "storage.max_batch and storage.read_connections must be positive".into(),
            ));
        }
        Ok(())
    }

    /// `storage.backup_dir`, when set, must be a directory the server can create files in:
    /// checked at start-up (by creating and removing a file there), not found out by the first
    /// backup.
    pub fn check_backup_dir(&self) -> Result<(), ConfigError> {
        let Some(directory) = &self.storage.backup_dir else {
            return Ok(());
        };
        let refused = |problem: String| {
            ConfigError::Invalid(format!(
                "storage.backup_dir {}: {problem}; create it, writable by the server, or change storage.backup_dir",
                directory.display()
            ))
        };
        if !directory.is_dir() {
            return Err(refused("no such directory".into()));
        }
        // A name of its own each time (in a container the pid is the same at every start, and
        // a probe left by a crash would refuse every later start).
        let probe = directory.join(format!(
            ".countersign-write-check-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map_err(|e| refused(format!("cannot create a file in it ({e})")))?;
        std::fs::remove_file(&probe)
            .map_err(|e| refused(format!("cannot remove {} ({e})", probe.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(config.approvals.default_ttl_seconds, 3600);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_step_up_rule_needs_the_inbox_url_of_a_valid_relying_party() {
        let rule = "[[rules]]\nname = \"deploys\"\naction = \"require\"\nstep_up = \"passkey\"\n";
        let error = Config::parse(rule).unwrap().validate().unwrap_err();
        assert!(
            error.to_string().contains("set passkeys.inbox_url"),
            "{error}"
        );
        let on_ip = format!("[passkeys]\ninbox_url = \"http://127.0.0.1:8080\"\n\n{rule}");
        let error = Config::parse(&on_ip).unwrap().validate().unwrap_err();
        assert!(error.to_string().contains("IP address"), "{error}");
        let ok = format!("[passkeys]\ninbox_url = \"https://inbox.example.com\"\n\n{rule}");
        let config = Config::parse(&ok).unwrap();
        assert!(config.validate().is_ok());
        let rp = config.passkeys.relying_party().unwrap().unwrap();
        assert_eq!(
            (rp.id.as_str(), rp.origin.as_str()),
            ("inbox.example.com", "https://inbox.example.com")
        );
    }

    #[test]
    fn wal_checkpoints_and_the_backup_directory_are_read() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.storage.wal_checkpoints, WalCheckpoints::Server);
        assert_eq!(config.storage.backup_dir, None);
        let config = Config::parse(
            "[storage]\nwal_checkpoints = \"external\"\nbackup_dir = \"/var/backups/cs\"\n",
        )
        .unwrap();
        assert_eq!(config.storage.wal_checkpoints, WalCheckpoints::External);
        assert_eq!(
            config.storage.backup_dir,
            Some(PathBuf::from("/var/backups/cs"))
        );
        let err = Config::parse("[storage]\nwal_checkpoints = \"litestream\"\n").unwrap_err();
        assert!(err.contains("wal_checkpoints"), "{err}");
    }

    #[test]
    fn ciba_clients_are_read_and_a_zero_poll_interval_refused() {
        let config = Config::parse(
            "[http]\npoll_interval_seconds = 2\n[[http.clients]]\nclient_id = \"app\"\nagent = \"a\"\nsecret_env = \"S\"\n",
        )
        .unwrap();
        assert_eq!(config.http.poll_interval_seconds, Some(2));
        assert_eq!(config.http.clients[0].client_id, "app");
        let zero = Config::parse("[http]\npoll_interval_seconds = 0\n").unwrap();
        let err = zero.validate().unwrap_err().to_string();
        assert!(err.contains("http.poll_interval_seconds"), "{err}");
        let err = Config::parse("[[http.clients]]\nclient = \"x\"\n").unwrap_err();
        assert!(err.contains("client"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let err = Config::parse("[approvals]\ndefault_ttl = 5\n").unwrap_err();
        assert!(err.contains("default_ttl"), "{err}");
    }
}
