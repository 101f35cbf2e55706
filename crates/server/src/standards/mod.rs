//! The open-standards front door on the `[http]` listener (docs/standards.md): the OpenID
//! AuthZEN Access Evaluation API and OpenID CIBA (poll mode). A thin edge like the gRPC one: each handler authenticates
//! the bearer token into a [`Caller`](crate::caller::Caller), turns the JSON into the use
//! case's input, calls [`App`] and turns the answer back; errors become HTTP statuses once,
//! in `http.rs`.

mod authzen;
mod ciba;
mod ciba_state;
mod clients;
mod http;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub(crate) use self::ciba_state::Ciba;
pub(crate) use self::clients::Clients;
use self::http::Front;
use crate::app::App;
use crate::auth::Authenticator;

/// Serves the standards endpoints on `listener` until `stop` turns true.
pub(crate) async fn serve(
    app: Arc<App>,
    auth: Authenticator,
    base_url: String,
    ciba: Arc<Ciba>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let body_limit = app.config().limits.max_message_bytes;
    let front = Front {
        app,
        auth,
        base_url,
        ciba,
    };
    let router = Router::new()
        .route(
            "/.well-known/authzen-configuration",
            get(authzen::configuration),
        )
        .route(authzen::EVALUATION_PATH, post(authzen::evaluation))
        .route(authzen::EVALUATIONS_PATH, post(authzen::evaluations))
        .route(ciba::CONFIGURATION_PATH, get(ciba::configuration))
        .route(ciba::JWKS_PATH, get(ciba::jwks))
        .route(ciba::AUTHORIZE_PATH, post(ciba::authorize))
        .route(ciba::TOKEN_PATH, post(ciba::token))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(front);
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        })
        .await
}
