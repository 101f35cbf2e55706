//! The server's receipt signing keys (docs/security.md#decision-receipts): a key set in
//! `receipt-keys.json` in the keys directory, mode 0600, made with one key on first start.
//!
//! The file is a JWKS of every public key the server ever signed with (oldest first, each
//! later one endorsed by the one before it, see `countersign_core::receipt`) plus the current
//! private key. `countersign-server keys rotate` makes a new key, endorsed by the current one,
//! and drops the old private key; the old public keys stay, so old receipts still verify. A
//! running server reads the file at start: restart it (every replica) after a rotation.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use countersign_core::receipt::{self, KeySet, PublicKey, ReceiptClaims};
use countersign_core::{Approval, Millis};
use ed25519_dalek::SigningKey;
use rand::RngCore as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// The key set's file in the keys directory.
pub const KEYS_FILE: &str = "receipt-keys.json";

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("cannot read or write the receipt keys {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the receipt keys {path} are not valid: {why}")]
    Invalid { path: PathBuf, why: String },
}

/// The current signing key and every public key, with how long receipts are good for.
pub struct ReceiptKeys {
    current: SigningKey,
    set: KeySet,
    ttl_seconds: i64,
}

impl ReceiptKeys {
    /// Reads the key set in `dir`, creating it with a new key when there is none. Two
    /// replicas starting at once on one shared directory: one creates it, the other reads it.
    pub fn load_or_create(dir: &Path, ttl_seconds: u32) -> Result<ReceiptKeys, KeysError> {
        let path = dir.join(KEYS_FILE);
        let io = |source| KeysError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let fresh = new_key();
        let created = ReceiptKeys {
            set: KeySet {
                keys: vec![public(&fresh, None)],
            },
            current: fresh,
            ttl_seconds: i64::from(ttl_seconds),
        };
        match write_file(&path, &created.file_text(), true) {
            Ok(()) => {
                tracing::info!(path = %path.display(), kid = created.kid(), "made a new receipt signing key");
                Ok(created)
            }
            Err(KeysError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                read(&path, ttl_seconds)
            }
            Err(e) => Err(e),
        }
    }

    /// `keys rotate`: a new current key endorsed by the old one; the old public key stays.
    /// Returns (old kid, new kid).
    pub fn rotate(dir: &Path, now: Millis) -> Result<(String, String), KeysError> {
        let mut keys = ReceiptKeys::load_or_create(dir, 0)?;
        let old = keys.kid().to_owned();
        let next = new_key();
        let endorsement = receipt::endorse(&keys.current, &next.verifying_key(), now);
        keys.set.keys.push(public(&next, Some(endorsement)));
        keys.current = next;
        write_file(&dir.join(KEYS_FILE), &keys.file_text(), false)?;
        Ok((old, keys.kid().to_owned()))
    }

    /// The current key's id.
    pub fn kid(&self) -> &str {
        self.set.keys.last().map(|k| k.kid.as_str()).unwrap_or("")
    }

    /// The key set's fingerprint: its first key's id.
    pub fn fingerprint(&self) -> &str {
        self.set.fingerprint().unwrap_or("")
    }

    /// The public keys as a JWKS document.
    pub fn jwks(&self) -> String {
        self.set.to_jwks()
    }

    /// The receipt of `approval`, resolved by the event `seq`; none without a verdict.
    pub fn sign(&self, approval: &Approval, seq: i64) -> Option<String> {
        let claims = ReceiptClaims::of(approval, seq, self.ttl_seconds)?;
        Some(receipt::sign_receipt(&self.current, &claims))
    }

    /// A compact JWS of type `typ` over `claims`, signed with the current key (the OpenID
    /// CIBA tokens, `crate::standards`).
    pub fn sign_jws(&self, typ: &str, claims: &Value) -> String {
        receipt::sign_jws(&self.current, typ, claims)
    }

    /// A 32-byte secret for `purpose`, derived from the current private key: it changes with
    /// a rotation and is never stored.
    pub fn derived_secret(&self, purpose: &str) -> [u8; 32] {
        let mut hash = Sha256::new();
        hash.update(b"countersign derived secret\0");
        hash.update(purpose.as_bytes());
        hash.update([0]);
        hash.update(self.current.to_bytes());
        hash.finalize().into()
    }

    /// A signed checkpoint of the audit chain's head.
    pub fn checkpoint(&self, claims: &Value) -> String {
        receipt::sign_jws(&self.current, receipt::CHECKPOINT_TYPE, claims)
    }

    fn file_text(&self) -> String {
        let mut doc: Value = serde_json::from_str(&self.jwks()).unwrap_or(Value::Null);
        if let Some(o) = doc.as_object_mut() {
            o.insert(
                "current".into(),
                json!({"kid": self.kid(), "d": URL_SAFE_NO_PAD.encode(self.current.to_bytes())}),
            );
        }
        format!("{doc:#}\n")
    }
}

fn new_key() -> SigningKey {
    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    SigningKey::from_bytes(&seed)
}

fn public(key: &SigningKey, endorsement: Option<String>) -> PublicKey {
    PublicKey {
        kid: receipt::key_id(&key.verifying_key()),
        key: key.verifying_key(),
        endorsement,
    }
}

fn read(path: &Path, ttl_seconds: u32) -> Result<ReceiptKeys, KeysError> {
    let invalid = |why: String| KeysError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let set = KeySet::from_jwks(&text).map_err(|e| invalid(e.to_string()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let seed: [u8; 32] = doc
        .pointer("/current/d")
        .and_then(Value::as_str)
        .and_then(|d| URL_SAFE_NO_PAD.decode(d).ok())
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| invalid("no 32-byte current private key \"d\"".into()))?;
    let current = SigningKey::from_bytes(&seed);
    let kid = receipt::key_id(&current.verifying_key());
    if set.keys.last().map(|k| &k.kid) != Some(&kid) {
        return Err(invalid(format!(
            "the current private key ({kid}) is not the newest public key"
        )));
    }
    Ok(ReceiptKeys {
        current,
        set,
        ttl_seconds: i64::from(ttl_seconds),
    })
}

/// Writes the file, mode 0600, whole or not at all: through a temporary file that is then
/// linked in (`create_new`: only where no file is, so a replica starting at the same moment
/// never reads half a file) or renamed over the old one.
fn write_file(path: &Path, text: &str, create_new: bool) -> Result<(), KeysError> {
    let temporary = path.with_extension(format!("json.{}", rand::random::<u64>()));
    let io = |source| KeysError::Io {
        path: path.to_path_buf(),
        source,
    };
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        if create_new {
            std::fs::hard_link(&temporary, path)
        } else {
            std::fs::rename(&temporary, path)
        }
    })();
    let _ = std::fs::remove_file(&temporary);
    written.map_err(io)
}
