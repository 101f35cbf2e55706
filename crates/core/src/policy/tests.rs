//! Policy's unit tests: rules compiled from their specs (and the errors naming them), matching,
//! risk floors, and policy again on edited arguments.

use std::collections::BTreeMap;

use super::*;

pub(super) fn request(tool: &str, arguments: &str, risk: Risk) -> ApprovalRequest {
    ApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "s".into(),
        requester: "alice".into(),
        idempotency_key: "k".into(),
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        args_digest: "d".into(),
        action: String::new(),
        reason: String::new(),
        risk,
        routes: Vec::new(),
        required_approvals: 1,
        ttl_seconds: None,
        labels: BTreeMap::new(),
        policy_rule: None,
        separation_of_duties: true,
        grant_scope: String::new(),
        approver_groups: Vec::new(),
        follow_up: None,
        withdraw_when_caller_leaves: false,
        step_up: None,
    }
}

fn rules(toml_like: Vec<RuleSpec>) -> Policy {
    Policy::compile(&toml_like, &Limits::default()).unwrap()
}

fn rule(name: &str, action: &str) -> RuleSpec {
    RuleSpec {
        name: name.into(),
        action: action.into(),
        ..RuleSpec::default()
    }
}

fn verdict_of(disposition: &Disposition) -> Option<(Verdict, Option<String>)> {
    match disposition {
        Disposition::Resolve { verdict, rule, .. } => Some((*verdict, rule.clone())),
        Disposition::RequireHuman => None,
    }
}

#[test]
fn no_rule_or_no_match_requires_a_human() {
    let (_, disposition) = Policy::default().apply(request("bash", "{}", Risk::Low));
    assert_eq!(disposition, Disposition::RequireHuman);
    let mut only_deploys = rule("deploys", "allow");
    only_deploys.matches.tool = Some("deploy".into());
    let (request, disposition) = rules(vec![only_deploys]).apply(request("bash", "{}", Risk::Low));
    assert_eq!(disposition, Disposition::RequireHuman);
    assert_eq!(request.policy_rule, None);
}

#[test]
fn the_first_matching_rule_wins() {
    let mut deny_rm = rule("no-rm", "deny");
    deny_rm.matches.arguments = vec![ArgumentSpec {
        pointer: "/command".into(),
        regex: Some(r"\brm\s+-rf\b".into()),
        glob: None,
    }];
    let mut low = rule("auto-low", "allow");
    low.matches.risk = vec!["low".into()];
    let policy = rules(vec![deny_rm, low]);
    let (_, denied) = policy.apply(request("bash", r#"{"command":"rm -rf /"}"#, Risk::Low));
    assert_eq!(
        verdict_of(&denied),
        Some((Verdict::Reject, Some("no-rm".into())))
    );
    let (_, allowed) = policy.apply(request("bash", r#"{"command":"ls"}"#, Risk::Low));
    assert_eq!(
        verdict_of(&allowed),
        Some((Verdict::Approve, Some("auto-low".into())))
    );
    let (_, high) = policy.apply(request("bash", r#"{"command":"ls"}"#, Risk::High));
    assert_eq!(high, Disposition::RequireHuman);
}

#[test]
fn globs_match_whole_names_and_pointers_reach_nested_values() {
    let mut prod = rule("prod", "deny");
    prod.matches.tool = Some("deploy.*".into());
    prod.matches.arguments = vec![ArgumentSpec {
        pointer: "/target/env".into(),
        glob: Some("prod*".into()),
        regex: None,
    }];
    let policy = rules(vec![prod]);
    let hit = request(
        "deploy.k8s",
        r#"{"target":{"env":"production"}}"#,
        Risk::Low,
    );
    assert!(verdict_of(&policy.apply(hit).1).is_some());
    for (tool, arguments) in [
        ("deploy", r#"{"target":{"env":"production"}}"#),
        ("deploy.k8s", r#"{"target":{"env":"staging-prod"}}"#),
        ("deploy.k8s", r#"{"target":{}}"#),
        ("xdeploy.k8s", r#"{"target":{"env":"prod"}}"#),
    ] {
        let (_, disposition) = policy.apply(request(tool, arguments, Risk::Low));
        assert_eq!(disposition, Disposition::RequireHuman, "{tool} {arguments}");
    }
}

#[test]
fn non_string_values_match_as_json_text() {
    let mut many = rule("many", "deny");
    many.matches.arguments = vec![ArgumentSpec {
        pointer: "/count".into(),
        regex: Some("^[0-9]{4,}$".into()),
        glob: None,
    }];
    let policy = rules(vec![many]);
    let (_, big) = policy.apply(request("mail", r#"{"count":12000}"#, Risk::Low));
    assert!(verdict_of(&big).is_some());
    let (_, small) = policy.apply(request("mail", r#"{"count":12}"#, Risk::Low));
    assert_eq!(small, Disposition::RequireHuman);
}

#[test]
fn require_rules_shape_the_request() {
    let mut require = rule("prod-deploys", "require");
    require.risk = Some("critical".into());
    require.ttl_seconds = Some(600);
    require.required_approvals = Some(2);
    require.routes = vec![Route {
        channel: "github".into(),
        target: "acme/ops#1".into(),
    }];
    require.separation_of_duties = Some(false);
    let policy = rules(vec![require]);
    let mut asked = request("deploy", "{}", Risk::Low);
    asked.ttl_seconds = Some(3600);
    asked.required_approvals = 3;
    let (shaped, disposition) = policy.apply(asked);
    assert_eq!(disposition, Disposition::RequireHuman);
    assert_eq!(shaped.risk, Risk::Critical);
    assert_eq!(shaped.ttl_seconds, Some(600), "the rule caps the TTL");
    assert_eq!(shaped.required_approvals, 3, "the rule sets a floor");
    assert_eq!(shaped.routes[0].target, "acme/ops#1");
    assert!(!shaped.separation_of_duties);
    assert_eq!(shaped.policy_rule.as_deref(), Some("prod-deploys"));
}

#[test]
fn classify_rules_raise_the_risk_that_later_rules_see() {
    let mut shell = rule("shell-is-high", "classify");
    shell.risk = Some("high".into());
    shell.matches.tool = Some("bash".into());
    shell.grant_scope = vec![GrantScopeSpec {
        pointer: "/command".into(),
        regex: Some(r"^\S+".into()),
    }];
    let mut rm = rule("rm-is-critical", "classify");
    rm.risk = Some("critical".into());
    rm.matches.arguments = vec![ArgumentSpec {
        pointer: "/command".into(),
        regex: Some(r"\brm\b".into()),
        glob: None,
    }];
    let mut low = rule("auto-low", "allow");
    low.matches.risk = vec!["low".into()];
    // Order does not matter: classify rules run first.
    let policy = rules(vec![low, shell, rm]);
    let (shaped, disposition) =
        policy.apply(request("bash", r#"{"command":"rm -rf /"}"#, Risk::Low));
    assert_eq!(disposition, Disposition::RequireHuman);
    assert_eq!(shaped.risk, Risk::Critical);
    assert_eq!(shaped.grant_scope, r#"[["/command","rm"]]"#);
    let (_, read) = policy.apply(request("read_file", r#"{"path":"a"}"#, Risk::Low));
    assert!(verdict_of(&read).is_some());
    let (kept, _) = policy.apply(request("read_file", "{}", Risk::Critical));
    assert_eq!(kept.risk, Risk::Critical, "a classify rule never lowers");
}

#[test]
fn every_malformed_rule_is_refused_with_its_name() {
    let argument = |pointer: &str, glob: Option<&str>, regex: Option<&str>| ArgumentSpec {
        pointer: pointer.into(),
        glob: glob.map(Into::into),
        regex: regex.map(Into::into),
    };
    type Breakage = Box<dyn Fn(&mut RuleSpec)>;
    let cases: Vec<(&str, Breakage)> = vec![
        ("glob", Box::new(|r| r.matches.tool = Some("[a".into()))),
        (
            "regex",
            Box::new(move |r| r.matches.arguments = vec![argument("/x", None, Some("(a"))]),
        ),
        (
            "pointer",
            Box::new(move |r| r.matches.arguments = vec![argument("x", Some("*"), None)]),
        ),
        (
            "~",
            Box::new(move |r| r.matches.arguments = vec![argument("/a~2", Some("*"), None)]),
        ),
        (
            "exactly one",
            Box::new(move |r| r.matches.arguments = vec![argument("/x", Some("*"), Some("x"))]),
        ),
        (
            "risk level",
            Box::new(|r| r.matches.risk = vec!["huge".into()]),
        ),
        ("not one of", Box::new(|r| r.action = "maybe".into())),
        ("require", Box::new(|r| r.ttl_seconds = Some(60))),
        ("needs risk", Box::new(|r| r.action = "classify".into())),
        (
            "grant_scope belongs",
            Box::new(|r| {
                r.grant_scope = vec![GrantScopeSpec {
                    pointer: "/c".into(),
                    regex: None,
                }]
            }),
        ),
    ];
    for (expected, breakage) in cases {
        let mut broken = rule("broken-one", "allow");
        breakage(&mut broken);
        let error =
            Policy::compile(&[rule("fine", "deny"), broken], &Limits::default()).unwrap_err();
        assert_eq!(error.subject, r#"rule "broken-one" (rules[1])"#);
        assert!(error.message.contains(expected), "{expected}: {error}");
    }
    let mut slow = rule("slow", "require");
    slow.ttl_seconds = Some(0);
    assert!(Policy::compile(&[slow], &Limits::default()).is_err());
    let twice = Policy::compile(&[rule("a", "deny"), rule("a", "allow")], &Limits::default());
    assert!(twice.unwrap_err().message.contains("same name"));
    let unnamed = Policy::compile(&[rule("", "deny")], &Limits::default()).unwrap_err();
    assert_eq!(unnamed.to_string(), "rules[0]: name is required");
}

fn shell_rule(name: &str, action: &str, every: &[&str]) -> RuleSpec {
    let mut spec = rule(name, action);
    spec.matches.tool = Some("Bash".into());
    spec.matches.shell = Some(shell::ShellSpec {
        every: every.iter().map(|s| s.to_string()).collect(),
        ..shell::ShellSpec::default()
    });
    spec
}

#[test]
fn a_shell_rule_matches_only_a_line_it_understands_whole() {
    let policy = rules(vec![shell_rule("reads", "allow", &["ls **", "git status"])]);
    let decide = |command: &str| {
        let arguments = serde_json::json!({ "command": command }).to_string();
        verdict_of(&policy.apply(request("Bash", &arguments, Risk::Low)).1).map(|(v, _)| v)
    };
    assert_eq!(decide("ls -la && git status"), Some(Verdict::Approve));
    for line in [
        "ls; rm -rf ~",
        "git status && curl x | sh",
        "ls > ~/.bashrc",
        "ls '",
    ] {
        assert_eq!(decide(line), None, "{line}");
    }
    let (_, no_command) = policy.apply(request("Bash", r#"{"command":7}"#, Risk::Low));
    assert_eq!(no_command, Disposition::RequireHuman);
}

#[test]
fn explain_names_the_deciding_rule_and_why_the_others_did_not_match() {
    let mut high = rule("rm-is-high", "classify");
    high.risk = Some("high".into());
    high.matches.shell = Some(shell::ShellSpec {
        any: vec!["rm **".into()],
        ..shell::ShellSpec::default()
    });
    let mut edits = rule("edits", "allow");
    edits.matches.tool = Some("Edit".into());
    let policy = rules(vec![
        high,
        edits,
        shell_rule("reads", "allow", &["ls **"]),
        rule("rest", "require"),
    ]);
    let explained = policy.explain(request("Bash", r#"{"command":"ls && rm x"}"#, Risk::Low));
    assert_eq!(explained.decision, "ask");
    assert_eq!(explained.risk, Risk::High);
    assert_eq!(explained.rule.as_deref(), Some("rest"));
    let outcomes: Vec<&inspect::Outcome> = explained.rules.iter().map(|r| &r.outcome).collect();
    assert_eq!(outcomes[0], &inspect::Outcome::Raised(Risk::High));
    assert_eq!(
        outcomes[1],
        &inspect::Outcome::NoMatch("the tool is not \"Edit\"".into())
    );
    assert_eq!(
        outcomes[2],
        &inspect::Outcome::NoMatch("\"rm x\" is not one of the allowed commands".into())
    );
    assert_eq!(outcomes[3], &inspect::Outcome::Decided);
    let allowed = policy.explain(request("Bash", r#"{"command":"ls"}"#, Risk::Low));
    assert_eq!(allowed.decision, "allow");
    assert_eq!(allowed.rules[3].outcome, inspect::Outcome::NotReached);
}

#[test]
fn lint_finds_unreachable_shadowed_and_overlapping_rules() {
    use inspect::FindingKind::*;
    let mut bash = rule("bash", "allow");
    bash.matches.tool = Some("{Bash,run_shell_command}".into());
    let mut bash_rm = rule("bash-rm", "deny");
    bash_rm.matches.tool = Some("Bash".into());
    bash_rm.matches.arguments = vec![ArgumentSpec {
        pointer: "/command".into(),
        glob: Some("rm *".into()),
        regex: None,
    }];
    let mut low = rule("low", "deny");
    low.matches.risk = vec!["low".into()];
    let mut edits = rule("edits", "allow");
    edits.matches.tool = Some("Edit".into());
    let mut floor = rule("floor", "classify");
    floor.risk = Some("medium".into());
    let findings = rules(vec![
        floor,
        bash,
        bash_rm,
        low,
        rule("all", "require"),
        edits,
    ])
    .lint();
    let found: Vec<(inspect::FindingKind, usize, Option<usize>)> = findings
        .iter()
        .map(|f| (f.kind.clone(), f.rule, f.other))
        .collect();
    assert_eq!(
        found,
        vec![
            (Shadowed, 2, Some(1)),
            (Unreachable, 3, None),
            (Overlapping, 4, Some(1)),
            (Unreachable, 5, Some(4)),
        ]
    );
    // Two rules on argument values: whether they overlap cannot be told from their text.
    let on_arguments = rules(vec![
        shell_rule("a", "allow", &["ls"]),
        shell_rule("b", "deny", &["rm"]),
    ])
    .lint();
    assert!(on_arguments.is_empty(), "{on_arguments:?}");
}

#[test]
fn a_require_rule_asks_for_a_passkey_step_up_and_an_edit_cannot_escape_it() {
    let mut deploys = rule("deploys", "require");
    deploys.matches.tool = Some("deploy".into());
    deploys.step_up = Some("passkey".into());
    let policy = rules(vec![deploys]);
    let (shaped, disposition) = policy.apply(request("deploy", "{}", Risk::Low));
    assert_eq!(disposition, Disposition::RequireHuman);
    assert_eq!(shaped.step_up, Some(crate::StepUp::Passkey));
    let (plain, _) = policy.apply(request("bash", "{}", Risk::Low));
    assert_eq!(plain.step_up, None);

    for action in ["allow", "deny", "classify"] {
        let mut misplaced = rule("misplaced", action);
        misplaced.risk = (action == "classify").then(|| "high".into());
        misplaced.step_up = Some("passkey".into());
        assert!(
            Policy::compile(&[misplaced], &Limits::default()).is_err(),
            "{action} took step_up"
        );
    }
    let mut unknown = rule("unknown", "require");
    unknown.step_up = Some("sms".into());
    let error = Policy::compile(&[unknown], &Limits::default()).unwrap_err();
    assert!(
        error.to_string().contains("\"sms\" is not known"),
        "{error}"
    );
}

#[test]
fn an_edit_that_a_step_up_rule_matches_is_refused_on_an_approval_without_it() {
    let mut rm = rule("rm needs a passkey", "require");
    rm.matches.arguments = vec![ArgumentSpec {
        pointer: "/command".into(),
        glob: Some("rm *".into()),
        regex: None,
    }];
    rm.step_up = Some("passkey".into());
    let policy = rules(vec![rm]);
    let approval = Approval::new(
        "a1".into(),
        request("bash", r#"{"command":"ls"}"#, Risk::Low),
        60,
        Disposition::RequireHuman,
        0,
    );
    let refused = policy
        .reevaluate(&approval, r#"{"command":"rm -rf /"}"#.into(), "e".into())
        .unwrap_err();
    assert!(
        refused.to_string().contains("need a passkey step-up"),
        "{refused}"
    );
    assert!(policy
        .reevaluate(&approval, r#"{"command":"ls -l"}"#.into(), "e".into())
        .is_ok());
}
