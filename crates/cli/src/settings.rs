//! Settings from flags, environment variables and the optional TOML config file, in that order
//! of precedence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use countersign_client::{pb, Client, ClientConfig, ClientError};
use serde::Deserialize;

use clap::Subcommand;

use crate::args::{Cli, Command, Risk};
use crate::exit::CliError;
use crate::instance::{Instance, Secret, Token};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";
pub const DEFAULT_AGENT_ID: &str = "countersign-cli";

/// The config file (`--config` / `COUNTERSIGN_CONFIG`). Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub server: Option<String>,
    /// Prefer `COUNTERSIGN_TOKEN`; a token in a file must be readable only by its owner.
    pub token: Option<String>,
    /// Relative paths are relative to the config file.
    pub ca_cert: Option<PathBuf>,
    pub agent_id: Option<String>,
    /// Who `approve` / `reject` decide as.
    pub user: Option<String>,
    /// Hooks and MCP: the risk of a tool (`Bash = "high"`; a name may end in `*`).
    #[serde(default)]
    pub tool_risk: BTreeMap<String, Risk>,
    /// The receipt key set's fingerprint decision receipts are checked against.
    pub receipt_pin: Option<String>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            CliError::Usage(format!(
                "cannot read config file {}: {error}",
                path.display()
            ))
        })?;
        let mut config: FileConfig = toml::from_str(&text)
            .map_err(|error| CliError::Usage(format!("config file {}: {error}", path.display())))?;
        if let (Some(ca_cert), Some(dir)) = (&config.ca_cert, path.parent()) {
            config.ca_cert = Some(dir.join(ca_cert));
        }
        Ok(config)
    }
}

/// Everything the subcommands need besides their own arguments.
#[derive(Debug, Clone)]
pub struct Settings {
    pub client: ClientConfig,
    pub agent_id: Option<String>,
    pub user: Option<String>,
    pub tool_risk: BTreeMap<String, Risk>,
    /// Decision receipts must chain to the key set with this fingerprint; `None`: the key set
    /// the server serves.
    pub receipt_pin: Option<String>,
}

impl Settings {
    /// A client of the configured server that checks decision receipts against the pin, with
    /// the pinned key set kept in the user's cache directory.
    pub fn connect(&self) -> Result<Client, ClientError> {
        let client =
            Client::connect(self.client.clone())?.with_receipt_pin(self.receipt_pin.clone());
        Ok(match crate::instance::receipt_key_cache() {
            Some(dir) => client.with_receipt_key_cache(&dir),
            None => client,
        })
    }

    /// The settings of command line `cli`; `local_token`: the local instance's token it uses
    /// when no server is named ([`Settings::local_token`]).
    pub fn resolve<C: Subcommand>(cli: &Cli<C>, local_token: Token) -> Result<Self, CliError> {
        let file = match &cli.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let token = match (cli.token.clone().or(file.token), &cli.token_file) {
            (Some(token), _) => Some(token),
            (None, Some(path)) => Some(read_token_file(path)?),
            (None, None) => None,
        };
        let (server, token) = match cli.server.clone().or(file.server) {
            Some(server) => (server, token),
            None => local_instance(local_token, token)
                .unwrap_or_else(|token| (DEFAULT_SERVER.to_owned(), token)),
        };
        let mut client = ClientConfig::new(server);
        client.token = token.filter(|token| !token.is_empty());
        if let Some(path) = cli.ca_cert.clone().or(file.ca_cert) {
            let pem = std::fs::read(&path).map_err(|error| {
                CliError::Usage(format!(
                    "cannot read CA certificate {}: {error}",
                    path.display()
                ))
            })?;
            client.ca_cert_pem = Some(pem);
        }
        Ok(Settings {
            client,
            agent_id: file.agent_id,
            user: file.user,
            tool_risk: file.tool_risk,
            receipt_pin: cli.receipt_pin.clone().or(file.receipt_pin),
        })
    }

    /// The local instance's token `command` uses: the agent token for the surfaces agents use
    /// (hook, mcp), the admin token for the rest.
    pub fn local_token(command: &Command) -> Token {
        match command {
            Command::Hook(_) | Command::Mcp(_) => Token::Agent,
            _ => Token::Admin,
        }
    }

    /// The agent id requests are made as: the flag or environment, the config file, the
    /// default.
    pub fn agent_id(&self, flag: Option<&str>) -> String {
        flag.map(str::to_owned)
            .or_else(|| self.agent_id.clone())
            .unwrap_or_else(|| DEFAULT_AGENT_ID.to_owned())
    }

    /// The risk of a tool call: the first matching flag, then the config file, then the
    /// default for the tool.
    pub fn tool_risk(&self, flags: &[(String, Risk)], tool_name: &str) -> pb::Risk {
        let matches = |pattern: &str| match pattern.strip_suffix('*') {
            Some(prefix) => tool_name.starts_with(prefix),
            None => pattern == tool_name,
        };
        flags
            .iter()
            .map(|(pattern, risk)| (pattern.as_str(), *risk))
            .chain(self.tool_risk.iter().map(|(p, r)| (p.as_str(), *r)))
            .find(|(pattern, _)| matches(pattern))
            .map(|(_, risk)| pb::Risk::from(risk))
            .unwrap_or_else(|| countersign_client::gate::default_risk(tool_name))
    }

    /// The user `approve` / `reject` decide as: `--as`, the config file, `$USER`, the OS
    /// account name (containers often run without `$USER`).
    pub fn decider(&self, flag: Option<&str>) -> Result<String, CliError> {
        flag.map(str::to_owned)
            .or_else(|| self.user.clone())
            .or_else(local_user)
            .filter(|user| !user.is_empty())
            .ok_or_else(|| {
                CliError::Usage(
                    "no user to act as: name one (approve/reject --as USER, delegate --from APPROVER), set user in the config file, or set $USER (the OS account has no name)"
                        .into(),
                )
            })
    }
}

/// The server of the local instance (`countersign up`) and, unless one is given, its token of
/// `role`. `Err` gives the token back when no instance ever started.
fn local_instance(
    role: Token,
    token: Option<String>,
) -> Result<(String, Option<String>), Option<String>> {
    let Some((instance, url)) = Instance::locate(None)
        .ok()
        .and_then(|instance| instance.server_url().map(|url| (instance, url)))
    else {
        return Err(token);
    };
    let token = token.or_else(|| instance.read_secret(Secret::Token(role)).ok().flatten());
    Ok((url, token))
}

/// The token in a file (surrounding whitespace ignored).
pub fn read_token_file(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map(|token| token.trim().to_owned())
        .map_err(|error| {
            CliError::Usage(format!(
                "cannot read token file {}: {error}",
                path.display()
            ))
        })
}

/// The local login name, recorded as the requester of CLI requests: `$USER`, else the name of
/// the OS account the process runs as.
pub fn local_user() -> Option<String> {
    std::env::var("USER")
        .ok()
        .filter(|user| !user.is_empty())
        .or_else(|| whoami::fallible::username().ok())
        .filter(|user| !user.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_risk_takes_flags_then_the_config_file_then_the_default() {
        let file: FileConfig =
            toml::from_str("[tool_risk]\nBash = \"critical\"\n\"mcp__github__*\" = \"high\"\n")
                .unwrap();
        let settings = Settings {
            client: ClientConfig::new("http://127.0.0.1:1"),
            agent_id: None,
            user: None,
            tool_risk: file.tool_risk,
            receipt_pin: None,
        };
        let flags = [("Bash".to_owned(), Risk::Low)];
        assert_eq!(settings.tool_risk(&flags, "Bash"), pb::Risk::Low);
        assert_eq!(settings.tool_risk(&[], "Bash"), pb::Risk::Critical);
        assert_eq!(
            settings.tool_risk(&[], "mcp__github__merge"),
            pb::Risk::High
        );
        assert_eq!(
            settings.tool_risk(&[], "mcp__slack__post"),
            pb::Risk::Medium
        );
        assert_eq!(settings.tool_risk(&[], "Read"), pb::Risk::Low);
        assert!(toml::from_str::<FileConfig>("[tool_risk]\nBash = \"severe\"\n").is_err());
    }
}
