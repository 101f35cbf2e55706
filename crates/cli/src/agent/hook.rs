//! `hook`: a coding agent's pre-tool hook. Reads the host's JSON on stdin, asks countersign,
//! and answers on stdout in the host's own format, always before `--timeout`.
//!
//! Every host fails open when a hook errors, times out or prints something it does not
//! understand, so this command never does any of those: whatever happens it prints a decision
//! the host understands and exits 0, denying when it cannot decide.

use std::io::Write;
use std::time::Duration;

use countersign_client::gate::{self, Verdict};
use countersign_client::receipts;
use countersign_client::{pb, Client};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::agent::stop::{self, StopSignals};
use crate::args::{GateArgs, HookArgs, HookEvent, Host, OnError};
use crate::exit::CliError;
use crate::settings::{local_user, Settings};

/// The most hook input read from stdin; more is refused (and denied).
const MAX_INPUT_BYTES: u64 = 4 << 20;

/// The wait used when `--timeout` is not given: under Claude Code's and Codex's 600 s hook
/// timeout, and under Gemini CLI's 60 000 ms.
pub fn default_timeout(host: Host) -> Duration {
    match host {
        Host::Gemini => Duration::from_secs(50),
        Host::ClaudeCode | Host::Codex => Duration::from_secs(540),
    }
}

/// The agent id requests are made as when neither flag, environment nor config name one.
pub fn default_agent(host: Host) -> &'static str {
    match host {
        Host::ClaudeCode => "claude-code",
        Host::Codex => "codex",
        Host::Gemini => "gemini-cli",
    }
}

/// The host's own name of the hook event.
pub fn event_name(host: Host, event: HookEvent) -> &'static str {
    match (host, event) {
        (Host::Gemini, _) => "BeforeTool",
        (_, HookEvent::PreToolUse) => "PreToolUse",
        (_, HookEvent::PermissionRequest) => "PermissionRequest",
    }
}

/// When the wait for a decision ends, leaving time to withdraw the request and answer before
/// the whole budget is spent.
pub fn wait_deadline(started: Instant, budget: Duration) -> Instant {
    let reserve = (budget / 5).min(gate::WITHDRAW_TIMEOUT + Duration::from_secs(1));
    started + budget.saturating_sub(reserve)
}

/// The fields of the hosts' hook input that countersign uses; the rest is ignored.
#[derive(Debug, Deserialize)]
struct HookInput {
    #[serde(default)]
    session_id: String,
    #[serde(default)]
    hook_event_name: Option<String>,
    tool_name: String,
    #[serde(default)]
    tool_input: Value,
    #[serde(default)]
    tool_use_id: Option<String>,
}

/// One tool call to gate, from whichever surface it came.
pub struct Call {
    pub session_id: String,
    pub tool_name: String,
    /// Always a JSON object.
    pub input: Value,
    /// The host's id of the call, when it has one.
    pub call_id: Option<String>,
    /// Why the agent makes the call (`tool_input.description`), when it says.
    pub reason: String,
}

impl Call {
    pub fn new(
        session_id: String,
        tool_name: String,
        input: Value,
        call_id: Option<String>,
    ) -> Call {
        let input = match input {
            Value::Object(_) => input,
            Value::Null => json!({}),
            other => json!({ "input": other }),
        };
        let reason = input
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Call {
            session_id,
            tool_name,
            input,
            call_id: call_id.filter(|id| !id.is_empty()),
            reason,
        }
    }

    /// The approval request for this call. Without a host call id the key is a digest of the
    /// session, tool and input (then [`Call::key_is_derived`]).
    pub fn request(
        &self,
        settings: &Settings,
        gate_args: &GateArgs,
        default_agent: &str,
    ) -> pb::RequestApprovalRequest {
        pb::RequestApprovalRequest {
            agent_id: gate_args
                .agent_id
                .clone()
                .or_else(|| settings.agent_id.clone())
                .unwrap_or_else(|| default_agent.to_owned()),
            session_id: self.session_id.clone(),
            requester: local_user().unwrap_or_default(),
            idempotency_key: self
                .call_id
                .clone()
                .unwrap_or_else(|| gate::call_key(&self.session_id, &self.tool_name, &self.input)),
            tool_name: self.tool_name.clone(),
            arguments_json: self.input.to_string(),
            action: gate::describe_call(&self.tool_name, &self.input),
            reason: self.reason.clone(),
            risk: settings.tool_risk(&gate_args.risks, &self.tool_name).into(),
            routes: gate_args.routes.clone(),
            ..Default::default()
        }
    }

    pub fn key_is_derived(&self) -> bool {
        self.call_id.is_none()
    }
}

/// An approval the hook asked for and waits on.
struct Asked {
    client: Client,
    approval_id: String,
}

/// Runs the hook; returns the exit code (always 0: the answer is on stdout). Stopped by a
/// signal (the host killed it), it withdraws what it asked for and denies.
pub async fn run(settings: Result<Settings, CliError>, args: HookArgs) -> i32 {
    let started = Instant::now();
    let mut stops = StopSignals::install();
    let budget = args.gate.timeout.unwrap_or(default_timeout(args.host));
    let mut tool_name = String::new();
    let mut asked = None;
    let ended = {
        let decided = decide(settings, &args, started, budget, &mut tool_name, &mut asked);
        tokio::select! {
            decided = tokio::time::timeout(budget, decided) => Ok(decided),
            signal = stops.recv() => Err(signal),
        }
    };
    let verdict = match ended {
        Ok(Ok(verdict)) => verdict,
        Ok(Err(_)) => Verdict::failed(format!(
            "countersign: no decision within {}",
            humantime::format_duration(budget)
        )),
        Err(signal) => stopped(signal, asked).await,
    };
    let failure = matches!(verdict, Verdict::Deny { failure: true, .. });
    tracing::info!(
        host = ?args.host,
        event = ?args.event,
        allowed = verdict.is_allow(),
        failure,
        "hook answered"
    );
    if !verdict.is_allow() {
        eprintln!("{}", verdict.explanation());
    }
    let ask = failure && args.on_error == OnError::Ask;
    if let Some(answer) = answer(args.host, args.event, &tool_name, &verdict, ask) {
        let mut stdout = std::io::stdout().lock();
        // Nothing else could tell the host: if stdout is gone, so is the host.
        let _ = writeln!(stdout, "{answer}").and_then(|()| stdout.flush());
    }
    0
}

/// The answer of a hook stopped by `signal`: what it asked for is withdrawn, the call denied.
async fn stopped(signal: &str, asked: Option<Asked>) -> Verdict {
    let reason = stop::withdrawn_reason("the hook", signal);
    let Some(asked) = asked else {
        return Verdict::failed(format!(
            "countersign: the hook was stopped ({signal}) before it asked"
        ));
    };
    let id = asked.approval_id;
    let outcome = match stop::withdraw(&asked.client, &id, &reason).await {
        // Withdrawn, or decided against meanwhile.
        Some(verdict) if !verdict.is_allow() => return verdict,
        // Approved meanwhile; the host stopped waiting, so nothing runs.
        Some(_) => "was approved too late",
        None => "could not be withdrawn in time; the server withdraws it once this hook is gone",
    };
    Verdict::Deny {
        explanation: format!("countersign: {reason}; approval {id} {outcome}"),
        failure: true,
        approval_id: Some(id),
    }
}

/// Asks countersign about the call on stdin; names its tool in `tool_name` once known, and the
/// approval in `asked` while it waits.
async fn decide(
    settings: Result<Settings, CliError>,
    args: &HookArgs,
    started: Instant,
    budget: Duration,
    tool_name: &mut String,
    asked: &mut Option<Asked>,
) -> Verdict {
    let host_name = default_agent(args.host);
    if args.host == Host::Gemini && args.event == HookEvent::PermissionRequest {
        return Verdict::failed(
            "countersign: Gemini CLI has no PermissionRequest event; use the default (BeforeTool)",
        );
    }
    let input = match read_input().await {
        Ok(input) => input,
        Err(error) => return Verdict::failed(format!("countersign: cannot read stdin: {error}")),
    };
    let call = match parse_input(&input, event_name(args.host, args.event)) {
        Ok(call) => call,
        Err(error) => {
            return Verdict::failed(format!(
                "countersign: the {host_name} hook input is not usable: {error}"
            ))
        }
    };
    tool_name.clone_from(&call.tool_name);
    let settings = match settings {
        Ok(settings) => settings,
        Err(error) => return Verdict::failed(format!("countersign: {error}")),
    };
    let client = match settings.connect() {
        Ok(client) => client,
        Err(error) => return Verdict::failed(format!("countersign: {error}")),
    };
    let mut request = call.request(&settings, &args.gate, host_name);
    let deadline = wait_deadline(started, budget);
    gate::tie_to_the_waiting_caller(&mut request, deadline);
    let approval = match gate::request(&client, &request, deadline, call.key_is_derived()).await {
        Ok(approval) => approval,
        Err(error) => return Verdict::failed(gate::failure_text(&error, client.url())),
    };
    tracing::info!(approval_id = %approval.id, tool = %call.tool_name, args_digest = %approval.args_digest, "approval requested");
    if approval.state() == pb::ApprovalState::Pending {
        eprintln!(
            "countersign: waiting for a decision on approval {}",
            approval.id
        );
        *asked = Some(Asked {
            client: client.clone(),
            approval_id: approval.id.clone(),
        });
    }
    // The time it really waited: the budget less what is kept to withdraw and answer.
    let withdraw_reason = format!(
        "no decision within {}",
        humantime::format_duration(deadline - started)
    );
    let requested_digest = match receipts::digest_of(&request.arguments_json) {
        Ok(digest) => digest,
        Err(error) => return Verdict::failed(format!("countersign: {error}")),
    };
    let verdict = gate::await_verdict(
        &client,
        approval,
        deadline,
        &withdraw_reason,
        &requested_digest,
    )
    .await;
    if call.key_is_derived() {
        gate::hand_off(&client, verdict, host_name).await
    } else {
        verdict
    }
}

/// Reads all of stdin (on a blocking thread: the runtime has no async stdin).
pub async fn read_input() -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let read = tokio::task::spawn_blocking(|| {
        let mut input = Vec::new();
        std::io::stdin()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut input)
            .map(|_| input)
    });
    let input = read.await.map_err(std::io::Error::other)??;
    if input.len() as u64 > MAX_INPUT_BYTES {
        return Err(std::io::Error::other(format!(
            "more than {MAX_INPUT_BYTES} bytes"
        )));
    }
    Ok(input)
}

fn parse_input(input: &[u8], expected_event: &str) -> Result<Call, String> {
    let input: HookInput =
        serde_json::from_slice(input).map_err(|error| format!("not hook JSON ({error})"))?;
    if let Some(event) = &input.hook_event_name {
        if event != expected_event {
            return Err(format!(
                "hook_event_name is {event:?}, this hook answers {expected_event:?} (check --event)"
            ));
        }
    }
    if input.tool_name.is_empty() {
        return Err("tool_name is empty".into());
    }
    Ok(Call::new(
        input.session_id,
        input.tool_name,
        input.tool_input,
        input.tool_use_id,
    ))
}

/// The host's answer for a verdict; `None` means print nothing (the host's own flow decides).
/// `ask`: countersign could not decide and the user chose `--on-error ask`.
fn answer(
    host: Host,
    event: HookEvent,
    tool_name: &str,
    verdict: &Verdict,
    ask: bool,
) -> Option<Value> {
    let reason = verdict.explanation();
    // Edit-on-approve: the arguments the approver edited replace the tool's input.
    let updated_input = match verdict {
        Verdict::Allow { updated_input, .. } => updated_input.as_ref(),
        Verdict::Deny { .. } => None,
    };
    match (host, event) {
        // Gemini's hook output has no way to change the tool's input: an edit is not run as
        // requested, it is denied with the reason.
        (Host::Gemini, _) if updated_input.is_some() && !ask => Some(json!({
            "decision": "deny",
            "reason": format!("{reason}; Gemini CLI cannot run edited arguments, so the call is not run as requested"),
        })),
        (Host::Gemini, _) => Some(if ask || verdict.is_allow() {
            json!({})
        } else {
            json!({"decision": "deny", "reason": reason})
        }),
        (Host::ClaudeCode, HookEvent::PreToolUse) => {
            let decision = if ask {
                "ask"
            } else if verdict.is_allow() {
                "allow"
            } else {
                "deny"
            };
            let mut output = json!({
                "hookEventName": "PreToolUse",
                "permissionDecision": decision,
                "permissionDecisionReason": reason,
            });
            if let (Some(input), false) = (updated_input, ask) {
                output["updatedInput"] = input.clone();
            }
            Some(json!({ "hookSpecificOutput": output }))
        }
        // Codex takes `allow` only with updatedInput (an approval with edits), and no `ask`:
        // silence lets the call go on.
        (Host::Codex, HookEvent::PreToolUse) => match (ask, updated_input) {
            (false, Some(input)) => Some(json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": reason,
                "updatedInput": input,
            }})),
            _ => (!ask && !verdict.is_allow()).then(|| {
                json!({"hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": reason,
                }})
            }),
        },
        (_, HookEvent::PermissionRequest) => {
            if ask {
                return None;
            }
            let decision = match verdict {
                Verdict::Allow { session, .. } => {
                    let mut decision = json!({"behavior": "allow"});
                    if let Some(input) = updated_input {
                        decision["updatedInput"] = input.clone();
                    }
                    if host == Host::ClaudeCode && *session {
                        decision["updatedPermissions"] = json!([{
                            "type": "addRules",
                            "rules": [{"toolName": tool_name}],
                            "behavior": "allow",
                            "destination": "session",
                        }]);
                    }
                    decision
                }
                Verdict::Deny { .. } => json!({"behavior": "deny", "message": reason}),
            };
            Some(json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": decision,
            }}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_ends_early_enough_to_withdraw_and_answer() {
        let started = Instant::now();
        for (budget, wait) in [(540, 537_000), (50, 47_000), (2, 1_600), (1, 800)] {
            let deadline = wait_deadline(started, Duration::from_secs(budget));
            assert_eq!(deadline - started, Duration::from_millis(wait), "{budget}s");
        }
        for host in [Host::ClaudeCode, Host::Codex, Host::Gemini] {
            let host_default = match host {
                Host::Gemini => Duration::from_millis(60_000),
                _ => Duration::from_secs(600),
            };
            assert!(default_timeout(host) < host_default, "{host:?}");
        }
    }

    #[test]
    fn inputs_that_are_not_objects_are_wrapped_and_the_description_is_the_reason() {
        let call = Call::new("s".into(), "T".into(), json!("text"), Some(String::new()));
        assert_eq!(call.input, json!({"input": "text"}));
        assert_eq!(call.call_id, None, "an empty id is no id");
        let call = Call::new(
            "s".into(),
            "Bash".into(),
            json!({"description": "why"}),
            None,
        );
        assert_eq!(call.reason, "why");
    }
}
