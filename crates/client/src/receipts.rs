//! Checking decision receipts before a call runs (docs/security.md#decision-receipts): the
//! receipt must be signed by a key of the server's key set, that set must be the one pinned
//! (its fingerprint, the first key's id, with every later key endorsed by the one before), and
//! the receipt must approve this approval, for the digest of the arguments about to run, and
//! not be expired. Anything else is an error naming what did not match.

use std::future::Future;

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
}

impl ReceiptTrust {
    pub(crate) fn pinned(pin: Option<String>) -> ReceiptTrust {
        ReceiptTrust {
            pin: pin.filter(|pin| !pin.is_empty()),
            keys: Mutex::new(None),
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
        let mut fetched = false;
        loop {
            let keys = match cached.as_ref() {
                Some(keys) => keys,
                None => {
                    fetched = true;
                    let jwks = fetch().await?;
                    let keys = KeySet::from_jwks(&jwks)?.pinned(self.pin.as_deref())?;
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
