//! `rules suggest`: allow rules proposed from the audit trail, for call shapes people approved
//! again and again and never rejected; `--accept ID` appends one to the config file.
//!
//! A shape is an agent, a tool and a bound on its arguments that a rule can hold to:
//! - a shell command (`/command`) made of plain words only (letters, digits and
//!   `_ . / = : @ % + , -`: nothing that can start another command, redirect, substitute,
//!   quote or expand): its program and subcommand (`npm test`), followed by exactly one of the
//!   lists of further words people approved with it, so approvals of `npm test --watch` and
//!   `npm test src/a.test.js` allow those two and neither `npm test --watch src/a.test.js`,
//!   `npm test; rm -rf ~`, `npm test > ~/.bashrc`, nor `rm -rf /` from approvals of
//!   `rm -rf build`;
//! - a file path (`/file_path`): a file directly in the same directory, whose name does not
//!   start with a dot (no `..`, no `.env`).
//!
//! Other calls are not generalised: nothing is proposed for them. A rejection counts against
//! every shape it might share a program with, whatever its own shape: a rejected shell command
//! blocks every program its line runs (as the policy engine's shell parser reads it), a
//! rejected file call blocks its directory, and a rejected call whose programs or directory
//! cannot be told blocks its tool.
//!
//! Each suggestion has an id, a digest of the rule it would add: `--accept ID` adds that rule
//! and no other, and is refused when history has changed the suggestion since it was listed.

use std::collections::{BTreeMap, BTreeSet};

use countersign_client::pb;
use countersign_core::policy::shell;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use toml_edit::{value, Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table};

use crate::exit::CliError;
use crate::render::{self, cell};

/// The characters a suggested shell rule lets through in a command's further words.
const SAFE_WORD: &str = "[A-Za-z0-9_./=:@%+,-]+";
/// A file name a suggested file rule lets through (no leading dot).
const SAFE_NAME: &str = "[A-Za-z0-9_-][A-Za-z0-9_.-]*";

/// A call shape: what a rule is proposed for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    agent_id: String,
    tool_name: String,
    bound: Bound,
}

/// The part of the arguments a shape holds to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Bound {
    /// `/command`: these first words (program, subcommand).
    Command(Vec<String>),
    /// `/file_path`: a file directly in this directory.
    Directory(String),
}

impl Bound {
    fn pointer(&self) -> &'static str {
        match self {
            Bound::Command(_) => "/command",
            Bound::Directory(_) => "/file_path",
        }
    }

    /// What the shape is, for people: `npm test`, `/home/dev/shop/src/*`.
    fn summary(&self) -> String {
        match self {
            Bound::Command(head) => head.join(" "),
            Bound::Directory(directory) => format!("{directory}/*"),
        }
    }
}

/// What a rejection counts against: suggestions of any agent for that tool and…
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Blocked {
    /// …whatever their shape (the rejected call's programs or directory cannot be told).
    Tool(String),
    /// …a command whose program is this.
    Program(String, String),
    /// …a file in this directory.
    Directory(String, String),
}

/// One proposed rule and its evidence.
#[derive(Debug, Clone)]
pub struct Suggestion {
    shape: Shape,
    /// The lists of words approved after a command's first ones (an empty list: the first
    /// words alone).
    further_words: BTreeSet<Vec<String>>,
    approvals: u32,
    /// How many times each person approved it (display name and channel).
    approvers: BTreeMap<String, u32>,
    /// The approvals that are the evidence, oldest first.
    approval_ids: Vec<String>,
}

impl Suggestion {
    /// The rule's regex on the value at the bound's pointer.
    fn regex(&self) -> String {
        match &self.shape.bound {
            Bound::Command(head) => {
                let head: Vec<String> = head.iter().map(|word| regex::escape(word)).collect();
                let head = head.join(" ");
                // Each approved list as written: ` --watch`, ` src/a\.js`, or "" (none).
                let further: Vec<String> = self
                    .further_words
                    .iter()
                    .map(|words| {
                        words
                            .iter()
                            .map(|word| format!(" {}", regex::escape(word)))
                            .collect()
                    })
                    .collect();
                match further.as_slice() {
                    [only] => format!("^{head}{only}$"),
                    _ => format!("^{head}(?:{})$", further.join("|")),
                }
            }
            Bound::Directory(directory) => {
                format!("^{}/{SAFE_NAME}$", regex::escape(directory))
            }
        }
    }

    /// The suggestion's id: a digest of the rule it would add, so an id names that rule and no
    /// other however the list around it changes.
    pub fn id(&self) -> String {
        let mut digest = Sha256::new();
        for part in [
            self.shape.agent_id.as_str(),
            self.shape.tool_name.as_str(),
            self.shape.bound.pointer(),
            self.regex().as_str(),
        ] {
            digest.update(part.as_bytes());
            digest.update([0]);
        }
        hex::encode(&digest.finalize()[..5])
    }

    /// The rule's name in the config file.
    pub fn rule_name(&self) -> String {
        let words: String = format!("{} {}", self.shape.tool_name, self.shape.bound.summary())
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        let words: Vec<&str> = words.split('-').filter(|w| !w.is_empty()).collect();
        let name = format!("suggested-{}-{}", self.shape.agent_id, words.join("-"));
        name.chars().take(120).collect()
    }

    /// The evidence in one line: how often, by whom, never rejected.
    pub fn evidence(&self) -> String {
        let by: Vec<String> = self
            .approvers
            .iter()
            .map(|(who, times)| format!("{who} ×{times}"))
            .collect();
        format!(
            "approved {} times ({}), never rejected",
            self.approvals,
            by.join(", ")
        )
    }
}

/// The shape of a call and the further words of its command, when it has a shape a rule can
/// bound.
fn shape_of(approval: &pb::Approval) -> Option<(Shape, Vec<String>)> {
    let arguments: Value = serde_json::from_str(&approval.arguments_json).ok()?;
    let plain = regex::Regex::new(&format!("^{SAFE_WORD}$")).ok()?;
    let shape = |bound| Shape {
        agent_id: approval.agent_id.clone(),
        tool_name: approval.tool_name.clone(),
        bound,
    };
    if let Some(command) = arguments.get("command").and_then(Value::as_str) {
        let words: Vec<&str> = command.split(' ').collect();
        // An assignment first (`PAGER=x git log`) changes what the program does.
        if words.iter().any(|word| !plain.is_match(word)) || words[0].contains('=') {
            return None;
        }
        // `git status`, `npm test`: the second word is a subcommand unless it is an option or
        // a path.
        let has_subcommand = words.get(1).is_some_and(|word| {
            !word.starts_with('-') && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
        let (head, further) = words.split_at(if has_subcommand { 2 } else { 1 });
        let head = head.iter().map(|word| (*word).to_owned()).collect();
        let further = further.iter().map(|word| (*word).to_owned()).collect();
        return Some((shape(Bound::Command(head)), further));
    }
    let path = arguments.get("file_path").and_then(Value::as_str)?;
    let (directory, _) = path.rsplit_once('/')?;
    if !path.starts_with('/')
        || !plain.is_match(directory)
        || directory.split('/').any(|part| part == "..")
    {
        return None;
    }
    Some((shape(Bound::Directory(directory.to_owned())), Vec::new()))
}

/// What a rejected call counts against (see the module's comment).
fn blocked_by(approval: &pb::Approval) -> Vec<Blocked> {
    let tool = approval.tool_name.clone();
    let whole_tool = || vec![Blocked::Tool(approval.tool_name.clone())];
    let Ok(arguments) = serde_json::from_str::<Value>(&approval.arguments_json) else {
        return whole_tool();
    };
    if let Some(command) = arguments.get("command") {
        let Some(line) = command.as_str() else {
            return whole_tool();
        };
        let analysis = shell::analyze(line);
        if analysis.opaque.is_some() {
            return whole_tool();
        }
        // Every word that is not an option may be a program (`sudo rm`, `env X=1 rm`, `xargs
        // rm`), by the last part of its path (`/bin/rm`): more than the line runs, never less.
        let programs: BTreeSet<String> = analysis
            .all
            .iter()
            .flatten()
            .filter(|word| !word.starts_with('-'))
            .map(|word| word.rsplit('/').next().unwrap_or(word).to_owned())
            .collect();
        if programs.is_empty() {
            return whole_tool();
        }
        return programs
            .into_iter()
            .map(|program| Blocked::Program(tool.clone(), program))
            .collect();
    }
    match shape_of(approval) {
        Some((
            Shape {
                bound: Bound::Directory(directory),
                ..
            },
            _,
        )) => vec![Blocked::Directory(tool, directory)],
        _ => whole_tool(),
    }
}

/// Whether a rejection counts against `shape`.
fn is_blocked(blocked: &BTreeSet<Blocked>, shape: &Shape) -> bool {
    let tool = shape.tool_name.clone();
    blocked.contains(&Blocked::Tool(tool.clone()))
        || match &shape.bound {
            Bound::Command(head) => head
                .first()
                .is_some_and(|program| blocked.contains(&Blocked::Program(tool, program.clone()))),
            Bound::Directory(directory) => {
                blocked.contains(&Blocked::Directory(tool, directory.clone()))
            }
        }
}

/// Who decided, as the report names them.
fn deciders(approval: &pb::Approval) -> Vec<String> {
    approval
        .resolution
        .as_ref()
        .map(|resolution| {
            resolution
                .deciders
                .iter()
                .map(countersign_client::decider::name_and_channel)
                .collect()
        })
        .unwrap_or_default()
}

/// The suggestions the approvals in `events` support: shapes people approved at least
/// `min_approvals` times and never rejected, most approved first.
pub fn suggest(events: &[pb::AuditEvent], min_approvals: u32) -> Vec<Suggestion> {
    let mut newest: BTreeMap<&str, (u64, &pb::Approval)> = BTreeMap::new();
    for event in events.iter().filter_map(|audit| audit.event.as_ref()) {
        if let Some(approval) = event.approval.as_ref() {
            let entry = newest
                .entry(approval.id.as_str())
                .or_insert((event.seq, approval));
            if event.seq >= entry.0 {
                *entry = (event.seq, approval);
            }
        }
    }
    let mut shapes: BTreeMap<Shape, Suggestion> = BTreeMap::new();
    let mut blocked: BTreeSet<Blocked> = BTreeSet::new();
    for (_, approval) in newest.into_values() {
        let by_people = approval
            .resolution
            .as_ref()
            .is_some_and(|r| r.resolved_by() == pb::ResolvedBy::Decision);
        if !by_people {
            continue;
        }
        match approval.state() {
            pb::ApprovalState::Approved | pb::ApprovalState::Consumed => {
                let Some((shape, further)) = shape_of(approval) else {
                    continue;
                };
                let suggestion = shapes.entry(shape.clone()).or_insert(Suggestion {
                    shape,
                    further_words: BTreeSet::new(),
                    approvals: 0,
                    approvers: BTreeMap::new(),
                    approval_ids: Vec::new(),
                });
                suggestion.approvals += 1;
                suggestion.further_words.insert(further);
                suggestion.approval_ids.push(approval.id.clone());
                for who in deciders(approval) {
                    *suggestion.approvers.entry(who).or_default() += 1;
                }
            }
            pb::ApprovalState::Rejected => blocked.extend(blocked_by(approval)),
            _ => {}
        }
    }
    let mut suggestions: Vec<Suggestion> = shapes
        .into_values()
        .filter(|s| s.approvals >= min_approvals && !is_blocked(&blocked, &s.shape))
        .collect();
    suggestions.sort_by(|a, b| {
        b.approvals
            .cmp(&a.approvals)
            .then_with(|| a.shape.cmp(&b.shape))
    });
    suggestions
}

/// The `[[rules]]` entry of a suggestion.
fn rule_table(suggestion: &Suggestion) -> Table {
    let mut rule = Table::new();
    rule.insert("name", value(suggestion.rule_name()));
    rule.insert("action", value("allow"));
    rule.insert(
        "reason",
        value(format!(
            "suggested from history: {} {}",
            suggestion.shape.tool_name,
            suggestion.shape.bound.summary()
        )),
    );
    let mut matches = InlineTable::new();
    matches.insert("tool", glob_literal(&suggestion.shape.tool_name).into());
    matches.insert("agent", glob_literal(&suggestion.shape.agent_id).into());
    let mut argument = InlineTable::new();
    argument.insert("pointer", suggestion.shape.bound.pointer().into());
    argument.insert("regex", suggestion.regex().into());
    let mut arguments = Array::new();
    arguments.push(argument);
    matches.insert("arguments", arguments.into());
    rule.insert("match", Item::Value(matches.into()));
    rule
}

/// A glob that matches exactly `text` (its special characters escaped).
fn glob_literal(text: &str) -> String {
    let mut glob = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob
}

/// The `[[rules]]` entry a suggestion adds, as TOML.
pub fn rule_text(suggestion: &Suggestion) -> String {
    let mut doc = DocumentMut::new();
    let mut rules = ArrayOfTables::new();
    rules.push(rule_table(suggestion));
    doc.insert("rules", Item::ArrayOfTables(rules));
    doc.to_string()
}

/// What the audit trail records of a suggestion `accepted_by` accepted: the rule, the
/// evidence, and the newest approval of it (the event is recorded there).
pub fn acceptance(suggestion: &Suggestion, accepted_by: &str) -> pb::RecordRuleAcceptedRequest {
    let first = suggestion.approval_ids.first().cloned().unwrap_or_default();
    let last = suggestion.approval_ids.last().cloned().unwrap_or_default();
    pb::RecordRuleAcceptedRequest {
        approval_id: last.clone(),
        rule_name: suggestion.rule_name(),
        rule: rule_text(suggestion),
        evidence: format!(
            "{}; approvals {first} … {last}; suggestion {}; accepted on the CLI as {}",
            suggestion.evidence(),
            suggestion.id(),
            one_line(accepted_by)
        ),
    }
}

/// The suggestions as text: each with its id, its evidence and the rule it would add.
pub fn text(suggestions: &[Suggestion]) -> String {
    if suggestions.is_empty() {
        return "no suggestions: no call shape was approved often enough without ever being rejected\n"
            .to_owned();
    }
    let mut out = String::new();
    for suggestion in suggestions {
        out.push_str(&format!(
            "{} allow {} {} for agent {}: {}\n",
            suggestion.id(),
            cell(&suggestion.shape.tool_name, 64),
            cell(&suggestion.shape.bound.summary(), 120),
            cell(&suggestion.shape.agent_id, 64),
            suggestion.evidence()
        ));
        for line in rule_text(suggestion).lines() {
            out.push_str(&format!("   {line}\n"));
        }
    }
    out.push_str("\naccept one with: countersign rules suggest --accept ID\n");
    out
}

/// The suggestions as JSON.
pub fn json(suggestions: &[Suggestion]) -> Value {
    Value::Array(
        suggestions
            .iter()
            .map(|s| {
                json!({
                    "id": s.id(),
                    "rule": s.rule_name(),
                    "agent_id": s.shape.agent_id,
                    "tool_name": s.shape.tool_name,
                    "shape": s.shape.bound.summary(),
                    "pointer": s.shape.bound.pointer(),
                    "regex": s.regex(),
                    "approvals": s.approvals,
                    "approvers": s.approvers,
                    "rejections": 0,
                    "evidence": s.approval_ids,
                })
            })
            .collect(),
    )
}

/// Appends suggestion `suggestion` to `doc`'s `[[rules]]` (after the existing ones: a rule
/// already there still wins), with a comment that records who accepted it, when, and on what
/// evidence. Refused when a rule of that name exists already.
pub fn accept(
    doc: &mut DocumentMut,
    suggestion: &Suggestion,
    accepted_by: &str,
    now: std::time::SystemTime,
) -> Result<(), CliError> {
    let name = suggestion.rule_name();
    let rules = doc
        .entry("rules")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| {
            CliError::Usage("the config file's rules is not an array of tables".into())
        })?;
    if rules
        .iter()
        .any(|rule| rule.get("name").and_then(Item::as_str) == Some(name.as_str()))
    {
        return Err(CliError::Usage(format!(
            "the config file has a rule named {name:?} already; not adding it again"
        )));
    }
    let mut rule = rule_table(suggestion);
    let when =
        render::timestamp(Some(&countersign_client::Timestamp::from(now))).unwrap_or_default();
    let first = suggestion.approval_ids.first().cloned().unwrap_or_default();
    let last = suggestion.approval_ids.last().cloned().unwrap_or_default();
    rule.decor_mut().set_prefix(format!(
        "\n# Accepted from `countersign rules suggest` by {} at {when}: {}; evidence: approvals {first} … {last}; suggestion {}.\n",
        one_line(accepted_by),
        one_line(&suggestion.evidence()),
        suggestion.id(),
    ));
    rules.push(rule);
    Ok(())
}

/// Text for a TOML comment: on one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
