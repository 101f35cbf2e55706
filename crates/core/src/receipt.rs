//! Decision receipts: what the server signs when an approval resolves, and how every client
//! checks it before a tool runs (docs/security.md#decision-receipts).
//!
//! A receipt is a compact JWS (RFC 7515) signed with EdDSA over Ed25519 (RFC 8037): three
//! base64url parts, `header.payload.signature`. The header and payload are this crate's
//! canonical JSON ([`crate::digest::canonical_json`]), so the same receipt is the same bytes.
//! Built over `ed25519-dalek` rather than a JOSE crate: one algorithm, one header shape, so the
//! verifier has no algorithm to negotiate (no `alg: none`, no HMAC-with-the-public-key
//! confusion), and no other signature backends are compiled in. Any JOSE library verifies it
//! against the server's JWKS.
//!
//! Keys: a key's id is its RFC 7638 JWK thumbprint. The server's key set lists every key it
//! ever signed with, oldest first; each later key carries an endorsement, a JWS by the key
//! before it naming the new key's id. The key set's fingerprint is the id of its first key:
//! a client that pinned it trusts exactly the keys chained to that key, so a rotation needs no
//! new pin and a key nobody endorsed is refused.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::approval::{Approval, Decider, ResolvedBy, Scope, Verdict};
use crate::digest::{canonical_json, sha256_hex};
use crate::Millis;

/// The JWS `typ` of a decision receipt (a JWT: RFC 8725 explicit typing, so a receipt cannot
/// pass for another token the same key signs, and the reverse).
pub const RECEIPT_TYPE: &str = "countersign-receipt+jwt";
/// The JWS `typ` of a key endorsement (a rotation).
pub const ENDORSEMENT_TYPE: &str = "countersign-key+jwt";
/// The JWS `typ` of a signed audit checkpoint.
pub const CHECKPOINT_TYPE: &str = "countersign-checkpoint+jwt";
/// The receipt's issuer claim.
pub const ISSUER: &str = "countersign";

/// What did not verify; each message names the part that did not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("the receipt is missing")]
    Missing,
    #[error("the receipt is not a compact JWS: {0}")]
    Malformed(String),
    #[error("the receipt's header is not an EdDSA {expected} header: {found}")]
    Header {
        expected: &'static str,
        found: String,
    },
    #[error("the receipt is signed with key {0}, which is not in the pinned key set")]
    UnknownKey(String),
    #[error("the receipt's signature does not verify with key {0}")]
    Signature(String),
    #[error("the receipt is for approval {found}, not {expected}")]
    ApprovalId { expected: String, found: String },
    #[error("the receipt approves arguments with digest {found}, not the arguments about to run (digest {expected})")]
    ArgsDigest { expected: String, found: String },
    #[error("the receipt's verdict is {0}, not APPROVE")]
    Verdict(String),
    #[error("the receipt expired at {expired_at} (unix seconds), now is {now}")]
    Expired { expired_at: i64, now: i64 },
    #[error("the key set is not valid: {0}")]
    KeySet(String),
    #[error("the key set's fingerprint is {found}, not the pinned {expected}")]
    Fingerprint { expected: String, found: String },
}

/// A decider as the receipt names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptDecider {
    pub channel: String,
    pub user_id: String,
    pub display_name: String,
    /// The approver the decision counted for (registry id, or channel identity).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub approver: String,
}

/// The claims of a decision receipt (its JWT payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptClaims {
    pub iss: String,
    /// The approval id (also in `approval_id`, for readers that look for a JWT subject).
    pub sub: String,
    /// Signed at, unix seconds.
    pub iat: i64,
    /// Not to be acted on after, unix seconds.
    pub exp: i64,
    pub approval_id: String,
    pub agent_id: String,
    pub session_id: String,
    pub tool: String,
    /// Hex SHA-256 of the canonical JSON of the arguments decided on: the edited arguments'
    /// digest when an approver edited them.
    pub args_digest: String,
    /// `APPROVE` or `REJECT`.
    pub verdict: String,
    /// `DECISION` (people), `RULE` or `GRANT`.
    pub resolved_by: String,
    pub deciders: Vec<ReceiptDecider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    /// `ONCE` or `SESSION`.
    pub scope: String,
    pub resolved_at_ms: Millis,
    /// The audit seq of the event that resolved the approval.
    pub seq: i64,
    /// The second factors the counted approvals were made with: one
    /// `{"method": "passkey", "credential_id": …, "approver": …}` each; absent when none was
    /// asked (docs/security.md, "Passkey step-up").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_up: Option<Value>,
}

impl ReceiptClaims {
    /// The claims for `approval`, resolved by the event `seq`; `None` when it was not
    /// resolved by a verdict (pending, expired, cancelled).
    pub fn of(approval: &Approval, seq: i64, ttl_seconds: i64) -> Option<ReceiptClaims> {
        let resolution = approval.resolution.as_ref()?;
        let verdict = resolution.verdict?;
        let args_digest = if !resolution.args_digest.is_empty() {
            resolution.args_digest.clone()
        } else if let Some(edit) = &approval.edit {
            edit.args_digest.clone()
        } else {
            approval.args_digest.clone()
        };
        let session = resolution.resolved_by == ResolvedBy::Grant
            || approval
                .decisions
                .iter()
                .any(|d| d.verdict == Verdict::Approve && d.scope == Scope::Session);
        let decider = |d: &Decider| {
            let approver = approval
                .decisions
                .iter()
                .find(|decision| &decision.decider == d)
                .map(|decision| decision.approver.clone())
                .unwrap_or_default();
            ReceiptDecider {
                channel: d.channel.clone(),
                user_id: d.user_id.clone(),
                display_name: d.display_name.clone(),
                approver,
            }
        };
        // The second factors the counted approvals were made with (passkey step-up).
        let step_ups: Vec<Value> = approval
            .decisions
            .iter()
            .filter(|d| verdict == Verdict::Approve && resolution.deciders.contains(&d.decider))
            .filter_map(|d| {
                d.step_up.as_ref().map(|proof| {
                    json!({
                        "method": proof.method.as_str(),
                        "credential_id": proof.credential_id,
                        "approver": d.approver,
                    })
                })
            })
            .collect();
        let iat = resolution.resolved_at.div_euclid(1000);
        Some(ReceiptClaims {
            iss: ISSUER.to_owned(),
            sub: approval.id.clone(),
            iat,
            exp: iat.saturating_add(ttl_seconds),
            approval_id: approval.id.clone(),
            agent_id: approval.agent_id.clone(),
            session_id: approval.session_id.clone(),
            tool: approval.tool_name.clone(),
            args_digest,
            verdict: upper(verdict),
            resolved_by: upper(resolution.resolved_by),
            deciders: resolution.deciders.iter().map(decider).collect(),
            rule: resolution.rule.clone(),
            grant_id: resolution.grant_id.clone(),
            scope: if session { "SESSION" } else { "ONCE" }.to_owned(),
            resolved_at_ms: resolution.resolved_at,
            seq,
            step_up: (!step_ups.is_empty()).then_some(Value::Array(step_ups)),
        })
    }

    /// Whether these claims let the call run: an approval of `approval_id` for arguments whose
    /// digest is `args_digest`, not expired at `now_ms`.
    pub fn allows(
        &self,
        approval_id: &str,
        args_digest: &str,
        now_ms: Millis,
    ) -> Result<(), ReceiptError> {
        self.is_for(approval_id)?;
        self.approves(args_digest)?;
        self.unexpired(now_ms)
    }

    /// The receipt is about approval `approval_id`.
    pub fn is_for(&self, approval_id: &str) -> Result<(), ReceiptError> {
        if self.approval_id != approval_id || self.sub != approval_id {
            return Err(ReceiptError::ApprovalId {
                expected: approval_id.to_owned(),
                found: self.approval_id.clone(),
            });
        }
        Ok(())
    }

    /// The verdict is APPROVE, of the arguments whose digest is `args_digest`.
    pub fn approves(&self, args_digest: &str) -> Result<(), ReceiptError> {
        if self.verdict != "APPROVE" {
            return Err(ReceiptError::Verdict(self.verdict.clone()));
        }
        if self.args_digest != args_digest {
            return Err(ReceiptError::ArgsDigest {
                expected: args_digest.to_owned(),
                found: self.args_digest.clone(),
            });
        }
        Ok(())
    }

    /// Not past `exp` at `now_ms`.
    pub fn unexpired(&self, now_ms: Millis) -> Result<(), ReceiptError> {
        let now = now_ms.div_euclid(1000);
        if now >= self.exp {
            return Err(ReceiptError::Expired {
                expired_at: self.exp,
                now,
            });
        }
        Ok(())
    }
}

/// `Approve` → "APPROVE", as serde names it.
fn upper<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(part: &str, what: &str) -> Result<Vec<u8>, ReceiptError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| ReceiptError::Malformed(format!("{what} is not base64url: {e}")))
}

/// The RFC 7638 thumbprint of an Ed25519 public key: base64url SHA-256 of `{"crv","kty","x"}`.
pub fn key_id(key: &VerifyingKey) -> String {
    let members = json!({"crv": "Ed25519", "kty": "OKP", "x": b64(key.as_bytes())});
    let digest = sha256_hex(canonical_json(&members).as_bytes());
    let raw = hex::decode(digest).unwrap_or_default();
    b64(&raw)
}

/// Signs `claims` as a compact JWS of type `typ` with `key`.
pub fn sign_jws(key: &SigningKey, typ: &str, claims: &Value) -> String {
    let header = json!({"alg": "EdDSA", "kid": key_id(&key.verifying_key()), "typ": typ});
    let input = format!(
        "{}.{}",
        b64(canonical_json(&header).as_bytes()),
        b64(canonical_json(claims).as_bytes())
    );
    let signature = key.sign(input.as_bytes());
    format!("{input}.{}", b64(&signature.to_bytes()))
}

/// Checks a compact JWS of type `typ` against `keys`; its payload when the signature verifies.
pub fn verify_jws(token: &str, typ: &'static str, keys: &KeySet) -> Result<Value, ReceiptError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(ReceiptError::Missing);
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        return Err(ReceiptError::Malformed(format!(
            "{} parts, not 3",
            parts.len()
        )));
    };
    let header_value: Value = serde_json::from_slice(&unb64(header, "the header")?)
        .map_err(|e| ReceiptError::Malformed(format!("the header is not JSON: {e}")))?;
    let kid = header_value
        .get("kid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let shaped = header_value.get("alg").and_then(Value::as_str) == Some("EdDSA")
        && header_value.get("typ").and_then(Value::as_str) == Some(typ)
        && !kid.is_empty()
        && header_value.as_object().is_some_and(|o| o.len() == 3);
    if !shaped {
        return Err(ReceiptError::Header {
            expected: typ,
            found: canonical_json(&header_value),
        });
    }
    let key = keys
        .get(&kid)
        .ok_or_else(|| ReceiptError::UnknownKey(kid.clone()))?;
    let signature_bytes: [u8; 64] = unb64(signature, "the signature")?
        .try_into()
        .map_err(|_| ReceiptError::Signature(kid.clone()))?;
    key.verify(
        format!("{header}.{payload}").as_bytes(),
        &Signature::from_bytes(&signature_bytes),
    )
    .map_err(|_| ReceiptError::Signature(kid.clone()))?;
    serde_json::from_slice(&unb64(payload, "the payload")?)
        .map_err(|e| ReceiptError::Malformed(format!("the payload is not JSON: {e}")))
}

/// Signs a decision receipt.
pub fn sign_receipt(key: &SigningKey, claims: &ReceiptClaims) -> String {
    sign_jws(
        key,
        RECEIPT_TYPE,
        &serde_json::to_value(claims).unwrap_or(Value::Null),
    )
}

/// Checks a receipt's signature against `keys` and reads its claims (nothing about what it
/// allows: see [`ReceiptClaims::allows`]).
pub fn verify_receipt(token: &str, keys: &KeySet) -> Result<ReceiptClaims, ReceiptError> {
    let payload = verify_jws(token, RECEIPT_TYPE, keys)?;
    serde_json::from_value(payload)
        .map_err(|e| ReceiptError::Malformed(format!("the claims are not a receipt's: {e}")))
}

/// One public key of the set, with the endorsement by the key before it (none for the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: String,
    pub key: VerifyingKey,
    pub endorsement: Option<String>,
}

/// The public keys receipts are checked against, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySet {
    pub keys: Vec<PublicKey>,
}

impl KeySet {
    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.keys.iter().find(|k| k.kid == kid).map(|k| &k.key)
    }

    /// The key set's fingerprint: the id of its first key, to which every other is chained.
    pub fn fingerprint(&self) -> Option<&str> {
        self.keys.first().map(|k| k.kid.as_str())
    }

    /// The JWKS document (RFC 7517): each key with `kid`, `alg`, `use`, and, after the first,
    /// `countersign_endorsement`.
    pub fn to_jwks(&self) -> String {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                let mut jwk = json!({
                    "kty": "OKP", "crv": "Ed25519", "x": b64(k.key.as_bytes()),
                    "kid": k.kid, "alg": "EdDSA", "use": "sig",
                });
                if let (Some(endorsement), Some(o)) = (&k.endorsement, jwk.as_object_mut()) {
                    o.insert(
                        "countersign_endorsement".to_owned(),
                        Value::String(endorsement.clone()),
                    );
                }
                jwk
            })
            .collect();
        canonical_json(&json!({ "keys": keys }))
    }

    /// Reads a JWKS document and checks that it is one chain: each key's id is its
    /// thumbprint, and each key after the first is endorsed by the one before it.
    pub fn from_jwks(text: &str) -> Result<KeySet, ReceiptError> {
        let bad = |why: String| ReceiptError::KeySet(why);
        let doc: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let entries = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no \"keys\" array".into()))?;
        let mut set = KeySet::default();
        for (i, jwk) in entries.iter().enumerate() {
            let text = |name: &str| jwk.get(name).and_then(Value::as_str);
            if text("kty") != Some("OKP") || text("crv") != Some("Ed25519") {
                return Err(bad(format!("key {i} is not an Ed25519 key")));
            }
            let x: [u8; 32] = URL_SAFE_NO_PAD
                .decode(text("x").unwrap_or_default())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| bad(format!("key {i} has no 32-byte \"x\"")))?;
            let key = VerifyingKey::from_bytes(&x)
                .map_err(|_| bad(format!("key {i} is not an Ed25519 point")))?;
            let kid = key_id(&key);
            if text("kid") != Some(kid.as_str()) {
                return Err(bad(format!("key {i}'s kid is not its thumbprint {kid}")));
            }
            let endorsement = text("countersign_endorsement").map(str::to_owned);
            set.keys.push(PublicKey {
                kid,
                key,
                endorsement,
            });
        }
        set.check_chain()?;
        Ok(set)
    }

    /// Each key after the first is endorsed by the key before it.
    fn check_chain(&self) -> Result<(), ReceiptError> {
        if self.keys.is_empty() {
            return Err(ReceiptError::KeySet("no keys".into()));
        }
        for pair in self.keys.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let endorser = KeySet {
                keys: vec![before.clone()],
            };
            let endorsed = after
                .endorsement
                .as_deref()
                .map(|token| verify_jws(token, ENDORSEMENT_TYPE, &endorser));
            match endorsed {
                Some(Ok(claims))
                    if claims.get("endorses").and_then(Value::as_str) == Some(&after.kid) => {}
                _ => {
                    return Err(ReceiptError::KeySet(format!(
                        "key {} is not endorsed by key {}",
                        after.kid, before.kid
                    )))
                }
            }
        }
        Ok(())
    }

    /// The set, when its fingerprint is `pin` (no pin: the set as it is).
    pub fn pinned(self, pin: Option<&str>) -> Result<KeySet, ReceiptError> {
        match (pin, self.fingerprint()) {
            (Some(pin), Some(found)) if pin != found => Err(ReceiptError::Fingerprint {
                expected: pin.to_owned(),
                found: found.to_owned(),
            }),
            _ => Ok(self),
        }
    }
}

/// Checks a signed audit checkpoint against `keys`: its claims (`head_seq`, `head_hash`).
pub fn verify_checkpoint(token: &str, keys: &KeySet) -> Result<Value, ReceiptError> {
    verify_jws(token, CHECKPOINT_TYPE, keys)
}

/// The endorsement of `next` by `current`, for a rotation.
pub fn endorse(current: &SigningKey, next: &VerifyingKey, now_ms: Millis) -> String {
    sign_jws(
        current,
        ENDORSEMENT_TYPE,
        &json!({"endorses": key_id(next), "iat": now_ms.div_euclid(1000)}),
    )
}

#[cfg(test)]
mod tests;
