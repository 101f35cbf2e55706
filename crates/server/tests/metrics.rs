//! `/metrics` after real gRPC traffic: scraped over HTTP from a server on loopback.

use std::time::{Duration, Instant};

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_server::config::Config;
use countersign_testkit::http::{self, sample};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const PATIENCE: Duration = Duration::from_secs(10);

struct Running {
    grpc_url: String,
    metrics_addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        database: dir.path().join("countersign.db"),
        ..Config::default()
    };
    config.approvals.sweep_interval_ms = 50;
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_url = format!("http://{}", grpc.local_addr().unwrap());
    let metrics_addr = metrics.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        countersign_server::serve_with_metrics(config, grpc, Some(metrics), async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        grpc_url,
        metrics_addr,
        stop: Some(stop),
        task,
        _dir: dir,
    }
}

/// `GET /metrics`; returns the content type and the body.
async fn scrape(addr: std::net::SocketAddr) -> (String, String) {
    let answer = http::get(addr, "/metrics").await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    (answer.content_type, answer.body)
}

/// Scrapes until every expected sample has its value; the counts follow the event log a
/// moment after the calls return.
async fn scrape_until(addr: std::net::SocketAddr, expected: &[(&str, f64)]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, text) = scrape(addr).await;
        let missing: Vec<_> = expected
            .iter()
            .filter(|(series, want)| sample(&text, series) != Some(*want))
            .collect();
        if missing.is_empty() {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "still not as expected: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn request(key: &str, channel: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "agent-1".into(),
        session_id: "s-1".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command": "ls"}"#.into(),
        action: "list files".into(),
        risk: pb::Risk::High as i32,
        routes: vec![pb::Route {
            channel: channel.into(),
            target: "t".into(),
        }],
        ..Default::default()
    }
}

fn decide(id: &str, verdict: pb::Verdict, channel: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        approval_id: id.into(),
        verdict: verdict as i32,
        scope: pb::Scope::Once as i32,
        decider: Some(pb::Decider {
            channel: channel.into(),
            user_id: "42".into(),
            display_name: "Ada".into(),
        }),
        idempotency_key: format!("{id}-{channel}"),
        ..Default::default()
    }
}

#[tokio::test]
async fn metrics_follow_requests_decisions_streams_and_commits() {
    let mut server = start().await;
    let (content_type, before) = scrape(server.metrics_addr).await;
    assert!(content_type.starts_with("application/openmetrics-text"));
    assert_eq!(sample(&before, "countersign_pending_approvals"), Some(0.0));
    assert_eq!(sample(&before, "countersign_watch_streams"), Some(0.0));
    assert_eq!(
        sample(&before, "countersign_requests_total{outcome=\"pending\"}"),
        Some(0.0)
    );
    // Families with labels from traffic (decisions, RPCs) appear with their first sample.
    for help in [
        "countersign_time_to_decision_seconds",
        "countersign_commit_batch_size",
        "countersign_commit_latency_seconds",
    ] {
        assert!(
            before.contains(&format!("# HELP {help} ")),
            "{help} missing:\n{before}"
        );
    }

    let mut client = ApprovalServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap();
    let mut watch = client
        .watch_approvals(pb::WatchApprovalsRequest {
            channel: "telegram".into(),
            include_snapshot: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().unwrap(); // SNAPSHOT_COMPLETE: the stream is open

    let mut ids = Vec::new();
    for (key, channel) in [("k1", "telegram"), ("k2", "github"), ("k3", "telegram")] {
        let response = client
            .request_approval(request(key, channel))
            .await
            .unwrap()
            .into_inner();
        ids.push(response.approval.unwrap().id);
    }
    // The same call again is not a new approval.
    client
        .request_approval(request("k1", "telegram"))
        .await
        .unwrap();
    let mut invalid = request("k4", "telegram");
    invalid.risk = pb::Risk::Unspecified as i32;
    let refused = client.request_approval(invalid).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    client
        .decide(decide(&ids[0], pb::Verdict::Approve, "telegram"))
        .await
        .unwrap();
    client
        .decide(decide(&ids[1], pb::Verdict::Reject, "github"))
        .await
        .unwrap();

    let method = "countersign.v1.ApprovalService";
    let text = scrape_until(
        server.metrics_addr,
        &[
            ("countersign_pending_approvals", 1.0),
            ("countersign_requests_total{outcome=\"pending\"}", 3.0),
            (
                "countersign_decisions_total{verdict=\"approve\",channel=\"telegram\"}",
                1.0,
            ),
            (
                "countersign_decisions_total{verdict=\"reject\",channel=\"github\"}",
                1.0,
            ),
            ("countersign_time_to_decision_seconds_count", 2.0),
            ("countersign_watch_streams", 1.0),
            (
                &format!("countersign_rpc_requests_total{{method=\"{method}/RequestApproval\",code=\"Ok\"}}"),
                4.0,
            ),
            (
                &format!("countersign_rpc_requests_total{{method=\"{method}/RequestApproval\",code=\"InvalidArgument\"}}"),
                1.0,
            ),
            (
                &format!("countersign_rpc_requests_total{{method=\"{method}/Decide\",code=\"Ok\"}}"),
                2.0,
            ),
        ],
    )
    .await;
    // Five changes committed (three requests, two decisions), in one or more groups.
    let commits = sample(&text, "countersign_commit_batch_size_count").unwrap();
    let changes = sample(&text, "countersign_commit_batch_size_sum").unwrap();
    assert!(commits >= 1.0 && changes >= 5.0, "{text}");
    assert_eq!(
        sample(&text, "countersign_commit_latency_seconds_count"),
        Some(commits)
    );
    assert!(sample(&text, "countersign_commit_latency_seconds_sum").unwrap() > 0.0);

    // A closed stream is no longer counted, and its call is counted as cancelled.
    drop(watch);
    scrape_until(
        server.metrics_addr,
        &[
            ("countersign_watch_streams", 0.0),
            (
                &format!("countersign_rpc_requests_total{{method=\"{method}/WatchApprovals\",code=\"Cancelled\"}}"),
                1.0,
            ),
        ],
    )
    .await;

    let _ = server.stop.take().unwrap().send(());
    server.task.await.unwrap();
}

#[tokio::test]
async fn the_receipt_keys_are_served_as_a_jwks_document() {
    let running = start().await;
    let mut client = ApprovalServiceClient::connect(running.grpc_url.clone())
        .await
        .unwrap();
    let keys = client
        .get_signing_keys(pb::GetSigningKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    let answer = http::get(running.metrics_addr, "/.well-known/jwks.json")
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.content_type, "application/jwk-set+json");
    assert_eq!(answer.body, keys.jwks_json);
    assert!(!keys.fingerprint.is_empty());
}
