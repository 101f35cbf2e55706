//! The pages: inbox, approval, decide, batch, history, grants, sign-in. Templates are checked
//! at compile time (askama) and escape every value.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use countersign_client::version;
use countersign_client::{pb, ClientError};

use crate::app::App;
use crate::auth::{session_cookie, SignedForm, Viewer, SESSION_COOKIE};
use crate::config::CHANNEL;
use crate::http::{message_page, render, server_failure, FormFields, Refusal};
use crate::layout::Layout;
use crate::passkeys::{assertion_of, StepUpForm};
use crate::sessions::random_token;
use crate::view::{self, Filters, Row, Status, TimelineEntry};

/// A form that comes back instead of deciding: why, with what the approver had typed and
/// chosen, so that nothing is lost and nothing is decided.
#[derive(Default)]
struct Returned {
    error: String,
    reason: String,
    /// The approver's edit of the arguments, when it is to be shown again.
    edit: Option<String>,
    session_scope: bool,
}

impl Returned {
    fn of(form: &FormFields, error: String) -> Returned {
        let shown = form.get("shown_arguments").unwrap_or("").trim();
        Returned {
            error,
            reason: form.get("reason").unwrap_or("").to_owned(),
            edit: form
                .get("arguments")
                .filter(|arguments| arguments.trim() != shown)
                .map(str::to_owned),
            session_scope: form.get("scope") == Some("session"),
        }
    }
}

// ---- inbox ----

#[derive(Template)]
#[template(path = "inbox.html")]
pub struct InboxPage {
    layout: Layout,
    /// Why the batch form came back ("Review selected" with nothing ticked); empty otherwise.
    error: String,
    filters: Filters,
    risks: [&'static str; 4],
    agents: Vec<String>,
    rows: Vec<Row>,
    query: String,
    seq: u64,
    ready: bool,
}

#[derive(Template)]
#[template(path = "rows.html")]
pub struct RowsFragment {
    pub rows: Vec<Row>,
}

/// Whether the inbox of the approver `approver_id` lists `approval`: pending, admitted by the
/// filters, theirs to decide and not approved by them yet.
pub fn in_inbox(app: &App, approver_id: &str, filters: &Filters, approval: &pb::Approval) -> bool {
    approval.state() == pb::ApprovalState::Pending
        && filters.admit(approval)
        && !view::approved_by(approval, approver_id)
        && app.deciders.may_decide(approver_id, approval)
}

/// The pending approvals `viewer` may still act on, filtered and in inbox order.
pub fn inbox_rows(
    app: &App,
    pending: &[Arc<pb::Approval>],
    approver_id: &str,
    filters: &Filters,
) -> Vec<Row> {
    let mut rows: Vec<Row> = pending
        .iter()
        .filter(|approval| in_inbox(app, approver_id, filters, approval))
        .map(|approval| Row::of(approval))
        .collect();
    view::sort_inbox(&mut rows);
    rows
}

pub async fn inbox(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Response {
    inbox_page(&app, &viewer, filters, String::new())
}

fn inbox_page(app: &App, viewer: &Viewer, filters: Filters, error: String) -> Response {
    let (pending, seq) = app.live.pending();
    let mut agents: Vec<String> = pending.iter().map(|a| a.agent_id.clone()).collect();
    agents.sort();
    agents.dedup();
    let rows = inbox_rows(app, &pending, &viewer.approver.id, &filters);
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("agent", &filters.agent)
        .append_pair("tool", &filters.tool)
        .append_pair("risk", &filters.risk)
        .finish();
    render(&InboxPage {
        layout: Layout::of(app, viewer),
        error,
        filters,
        risks: ["critical", "high", "medium", "low"],
        agents,
        rows,
        query,
        seq,
        ready: app.live.is_ready(),
    })
}

// ---- one approval ----

#[derive(Template)]
#[template(path = "approval.html")]
struct ApprovalPage {
    layout: Layout,
    row: Row,
    status: Status,
    requester: String,
    reason: String,
    /// The digest of the requested arguments.
    digest: String,
    /// The current arguments (the edited ones when edited), pretty-printed; the edit box
    /// starts with them.
    arguments: String,
    /// Their digest: the version an approval from this page names.
    current_digest: String,
    /// "Alice (telegram)" when an approver edited the arguments; empty otherwise.
    edited_by: String,
    diffs: Vec<view::Diff>,
    timeline: Vec<TimelineEntry>,
    key: String,
    seq: u64,
    /// The edit box's text: the arguments, or the approver's edit when the form came back.
    edit_arguments: String,
    returned: Returned,
    /// Set when approving needs a passkey (and the approval is pending).
    step_up: Option<StepUpForm>,
}

#[derive(Template)]
#[template(path = "status.html")]
pub struct StatusFragment {
    pub status: Status,
}

pub async fn approval(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    approval_page(&app, &viewer, &id, Returned::default()).await
}

async fn approval_page(
    app: &App,
    viewer: &Viewer,
    id: &str,
    returned: Returned,
) -> Result<Response, Refusal> {
    // The seq before the read: an update racing with it is replayed, never missed.
    let (_, seq) = app.live.pending();
    let approval = app.client.get_approval(id).await?;
    let timeline = timeline(app, &approval).await;
    let (current, current_digest) = version::current_arguments(&approval);
    let arguments = view::pretty_arguments(current);
    let step_up = if approval.step_up == "passkey" && approval.state() == pb::ApprovalState::Pending
    {
        Some(StepUpForm::of(app, viewer, &approval.id, current_digest).await?)
    } else {
        None
    };
    Ok(render(&ApprovalPage {
        step_up,
        layout: Layout::of(app, viewer),
        row: Row::of(&approval),
        status: Status::of(&approval),
        requester: approval.requester.clone(),
        reason: approval.reason.clone(),
        digest: approval.args_digest.clone(),
        edit_arguments: returned.edit.clone().unwrap_or_else(|| arguments.clone()),
        arguments,
        current_digest: current_digest.to_owned(),
        edited_by: version::editor_name(&approval)
            .filter(|_| version::is_edited(&approval))
            .unwrap_or_default(),
        diffs: view::diffs(current),
        timeline,
        key: random_token(),
        seq,
        returned,
    }))
}

/// The audit trail of the approval when the admin token allows reading it; otherwise what
/// the approval itself records (decisions and deliveries).
async fn timeline(app: &App, approval: &pb::Approval) -> Vec<TimelineEntry> {
    if let Some(admin) = &app.admin {
        let request = pb::ListEventsRequest {
            approval_id: approval.id.clone(),
            page_size: 200,
            ..Default::default()
        };
        match admin.list_events(request).await {
            Ok(page) => return page.events.iter().filter_map(view::event_entry).collect(),
            Err(error) => tracing::warn!(%error, "audit timeline unavailable; showing decisions"),
        }
    }
    let mut entries = vec![TimelineEntry {
        at: view::time_text(approval.created_at.as_ref()),
        what: "requested".into(),
    }];
    entries.extend(Status::of(approval).decisions);
    entries.extend(approval.deliveries.iter().map(view::delivery_entry));
    entries
}

/// What one decision of this approver came to, in words.
pub struct DecideResult {
    pub class: &'static str,
    pub what: String,
    /// The approval as the server answered, when it did.
    pub approval: Option<pb::Approval>,
}

/// Which version of the arguments a decision is about: the one the page showed, and the
/// approver's edit of it (edit-on-approve).
#[derive(Default)]
struct Version {
    expected_digest: String,
    edited_arguments: String,
}

// One parameter per part of a Decide call.
#[allow(clippy::too_many_arguments)]
async fn decide_one(
    app: &App,
    viewer: &Viewer,
    approval_id: &str,
    verdict: pb::Verdict,
    scope: pb::Scope,
    reason: &str,
    key: &str,
    version: Version,
    passkey: Option<pb::PasskeyAssertion>,
) -> DecideResult {
    let request = pb::DecideRequest {
        approval_id: approval_id.to_owned(),
        verdict: verdict.into(),
        scope: scope.into(),
        reason: reason.to_owned(),
        decider: Some(pb::Decider {
            channel: CHANNEL.to_owned(),
            user_id: viewer.approver.id.clone(),
            display_name: viewer.approver.name.clone(),
        }),
        idempotency_key: format!("web-{key}-{approval_id}"),
        expected_args_digest: version.expected_digest,
        edited_arguments_json: version.edited_arguments,
    };
    let decided = match passkey {
        Some(passkey) => {
            app.client
                .decide_with_passkey(pb::DecideWithPasskeyRequest {
                    decision: Some(request),
                    passkey: Some(passkey),
                })
                .await
        }
        None => app.client.decide(request).await,
    };
    let (class, what, approval) = match decided {
        Ok(response) => {
            let outcome = response
                .approval
                .as_ref()
                .map(|approval| Status::of(approval).outcome)
                .unwrap_or_default();
            let (class, what) = match response.outcome() {
                pb::DecideOutcome::Resolved => ("resolved", format!("resolved: {outcome}")),
                pb::DecideOutcome::Recorded => (
                    "recorded",
                    "recorded; waiting for more approvals".to_owned(),
                ),
                pb::DecideOutcome::AlreadyResolved => {
                    ("already", format!("already resolved: {outcome}"))
                }
                _ => ("duplicate", "already recorded".to_owned()),
            };
            (class, what, response.approval)
        }
        Err(ClientError::PermissionDenied(why)) => ("refused", format!("refused: {why}"), None),
        // A malformed edit, or arguments edited since the page was shown.
        Err(ClientError::InvalidArgument(why)) => ("invalid", format!("refused: {why}"), None),
        Err(ClientError::FailedPrecondition(why)) => ("changed", format!("refused: {why}"), None),
        Err(error) => {
            tracing::warn!(%error, approval = ?approval_id, "countersign server call failed");
            (
                "failed",
                format!("failed: {}", server_failure(&error)),
                None,
            )
        }
    };
    DecideResult {
        class,
        what,
        approval,
    }
}

/// What a form without an explicit verdict gets back: Enter in a field submits a form with
/// its first submit button, which names none, so only a click on Approve or Reject (or a
/// keyboard shortcut) decides.
const NO_VERDICT: &str = "Nothing was decided: Enter does not decide. Click Approve or Reject \
     (or, outside a text field, press a to approve, or r to type a reason and reject).";

/// The verdict, scope and reason of a decide form; a rejection needs a reason. The error says
/// what to do, on the form that comes back.
fn decision_of(form: &FormFields) -> Result<(pb::Verdict, pb::Scope, String), String> {
    let verdict = match form.get("verdict").unwrap_or("") {
        "approve" => pb::Verdict::Approve,
        "reject" => pb::Verdict::Reject,
        "" => return Err(NO_VERDICT.into()),
        other => {
            return Err(format!(
                "Nothing was decided: the verdict must be approve or reject, not {other:?}."
            ))
        }
    };
    let scope = match form.get("scope").unwrap_or("once") {
        "once" => pb::Scope::Once,
        "session" => pb::Scope::Session,
        other => {
            return Err(format!(
                "Nothing was decided: the scope must be once or session, not {other:?}."
            ))
        }
    };
    let reason = form.get("reason").unwrap_or("").trim().to_owned();
    if verdict == pb::Verdict::Reject && reason.is_empty() {
        return Err(
            "Nothing was decided: a rejection needs a reason (the agent is told it). \
             Type it under Reason, then click Reject."
                .into(),
        );
    }
    Ok((verdict, scope, reason))
}

/// The version the page showed (`args_digest`) and, when the approver changed the arguments
/// in the edit box (`arguments`, prefilled with `shown_arguments`), their edit. An edit goes
/// with an approval only.
fn version_of(form: &FormFields, verdict: pb::Verdict) -> Result<Version, String> {
    let shown = form.get("shown_arguments").unwrap_or("").trim();
    let edited = form
        .get("arguments")
        .map(str::trim)
        .filter(|arguments| *arguments != shown)
        .unwrap_or("");
    if !edited.is_empty() && verdict != pb::Verdict::Approve {
        return Err(
            "Nothing was decided: edited arguments go with Approve only; to reject, \
             leave the arguments as they are."
                .into(),
        );
    }
    Ok(Version {
        expected_digest: form.get("args_digest").unwrap_or("").trim().to_owned(),
        edited_arguments: edited.to_owned(),
    })
}

fn form_key(form: &FormFields) -> String {
    form.get("key")
        .filter(|key| {
            !key.is_empty() && key.len() <= 64 && key.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .map_or_else(random_token, str::to_owned)
}

pub async fn decide(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    let checked = decision_of(&form).and_then(|(verdict, scope, reason)| {
        let passkey = assertion_of(&form)?;
        Ok((verdict, scope, reason, version_of(&form, verdict)?, passkey))
    });
    let (verdict, scope, reason, version, passkey) = match checked {
        Ok(checked) => checked,
        Err(error) => {
            let page = approval_page(&app, &viewer, &id, Returned::of(&form, error)).await?;
            return Ok((StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let result = decide_one(
        &app,
        &viewer,
        &id,
        verdict,
        scope,
        &reason,
        &form_key(&form),
        version,
        passkey,
    )
    .await;
    tracing::info!(approval = %id, approver = %viewer.approver.id, result = result.class, "web decision");
    if matches!(result.class, "refused" | "invalid" | "changed" | "failed") {
        let status = match result.class {
            "refused" => StatusCode::FORBIDDEN,
            "invalid" => StatusCode::BAD_REQUEST,
            "changed" => StatusCode::CONFLICT,
            _ => StatusCode::BAD_GATEWAY,
        };
        let mut returned = Returned::of(&form, format!("Decision not recorded: {}", result.what));
        if result.class == "changed" {
            // The edit was of a version that is gone: the page shows the current one.
            returned.edit = None;
        }
        let page = match approval_page(&app, &viewer, &id, returned).await {
            Ok(page) => page,
            Err(_) => message_page("Decision not recorded", &result.what, None),
        };
        return Ok((status, page).into_response());
    }
    Ok(Redirect::to(&format!("/approvals/{id}")).into_response())
}

// ---- batch ----

struct BatchItem {
    row: Row,
    /// The current arguments (edited ones when edited) and their digest, which the decision
    /// names.
    arguments: String,
    digest: String,
    edited_by: String,
}

#[derive(Template)]
#[template(path = "batch_review.html")]
struct BatchReviewPage {
    layout: Layout,
    items: Vec<BatchItem>,
    key: String,
    returned: Returned,
}

struct BatchResult {
    id: String,
    action: String,
    class: &'static str,
    what: String,
}

#[derive(Template)]
#[template(path = "batch_result.html")]
struct BatchResultPage {
    layout: Layout,
    results: Vec<BatchResult>,
}

/// The most approvals one batch decides.
const MAX_BATCH: usize = 200;

fn batch_ids(form: &FormFields) -> Result<Vec<String>, String> {
    let mut ids = form.all("id");
    ids.dedup();
    if ids.is_empty() {
        return Err(
            "Tick at least one approval (or choose an agent in Select all of…), then click Review selected."
                .into(),
        );
    }
    if ids.len() > MAX_BATCH {
        return Err(format!(
            "A batch holds at most {MAX_BATCH} approvals, not {}: tick fewer.",
            ids.len()
        ));
    }
    Ok(ids)
}

/// "Review selected" on the inbox: the review page of the ticked approvals, or the inbox
/// again (with its filters) saying what is missing.
pub async fn batch_review(
    State(app): State<Arc<App>>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    match batch_ids(&form) {
        Ok(ids) => batch_page(&app, &viewer, &ids, Returned::default()).await,
        Err(error) => {
            let filters = Filters {
                agent: form.get("agent").unwrap_or("").to_owned(),
                tool: form.get("tool").unwrap_or("").to_owned(),
                risk: form.get("risk").unwrap_or("").to_owned(),
            };
            let page = inbox_page(&app, &viewer, filters, error);
            Ok((StatusCode::BAD_REQUEST, page).into_response())
        }
    }
}

async fn batch_page(
    app: &App,
    viewer: &Viewer,
    ids: &[String],
    returned: Returned,
) -> Result<Response, Refusal> {
    let approvals =
        futures::future::join_all(ids.iter().map(|id| app.client.get_approval(id))).await;
    let items = approvals
        .into_iter()
        .map(|approval| {
            let approval = approval?;
            let (arguments, digest) = version::current_arguments(&approval);
            Ok(BatchItem {
                row: Row::of(&approval),
                arguments: view::pretty_arguments(arguments),
                digest: digest.to_owned(),
                edited_by: version::editor_name(&approval)
                    .filter(|_| version::is_edited(&approval))
                    .unwrap_or_default(),
            })
        })
        .collect::<Result<Vec<_>, ClientError>>()?;
    Ok(render(&BatchReviewPage {
        layout: Layout::of(app, viewer),
        items,
        key: random_token(),
        returned,
    }))
}

pub async fn batch_decide(
    State(app): State<Arc<App>>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    let ids = batch_ids(&form).map_err(Refusal::BadRequest)?;
    let (verdict, scope, reason) = match decision_of(&form) {
        Ok(decision) => decision,
        Err(error) => {
            let page = batch_page(&app, &viewer, &ids, Returned::of(&form, error)).await?;
            return Ok((StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let key = form_key(&form);
    // Each approval's version as the review page showed it.
    let versions: Vec<Version> = ids
        .iter()
        .map(|id| Version {
            expected_digest: form.get(&format!("digest-{id}")).unwrap_or("").to_owned(),
            edited_arguments: String::new(),
        })
        .collect();
    let outcomes = futures::future::join_all(ids.iter().zip(versions).map(|(id, version)| async {
        let result = decide_one(
            &app, &viewer, id, verdict, scope, &reason, &key, version, None,
        )
        .await;
        // A refused or failed decision carries no approval: read it for its action.
        let approval = match result.approval {
            Some(approval) => Some(approval),
            None => app.client.get_approval(id).await.ok(),
        };
        let action = approval.map_or_else(
            || id.clone(),
            |approval| countersign_worker::agent_text::one_line(&approval.action, 200),
        );
        BatchResult {
            id: id.clone(),
            action,
            class: result.class,
            what: result.what,
        }
    }))
    .await;
    tracing::info!(approver = %viewer.approver.id, count = outcomes.len(), "web batch decision");
    Ok(render(&BatchResultPage {
        layout: Layout::of(&app, &viewer),
        results: outcomes,
    }))
}

// ---- history ----

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct Search {
    q: String,
    agent: String,
    tool: String,
    state: String,
    page: String,
}

#[derive(Template)]
#[template(path = "history.html")]
struct HistoryPage {
    layout: Layout,
    search: Search,
    states: [&'static str; 5],
    rows: Vec<Row>,
    next: Option<String>,
}

/// Rows on a history page.
const HISTORY_ROWS: u32 = 100;

/// Pages of 500 a text search reads at most for one page of results.
const SEARCH_PAGES: usize = 20;

const DECIDED_STATES: [pb::ApprovalState; 5] = [
    pb::ApprovalState::Approved,
    pb::ApprovalState::Rejected,
    pb::ApprovalState::Expired,
    pb::ApprovalState::Cancelled,
    pb::ApprovalState::Consumed,
];

pub async fn history(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Query(search): Query<Search>,
) -> Result<Response, Refusal> {
    let states: Vec<i32> = DECIDED_STATES
        .iter()
        .filter(|state| search.state.is_empty() || view::state_label(**state) == search.state)
        .map(|state| i32::from(*state))
        .collect();
    if states.is_empty() {
        return Err(Refusal::BadRequest(format!(
            "unknown state {:?}",
            search.state
        )));
    }
    // A text search reads on until it has a page of matches (or has read SEARCH_PAGES
    // pages), so an older match is found too; the next link continues where it stopped.
    let needle = search.q.to_lowercase();
    let mut rows: Vec<Row> = Vec::new();
    let mut token = search.page.clone();
    for _ in 0..SEARCH_PAGES {
        let page = app
            .client
            .list_approvals(pb::ListApprovalsRequest {
                states: states.clone(),
                agent_id: search.agent.clone(),
                tool_name: search.tool.clone(),
                page_size: if needle.is_empty() { HISTORY_ROWS } else { 500 },
                page_token: token,
                ..Default::default()
            })
            .await?;
        rows.extend(
            page.approvals
                .iter()
                .filter(|approval| {
                    needle.is_empty()
                        || [
                            &approval.action,
                            &approval.reason,
                            &approval.agent_id,
                            &approval.tool_name,
                            &approval.id,
                        ]
                        .iter()
                        .any(|text| text.to_lowercase().contains(&needle))
                })
                .map(Row::of),
        );
        token = page.next_page_token;
        if needle.is_empty() || rows.len() >= HISTORY_ROWS as usize || token.is_empty() {
            break;
        }
    }
    let next = (!token.is_empty()).then(|| {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("q", &search.q)
            .append_pair("agent", &search.agent)
            .append_pair("tool", &search.tool)
            .append_pair("state", &search.state)
            .append_pair("page", &token)
            .finish()
    });
    Ok(render(&HistoryPage {
        layout: Layout::of(&app, &viewer),
        search,
        states: ["approved", "rejected", "expired", "cancelled", "consumed"],
        rows,
        next,
    }))
}

// ---- grants ----

struct GrantRow {
    id: String,
    agent: String,
    session: String,
    tool: String,
    granted_by: String,
    expires: String,
    active: bool,
}

#[derive(Template)]
#[template(path = "grants.html")]
struct GrantsPage {
    layout: Layout,
    grants: Vec<GrantRow>,
}

fn admin_of(app: &App, viewer: &Viewer) -> Result<countersign_client::Client, Refusal> {
    match &app.admin {
        Some(admin) if viewer.admin => Ok(admin.clone()),
        _ => Err(Refusal::Forbidden(
            "only the approvers listed in the web inbox's admins may manage grants".into(),
        )),
    }
}

pub async fn grants(State(app): State<Arc<App>>, viewer: Viewer) -> Result<Response, Refusal> {
    let admin = admin_of(&app, &viewer)?;
    let page = admin
        .list_grants(pb::ListGrantsRequest {
            include_inactive: true,
            page_size: 200,
            ..Default::default()
        })
        .await?;
    let grants = page
        .grants
        .iter()
        .map(|grant| GrantRow {
            id: grant.id.clone(),
            agent: grant.agent_id.clone(),
            session: grant.session_id.clone(),
            tool: grant.tool_name.clone(),
            granted_by: grant.granted_by.clone(),
            expires: view::time_text(grant.expires_at.as_ref()),
            active: grant.active,
        })
        .collect();
    Ok(render(&GrantsPage {
        layout: Layout::of(&app, &viewer),
        grants,
    }))
}

pub async fn revoke_grant(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    let admin = admin_of(&app, &viewer)?;
    let given = form.get("reason").map(str::trim).unwrap_or("");
    let reason = if given.is_empty() {
        format!("revoked in the web inbox by {}", viewer.approver.id)
    } else {
        format!(
            "revoked in the web inbox by {}: {given}",
            viewer.approver.id
        )
    };
    admin.revoke_grant(&id, &reason).await?;
    tracing::info!(grant = %id, approver = %viewer.approver.id, "grant revoked");
    Ok(Redirect::to("/grants").into_response())
}

// ---- sign-in ----

/// The login link's page: a button, so that link previews and prefetchers cannot use the
/// one-time token.
pub async fn login_page(Path(token): Path<String>) -> Response {
    message_page(
        "Sign in to countersign",
        "This one-time link signs you in to the approval inbox on this browser.",
        Some(&token),
    )
}

pub async fn login(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Result<Response, Refusal> {
    let form = FormFields::parse(&body);
    let token = form.get("token").unwrap_or("");
    let redeemed = app
        .sessions
        .redeem_login(token, app.settings.session_ttl)
        .await
        .map_err(|error| Refusal::Internal(error.to_string()))?;
    let Some((session_id, session)) = redeemed else {
        return Err(Refusal::Forbidden(
            "This login link is unknown, already used or expired. Ask for a new one.".into(),
        ));
    };
    tracing::info!(approver = %session.approver.id, "signed in");
    let cookie = session_cookie_value(
        &session_id,
        app.settings.session_ttl,
        app.settings.secure_cookies(),
    );
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|error| Refusal::Internal(error.to_string()))?,
    );
    Ok(response)
}

/// The `Set-Cookie` value of a new session: not readable by scripts, never sent from another
/// site, expiring, and only over TLS when the inbox is served over https.
fn session_cookie_value(session_id: &str, ttl: std::time::Duration, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{SESSION_COOKIE}={session_id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        ttl.as_secs()
    )
}

pub async fn logout(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    _signed: SignedForm,
) -> Result<Response, Refusal> {
    if let Some(session_id) = session_cookie(&headers) {
        app.sessions
            .end(session_id)
            .await
            .map_err(|error| Refusal::Internal(error.to_string()))?;
    }
    let mut response = message_page("Signed out", "You are signed out.", None);
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "countersign_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_secure_under_tls() {
        let ttl = std::time::Duration::from_secs(60);
        let plain = session_cookie_value("abc", ttl, false);
        assert_eq!(
            plain,
            "countersign_session=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=60"
        );
        assert_eq!(
            session_cookie_value("abc", ttl, true),
            format!("{plain}; Secure")
        );
    }
}
