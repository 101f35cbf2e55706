//! `countersign install` and `countersign doctor` on real settings files in a temporary
//! project and home directory.

use crate::support;

use std::path::Path;

use countersign_testkit::server::TestServer;
use serde_json::{json, Value};
use support::*;

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `countersign` run in `project` with `home` as $HOME. The server (from the environment) is
/// repeated in installed hook commands, as the host may not have the same environment.
async fn run_in(server: &str, project: &Path, home: &Path, args: &[&str]) -> std::process::Output {
    let mut command = countersign(server);
    command
        .current_dir(project)
        .env("HOME", home)
        .env_remove("CODEX_HOME")
        .args(args);
    tokio::time::timeout(STEP, command.output())
        .await
        .expect("countersign hung")
        .unwrap()
}

fn hook_of(settings: &Value, event: &str) -> Value {
    let groups = settings["hooks"][event].as_array().unwrap();
    let ours: Vec<&Value> = groups
        .iter()
        .filter(|group| {
            group["hooks"][0]["command"]
                .as_str()
                .unwrap_or("")
                .contains("countersign-hook ")
        })
        .collect();
    assert_eq!(ours.len(), 1, "one countersign group in {settings}");
    ours[0].clone()
}

#[tokio::test]
async fn install_merges_into_existing_settings_keeps_a_backup_and_never_duplicates() {
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let settings_path = project.path().join(".claude/settings.json");
    std::fs::create_dir_all(settings_path.parent().unwrap()).unwrap();
    let original = json!({
        "model": "opus",
        "permissions": {"allow": ["Read"]},
        "hooks": {"PreToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": "prettier --check"}]}]}
    });
    std::fs::write(&settings_path, original.to_string()).unwrap();
    // Installed hooks run `countersign-hook`, built beside `countersign`.
    let hook_exe = env!("CARGO_BIN_EXE_countersign-hook");

    for _ in 0..2 {
        let output = run_in(
            "http://127.0.0.1:1",
            project.path(),
            home.path(),
            &["install", "claude-code"],
        )
        .await;
        assert_exit(&output, 0);
    }
    let settings = read_json(&settings_path);
    assert_eq!(settings["model"], "opus");
    assert_eq!(settings["permissions"], original["permissions"]);
    let groups = settings["hooks"]["PreToolUse"].as_array().unwrap();
    assert_eq!(
        groups.len(),
        2,
        "the user's hook stays, ours is added once: {settings}"
    );
    assert_eq!(groups[0], original["hooks"]["PreToolUse"][0]);
    assert_eq!(
        hook_of(&settings, "PreToolUse"),
        json!({
            "matcher": "Bash|Edit|Write|MultiEdit|NotebookEdit|WebFetch|mcp__.*",
            "hooks": [{"type": "command", "command": format!("{hook_exe} claude-code --timeout 540s --server http://127.0.0.1:1"), "timeout": 600}],
        })
    );
    let backup = project.path().join(".claude/settings.json.bak");
    assert_eq!(
        read_json(&backup),
        original,
        "the first backup holds the original"
    );
    assert!(project.path().join(".claude/settings.json.bak.2").exists());

    // The PermissionRequest hook goes next to it, with the config path carried along.
    std::fs::write(
        project.path().join("cs.toml"),
        "agent_id = \"claude-code-ci\"\n",
    )
    .unwrap();
    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &[
            "install",
            "claude-code",
            "--event",
            "permission-request",
            "--timeout",
            "100s",
            "--config",
            "cs.toml",
        ],
    )
    .await;
    assert_exit(&output, 0);
    let config = project.path().join("cs.toml");
    assert_eq!(
        hook_of(&read_json(&settings_path), "PermissionRequest"),
        json!({
            "matcher": "*",
            "hooks": [{"type": "command", "command": format!("{hook_exe} claude-code --event permission-request --timeout 100s --config {} --server http://127.0.0.1:1", config.display()), "timeout": 160}],
        })
    );
}

#[tokio::test]
async fn install_writes_each_hosts_file_and_format() {
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // Installed hooks run `countersign-hook`, built beside `countersign`.
    let hook_exe = env!("CARGO_BIN_EXE_countersign-hook");
    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &["install", "codex", "--user"],
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(
        read_json(&home.path().join(".codex/hooks.json")),
        json!({"hooks": {"PreToolUse": [{
            "matcher": "Bash|apply_patch|mcp__.*",
            "hooks": [{"type": "command", "command": format!("{hook_exe} codex --timeout 540s --server http://127.0.0.1:1"), "timeout": 600}],
        }]}})
    );
    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &["install", "gemini", "--project"],
    )
    .await;
    assert_exit(&output, 0);
    assert_eq!(
        read_json(&project.path().join(".gemini/settings.json")),
        json!({"hooks": {"BeforeTool": [{
            "matcher": "run_shell_command|write_file|replace|web_fetch|^mcp_.*",
            "hooks": [{"name": "countersign", "type": "command", "command": format!("{hook_exe} gemini --timeout 540s --server http://127.0.0.1:1"), "timeout": 600000}],
        }]}})
    );
    // --print shows the snippet and writes nothing.
    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &["install", "claude-code", "--print"],
    )
    .await;
    assert_exit(&output, 0);
    let snippet: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(
        snippet["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"],
        600
    );
    assert!(!project.path().join(".claude").exists());
}

#[tokio::test]
async fn install_refuses_a_settings_file_it_cannot_read_and_leaves_it_alone() {
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let path = project.path().join(".gemini/settings.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    for text in [
        "{\"hooks\": ",
        "[1, 2]",
        "{\"hooks\": {\"BeforeTool\": {}}}",
    ] {
        std::fs::write(&path, text).unwrap();
        let output = run_in(
            "http://127.0.0.1:1",
            project.path(),
            home.path(),
            &["install", "gemini"],
        )
        .await;
        assert_exit(&output, 70);
        assert!(
            stderr(&output).contains("not changing it"),
            "{}",
            stderr(&output)
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert!(!project.path().join(".gemini/settings.json.bak").exists());
    }
    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &["install", "gemini", "--event", "permission-request"],
    )
    .await;
    assert_exit(&output, 64);
}

#[tokio::test]
async fn doctor_checks_the_server_the_token_and_the_installed_hooks() {
    let server = TestServer::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let output = run_in(&server.url(), project.path(), home.path(), &["doctor"]).await;
    assert_exit(&output, 70);
    assert!(
        stdout(&output).contains("no countersign hook is installed"),
        "{}",
        stdout(&output)
    );

    let output = run_in(
        &server.url(),
        project.path(),
        home.path(),
        &["install", "claude-code"],
    )
    .await;
    assert_exit(&output, 0);
    let output = run_in(&server.url(), project.path(), home.path(), &["doctor"]).await;
    assert_exit(&output, 0);
    let report = stdout(&output);
    assert!(
        report.contains(&format!(
            "ok    server {} answers and accepts the token",
            server.url()
        )),
        "{report}"
    );
    assert!(
        report.contains("PreToolUse: countersign waits 9m, the host 10m"),
        "{report}"
    );

    // A host timeout shorter than countersign's wait would let the host run the tool.
    let path = project.path().join(".claude/settings.json");
    let mut settings = read_json(&path);
    settings["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"] = json!(300);
    std::fs::write(&path, settings.to_string()).unwrap();
    let output = run_in(
        &server.url(),
        project.path(),
        home.path(),
        &["doctor", "claude-code"],
    )
    .await;
    assert_exit(&output, 70);
    assert!(
        stdout(&output).contains("raise the hook's timeout"),
        "{}",
        stdout(&output)
    );

    let output = run_in(
        "http://127.0.0.1:1",
        project.path(),
        home.path(),
        &["doctor"],
    )
    .await;
    assert_exit(&output, 69);
}

/// Whether a host runs a hook for `tool`: all three read a matcher holding regex characters
/// as an unanchored regex (Gemini CLI `new RegExp(m).test(name)`, Codex and Claude Code alike),
/// and `*` as every tool.
fn host_runs_hook(matcher: &str, tool: &str) -> bool {
    matcher == "*" || regex::Regex::new(matcher).unwrap().is_match(tool)
}

/// A host and event, its key in the settings, the tools its matcher must gate and those it
/// must leave alone.
type MatcherCase = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

/// The default matchers, as `install` writes them, gate each host's shells, file changes,
/// fetches and MCP tools under the names the host documents, and leave its reads alone.
#[tokio::test]
async fn install_matchers_cover_each_hosts_documented_tool_names() {
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // (host, event, settings key, gated tools, tools left alone)
    let cases: [MatcherCase; 5] = [
        (
            "claude-code",
            "pre-tool-use",
            "PreToolUse",
            &[
                "Bash",
                "Edit",
                "Write",
                "MultiEdit",
                "NotebookEdit",
                "WebFetch",
                "mcp__github__create_issue",
            ],
            &["Read", "Grep", "Glob"],
        ),
        (
            "claude-code",
            "permission-request",
            "PermissionRequest",
            &["Bash", "mcp__github__create_issue"],
            &[],
        ),
        (
            "codex",
            "pre-tool-use",
            "PreToolUse",
            &["Bash", "apply_patch", "mcp__github__create_issue"],
            &[],
        ),
        (
            "codex",
            "permission-request",
            "PermissionRequest",
            &["Bash", "apply_patch", "mcp__github__create_issue"],
            &[],
        ),
        (
            "gemini",
            "pre-tool-use",
            "BeforeTool",
            &[
                "run_shell_command",
                "write_file",
                "replace",
                "web_fetch",
                // Gemini CLI: `mcp_<server>_<tool>`, single underscores.
                "mcp_github_create_issue",
                "mcp_my-server_write",
            ],
            &[
                "read_file",
                "glob",
                "list_mcp_resources",
                "read_mcp_resource",
            ],
        ),
    ];
    for (host, event, key, gated, left_alone) in cases {
        let output = run_in(
            "http://127.0.0.1:1",
            project.path(),
            home.path(),
            &["install", host, "--event", event, "--print"],
        )
        .await;
        assert_exit(&output, 0);
        let snippet: Value = serde_json::from_str(&stdout(&output)).unwrap();
        let matcher = snippet["hooks"][key][0]["matcher"].as_str().unwrap();
        for tool in gated {
            assert!(
                host_runs_hook(matcher, tool),
                "{host} {event}: {matcher:?} lets {tool} run ungated"
            );
        }
        for tool in left_alone {
            assert!(
                !host_runs_hook(matcher, tool),
                "{host} {event}: {matcher:?} asks about {tool}"
            );
        }
    }
}

/// A hook installed with a matcher that misses the host's MCP tools (Gemini CLI's before
/// `mcp_` was matched; one MCP server named by hand) or its shell fails `doctor`, which names
/// the tool and the fix.
#[tokio::test]
async fn doctor_fails_a_matcher_that_leaves_mcp_tools_ungated() {
    let server = TestServer::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    for (host, path, key, old_matcher, ungated) in [
        (
            "gemini",
            ".gemini/settings.json",
            "BeforeTool",
            "run_shell_command|write_file|replace|web_fetch|mcp__.*",
            "mcp_github_create_issue",
        ),
        (
            "claude-code",
            ".claude/settings.json",
            "PreToolUse",
            "Bash|Edit|Write",
            "mcp__github__create_issue",
        ),
        (
            "claude-code",
            ".claude/settings.json",
            "PreToolUse",
            "Bash|mcp__github__.*",
            "mcp__zz_any_server__run",
        ),
        (
            "gemini",
            ".gemini/settings.json",
            "BeforeTool",
            "write_file|replace|web_fetch|^mcp_.*",
            "run_shell_command",
        ),
    ] {
        let output = run_in(
            &server.url(),
            project.path(),
            home.path(),
            &["install", host],
        )
        .await;
        assert_exit(&output, 0);
        let output = run_in(
            &server.url(),
            project.path(),
            home.path(),
            &["doctor", host],
        )
        .await;
        assert_exit(&output, 0);

        let path = project.path().join(path);
        let mut settings = read_json(&path);
        settings["hooks"][key][0]["matcher"] = json!(old_matcher);
        std::fs::write(&path, settings.to_string()).unwrap();
        let output = run_in(
            &server.url(),
            project.path(),
            home.path(),
            &["doctor", host],
        )
        .await;
        assert_exit(&output, 70);
        let report = stdout(&output);
        assert!(
            report.contains(&format!("leaves {ungated} ungated"))
                && report.contains(&format!("run countersign install {host} again")),
            "{report}"
        );
    }
}

/// Codex skips a hook nobody trusted, with only a warning, and runs the tools ungated:
/// `install codex` says how to trust it, and `doctor codex` fails until Codex's config records
/// the trust of the project and of the hook (as Codex's `/hooks` writes it).
#[tokio::test]
async fn codex_hooks_must_be_trusted_in_codex_and_doctor_says_how() {
    let server = TestServer::start().await;
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let project_dir = project.path().canonicalize().unwrap();
    let project_key = format!("{:?}", project_dir.display().to_string());
    let output = run_in(
        &server.url(),
        &project_dir,
        home.path(),
        &["install", "codex"],
    )
    .await;
    assert_exit(&output, 0);
    let said = stdout(&output);
    assert!(
        said.contains("type /hooks and trust the countersign hook")
            && said.contains(&format!(
                "[projects.{project_key}] trust_level = \"trusted\""
            )),
        "{said}"
    );

    let config = home.path().join(".codex/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    let project_trusted = format!("[projects.{project_key}]\ntrust_level = \"trusted\"\n");
    let hook_key = format!(
        "{}:pre_tool_use:0:0",
        project_dir.join(".codex/hooks.json").display()
    );
    for (recorded, problem) in [
        (String::new(), "untrusted project"),
        (project_trusted.clone(), "Codex has not trusted this hook"),
        (
            format!("{project_trusted}[hooks.state.{hook_key:?}]\nenabled = false\ntrusted_hash = \"sha256:00\"\n"),
            "the hook is disabled in Codex",
        ),
    ] {
        std::fs::write(&config, recorded).unwrap();
        let output = run_in(&server.url(), &project_dir, home.path(), &["doctor", "codex"]).await;
        assert_exit(&output, 70);
        let report = stdout(&output);
        assert!(
            report.contains(&format!("FAIL  {}", project_dir.join(".codex/hooks.json").display()))
                && report.contains(problem),
            "{report}"
        );
    }
    std::fs::write(
        &config,
        format!("{project_trusted}[hooks.state.{hook_key:?}]\ntrusted_hash = \"sha256:00\"\n"),
    )
    .unwrap();
    let output = run_in(
        &server.url(),
        &project_dir,
        home.path(),
        &["doctor", "codex"],
    )
    .await;
    assert_exit(&output, 0);
    assert!(
        stdout(&output).contains("trusted in Codex"),
        "{}",
        stdout(&output)
    );
}
