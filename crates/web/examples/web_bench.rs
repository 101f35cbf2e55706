//! Figures for the web inbox (docs/performance.md), each with a baseline measured in the same
//! run on the same machine:
//!
//! 1. The inbox page with 1,000 pending approvals: request time on loopback (an upper bound
//!    of server time), against the same page filtered down to no rows.
//! 2. Approval-to-browser latency at 100 approvals/s with 50 open inbox event streams: from
//!    just before `RequestApproval` until each stream has the row, against the server's own
//!    `WatchApprovals` fan-out latency measured alongside.
//!
//! Run: `cargo run --release -p countersign-web --example web_bench` (about 30 s).

use countersign_worker::config::WorkerSettings;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use countersign_client::{pb, Client, ClientConfig, WatchItem, WatchOptions};
use countersign_testkit::server::TestServer;
use countersign_web::sessions::{Approver, Sessions};
use futures::StreamExt;

const PENDING: usize = 1_000;
const PAGE_LOADS: usize = 40;
const STREAMS: usize = 50;
const RATE_PER_SEC: u64 = 100;
const STREAM_SECONDS: u64 = 5;

const SERVER_TOML: &str = r#"
[limits]
requests_per_minute = 0
max_pending_per_agent = 0
"#;

#[tokio::main]
async fn main() {
    let server = TestServer::start_with_toml(SERVER_TOML).await;
    let client = Client::connect(ClientConfig::new(server.url())).expect("client");
    let state = tempfile::tempdir().expect("state directory");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let web_addr = listener.local_addr().expect("address");
    let settings = settings(&server.url(), state.path(), web_addr);
    let sessions = Sessions::open(state.path()).await.expect("sessions");
    let token = sessions
        .issue_login(
            &Approver {
                id: "bench".into(),
                name: "Bench".into(),
            },
            Duration::from_secs(600),
        )
        .await
        .expect("login token");
    let (session_id, _) = sessions
        .redeem_login(&token, Duration::from_secs(3600))
        .await
        .expect("redeem")
        .expect("session");
    let cookie = format!("countersign_session={session_id}");
    tokio::spawn(countersign_web::serve(
        settings,
        listener,
        std::future::pending(),
    ));
    let base = format!("http://{web_addr}");
    let http = reqwest::Client::new();

    // 1. The inbox with 1,000 pending approvals.
    let created = Instant::now();
    futures::stream::iter(0..PENDING)
        .for_each_concurrent(32, |i| {
            let client = client.clone();
            async move {
                client
                    .request_approval(request(
                        &format!("agent-{}", i % 20),
                        &format!("pending#{i};"),
                    ))
                    .await
                    .expect("request");
            }
        })
        .await;
    println!("created {PENDING} approvals in {:?}", created.elapsed());
    wait_for_rows(&http, &base, &cookie, PENDING).await;
    let full = time_page(&http, &format!("{base}/"), &cookie).await;
    let empty = time_page(&http, &format!("{base}/?agent=nobody"), &cookie).await;
    println!(
        "inbox page, {PENDING} rows: p50 {:.1} ms, p99 {:.1} ms; same page with 0 rows: p50 {:.1} ms, p99 {:.1} ms; ratio p50 {:.1}x",
        ms(percentile(&full, 50)),
        ms(percentile(&full, 99)),
        ms(percentile(&empty, 50)),
        ms(percentile(&empty, 99)),
        ms(percentile(&full, 50)) / ms(percentile(&empty, 50)).max(0.001)
    );

    // 2. Approval-to-browser latency with 50 open inbox streams at 100 approvals/s.
    let total = (RATE_PER_SEC * STREAM_SECONDS) as usize;
    let sent: Arc<Vec<Mutex<Option<Instant>>>> =
        Arc::new((0..total).map(|_| Mutex::new(None)).collect());
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total * STREAMS)));
    let mut readers = Vec::new();
    for _ in 0..STREAMS {
        let response = http
            .get(format!("{base}/events?agent=live"))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("event stream");
        readers.push(tokio::spawn(read_stream(
            response,
            Arc::clone(&sent),
            Arc::clone(&latencies),
            total,
        )));
    }
    let watch_latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let watcher = tokio::spawn(watch_baseline(
        client.clone(),
        Arc::clone(&sent),
        Arc::clone(&watch_latencies),
        total,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_SEC));
    for i in 0..total {
        ticker.tick().await;
        let client = client.clone();
        let sent = Arc::clone(&sent);
        tokio::spawn(async move {
            *sent[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            client
                .request_approval(request("live", &format!("live#{i};")))
                .await
                .expect("request");
        });
    }
    for reader in readers {
        let _ = tokio::time::timeout(Duration::from_secs(30), reader).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), watcher).await;
    let mut web = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut watch = watch_latencies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    web.sort();
    watch.sort();
    println!(
        "approval to browser, {STREAMS} streams at {RATE_PER_SEC}/s: {} deliveries of {} expected; p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        web.len(),
        total * STREAMS,
        ms(percentile(&web, 50)),
        ms(percentile(&web, 99)),
        ms(web.last().copied().unwrap_or_default())
    );
    println!(
        "baseline, the server's WatchApprovals to one SDK watcher: p50 {:.1} ms, p99 {:.1} ms; ratio p99 {:.1}x",
        ms(percentile(&watch, 50)),
        ms(percentile(&watch, 99)),
        ms(percentile(&web, 99)) / ms(percentile(&watch, 99)).max(0.001)
    );
}

fn settings(
    server_url: &str,
    state: &std::path::Path,
    listen: std::net::SocketAddr,
) -> countersign_web::Settings {
    let config = state.join("web.toml");
    std::fs::write(
        &config,
        format!("listen = \"{listen}\"\nstate_dir = {state:?}\n[server]\nurl = \"{server_url}\"\n"),
    )
    .expect("write config");
    countersign_web::Settings::load(&config).expect("settings")
}

fn request(agent: &str, action: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: agent.into(),
        session_id: "bench".into(),
        idempotency_key: uuid::Uuid::now_v7().to_string(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"make deploy"}"#.into(),
        action: action.into(),
        risk: pb::Risk::Medium.into(),
        ttl_seconds: 3600,
        ..Default::default()
    }
}

/// The body of a signed-in GET.
async fn fetch(http: &reqwest::Client, url: &str, cookie: &str) -> String {
    http.get(url)
        .header("cookie", cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("body")
}

async fn wait_for_rows(http: &reqwest::Client, base: &str, cookie: &str, rows: usize) {
    for _ in 0..600 {
        let page = fetch(http, &format!("{base}/"), cookie).await;
        if page.matches("<tr id=\"row-").count() >= rows {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the inbox never showed {rows} rows");
}

async fn time_page(http: &reqwest::Client, url: &str, cookie: &str) -> Vec<Duration> {
    let mut times = Vec::with_capacity(PAGE_LOADS);
    for _ in 0..PAGE_LOADS {
        let started = Instant::now();
        let body = fetch(http, url, cookie).await;
        times.push(started.elapsed());
        assert!(!body.is_empty());
    }
    times.sort();
    times
}

/// The index in a `live#N;` marker.
fn marker(text: &str) -> Option<usize> {
    let start = text.find("live#")? + "live#".len();
    text[start..].split(';').next()?.parse().ok()
}

async fn read_stream(
    mut response: reqwest::Response,
    sent: Arc<Vec<Mutex<Option<Instant>>>>,
    latencies: Arc<Mutex<Vec<Duration>>>,
    total: usize,
) {
    let mut buffer = String::new();
    let mut seen = 0;
    while seen < total {
        let Ok(Ok(Some(chunk))) =
            tokio::time::timeout(Duration::from_secs(20), response.chunk()).await
        else {
            return;
        };
        let now = Instant::now();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if let Some(i) = marker(&block) {
                seen += usize::from(record(&sent, &latencies, i, now));
            }
        }
    }
}

async fn watch_baseline(
    client: Client,
    sent: Arc<Vec<Mutex<Option<Instant>>>>,
    latencies: Arc<Mutex<Vec<Duration>>>,
    total: usize,
) {
    let mut watch = client.watch(WatchOptions::channel("web"));
    let mut seen = 0;
    while seen < total {
        let Ok(Ok(item)) = tokio::time::timeout(Duration::from_secs(20), watch.next()).await else {
            return;
        };
        let now = Instant::now();
        if let WatchItem::Event(event) = item {
            if event.kind() != pb::EventKind::Requested {
                continue;
            }
            let Some(i) = event.approval.as_ref().and_then(|a| marker(&a.action)) else {
                continue;
            };
            seen += usize::from(record(&sent, &latencies, i, now));
        }
    }
}

/// Records the latency of approval `i` seen at `now`; false when its send time is unknown.
fn record(
    sent: &[Mutex<Option<Instant>>],
    latencies: &Mutex<Vec<Duration>>,
    i: usize,
    now: Instant,
) -> bool {
    let Some(at) = *sent[i].lock().unwrap_or_else(|p| p.into_inner()) else {
        return false;
    };
    latencies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(now - at);
    true
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) * p) / 100]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
