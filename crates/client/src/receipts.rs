//! Checking decision receipts before a call runs (docs/security.md#decision-receipts): the
//! receipt must be signed by a key of the server's key set, that set must be the one pinned
//! (its fingerprint, the first key's id, with every later key endorsed by the one before), and
//! the receipt must approve this approval, for the digest of the arguments about to run, and
//! not be expired. Anything else is an error naming what did not match.

use std::future::Future;
use std::path::{Path, PathBuf};

use countersign_core::digest::{args_digest, parse_strict};
use countersign_core::receipt::{verify_receipt, KeySet, ReceiptClaims, ReceiptError};
use countersign_proto::v1 as pb;
use tokio::sync::Mutex;

use crate::error::ClientError;

/// The pinned fingerprint and the key set last read from the server.
#[derive(Debug, Default)]
pub(crate) struct ReceiptTrust {
    pin: Option<String>,
    keys: Mutex<Option<KeySet>>,
    /// The file that keeps the pinned key set between processes (a hook runs once per call).
    cache: Option<PathBuf>,
}

impl ReceiptTrust {
    pub(crate) fn pinned(pin: Option<String>) -> ReceiptTrust {
        ReceiptTrust {
            pin: pin.filter(|pin| !pin.is_empty()),
            keys: Mutex::new(None),
            cache: None,
        }
    }

    /// The same trust, keeping the pinned key set in `dir` (as `<pin>.jwks.json`). Only a
    /// pinned set is kept: the pin authenticates the file's content (the first key's id is
    /// its thumbprint and every later key is endorsed by the one before), so a file changed by
    /// anyone else is refused like a server's set would be, and then read again from the
    /// server. Without a pin, or with a pin that is not a key id, nothing is kept.
    pub(crate) fn cached_in(&self, dir: &Path) -> ReceiptTrust {
        let is_key_id = |pin: &&String| {
            pin.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        ReceiptTrust {
            pin: self.pin.clone(),
            keys: Mutex::new(None),
            cache: self
                .pin
                .as_ref()
                .filter(is_key_id)
                .map(|pin| dir.join(format!("{pin}.jwks.json"))),
        }
    }

    /// The key set kept in the cache file, when there is one and it is the pinned set.
    async fn read_cache(&self) -> Option<KeySet> {
        let text = tokio::fs::read_to_string(self.cache.as_ref()?).await.ok()?;
        KeySet::from_jwks(&text)
            .and_then(|keys| keys.pinned(self.pin.as_deref()))
            .ok()
    }

    /// Keeps `jwks`, a set that passed the pin, for the next process. A cache that cannot be
    /// written costs one more read of the server's set next time, nothing else.
    async fn write_cache(&self, jwks: &str) {
        let Some(path) = &self.cache else { return };
        let written = async {
            if let Some(dir) = path.parent() {
                tokio::fs::create_dir_all(dir).await?;
            }
            // Written aside and renamed: a reader never sees half a file.
            let partial = path.with_extension(format!("{}.partial", std::process::id()));
            tokio::fs::write(&partial, jwks).await?;
            tokio::fs::rename(&partial, path).await
        };
        if let Err(error) = written.await {
            tracing::debug!(path = %path.display(), %error, "the receipt key set is not cached");
        }
    }

    /// Verifies `receipt` for approval `approval_id` and arguments with digest `args_digest`.
    /// `fetch` reads the server's JWKS; it is called when no key set was read yet, and once
    /// more when the receipt names a key the set read before does not have (a rotation).
    pub(crate) async fn verify<F, Fut>(
        &self,
        receipt: &str,
        approval_id: &str,
        args_digest: &str,
        fetch: F,
    ) -> Result<ReceiptClaims, ClientError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<String, ClientError>>,
    {
        if receipt.is_empty() {
            return Err(ReceiptError::Missing.into());
        }
        let mut cached = self.keys.lock().await;
        if cached.is_none() {
            *cached = self.read_cache().await;
        }
        let mut fetched = false;
        loop {
            let keys = match cached.as_ref() {
                Some(keys) => keys,
                None => {
                    fetched = true;
                    let jwks = fetch().await?;
                    let keys = KeySet::from_jwks(&jwks)?.pinned(self.pin.as_deref())?;
                    self.write_cache(&jwks).await;
                    cached.insert(keys)
                }
            };
            match verify_receipt(receipt, keys) {
                Err(ReceiptError::UnknownKey(_)) if !fetched => *cached = None,
                Err(e) => return Err(e.into()),
                Ok(claims) => {
                    claims.allows(approval_id, args_digest, now_millis())?;
                    return Ok(claims);
                }
            }
        }
    }
}

/// The digest of an arguments JSON text as the server computes it: SHA-256 of its canonical
/// JSON, parsed strictly.
pub fn digest_of(arguments_json: &str) -> Result<String, ClientError> {
    parse_strict(arguments_json)
        .map(|value| args_digest(&value))
        .map_err(|e| ClientError::InvalidArgument(format!("the arguments: {e}")))
}

/// The digest of the arguments that run once `approval` is approved: the edited arguments
/// when an approver edited them (as received, so an altered edit does not match its
/// receipt), else those requested (`requested_digest`, computed from what was sent).
pub fn digest_to_run(
    approval: &pb::Approval,
    requested_digest: &str,
) -> Result<String, ClientError> {
    if approval.edited_arguments_json.is_empty() && approval.edited_args_digest.is_empty() {
        Ok(requested_digest.to_owned())
    } else {
        digest_of(&approval.edited_arguments_json)
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
