//! Request validation: every refusal names the field, and nothing is stored.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::digest::{args_digest, parse_strict};
use crate::fields::{
    identifier, optional, required, required_identifier, single_line, validate_channel,
};
use crate::{ApprovalRequest, Decider, Error, FollowUp, GroupQuorum, Risk, Route};

/// Bounds on what a request may carry. The server reads them from its configuration.
/// Label keys the server writes itself (observe mode's `policy.observed` and
/// `policy.observed_rule`): an agent's request may not carry them, or it could make the policy
/// report, `/metrics` and reviewers believe what the rules would have done.
pub const RESERVED_LABEL_PREFIX: &str = "policy.";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_arguments_bytes: usize,
    pub max_routes: usize,
    pub max_labels: usize,
    pub max_required_approvals: u32,
    pub min_ttl_seconds: u32,
    pub max_ttl_seconds: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_arguments_bytes: 64 * 1024,
            max_routes: 16,
            max_labels: 32,
            max_required_approvals: 16,
            min_ttl_seconds: 1,
            max_ttl_seconds: 7 * 24 * 3600,
        }
    }
}

/// A request as it arrives, before validation. `risk` is `None` when unspecified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInput {
    pub agent_id: String,
    pub session_id: String,
    pub requester: String,
    pub idempotency_key: String,
    pub tool_name: String,
    pub arguments_json: String,
    pub action: String,
    pub reason: String,
    pub risk: Option<Risk>,
    pub routes: Vec<Route>,
    pub required_approvals: u32,
    pub ttl_seconds: u32,
    pub labels: BTreeMap<String, String>,
    /// Group names and quorums only; the server fills in the rest.
    pub approver_groups: Vec<GroupQuorum>,
    /// The requested follow-up; `escalate_to` names the group only.
    pub follow_up: Option<FollowUp>,
    /// See [`ApprovalRequest::withdraw_when_caller_leaves`].
    pub withdraw_when_caller_leaves: bool,
}

/// The most groups one request may name.
const MAX_GROUPS: usize = 8;

const MAX_ID_CHARS: usize = 128;
const MAX_KEY_CHARS: usize = 256;
const MAX_ACTION_CHARS: usize = 1024;
const MAX_REASON_CHARS: usize = 4096;
const MAX_TARGET_CHARS: usize = 256;
const MAX_LABEL_KEY_CHARS: usize = 64;
const MAX_LABEL_VALUE_CHARS: usize = 256;
const MAX_DISPLAY_NAME_CHARS: usize = 256;

pub fn validate_request(input: RequestInput, limits: &Limits) -> Result<ApprovalRequest, Error> {
    required_identifier("agent_id", &input.agent_id, MAX_ID_CHARS)?;
    identifier("session_id", &input.session_id, MAX_ID_CHARS)?;
    identifier("requester", &input.requester, MAX_KEY_CHARS)?;
    required_identifier("idempotency_key", &input.idempotency_key, MAX_KEY_CHARS)?;
    validate_tool_name(&input.tool_name)?;
    optional("action", &input.action, MAX_ACTION_CHARS)?;
    optional("reason", &input.reason, MAX_REASON_CHARS)?;
    let risk = input.risk.ok_or_else(|| {
        Error::invalid(
            "risk",
            "is required (RISK_LOW, RISK_MEDIUM, RISK_HIGH or RISK_CRITICAL)",
        )
    })?;

    let args_digest = validate_arguments("arguments_json", &input.arguments_json, limits)?;

    if input.routes.len() > limits.max_routes {
        return Err(Error::invalid(
            "routes",
            format!(
                "has {} entries, at most {} are allowed",
                input.routes.len(),
                limits.max_routes
            ),
        ));
    }
    for (i, route) in input.routes.iter().enumerate() {
        validate_channel(&format!("routes[{i}].channel"), &route.channel)?;
        identifier(
            &format!("routes[{i}].target"),
            &route.target,
            MAX_TARGET_CHARS,
        )?;
    }

    if input.required_approvals > limits.max_required_approvals {
        return Err(Error::invalid(
            "required_approvals",
            format!("must be at most {}", limits.max_required_approvals),
        ));
    }
    let ttl_seconds = match input.ttl_seconds {
        0 => None,
        ttl if ttl < limits.min_ttl_seconds || ttl > limits.max_ttl_seconds => {
            return Err(Error::invalid(
                "ttl_seconds",
                format!(
                    "must be between {} and {} seconds (0 for the server default)",
                    limits.min_ttl_seconds, limits.max_ttl_seconds
                ),
            ))
        }
        ttl => Some(ttl),
    };

    if input.labels.len() > limits.max_labels {
        return Err(Error::invalid(
            "labels",
            format!(
                "has {} entries, at most {} are allowed",
                input.labels.len(),
                limits.max_labels
            ),
        ));
    }
    for (key, value) in &input.labels {
        required_identifier("labels key", key, MAX_LABEL_KEY_CHARS)?;
        if key.starts_with(RESERVED_LABEL_PREFIX) {
            return Err(Error::invalid(
                "labels key",
                format!("{key:?}: keys starting with {RESERVED_LABEL_PREFIX:?} are written by the server (observe mode), not by agents"),
            ));
        }
        optional(&format!("labels[{key}]"), value, MAX_LABEL_VALUE_CHARS)?;
    }

    if input.approver_groups.len() > MAX_GROUPS {
        return Err(Error::invalid(
            "approver_groups",
            format!(
                "has {} entries, at most {MAX_GROUPS} are allowed",
                input.approver_groups.len()
            ),
        ));
    }
    for (i, group) in input.approver_groups.iter().enumerate() {
        required_identifier(&format!("approver_groups[{i}].group"), &group.group, 64)?;
        if group.required > limits.max_required_approvals {
            return Err(Error::invalid(
                format!("approver_groups[{i}].required"),
                format!("must be at most {}", limits.max_required_approvals),
            ));
        }
    }
    if let Some(target) = input
        .follow_up
        .as_ref()
        .and_then(|f| f.escalate_to.as_ref())
    {
        required_identifier("escalate_to", &target.group, 64)?;
    }

    Ok(ApprovalRequest {
        args_digest,
        agent_id: input.agent_id,
        session_id: input.session_id,
        requester: input.requester,
        idempotency_key: input.idempotency_key,
        tool_name: input.tool_name,
        arguments_json: input.arguments_json,
        action: input.action,
        reason: input.reason,
        risk,
        routes: input.routes,
        required_approvals: input.required_approvals.max(1),
        ttl_seconds,
        labels: input.labels,
        policy_rule: None,
        separation_of_duties: true,
        grant_scope: String::new(),
        approver_groups: input.approver_groups,
        follow_up: input.follow_up,
        withdraw_when_caller_leaves: input.withdraw_when_caller_leaves,
        step_up: None,
    })
}

/// Checks arguments (a request's, or an approver's edit of them) and returns their digest:
/// within the size limit, strict JSON (no duplicate keys, no number that cannot be represented
/// exactly) and an object. `field` names them in the refusal.
pub fn validate_arguments(field: &str, text: &str, limits: &Limits) -> Result<String, Error> {
    if text.len() > limits.max_arguments_bytes {
        return Err(Error::invalid(
            field,
            format!(
                "is {} bytes, more than the limit of {} bytes",
                text.len(),
                limits.max_arguments_bytes
            ),
        ));
    }
    let arguments: Value =
        parse_strict(text).map_err(|e| Error::invalid(field, format!("is not accepted: {e}")))?;
    if !arguments.is_object() {
        return Err(Error::invalid(field, "must be a JSON object"));
    }
    Ok(args_digest(&arguments))
}

/// Checks an expected arguments digest: empty, or 64 lowercase hex digits.
pub fn validate_digest(field: &str, digest: &str) -> Result<(), Error> {
    let well_formed = digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if digest.is_empty() || well_formed {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            "must be a hex SHA-256 digest (64 lowercase hex digits) as in args_digest",
        ))
    }
}

/// Checks the decider of a `Decide` call and a free-text reason.
pub fn validate_decider(
    decider: &Decider,
    reason: &str,
    idempotency_key: &str,
) -> Result<(), Error> {
    validate_channel("decider.channel", &decider.channel)?;
    required_identifier("decider.user_id", &decider.user_id, MAX_KEY_CHARS)?;
    single_line(
        "decider.display_name",
        &decider.display_name,
        MAX_DISPLAY_NAME_CHARS,
    )?;
    optional("reason", reason, MAX_REASON_CHARS)?;
    required_identifier("idempotency_key", idempotency_key, MAX_KEY_CHARS)
}

pub fn validate_tool_name(tool_name: &str) -> Result<(), Error> {
    required("tool_name", tool_name, 128)?;
    if !tool_name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-'))
    {
        return Err(Error::invalid(
            "tool_name",
            "may hold only letters, digits and . _ : / -",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> RequestInput {
        RequestInput {
            agent_id: "agent".into(),
            idempotency_key: "call-1".into(),
            tool_name: "bash".into(),
            arguments_json: r#"{"cmd":"ls"}"#.into(),
            risk: Some(Risk::Low),
            ..RequestInput::default()
        }
    }

    fn field_of(result: Result<ApprovalRequest, Error>) -> String {
        match result {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_minimal_request_and_defaults_the_quorum() {
        let mut multiline = input();
        multiline.reason = "line one\nline two".into();
        multiline.requester = "Ève Dupont".into();
        let request = validate_request(multiline, &Limits::default()).unwrap();
        assert_eq!(request.required_approvals, 1);
        assert_eq!(request.ttl_seconds, None);
        assert_eq!(request.args_digest.len(), 64);
    }

    #[test]
    fn each_bad_field_is_named() {
        let limits = Limits::default();
        type Mutation = Box<dyn Fn(&mut RequestInput)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("agent_id", Box::new(|i| i.agent_id.clear())),
            ("idempotency_key", Box::new(|i| i.idempotency_key.clear())),
            ("tool_name", Box::new(|i| i.tool_name = "rm -rf".into())),
            ("tool_name", Box::new(|i| i.tool_name = "x".repeat(129))),
            ("risk", Box::new(|i| i.risk = None)),
            (
                "arguments_json",
                Box::new(|i| i.arguments_json = "[1]".into()),
            ),
            (
                "arguments_json",
                Box::new(|i| i.arguments_json = "{".into()),
            ),
            (
                "arguments_json",
                Box::new(|i| i.arguments_json = format!(r#"{{"a":"{}"}}"#, "x".repeat(70_000))),
            ),
            (
                "routes",
                Box::new(|i| {
                    i.routes = vec![
                        Route {
                            channel: "cli".into(),
                            target: String::new()
                        };
                        17
                    ]
                }),
            ),
            (
                "routes[0].channel",
                Box::new(|i| {
                    i.routes = vec![Route {
                        channel: "Tele gram".into(),
                        target: String::new(),
                    }]
                }),
            ),
            ("ttl_seconds", Box::new(|i| i.ttl_seconds = 8 * 24 * 3600)),
            (
                "required_approvals",
                Box::new(|i| i.required_approvals = 17),
            ),
            ("reason", Box::new(|i| i.reason = "x".repeat(4097))),
            ("session_id", Box::new(|i| i.session_id = "a\u{0}b".into())),
            ("agent_id", Box::new(|i| i.agent_id = "a\nb".into())),
            (
                "agent_id",
                Box::new(|i| i.agent_id = "ag\u{202E}ent".into()),
            ),
            (
                "requester",
                Box::new(|i| i.requester = "alice\u{200B}".into()),
            ),
            ("requester", Box::new(|i| i.requester = "e\u{301}ve".into())),
            ("requester", Box::new(|i| i.requester = " alice".into())),
            (
                "idempotency_key",
                Box::new(|i| i.idempotency_key = "k\tk".into()),
            ),
            (
                "action",
                Box::new(|i| i.action = "run \u{2067}ls\u{2069}".into()),
            ),
            ("reason", Box::new(|i| i.reason = "ok\u{FEFF}".into())),
            (
                "labels key",
                Box::new(|i| {
                    i.labels.insert("team\u{2028}".into(), "x".into());
                }),
            ),
            (
                "routes[0].target",
                Box::new(|i| {
                    i.routes = vec![Route {
                        channel: "github".into(),
                        target: "acme/ops#1\n".into(),
                    }]
                }),
            ),
            (
                "arguments_json",
                Box::new(|i| i.arguments_json = r#"{"cmd":"ls","cmd":"rm"}"#.into()),
            ),
        ];
        for (field, mutate) in cases {
            let mut bad = input();
            mutate(&mut bad);
            assert_eq!(field_of(validate_request(bad, &limits)), field);
        }
    }

    /// The field-length table of docs/security.md: each row's field and its limit.
    fn documented_lengths() -> Vec<(String, usize)> {
        let doc = include_str!("../../../docs/security.md");
        let section = doc
            .split("## Limits")
            .nth(1)
            .expect("docs/security.md has a \"Limits\" section");
        section
            .lines()
            .skip_while(|line| !line.starts_with("| field | at most |"))
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let limit = cells[2]
                    .parse()
                    .unwrap_or_else(|_| panic!("not a number of characters: {line}"));
                (cells[1].to_owned(), limit)
            })
            .collect()
    }

    /// Validates a request, or a decision, whose documented `field` holds `text`; the field
    /// a refusal names, or `None` when accepted.
    fn refused_field(field: &str, text: String) -> Option<String> {
        let mut request = input();
        let mut decider = Decider {
            channel: "telegram".into(),
            user_id: "42".into(),
            display_name: "Alice".into(),
        };
        let mut decision_reason = String::new();
        match field {
            "`agent_id`" => request.agent_id = text,
            "`session_id`" => request.session_id = text,
            "`tool_name`" => request.tool_name = text,
            "`requester`" => request.requester = text,
            "`idempotency_key`" => request.idempotency_key = text,
            "`action`" => request.action = text,
            "`reason`" => request.reason = text,
            "`routes[].target`" => {
                request.routes = vec![Route {
                    channel: "telegram".into(),
                    target: text,
                }]
            }
            "`labels` key" => {
                request.labels.insert(text, "x".into());
            }
            "`labels` value" => {
                request.labels.insert("team".into(), text);
            }
            "`approver_groups[].group`" => {
                request.approver_groups = vec![GroupQuorum {
                    group: text,
                    required: 1,
                    ..GroupQuorum::default()
                }]
            }
            "`decider.user_id`" => decider.user_id = text,
            "`decider.display_name`" => decider.display_name = text,
            "a decision's `reason`" => decision_reason = text,
            other => panic!("docs/security.md lists a field this test does not know: {other}"),
        }
        let error = if field.starts_with("`decider.") || field.starts_with("a decision's") {
            validate_decider(&decider, &decision_reason, "decision-1").err()
        } else {
            validate_request(request, &Limits::default()).err()
        };
        error.map(|error| match error {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        })
    }

    #[test]
    fn the_field_lengths_in_the_security_guide_are_the_ones_enforced() {
        let rows = documented_lengths();
        assert!(rows.len() >= 14, "{rows:?}");
        for (field, limit) in rows {
            assert_eq!(
                refused_field(&field, "a".repeat(limit)),
                None,
                "{field} of {limit} characters"
            );
            let named = refused_field(&field, "a".repeat(limit + 1))
                .unwrap_or_else(|| panic!("{field} of {} characters was accepted", limit + 1));
            let bare = field.split('`').nth(1).unwrap_or_default();
            let (head, _) = bare.split_once("[]").unwrap_or((bare, ""));
            assert!(
                named.starts_with(head.split(' ').next().unwrap_or_default()),
                "{field}: the refusal names {named}"
            );
        }
    }
}
