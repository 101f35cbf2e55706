//! `countersign-bench --database postgres://…` against a private PostgreSQL cluster: it
//! measures on databases of its own and leaves none of them behind on the operator's server.

use std::process::Stdio;

use sqlx::Connection;

#[tokio::test]
async fn a_run_on_postgres_drops_every_database_it_created() {
    if !countersign_testkit::postgres::enabled() {
        eprintln!("skipped: runs with COUNTERSIGN_TEST_BACKEND=postgres");
        return;
    }
    let cluster = countersign_testkit::postgres::Cluster::shared();
    let admin = cluster.url("postgres");
    let child = crate::workspace::bench()
        .args(["--database", &admin, "--only", "requests"])
        .args([
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--concurrency",
            "4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");
    // Its databases are named after its process id.
    let databases = format!("countersign_bench_{}_%", child.id());
    let bench = child.wait_with_output().expect("run the bench");
    let stdout = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success(),
        "the bench failed: {stdout}{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    // Three configurations, each measured on a database of its own.
    assert_eq!(
        stdout.matches("RequestApproval, ").count(),
        3,
        "expected the three RequestApproval figures: {stdout}"
    );

    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    let left: Vec<String> =
        sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE $1")
            .bind(&databases)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert!(left.is_empty(), "databases left behind: {left:?}");
}
