//! `countersign-bench --only requests,floor`: the storage floor is measured in the same run
//! (SQLite, or with COUNTERSIGN_TEST_BACKEND=postgres the test kit's PostgreSQL through
//! `--database`) and the RequestApproval figures are compared to it.

#[test]
fn the_floor_is_measured_and_request_figures_are_compared_to_it() {
    let mut bench = crate::workspace::bench();
    bench
        .args(["--only", "requests,floor", "--json"])
        .args(["--duration", "300ms", "--warmup", "100ms"])
        .args(["--concurrency", "4"]);
    let backend = if countersign_testkit::postgres::enabled() {
        let cluster = countersign_testkit::postgres::Cluster::shared();
        bench.args(["--database", &cluster.url("postgres")]);
        "PostgreSQL"
    } else {
        "SQLite"
    };
    let output = bench.output().expect("run the bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the bench failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("the bench's JSON");
    let figures = report["figures"].as_array().expect("figures");
    let floor = figures
        .iter()
        .find(|f| f["name"] == format!("storage floor: request writes, {backend}, full"))
        .unwrap_or_else(|| panic!("no storage floor figure for {backend}: {stdout}"));
    let floor_rate = floor["per_second"].as_f64().expect("the floor's rate");
    assert!(floor_rate > 0.0, "the floor wrote nothing: {floor}");
    assert!(
        floor["operations"].as_u64().is_some_and(|ops| ops > 0),
        "{floor}"
    );
    // Written in transactions of the group commit's mean batch, measured just before.
    let requests = figures
        .iter()
        .find(|f| f["name"] == "RequestApproval, full, group commit")
        .expect("the group-commit figure");
    let mean_batch = requests["extra"]["mean_commit_batch"]
        .as_f64()
        .expect("the group commit's mean batch");
    assert_eq!(
        floor["extra"]["changes_per_commit"].as_u64(),
        Some(mean_batch.round().max(1.0) as u64),
        "{floor}"
    );
    // The time each kind of the server's threads waited, runnable, for a CPU, beside the CPU it
    // used (from the kernel's scheduler statistics), for the writer too.
    for key in [
        "server_cpu_us_per_call",
        "server_waited_for_cpu_us_per_call",
    ] {
        let times = &requests["extra"][key];
        let by_thread = times["by_thread"].as_object().expect(key);
        let writer = by_thread["writer"].as_f64().unwrap_or(-1.0);
        assert!(writer >= 0.0, "{key}: no writer figure: {times}");
        let sum: f64 = by_thread.values().filter_map(|us| us.as_f64()).sum();
        let total = times["total"].as_f64().expect("a total");
        assert!((sum - total).abs() < 1e-6, "{key}: {times}");
    }
    for figure in figures.iter().filter(|f| {
        f["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("RequestApproval"))
    }) {
        let rate = figure["per_second"].as_f64().expect("a rate");
        let ratio = figure["extra"]["floor_ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("no ratio to the floor: {figure}"));
        assert!((ratio - rate / floor_rate).abs() < 1e-9, "{figure}");
        let note = figure["note"].as_str().unwrap_or_default();
        assert!(
            note.starts_with(&format!("{ratio:.2}x the storage floor")),
            "{note}"
        );
    }
}
