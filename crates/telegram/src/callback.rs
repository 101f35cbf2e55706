//! The `callback_data` of the inline buttons: `cs1:<action>:<approval id>`, and on the Approve
//! button of an approval whose arguments were edited `cs1:a:<approval id>:<version>`, the
//! first [`VERSION_PREFIX_LEN`] hex digits of the edited arguments' digest (edit-on-approve:
//! a tap approves only the version its message showed).
//!
//! Telegram limits `callback_data` to 64 bytes and hands back whatever a client sends, so the
//! format carries a version (old buttons keep working or are refused cleanly after a format
//! change) and parsing trusts nothing: anything malformed is an error, never a decision.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use uuid::Uuid;

/// Telegram's limit on `callback_data`, in bytes.
pub const MAX_CALLBACK_DATA_BYTES: usize = 64;

const VERSION: &str = "cs1";

/// How much of an args digest a button carries: 64 bits, enough that no edit made meanwhile
/// can pass for the version shown, and within Telegram's 64 bytes.
pub const VERSION_PREFIX_LEN: usize = 16;

/// What a button does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ButtonAction {
    /// Approve this call (scope ONCE).
    Approve,
    /// Reject this call.
    Reject,
    /// Approve this call and later calls of the same tool in the same session (scope SESSION).
    AllowSession,
}

impl ButtonAction {
    pub const ALL: [ButtonAction; 3] = [
        ButtonAction::Approve,
        ButtonAction::Reject,
        ButtonAction::AllowSession,
    ];

    fn code(self) -> &'static str {
        match self {
            ButtonAction::Approve => "a",
            ButtonAction::Reject => "r",
            ButtonAction::AllowSession => "s",
        }
    }

    fn from_code(code: &str) -> Option<ButtonAction> {
        ButtonAction::ALL
            .into_iter()
            .find(|action| action.code() == code)
    }

    /// The button's label.
    pub fn label(self) -> &'static str {
        match self {
            ButtonAction::Approve => "✅ Approve",
            ButtonAction::Reject => "❌ Reject",
            ButtonAction::AllowSession => "🔓 Allow for session",
        }
    }
}

/// A button press: what to do with which approval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackData {
    pub action: ButtonAction,
    /// The approval id, as a lower-case hyphenated UUID.
    pub approval_id: String,
    /// The start of the args digest of the version the message showed ([`VERSION_PREFIX_LEN`]
    /// lower-case hex digits), on buttons of an edited approval.
    pub version: Option<String>,
}

impl CallbackData {
    pub fn new(action: ButtonAction, approval_id: &str) -> CallbackData {
        CallbackData {
            action,
            approval_id: approval_id.to_owned(),
            version: None,
        }
    }

    /// A button that acts only on the version of the arguments with digest `args_digest`.
    pub fn for_version(action: ButtonAction, approval_id: &str, args_digest: &str) -> CallbackData {
        CallbackData {
            version: args_digest.get(..VERSION_PREFIX_LEN).map(str::to_owned),
            ..CallbackData::new(action, approval_id)
        }
    }
}

impl fmt::Display for CallbackData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION}:{}:{}", self.action.code(), self.approval_id)?;
        match &self.version {
            Some(version) => write!(f, ":{version}"),
            None => Ok(()),
        }
    }
}

/// Why `callback_data` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallbackDataError {
    #[error("callback data is longer than {MAX_CALLBACK_DATA_BYTES} bytes")]
    TooLong,
    #[error("callback data is not of the form version:action:approval")]
    Malformed,
    #[error("callback data has an unknown version")]
    UnknownVersion,
    #[error("callback data has an unknown action")]
    UnknownAction,
    #[error("callback data has an invalid approval id")]
    InvalidApprovalId,
}

impl FromStr for CallbackData {
    type Err = CallbackDataError;

    fn from_str(data: &str) -> Result<CallbackData, CallbackDataError> {
        if data.len() > MAX_CALLBACK_DATA_BYTES {
            return Err(CallbackDataError::TooLong);
        }
        let mut parts = data.split(':');
        let (Some(version), Some(action), Some(approval_id), args_version, None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(CallbackDataError::Malformed);
        };
        let args_version = match args_version {
            None => None,
            Some(prefix)
                if prefix.len() == VERSION_PREFIX_LEN
                    && prefix
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Some(prefix.to_owned())
            }
            Some(_) => return Err(CallbackDataError::Malformed),
        };
        if version != VERSION {
            return Err(CallbackDataError::UnknownVersion);
        }
        let action = ButtonAction::from_code(action).ok_or(CallbackDataError::UnknownAction)?;
        let approval_id = Uuid::try_parse(approval_id)
            .map_err(|_| CallbackDataError::InvalidApprovalId)?
            .hyphenated()
            .to_string();
        Ok(CallbackData {
            action,
            approval_id,
            version: args_version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b";

    #[test]
    fn every_action_round_trips_within_64_bytes() {
        for action in ButtonAction::ALL {
            let data = CallbackData::new(action, ID).to_string();
            assert!(data.len() <= MAX_CALLBACK_DATA_BYTES, "{data}");
            assert!(data.starts_with("cs1:"), "{data}");
            assert_eq!(data.parse(), Ok(CallbackData::new(action, ID)));
        }
    }

    #[test]
    fn a_version_round_trips_within_64_bytes() {
        let digest = "0123456789abcdef".repeat(4);
        let data = CallbackData::for_version(ButtonAction::Approve, ID, &digest);
        let text = data.to_string();
        assert_eq!(text, format!("cs1:a:{ID}:0123456789abcdef"));
        assert!(text.len() <= MAX_CALLBACK_DATA_BYTES, "{text}");
        assert_eq!(text.parse(), Ok(data));
        for bad in ["0123456789ABCDEF", "0123456789abcde", "0123456789abcdefg"] {
            assert_eq!(
                format!("cs1:a:{ID}:{bad}").parse::<CallbackData>(),
                Err(CallbackDataError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn upper_case_ids_are_normalised() {
        let data = format!("cs1:r:{}", ID.to_uppercase());
        assert_eq!(
            data.parse(),
            Ok(CallbackData::new(ButtonAction::Reject, ID))
        );
    }

    #[test]
    fn malformed_data_is_refused() {
        let cases = [
            ("", CallbackDataError::Malformed),
            ("Hello world!", CallbackDataError::Malformed),
            ("cs1:a", CallbackDataError::Malformed),
            (
                "cs1:a:0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b:x",
                CallbackDataError::Malformed,
            ),
            (
                "cs2:a:0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b",
                CallbackDataError::UnknownVersion,
            ),
            (
                "cs1:x:0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b",
                CallbackDataError::UnknownAction,
            ),
            ("cs1:a:not-a-uuid", CallbackDataError::InvalidApprovalId),
            ("cs1:a:", CallbackDataError::InvalidApprovalId),
            (
                "cs1:a:0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b-and-far-too-long-for-64",
                CallbackDataError::TooLong,
            ),
        ];
        for (data, expected) in cases {
            assert_eq!(data.parse::<CallbackData>(), Err(expected), "{data:?}");
        }
    }
}
