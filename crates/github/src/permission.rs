//! A commenter's permission on a repository, read from the raw JSON of
//! `GET /repos/{owner}/{repo}/collaborators/{username}/permission`.
//!
//! GitHub has answered this in several shapes: the legacy `{"permission": "admin"|"write"|
//! "read"|"none", "user": {…}}`, and a newer one that adds `role_name` and `user.permissions`
//! (`admin`, `maintain`, `push`, `triage`, `pull`) and has put `maintain` into `permission`.
//! Typed models reject some of these, so the fields are read one by one. Deciding needs write
//! access or more; anything not recognised denies.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Level {
    Admin,
    Maintain,
    Write,
    Triage,
    Read,
    None,
    /// A value this worker does not know; never enough to decide.
    Unknown(String),
}

impl Level {
    fn parse(value: &str) -> Level {
        match value {
            "admin" => Level::Admin,
            "maintain" => Level::Maintain,
            "write" => Level::Write,
            "triage" => Level::Triage,
            "read" => Level::Read,
            "none" => Level::None,
            other => Level::Unknown(other.to_string()),
        }
    }

    fn can_write(&self) -> bool {
        matches!(self, Level::Admin | Level::Maintain | Level::Write)
    }

    /// A known level below write: an explicit "no".
    fn denies_write(&self) -> bool {
        matches!(self, Level::Triage | Level::Read | Level::None)
    }

    pub fn as_str(&self) -> &str {
        match self {
            Level::Admin => "admin",
            Level::Maintain => "maintain",
            Level::Write => "write",
            Level::Triage => "triage",
            Level::Read => "read",
            Level::None => "none",
            Level::Unknown(other) => other,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    /// The `permission` field.
    pub level: Level,
    /// Write access or more, with no field of the answer saying otherwise.
    pub can_write: bool,
}

impl Permission {
    /// What a user the repository does not know (404) has.
    pub fn none() -> Permission {
        Permission {
            level: Level::None,
            can_write: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PermissionError {
    #[error("the permission answer is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("the permission answer has no string field `permission`")]
    NoPermissionField,
}

/// Reads the answer: `permission` must be write, maintain or admin; `role_name` (when it is a
/// known role) and `user.permissions` (when present) must not contradict it.
pub fn parse_permission(body: &[u8]) -> Result<Permission, PermissionError> {
    let answer: Value = serde_json::from_slice(body)?;
    let level = answer
        .get("permission")
        .and_then(Value::as_str)
        .map(Level::parse)
        .ok_or(PermissionError::NoPermissionField)?;
    // Custom repository roles have their own names; the base permission above covers them.
    let role_denies = answer
        .get("role_name")
        .and_then(Value::as_str)
        .is_some_and(|role| Level::parse(role).denies_write());
    let flags_deny = match answer.pointer("/user/permissions") {
        Some(flags) => !["admin", "maintain", "push"]
            .iter()
            .any(|flag| flags.get(flag).and_then(Value::as_bool) == Some(true)),
        None => false,
    };
    let can_write = level.can_write() && !role_denies && !flags_deny;
    Ok(Permission { level, can_write })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN_LEGACY: &str = include_str!(
        "../../testkit/fixtures/github/rest.collaborator-permission.admin.legacy-shape.hub4j.json"
    );
    const READ_LEGACY: &str = include_str!(
        "../../testkit/fixtures/github/rest.collaborator-permission.read.legacy-shape.hub4j.json"
    );
    const MAINTAIN: &str = include_str!(
        "../../testkit/fixtures/github/rest.collaborator-permission.maintain.hub4j.json"
    );

    #[test]
    fn recorded_answers() {
        let admin = parse_permission(ADMIN_LEGACY.as_bytes()).unwrap();
        assert_eq!(admin.level, Level::Admin);
        assert!(admin.can_write);

        let read = parse_permission(READ_LEGACY.as_bytes()).unwrap();
        assert_eq!(read.level, Level::Read);
        assert!(!read.can_write);

        let maintain = parse_permission(MAINTAIN.as_bytes()).unwrap();
        assert_eq!(maintain.level, Level::Maintain);
        assert!(maintain.can_write);
    }

    #[test]
    fn documented_values() {
        for (value, allowed) in [
            ("admin", true),
            ("maintain", true),
            ("write", true),
            ("triage", false),
            ("read", false),
            ("none", false),
        ] {
            let body = format!(r#"{{"permission":"{value}","user":{{"login":"a"}}}}"#);
            assert_eq!(
                parse_permission(body.as_bytes()).unwrap().can_write,
                allowed,
                "{value}"
            );
        }
    }

    #[test]
    fn unknown_values_and_contradictions_deny() {
        let unknown = parse_permission(br#"{"permission":"superuser"}"#).unwrap();
        assert_eq!(unknown.level, Level::Unknown("superuser".to_string()));
        assert!(!unknown.can_write);

        let capitalised = parse_permission(br#"{"permission":"Write"}"#).unwrap();
        assert!(!capitalised.can_write);

        let role_says_read =
            parse_permission(br#"{"permission":"write","role_name":"read"}"#).unwrap();
        assert!(!role_says_read.can_write);

        let flags_say_no = parse_permission(
            br#"{"permission":"write","user":{"permissions":{"admin":false,"maintain":false,"push":false,"triage":true,"pull":true}}}"#,
        )
        .unwrap();
        assert!(!flags_say_no.can_write);

        // A custom role name is not a contradiction: the base permission decides.
        let custom = parse_permission(br#"{"permission":"write","role_name":"deployer"}"#).unwrap();
        assert!(custom.can_write);
    }

    #[test]
    fn malformed_answers_are_errors() {
        assert!(parse_permission(b"not json").is_err());
        assert!(parse_permission(br#"{"role_name":"admin"}"#).is_err());
        assert!(parse_permission(br#"{"permission":null}"#).is_err());
    }
}
