//! `countersign verify` and `countersign keys`: decision receipts checked by hand
//! (docs/security.md#decision-receipts).

use countersign_client::receipts::digest_of;
use countersign_client::{Client, ClientError};
use countersign_core::receipt::{verify_receipt, KeySet, ReceiptError};
use serde_json::{json, Value};

use crate::args::VerifyArgs;
use crate::exit::CliError;

/// Checks the receipt in `args`; its claims when it verifies, else an error naming what did
/// not match. Offline with `--keys`; the server is asked for its key set otherwise.
pub async fn verify(
    client: &Client,
    pin: Option<&str>,
    args: VerifyArgs,
) -> Result<Value, CliError> {
    let receipt = match std::fs::read_to_string(&args.receipt) {
        Ok(text) => text.trim().to_owned(),
        Err(_) => args.receipt.trim().to_owned(),
    };
    let jwks = match &args.keys {
        Some(path) => read(path)?,
        None => client.signing_keys().await?.jwks_json,
    };
    let refused = |error: ReceiptError| CliError::Client(ClientError::Receipt(error));
    let keys = KeySet::from_jwks(&jwks)
        .and_then(|keys| keys.pinned(pin))
        .map_err(refused)?;
    let claims = verify_receipt(&receipt, &keys).map_err(refused)?;
    if let Some(approval_id) = &args.approval {
        claims.is_for(approval_id).map_err(refused)?;
    }
    if let Some(path) = &args.args {
        claims
            .approves(&digest_of(&read(path)?)?)
            .map_err(refused)?;
    }
    if !args.expired_ok {
        claims.unexpired(now_millis()).map_err(refused)?;
    }
    Ok(json!({
        "verified": true,
        "fingerprint": keys.fingerprint(),
        "claims": serde_json::to_value(&claims).unwrap_or(Value::Null),
    }))
}

/// The server's key set and its fingerprint.
pub async fn keys(client: &Client) -> Result<Value, CliError> {
    let keys = client.signing_keys().await?;
    let jwks: Value = serde_json::from_str(&keys.jwks_json)
        .map_err(|error| CliError::Failure(format!("the server's JWKS is not JSON: {error}")))?;
    Ok(json!({ "fingerprint": keys.fingerprint, "jwks": jwks }))
}

fn read(path: &std::path::Path) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|error| CliError::Usage(format!("cannot read {}: {error}", path.display())))
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
