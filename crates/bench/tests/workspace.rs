//! The workspace's binaries, for the tests that run them beside the bench.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const BINARIES: [(&str, &str); 5] = [
    ("countersign-server", "countersign-server"),
    ("countersign-telegram", "countersign-telegram"),
    ("countersign-github", "countersign-github"),
    ("countersign", "countersign-cli"),
    ("countersign-webhook", "countersign-webhook"),
];

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A workspace binary, built by cargo first when it is not next to this test yet (when the
/// test runs without `cargo test --workspace`, which builds them all).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/deploy-<hash>
        let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        if BINARIES.iter().any(|(bin, _)| !dir.join(bin).exists()) {
            let profile = dir.file_name().unwrap().to_str().unwrap().to_string();
            let mut build = Command::new(env!("CARGO"));
            build.current_dir(repo()).arg("build");
            for (_, package) in BINARIES {
                build.args(["-p", package]);
            }
            match profile.as_str() {
                "debug" => {}
                "release" => {
                    build.arg("--release");
                }
                other => {
                    build.args(["--profile", other]);
                }
            }
            assert!(build.status().unwrap().success(), "building the binaries");
        }
        dir
    });
    let path = dir.join(name);
    assert!(path.exists(), "{} missing", path.display());
    path
}

/// `countersign-bench` with the workspace's server binary named: without it the bench, seeing
/// `CARGO` set as under `cargo test`, would build the server again with `cargo build -p` (other
/// features: a minute or more, and a server binary the other tests do not use).
pub fn bench() -> Command {
    let mut bench = Command::new(env!("CARGO_BIN_EXE_countersign-bench"));
    bench
        .arg("--server-binary")
        .arg(binary("countersign-server"));
    bench
}
