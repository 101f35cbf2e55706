//! A fake ntfy server on 127.0.0.1 that answers like the real one (ntfy 2.16+), errors
//! included:
//!
//! - `POST /` publishes a JSON message (`topic`, `title`, `message`, `priority` 1-5, `tags`,
//!   `actions` (at most 3), `sequence_id`) and answers the message as ntfy stores it (`id`,
//!   `time`, `expires`, `event: "message"`, ...). A message with the `sequence_id` of an
//!   earlier one of its topic updates that notification in place, as the clients show it.
//! - `POST /{topic}` (or `PUT`) publishes its body as the message's text (what the ntfy app's
//!   `http` action sends when it targets a topic on the server), `Title` and `Priority`
//!   headers read as ntfy reads them.
//! - `GET /{topic}/json?poll=1&since=…` returns the topic's cached messages as
//!   newline-delimited JSON; without `poll` it is the topic's stream: an `open` event, the
//!   cached messages after `since` (none without it), then every new message as it is
//!   published, and a `keepalive` event each keepalive interval (ntfy's default 45 s;
//!   [`FakeNtfy::set_keepalive`]). `since` is `all`, `none`, `latest`, a Unix time in
//!   seconds (messages at or after it) or a message id (the messages after it; an id ntfy no
//!   longer knows gives all cached messages, as ntfy does), anything else `400 40008`.
//! - [`FakeNtfy::set_down`] puts it behind a proxy whose upstream is down: every request gets
//!   a 502 page and the open streams end, until it is up again.
//! - With an access token configured, a request without `Authorization: Bearer <token>` gets
//!   `401 {"code":40101,"http":401,"error":"unauthorized"}`.
//! - Invalid input gets ntfy's 400 answers (invalid topic, priority, too many actions; a
//!   message of 4,096 bytes or more, which ntfy takes for a file, `40014 attachments not
//!   allowed` as a server without an attachment cache answers).
//! - Tests inject failures ([`FakeNtfy::fail_next`]: a 429 with or without `Retry-After`, a
//!   5xx) and hold a publish's answer after it was applied ([`FakeNtfy::hold_publishes`]),
//!   so that a worker can be killed between ntfy storing a message and the worker hearing so.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// ntfy's default `message-size-limit`, in bytes.
const MESSAGE_SIZE_LIMIT: usize = 4_096;

/// A message as the fake stored it.
#[derive(Clone, Debug)]
pub struct NtfyMessage {
    pub id: String,
    pub time: i64,
    pub topic: String,
    pub sequence_id: Option<String>,
    pub title: String,
    pub message: String,
    pub priority: u8,
    pub tags: Vec<String>,
    /// As published (`action`, `label`, `url`, `method`, `headers`, `body`, `clear`).
    pub actions: Vec<Value>,
}

impl NtfyMessage {
    /// The action button labelled `label`.
    pub fn action(&self, label: &str) -> Option<&Value> {
        self.actions
            .iter()
            .find(|action| action["label"].as_str() == Some(label))
    }

    pub fn labels(&self) -> Vec<String> {
        self.actions
            .iter()
            .filter_map(|action| action["label"].as_str().map(str::to_owned))
            .collect()
    }
}

/// One request the fake answered.
#[derive(Clone, Debug)]
pub struct NtfyRequest {
    pub method: String,
    pub path: String,
    /// The query string (`since=…`), empty without one.
    pub query: String,
    pub status: u16,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// A failure to answer the next publish with.
#[derive(Clone, Copy, Debug)]
pub struct NtfyFailure {
    pub status: u16,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

struct FakeState {
    messages: Vec<NtfyMessage>,
    requests: Vec<NtfyRequest>,
    failures: VecDeque<NtfyFailure>,
    hold: Duration,
    next_id: u64,
    keepalive: Duration,
    /// Topics anyone may publish to without the token (ntfy's `ntfy access everyone
    /// <topic> write-only`).
    anonymous_write: Vec<String>,
}

impl Default for FakeState {
    fn default() -> FakeState {
        FakeState {
            messages: Vec::new(),
            requests: Vec::new(),
            failures: VecDeque::new(),
            hold: Duration::ZERO,
            next_id: 0,
            keepalive: Duration::from_secs(45),
            anonymous_write: Vec::new(),
        }
    }
}

struct Shared {
    token: Option<String>,
    state: Mutex<FakeState>,
    /// Every message as it is published, for the open streams.
    published: tokio::sync::broadcast::Sender<NtfyMessage>,
    /// Whether the proxy's upstream is down.
    down: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(&self, method: &str, path: &str, status: StatusCode) {
        self.record_query(method, path, "", status);
    }

    fn record_query(&self, method: &str, path: &str, query: &str, status: StatusCode) {
        self.lock().requests.push(NtfyRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            status: status.as_u16(),
            at: std::time::Instant::now(),
        });
    }
}

/// The fake server; dropping it stops it.
pub struct FakeNtfy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeNtfy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeNtfy {
    /// Starts a fake that needs no access token.
    pub async fn start() -> FakeNtfy {
        FakeNtfy::start_with_token(None).await
    }

    /// Starts a fake that refuses requests without `Authorization: Bearer <token>`.
    pub async fn start_with_token(token: Option<&str>) -> FakeNtfy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake ntfy to 127.0.0.1");
        let addr = listener
            .local_addr()
            .expect("local address of the fake ntfy");
        let shared = Arc::new(Shared {
            token: token.map(str::to_owned),
            state: Mutex::new(FakeState::default()),
            published: tokio::sync::broadcast::channel(1024).0,
            down: tokio::sync::watch::channel(false).0,
        });
        let app = Router::new()
            .route("/", post(publish).put(publish))
            .route("/{topic}", post(publish_to_topic).put(publish_to_topic))
            .route("/{topic}/json", get(subscribe))
            .layer(axum::middleware::from_fn_with_state(
                shared.clone(),
                behind_proxy,
            ))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeNtfy {
            addr,
            shared,
            server,
        }
    }

    /// The server URL to configure (`ntfy.server_url`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every message published, in order (updates included).
    pub fn messages(&self) -> Vec<NtfyMessage> {
        self.shared.lock().messages.clone()
    }

    /// What subscribers of `topic` see: one notification per sequence id (the latest
    /// message of each), in the order they first appeared.
    pub fn notifications(&self, topic: &str) -> Vec<NtfyMessage> {
        let state = self.shared.lock();
        let mut shown: Vec<NtfyMessage> = Vec::new();
        for message in state.messages.iter().filter(|m| m.topic == topic) {
            let same = shown
                .iter_mut()
                .find(|m| m.sequence_id.is_some() && m.sequence_id == message.sequence_id);
            match same {
                Some(existing) => *existing = message.clone(),
                None => shown.push(message.clone()),
            }
        }
        shown
    }

    pub fn requests(&self) -> Vec<NtfyRequest> {
        self.shared.lock().requests.clone()
    }

    /// The next publish is answered with `failure` (and not applied).
    pub fn fail_next(&self, failure: NtfyFailure) {
        self.shared.lock().failures.push_back(failure);
    }

    /// Down (`true`): every request gets the proxy's 502 and the open streams end; up again
    /// (`false`): answered as before, with the messages published before.
    pub fn set_down(&self, down: bool) {
        self.shared.down.send_replace(down);
    }

    /// Lets anyone publish to `topic` without the access token, as ntfy's
    /// `ntfy access everyone <topic> write-only` does; reading it still needs the token.
    pub fn allow_anonymous_write(&self, topic: &str) {
        self.shared.lock().anonymous_write.push(topic.to_owned());
    }

    /// How often the streams get a `keepalive` event (ntfy's default: 45 s).
    pub fn set_keepalive(&self, interval: Duration) {
        self.shared.lock().keepalive = interval;
    }

    /// The `since` of each stream opened on `topic`, in order (`None`: none given).
    pub fn stream_sinces(&self, topic: &str) -> Vec<Option<String>> {
        let path = format!("/{topic}/json");
        self.requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.path == path && !r.query.contains("poll=1"))
            .map(|r| {
                r.query
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("since="))
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Publishes are applied at once and answered `hold` later (zero: at once).
    pub fn hold_publishes(&self, hold: Duration) {
        self.shared.lock().hold = hold;
    }

    /// Waits (up to 20 s) until `check` finds something in the fake, and returns it.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeNtfy) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; messages: {:#?}",
                    self.messages()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs() as i64)
}

/// ntfy's error answer.
fn error(status: StatusCode, code: u32, text: &str) -> Response {
    let body = json!({"code": code, "http": status.as_u16(), "error": text, "link": "https://ntfy.sh/docs/publish/"});
    (status, axum::Json(body)).into_response()
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = &shared.token else {
        return true;
    };
    headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|given| given == token)
}

/// ntfy's topic names: 1-64 of `A-Za-z0-9_-`.
fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 64
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

async fn publish(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let response = publish_inner(&shared, &headers, &body);
    shared.record("POST", "/", response.0);
    let hold = shared.lock().hold;
    if response.0.is_success() && !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    response.1
}

fn publish_inner(shared: &Shared, headers: &HeaderMap, body: &[u8]) -> (StatusCode, Response) {
    let anonymous_ok = serde_json::from_slice::<Value>(body).is_ok_and(|json| {
        json["topic"]
            .as_str()
            .is_some_and(|topic| shared.lock().anonymous_write.iter().any(|t| t == topic))
    });
    if !anonymous_ok && !authorized(shared, headers) {
        let status = StatusCode::UNAUTHORIZED;
        return (status, error(status, 40101, "unauthorized"));
    }
    if let Some(failure) = shared.lock().failures.pop_front() {
        let status = StatusCode::from_u16(failure.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut response = if failure.status == 429 {
            error(status, 42901, "limit reached: too many requests")
        } else {
            // A proxy's page in front of ntfy, or ntfy's own 500.
            (status, "<html><body>upstream unavailable</body></html>").into_response()
        };
        if let Some(seconds) = failure.retry_after {
            response.headers_mut().insert(
                "retry-after",
                HeaderValue::from_str(&seconds.to_string())
                    .unwrap_or(HeaderValue::from_static("1")),
            );
        }
        return (status, response);
    }
    let bad = StatusCode::BAD_REQUEST;
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return (
            bad,
            error(
                bad,
                40017,
                "invalid request: request body must be message JSON",
            ),
        );
    };
    let topic = json["topic"].as_str().unwrap_or_default().to_owned();
    if !valid_topic(&topic) {
        return (bad, error(bad, 40009, "invalid topic"));
    }
    let priority = match &json["priority"] {
        Value::Null => 3,
        Value::Number(n) => match n.as_u64() {
            Some(p @ 1..=5) => p as u8,
            _ => return (bad, error(bad, 40007, "invalid priority")),
        },
        _ => return (bad, error(bad, 40007, "invalid priority")),
    };
    let actions = json["actions"].as_array().cloned().unwrap_or_default();
    if actions.len() > 3 {
        return (bad, error(bad, 40018, "invalid request: actions invalid"));
    }
    for action in &actions {
        let kind = action["action"].as_str().unwrap_or_default();
        let url = action["url"].as_str().unwrap_or_default();
        if !["view", "http", "broadcast"].contains(&kind)
            || action["label"].as_str().unwrap_or_default().is_empty()
            || (kind != "broadcast" && !(url.starts_with("http://") || url.starts_with("https://")))
        {
            return (bad, error(bad, 40018, "invalid request: actions invalid"));
        }
    }
    // ntfy peeks at most `message-size-limit` (4,096) bytes of the message; one that reaches
    // the limit is taken for a file, and without an attachment cache (the default) refused.
    if json["message"].as_str().unwrap_or_default().len() >= MESSAGE_SIZE_LIMIT {
        return (
            bad,
            error(bad, 40014, "invalid request: attachments not allowed"),
        );
    }
    let mut state = shared.lock();
    state.next_id += 1;
    let id = format!("fake{:08}", state.next_id);
    let sequence_id = json["sequence_id"].as_str().map(str::to_owned);
    let message = NtfyMessage {
        id: id.clone(),
        time: now_secs(),
        topic: topic.clone(),
        sequence_id: sequence_id.clone(),
        title: json["title"].as_str().unwrap_or_default().to_owned(),
        message: json["message"].as_str().unwrap_or("triggered").to_owned(),
        priority,
        tags: json["tags"]
            .as_array()
            .map(|tags| {
                tags.iter()
                    .filter_map(|t| t.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        actions,
    };
    let answer = message_json(&message);
    state.messages.push(message.clone());
    // Under the lock: a stream opening now reads the cache and then the live messages
    // without a gap or a repeat.
    let _ = shared.published.send(message);
    drop(state);
    (StatusCode::OK, axum::Json(answer).into_response())
}

fn message_json(message: &NtfyMessage) -> Value {
    let actions: Vec<Value> = message
        .actions
        .iter()
        .enumerate()
        .map(|(index, action)| {
            let mut action = action.clone();
            action["id"] = json!(format!("{}a{index}", message.id));
            action
        })
        .collect();
    json!({
        "id": message.id,
        "time": message.time,
        "expires": message.time + 43_200,
        "event": "message",
        "topic": message.topic,
        "sequence_id": message.sequence_id.clone().unwrap_or_else(|| message.id.clone()),
        "title": message.title,
        "message": message.message,
        "priority": message.priority,
        "tags": message.tags,
        "actions": actions,
    })
}

/// A proxy in front of ntfy: while the upstream is down, every request gets its 502 page.
async fn behind_proxy(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if *shared.down.borrow() {
        let status = StatusCode::BAD_GATEWAY;
        shared.record_query(
            request.method().as_str(),
            request.uri().path(),
            request.uri().query().unwrap_or_default(),
            status,
        );
        return (status, "<html><body>502 Bad Gateway</body></html>").into_response();
    }
    next.run(request).await
}

/// `POST /{topic}`: the body is the message's text, as ntfy takes it.
async fn publish_to_topic(
    State(shared): State<Arc<Shared>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |names: &[&str]| {
        names.iter().find_map(|name| {
            headers
                .get(*name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        })
    };
    let mut json = json!({
        "topic": topic,
        "message": String::from_utf8_lossy(&body),
    });
    if let Some(title) = header(&["x-title", "title", "t"]) {
        json["title"] = json!(title);
    }
    if let Some(priority) = header(&["x-priority", "priority", "prio", "p"]) {
        json["priority"] = match priority.as_str() {
            "min" => json!(1),
            "low" => json!(2),
            "default" => json!(3),
            "high" => json!(4),
            "max" | "urgent" => json!(5),
            other => other.parse::<u64>().map_or(json!(other), |n| json!(n)),
        };
    }
    let body = serde_json::to_vec(&json).unwrap_or_default();
    let response = publish_inner(&shared, &headers, &body);
    shared.record("POST", &format!("/{topic}"), response.0);
    response.1
}

#[derive(serde::Deserialize)]
struct SubscribeQuery {
    poll: Option<String>,
    since: Option<String>,
}

/// ntfy's message ids: 12 letters and digits.
fn valid_message_id(id: &str) -> bool {
    id.len() == 12 && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Where in the cache `since` starts (an index into the messages), as ntfy reads it.
fn since_start(messages: &[NtfyMessage], topic: &str, since: &str) -> Option<usize> {
    match since {
        "all" => Some(0),
        "none" => Some(messages.len()),
        "latest" => Some(
            messages
                .iter()
                .rposition(|m| m.topic == topic)
                .unwrap_or(messages.len()),
        ),
        id if valid_message_id(id) => Some(
            // An id no longer in the cache: ntfy sends everything it has.
            messages
                .iter()
                .position(|m| m.id == id)
                .map_or(0, |index| index + 1),
        ),
        secs => secs.parse::<i64>().ok().map(|secs| {
            messages
                .iter()
                .position(|m| m.time >= secs)
                .unwrap_or(messages.len())
        }),
    }
}

fn event_line(event: &str, topic: &str) -> String {
    format!(
        "{}\n",
        json!({"id": "fakeevent000", "time": now_secs(), "event": event, "topic": topic})
    )
}

async fn subscribe(
    State(shared): State<Arc<Shared>>,
    Path(topic): Path<String>,
    Query(query): Query<SubscribeQuery>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let path = format!("/{topic}/json");
    let query_text = uri.query().unwrap_or_default().to_owned();
    let record = |status| shared.record_query("GET", &path, &query_text, status);
    if !authorized(&shared, &headers) {
        record(StatusCode::UNAUTHORIZED);
        return error(StatusCode::UNAUTHORIZED, 40101, "unauthorized");
    }
    let poll = query.poll.as_deref() == Some("1");
    // A stream without `since` starts with new messages; a poll with all of them.
    let since = query
        .since
        .unwrap_or_else(|| if poll { "all" } else { "none" }.to_owned());
    let state = shared.lock();
    let Some(start) = since_start(&state.messages, &topic, &since) else {
        drop(state);
        record(StatusCode::BAD_REQUEST);
        return error(StatusCode::BAD_REQUEST, 40008, "invalid since parameter");
    };
    let cached: Vec<String> = state.messages[start..]
        .iter()
        .filter(|m| m.topic == topic)
        .map(|m| format!("{}\n", message_json(m)))
        .collect();
    // Subscribed under the lock: nothing published between the cache and the live messages
    // is missed or sent twice.
    let live = shared.published.subscribe();
    let keepalive = state.keepalive;
    drop(state);
    record(StatusCode::OK);
    let content_type = [(
        axum::http::header::CONTENT_TYPE,
        "application/x-ndjson; charset=utf-8",
    )];
    if poll {
        return (content_type, cached.concat()).into_response();
    }
    let mut lines: VecDeque<String> = VecDeque::new();
    lines.push_back(event_line("open", &topic));
    lines.extend(cached);
    let down = shared.down.subscribe();
    let stream = futures::stream::unfold(
        (lines, live, down, topic),
        move |(mut lines, mut live, mut down, topic)| async move {
            loop {
                if *down.borrow() {
                    return None;
                }
                if let Some(line) = lines.pop_front() {
                    return Some((
                        Ok::<_, std::convert::Infallible>(Bytes::from(line)),
                        (lines, live, down, topic),
                    ));
                }
                tokio::select! {
                    message = live.recv() => match message {
                        Ok(message) if message.topic == topic => {
                            lines.push_back(format!("{}\n", message_json(&message)));
                        }
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    },
                    _ = down.changed() => {}
                    () = tokio::time::sleep(keepalive) => {
                        lines.push_back(event_line("keepalive", &topic));
                    }
                }
            }
        },
    );
    (content_type, axum::body::Body::from_stream(stream)).into_response()
}

/// Performs an `http` action the way the ntfy app does when its button is tapped (method,
/// URL, headers, body); returns the status and body of the answer.
pub async fn tap(action: &Value) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let method = action["method"].as_str().unwrap_or("POST");
    let mut request = axum::http::Request::builder()
        .method(method)
        .uri(action["url"].as_str().expect("an action URL"))
        .header("user-agent", "ntfy/1.22.0 (Android)");
    if let Some(headers) = action["headers"].as_object() {
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str().unwrap_or_default());
        }
    }
    let body = action["body"].as_str().unwrap_or_default().to_owned();
    let request = request
        .body(Full::new(Bytes::from(body)))
        .expect("the action's request");
    let response = client
        .request(request)
        .await
        .expect("the action's request is answered");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the answer's body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
