//! `countersign policy`: write a preset's rules into the local instance's config file, show
//! how the rules decide a tool call, and find rules that never decide or overlap.

use std::io::Read as _;

use countersign_client::pb;
use countersign_core::policy::inspect::{Finding, FindingKind, Outcome};
use countersign_core::policy::Policy;
use countersign_core::{ApprovalRequest, Risk, StepUp};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::agent::hook::Call;
use crate::args::{Output, PolicyCommand};
use crate::config_file;
use crate::exit::{CliError, Exit};
use crate::instance::Instance;
use crate::rules_file::{rules_of, write_preset};

/// The most input `policy test` reads from stdin.
const MAX_INPUT_BYTES: u64 = 4 << 20;

pub fn run(instance: &Instance, command: PolicyCommand, output: Output) -> Result<Exit, CliError> {
    match command {
        PolicyCommand::Preset { name } => {
            let written = write_preset(instance, &name)?;
            println!(
                "Wrote the {name} preset's {written} policy rules into {}, after any rules of your own (countersign up reads them at start).",
                instance.config_file.display()
            );
            Ok(Exit::Success)
        }
        PolicyCommand::Test { call, agent, risk } => test(instance, call, agent, risk, output),
        PolicyCommand::Lint => lint(instance, output),
        PolicyCommand::Report(_) => Err(CliError::Failure(
            "policy report asks the server, not the local instance's file".into(),
        )),
    }
}

/// The config file's rules, compiled as the server compiles them, and their lines.
/// The rules of the local instance's config file, compiled, with each rule's line, and whether
/// `[policy] mode = "observe"` has them only observed.
struct LoadedRules {
    policy: Policy,
    lines: Vec<Option<usize>>,
    observed: bool,
}

fn load(instance: &Instance) -> Result<LoadedRules, CliError> {
    let text = std::fs::read_to_string(&instance.config_file).map_err(|error| {
        CliError::Usage(format!(
            "cannot read config file {}: {error}",
            instance.config_file.display()
        ))
    })?;
    let config = instance.load_config()?;
    let policy = Policy::compile(&config.server.rules, &config.server.request_limits())
        .map_err(|error| config_file::invalid(instance, &error.to_string()))?;
    let (_, lines) = rules_of(&text).map_err(|what| config_file::invalid(instance, &what))?;
    Ok(LoadedRules {
        policy,
        lines,
        observed: config.server.policy.mode == countersign_server::config::PolicyMode::Observe,
    })
}

fn line_of(lines: &[Option<usize>], index: usize) -> String {
    match lines.get(index).copied().flatten() {
        Some(line) => format!("line {line}"),
        None => format!("rules[{index}]"),
    }
}

/// The call to test: a host's hook payload (`tool_name`, `tool_input`) as the argument or on
/// stdin.
#[derive(Deserialize)]
struct CallInput {
    tool_name: String,
    #[serde(default)]
    tool_input: Value,
}

fn read_call(argument: Option<String>) -> Result<Call, CliError> {
    let text = match argument {
        Some(text) => text,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_INPUT_BYTES + 1)
                .read_to_string(&mut text)
                .map_err(|error| CliError::Usage(format!("cannot read stdin: {error}")))?;
            if text.len() as u64 > MAX_INPUT_BYTES {
                return Err(CliError::Usage(format!(
                    "the call on stdin is over {MAX_INPUT_BYTES} bytes"
                )));
            }
            text
        }
    };
    let input: CallInput = serde_json::from_str(&text).map_err(|error| {
        CliError::Usage(format!(
            "the call is not JSON with tool_name and tool_input ({error})"
        ))
    })?;
    Ok(Call::new(
        String::new(),
        input.tool_name,
        input.tool_input,
        None,
    ))
}

fn test(
    instance: &Instance,
    call: Option<String>,
    agent: String,
    risk: Option<crate::args::Risk>,
    output: Output,
) -> Result<Exit, CliError> {
    let call = read_call(call)?;
    let LoadedRules {
        policy,
        lines,
        observed,
    } = load(instance)?;
    let risk = match risk {
        Some(risk) => risk.into(),
        None => countersign_client::gate::default_risk(&call.tool_name),
    };
    let request = ApprovalRequest {
        agent_id: agent,
        tool_name: call.tool_name.clone(),
        arguments_json: call.input.to_string(),
        risk: match risk {
            pb::Risk::Low => Risk::Low,
            pb::Risk::Medium => Risk::Medium,
            pb::Risk::High => Risk::High,
            _ => Risk::Critical,
        },
        required_approvals: 1,
        separation_of_duties: true,
        session_id: String::new(),
        requester: String::new(),
        idempotency_key: String::new(),
        args_digest: String::new(),
        action: String::new(),
        reason: String::new(),
        routes: Vec::new(),
        ttl_seconds: None,
        labels: Default::default(),
        policy_rule: None,
        grant_scope: String::new(),
        approver_groups: Vec::new(),
        follow_up: None,
        withdraw_when_caller_leaves: false,
        step_up: None,
    };
    let declared = request.risk;
    let explanation = policy.explain(request);
    let rule_line = explanation
        .rules
        .iter()
        .find(|r| r.outcome == Outcome::Decided);
    // Observe mode: the server asks as without rules (the declared risk, no rule), and only
    // records what the rules would have done.
    let (decision, risk) = if observed {
        ("ask", declared)
    } else {
        (explanation.decision, explanation.risk)
    };
    match output {
        Output::Json => {
            let rules: Vec<Value> = explanation
                .rules
                .iter()
                .map(|rule| {
                    let (outcome, why) = outcome_words(&rule.outcome);
                    json!({
                        "name": rule.name,
                        "line": lines.get(rule.index).copied().flatten(),
                        "action": rule.action,
                        "outcome": outcome,
                        "why": why,
                    })
                })
                .collect();
            let verdict = json!({
                "decision": explanation.decision,
                "risk": risk_name(explanation.risk),
                "rule": explanation.rule,
                "line": rule_line.and_then(|r| lines.get(r.index).copied().flatten()),
                "reason": explanation.reason,
                "step_up": explanation.step_up.map(StepUp::as_str),
            });
            let mut answer = if observed {
                json!({
                    "decision": decision,
                    "risk": risk_name(risk),
                    "rule": null,
                    "line": null,
                    "reason": "",
                    "step_up": null,
                    "observed": verdict,
                })
            } else {
                verdict
            };
            answer["mode"] = json!(if observed { "observe" } else { "enforce" });
            answer["rules"] = Value::Array(rules);
            println!("{answer}");
        }
        Output::Table => {
            if observed {
                println!("decision: {decision} (the config file's [policy] mode is \"observe\": the rules are recorded, not applied)");
                println!("risk: {}", risk_name(risk));
                print!("observed: the rules would {}", explanation.decision);
                if explanation.decision != "ask" {
                    print!(" it");
                }
                println!(", at {} risk", risk_name(explanation.risk));
            } else {
                println!("decision: {decision}");
                println!("risk: {}", risk_name(risk));
            }
            match (&explanation.rule, rule_line) {
                (Some(name), Some(rule)) => {
                    println!("rule: {name:?} ({})", line_of(&lines, rule.index))
                }
                _ => println!("rule: none matched; a person decides"),
            }
            if !explanation.reason.is_empty() {
                println!("reason: {:?}", explanation.reason);
            }
            if let (false, Some(StepUp::Passkey)) = (observed, explanation.step_up) {
                println!("step-up: passkey (approved only with the approver's passkey, in the web inbox; rejecting needs none)");
            }
            for rule in &explanation.rules {
                let (outcome, why) = outcome_words(&rule.outcome);
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                };
                println!(
                    "  {} {} {:?}: {outcome}{why}",
                    line_of(&lines, rule.index),
                    rule.action,
                    rule.name
                );
            }
        }
    }
    Ok(Exit::Success)
}

/// A risk as the config file writes it.
fn risk_name(risk: Risk) -> String {
    risk.as_str().to_ascii_lowercase()
}

fn outcome_words(outcome: &Outcome) -> (&'static str, String) {
    match outcome {
        Outcome::Raised(risk) => ("matched", format!("risk at least {}", risk_name(*risk))),
        Outcome::Decided => ("decided", String::new()),
        Outcome::NoMatch(why) => ("no match", why.clone()),
        Outcome::NotReached => ("not reached", "an earlier rule decided".into()),
    }
}

fn lint(instance: &Instance, output: Output) -> Result<Exit, CliError> {
    let LoadedRules { policy, lines, .. } = load(instance)?;
    let findings = policy.lint();
    let kind = |finding: &Finding| match finding.kind {
        FindingKind::Unreachable => "unreachable",
        FindingKind::Shadowed => "shadowed",
        FindingKind::Overlapping => "overlapping",
    };
    match output {
        Output::Json => {
            let findings: Vec<Value> = findings
                .iter()
                .map(|finding| {
                    json!({
                        "kind": kind(finding),
                        "rule": finding.rule,
                        "line": lines.get(finding.rule).copied().flatten(),
                        "other_line": finding.other.and_then(|other| lines.get(other).copied().flatten()),
                        "message": finding.message,
                    })
                })
                .collect();
            println!("{}", json!({ "findings": findings }));
        }
        Output::Table => {
            for finding in &findings {
                let other = finding
                    .other
                    .map(|other| format!(" (see {})", line_of(&lines, other)))
                    .unwrap_or_default();
                println!(
                    "{}: {}: {}{other}",
                    line_of(&lines, finding.rule),
                    kind(finding),
                    finding.message
                );
            }
            if findings.is_empty() {
                println!(
                    "{}: no unreachable, shadowed or overlapping rules",
                    instance.config_file.display()
                );
            }
        }
    }
    Ok(if findings.is_empty() {
        Exit::Success
    } else {
        Exit::Failure
    })
}
