//! countersign's one-time decision links, shared by the channels that decide through a URL
//! (the webhook channel's events, ntfy's action buttons).
//!
//! - [`new_token`] / [`token_hash`]: a link is `{public_url}/decide/{token}`, the token 256
//!   random bits; only its SHA-256 is stored, so the store cannot leak usable links and a
//!   forged or altered token names no link.
//! - [`store::LinkStore`]: the links (SQLite, in the worker's own database): a link decides
//!   once and takes its siblings (the other verdicts sent to the same destination) with it,
//!   expires with the approval, and can be revoked.
//! - [`pages::Pages`]: `GET /decide/{token}` shows the approval and a confirmation form (a
//!   GET never decides: link scanners prefetch); the form's POST, carrying a token bound to
//!   the link by HMAC ([`pages::Pages::form_token`]), decides as the link's approver.

pub mod pages;
pub mod store;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// A fresh link token: 256 random bits, URL-safe.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// What is stored of a token.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// When an approval's links stop working: when the approval expires (never, without an
/// expiry), in milliseconds since the Unix epoch.
pub fn expires_ms(approval: &countersign_client::pb::Approval) -> i64 {
    approval.expires_at.as_ref().map_or(i64::MAX, |t| {
        t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
    })
}

/// What a link decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkVerdict {
    Approve,
    Reject,
    /// Approve, and approve the same tool for the rest of the agent's session.
    AllowSession,
}

impl LinkVerdict {
    /// The name stored with the link.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkVerdict::Approve => "approve",
            LinkVerdict::Reject => "reject",
            LinkVerdict::AllowSession => "allow_session",
        }
    }

    /// Reads a stored name; an unknown one is `None` (the link then decides nothing).
    pub fn parse(name: &str) -> Option<LinkVerdict> {
        match name {
            "approve" => Some(LinkVerdict::Approve),
            "reject" => Some(LinkVerdict::Reject),
            "allow_session" => Some(LinkVerdict::AllowSession),
            _ => None,
        }
    }

    /// The button's word.
    pub fn label(self) -> &'static str {
        match self {
            LinkVerdict::Approve => "Approve",
            LinkVerdict::Reject => "Reject",
            LinkVerdict::AllowSession => "Allow for session",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_stored_hashed() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert_eq!(URL_SAFE_NO_PAD.decode(&a).unwrap().len(), 32);
        assert_eq!(token_hash(&a).len(), 64);
        assert_ne!(token_hash(&a), a);
    }

    #[test]
    fn verdict_names_round_trip_and_unknown_ones_are_refused() {
        for verdict in [
            LinkVerdict::Approve,
            LinkVerdict::Reject,
            LinkVerdict::AllowSession,
        ] {
            assert_eq!(LinkVerdict::parse(verdict.as_str()), Some(verdict));
        }
        assert_eq!(LinkVerdict::parse("approve_all"), None);
    }
}
