//! A fake Discord on 127.0.0.1 that answers like the real one (API v10), errors included:
//!
//! - REST under `/api/v10/`: `POST /channels/{id}/messages`, `PATCH
//!   /channels/{id}/messages/{id}`, `GET /channels/{id}/messages?after=&limit=`, `POST
//!   /interactions/{id}/{token}/callback` (each interaction answered once: a second answer gets
//!   400 code 40060, as Discord does), `POST /webhooks/{application id}/{token}` (a follow-up,
//!   once the interaction was answered) and `GET /users/@me`. A wrong token gets 401 `{"message": "401: Unauthorized", "code": 0}`; content over 2,000
//!   characters or a `custom_id` over 100 gets 400 code 50035 (Invalid Form Body).
//! - The Gateway: `GET /gateway` upgrades to a WebSocket that says HELLO (op 10), takes
//!   IDENTIFY (op 2; a wrong token is closed with 4004), answers READY (with a
//!   `resume_gateway_url` back to this fake), ACKs heartbeats (op 1 → op 11), takes RESUME
//!   (op 6: the dispatches missed since the given sequence are replayed, then RESUMED; an
//!   unknown session gets INVALID_SESSION, op 9) and carries the INTERACTION_CREATE and
//!   MESSAGE_CREATE dispatches a test pushes ([`FakeDiscord::tap`],
//!   [`FakeDiscord::submit_modal`], [`FakeDiscord::direct_message`]). A dispatch pushed while
//!   no connection is open waits for the RESUME.
//! - Tests inject failures into the next message write ([`FakeDiscord::fail_next`]: a 429 with
//!   `retry_after`, global or the route's bucket; a 5xx), hold a post's answer after it was
//!   applied ([`FakeDiscord::hold_posts`]) and drop the Gateway connection
//!   ([`FakeDiscord::drop_gateway`]).

use std::collections::HashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub const APPLICATION_ID: &str = "1100000000000000001";
pub const BOT_USER_ID: &str = "1100000000000000001";
pub const GUILD_ID: &str = "1200000000000000001";
/// Discord's limit on a message's `content`.
const MAX_CONTENT_CHARS: usize = 2_000;
const MAX_CUSTOM_ID_CHARS: usize = 100;
/// Gateway intent for direct messages (MESSAGE_CREATE in DMs).
const DIRECT_MESSAGES: u64 = 1 << 12;

/// A message as the fake stores it (its latest version).
#[derive(Clone, Debug)]
pub struct DiscordMessage {
    pub id: String,
    pub channel_id: String,
    pub content: String,
    pub components: Value,
    pub allowed_mentions: Value,
    /// How many times it was edited.
    pub edits: u32,
}

impl DiscordMessage {
    /// The buttons' `custom_id`s, in order.
    pub fn buttons(&self) -> Vec<String> {
        let rows = self.components.as_array().into_iter().flatten();
        let buttons = rows.flat_map(|row| row["components"].as_array().into_iter().flatten());
        let ids = buttons.filter_map(|button| button["custom_id"].as_str());
        ids.map(str::to_owned).collect()
    }

    /// The `custom_id` of the button whose id has the verb `verb` (`countersign:<verb>:…`).
    pub fn button(&self, verb: &str) -> String {
        let prefix = format!("countersign:{verb}:");
        let found = self
            .buttons()
            .into_iter()
            .find(|id| id.starts_with(&prefix));
        found.unwrap_or_else(|| panic!("no {verb} button on {self:#?}"))
    }

    /// The message as Discord's API and Gateway show it.
    fn json(&self) -> Value {
        json!({
            "id": self.id, "channel_id": self.channel_id, "type": 0,
            "author": {"id": BOT_USER_ID, "username": "countersign", "discriminator": "0",
                       "global_name": null, "avatar": null, "bot": true},
            "content": self.content, "components": self.components,
            "timestamp": "2026-01-01T00:00:00.000000+00:00",
            "edited_timestamp": if self.edits > 0 { json!("2026-01-01T00:00:01.000000+00:00") } else { Value::Null },
            "tts": false, "mention_everyone": false, "mentions": [], "mention_roles": [],
            "attachments": [], "embeds": [], "pinned": false, "flags": 0,
        })
    }
}

/// A Discord user who taps.
#[derive(Clone, Debug)]
pub struct DiscordUser {
    pub id: String,
    pub username: String,
}

impl DiscordUser {
    pub fn new(id: &str, username: &str) -> DiscordUser {
        DiscordUser {
            id: id.to_owned(),
            username: username.to_owned(),
        }
    }

    fn json(&self) -> Value {
        json!({"id": self.id, "username": self.username, "discriminator": "0",
               "global_name": self.username, "avatar": null, "bot": false})
    }
}

/// One REST request the fake answered.
#[derive(Clone, Debug)]
pub struct DiscordRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub at: std::time::Instant,
}

/// A failure to answer the next message write (post or edit) with.
#[derive(Clone, Copy, Debug)]
pub struct DiscordFailure {
    pub status: u16,
    /// Seconds for a 429's `retry_after` (and `Retry-After`, rounded up).
    pub retry_after: Option<f64>,
    /// A 429 of the global limit (`X-RateLimit-Global: true`) rather than the route's bucket.
    pub global: bool,
}

/// The answer an interaction got (`POST /interactions/{id}/{token}/callback`).
#[derive(Clone, Debug)]
pub struct InteractionAnswer {
    pub interaction_id: String,
    pub status: u16,
    pub body: Value,
}

impl InteractionAnswer {
    /// The ephemeral text (type 4 with flag 64), if that is what it was.
    pub fn ephemeral_text(&self) -> Option<&str> {
        let ephemeral = self.body["type"] == 4 && self.body["data"]["flags"] == 64;
        ephemeral.then(|| self.body["data"]["content"].as_str().unwrap_or_default())
    }
}

#[derive(Default)]
struct Session {
    /// Every dispatch of the session, by sequence (1-based), for a RESUME's replay.
    dispatched: Vec<Value>,
    intents: u64,
}

#[derive(Default)]
struct FakeState {
    messages: Vec<DiscordMessage>,
    requests: Vec<DiscordRequest>,
    failures: VecDeque<DiscordFailure>,
    hold: Duration,
    /// Interactions dispatched, by id: their payload and whether they were answered.
    interactions: HashMap<String, (Value, bool)>,
    answers: Vec<InteractionAnswer>,
    followups: Vec<InteractionAnswer>,
    sessions: HashMap<String, Session>,
    /// The open connection: its session and where its dispatches go.
    connection: Option<(String, mpsc::UnboundedSender<Outgoing>)>,
    identifies: u32,
    resumes: u32,
    heartbeats: u32,
    dm_channels: HashMap<String, String>,
    next: u64,
}

enum Outgoing {
    Frame(Value),
    Drop,
}

impl FakeState {
    /// A new snowflake: ids grow with time, like Discord's.
    fn snowflake(&mut self) -> String {
        self.next += 1;
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as u64);
        (((ms - 1_420_070_400_000) << 22) + self.next).to_string()
    }

    /// Sends (or, with no connection, keeps for the RESUME) a dispatch `t` of the current
    /// session, or of the last one when the connection is down.
    fn dispatch(&mut self, kind: &str, data: Value) {
        let session_id = match &self.connection {
            Some((session, _)) => session.clone(),
            None => self
                .sessions
                .keys()
                .max()
                .cloned()
                .expect("no Gateway session"),
        };
        let session = self.sessions.get_mut(&session_id).expect("the session");
        if kind == "MESSAGE_CREATE" && session.intents & DIRECT_MESSAGES == 0 {
            return;
        }
        let seq = session.dispatched.len() + 1;
        let frame = json!({"op": 0, "s": seq, "t": kind, "d": data});
        session.dispatched.push(frame.clone());
        if let Some((_, sender)) = &self.connection {
            let _ = sender.send(Outgoing::Frame(frame));
        }
    }
}

struct Shared {
    bot_token: String,
    addr: SocketAddr,
    state: Mutex<FakeState>,
}

impl Shared {
    /// Whether an IDENTIFY or RESUME carries the bot's token (Discord takes it with or
    /// without the `Bot ` prefix there).
    fn gateway_token(&self, frame: &Value) -> bool {
        let token = frame["d"]["token"].as_str().unwrap_or_default();
        token.strip_prefix("Bot ").unwrap_or(token) == self.bot_token
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The fake; dropping it stops it.
pub struct FakeDiscord {
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeDiscord {
    /// Starts a fake that accepts `bot_token`.
    pub async fn start(bot_token: &str) -> FakeDiscord {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Discord to 127.0.0.1");
        let addr = listener.local_addr().expect("the fake Discord's address");
        let shared = Arc::new(Shared {
            bot_token: bot_token.to_owned(),
            addr,
            state: Mutex::new(FakeState::default()),
        });
        let app = Router::new()
            .route("/api/v10/{*path}", any(rest))
            .route("/gateway", get(gateway))
            .route("/gateway/", get(gateway))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeDiscord { shared, server }
    }

    /// The REST base URL to configure (`discord.api_url`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/v10", self.shared.addr)
    }

    /// The Gateway URL to configure (`discord.gateway_url`).
    pub fn gateway_url(&self) -> String {
        format!("ws://{}/gateway", self.shared.addr)
    }

    /// The messages of `channel`, oldest first.
    pub fn messages(&self, channel: &str) -> Vec<DiscordMessage> {
        let state = self.shared.lock();
        let of_channel = state.messages.iter().filter(|m| m.channel_id == channel);
        of_channel.cloned().collect()
    }

    pub fn requests(&self) -> Vec<DiscordRequest> {
        self.shared.lock().requests.clone()
    }

    /// The message posts answered, in order.
    pub fn posts(&self) -> Vec<DiscordRequest> {
        let requests = self.requests().into_iter();
        let posts = requests.filter(|r| r.method == "POST" && r.path.ends_with("/messages"));
        posts.collect()
    }

    /// The statuses of the answers to message posts, in order.
    pub fn post_statuses(&self) -> Vec<u16> {
        self.posts().into_iter().map(|r| r.status).collect()
    }

    /// Every answer to an interaction, in order.
    pub fn answers(&self) -> Vec<InteractionAnswer> {
        self.shared.lock().answers.clone()
    }

    /// Every follow-up message of an interaction (`POST /webhooks/{application id}/{token}`).
    pub fn followups(&self) -> Vec<InteractionAnswer> {
        self.shared.lock().followups.clone()
    }

    /// What the user was told ephemerally about the interaction `id`: in its answer (type 4,
    /// flag 64) or in a follow-up with flag 64.
    pub fn told(&self, id: &str) -> Option<String> {
        let answers = self
            .answers()
            .into_iter()
            .filter(|a| a.interaction_id == id);
        let mut told = answers.filter_map(|a| a.ephemeral_text().map(str::to_owned));
        let followups = self
            .followups()
            .into_iter()
            .filter(|f| f.interaction_id == id);
        let ephemeral = followups.filter(|f| f.body["flags"] == 64);
        told.next().or_else(|| {
            ephemeral
                .filter_map(|f| f.body["content"].as_str().map(str::to_owned))
                .next()
        })
    }

    /// How many times a Gateway session was identified, resumed, and heartbeats ACKed.
    pub fn identifies(&self) -> u32 {
        self.shared.lock().identifies
    }

    pub fn resumes(&self) -> u32 {
        self.shared.lock().resumes
    }

    pub fn heartbeats(&self) -> u32 {
        self.shared.lock().heartbeats
    }

    /// Whether a Gateway connection is open and ready (identified or resumed).
    pub fn connected(&self) -> bool {
        self.shared.lock().connection.is_some()
    }

    /// The next message write is answered with `failure` (and not applied).
    pub fn fail_next(&self, failure: DiscordFailure) {
        self.shared.lock().failures.push_back(failure);
    }

    /// Posts are applied at once and answered `hold` later (zero: at once).
    pub fn hold_posts(&self, hold: Duration) {
        self.shared.lock().hold = hold;
    }

    /// Drops the Gateway connection without a close frame (a network failure): the client
    /// must connect again and RESUME.
    pub fn drop_gateway(&self) {
        let mut state = self.shared.lock();
        if let Some((_, sender)) = state.connection.take() {
            let _ = sender.send(Outgoing::Drop);
        }
    }

    /// Drops the Gateway connection like [`FakeDiscord::drop_gateway`] and forgets every
    /// session, as Discord does once a session has been gone too long: the RESUME is answered
    /// INVALID_SESSION (op 9, not resumable), and the client must IDENTIFY again.
    pub fn drop_gateway_and_forget_sessions(&self) {
        let mut state = self.shared.lock();
        if let Some((_, sender)) = state.connection.take() {
            let _ = sender.send(Outgoing::Drop);
        }
        state.sessions.clear();
    }

    /// `user` taps the button `custom_id` on `message`: the interaction's id.
    pub fn tap(&self, user: &DiscordUser, message: &DiscordMessage, custom_id: &str) -> String {
        let data = json!({"custom_id": custom_id, "component_type": 2});
        self.interact(3, user, message, data)
    }

    /// `user` submits the modal an interaction was answered with (type 9), typing `reason`:
    /// the submission's interaction id.
    pub fn submit_modal(
        &self,
        user: &DiscordUser,
        answer: &InteractionAnswer,
        message: &DiscordMessage,
        reason: &str,
    ) -> String {
        let modal = &answer.body["data"];
        let rows = modal["components"].as_array().cloned().unwrap_or_default();
        let inputs: Vec<Value> = rows
            .iter()
            .flat_map(|row| row["components"].as_array().cloned().unwrap_or_default())
            .map(|input| json!({"type": 4, "custom_id": input["custom_id"], "value": reason}))
            .collect();
        let data = json!({"custom_id": modal["custom_id"], "components": [{"type": 1, "components": inputs}]});
        self.interact(5, user, message, data)
    }

    /// Dispatches the interaction `interaction_id` again, as it was (a redelivery).
    pub fn redeliver(&self, interaction_id: &str) {
        let mut state = self.shared.lock();
        let payload = state.interactions[interaction_id].0.clone();
        state.dispatch("INTERACTION_CREATE", payload);
    }

    /// `user` taps the button `custom_id` on `message`, the application set up with an
    /// Interactions Endpoint URL: the interaction's id and the body Discord POSTs there (not
    /// dispatched; its answer is the response to that POST, so its follow-ups are accepted).
    pub fn tap_over_http(
        &self,
        user: &DiscordUser,
        message: &DiscordMessage,
        custom_id: &str,
    ) -> (String, Value) {
        let data = json!({"custom_id": custom_id, "component_type": 2});
        let mut state = self.shared.lock();
        let (id, payload) = interaction(&mut state, 3, user, message, data);
        state
            .interactions
            .insert(id.clone(), (payload.clone(), true));
        (id, payload)
    }

    fn interact(
        &self,
        kind: u8,
        user: &DiscordUser,
        message: &DiscordMessage,
        data: Value,
    ) -> String {
        let mut state = self.shared.lock();
        let (id, payload) = interaction(&mut state, kind, user, message, data);
        state
            .interactions
            .insert(id.clone(), (payload.clone(), false));
        state.dispatch("INTERACTION_CREATE", payload);
        id
    }

    /// `user` sends `content` to the bot in a direct message (MESSAGE_CREATE, dispatched to a
    /// session identified with the DIRECT_MESSAGES intent).
    pub fn direct_message(&self, user: &DiscordUser, content: &str) {
        let mut state = self.shared.lock();
        let id = state.snowflake();
        let channel_id = dm_channel(&mut state, &user.id);
        let data = json!({
            "id": id, "channel_id": channel_id, "type": 0, "author": user.json(), "content": content,
            "timestamp": "2026-01-01T00:00:00.000000+00:00", "edited_timestamp": null, "tts": false,
            "mention_everyone": false, "mentions": [], "mention_roles": [], "attachments": [],
            "embeds": [], "pinned": false, "flags": 0,
        });
        state.dispatch("MESSAGE_CREATE", data);
    }

    /// The id of the direct-message channel with `user_id` (made on first use).
    pub fn dm_channel_of(&self, user_id: &str) -> String {
        dm_channel(&mut self.shared.lock(), user_id)
    }

    /// Waits (up to 20 s) until `check` finds something in the fake, and returns it.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeDiscord) -> Option<T>) -> T {
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

fn dm_channel(state: &mut FakeState, user_id: &str) -> String {
    if let Some(channel) = state.dm_channels.get(user_id) {
        return channel.clone();
    }
    let channel = state.snowflake();
    state
        .dm_channels
        .insert(user_id.to_owned(), channel.clone());
    channel
}

/// Discord's error answer.
fn error(status: StatusCode, code: u64, message: &str) -> (StatusCode, Value) {
    (status, json!({"message": message, "code": code}))
}

fn invalid_form_body(field: &str) -> (StatusCode, Value) {
    let (status, mut body) = error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
    body["errors"] = json!({field: {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}});
    (status, body)
}

/// Why Discord would refuse the message body (400, code 50035).
fn refused_content(body: &Value) -> Option<(StatusCode, Value)> {
    if body["content"].as_str().unwrap_or_default().chars().count() > MAX_CONTENT_CHARS {
        return Some(invalid_form_body("content"));
    }
    let message = DiscordMessage {
        id: String::new(),
        channel_id: String::new(),
        content: String::new(),
        components: body["components"].clone(),
        allowed_mentions: Value::Null,
        edits: 0,
    };
    let too_long = message
        .buttons()
        .iter()
        .any(|id| id.chars().count() > MAX_CUSTOM_ID_CHARS);
    too_long.then(|| invalid_form_body("components"))
}

async fn rest(
    State(shared): State<Arc<Shared>>,
    method: Method,
    Path(path): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.split('/').collect();
    let message_write = matches!(
        (&method, segments.as_slice()),
        (&Method::POST, ["channels", _, "messages"])
            | (&Method::PATCH, ["channels", _, "messages", _])
    );
    let failure = if message_write {
        shared.lock().failures.pop_front()
    } else {
        None
    };
    let mut extra_headers = Vec::new();
    let (status, answer) = match failure {
        Some(failure) if failure.status == 429 => {
            let seconds = failure.retry_after.unwrap_or(1.0);
            extra_headers.push(("retry-after", (seconds.ceil() as u64).to_string()));
            extra_headers.push((
                "x-ratelimit-scope",
                if failure.global { "global" } else { "user" }.to_owned(),
            ));
            if failure.global {
                extra_headers.push(("x-ratelimit-global", "true".to_owned()));
            } else {
                extra_headers.push(("x-ratelimit-bucket", "fake-channel-messages".to_owned()));
            }
            let body = json!({"message": "You are being rate limited.", "retry_after": seconds, "global": failure.global});
            (StatusCode::TOO_MANY_REQUESTS, body)
        }
        Some(failure) => {
            let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_GATEWAY);
            error(
                status,
                0,
                &format!(
                    "{}: {}",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("error")
                ),
            )
        }
        None => answer(&shared, &method, &segments, &query, &headers, &body),
    };
    shared.lock().requests.push(DiscordRequest {
        method: method.to_string(),
        path: path.clone(),
        status: status.as_u16(),
        at: std::time::Instant::now(),
    });
    let hold = shared.lock().hold;
    if method == Method::POST && message_write && status.is_success() && !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let mut response = if status == StatusCode::NO_CONTENT {
        status.into_response()
    } else {
        (status, axum::Json(answer)).into_response()
    };
    for (name, value) in extra_headers {
        response
            .headers_mut()
            .insert(name, value.parse().expect("a header value"));
    }
    response
}

fn answer(
    shared: &Shared,
    method: &Method,
    path: &[&str],
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Value,
) -> (StatusCode, Value) {
    let mut state = shared.lock();
    if let ["interactions", id, token, "callback"] = path {
        // Authenticated by the interaction's token, not the bot's.
        let Some((payload, answered)) = state.interactions.get_mut(*id) else {
            return error(StatusCode::NOT_FOUND, 10062, "Unknown interaction");
        };
        if payload["token"] != *token {
            return error(StatusCode::UNAUTHORIZED, 50027, "Invalid Webhook Token");
        }
        if *answered {
            return error(
                StatusCode::BAD_REQUEST,
                40060,
                "Interaction has already been acknowledged.",
            );
        }
        *answered = true;
        state.answers.push(InteractionAnswer {
            interaction_id: (*id).to_owned(),
            status: 204,
            body: body.clone(),
        });
        return (StatusCode::NO_CONTENT, Value::Null);
    }
    if let ["webhooks", application_id, token] = path {
        // A follow-up of an interaction, by its token; only once the interaction was answered.
        let found = state.interactions.iter().find(|(_, (payload, answered))| {
            payload["token"] == *token && payload["application_id"] == *application_id && *answered
        });
        let Some((id, _)) = found else {
            return error(StatusCode::NOT_FOUND, 10015, "Unknown Webhook");
        };
        let followup = InteractionAnswer {
            interaction_id: id.clone(),
            status: 200,
            body: body.clone(),
        };
        state.followups.push(followup);
        let message =
            json!({"id": state.snowflake(), "content": body["content"], "flags": body["flags"]});
        return (StatusCode::OK, message);
    }
    let authorization = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok());
    if authorization != Some(format!("Bot {}", shared.bot_token).as_str()) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    match (method, path) {
        (&Method::GET, ["users", "@me"]) => (
            StatusCode::OK,
            json!({"id": BOT_USER_ID, "username": "countersign", "discriminator": "0", "avatar": null, "bot": true, "mfa_enabled": false}),
        ),
        (&Method::POST, ["channels", channel, "messages"]) => {
            if let Some(refused) = refused_content(body) {
                return refused;
            }
            let message = DiscordMessage {
                id: state.snowflake(),
                channel_id: (*channel).to_owned(),
                content: body["content"].as_str().unwrap_or_default().to_owned(),
                components: body.get("components").cloned().unwrap_or(json!([])),
                allowed_mentions: body.get("allowed_mentions").cloned().unwrap_or(Value::Null),
                edits: 0,
            };
            let shown = message.json();
            state.messages.push(message);
            (StatusCode::OK, shown)
        }
        (&Method::PATCH, ["channels", channel, "messages", id]) => {
            if let Some(refused) = refused_content(body) {
                return refused;
            }
            let found = state
                .messages
                .iter_mut()
                .find(|m| m.channel_id == *channel && m.id == *id);
            let Some(message) = found else {
                return error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
            };
            if let Some(content) = body["content"].as_str() {
                message.content = content.to_owned();
            }
            if let Some(components) = body.get("components") {
                message.components = components.clone();
            }
            if let Some(mentions) = body.get("allowed_mentions") {
                message.allowed_mentions = mentions.clone();
            }
            message.edits += 1;
            (StatusCode::OK, message.json())
        }
        (&Method::GET, ["channels", channel, "messages"]) => {
            let after: u64 = query.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
            let limit: usize = query
                .get("limit")
                .and_then(|l| l.parse().ok())
                .unwrap_or(50)
                .min(100);
            let newer = state.messages.iter().filter(|m| m.channel_id == *channel);
            let newer = newer.filter(|m| m.id.parse::<u64>().unwrap_or(0) > after);
            // Newest first, as Discord lists them.
            let mut found: Vec<Value> = newer.map(DiscordMessage::json).collect();
            found.reverse();
            found.truncate(limit);
            (StatusCode::OK, Value::Array(found))
        }
        _ => error(StatusCode::NOT_FOUND, 0, "404: Not Found"),
    }
}

async fn gateway(State(shared): State<Arc<Shared>>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(move |socket| serve_gateway(shared, socket))
}

/// One Gateway connection: HELLO, then IDENTIFY or RESUME, heartbeats, dispatches.
async fn serve_gateway(shared: Arc<Shared>, mut socket: WebSocket) {
    let send = |frame: Value| Message::Text(frame.to_string().into());
    let hello = json!({"op": 10, "s": null, "t": null, "d": {"heartbeat_interval": 1000}});
    if socket.send(send(hello)).await.is_err() {
        return;
    }
    let (sender, mut outgoing) = mpsc::unbounded_channel::<Outgoing>();
    loop {
        tokio::select! {
            frame = outgoing.recv() => match frame {
                Some(Outgoing::Frame(frame)) => if socket.send(send(frame)).await.is_err() { break },
                // Gone without a close frame, as a broken network leaves it.
                Some(Outgoing::Drop) | None => return,
            },
            received = socket.recv() => {
                let text = match received {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Binary(_))) => continue,
                    _ => break,
                };
                let Ok(frame) = serde_json::from_str::<Value>(&text) else { continue };
                match frame["op"].as_u64() {
                    Some(1) => {
                        shared.lock().heartbeats += 1;
                        let ack = json!({"op": 11, "s": null, "t": null, "d": null});
                        if socket.send(send(ack)).await.is_err() { break }
                    }
                    Some(2) => {
                        if !shared.gateway_token(&frame) {
                            let close = CloseFrame { code: 4004, reason: "Authentication failed.".into() };
                            let _ = socket.send(Message::Close(Some(close))).await;
                            break;
                        }
                        let mut state = shared.lock();
                        state.identifies += 1;
                        let session_id = format!("session-{}", state.snowflake());
                        let intents = frame["d"]["intents"].as_u64().unwrap_or(0);
                        state.sessions.insert(session_id.clone(), Session { dispatched: Vec::new(), intents });
                        state.connection = Some((session_id.clone(), sender.clone()));
                        let ready = json!({
                            "v": 10, "session_id": session_id, "guilds": [], "shard": [0, 1],
                            "resume_gateway_url": format!("ws://{}/gateway", shared.addr),
                            "user": {"id": BOT_USER_ID, "username": "countersign", "discriminator": "0",
                                     "avatar": null, "bot": true, "mfa_enabled": false, "verified": true},
                            "application": {"id": APPLICATION_ID, "flags": 0},
                        });
                        state.dispatch("READY", ready);
                    }
                    Some(6) => {
                        let session_id = frame["d"]["session_id"].as_str().unwrap_or_default().to_owned();
                        let seq = frame["d"]["seq"].as_u64().unwrap_or(0) as usize;
                        let mut state = shared.lock();
                        let valid = shared.gateway_token(&frame) && state.sessions.contains_key(&session_id);
                        if !valid {
                            let _ = sender.send(Outgoing::Frame(json!({"op": 9, "s": null, "t": null, "d": false})));
                            continue;
                        }
                        state.resumes += 1;
                        state.connection = Some((session_id.clone(), sender.clone()));
                        let missed = state.sessions[&session_id].dispatched.iter().skip(seq).cloned();
                        for frame in missed.collect::<Vec<_>>() {
                            let _ = sender.send(Outgoing::Frame(frame));
                        }
                        state.dispatch("RESUMED", json!({}));
                    }
                    _ => {}
                }
            }
        }
    }
    let mut state = shared.lock();
    if state
        .connection
        .as_ref()
        .is_some_and(|(_, open)| open.same_channel(&sender))
    {
        state.connection = None;
    }
}

/// An interaction of `kind` by `user` on `message`, as Discord sends it: its id and payload.
fn interaction(
    state: &mut FakeState,
    kind: u8,
    user: &DiscordUser,
    message: &DiscordMessage,
    data: Value,
) -> (String, Value) {
    let id = state.snowflake();
    let payload = json!({
        "id": id, "application_id": APPLICATION_ID, "type": kind, "data": data,
        "guild_id": GUILD_ID, "channel_id": message.channel_id,
        "member": {"user": user.json(), "roles": [], "joined_at": "2025-01-01T00:00:00.000000+00:00",
                   "deaf": false, "mute": false, "flags": 0, "permissions": "2147483647"},
        "message": message.json(), "token": format!("interaction-token-{id}"), "version": 1,
        "app_permissions": "2147483647", "locale": "en-US", "guild_locale": "en-US",
        "entitlements": [], "authorizing_integration_owners": {"0": GUILD_ID}, "context": 0,
    });
    (id, payload)
}
