//! Policy rules: ordered, the first match wins, and no match means a human decides (fail
//! closed).
//!
//! The risk a rule matches on is the computed risk, never only the one the agent declared:
//! first every `classify` rule that matches raises the risk to at least its `risk` (a floor,
//! per tool or per argument pattern), then the first matching `allow`, `deny` or `require`
//! rule decides. A `require` rule's risk is a floor as well.
//!
//! A rule matches on the tool name (glob), the agent id (glob), the requested risk, argument
//! values (a JSON pointer, then a glob or a regex) and a shell command line taken apart into
//! the commands it runs (policy/shell.rs). `allow` and `deny` resolve the request at
//! once and the resolution names the rule; `require` sends it to people with the rule's risk,
//! TTL, quorum, routes and separation-of-duties setting. Rules are compiled once, at start, and
//! every error names the rule it comes from.

use globset::{GlobBuilder, GlobMatcher};
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::digest::canonical_json;
use crate::fields::{optional, required, subject, validate_channel, SpecError};
use crate::policy::shell::{ShellMatcher, ShellSpec};
use crate::validate::Limits;
use crate::{
    Approval, ApprovalRequest, Disposition, EditedVersion, Error, FollowUp, GroupQuorum, OnTimeout,
    ResolvedBy, Risk, Route, StepUp, Verdict,
};

/// One `[[rules]]` entry as configured.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    /// `allow`, `deny`, `require` or `classify`.
    pub action: String,
    #[serde(rename = "match")]
    pub matches: MatchSpec,
    /// Shown in the resolution of `allow` and `deny`.
    pub reason: String,
    /// `require` and `classify`: the lowest risk the approval gets (a declared risk above it
    /// stays).
    pub risk: Option<String>,
    /// `require` only: the longest the approval stays open; a request may ask for less.
    pub ttl_seconds: Option<u32>,
    /// `require` only: the fewest distinct approvers; a request may ask for more.
    pub required_approvals: Option<u32>,
    /// `require` only: where the approval is shown (replaces the request's routes).
    pub routes: Vec<Route>,
    /// `require` only: whether the requester is barred from approving (default true).
    pub separation_of_duties: Option<bool>,
    /// `require` and `classify`: what a session grant made from a matching approval is bound
    /// to. A later call is covered only when these argument parts are equal (each the value
    /// at the pointer, or the first match of the regex in it). The first matching rule that
    /// sets it counts; without one a grant covers any arguments of the tool.
    pub grant_scope: Vec<GrantScopeSpec>,
    /// `require` only: groups that must each approve, e.g. 2 of `security` and 1 of `db`
    /// (added to the request's own).
    pub approver_groups: Vec<GroupRequirementSpec>,
    /// `require` only: remind the deciders after this many seconds without a decision.
    pub remind_after_seconds: Option<u32>,
    /// `require` only: hand the approval to `escalate_to` after this many seconds.
    pub escalate_after_seconds: Option<u32>,
    /// `require` only: the group an escalation goes to.
    pub escalate_to: Option<String>,
    /// `require` only: what the deadline means, `reject` (the default) or `escalate`.
    pub on_timeout: Option<String>,
    /// `require` only: `"passkey"`: the approval can be approved only with a passkey
    /// assertion for it (docs/security.md, "Passkey step-up"); rejecting needs none.
    pub step_up: Option<String>,
}

/// `{ group = "security", required = 2 }`: 2 distinct members of `security` must approve.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupRequirementSpec {
    pub group: String,
    /// Default 1.
    pub required: u32,
}

impl RuleSpec {
    /// Whether the rule sets who decides or the follow-up, which only `require` rules do.
    fn decides_who(&self) -> bool {
        !self.approver_groups.is_empty()
            || self.remind_after_seconds.is_some()
            || self.escalate_after_seconds.is_some()
            || self.escalate_to.is_some()
            || self.on_timeout.is_some()
            || self.step_up.is_some()
    }
}

/// One argument part a session grant is bound to.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrantScopeSpec {
    /// RFC 6901 JSON pointer into the arguments object.
    pub pointer: String,
    /// The part of the value that counts, e.g. `^\\S+` for a command's first word; absent:
    /// the whole value.
    pub regex: Option<String>,
}

/// What a rule matches; every part that is set must match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MatchSpec {
    /// Glob on the tool name.
    pub tool: Option<String>,
    /// Glob on the agent id.
    pub agent: Option<String>,
    /// The computed risk (the declared one raised by `classify` rules) is one of these.
    pub risk: Vec<String>,
    pub arguments: Vec<ArgumentSpec>,
    /// The command line at a pointer, parsed as a shell would (policy/shell.rs).
    pub shell: Option<ShellSpec>,
}

/// A match on one argument value: the JSON pointer, then exactly one of `glob` or `regex`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArgumentSpec {
    /// RFC 6901 JSON pointer into the arguments object, e.g. `/command` or `/env/name`.
    pub pointer: String,
    /// Matches the whole value.
    pub glob: Option<String>,
    /// Matches anywhere in the value unless anchored with `^` and `$`.
    pub regex: Option<String>,
}

/// The compiled rules, in order.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    rules: Vec<Rule>,
    /// Whether any rule looks at argument values (so the arguments need parsing).
    reads_arguments: bool,
}

#[derive(Debug, Clone)]
struct Rule {
    name: String,
    tool: Option<GlobMatcher>,
    agent: Option<GlobMatcher>,
    risks: Vec<Risk>,
    arguments: Vec<ArgumentMatcher>,
    shell: Option<ShellMatcher>,
    action: Action,
    grant_scope: Vec<ScopePart>,
}

#[derive(Debug, Clone)]
enum Action {
    Resolve { verdict: Verdict, reason: String },
    Require(Requirements),
    Classify(Risk),
}

#[derive(Debug, Clone)]
struct ScopePart {
    pointer: String,
    regex: Option<Regex>,
}

#[derive(Debug, Clone)]
struct Requirements {
    risk: Option<Risk>,
    ttl_seconds: Option<u32>,
    required_approvals: Option<u32>,
    routes: Vec<Route>,
    separation_of_duties: bool,
    approver_groups: Vec<GroupQuorum>,
    follow_up: FollowUpRule,
    step_up: Option<StepUp>,
}

/// The follow-up parts a `require` rule sets; each overrides the request's.
#[derive(Debug, Clone, Default)]
struct FollowUpRule {
    remind_after_seconds: Option<u32>,
    escalate_after_seconds: Option<u32>,
    escalate_to: Option<String>,
    on_timeout: Option<OnTimeout>,
}

impl FollowUpRule {
    fn is_set(&self) -> bool {
        self.remind_after_seconds.is_some()
            || self.escalate_after_seconds.is_some()
            || self.escalate_to.is_some()
            || self.on_timeout.is_some()
    }
}

#[derive(Debug, Clone)]
struct ArgumentMatcher {
    pointer: String,
    pattern: Pattern,
}

#[derive(Debug, Clone)]
enum Pattern {
    Glob(GlobMatcher),
    Regex(Regex),
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Glob(glob) => write!(f, "glob {:?}", glob.glob().glob()),
            Pattern::Regex(regex) => write!(f, "regex {:?}", regex.as_str()),
        }
    }
}

impl Pattern {
    fn is_match(&self, text: &str) -> bool {
        match self {
            Pattern::Glob(glob) => glob.is_match(text),
            Pattern::Regex(regex) => regex.is_match(text),
        }
    }
}

const MAX_RULE_NAME_CHARS: usize = 128;
const MAX_TARGET_CHARS: usize = 256;

impl Policy {
    /// Compiles the rules in order. Every error names the rule.
    pub fn compile(specs: &[RuleSpec], limits: &Limits) -> Result<Policy, SpecError> {
        let mut rules: Vec<Rule> = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let fail = |message: String| SpecError {
                subject: subject("rule", "rules", index, &spec.name),
                message,
            };
            let rule = compile_rule(spec, limits).map_err(fail)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(fail("another rule has the same name".into()));
            }
            rules.push(rule);
        }
        let reads_arguments = rules
            .iter()
            .any(|r| !r.arguments.is_empty() || r.shell.is_some() || !r.grant_scope.is_empty());
        Ok(Policy {
            rules,
            reads_arguments,
        })
    }

    /// Every group a rule names, with the rule and the quorum it asks of the group (1 for an
    /// `escalate_to`), so that the server can check them against `[[groups]]` at start.
    pub fn named_groups(&self) -> Vec<(&str, &str, u32)> {
        self.rules
            .iter()
            .filter_map(|rule| match &rule.action {
                Action::Require(r) => Some((rule.name.as_str(), r)),
                _ => None,
            })
            .flat_map(|(name, r)| {
                r.approver_groups
                    .iter()
                    .map(|g| (g.group.as_str(), g.required))
                    .chain(r.follow_up.escalate_to.as_deref().map(|g| (g, 1)))
                    .map(move |(group, required)| (name, group, required))
            })
            .collect()
    }

    /// Raises the risk by the matching `classify` rules, then applies the first matching
    /// `allow`, `deny` or `require` rule: the request as the rules shape it, and how it
    /// starts. No match leaves the request to a human.
    pub fn apply(&self, mut request: ApprovalRequest) -> (ApprovalRequest, Disposition) {
        let arguments = if self.reads_arguments {
            match serde_json::from_str::<Value>(&request.arguments_json) {
                Ok(arguments) => Some(arguments),
                // Validation only lets JSON objects through; should that ever fail, no rule is
                // skipped over on its account: a human decides.
                Err(_) => return (request, Disposition::RequireHuman),
            }
        } else {
            None
        };
        let mut scoped = false;
        for rule in &self.rules {
            let Action::Classify(floor) = rule.action else {
                continue;
            };
            if rule.matches(&request, arguments.as_ref()) {
                request.risk = request.risk.max(floor);
                scoped = scoped || rule.scope_grant(&mut request, arguments.as_ref());
            }
        }
        let Some(rule) = self.rules.iter().find(|rule| {
            !matches!(rule.action, Action::Classify(_))
                && rule.matches(&request, arguments.as_ref())
        }) else {
            return (request, Disposition::RequireHuman);
        };
        request.policy_rule = Some(rule.name.clone());
        let disposition = match &rule.action {
            Action::Resolve { verdict, reason } => Disposition::Resolve {
                verdict: *verdict,
                resolved_by: ResolvedBy::Rule,
                rule: Some(rule.name.clone()),
                grant_id: None,
                reason: reason.clone(),
            },
            Action::Require(requirements) => {
                requirements.shape(&mut request);
                if !scoped {
                    rule.scope_grant(&mut request, arguments.as_ref());
                }
                Disposition::RequireHuman
            }
            Action::Classify(_) => Disposition::RequireHuman,
        };
        (request, disposition)
    }
}

impl Policy {
    /// What the rules require for `approval` with its arguments replaced by an approver's
    /// edit (`arguments_json`, already validated, and its digest), evaluated like a request:
    /// a `deny` rule refuses the edit; otherwise the risk, quorum and four-eyes rule of the
    /// edited call, never below what the approval requires now (an edit cannot lower what is
    /// required, and an `allow` rule does not approve an edit).
    pub fn reevaluate(
        &self,
        approval: &Approval,
        arguments_json: String,
        args_digest: String,
    ) -> Result<EditedVersion, Error> {
        let request = ApprovalRequest {
            agent_id: approval.agent_id.clone(),
            session_id: approval.session_id.clone(),
            requester: approval.requester.clone(),
            idempotency_key: approval.idempotency_key.clone(),
            tool_name: approval.tool_name.clone(),
            arguments_json,
            args_digest,
            action: approval.action.clone(),
            reason: approval.reason.clone(),
            risk: approval.effective_risk(),
            routes: approval.routes.clone(),
            required_approvals: approval.effective_required_approvals(),
            ttl_seconds: None,
            labels: approval.labels.clone(),
            policy_rule: None,
            // The edited call starts from a request's default, as a new request would: only a
            // rule matching the edited call exempts it (the approval's own exemption was for
            // the call as requested); the result is combined with the approval's below.
            separation_of_duties: true,
            grant_scope: String::new(),
            approver_groups: approval.approver_groups.clone(),
            follow_up: None,
            withdraw_when_caller_leaves: false,
            step_up: approval.step_up,
        };
        let (shaped, disposition) = self.apply(request);
        if let Disposition::Resolve {
            verdict: Verdict::Reject,
            rule,
            reason,
            ..
        } = disposition
        {
            let why = if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            };
            return Err(Error::PermissionDenied(format!(
                "the edited arguments match deny rule {:?}{why}: an edit cannot approve a call the policy denies",
                rule.unwrap_or_default()
            )));
        }
        // Groups a rule requires of the edited call that the approval does not: its deciders
        // were chosen for the call as requested, so such an edit needs a new request.
        let missing: Vec<String> = shaped
            .approver_groups
            .iter()
            .filter(|wanted| {
                !approval
                    .approver_groups
                    .iter()
                    .any(|g| g.group == wanted.group && g.required >= wanted.required)
            })
            .map(|g| format!("{} of {}", g.required, g.group))
            .collect();
        if !missing.is_empty() {
            return Err(Error::PermissionDenied(format!(
                "the edited arguments need approval from {}, which this approval does not ask for: request the edited call anew",
                missing.join(" and ")
            )));
        }
        // An edit must not move a call past a rule's step-up without it.
        if let (Some(step_up), None) = (shaped.step_up, approval.step_up) {
            return Err(Error::PermissionDenied(format!(
                "the edited arguments need a {} step-up, which this approval does not ask for: request the edited call anew",
                step_up.as_str()
            )));
        }
        Ok(EditedVersion {
            arguments_json: shaped.arguments_json,
            args_digest: shaped.args_digest,
            risk: shaped.risk.max(approval.effective_risk()),
            required_approvals: shaped
                .required_approvals
                .max(approval.effective_required_approvals()),
            separation_of_duties: shaped.separation_of_duties
                || approval.effective_separation_of_duties(),
        })
    }
}

impl Rule {
    /// Binds a session grant from this request to the rule's argument parts; false when the
    /// rule has none.
    fn scope_grant(&self, request: &mut ApprovalRequest, arguments: Option<&Value>) -> bool {
        if self.grant_scope.is_empty() {
            return false;
        }
        let parts: Vec<Value> = self
            .grant_scope
            .iter()
            .map(|part| {
                let value = arguments.and_then(|arguments| arguments.pointer(&part.pointer));
                let text = value.map(value_text);
                let kept = match (&part.regex, &text) {
                    (Some(regex), Some(text)) => regex.find(text).map(|m| m.as_str().to_owned()),
                    (None, Some(text)) => Some(text.to_string()),
                    (_, None) => None,
                };
                serde_json::json!([part.pointer, kept])
            })
            .collect();
        request.grant_scope = canonical_json(&Value::Array(parts));
        true
    }

    fn matches(&self, request: &ApprovalRequest, arguments: Option<&Value>) -> bool {
        self.mismatch(request, arguments).is_none()
    }

    /// Why the rule does not match the request; `None` when it does.
    fn mismatch(&self, request: &ApprovalRequest, arguments: Option<&Value>) -> Option<String> {
        if let Some(glob) = self
            .tool
            .as_ref()
            .filter(|g| !g.is_match(&request.tool_name))
        {
            return Some(format!("the tool is not {:?}", glob.glob().glob()));
        }
        if let Some(glob) = self
            .agent
            .as_ref()
            .filter(|g| !g.is_match(&request.agent_id))
        {
            return Some(format!("the agent is not {:?}", glob.glob().glob()));
        }
        if !self.risks.is_empty() && !self.risks.contains(&request.risk) {
            return Some(format!(
                "the risk is {}",
                request.risk.as_str().to_ascii_lowercase()
            ));
        }
        let at = |pointer: &str| arguments.and_then(|arguments| arguments.pointer(pointer));
        for matcher in &self.arguments {
            let Some(value) = at(&matcher.pointer) else {
                return Some(format!("the arguments have no {}", matcher.pointer));
            };
            if !matcher.pattern.is_match(&value_text(value)) {
                return Some(format!(
                    "{} does not match {}",
                    matcher.pointer, matcher.pattern
                ));
            }
        }
        if let Some(shell) = &self.shell {
            let Some(line) = at(&shell.pointer).and_then(Value::as_str) else {
                return Some(format!(
                    "the arguments have no command line at {}",
                    shell.pointer
                ));
            };
            return shell.mismatch(line);
        }
        None
    }
}

impl Requirements {
    fn shape(&self, request: &mut ApprovalRequest) {
        if let Some(risk) = self.risk {
            request.risk = request.risk.max(risk);
        }
        if let Some(rule_ttl) = self.ttl_seconds {
            request.ttl_seconds = Some(
                request
                    .ttl_seconds
                    .map_or(rule_ttl, |ttl| ttl.min(rule_ttl)),
            );
        }
        if let Some(required) = self.required_approvals {
            request.required_approvals = request.required_approvals.max(required);
        }
        if !self.routes.is_empty() {
            request.routes = self.routes.clone();
        }
        request.separation_of_duties = self.separation_of_duties;
        request
            .approver_groups
            .extend(self.approver_groups.iter().cloned());
        request.step_up = request.step_up.or(self.step_up);
        let rule = &self.follow_up;
        if rule.is_set() {
            let follow_up = request.follow_up.get_or_insert_with(FollowUp::default);
            if let Some(seconds) = rule.remind_after_seconds {
                follow_up.remind_after_seconds = seconds;
            }
            if let Some(seconds) = rule.escalate_after_seconds {
                follow_up.escalate_after_seconds = seconds;
            }
            if let Some(group) = &rule.escalate_to {
                follow_up.escalate_to = Some(GroupQuorum {
                    group: group.clone(),
                    ..GroupQuorum::default()
                });
            }
            if let Some(on_timeout) = rule.on_timeout {
                follow_up.on_timeout = on_timeout;
            }
        }
    }
}

/// The text a pattern sees: a string as it is, any other value as canonical JSON.
fn value_text(value: &Value) -> std::borrow::Cow<'_, str> {
    match value {
        Value::String(text) => std::borrow::Cow::Borrowed(text),
        other => std::borrow::Cow::Owned(canonical_json(other)),
    }
}

fn compile_rule(spec: &RuleSpec, limits: &Limits) -> Result<Rule, String> {
    if spec.name.is_empty() {
        return Err("name is required".into());
    }
    optional("name", &spec.name, MAX_RULE_NAME_CHARS).map_err(|e| e.to_string())?;
    let matches = &spec.matches;
    let tool = matches
        .tool
        .as_deref()
        .map(|glob| compile_glob("match.tool", glob))
        .transpose()?;
    let agent = matches
        .agent
        .as_deref()
        .map(|glob| compile_glob("match.agent", glob))
        .transpose()?;
    let risks = matches
        .risk
        .iter()
        .map(|name| parse_risk("match.risk", name))
        .collect::<Result<Vec<_>, _>>()?;
    let arguments = matches
        .arguments
        .iter()
        .enumerate()
        .map(|(i, argument)| compile_argument(&format!("match.arguments[{i}]"), argument))
        .collect::<Result<Vec<_>, _>>()?;
    let shell = matches
        .shell
        .as_ref()
        .map(|shell| {
            ShellMatcher::compile(shell).and_then(|compiled| {
                validate_pointer(&compiled.pointer)
                    .map_err(|message| format!("match.shell.pointer: {message}"))
                    .map(|()| compiled)
            })
        })
        .transpose()?;
    let action = match spec.action.as_str() {
        "allow" | "deny" => {
            let shapes = spec.risk.is_some()
                || spec.decides_who()
                || spec.ttl_seconds.is_some()
                || spec.required_approvals.is_some()
                || !spec.routes.is_empty()
                || spec.separation_of_duties.is_some();
            if shapes {
                return Err(format!(
                    "action {:?} resolves at once; risk, ttl_seconds, required_approvals, routes, separation_of_duties, approver_groups, step_up and the follow-up (remind_after_seconds, escalate_after_seconds, escalate_to, on_timeout) belong to \"require\" rules",
                    spec.action
                ));
            }
            let (verdict, verb) = if spec.action == "allow" {
                (Verdict::Approve, "allowed")
            } else {
                (Verdict::Reject, "denied")
            };
            let reason = if spec.reason.is_empty() {
                format!("{verb} by policy rule {:?}", spec.name)
            } else {
                spec.reason.clone()
            };
            Action::Resolve { verdict, reason }
        }
        "require" => Action::Require(compile_requirements(spec, limits)?),
        "classify" => {
            let shapes = spec.ttl_seconds.is_some()
                || spec.decides_who()
                || spec.required_approvals.is_some()
                || !spec.routes.is_empty()
                || spec.separation_of_duties.is_some()
                || !spec.reason.is_empty();
            if shapes {
                return Err("action \"classify\" only sets risk and grant_scope".into());
            }
            let risk = spec
                .risk
                .as_deref()
                .ok_or("action \"classify\" needs risk (low, medium, high or critical)")?;
            Action::Classify(parse_risk("risk", risk)?)
        }
        "" => return Err("action is required (allow, deny, require or classify)".into()),
        other => {
            return Err(format!(
                "action {other:?} is not one of allow, deny, require or classify"
            ))
        }
    };
    if matches!(action, Action::Resolve { .. }) && !spec.grant_scope.is_empty() {
        return Err("grant_scope belongs to \"require\" and \"classify\" rules".into());
    }
    let grant_scope = spec
        .grant_scope
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let field = format!("grant_scope[{i}]");
            validate_pointer(&part.pointer)
                .map_err(|message| format!("{field}.pointer: {message}"))?;
            let regex = part
                .regex
                .as_deref()
                .map(|regex| Regex::new(regex).map_err(|e| format!("{field}.regex {regex:?}: {e}")))
                .transpose()?;
            Ok(ScopePart {
                pointer: part.pointer.clone(),
                regex,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Rule {
        name: spec.name.clone(),
        tool,
        agent,
        risks,
        arguments,
        shell,
        action,
        grant_scope,
    })
}

fn compile_requirements(spec: &RuleSpec, limits: &Limits) -> Result<Requirements, String> {
    let risk = spec
        .risk
        .as_deref()
        .map(|name| parse_risk("risk", name))
        .transpose()?;
    if let Some(ttl) = spec.ttl_seconds {
        if ttl < limits.min_ttl_seconds || ttl > limits.max_ttl_seconds {
            return Err(format!(
                "ttl_seconds {ttl} is outside {}..={} (approvals.min_ttl_seconds..approvals.max_ttl_seconds)",
                limits.min_ttl_seconds, limits.max_ttl_seconds
            ));
        }
    }
    if let Some(required) = spec.required_approvals {
        if required == 0 || required > limits.max_required_approvals {
            return Err(format!(
                "required_approvals {required} is outside 1..={} (limits.max_required_approvals)",
                limits.max_required_approvals
            ));
        }
    }
    if spec.routes.len() > limits.max_routes {
        return Err(format!(
            "has {} routes, at most {} are allowed (limits.max_routes)",
            spec.routes.len(),
            limits.max_routes
        ));
    }
    for (i, route) in spec.routes.iter().enumerate() {
        validate_channel(&format!("routes[{i}].channel"), &route.channel)
            .and_then(|()| {
                optional(
                    &format!("routes[{i}].target"),
                    &route.target,
                    MAX_TARGET_CHARS,
                )
            })
            .map_err(|e| e.to_string())?;
    }
    let mut approver_groups = Vec::with_capacity(spec.approver_groups.len());
    for (i, group) in spec.approver_groups.iter().enumerate() {
        required(&format!("approver_groups[{i}].group"), &group.group, 64)
            .map_err(|e| e.to_string())?;
        if group.required > limits.max_required_approvals {
            return Err(format!(
                "approver_groups[{i}].required {} is above {} (limits.max_required_approvals)",
                group.required, limits.max_required_approvals
            ));
        }
        approver_groups.push(GroupQuorum {
            group: group.group.clone(),
            required: group.required.max(1),
            ..GroupQuorum::default()
        });
    }
    let on_timeout = spec
        .on_timeout
        .as_deref()
        .map(|name| {
            OnTimeout::parse(name)
                .ok_or_else(|| format!("on_timeout {name:?} is not reject or escalate"))
        })
        .transpose()?;
    let escalates = spec.escalate_after_seconds.is_some_and(|s| s > 0)
        || on_timeout == Some(OnTimeout::Escalate);
    if escalates && spec.escalate_to.is_none() {
        return Err("escalate_to is required to escalate (escalate_after_seconds or on_timeout = \"escalate\")".into());
    }
    let step_up = spec.step_up.as_deref().map(StepUp::parse).transpose()?;
    Ok(Requirements {
        step_up,
        risk,
        ttl_seconds: spec.ttl_seconds,
        required_approvals: spec.required_approvals,
        routes: spec.routes.clone(),
        separation_of_duties: spec.separation_of_duties.unwrap_or(true),
        approver_groups,
        follow_up: FollowUpRule {
            remind_after_seconds: spec.remind_after_seconds,
            escalate_after_seconds: spec.escalate_after_seconds,
            escalate_to: spec.escalate_to.clone(),
            on_timeout,
        },
    })
}

fn compile_argument(field: &str, spec: &ArgumentSpec) -> Result<ArgumentMatcher, String> {
    validate_pointer(&spec.pointer).map_err(|message| format!("{field}.pointer: {message}"))?;
    let pattern = match (&spec.glob, &spec.regex) {
        (Some(glob), None) => Pattern::Glob(compile_glob(&format!("{field}.glob"), glob)?),
        (None, Some(regex)) => {
            Pattern::Regex(Regex::new(regex).map_err(|e| format!("{field}.regex {regex:?}: {e}"))?)
        }
        _ => return Err(format!("{field} needs exactly one of glob or regex")),
    };
    Ok(ArgumentMatcher {
        pointer: spec.pointer.clone(),
        pattern,
    })
}

/// `*` matches any run of characters (also `/`), `?` one character, `[a-z]` a class and
/// `{a,b}` either alternative; the glob must match the whole text.
fn compile_glob(field: &str, glob: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(glob)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|e| format!("{field} glob {glob:?}: {e}"))
}

fn parse_risk(field: &str, name: &str) -> Result<Risk, String> {
    Risk::parse(name).ok_or_else(|| {
        format!("{field} {name:?} is not a risk level (low, medium, high or critical)")
    })
}

/// An RFC 6901 pointer: empty (the whole object) or `/`-separated tokens in which `~` only
/// appears as `~0` or `~1`.
fn validate_pointer(pointer: &str) -> Result<(), String> {
    if pointer.is_empty() {
        return Err("is required; use \"/name\" for the argument \"name\"".into());
    }
    if !pointer.starts_with('/') {
        return Err(format!("{pointer:?} must start with '/'"));
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "{pointer:?} has a '~' not followed by 0 or 1 (write ~0 for '~' and ~1 for '/')"
            ));
        }
    }
    Ok(())
}

pub mod inspect;
pub mod shell;
#[cfg(test)]
mod tests;
