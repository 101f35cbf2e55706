//! What every handler shares about HTTP: the urlencoded form a request carries, the
//! [`Refusal`] a request that is not served gets (as a page), and a template rendered to a
//! response.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use countersign_client::ClientError;

/// Why a request is not served.
#[derive(Debug)]
pub enum Refusal {
    SignedOut,
    Csrf,
    Forbidden(String),
    NotFound(String),
    /// No page at this address (the router's fallback).
    NoSuchPage,
    /// A page, asked for with a method it does not take.
    WrongMethod,
    BadRequest(String),
    Server(ClientError),
    Internal(String),
}

impl From<ClientError> for Refusal {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::NotFound(what) => Refusal::NotFound(what),
            ClientError::InvalidArgument(what) => Refusal::BadRequest(what),
            ClientError::PermissionDenied(what) => Refusal::Forbidden(what),
            other => Refusal::Server(other),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, title, text) = match self {
            Refusal::SignedOut => (
                StatusCode::UNAUTHORIZED,
                "Not signed in",
                "Sign in with the login link an administrator issued to you \
                 (countersign-web issue-login), or through your organisation's sign-in proxy."
                    .to_owned(),
            ),
            Refusal::Csrf => (
                StatusCode::FORBIDDEN,
                "Form refused",
                "The form's security token is missing or stale; nothing was changed. \
                 Reload the page and try again."
                    .to_owned(),
            ),
            Refusal::Forbidden(why) => (StatusCode::FORBIDDEN, "Not allowed", why),
            Refusal::NotFound(what) => (StatusCode::NOT_FOUND, "Not found", what),
            Refusal::BadRequest(what) => (StatusCode::BAD_REQUEST, "Bad request", what),
            Refusal::NoSuchPage => (
                StatusCode::NOT_FOUND,
                "No such page",
                "There is no page at this address. The inbox lists every approval waiting \
                 for you; each links to its own page."
                    .to_owned(),
            ),
            Refusal::WrongMethod => (
                StatusCode::METHOD_NOT_ALLOWED,
                "Not a page to open this way",
                "This address takes only what the inbox's own links and buttons send; \
                 nothing was changed."
                    .to_owned(),
            ),
            Refusal::Server(error) => {
                tracing::warn!(%error, "countersign server call failed");
                let title = if is_unreachable(&error) {
                    "Server unavailable"
                } else {
                    "Server error"
                };
                (
                    StatusCode::BAD_GATEWAY,
                    title,
                    format!("{}.", server_failure(&error)),
                )
            }
            Refusal::Internal(error) => {
                tracing::error!(%error, "web inbox failure");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal error",
                    "The web inbox failed; see its log.".to_owned(),
                )
            }
        };
        (status, message_page(title, &text, None)).into_response()
    }
}

/// What a person is told when a call to the server failed: what it means and what to do,
/// never the internals (the log has those).
pub(crate) fn server_failure(error: &ClientError) -> &'static str {
    if is_unreachable(error) {
        "The countersign server cannot be reached right now, so nothing can be shown or \
         decided here. Try again in a minute; if it goes on, tell whoever runs countersign \
         (the web inbox's log says what failed)"
    } else {
        "The countersign server could not serve this request. Try again; if it goes on, \
         tell whoever runs countersign (the web inbox's log says what failed)"
    }
}

/// Whether the call failed because the server could not be reached in time.
fn is_unreachable(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Unavailable(_) | ClientError::DeadlineExceeded(_)
    )
}

#[derive(Template)]
#[template(path = "message.html")]
pub(crate) struct MessagePage<'a> {
    title: &'a str,
    text: &'a str,
    login_token: Option<&'a str>,
}

pub(crate) fn message_page(title: &str, text: &str, login_token: Option<&str>) -> Response {
    render(&MessagePage {
        title,
        text,
        login_token,
    })
}

pub(crate) fn render(template: &impl Template) -> Response {
    match template.render() {
        Ok(html) => Html(html).into_response(),
        Err(error) => {
            tracing::error!(%error, "template failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A urlencoded form body, keeping repeated fields (`id=a&id=b`).
pub struct FormFields(Vec<(String, String)>);

impl FormFields {
    pub fn parse(body: &[u8]) -> FormFields {
        FormFields(form_urlencoded::parse(body).into_owned().collect())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .collect()
    }
}
