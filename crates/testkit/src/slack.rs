//! A fake Slack on 127.0.0.1 that answers like the real one, errors included:
//!
//! - The Web API under `/api/`: `auth.test`, `chat.postMessage`, `chat.update`,
//!   `chat.postEphemeral`, `conversations.history` (with message metadata when
//!   `include_all_metadata` is set), `views.open` (only with a trigger id the fake handed out)
//!   and `apps.connections.open` (with the app-level token: the URL of its Socket Mode
//!   WebSocket). A wrong or missing token gets HTTP 200 `{"ok":false,"error":"invalid_auth"}`,
//!   an unknown message `message_not_found`, as Slack does.
//! - Channels a test makes ([`FakeSlack::add_channel`]): `users.conversations` lists those
//!   the bot is in, `conversations.list` the public ones (paginated with `cursor`, as Slack
//!   does), `conversations.join` joins a public one (`method_not_supported_for_channel_type`
//!   for a private one, `is_archived`, `channel_not_found`; `already_in_channel` as a
//!   warning), and `chat.postMessage` to one the bot is not in is `not_in_channel`.
//! - Socket Mode: `GET /socket` upgrades to a WebSocket that says `hello`, carries the
//!   envelopes a test pushes ([`FakeSlack::tap`], [`FakeSlack::submit_reason`],
//!   [`FakeSlack::push`]) and records every acknowledgement's `envelope_id`.
//! - Messages Block Kit refuses are refused like Slack does: more than 50 blocks or a section
//!   text over 3,000 characters (a header over 150) `invalid_blocks`, a `text` over 40,000
//!   characters `msg_too_long`.
//! - Tests inject failures into the next message write ([`FakeSlack::fail_next`]: a 429 with
//!   `Retry-After`, a 5xx; [`FakeSlack::refuse_next`]: an error code such as `msg_too_long`) or
//!   the next `apps.connections.open` ([`FakeSlack::fail_next_connect`]) and hold a post's answer after it was applied
//!   ([`FakeSlack::hold_posts`]), so that a worker can be killed between Slack storing a
//!   message and the worker hearing so.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;

const TEAM: &str = "T0FAKE";
const APP: &str = "A0FAKE";

/// A message as the fake stores it (the latest version of it).
#[derive(Clone, Debug)]
pub struct SlackMessage {
    pub channel: String,
    pub ts: String,
    pub text: String,
    pub blocks: Value,
    pub metadata: Option<Value>,
    /// How many times `chat.update` changed it.
    pub updates: u32,
}

impl SlackMessage {
    /// The buttons' action ids, in order.
    pub fn buttons(&self) -> Vec<String> {
        self.button_elements()
            .filter_map(|button| button["action_id"].as_str().map(str::to_owned))
            .collect()
    }

    fn button_elements(&self) -> impl Iterator<Item = &Value> {
        self.blocks
            .as_array()
            .into_iter()
            .flatten()
            .filter(|block| block["type"] == "actions")
            .flat_map(|block| block["elements"].as_array().into_iter().flatten())
    }

    /// The `value` of the button with `action_id`.
    pub fn button_value(&self, action_id: &str) -> Option<String> {
        self.button_elements()
            .find(|button| button["action_id"] == action_id)
            .and_then(|button| button["value"].as_str().map(str::to_owned))
    }

    /// Every text of its blocks, joined by newlines: what a reader sees.
    pub fn shown(&self) -> String {
        let mut texts = Vec::new();
        for block in self.blocks.as_array().into_iter().flatten() {
            if let Some(text) = block["text"]["text"].as_str() {
                texts.push(text.to_owned());
            }
        }
        texts.join("\n")
    }
}

/// One Web API request the fake answered.
#[derive(Clone, Debug)]
pub struct SlackRequest {
    pub method: String,
    pub status: u16,
    /// Slack's `error` when `ok` was false.
    pub error: Option<String>,
    pub at: std::time::Instant,
}

/// A failure to answer the next `chat.postMessage` / `chat.update` with.
#[derive(Clone, Copy, Debug)]
pub struct SlackFailure {
    pub status: u16,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

/// A message only one user sees.
#[derive(Clone, Debug)]
pub struct Ephemeral {
    pub channel: String,
    pub user: String,
    pub text: String,
}

/// A modal opened with `views.open`.
#[derive(Clone, Debug)]
pub struct OpenedView {
    pub id: String,
    pub trigger_id: String,
    pub view: Value,
}

#[derive(Default)]
struct FakeState {
    messages: Vec<SlackMessage>,
    requests: Vec<SlackRequest>,
    failures: VecDeque<SlackFailure>,
    /// Error codes to refuse the next message writes with (HTTP 200, `ok: false`).
    refusals: VecDeque<String>,
    /// Failures for the next `apps.connections.open` calls.
    connect_failures: VecDeque<SlackFailure>,
    hold: Duration,
    ephemerals: Vec<Ephemeral>,
    views: Vec<OpenedView>,
    triggers: Vec<String>,
    sockets: Vec<mpsc::UnboundedSender<String>>,
    connections: u32,
    acks: Vec<String>,
    channels: Vec<FakeChannel>,
    next: u64,
}

/// A channel of the fake workspace.
#[derive(Clone, Debug)]
struct FakeChannel {
    id: String,
    name: String,
    private: bool,
    archived: bool,
    bot_member: bool,
}

impl FakeChannel {
    /// The conversation object Slack answers with.
    fn json(&self) -> Value {
        json!({
            "id": self.id, "name": self.name, "name_normalized": self.name,
            "is_channel": !self.private, "is_group": self.private, "is_im": false, "is_mpim": false,
            "is_private": self.private, "is_archived": self.archived, "is_general": false,
            "is_shared": false, "is_org_shared": false, "is_member": self.bot_member,
            "created": 1_700_000_000u64, "creator": "U0CREATOR", "num_members": 2,
        })
    }
}

/// How many conversations one page of `users.conversations` / `conversations.list` holds
/// (small, so that paging is exercised).
const CONVERSATIONS_PAGE: usize = 2;

impl FakeState {
    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

struct Shared {
    bot_token: String,
    app_token: String,
    addr: SocketAddr,
    state: Mutex<FakeState>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The fake; dropping it stops it.
pub struct FakeSlack {
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeSlack {
    /// Starts a fake that accepts `bot_token` for the Web API and `app_token` for Socket Mode.
    pub async fn start(bot_token: &str, app_token: &str) -> FakeSlack {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Slack to 127.0.0.1");
        let addr = listener.local_addr().expect("the fake Slack's address");
        let shared = Arc::new(Shared {
            bot_token: bot_token.to_owned(),
            app_token: app_token.to_owned(),
            addr,
            state: Mutex::new(FakeState::default()),
        });
        let app = Router::new()
            .route("/api/{method}", any(web_api))
            .route("/socket", get(socket))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeSlack { shared, server }
    }

    /// The Web API base URL to configure (`slack.api_url`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.shared.addr)
    }

    /// The messages of `channel`, oldest first.
    pub fn messages(&self, channel: &str) -> Vec<SlackMessage> {
        let state = self.shared.lock();
        state
            .messages
            .iter()
            .filter(|message| message.channel == channel)
            .cloned()
            .collect()
    }

    pub fn requests(&self) -> Vec<SlackRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests to one Web API method.
    pub fn calls(&self, method: &str) -> Vec<SlackRequest> {
        let state = self.shared.lock();
        let calls = state.requests.iter().filter(|r| r.method == method);
        calls.cloned().collect()
    }

    pub fn ephemerals(&self) -> Vec<Ephemeral> {
        self.shared.lock().ephemerals.clone()
    }

    pub fn views(&self) -> Vec<OpenedView> {
        self.shared.lock().views.clone()
    }

    /// The `envelope_id`s acknowledged, in order.
    pub fn acks(&self) -> Vec<String> {
        self.shared.lock().acks.clone()
    }

    /// How many Socket Mode connections are open.
    pub fn connections(&self) -> u32 {
        self.shared.lock().connections
    }

    /// Adds a channel named `name` to the workspace (private or public, the bot in it or
    /// not); its id.
    pub fn add_channel(&self, name: &str, private: bool, bot_member: bool) -> String {
        let mut state = self.shared.lock();
        let id = format!(
            "{}0FAKE{}",
            if private { 'G' } else { 'C' },
            state.next_id()
        );
        state.channels.push(FakeChannel {
            id: id.clone(),
            name: name.to_owned(),
            private,
            archived: false,
            bot_member,
        });
        id
    }

    /// Archives the channel `id`.
    pub fn archive_channel(&self, id: &str) {
        let mut state = self.shared.lock();
        for channel in state.channels.iter_mut().filter(|channel| channel.id == id) {
            channel.archived = true;
        }
    }

    /// Whether the bot is in the channel `id`.
    pub fn bot_in(&self, id: &str) -> bool {
        let state = self.shared.lock();
        state
            .channels
            .iter()
            .any(|channel| channel.id == id && channel.bot_member)
    }

    /// The next message write is answered with `failure` (and not applied).
    pub fn fail_next(&self, failure: SlackFailure) {
        self.shared.lock().failures.push_back(failure);
    }

    /// Refuses the next message write with Slack's `error` code (`invalid_blocks`,
    /// `msg_too_long`), as Slack refuses content whatever the fake checks itself.
    pub fn refuse_next(&self, error: &str) {
        self.shared.lock().refusals.push_back(error.to_owned());
    }

    /// Answers the next `apps.connections.open` with `failure` (Socket Mode's connection).
    pub fn fail_next_connect(&self, failure: SlackFailure) {
        self.shared.lock().connect_failures.push_back(failure);
    }

    /// Posts are applied at once and answered `hold` later (zero: at once).
    pub fn hold_posts(&self, hold: Duration) {
        self.shared.lock().hold = hold;
    }

    /// Sends an envelope (`type`, `payload`) over the open Socket Mode connection; its id.
    pub fn push(&self, kind: &str, payload: Value) -> String {
        let mut state = self.shared.lock();
        let envelope_id = format!("env-{}", state.next_id());
        let envelope = json!({
            "envelope_id": envelope_id, "type": kind, "payload": payload,
            "accepts_response_payload": false,
        });
        state.sockets.retain(|socket| !socket.is_closed());
        let socket = state.sockets.last().expect("no Socket Mode connection");
        socket
            .send(envelope.to_string())
            .expect("the Socket Mode connection");
        envelope_id
    }

    /// `user` taps the button `action_id` of `message` over Socket Mode: the envelope's id and
    /// the `block_actions` payload it carried.
    pub fn tap(&self, user: &str, message: &SlackMessage, action_id: &str) -> (String, Value) {
        let value = message.button_value(action_id).unwrap_or_default();
        self.tap_with_value(user, message, action_id, &value)
    }

    /// Like [`FakeSlack::tap`] with a button value of the test's choosing (a forgery).
    pub fn tap_with_value(
        &self,
        user: &str,
        message: &SlackMessage,
        action_id: &str,
        value: &str,
    ) -> (String, Value) {
        let payload = self.block_actions(user, message, action_id, value);
        (self.push("interactive", payload.clone()), payload)
    }

    /// The `block_actions` payload of `user` tapping the button `action_id` (with `value`) on
    /// `message`, as Slack sends it (over Socket Mode, or POSTed in HTTP mode).
    pub fn block_actions(
        &self,
        user: &str,
        message: &SlackMessage,
        action_id: &str,
        value: &str,
    ) -> Value {
        let trigger_id = self.trigger();
        json!({
            "type": "block_actions",
            "team": {"id": TEAM, "domain": "fake"},
            "user": {"id": user, "username": user.to_lowercase(), "name": user.to_lowercase(), "team_id": TEAM},
            "api_app_id": APP,
            "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel, "is_ephemeral": false},
            "trigger_id": trigger_id,
            "channel": {"id": message.channel, "name": "approvals"},
            "message": {"type": "message", "ts": message.ts, "text": message.text},
            "response_url": format!("http://{}/response/{trigger_id}", self.shared.addr),
            "actions": [{
                "type": "button", "action_id": action_id, "block_id": "b1", "value": value,
                "text": {"type": "plain_text", "text": action_id},
                "action_ts": format!("{}.000100", now_secs()),
            }],
        })
    }

    /// `user` submits the modal `view` with `reason`: the `view_submission` envelope's id.
    pub fn submit_reason(&self, user: &str, view: &OpenedView, reason: &str) -> String {
        let mut submitted = view.view.clone();
        submitted["id"] = json!(view.id);
        submitted["team_id"] = json!(TEAM);
        submitted["hash"] = json!("1.fake");
        submitted["state"] = json!({"values": {"reason": {"reason_text": {"type": "plain_text_input", "value": reason}}}});
        let payload = json!({
            "type": "view_submission",
            "team": {"id": TEAM, "domain": "fake"},
            "user": {"id": user, "username": user.to_lowercase(), "name": user.to_lowercase(), "team_id": TEAM},
            "view": submitted,
            "trigger_id": self.trigger(),
        });
        self.push("interactive", payload)
    }

    fn trigger(&self) -> String {
        let mut state = self.shared.lock();
        let trigger_id = format!("{}.{}.fake", now_secs(), state.next_id());
        state.triggers.push(trigger_id.clone());
        trigger_id
    }

    /// Waits (up to 20 s) until `check` finds something in the fake, and returns it.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeSlack) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::Instant::now() > deadline {
                let messages = self.shared.lock().messages.clone();
                panic!("timed out waiting for {what}; messages: {messages:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Slack's request signature: `v0=` and the hex HMAC-SHA256, keyed with the app's signing
/// secret, of `v0:{timestamp}:{body}`.
pub fn signature(signing_secret: &str, timestamp: u64, body: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(signing_secret.as_bytes()).expect("any key length");
    mac.update(format!("v0:{timestamp}:{body}").as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

/// POSTs an interaction `payload` to a Request URL as Slack does in HTTP mode: form-encoded
/// `payload=<JSON>`, with `X-Slack-Request-Timestamp` and the `X-Slack-Signature` made with
/// `signing_secret` (a test passes a wrong secret or an old timestamp to forge one). The
/// answer's status.
pub async fn post_interaction(
    url: &str,
    signing_secret: &str,
    timestamp: u64,
    payload: &Value,
) -> u16 {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let request = json!({
        "method": "POST",
        "url": url,
        "headers": {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp.to_string(),
            "X-Slack-Signature": signature(signing_secret, timestamp, &body),
        },
        "body": body,
    });
    crate::ntfy::tap(&request).await.0
}

/// The Unix time now, in seconds (a request's timestamp).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Block Kit's documented limits, which Slack enforces by refusing the message.
const MAX_BLOCKS: usize = 50;
const MAX_SECTION_TEXT_CHARS: usize = 3_000;
const MAX_HEADER_TEXT_CHARS: usize = 150;
/// `chat.postMessage`'s `text` (Slack truncates past 40,000 characters; the fake refuses).
const MAX_MESSAGE_TEXT_CHARS: usize = 40_000;

/// Why Slack would refuse the blocks and text of a message, as its `error` code.
fn refused_content(body: &Value) -> Option<&'static str> {
    if body["text"].as_str().unwrap_or_default().chars().count() > MAX_MESSAGE_TEXT_CHARS {
        return Some("msg_too_long");
    }
    let blocks = body["blocks"].as_array()?;
    if blocks.len() > MAX_BLOCKS {
        return Some("invalid_blocks");
    }
    let too_long = |block: &Value, max: usize| {
        block["text"]["text"]
            .as_str()
            .is_some_and(|text| text.chars().count() > max)
    };
    blocks
        .iter()
        .any(|block| match block["type"].as_str() {
            Some("section") => too_long(block, MAX_SECTION_TEXT_CHARS),
            Some("header") => too_long(block, MAX_HEADER_TEXT_CHARS),
            _ => false,
        })
        .then_some("invalid_blocks")
}

/// Slack's answer to a failed call: HTTP 200, `ok: false`.
fn slack_error(error: &str) -> (StatusCode, Value) {
    (StatusCode::OK, json!({"ok": false, "error": error}))
}

async fn web_api(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let writes = ["chat.postMessage", "chat.update"].contains(&method.as_str());
    let failure = if writes {
        shared.lock().failures.pop_front()
    } else if method == "apps.connections.open" {
        shared.lock().connect_failures.pop_front()
    } else {
        None
    };
    let (status, answer, retry_after) = match failure {
        Some(failure) => {
            let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let answer = if failure.status == 429 {
                json!({"ok": false, "error": "ratelimited"})
            } else {
                json!({"ok": false, "error": "internal_error"})
            };
            (status, answer, failure.retry_after)
        }
        None => {
            let refusal = if writes {
                shared.lock().refusals.pop_front()
            } else {
                None
            };
            let (status, answer) = match refusal {
                Some(error) => slack_error(&error),
                None => answer(&shared, &method, &query, &headers, &body),
            };
            (status, answer, None)
        }
    };
    shared.lock().requests.push(SlackRequest {
        method: method.clone(),
        status: status.as_u16(),
        error: answer["error"].as_str().map(str::to_owned),
        at: std::time::Instant::now(),
    });
    let hold = shared.lock().hold;
    if method == "chat.postMessage" && answer["ok"] == true && !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let mut response = (status, axum::Json(answer)).into_response();
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(
            "retry-after",
            seconds.to_string().parse().expect("a number"),
        );
    }
    response
}

fn answer(
    shared: &Shared,
    method: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Value,
) -> (StatusCode, Value) {
    let token = bearer(headers);
    if method == "apps.connections.open" {
        if token == Some(shared.bot_token.as_str()) {
            return slack_error("not_allowed_token_type");
        }
        if token != Some(shared.app_token.as_str()) {
            return slack_error("invalid_auth");
        }
        let url = format!("ws://{}/socket", shared.addr);
        return (StatusCode::OK, json!({"ok": true, "url": url}));
    }
    if token != Some(shared.bot_token.as_str()) {
        return slack_error(if token.is_some_and(|t| t.starts_with("xapp-")) {
            "not_allowed_token_type"
        } else {
            "invalid_auth"
        });
    }
    let mut state = shared.lock();
    let text = |key: &str| body[key].as_str().unwrap_or_default().to_owned();
    match method {
        "auth.test" => (
            StatusCode::OK,
            json!({
                "ok": true, "url": "https://fake.slack.com/", "team": "Fake Workspace",
                "user": "countersign", "team_id": TEAM, "user_id": "U0BOT", "bot_id": "B0BOT",
            }),
        ),
        "users.conversations" | "conversations.list" => {
            let types = query.get("types").map_or("public_channel", String::as_str);
            let kinds: Vec<&str> = types.split(',').collect();
            let exclude_archived =
                query.get("exclude_archived").map(String::as_str) == Some("true");
            let listed: Vec<Value> = state
                .channels
                .iter()
                .filter(|channel| method == "conversations.list" || channel.bot_member)
                .filter(|channel| {
                    kinds.contains(&if channel.private {
                        "private_channel"
                    } else {
                        "public_channel"
                    })
                })
                // A bot sees a private channel only when it is in it.
                .filter(|channel| !channel.private || channel.bot_member)
                .filter(|channel| !(exclude_archived && channel.archived))
                .map(FakeChannel::json)
                .collect();
            let start: usize = match query.get("cursor").filter(|cursor| !cursor.is_empty()) {
                Some(cursor) => match cursor.strip_prefix("page:").and_then(|n| n.parse().ok()) {
                    Some(start) => start,
                    None => return slack_error("invalid_cursor"),
                },
                None => 0,
            };
            let end = (start + CONVERSATIONS_PAGE).min(listed.len());
            let next = if end < listed.len() {
                format!("page:{end}")
            } else {
                String::new()
            };
            (
                StatusCode::OK,
                json!({
                    "ok": true, "channels": listed.get(start..end).unwrap_or_default(),
                    "response_metadata": {"next_cursor": next},
                }),
            )
        }
        "conversations.join" => {
            let id = text("channel");
            let Some(channel) = state.channels.iter_mut().find(|channel| channel.id == id) else {
                return slack_error("channel_not_found");
            };
            if channel.private {
                return slack_error("method_not_supported_for_channel_type");
            }
            if channel.archived {
                return slack_error("is_archived");
            }
            let already = channel.bot_member;
            channel.bot_member = true;
            let mut answer = json!({"ok": true, "channel": channel.json()});
            if already {
                answer["warning"] = json!("already_in_channel");
                answer["response_metadata"] = json!({"warnings": ["already_in_channel"]});
            }
            (StatusCode::OK, answer)
        }
        "chat.postMessage" => {
            let channel = text("channel");
            if channel.is_empty() {
                return slack_error("channel_not_found");
            }
            let known = state.channels.iter().find(|known| known.id == channel);
            if known.is_some_and(|known| !known.bot_member) {
                return slack_error("not_in_channel");
            }
            if let Some(error) = refused_content(body) {
                return slack_error(error);
            }
            let ts = format!("{}.{:06}", now_secs(), state.next_id());
            let message = SlackMessage {
                channel: channel.clone(),
                ts: ts.clone(),
                text: text("text"),
                blocks: body["blocks"].clone(),
                metadata: body.get("metadata").cloned(),
                updates: 0,
            };
            state.messages.push(message);
            let stored = json!({"type": "message", "ts": ts, "text": text("text"), "bot_id": "B0BOT", "blocks": body["blocks"]});
            (
                StatusCode::OK,
                json!({"ok": true, "channel": channel, "ts": ts, "message": stored}),
            )
        }
        "chat.update" => {
            let (channel, ts) = (text("channel"), text("ts"));
            let Some(message) = state
                .messages
                .iter_mut()
                .find(|m| m.channel == channel && m.ts == ts)
            else {
                return slack_error("message_not_found");
            };
            if let Some(error) = refused_content(body) {
                return slack_error(error);
            }
            message.text = text("text");
            message.blocks = body["blocks"].clone();
            message.updates += 1;
            let updated =
                json!({"text": message.text, "bot_id": "B0BOT", "blocks": message.blocks});
            (
                StatusCode::OK,
                json!({"ok": true, "channel": channel, "ts": ts, "text": message.text, "message": updated}),
            )
        }
        "chat.postEphemeral" => {
            state.ephemerals.push(Ephemeral {
                channel: text("channel"),
                user: text("user"),
                text: text("text"),
            });
            let ts = format!("{}.{:06}", now_secs(), state.next_id());
            (StatusCode::OK, json!({"ok": true, "message_ts": ts}))
        }
        "conversations.history" => {
            let channel = query.get("channel").cloned().unwrap_or_default();
            let oldest: f64 = query
                .get("oldest")
                .and_then(|o| o.parse().ok())
                .unwrap_or(0.0);
            let with_metadata =
                query.get("include_all_metadata").map(String::as_str) == Some("true");
            let mut messages: Vec<Value> = state
                .messages
                .iter()
                .filter(|m| m.channel == channel && m.ts.parse::<f64>().unwrap_or(0.0) > oldest)
                .map(|m| {
                    let mut message = json!({"type": "message", "ts": m.ts, "text": m.text, "bot_id": "B0BOT", "blocks": m.blocks});
                    if let (true, Some(metadata)) = (with_metadata, &m.metadata) {
                        message["metadata"] = metadata.clone();
                    }
                    message
                })
                .collect();
            messages.reverse();
            (
                StatusCode::OK,
                json!({"ok": true, "messages": messages, "has_more": false}),
            )
        }
        "views.open" => {
            let trigger_id = text("trigger_id");
            if !state.triggers.contains(&trigger_id) {
                return slack_error("invalid_trigger_id");
            }
            let id = format!("V0FAKE{}", state.next_id());
            let view = body["view"].clone();
            state.views.push(OpenedView {
                id: id.clone(),
                trigger_id,
                view: view.clone(),
            });
            let mut opened = view;
            opened["id"] = json!(id);
            opened["team_id"] = json!(TEAM);
            opened["hash"] = json!("1.fake");
            (StatusCode::OK, json!({"ok": true, "view": opened}))
        }
        _ => slack_error("unknown_method"),
    }
}

async fn socket(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(move |socket| serve_socket(shared, socket))
}

async fn serve_socket(shared: Arc<Shared>, mut socket: WebSocket) {
    let (sender, mut envelopes) = mpsc::unbounded_channel::<String>();
    {
        let mut state = shared.lock();
        state.sockets.push(sender);
        state.connections += 1;
    }
    let hello = json!({
        "type": "hello", "num_connections": 1,
        "connection_info": {"app_id": APP},
        "debug_info": {"host": "fake-slack", "approximate_connection_time": 18060},
    });
    let mut open = socket
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_ok();
    while open {
        tokio::select! {
            envelope = envelopes.recv() => match envelope {
                Some(envelope) => open = socket.send(Message::Text(envelope.into())).await.is_ok(),
                None => open = false,
            },
            received = socket.recv() => match received {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(ack) = serde_json::from_str::<Value>(&text) {
                        if let Some(id) = ack["envelope_id"].as_str() {
                            shared.lock().acks.push(id.to_owned());
                        }
                    }
                }
                Some(Ok(Message::Ping(data))) => open = socket.send(Message::Pong(data)).await.is_ok(),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => open = false,
            },
        }
    }
    let mut state = shared.lock();
    state.connections = state.connections.saturating_sub(1);
}
