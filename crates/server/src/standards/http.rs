//! What the standards handlers share: the state they are given, the caller of a bearer
//! token, JSON bodies, and refusals as HTTP statuses with an OAuth-style error body.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use countersign_core::Error as DomainError;
use serde_json::{json, Value};

use super::ciba_state::Ciba;
use crate::app::{App, AppError};
use crate::auth::Authenticator;
use crate::caller::Caller;
use crate::store::StoreError;

/// What the handlers share.
#[derive(Clone)]
pub(super) struct Front {
    pub(super) app: Arc<App>,
    pub(super) auth: Authenticator,
    /// The listener's public base URL, for the metadata documents.
    pub(super) base_url: String,
    /// OpenID CIBA: the clients, the token key, the polling pace.
    pub(super) ciba: Arc<Ciba>,
}

/// A refusal: its HTTP status, an OAuth-style error code and a description that names the
/// field at fault.
#[derive(Debug)]
pub(super) struct HttpError {
    pub(super) status: StatusCode,
    pub(super) error: &'static str,
    pub(super) description: String,
}

impl HttpError {
    pub(super) fn invalid(field: &str, message: impl std::fmt::Display) -> HttpError {
        HttpError {
            status: StatusCode::BAD_REQUEST,
            error: "invalid_request",
            description: format!("{field}: {message}"),
        }
    }

    fn unauthenticated(description: &str) -> HttpError {
        HttpError {
            status: StatusCode::UNAUTHORIZED,
            error: "invalid_token",
            description: description.to_owned(),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": self.error, "error_description": self.description}));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // A CIBA client authenticates with Basic (RFC 6749 §5.2); agents with a bearer token.
            let scheme = if self.error == "invalid_client" {
                "Basic realm=\"countersign\""
            } else {
                "Bearer"
            };
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(scheme));
        }
        response
    }
}

impl From<AppError> for HttpError {
    fn from(error: AppError) -> HttpError {
        let (status, error_code, description) = match error {
            AppError::Domain(e) => domain(e),
            AppError::Store(StoreError::Domain(e)) => domain(e),
            AppError::Store(StoreError::Closed) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily_unavailable",
                "the server is shutting down".to_owned(),
            ),
            AppError::RateLimited { message, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "slow_down", message)
            }
            other => {
                tracing::error!(error = %other, "a standards endpoint failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "internal failure; see the server log".to_owned(),
                )
            }
        };
        HttpError {
            status,
            error: error_code,
            description,
        }
    }
}

fn domain(error: DomainError) -> (StatusCode, &'static str, String) {
    match error {
        e @ DomainError::InvalidArgument { .. } => {
            (StatusCode::BAD_REQUEST, "invalid_request", e.to_string())
        }
        DomainError::PermissionDenied(m) => (StatusCode::FORBIDDEN, "access_denied", m),
        DomainError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m),
        DomainError::ResourceExhausted(m) => (StatusCode::TOO_MANY_REQUESTS, "slow_down", m),
        DomainError::AlreadyExists(m) | DomainError::FailedPrecondition(m) => {
            (StatusCode::CONFLICT, "invalid_request", m)
        }
    }
}

impl Front {
    /// The caller of a request's bearer token.
    pub(super) fn caller(&self, headers: &HeaderMap) -> Result<Arc<Caller>, HttpError> {
        self.auth
            .caller(
                headers
                    .get(header::AUTHORIZATION)
                    .map(HeaderValue::as_bytes),
            )
            .map_err(HttpError::unauthenticated)
    }
}

/// A JSON object body; anything else is refused with what was wrong.
pub(super) fn json_object(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<serde_json::Map<String, Value>, HttpError> {
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json_type {
        return Err(HttpError::invalid(
            "Content-Type",
            "must be application/json",
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(HttpError::invalid("body", "must be a JSON object")),
        Err(e) => Err(HttpError::invalid("body", format!("is not JSON: {e}"))),
    }
}

/// The answer, with the caller's `X-Request-ID` echoed (AuthZEN asks a PDP to).
pub(super) fn answer(headers: &HeaderMap, result: Result<Value, HttpError>) -> Response {
    let mut response = match result {
        Ok(body) => (StatusCode::OK, Json(body)).into_response(),
        Err(e) => e.into_response(),
    };
    if let Some(id) = headers.get("x-request-id") {
        response.headers_mut().insert("x-request-id", id.clone());
    }
    response
}

/// The state type the handlers take.
pub(super) type FrontState = State<Front>;
