//! The decision-link pages. `GET /decide/{token}` only shows the approval and a confirmation
//! form (mail systems' link scanners prefetch links: a GET never decides); the form's POST,
//! carrying a token bound to the link, decides as the link's approver through `Decide` (on
//! the channel the pages serve). A link is single-use (and takes its siblings with it),
//! expires with the approval and can be revoked; a used, expired, revoked or unknown link gets
//! a page saying so (409, 410, 410, 404). A reject link's form asks for a reason. Every
//! agent-written text is HTML-escaped.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Router};
use countersign_client::{decider, pb, Client, ClientError};
use countersign_worker::agent_text;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::store::{now_ms, Link, LinkState, LinkStore};
use crate::{token_hash, LinkVerdict};

/// How much of the arguments a page shows.
const ARGUMENTS_SHOWN: usize = 4000;

/// The longest reason a reject form takes.
const MAX_REASON_CHARS: usize = 1000;

#[derive(Clone)]
pub struct Pages {
    client: Client,
    store: LinkStore,
    /// Keys the form tokens; kept in the store so that a restart keeps open pages working.
    form_key: Arc<Vec<u8>>,
    /// The channel decisions are made on (`webhook`, `ntfy`).
    channel: &'static str,
}

#[derive(Debug, Default, Deserialize)]
pub struct Confirmation {
    #[serde(default)]
    pub form_token: String,
    /// The version of the arguments the page showed; the decision is refused when they were
    /// edited since.
    #[serde(default)]
    pub args_digest: String,
    /// Why (a reject link's form asks).
    #[serde(default)]
    pub reason: String,
}

impl Pages {
    /// The pages of the links in `store`, deciding on `channel`; `form_key` from
    /// [`LinkStore::form_key`].
    pub fn new(
        client: Client,
        store: LinkStore,
        form_key: Vec<u8>,
        channel: &'static str,
    ) -> Pages {
        Pages {
            client,
            store,
            form_key: Arc::new(form_key),
            channel,
        }
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/decide/{token}", get(show).post(decide))
            .with_state(self)
    }

    /// The form token of the link with `token`: what its confirmation page's form carries.
    /// A channel whose buttons decide without a page (ntfy's `http` actions) sends it itself.
    pub fn form_token(&self, token: &str) -> String {
        hex::encode(self.form_mac(&token_hash(token)).finalize().into_bytes())
    }

    fn form_mac(&self, hash: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.form_key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(hash.as_bytes());
        mac
    }
}

/// HTML-escapes text (agent text also made visible: no hidden or reordering characters).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in agent_text::visible(text).chars() {
        match character {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

fn page(status: StatusCode, title: &str, body_html: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><meta name=\"robots\" content=\"noindex\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;max-width:40em;margin:2em auto;padding:0 1em}}pre{{white-space:pre-wrap;background:#f4f4f4;padding:.5em}}button{{font-size:1.2em;padding:.4em 1.2em}}</style></head>\
         <body><h1>{title}</h1>{body_html}</body></html>",
        title = escape(title)
    );
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn refused(state: LinkState) -> Response {
    match state {
        LinkState::Used => page(
            StatusCode::CONFLICT,
            "This link was already used",
            "<p>Each decision link works once, and a decision was already made through this request's links. Nothing was changed.</p>",
        ),
        LinkState::Revoked => page(
            StatusCode::GONE,
            "This link was revoked",
            "<p>An operator revoked the decision links of this approval. Nothing was changed.</p>",
        ),
        LinkState::Expired => page(
            StatusCode::GONE,
            "This link has expired",
            "<p>The approval request expired, and its links with it. Nothing was changed.</p>",
        ),
        LinkState::Usable => unavailable(),
    }
}

fn unknown() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Unknown link",
        "<p>This decision link does not exist. Nothing was changed.</p>",
    )
}

fn unavailable() -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Please try again",
        "<p>The decision could not be handled right now. Nothing was changed; the link still works.</p>",
    )
}

/// Looks the link up; the page to show instead when it is not usable.
async fn usable_link(pages: &Pages, hash: &str) -> Result<(Link, LinkVerdict), Response> {
    match pages.store.link(hash).await {
        Ok(Some(link)) => match (link.state(now_ms()), LinkVerdict::parse(&link.verdict)) {
            (LinkState::Usable, Some(verdict)) => Ok((link, verdict)),
            (LinkState::Usable, None) => Err(unknown()),
            (state, _) => Err(refused(state)),
        },
        Ok(None) => Err(unknown()),
        Err(error) => {
            tracing::error!(%error, "cannot read a decision link");
            Err(unavailable())
        }
    }
}

async fn show(State(pages): State<Pages>, Path(token): Path<String>) -> Response {
    let hash = token_hash(&token);
    let (link, verdict) = match usable_link(&pages, &hash).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let approval = match pages.client.get_approval(&link.approval_id).await {
        Ok(approval) => approval,
        Err(ClientError::NotFound(_)) => return unknown(),
        Err(error) => {
            tracing::warn!(approval_id = %link.approval_id, %error, "cannot fetch the approval of a decision link");
            return unavailable();
        }
    };
    if approval.state() != pb::ApprovalState::Pending {
        return already_resolved(&approval);
    }
    let form_token = hex::encode(pages.form_mac(&hash).finalize().into_bytes());
    let word = verdict.label();
    let reason_field = if verdict == LinkVerdict::Reject {
        format!("<p><label>Reason (optional)<br><textarea name=\"reason\" rows=\"3\" cols=\"40\" maxlength=\"{MAX_REASON_CHARS}\"></textarea></label></p>")
    } else {
        String::new()
    };
    // The version to decide on: the edited arguments when an approver edited them.
    let (shown, digest, edited) = match &approval.editor {
        Some(editor) if !approval.edited_args_digest.is_empty() => (
            &approval.edited_arguments_json,
            &approval.edited_args_digest,
            format!(
                " edited by {}",
                escape(&agent_text::one_line(
                    &decider::name_and_channel(editor),
                    200
                ))
            ),
        ),
        _ => (
            &approval.arguments_json,
            &approval.args_digest,
            String::new(),
        ),
    };
    let arguments = agent_text::cap(shown, ARGUMENTS_SHOWN);
    let body = format!(
        "<p>{word} this request as <strong>{approver}</strong>?</p>\
         <p>Agent: {agent}<br>Tool: {tool}<br>Action: {action}<br>Reason: {reason}<br>Risk: {risk}</p>\
         <p>Arguments{edited} (digest {digest}):</p><pre>{arguments}</pre>\
         <form method=\"post\"><input type=\"hidden\" name=\"form_token\" value=\"{form_token}\"><input type=\"hidden\" name=\"args_digest\" value=\"{digest}\">{reason_field}<button type=\"submit\">{word}</button></form>\
         <p>Nothing is decided until you press the button.</p>",
        approver = escape(&link.approver),
        agent = escape(&agent_text::one_line(&approval.agent_id, 200)),
        tool = escape(&agent_text::one_line(&approval.tool_name, 200)),
        action = escape(&agent_text::one_line(&approval.action, 500)),
        reason = escape(&agent_text::one_line(&approval.reason, 500)),
        risk = escape(approval.risk().as_str_name().trim_start_matches("RISK_")),
        digest = escape(digest),
        arguments = escape(&arguments),
    );
    page(StatusCode::OK, &format!("{word} this request?"), &body)
}

fn already_resolved(approval: &pb::Approval) -> Response {
    let state = approval
        .state()
        .as_str_name()
        .trim_start_matches("APPROVAL_STATE_")
        .to_lowercase();
    page(
        StatusCode::CONFLICT,
        "Already decided",
        &format!(
            "<p>This approval is no longer pending (it is {}). Nothing was changed.</p>",
            escape(&state)
        ),
    )
}

/// What deciding through a link came to.
#[derive(Debug)]
pub enum Decided {
    /// No link has this token (never handed out, forged or altered).
    Unknown,
    /// The link is used, revoked or expired.
    NotUsable(LinkState),
    /// The form token is not the link's.
    BadForm,
    /// The approval was no longer pending.
    AlreadyResolved(Option<Box<pb::Approval>>),
    /// Counted toward a quorum; the approval is still pending.
    Recorded,
    /// The decision resolved the approval, as `approver`.
    Resolved {
        verdict: pb::Verdict,
        approver: String,
    },
    /// The server refused the link's approver.
    NotAllowed(String),
    /// The arguments changed since they were shown; the link stays usable.
    Changed(String),
    /// The store or the server failed; nothing changed and the link still works.
    Unavailable,
}

impl Decided {
    /// Whether trying again later may decide (the store or the server failed).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Decided::Unavailable)
    }
}

impl Pages {
    /// Decides through the link with `token`, as its approver, when `confirmation` carries
    /// the link's form token: the confirmation page's POST, and a decision token that came
    /// back another way (ntfy's reply topic). A link decides once; the link that took
    /// itself and its siblings sends its decision again (same idempotency key, so the server
    /// counts it once) when it comes back, so that a crash between the claim and the
    /// server's answer loses nothing.
    pub async fn decide_token(&self, token: &str, confirmation: &Confirmation) -> Decided {
        let hash = token_hash(token);
        let link = match self.store.link(&hash).await {
            Ok(Some(link)) => link,
            Ok(None) => return Decided::Unknown,
            Err(error) => {
                tracing::error!(%error, "cannot read a decision link");
                return Decided::Unavailable;
            }
        };
        let Some(link_verdict) = LinkVerdict::parse(&link.verdict) else {
            return Decided::Unknown;
        };
        let again = match link.state(now_ms()) {
            LinkState::Usable => false,
            LinkState::Used => match self.store.claimed_by(&hash).await {
                Ok(true) => true,
                Ok(false) => return Decided::NotUsable(LinkState::Used),
                Err(error) => {
                    tracing::error!(%error, "cannot read a decision link's claim");
                    return Decided::Unavailable;
                }
            },
            state => return Decided::NotUsable(state),
        };
        let form_ok = hex::decode(confirmation.form_token.trim())
            .is_ok_and(|given| self.form_mac(&hash).verify_slice(&given).is_ok());
        if !form_ok {
            return Decided::BadForm;
        }
        let reason = agent_text::cap(confirmation.reason.trim(), MAX_REASON_CHARS);
        let claimed_ms = now_ms();
        if !again {
            match self.store.claim(&hash, &link).await {
                Ok(true) => {}
                Ok(false) => {
                    return match self.store.link(&hash).await {
                        Ok(Some(now)) => Decided::NotUsable(now.state(now_ms())),
                        _ => Decided::Unavailable,
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "cannot claim a decision link");
                    return Decided::Unavailable;
                }
            }
        }
        let (verdict, scope) = match link_verdict {
            LinkVerdict::Approve => (pb::Verdict::Approve, pb::Scope::Once),
            LinkVerdict::Reject => (pb::Verdict::Reject, pb::Scope::Once),
            LinkVerdict::AllowSession => (pb::Verdict::Approve, pb::Scope::Session),
        };
        let request = pb::DecideRequest {
            approval_id: link.approval_id.clone(),
            verdict: verdict.into(),
            scope: scope.into(),
            reason,
            decider: Some(pb::Decider {
                channel: self.channel.to_owned(),
                user_id: link.approver.clone(),
                display_name: link.approver.clone(),
            }),
            idempotency_key: format!("{}:link:{hash}", self.channel),
            expected_args_digest: confirmation.args_digest.trim().to_owned(),
            ..Default::default()
        };
        match self.client.decide(request).await {
            Ok(response) => {
                tracing::info!(approval_id = %link.approval_id, approver = %link.approver, outcome = ?response.outcome(), "decision link used");
                match response.outcome() {
                    pb::DecideOutcome::AlreadyResolved => {
                        Decided::AlreadyResolved(response.approval.map(Box::new))
                    }
                    // The same link again: it decided before.
                    pb::DecideOutcome::Duplicate if again => Decided::NotUsable(LinkState::Used),
                    pb::DecideOutcome::Recorded => Decided::Recorded,
                    _ => Decided::Resolved {
                        verdict,
                        approver: link.approver,
                    },
                }
            }
            Err(ClientError::PermissionDenied(reason)) => {
                tracing::info!(approval_id = %link.approval_id, approver = %link.approver, %reason, "the server refused a decision link's approver");
                Decided::NotAllowed(reason)
            }
            Err(ClientError::FailedPrecondition(reason)) => {
                // Edited since it was shown: the link stays usable, to decide on what it
                // shows now.
                tracing::info!(approval_id = %link.approval_id, approver = %link.approver, %reason, "the arguments changed since the confirmation page");
                self.release(&link, claimed_ms).await;
                Decided::Changed(reason)
            }
            Err(error) => {
                tracing::warn!(approval_id = %link.approval_id, %error, "Decide failed; giving the link back");
                self.release(&link, claimed_ms).await;
                Decided::Unavailable
            }
        }
    }

    async fn release(&self, link: &Link, claimed_ms: i64) {
        if let Err(error) = self.store.release(link, claimed_ms).await {
            tracing::error!(%error, "cannot give a decision link back");
        }
    }
}

async fn decide(
    State(pages): State<Pages>,
    Path(token): Path<String>,
    Form(confirmation): Form<Confirmation>,
) -> Response {
    match pages.decide_token(&token, &confirmation).await {
        Decided::Unknown => unknown(),
        Decided::NotUsable(state) => refused(state),
        Decided::BadForm => page(
            StatusCode::FORBIDDEN,
            "Please confirm on the link's page",
            "<p>This form did not come from the confirmation page of this link. Nothing was changed; open the link again.</p>",
        ),
        Decided::AlreadyResolved(Some(approval)) => already_resolved(&approval),
        Decided::AlreadyResolved(None) => refused(LinkState::Used),
        Decided::Recorded => page(
            StatusCode::OK,
            "Decision recorded",
            "<p>Your decision was recorded; the request needs further approvals.</p>",
        ),
        Decided::Resolved { verdict, approver } => page(
            StatusCode::OK,
            if verdict == pb::Verdict::Approve {
                "Approved"
            } else {
                "Rejected"
            },
            &format!(
                "<p>You decided as <strong>{}</strong>. This link no longer works.</p>",
                escape(&approver)
            ),
        ),
        Decided::NotAllowed(reason) => page(
            StatusCode::FORBIDDEN,
            "Not allowed",
            &format!(
                "<p>The countersign server refused this decision: {}</p>",
                escape(&reason)
            ),
        ),
        Decided::Changed(reason) => page(
            StatusCode::CONFLICT,
            "The request changed",
            &format!(
                "<p>Nothing was decided: {}</p><p>Open the link again to see the request as it is now.</p>",
                escape(&reason)
            ),
        ),
        Decided::Unavailable => unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_no_hidden_characters() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"\u{202E}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;⟨U+202E⟩"
        );
    }
}
