//! Step-up: approvals a policy rule marks (`step_up = "passkey"`) may be approved only with a
//! second factor the approver holds, verified by the server for this very approval. What the
//! factor signs is [`challenge`]: it commits to the approval id and the digest of the
//! arguments approved, so an assertion made for one approval (or one version of its
//! arguments) approves nothing else.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::digest::canonical_json;

/// The second factor an approval needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepUp {
    /// A WebAuthn assertion of a passkey the approver registered in the web inbox.
    Passkey,
}

impl StepUp {
    pub fn as_str(self) -> &'static str {
        match self {
            StepUp::Passkey => "passkey",
        }
    }

    /// The policy's spelling (`"passkey"`).
    pub fn parse(name: &str) -> Result<StepUp, String> {
        match name {
            "passkey" => Ok(StepUp::Passkey),
            other => Err(format!("step_up {other:?} is not known (\"passkey\" is)")),
        }
    }
}

/// The second factor the server verified for one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepUpProof {
    pub method: StepUp,
    /// The passkey's credential id, base64url.
    pub credential_id: String,
}

/// The WebAuthn challenge of a step-up: SHA-256 over the canonical JSON of
/// `["countersign step-up v1", approval id, arguments digest, nonce]`. The nonce (random,
/// from the inbox) makes every challenge unpredictable, as WebAuthn asks (§13.4.3); what binds
/// the assertion to one call is the approval id and the digest.
pub fn challenge(approval_id: &str, args_digest: &str, nonce: &str) -> [u8; 32] {
    let encoded = canonical_json(&json!([
        "countersign step-up v1",
        approval_id,
        args_digest,
        nonce
    ]));
    Sha256::digest(encoded.as_bytes()).into()
}
