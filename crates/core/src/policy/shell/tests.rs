//! Shell-aware matching: the walker's findings, pattern matching, and the table of command
//! lines (commands.tsv) decided by the `balanced` preset (config/presets/balanced.toml).

use super::*;
use crate::policy::{Policy, RuleSpec};
use crate::validate::Limits;
use crate::{ApprovalRequest, Disposition, Risk, Verdict};

fn words(line: &str) -> Vec<Vec<String>> {
    analyze(line).top
}

#[test]
fn lists_and_pipelines_are_taken_apart_and_quotes_removed() {
    assert_eq!(
        words("ls -la 'a b' && git status | grep \"x y\"; echo \\$HOME"),
        vec![
            vec!["ls".to_owned(), "-la".into(), "a b".into()],
            vec!["git".into(), "status".into()],
            vec!["grep".into(), "x y".into()],
            vec!["echo".into(), "$HOME".into()],
        ]
    );
    assert_eq!(
        analyze("ls \\\n  -la").top,
        vec![vec!["ls".to_owned(), "-la".into()]]
    );
}

#[test]
fn substitutions_expansions_and_file_redirects_are_obstacles() {
    for line in [
        "ls $(rm -rf ~)",
        "ls `rm -rf ~`",
        "cat <(rm -rf ~)",
        "cat x > ~/.bashrc",
        "ls $HOME",
        "FOO=1 ls",
        "for f in *; do rm $f; done",
        "ls {a,b}",
    ] {
        assert!(analyze(line).obstacle.is_some(), "{line}");
    }
    for line in [
        "ls 2>/dev/null",
        "ls 2>&1",
        "ls > /dev/null 2>&1",
        "cat <<'EOF'\n$(x)\nEOF\n",
    ] {
        assert_eq!(analyze(line).obstacle, None, "{line}");
    }
}

#[test]
fn commands_inside_substitutions_and_wrappers_are_found() {
    let all = analyze("echo $(sudo rm -rf /) && sh -c 'curl x | bash'").all;
    let found: Vec<Vec<String>> = all.iter().flat_map(|c| candidates(c, 0)).collect();
    let has = |w: &[&str]| found.iter().any(|c| c == w);
    assert!(has(&["rm", "-rf", "/"]));
    assert!(has(&["bash"]));
    assert!(has(&["curl", "x"]));
}

#[test]
fn unparseable_lines_are_opaque() {
    for line in [
        "ls '",
        "ls $(",
        "echo \"unterminated",
        "$CMD -rf /",
        "\"$(echo rm)\" -rf /",
    ] {
        assert!(analyze(line).opaque.is_some(), "{line}");
    }
}

#[test]
fn double_star_matches_any_run_of_words() {
    let pattern = CommandPattern::compile("t", "rm ** -*r* **").unwrap();
    let w = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert!(pattern.is_match(&w("rm -rf x")));
    assert!(pattern.is_match(&w("rm x -r")));
    assert!(!pattern.is_match(&w("rm x")));
    assert!(!pattern.is_match(&w("rmdir -r x")));
}

#[test]
fn a_spec_needs_exactly_one_mode() {
    assert!(ShellMatcher::compile(&ShellSpec::default()).is_err());
    let both = ShellSpec {
        every: vec!["ls".into()],
        any: vec!["rm".into()],
        ..ShellSpec::default()
    };
    assert!(ShellMatcher::compile(&both).is_err());
}

#[derive(Deserialize)]
struct Preset {
    rules: Vec<RuleSpec>,
}

fn preset(name: &str) -> Policy {
    let path = format!(
        "{}/../../config/presets/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let preset: Preset = toml::from_str(&text).unwrap();
    Policy::compile(&preset.rules, &Limits::default()).unwrap()
}

fn bash(command: &str) -> ApprovalRequest {
    let arguments = serde_json::json!({ "command": command }).to_string();
    crate::policy::tests::request("Bash", &arguments, Risk::Low)
}

/// `allow`, `deny`, `ask` (a human, at the declared low risk) or `high` (a human, at high
/// risk) for a command line under `policy`.
fn outcome(policy: &Policy, command: &str) -> &'static str {
    match policy.apply(bash(command)) {
        (
            _,
            Disposition::Resolve {
                verdict: Verdict::Approve,
                ..
            },
        ) => "allow",
        (_, Disposition::Resolve { .. }) => "deny",
        (request, Disposition::RequireHuman) if request.risk >= Risk::High => "high",
        (_, Disposition::RequireHuman) => "ask",
    }
}

/// One row a line: the expected outcome, a tab, the command line with `\n` for a newline and
/// `\t` for a tab. `#` starts a comment line.
#[test]
fn the_balanced_preset_decides_the_command_table() {
    let policy = preset("balanced");
    let table = include_str!("commands.tsv");
    let mut rows = 0;
    let mut wrong = Vec::new();
    for line in table
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let (expected, command) = line
            .split_once('\t')
            .unwrap_or_else(|| panic!("row {line:?}"));
        let command = command.replace("\\n", "\n").replace("\\t", "\t");
        rows += 1;
        let got = outcome(&policy, &command);
        if got != expected {
            wrong.push(format!("{command:?}: expected {expected}, got {got}"));
        }
    }
    assert!(rows >= 200, "the table has {rows} rows");
    assert!(
        wrong.is_empty(),
        "{} of {rows} rows wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_strict_preset_allows_only_reads() {
    let policy = preset("strict");
    assert_eq!(outcome(&policy, "ls"), "ask");
    assert_eq!(outcome(&policy, "rm -rf build"), "high");
    let mut read = bash("");
    read.tool_name = "Read".into();
    read.arguments_json = r#"{"file_path":"/etc/hosts"}"#.into();
    assert!(matches!(
        policy.apply(read).1,
        Disposition::Resolve {
            verdict: Verdict::Approve,
            ..
        }
    ));
}

#[test]
fn the_example_in_docs_policies_compiles_and_reads_lines_whole() {
    let doc = include_str!("../../../../../docs/policies.md");
    let example = doc
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a TOML block in docs/policies.md");
    let preset: Preset = toml::from_str(example).unwrap();
    let policy = Policy::compile(&preset.rules, &Limits::default()).unwrap();
    assert_eq!(outcome(&policy, "git status && ls -la"), "allow");
    assert_eq!(outcome(&policy, "git status; rm -rf ~"), "ask");
    assert_eq!(outcome(&policy, "find . -delete"), "ask");
}

/// The parser recurses on nesting; a line deep enough to overflow the stack is not parsed
/// (and so never allowed), on a thread with the stack a server's worker thread has.
#[test]
fn deeply_nested_or_long_lines_are_refused_without_overflowing_the_stack() {
    let probe = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            for n in [100usize, 1000, 100_000] {
                for line in [
                    format!("{}ls{}", "(".repeat(n), ")".repeat(n)),
                    format!("ls {}{}", "$(".repeat(n), ")".repeat(n)),
                    format!("echo {}", "\"$(echo ".repeat(n) + &")\"".repeat(n)),
                    format!("ls {}", "{".repeat(n)),
                    format!("ls {}", "`".repeat(n)),
                    format!("{}ls{}", "if true; then ".repeat(n), "; fi".repeat(n)),
                    format!("{}ls{}", "while true; do ".repeat(n), "; done".repeat(n)),
                    format!("{}ls", "f() ".repeat(n)),
                ] {
                    assert!(analyze(&line).obstacle.is_some(), "{n}: {line:.40}");
                }
            }
            for n in [1000usize, 20_000] {
                let chain = vec!["ls"; n];
                let word = format!("ls {}", "a\"b\"'c'\\d".repeat(n));
                assert_eq!(analyze(&word).obstacle, None);
                let test = format!("[[ {}-n a ]]", "-n a && ".repeat(n));
                assert!(analyze(&test).obstacle.is_some());
                for joiner in [" && ", " | ", "; ", "\n"] {
                    let analysis = analyze(&chain.join(joiner));
                    assert!(
                        analysis.obstacle.is_none() && analysis.top.len() == n,
                        "{joiner:?}"
                    );
                }
            }
        })
        .unwrap();
    probe.join().unwrap();
}
