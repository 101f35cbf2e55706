//! HTTP interactions: instead of the Gateway, Discord POSTs each interaction to the
//! application's Interactions Endpoint URL, served here. Every request must carry
//! `X-Signature-Ed25519`, the hex Ed25519 signature of `X-Signature-Timestamp` followed by the
//! raw body, made with the application's key and checked against its public key, and a
//! timestamp within five minutes (a replayed request is refused); anything else is answered
//! 401 and decides nothing. A PING (type 1) is answered PONG; any other interaction is handled
//! exactly as one from the Gateway, its first answer the response's body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use twilight_model::application::interaction::Interaction;

use crate::inbound::{Inbound, Reply};

/// The path of the Interactions Endpoint URL.
pub const INTERACTIONS_PATH: &str = "/discord/interactions";
/// How old a signed request may be before it counts as replayed.
const MAX_AGE_SECS: u64 = 300;

struct Receiver {
    inbound: Arc<Inbound>,
    public_key: VerifyingKey,
}

/// Serves the Interactions Endpoint URL on `listen` until the listener fails.
pub async fn serve(
    listen: SocketAddr,
    inbound: Arc<Inbound>,
    public_key: VerifyingKey,
) -> std::io::Result<()> {
    let receiver = Arc::new(Receiver {
        inbound,
        public_key,
    });
    let router = Router::new()
        .route(INTERACTIONS_PATH, post(interaction))
        .with_state(receiver);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, path = INTERACTIONS_PATH, "serving Discord's interactions over HTTP");
    axum::serve(listener, router).await
}

/// Why a request is not Discord's: its signature or its age.
fn verified(public_key: &VerifyingKey, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let (Some(signature), Some(timestamp)) = (
        header("X-Signature-Ed25519"),
        header("X-Signature-Timestamp"),
    ) else {
        return Err("no signature headers".to_owned());
    };
    let signature = hex::decode(signature)
        .ok()
        .and_then(|bytes| Signature::from_slice(&bytes).ok())
        .ok_or("a signature that is no Ed25519 signature")?;
    let signed = [timestamp.as_bytes(), body].concat();
    public_key
        .verify_strict(&signed, &signature)
        .map_err(|_| "a signature not made with the application's key")?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs());
    match timestamp.parse::<u64>() {
        Ok(at) if now.abs_diff(at) <= MAX_AGE_SECS => Ok(()),
        _ => Err(format!(
            "a timestamp ({timestamp:?}) not within {MAX_AGE_SECS} s of now"
        )),
    }
}

async fn interaction(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(reason) = verified(&receiver.public_key, &headers, &body) {
        tracing::warn!(reason = %reason.escape_debug(), "refused a request not signed by Discord");
        return (StatusCode::UNAUTHORIZED, "invalid request signature").into_response();
    }
    let value: Value = serde_json::from_slice(&body).unwrap_or_default();
    if value["type"] == 1 {
        return Json(json!({"type": 1})).into_response();
    }
    let Ok(interaction) = serde_json::from_value::<Interaction>(value) else {
        tracing::warn!("a signed Discord request without an interaction");
        return StatusCode::BAD_REQUEST.into_response();
    };
    let (reply, answer) = oneshot::channel();
    // Decided after the answer is sent (Discord wants it within 3 seconds).
    let inbound = receiver.inbound.clone();
    tokio::spawn(async move { inbound.handle(&interaction, Reply::Http(reply)).await });
    match answer.await {
        Ok(answer) => Json(answer).into_response(),
        Err(_) => (StatusCode::BAD_REQUEST, "not a countersign interaction").into_response(),
    }
}
