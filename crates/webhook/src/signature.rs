//! Standard Webhooks signatures: `webhook-signature` is `v1,` + base64(HMAC-SHA256(key,
//! "{webhook-id}.{webhook-timestamp}.{body}")) for each secret, space-separated, so that a
//! receiver rotating its secret accepts either while both are configured.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const SECRET_PREFIX: &str = "whsec_";

/// Why a signing secret cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("a webhook secret must look like whsec_<base64>: {0}")]
    NotBase64(base64::DecodeError),
    #[error("a webhook secret must decode to 24 to 64 bytes, this one has {0}")]
    Length(usize),
}

/// One signing key (the bytes behind a `whsec_…` secret).
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Parses `whsec_<base64>` (the prefix is optional, as the spec's libraries accept).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let encoded = text.trim();
        let encoded = encoded.strip_prefix(SECRET_PREFIX).unwrap_or(encoded);
        let key = STANDARD.decode(encoded).map_err(SecretError::NotBase64)?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret { key })
    }

    /// Several secrets separated by spaces (rotation: the new one and the old one).
    pub fn parse_list(text: &str) -> Result<Vec<Secret>, SecretError> {
        text.split_whitespace().map(Secret::parse).collect()
    }

    /// `v1,<base64 signature>` of one message.
    pub fn sign(&self, webhook_id: &str, timestamp: i64, body: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(format!("{webhook_id}.{timestamp}.{body}").as_bytes());
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header: one signature per secret, space-separated.
pub fn signature_header(
    secrets: &[Secret],
    webhook_id: &str,
    timestamp: i64,
    body: &str,
) -> String {
    secrets
        .iter()
        .map(|secret| secret.sign(webhook_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector of the Standard Webhooks reference libraries' tests.
    #[test]
    fn the_published_test_vector() {
        let secret = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            secret.sign(
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
                1649367553,
                r#"{"email":"test@example.com","username":"test_user"}"#
            ),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn rotation_signs_with_every_secret() {
        let secrets = Secret::parse_list(
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD  whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .unwrap();
        let header = signature_header(
            &secrets,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            r#"{"email":"test@example.com","username":"test_user"}"#,
        );
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
        assert!(parts[1].starts_with("v1,") && parts[1] != parts[0]);
    }

    #[test]
    fn bad_secrets_are_named() {
        assert!(matches!(
            Secret::parse("whsec_not base64!"),
            Err(SecretError::NotBase64(_))
        ));
        assert!(matches!(
            Secret::parse("whsec_c2hvcnQ="),
            Err(SecretError::Length(5))
        ));
    }
}
