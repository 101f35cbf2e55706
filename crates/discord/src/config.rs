//! Configuration: one TOML file; the bot token and the worker token come from the
//! environment.
//!
//! ```toml
//! [server]
//! url = "http://127.0.0.1:50051"
//! # token: env COUNTERSIGN_WORKER_TOKEN
//!
//! [discord]
//! # Bot token: env DISCORD_BOT_TOKEN.
//! # The channels approvals may be posted in (their ids); routes name one as their target.
//! channels = ["1234567890123456789"]
//! default_channel = "1234567890123456789"
//! state_dir = "/var/lib/countersign/discord"
//! # How taps arrive: "gateway" (the default: no public URL) or "http" (Discord POSTs them to
//! # the Interactions Endpoint URL, served on `listen`, signed with the application's key).
//! interactions = "gateway"
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
use ed25519_dalek::VerifyingKey;
use serde::Deserialize;

/// The bot token (Developer Portal → the application → Bot → Reset Token).
pub const BOT_TOKEN_ENV: &str = "DISCORD_BOT_TOKEN";
/// Discord's REST API, version 10.
pub const DISCORD_API_URL: &str = "https://discord.com/api/v10";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: ServerSection,
    pub discord: DiscordSection,
    #[serde(default)]
    pub metrics: MetricsSection,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscordSection {
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// The Gateway's WebSocket URL; `None`: Discord's own (a test points it at a fake).
    pub gateway_url: Option<String>,
    pub channels: Vec<String>,
    pub default_channel: Option<String>,
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub interactions: Mode,
    /// Where HTTP mode serves Discord's requests (put it behind a TLS proxy).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The application's public key (hex; Developer Portal → General Information).
    pub public_key: Option<String>,
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    #[serde(default = "defaults::retry_interval_ms")]
    pub retry_interval_ms: u64,
    #[serde(default = "defaults::max_retry_wait_ms")]
    pub max_retry_wait_ms: u64,
}

/// How approvers' taps reach the worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// INTERACTION_CREATE over the Gateway: the worker connects to Discord (no public URL).
    #[default]
    Gateway,
    /// Discord POSTs interactions to the worker's Interactions Endpoint URL.
    Http,
}

/// Where taps come from.
#[derive(Clone, Debug)]
pub enum Taps {
    Gateway,
    Http {
        listen: SocketAddr,
        /// The application's Ed25519 public key, which checks every request's signature
        /// (boxed: a decompressed point is large).
        public_key: Box<VerifyingKey>,
    },
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8790))
}
fn default_api_url() -> String {
    DISCORD_API_URL.to_owned()
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("countersign-discord-state")
}

/// Everything the worker needs, validated, the token resolved.
#[derive(Clone)]
pub struct Settings {
    pub runtime: RuntimeSettings,
    pub api_url: String,
    pub gateway_url: Option<String>,
    pub bot_token: String,
    pub channels: Vec<String>,
    pub default_channel: Option<String>,
    pub state_dir: PathBuf,
    pub taps: Taps,
    pub request_timeout: Duration,
}

/// Shows everything except the tokens.
impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("runtime", &self.runtime)
            .field("api_url", &self.api_url)
            .field("gateway_url", &self.gateway_url)
            .field("channels", &self.channels)
            .field("default_channel", &self.default_channel)
            .field("state_dir", &self.state_dir)
            .field("taps", &self.taps)
            .finish_non_exhaustive()
    }
}

/// A Discord id (a snowflake): digits only.
pub fn is_snowflake(id: &str) -> bool {
    (1..=20).contains(&id.len()) && id.chars().all(|c| c.is_ascii_digit())
}

/// An Ed25519 public key written as 64 hex digits.
fn public_key(hex_digits: &str) -> Option<Box<VerifyingKey>> {
    let bytes = hex::decode(hex_digits).ok()?.try_into().ok()?;
    VerifyingKey::from_bytes(&bytes).ok().map(Box::new)
}

impl WorkerSettings for Settings {
    type File = FileConfig;

    fn from_file(
        file: FileConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let FileConfig {
            server,
            discord,
            metrics,
        } = file;
        let runtime = RuntimeSettings::from_sections(
            server,
            env(WORKER_TOKEN_ENV),
            metrics,
            RuntimeSection::from_millis(discord.retry_interval_ms, discord.max_retry_wait_ms),
        )?;
        let bot_token = env(BOT_TOKEN_ENV).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "{BOT_TOKEN_ENV} is not set: export the Discord application's bot token"
            ))
        })?;
        let url = |url: &str, schemes: [&str; 2]| schemes.iter().any(|s| url.starts_with(s));
        if !url(&discord.api_url, ["http://", "https://"]) {
            return Err(ConfigError::Invalid(
                "discord.api_url must start with http:// or https://".to_owned(),
            ));
        }
        if let Some(gateway) = &discord.gateway_url {
            if !url(gateway, ["ws://", "wss://"]) {
                return Err(ConfigError::Invalid(
                    "discord.gateway_url must start with ws:// or wss://".to_owned(),
                ));
            }
        }
        let taps = match (discord.interactions, &discord.public_key) {
            (Mode::Gateway, None) => Taps::Gateway,
            (Mode::Gateway, Some(_)) => {
                return Err(ConfigError::Invalid(
                    "discord.public_key is set but discord.interactions is not \"http\"".to_owned(),
                ))
            }
            (Mode::Http, key) => Taps::Http {
                listen: discord.listen,
                public_key: key.as_deref().and_then(public_key).ok_or_else(|| {
                    ConfigError::Invalid(
                        "discord.interactions = \"http\" needs discord.public_key: the \
                         application's public key (64 hex digits, Developer Portal → General \
                         Information)"
                            .to_owned(),
                    )
                })?,
            },
        };
        let mut seen = HashSet::new();
        for id in &discord.channels {
            if !is_snowflake(id) || !seen.insert(id) {
                return Err(ConfigError::Invalid(format!(
                    "discord.channels: {id:?} is not a channel id (digits; Discord shows it with \
                     Developer Mode on, Copy Channel ID) or is listed twice"
                )));
            }
        }
        if discord.channels.is_empty() {
            return Err(ConfigError::Invalid(
                "discord.channels is empty: list the ids of the channels approvals go to (or run \
                 `countersign setup discord`)"
                    .to_owned(),
            ));
        }
        if let Some(default) = &discord.default_channel {
            if !seen.contains(default) {
                return Err(ConfigError::Invalid(format!(
                    "discord.default_channel names {default:?}, which is not in discord.channels"
                )));
            }
        }
        Ok(Settings {
            runtime,
            api_url: discord.api_url.trim_end_matches('/').to_owned(),
            gateway_url: discord.gateway_url,
            bot_token,
            channels: discord.channels,
            default_channel: discord.default_channel,
            state_dir: discord.state_dir,
            taps,
            request_timeout: Duration::from_millis(discord.request_timeout_ms.max(1)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "[server]\nurl = \"http://127.0.0.1:1\"\n[discord]\nchannels = [\"111\", \"222\"]\ndefault_channel = \"111\"\n";

    fn env(name: &str) -> Option<String> {
        (name == BOT_TOKEN_ENV).then(|| "secret-bot-token".to_owned())
    }

    fn refused(text: &str, env: impl Fn(&str) -> Option<String>) -> String {
        Settings::from_file(toml::from_str(text).unwrap(), env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_file_is_read_and_the_token_is_never_shown() {
        let settings = Settings::from_file(toml::from_str(CONFIG).unwrap(), env).unwrap();
        assert_eq!(settings.api_url, DISCORD_API_URL);
        assert!(!format!("{settings:?}").contains("secret"));
    }

    #[test]
    fn the_readme_table_gives_each_key_its_default() {
        let documented =
            countersign_testkit::docs::table_defaults(include_str!("../README.md"), "discord.");
        let file: FileConfig = toml::from_str(CONFIG).unwrap();
        let discord = file.discord;
        let actual = [
            ("channels", "—".to_owned()),
            ("default_channel", "—".to_owned()),
            ("state_dir", discord.state_dir.display().to_string()),
            ("api_url", discord.api_url),
            ("gateway_url", "—".to_owned()),
            (
                "interactions",
                format!("{:?}", discord.interactions).to_lowercase(),
            ),
            ("listen", discord.listen.to_string()),
            ("public_key", "—".to_owned()),
            ("request_timeout_ms", discord.request_timeout_ms.to_string()),
            ("retry_interval_ms", discord.retry_interval_ms.to_string()),
            ("max_retry_wait_ms", discord.max_retry_wait_ms.to_string()),
        ];
        let actual: Vec<(String, String)> = actual
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        assert_eq!(documented, actual);
    }

    #[test]
    fn the_example_configuration_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../config/discord.example.toml");
        let file = countersign_worker::config::read_toml(&path).unwrap();
        let settings = Settings::from_file(file, env).unwrap();
        assert_eq!(
            settings.default_channel.as_deref(),
            Some("1234567890123456789")
        );
    }

    #[test]
    fn mistakes_are_refused_naming_what_is_wrong() {
        assert!(refused(CONFIG, |_| None).contains(BOT_TOKEN_ENV));
        assert!(refused(&CONFIG.replace("\"222\"", "\"#ops\""), env).contains("#ops"));
        assert!(refused(&CONFIG.replace("\"111\"\n", "\"333\"\n"), env).contains("333"));
        let typo: Result<FileConfig, _> = toml::from_str(&CONFIG.replace("channels", "chanels"));
        assert!(typo.unwrap_err().to_string().contains("chanels"));
        let http = CONFIG.replace("[discord]\n", "[discord]\ninteractions = \"http\"\n");
        assert!(refused(&http, env).contains("public_key"));
        let short_key = http.replace("[discord]\n", "[discord]\npublic_key = \"abcd\"\n");
        assert!(refused(&short_key, env).contains("64 hex digits"));
        let key_for_gateway = CONFIG.replace(
            "[discord]\n",
            &format!("[discord]\npublic_key = \"{}\"\n", "ab".repeat(32)),
        );
        assert!(refused(&key_for_gateway, env).contains("interactions"));
    }

    #[test]
    fn http_interactions_take_the_public_key() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key();
        let http = CONFIG.replace(
            "[discord]\n",
            &format!(
                "[discord]\ninteractions = \"http\"\npublic_key = \"{}\"\n",
                hex::encode(key.as_bytes())
            ),
        );
        let settings = Settings::from_file(toml::from_str(&http).unwrap(), env).unwrap();
        assert!(matches!(settings.taps, Taps::Http { public_key, .. } if *public_key == key));
    }
}
