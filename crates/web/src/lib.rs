//! countersign's web inbox: a browser channel where approvers see everything pending live,
//! read the full call (arguments pretty-printed, file edits as diffs, the audit timeline) and
//! decide one by one or in batches.
//!
//! It is a channel worker like the Telegram and GitHub ones: it talks to the server only
//! through the client SDK, with a worker token for channel `web`. One `WatchApprovals` stream
//! keeps the pending set ([`live`]); pages are rendered on the server from compile-time checked
//! templates ([`pages`]) and kept live with server-sent events ([`events`]). Decisions are
//! recorded with the decider on channel `web` (the approver's id and name), so the server's
//! approver registry, quorum, risk ceilings and self-approval rules apply unchanged.

pub mod app;
pub mod auth;
pub mod config;
pub mod deciders;
pub mod events;
mod http;
pub mod layout;
pub mod live;
pub mod pages;
pub mod passkeys;
pub mod sessions;
pub mod view;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use countersign_client::{Client, ClientError};
use tokio::net::TcpListener;

pub use crate::app::App;

pub use config::Settings;
use http::Refusal;
use live::Live;
use sessions::{SessionError, Sessions};

/// Scripts and styles come only from files of this origin: no inline code, no inline styles.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");
const FAVICON: &[u8] = include_bytes!("../assets/favicon.ico");

/// Why the web inbox stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error(transparent)]
    Sessions(#[from] SessionError),
    #[error("countersign server: {0}")]
    Client(#[from] ClientError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Serve(#[source] std::io::Error),
}

/// Binds `settings.listen` and serves until `shutdown` completes.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WebError> {
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|source| WebError::Listen {
            addr: settings.listen,
            source,
        })?;
    serve(settings, listener, shutdown).await
}

/// Serves the inbox on `listener` until `shutdown` completes, or until the server refuses the
/// worker token for good.
pub async fn serve(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WebError> {
    let sessions = Sessions::open(&settings.state_dir).await?;
    let client = Client::connect(settings.server.clone())?;
    let admin = settings
        .admin_server
        .clone()
        .map(Client::connect)
        .transpose()?;
    let csrf_key = sessions.csrf_key().await?;
    let (close, closing) = tokio::sync::watch::channel(false);
    let app = Arc::new(App {
        settings,
        client: client.clone(),
        admin,
        sessions,
        live: Arc::new(Live::default()),
        deciders: Arc::default(),
        csrf_key,
        closing,
    });
    if let Some(admin) = app.admin.clone() {
        tokio::spawn(deciders::follow(admin, Arc::clone(&app.deciders)));
    }
    let follow = live::follow(client, Arc::clone(&app.live));
    let addr = listener.local_addr().map_err(WebError::Serve)?;
    tracing::info!(%addr, public_url = %app.settings.public_url, "web inbox listening");
    let http = axum::serve(
        listener,
        router(app).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: ending event streams");
        let _ = close.send(true);
    });
    tokio::select! {
        served = http => served.map_err(WebError::Serve),
        followed = follow => {
            let error = followed.err().unwrap_or(ClientError::Unavailable("the watch ended".into()));
            tracing::error!(%error, "the server refused the inbox's watch");
            Err(WebError::Client(error))
        }
    }
}

/// Every route of the inbox.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::inbox))
        .route("/events", get(events::events))
        .route("/approvals/{id}", get(pages::approval))
        .route("/approvals/{id}/decide", post(pages::decide))
        .route("/batch", post(pages::batch_review))
        .route("/batch/decide", post(pages::batch_decide))
        .route("/history", get(pages::history))
        .route("/grants", get(pages::grants))
        .route(
            "/passkeys",
            get(passkeys::passkeys).post(passkeys::register),
        )
        .route("/passkeys/remove", post(passkeys::remove))
        .route("/grants/{id}/revoke", post(pages::revoke_grant))
        .route("/login/{token}", get(pages::login_page))
        .route("/login", post(pages::login))
        .route("/logout", post(pages::logout))
        .route(
            "/assets/app.js",
            get(|| asset(APP_JS.as_bytes(), "text/javascript; charset=utf-8")),
        )
        .route(
            "/assets/app.css",
            get(|| asset(APP_CSS.as_bytes(), "text/css; charset=utf-8")),
        )
        .route("/favicon.ico", get(|| asset(FAVICON, "image/x-icon")))
        // A page of the inbox's own, with a way back, instead of the browser's empty error.
        .method_not_allowed_fallback(|| async { Refusal::WrongMethod })
        .fallback(|| async { Refusal::NoSuchPage })
        .layer(axum::middleware::map_response(security_headers))
        .with_state(app)
}

async fn asset(body: &'static [u8], content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Login links carry a token in their path: never pass it on.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}
