//! `POST /webhook`: GitHub's deliveries.
//!
//! The signature (`X-Hub-Signature-256`, HMAC-SHA256 of the raw body, compared in constant
//! time) is checked before anything else: a missing or wrong one gets 401 and changes nothing.
//! Each `X-GitHub-Delivery` is handled once (GitHub redelivers on request). `ping` gets 200;
//! an `issue_comment` `created` is queued for the worker and answered 202 at once, well within
//! GitHub's 10 s; every other event or action gets 200 and is ignored.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::api::IssueComment;
use crate::inbound::Input;
use crate::incoming::IncomingComment;
use crate::recent::RecentSet;
use crate::target::{IssueRef, RepoName};

/// GitHub caps payloads at 25 MB; comment deliveries are a few kB.
const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;
const REMEMBERED_DELIVERIES: usize = 10_000;

#[derive(Clone)]
struct WebhookState {
    secret: Arc<str>,
    deliveries: Arc<Mutex<RecentSet<String>>>,
    inputs: mpsc::Sender<Input>,
}

pub fn router(secret: &str, inputs: mpsc::Sender<Input>) -> Router {
    let state = WebhookState {
        secret: Arc::from(secret),
        deliveries: Arc::new(Mutex::new(RecentSet::new(REMEMBERED_DELIVERIES))),
        inputs,
    };
    Router::new()
        .route("/webhook", post(receive))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

#[derive(Deserialize)]
struct IssueCommentEvent {
    action: String,
    issue: EventIssue,
    comment: IssueComment,
    repository: EventRepository,
}

#[derive(Deserialize)]
struct EventIssue {
    number: u64,
}

#[derive(Deserialize)]
struct EventRepository {
    full_name: String,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok()
}

async fn receive(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let delivery = header(&headers, "x-github-delivery").unwrap_or_default();
    let Some(signature) = header(&headers, "x-hub-signature-256") else {
        tracing::warn!(delivery, "webhook delivery without signature refused");
        return (StatusCode::UNAUTHORIZED, "missing X-Hub-Signature-256");
    };
    if octocrab::models::webhook_events::verify_signature(signature, state.secret.as_bytes(), &body)
        .is_err()
    {
        tracing::warn!(delivery, "webhook delivery with a bad signature refused");
        return (StatusCode::UNAUTHORIZED, "bad signature");
    }
    let Some(event) = header(&headers, "x-github-event") else {
        return (StatusCode::BAD_REQUEST, "missing X-GitHub-Event");
    };
    if delivery.is_empty() {
        return (StatusCode::BAD_REQUEST, "missing X-GitHub-Delivery");
    }
    let first_time = state
        .deliveries
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(delivery.to_string());
    if !first_time {
        tracing::info!(delivery, event, "webhook delivery seen before; ignored");
        return (StatusCode::OK, "duplicate delivery");
    }
    match event {
        "ping" => {
            tracing::info!(delivery, "webhook ping");
            (StatusCode::OK, "pong")
        }
        "issue_comment" => {
            let parsed: IssueCommentEvent = match serde_json::from_slice(&body) {
                Ok(parsed) => parsed,
                Err(error) => {
                    tracing::warn!(delivery, %error, "malformed issue_comment delivery");
                    forget(&state, delivery);
                    return (StatusCode::BAD_REQUEST, "malformed issue_comment payload");
                }
            };
            if parsed.action != "created" {
                tracing::debug!(delivery, action = %parsed.action, "issue_comment action ignored");
                return (StatusCode::OK, "ignored");
            }
            let repo: RepoName = match parsed.repository.full_name.parse() {
                Ok(repo) => repo,
                Err(error) => {
                    tracing::warn!(delivery, %error, "issue_comment delivery with an odd repository name");
                    return (StatusCode::OK, "ignored");
                }
            };
            let incoming = IncomingComment {
                issue: IssueRef {
                    repo,
                    number: parsed.issue.number,
                },
                comment: parsed.comment,
            };
            tracing::debug!(delivery, issue = %incoming.issue, comment_id = incoming.comment.id, "comment received by webhook");
            match state.inputs.try_send(Input::Comments(vec![incoming])) {
                Ok(()) => (StatusCode::ACCEPTED, "queued"),
                Err(_) => {
                    // Let a redelivery from GitHub's UI get through later.
                    forget(&state, delivery);
                    tracing::warn!(delivery, "worker queue full; delivery refused");
                    (StatusCode::SERVICE_UNAVAILABLE, "busy")
                }
            }
        }
        other => {
            tracing::debug!(delivery, event = other, "webhook event ignored");
            (StatusCode::OK, "ignored")
        }
    }
}

fn forget(state: &WebhookState, delivery: &str) {
    state
        .deliveries
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&delivery.to_string());
}
