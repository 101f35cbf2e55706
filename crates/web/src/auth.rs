//! Who is asking: a session cookie (built-in sign-in) or an identity header from a trusted
//! proxy; and the CSRF token every form of that approver must carry.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::app::App;
use crate::config::SignIn;
use crate::http::{FormFields, Refusal};
use crate::sessions::{validate_approver_id, Approver, Session};

/// The largest form body accepted (a batch of 200 ids with a reason fits many times).
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "countersign_session";

/// The signed-in approver of a request.
#[derive(Clone, Debug)]
pub struct Viewer {
    pub approver: Approver,
    pub csrf: String,
    /// May list and revoke grants.
    pub admin: bool,
    /// Signed in with a session cookie (proxy sign-in cannot sign out here).
    pub has_session: bool,
}

impl App {
    /// The approver behind a request, or why there is none.
    pub async fn viewer(&self, headers: &HeaderMap, peer: SocketAddr) -> Result<Viewer, Refusal> {
        let (session, has_session) = match &self.settings.sign_in {
            SignIn::Login => {
                let cookie = session_cookie(headers).ok_or(Refusal::SignedOut)?;
                let session = self
                    .sessions
                    .session(cookie)
                    .await
                    .map_err(|error| Refusal::Internal(error.to_string()))?
                    .ok_or(Refusal::SignedOut)?;
                (session, true)
            }
            SignIn::Proxy {
                identity_header,
                name_header,
                trusted_proxies,
            } => {
                if !trusted_proxies.contains(&peer.ip()) {
                    tracing::warn!(peer = %peer.ip(), "identity header from an untrusted address ignored");
                    return Err(Refusal::SignedOut);
                }
                let id = header_text(headers, identity_header).ok_or(Refusal::SignedOut)?;
                validate_approver_id(id).map_err(|_| Refusal::SignedOut)?;
                let name = name_header
                    .as_ref()
                    .and_then(|name| header_text(headers, name))
                    .unwrap_or(id);
                let approver = Approver {
                    id: id.to_owned(),
                    name: countersign_worker::agent_text::one_line(name, 128),
                };
                let csrf = self.proxy_csrf(&approver.id);
                (Session { approver, csrf }, false)
            }
        };
        let admin = self.admin.is_some() && self.settings.admins.contains(&session.approver.id);
        Ok(Viewer {
            approver: session.approver,
            csrf: session.csrf,
            admin,
            has_session,
        })
    }

    /// Proxy sign-in has no session to keep a token in: the token is a MAC of the approver id
    /// under a key made at start-up.
    fn proxy_csrf(&self, approver_id: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.csrf_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(approver_id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

impl Viewer {
    /// Refuses a form whose CSRF token is missing or not this approver's.
    pub fn check_csrf(&self, submitted: Option<&str>) -> Result<(), Refusal> {
        let matches = submitted.is_some_and(|token| {
            token.len() == self.csrf.len()
                && token
                    .bytes()
                    .zip(self.csrf.bytes())
                    .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                    == 0
        });
        if matches {
            Ok(())
        } else {
            tracing::warn!(approver = %self.approver.id, "form refused: CSRF token missing or wrong");
            Err(Refusal::Csrf)
        }
    }
}

/// Handlers that take a `Viewer` serve signed-in approvers only.
impl FromRequestParts<Arc<App>> for Viewer {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Viewer, Refusal> {
        let ConnectInfo(peer) = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .copied()
            .ok_or_else(|| Refusal::Internal("the peer address is unknown".into()))?;
        app.viewer(&parts.headers, peer).await
    }
}

/// A form posted by a signed-in approver, carrying that approver's CSRF token.
pub struct SignedForm {
    pub viewer: Viewer,
    pub form: FormFields,
}

impl FromRequest<Arc<App>> for SignedForm {
    type Rejection = Refusal;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<SignedForm, Refusal> {
        let (mut parts, body) = request.into_parts();
        let viewer = Viewer::from_request_parts(&mut parts, app).await?;
        let body = axum::body::to_bytes(body, MAX_FORM_BYTES)
            .await
            .map_err(|_| {
                Refusal::BadRequest(format!("a form may hold at most {MAX_FORM_BYTES} bytes"))
            })?;
        let form = FormFields::parse(&body);
        viewer.check_csrf(form.get("csrf"))?;
        Ok(SignedForm { viewer, form })
    }
}

/// The session cookie's value.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

fn header_text<'a>(headers: &'a HeaderMap, name: &axum::http::HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty())
}
