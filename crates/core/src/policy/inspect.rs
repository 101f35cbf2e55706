//! Looking at the rules rather than applying them: why each rule did or did not match a call
//! (`countersign policy test`), and rules that can never decide or overlap others
//! (`countersign policy lint`).

use serde_json::Value;

use super::{Action, Policy, Rule};
use crate::{ApprovalRequest, Disposition, Risk, StepUp, Verdict};

/// What one rule made of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A `classify` rule that matched and raised the risk to at least this.
    Raised(Risk),
    /// The rule that decided.
    Decided,
    /// The rule did not match, and why.
    NoMatch(String),
    /// An earlier rule decided first (the rule may or may not match).
    NotReached,
}

/// One rule's part in a decision.
#[derive(Debug, Clone)]
pub struct RuleOutcome {
    /// Its place in `[[rules]]`, from 0.
    pub index: usize,
    pub name: String,
    /// `allow`, `deny`, `require` or `classify`.
    pub action: &'static str,
    pub outcome: Outcome,
}

/// How the rules decide a call.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// `allow`, `deny` or `ask` (a human decides).
    pub decision: &'static str,
    /// The risk the call has after the rules.
    pub risk: Risk,
    /// The rule that decided, when one did.
    pub rule: Option<String>,
    /// The rule's reason (allow and deny).
    pub reason: String,
    /// The second factor the deciding `require` rule asks for.
    pub step_up: Option<StepUp>,
    pub rules: Vec<RuleOutcome>,
}

/// What `policy lint` found about a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindingKind {
    /// The rule can never match a call that reaches it.
    Unreachable,
    /// Every call it matches is decided by an earlier rule.
    Shadowed,
    /// Some call matches both it and an earlier rule with another action: the earlier decides.
    Overlapping,
}

#[derive(Debug, Clone)]
pub struct Finding {
    pub kind: FindingKind,
    /// The rule the finding is about, by its place in `[[rules]]`.
    pub rule: usize,
    /// The earlier rule involved, when there is one.
    pub other: Option<usize>,
    pub message: String,
}

impl Rule {
    fn action_name(&self) -> &'static str {
        match &self.action {
            Action::Resolve {
                verdict: Verdict::Approve,
                ..
            } => "allow",
            Action::Resolve { .. } => "deny",
            Action::Require(_) => "require",
            Action::Classify(_) => "classify",
        }
    }

    fn has_no_condition(&self) -> bool {
        self.tool.is_none()
            && self.agent.is_none()
            && self.risks.is_empty()
            && self.arguments.is_empty()
            && self.shell.is_none()
    }

    /// Whether every call `later` matches is matched by this rule too (as far as can be told
    /// from the patterns' text).
    fn covers(&self, later: &Rule) -> bool {
        covers_glob(self.tool.as_ref(), later.tool.as_ref())
            && covers_glob(self.agent.as_ref(), later.agent.as_ref())
            && (self.risks.is_empty()
                || (!later.risks.is_empty() && later.risks.iter().all(|r| self.risks.contains(r))))
            && self.arguments.iter().all(|mine| {
                later.arguments.iter().any(|theirs| {
                    mine.pointer == theirs.pointer
                        && mine.pattern.to_string() == theirs.pattern.to_string()
                })
            })
            && match (&self.shell, &later.shell) {
                (None, _) => true,
                (Some(mine), Some(theirs)) => mine.covers(theirs),
                (Some(_), None) => false,
            }
    }

    /// Whether some call is known to match both rules: their tools and agents share a name,
    /// their risks a level (arguments are not compared).
    fn overlaps(&self, other: &Rule) -> bool {
        shares_name(self.tool.as_ref(), other.tool.as_ref())
            && shares_name(self.agent.as_ref(), other.agent.as_ref())
            && (self.risks.is_empty()
                || other.risks.is_empty()
                || self.risks.iter().any(|r| other.risks.contains(r)))
    }
}

type Glob = globset::GlobMatcher;

fn covers_glob(mine: Option<&Glob>, theirs: Option<&Glob>) -> bool {
    match (mine, theirs) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(mine), Some(theirs)) => {
            mine.glob().glob() == theirs.glob().glob()
                || names(theirs).is_some_and(|names| names.iter().all(|n| mine.is_match(n)))
        }
    }
}

fn shares_name(a: Option<&Glob>, b: Option<&Glob>) -> bool {
    match (a, b) {
        (None, _) | (_, None) => true,
        (Some(a), Some(b)) => {
            a.glob().glob() == b.glob().glob()
                || names(a).is_some_and(|names| names.iter().any(|n| b.is_match(n)))
                || names(b).is_some_and(|names| names.iter().any(|n| a.is_match(n)))
        }
    }
}

/// The names a glob stands for when it is a plain name or `{a,b,…}` of plain names.
fn names(glob: &Glob) -> Option<Vec<String>> {
    let text = glob.glob().glob();
    let plain = |s: &str| !s.contains(['*', '?', '[', ']', '{', '}', ',', '\\']);
    if plain(text) {
        return Some(vec![text.to_owned()]);
    }
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    let names: Vec<String> = inner.split(',').map(str::to_owned).collect();
    names.iter().all(|n| plain(n)).then_some(names)
}

impl Policy {
    /// The decision on `request` with each rule's part in it.
    pub fn explain(&self, request: ApprovalRequest) -> Explanation {
        let arguments = serde_json::from_str::<Value>(&request.arguments_json).ok();
        let mut probe = request.clone();
        let (shaped, disposition) = self.apply(request);
        let mut decided = false;
        let mut rules = Vec::with_capacity(self.rules.len());
        // Classify rules run first, in order, each on the risk the earlier ones left.
        for (index, rule) in self.rules.iter().enumerate() {
            if let Action::Classify(floor) = rule.action {
                let outcome = match rule.mismatch(&probe, arguments.as_ref()) {
                    None => {
                        probe.risk = probe.risk.max(floor);
                        Outcome::Raised(floor)
                    }
                    Some(why) => Outcome::NoMatch(why),
                };
                rules.push((index, rule, outcome));
            }
        }
        for (index, rule) in self.rules.iter().enumerate() {
            if matches!(rule.action, Action::Classify(_)) {
                continue;
            }
            let outcome = if decided {
                Outcome::NotReached
            } else {
                match rule.mismatch(&probe, arguments.as_ref()) {
                    None => {
                        decided = true;
                        Outcome::Decided
                    }
                    Some(why) => Outcome::NoMatch(why),
                }
            };
            rules.push((index, rule, outcome));
        }
        rules.sort_by_key(|(index, _, _)| *index);
        let (decision, reason) = match disposition {
            Disposition::Resolve {
                verdict: Verdict::Approve,
                reason,
                ..
            } => ("allow", reason),
            Disposition::Resolve { reason, .. } => ("deny", reason),
            Disposition::RequireHuman => ("ask", String::new()),
        };
        Explanation {
            decision,
            risk: shaped.risk,
            rule: shaped.policy_rule,
            reason,
            step_up: shaped.step_up,
            rules: rules
                .into_iter()
                .map(|(index, rule, outcome)| RuleOutcome {
                    index,
                    name: rule.name.clone(),
                    action: rule.action_name(),
                    outcome,
                })
                .collect(),
        }
    }

    /// Rules that can never decide, and rules whose calls an earlier rule with another action
    /// may take.
    pub fn lint(&self) -> Vec<Finding> {
        let mut findings = Vec::new();
        // The risk every call has at least: unconditional `classify` rules raise it.
        let floor = self
            .rules
            .iter()
            .filter(|rule| rule.has_no_condition())
            .filter_map(|rule| match rule.action {
                Action::Classify(risk) => Some(risk),
                _ => None,
            })
            .max();
        for (index, rule) in self.rules.iter().enumerate() {
            if let Some(floor) = floor {
                if !rule.risks.is_empty() && rule.risks.iter().all(|risk| *risk < floor) {
                    findings.push(Finding {
                        kind: FindingKind::Unreachable,
                        rule: index,
                        other: None,
                        message: format!(
                            "matches only risks below {}, and every call is at least {} after the classify rules",
                            floor.as_str().to_ascii_lowercase(),
                            floor.as_str().to_ascii_lowercase()
                        ),
                    });
                    continue;
                }
            }
            if matches!(rule.action, Action::Classify(_)) {
                continue;
            }
            let earlier = self.rules[..index]
                .iter()
                .enumerate()
                .filter(|(_, e)| !matches!(e.action, Action::Classify(_)));
            let mut overlap = None;
            let mut covered = None;
            for (at, before) in earlier {
                if before.covers(rule) {
                    covered = Some((at, before));
                    break;
                }
                if overlap.is_none()
                    && before.action_name() != rule.action_name()
                    && before.overlaps(rule)
                    && (before.arguments.is_empty() && before.shell.is_none()
                        || rule.arguments.is_empty() && rule.shell.is_none())
                {
                    overlap = Some((at, before));
                }
            }
            if let Some((at, before)) = covered {
                let (kind, message) = if before.has_no_condition() {
                    (
                        FindingKind::Unreachable,
                        format!("rule {:?} before it matches every call", before.name),
                    )
                } else {
                    (
                        FindingKind::Shadowed,
                        format!(
                            "rule {:?} before it matches every call this one matches",
                            before.name
                        ),
                    )
                };
                findings.push(Finding {
                    kind,
                    rule: index,
                    other: Some(at),
                    message,
                });
            } else if let Some((at, before)) = overlap {
                findings.push(Finding {
                    kind: FindingKind::Overlapping,
                    rule: index,
                    other: Some(at),
                    message: format!(
                        "rule {:?} before it ({}) may match the same calls; where both match, it decides",
                        before.name,
                        before.action_name()
                    ),
                });
            }
        }
        findings
    }
}
