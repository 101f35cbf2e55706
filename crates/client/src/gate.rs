//! Gating one agent tool call on a decision, for hosts that must hear "allow" or "deny" before
//! their own deadline: coding-agent hooks and the MCP permission tool.
//!
//! Everything here fails closed: an error, an expiry, a cancellation or a deadline reached while
//! still pending is a [`Verdict::Deny`] that says what happened, never an allow.

use std::time::Duration;

use countersign_core::digest::args_digest;
use countersign_proto::v1 as pb;
use serde_json::Value;
use tokio::time::Instant;

use crate::backoff::{log_retry, Backoff};
use crate::{decider, version, Client, ClientError};

/// How long a gated request keeps retrying a server it cannot reach before it denies: long
/// enough to ride out a restart, short enough that an agent is not held for minutes by a server
/// that is down.
pub const REQUEST_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// How long withdrawing an approval at the deadline may take; the answer must still reach the
/// host in time.
pub const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(2);

/// The server's limit on `action`, in characters.
pub const MAX_ACTION_CHARS: usize = 1024;

/// How much of an argument value an action line quotes.
const MAX_QUOTED_CHARS: usize = 300;

/// The outcome of a gated call, as the agent host needs to hear it.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Go ahead. `session` is true when the approval covers later calls of the same tool in
    /// the same session (a SESSION-scope decision, or an existing session grant).
    Allow {
        approval_id: String,
        session: bool,
        /// True when people approved this one call (ONCE): nothing else (a rule, a grant, a
        /// session decision) would approve the same call again.
        single_use: bool,
        explanation: String,
        /// An approver edited the arguments (edit-on-approve): run the call with this input
        /// instead of the one requested.
        updated_input: Option<Value>,
        /// The approval's decision receipt, which [`checked`] verifies.
        receipt: String,
    },
    /// Do not run the call. `failure` is true when countersign could not decide (server
    /// unreachable, refused, deadline reached, bad input) rather than a person or rule saying no.
    Deny {
        approval_id: Option<String>,
        failure: bool,
        explanation: String,
    },
}

impl Verdict {
    /// A denial because countersign could not decide.
    pub fn failed(explanation: impl Into<String>) -> Verdict {
        Verdict::Deny {
            approval_id: None,
            failure: true,
            explanation: explanation.into(),
        }
    }

    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow { .. })
    }

    /// One sentence for the model (deny reasons) and the user, starting with "countersign:".
    pub fn explanation(&self) -> &str {
        match self {
            Verdict::Allow { explanation, .. } | Verdict::Deny { explanation, .. } => explanation,
        }
    }
}

/// The most approvals one digest key is renewed to (see [`request`]).
const MAX_RENEWALS: u32 = 100;

/// Requests the approval, retrying transient failures for at most [`REQUEST_RETRY_WINDOW`]
/// (and never past `deadline_at`). The same idempotency key is resent, so a retry never makes
/// a second approval.
///
/// `renew_ended`: for keys derived from the call itself ([`call_key`]), a previous identical
/// call whose approval expired, was cancelled or was used ([`hand_off`]) must not answer this
/// one: the key gets a numbered suffix until it names an approval that did not end that way.
/// Deterministic, so a host retrying the same call while it waits finds the same approval.
pub async fn request(
    client: &Client,
    req: &pb::RequestApprovalRequest,
    deadline_at: Instant,
    renew_ended: bool,
) -> Result<pb::Approval, ClientError> {
    let mut req = req.clone();
    let base_key = req.idempotency_key.clone();
    for renewal in 1..=MAX_RENEWALS {
        let approval = request_once(client, &req, deadline_at).await?;
        let ended = matches!(
            approval.state(),
            pb::ApprovalState::Expired | pb::ApprovalState::Cancelled | pb::ApprovalState::Consumed
        );
        if !(renew_ended && ended) {
            return Ok(approval);
        }
        req.idempotency_key = format!("{base_key}.{renewal}");
    }
    // Never answer with an approval that ended or was used: that would approve nothing asked.
    Err(ClientError::FailedPrecondition(format!(
        "this exact call was asked {MAX_RENEWALS} times in this session; start a new session"
    )))
}

/// For a call known only by its digest ([`call_key`]): once an allow that people gave for
/// this one call (`single_use`) is handed to the host, the approval is consumed
/// (`HANDED_OFF`), so that the same call made again is asked anew and a ONCE approval approves
/// one call. The invocation whose consumption the server records is the one allowed; another
/// one waiting on the same approval (two identical calls at once) is denied, and so is the
/// call when the use cannot be recorded (fail closed). Approvals by a rule, a session grant or
/// a session decision are left as they are: they would approve the same call again anyway.
pub async fn hand_off(client: &Client, verdict: Verdict, host: &str) -> Verdict {
    let Verdict::Allow {
        approval_id,
        single_use: true,
        ..
    } = &verdict
    else {
        return verdict;
    };
    let detail = format!("allowed; handed to {host} to run");
    let consumed = client
        .consume(approval_id, pb::ConsumeOutcome::HandedOff, &detail)
        .await;
    let error = match consumed {
        Ok(_) => return verdict,
        Err(error) => error,
    };
    // Refused: used by an identical call already, or anything else (an approval that disagrees
    // with its trail); only the approval as it is now tells which.
    let used_already = matches!(error, ClientError::FailedPrecondition(_))
        && client
            .get_approval(approval_id)
            .await
            .is_ok_and(|approval| approval.state() == pb::ApprovalState::Consumed);
    if used_already {
        return Verdict::Deny {
            explanation: format!(
                "countersign: approval {approval_id} was already used by an identical call; this call was not approved, ask again"
            ),
            failure: false,
            approval_id: Some(approval_id.clone()),
        };
    }
    Verdict::Deny {
        explanation: format!(
            "countersign: cannot record that approval {approval_id} was used ({error}); not approving the call"
        ),
        failure: true,
        approval_id: Some(approval_id.clone()),
    }
}

/// Sends the request until it is answered: transient failures are retried for at most
/// [`REQUEST_RETRY_WINDOW`], and a rate limit is waited out when its retry-after ends before
/// `deadline_at` (the server said when the call will fit; denying at once would waste the
/// wait the host allows).
async fn request_once(
    client: &Client,
    req: &pb::RequestApprovalRequest,
    deadline_at: Instant,
) -> Result<pb::Approval, ClientError> {
    let mut give_up_at = deadline_at.min(Instant::now() + REQUEST_RETRY_WINDOW);
    let mut backoff = Backoff::new(Duration::from_secs(1));
    let mut last_error = None;
    loop {
        let remaining = give_up_at.saturating_duration_since(Instant::now());
        let attempt = tokio::time::timeout(remaining, client.request_approval(req.clone())).await;
        let error = match attempt {
            Ok(Ok(response)) => {
                return response.approval.ok_or_else(|| {
                    ClientError::Other(tonic::Status::internal(
                        "RequestApproval answered without an approval",
                    ))
                })
            }
            Ok(Err(error)) => error,
            // Cut short by the window: the failure before says more than the cut.
            Err(_) => last_error.unwrap_or_else(|| {
                ClientError::DeadlineExceeded("requesting approval took too long".into())
            }),
        };
        if let Some(retry_at) = error.retry_before(deadline_at) {
            tracing::warn!(%error, agent_id = %req.agent_id, "rate limited; retrying when the server said");
            tokio::time::sleep_until(retry_at).await;
            give_up_at = deadline_at.min(Instant::now() + REQUEST_RETRY_WINDOW);
            last_error = None;
            continue;
        }
        if !error.is_transient() || Instant::now() >= give_up_at {
            tracing::warn!(%error, agent_id = %req.agent_id, "requesting approval failed");
            return Err(error);
        }
        log_retry!(backoff, %error, agent_id = %req.agent_id, "requesting approval failed; retrying");
        let delay = backoff.next_delay();
        tokio::time::sleep_until((Instant::now() + delay).min(give_up_at)).await;
        last_error = Some(error);
    }
}

/// How long after its caller stops waiting a gated approval expires: the caller withdraws it
/// itself at its deadline; the expiry is for when it cannot (server unreachable then).
pub const EXPIRY_GRACE: Duration = Duration::from_secs(1);

/// Makes `request`'s approval expire when a caller that waits until `deadline_at` stops
/// waiting (plus [`EXPIRY_GRACE`]), unless it asks for an earlier expiry already: nobody can
/// act on an approval after its caller gave up, so it must never be approved later.
pub fn expire_with_the_wait(request: &mut pb::RequestApprovalRequest, deadline_at: Instant) {
    let wait = deadline_at.saturating_duration_since(Instant::now()) + EXPIRY_GRACE;
    let seconds =
        u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX);
    if request.ttl_seconds == 0 || request.ttl_seconds > seconds {
        request.ttl_seconds = seconds;
    }
}

/// Prepares `request` for a caller that waits for its decision until `deadline_at` and cannot
/// act on it once gone (a hook, the MCP server): the approval expires with the wait
/// ([`expire_with_the_wait`]), and the server withdraws it once the caller's connection is
/// gone (`withdraw_when_caller_leaves`), which covers a caller killed outright, where it
/// cannot withdraw the approval itself.
pub fn tie_to_the_waiting_caller(request: &mut pb::RequestApprovalRequest, deadline_at: Instant) {
    expire_with_the_wait(request, deadline_at);
    request.withdraw_when_caller_leaves = true;
}

/// Waits for the decision on `approval` until `deadline_at`. Still pending then: the approval
/// is withdrawn (cancelled with `withdraw_reason`, so approvers see why) and the call denied.
/// An allow stands only when its decision receipt verifies for the arguments that will run
/// ([`checked`]; `requested_digest`: the digest of the arguments requested).
pub async fn await_verdict(
    client: &Client,
    approval: pb::Approval,
    deadline_at: Instant,
    withdraw_reason: &str,
    requested_digest: &str,
) -> Verdict {
    let verdict = await_unchecked(client, approval, deadline_at, withdraw_reason).await;
    checked(client, verdict, requested_digest).await
}

/// Lets an allow stand only when its decision receipt verifies (signed by the pinned key set,
/// for this approval, not expired) for the arguments that will run: an approver's edit when
/// there is one, else those requested (`requested_digest`). Otherwise the call is denied,
/// naming what did not match (fail closed).
pub async fn checked(client: &Client, verdict: Verdict, requested_digest: &str) -> Verdict {
    let Verdict::Allow {
        approval_id,
        updated_input,
        receipt,
        ..
    } = &verdict
    else {
        return verdict;
    };
    let digest = match updated_input {
        Some(input) => args_digest(input),
        None => requested_digest.to_owned(),
    };
    let probe = pb::Approval {
        id: approval_id.clone(),
        receipt: receipt.clone(),
        ..Default::default()
    };
    match client.verify_receipt(&probe, &digest).await {
        Ok(_) => verdict,
        Err(error) => {
            tracing::warn!(%error, approval_id = %approval_id, "refused an approval whose receipt does not verify");
            Verdict::Deny {
                explanation: format!("countersign: approval {approval_id} is not run: {error}"),
                failure: true,
                approval_id: Some(approval_id.clone()),
            }
        }
    }
}

async fn await_unchecked(
    client: &Client,
    approval: pb::Approval,
    deadline_at: Instant,
    withdraw_reason: &str,
) -> Verdict {
    if approval.state() != pb::ApprovalState::Pending {
        return verdict_of(&approval);
    }
    let remaining = deadline_at.saturating_duration_since(Instant::now());
    let waited = tokio::time::timeout(
        remaining + Duration::from_millis(500),
        client.wait_until_resolved(&approval.id, remaining),
    )
    .await;
    match waited {
        Ok(Ok(resolved)) if resolved.state() != pb::ApprovalState::Pending => verdict_of(&resolved),
        Ok(Err(error)) if !error.is_transient() => Verdict::Deny {
            approval_id: Some(approval.id.clone()),
            failure: true,
            explanation: failure_text(&error, client.url()),
        },
        _ => withdraw(client, &approval.id, withdraw_reason).await,
    }
}

/// Cancels a pending approval nobody will act on any more and denies. When a decision raced
/// the cancellation, that decision is the answer.
pub async fn withdraw(client: &Client, approval_id: &str, reason: &str) -> Verdict {
    let cancelled = tokio::time::timeout(
        WITHDRAW_TIMEOUT,
        client.cancel_approval(approval_id, reason),
    )
    .await;
    match cancelled {
        Ok(Ok(approval)) if approval.state() != pb::ApprovalState::Cancelled => {
            verdict_of(&approval)
        }
        Ok(Err(ClientError::FailedPrecondition(_))) => {
            // Resolved in the meantime: the decision stands.
            match tokio::time::timeout(WITHDRAW_TIMEOUT, client.get_approval(approval_id)).await {
                Ok(Ok(approval)) if approval.state() != pb::ApprovalState::Pending => {
                    verdict_of(&approval)
                }
                _ => withdrawn(
                    approval_id,
                    reason,
                    "was decided meanwhile but cannot be read",
                ),
            }
        }
        Ok(Ok(_)) => withdrawn(approval_id, reason, "was withdrawn"),
        Ok(Err(error)) => {
            tracing::warn!(%error, approval_id, "could not withdraw the approval");
            withdrawn(
                approval_id,
                reason,
                "could not be withdrawn; it expires unanswered",
            )
        }
        Err(_) => withdrawn(
            approval_id,
            reason,
            "could not be withdrawn; it expires unanswered",
        ),
    }
}

fn withdrawn(approval_id: &str, reason: &str, outcome: &str) -> Verdict {
    Verdict::Deny {
        approval_id: Some(approval_id.to_owned()),
        failure: true,
        explanation: format!("countersign: {reason}; approval {approval_id} {outcome}"),
    }
}

/// The verdict an approval in its current state stands for (pending: not approved, so deny).
pub fn verdict_of(approval: &pb::Approval) -> Verdict {
    let id = approval.id.clone();
    let by = resolved_by(approval);
    let reason = approval
        .resolution
        .as_ref()
        .map(|resolution| resolution.reason.as_str())
        .filter(|reason| !reason.is_empty())
        .map(|reason| format!(": {reason}"))
        .unwrap_or_default();
    match approval.state() {
        pb::ApprovalState::Approved | pb::ApprovalState::Consumed
            if version::is_edited(approval) =>
        {
            let editor = version::editor_name(approval).unwrap_or_default();
            match version::edited_input(approval) {
                Some(input) => Verdict::Allow {
                    receipt: approval.receipt.clone(),
                    session: is_session_scoped(approval),
                    single_use: is_single_use(approval),
                    explanation: format!(
                        "countersign: approved {by}{reason}, with the arguments edited by {editor}"
                    ),
                    approval_id: id,
                    updated_input: Some(input),
                },
                // Edited, but the edit is not readable (redacted): running the arguments as
                // requested would run what nobody approved.
                None => Verdict::Deny {
                    explanation: format!(
                        "countersign: approval {id} approved arguments edited by {editor}, which are not available (redacted), so the call is not run"
                    ),
                    failure: true,
                    approval_id: Some(id),
                },
            }
        }
        pb::ApprovalState::Approved | pb::ApprovalState::Consumed => Verdict::Allow {
            receipt: approval.receipt.clone(),
            session: is_session_scoped(approval),
            single_use: is_single_use(approval),
            explanation: format!("countersign: approved {by}{reason}"),
            approval_id: id,
            updated_input: None,
        },
        pb::ApprovalState::Rejected => Verdict::Deny {
            explanation: format!("countersign: rejected {by}{reason}"),
            failure: false,
            approval_id: Some(id),
        },
        pb::ApprovalState::Expired => Verdict::Deny {
            explanation: format!("countersign: approval {id} expired before anyone decided"),
            failure: true,
            approval_id: Some(id),
        },
        pb::ApprovalState::Cancelled => Verdict::Deny {
            explanation: format!("countersign: approval {id} was cancelled{reason}"),
            failure: true,
            approval_id: Some(id),
        },
        pb::ApprovalState::Pending | pb::ApprovalState::Unspecified => Verdict::Deny {
            explanation: format!("countersign: approval {id} is not decided"),
            failure: true,
            approval_id: Some(id),
        },
    }
}

/// True when the approving decision (or the grant that resolved it) covers the whole session.
pub fn is_session_scoped(approval: &pb::Approval) -> bool {
    let by_grant = approval
        .resolution
        .as_ref()
        .is_some_and(|resolution| resolution.resolved_by() == pb::ResolvedBy::Grant);
    by_grant
        || approval.decisions.iter().any(|decision| {
            decision.verdict() == pb::Verdict::Approve && decision.scope() == pb::Scope::Session
        })
}

/// Whether people approved exactly one call (ONCE decisions): a rule or a session grant
/// approves the same call again by itself, a session decision covers the session.
fn is_single_use(approval: &pb::Approval) -> bool {
    let by_people = approval
        .resolution
        .as_ref()
        .is_some_and(|resolution| resolution.resolved_by() == pb::ResolvedBy::Decision);
    by_people && !is_session_scoped(approval)
}

/// "by Alice (telegram)", "by policy rule allow-reads", "by the session grant ...".
pub fn resolved_by(approval: &pb::Approval) -> String {
    let Some(resolution) = &approval.resolution else {
        return String::new();
    };
    match resolution.resolved_by() {
        pb::ResolvedBy::Decision => {
            let names: Vec<String> = resolution
                .deciders
                .iter()
                .map(decider::name_and_channel)
                .collect();
            format!("by {}", names.join(", "))
        }
        pb::ResolvedBy::Rule => format!("by policy rule {}", resolution.rule),
        pb::ResolvedBy::Grant => format!("by session grant {}", resolution.grant_id),
        pb::ResolvedBy::Expiry => "by expiry".into(),
        pb::ResolvedBy::Cancellation => "by cancellation".into(),
        pb::ResolvedBy::Unspecified => String::new(),
    }
}

/// What to tell the model when countersign itself failed.
pub fn failure_text(error: &ClientError, server_url: &str) -> String {
    match error {
        // Transport details go to the log, not to the model.
        ClientError::Unavailable(_) | ClientError::DeadlineExceeded(_) => format!(
            "countersign: cannot reach the approval server at {server_url}; nothing was approved"
        ),
        ClientError::Unauthenticated(_) => {
            "countersign: the approval server refused the token; check COUNTERSIGN_TOKEN".into()
        }
        ClientError::PermissionDenied(_) => {
            "countersign: the approval server refused this agent; check the token's agents".into()
        }
        _ => format!("countersign: the approval server refused the request ({error})"),
    }
}

/// The idempotency key of a call the host gives no id for: a digest of the session, the tool
/// and the canonical JSON of its input, so a repeat of the same call finds the same approval.
pub fn call_key(session_id: &str, tool_name: &str, input: &Value) -> String {
    let canonical = countersign_core::digest::canonical_json(&serde_json::json!([
        session_id, tool_name, input
    ]));
    format!(
        "call-{}",
        countersign_core::digest::sha256_hex(canonical.as_bytes())
    )
}

/// The risk a tool gets unless configured otherwise: shells high, edits and fetches medium,
/// reads low. Names cover Claude Code, Codex and Gemini CLI.
pub fn default_risk(tool_name: &str) -> pb::Risk {
    match tool_name {
        "Bash" | "run_shell_command" | "shell" | "exec_command" | "local_shell" => pb::Risk::High,
        "Read"
        | "Glob"
        | "Grep"
        | "LS"
        | "read_file"
        | "read_many_files"
        | "list_directory"
        | "glob"
        | "search_file_content"
        | "grep"
        | "TodoWrite" => pb::Risk::Low,
        _ => pb::Risk::Medium,
    }
}

/// The one-line action an approver reads on a phone: the shell command, the file and the size
/// of the change, the URL, or the MCP tool and its arguments.
pub fn describe_call(tool_name: &str, input: &Value) -> String {
    let text = |key: &str| input.get(key).and_then(Value::as_str);
    let lines = |key: &str| text(key).map_or(0, |value| value.lines().count());
    let line = match tool_name {
        "Bash" | "run_shell_command" | "shell" | "exec_command" | "local_shell" => {
            match input.get("command") {
                Some(Value::String(command)) => format!("run: {command}"),
                // Codex shells may pass the argv.
                Some(Value::Array(argv)) => format!(
                    "run: {}",
                    argv.iter()
                        .map(|arg| arg.as_str().map_or_else(|| arg.to_string(), str::to_owned))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                _ => generic(tool_name, input),
            }
        }
        "Edit" | "replace" => match text("file_path") {
            Some(path) => format!(
                "edit {path}: -{} +{} lines",
                lines("old_string"),
                lines("new_string")
            ),
            None => generic(tool_name, input),
        },
        "MultiEdit" => match (
            text("file_path"),
            input.get("edits").and_then(Value::as_array),
        ) {
            (Some(path), Some(edits)) => {
                let count = |key: &str| -> usize {
                    edits
                        .iter()
                        .filter_map(|edit| edit.get(key).and_then(Value::as_str))
                        .map(|value| value.lines().count())
                        .sum()
                };
                format!(
                    "edit {path}: {} edits, -{} +{} lines",
                    edits.len(),
                    count("old_string"),
                    count("new_string")
                )
            }
            _ => generic(tool_name, input),
        },
        "Write" | "write_file" => match text("file_path") {
            Some(path) => format!("write {path}: {} lines", lines("content")),
            None => generic(tool_name, input),
        },
        "NotebookEdit" => match text("notebook_path") {
            Some(path) => format!("edit notebook {path}"),
            None => generic(tool_name, input),
        },
        "WebFetch" => match text("url") {
            Some(url) => format!("fetch {url}"),
            None => generic(tool_name, input),
        },
        "web_fetch" => match text("prompt") {
            Some(prompt) => format!("fetch: {}", quote(prompt)),
            None => generic(tool_name, input),
        },
        "WebSearch" | "google_web_search" => match text("query") {
            Some(query) => format!("search the web: {}", quote(query)),
            None => generic(tool_name, input),
        },
        "apply_patch" => match text("command").or_else(|| text("input")) {
            Some(patch) => patch_summary(patch),
            None => generic(tool_name, input),
        },
        _ => generic(tool_name, input),
    };
    truncate(&line, MAX_ACTION_CHARS)
}

/// `MCP server/tool {args}` for MCP tools (`mcp__server__tool`), else `tool {args}`.
fn generic(tool_name: &str, input: &Value) -> String {
    let arguments = quote(&input.to_string());
    match tool_name
        .strip_prefix("mcp__")
        .and_then(|rest| rest.split_once("__"))
    {
        Some((server, tool)) => format!("MCP {server}/{tool} {arguments}"),
        None => format!("{tool_name} {arguments}"),
    }
}

/// The files an `apply_patch` envelope touches.
fn patch_summary(patch: &str) -> String {
    let files: Vec<String> = patch
        .lines()
        .filter_map(|line| {
            [
                ("*** Add File: ", "add"),
                ("*** Update File: ", "update"),
                ("*** Delete File: ", "delete"),
            ]
            .iter()
            .find_map(|(prefix, verb)| {
                line.strip_prefix(prefix)
                    .map(|path| format!("{verb} {}", path.trim()))
            })
        })
        .collect();
    if files.is_empty() {
        format!("apply patch: {}", quote(patch))
    } else {
        format!("apply patch: {}", files.join(", "))
    }
}

fn quote(text: &str) -> String {
    truncate(text, MAX_QUOTED_CHARS)
}

/// `text` cut to at most `max_chars` characters, ending in `…` when cut.
pub fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn actions_say_what_the_call_does() {
        let cases = [
            (
                "Bash",
                json!({"command": "rm -rf build"}),
                "run: rm -rf build",
            ),
            (
                "Edit",
                json!({"file_path": "/src/a.rs", "old_string": "a\nb", "new_string": "c"}),
                "edit /src/a.rs: -2 +1 lines",
            ),
            (
                "MultiEdit",
                json!({"file_path": "/a", "edits": [{"old_string": "x", "new_string": "y\nz"}, {"old_string": "q", "new_string": ""}]}),
                "edit /a: 2 edits, -2 +2 lines",
            ),
            (
                "Write",
                json!({"file_path": "/a.txt", "content": "1\n2\n3\n"}),
                "write /a.txt: 3 lines",
            ),
            (
                "WebFetch",
                json!({"url": "https://x.test/", "prompt": "p"}),
                "fetch https://x.test/",
            ),
            (
                "mcp__github__create_issue",
                json!({"title": "t"}),
                r#"MCP github/create_issue {"title":"t"}"#,
            ),
            ("run_shell_command", json!({"command": "ls"}), "run: ls"),
            (
                "apply_patch",
                json!({"command": "*** Begin Patch\n*** Update File: src/x.rs\n@@\n-a\n+b\n*** Add File: y\n*** End Patch"}),
                "apply patch: update src/x.rs, add y",
            ),
            ("Task", json!({"n": 1}), r#"Task {"n":1}"#),
        ];
        for (tool, input, action) in cases {
            assert_eq!(describe_call(tool, &input), action, "{tool}");
        }
        let long = describe_call("Bash", &json!({"command": "x".repeat(5000)}));
        assert_eq!(long.chars().count(), MAX_ACTION_CHARS);
        assert!(long.ends_with('…'));
        assert_eq!(truncate("short", MAX_ACTION_CHARS), "short");
    }

    #[test]
    fn the_call_key_ignores_key_order_but_not_session_tool_or_input() {
        let key = call_key("s", "Bash", &json!({"a": 1, "b": 2}));
        assert_eq!(key, call_key("s", "Bash", &json!({"b": 2, "a": 1})));
        assert_ne!(key, call_key("t", "Bash", &json!({"a": 1, "b": 2})));
        assert_ne!(key, call_key("s", "Edit", &json!({"a": 1, "b": 2})));
        assert_ne!(key, call_key("s", "Bash", &json!({"a": 1, "b": 3})));
        assert!(key.starts_with("call-") && key.len() == 69, "{key}");
    }
}
