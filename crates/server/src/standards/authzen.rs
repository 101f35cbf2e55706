//! OpenID AuthZEN Authorization API 1.0: the Access Evaluation API (single and batch) and the
//! PDP metadata. A tool call is asked as "may agent S call tool R with these arguments?":
//!
//! - `subject`: `{"type": "agent", "id": <agent_id>, "properties": {"session_id"}}`;
//! - `resource`: `{"type": "tool", "id": <tool name>, "properties": {"arguments", "risk"}}`;
//! - `action`: `{"name": <what the call does, free text>}`;
//! - `context`: `{"reason"}` (optional).
//!
//! The answer is the policy's: a rule that allows → `decision: true`; a rule that denies →
//! `false` with the rule's reason; a call left to a person → `false` with a context that
//! says so and how to ask (docs/standards.md).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use countersign_core::validate::RequestInput;
use countersign_core::{Disposition, Error as DomainError, Risk, Verdict};
use serde_json::{json, Map, Value};

use super::ciba;
use super::http::{answer, json_object, Front, FrontState, HttpError};
use crate::app::{AppError, Evaluation};
use crate::caller::Caller;

pub(super) const EVALUATION_PATH: &str = "/access/v1/evaluation";
pub(super) const EVALUATIONS_PATH: &str = "/access/v1/evaluations";
/// The most evaluations one batch may hold.
const MAX_EVALUATIONS: usize = 64;
/// The gRPC method that asks a person, named in a require-human answer.
const REQUEST_METHOD: &str = "countersign.v1.ApprovalService/RequestApproval";

/// `GET /.well-known/authzen-configuration`: the PDP metadata.
pub(super) async fn configuration(State(front): FrontState) -> Json<Value> {
    let base = &front.base_url;
    Json(json!({
        "policy_decision_point": base,
        "access_evaluation_endpoint": format!("{base}{EVALUATION_PATH}"),
        "access_evaluations_endpoint": format!("{base}{EVALUATIONS_PATH}"),
    }))
}

/// `POST /access/v1/evaluation`.
pub(super) async fn evaluation(
    State(front): FrontState,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let caller = front.caller(&headers)?;
        let request = json_object(&headers, &body)?;
        let input = input_of(&request, &Map::new(), "")?;
        decide(&front, &caller, input).await
    }
    .await;
    answer(&headers, result)
}

/// `POST /access/v1/evaluations`: the top-level `subject`, `action`, `resource` and
/// `context` are defaults that an item's own replace; without items it is one evaluation.
pub(super) async fn evaluations(
    State(front): FrontState,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let caller = front.caller(&headers)?;
        let request = json_object(&headers, &body)?;
        let semantic = semantic_of(&request)?;
        let items = match request.get("evaluations") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items.iter().collect(),
            Some(_) => return Err(HttpError::invalid("evaluations", "must be an array")),
        };
        if items.is_empty() {
            let input = input_of(&request, &Map::new(), "")?;
            return decide(&front, &caller, input).await;
        }
        if items.len() > MAX_EVALUATIONS {
            return Err(HttpError::invalid(
                "evaluations",
                format!("has {} items, at most {MAX_EVALUATIONS} are allowed", items.len()),
            ));
        }
        let mut results = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let at = format!("evaluations[{index}].");
            let result = match item {
                Value::Object(item) => match input_of(item, &request, &at) {
                    Ok(input) => decide(&front, &caller, input).await,
                    Err(e) => Err(e),
                },
                _ => Err(HttpError::invalid(&at[..at.len() - 1], "must be an object")),
            };
            // An item that cannot be evaluated is refused alone, as a denial that says why.
            let result = result.unwrap_or_else(|e| {
                json!({
                    "decision": false,
                    "context": {"error": {"status": e.status.as_u16(), "error": e.error, "message": e.description}},
                })
            });
            let decided = result["decision"].as_bool().unwrap_or(false);
            results.push(result);
            if semantic.stops_at(decided) {
                break;
            }
        }
        Ok(json!({ "evaluations": results }))
    }
    .await;
    answer(&headers, result)
}

/// `options.evaluations_semantic`.
#[derive(Clone, Copy)]
enum Semantic {
    ExecuteAll,
    DenyOnFirstDeny,
    PermitOnFirstPermit,
}

impl Semantic {
    /// Whether a batch ends after an item decided `decision`.
    fn stops_at(self, decision: bool) -> bool {
        match self {
            Semantic::ExecuteAll => false,
            Semantic::DenyOnFirstDeny => !decision,
            Semantic::PermitOnFirstPermit => decision,
        }
    }
}

fn semantic_of(request: &Map<String, Value>) -> Result<Semantic, HttpError> {
    let options = match request.get("options") {
        None | Some(Value::Null) => return Ok(Semantic::ExecuteAll),
        Some(Value::Object(options)) => options,
        Some(_) => return Err(HttpError::invalid("options", "must be an object")),
    };
    match options.get("evaluations_semantic") {
        None | Some(Value::Null) => Ok(Semantic::ExecuteAll),
        Some(Value::String(s)) if s == "execute_all" => Ok(Semantic::ExecuteAll),
        Some(Value::String(s)) if s == "deny_on_first_deny" => Ok(Semantic::DenyOnFirstDeny),
        Some(Value::String(s)) if s == "permit_on_first_permit" => {
            Ok(Semantic::PermitOnFirstPermit)
        }
        Some(_) => Err(HttpError::invalid(
            "options.evaluations_semantic",
            "must be execute_all, deny_on_first_deny or permit_on_first_permit",
        )),
    }
}

/// The evaluation's answer, or its refusal with the request's field names.
async fn decide(front: &Front, caller: &Caller, input: RequestInput) -> Result<Value, HttpError> {
    match front.app.evaluate(caller, input).await {
        Ok(evaluation) => Ok(decision_of(front, evaluation)),
        Err(AppError::Domain(DomainError::InvalidArgument { field, message })) => {
            Err(HttpError::invalid(wire_field(&field), message))
        }
        Err(e) => Err(e.into()),
    }
}

/// The AuthZEN name of a field of the use case's input.
fn wire_field(field: &str) -> &str {
    match field {
        "agent_id" => "subject.id",
        "session_id" => "subject.properties.session_id",
        "tool_name" => "resource.id",
        "arguments_json" => "resource.properties.arguments",
        "risk" => "resource.properties.risk",
        "action" => "action.name",
        "reason" => "context.reason",
        other => other,
    }
}

fn decision_of(front: &Front, evaluation: Evaluation) -> Value {
    let Evaluation {
        disposition,
        request,
    } = evaluation;
    match disposition {
        Disposition::Resolve {
            verdict: Verdict::Approve,
            rule,
            reason,
            ..
        } => json!({"decision": true, "context": {"rule": rule, "reason": reason}}),
        Disposition::Resolve {
            verdict: Verdict::Reject,
            rule,
            reason,
            ..
        } => json!({"decision": false, "context": {"rule": rule, "reason": reason}}),
        Disposition::RequireHuman => {
            let arguments: Value =
                serde_json::from_str(&request.arguments_json).unwrap_or(Value::Null);
            let groups: Vec<Value> = request
                .approver_groups
                .iter()
                .map(|g| json!({"group": g.group, "required": g.required}))
                .collect();
            let mut answer = json!({
                "decision": false,
                "context": {
                    "reason": "a person must approve this call",
                    "require_human": true,
                    "rule": request.policy_rule,
                    "ask": {
                        "grpc_method": REQUEST_METHOD,
                        "approval": {
                            "agent_id": request.agent_id,
                            "session_id": request.session_id,
                            "tool_name": request.tool_name,
                            "arguments": arguments,
                            "risk": request.risk.as_str().to_ascii_lowercase(),
                            "required_approvals": request.required_approvals,
                            "approver_groups": groups,
                        },
                    },
                },
            });
            // With CIBA clients registered, a client may ask through the standard as well.
            if front.ciba.has_clients() {
                answer["context"]["ask"]["ciba"] = Value::Object(ciba::ask_of(
                    &front.base_url,
                    &request.tool_name,
                    &arguments,
                    request.risk,
                ));
            }
            answer
        }
    }
}

/// The use case's input from an evaluation `item`, each of its four parts taken from the item
/// or else from `defaults`; field names in refusals are prefixed by where the part came from.
fn input_of(
    item: &Map<String, Value>,
    defaults: &Map<String, Value>,
    at: &str,
) -> Result<RequestInput, HttpError> {
    let part = |key: &str| -> (Option<&Value>, String) {
        match item.get(key) {
            Some(value) => (Some(value), format!("{at}{key}")),
            None => (defaults.get(key), key.to_owned()),
        }
    };
    let (subject, subject_at) = part("subject");
    let subject = object(subject, &subject_at)?;
    kind(subject, &subject_at, "agent")?;
    let agent_id = string(subject.get("id"), &format!("{subject_at}.id"))?;
    let subject_properties = optional_object(
        subject.get("properties"),
        &format!("{subject_at}.properties"),
    )?;
    let session_id = optional_string(
        subject_properties.get("session_id"),
        &format!("{subject_at}.properties.session_id"),
    )?;

    let (resource, resource_at) = part("resource");
    let resource = object(resource, &resource_at)?;
    kind(resource, &resource_at, "tool")?;
    let tool_name = string(resource.get("id"), &format!("{resource_at}.id"))?;
    let properties = optional_object(
        resource.get("properties"),
        &format!("{resource_at}.properties"),
    )?;
    let arguments_at = format!("{resource_at}.properties.arguments");
    let arguments_json = match properties.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(arguments @ Value::Object(_)) => arguments.to_string(),
        Some(_) => return Err(HttpError::invalid(&arguments_at, "must be a JSON object")),
    };
    let risk_at = format!("{resource_at}.properties.risk");
    let risk_name = string(properties.get("risk"), &risk_at)?;
    let risk = Risk::parse(&risk_name)
        .ok_or_else(|| HttpError::invalid(&risk_at, "must be low, medium, high or critical"))?;

    let (action, action_at) = part("action");
    let action = object(action, &action_at)?;
    let action = string(action.get("name"), &format!("{action_at}.name"))?;

    let (context, context_at) = part("context");
    let context = optional_object(context, &context_at)?;
    let reason = optional_string(context.get("reason"), &format!("{context_at}.reason"))?;

    Ok(RequestInput {
        agent_id,
        session_id,
        // Nothing is stored: the key only satisfies the request's validation.
        idempotency_key: "authzen-evaluation".to_owned(),
        tool_name,
        arguments_json,
        action,
        reason,
        risk: Some(risk),
        ..RequestInput::default()
    })
}

fn object<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a Map<String, Value>, HttpError> {
    match value {
        Some(Value::Object(object)) => Ok(object),
        None | Some(Value::Null) => Err(HttpError::invalid(at, "is required")),
        Some(_) => Err(HttpError::invalid(at, "must be an object")),
    }
}

fn optional_object(value: Option<&Value>, at: &str) -> Result<Map<String, Value>, HttpError> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(object)) => Ok(object.clone()),
        Some(_) => Err(HttpError::invalid(at, "must be an object")),
    }
}

fn string(value: Option<&Value>, at: &str) -> Result<String, HttpError> {
    match value {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        None | Some(Value::Null) => Err(HttpError::invalid(at, "is required")),
        Some(Value::String(_)) => Err(HttpError::invalid(at, "must not be empty")),
        Some(_) => Err(HttpError::invalid(at, "must be a string")),
    }
}

fn optional_string(value: Option<&Value>, at: &str) -> Result<String, HttpError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(HttpError::invalid(at, "must be a string")),
    }
}

/// The part's `type` must be `expected`.
fn kind(part: &Map<String, Value>, at: &str, expected: &str) -> Result<(), HttpError> {
    let type_at = format!("{at}.type");
    let found = string(part.get("type"), &type_at)?;
    if found != expected {
        return Err(HttpError::invalid(
            &type_at,
            format!("must be {expected:?} (countersign evaluates tool calls of agents)"),
        ));
    }
    Ok(())
}
