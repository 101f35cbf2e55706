//! OpenID Client-Initiated Backchannel Authentication (CIBA Core 1.0), poll mode, with the
//! tool call as an RFC 9396 `authorization_details` entry: `/bc-authorize` asks a person
//! (an approval, as RequestApproval makes it) and `/token` answers the client's polls; an
//! approval is redeemed once for an access token and, with the `openid` scope, an ID token,
//! both signed with the server's receipt key. The discovery document and the JWKS say how.
//! What the endpoints keep between requests is `ciba_state.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use countersign_core::validate::RequestInput;
use countersign_core::{
    Approval, ConsumeOutcome, Error as DomainError, GroupQuorum, ResolvedBy, Risk, Verdict,
};
use rand::RngCore as _;
use serde_json::{json, Map, Value};

use super::clients::{Client, ClientError, ASSERTION_ALGS, JWT_BEARER};
use super::http::{Front, FrontState, HttpError};
use crate::app::{AppError, ConsumeInput};
use crate::store::now_millis;

pub(super) const CONFIGURATION_PATH: &str = "/.well-known/openid-configuration";
pub(super) const JWKS_PATH: &str = "/.well-known/jwks.json";
pub(super) const AUTHORIZE_PATH: &str = "/bc-authorize";
pub(super) const TOKEN_PATH: &str = "/token";
pub(super) const CIBA_GRANT: &str = "urn:openid:params:grant-type:ciba";
/// The `authorization_details` type of a tool call.
pub(super) const TOOL_CALL_TYPE: &str = "countersign_tool_call";
const ACCESS_TOKEN_TYPE: &str = "at+jwt";
const ID_TOKEN_TYPE: &str = "JWT";
/// CIBA §7.3 / §10.3.1: the claim that binds an ID token to its `auth_req_id`.
const AUTH_REQ_ID_CLAIM: &str = "urn:openid:params:jwt:claim:auth_req_id";
/// The labels of an approval asked through CIBA: its client, and `openid` when the
/// request's scope held it (its tokens then include an ID token).
const CLIENT_LABEL: &str = "ciba.client_id";
const SCOPE_LABEL: &str = "ciba.scope";
/// The fields of a `countersign_tool_call` entry.
const TOOL_CALL_FIELDS: [&str; 6] = ["type", "tool", "arguments", "risk", "reason", "session_id"];

/// `GET /.well-known/openid-configuration`: the OpenID Provider metadata, CIBA's included.
pub(super) async fn configuration(State(front): FrontState) -> Json<Value> {
    let base = &front.base_url;
    Json(json!({
        "issuer": base,
        "backchannel_authentication_endpoint": format!("{base}{AUTHORIZE_PATH}"),
        "token_endpoint": format!("{base}{TOKEN_PATH}"),
        "jwks_uri": format!("{base}{JWKS_PATH}"),
        "backchannel_token_delivery_modes_supported": ["poll"],
        "backchannel_user_code_parameter_supported": false,
        "grant_types_supported": [CIBA_GRANT],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "private_key_jwt"],
        "token_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGS,
        "authorization_details_types_supported": [TOOL_CALL_TYPE],
        "scopes_supported": ["openid"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["EdDSA"],
        "claims_supported": ["iss", "sub", "aud", "iat", "exp", "auth_time", AUTH_REQ_ID_CLAIM],
    }))
}

/// `GET /.well-known/jwks.json`: the receipt keys, which sign the tokens.
pub(super) async fn jwks(State(front): FrontState) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        front.ciba.keys.jwks(),
    )
        .into_response()
}

/// `POST /bc-authorize`: the authentication request (CIBA §7).
pub(super) async fn authorize(
    State(front): FrontState,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let form = form_of(&headers, &body)?;
        let client = authenticate(&front, &headers, &form).await?;
        for unsupported in [
            "login_hint_token",
            "id_token_hint",
            "user_code",
            "request",
            "client_notification_token",
        ] {
            if form.contains_key(unsupported) {
                return Err(HttpError::invalid(
                    unsupported,
                    "is not supported (poll mode, login_hint only; see docs/standards.md)",
                ));
            }
        }
        let details = tool_call_of(form.get("authorization_details"))?;
        let ttl_seconds = match form.get("requested_expiry") {
            None => 0,
            Some(text) => text
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|seconds| *seconds > 0)
                .ok_or_else(|| {
                    HttpError::invalid("requested_expiry", "must be a positive integer")
                })?,
        };
        let approver_groups = match form.get("login_hint") {
            None => Vec::new(),
            Some(hint) => vec![GroupQuorum {
                group: hint.clone(),
                required: 1,
                ..GroupQuorum::default()
            }],
        };
        let mut labels = BTreeMap::from([(CLIENT_LABEL.to_owned(), client.id.clone())]);
        if form
            .get("scope")
            .is_some_and(|scope| scope.split(' ').any(|s| s == "openid"))
        {
            labels.insert(SCOPE_LABEL.to_owned(), "openid".to_owned());
        }
        let input = RequestInput {
            agent_id: client.agent.clone(),
            session_id: details.session_id,
            idempotency_key: format!("ciba-{}", random_hex()),
            tool_name: details.tool,
            arguments_json: details.arguments,
            action: form.get("binding_message").cloned().unwrap_or_default(),
            reason: details.reason,
            risk: Some(details.risk),
            ttl_seconds,
            approver_groups,
            labels,
            ..RequestInput::default()
        };
        let requested = front
            .app
            .request(&client.caller, input)
            .await
            .map_err(request_error)?;
        let approval = requested.approval;
        let expires_in = ((approval.expires_at - now_millis()) / 1000).max(1);
        Ok(json!({
            "auth_req_id": front.ciba.auth_req_id(&client.id, &approval.id),
            "expires_in": expires_in,
            "interval": front.ciba.interval,
        }))
    }
    .await;
    answer(result)
}

/// `POST /token` with the CIBA grant (CIBA §10, §11).
pub(super) async fn token(State(front): FrontState, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        let form = form_of(&headers, &body)?;
        let client = authenticate(&front, &headers, &form).await?;
        match form.get("grant_type").map(String::as_str) {
            None => return Err(HttpError::invalid("grant_type", "is required")),
            Some(CIBA_GRANT) => {}
            Some(_) => {
                return Err(oauth(
                    "unsupported_grant_type",
                    format!("grant_type: only {CIBA_GRANT} is supported"),
                ))
            }
        }
        let auth_req_id = form
            .get("auth_req_id")
            .ok_or_else(|| HttpError::invalid("auth_req_id", "is required"))?;
        let unknown = || {
            oauth(
                "invalid_grant",
                "auth_req_id: unknown, or issued to another client".to_owned(),
            )
        };
        let approval_id = front
            .ciba
            .approval_of(&client.id, auth_req_id)
            .ok_or_else(unknown)?;
        let approval = match front.app.get(&client.caller, &approval_id).await {
            Ok(approval) => approval,
            Err(AppError::Domain(DomainError::NotFound(_)))
            | Err(AppError::Store(crate::store::StoreError::Domain(DomainError::NotFound(_)))) => {
                return Err(unknown())
            }
            Err(e) => return Err(e.into()),
        };
        use countersign_core::State as Is;
        if approval.state != Is::Pending {
            front.ciba.settled(&approval.id);
        }
        match approval.state {
            Is::Pending if front.ciba.too_fast(&approval.id, Instant::now()) => Err(oauth(
                "slow_down",
                "polled sooner than the interval; wait 5 seconds more between polls".to_owned(),
            )),
            Is::Pending => Err(oauth(
                "authorization_pending",
                "nobody has decided yet".to_owned(),
            )),
            Is::Rejected => Err(oauth(
                "access_denied",
                format!("rejected: {}", resolution_reason(&approval)),
            )),
            Is::Cancelled => Err(oauth(
                "access_denied",
                format!("cancelled: {}", resolution_reason(&approval)),
            )),
            Is::Expired => Err(oauth(
                "expired_token",
                "auth_req_id expired before anybody decided; make a new request".to_owned(),
            )),
            Is::Consumed => Err(redeemed()),
            Is::Approved => issue(&front, client, auth_req_id, approval).await,
        }
    }
    .await;
    answer(result)
}

fn redeemed() -> HttpError {
    oauth(
        "invalid_grant",
        "auth_req_id: its tokens were already issued".to_owned(),
    )
}

fn resolution_reason(approval: &Approval) -> &str {
    approval
        .resolution
        .as_ref()
        .map(|r| r.reason.as_str())
        .filter(|r| !r.is_empty())
        .unwrap_or("no reason given")
}

/// Redeems an approved request, once (the approval is consumed), for its tokens.
async fn issue(
    front: &Front,
    client: &Client,
    auth_req_id: &str,
    approval: Approval,
) -> Result<Value, HttpError> {
    let consumed = front
        .app
        .consume(
            &client.caller,
            ConsumeInput {
                approval_id: approval.id.clone(),
                outcome: ConsumeOutcome::HandedOff,
                detail: format!("OpenID CIBA tokens issued to client {}", client.id),
                args_digest: approval.current_digest().to_owned(),
            },
        )
        .await;
    let approval = match consumed {
        Ok(approval) => approval,
        // Another poll redeemed it first.
        Err(AppError::Domain(DomainError::FailedPrecondition(_)))
        | Err(AppError::Store(crate::store::StoreError::Domain(
            DomainError::FailedPrecondition(_),
        ))) => return Err(redeemed()),
        Err(e) => return Err(e.into()),
    };
    let ciba = &front.ciba;
    let now = now_millis() / 1000;
    let exp = now + ciba.token_ttl_seconds;
    let subject = subject_of(&approval);
    let details = json!([tool_call_details(&approval)]);
    let access_token = ciba.keys.sign_jws(
        ACCESS_TOKEN_TYPE,
        &json!({
            "iss": front.base_url,
            "sub": subject,
            "aud": front.base_url,
            "client_id": client.id,
            "iat": now,
            "exp": exp,
            "jti": random_hex(),
            "approval_id": approval.id,
            "authorization_details": details,
            "receipt": approval.receipt,
        }),
    );
    let mut answer = json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": ciba.token_ttl_seconds,
        "authorization_details": details,
    });
    let resolved_at = approval.resolved_at().unwrap_or(approval.created_at) / 1000;
    // The scope is the authentication request's, kept on the approval's label.
    if approval
        .labels
        .get(SCOPE_LABEL)
        .is_some_and(|s| s == "openid")
    {
        let id_token = ciba.keys.sign_jws(
            ID_TOKEN_TYPE,
            &json!({
                "iss": front.base_url,
                "sub": subject,
                "aud": client.id,
                "iat": now,
                "exp": exp,
                "auth_time": resolved_at,
                AUTH_REQ_ID_CLAIM: auth_req_id,
            }),
        );
        if let Some(o) = answer.as_object_mut() {
            o.insert("id_token".into(), Value::String(id_token));
            o.insert("scope".into(), Value::String("openid".into()));
        }
    }
    tracing::info!(approval_id = %approval.id, client_id = %client.id, "OpenID CIBA tokens issued");
    Ok(answer)
}

/// Who approved: the approvers of the approved version (the first is the subject), or the
/// rule or grant that approved it.
fn subject_of(approval: &Approval) -> String {
    let resolution = approval.resolution.as_ref();
    match resolution.map(|r| r.resolved_by) {
        Some(ResolvedBy::Rule) => format!(
            "rule:{}",
            resolution.and_then(|r| r.rule.as_deref()).unwrap_or("")
        ),
        Some(ResolvedBy::Grant) => format!(
            "grant:{}",
            resolution.and_then(|r| r.grant_id.as_deref()).unwrap_or("")
        ),
        _ => approval
            .decisions
            .iter()
            .find(|d| d.verdict == Verdict::Approve && approval.is_current(d))
            .map(|d| d.approver.clone())
            .unwrap_or_default(),
    }
}

/// The approved call as an `authorization_details` entry: the arguments as approved, the
/// edited ones when an approver edited them.
fn tool_call_details(approval: &Approval) -> Value {
    let arguments: Value =
        serde_json::from_str(approval.current_arguments()).unwrap_or(Value::Null);
    let mut entry = json!({
        "type": TOOL_CALL_TYPE,
        "tool": approval.tool_name,
        "arguments": arguments,
        "args_digest": approval.current_digest(),
        "risk": approval.effective_risk().as_str().to_ascii_lowercase(),
        "edited": approval.edit.is_some(),
    });
    if !approval.session_id.is_empty() {
        entry["session_id"] = Value::String(approval.session_id.clone());
    }
    entry
}

/// The tool call of a `countersign_tool_call` entry.
struct ToolCall {
    tool: String,
    arguments: String,
    risk: Risk,
    reason: String,
    session_id: String,
}

/// Reads `authorization_details` (RFC 9396 §2): a JSON array of one `countersign_tool_call`.
/// Not a JSON array: `invalid_request`; an entry that is not one we support or does not
/// conform to its type: `invalid_authorization_details` (RFC 9396 §5). Both name the field.
fn tool_call_of(text: Option<&String>) -> Result<ToolCall, HttpError> {
    const FIELD: &str = "authorization_details";
    let text = text.ok_or_else(|| {
        HttpError::invalid(
            FIELD,
            format!("is required: a JSON array holding one {TOOL_CALL_TYPE:?} entry"),
        )
    })?;
    let entries = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(entries)) => entries,
        Ok(_) => return Err(HttpError::invalid(FIELD, "must be a JSON array")),
        Err(e) => return Err(HttpError::invalid(FIELD, format!("is not JSON: {e}"))),
    };
    let bad = |field: String, why: &str| {
        oauth("invalid_authorization_details", format!("{field}: {why}"))
    };
    let [entry] = &entries[..] else {
        return Err(bad(
            FIELD.to_owned(),
            &format!(
                "holds {} entries; one {TOOL_CALL_TYPE:?} entry is supported",
                entries.len()
            ),
        ));
    };
    let at = format!("{FIELD}[0]");
    let entry = entry
        .as_object()
        .ok_or_else(|| bad(at.clone(), "must be a JSON object"))?;
    match entry.get("type") {
        Some(Value::String(kind)) if kind == TOOL_CALL_TYPE => {}
        Some(Value::String(_)) => {
            return Err(bad(
                format!("{at}.type"),
                &format!("is not supported; the supported type is {TOOL_CALL_TYPE:?}"),
            ))
        }
        _ => return Err(bad(format!("{at}.type"), "is required (a string)")),
    }
    if let Some(unknown) = entry
        .keys()
        .find(|k| !TOOL_CALL_FIELDS.contains(&k.as_str()))
    {
        return Err(bad(
            format!("{at}.{unknown}"),
            &format!("is not a field of {TOOL_CALL_TYPE:?}"),
        ));
    }
    let text_field = |name: &str, required: bool| -> Result<String, HttpError> {
        match entry.get(name) {
            Some(Value::String(s)) if !(required && s.is_empty()) => Ok(s.clone()),
            None | Some(Value::Null) if !required => Ok(String::new()),
            None | Some(Value::Null) => Err(bad(format!("{at}.{name}"), "is required")),
            Some(_) => Err(bad(format!("{at}.{name}"), "must be a non-empty string")),
        }
    };
    let tool = text_field("tool", true)?;
    let arguments = match entry.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(arguments @ Value::Object(_)) => arguments.to_string(),
        Some(_) => return Err(bad(format!("{at}.arguments"), "must be a JSON object")),
    };
    let risk = match text_field("risk", false)?.as_str() {
        "" => Risk::Medium,
        name => Risk::parse(name).ok_or_else(|| {
            bad(
                format!("{at}.risk"),
                "must be low, medium, high or critical",
            )
        })?,
    };
    Ok(ToolCall {
        tool,
        arguments,
        risk,
        reason: text_field("reason", false)?,
        session_id: text_field("session_id", false)?,
    })
}

/// A refusal of the request's use case, with the CIBA names of the fields at fault.
fn request_error(error: AppError) -> HttpError {
    let (field, message) = match error {
        AppError::Domain(DomainError::InvalidArgument { field, message })
        | AppError::Store(crate::store::StoreError::Domain(DomainError::InvalidArgument {
            field,
            message,
        })) => (field, message),
        other => return other.into(),
    };
    let entry = "authorization_details[0]";
    match field.as_str() {
        "tool_name" => oauth(
            "invalid_authorization_details",
            format!("{entry}.tool: {message}"),
        ),
        "arguments_json" => oauth(
            "invalid_authorization_details",
            format!("{entry}.arguments: {message}"),
        ),
        "reason" | "session_id" | "risk" => oauth(
            "invalid_authorization_details",
            format!("{entry}.{field}: {message}"),
        ),
        "action" => oauth(
            "invalid_binding_message",
            format!("binding_message: {message}"),
        ),
        "ttl_seconds" => HttpError::invalid("requested_expiry", message),
        f if f.starts_with("approver_groups") => {
            oauth("unknown_user_id", format!("login_hint: {message}"))
        }
        _ => HttpError::invalid(&field, message),
    }
}

/// An OAuth error answered with 400.
fn oauth(error: &'static str, description: String) -> HttpError {
    HttpError {
        status: StatusCode::BAD_REQUEST,
        error,
        description,
    }
}

/// Authenticates the client of a request: `client_secret_basic` or `private_key_jwt`,
/// exactly one of them. An assertion's audience may be the issuer or either endpoint, at
/// either endpoint (OpenID Connect Core §9 names the token endpoint; CIBA §7.1 has the
/// client authenticate at `/bc-authorize` as it does there, and lists all three).
async fn authenticate<'a>(
    front: &'a Front,
    headers: &HeaderMap,
    form: &HashMap<String, String>,
) -> Result<&'a Client, HttpError> {
    let clients = &front.ciba.clients;
    let basic = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or_default());
    let assertion = form.get("client_assertion");
    if form.contains_key("client_secret") {
        return Err(invalid_client(
            "client_secret_post is not supported: use client_secret_basic or private_key_jwt",
        ));
    }
    let authenticated = match (basic, assertion) {
        (Some(_), Some(_)) => {
            return Err(HttpError::invalid(
                "client_assertion",
                "one client authentication method only (here also an Authorization header)",
            ))
        }
        (Some(header), None) => clients.basic(header).map(|client| (client, None)),
        (None, Some(assertion)) => {
            if form.get("client_assertion_type").map(String::as_str) != Some(JWT_BEARER) {
                return Err(HttpError::invalid(
                    "client_assertion_type",
                    format!("must be {JWT_BEARER}"),
                ));
            }
            let base = &front.base_url;
            let (token, authorize) = (
                format!("{base}{TOKEN_PATH}"),
                format!("{base}{AUTHORIZE_PATH}"),
            );
            let audiences = [base.as_str(), token.as_str(), authorize.as_str()];
            clients
                .assertion(assertion, &audiences, now_millis() / 1000)
                .map(|verified| (verified.client, Some((verified.jti, verified.expires_at))))
        }
        (None, None) => {
            return Err(invalid_client(
                "client authentication is required: client_secret_basic or private_key_jwt",
            ))
        }
    };
    let (client, jti) = authenticated.map_err(|e| match e {
        ClientError::Invalid(why) => invalid_client(&why),
        ClientError::Malformed(why) => HttpError {
            status: StatusCode::BAD_REQUEST,
            error: "invalid_request",
            description: why,
        },
    })?;
    if let Some((jti, expires_at)) = jti {
        let first = front
            .app
            .use_client_assertion(&client.id, &jti, expires_at.saturating_mul(1000))
            .await
            .map_err(HttpError::from)?;
        if !first {
            tracing::warn!(client_id = %client.id, "a client assertion was replayed");
            return Err(invalid_client(
                "client_assertion: this assertion (its jti) was already used",
            ));
        }
    }
    if form.get("client_id").is_some_and(|id| *id != client.id) {
        return Err(invalid_client(
            "client_id is not the client that authenticated",
        ));
    }
    Ok(client)
}

fn invalid_client(why: &str) -> HttpError {
    HttpError {
        status: StatusCode::UNAUTHORIZED,
        error: "invalid_client",
        description: why.to_owned(),
    }
}

/// The parameters of an `application/x-www-form-urlencoded` body; a parameter given twice is
/// refused (RFC 6749 §3.1, §3.2).
fn form_of(headers: &HeaderMap, body: &Bytes) -> Result<HashMap<String, String>, HttpError> {
    let form_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !form_type {
        return Err(HttpError::invalid(
            "Content-Type",
            "must be application/x-www-form-urlencoded",
        ));
    }
    let mut form = HashMap::new();
    for (name, value) in form_urlencoded::parse(body) {
        if value.is_empty() {
            // An empty parameter is treated as omitted (RFC 6749 §3.1).
            continue;
        }
        if form.insert(name.to_string(), value.into_owned()).is_some() {
            return Err(HttpError::invalid(&name, "is given more than once"));
        }
    }
    Ok(form)
}

/// The answer, never cached (RFC 6749 §5.1).
fn answer(result: Result<Value, HttpError>) -> Response {
    let mut response = match result {
        Ok(body) => (StatusCode::OK, Json(body)).into_response(),
        Err(e) => e.into_response(),
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    response
}

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The CIBA request a require-human evaluation would make: the endpoint and the
/// `authorization_details` (AuthZEN's answer names it, `authzen.rs`).
pub(super) fn ask_of(
    base_url: &str,
    tool: &str,
    arguments: &Value,
    risk: Risk,
) -> Map<String, Value> {
    let mut ask = Map::new();
    ask.insert(
        "backchannel_authentication_endpoint".into(),
        Value::String(format!("{base_url}{AUTHORIZE_PATH}")),
    );
    ask.insert(
        "authorization_details".into(),
        json!([{
            "type": TOOL_CALL_TYPE,
            "tool": tool,
            "arguments": arguments,
            "risk": risk.as_str().to_ascii_lowercase(),
        }]),
    );
    ask
}
