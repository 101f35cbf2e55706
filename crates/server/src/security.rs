//! Everything the server decides about who may do what, built once from the configuration at
//! start: tokens, the approver registry and the policy rules. Any error stops the start and
//! names the entry.

use std::net::SocketAddr;
use std::sync::Arc;

use countersign_core::approvers::ApproverRegistry;
use countersign_core::groups::Groups;
use countersign_core::policy::Policy;

use tonic::transport::{Identity, ServerTlsConfig};

use crate::auth::Tokens;
use crate::config::{Config, ConfigError, TlsConfig};

pub struct Security {
    pub tokens: Arc<Tokens>,
    pub approvers: ApproverRegistry,
    pub groups: Groups,
    pub policy: Policy,
}

impl Security {
    /// Compiles the security configuration for a server listening on `listen`. Without tokens
    /// only a loopback address is allowed.
    pub fn from_config(config: &Config, listen: SocketAddr) -> Result<Security, ConfigError> {
        let tokens = Tokens::from_config(&config.tokens, |variable| std::env::var(variable).ok())?;
        if tokens.is_empty() {
            crate::config::refuse_open_listen(listen, true)?;
            tracing::warn!(listen = %listen, "no tokens configured: every local caller may do everything; serving on loopback only");
        }
        let approvers = ApproverRegistry::compile(&config.approvers)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if approvers.is_empty() {
            tracing::warn!("no approvers configured: any decider a worker sends is accepted");
        }
        let groups = Groups::compile(&config.groups, &approvers)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let policy = Policy::compile(&config.rules, &config.request_limits())
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        for (rule, group, required) in policy.named_groups() {
            match groups.size(group) {
                None => {
                    return Err(ConfigError::Invalid(format!(
                        "rule {rule:?} names group {group:?}, which is not configured (see [[groups]])"
                    )))
                }
                Some(members) if required as usize > members => {
                    return Err(ConfigError::Invalid(format!(
                        "rule {rule:?} asks for {required} approvals from group {group:?}, which has {members} members"
                    )))
                }
                Some(_) => {}
            }
        }
        tracing::info!(
            approvers = approvers.len(),
            groups = groups.len(),
            rules = config.rules.len(),
            tls = config.tls.is_some(),
            "security configuration loaded"
        );
        Ok(Security {
            tokens: Arc::new(tokens),
            approvers,
            groups,
            policy,
        })
    }
}

/// The TLS settings of the gRPC listener, from the PEM files configured.
pub(crate) fn server_tls(config: &TlsConfig) -> Result<ServerTlsConfig, ConfigError> {
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            ConfigError::Invalid(format!("cannot read tls.{field} {}: {e}", path.display()))
        })
    };
    let cert = read("cert_file", &config.cert_file)?;
    let key = read("key_file", &config.key_file)?;
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_configuration_is_valid() {
        let doc = include_str!("../../../docs/configuration.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("a TOML example in docs/configuration.md");
        let config = Config::parse(example).unwrap();
        config.validate().unwrap();
        let tokens =
            Tokens::from_config(&config.tokens, |v| Some(format!("{v}-0123456789"))).unwrap();
        assert!(!tokens.is_empty());
        assert_eq!(
            ApproverRegistry::compile(&config.approvers).unwrap().len(),
            2
        );
        Policy::compile(&config.rules, &config.request_limits()).unwrap();
        assert_eq!(config.rules.len(), 5);
        assert_eq!(config.serving.shutdown_grace_seconds, 20);
        assert_eq!(config.limits.decisions_per_minute, 30);
        assert!(config.tls.is_some() && config.storage.redact_arguments);
    }

    /// The rule docs/integrations.md gives for letting `git status` run, applied to the hook
    /// payloads of Claude Code, Codex and Gemini CLI (the CLI's fixtures, as each host sends
    /// them): the host's tool name and the `/command` pointer the page names match exactly
    /// that command, and a command that only starts with it still goes to a human.
    #[test]
    fn the_documented_rule_for_each_hosts_shell_matches_its_payload() {
        let doc = include_str!("../../../docs/integrations.md");
        let example = doc
            .split("## Policy rules for each host's tools")
            .nth(1)
            .and_then(|section| section.split("```toml\n").nth(1))
            .and_then(|rest| rest.split("```").next())
            .expect(
                "a TOML rule under \"Policy rules for each host's tools\" in docs/integrations.md",
            );
        let config = Config::parse(example).unwrap();
        let policy = Policy::compile(&config.rules, &config.request_limits()).unwrap();
        let payloads = [
            include_str!("../../cli/tests/fixtures/claude-code/pre-tool-use.json"),
            include_str!("../../cli/tests/fixtures/codex/pre-tool-use.json"),
            include_str!("../../cli/tests/fixtures/gemini/before-tool.json"),
        ];
        for payload in payloads {
            let payload: serde_json::Value = serde_json::from_str(payload).unwrap();
            let tool = payload["tool_name"].as_str().unwrap();
            for (command, allowed) in [("git status", true), ("git status; rm -rf ~", false)] {
                let mut input = payload["tool_input"].clone();
                input["command"] = command.into();
                let request = countersign_core::validate::validate_request(
                    countersign_core::validate::RequestInput {
                        agent_id: "coder-1".into(),
                        idempotency_key: "call-1".into(),
                        tool_name: tool.into(),
                        arguments_json: input.to_string(),
                        risk: Some(countersign_core::Risk::High),
                        ..Default::default()
                    },
                    &config.request_limits(),
                )
                .unwrap();
                let (_, disposition) = policy.apply(request);
                assert_eq!(
                    matches!(disposition, countersign_core::Disposition::Resolve { .. }),
                    allowed,
                    "{tool} {command:?}: {disposition:?}"
                );
            }
        }
    }
}
