//! Which `countersign` runs: `--version` names its version and the commit it was built from,
//! `doctor` that and the executable's path (the one an installed hook names may be another).

mod support;

use support::home::{text, Home};

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
