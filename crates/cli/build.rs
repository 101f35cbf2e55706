//! Sets `COUNTERSIGN_COMMIT` for `countersign --version` and `doctor`: the commit the binary
//! was built from. `COUNTERSIGN_BUILD_COMMIT` in the environment wins (a build from a source
//! archive or a wheel's sdist, which carry no .git); else git's HEAD; else "unknown".

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=COUNTERSIGN_BUILD_COMMIT");
    let commit = std::env::var("COUNTERSIGN_BUILD_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(git_head)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=COUNTERSIGN_COMMIT={}", commit.trim());
}

/// HEAD's abbreviated commit, and the files whose change moves it (HEAD itself, the branch it
/// names, packed refs) as the build script's triggers. `None` outside a git checkout or
/// without git.
fn git_head() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["rev-parse", "--symbolic-full-name", "HEAD"]) {
        if branch.starts_with("refs/") {
            watched.push(branch);
        }
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            if PathBuf::from(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
