//! Which `countersign` runs: `--version` names its version and the commit it was built from,
//! `doctor` that and the executable's path (the one an installed hook names may be another).

use crate::support;

use support::home::{installed_hook, text, Home};

/// What build.rs records: git's HEAD when the tests run in a checkout, else "unknown".
fn built_from() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[tokio::test]
async fn version_names_the_release_and_the_commit() {
    let home = Home::new("http://127.0.0.1:9");
    let output = home.run(&["--version"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!(
            "countersign {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            built_from()
        )
    );
}

#[tokio::test]
async fn doctor_names_the_binary_its_version_and_path_first() {
    let home = Home::new("http://127.0.0.1:9");
    let output = home.run(&["doctor"]).await;
    let shown = text(&output);
    let first = shown.lines().next().unwrap_or_default();
    let path = std::fs::canonicalize(support::countersign_binary()).unwrap();
    assert_eq!(
        first,
        format!(
            "ok    countersign {} (commit {}) at {}",
            env!("CARGO_PKG_VERSION"),
            built_from(),
            path.display()
        ),
        "{shown}"
    );
}

/// A hook naming a binary that is gone (npx's cache cleaned, an uninstall) would run nothing
/// and let the host go on: doctor fails naming it and the fix.
#[tokio::test]
async fn doctor_fails_when_an_installed_hook_names_a_missing_binary() {
    let home = Home::new("http://127.0.0.1:9");
    let installed = home.run(&["install", "claude-code"]).await;
    assert_eq!(installed.status.code(), Some(0), "{}", text(&installed));
    let doctor = home.run(&["doctor", "claude-code"]).await;
    assert!(
        !text(&doctor).contains("which is not there"),
        "{}",
        text(&doctor)
    );

    let settings_file = home.path().join("project/.claude/settings.json");
    let hook = installed_hook(&home);
    // The executable it runs (`countersign-hook`, beside `countersign`), moved away.
    let program = hook.split_whitespace().next().unwrap();
    assert!(program.ends_with("/countersign-hook"), "{hook}");
    let gone = "/nonexistent/npx cache/countersign-hook";
    let settings = std::fs::read_to_string(&settings_file).unwrap().replace(
        &serde_json::to_string(&hook).unwrap(),
        &serde_json::to_string(&hook.replacen(program, &format!("'{gone}'"), 1)).unwrap(),
    );
    std::fs::write(&settings_file, settings).unwrap();
    assert!(
        installed_hook(&home).starts_with("'/nonexistent/npx cache/countersign-hook' claude-code")
    );

    let doctor = home.run(&["doctor", "claude-code"]).await;
    let shown = text(&doctor);
    assert_ne!(doctor.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains(&format!(
            "/.claude/settings.json PreToolUse: the hook runs {gone}, which is not there: run countersign install claude-code again"
        )),
        "{shown}"
    );
}
