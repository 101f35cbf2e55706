//! The relying party's checks of WebAuthn (W3C Web Authentication Level 3): registering a
//! credential (§7.1) and verifying an assertion (§7.2), for passkey step-up. Pure: the server
//! feeds it the relying party, the expected challenge and the stored credential.
//!
//! Why not `webauthn-rs`: its core crate (`webauthn-rs-core`) depends on `openssl`, which
//! countersign's builds exclude (rustls and pure Rust only; the wheel, the npm package and the
//! archives must not link libssl). What step-up needs is small: attestation `none` (no
//! attestation statement is trusted, so there are no certificate chains to check), ES256 and
//! EdDSA keys, and the checks of §7.1/§7.2. Authenticator data and COSE keys are read with the
//! minimal CBOR reader below (definite lengths only, the subset CTAP2's canonical encoding
//! uses), signatures checked with `p256` (ES256) and `ed25519-dalek` (EdDSA), both pure Rust
//! and already in the dependency tree.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

/// COSE algorithm ES256 (ECDSA with P-256 and SHA-256).
pub const COSE_ES256: i64 = -7;
/// COSE algorithm EdDSA (Ed25519 here).
pub const COSE_EDDSA: i64 = -8;

// Authenticator data flags (§6.1).
const FLAG_UP: u8 = 0x01;
const FLAG_UV: u8 = 0x04;
const FLAG_BE: u8 = 0x08;
const FLAG_BS: u8 = 0x10;
const FLAG_AT: u8 = 0x40;
const FLAG_ED: u8 = 0x80;

/// The most a credential id may be (§5.8.3: at most 1023 bytes).
const MAX_CREDENTIAL_ID_BYTES: usize = 1023;

/// Why a registration or an assertion was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebauthnError {
    #[error("the relying party is not valid: {0}")]
    RelyingParty(String),
    #[error("{0} is not valid base64url")]
    Base64(&'static str),
    #[error("clientDataJSON is not valid: {0}")]
    ClientData(String),
    #[error("clientDataJSON's type is {found:?}, not {expected:?}")]
    Type {
        expected: &'static str,
        found: String,
    },
    #[error("the challenge the authenticator signed is not this one")]
    Challenge,
    #[error("the origin is {found:?}, not {expected:?}")]
    Origin { expected: String, found: String },
    #[error("the assertion was made for a cross-origin frame")]
    CrossOrigin,
    #[error("the attestation object is not valid: {0}")]
    Attestation(String),
    #[error("attestation format {0:?} is not accepted (the inbox asks for \"none\")")]
    AttestationFormat(String),
    #[error("the authenticator data is not valid: {0}")]
    AuthenticatorData(String),
    #[error("the authenticator data is for another relying party id")]
    RpIdHash,
    #[error("the user was not present (flag UP not set)")]
    UserPresence,
    #[error(
        "the user was not verified (flag UV not set): the passkey must ask for a PIN or biometrics"
    )]
    UserVerification,
    #[error("the public key is not valid: {0}")]
    PublicKey(String),
    #[error("COSE algorithm {0} is not accepted (ES256 -7 and EdDSA -8 are)")]
    Algorithm(i64),
    #[error("the signature does not verify")]
    Signature,
    #[error("the sign counter went from {stored} to {found}: the passkey may have been cloned")]
    SignCount { stored: u32, found: u32 },
}

/// The relying party: its id (a registrable domain, `localhost` included) and the one origin
/// its pages are served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelyingParty {
    pub id: String,
    pub origin: String,
}

impl RelyingParty {
    /// The relying party of pages served at `url` (`https://inbox.example.com/` or, for a
    /// machine of one's own, `http://localhost:8080`): the id is the host, the origin the
    /// scheme, host and port. IP addresses are not valid relying party ids (§5.1.4.1), and
    /// only localhost may be plain HTTP (a secure context).
    pub fn from_url(url: &str) -> Result<RelyingParty, WebauthnError> {
        let invalid = |why: &str| WebauthnError::RelyingParty(format!("{url:?}: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("not an absolute URL"))?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(invalid("a URL with user information"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) => {
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid("the port is not a number"));
                }
                (host, Some(port))
            }
            None => (authority, None),
        };
        let host = host.to_ascii_lowercase();
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        };
        if host.is_empty() || !host.split('.').all(label_ok) {
            return Err(invalid("the host is not a domain name"));
        }
        if host
            .split('.')
            .all(|label| label.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(invalid(
                "an IP address is not a valid relying party id: use a domain name (localhost on this machine)",
            ));
        }
        let scheme = scheme.to_ascii_lowercase();
        let local = host == "localhost" || host.ends_with(".localhost");
        match scheme.as_str() {
            "https" => {}
            "http" if local => {}
            "http" => {
                return Err(invalid(
                    "passkeys need HTTPS (plain HTTP only on localhost)",
                ))
            }
            _ => return Err(invalid("the scheme is neither https nor http")),
        }
        let default_port = if scheme == "https" { "443" } else { "80" };
        let origin = match port.filter(|p| *p != default_port) {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        };
        Ok(RelyingParty { id: host, origin })
    }

    fn id_hash(&self) -> [u8; 32] {
        Sha256::digest(self.id.as_bytes()).into()
    }
}

/// A credential as registered: what the server stores to verify its assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredCredential {
    pub credential_id: Vec<u8>,
    /// The credential's public key, COSE_Key encoded, as the authenticator gave it.
    pub cose_key: Vec<u8>,
    pub algorithm: i64,
    pub sign_count: u32,
}

/// What a browser hands back from `navigator.credentials.create()`.
#[derive(Debug, Clone, Default)]
pub struct Registration<'a> {
    pub client_data_json: &'a [u8],
    pub attestation_object: &'a [u8],
}

/// What a browser hands back from `navigator.credentials.get()`.
#[derive(Debug, Clone, Default)]
pub struct Assertion<'a> {
    pub client_data_json: &'a [u8],
    pub authenticator_data: &'a [u8],
    pub signature: &'a [u8],
}

/// Base64url without padding, as WebAuthn's JSON forms write binary values.
pub fn base64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url (padding tolerated); `what` names the value in the error.
pub fn from_base64url(text: &str, what: &'static str) -> Result<Vec<u8>, WebauthnError> {
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| WebauthnError::Base64(what))
}

/// §7.1: registers a new credential from a `create()` response made for `challenge`.
/// Attestation `none` only: the credential is trusted because the approver registering it
/// signed in to the inbox, not because of who made the authenticator.
pub fn verify_registration(
    rp: &RelyingParty,
    challenge: &[u8],
    registration: &Registration<'_>,
) -> Result<RegisteredCredential, WebauthnError> {
    check_client_data(
        rp,
        registration.client_data_json,
        "webauthn.create",
        challenge,
    )?;
    let attestation = cbor::decode(registration.attestation_object)
        .map_err(|e| WebauthnError::Attestation(e.to_string()))?;
    let format = attestation
        .get_text("fmt")
        .and_then(cbor::Value::as_text)
        .ok_or_else(|| WebauthnError::Attestation("no fmt".into()))?;
    if format != "none" {
        return Err(WebauthnError::AttestationFormat(format.to_owned()));
    }
    match attestation.get_text("attStmt") {
        Some(cbor::Value::Map(entries)) if entries.is_empty() => {}
        _ => {
            return Err(WebauthnError::Attestation(
                "attStmt of format none must be an empty map".into(),
            ))
        }
    }
    let auth_data = attestation
        .get_text("authData")
        .and_then(cbor::Value::as_bytes)
        .ok_or_else(|| WebauthnError::Attestation("no authData".into()))?;
    let parsed = AuthenticatorData::parse(auth_data)?;
    parsed.check(rp)?;
    let attested = parsed.attested.ok_or_else(|| {
        WebauthnError::AuthenticatorData("no attested credential data (flag AT)".into())
    })?;
    let algorithm = PublicKey::from_cose(&attested.cose_key)?.algorithm();
    Ok(RegisteredCredential {
        credential_id: attested.credential_id,
        cose_key: attested.cose_key,
        algorithm,
        sign_count: parsed.sign_count,
    })
}

/// §7.2: verifies an assertion made for `challenge` by `credential`, whose sign counter was
/// `stored_sign_count`. Returns the new sign counter to store.
pub fn verify_assertion(
    rp: &RelyingParty,
    challenge: &[u8],
    cose_key: &[u8],
    stored_sign_count: u32,
    assertion: &Assertion<'_>,
) -> Result<u32, WebauthnError> {
    check_client_data(rp, assertion.client_data_json, "webauthn.get", challenge)?;
    let parsed = AuthenticatorData::parse(assertion.authenticator_data)?;
    parsed.check(rp)?;
    let mut signed = assertion.authenticator_data.to_vec();
    signed.extend_from_slice(&Sha256::digest(assertion.client_data_json));
    PublicKey::from_cose(cose_key)?.verify(&signed, assertion.signature)?;
    // §7.2 step 22: a counter that does not move forward is a sign of a cloned authenticator;
    // authenticators without a counter (synced passkeys) always say 0.
    let found = parsed.sign_count;
    if (found != 0 || stored_sign_count != 0) && found <= stored_sign_count {
        return Err(WebauthnError::SignCount {
            stored: stored_sign_count,
            found,
        });
    }
    Ok(found)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientData {
    #[serde(rename = "type")]
    kind: String,
    challenge: String,
    origin: String,
    #[serde(default)]
    cross_origin: bool,
    #[serde(default)]
    top_origin: Option<String>,
}

/// §7.1 steps 5-10 and §7.2 steps 10-15: type, challenge, origin, no cross-origin frame.
fn check_client_data(
    rp: &RelyingParty,
    client_data_json: &[u8],
    expected_type: &'static str,
    challenge: &[u8],
) -> Result<(), WebauthnError> {
    let data: ClientData = serde_json::from_slice(client_data_json)
        .map_err(|e| WebauthnError::ClientData(e.to_string()))?;
    if data.kind != expected_type {
        return Err(WebauthnError::Type {
            expected: expected_type,
            found: data.kind,
        });
    }
    let signed_challenge = from_base64url(&data.challenge, "the challenge")?;
    if !constant_time_eq(&signed_challenge, challenge) {
        return Err(WebauthnError::Challenge);
    }
    if data.origin != rp.origin {
        return Err(WebauthnError::Origin {
            expected: rp.origin.clone(),
            found: data.origin,
        });
    }
    if data.cross_origin || data.top_origin.is_some() {
        return Err(WebauthnError::CrossOrigin);
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

struct AttestedCredential {
    credential_id: Vec<u8>,
    cose_key: Vec<u8>,
}

/// Authenticator data (§6.1): rpIdHash, flags, signCount, then attested credential data
/// (flag AT) and extensions (flag ED).
struct AuthenticatorData {
    rp_id_hash: [u8; 32],
    flags: u8,
    sign_count: u32,
    attested: Option<AttestedCredential>,
}

impl AuthenticatorData {
    fn parse(bytes: &[u8]) -> Result<AuthenticatorData, WebauthnError> {
        let short = || WebauthnError::AuthenticatorData("too short".into());
        let rp_id_hash: [u8; 32] = bytes
            .get(..32)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(short)?;
        let flags = *bytes.get(32).ok_or_else(short)?;
        let sign_count = bytes
            .get(33..37)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_be_bytes)
            .ok_or_else(short)?;
        let mut rest = &bytes[37..];
        let attested = if flags & FLAG_AT != 0 {
            // aaguid (16 bytes), credentialIdLength (2), credentialId, credentialPublicKey.
            let length = rest
                .get(16..18)
                .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                .ok_or_else(short)?;
            if length == 0 || length > MAX_CREDENTIAL_ID_BYTES {
                return Err(WebauthnError::AuthenticatorData(format!(
                    "a credential id of {length} bytes"
                )));
            }
            let credential_id = rest.get(18..18 + length).ok_or_else(short)?.to_vec();
            rest = &rest[18 + length..];
            let key_length =
                cbor::encoded_length(rest).map_err(|e| WebauthnError::PublicKey(e.to_string()))?;
            let cose_key = rest[..key_length].to_vec();
            rest = &rest[key_length..];
            Some(AttestedCredential {
                credential_id,
                cose_key,
            })
        } else {
            None
        };
        if flags & FLAG_ED != 0 {
            let length = cbor::encoded_length(rest)
                .map_err(|e| WebauthnError::AuthenticatorData(format!("extensions: {e}")))?;
            rest = &rest[length..];
        }
        if !rest.is_empty() {
            return Err(WebauthnError::AuthenticatorData(format!(
                "{} bytes left over",
                rest.len()
            )));
        }
        Ok(AuthenticatorData {
            rp_id_hash,
            flags,
            sign_count,
            attested,
        })
    }

    /// rpIdHash, UP, UV (step-up asks for a verified user), and BS only with BE.
    fn check(&self, rp: &RelyingParty) -> Result<(), WebauthnError> {
        if !constant_time_eq(&self.rp_id_hash, &rp.id_hash()) {
            return Err(WebauthnError::RpIdHash);
        }
        if self.flags & FLAG_UP == 0 {
            return Err(WebauthnError::UserPresence);
        }
        if self.flags & FLAG_UV == 0 {
            return Err(WebauthnError::UserVerification);
        }
        if self.flags & FLAG_BS != 0 && self.flags & FLAG_BE == 0 {
            return Err(WebauthnError::AuthenticatorData(
                "backed up (BS) but not backup eligible (BE)".into(),
            ));
        }
        Ok(())
    }
}

enum PublicKey {
    Es256(p256::ecdsa::VerifyingKey),
    EdDsa(ed25519_dalek::VerifyingKey),
}

impl PublicKey {
    /// A COSE_Key (RFC 9053): EC2 on P-256 with ES256, or OKP on Ed25519 with EdDSA.
    fn from_cose(bytes: &[u8]) -> Result<PublicKey, WebauthnError> {
        let invalid = |why: &str| WebauthnError::PublicKey(why.to_owned());
        let key = cbor::decode(bytes).map_err(|e| WebauthnError::PublicKey(e.to_string()))?;
        let int = |label: i64| key.get_int(label).and_then(cbor::Value::as_int);
        let bytes_at = |label: i64| key.get_int(label).and_then(cbor::Value::as_bytes);
        let algorithm = int(3).ok_or_else(|| invalid("no alg"))?;
        match (int(1), algorithm) {
            (Some(2), COSE_ES256) => {
                if int(-1) != Some(1) {
                    return Err(invalid("an EC2 key not on P-256"));
                }
                let (x, y) = bytes_at(-2)
                    .zip(bytes_at(-3))
                    .filter(|(x, y)| x.len() == 32 && y.len() == 32)
                    .ok_or_else(|| invalid("EC2 coordinates are not 32 bytes each"))?;
                let mut point = vec![0x04];
                point.extend_from_slice(x);
                point.extend_from_slice(y);
                p256::ecdsa::VerifyingKey::from_sec1_bytes(&point)
                    .map(PublicKey::Es256)
                    .map_err(|_| invalid("the point is not on P-256"))
            }
            (Some(1), COSE_EDDSA) => {
                if int(-1) != Some(6) {
                    return Err(invalid("an OKP key that is not Ed25519"));
                }
                let x: [u8; 32] = bytes_at(-2)
                    .and_then(|x| x.try_into().ok())
                    .ok_or_else(|| invalid("an Ed25519 key is not 32 bytes"))?;
                ed25519_dalek::VerifyingKey::from_bytes(&x)
                    .map(PublicKey::EdDsa)
                    .map_err(|_| invalid("not an Ed25519 point"))
            }
            (_, algorithm) => Err(WebauthnError::Algorithm(algorithm)),
        }
    }

    fn algorithm(&self) -> i64 {
        match self {
            PublicKey::Es256(_) => COSE_ES256,
            PublicKey::EdDsa(_) => COSE_EDDSA,
        }
    }

    fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), WebauthnError> {
        use p256::ecdsa::signature::Verifier as _;
        match self {
            // WebAuthn ES256 signatures are ASN.1 DER (§6.5.5).
            PublicKey::Es256(key) => {
                let signature = p256::ecdsa::Signature::from_der(signature)
                    .map_err(|_| WebauthnError::Signature)?;
                key.verify(message, &signature)
                    .map_err(|_| WebauthnError::Signature)
            }
            PublicKey::EdDsa(key) => {
                let signature = ed25519_dalek::Signature::from_slice(signature)
                    .map_err(|_| WebauthnError::Signature)?;
                key.verify_strict(message, &signature)
                    .map_err(|_| WebauthnError::Signature)
            }
        }
    }
}

/// The CBOR (RFC 8949) WebAuthn needs: definite-length items, integers, byte and text
/// strings, arrays, maps, simple values. Indefinite lengths, tags and floats are refused
/// (CTAP2's canonical encoding has none in these structures).
mod cbor {
    const MAX_DEPTH: usize = 16;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Value {
        Int(i128),
        Bytes(Vec<u8>),
        Text(String),
        Array(Vec<Value>),
        Map(Vec<(Value, Value)>),
        Simple(u8),
    }

    #[derive(Debug, thiserror::Error)]
    pub enum CborError {
        #[error("CBOR ends early")]
        Short,
        #[error("CBOR item not accepted: {0}")]
        Unsupported(&'static str),
        #[error("CBOR nested too deep")]
        Deep,
        #[error("CBOR has bytes after its item")]
        Trailing,
        #[error("CBOR text is not UTF-8")]
        Utf8,
    }

    impl Value {
        pub fn as_text(&self) -> Option<&str> {
            match self {
                Value::Text(text) => Some(text),
                _ => None,
            }
        }

        pub fn as_bytes(&self) -> Option<&[u8]> {
            match self {
                Value::Bytes(bytes) => Some(bytes),
                _ => None,
            }
        }

        pub fn as_int(&self) -> Option<i64> {
            match self {
                Value::Int(int) => i64::try_from(*int).ok(),
                _ => None,
            }
        }

        fn get(&self, wanted: &Value) -> Option<&Value> {
            match self {
                Value::Map(entries) => entries.iter().find(|(k, _)| k == wanted).map(|(_, v)| v),
                _ => None,
            }
        }

        pub fn get_text(&self, key: &str) -> Option<&Value> {
            self.get(&Value::Text(key.to_owned()))
        }

        pub fn get_int(&self, key: i64) -> Option<&Value> {
            self.get(&Value::Int(i128::from(key)))
        }
    }

    /// One item that is the whole of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Value, CborError> {
        let (value, used) = item(bytes, 0)?;
        if used != bytes.len() {
            return Err(CborError::Trailing);
        }
        Ok(value)
    }

    /// How many bytes the first item of `bytes` takes.
    pub fn encoded_length(bytes: &[u8]) -> Result<usize, CborError> {
        item(bytes, 0).map(|(_, used)| used)
    }

    fn item(bytes: &[u8], depth: usize) -> Result<(Value, usize), CborError> {
        if depth > MAX_DEPTH {
            return Err(CborError::Deep);
        }
        let first = *bytes.first().ok_or(CborError::Short)?;
        let (major, info) = (first >> 5, first & 0x1f);
        let (argument, mut at) = match info {
            0..=23 => (u64::from(info), 1),
            24..=27 => {
                let size = 1usize << (info - 24);
                let raw = bytes.get(1..1 + size).ok_or(CborError::Short)?;
                (
                    raw.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)),
                    1 + size,
                )
            }
            _ => return Err(CborError::Unsupported("indefinite length or reserved")),
        };
        let length = |n: u64| usize::try_from(n).map_err(|_| CborError::Short);
        let value = match major {
            0 => Value::Int(i128::from(argument)),
            1 => Value::Int(-1 - i128::from(argument)),
            2 | 3 => {
                let n = length(argument)?;
                let end = at.checked_add(n).ok_or(CborError::Short)?;
                let raw = bytes.get(at..end).ok_or(CborError::Short)?.to_vec();
                at = end;
                if major == 2 {
                    Value::Bytes(raw)
                } else {
                    Value::Text(String::from_utf8(raw).map_err(|_| CborError::Utf8)?)
                }
            }
            4 => {
                let n = length(argument)?;
                let mut items = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let (value, used) = item(bytes.get(at..).ok_or(CborError::Short)?, depth + 1)?;
                    items.push(value);
                    at += used;
                }
                Value::Array(items)
            }
            5 => {
                let n = length(argument)?;
                let mut entries = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let (key, used) = item(bytes.get(at..).ok_or(CborError::Short)?, depth + 1)?;
                    at += used;
                    let (value, used) = item(bytes.get(at..).ok_or(CborError::Short)?, depth + 1)?;
                    at += used;
                    entries.push((key, value));
                }
                Value::Map(entries)
            }
            6 => return Err(CborError::Unsupported("tag")),
            _ if info < 24 => Value::Simple(info),
            _ => return Err(CborError::Unsupported("float")),
        };
        Ok((value, at))
    }
}

#[cfg(test)]
mod tests;
