//! `countersign-test-postgres`, the cluster scripts/test starts for its PostgreSQL pass: it
//! prints a port that serves, and the cluster ends, its files deleted, once the process it was
//! started for ends. (Also why cargo builds the binary with the workspace's tests.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

#[tokio::test]
async fn the_cluster_serves_then_ends_with_the_process_it_belongs_to() {
    let mut owner = Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("start the owner");
    let started = Command::new(env!("CARGO_BIN_EXE_countersign-test-postgres"))
        .args(["--until", &owner.id().to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("run countersign-test-postgres");
    assert!(started.status.success(), "{started:?}");
    let port: u16 = String::from_utf8_lossy(&started.stdout)
        .trim()
        .parse()
        .expect("it prints the port");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let mut connection = sqlx::PgConnection::connect(&url)
        .await
        .expect("the cluster serves");
    let answer: i32 = sqlx::query_scalar("SELECT 41 + 1")
        .fetch_one(&mut connection)
        .await
        .expect("a query");
    assert_eq!(answer, 42);
    let directory: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(&mut connection)
        .await
        .expect("its data directory");
    drop(connection);

    owner.kill().expect("end the owner");
    owner.wait().expect("the owner ended");
    // The watchdog looks every half second, then stops the cluster at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::PgConnection::connect(&url).await.is_ok()
        || std::path::Path::new(&directory).exists()
    {
        assert!(
            Instant::now() < deadline,
            "the cluster outlived its owner by 30 s ({directory})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn without_an_owner_it_says_how_to_use_it_and_starts_nothing() {
    for args in [&[][..], &["--until"][..], &["--until", "me"][..]] {
        let refused = Command::new(env!("CARGO_BIN_EXE_countersign-test-postgres"))
            .args(args)
            .output()
            .expect("run countersign-test-postgres");
        assert_eq!(refused.status.code(), Some(64), "{args:?}: {refused:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains("usage: countersign-test-postgres --until PID"),
            "{stderr}"
        );
        assert!(refused.stdout.is_empty(), "{args:?}: no port printed");
    }
}
