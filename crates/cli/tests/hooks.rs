//! `countersign hook ...` fed the hosts' own hook JSON (fixtures as Claude Code, Codex and
//! Gemini CLI document them) against a real server: for every host and event, the exact
//! answer on stdout and the exit code.

use crate::support;

use std::process::{Output, Stdio};
use std::time::Duration;

use countersign_client::pb;
use countersign_server::config::Role;
use countersign_testkit::server::{token, TestServer};
use serde_json::{json, Value};
use support::*;

/// The hook surfaces: how each is run, what it is fed, and how it answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Surface {
    ClaudePreToolUse,
    ClaudePermissionRequest,
    CodexPreToolUse,
    CodexPermissionRequest,
    GeminiBeforeTool,
}

use Surface::*;

const SURFACES: [Surface; 5] = [
    ClaudePreToolUse,
    ClaudePermissionRequest,
    CodexPreToolUse,
    CodexPermissionRequest,
    GeminiBeforeTool,
];

impl Surface {
    fn args(self) -> &'static [&'static str] {
        match self {
            ClaudePreToolUse => &["hook", "claude-code"],
            ClaudePermissionRequest => &["hook", "claude-code", "--event", "permission-request"],
            CodexPreToolUse => &["hook", "codex"],
            CodexPermissionRequest => &["hook", "codex", "--event", "permission-request"],
            GeminiBeforeTool => &["hook", "gemini"],
        }
    }

    fn fixture(self) -> &'static str {
        match self {
            ClaudePreToolUse => "claude-code/pre-tool-use.json",
            ClaudePermissionRequest => "claude-code/permission-request.json",
            CodexPreToolUse => "codex/pre-tool-use.json",
            CodexPermissionRequest => "codex/permission-request.json",
            GeminiBeforeTool => "gemini/before-tool.json",
        }
    }

    fn agent(self) -> &'static str {
        match self {
            ClaudePreToolUse | ClaudePermissionRequest => "claude-code",
            CodexPreToolUse | CodexPermissionRequest => "codex",
            GeminiBeforeTool => "gemini-cli",
        }
    }

    /// Whether the host names the call (`tool_use_id`), which is then the idempotency key.
    fn has_call_id(self) -> bool {
        matches!(self, ClaudePreToolUse | CodexPreToolUse)
    }

    /// The fixture in session `session`; `variant` > 0 makes a different call of the same tool.
    fn payload(self, session: &str, variant: u32) -> Vec<u8> {
        let mut payload = fixture(self.fixture());
        payload["session_id"] = json!(session);
        if variant > 0 {
            payload["tool_input"]["command"] =
                json!(format!("npm run deploy -- --shard {variant}"));
            if let Some(id) = payload.get("tool_use_id").and_then(Value::as_str) {
                payload["tool_use_id"] = json!(format!("{id}{variant}"));
            }
        }
        serde_json::to_vec(&payload).unwrap()
    }

    fn command(self, server: &str, extra: &[&str]) -> tokio::process::Command {
        let mut command = countersign(server);
        command.args(self.args()).args(extra);
        command
    }

    async fn run(self, server: &str, input: &[u8], extra: &[&str]) -> Output {
        run_with_input(self.command(server, extra), input).await
    }

    /// What the host must read for an approval.
    fn allowed(self, reason: &str, session_tool: Option<&str>) -> Option<Value> {
        let permission_allow = || {
            let mut decision = json!({"behavior": "allow"});
            if let (ClaudePermissionRequest, Some(tool)) = (self, session_tool) {
                decision["updatedPermissions"] = json!([{
                    "type": "addRules",
                    "rules": [{"toolName": tool}],
                    "behavior": "allow",
                    "destination": "session",
                }]);
            }
            json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}})
        };
        match self {
            ClaudePreToolUse => Some(json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": reason,
            }})),
            ClaudePermissionRequest | CodexPermissionRequest => Some(permission_allow()),
            CodexPreToolUse => None,
            GeminiBeforeTool => Some(json!({})),
        }
    }

    /// What the host must read for a denial.
    fn denied(self, reason: &str) -> Option<Value> {
        Some(match self {
            ClaudePreToolUse | CodexPreToolUse => json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }}),
            ClaudePermissionRequest | CodexPermissionRequest => json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": {"behavior": "deny", "message": reason},
            }}),
            GeminiBeforeTool => json!({"decision": "deny", "reason": reason}),
        })
    }

    /// What the host must read with `--on-error ask` when countersign could not decide.
    fn asked(self, reason: &str) -> Option<Value> {
        match self {
            ClaudePreToolUse => Some(json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "ask",
                "permissionDecisionReason": reason,
            }})),
            ClaudePermissionRequest | CodexPreToolUse | CodexPermissionRequest => None,
            GeminiBeforeTool => Some(json!({})),
        }
    }
}

/// Exit 0 and exactly `expected` on stdout (one JSON line, or nothing).
#[track_caller]
fn assert_answer(surface: Surface, output: &Output, expected: Option<Value>) {
    assert_exit(output, 0);
    let out = stdout(output);
    let answer = match out.as_str() {
        "" => None,
        text => {
            assert!(
                text.ends_with('\n') && text.lines().count() == 1,
                "{surface:?}: {text:?}"
            );
            Some(serde_json::from_str::<Value>(text).unwrap_or_else(|error| {
                panic!("{surface:?}: stdout is not JSON ({error}): {text}")
            }))
        }
    };
    assert_eq!(answer, expected, "{surface:?}; stderr: {}", stderr(output));
}

/// The answer on stdout, if any (for comparing without asserting).
fn answer_of(output: &Output) -> Option<Value> {
    serde_json::from_str(stdout(output).trim()).ok()
}

fn session_of(surface: Surface, test: &str) -> String {
    format!("{test}-{surface:?}")
}

/// Runs the hook for one call while an approver decides it; returns the hook's output and the
/// approval as it was requested.
async fn decided(
    server: &TestServer,
    surface: Surface,
    session: &str,
    variant: u32,
    verdict: pb::Verdict,
    scope: pb::Scope,
    reason: &str,
) -> (Output, pb::Approval) {
    let url = server.url();
    let mut watch = watch_requests(&url).await;
    let input = surface.payload(session, variant);
    let hook = tokio::spawn({
        let url = url.clone();
        async move { surface.run(&url, &input, &[]).await }
    });
    let approval = next_pending(&mut watch).await;
    decide(&client(&url), &approval.id, verdict, scope, reason).await;
    (hook.await.unwrap(), approval)
}

#[tokio::test]
async fn an_approval_reaches_each_host_as_its_own_allow() {
    let server = TestServer::start().await;
    for surface in SURFACES {
        let session = session_of(surface, "approve");
        let (output, approval) = decided(
            &server,
            surface,
            &session,
            0,
            pb::Verdict::Approve,
            pb::Scope::Once,
            "",
        )
        .await;
        assert_answer(
            surface,
            &output,
            surface.allowed(&format!("countersign: approved by {APPROVER}"), None),
        );
        // What the approver saw.
        assert_eq!(approval.agent_id, surface.agent(), "{surface:?}");
        assert_eq!(approval.session_id, session);
        assert_eq!(approval.requester, "tester");
        let tool = if surface == GeminiBeforeTool {
            "run_shell_command"
        } else {
            "Bash"
        };
        assert_eq!(approval.tool_name, tool);
        assert_eq!(
            approval.action,
            "run: rm -rf build/ && npm run deploy -- --env prod"
        );
        let reason = if surface == CodexPreToolUse {
            ""
        } else {
            "Deploy the shop to production"
        };
        assert_eq!(approval.reason, reason, "{surface:?}");
        assert_eq!(
            approval.risk(),
            pb::Risk::High,
            "shells default to high risk"
        );
        let arguments: Value = serde_json::from_str(&approval.arguments_json).unwrap();
        assert_eq!(arguments, fixture(surface.fixture())["tool_input"]);
        let key = &approval.idempotency_key;
        if surface.has_call_id() {
            assert_eq!(
                key,
                fixture(surface.fixture())["tool_use_id"].as_str().unwrap()
            );
        } else {
            assert!(
                key.starts_with("call-") && key.len() == 69,
                "{surface:?}: {key}"
            );
        }
    }
}

/// An approval with edited arguments (edit-on-approve) reaches each host as its way of running
/// the edited input: Claude Code and Codex get `updatedInput`; Gemini CLI, whose hook can only
/// merge keys into the input, gets a denial instead of a call nobody approved.
#[tokio::test]
async fn an_approval_with_edits_reaches_each_host_as_its_updated_input() {
    let server = TestServer::start().await;
    let url = server.url();
    let edited = json!({"command": "npm run deploy -- --env staging"});
    for surface in SURFACES {
        let session = session_of(surface, "edit");
        let mut watch = watch_requests(&url).await;
        let input = surface.payload(&session, 0);
        let hook = tokio::spawn({
            let url = url.clone();
            async move { surface.run(&url, &input, &[]).await }
        });
        let approval = next_pending(&mut watch).await;
        approve_with_edits(&client(&url), &approval.id, &edited).await;
        let output = hook.await.unwrap();
        let reason = format!(
            "countersign: approved by {APPROVER}, with the arguments edited by Alice (telegram)"
        );
        let expected = match surface {
            ClaudePreToolUse | CodexPreToolUse => json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": reason,
                "updatedInput": edited,
            }}),
            ClaudePermissionRequest | CodexPermissionRequest => json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": {"behavior": "allow", "updatedInput": edited},
            }}),
            GeminiBeforeTool => json!({
                "decision": "deny",
                "reason": format!("{reason}; Gemini CLI cannot run edited arguments, so the call is not run as requested"),
            }),
        };
        assert_answer(surface, &output, Some(expected));
    }
}

#[tokio::test]
async fn a_rejection_reaches_the_model_with_its_reason_and_approver() {
    let server = TestServer::start().await;
    for surface in SURFACES {
        let (output, _) = decided(
            &server,
            surface,
            &session_of(surface, "reject"),
            0,
            pb::Verdict::Reject,
            pb::Scope::Once,
            "not on a Friday",
        )
        .await;
        assert_answer(
            surface,
            &output,
            surface.denied(&format!(
                "countersign: rejected by {APPROVER}: not on a Friday"
            )),
        );
    }
}

#[tokio::test]
async fn a_session_approval_answers_the_next_call_of_the_tool_at_once() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    for surface in SURFACES {
        let session = session_of(surface, "grant");
        let (output, _) = decided(
            &server,
            surface,
            &session,
            0,
            pb::Verdict::Approve,
            pb::Scope::Session,
            "",
        )
        .await;
        let tool = if surface == GeminiBeforeTool {
            "run_shell_command"
        } else {
            "Bash"
        };
        assert_answer(
            surface,
            &output,
            surface.allowed(&format!("countersign: approved by {APPROVER}"), Some(tool)),
        );
        // Another call of the same tool in the same session: nobody decides it.
        let output = surface
            .run(&server.url(), &surface.payload(&session, 1), &[])
            .await;
        let approvals = approvals_of(&client, &session).await;
        assert_eq!(approvals.len(), 2, "{surface:?}");
        let resolution = approvals[0].resolution.clone().unwrap();
        assert_eq!(resolution.resolved_by(), pb::ResolvedBy::Grant);
        let mut reason = format!(
            "countersign: approved by session grant {}",
            resolution.grant_id
        );
        if !resolution.reason.is_empty() {
            reason = format!("{reason}: {}", resolution.reason);
        }
        assert_answer(surface, &output, surface.allowed(&reason, Some(tool)));
    }
}

#[tokio::test]
async fn policy_rules_answer_without_a_human() {
    let server = TestServer::start_with_toml(
        r#"
        [[rules]]
        name = "no-prod-db"
        action = "deny"
        reason = "never touch the prod database"
        [rules.match]
        arguments = [{ pointer = "/command", regex = "--shard 7" }]

        [[rules]]
        name = "shell-ok"
        action = "allow"
        reason = "deploys are pre-approved"
        [rules.match]
        tool = "{Bash,run_shell_command}"
        "#,
    )
    .await;
    let client = client(&server.url());
    for surface in SURFACES {
        let session = session_of(surface, "policy");
        // The same call again and again: the rule answers each time, and a call known by its
        // digest keeps its one approval (a rule's approval is not used up).
        for _ in 0..3 {
            let output = surface
                .run(&server.url(), &surface.payload(&session, 0), &[])
                .await;
            assert_answer(
                surface,
                &output,
                surface.allowed(
                    "countersign: approved by policy rule shell-ok: deploys are pre-approved",
                    None,
                ),
            );
        }
        let approvals = approvals_of(&client, &session).await;
        assert_eq!(approvals.len(), 1, "{surface:?}");
        assert_eq!(approvals[0].state(), pb::ApprovalState::Approved);
        let output = surface
            .run(&server.url(), &surface.payload(&session, 7), &[])
            .await;
        assert_answer(
            surface,
            &output,
            surface.denied(
                "countersign: rejected by policy rule no-prod-db: never touch the prod database",
            ),
        );
    }
}

#[tokio::test]
async fn an_approval_nobody_decided_in_time_expires_and_is_denied() {
    let server = TestServer::start_with_toml(
        r#"
        [[rules]]
        name = "quick"
        action = "require"
        ttl_seconds = 1
        "#,
    )
    .await;
    let client = client(&server.url());
    for surface in SURFACES {
        let session = session_of(surface, "expiry");
        let mut watch = watch_requests(&server.url()).await;
        let input = surface.payload(&session, 0);
        let hook = tokio::spawn({
            let (url, input) = (server.url(), input.clone());
            async move { surface.run(&url, &input, &[]).await }
        });
        let approval = next_pending(&mut watch).await;
        let output = hook.await.unwrap();
        let expired = |id: &str| {
            surface.denied(&format!(
                "countersign: approval {id} expired before anyone decided"
            ))
        };
        assert_answer(surface, &output, expired(&approval.id));

        // The same call again: a host retry of a named call gets the same answer; a call
        // known only by its digest is a new call, asked anew (its earlier approval ended).
        let output = surface.run(&server.url(), &input, &[]).await;
        let approvals = approvals_of(&client, &session).await;
        if surface.has_call_id() {
            assert_eq!(approvals.len(), 1, "{surface:?}");
        } else {
            assert_eq!(approvals.len(), 2, "{surface:?}");
            assert_eq!(
                approvals[0].idempotency_key,
                format!("{}.1", approval.idempotency_key)
            );
        }
        assert_answer(surface, &output, expired(&approvals[0].id));
    }
}

#[tokio::test]
async fn an_unreachable_server_or_a_refused_token_is_a_denial_or_with_on_error_ask_the_hosts_prompt(
) {
    // Nothing listens on port 1.
    let down = "http://127.0.0.1:1";
    let unreachable =
        format!("countersign: cannot reach the approval server at {down}; nothing was approved");
    let guarded = TestServer::start_with(|config| {
        config.tokens = vec![token("agent", Role::Agent, &["*"], "s3cret")];
    })
    .await;
    let refused = "countersign: the approval server refused the token; check COUNTERSIGN_TOKEN";
    for surface in SURFACES {
        let input = surface.payload(&session_of(surface, "down"), 0);
        let output = surface.run(down, &input, &["--timeout", "1s"]).await;
        assert_answer(surface, &output, surface.denied(&unreachable));
        assert!(
            stderr(&output).contains("unavailable"),
            "{}",
            stderr(&output)
        );
        let output = surface
            .run(down, &input, &["--timeout", "1s", "--on-error", "ask"])
            .await;
        assert_answer(surface, &output, surface.asked(&unreachable));

        let output = surface.run(&guarded.url(), &input, &[]).await;
        assert_answer(surface, &output, surface.denied(refused));
    }
}

#[tokio::test]
async fn unusable_input_is_denied_without_asking_anyone() {
    let server = TestServer::start().await;
    for surface in SURFACES {
        let name = surface.agent();
        let cases: [(&[u8], String); 3] = [
            (
                b"garbage",
                "not hook JSON (expected value at line 1 column 1)".into(),
            ),
            (
                br#"{"session_id": "s", "tool_input": {}}"#,
                "not hook JSON (missing field `tool_name` at line 1 column 37)".into(),
            ),
            (
                br#"{"session_id": "s", "hook_event_name": "Stop", "tool_name": "Bash"}"#,
                format!(
                    "hook_event_name is \"Stop\", this hook answers {:?} (check --event)",
                    match surface {
                        ClaudePreToolUse | CodexPreToolUse => "PreToolUse",
                        ClaudePermissionRequest | CodexPermissionRequest => "PermissionRequest",
                        GeminiBeforeTool => "BeforeTool",
                    }
                ),
            ),
        ];
        for (input, problem) in cases {
            let output = surface.run(&server.url(), input, &[]).await;
            assert_answer(
                surface,
                &output,
                surface.denied(&format!(
                    "countersign: the {name} hook input is not usable: {problem}"
                )),
            );
        }
    }
    // An unreadable config file is as much a reason to deny.
    for surface in SURFACES {
        let input = surface.payload(&session_of(surface, "config"), 0);
        let output = surface
            .run(&server.url(), &input, &["--config", "/nonexistent/cs.toml"])
            .await;
        assert_answer(
            surface,
            &output,
            surface.denied(
                "countersign: cannot read config file /nonexistent/cs.toml: No such file or directory (os error 2)",
            ),
        );
    }
    let all = client(&server.url())
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .unwrap();
    assert!(all.approvals.is_empty(), "nothing was requested");
}

#[tokio::test]
async fn the_hook_answers_before_the_host_times_it_out_and_withdraws_the_request() {
    // The host would kill the hook (and run the tool) after this long. The hook's 4 s leave
    // 0.8 s to withdraw the request (a fifth of the budget), which a loaded machine needs: it
    // waits 3.2 s, and says so (not "4s").
    const HOST_TIMEOUT: Duration = Duration::from_secs(10);
    let server = TestServer::start().await;
    let url = server.url();
    let client = client(&url);
    let (url, client) = (&url, &client);
    // Each surface's hook at once: the test waits one budget, not five.
    futures::future::join_all(SURFACES.map(|surface| async move {
        let session = session_of(surface, "deadline");
        let mut child = surface.command(url, &["--timeout", "4s"]);
        child
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = child.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stdin, &surface.payload(&session, 0))
            .await
            .unwrap();
        drop(stdin);
        let output = tokio::time::timeout(HOST_TIMEOUT, child.wait_with_output())
            .await
            .expect("the hook outlived the host's timeout: the host would have run the tool")
            .unwrap();
        let approval = approvals_of(client, &session).await.remove(0);
        assert_answer(
            surface,
            &output,
            surface.denied(&format!(
                "countersign: no decision within 3s 200ms; approval {} was withdrawn",
                approval.id
            )),
        );
        assert_eq!(approval.state(), pb::ApprovalState::Cancelled);
        // Had the withdrawal failed, the approval would expire with the hook's wait, not
        // with the server's default TTL of an hour.
        let lifetime = approval.expires_at.unwrap().seconds - approval.created_at.unwrap().seconds;
        assert!(
            lifetime <= 6,
            "{surface:?}: the approval outlives the wait by {lifetime} s"
        );
        assert_eq!(
            approval.resolution.unwrap().reason,
            "no decision within 3s 200ms"
        );
    }))
    .await;
}

/// A host that writes its payload and never closes stdin still gets a denial, and the hook
/// exits with it: a hook the host has to kill is a call the host runs.
#[tokio::test]
async fn a_host_that_keeps_stdin_open_gets_a_denial_and_the_hook_exits() {
    const HOST_TIMEOUT: Duration = Duration::from_secs(10);
    let server = TestServer::start().await;
    let surface = SURFACES[0];
    let mut child = surface.command(&server.url(), &["--timeout", "2s"]);
    child
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = child.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &surface.payload("open-stdin", 0))
        .await
        .unwrap();
    let output = tokio::time::timeout(HOST_TIMEOUT, child.wait_with_output())
        .await
        .expect("the hook outlived the host's timeout: the host would have run the tool")
        .unwrap();
    drop(stdin);
    let answer: Value = serde_json::from_slice(&output.stdout).expect("one JSON answer");
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "deny",
        "{answer}"
    );
    assert_eq!(output.status.code(), Some(0));
}

#[tokio::test]
async fn the_default_wait_stays_under_each_hosts_default_timeout() {
    let output = countersign("http://127.0.0.1:1")
        .args(["hook", "--help"])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 0);
    let help = stdout(&output)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for promise in [
        "540s (Claude Code and Codex time hooks out after 600s)",
        "gemini: 50s (Gemini CLI: 60000 ms)",
    ] {
        assert!(help.contains(promise), "--help lacks {promise:?}:\n{help}");
    }
}

/// A ONCE approval approves one call: a call known only by its digest is marked used
/// (HANDED_OFF) when its allow goes to the host, and the same call made again is asked anew.
/// A named call (a host's call id) seen again is the same call: the same answer.
#[tokio::test]
async fn a_once_approval_answers_one_call_and_the_same_call_again_is_asked_anew() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    for surface in SURFACES {
        let session = session_of(surface, "once");
        let (output, approval) = decided(
            &server,
            surface,
            &session,
            0,
            pb::Verdict::Approve,
            pb::Scope::Once,
            "",
        )
        .await;
        let allowed = surface.allowed(&format!("countersign: approved by {APPROVER}"), None);
        assert_answer(surface, &output, allowed.clone());
        let first = client.get_approval(&approval.id).await.unwrap();
        if surface.has_call_id() {
            assert_eq!(first.state(), pb::ApprovalState::Approved, "{surface:?}");
            let again = surface
                .run(&server.url(), &surface.payload(&session, 0), &[])
                .await;
            assert_answer(surface, &again, allowed);
            assert_eq!(approvals_of(&client, &session).await.len(), 1);
            continue;
        }
        assert_eq!(first.state(), pb::ApprovalState::Consumed, "{surface:?}");
        assert_eq!(
            first.consumption.unwrap().outcome(),
            pb::ConsumeOutcome::HandedOff
        );
        // The identical call again: a new approval, and nobody answered it yet.
        let (again, second) = decided(
            &server,
            surface,
            &session,
            0,
            pb::Verdict::Reject,
            pb::Scope::Once,
            "not twice",
        )
        .await;
        assert_ne!(second.id, approval.id, "{surface:?}");
        assert_answer(
            surface,
            &again,
            surface.denied(&format!("countersign: rejected by {APPROVER}: not twice")),
        );
        assert_eq!(approvals_of(&client, &session).await.len(), 2);
    }
}

#[tokio::test]
async fn a_retried_call_gets_the_same_approval_and_identical_digest_calls_share_one_use() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    for surface in [ClaudePreToolUse, ClaudePermissionRequest, GeminiBeforeTool] {
        let session = session_of(surface, "retry");
        let mut watch = watch_requests(&server.url()).await;
        let input = surface.payload(&session, 0);
        let first = tokio::spawn({
            let (url, input) = (server.url(), input.clone());
            async move { surface.run(&url, &input, &[]).await }
        });
        let approval = next_pending(&mut watch).await;
        let second = tokio::spawn({
            let (url, input) = (server.url(), input.clone());
            async move { surface.run(&url, &input, &[]).await }
        });
        // Let the retry attach to the approval before anyone decides (if it is later, it
        // finds the approval resolved: the same answer, still one approval).
        tokio::time::sleep(Duration::from_millis(300)).await;
        approve(&client, &approval.id, pb::Scope::Once, "").await;
        let expected = surface.allowed(&format!("countersign: approved by {APPROVER}"), None);
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        if surface.has_call_id() {
            assert_answer(surface, &first, expected.clone());
            assert_answer(surface, &second, expected);
        } else {
            // Known only by its digest, the second is indistinguishable from the same call
            // made twice: the approval is used once, the other invocation is denied.
            let allowed = [&first, &second]
                .into_iter()
                .filter(|output| answer_of(output) == expected)
                .count();
            assert_eq!(allowed, 1, "{surface:?}");
            let used = format!(
                "countersign: approval {} was already used by an identical call; this call was not approved, ask again",
                approval.id
            );
            assert!(
                [&first, &second]
                    .iter()
                    .any(|output| stdout(output).contains(&used)),
                "{surface:?}"
            );
        }
        assert_eq!(
            approvals_of(&client, &session).await.len(),
            1,
            "{surface:?}"
        );
    }
}

#[tokio::test]
async fn a_hook_command_line_the_host_cannot_use_blocks_the_call() {
    // Exit 2 is "block" in all three hosts; any other failure would let the call run. And
    // `countersign-hook ARGS` is `countersign hook ARGS`: the same block.
    let server = "http://127.0.0.1:1";
    for command in [
        countersign(server).args(["hook", "claude-code", "--bogus"]),
        countersign(server).args(["hook", "nobody"]),
        countersign(server).args(["--server", "http://x", "hook", "codex", "--timeout", "soon"]),
        countersign_hook(server).args(["claude-code", "--bogus"]),
        countersign_hook(server).args(["nobody"]),
    ] {
        let output = command.output().await.unwrap();
        assert_exit(&output, 2);
        assert!(stdout(&output).is_empty());
    }
    // Other commands keep their usage exit code.
    let output = countersign(server)
        .args(["list", "--bogus"])
        .output()
        .await
        .unwrap();
    assert_exit(&output, 64);
    // And the same help, with its own usage line.
    let help = countersign_hook("http://127.0.0.1:1")
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert_exit(&help, 0);
    let hook_help = countersign("http://127.0.0.1:1")
        .args(["hook", "--help"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        stdout(&help),
        stdout(&hook_help).replace(
            "Usage: countersign hook [OPTIONS]",
            "Usage: countersign-hook [OPTIONS]"
        )
    );
}

/// The rest of a child's stderr, kept open while the child runs (a hook whose stderr is closed
/// cannot print its explanation).
type Stderr = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>;

/// A Claude Code hook for call `variant` in `session` (see [`Surface::payload`]), started on
/// `server`, once it waits for a decision: the child, its stderr and the approval it waits on.
async fn waiting_hook(
    server: &TestServer,
    watch: &mut countersign_client::Watch,
    session: &str,
    variant: u32,
) -> (tokio::process::Child, Stderr, pb::Approval) {
    use tokio::io::AsyncBufReadExt;
    let surface = ClaudePreToolUse;
    let mut command = surface.command(&server.url(), &[]);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &surface.payload(session, variant))
        .await
        .unwrap();
    drop(stdin);
    let approval = next_pending(watch).await;
    // The hook says so once it holds the approval it waits on.
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(STEP, stderr.next_line())
            .await
            .expect("the hook waits in time")
            .unwrap()
            .expect("the hook waits");
        if line.contains("waiting for a decision on approval") {
            assert!(line.contains(&approval.id), "{line}");
            break;
        }
    }
    (child, stderr, approval)
}

/// Claude Code kills a hook when the user presses Esc, and hosts stop hooks with SIGTERM or
/// SIGHUP: the hook withdraws its approval (approvers no longer see buttons for a call nobody
/// waits for), still answers with a denial, and exits.
#[tokio::test]
async fn a_hook_stopped_by_a_signal_withdraws_its_approval_and_exits() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let mut watch = watch_requests(&server.url()).await;
    for (variant, signal) in (1..).zip(["INT", "TERM", "HUP"]) {
        let (child, _stderr, approval) =
            waiting_hook(&server, &mut watch, &format!("stop-{signal}"), variant).await;
        send_signal(&child, signal);
        let output = tokio::time::timeout(STEP, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("the hook did not exit on SIG{signal}"))
            .unwrap();
        let reason = format!("withdrawn: the hook was stopped (SIG{signal})");
        assert_answer(
            ClaudePreToolUse,
            &output,
            ClaudePreToolUse.denied(&format!(
                "countersign: {reason}; approval {} was withdrawn",
                approval.id
            )),
        );
        let withdrawn = client.get_approval(&approval.id).await.unwrap();
        assert_eq!(
            withdrawn.state(),
            pb::ApprovalState::Cancelled,
            "SIG{signal}"
        );
        assert_eq!(withdrawn.resolution.unwrap().reason, reason);
    }
}

/// A hook killed outright (SIGKILL) cannot withdraw anything: its approval asked the server
/// to, and the server does once the hook's connection is gone for the grace.
#[tokio::test]
async fn a_killed_hook_s_approval_is_withdrawn_by_the_server() {
    let server = TestServer::start_with(|config| config.approvals.caller_grace_ms = 300).await;
    let mut watch = watch_requests(&server.url()).await;
    let (mut child, _stderr, approval) = waiting_hook(&server, &mut watch, "killed", 0).await;
    assert!(approval.withdraw_when_caller_leaves, "the hook asks for it");
    // Time for the hook's WaitForDecision to reach the server: on a database shared by
    // replicas only a wait the server saw and lost starts the grace (nothing asserts on it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_signal(&child, "KILL");
    tokio::time::timeout(STEP, child.wait())
        .await
        .expect("killed")
        .unwrap();
    // Watched, not waited for: a wait would be a caller still there.
    let withdrawn = loop {
        let item = tokio::time::timeout(STEP, watch.next())
            .await
            .expect("withdrawn in time")
            .unwrap();
        if let countersign_client::WatchItem::Event(event) = item {
            let changed = event.approval.unwrap_or_default();
            if changed.id == approval.id && changed.state() != pb::ApprovalState::Pending {
                break changed;
            }
        }
    };
    assert_eq!(withdrawn.state(), pb::ApprovalState::Cancelled);
    assert_eq!(
        withdrawn.resolution.unwrap().reason,
        "withdrawn: the caller left"
    );
}
