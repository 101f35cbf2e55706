//! `countersign-server healthcheck`, the container health check: exit 0 against a serving
//! server, non-zero when nothing answers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = env!("CARGO_BIN_EXE_countersign-server");

fn healthcheck(url: &str) -> std::process::Output {
    healthcheck_with(url, &[])
}

fn healthcheck_with(url: &str, extra: &[&str]) -> std::process::Output {
    Command::new(SERVER)
        .args(["healthcheck", "--url", url, "--timeout-ms", "1000"])
        .args(extra)
        .output()
        .unwrap()
}

/// Starts the server binary with `config` and waits until `check` passes (or 30 s).
fn start_and_check(
    config: &str,
    dir: &std::path::Path,
    mut check: impl FnMut() -> std::process::Output,
) -> std::process::Output {
    let config_path = dir.join("countersign.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut server = Command::new(SERVER)
        .arg("--config")
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let output = loop {
        let output = check();
        if output.status.success() || Instant::now() > deadline {
            break output;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    server.kill().unwrap();
    server.wait().unwrap();
    output
}

#[test]
fn healthcheck_speaks_tls_with_the_servers_ca() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.path().join("server.pem"), server_cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "listen = \"127.0.0.1:{port}\"\ndatabase = \"{db}\"\n[tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n",
        db = dir.path().join("countersign.db").display(),
        cert = dir.path().join("server.pem").display(),
        key = dir.path().join("server.key").display(),
    );
    let url = format!("https://localhost:{port}");
    let ca_path = dir.path().join("ca.pem");
    let ca_arg = ca_path.to_str().unwrap();
    let plaintext_url = format!("http://127.0.0.1:{port}");
    let (with_ca, plaintext) = {
        let mut plaintext = None;
        let with_ca = start_and_check(&config, dir.path(), || {
            let output = healthcheck_with(&url, &["--ca-cert", ca_arg]);
            if output.status.success() {
                plaintext = Some(healthcheck(&plaintext_url));
            }
            output
        });
        (with_ca, plaintext)
    };
    assert!(with_ca.status.success(), "{with_ca:?}");
    let plaintext = plaintext.expect("checked plaintext while the server ran");
    assert!(
        !plaintext.status.success(),
        "a plaintext check must not pass a TLS server"
    );
}

#[test]
fn healthcheck_reports_a_serving_server_and_fails_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}");
    let config = format!(
        "listen = \"{addr}\"\ndatabase = \"{}\"\n",
        dir.path().join("countersign.db").display()
    );
    let serving = start_and_check(&config, dir.path(), || healthcheck(&url));
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
