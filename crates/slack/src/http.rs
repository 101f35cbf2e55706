//! HTTP mode: instead of Socket Mode, Slack POSTs each interaction (a tap, a modal's
//! submission) to the app's Interactivity Request URL, served here. Every request must carry
//! Slack's signature (`X-Slack-Signature: v0=HMAC-SHA256(signing secret,
//! "v0:{X-Slack-Request-Timestamp}:{body}")`) with a timestamp within five minutes, checked
//! by slack-morphism's verifier; anything else is refused with 401 and decides nothing. A
//! verified interaction is handled exactly as one from Socket Mode.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use slack_morphism::prelude::*;
use slack_morphism::signature_verifier::SlackEventSignatureVerifier;

use crate::inbound::Inbound;

/// The path of the Interactivity Request URL.
pub const INTERACTIONS_PATH: &str = "/slack/interactions";

struct Receiver {
    inbound: Arc<Inbound>,
    verifier: SlackEventSignatureVerifier,
}

/// Serves the Request URL on `listen` until the listener fails.
pub async fn serve(
    listen: SocketAddr,
    inbound: Arc<Inbound>,
    signing_secret: &str,
) -> std::io::Result<()> {
    let receiver = Arc::new(Receiver {
        inbound,
        verifier: SlackEventSignatureVerifier::new(&signing_secret.to_owned().into()),
    });
    let router = Router::new()
        .route(INTERACTIONS_PATH, post(interaction))
        .with_state(receiver);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, path = INTERACTIONS_PATH, "serving Slack's interactions over HTTP");
    axum::serve(listener, router).await
}

async fn interaction(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let signed = match (
        header(SlackEventSignatureVerifier::SLACK_SIGNED_HASH_HEADER),
        header(SlackEventSignatureVerifier::SLACK_SIGNED_TIMESTAMP),
    ) {
        (Some(signature), Some(timestamp)) => receiver
            .verifier
            .verify(signature, &body, timestamp)
            .map_err(|error| error.to_string()),
        _ => Err("no signature headers".to_owned()),
    };
    if let Err(reason) = signed {
        tracing::warn!(%reason, "refused an unsigned or stale Slack request");
        return StatusCode::UNAUTHORIZED;
    }
    let payload = form_urlencoded::parse(body.as_bytes())
        .find(|(key, _)| key == "payload")
        .map(|(_, value)| value.into_owned());
    let Some(Ok(event)) =
        payload.map(|payload| serde_json::from_str::<SlackInteractionEvent>(&payload))
    else {
        tracing::warn!("a signed Slack request without an interaction payload");
        return StatusCode::BAD_REQUEST;
    };
    receiver.inbound.handle(event).await;
    StatusCode::OK
}
