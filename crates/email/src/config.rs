//! Configuration: one TOML file; the worker token and the SMTP password come from the
//! environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//!
//! [email]
//! # The SMTP relay the mails go out through. Password: env COUNTERSIGN_SMTP_PASSWORD.
//! smtp_host = "smtp.example.com"
//! tls = "starttls"            # or "tls" (port 465), or "none" (a relay on loopback only)
//! username = "approvals@example.com"
//! from = "countersign <approvals@example.com>"
//! # Approvals routed to `email` without a target (or without any route) go here.
//! default_recipient = "alice@example.com"
//! # The decision-link pages the mails' links open (plain HTTP: put them behind a TLS proxy).
//! listen = "127.0.0.1:8789"
//! public_url = "https://approvals.example.com"
//! state_dir = "/var/lib/countersign/email"
//!
//! [[recipients]]
//! # Links in mails to this address decide as channel `email`, user id the address.
//! address = "alice@example.com"
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
use lettre::message::Mailbox;
use serde::Deserialize;

/// The environment variable holding the SMTP password.
pub const SMTP_PASSWORD_ENV: &str = "COUNTERSIGN_SMTP_PASSWORD";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub email: EmailSection,
    #[serde(default)]
    pub recipients: Vec<RecipientSection>,
    #[serde(default)]
    pub metrics: MetricsSection,
}

/// How the connection to the relay is protected.
#[derive(Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain connect, then STARTTLS before anything else (required: no fallback to plain).
    #[default]
    Starttls,
    /// TLS from the first byte (SMTPS, usually port 465).
    Tls,
    /// No encryption: only for a relay on this machine (loopback).
    None,
}

impl std::str::FromStr for TlsMode {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<TlsMode, ConfigError> {
        match text {
            "starttls" => Ok(TlsMode::Starttls),
            "tls" => Ok(TlsMode::Tls),
            "none" => Ok(TlsMode::None),
            other => Err(ConfigError::Invalid(format!(
                "tls {other:?}: use starttls, tls or none"
            ))),
        }
    }
}

impl TlsMode {
    pub fn default_port(self) -> u16 {
        match self {
            TlsMode::Starttls => 587,
            TlsMode::Tls => 465,
            TlsMode::None => 25,
        }
    }
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSection {
    pub smtp_host: String,
    /// By `tls`: 587, 465 or 25.
    pub smtp_port: Option<u16>,
    #[serde(default)]
    pub tls: TlsMode,
    /// A PEM file of a private CA the relay's certificate is checked against, beside
    /// Mozilla's roots.
    pub ca_file: Option<PathBuf>,
    pub username: Option<String>,
    /// The sender (`Name <address>`); its domain ends the Message-IDs.
    pub from: String,
    pub default_recipient: Option<String>,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How the approvers' browsers reach the decision-link pages (the links start with it);
    /// inside `countersign up`, by default where they listen.
    #[serde(default)]
    pub public_url: String,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// One SMTP session's limit per command (connect, each reply).
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The first pause after a failed send, doubling up to `max_retry_wait_ms`.
    #[serde(default = "defaults::retry_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "defaults::max_retry_wait_ms")]
    pub max_retry_wait_ms: u64,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecipientSection {
    /// The address; what routes name as their `email` target, and the user id its links
    /// decide as (channel `email`).
    pub address: String,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8789))
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-email-state")
}

/// Where and how the mails go out.
#[derive(Clone)]
pub struct Smtp {
    pub host: String,
    pub port: u16,
    pub tls: TlsMode,
    /// PEM of a private CA, read at start.
    pub ca_pem: Option<Vec<u8>>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub timeout: Duration,
}

/// Everything the worker needs, validated, secrets resolved.
#[derive(Clone)]
pub struct Settings {
    /// The server, `[metrics]` and retries; no cursor: every start reconciles with a
    /// snapshot, the store knows what was sent.
    pub runtime: RuntimeSettings,
    pub smtp: Smtp,
    pub from: Mailbox,
    /// The recipients' addresses, as configured (lowercased for routing).
    pub recipients: Vec<String>,
    pub default_recipient: Option<String>,
    pub listen: SocketAddr,
    pub public_url: String,
    pub state_dir: PathBuf,
}

/// Shows everything except the secrets.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("smtp_host", &self.smtp.host)
            .field("smtp_port", &self.smtp.port)
            .field("tls", &self.smtp.tls)
            .field("username", &self.smtp.username)
            .field(
                "password",
                &self.smtp.password.as_ref().map(|_| "<redacted>"),
            )
            .field("from", &self.from.to_string())
            .field("recipients", &self.recipients)
            .field("default_recipient", &self.default_recipient)
            .field("listen", &self.listen)
            .field("public_url", &self.public_url)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

/// Whether `host` names this machine (where an unencrypted relay is acceptable).
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A recipient address, checked (one plain address, no display name) and lowercased.
pub fn recipient_address(text: &str) -> Result<String, ConfigError> {
    let address: lettre::Address = text.trim().parse().map_err(|_| {
        ConfigError::Invalid(format!("{text:?} is not an email address (name@domain)"))
    })?;
    Ok(address.to_string().to_lowercase())
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            email,
            recipients,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection::from_millis(email.retry_interval_ms, email.max_retry_wait_ms),
        )?;
        let tls = email.tls;
        if email.smtp_host.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "email.smtp_host is empty: name the SMTP relay".to_owned(),
            ));
        }
        if tls == TlsMode::None && !is_loopback(&email.smtp_host) {
            return Err(ConfigError::Invalid(format!(
                "email.tls = \"none\" sends the password and the decision links unencrypted: only a relay on loopback may be used so, not {:?} (use \"starttls\" or \"tls\")",
                email.smtp_host
            )));
        }
        let from: Mailbox = email.from.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "email.from {:?} is not a sender (name@domain, or Name <name@domain>)",
                email.from
            ))
        })?;
        if !email.public_url.starts_with("http://") && !email.public_url.starts_with("https://") {
            return Err(ConfigError::Invalid(
                "email.public_url (how browsers reach the decision links, e.g. https://approvals.example.com) must start with http:// or https://".to_owned(),
            ));
        }
        let ca_pem = match &email.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|error| {
                ConfigError::Invalid(format!("email.ca_file {}: {error}", path.display()))
            })?),
            None => None,
        };
        let password = env(SMTP_PASSWORD_ENV);
        if password.is_some() != email.username.is_some() {
            return Err(ConfigError::Invalid(format!(
                "email.username and {SMTP_PASSWORD_ENV} go together: set both, or neither for a relay that needs no login"
            )));
        }
        let mut seen = HashSet::new();
        let mut addresses = Vec::new();
        for recipient in recipients {
            let address = recipient_address(&recipient.address)?;
            if !seen.insert(address.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "recipient {address:?} is configured twice"
                )));
            }
            addresses.push(address);
        }
        if addresses.is_empty() {
            return Err(ConfigError::Invalid(
                "no recipients: add a [[recipients]] section with the approver's address"
                    .to_owned(),
            ));
        }
        let default_recipient = match &email.default_recipient {
            Some(text) => {
                let address = recipient_address(text)?;
                if !seen.contains(&address) {
                    return Err(ConfigError::Invalid(format!(
                        "email.default_recipient names {address:?}, which is not a [[recipients]] entry"
                    )));
                }
                Some(address)
            }
            None => None,
        };
        Ok(Settings {
            runtime,
            smtp: Smtp {
                port: email.smtp_port.unwrap_or(tls.default_port()),
                host: email.smtp_host,
                tls,
                ca_pem,
                username: email.username,
                password,
                timeout: Duration::from_millis(email.request_timeout_ms),
            },
            from,
            recipients: addresses,
            default_recipient,
            listen: email.listen,
            public_url: email.public_url.trim_end_matches('/').to_owned(),
            state_dir: email.state_dir,
        })
    }
}

impl Settings {
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("email.db")
    }

    /// The configured recipient `target` names (case aside).
    pub fn recipient(&self, target: &str) -> Option<&String> {
        let target = target.trim().to_lowercase();
        self.recipients.iter().find(|address| **address == target)
    }

    /// The domain the Message-IDs end with: the sender's.
    pub fn message_id_domain(&self) -> &str {
        self.from.email.domain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "[server]\nurl = \"http://127.0.0.1:1\"\ntoken = \"file-token\"\n[email]\nsmtp_host = \"smtp.example.com\"\nusername = \"approvals\"\nfrom = \"countersign <approvals@example.com>\"\npublic_url = \"https://a.example/\"\ndefault_recipient = \"Alice@Example.com\"\n[[recipients]]\naddress = \"alice@example.com\"\n[[recipients]]\naddress = \"bob@example.com\"\n";

    fn parse(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    fn env(name: &str) -> Option<String> {
        match name {
            SMTP_PASSWORD_ENV => Some("smtp-secret".to_owned()),
            WORKER_TOKEN_ENV => Some("env-worker".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn the_readme_table_gives_each_key_its_default() {
        let documented =
            countersign_testkit::docs::table_defaults(include_str!("../README.md"), "email.");
        let email = parse(CONFIG).email;
        let shown = |value: Option<String>| value.unwrap_or_else(|| "—".to_owned());
        let actual = [
            ("smtp_host", "—".to_owned()),
            (
                "smtp_port",
                shown(parse(CONFIG).email.smtp_port.map(|p| p.to_string())),
            ),
            ("tls", "starttls".to_owned()),
            (
                "ca_file",
                shown(email.ca_file.map(|p| p.display().to_string())),
            ),
            ("username", "—".to_owned()),
            ("from", "—".to_owned()),
            ("default_recipient", "—".to_owned()),
            ("public_url", "—".to_owned()),
            ("listen", email.listen.to_string()),
            ("state_dir", email.state_dir.display().to_string()),
            ("request_timeout_ms", email.request_timeout_ms.to_string()),
            ("retry_interval_ms", email.retry_interval_ms.to_string()),
            ("max_retry_wait_ms", email.max_retry_wait_ms.to_string()),
        ];
        assert_eq!(email.tls, TlsMode::Starttls);
        let actual: Vec<(String, String)> = actual
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        assert_eq!(documented, actual);
    }

    #[test]
    fn the_example_configuration_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../config/email.example.toml");
        let file: FileConfig = countersign_worker::config::read_toml(&path).unwrap();
        let settings = Settings::from_file(file, env).unwrap();
        assert_eq!(
            settings.default_recipient.as_deref(),
            Some("alice@example.com")
        );
        assert_eq!(settings.smtp.port, 587);
    }

    #[test]
    fn a_file_is_read_and_secrets_come_from_the_environment() {
        let settings = Settings::from_file(parse(CONFIG), env).unwrap();
        assert_eq!(settings.smtp.port, 587);
        assert_eq!(settings.smtp.tls, TlsMode::Starttls);
        assert_eq!(settings.public_url, "https://a.example");
        assert_eq!(
            settings.default_recipient.as_deref(),
            Some("alice@example.com")
        );
        assert_eq!(
            settings.recipient("BOB@example.com").unwrap(),
            "bob@example.com"
        );
        assert_eq!(settings.message_id_domain(), "example.com");
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("smtp-secret") && !shown.contains("env-worker"),
            "{shown}"
        );
    }

    #[test]
    fn mistakes_are_refused_naming_what_is_wrong() {
        let refused = |text: &str| {
            Settings::from_file(parse(text), env)
                .unwrap_err()
                .to_string()
        };
        let plain_remote = CONFIG.replace("[email]\n", "[email]\ntls = \"none\"\n");
        assert!(refused(&plain_remote).contains("loopback"));
        let plain_local = plain_remote.replace("smtp.example.com", "127.0.0.1");
        assert!(Settings::from_file(parse(&plain_local), env).is_ok());
        let bad_tls: Result<FileConfig, _> =
            toml::from_str(&CONFIG.replace("[email]\n", "[email]\ntls = \"ssl\"\n"));
        assert!(bad_tls.unwrap_err().to_string().contains("ssl"));
        let bad_address = CONFIG.replace("bob@example.com", "bob at example");
        assert!(refused(&bad_address).contains("bob at example"));
        let unknown_default = CONFIG.replace("Alice@Example.com", "carol@example.com");
        assert!(refused(&unknown_default).contains("default_recipient"));
        let no_password = Settings::from_file(parse(CONFIG), |_| None)
            .unwrap_err()
            .to_string();
        assert!(no_password.contains(SMTP_PASSWORD_ENV), "{no_password}");
    }
}
