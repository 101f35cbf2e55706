//! A fake GitHub REST API on 127.0.0.1 for end-to-end tests of the GitHub worker.
//!
//! It serves the endpoints the worker uses with the response shapes of the real API, built
//! from the recorded answers in `fixtures/github/` (see the README there): issue comments
//! (create, list with `since`, edit with PATCH), reactions, collaborator permission (legacy and
//! modern shapes), issues (create, list, edit) and the GitHub App installation token exchange.
//! Every request is recorded; test hooks add users, issues and comments, set permissions,
//! inject rate-limit and server errors for the next calls, and hold answers back.
//!
//! It also builds webhook deliveries from the published payload examples, signs them like
//! GitHub (`X-Hub-Signature-256`) and posts them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::watch;

const COMMENT_JSON: &str =
    include_str!("../fixtures/github/rest.issue-comment.create.201.hub4j.json");
const COMMENT_MAPPING_JSON: &str =
    include_str!("../fixtures/github/rest.issue-comment.create.201.hub4j.mapping.json");
const PERMISSION_LEGACY_JSON: &str =
    include_str!("../fixtures/github/rest.collaborator-permission.admin.legacy-shape.hub4j.json");
const PERMISSION_MODERN_JSON: &str =
    include_str!("../fixtures/github/rest.collaborator-permission.maintain.hub4j.json");
const REACTION_JSON: &str =
    include_str!("../fixtures/github/rest.issue-comment-reaction.create.201.hub4j.json");
const ISSUE_JSON: &str = include_str!("../fixtures/github/rest.issues.create.201.hub4j.json");
const WEBHOOK_COMMENT_CREATED_JSON: &str =
    include_str!("../fixtures/github/webhook.issue_comment.created.payload.json");
const WEBHOOK_COMMENT_EDITED_JSON: &str =
    include_str!("../fixtures/github/webhook.issue_comment.edited.payload.json");
const WEBHOOK_COMMENT_DELETED_JSON: &str =
    include_str!("../fixtures/github/webhook.issue_comment.deleted.payload.json");
const WEBHOOK_BOT_COMMENT_CREATED_JSON: &str =
    include_str!("../fixtures/github/octocrab.issue_comment_created_webhook_event.json");

/// The bytes of the published `ping` webhook example, unchanged (sign them to deliver).
pub const WEBHOOK_PING_PAYLOAD: &str = include_str!("../fixtures/github/webhook.ping.payload.json");

/// The personal access token the fake accepts by default.
pub const DEFAULT_TOKEN: &str = "ghp_countersignFakeToken0000000000000000";
/// The login of the account the default token belongs to.
pub const DEFAULT_BOT_LOGIN: &str = "countersign-bot";

const RATE_LIMIT: u64 = 5000;
const DOCS_URL: &str = "https://docs.github.com/rest";
const REACTION_CONTENTS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

/// Whether an account is a person (or machine user) or an app's bot account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserKind {
    User,
    Bot,
}

impl UserKind {
    fn as_str(self) -> &'static str {
        match self {
            UserKind::User => "User",
            UserKind::Bot => "Bot",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub login: String,
    pub id: u64,
    pub kind: UserKind,
}

/// A repository role, as GitHub names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Maintain,
    Write,
    Triage,
    Read,
    None,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Maintain => "maintain",
            Role::Write => "write",
            Role::Triage => "triage",
            Role::Read => "read",
            Role::None => "none",
        }
    }

    /// The legacy base permission GitHub documents for the `permission` field.
    fn documented_permission(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Maintain | Role::Write => "write",
            Role::Triage | Role::Read => "read",
            Role::None => "none",
        }
    }
}

/// Which recorded shape the collaborator-permission endpoint answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PermissionShape {
    /// `{"permission", "user"}` only, as recorded before `role_name` existed.
    Legacy,
    /// `permission` (maintain mapped to write, triage to read, as documented), `role_name`,
    /// `user.permissions`, `user.role_name`.
    Modern,
    /// The modern shape with the role itself in `permission`, as recorded in 2023
    /// (`"permission": "maintain"`).
    ModernUnmapped,
}

#[derive(Clone, Debug)]
pub struct Comment {
    pub id: u64,
    /// `owner/repo`, as given when the issue was added.
    pub repo: String,
    pub issue: u64,
    pub user: User,
    pub body: String,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

#[derive(Clone, Debug)]
pub struct Issue {
    pub repo: String,
    pub number: u64,
    pub id: u64,
    pub title: String,
    pub body: String,
    pub user: User,
    pub state: String,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

#[derive(Clone, Debug)]
pub struct Reaction {
    pub id: u64,
    pub comment_id: u64,
    pub user: User,
    pub content: String,
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub authorization: Option<String>,
    pub body: String,
    pub endpoint: Option<Endpoint>,
    /// 0 while the answer is held back.
    pub status: u16,
    pub received_at: Instant,
}

/// The endpoints the fake serves, for error injection, holds and assertions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `GET /repos/{owner}/{repo}/issues/{number}/comments`
    ListComments,
    /// `POST /repos/{owner}/{repo}/issues/{number}/comments`
    CreateComment,
    /// `GET /repos/{owner}/{repo}/issues/comments/{id}`
    GetComment,
    /// `PATCH /repos/{owner}/{repo}/issues/comments/{id}`
    UpdateComment,
    /// `POST /repos/{owner}/{repo}/issues/comments/{id}/reactions`
    CreateReaction,
    /// `GET /repos/{owner}/{repo}/collaborators/{username}/permission`
    GetPermission,
    /// `POST /repos/{owner}/{repo}/issues`
    CreateIssue,
    /// `GET /repos/{owner}/{repo}/issues`
    ListIssues,
    /// `GET /repos/{owner}/{repo}/issues/{number}`
    GetIssue,
    /// `PATCH /repos/{owner}/{repo}/issues/{number}`
    UpdateIssue,
    /// `POST /app/installations/{id}/access_tokens`
    CreateInstallationToken,
    /// `GET /user`: the account the token belongs to.
    GetAuthenticatedUser,
    /// `GET /repos/{owner}/{repo}`
    GetRepository,
}

/// An error answer injected for the next call(s) of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// 403 with `Retry-After` and GitHub's secondary-rate-limit message.
    SecondaryRateLimit { retry_after_secs: u64 },
    /// 429 with `Retry-After`.
    TooManyRequests { retry_after_secs: u64 },
    /// 403 with `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset`; every call until the reset
    /// time gets the same answer, as on GitHub.
    PrimaryRateLimit { reset_after_secs: u64 },
    /// 502 without doing anything.
    BadGateway,
    /// The write is done, then 502: the answer was lost on the way (the case where a client
    /// retrying a POST would create a second comment).
    BadGatewayAfterWrite,
    /// 422 "Validation Failed" on the body, as GitHub refuses a body it will not take.
    BodyRefused,
    /// 410 "This issue was deleted", as GitHub answers for a deleted issue's comments.
    Gone,
}

struct Injected {
    endpoint: Endpoint,
    failure: Failure,
    remaining: usize,
}

struct FakeState {
    base_url: String,
    bot: User,
    app_bot: User,
    tokens: HashSet<String>,
    users: HashMap<String, User>,
    next_user_id: u64,
    next_comment_id: u64,
    next_reaction_id: u64,
    next_issue_id: u64,
    next_installation_token: u64,
    /// Issues by lower-case `owner/repo`, then number.
    issues: HashMap<String, BTreeMap<u64, Issue>>,
    comments: BTreeMap<u64, Comment>,
    reactions: Vec<Reaction>,
    permissions: HashMap<(String, String), (Role, PermissionShape)>,
    requests: Vec<RecordedRequest>,
    injected: VecDeque<Injected>,
    rate_limited_until: Option<OffsetDateTime>,
    /// Added before every answer, as a distant server would.
    latency: std::time::Duration,
    held: HashSet<Endpoint>,
    /// Endpoints held once the given number of further calls has been answered.
    hold_after: HashMap<Endpoint, usize>,
    rate_used: u64,
}

struct Shared {
    state: Mutex<FakeState>,
    /// Bumped on every change, so tests can wait for a condition.
    version: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A panicking test thread must not hide the state from the others.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self) {
        self.version.send_modify(|version| *version += 1);
    }
}

/// The fake GitHub REST API server. Dropping it stops the server.
pub struct FakeGitHub {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeGitHub {
    /// Starts the fake on 127.0.0.1:<ephemeral>. The token [`DEFAULT_TOKEN`] belongs to the
    /// machine user [`DEFAULT_BOT_LOGIN`].
    pub async fn start() -> FakeGitHub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake GitHub listener");
        let addr = listener.local_addr().expect("fake GitHub address");
        let base_url = format!("http://{addr}");
        let bot = User {
            login: DEFAULT_BOT_LOGIN.to_string(),
            id: 90_000_001,
            kind: UserKind::User,
        };
        let app_bot = User {
            login: "countersign-app[bot]".to_string(),
            id: 90_000_002,
            kind: UserKind::Bot,
        };
        let mut users = HashMap::new();
        users.insert(bot.login.to_lowercase(), bot.clone());
        users.insert(app_bot.login.to_lowercase(), app_bot.clone());
        let state = FakeState {
            base_url,
            bot,
            app_bot,
            tokens: HashSet::from([DEFAULT_TOKEN.to_string()]),
            users,
            next_user_id: 21_031_067,
            next_comment_id: 1_254_853_505,
            next_reaction_id: 158_437_374,
            next_issue_id: 1_382_170_832,
            next_installation_token: 1,
            issues: HashMap::new(),
            comments: BTreeMap::new(),
            reactions: Vec::new(),
            permissions: HashMap::new(),
            requests: Vec::new(),
            injected: VecDeque::new(),
            rate_limited_until: None,
            latency: std::time::Duration::ZERO,
            held: HashSet::new(),
            hold_after: HashMap::new(),
            rate_used: 0,
        };
        let (version, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            version,
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            // The server ends when the test drops the fake (abort).
            let _ = axum::serve(listener, app).await;
        });
        FakeGitHub {
            shared,
            addr,
            server,
        }
    }

    /// `http://127.0.0.1:PORT`, the API base URL to give the worker.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The account behind [`DEFAULT_TOKEN`].
    pub fn bot(&self) -> User {
        self.shared.lock().bot.clone()
    }

    /// The bot account of the GitHub App whose installation tokens the fake issues.
    pub fn app_bot(&self) -> User {
        self.shared.lock().app_bot.clone()
    }

    /// Registers an account (or returns the existing one with that login).
    pub fn add_user(&self, login: &str, kind: UserKind) -> User {
        let mut state = self.shared.lock();
        if let Some(user) = state.users.get(&login.to_lowercase()) {
            return user.clone();
        }
        let user = User {
            login: login.to_string(),
            id: state.next_user_id,
            kind,
        };
        state.next_user_id += 1;
        state.users.insert(login.to_lowercase(), user.clone());
        drop(state);
        self.shared.changed();
        user
    }

    /// Opens an issue in `owner/repo` (the repository exists from then on); returns its number.
    pub fn add_issue(&self, repo: &str, title: &str) -> u64 {
        let mut state = self.shared.lock();
        let user = state.bot.clone();
        let number = state.create_issue(repo, title, "", user).number;
        drop(state);
        self.shared.changed();
        number
    }

    /// Sets `login`'s role on `owner/repo` and the shape the permission endpoint answers with.
    /// Registered users without a role set get `read` in the modern shape.
    pub fn set_permission(&self, repo: &str, login: &str, role: Role, shape: PermissionShape) {
        self.shared
            .lock()
            .permissions
            .insert((repo.to_lowercase(), login.to_lowercase()), (role, shape));
        self.shared.changed();
    }

    /// `user` comments on an issue, as if on github.com. Panics if the issue does not exist.
    pub fn add_comment(&self, repo: &str, issue: u64, user: &User, body: &str) -> Comment {
        let mut state = self.shared.lock();
        assert!(
            state.issue(repo, issue).is_some(),
            "add_comment: no issue {repo}#{issue} (add_issue first)"
        );
        let comment = state.create_comment(repo, issue, user.clone(), body);
        drop(state);
        self.shared.changed();
        comment
    }

    /// Edits a comment's body, as its author would on github.com (updated_at moves on).
    pub fn edit_comment(&self, id: u64, body: &str) -> Comment {
        let mut state = self.shared.lock();
        let comment = state
            .comments
            .get_mut(&id)
            .unwrap_or_else(|| panic!("edit_comment: no comment {id}"));
        comment.body = body.to_string();
        comment.updated_at = now_seconds();
        let comment = comment.clone();
        drop(state);
        self.shared.changed();
        comment
    }

    pub fn comment(&self, id: u64) -> Option<Comment> {
        self.shared.lock().comments.get(&id).cloned()
    }

    /// The comments of an issue, oldest first.
    pub fn comments(&self, repo: &str, issue: u64) -> Vec<Comment> {
        let state = self.shared.lock();
        state
            .comments
            .values()
            .filter(|c| c.repo.eq_ignore_ascii_case(repo) && c.issue == issue)
            .cloned()
            .collect()
    }

    pub fn issue(&self, repo: &str, number: u64) -> Option<Issue> {
        self.shared.lock().issue(repo, number).cloned()
    }

    /// The issues of a repository, by number.
    pub fn issues(&self, repo: &str) -> Vec<Issue> {
        let state = self.shared.lock();
        state
            .issues
            .get(&repo.to_lowercase())
            .map(|issues| issues.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn reactions(&self, comment_id: u64) -> Vec<Reaction> {
        let state = self.shared.lock();
        state
            .reactions
            .iter()
            .filter(|r| r.comment_id == comment_id)
            .cloned()
            .collect()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests received for one endpoint, in arrival order.
    pub fn requests_to(&self, endpoint: Endpoint) -> Vec<RecordedRequest> {
        let state = self.shared.lock();
        state
            .requests
            .iter()
            .filter(|r| r.endpoint == Some(endpoint))
            .cloned()
            .collect()
    }

    /// The next `count` calls of `endpoint` get `failure` instead of their answer.
    pub fn fail_next(&self, endpoint: Endpoint, count: usize, failure: Failure) {
        self.shared.lock().injected.push_back(Injected {
            endpoint,
            failure,
            remaining: count,
        });
    }

    /// Calls of `endpoint` do their work, then wait for [`FakeGitHub::release`] before answering.
    pub fn hold(&self, endpoint: Endpoint) {
        self.shared.lock().held.insert(endpoint);
        self.shared.changed();
    }

    /// The next `passing` calls of `endpoint` are answered; the ones after them are held as by
    /// [`FakeGitHub::hold`] (until [`FakeGitHub::release`]).
    pub fn hold_after(&self, endpoint: Endpoint, passing: usize) {
        self.shared.lock().hold_after.insert(endpoint, passing);
        self.shared.changed();
    }

    /// Adds `latency` before every answer.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.shared.lock().latency = latency;
    }

    /// Lets held answers of `endpoint` go.
    pub fn release(&self, endpoint: Endpoint) {
        self.shared.lock().held.remove(&endpoint);
        self.shared.changed();
    }

    /// Waits until `probe` returns `Some` (checked after every change of the fake); panics
    /// after `timeout`, naming `what`.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(&FakeGitHub) -> Option<T>,
    ) -> T {
        let mut version = self.shared.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            version.borrow_and_update();
            if let Some(found) = probe(self) {
                return found;
            }
            if tokio::time::timeout_at(deadline, version.changed())
                .await
                .is_err()
            {
                panic!("fake GitHub: timed out after {timeout:?} waiting for {what}");
            }
        }
    }
}

impl FakeState {
    fn issue(&self, repo: &str, number: u64) -> Option<&Issue> {
        self.issues.get(&repo.to_lowercase())?.get(&number)
    }

    fn repo_exists(&self, repo: &str) -> bool {
        self.issues.contains_key(&repo.to_lowercase())
    }

    fn create_issue(&mut self, repo: &str, title: &str, body: &str, user: User) -> Issue {
        let id = self.next_issue_id;
        self.next_issue_id += 1;
        let issues = self.issues.entry(repo.to_lowercase()).or_default();
        let number = issues.keys().next_back().map_or(1, |last| last + 1);
        let now = now_seconds();
        let issue = Issue {
            repo: repo.to_string(),
            number,
            id,
            title: title.to_string(),
            body: body.to_string(),
            user,
            state: "open".to_string(),
            created_at: now,
            updated_at: now,
        };
        issues.insert(number, issue.clone());
        issue
    }

    fn create_comment(&mut self, repo: &str, issue: u64, user: User, body: &str) -> Comment {
        let id = self.next_comment_id;
        self.next_comment_id += 1;
        let now = now_seconds();
        let comment = Comment {
            id,
            repo: repo.to_string(),
            issue,
            user,
            body: body.to_string(),
            created_at: now,
            updated_at: now,
        };
        self.comments.insert(id, comment.clone());
        comment
    }

    fn user_for_token(&self, token: &str) -> Option<User> {
        if token == DEFAULT_TOKEN {
            Some(self.bot.clone())
        } else if self.tokens.contains(token) {
            Some(self.app_bot.clone())
        } else {
            None
        }
    }

    fn take_failure(&mut self, endpoint: Endpoint) -> Option<Failure> {
        let position = self
            .injected
            .iter()
            .position(|injected| injected.endpoint == endpoint && injected.remaining > 0)?;
        let injected = &mut self.injected[position];
        injected.remaining -= 1;
        let failure = injected.failure;
        if injected.remaining == 0 {
            self.injected.remove(position);
        }
        Some(failure)
    }

    fn rate_headers(&mut self) -> Vec<(&'static str, String)> {
        self.rate_used += 1;
        let reset = match self.rate_limited_until {
            Some(until) => until,
            None => now_seconds() + time::Duration::hours(1),
        };
        let remaining = if self.rate_limited_until.is_some() {
            0
        } else {
            RATE_LIMIT.saturating_sub(self.rate_used)
        };
        vec![
            ("x-ratelimit-limit", RATE_LIMIT.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-reset", reset.unix_timestamp().to_string()),
            (
                "x-ratelimit-used",
                self.rate_used.min(RATE_LIMIT).to_string(),
            ),
            ("x-ratelimit-resource", "core".to_string()),
        ]
    }
}

fn now_seconds() -> OffsetDateTime {
    // GitHub timestamps have one-second precision.
    OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| OffsetDateTime::now_utc())
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// The answer of the fake, before the common headers are added.
struct Answer {
    status: StatusCode,
    body: Value,
    headers: Vec<(&'static str, String)>,
}

impl Answer {
    fn json(status: StatusCode, body: Value) -> Answer {
        Answer {
            status,
            body,
            headers: Vec::new(),
        }
    }

    fn error(status: StatusCode, message: &str) -> Answer {
        Answer::json(
            status,
            json!({
                "message": message,
                "documentation_url": DOCS_URL,
                "status": status.as_u16().to_string(),
            }),
        )
    }

    fn not_found() -> Answer {
        Answer::error(StatusCode::NOT_FOUND, "Not Found")
    }

    fn validation_failed(message: &str) -> Answer {
        Answer::error(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
}

/// The request as routed: the endpoint and its path parameters.
enum Route {
    ListComments { repo: String, number: u64 },
    CreateComment { repo: String, number: u64 },
    GetComment { repo: String, id: u64 },
    UpdateComment { repo: String, id: u64 },
    CreateReaction { repo: String, id: u64 },
    GetPermission { repo: String, login: String },
    CreateIssue { repo: String },
    ListIssues { repo: String },
    GetIssue { repo: String, number: u64 },
    UpdateIssue { repo: String, number: u64 },
    CreateInstallationToken,
    GetAuthenticatedUser,
    GetRepository { repo: String },
}

impl Route {
    fn endpoint(&self) -> Endpoint {
        match self {
            Route::ListComments { .. } => Endpoint::ListComments,
            Route::CreateComment { .. } => Endpoint::CreateComment,
            Route::GetComment { .. } => Endpoint::GetComment,
            Route::UpdateComment { .. } => Endpoint::UpdateComment,
            Route::CreateReaction { .. } => Endpoint::CreateReaction,
            Route::GetPermission { .. } => Endpoint::GetPermission,
            Route::CreateIssue { .. } => Endpoint::CreateIssue,
            Route::ListIssues { .. } => Endpoint::ListIssues,
            Route::GetIssue { .. } => Endpoint::GetIssue,
            Route::UpdateIssue { .. } => Endpoint::UpdateIssue,
            Route::CreateInstallationToken => Endpoint::CreateInstallationToken,
            Route::GetAuthenticatedUser => Endpoint::GetAuthenticatedUser,
            Route::GetRepository { .. } => Endpoint::GetRepository,
        }
    }

    fn is_write(&self) -> bool {
        !matches!(
            self,
            Route::ListComments { .. }
                | Route::GetComment { .. }
                | Route::GetPermission { .. }
                | Route::ListIssues { .. }
                | Route::GetIssue { .. }
                | Route::GetAuthenticatedUser
                | Route::GetRepository { .. }
        )
    }

    fn parse(method: &Method, path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let get = method == Method::GET;
        let post = method == Method::POST;
        let patch = method == Method::PATCH;
        match segments.as_slice() {
            ["app", "installations", _, "access_tokens"] if post => {
                Some(Route::CreateInstallationToken)
            }
            ["user"] if get => Some(Route::GetAuthenticatedUser),
            ["repos", owner, repo, rest @ ..] => {
                let repo = format!("{owner}/{repo}");
                match rest {
                    [] if get => Some(Route::GetRepository { repo }),
                    ["issues"] if post => Some(Route::CreateIssue { repo }),
                    ["issues"] if get => Some(Route::ListIssues { repo }),
                    ["issues", "comments", id] if patch => Some(Route::UpdateComment {
                        repo,
                        id: id.parse().ok()?,
                    }),
                    ["issues", "comments", id] if get => Some(Route::GetComment {
                        repo,
                        id: id.parse().ok()?,
                    }),
                    ["issues", "comments", id, "reactions"] if post => {
                        Some(Route::CreateReaction {
                            repo,
                            id: id.parse().ok()?,
                        })
                    }
                    ["issues", number, "comments"] if get || post => {
                        let number = number.parse().ok()?;
                        Some(if get {
                            Route::ListComments { repo, number }
                        } else {
                            Route::CreateComment { repo, number }
                        })
                    }
                    ["issues", number] if patch => Some(Route::UpdateIssue {
                        repo,
                        number: number.parse().ok()?,
                    }),
                    ["issues", number] if get => Some(Route::GetIssue {
                        repo,
                        number: number.parse().ok()?,
                    }),
                    ["collaborators", login, "permission"] if get => Some(Route::GetPermission {
                        repo,
                        login: login.to_string(),
                    }),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

async fn handle(
    AxumState(shared): AxumState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = Route::parse(&method, uri.path());
    let authorization = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let index = {
        let mut state = shared.lock();
        state.requests.push(RecordedRequest {
            method: method.to_string(),
            path: uri.path().to_string(),
            query: uri.query().map(str::to_string),
            authorization: authorization.clone(),
            body: String::from_utf8_lossy(&body).into_owned(),
            endpoint: route.as_ref().map(Route::endpoint),
            status: 0,
            received_at: Instant::now(),
        });
        state.requests.len() - 1
    };
    shared.changed();

    let latency = shared.lock().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let answer = answer(&shared, route, authorization.as_deref(), uri.query(), &body).await;

    let mut state = shared.lock();
    state.requests[index].status = answer.status.as_u16();
    let mut response = (answer.status, axum::Json(answer.body)).into_response();
    let response_headers = response.headers_mut();
    for (name, value) in recorded_headers() {
        response_headers.insert(name, value);
    }
    for (name, value) in state.rate_headers().into_iter().chain(answer.headers) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response_headers.insert(HeaderName::from_static(name), value);
        }
    }
    drop(state);
    shared.changed();
    response
}

/// The static response headers of the recorded comment creation (server, media type, CORS...),
/// without the per-request ones (date, etag, rate limit, request id, location).
fn recorded_headers() -> Vec<(HeaderName, HeaderValue)> {
    let mapping: Value = serde_json::from_str(COMMENT_MAPPING_JSON).expect("mapping fixture");
    let per_request = [
        "date",
        "etag",
        "location",
        "vary",
        "x-github-request-id",
        "github-authentication-token-expiration",
    ];
    let mut headers = Vec::new();
    if let Some(recorded) = mapping["response"]["headers"].as_object() {
        for (name, value) in recorded {
            let lower = name.to_lowercase();
            if per_request.contains(&lower.as_str()) || lower.starts_with("x-ratelimit") {
                continue;
            }
            if let (Ok(name), Some(Ok(value))) = (
                HeaderName::try_from(lower.as_str()),
                value.as_str().map(HeaderValue::from_str),
            ) {
                headers.push((name, value));
            }
        }
    }
    headers
}

async fn answer(
    shared: &Shared,
    route: Option<Route>,
    authorization: Option<&str>,
    query: Option<&str>,
    body: &[u8],
) -> Answer {
    let Some(route) = route else {
        return Answer::not_found();
    };
    let endpoint = route.endpoint();
    let failure = {
        let mut state = shared.lock();
        let token = authorization.and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("token "))
        });
        let caller = match (&route, token) {
            // The installation-token exchange is authenticated with the app's JWT.
            (Route::CreateInstallationToken, Some(jwt)) if jwt.split('.').count() == 3 => {
                Some(state.app_bot.clone())
            }
            (_, Some(token)) => state.user_for_token(token),
            (_, None) => None,
        };
        if caller.is_none() {
            return Answer::error(StatusCode::UNAUTHORIZED, "Bad credentials");
        }
        if let Some(until) = state.rate_limited_until {
            if until > OffsetDateTime::now_utc() {
                return primary_rate_limit_answer(&state.bot, until);
            }
            state.rate_limited_until = None;
        }
        state.take_failure(endpoint)
    };
    let answer_instead = match failure {
        None => None,
        Some(Failure::SecondaryRateLimit { retry_after_secs }) => {
            let mut answer = Answer::error(
                StatusCode::FORBIDDEN,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID DC91:9FDD:4F1C506:505FE5A:632C3D72.",
            );
            answer.body["documentation_url"] = json!("https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits");
            answer
                .headers
                .push(("retry-after", retry_after_secs.to_string()));
            Some(answer)
        }
        Some(Failure::TooManyRequests { retry_after_secs }) => {
            let mut answer = Answer::error(
                StatusCode::TOO_MANY_REQUESTS,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            );
            answer
                .headers
                .push(("retry-after", retry_after_secs.to_string()));
            Some(answer)
        }
        Some(Failure::PrimaryRateLimit { reset_after_secs }) => {
            let mut state = shared.lock();
            let secs = i64::try_from(reset_after_secs).unwrap_or(i64::MAX);
            let until = now_seconds() + time::Duration::seconds(secs);
            state.rate_limited_until = Some(until);
            Some(primary_rate_limit_answer(&state.bot, until))
        }
        Some(Failure::BadGateway) => Some(Answer::error(StatusCode::BAD_GATEWAY, "Server Error")),
        Some(Failure::Gone) => Some(Answer::error(StatusCode::GONE, "This issue was deleted")),
        Some(Failure::BadGatewayAfterWrite) => None,
        Some(Failure::BodyRefused) => {
            let too_long = "x".repeat(MAX_BODY_CHARS + 1);
            checked_body(too_long, "IssueComment").err()
        }
    };
    if let Some(answer) = answer_instead {
        return answer;
    }
    let is_write = route.is_write();
    let answer = {
        let mut state = shared.lock();
        let caller = authorization
            .and_then(|value| {
                value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("token "))
            })
            .and_then(|token| state.user_for_token(token))
            .unwrap_or_else(|| state.app_bot.clone());
        match state.hold_after.get_mut(&endpoint) {
            Some(0) => {
                state.hold_after.remove(&endpoint);
                state.held.insert(endpoint);
            }
            Some(passing) => *passing -= 1,
            None => {}
        }
        serve(&mut state, route, caller, query, body)
    };
    shared.changed();
    wait_while_held(shared, endpoint).await;
    if failure == Some(Failure::BadGatewayAfterWrite) && is_write {
        return Answer::error(StatusCode::BAD_GATEWAY, "Server Error");
    }
    answer
}

fn primary_rate_limit_answer(bot: &User, until: OffsetDateTime) -> Answer {
    let mut answer = Answer::error(
        StatusCode::FORBIDDEN,
        &format!("API rate limit exceeded for user ID {}.", bot.id),
    );
    answer.body["documentation_url"] = json!(
        "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-the-primary-rate-limit"
    );
    // The common rate headers report remaining 0 and this reset while the limit holds.
    answer
        .headers
        .push(("x-ratelimit-reset", until.unix_timestamp().to_string()));
    answer
}

async fn wait_while_held(shared: &Shared, endpoint: Endpoint) {
    let mut version = shared.version.subscribe();
    loop {
        version.borrow_and_update();
        if !shared.lock().held.contains(&endpoint) {
            return;
        }
        if version.changed().await.is_err() {
            return;
        }
    }
}

fn query_params(query: Option<&str>) -> HashMap<String, String> {
    let mut params = HashMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        params.insert(percent_decode(name), percent_decode(value));
    }
    params
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        decoded.push(byte);
                        i += 3;
                    }
                    None => {
                        decoded.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                decoded.push(b' ');
                i += 1;
            }
            byte => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

fn parse_body(body: &[u8]) -> Result<Value, Answer> {
    serde_json::from_slice(body)
        .map_err(|_| Answer::error(StatusCode::BAD_REQUEST, "Problems parsing JSON"))
}

/// GitHub's limit on a comment or issue body, in characters.
pub const MAX_BODY_CHARS: usize = 65_536;

/// The `body` of a comment or issue, refused like GitHub refuses it when too long: 422
/// "Validation Failed" with the field error.
fn checked_body(text: String, resource: &str) -> Result<String, Answer> {
    if text.chars().count() <= MAX_BODY_CHARS {
        return Ok(text);
    }
    Err(Answer::json(
        StatusCode::UNPROCESSABLE_ENTITY,
        json!({
            "message": "Validation Failed",
            "errors": [{
                "resource": resource,
                "code": "custom",
                "field": "body",
                "message": format!("body is too long (maximum is {MAX_BODY_CHARS} characters)"),
            }],
            "documentation_url": DOCS_URL,
            "status": "422",
        }),
    ))
}

fn required_string(body: &Value, field: &str) -> Result<String, Answer> {
    body[field].as_str().map(str::to_string).ok_or_else(|| {
        Answer::validation_failed(&format!("Invalid request.\n\n\"{field}\" wasn't supplied."))
    })
}

/// Pagination as GitHub does it: `per_page` (default 30, at most 100), `page` from 1, and a
/// `Link` header naming the next and last pages.
fn paginate(
    items: Vec<Value>,
    params: &HashMap<String, String>,
    base_url: &str,
    path: &str,
) -> Answer {
    let per_page = params
        .get("per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page = params
        .get("page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let start = (page - 1).saturating_mul(per_page).min(items.len());
    let end = (start + per_page).min(items.len());
    let mut answer = Answer::json(StatusCode::OK, Value::Array(items[start..end].to_vec()));
    if page < last {
        let mut other: Vec<String> = params
            .iter()
            .filter(|(name, _)| name.as_str() != "page")
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        other.sort();
        let prefix = if other.is_empty() {
            String::new()
        } else {
            format!("{}&", other.join("&"))
        };
        answer.headers.push((
            "link",
            format!(
                "<{base_url}{path}?{prefix}page={}>; rel=\"next\", <{base_url}{path}?{prefix}page={last}>; rel=\"last\"",
                page + 1
            ),
        ));
    }
    answer
}

fn serve(
    state: &mut FakeState,
    route: Route,
    caller: User,
    query: Option<&str>,
    body: &[u8],
) -> Answer {
    let base_url = state.base_url.clone();
    match route {
        Route::GetAuthenticatedUser => Answer::json(StatusCode::OK, user_json(&caller)),
        Route::GetRepository { repo } => {
            if !state.repo_exists(&repo) {
                return Answer::not_found();
            }
            repository_json(&base_url, &repo)
        }
        Route::ListComments { repo, number } => {
            if state.issue(&repo, number).is_none() {
                return Answer::not_found();
            }
            let params = query_params(query);
            let since = match params.get("since") {
                Some(since) => match OffsetDateTime::parse(since, &Rfc3339) {
                    Ok(since) => Some(since),
                    Err(_) => {
                        return Answer::validation_failed(&format!(
                            "Invalid value for `since`: {since}"
                        ))
                    }
                },
                None => None,
            };
            // `since` compares with updated_at, inclusively, at one-second precision; the list
            // is in ascending order of creation.
            let items: Vec<Value> = state
                .comments
                .values()
                .filter(|c| c.repo.eq_ignore_ascii_case(&repo) && c.issue == number)
                .filter(|c| since.is_none_or(|since| c.updated_at >= since))
                .map(|c| comment_json(&base_url, c, state))
                .collect();
            let path = format!("/repos/{repo}/issues/{number}/comments");
            paginate(items, &params, &base_url, &path)
        }
        Route::CreateComment { repo, number } => {
            if state.issue(&repo, number).is_none() {
                return Answer::not_found();
            }
            let text = match parse_body(body)
                .and_then(|b| required_string(&b, "body"))
                .and_then(|text| checked_body(text, "IssueComment"))
            {
                Ok(text) => text,
                Err(answer) => return answer,
            };
            let repo_name = state
                .issue(&repo, number)
                .map(|issue| issue.repo.clone())
                .unwrap_or(repo);
            let comment = state.create_comment(&repo_name, number, caller, &text);
            let mut answer = Answer::json(
                StatusCode::CREATED,
                comment_json(&base_url, &comment, state),
            );
            answer.headers.push((
                "location",
                format!(
                    "{base_url}/repos/{repo_name}/issues/comments/{}",
                    comment.id
                ),
            ));
            answer
        }
        Route::GetComment { repo, id } => match state.comments.get(&id) {
            Some(comment) if comment.repo.eq_ignore_ascii_case(&repo) => {
                let comment = comment.clone();
                Answer::json(StatusCode::OK, comment_json(&base_url, &comment, state))
            }
            _ => Answer::not_found(),
        },
        Route::UpdateComment { repo, id } => {
            let text = match parse_body(body)
                .and_then(|b| required_string(&b, "body"))
                .and_then(|text| checked_body(text, "IssueComment"))
            {
                Ok(text) => text,
                Err(answer) => return answer,
            };
            let Some(comment) = state.comments.get_mut(&id) else {
                return Answer::not_found();
            };
            if !comment.repo.eq_ignore_ascii_case(&repo) {
                return Answer::not_found();
            }
            if comment.user.id != caller.id {
                return Answer::error(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by integration",
                );
            }
            comment.body = text;
            comment.updated_at = now_seconds();
            let comment = comment.clone();
            Answer::json(StatusCode::OK, comment_json(&base_url, &comment, state))
        }
        Route::CreateReaction { repo, id } => {
            let content = match parse_body(body).and_then(|b| required_string(&b, "content")) {
                Ok(content) => content,
                Err(answer) => return answer,
            };
            if !REACTION_CONTENTS.contains(&content.as_str()) {
                return Answer::validation_failed("Validation Failed");
            }
            match state.comments.get(&id) {
                Some(comment) if comment.repo.eq_ignore_ascii_case(&repo) => {}
                _ => return Answer::not_found(),
            }
            // The same reaction by the same user again: 200 with the existing one.
            if let Some(existing) = state
                .reactions
                .iter()
                .find(|r| r.comment_id == id && r.user.id == caller.id && r.content == content)
            {
                return Answer::json(StatusCode::OK, reaction_json(existing));
            }
            let reaction = Reaction {
                id: state.next_reaction_id,
                comment_id: id,
                user: caller,
                content,
            };
            state.next_reaction_id += 1;
            state.reactions.push(reaction.clone());
            Answer::json(StatusCode::CREATED, reaction_json(&reaction))
        }
        Route::GetPermission { repo, login } => {
            if !state.repo_exists(&repo) {
                return Answer::not_found();
            }
            let Some(user) = state.users.get(&login.to_lowercase()).cloned() else {
                return Answer::error(StatusCode::NOT_FOUND, &format!("{login} is not a user"));
            };
            let (role, shape) = state
                .permissions
                .get(&(repo.to_lowercase(), login.to_lowercase()))
                .copied()
                .unwrap_or((Role::Read, PermissionShape::Modern));
            Answer::json(StatusCode::OK, permission_json(&user, role, shape))
        }
        Route::CreateIssue { repo } => {
            if !state.repo_exists(&repo) {
                return Answer::not_found();
            }
            let body = match parse_body(body) {
                Ok(body) => body,
                Err(answer) => return answer,
            };
            let title = match required_string(&body, "title") {
                Ok(title) => title,
                Err(answer) => return answer,
            };
            let text = match checked_body(
                body["body"].as_str().unwrap_or_default().to_string(),
                "Issue",
            ) {
                Ok(text) => text,
                Err(answer) => return answer,
            };
            let issue = state.create_issue(&repo, &title, &text, caller);
            let mut answer = Answer::json(StatusCode::CREATED, issue_json(&base_url, &issue));
            answer.headers.push((
                "location",
                format!("{base_url}/repos/{}/issues/{}", issue.repo, issue.number),
            ));
            answer
        }
        Route::ListIssues { repo } => {
            let Some(issues) = state.issues.get(&repo.to_lowercase()) else {
                return Answer::not_found();
            };
            let params = query_params(query);
            let wanted_state = params.get("state").map_or("open", String::as_str);
            let creator = params.get("creator");
            let ascending = params.get("direction").is_some_and(|d| d == "asc");
            let mut items: Vec<&Issue> = issues
                .values()
                .filter(|i| wanted_state == "all" || i.state == wanted_state)
                .filter(|i| creator.is_none_or(|c| i.user.login.eq_ignore_ascii_case(c)))
                .collect();
            if !ascending {
                items.reverse();
            }
            let items = items
                .into_iter()
                .map(|i| issue_json(&base_url, i))
                .collect();
            paginate(items, &params, &base_url, &format!("/repos/{repo}/issues"))
        }
        Route::GetIssue { repo, number } => match state.issue(&repo, number) {
            Some(issue) => Answer::json(StatusCode::OK, issue_json(&base_url, issue)),
            None => Answer::not_found(),
        },
        Route::UpdateIssue { repo, number } => {
            let body = match parse_body(body) {
                Ok(body) => body,
                Err(answer) => return answer,
            };
            if let Some(text) = body["body"].as_str() {
                if let Err(answer) = checked_body(text.to_string(), "Issue") {
                    return answer;
                }
            }
            let Some(issue) = state
                .issues
                .get_mut(&repo.to_lowercase())
                .and_then(|issues| issues.get_mut(&number))
            else {
                return Answer::not_found();
            };
            if let Some(text) = body["body"].as_str() {
                issue.body = text.to_string();
            }
            if let Some(title) = body["title"].as_str() {
                issue.title = title.to_string();
            }
            if let Some(new_state) = body["state"].as_str() {
                issue.state = new_state.to_string();
            }
            issue.updated_at = now_seconds();
            let issue = issue.clone();
            Answer::json(StatusCode::OK, issue_json(&base_url, &issue))
        }
        Route::CreateInstallationToken => {
            let token = format!(
                "ghs_fakeInstallationToken{:016}",
                state.next_installation_token
            );
            state.next_installation_token += 1;
            state.tokens.insert(token.clone());
            let expires_at = now_seconds() + time::Duration::hours(1);
            Answer::json(
                StatusCode::CREATED,
                json!({
                    "token": token,
                    "expires_at": rfc3339(expires_at),
                    "permissions": {"issues": "write", "metadata": "read", "pull_requests": "write"},
                    "repository_selection": "all",
                }),
            )
        }
    }
}

/// Replaces every occurrence of `from` in the string values of `value`.
fn replace_in_strings(value: &mut Value, from: &str, to: &str) {
    match value {
        Value::String(text) if text.contains(from) => {
            *text = text.replace(from, to);
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| replace_in_strings(item, from, to)),
        Value::Object(fields) => fields
            .values_mut()
            .for_each(|field| replace_in_strings(field, from, to)),
        _ => {}
    }
}

/// A user object in the shape of the recorded ones, for `user`.
/// The fields of `GET /repos/{owner}/{repo}` that clients read.
fn repository_json(base_url: &str, repo: &str) -> Answer {
    let (owner, name) = repo.split_once('/').unwrap_or((repo, repo));
    Answer::json(
        StatusCode::OK,
        json!({
            "id": 1_296_269,
            "name": name,
            "full_name": repo,
            "owner": {"login": owner, "type": "Organization"},
            "private": false,
            "url": format!("{base_url}/repos/{repo}"),
            "has_issues": true,
        }),
    )
}

pub fn user_json(user: &User) -> Value {
    let template: Value = serde_json::from_str(COMMENT_JSON).expect("comment fixture");
    let mut json = template["user"].clone();
    let recorded_login = json["login"].as_str().unwrap_or_default().to_string();
    let recorded_id = json["id"].to_string();
    replace_in_strings(&mut json, &recorded_login, &user.login);
    replace_in_strings(
        &mut json,
        &format!("/u/{recorded_id}"),
        &format!("/u/{}", user.id),
    );
    json["id"] = json!(user.id);
    json["node_id"] = json!(format!("U_fake{}", user.id));
    json["type"] = json!(user.kind.as_str());
    json
}

fn reactions_summary(base_url: &str, comment: &Comment, state: &FakeState) -> Value {
    let mut summary = json!({
        "url": format!("{base_url}/repos/{}/issues/comments/{}/reactions", comment.repo, comment.id),
        "total_count": 0,
    });
    let mut total = 0;
    for content in REACTION_CONTENTS {
        let count = state
            .reactions
            .iter()
            .filter(|r| r.comment_id == comment.id && r.content == content)
            .count();
        total += count;
        summary[content] = json!(count);
    }
    summary["total_count"] = json!(total);
    summary
}

fn comment_json(base_url: &str, comment: &Comment, state: &FakeState) -> Value {
    let mut json: Value = serde_json::from_str(COMMENT_JSON).expect("comment fixture");
    let repo = &comment.repo;
    json["url"] = json!(format!(
        "{base_url}/repos/{repo}/issues/comments/{}",
        comment.id
    ));
    json["html_url"] = json!(format!(
        "{base_url}/{repo}/issues/{}#issuecomment-{}",
        comment.issue, comment.id
    ));
    json["issue_url"] = json!(format!("{base_url}/repos/{repo}/issues/{}", comment.issue));
    json["id"] = json!(comment.id);
    json["node_id"] = json!(format!("IC_fake{}", comment.id));
    json["user"] = user_json(&comment.user);
    json["created_at"] = json!(rfc3339(comment.created_at));
    json["updated_at"] = json!(rfc3339(comment.updated_at));
    json["body"] = json!(comment.body);
    json["reactions"] = reactions_summary(base_url, comment, state);
    json
}

fn reaction_json(reaction: &Reaction) -> Value {
    let mut json: Value = serde_json::from_str(REACTION_JSON).expect("reaction fixture");
    json["id"] = json!(reaction.id);
    json["node_id"] = json!(format!("REA_fake{}", reaction.id));
    json["user"] = user_json(&reaction.user);
    json["content"] = json!(reaction.content);
    json["created_at"] = json!(rfc3339(now_seconds()));
    json
}

fn issue_json(base_url: &str, issue: &Issue) -> Value {
    let mut json: Value = serde_json::from_str(ISSUE_JSON).expect("issue fixture");
    replace_in_strings(&mut json, "https://api.github.com", base_url);
    replace_in_strings(&mut json, "https://github.com", base_url);
    replace_in_strings(&mut json, "hub4j-test-org/GHIssueTest", &issue.repo);
    replace_in_strings(&mut json, "/issues/4", &format!("/issues/{}", issue.number));
    json["id"] = json!(issue.id);
    json["node_id"] = json!(format!("I_fake{}", issue.id));
    json["number"] = json!(issue.number);
    json["title"] = json!(issue.title);
    json["body"] = json!(issue.body);
    json["user"] = user_json(&issue.user);
    json["state"] = json!(issue.state);
    json["created_at"] = json!(rfc3339(issue.created_at));
    json["updated_at"] = json!(rfc3339(issue.updated_at));
    json
}

fn permission_json(user: &User, role: Role, shape: PermissionShape) -> Value {
    match shape {
        PermissionShape::Legacy => {
            let mut json: Value =
                serde_json::from_str(PERMISSION_LEGACY_JSON).expect("legacy permission fixture");
            json["permission"] = json!(role.documented_permission());
            json["user"] = legacy_user_json(&json["user"], user);
            json
        }
        PermissionShape::Modern | PermissionShape::ModernUnmapped => {
            let mut json: Value =
                serde_json::from_str(PERMISSION_MODERN_JSON).expect("modern permission fixture");
            let permission = if shape == PermissionShape::Modern {
                role.documented_permission()
            } else {
                role.name()
            };
            let mut user_object = legacy_user_json(&json["user"], user);
            user_object["permissions"] = json!({
                "admin": role == Role::Admin,
                "maintain": matches!(role, Role::Admin | Role::Maintain),
                "push": matches!(role, Role::Admin | Role::Maintain | Role::Write),
                "triage": !matches!(role, Role::Read | Role::None),
                "pull": role != Role::None,
            });
            user_object["role_name"] = json!(role.name());
            json["permission"] = json!(permission);
            json["role_name"] = json!(role.name());
            json["user"] = user_object;
            json
        }
    }
}

/// The fixture's user object with `user`'s login and id.
fn legacy_user_json(template: &Value, user: &User) -> Value {
    let mut json = template.clone();
    let recorded_login = json["login"].as_str().unwrap_or_default().to_string();
    replace_in_strings(&mut json, &recorded_login, &user.login);
    json["id"] = json!(user.id);
    json["node_id"] = json!(format!("U_fake{}", user.id));
    json["type"] = json!(user.kind.as_str());
    json
}

/// `sha256=<hex HMAC-SHA256 of body>`, the `X-Hub-Signature-256` GitHub sends.
pub fn sign_webhook(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// What happened to the comment, as the `action` of an `issue_comment` delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommentAction {
    Created,
    /// `changes.body.from` holds the given previous body.
    Edited,
    Deleted,
}

/// The body of an `issue_comment` delivery about `comment` (repository, issue, comment,
/// sender), built from the published payload example for the action and compacted as GitHub
/// sends it. `previous_body` fills `changes.body.from` for an edit.
pub fn issue_comment_payload(
    fake: &FakeGitHub,
    action: CommentAction,
    comment: &Comment,
    previous_body: Option<&str>,
) -> Vec<u8> {
    let template = match action {
        CommentAction::Created => WEBHOOK_COMMENT_CREATED_JSON,
        CommentAction::Edited => WEBHOOK_COMMENT_EDITED_JSON,
        CommentAction::Deleted => WEBHOOK_COMMENT_DELETED_JSON,
    };
    let mut payload: Value = serde_json::from_str(template).expect("webhook fixture");
    fill_comment_payload(fake, &mut payload, comment);
    payload["sender"] = user_json(&comment.user);
    if action == CommentAction::Edited {
        payload["changes"]["body"]["from"] = json!(previous_body.unwrap_or_default());
    }
    serde_json::to_vec(&payload).expect("serialize webhook payload")
}

/// The body of the `issue_comment` `created` delivery captured from a GitHub App bot
/// (`gagbo-test-app[bot]`, type Bot), moved to `comment`'s repository, issue, id and body; the
/// author stays the captured bot.
pub fn captured_bot_comment_payload(fake: &FakeGitHub, comment: &Comment) -> Vec<u8> {
    let mut payload: Value =
        serde_json::from_str(WEBHOOK_BOT_COMMENT_CREATED_JSON).expect("webhook fixture");
    let bot_user = payload["comment"]["user"].clone();
    fill_comment_payload(fake, &mut payload, comment);
    payload["comment"]["user"] = bot_user;
    serde_json::to_vec(&payload).expect("serialize webhook payload")
}

fn fill_comment_payload(fake: &FakeGitHub, payload: &mut Value, comment: &Comment) {
    let state = fake.shared.lock();
    let base_url = state.base_url.clone();
    let recorded_repo = payload["repository"]["full_name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let recorded_number = payload["issue"]["number"].as_u64().unwrap_or_default();
    replace_in_strings(&mut payload["repository"], &recorded_repo, &comment.repo);
    replace_in_strings(
        &mut payload["issue"],
        &format!("{recorded_repo}/issues/{recorded_number}"),
        &format!("{}/issues/{}", comment.repo, comment.issue),
    );
    replace_in_strings(&mut payload["issue"], &recorded_repo, &comment.repo);
    let (owner, name) = comment
        .repo
        .split_once('/')
        .expect("comment repo is owner/name");
    payload["repository"]["name"] = json!(name);
    payload["repository"]["owner"]["login"] = json!(owner);
    payload["issue"]["number"] = json!(comment.issue);
    if let Some(issue) = state.issue(&comment.repo, comment.issue) {
        payload["issue"]["id"] = json!(issue.id);
        payload["issue"]["title"] = json!(issue.title);
    }
    let author = payload["comment"]["author_association"].clone();
    payload["comment"] = comment_json(&base_url, comment, &state);
    payload["comment"]["author_association"] = author;
}

/// Posts a webhook delivery the way GitHub does and returns the status and body of the answer.
/// `signature` is the `X-Hub-Signature-256` value, or `None` to send none.
pub async fn post_webhook(
    url: &str,
    event: &str,
    delivery_id: &str,
    body: &[u8],
    signature: Option<&str>,
) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut request = axum::http::Request::post(url)
        .header("content-type", "application/json")
        .header("user-agent", "GitHub-Hookshot/7b48b1b")
        .header("x-github-event", event)
        .header("x-github-delivery", delivery_id)
        .header("x-github-hook-id", "109948940")
        .header("x-github-hook-installation-target-type", "repository");
    if let Some(signature) = signature {
        request = request.header("x-hub-signature-256", signature);
    }
    let request = request
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("webhook request");
    let response = client.request(request).await.expect("post the webhook");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("webhook answer body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST_TWO_JSON: &str =
        include_str!("../fixtures/github/rest.issue-comments.list.two.hub4j.json");
    const LIST_SINCE_JSON: &str = include_str!(
        "../fixtures/github/rest.issue-comments.list.since-equal-created_at.hub4j.json"
    );

    /// The names (recursively) of an object's fields.
    fn shape(value: &Value) -> Value {
        match value {
            Value::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(name, field)| (name.clone(), shape(field)))
                    .collect(),
            ),
            _ => Value::Null,
        }
    }

    async fn call(
        method: &str,
        url: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, HeaderMap, Value) {
        use http_body_util::{BodyExt, Full};
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;

        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let mut request = axum::http::Request::builder().method(method).uri(url);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default().to_string())))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn comments_have_the_recorded_shape_and_since_is_inclusive_to_the_second() {
        let fake = FakeGitHub::start().await;
        let number = fake.add_issue("acme/widgets", "t");
        let alice = fake.add_user("alice", UserKind::User);
        let first = fake.add_comment("acme/widgets", number, &alice, "First comment");
        let second = fake.add_comment("acme/widgets", number, &alice, "Second comment");
        let url = format!("{}/repos/acme/widgets/issues/{number}/comments", fake.url());

        let (status, headers, listed) = call("GET", &url, Some(DEFAULT_TOKEN), None).await;
        assert_eq!(status, 200);
        let recorded: Value = serde_json::from_str(LIST_TWO_JSON).unwrap();
        assert_eq!(shape(&listed[0]), shape(&recorded[0]));
        assert_eq!(listed[0]["body"], "First comment");
        assert_eq!(listed[1]["body"], "Second comment");
        assert_eq!(headers["content-type"], "application/json; charset=utf-8");
        assert!(headers.contains_key("x-ratelimit-remaining"));

        // `since` equal to created_at returns the comment, one second later does not (as
        // recorded against api.github.com).
        let recorded_since: Value = serde_json::from_str(LIST_SINCE_JSON).unwrap();
        assert_eq!(shape(&recorded_since[0]), shape(&recorded[0]));
        let at = rfc3339(second.created_at).replace(':', "%3A");
        let (_, _, same_second) = call(
            "GET",
            &format!("{url}?since={at}"),
            Some(DEFAULT_TOKEN),
            None,
        )
        .await;
        let same_second = same_second.as_array().cloned().unwrap_or_default();
        assert_eq!(
            same_second.last().map(|c| c["id"].clone()),
            Some(json!(second.id))
        );
        let later = rfc3339(second.created_at + time::Duration::seconds(1)).replace(':', "%3A");
        let (_, _, after) = call(
            "GET",
            &format!("{url}?since={later}"),
            Some(DEFAULT_TOKEN),
            None,
        )
        .await;
        assert_eq!(after, json!([]));

        let (_, headers, page) = call(
            "GET",
            &format!("{url}?per_page=1"),
            Some(DEFAULT_TOKEN),
            None,
        )
        .await;
        assert_eq!(page.as_array().map(Vec::len), Some(1));
        assert!(headers["link"]
            .to_str()
            .unwrap()
            .contains("page=2>; rel=\"next\""));

        let (status, _, error) = call("GET", &url, Some("wrong"), None).await;
        assert_eq!(
            (status, error["message"].as_str()),
            (401, Some("Bad credentials"))
        );
        // Comments are edited with PATCH; POST on that path is not an endpoint.
        let comment_url = format!(
            "{}/repos/acme/widgets/issues/comments/{}",
            fake.url(),
            first.id
        );
        let edit = Some(r#"{"body":"x"}"#);
        assert_eq!(
            call("POST", &comment_url, Some(DEFAULT_TOKEN), edit)
                .await
                .0,
            404
        );
        // Only the author may edit.
        assert_eq!(
            call("PATCH", &comment_url, Some(DEFAULT_TOKEN), edit)
                .await
                .0,
            403
        );
    }

    #[tokio::test]
    async fn injected_failures_and_reactions() {
        let fake = FakeGitHub::start().await;
        let number = fake.add_issue("acme/widgets", "t");
        let url = format!("{}/repos/acme/widgets/issues/{number}/comments", fake.url());
        fake.fail_next(
            Endpoint::CreateComment,
            1,
            Failure::SecondaryRateLimit {
                retry_after_secs: 3,
            },
        );
        let body = Some(r#"{"body":"hello"}"#);
        let (status, headers, error) = call("POST", &url, Some(DEFAULT_TOKEN), body).await;
        assert_eq!(status, 403);
        assert_eq!(headers["retry-after"], "3");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("secondary rate limit"));
        assert!(fake.comments("acme/widgets", number).is_empty());

        let (status, _, created) = call("POST", &url, Some(DEFAULT_TOKEN), body).await;
        assert_eq!(status, 201);
        let recorded: Value = serde_json::from_str(COMMENT_JSON).unwrap();
        assert_eq!(shape(&created), shape(&recorded));
        assert_eq!(created["user"]["login"], DEFAULT_BOT_LOGIN);

        let reactions = format!(
            "{}/repos/acme/widgets/issues/comments/{}/reactions",
            fake.url(),
            created["id"]
        );
        let confused = Some(r#"{"content":"confused"}"#);
        assert_eq!(
            call("POST", &reactions, Some(DEFAULT_TOKEN), confused)
                .await
                .0,
            201
        );
        assert_eq!(
            call("POST", &reactions, Some(DEFAULT_TOKEN), confused)
                .await
                .0,
            200
        );
        let bad = Some(r#"{"content":"shrug"}"#);
        assert_eq!(
            call("POST", &reactions, Some(DEFAULT_TOKEN), bad).await.0,
            422
        );

        fake.fail_next(
            Endpoint::ListComments,
            1,
            Failure::PrimaryRateLimit {
                reset_after_secs: 60,
            },
        );
        let (status, headers, _) = call("GET", &url, Some(DEFAULT_TOKEN), None).await;
        assert_eq!(status, 403);
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        // The limit holds for every call until the reset.
        assert_eq!(
            call("POST", &reactions, Some(DEFAULT_TOKEN), confused)
                .await
                .0,
            403
        );
    }

    #[test]
    fn signs_like_the_documented_test_vectors() {
        assert_eq!(
            sign_webhook("It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
        assert_eq!(
            sign_webhook("my_webhook_secret", br#"{"action":"opened"}"#),
            "sha256=a8591b84025410fb80a4c1621f4bf8e9c2576e5c2c7715a04609250612010665"
        );
    }

    #[test]
    fn permission_shapes_follow_the_recordings() {
        let user = User {
            login: "alecharp".to_string(),
            id: 985955,
            kind: UserKind::User,
        };
        let recorded: Value = serde_json::from_str(PERMISSION_MODERN_JSON).unwrap();
        let mut built = permission_json(&user, Role::Maintain, PermissionShape::ModernUnmapped);
        // The recording's node id is the only field the fake makes up.
        built["user"]["node_id"] = recorded["user"]["node_id"].clone();
        assert_eq!(built, recorded);

        let legacy = permission_json(&user, Role::Read, PermissionShape::Legacy);
        assert_eq!(legacy["permission"], "read");
        assert!(legacy.get("role_name").is_none());
        assert!(legacy["user"].get("permissions").is_none());

        let documented = permission_json(&user, Role::Maintain, PermissionShape::Modern);
        assert_eq!(documented["permission"], "write");
        assert_eq!(documented["role_name"], "maintain");
    }

    #[test]
    fn percent_decoding_handles_since_values() {
        let params = query_params(Some("since=2022-09-22T10%3A48%3A18Z&per_page=100"));
        assert_eq!(params["since"], "2022-09-22T10:48:18Z");
        assert_eq!(params["per_page"], "100");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
