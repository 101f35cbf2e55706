//! `mcp`: a Model Context Protocol server on stdin/stdout (newline-delimited JSON-RPC 2.0)
//! offering the approval tools.
//!
//! A small hand-written loop over serde_json rather than the `rmcp` crate: three tools and four
//! methods do not need its macros and transports, and the CLI builds faster without them.
//! Tool calls run concurrently; a waiting call reports progress when the client sent a
//! progressToken, and ends (withdrawing its approval) on `notifications/cancelled` or when
//! stdin closes.
//!
//! With `--channel` it is also a Claude Code channel relaying permission prompts: each
//! `notifications/claude/channel/permission_request` becomes an approval, and its verdict goes
//! back as `notifications/claude/channel/permission` with the same `request_id`. The terminal's
//! dialog stays live and the first answer wins; Claude Code does not tell a channel when the
//! terminal answered, so a relayed approval still pending is withdrawn as superseded when the
//! session's next permission request arrives (Claude Code shows, and relays, one dialog at a
//! time, so the earlier one was answered) or when the session ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_client::gate::{self, Verdict};
use countersign_client::receipts;
use countersign_client::version;
use countersign_client::withdrawal::WITHDRAWN_REASON_PREFIX;
use countersign_client::{pb, Client};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::agent::hook::Call;
use crate::agent::stop::{self, StopSignals};
use crate::args::{McpArgs, Risk};
use crate::exit::{CliError, Exit};
use crate::settings::Settings;

/// Protocol revisions this server speaks, newest first; a client asking for another gets the
/// newest.
const PROTOCOL_VERSIONS: [&str; 2] = ["2025-11-25", "2025-06-18"];

/// The agent id of `approve` requests unless configured: the permission-prompt tool is
/// Claude Code's.
const APPROVE_AGENT: &str = "claude-code";

/// The agent id of `request_approval` requests unless configured.
const REQUEST_AGENT: &str = "mcp-agent";

/// The wait of a tool call unless `--timeout` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(540);

/// How long in-flight calls get to withdraw their approvals once stdin closed: time to finish
/// a request being retried, then to cancel it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(
    gate::REQUEST_RETRY_WINDOW.as_secs() + gate::WITHDRAW_TIMEOUT.as_secs() + 1,
);

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Serves until stdin closes or a stop signal arrives.
pub async fn serve(client: Client, settings: &Settings, args: McpArgs) -> Result<Exit, CliError> {
    let mut stops = StopSignals::install();
    let (out, out_rx) = mpsc::unbounded_channel::<Value>();
    let writer = std::thread::spawn(move || write_messages(out_rx));
    let mut lines = read_lines();
    let tools = Arc::new(Tools {
        client,
        settings: settings.clone(),
        timeout: args.gate.timeout.unwrap_or(DEFAULT_TIMEOUT),
        progress_interval: args.progress_interval.max(Duration::from_millis(10)),
        session_id: format!("mcp-{}", uuid::Uuid::now_v7()),
        args,
        out: out.clone(),
    });
    tracing::info!(session_id = %tools.session_id, "MCP server ready on stdio");
    let mut in_flight: HashMap<String, oneshot::Sender<String>> = HashMap::new();
    let mut calls: JoinSet<String> = JoinSet::new();
    // Why the calls still waiting are withdrawn, and how long they get for it.
    let (why, grace) = loop {
        tokio::select! {
            signal = stops.recv() => {
                break (stop::withdrawn_reason("countersign mcp", signal), stop::WITHDRAW_LIMIT);
            }
            line = lines.recv() => match line {
                Some(line) if line.trim().is_empty() => {}
                Some(line) => {
                    if let Some(reply) = handle(&line, &tools, &mut in_flight, &mut calls) {
                        let _ = out.send(reply);
                    }
                }
                // The client is gone: withdraw what is still waiting, so approvers see why.
                None => break (format!("{WITHDRAWN_REASON_PREFIX}the MCP client disconnected"), SHUTDOWN_GRACE),
            },
            Some(done) = calls.join_next() => {
                if let Ok(key) = done {
                    in_flight.remove(&key);
                }
            }
        }
    };
    for (_, cancel) in in_flight.drain() {
        let _ = cancel.send(why.clone());
    }
    let _ = tokio::time::timeout(grace, async { while calls.join_next().await.is_some() {} }).await;
    // A call still running after the grace (a server that does not answer) holds the output:
    // stop it, or the writer below never finishes and the process never exits.
    calls.abort_all();
    while calls.join_next().await.is_some() {}
    drop(tools);
    drop(out);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    Ok(Exit::Success)
}

/// The lines of stdin, read on a thread of their own (the runtime has no async stdin); the
/// channel closes at end of input or on a read error.
fn read_lines() -> mpsc::UnboundedReceiver<String> {
    let (lines, received) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) => {
                    if lines.send(line).is_err() {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read stdin; stopping");
                    return;
                }
            }
        }
    });
    received
}

/// Writes each message as one line, flushed, until every sender is gone.
fn write_messages(mut messages: mpsc::UnboundedReceiver<Value>) {
    let mut stdout = std::io::stdout();
    while let Some(message) = messages.blocking_recv() {
        if writeln!(stdout, "{message}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            tracing::warn!("stdout closed; dropping MCP messages");
            return;
        }
    }
}

/// Handles one line; returns the immediate reply, if any (tool calls reply from their task).
fn handle(
    line: &str,
    tools: &Arc<Tools>,
    in_flight: &mut HashMap<String, oneshot::Sender<String>>,
    calls: &mut JoinSet<String>,
) -> Option<Value> {
    let message: Value = match serde_json::from_str(line) {
        Ok(message) => message,
        Err(error) => return Some(error_reply(&Value::Null, PARSE_ERROR, &format!("{error}"))),
    };
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        if message.is_object()
            && (message.get("result").is_some() || message.get("error").is_some())
        {
            // A response to a request this server never sends.
            return None;
        }
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        return Some(error_reply(
            &id,
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 request",
        ));
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let Some(id) = message.get("id").filter(|id| !id.is_null()).cloned() else {
        if method == PERMISSION_REQUEST && tools.args.channel {
            relay_permission_request(params, tools, in_flight, calls);
        } else if method == "notifications/cancelled" {
            let key = params.get("requestId").map(Value::to_string);
            if let Some(cancel) = key.and_then(|key| in_flight.remove(&key)) {
                let why = params
                    .get("reason")
                    .and_then(Value::as_str)
                    .map(|reason| format!("the MCP client cancelled the call: {reason}"))
                    .unwrap_or_else(|| "the MCP client cancelled the call".into());
                let _ = cancel.send(why);
            }
        }
        return None;
    };
    match method {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = PROTOCOL_VERSIONS
                .into_iter()
                .find(|version| Some(*version) == asked)
                .unwrap_or(PROTOCOL_VERSIONS[0]);
            Some(result_reply(
                &id,
                json!({
                    "protocolVersion": version,
                    "capabilities": capabilities(tools.args.channel),
                    "serverInfo": {"name": "countersign", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Ask a human before risky actions: request_approval, then act only when the status is approved.",
                }),
            ))
        }
        "ping" => Some(result_reply(&id, json!({}))),
        "tools/list" => Some(result_reply(&id, json!({"tools": tool_definitions()}))),
        "tools/call" => {
            let name = params
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !["approve", "request_approval", "check_approval"].contains(&name) {
                return Some(error_reply(
                    &id,
                    INVALID_PARAMS,
                    &format!("unknown tool {name:?}"),
                ));
            }
            let name = name.to_owned();
            let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
            let progress = params
                .get("_meta")
                .and_then(|meta| meta.get("progressToken"))
                .cloned();
            let key = id.to_string();
            let (cancel, cancelled) = oneshot::channel();
            in_flight.insert(key.clone(), cancel);
            let tools = Arc::clone(tools);
            calls.spawn(async move {
                let outcome = tools.call(&name, arguments, progress, cancelled).await;
                // A cancelled request gets no response.
                if let Some(result) = outcome {
                    let _ = tools.out.send(result_reply(&id, result));
                }
                key
            });
            None
        }
        other => Some(error_reply(
            &id,
            METHOD_NOT_FOUND,
            &format!("method not found: {other}"),
        )),
    }
}

/// Claude Code's notification of a permission dialog it shows.
const PERMISSION_REQUEST: &str = "notifications/claude/channel/permission_request";
/// The channel's answer to one.
const PERMISSION_VERDICT: &str = "notifications/claude/channel/permission";
/// The `in_flight` keys of relayed permission prompts start with this.
const RELAY_KEY_PREFIX: &str = "relay:";

fn capabilities(channel: bool) -> Value {
    let mut capabilities = json!({"tools": {"listChanged": false}});
    if channel {
        capabilities["experimental"] =
            json!({"claude/channel": {}, "claude/channel/permission": {}});
    }
    capabilities
}

/// Starts relaying a permission prompt; the prompts of the session still waiting are
/// superseded (withdrawn, no verdict sent).
fn relay_permission_request(
    params: Value,
    tools: &Arc<Tools>,
    in_flight: &mut HashMap<String, oneshot::Sender<String>>,
    calls: &mut JoinSet<String>,
) {
    let text = |key: &str| params.get(key).and_then(Value::as_str).unwrap_or_default();
    let request_id = text("request_id").to_owned();
    if request_id.is_empty() {
        tracing::warn!("ignoring a permission request without request_id");
        return;
    }
    let earlier: Vec<String> = in_flight
        .keys()
        .filter(|key| key.starts_with(RELAY_KEY_PREFIX))
        .cloned()
        .collect();
    for key in earlier {
        if let Some(cancel) = in_flight.remove(&key) {
            let _ = cancel.send(
                "superseded: Claude Code moved on to its next permission prompt (answered in the terminal)"
                    .into(),
            );
        }
    }
    let prompt = PermissionPrompt {
        request_id,
        tool_name: text("tool_name").to_owned(),
        description: text("description").to_owned(),
        input_preview: text("input_preview").to_owned(),
    };
    let key = format!("{RELAY_KEY_PREFIX}{}", prompt.request_id);
    let (cancel, cancelled) = oneshot::channel();
    in_flight.insert(key.clone(), cancel);
    let tools = Arc::clone(tools);
    calls.spawn(async move {
        tools.relay(prompt, cancelled).await;
        key
    });
}

/// A permission dialog Claude Code relays.
struct PermissionPrompt {
    request_id: String,
    tool_name: String,
    description: String,
    input_preview: String,
}

fn result_reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error_reply(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// A tool result holding one text block.
fn text_result(text: String, is_error: bool) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": is_error})
}

fn tool_definitions() -> Value {
    json!([
        {
            "name": "approve",
            "description": "Permission prompt for Claude Code (--permission-prompt-tool mcp__countersign__approve): asks a human through countersign whether the tool call may run.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "tool_name": {"type": "string", "description": "The tool asking for permission"},
                    "input": {"type": "object", "description": "The tool's input"},
                    "tool_use_id": {"type": "string", "description": "The tool call's id"}
                },
                "required": ["tool_name", "input"]
            }
        },
        {
            "name": "request_approval",
            "description": "Ask a human to approve an action before doing it. Waits for the decision unless wait is false; act only when the status is approved.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "description": "One line saying what you are about to do"},
                    "reason": {"type": "string", "description": "Why it is needed"},
                    "risk_level": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
                    "arguments": {"type": "object", "description": "The exact parameters of the action"},
                    "tool_name": {"type": "string", "description": "The tool or operation; an approval for the session then covers its later calls (without it, every request is decided on its own)"},
                    "wait": {"type": "boolean", "description": "Wait for the decision (default true); false returns an approval_id for check_approval"}
                },
                "required": ["action"]
            }
        },
        {
            "name": "check_approval",
            "description": "The current status of an approval requested with wait: false.",
            "inputSchema": {
                "type": "object",
                "properties": {"approval_id": {"type": "string"}},
                "required": ["approval_id"]
            }
        }
    ])
}

/// What the tool calls share.
struct Tools {
    client: Client,
    settings: Settings,
    args: McpArgs,
    timeout: Duration,
    progress_interval: Duration,
    /// Session-scoped approvals given through this server apply to the calls of this process.
    session_id: String,
    out: mpsc::UnboundedSender<Value>,
}

impl Tools {
    /// Runs a tool; `None` when the client cancelled it.
    async fn call(
        &self,
        name: &str,
        arguments: Value,
        progress: Option<Value>,
        cancelled: oneshot::Receiver<String>,
    ) -> Option<Value> {
        match name {
            "approve" => self.approve(arguments, progress, cancelled).await,
            "request_approval" => self.request_approval(arguments, progress, cancelled).await,
            _ => Some(self.check_approval(&arguments).await),
        }
    }

    /// Claude Code's permission prompt: `{"behavior":"allow","updatedInput":...}` or
    /// `{"behavior":"deny","message":...}`, as the text of one block, whatever happens.
    async fn approve(
        &self,
        arguments: Value,
        progress: Option<Value>,
        cancelled: oneshot::Receiver<String>,
    ) -> Option<Value> {
        let tool_name = arguments.get("tool_name").and_then(Value::as_str);
        let verdict = match tool_name.filter(|name| !name.is_empty()) {
            None => Verdict::failed("countersign: the approve tool was called without tool_name"),
            Some(tool_name) => {
                let input = arguments.get("input").cloned().unwrap_or(json!({}));
                let call = Call::new(
                    self.session_id.clone(),
                    tool_name.to_owned(),
                    input.clone(),
                    arguments
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                );
                let request = call.request(&self.settings, &self.args.gate, APPROVE_AGENT);
                let derived = call.key_is_derived();
                let verdict = self.gate(request, derived, progress, cancelled).await?;
                let verdict = if derived {
                    gate::hand_off(&self.client, verdict, "the MCP client").await
                } else {
                    verdict
                };
                if let Verdict::Allow { updated_input, .. } = &verdict {
                    // The input as the host sent it, or as an approver edited it.
                    let input = updated_input.clone().unwrap_or(input);
                    let answer = json!({"behavior": "allow", "updatedInput": input});
                    return Some(text_result(answer.to_string(), false));
                }
                verdict
            }
        };
        let answer = json!({"behavior": "deny", "message": verdict.explanation()});
        Some(text_result(answer.to_string(), false))
    }

    /// Asks about a relayed permission prompt and sends the verdict back; sends nothing when
    /// the prompt was superseded (its approval is withdrawn).
    async fn relay(&self, prompt: PermissionPrompt, cancelled: oneshot::Receiver<String>) {
        let tool_name = if prompt.tool_name.is_empty() {
            "unknown tool".to_owned()
        } else {
            prompt.tool_name
        };
        // The call id makes a resent prompt the same approval; the session keeps it apart from
        // another Claude Code session's prompt of the same id.
        // Claude Code sends the tool's input as JSON text, cut when long: the input itself when
        // it parses, else the text as Claude Code sent it (never JSON inside JSON).
        let (input, action) = match serde_json::from_str::<Value>(&prompt.input_preview) {
            Ok(input @ Value::Object(_)) => (input, None),
            _ => (
                json!({"input_preview": prompt.input_preview}),
                Some(format!("{tool_name} {}", prompt.input_preview)),
            ),
        };
        let call = Call::new(
            self.session_id.clone(),
            tool_name,
            input,
            Some(format!("{}:{}", self.session_id, prompt.request_id)),
        );
        let mut request = call.request(&self.settings, &self.args.gate, APPROVE_AGENT);
        if let Some(action) = action {
            request.action = gate::truncate(&action, gate::MAX_ACTION_CHARS);
        }
        if !prompt.description.trim().is_empty() {
            request.reason = prompt.description;
        }
        let Some(verdict) = self.gate(request, false, None, cancelled).await else {
            tracing::info!(request_id = %prompt.request_id, "permission prompt superseded");
            return;
        };
        let behavior = if verdict.is_allow() { "allow" } else { "deny" };
        let _ = self.out.send(json!({
            "jsonrpc": "2.0",
            "method": PERMISSION_VERDICT,
            "params": {"request_id": prompt.request_id, "behavior": behavior},
        }));
    }

    async fn request_approval(
        &self,
        arguments: Value,
        progress: Option<Value>,
        cancelled: oneshot::Receiver<String>,
    ) -> Option<Value> {
        let request = match self.explicit_request(&arguments) {
            Ok(request) => request,
            Err(problem) => return Some(text_result(problem, true)),
        };
        if arguments.get("wait").and_then(Value::as_bool) == Some(false) {
            let deadline = Instant::now() + self.timeout;
            return Some(
                match gate::request(&self.client, &request, deadline, false).await {
                    Ok(approval) if approval.state() == pb::ApprovalState::Pending => text_result(
                        json!({"status": "awaiting_approval", "approval_id": approval.id})
                            .to_string(),
                        false,
                    ),
                    Ok(approval) => text_result(status_of(&approval).to_string(), false),
                    Err(error) => text_result(gate::failure_text(&error, self.client.url()), true),
                },
            );
        }
        let verdict = self.gate(request, false, progress, cancelled).await?;
        Some(self.verdict_result(&verdict).await)
    }

    async fn check_approval(&self, arguments: &Value) -> Value {
        let Some(approval_id) = arguments.get("approval_id").and_then(Value::as_str) else {
            return text_result("check_approval needs approval_id".into(), true);
        };
        match self.client.get_approval(approval_id).await {
            Ok(approval) => text_result(status_of(&approval).to_string(), false),
            Err(error) => text_result(gate::failure_text(&error, self.client.url()), true),
        }
    }

    /// The request of a `request_approval` call, or what is wrong with its arguments.
    fn explicit_request(&self, arguments: &Value) -> Result<pb::RequestApprovalRequest, String> {
        let text = |key: &str| arguments.get(key).and_then(Value::as_str);
        let action = text("action")
            .filter(|action| !action.trim().is_empty())
            .ok_or("request_approval needs action: one line saying what you are about to do")?;
        // A session grant approves later calls of the same tool: only for a named tool, never
        // for every later request_approval of unrelated actions.
        let (tool_name, session_id) = match text("tool_name") {
            Some(tool_name) => (tool_name.to_owned(), self.session_id.clone()),
            None => ("request_approval".to_owned(), String::new()),
        };
        let call_arguments = match arguments.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(object @ Value::Object(_)) => object.clone(),
            Some(_) => return Err("arguments must be a JSON object".into()),
        };
        let risk = match text("risk_level") {
            None => self.settings.tool_risk(&self.args.gate.risks, &tool_name),
            Some(level) => {
                let risk = <Risk as clap::ValueEnum>::from_str(level, true).map_err(|_| {
                    format!("risk_level {level:?} is not one of low, medium, high, critical")
                })?;
                pb::Risk::from(risk)
            }
        };
        let call = Call::new(session_id, tool_name, call_arguments, None);
        let mut request = call.request(&self.settings, &self.args.gate, REQUEST_AGENT);
        request.idempotency_key = uuid::Uuid::now_v7().to_string();
        request.action = action.to_owned();
        request.reason = text("reason").unwrap_or_default().to_owned();
        request.risk = risk.into();
        Ok(request)
    }

    /// Requests and waits, reporting progress; `None` when the client cancelled (the approval
    /// is then withdrawn).
    async fn gate(
        &self,
        mut request: pb::RequestApprovalRequest,
        renew_ended: bool,
        progress: Option<Value>,
        mut cancelled: oneshot::Receiver<String>,
    ) -> Option<Verdict> {
        let deadline = Instant::now() + self.timeout;
        gate::tie_to_the_waiting_caller(&mut request, deadline);
        // Not raced against a cancellation: the request may be stored already, and must then
        // be withdrawn below.
        let approval = match gate::request(&self.client, &request, deadline, renew_ended).await {
            Ok(approval) => approval,
            Err(error) => {
                return Some(Verdict::failed(gate::failure_text(
                    &error,
                    self.client.url(),
                )))
            }
        };
        tracing::info!(approval_id = %approval.id, tool = %approval.tool_name, args_digest = %approval.args_digest, "approval requested");
        let withdraw_reason = format!(
            "no decision within {}",
            humantime::format_duration(self.timeout)
        );
        let requested_digest = match receipts::digest_of(&request.arguments_json) {
            Ok(digest) => digest,
            Err(error) => return Some(Verdict::failed(format!("countersign: {error}"))),
        };
        let wait = gate::await_verdict(
            &self.client,
            approval.clone(),
            deadline,
            &withdraw_reason,
            &requested_digest,
        );
        tokio::pin!(wait);
        let mut ticks = tokio::time::interval_at(
            Instant::now() + self.progress_interval,
            self.progress_interval,
        );
        let mut reported: u64 = 0;
        loop {
            tokio::select! {
                verdict = &mut wait => return Some(verdict),
                reason = &mut cancelled => {
                    let reason = reason.unwrap_or_else(|_| "the MCP client went away".into());
                    let verdict = gate::withdraw(&self.client, &approval.id, &reason).await;
                    tracing::info!(approval_id = %approval.id, allowed = verdict.is_allow(), "call cancelled by the client");
                    return None;
                }
                _ = ticks.tick(), if progress.is_some() => {
                    reported += 1;
                    let _ = self.out.send(json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {
                            "progressToken": progress,
                            "progress": reported,
                            "message": format!("waiting for a human to decide approval {}", approval.id),
                        },
                    }));
                }
            }
        }
    }

    /// The `request_approval` answer for a verdict: the approval's status, or the failure.
    async fn verdict_result(&self, verdict: &Verdict) -> Value {
        let approval_id = match verdict {
            Verdict::Allow { approval_id, .. } => Some(approval_id.as_str()),
            Verdict::Deny { approval_id, .. } => approval_id.as_deref(),
        };
        let approval = match approval_id {
            Some(id) => self.client.get_approval(id).await.ok(),
            None => None,
        };
        match approval {
            Some(approval) if approval.state() != pb::ApprovalState::Pending => {
                text_result(status_of(&approval).to_string(), false)
            }
            _ => text_result(
                json!({"status": "error", "approval_id": approval_id, "message": verdict.explanation()})
                    .to_string(),
                !verdict.is_allow(),
            ),
        }
    }
}

/// The state of an approval as `request_approval` and `check_approval` report it.
fn status_of(approval: &pb::Approval) -> Value {
    let status = match approval.state() {
        pb::ApprovalState::Pending => "awaiting_approval",
        pb::ApprovalState::Approved | pb::ApprovalState::Consumed => "approved",
        pb::ApprovalState::Rejected => "rejected",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Cancelled => "cancelled",
        pb::ApprovalState::Unspecified => "unknown",
    };
    let mut answer = json!({"status": status, "approval_id": approval.id});
    if let Some(resolution) = &approval.resolution {
        answer["reason"] = json!(resolution.reason);
        answer["decider"] = json!(gate::resolved_by(approval)
            .strip_prefix("by ")
            .unwrap_or_default());
    }
    if status == "approved" {
        let scope = if gate::is_session_scoped(approval) {
            "session"
        } else {
            "once"
        };
        answer["scope"] = json!(scope);
        if version::is_edited(approval) {
            // The approver approved other arguments than those asked about: the agent must
            // run exactly those, or, when they are no longer readable, nothing.
            let editor = version::editor_name(approval).unwrap_or_default();
            match version::edited_input(approval) {
                Some(edited) => {
                    answer["arguments"] = edited;
                    answer["edited_by"] = json!(editor);
                    answer["message"] = json!(format!(
                        "approved with the arguments edited by {editor}: act only with `arguments`"
                    ));
                }
                None => {
                    answer["status"] = json!("error");
                    answer["message"] = json!(format!(
                        "approved arguments edited by {editor}, which are no longer available (redacted): do not act"
                    ));
                }
            }
        }
    }
    answer
}
