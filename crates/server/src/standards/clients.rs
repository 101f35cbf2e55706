//! The OpenID CIBA clients of `[[http.clients]]` and their authentication at `/bc-authorize`
//! and `/token`: `client_secret_basic` (RFC 6749 §2.3.1) and `private_key_jwt` (RFC 7523 §3,
//! OpenID Connect Core §9) signed with EdDSA (Ed25519) or ES256. Secrets are held only as
//! SHA-256 hashes and compared in constant time; neither they nor assertions are logged.

use std::collections::HashSet;
use std::sync::Arc;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::caller::Caller;
use crate::config::{CibaClientConfig, ConfigError, Role};

/// `client_assertion_type` of a JWT client assertion (RFC 7523 §2.2).
pub(super) const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The assertion signing algorithms accepted, as the discovery document lists them: Ed25519
/// as `EdDSA` and as its fully specified name (RFC 9864), and ES256.
pub(super) const ASSERTION_ALGS: [&str; 3] = ["EdDSA", "Ed25519", "ES256"];
/// The latest `exp` an assertion may have, in seconds from now (an hour, as common client
/// libraries make them, and the skew): it bounds how long its `jti` must be remembered.
const MAX_ASSERTION_LIFETIME_SECONDS: i64 = 3600 + SKEW_SECONDS;
/// Clock skew allowed on `nbf` and `iat`.
const SKEW_SECONDS: i64 = 60;
const MIN_SECRET_CHARS: usize = 16;
const MAX_JTI_CHARS: usize = 256;

/// A registered client.
pub(super) struct Client {
    pub(super) id: String,
    /// The agent its approvals are asked for.
    pub(super) agent: String,
    /// Its rights: an agent token's, bound to `agent`.
    pub(super) caller: Arc<Caller>,
    secret: Option<[u8; 32]>,
    keys: Vec<ClientKey>,
}

enum ClientKey {
    Ed25519 {
        kid: Option<String>,
        key: ed25519_dalek::VerifyingKey,
    },
    P256 {
        kid: Option<String>,
        key: p256::ecdsa::VerifyingKey,
    },
}

impl ClientKey {
    fn signs_with(&self, alg: &str) -> bool {
        match self {
            ClientKey::Ed25519 { .. } => alg == "EdDSA" || alg == "Ed25519",
            ClientKey::P256 { .. } => alg == "ES256",
        }
    }

    fn kid(&self) -> Option<&str> {
        match self {
            ClientKey::Ed25519 { kid, .. } | ClientKey::P256 { kid, .. } => kid.as_deref(),
        }
    }

    fn verifies(&self, input: &[u8], signature: &[u8]) -> bool {
        match self {
            ClientKey::Ed25519 { key, .. } => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|s| key.verify_strict(input, &s).is_ok()),
            ClientKey::P256 { key, .. } => p256::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|s| p256::ecdsa::signature::Verifier::verify(key, input, &s).is_ok()),
        }
    }
}

/// Why a client was not authenticated; the answer is `invalid_client` (or, for a request
/// that is malformed rather than unauthenticated, `invalid_request`).
#[derive(Debug, thiserror::Error)]
pub(super) enum ClientError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Malformed(String),
}

/// The registered clients.
pub(crate) struct Clients {
    clients: Vec<Client>,
}

/// An assertion whose signature and claims verified; its `jti` is still to be used up (the
/// store remembers it, [`crate::app::App::use_client_assertion`]).
pub(super) struct VerifiedAssertion<'a> {
    pub(super) client: &'a Client,
    pub(super) jti: String,
    /// Its `exp`, Unix seconds.
    pub(super) expires_at: i64,
}

impl Clients {
    /// Resolves `[[http.clients]]`: reads secrets through `env` and files, parses the keys;
    /// errors name the client, never a secret.
    pub(crate) fn from_config(
        configs: &[CibaClientConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Clients, ConfigError> {
        let mut ids = HashSet::new();
        let mut clients = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let fail = |message: String| {
                ConfigError::Invalid(format!(
                    "client {:?} (http.clients[{index}]): {message}",
                    config.client_id
                ))
            };
            if config.client_id.is_empty() {
                return Err(fail("client_id is required".into()));
            }
            if !ids.insert(config.client_id.as_str()) {
                return Err(fail("another client has the same client_id".into()));
            }
            if config.agent.is_empty() {
                return Err(fail("agent (the agent id it acts for) is required".into()));
            }
            let secret = secret_of(config, &env).map_err(&fail)?;
            let keys = keys_of(config).map_err(&fail)?;
            if secret.is_none() && keys.is_empty() {
                return Err(fail(
                    "needs a secret (secret_env or secret_file) or keys (jwks or jwks_file)".into(),
                ));
            }
            clients.push(Client {
                id: config.client_id.clone(),
                agent: config.agent.clone(),
                caller: Arc::new(Caller::new(
                    format!("client {}", config.client_id),
                    Role::Agent,
                    std::slice::from_ref(&config.agent),
                    &[],
                )),
                secret,
                keys,
            });
        }
        Ok(Clients { clients })
    }

    /// Whether any client is registered (the CIBA endpoints are published only then).
    pub(super) fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    fn find(&self, id: &str) -> Option<&Client> {
        self.clients.iter().find(|c| c.id == id)
    }

    /// The client of a `client_secret_basic` `Authorization` header's value.
    pub(super) fn basic(&self, header: &str) -> Result<&Client, ClientError> {
        let invalid = || ClientError::Invalid("unknown client or wrong client secret".into());
        let encoded = header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .map(|(_, rest)| rest.trim())
            // Another scheme is an unsupported authentication method (RFC 6749 §5.2).
            .ok_or_else(|| {
                ClientError::Invalid(
                    "Authorization: only the Basic scheme authenticates a client here".into(),
                )
            })?;
        let decoded = STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| ClientError::Malformed("Authorization: not base64 text".into()))?;
        let (id, secret) = decoded.split_once(':').ok_or_else(|| {
            ClientError::Malformed("Authorization: not client_id:client_secret".into())
        })?;
        // RFC 6749 §2.3.1: both are form-urlencoded before they are joined.
        let id = form_decoded(id);
        let secret = form_decoded(secret);
        let client = self.find(&id).ok_or_else(invalid)?;
        let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        match &client.secret {
            Some(hash) if bool::from(hash.ct_eq(&presented)) => Ok(client),
            _ => {
                tracing::warn!(client_id = %client.id, "a client presented a wrong secret");
                Err(invalid())
            }
        }
    }

    /// The client of a `private_key_jwt` assertion whose audience is one of `audiences`,
    /// `now` in Unix seconds.
    pub(super) fn assertion(
        &self,
        assertion: &str,
        audiences: &[&str],
        now: i64,
    ) -> Result<VerifiedAssertion<'_>, ClientError> {
        let invalid = |why: &str| ClientError::Invalid(format!("client_assertion: {why}"));
        let parts: Vec<&str> = assertion.split('.').collect();
        let [header_b64, claims_b64, signature_b64] = parts[..] else {
            return Err(invalid("not a compact JWS (three dot-separated parts)"));
        };
        let part = |b64: &str| {
            URL_SAFE_NO_PAD
                .decode(b64)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .filter(Value::is_object)
        };
        let header = part(header_b64).ok_or_else(|| invalid("the header is not a JSON object"))?;
        let claims = part(claims_b64).ok_or_else(|| invalid("the claims are not a JSON object"))?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature_b64)
            .map_err(|_| invalid("the signature is not base64url"))?;
        let issuer = claims["iss"]
            .as_str()
            .ok_or_else(|| invalid("iss (the client_id) is required"))?;
        if claims["sub"].as_str() != Some(issuer) {
            return Err(invalid("sub must be the client_id, as iss is"));
        }
        let client = self.find(issuer).ok_or_else(|| invalid("unknown client"))?;
        let alg = header["alg"].as_str().unwrap_or_default();
        if !ASSERTION_ALGS.contains(&alg) {
            return Err(invalid("alg must be EdDSA, Ed25519 or ES256"));
        }
        let kid = header["kid"].as_str();
        let input = format!("{header_b64}.{claims_b64}");
        let signed = client
            .keys
            .iter()
            .filter(|k| k.signs_with(alg) && (kid.is_none() || k.kid() == kid))
            .any(|k| k.verifies(input.as_bytes(), &signature));
        if !signed {
            tracing::warn!(client_id = %client.id, "a client assertion's signature did not verify");
            return Err(invalid(
                "the signature does not verify with the client's keys",
            ));
        }
        let audience_ok = match &claims["aud"] {
            Value::String(aud) => audiences.contains(&aud.as_str()),
            Value::Array(auds) => auds
                .iter()
                .any(|a| a.as_str().is_some_and(|a| audiences.contains(&a))),
            _ => false,
        };
        if !audience_ok {
            return Err(invalid(&format!(
                "aud must be the issuer or the endpoint ({})",
                audiences.join(" or ")
            )));
        }
        let exp = claims["exp"]
            .as_i64()
            .ok_or_else(|| invalid("exp is required"))?;
        if exp <= now {
            return Err(invalid("expired (exp)"));
        }
        if exp > now + MAX_ASSERTION_LIFETIME_SECONDS {
            return Err(invalid(&format!(
                "exp is more than {MAX_ASSERTION_LIFETIME_SECONDS} seconds away"
            )));
        }
        if claims["nbf"]
            .as_i64()
            .is_some_and(|nbf| nbf > now + SKEW_SECONDS)
            || claims["iat"]
                .as_i64()
                .is_some_and(|iat| iat > now + SKEW_SECONDS)
        {
            return Err(invalid("not valid yet (nbf or iat)"));
        }
        let jti = claims["jti"]
            .as_str()
            .filter(|j| !j.is_empty() && j.chars().count() <= MAX_JTI_CHARS)
            .ok_or_else(|| invalid("jti is required (at most 256 characters)"))?;
        Ok(VerifiedAssertion {
            client,
            jti: jti.to_owned(),
            expires_at: exp,
        })
    }
}

fn form_decoded(text: &str) -> String {
    form_urlencoded::parse(format!("v={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

fn secret_of(
    config: &CibaClientConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<[u8; 32]>, String> {
    let secret = match (&config.secret_env, &config.secret_file) {
        (None, None) => return Ok(None),
        (Some(variable), None) => env(variable)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("environment variable {variable} is not set"))?,
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read secret_file {}: {e}", path.display()))?
            .trim()
            .to_owned(),
        (Some(_), Some(_)) => return Err("needs at most one of secret_env or secret_file".into()),
    };
    if secret.chars().count() < MIN_SECRET_CHARS {
        return Err(format!(
            "the client secret is shorter than {MIN_SECRET_CHARS} characters; use a long random secret"
        ));
    }
    Ok(Some(Sha256::digest(secret.as_bytes()).into()))
}

fn keys_of(config: &CibaClientConfig) -> Result<Vec<ClientKey>, String> {
    let text = match (&config.jwks, &config.jwks_file) {
        (None, None) => return Ok(Vec::new()),
        (Some(text), None) => text.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read jwks_file {}: {e}", path.display()))?,
        (Some(_), Some(_)) => return Err("needs at most one of jwks or jwks_file".into()),
    };
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("the keys are not JSON: {e}"))?;
    let jwks = match doc.get("keys") {
        Some(Value::Array(keys)) => keys.clone(),
        Some(_) => return Err("keys must be an array of JWKs".into()),
        None => vec![doc],
    };
    if jwks.is_empty() {
        return Err("the JWKS holds no key".into());
    }
    jwks.iter()
        .enumerate()
        .map(|(i, jwk)| key_of(jwk).map_err(|why| format!("key {i}: {why}")))
        .collect()
}

fn key_of(jwk: &Value) -> Result<ClientKey, String> {
    if jwk.get("d").is_some() {
        return Err("holds a private key (\"d\"): register the public key only".into());
    }
    let coordinate = |name: &str| {
        jwk[name]
            .as_str()
            .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
            .ok_or_else(|| format!("{name} must be base64url"))
    };
    let kid = jwk["kid"].as_str().map(str::to_owned);
    match (jwk["kty"].as_str(), jwk["crv"].as_str()) {
        (Some("OKP"), Some("Ed25519")) => {
            let x: [u8; 32] = coordinate("x")?
                .try_into()
                .map_err(|_| "x must be 32 bytes".to_string())?;
            let key = ed25519_dalek::VerifyingKey::from_bytes(&x)
                .map_err(|_| "x is not an Ed25519 public key".to_string())?;
            Ok(ClientKey::Ed25519 { kid, key })
        }
        (Some("EC"), Some("P-256")) => {
            let x = coordinate("x")?;
            let y = coordinate("y")?;
            if x.len() != 32 || y.len() != 32 {
                return Err("x and y must be 32 bytes each".into());
            }
            let point = p256::EncodedPoint::from_affine_coordinates(
                p256::FieldBytes::from_slice(&x),
                p256::FieldBytes::from_slice(&y),
                false,
            );
            let key = p256::ecdsa::VerifyingKey::from_encoded_point(&point)
                .map_err(|_| "x, y is not a P-256 public key".to_string())?;
            Ok(ClientKey::P256 { kid, key })
        }
        _ => Err("must be an Ed25519 (kty OKP) or P-256 (kty EC) public key".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(id: &str) -> CibaClientConfig {
        CibaClientConfig {
            client_id: id.into(),
            agent: "agent-1".into(),
            secret_env: Some("SECRET".into()),
            ..CibaClientConfig::default()
        }
    }

    fn env(_: &str) -> Option<String> {
        Some("a-long-enough-secret-0123".into())
    }

    #[test]
    fn bad_client_entries_are_named_without_their_secret() {
        let mut no_agent = client("no-agent");
        no_agent.agent = String::new();
        let mut nothing = client("nothing");
        nothing.secret_env = None;
        let mut both = client("both");
        both.secret_file = Some("/nonexistent".into());
        let mut private = client("private");
        private.jwks = Some(r#"{"kty": "OKP", "crv": "Ed25519", "x": "AAAA", "d": "AAAA"}"#.into());
        let mut rsa = client("rsa");
        rsa.jwks = Some(r#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#.into());
        let mut short_x = client("short-x");
        short_x.jwks = Some(r#"{"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}"#.into());
        let cases = [
            (no_agent, "agent"),
            (nothing, "needs a secret"),
            (both, "at most one of secret_env or secret_file"),
            (private, "private key"),
            (rsa, "key 0: must be an Ed25519"),
            (short_x, "32 bytes"),
        ];
        for (entry, expected) in cases {
            let name = entry.client_id.clone();
            let error = Clients::from_config(&[entry], env)
                .err()
                .unwrap()
                .to_string();
            assert!(error.contains(&format!("client {name:?}")), "{error}");
            assert!(error.contains(expected), "{expected}: {error}");
            assert!(!error.contains("a-long-enough-secret"), "{error}");
        }
        let short = Clients::from_config(&[client("short")], |_: &str| Some("tiny".into()))
            .err()
            .unwrap()
            .to_string();
        assert!(short.contains("shorter than 16"), "{short}");
        assert!(!short.contains("tiny"), "{short}");
        let twice = Clients::from_config(&[client("same"), client("same")], env)
            .err()
            .unwrap()
            .to_string();
        assert!(twice.contains("same client_id"), "{twice}");
    }

    #[test]
    fn a_basic_header_is_form_decoded_and_checked_in_full() {
        let clients = Clients::from_config(&[client("app:1")], env).unwrap();
        let header =
            |id: &str, secret: &str| format!("Basic {}", STANDARD.encode(format!("{id}:{secret}")));
        // RFC 6749 §2.3.1: the id's ":" is sent form-encoded.
        let found = clients.basic(&header("app%3A1", "a-long-enough-secret-0123"));
        assert_eq!(found.map(|c| c.id.as_str()).ok(), Some("app:1"));
        assert!(matches!(
            clients.basic(&header("app%3A1", "a-long-enough-secret-012")),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(
            clients.basic("Bearer x"),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(
            clients.basic("Basic not-base64!"),
            Err(ClientError::Malformed(_))
        ));
    }
}
