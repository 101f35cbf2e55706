//! A fake Telegram Bot API server on 127.0.0.1, for end-to-end tests of the Telegram worker.
//!
//! It answers with the shapes of the real Bot API, built from the published payloads in
//! `fixtures/telegram/` (see the README there), and behaves like the real server where the
//! worker depends on it:
//! - method names are matched case-insensitively (teloxide calls `/bot<token>/SendMessage`);
//! - parameters are read from a JSON body, a form body or the query string;
//! - `parse_mode: "HTML"` texts are parsed with the rules of Telegram's own HTML parser
//!   (tdlib `parse_html`): malformed markup is refused with `400 can't parse entities`, and a
//!   text longer than 4096 UTF-16 code units after parsing with `400 message is too long`;
//! - `callback_data` longer than 64 bytes is refused (`BUTTON_DATA_INVALID`);
//! - editing a message to the same text and keyboard is refused with "message is not modified";
//!   editing without `reply_markup` removes the inline keyboard;
//! - `getUpdates` long-polls, returns unconfirmed updates until a later call confirms them with
//!   `offset`, and a new `getUpdates` terminates a pending one with `409 Conflict`;
//! - a callback query can be answered once;
//! - `editMessageReplyMarkup` without `reply_markup` removes the buttons ("not modified" for a
//!   message without any).
//!
//! Like the real service it can be slow (a latency added to every call), fail with 5xx whose
//! body is Telegram's JSON error or a proxy's HTML page, rate-limit with `retry_after`, fail
//! only the calls for one chat, and apply a call but hold its answer (a worker killed then
//! never learns the message id).
//!
//! Tests inject updates (callback queries, text messages), inject errors for the next calls of
//! a method, and read every recorded request and the current state of every chat message.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const GET_ME: &str = include_str!("../fixtures/telegram/getMe_response_with_has_main_web_app.json");
const GET_WEBHOOK_INFO: &str =
    include_str!("../fixtures/telegram/getWebhookInfo_response_no_webhook.json");
const DELETE_WEBHOOK: &str = include_str!("../fixtures/telegram/deleteWebhook_response.json");
const SEND_MESSAGE: &str = include_str!("../fixtures/telegram/sendMessage_response.json");
const EDIT_MESSAGE_TEXT: &str = include_str!("../fixtures/telegram/editMessageText_response.json");
const ANSWER_CALLBACK_QUERY: &str =
    include_str!("../fixtures/telegram/answerCallbackQuery_response.json");
const UPDATE_CALLBACK_QUERY: &str =
    include_str!("../fixtures/telegram/update_callback_query_private.json");
const UPDATE_MESSAGE_PRIVATE: &str =
    include_str!("../fixtures/telegram/update_message_text_private.json");
const UPDATE_MESSAGE_GROUP: &str =
    include_str!("../fixtures/telegram/update_message_group_command_captured.json");
const ERROR_TOO_MANY_REQUESTS: &str =
    include_str!("../fixtures/telegram/error_429_too_many_requests.json");
const ERROR_NOT_MODIFIED_SHORT: &str =
    include_str!("../fixtures/telegram/error_400_message_not_modified_short.json");
const ERROR_MESSAGE_TOO_LONG: &str =
    include_str!("../fixtures/telegram/error_400_message_too_long.json");
const ERROR_CHAT_NOT_FOUND: &str =
    include_str!("../fixtures/telegram/error_400_chat_not_found.json");
const ERROR_TERMINATED_BY_OTHER_GET_UPDATES: &str =
    include_str!("../fixtures/telegram/error_409_terminated_by_other_getUpdates.json");

/// Today's wording of "not modified" (tdlib/telegram-bot-api `Client::fail_query_with_error`).
const NOT_MODIFIED_LONG: &str = "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message";
/// tdlib/telegram-bot-api's text for `QUERY_ID_INVALID`.
const QUERY_TOO_OLD: &str =
    "Bad Request: query is too old and response timeout expired or query ID is invalid";
/// The longest text Telegram accepts, in UTF-16 code units after entity parsing.
pub const MAX_TEXT_UTF16: usize = 4096;
/// The longest `callback_data` Telegram accepts, in bytes.
const MAX_CALLBACK_DATA_BYTES: usize = 64;
/// The longest long-polling wait the fake honours, whatever `timeout` asks for.
const MAX_POLL_WAIT: Duration = Duration::from_secs(30);
/// How long `wait_for*` helpers wait before failing the test.
const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// An error the fake returns instead of handling the next call(s) of a method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InjectedError {
    /// 429 with `parameters.retry_after` (seconds).
    TooManyRequests { retry_after: u32 },
    /// 400 "Bad Request: message is not modified" (the short, older wording).
    MessageNotModifiedShort,
    /// 400 "message is not modified: specified new message content …" (today's wording).
    MessageNotModified,
    /// 400 "Bad Request: message is too long".
    MessageTooLong,
    /// 400 "Bad Request: message can't be edited" (for example a message too old to edit).
    MessageCantBeEdited,
    /// 400 "Bad Request: chat not found".
    ChatNotFound,
    /// 409 "Conflict: terminated by other getUpdates request; …".
    TerminatedByOtherGetUpdates,
    /// A 5xx with Telegram's JSON error body (`{"ok":false,"error_code":502,…}`).
    ServerErrorJson { status: u16 },
    /// A 5xx with an HTML page, as a proxy in front of the Bot API answers.
    ServerErrorHtml { status: u16 },
}

impl InjectedError {
    fn reply(&self) -> ApiReply {
        match self {
            InjectedError::TooManyRequests { retry_after } => {
                let mut body = fixture(ERROR_TOO_MANY_REQUESTS);
                body["description"] =
                    json!(format!("Too Many Requests: retry after {retry_after}"));
                body["parameters"]["retry_after"] = json!(retry_after);
                ApiReply::from_error_body(body)
            }
            InjectedError::MessageNotModifiedShort => {
                ApiReply::from_error_body(fixture(ERROR_NOT_MODIFIED_SHORT))
            }
            InjectedError::MessageNotModified => ApiReply::bad_request(NOT_MODIFIED_LONG),
            InjectedError::MessageTooLong => {
                ApiReply::from_error_body(fixture(ERROR_MESSAGE_TOO_LONG))
            }
            InjectedError::MessageCantBeEdited => {
                ApiReply::bad_request("Bad Request: message can't be edited")
            }
            InjectedError::ChatNotFound => ApiReply::from_error_body(fixture(ERROR_CHAT_NOT_FOUND)),
            InjectedError::TerminatedByOtherGetUpdates => {
                ApiReply::from_error_body(fixture(ERROR_TERMINATED_BY_OTHER_GET_UPDATES))
            }
            InjectedError::ServerErrorJson { status } => {
                ApiReply::error(*status, server_error_text(*status))
            }
            InjectedError::ServerErrorHtml { status } => {
                let page = format!(
                    "<html>\r\n<head><title>{status} {text}</title></head>\r\n<body>\r\n<center><h1>{status} {text}</h1></center>\r\n<hr><center>nginx/1.18.0</center>\r\n</body>\r\n</html>\r\n",
                    text = server_error_text(*status)
                );
                ApiReply {
                    status: StatusCode::from_u16(*status)
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    body: Value::String(page.clone()),
                    html: Some(page),
                }
            }
        }
    }
}

fn server_error_text(status: u16) -> &'static str {
    match status {
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Internal Server Error",
    }
}

/// One call the fake received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The Bot API method in its documented spelling (`sendMessage`), whatever case was used.
    pub method: String,
    /// The parameters as a JSON object (form and query values stay strings).
    pub params: Value,
    /// The HTTP status the fake answered with.
    pub status: u16,
    /// The JSON body the fake answered with.
    pub response: Value,
    pub received_at: Instant,
}

impl RecordedRequest {
    pub fn param_str(&self, name: &str) -> Option<&str> {
        self.params.get(name).and_then(Value::as_str)
    }

    pub fn param_i64(&self, name: &str) -> Option<i64> {
        self.params.get(name).and_then(value_as_i64)
    }

    /// The `callback_data` of every inline button of the request's `reply_markup`.
    pub fn callback_data(&self) -> Vec<String> {
        self.params
            .get("reply_markup")
            .map(|markup| callback_data_of(&parse_json_param(markup)))
            .unwrap_or_default()
    }

    pub fn succeeded(&self) -> bool {
        self.status == 200
    }

    /// The Bot API error description, when the call failed.
    pub fn error(&self) -> Option<&str> {
        if self.succeeded() {
            return None;
        }
        self.response.get("description").and_then(Value::as_str)
    }

    /// One line saying what was asked and how it was answered, for a failing test's output
    /// (the whole request, entities and all, is too long to read in a CI log).
    pub fn summary(&self) -> String {
        let mut params = self.params.clone();
        if let Some(params) = params.as_object_mut() {
            params.remove("entities");
            params.remove("reply_markup");
            if let Some(Value::String(text)) = params.get_mut("text") {
                if text.chars().count() > 60 {
                    *text = format!("{}…", text.chars().take(60).collect::<String>());
                }
            }
        }
        match self.error() {
            Some(error) => format!("{} {params} -> {} {error}", self.method, self.status),
            None => format!("{} {params} -> {}", self.method, self.status),
        }
    }

    /// The `message_id` of the message a successful sendMessage/editMessageText returned.
    pub fn result_message_id(&self) -> Option<i64> {
        self.response
            .get("result")
            .and_then(|result| result.get("message_id"))
            .and_then(Value::as_i64)
    }
}

/// A message as the fake's chat currently shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatMessage {
    pub chat_id: i64,
    pub message_id: i64,
    /// The text as users see it (markup parsed away).
    pub text: String,
    /// The Bot API `entities` of the text.
    pub entities: Vec<Value>,
    /// The inline keyboard, `None` when the message has no buttons.
    pub reply_markup: Option<Value>,
    pub reply_to_message_id: Option<i64>,
    /// Whether the bot sent it (only those can be edited by the bot).
    pub from_bot: bool,
    pub edit_count: u32,
    /// Unix time the message was sent.
    pub date: u64,
}

impl ChatMessage {
    /// The `callback_data` of every inline button, in keyboard order.
    pub fn callback_data(&self) -> Vec<String> {
        self.reply_markup
            .as_ref()
            .map(callback_data_of)
            .unwrap_or_default()
    }

    /// The labels of every inline button, in keyboard order.
    pub fn button_texts(&self) -> Vec<String> {
        self.reply_markup
            .as_ref()
            .map(|markup| {
                buttons_of(markup)
                    .filter_map(|button| button.get("text").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A Telegram user for injected updates.
#[derive(Clone, Debug)]
pub struct TestUser {
    pub id: i64,
    pub first_name: String,
    pub username: Option<String>,
}

impl TestUser {
    pub fn new(id: i64, first_name: &str, username: Option<&str>) -> TestUser {
        TestUser {
            id,
            first_name: first_name.to_owned(),
            username: username.map(str::to_owned),
        }
    }
}

/// The fake Bot API server. Dropping it stops the server.
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeTelegram {
    /// Starts the fake on 127.0.0.1 with an ephemeral port; it accepts only `token`.
    pub async fn start(token: &str) -> FakeTelegram {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Bot API to 127.0.0.1");
        let addr = listener
            .local_addr()
            .expect("local address of the fake Bot API");
        let (changed, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            bot_user: bot_user_from_fixture(),
            state: Mutex::new(FakeState::default()),
            changed,
        });
        let app = Router::new()
            .route("/{bot_token}/{method}", any(handle_call))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            // The server ends when the test drops the fake (the task is aborted).
            let _ = axum::serve(listener, app).await;
        });
        FakeTelegram {
            addr,
            shared,
            server,
        }
    }

    /// The base URL to give the worker (teloxide appends `/bot<token>/<Method>`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every call received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The calls of one method (any spelling), in order.
    pub fn requests_of(&self, method: &str) -> Vec<RecordedRequest> {
        let wanted = canonical_method(method);
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|request| request.method == wanted)
            .cloned()
            .collect()
    }

    /// A message of a chat as it currently is.
    pub fn message(&self, chat_id: i64, message_id: i64) -> Option<ChatMessage> {
        self.shared
            .lock()
            .messages
            .get(&(chat_id, message_id))
            .cloned()
    }

    /// Adds `latency` before every answer, as a distant server would.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.lock().latency = latency;
    }

    /// Makes the next `times` calls of `method` for chat `chat_id` fail with `error`, each
    /// answered after `delay` (a slow gateway); calls for other chats are not affected.
    pub fn fail_next_in_chat(
        &self,
        method: &str,
        chat_id: i64,
        times: usize,
        error: InjectedError,
        delay: Duration,
    ) {
        let mut state = self.shared.lock();
        let queue = state
            .chat_errors
            .entry((canonical_method(method), chat_id))
            .or_default();
        queue.extend(std::iter::repeat_n((error, delay), times));
    }

    /// Applies every later call of `method` but answers it only after `hold` (the call shows
    /// in the chat and in [`FakeTelegram::requests`] at once): a worker killed meanwhile has
    /// had its call done without learning the result.
    pub fn hold_answers(&self, method: &str, hold: Duration) {
        self.shared
            .lock()
            .held_answers
            .insert(canonical_method(method), hold);
    }

    /// Makes the next `times` calls of `method` fail with `error` (after recording them).
    pub fn fail_next(&self, method: &str, times: usize, error: InjectedError) {
        let mut state = self.shared.lock();
        let queue = state
            .injected_errors
            .entry(canonical_method(method))
            .or_default();
        queue.extend(std::iter::repeat_n(error, times));
    }

    /// Queues an update for `getUpdates`; its `update_id` is assigned here and returned.
    pub fn inject_update(&self, mut update: Value) -> i64 {
        let update_id = {
            let mut state = self.shared.lock();
            state.last_update_id += 1;
            let update_id = state.last_update_id;
            update["update_id"] = json!(update_id);
            state.history.insert(update_id, update.clone());
            state.pending_updates.push_back((update_id, update));
            update_id
        };
        self.shared.notify();
        update_id
    }

    /// Queues again an update that was already delivered (and perhaps confirmed), as Telegram
    /// does when a bot crashed before confirming it.
    pub fn redeliver(&self, update_id: i64) {
        {
            let mut state = self.shared.lock();
            let update = state
                .history
                .get(&update_id)
                .cloned()
                .unwrap_or_else(|| panic!("no update {update_id} was injected"));
            state.pending_updates.push_front((update_id, update));
        }
        self.shared.notify();
    }

    /// Injects a tap on an inline button of a message the bot sent. Returns the update id and
    /// the callback query id.
    pub fn tap_button(
        &self,
        user: &TestUser,
        chat_id: i64,
        message_id: i64,
        data: &str,
    ) -> (i64, String) {
        let (message, callback_id) = {
            let mut state = self.shared.lock();
            let stored = state
                .messages
                .get(&(chat_id, message_id))
                .unwrap_or_else(|| panic!("no message {message_id} in chat {chat_id}"));
            let message = message_json(&state, &self.shared.bot_user, stored, None);
            state.last_callback_id += 1;
            // Real callback query ids are long decimal strings.
            let callback_id = format!("6667286990{:09}", state.last_callback_id);
            state.open_callback_queries.insert(callback_id.clone());
            (message, callback_id)
        };
        let mut update = fixture(UPDATE_CALLBACK_QUERY);
        let query = &mut update["callback_query"];
        query["id"] = json!(callback_id);
        query["from"] = user_json(&query["from"], user);
        query["message"] = message;
        query["data"] = json!(data);
        let update_id = self.inject_update(update);
        (update_id, callback_id)
    }

    /// Injects a text message from a user into a chat, optionally as a reply to a message.
    /// Returns the update id and the new message's id.
    pub fn send_text(
        &self,
        user: &TestUser,
        chat_id: i64,
        text: &str,
        reply_to_message_id: Option<i64>,
    ) -> (i64, i64) {
        let (message, message_id) = {
            let mut state = self.shared.lock();
            let message_id = state.next_message_id(chat_id);
            let stored = ChatMessage {
                chat_id,
                message_id,
                text: text.to_owned(),
                entities: bot_command_entities(text),
                reply_markup: None,
                reply_to_message_id,
                from_bot: false,
                edit_count: 0,
                date: unix_now(),
            };
            state.messages.insert((chat_id, message_id), stored.clone());
            (
                message_json(&state, &self.shared.bot_user, &stored, Some(user)),
                message_id,
            )
        };
        let update = json!({ "update_id": 0, "message": message });
        (self.inject_update(update), message_id)
    }

    /// Waits until the recorded calls satisfy `condition`; fails the test after 30 s.
    pub async fn wait_for_requests(
        &self,
        what: &str,
        condition: impl Fn(&[RecordedRequest]) -> bool,
    ) -> Vec<RecordedRequest> {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
        loop {
            {
                let state = self.shared.lock();
                if condition(&state.requests) {
                    return state.requests.clone();
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                let requests: Vec<String> = self
                    .requests()
                    .iter()
                    .map(RecordedRequest::summary)
                    .collect();
                panic!(
                    "fake Telegram: timed out waiting for {what}; requests:\n{}",
                    requests.join("\n")
                );
            }
        }
    }

    /// Waits until every call received (but long polls) has been answered and recorded: what
    /// the messages show and what `requests` holds then agree. Fails the test after 30 s.
    pub async fn settled(&self) {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
        while self.shared.lock().answering > 0 {
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                panic!("fake Telegram: calls still unanswered after 30 s");
            }
        }
    }

    /// Waits until a message satisfies `condition`; fails the test after 30 s.
    pub async fn wait_for_message(
        &self,
        what: &str,
        chat_id: i64,
        message_id: i64,
        condition: impl Fn(&ChatMessage) -> bool,
    ) -> ChatMessage {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
        loop {
            if let Some(message) = self.message(chat_id, message_id) {
                if condition(&message) {
                    return message;
                }
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                panic!(
                    "fake Telegram: timed out waiting for {what}; message now: {:#?}",
                    self.message(chat_id, message_id)
                );
            }
        }
    }
}

struct Shared {
    token: String,
    bot_user: Value,
    state: Mutex<FakeState>,
    /// Bumped on every change, so that waiters (long polls, tests) wake up.
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock must not hide the state from others.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|version| *version += 1);
    }
}

#[derive(Default)]
struct FakeState {
    requests: Vec<RecordedRequest>,
    injected_errors: HashMap<String, VecDeque<InjectedError>>,
    /// Updates not yet confirmed by an `offset`, in delivery order.
    pending_updates: VecDeque<(i64, Value)>,
    /// Every injected update, for `redeliver`.
    history: BTreeMap<i64, Value>,
    last_update_id: i64,
    /// The update types the bot asked for (`allowed_updates`); empty: all.
    allowed_updates: Vec<String>,
    /// Identifies the newest `getUpdates`; an older one waiting is terminated (409).
    poll_generation: u64,
    messages: BTreeMap<(i64, i64), ChatMessage>,
    last_message_ids: HashMap<i64, i64>,
    last_callback_id: u64,
    /// Callback queries injected and not yet answered.
    open_callback_queries: HashSet<String>,
    /// Added before every answer.
    latency: Duration,
    /// Errors (and how late they are answered) for the calls of a method for one chat.
    chat_errors: HashMap<(String, i64), VecDeque<(InjectedError, Duration)>>,
    /// Methods whose answers are held back after the call was applied.
    held_answers: HashMap<String, Duration>,
    /// Calls (other than `getUpdates`, which waits by design) received and not yet recorded:
    /// the state a call changed shows before the call is in `requests`.
    answering: usize,
}

impl FakeState {
    fn next_message_id(&mut self, chat_id: i64) -> i64 {
        let last = self.last_message_ids.entry(chat_id).or_insert(100);
        *last += 1;
        *last
    }
}

/// The Bot API answer to one call.
struct ApiReply {
    status: StatusCode,
    body: Value,
    /// An HTML page instead of the JSON body (a proxy's error page).
    html: Option<String>,
}

impl ApiReply {
    fn ok(result: Value) -> ApiReply {
        ApiReply::with_body(StatusCode::OK, json!({ "ok": true, "result": result }))
    }

    fn with_body(status: StatusCode, body: Value) -> ApiReply {
        ApiReply {
            status,
            body,
            html: None,
        }
    }

    fn from_error_body(body: Value) -> ApiReply {
        let code = body["error_code"].as_u64().unwrap_or(400);
        let status = u16::try_from(code)
            .ok()
            .and_then(|code| StatusCode::from_u16(code).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        ApiReply::with_body(status, body)
    }

    /// A 400 in the shape of the published error fixtures.
    fn bad_request(description: &str) -> ApiReply {
        let mut body = fixture(ERROR_CHAT_NOT_FOUND);
        body["description"] = json!(description);
        ApiReply::from_error_body(body)
    }

    fn error(code: u16, description: &str) -> ApiReply {
        let mut body = fixture(ERROR_CHAT_NOT_FOUND);
        body["error_code"] = json!(code);
        body["description"] = json!(description);
        ApiReply::from_error_body(body)
    }
}

impl IntoResponse for ApiReply {
    fn into_response(self) -> Response {
        if let Some(page) = self.html {
            return (self.status, [(header::CONTENT_TYPE, "text/html")], page).into_response();
        }
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body.to_string(),
        )
            .into_response()
    }
}

/// A call being answered, from its arrival until it is recorded (or dropped: a client that
/// went away).
struct Answering(Arc<Shared>);

impl Answering {
    fn start(shared: &Arc<Shared>) -> Answering {
        shared.lock().answering += 1;
        Answering(shared.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.lock().answering -= 1;
        self.0.notify();
    }
}

async fn handle_call(
    State(shared): State<Arc<Shared>>,
    Path((bot_token, method)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> ApiReply {
    let method = canonical_method(&method);
    let _answering = (method != "getUpdates").then(|| Answering::start(&shared));
    let params = request_params(query.as_deref(), &headers, &body);
    let received_at = Instant::now();
    let latency = shared.lock().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let reply = if bot_token.strip_prefix("bot") != Some(shared.token.as_str()) {
        ApiReply::error(401, "Unauthorized")
    } else {
        let chat = params.get("chat_id").and_then(value_as_i64);
        let (injected, for_chat) = {
            let mut state = shared.lock();
            let for_chat = chat.and_then(|chat| {
                state
                    .chat_errors
                    .get_mut(&(method.clone(), chat))
                    .and_then(VecDeque::pop_front)
            });
            let injected = state
                .injected_errors
                .get_mut(&method)
                .and_then(VecDeque::pop_front);
            (injected, for_chat)
        };
        match (for_chat, injected) {
            (Some((error, delay)), _) => {
                tokio::time::sleep(delay).await;
                error.reply()
            }
            (None, Some(error)) => error.reply(),
            (None, None) => dispatch(&shared, &method, &params).await,
        }
    };
    let hold = shared.lock().held_answers.get(&method).copied();
    shared.lock().requests.push(RecordedRequest {
        method,
        params,
        status: reply.status.as_u16(),
        response: reply.body.clone(),
        received_at,
    });
    shared.notify();
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    reply
}

async fn dispatch(shared: &Shared, method: &str, params: &Value) -> ApiReply {
    match method {
        "getMe" => ApiReply::ok(fixture(GET_ME)["result"].clone()),
        "getWebhookInfo" => ApiReply::ok(fixture(GET_WEBHOOK_INFO)["result"].clone()),
        "deleteWebhook" => {
            let body = fixture(DELETE_WEBHOOK);
            ApiReply::with_body(StatusCode::OK, body)
        }
        "getUpdates" => get_updates(shared, params).await,
        "sendMessage" => send_message(shared, params),
        "editMessageText" => edit_message_text(shared, params),
        "editMessageReplyMarkup" => edit_message_reply_markup(shared, params),
        "answerCallbackQuery" => answer_callback_query(shared, params),
        _ => ApiReply::error(404, "Not Found"),
    }
}

async fn get_updates(shared: &Shared, params: &Value) -> ApiReply {
    let offset = params.get("offset").and_then(value_as_i64).unwrap_or(0);
    let limit = params
        .get("limit")
        .and_then(value_as_i64)
        .map_or(100, |limit| limit.clamp(1, 100)) as usize;
    let wait = params
        .get("timeout")
        .and_then(value_as_i64)
        .map_or(Duration::ZERO, |secs| {
            Duration::from_secs(secs.max(0) as u64).min(MAX_POLL_WAIT)
        });
    let allowed_updates = params.get("allowed_updates").map(parse_json_param);
    let mut changed = shared.changed.subscribe();
    let generation = {
        let mut state = shared.lock();
        if offset > 0 {
            state
                .pending_updates
                .retain(|(update_id, _)| *update_id >= offset);
        }
        if let Some(Value::Array(kinds)) = allowed_updates {
            state.allowed_updates = kinds
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
        }
        state.poll_generation += 1;
        state.poll_generation
    };
    // Wake an older poll so that it is terminated like on the real server.
    shared.notify();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        {
            let mut state = shared.lock();
            if state.poll_generation != generation {
                return InjectedError::TerminatedByOtherGetUpdates.reply();
            }
            let allowed = state.allowed_updates.clone();
            // Telegram drops updates of kinds the bot did not ask for.
            state.pending_updates.retain(|(_, update)| {
                allowed.is_empty() || allowed.iter().any(|kind| update.get(kind).is_some())
            });
            if !state.pending_updates.is_empty() {
                let mut batch: Vec<&(i64, Value)> = state.pending_updates.iter().collect();
                batch.sort_by_key(|(update_id, _)| *update_id);
                batch.dedup_by_key(|(update_id, _)| *update_id);
                let result: Vec<Value> = batch
                    .into_iter()
                    .take(limit)
                    .map(|(_, update)| update.clone())
                    .collect();
                return ApiReply::ok(Value::Array(result));
            }
        }
        if tokio::time::timeout_at(deadline, changed.changed())
            .await
            .is_err()
        {
            return ApiReply::ok(json!([]));
        }
    }
}

fn send_message(shared: &Shared, params: &Value) -> ApiReply {
    let Some(chat_id) = params
        .get("chat_id")
        .and_then(value_as_i64)
        .filter(|id| *id != 0)
    else {
        return InjectedError::ChatNotFound.reply();
    };
    let (text, entities) = match parse_text(params) {
        Ok(parsed) => parsed,
        Err(reply) => return reply,
    };
    let reply_markup = match parse_reply_markup(params) {
        Ok(markup) => markup,
        Err(reply) => return reply,
    };
    let reply_parameters = params.get("reply_parameters").map(parse_json_param);
    let mut reply_to_message_id = reply_parameters
        .as_ref()
        .and_then(|reply| reply.get("message_id").and_then(value_as_i64));
    let allow_sending_without_reply = reply_parameters
        .as_ref()
        .and_then(|reply| reply.get("allow_sending_without_reply"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut state = shared.lock();
    if let Some(reply_to) = reply_to_message_id {
        if !state.messages.contains_key(&(chat_id, reply_to)) {
            if !allow_sending_without_reply {
                return ApiReply::bad_request("Bad Request: message to be replied not found");
            }
            reply_to_message_id = None;
        }
    }
    let message_id = state.next_message_id(chat_id);
    let stored = ChatMessage {
        chat_id,
        message_id,
        text,
        entities,
        reply_markup,
        reply_to_message_id,
        from_bot: true,
        edit_count: 0,
        date: unix_now(),
    };
    state.messages.insert((chat_id, message_id), stored.clone());
    let mut body = fixture(SEND_MESSAGE);
    body["result"] = message_json(&state, &shared.bot_user, &stored, None);
    ApiReply::with_body(StatusCode::OK, body)
}

fn edit_message_text(shared: &Shared, params: &Value) -> ApiReply {
    match parse_text(params) {
        Ok(text) => edit_message(shared, params, Some(text)),
        Err(reply) => reply,
    }
}

fn edit_message_reply_markup(shared: &Shared, params: &Value) -> ApiReply {
    edit_message(shared, params, None)
}

/// An edit of a bot message: its keyboard (`reply_markup`, none to remove it) and, when
/// given, its text and entities.
fn edit_message(shared: &Shared, params: &Value, text: Option<(String, Vec<Value>)>) -> ApiReply {
    let (Some(chat_id), Some(message_id)) = (
        params.get("chat_id").and_then(value_as_i64),
        params.get("message_id").and_then(value_as_i64),
    ) else {
        return ApiReply::bad_request("Bad Request: message identifier is not specified");
    };
    let reply_markup = match parse_reply_markup(params) {
        Ok(markup) => markup,
        Err(reply) => return reply,
    };
    let mut state = shared.lock();
    let Some(stored) = state.messages.get_mut(&(chat_id, message_id)) else {
        return ApiReply::bad_request("Bad Request: message to edit not found");
    };
    if !stored.from_bot {
        return InjectedError::MessageCantBeEdited.reply();
    }
    let (text, entities) = text.unwrap_or_else(|| (stored.text.clone(), stored.entities.clone()));
    if stored.text == text && stored.entities == entities && stored.reply_markup == reply_markup {
        return InjectedError::MessageNotModified.reply();
    }
    stored.text = text;
    stored.entities = entities;
    stored.reply_markup = reply_markup;
    stored.edit_count += 1;
    let stored = stored.clone();
    let mut body = fixture(EDIT_MESSAGE_TEXT);
    let mut message = message_json(&state, &shared.bot_user, &stored, None);
    message["edit_date"] = json!(unix_now());
    body["result"] = message;
    ApiReply::with_body(StatusCode::OK, body)
}

fn answer_callback_query(shared: &Shared, params: &Value) -> ApiReply {
    let id = params
        .get("callback_query_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !shared.lock().open_callback_queries.remove(id) {
        return ApiReply::bad_request(QUERY_TOO_OLD);
    }
    ApiReply::with_body(StatusCode::OK, fixture(ANSWER_CALLBACK_QUERY))
}

/// The text and entities of a sendMessage/editMessageText call, checked like Telegram does.
fn parse_text(params: &Value) -> Result<(String, Vec<Value>), ApiReply> {
    let source = params
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (text, entities) = match params.get("parse_mode").and_then(Value::as_str) {
        None => (source.to_owned(), Vec::new()),
        Some(mode) if mode.eq_ignore_ascii_case("html") => parse_html(source).map_err(|error| {
            ApiReply::bad_request(&format!("Bad Request: can't parse entities: {error}"))
        })?,
        Some(_) => return Err(ApiReply::bad_request("Bad Request: unsupported parse_mode")),
    };
    if text.trim().is_empty() {
        return Err(ApiReply::bad_request("Bad Request: message text is empty"));
    }
    if utf16_len(&text) > MAX_TEXT_UTF16 {
        return Err(InjectedError::MessageTooLong.reply());
    }
    Ok((text, entities))
}

/// The inline keyboard of a call (`None`: no buttons), checked like Telegram does.
fn parse_reply_markup(params: &Value) -> Result<Option<Value>, ApiReply> {
    let Some(markup) = params.get("reply_markup").map(parse_json_param) else {
        return Ok(None);
    };
    for button in buttons_of(&markup) {
        let data = button.get("callback_data").and_then(Value::as_str);
        if data.is_some_and(|data| data.is_empty() || data.len() > MAX_CALLBACK_DATA_BYTES) {
            return Err(ApiReply::bad_request("Bad Request: BUTTON_DATA_INVALID"));
        }
    }
    let has_buttons = buttons_of(&markup).next().is_some();
    Ok(has_buttons.then_some(markup))
}

fn buttons_of(markup: &Value) -> impl Iterator<Item = &Value> {
    markup
        .get("inline_keyboard")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
}

fn callback_data_of(markup: &Value) -> Vec<String> {
    buttons_of(markup)
        .filter_map(|button| button.get("callback_data").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// A stored message as the Bot API's Message object, shaped like the fixtures.
fn message_json(
    state: &FakeState,
    bot_user: &Value,
    message: &ChatMessage,
    sender: Option<&TestUser>,
) -> Value {
    let template = fixture(SEND_MESSAGE)["result"].clone();
    let mut object = Map::new();
    object.insert("message_id".to_owned(), json!(message.message_id));
    let from = match sender {
        Some(user) => user_json(&fixture(UPDATE_MESSAGE_PRIVATE)["message"]["from"], user),
        None if message.from_bot => bot_user.clone(),
        None => template["from"].clone(),
    };
    object.insert("from".to_owned(), from);
    object.insert("chat".to_owned(), chat_json(message.chat_id));
    object.insert("date".to_owned(), json!(message.date));
    if let Some(reply_to) = message.reply_to_message_id {
        if let Some(original) = state.messages.get(&(message.chat_id, reply_to)) {
            let original_json = message_json(state, bot_user, original, None);
            object.insert("reply_to_message".to_owned(), original_json);
        }
    }
    object.insert("text".to_owned(), json!(message.text));
    if !message.entities.is_empty() {
        object.insert("entities".to_owned(), json!(message.entities));
    }
    if let Some(markup) = &message.reply_markup {
        object.insert("reply_markup".to_owned(), markup.clone());
    }
    Value::Object(object)
}

/// A chat object: private chats (positive ids) like the private fixtures, groups like the
/// captured group update.
fn chat_json(chat_id: i64) -> Value {
    let mut chat = if chat_id > 0 {
        fixture(UPDATE_MESSAGE_PRIVATE)["message"]["chat"].clone()
    } else {
        fixture(UPDATE_MESSAGE_GROUP)["message"]["chat"].clone()
    };
    chat["id"] = json!(chat_id);
    chat
}

fn user_json(template: &Value, user: &TestUser) -> Value {
    let mut from = template.clone();
    from["id"] = json!(user.id);
    from["is_bot"] = json!(false);
    from["first_name"] = json!(user.first_name);
    match (&user.username, from.as_object_mut()) {
        (Some(username), _) => from["username"] = json!(username),
        (None, Some(object)) => {
            object.remove("username");
        }
        (None, None) => {}
    }
    from
}

fn bot_user_from_fixture() -> Value {
    let me = &fixture(GET_ME)["result"];
    json!({
        "id": me["id"],
        "is_bot": true,
        "first_name": me["first_name"],
        "username": me["username"],
    })
}

/// Telegram marks a leading `/command` as a `bot_command` entity.
fn bot_command_entities(text: &str) -> Vec<Value> {
    if !text.starts_with('/') {
        return Vec::new();
    }
    let command = text.split(char::is_whitespace).next().unwrap_or_default();
    vec![json!({ "offset": 0, "length": utf16_len(command), "type": "bot_command" })]
}

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).expect("the Telegram fixtures are valid JSON")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or_default()
}

fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
}

/// Form and query parameters carry nested objects as JSON strings.
fn parse_json_param(value: &Value) -> Value {
    match value {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| value.clone()),
        other => other.clone(),
    }
}

/// The documented spelling of a method name, matched case-insensitively.
fn canonical_method(name: &str) -> String {
    const KNOWN: [&str; 7] = [
        "getMe",
        "getWebhookInfo",
        "deleteWebhook",
        "getUpdates",
        "sendMessage",
        "editMessageText",
        "answerCallbackQuery",
    ];
    KNOWN
        .iter()
        .find(|known| known.eq_ignore_ascii_case(name))
        .map_or_else(|| name.to_owned(), |known| (*known).to_owned())
}

fn request_params(query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Value {
    let mut params = Map::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        params.insert(key.into_owned(), Value::String(value.into_owned()));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if content_type.starts_with("application/json") {
        if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) {
            params.extend(object);
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        for (key, value) in form_urlencoded::parse(body) {
            params.insert(key.into_owned(), Value::String(value.into_owned()));
        }
    }
    Value::Object(params)
}

/// Telegram's HTML parse mode, following tdlib's `parse_html`: the visible text and its
/// entities, or the error text Telegram reports after "can't parse entities: ".
fn parse_html(source: &str) -> Result<(String, Vec<Value>), String> {
    HtmlParser::new(source).parse()
}

struct OpenTag {
    name: String,
    argument: String,
    utf16_offset: usize,
    text_start: usize,
}

struct HtmlEntity {
    kind: &'static str,
    offset: usize,
    length: usize,
    argument: String,
}

struct HtmlParser<'a> {
    source: &'a [u8],
    position: usize,
    text: Vec<u8>,
    utf16_offset: usize,
    open: Vec<OpenTag>,
    entities: Vec<HtmlEntity>,
}

impl<'a> HtmlParser<'a> {
    fn new(source: &'a str) -> HtmlParser<'a> {
        HtmlParser {
            source: source.as_bytes(),
            position: 0,
            text: Vec::with_capacity(source.len()),
            utf16_offset: 0,
            open: Vec::new(),
            entities: Vec::new(),
        }
    }

    /// The byte at `index`, 0 past the end (tdlib reads a NUL-terminated string).
    fn at(&self, index: usize) -> u8 {
        self.source.get(index).copied().unwrap_or(0)
    }

    fn parse(mut self) -> Result<(String, Vec<Value>), String> {
        while self.position < self.source.len() {
            let byte = self.at(self.position);
            if byte == b'&' {
                let mut end = self.position;
                if let Some(code) = decode_html_entity(self.source, &mut end) {
                    let character = char::from_u32(code).ok_or_else(|| {
                        "Text contains invalid Unicode characters after decoding HTML entities, check for unmatched surrogate code units".to_owned()
                    })?;
                    self.utf16_offset += character.len_utf16();
                    let mut buffer = [0u8; 4];
                    self.text
                        .extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
                    self.position = end;
                    continue;
                }
            }
            if byte != b'<' {
                if is_utf8_first_byte(byte) {
                    self.utf16_offset += if byte >= 0xf0 { 2 } else { 1 };
                }
                self.text.push(byte);
                self.position += 1;
                continue;
            }
            if self.at(self.position + 1) == b'/' {
                self.end_tag()?;
            } else {
                self.start_tag()?;
            }
            // The tag parsers stop on its closing '>'.
            self.position += 1;
        }
        if let Some(tag) = self.open.last() {
            return Err(format!(
                "Can't find end tag corresponding to start tag {}",
                tag.name
            ));
        }
        let text =
            String::from_utf8(self.text).map_err(|_| "Text must be encoded in UTF-8".to_owned())?;
        let mut entities = self.entities;
        entities.sort_by(|a, b| a.offset.cmp(&b.offset).then(b.length.cmp(&a.length)));
        Ok((text, entities.iter().map(entity_json).collect()))
    }

    fn start_tag(&mut self) -> Result<(), String> {
        let begin = self.position;
        let mut i = begin + 1;
        while !is_space(self.at(i)) && self.at(i) != b'>' {
            i += 1;
        }
        if self.at(i) == 0 {
            return Err(format!("Unclosed start tag at byte offset {begin}"));
        }
        let name = lossy_lower(&self.source[begin + 1..i]);
        const SUPPORTED: [&str; 16] = [
            "a",
            "b",
            "strong",
            "i",
            "em",
            "s",
            "strike",
            "del",
            "u",
            "ins",
            "tg-spoiler",
            "tg-emoji",
            "span",
            "pre",
            "code",
            "blockquote",
        ];
        if !SUPPORTED.contains(&name.as_str()) {
            return Err(format!(
                "Unsupported start tag \"{name}\" at byte offset {begin}"
            ));
        }
        let mut argument = String::new();
        while self.at(i) != b'>' {
            while self.at(i) != 0 && is_space(self.at(i)) {
                i += 1;
            }
            if self.at(i) == b'>' {
                break;
            }
            let attribute_begin = i;
            while !is_space(self.at(i)) && self.at(i) != b'=' {
                i += 1;
            }
            let attribute = lossy(&self.source[attribute_begin..i]);
            if attribute.is_empty() {
                return Err(format!(
                    "Empty attribute name in the tag \"{name}\" at byte offset {begin}"
                ));
            }
            while self.at(i) != 0 && is_space(self.at(i)) {
                i += 1;
            }
            if self.at(i) != b'=' {
                return Err(format!("Expected equal sign in declaration of an attribute of the tag \"{name}\" at byte offset {begin}"));
            }
            i += 1;
            while self.at(i) != 0 && is_space(self.at(i)) {
                i += 1;
            }
            if self.at(i) == 0 {
                return Err(format!(
                    "Unclosed start tag \"{name}\" at byte offset {begin}"
                ));
            }
            let value = if self.at(i) != b'\'' && self.at(i) != b'"' {
                let token_begin = i;
                while self.at(i).is_ascii_alphanumeric() || self.at(i) == b'.' || self.at(i) == b'-'
                {
                    i += 1;
                }
                if !is_space(self.at(i)) && self.at(i) != b'>' {
                    return Err(format!(
                        "Unexpected end of name token at byte offset {token_begin}"
                    ));
                }
                lossy_lower(&self.source[token_begin..i])
            } else {
                let quote = self.at(i);
                i += 1;
                let mut value = Vec::new();
                while self.at(i) != quote && self.at(i) != 0 {
                    if self.at(i) == b'&' {
                        let mut end = i;
                        if let Some(character) =
                            decode_html_entity(self.source, &mut end).and_then(char::from_u32)
                        {
                            let mut buffer = [0u8; 4];
                            value.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
                            i = end;
                            continue;
                        }
                    }
                    value.push(self.at(i));
                    i += 1;
                }
                if self.at(i) == quote {
                    i += 1;
                }
                lossy(&value)
            };
            if self.at(i) == 0 {
                return Err(format!("Unclosed start tag at byte offset {begin}"));
            }
            match (name.as_str(), attribute.as_str()) {
                ("a", "href") | ("tg-emoji", "emoji-id") => argument = value,
                ("code", "class") if value.starts_with("language-") => {
                    argument = value["language-".len()..].to_owned();
                }
                ("span", "class") if value.starts_with("tg-") => {
                    argument = value["tg-".len()..].to_owned();
                }
                _ => {}
            }
        }
        if name == "span" && argument != "spoiler" {
            return Err(format!(
                "Tag \"span\" must have class \"tg-spoiler\" at byte offset {begin}"
            ));
        }
        self.open.push(OpenTag {
            name,
            argument,
            utf16_offset: self.utf16_offset,
            text_start: self.text.len(),
        });
        self.position = i;
        Ok(())
    }

    fn end_tag(&mut self) -> Result<(), String> {
        let begin = self.position;
        if self.open.is_empty() {
            return Err(format!("Unexpected end tag at byte offset {begin}"));
        }
        let mut i = begin + 2;
        while !is_space(self.at(i)) && self.at(i) != b'>' {
            i += 1;
        }
        let end_name = lossy_lower(&self.source[begin + 2..i]);
        while is_space(self.at(i)) && self.at(i) != 0 {
            i += 1;
        }
        if self.at(i) != b'>' {
            return Err(format!("Unclosed end tag at byte offset {begin}"));
        }
        let Some(tag) = self.open.pop() else {
            return Err(format!("Unexpected end tag at byte offset {begin}"));
        };
        if !end_name.is_empty() && end_name != tag.name {
            return Err(format!(
                "Unmatched end tag at byte offset {begin}, expected \"</{}>\", found \"</{end_name}>\"",
                tag.name
            ));
        }
        if self.utf16_offset > tag.utf16_offset {
            self.close_entity(tag)?;
        }
        self.position = i;
        Ok(())
    }

    fn close_entity(&mut self, tag: OpenTag) -> Result<(), String> {
        let offset = tag.utf16_offset;
        let length = self.utf16_offset - offset;
        let same_span = |entity: &HtmlEntity| entity.offset == offset && entity.length == length;
        let (kind, argument) = match tag.name.as_str() {
            "i" | "em" => ("italic", String::new()),
            "b" | "strong" => ("bold", String::new()),
            "s" | "strike" | "del" => ("strikethrough", String::new()),
            "u" | "ins" => ("underline", String::new()),
            "tg-spoiler" | "span" => ("spoiler", String::new()),
            "tg-emoji" => {
                if tag.argument.parse::<i64>().map_or(true, |id| id == 0) {
                    return Err("Invalid custom emoji identifier specified".to_owned());
                }
                ("custom_emoji", tag.argument)
            }
            "a" => {
                let url = if tag.argument.is_empty() {
                    lossy(&self.text[tag.text_start..])
                } else {
                    tag.argument
                };
                ("text_link", url)
            }
            "pre" => {
                // `<pre><code class="language-x">` is one `pre` entity with a language.
                if let Some(last) = self.entities.last_mut() {
                    if last.kind == "code" && same_span(last) && !last.argument.is_empty() {
                        last.kind = "pre";
                        return Ok(());
                    }
                }
                ("pre", String::new())
            }
            "code" => {
                if let Some(last) = self.entities.last_mut() {
                    if last.kind == "pre" && same_span(last) && !tag.argument.is_empty() {
                        last.argument = tag.argument;
                        return Ok(());
                    }
                }
                ("code", tag.argument)
            }
            _ => ("blockquote", String::new()),
        };
        self.entities.push(HtmlEntity {
            kind,
            offset,
            length,
            argument,
        });
        Ok(())
    }
}

fn entity_json(entity: &HtmlEntity) -> Value {
    let mut object =
        json!({ "offset": entity.offset, "length": entity.length, "type": entity.kind });
    match entity.kind {
        "text_link" => object["url"] = json!(entity.argument),
        "custom_emoji" => object["custom_emoji_id"] = json!(entity.argument),
        "pre" if !entity.argument.is_empty() => object["language"] = json!(entity.argument),
        _ => {}
    }
    object
}

/// Decodes `&lt;`, `&gt;`, `&amp;`, `&quot;` and numeric references at `*position`; on success
/// moves `*position` past the reference.
fn decode_html_entity(source: &[u8], position: &mut usize) -> Option<u32> {
    let at = |index: usize| source.get(index).copied().unwrap_or(0);
    let start = *position;
    let mut end = start + 1;
    let code = if at(start + 1) == b'#' {
        end += 1;
        let radix = if at(start + 2) == b'x' {
            end += 1;
            16
        } else {
            10
        };
        let mut code: u64 = 0;
        while let Some(digit) = char::from(at(end)).to_digit(radix) {
            code = code
                .saturating_mul(u64::from(radix))
                .saturating_add(u64::from(digit));
            end += 1;
        }
        if code == 0 || code >= 0x10ffff || end - start >= 10 {
            return None;
        }
        code as u32
    } else {
        while at(end).is_ascii_alphabetic() {
            end += 1;
        }
        match &source[start + 1..end] {
            b"lt" => u32::from('<'),
            b"gt" => u32::from('>'),
            b"amp" => u32::from('&'),
            b"quot" => u32::from('"'),
            _ => return None,
        }
    };
    *position = if at(end) == b';' { end + 1 } else { end };
    Some(code)
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n' | 0 | 0x0b)
}

fn is_utf8_first_byte(byte: u8) -> bool {
    (byte & 0xc0) != 0x80
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn lossy_lower(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_escapes_decode_and_tags_become_entities() {
        let (text, entities) = parse_html(
            "<b>a &lt;b&gt; &amp; &quot;</b> <pre><code class=\"language-json\">{}</code></pre>",
        )
        .unwrap();
        assert_eq!(text, "a <b> & \" {}");
        assert_eq!(
            entities,
            vec![
                json!({"offset": 0, "length": 9, "type": "bold"}),
                json!({"offset": 10, "length": 2, "type": "pre", "language": "json"}),
            ]
        );
    }

    #[test]
    fn html_errors_match_telegram_wording() {
        assert_eq!(
            parse_html("a <x> b").unwrap_err(),
            "Unsupported start tag \"x\" at byte offset 2"
        );
        assert_eq!(
            parse_html("<b>x</i>").unwrap_err(),
            "Unmatched end tag at byte offset 4, expected \"</b>\", found \"</i>\""
        );
        assert_eq!(
            parse_html("<b>x").unwrap_err(),
            "Can't find end tag corresponding to start tag b"
        );
        assert_eq!(
            parse_html("x</b>").unwrap_err(),
            "Unexpected end tag at byte offset 1"
        );
        assert_eq!(
            parse_html("1 <2").unwrap_err(),
            "Unclosed start tag at byte offset 2"
        );
    }

    #[test]
    fn html_keeps_a_lone_ampersand_and_counts_utf16() {
        let (text, entities) = parse_html("R&D 😀 <i>é</i>").unwrap();
        assert_eq!(text, "R&D 😀 é");
        assert_eq!(
            entities,
            vec![json!({"offset": 7, "length": 1, "type": "italic"})]
        );
    }
}
