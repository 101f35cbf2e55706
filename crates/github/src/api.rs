//! The GitHub REST calls the worker makes, on octocrab (auth, base URL, TLS), with the
//! worker's own answer handling:
//!
//! - rate limits: a 403/429 with `Retry-After` is waited out; one with
//!   `X-RateLimit-Remaining: 0` waits until `X-RateLimit-Reset`; a secondary-limit answer without
//!   either waits a configured time; then the same request is sent again (GitHub did not act on
//!   it). A success that reports 0 remaining holds every later call until the reset.
//! - writes are spaced (about one per second against github.com), as GitHub asks of
//!   integrations to avoid secondary limits.
//! - server errors and broken connections are retried for reads and idempotent writes only. A
//!   comment or issue creation is never blindly repeated: [`GitHubApi::find_or_post_comment`]
//!   first looks for the comment carrying the approval's marker, so a crash or a lost answer
//!   never yields a second comment.

use countersign_worker::retry::{Backoff, Classify, PlatformHold, Verdict};
use std::time::Duration;

use octocrab::Octocrab;
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::permission::{parse_permission, Permission};
use crate::render::marked_approval_id;
use crate::target::{IssueRef, RepoName};

/// How the worker authenticates to GitHub.
#[derive(Clone)]
pub enum GitHubAuth {
    /// A personal access token (classic or fine-grained) of the bot account.
    Token(String),
    /// A GitHub App installation: the app's id and RSA private key (PEM), and the installation.
    App {
        app_id: u64,
        private_key_pem: String,
        installation_id: u64,
    },
}

impl std::fmt::Debug for GitHubAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GitHubAuth::Token(_) => f.write_str("Token(<redacted>)"),
            GitHubAuth::App {
                app_id,
                installation_id,
                ..
            } => write!(
                f,
                "App {{ app_id: {app_id}, installation_id: {installation_id}, private_key_pem: <redacted> }}"
            ),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GitHubSettings {
    /// `https://api.github.com`, or `https://HOST/api/v3` for GitHub Enterprise Server.
    pub api_url: String,
    pub auth: GitHubAuth,
    /// The login the worker's comments appear under (`name[bot]` for an app).
    pub bot_login: String,
    /// The least time between two writes.
    pub write_interval: Duration,
    /// How long to wait after a secondary-rate-limit answer that names no time.
    pub secondary_limit_wait: Duration,
    /// Attempts per request (rate-limit waits included) before giving up.
    pub max_attempts: u32,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("GitHub answered {status} to {method} {path}: {message}")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        message: String,
    },
    #[error("could not reach GitHub for {method} {path}: {detail}")]
    Transport {
        method: &'static str,
        path: String,
        detail: String,
    },
    #[error("GitHub kept rate-limiting {method} {path} after {attempts} attempts")]
    RateLimited {
        method: &'static str,
        path: String,
        attempts: u32,
    },
    #[error("unexpected answer from GitHub to {method} {path}: {detail}")]
    Decode {
        method: &'static str,
        path: String,
        detail: String,
    },
    #[error("cannot set up the GitHub client: {0}")]
    Setup(String),
}

impl Classify for ApiError {
    fn verdict(&self) -> Verdict {
        match self {
            ApiError::Transport { .. } | ApiError::RateLimited { .. } => {
                Verdict::Retry { after: None }
            }
            ApiError::Status { status, .. } => Verdict::of_http_status(*status, None),
            ApiError::Decode { .. } | ApiError::Setup(_) => Verdict::Final,
        }
    }
}

impl ApiError {
    /// True when the same call may succeed later (GitHub unreachable, overloaded or limiting).
    pub fn is_transient(&self) -> bool {
        self.verdict().is_retryable()
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A GitHub account as it appears on comments.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Author {
    pub login: String,
    pub id: u64,
    #[serde(rename = "type", default)]
    pub kind: String,
}

impl Author {
    /// App bot accounts: type `Bot`, and their logins end in `[bot]`.
    pub fn is_bot(&self) -> bool {
        self.kind.eq_ignore_ascii_case("bot") || self.login.ends_with("[bot]")
    }
}

/// An issue or pull-request comment.
#[derive(Clone, Debug, Deserialize)]
pub struct IssueComment {
    pub id: u64,
    #[serde(default)]
    pub body: Option<String>,
    /// Absent for deleted accounts.
    pub user: Option<Author>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl IssueComment {
    pub fn text(&self) -> &str {
        self.body.as_deref().unwrap_or_default()
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct IssueSummary {
    pub number: u64,
    #[serde(default)]
    pub body: Option<String>,
    pub user: Option<Author>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Reactions the worker puts on command comments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReactionContent {
    ThumbsUp,
    ThumbsDown,
    Confused,
}

impl ReactionContent {
    fn as_str(self) -> &'static str {
        match self {
            ReactionContent::ThumbsUp => "+1",
            ReactionContent::ThumbsDown => "-1",
            ReactionContent::Confused => "confused",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Get,
    Post,
    Patch,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Patch => "PATCH",
        }
    }
}

/// Whether a server error or a broken connection may be answered by sending the same request
/// again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repeatable {
    Yes,
    /// The request creates something; repeating it could create it twice.
    No,
}

struct Answer {
    status: u16,
    body: String,
}

const PAGE_SIZE: usize = 100;
/// How far before an approval's creation to look for its comment or issue: GitHub's clock
/// and the server's may disagree a little.
const CLOCK_SKEW_MARGIN: time::Duration = time::Duration::minutes(10);

pub struct GitHubApi {
    octocrab: Octocrab,
    settings: GitHubSettings,
    /// When the next write may go out.
    next_write: Mutex<Instant>,
    /// Set when GitHub reported the primary limit used up, or answered a secondary limit
    /// (403/429 with `Retry-After`): no call goes out before.
    blocked: PlatformHold,
}

/// What the worker put in place on GitHub: found by its marker (an earlier attempt or run
/// created it, so comments may have been written after it unseen) or created now.
#[derive(Debug)]
pub struct Placed<T> {
    pub item: T,
    pub found: bool,
}

impl GitHubApi {
    pub fn new(settings: GitHubSettings) -> Result<GitHubApi, ApiError> {
        let builder = Octocrab::builder()
            .base_uri(settings.api_url.as_str())
            .map_err(|error| ApiError::Setup(format!("API URL: {error}")))?
            .set_connect_timeout(Some(settings.connect_timeout))
            .set_read_timeout(Some(settings.read_timeout));
        let octocrab = match &settings.auth {
            GitHubAuth::Token(token) => builder
                .personal_token(token.clone())
                .build()
                .map_err(|error| ApiError::Setup(error.to_string()))?,
            GitHubAuth::App {
                app_id,
                private_key_pem,
                installation_id,
            } => {
                let key = octocrab::EncodingKey::from_rsa_pem(private_key_pem.as_bytes())
                    .map_err(|error| ApiError::Setup(format!("app private key: {error}")))?;
                builder
                    .app(octocrab::models::AppId(*app_id), key)
                    .build()
                    .and_then(|app| {
                        app.installation(octocrab::models::InstallationId(*installation_id))
                    })
                    .map_err(|error| ApiError::Setup(error.to_string()))?
            }
        };
        Ok(GitHubApi {
            octocrab,
            settings,
            next_write: Mutex::new(Instant::now()),
            blocked: PlatformHold::new(),
        })
    }

    pub fn bot_login(&self) -> &str {
        &self.settings.bot_login
    }

    /// True for comments by the worker itself or by any app bot.
    pub fn is_bot(&self, author: &Author) -> bool {
        author.is_bot() || author.login.eq_ignore_ascii_case(&self.settings.bot_login)
    }

    /// The comments of an issue updated at or after `since` (GitHub's `since` is inclusive,
    /// to the second, and also matches edited comments), oldest first, every page.
    pub async fn list_comments(
        &self,
        issue: &IssueRef,
        since: Option<OffsetDateTime>,
    ) -> Result<Vec<IssueComment>, ApiError> {
        let since = match since {
            Some(since) => format!("&since={}", query_time(since)),
            None => String::new(),
        };
        let mut comments = Vec::new();
        for page in 1.. {
            let path = format!(
                "/repos/{}/{}/issues/{}/comments?per_page={PAGE_SIZE}&page={page}{since}",
                issue.repo.owner(),
                issue.repo.name(),
                issue.number
            );
            let batch: Vec<IssueComment> = self.get_json(&path).await?;
            let last = batch.len() < PAGE_SIZE;
            comments.extend(batch);
            if last {
                break;
            }
        }
        Ok(comments)
    }

    /// One comment, or `None` when it no longer exists.
    pub async fn get_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
    ) -> Result<Option<IssueComment>, ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/comments/{comment_id}",
            repo.owner(),
            repo.name()
        );
        match self.get_json(&path).await {
            Ok(comment) => Ok(Some(comment)),
            Err(error) if error.status() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    pub async fn create_comment(
        &self,
        issue: &IssueRef,
        body: &str,
    ) -> Result<IssueComment, ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/{}/comments",
            issue.repo.owner(),
            issue.repo.name(),
            issue.number
        );
        let answer = self
            .send(
                Method::Post,
                &path,
                Some(&json!({ "body": body })),
                Repeatable::No,
            )
            .await?;
        decode(Method::Post, &path, &answer)
    }

    /// Edits a comment (PATCH, as the REST API documents it).
    pub async fn update_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<(), ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/comments/{comment_id}",
            repo.owner(),
            repo.name()
        );
        self.send(
            Method::Patch,
            &path,
            Some(&json!({ "body": body })),
            Repeatable::Yes,
        )
        .await?;
        Ok(())
    }

    /// Adds a reaction (GitHub answers the existing one when it is already there).
    pub async fn add_reaction(
        &self,
        repo: &RepoName,
        comment_id: u64,
        content: ReactionContent,
    ) -> Result<(), ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/comments/{comment_id}/reactions",
            repo.owner(),
            repo.name()
        );
        self.send(
            Method::Post,
            &path,
            Some(&json!({ "content": content.as_str() })),
            Repeatable::Yes,
        )
        .await?;
        Ok(())
    }

    /// The login of the account the token belongs to (`GET /user`): the one the worker
    /// comments as.
    pub async fn authenticated_login(&self) -> Result<String, ApiError> {
        #[derive(Deserialize)]
        struct Account {
            login: String,
        }
        let account: Account = self.get_json("/user").await?;
        Ok(account.login)
    }

    /// Whether `repo` exists and the token can see it (`GET /repos/{owner}/{repo}`).
    pub async fn repository_exists(&self, repo: &RepoName) -> Result<bool, ApiError> {
        let path = format!("/repos/{}/{}", repo.owner(), repo.name());
        match self.get_json::<Value>(&path).await {
            Ok(_) => Ok(true),
            Err(error) if error.status() == Some(404) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `login`'s permission on `repo`; a user GitHub does not know there has none.
    pub async fn permission(&self, repo: &RepoName, login: &str) -> Result<Permission, ApiError> {
        let path = format!(
            "/repos/{}/{}/collaborators/{}/permission",
            repo.owner(),
            repo.name(),
            path_segment(login)
        );
        match self.send(Method::Get, &path, None, Repeatable::Yes).await {
            Ok(answer) => {
                parse_permission(answer.body.as_bytes()).map_err(|error| ApiError::Decode {
                    method: "GET",
                    path,
                    detail: error.to_string(),
                })
            }
            Err(error) if error.status() == Some(404) => Ok(Permission::none()),
            Err(error) => Err(error),
        }
    }

    pub async fn create_issue(
        &self,
        repo: &RepoName,
        title: &str,
        body: &str,
    ) -> Result<IssueSummary, ApiError> {
        let path = format!("/repos/{}/{}/issues", repo.owner(), repo.name());
        let answer = self
            .send(
                Method::Post,
                &path,
                Some(&json!({ "title": title, "body": body })),
                Repeatable::No,
            )
            .await?;
        decode(Method::Post, &path, &answer)
    }

    pub async fn update_issue_body(&self, issue: &IssueRef, body: &str) -> Result<(), ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/{}",
            issue.repo.owner(),
            issue.repo.name(),
            issue.number
        );
        self.send(
            Method::Patch,
            &path,
            Some(&json!({ "body": body })),
            Repeatable::Yes,
        )
        .await?;
        Ok(())
    }

    /// One issue, or `None` when it does not exist.
    pub async fn get_issue(&self, issue: &IssueRef) -> Result<Option<IssueSummary>, ApiError> {
        let path = format!(
            "/repos/{}/{}/issues/{}",
            issue.repo.owner(),
            issue.repo.name(),
            issue.number
        );
        match self.get_json(&path).await {
            Ok(found) => Ok(Some(found)),
            Err(error) if error.status() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The worker's request comment for `approval_id` on `issue`, found by its marker among
    /// the bot's comments since shortly before `not_before`; posted only when there is none.
    pub async fn find_or_post_comment(
        &self,
        issue: &IssueRef,
        approval_id: &str,
        not_before: OffsetDateTime,
        body: &str,
    ) -> Result<Placed<IssueComment>, ApiError> {
        self.find_or_create(
            &format!("request comment for approval {approval_id} on {issue}"),
            || self.find_marked_comment(issue, approval_id, not_before),
            || self.create_comment(issue, body),
        )
        .await
        .inspect(|placed| tracing::debug!(%issue, approval_id, comment_id = placed.item.id, found = placed.found, "request comment in place"))
    }

    /// The request comment the worker wrote for `approval_id` on `issue` (by its marker).
    pub async fn find_marked_comment(
        &self,
        issue: &IssueRef,
        approval_id: &str,
        not_before: OffsetDateTime,
    ) -> Result<Option<IssueComment>, ApiError> {
        let comments = self
            .list_comments(issue, Some(not_before - CLOCK_SKEW_MARGIN))
            .await?;
        Ok(comments.into_iter().find(|comment| {
            comment
                .user
                .as_ref()
                .is_some_and(|user| user.login.eq_ignore_ascii_case(&self.settings.bot_login))
                && marked_approval_id(comment.text()) == Some(approval_id)
        }))
    }

    /// The issue the worker opened for `approval_id` in `repo`, found by the marker in its
    /// body; opened only when there is none.
    pub async fn find_or_open_issue(
        &self,
        repo: &RepoName,
        approval_id: &str,
        not_before: OffsetDateTime,
        title: &str,
        body: &str,
    ) -> Result<Placed<IssueSummary>, ApiError> {
        self.find_or_create(
            &format!("issue for approval {approval_id} in {repo}"),
            || self.find_marked_issue(repo, approval_id, not_before),
            || self.create_issue(repo, title, body),
        )
        .await
    }

    /// What an earlier attempt (or a crashed run) created, found by `find`, or else `create`.
    /// A create that fails transiently may still have succeeded (its answer lost), so before
    /// each retry the marker is looked for again: never two of the same.
    async fn find_or_create<T, Found, Created>(
        &self,
        subject: &str,
        find: impl Fn() -> Found,
        create: impl Fn() -> Created,
    ) -> Result<Placed<T>, ApiError>
    where
        Found: std::future::Future<Output = Result<Option<T>, ApiError>>,
        Created: std::future::Future<Output = Result<T, ApiError>>,
    {
        let found = |item| Placed { item, found: true };
        if let Some(item) = find().await? {
            return Ok(found(item));
        }
        let mut attempt = 1;
        loop {
            match create().await {
                Ok(item) => return Ok(Placed { item, found: false }),
                Err(error) if error.is_transient() && attempt < self.settings.max_attempts => {
                    if let Some(item) = find().await? {
                        tracing::info!(subject, "created although the answer was lost; using it");
                        return Ok(found(item));
                    }
                    tracing::warn!(subject, attempt, %error, "creating on GitHub failed; trying again");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The issue the worker opened for `approval_id` in `repo` (by the marker in its body).
    pub async fn find_marked_issue(
        &self,
        repo: &RepoName,
        approval_id: &str,
        not_before: OffsetDateTime,
    ) -> Result<Option<IssueSummary>, ApiError> {
        let since = query_time(not_before - CLOCK_SKEW_MARGIN);
        for page in 1.. {
            let path = format!(
                "/repos/{}/{}/issues?creator={}&state=all&sort=created&direction=desc&since={since}&per_page={PAGE_SIZE}&page={page}",
                repo.owner(),
                repo.name(),
                path_segment(&self.settings.bot_login)
            );
            let batch: Vec<IssueSummary> = self.get_json(&path).await?;
            let last = batch.len() < PAGE_SIZE;
            if let Some(found) = batch.into_iter().find(|issue| {
                marked_approval_id(issue.body.as_deref().unwrap_or_default()) == Some(approval_id)
            }) {
                return Ok(Some(found));
            }
            if last {
                break;
            }
        }
        Ok(None)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let answer = self.send(Method::Get, path, None, Repeatable::Yes).await?;
        decode(Method::Get, path, &answer)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        repeatable: Repeatable,
    ) -> Result<Answer, ApiError> {
        let mut attempt = 1;
        loop {
            self.blocked.wait().await;
            if method != Method::Get {
                self.pace_write().await;
            }
            let sent = match method {
                Method::Get => self.octocrab._get(path).await,
                Method::Post => self.octocrab._post(path, body).await,
                Method::Patch => self.octocrab._patch(path, body).await,
            };
            let answered = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let headers = response.headers().clone();
                    self.octocrab
                        .body_to_string(response)
                        .await
                        .map(|body| (status, headers, body))
                }
                Err(error) => Err(error),
            };
            let (status, headers, text) = match answered {
                Ok(answered) => answered,
                Err(error) => {
                    let error = ApiError::Transport {
                        method: method.as_str(),
                        path: path.to_string(),
                        detail: error.to_string(),
                    };
                    if repeatable == Repeatable::Yes && attempt < self.settings.max_attempts {
                        tracing::warn!(method = method.as_str(), path, attempt, %error, "GitHub request failed; trying again");
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(error);
                }
            };
            self.note_quota(&headers);
            if (200..300).contains(&status) {
                return Ok(Answer { status, body: text });
            }
            if let Some(wait) = rate_limit_wait(status, &headers, &text, &self.settings) {
                if attempt >= self.settings.max_attempts {
                    return Err(ApiError::RateLimited {
                        method: method.as_str(),
                        path: path.to_string(),
                        attempts: attempt,
                    });
                }
                tracing::warn!(
                    method = method.as_str(),
                    path,
                    status,
                    wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    "GitHub rate limit; holding every call until it has passed"
                );
                // GitHub limits the account (secondary limits too), not this one call: every
                // call waits at the top of the loop, this one included.
                self.blocked.hold(wait);
                attempt += 1;
                continue;
            }
            if Verdict::of_http_status(status, None).is_retryable()
                && repeatable == Repeatable::Yes
                && attempt < self.settings.max_attempts
            {
                tracing::warn!(
                    method = method.as_str(),
                    path,
                    status,
                    attempt,
                    "GitHub server error; trying again"
                );
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
                continue;
            }
            return Err(ApiError::Status {
                method: method.as_str(),
                path: path.to_string(),
                status,
                message: error_message(&text),
            });
        }
    }

    async fn pace_write(&self) {
        let mut next_write = self.next_write.lock().await;
        tokio::time::sleep_until(*next_write).await;
        *next_write = Instant::now() + self.settings.write_interval;
    }

    /// After an answer reporting the quota used up, hold further calls until it resets.
    fn note_quota(&self, headers: &http::HeaderMap) {
        if header_u64(headers, "x-ratelimit-remaining") == Some(0) {
            if let Some(reset) = header_u64(headers, "x-ratelimit-reset") {
                self.blocked.hold(until_reset(reset));
            }
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    method: Method,
    path: &str,
    answer: &Answer,
) -> Result<T, ApiError> {
    serde_json::from_str(&answer.body).map_err(|error| ApiError::Decode {
        method: method.as_str(),
        path: path.to_string(),
        detail: format!("{error} (status {})", answer.status),
    })
}

/// How long to wait before sending a rate-limited request again, or `None` when the answer is
/// not a rate limit (a 403 can also be a real refusal).
fn rate_limit_wait(
    status: u16,
    headers: &http::HeaderMap,
    body: &str,
    settings: &GitHubSettings,
) -> Option<Duration> {
    if status != 403 && status != 429 {
        return None;
    }
    if let Some(seconds) = header_u64(headers, "retry-after") {
        return Some(Duration::from_secs(seconds));
    }
    if header_u64(headers, "x-ratelimit-remaining") == Some(0) {
        if let Some(reset) = header_u64(headers, "x-ratelimit-reset") {
            return Some(until_reset(reset));
        }
    }
    if status == 429 || error_message(body).to_lowercase().contains("rate limit") {
        return Some(settings.secondary_limit_wait);
    }
    None
}

/// The time until a `X-RateLimit-Reset` epoch second, plus a second for clock granularity.
fn until_reset(reset_epoch: u64) -> Duration {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let reset = i64::try_from(reset_epoch).unwrap_or(i64::MAX);
    let seconds = u64::try_from(reset.saturating_sub(now)).unwrap_or(0);
    Duration::from_secs(seconds) + Duration::from_secs(1)
}

fn header_u64(headers: &http::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|value| value.get("message")?.as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

/// The runtime's backoff: 0.5 s, 1 s, 2 s… up to 30 s, jittered.
fn backoff(attempt: u32) -> Duration {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30)).delay(attempt)
}

/// A `since` value: RFC 3339 to the second, percent-encoded for a query string.
fn query_time(at: OffsetDateTime) -> String {
    let at = at.replace_nanosecond(0).unwrap_or(at);
    at.format(&Rfc3339)
        .unwrap_or_default()
        .replace(':', "%3A")
        .replace('+', "%2B")
}

/// A login as a path segment: GitHub logins are letters, digits and dashes; anything else
/// (`[bot]` suffixes) is percent-encoded.
fn path_segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> GitHubSettings {
        GitHubSettings {
            api_url: "http://127.0.0.1:1".to_string(),
            auth: GitHubAuth::Token("t".to_string()),
            bot_login: "bot".to_string(),
            write_interval: Duration::ZERO,
            secondary_limit_wait: Duration::from_secs(60),
            max_attempts: 3,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
        }
    }

    fn headers(pairs: &[(&'static str, String)]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn rate_limit_answers() {
        let settings = settings();
        let retry_after = headers(&[("retry-after", "7".to_string())]);
        assert_eq!(
            rate_limit_wait(403, &retry_after, "{}", &settings),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            rate_limit_wait(429, &retry_after, "{}", &settings),
            Some(Duration::from_secs(7))
        );
        let reset = OffsetDateTime::now_utc().unix_timestamp() + 5;
        let exhausted = headers(&[
            ("x-ratelimit-remaining", "0".to_string()),
            ("x-ratelimit-reset", reset.to_string()),
        ]);
        let wait = rate_limit_wait(403, &exhausted, "{}", &settings).unwrap();
        assert!(
            wait >= Duration::from_secs(4) && wait <= Duration::from_secs(7),
            "{wait:?}"
        );
        let secondary = r#"{"message":"You have exceeded a secondary rate limit. Please wait."}"#;
        assert_eq!(
            rate_limit_wait(403, &headers(&[]), secondary, &settings),
            Some(Duration::from_secs(60))
        );
        // A plain refusal is not a rate limit.
        let forbidden = r#"{"message":"Resource not accessible by integration"}"#;
        let plenty = headers(&[("x-ratelimit-remaining", "4000".to_string())]);
        assert_eq!(rate_limit_wait(403, &plenty, forbidden, &settings), None);
        assert_eq!(rate_limit_wait(500, &retry_after, "{}", &settings), None);
    }

    #[test]
    fn query_values() {
        let at = OffsetDateTime::from_unix_timestamp(1_663_843_698).unwrap();
        assert_eq!(query_time(at), "2022-09-22T10%3A48%3A18Z");
        assert_eq!(
            path_segment("gagbo-test-app[bot]"),
            "gagbo-test-app%5Bbot%5D"
        );
        assert_eq!(path_segment("Octo-Cat"), "Octo-Cat");
    }

    #[test]
    fn bots() {
        let app = Author {
            login: "gagbo-test-app[bot]".to_string(),
            id: 1,
            kind: "Bot".to_string(),
        };
        assert!(app.is_bot());
        let person = Author {
            login: "octocat".to_string(),
            id: 2,
            kind: "User".to_string(),
        };
        assert!(!person.is_bot());
    }
}
