//! The address check of `countersign setup email`: a test mail through the configured relay
//! whose link confirms that the approver reads that mailbox. Like the decision links, the
//! link's GET only shows a page (mail scanners open links); its button's POST confirms.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;
use tokio::sync::oneshot;

use crate::api::{Mailer, SmtpError};
use crate::config::Smtp;

/// Why the address was not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    #[error(transparent)]
    Smtp(#[from] SmtpError),
    #[error("the test mail's link was not confirmed within {0:?}")]
    Timeout(Duration),
    #[error("cannot serve the confirmation page: {0}")]
    Serve(std::io::Error),
}

/// What to mail and where the confirmation page is.
pub struct Check<'a> {
    pub smtp: &'a Smtp,
    pub from: &'a Mailbox,
    pub to: &'a str,
    /// Where the page listens (bound by the caller, so that a taken port is said first).
    pub listener: tokio::net::TcpListener,
    /// How the approver's browser reaches it.
    pub public_url: &'a str,
    pub wait: Duration,
}

#[derive(Clone)]
struct Page {
    token: Arc<String>,
    confirmed: Arc<Mutex<Option<oneshot::Sender<()>>>>,
}

/// Mails the test message (an `Err` when the relay refuses it: nothing else happens), calls
/// `sent`, then waits until its link is confirmed or `wait` passed.
pub async fn confirm_address(check: Check<'_>, sent: impl FnOnce()) -> Result<(), ConfirmError> {
    let token = countersign_links::new_token();
    let (confirmed, waiting) = oneshot::channel();
    let page = Page {
        token: Arc::new(token.clone()),
        confirmed: Arc::new(Mutex::new(Some(confirmed))),
    };
    let router = Router::new()
        .route("/confirm/{token}", get(show).post(confirm))
        .with_state(page);
    let listener = check.listener;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let url = format!("{}/confirm/{token}", check.public_url.trim_end_matches('/'));
    let result = async {
        Mailer::new(check.smtp)?
            .send(message(check.from, check.to, &url)?)
            .await?;
        sent();
        match tokio::time::timeout(check.wait, waiting).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(ConfirmError::Timeout(check.wait)),
        }
    }
    .await;
    if server.is_finished() {
        if let Ok(Err(error)) = server.await {
            return Err(ConfirmError::Serve(error));
        }
    } else {
        server.abort();
    }
    result
}

fn message(from: &Mailbox, to: &str, url: &str) -> Result<Message, SmtpError> {
    let to: Mailbox = to
        .parse()
        .map_err(|error| SmtpError::Setup(format!("recipient {to:?}: {error}")))?;
    let plain = format!(
        "countersign will mail approval requests to this address.\n\nConfirm it: {url}\n\nThe link opens a page; press its button. If you did not run countersign setup email, ignore this mail.\n"
    );
    let html = format!(
        "<p>countersign will mail approval requests to this address.</p><p><a href=\"{url}\">Confirm this address</a></p><p>The link opens a page; press its button. If you did not run countersign setup email, ignore this mail.</p>"
    );
    let part = |content_type: ContentType, body: String| {
        SinglePart::builder()
            .header(content_type)
            .header(ContentTransferEncoding::Base64)
            .body(body)
    };
    Ok(Message::builder()
        .from(from.clone())
        .to(to)
        .subject("countersign: confirm your address for approval requests")
        .multipart(
            MultiPart::alternative()
                .singlepart(part(ContentType::TEXT_PLAIN, plain))
                .singlepart(part(ContentType::TEXT_HTML, html)),
        )?)
}

fn page(status: StatusCode, body: &str) -> Response {
    (
        status,
        Html(format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><meta name=\"robots\" content=\"noindex\"><title>countersign</title></head><body style=\"font-family:sans-serif;max-width:40em;margin:2em auto;padding:0 1em\">{body}</body></html>"
        )),
    )
        .into_response()
}

async fn show(State(page_state): State<Page>, Path(token): Path<String>) -> Response {
    if token != *page_state.token {
        return page(StatusCode::NOT_FOUND, "<h1>Unknown link</h1>");
    }
    page(
        StatusCode::OK,
        "<h1>Confirm this address?</h1><p>countersign will mail approval requests here.</p><form method=\"post\"><button type=\"submit\">Confirm</button></form>",
    )
}

async fn confirm(State(page_state): State<Page>, Path(token): Path<String>) -> Response {
    if token != *page_state.token {
        return page(StatusCode::NOT_FOUND, "<h1>Unknown link</h1>");
    }
    let sender = page_state
        .confirmed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(sender) = sender {
        let _ = sender.send(());
    }
    page(
        StatusCode::OK,
        "<h1>Address confirmed</h1><p>You can close this page; the setup goes on in your terminal.</p>",
    )
}
