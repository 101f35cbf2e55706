//! The local instance that `countersign up` runs: where its configuration, its data and its
//! generated secrets live, and how the other commands find it.
//!
//! - configuration: `$XDG_CONFIG_HOME/countersign/countersign.toml` (`~/.config/...`), or the
//!   file `--config` names; no secret is ever written into it;
//! - data: `$XDG_DATA_HOME/countersign` (`~/.local/share/countersign`): the SQLite database,
//!   the workers' state, the address of the last `up` (`server-url`) and, under `secrets/`
//!   (mode 0700), one file per secret (mode 0600): the tokens the pieces use to talk to each
//!   other, generated on first start, and the bot token `setup telegram` was given;
//! - cache: `$XDG_CACHE_HOME/countersign` (`~/.cache/countersign`): the pinned receipt key
//!   set (`receipt-keys/<pin>.jwks.json`), so that a hook does not read it on every call.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use countersign_discord::config::DiscordSection;
use countersign_email::config::{EmailSection, RecipientSection};
use countersign_github::config::FileConfig as GitHubFile;
use countersign_ntfy::config::{NtfySection, TopicSection};
use countersign_server::config::Config as ServerConfig;
use countersign_slack::config::SlackSection;
use countersign_telegram::config::TelegramSection;
use countersign_webhook::config::FileConfig as WebhookFile;
use rand::RngCore;

use crate::exit::CliError;

/// The config file's name in the configuration directory.
const CONFIG_FILE: &str = "countersign.toml";

/// A token `up` generates for the pieces to talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The in-process channel workers' (role worker).
    Worker,
    /// Installed hooks' and `countersign mcp`'s (role agent).
    Agent,
    /// The local command line's (role admin: list, approve, reject, doctor...).
    Admin,
}

impl Token {
    pub const ALL: [Token; 3] = [Token::Worker, Token::Agent, Token::Admin];

    /// The name the server gives the token in its logs and audit trail.
    pub fn name(self) -> &'static str {
        match self {
            Token::Worker => "up-workers",
            Token::Agent => "up-agents",
            Token::Admin => "up-cli",
        }
    }
}

/// A secret of the local instance, kept in a file only its owner can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secret {
    Token(Token),
    /// The Telegram bot token `setup telegram` was given.
    TelegramBotToken,
    /// The GitHub token `setup github` was given.
    GitHubToken,
    /// The SMTP password `setup email` was given.
    SmtpPassword,
    /// The Discord bot token `setup discord` was given.
    DiscordBotToken,
    /// The Slack bot token (`xoxb-`) `setup slack` was given.
    SlackBotToken,
    /// The Slack app-level token (`xapp-`) `setup slack` was given.
    SlackAppToken,
}

impl Secret {
    fn file_name(self) -> &'static str {
        match self {
            Secret::Token(Token::Worker) => "worker-token",
            Secret::Token(Token::Agent) => "agent-token",
            Secret::Token(Token::Admin) => "admin-token",
            Secret::TelegramBotToken => "telegram-bot-token",
            Secret::GitHubToken => "github-token",
            Secret::SmtpPassword => "smtp-password",
            Secret::DiscordBotToken => "discord-bot-token",
            Secret::SlackBotToken => "slack-bot-token",
            Secret::SlackAppToken => "slack-app-token",
        }
    }
}

/// Where the local instance keeps its files.
#[derive(Debug, Clone)]
pub struct Instance {
    pub config_file: PathBuf,
    pub data_dir: PathBuf,
}

impl Instance {
    /// The instance of this user: `config` or the default config file, and the data directory.
    pub fn locate(config: Option<&Path>) -> Result<Instance, CliError> {
        let config_file = match config {
            Some(path) => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            None => xdg_dir("XDG_CONFIG_HOME", ".config")?
                .join("countersign")
                .join(CONFIG_FILE),
        };
        let data_dir = xdg_dir("XDG_DATA_HOME", ".local/share")?.join("countersign");
        Ok(Instance {
            config_file,
            data_dir,
        })
    }

    pub fn secret_path(&self, secret: Secret) -> PathBuf {
        self.data_dir.join("secrets").join(secret.file_name())
    }

    /// The file in which `up` records the URL its server listens on.
    fn server_url_path(&self) -> PathBuf {
        self.data_dir.join("server-url")
    }

    /// The URL of the server the last `up` started, if one ever started.
    pub fn server_url(&self) -> Option<String> {
        std::fs::read_to_string(self.server_url_path())
            .ok()
            .map(|url| url.trim().to_owned())
            .filter(|url| !url.is_empty())
    }

    pub fn record_server_url(&self, url: &str) -> Result<(), CliError> {
        std::fs::create_dir_all(&self.data_dir)
            .map_err(|error| write_error(&self.data_dir, &error))?;
        replace_file(&self.server_url_path(), format!("{url}\n").as_bytes(), None)
    }

    /// The secret's value; `None` when its file does not exist.
    pub fn read_secret(&self, secret: Secret) -> Result<Option<String>, CliError> {
        let path = self.secret_path(secret);
        match std::fs::read_to_string(&path) {
            Ok(value) => Ok(Some(value.trim().to_owned()).filter(|value| !value.is_empty())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(CliError::Failure(format!(
                "cannot read {}: {error}",
                path.display()
            ))),
        }
    }

    /// The secret, generated (32 random bytes, hex) when its file does not exist yet.
    pub fn ensure_token(&self, token: Token) -> Result<String, CliError> {
        let secret = Secret::Token(token);
        if let Some(token) = self.read_secret(secret)? {
            return Ok(token);
        }
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let token = hex::encode(bytes);
        self.write_secret(secret, &token)?;
        Ok(token)
    }

    /// Writes the secret's file (mode 0600, in a directory of mode 0700), replacing it whole.
    pub fn write_secret(&self, secret: Secret, value: &str) -> Result<(), CliError> {
        let path = self.secret_path(secret);
        let dir = path.parent().unwrap_or(&self.data_dir);
        create_private_dir(dir)?;
        replace_file(&path, format!("{value}\n").as_bytes(), Some(0o600))
    }
}

/// The config file of the local instance: the top-level keys are countersign-server's
/// (docs/configuration.md), beside one section per channel worker, as in the workers' own
/// files: `[telegram]`, `[ntfy]` (its `topics` a list in it), `[slack]`, `[github]` (its `[webhook]` and
/// `[polling]` as `[github.webhook]` and `[github.polling]`), `[webhook]` (its `[[endpoints]]`
/// as `[[webhook.endpoints]]`) and `[web]` (the web inbox's top-level keys and `[sign_in]`).
pub struct InstanceConfig {
    pub server: ServerConfig,
    /// The `[telegram]` section, when there is one.
    pub telegram: Option<TelegramSection>,
    /// The `[ntfy]` section and its topics, when there is one.
    pub ntfy: Option<(NtfySection, Vec<TopicSection>)>,
    /// The `[slack]` section, when there is one.
    pub slack: Option<SlackSection>,
    /// The `[discord]` section, when there is one.
    pub discord: Option<DiscordSection>,
    /// The GitHub worker's file, from `[github]`; its `server` is left for `up` to fill in.
    pub github: Option<GitHubFile>,
    /// The webhook worker's file, from `[webhook]`; its `server` is left for `up` to fill in.
    pub webhook: Option<WebhookFile>,
    /// The `[web]` section; it becomes the web inbox's file once `up` adds the server.
    pub web: Option<toml::Table>,
    /// The `[email]` section and its `[[email.recipients]]`, when there is one.
    pub email: Option<(EmailSection, Vec<RecipientSection>)>,
    /// The `[notify]` section: the quiet hours of `notify`'s notices.
    pub notify: crate::notify_config::NotifySection,
    /// False when the file does not exist (the defaults apply).
    pub exists: bool,
}

impl Instance {
    /// Reads the config file; a missing file gives the defaults. Relative to the data
    /// directory: the database (unless `database` is set) and the workers' state.
    pub fn load_config(&self) -> Result<InstanceConfig, CliError> {
        let path = &self.config_file;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(CliError::Usage(format!(
                    "cannot read config file {}: {error}",
                    path.display()
                )))
            }
        };
        let invalid =
            |message: String| CliError::Usage(format!("config file {}: {message}", path.display()));
        let mut table: toml::Table = match &text {
            Some(text) => toml::from_str(text).map_err(|error| invalid(error.to_string()))?,
            None => toml::Table::new(),
        };
        let telegram = match self.worker_section(&mut table, "telegram", &invalid)? {
            None => None,
            Some(section) => Some(section_as(section, "telegram", &invalid)?),
        };
        let ntfy = match self.worker_section(&mut table, "ntfy", &invalid)? {
            None => None,
            Some(mut section) => {
                let topics = take_part(&mut section, "ntfy", "topics", &invalid)?;
                Some((
                    section_as(section, "ntfy", &invalid)?,
                    topics.unwrap_or_default(),
                ))
            }
        };
        let slack = match self.worker_section(&mut table, "slack", &invalid)? {
            None => None,
            Some(section) => Some(section_as(section, "slack", &invalid)?),
        };
        let discord = match self.worker_section(&mut table, "discord", &invalid)? {
            None => None,
            Some(section) => Some(section_as(section, "discord", &invalid)?),
        };
        let github = match self.worker_section(&mut table, "github", &invalid)? {
            None => None,
            Some(mut section) => Some(GitHubFile {
                server: Default::default(),
                webhook: take_part(&mut section, "github", "webhook", &invalid)?,
                polling: take_part(&mut section, "github", "polling", &invalid)?,
                github: section_as(section, "github", &invalid)?,
                // `[metrics]` here is the server's (see channels.rs).
                metrics: Default::default(),
            }),
        };
        let webhook = match self.worker_section(&mut table, "webhook", &invalid)? {
            None => None,
            Some(mut section) => Some(WebhookFile {
                server: Default::default(),
                endpoints: take_part(&mut section, "webhook", "endpoints", &invalid)?
                    .unwrap_or_default(),
                webhook: section_as(section, "webhook", &invalid)?,
                // `[metrics]` here is the server's (see channels.rs).
                metrics: Default::default(),
            }),
        };
        let web = self.worker_section(&mut table, "web", &invalid)?;
        let email = match self.worker_section(&mut table, "email", &invalid)? {
            None => None,
            Some(mut section) => {
                let recipients = take_part(&mut section, "email", "recipients", &invalid)?;
                Some((
                    section_as(section, "email", &invalid)?,
                    recipients.unwrap_or_default(),
                ))
            }
        };
        let notify: crate::notify_config::NotifySection = match table.remove("notify") {
            None => Default::default(),
            Some(toml::Value::Table(section)) => section_as(section, "notify", &invalid)?,
            Some(_) => return Err(invalid("notify is not a table".into())),
        };
        notify.quiet_hours().map_err(&invalid)?;
        let database_set = table.contains_key("database");
        let mut server = ServerConfig::parse(&table.to_string()).map_err(invalid)?;
        if !database_set {
            server.database = self.data_dir.join("countersign.db");
        }
        // The receipt signing keys live with the other generated secrets.
        if server.receipts.keys_dir.is_none() {
            server.receipts.keys_dir = Some(self.data_dir.join("secrets"));
        }
        Ok(InstanceConfig {
            server,
            telegram,
            ntfy,
            slack,
            discord,
            github,
            webhook,
            web,
            email,
            notify,
            exists: text.is_some(),
        })
    }

    /// A channel worker's section of the config file, taken out of `table`, its `state_dir`
    /// under the data directory unless set.
    fn worker_section(
        &self,
        table: &mut toml::Table,
        name: &str,
        invalid: &impl Fn(String) -> CliError,
    ) -> Result<Option<toml::Table>, CliError> {
        match table.remove(name) {
            None => Ok(None),
            Some(toml::Value::Table(mut section)) => {
                section.entry("state_dir").or_insert_with(|| {
                    toml::Value::String(self.data_dir.join(name).to_string_lossy().into_owned())
                });
                Ok(Some(section))
            }
            Some(_) => Err(invalid(format!("{name} is not a table"))),
        }
    }
}

/// The URL this machine's clients reach a listener at (loopback for a wildcard address).
pub fn local_url(listen: SocketAddr) -> String {
    let mut address = listen;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{address}")
}

/// A worker's section as the type its own file has for it.
fn section_as<T: serde::de::DeserializeOwned>(
    section: toml::Table,
    name: &str,
    invalid: &impl Fn(String) -> CliError,
) -> Result<T, CliError> {
    toml::Value::Table(section)
        .try_into()
        .map_err(|error| invalid(format!("[{name}]: {error}")))
}

/// The part `<name>` of a worker's section (a sub-table or a list), taken out of it.
fn take_part<T: serde::de::DeserializeOwned>(
    section: &mut toml::Table,
    section_name: &str,
    name: &str,
    invalid: &impl Fn(String) -> CliError,
) -> Result<Option<T>, CliError> {
    section
        .remove(name)
        .map(|value| {
            value
                .try_into()
                .map_err(|error| invalid(format!("[{section_name}] {name}: {error}")))
        })
        .transpose()
}

/// `$<variable>`, else `$HOME/<fallback>`.
/// Where the pinned receipt key set is kept between hook calls; `None` without a home.
pub fn receipt_key_cache() -> Option<PathBuf> {
    xdg_dir("XDG_CACHE_HOME", ".cache")
        .ok()
        .map(|dir| dir.join("countersign").join("receipt-keys"))
}

fn xdg_dir(variable: &str, fallback: &str) -> Result<PathBuf, CliError> {
    if let Some(dir) = std::env::var_os(variable).filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(fallback))
        .ok_or_else(|| {
            CliError::Usage(format!(
                "neither ${variable} nor $HOME is set: cannot tell where the local instance lives"
            ))
        })
}

pub fn create_private_dir(dir: &Path) -> Result<(), CliError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .map_err(|error| write_error(dir, &error))
}

/// Writes `contents` next to `path` and renames it over `path`, so that no reader sees half a
/// file; `mode` is set on creation (a secret is never readable by others, not even briefly).
pub fn replace_file(path: &Path, contents: &[u8], mode: Option<u32>) -> Result<(), CliError> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let partial = path.with_file_name(format!(".{name}.partial"));
    let _ = std::fs::remove_file(&partial);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if let Some(mode) = mode {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let written = options.open(&partial).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()
    });
    written.map_err(|error| write_error(&partial, &error))?;
    std::fs::rename(&partial, path).map_err(|error| write_error(path, &error))
}

fn write_error(path: &Path, error: &std::io::Error) -> CliError {
    CliError::Failure(format!("cannot write {}: {error}", path.display()))
}

/// The permission bits others have on `path` (group and world), when it exists.
#[cfg(unix)]
pub fn open_to_others(path: &Path) -> Option<bool> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .ok()
        .map(|metadata| metadata.permissions().mode() & 0o077 != 0)
}

#[cfg(not(unix))]
pub fn open_to_others(path: &Path) -> Option<bool> {
    path.exists().then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let instance = Instance {
            config_file: dir.path().join("countersign.toml"),
            data_dir: dir.path().join("data"),
        };
        let token = instance.ensure_token(Token::Agent).unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(instance.ensure_token(Token::Agent).unwrap(), token);
        assert_ne!(instance.ensure_token(Token::Worker).unwrap(), token);
        let path = instance.secret_path(Secret::Token(Token::Agent));
        assert_eq!(open_to_others(&path), Some(false));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&path), 0o600);
            assert_eq!(mode(path.parent().unwrap()), 0o700);
        }
    }
}
