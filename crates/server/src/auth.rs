//! Authentication and authorization: bearer tokens with a role and an agent or channel scope.
//!
//! An interceptor in front of the countersign services turns the `authorization` header into a
//! [`Caller`] (UNAUTHENTICATED when it is missing or unknown) and hands it to the handlers in
//! the request's extensions; each handler then checks the caller's role and scope against what
//! the call touches (PERMISSION_DENIED). Health and reflection have no interceptor. Tokens are
//! held only as SHA-256 hashes and compared in constant time; they are never logged.

use std::collections::HashSet;
use std::sync::Arc;

use countersign_core::fields::validate_channel;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::caller::Caller;

pub use crate::config::Role;
use crate::config::{ConfigError, TokenConfig};

/// Tokens shorter than this are refused at start: they could be guessed.
const MIN_TOKEN_CHARS: usize = 16;

/// The caller of a request, put there by the [`Authenticator`]. Missing only if the
/// interceptor was not installed: then nobody is let in.
pub(crate) fn caller_of<T>(request: &Request<T>) -> Result<Arc<Caller>, Status> {
    request
        .extensions()
        .get::<Arc<Caller>>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no authenticated caller"))
}

struct Token {
    hash: [u8; 32],
    caller: Arc<Caller>,
}

/// The configured tokens, as hashes.
pub struct Tokens {
    tokens: Vec<Token>,
}

impl Tokens {
    /// Resolves `[[tokens]]`: reads `value_env` variables through `env` and hashes them, and
    /// checks every entry; errors name the token, never its value.
    pub fn from_config(
        configs: &[TokenConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Tokens, ConfigError> {
        let mut names = HashSet::new();
        let mut tokens: Vec<Token> = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let fail = |message: String| {
                ConfigError::Invalid(format!(
                    "token {:?} (tokens[{index}]): {message}",
                    config.name
                ))
            };
            if config.name.is_empty() {
                return Err(fail("name is required".into()));
            }
            if !names.insert(config.name.as_str()) {
                return Err(fail("another token has the same name".into()));
            }
            let hash = token_hash(config, &env).map_err(&fail)?;
            if tokens.iter().any(|t| bool::from(t.hash.ct_eq(&hash))) {
                return Err(fail("has the same value as another token".into()));
            }
            check_scope(config).map_err(&fail)?;
            tokens.push(Token {
                hash,
                caller: Arc::new(Caller::new(
                    config.name.clone(),
                    config.role,
                    &config.agents,
                    &config.channels,
                )),
            });
        }
        Ok(Tokens { tokens })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The caller a presented token belongs to. Every configured hash is compared, in
    /// constant time, whichever matches.
    pub(crate) fn find(&self, token: &str) -> Option<Arc<Caller>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for candidate in &self.tokens {
            if bool::from(candidate.hash.ct_eq(&presented)) {
                found = Some(candidate.caller.clone());
            }
        }
        found
    }
}

fn token_hash(
    config: &TokenConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<[u8; 32], String> {
    match (&config.value_env, &config.sha256) {
        (Some(variable), None) => {
            let value = env(variable)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("environment variable {variable} is not set"))?;
            if value.chars().count() < MIN_TOKEN_CHARS {
                return Err(format!(
                    "the value of {variable} is shorter than {MIN_TOKEN_CHARS} characters; use a long random token"
                ));
            }
            Ok(Sha256::digest(value.as_bytes()).into())
        }
        (None, Some(hex_hash)) => {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(hex_hash.trim(), &mut hash)
                .map_err(|_| "sha256 must be 64 hex digits".to_string())?;
            Ok(hash)
        }
        _ => Err("needs exactly one of value_env or sha256".into()),
    }
}

fn check_scope(config: &TokenConfig) -> Result<(), String> {
    match config.role {
        Role::Agent if config.agents.is_empty() => {
            Err("an agent token needs agents (its agent ids, or \"*\")".into())
        }
        Role::Worker if config.channels.is_empty() => {
            Err("a worker token needs channels (its channels, or \"*\")".into())
        }
        Role::Agent if !config.channels.is_empty() => {
            Err("channels apply to worker tokens only".into())
        }
        Role::Worker if !config.agents.is_empty() => {
            Err("agents apply to agent tokens only".into())
        }
        Role::Admin if !config.agents.is_empty() || !config.channels.is_empty() => {
            Err("an admin token has no agents or channels: it may do everything".into())
        }
        _ => {
            for channel in config.channels.iter().filter(|c| *c != "*") {
                validate_channel("channels", channel).map_err(|e| e.to_string())?;
            }
            if config.agents.iter().any(String::is_empty) {
                return Err("agents may not hold an empty id".into());
            }
            Ok(())
        }
    }
}

/// The interceptor: establishes the [`Caller`] of every call.
#[derive(Clone)]
pub(crate) struct Authenticator {
    tokens: Arc<Tokens>,
}

impl Authenticator {
    pub(crate) fn new(tokens: Arc<Tokens>) -> Authenticator {
        Authenticator { tokens }
    }

    /// The caller of an `authorization` header's value (none: the header is missing). The
    /// refusal's text says what to send; it never holds the token.
    pub(crate) fn caller(&self, header: Option<&[u8]>) -> Result<Arc<Caller>, &'static str> {
        if self.tokens.is_empty() {
            return Ok(Arc::new(Caller::open()));
        }
        let header =
            header.ok_or("a bearer token is required: send authorization: Bearer <token>")?;
        let token = std::str::from_utf8(header)
            .ok()
            .and_then(|value| {
                value
                    .split_once(' ')
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            })
            .map(|(_, token)| token.trim())
            .ok_or("the authorization header must be: Bearer <token>")?;
        self.tokens.find(token).ok_or_else(|| {
            tracing::warn!("a call with an unknown token was refused");
            "unknown token"
        })
    }

    fn authenticate(&self, metadata: &MetadataMap) -> Result<Arc<Caller>, Status> {
        self.caller(metadata.get("authorization").map(|value| value.as_bytes()))
            .map_err(Status::unauthenticated)
    }
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let caller = self.authenticate(request.metadata())?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, role: Role) -> TokenConfig {
        TokenConfig {
            name: name.into(),
            role,
            agents: Vec::new(),
            channels: Vec::new(),
            value_env: Some(format!("TOKEN_{name}")),
            sha256: None,
        }
    }

    fn env(variable: &str) -> Option<String> {
        Some(format!("{variable}-0123456789abcdef"))
    }

    #[test]
    fn tokens_resolve_from_the_environment_or_a_hash() {
        let mut agent = config("a", Role::Agent);
        agent.agents = vec!["coder".into()];
        let mut hashed = config("h", Role::Admin);
        hashed.value_env = None;
        hashed.sha256 = Some(hex::encode(Sha256::digest(b"hashed-secret-0123456789")));
        let tokens = Tokens::from_config(&[agent, hashed], env).unwrap();
        assert_eq!(tokens.find("TOKEN_a-0123456789abcdef").unwrap().name, "a");
        assert_eq!(tokens.find("hashed-secret-0123456789").unwrap().name, "h");
        assert!(tokens.find("TOKEN_a").is_none());
    }

    #[test]
    fn bad_token_entries_are_named_without_their_value() {
        let mut short = config("short", Role::Admin);
        short.value_env = Some("SHORT".into());
        let mut both = config("both", Role::Admin);
        both.sha256 = Some("00".repeat(32));
        let mut bad_hash = config("bad-hash", Role::Admin);
        bad_hash.value_env = None;
        bad_hash.sha256 = Some("xyz".into());
        let unbound = config("unbound", Role::Agent);
        let mut admin_scoped = config("admin-scoped", Role::Admin);
        admin_scoped.channels = vec!["telegram".into()];
        let cases = [
            (short, "shorter than 16"),
            (both, "exactly one"),
            (bad_hash, "64 hex"),
            (unbound, "needs agents"),
            (admin_scoped, "no agents or channels"),
        ];
        for (entry, expected) in cases {
            let name = entry.name.clone();
            let error = Tokens::from_config(&[entry], |v: &str| {
                (v == "SHORT")
                    .then(|| "tiny".to_string())
                    .or_else(|| env(v))
            })
            .err()
            .unwrap()
            .to_string();
            assert!(error.contains(&format!("token {name:?}")), "{error}");
            assert!(error.contains(expected), "{expected}: {error}");
            assert!(!error.contains("tiny"), "{error}");
        }
        let unset = Tokens::from_config(&[config("x", Role::Admin)], |_: &str| None)
            .err()
            .unwrap();
        assert!(unset.to_string().contains("TOKEN_x is not set"), "{unset}");
    }
}
