//! `countersign-server healthcheck`, the container health check: exit 0 against a serving
//! server, non-zero when nothing answers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = env!("CARGO_BIN_EXE_countersign-server");

fn healthcheck(url: &str) -> std::process::Output {
    Command::new(SERVER)
        .args(["healthcheck", "--url", url, "--timeout-ms", "1000"])
        .output()
        .unwrap()
}

#[test]
fn healthcheck_reports_a_serving_server_and_fails_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}");
    let mut server = Command::new(SERVER)
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--database")
        .arg(dir.path().join("countersign.db"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // The server needs a moment to listen; the check answers as soon as it does.
    let deadline = Instant::now() + Duration::from_secs(30);
    let serving = loop {
        let output = healthcheck(&url);
        if output.status.success() || Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(serving.status.success(), "{serving:?}");
    let said = String::from_utf8_lossy(&serving.stdout);
    assert!(
        said.contains("countersign.v1.ApprovalService") && said.contains("SERVING"),
        "{said}"
    );

    let down = healthcheck(&url);
    assert!(!down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains(&url));
}
