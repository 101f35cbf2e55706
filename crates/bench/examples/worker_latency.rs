//! Approval-to-message latency of the channel workers, each against its fake platform adding
//! a fixed latency to every call: a burst of approvals at once (the worker's lanes keep many
//! in flight) beside one approval at a time (each waits for the previous one's message).
//!
//! ```text
//! cargo run --release -p countersign-bench --example worker_latency -- [BURST] [ONE_AT_A_TIME] [LATENCY_MS]
//! ```
//! Defaults: 1000 approvals in the burst, 100 one at a time, 50 ms per platform call. The
//! latency of an approval runs from its RequestApproval answer to the moment the platform
//! created its message. Prints p50/p99 and the burst's p50 as a ratio of the one-at-a-time
//! p50 measured in the same run. Never asserts times.

use std::time::{Duration, Instant};

use countersign_client::{pb, Client, ClientConfig};
use countersign_github::config::{
    FileConfig, GitHubSection, PollingSection, ServerSection, WorkerSettings,
};
use countersign_testkit::github::{Endpoint, FakeGitHub, DEFAULT_BOT_LOGIN, DEFAULT_TOKEN};
use countersign_testkit::server::TestServer;
use countersign_testkit::telegram::FakeTelegram;

const BOT_TOKEN: &str = "364329248:AAE-fake-token-for-bench";
const CHAT: i64 = -1001234567890;
const REPO: &str = "acme/widgets";

/// No secrets from the environment: the configuration holds them.
/// A platform as the benchmark sees it: when the message of each approval was created.
trait Platform {
    fn channel(&self) -> &'static str;
    /// The route target of the `n`th approval.
    fn target(&self, n: usize) -> String;
    /// The creation time of the message of each of `ids` that exists, `None` for the others.
    fn created(&self, ids: &[String]) -> Vec<Option<Instant>>;
}

struct Telegram {
    fake: FakeTelegram,
    latency: Duration,
}

impl Platform for Telegram {
    fn channel(&self) -> &'static str {
        "telegram"
    }
    fn target(&self, _n: usize) -> String {
        String::new()
    }
    fn created(&self, ids: &[String]) -> Vec<Option<Instant>> {
        let sends: Vec<(Vec<String>, Instant)> = self
            .fake
            .requests_of("sendMessage")
            .into_iter()
            .filter(|r| r.succeeded())
            .map(|r| (r.callback_data(), r.received_at + self.latency))
            .collect();
        ids.iter()
            .map(|id| {
                sends
                    .iter()
                    .find(|(data, _)| data.iter().any(|d| d.contains(id.as_str())))
                    .map(|(_, at)| *at)
            })
            .collect()
    }
}

struct GitHub {
    fake: FakeGitHub,
    /// One issue per approval, as when each approval is about its own pull request (the
    /// worker lists an issue's comments before posting, to find one a crash left behind).
    issues: Vec<u64>,
    latency: Duration,
}

impl Platform for GitHub {
    fn channel(&self) -> &'static str {
        "github"
    }
    fn target(&self, n: usize) -> String {
        format!("{REPO}#{}", self.issues[n % self.issues.len()])
    }
    fn created(&self, ids: &[String]) -> Vec<Option<Instant>> {
        let posts: Vec<(String, Instant)> = self
            .fake
            .requests_to(Endpoint::CreateComment)
            .into_iter()
            .filter(|r| r.status == 201)
            .map(|r| (r.body, r.received_at + self.latency))
            .collect();
        ids.iter()
            .map(|id| {
                posts
                    .iter()
                    .find(|(body, _)| body.contains(id.as_str()))
                    .map(|(_, at)| *at)
            })
            .collect()
    }
}

fn request(key: String, n: usize, platform: &dyn Platform) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        // One agent per approval: the server's per-agent rate and pending limits stay out of
        // the figure.
        agent_id: format!("bench-{key}"),
        session_id: "bench-session".into(),
        idempotency_key: key,
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"make deploy"}"#.into(),
        action: "deploy".into(),
        reason: "benchmark".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: platform.channel().into(),
            target: platform.target(n),
        }],
        ..Default::default()
    }
}

/// Waits until every approval has its message; returns each latency.
async fn latencies(platform: &dyn Platform, asked: &[(String, Instant)]) -> Vec<Duration> {
    let ids: Vec<String> = asked.iter().map(|(id, _)| id.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let created = platform.created(&ids);
        if created.iter().all(Option::is_some) {
            return created
                .into_iter()
                .zip(asked)
                .map(|(at, (_, asked_at))| {
                    at.unwrap_or(*asked_at).saturating_duration_since(*asked_at)
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "messages missing after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(if ids.len() > 1 { 250 } else { 10 })).await;
    }
}

async fn burst(platform: &dyn Platform, agent: &Client, count: usize) -> Vec<Duration> {
    let calls = (0..count).map(|n| {
        let agent = agent.clone();
        let request = request(format!("burst-{n}"), n, platform);
        async move {
            let approval = agent
                .request_approval(request)
                .await
                .expect("RequestApproval")
                .approval
                .expect("an approval");
            (approval.id, Instant::now())
        }
    });
    let asked = futures::future::join_all(calls).await;
    latencies(platform, &asked).await
}

/// `count` approvals one after the other, numbered from `first` (keys and targets).
async fn one_at_a_time(
    platform: &dyn Platform,
    agent: &Client,
    first: usize,
    count: usize,
) -> Vec<Duration> {
    let mut all = Vec::new();
    for n in first..first + count {
        let approval = agent
            .request_approval(request(format!("single-{n}"), n, platform))
            .await
            .expect("RequestApproval")
            .approval
            .expect("an approval");
        let asked = [(approval.id, Instant::now())];
        all.extend(latencies(platform, &asked).await);
    }
    all
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn report(worker: &str, burst: Vec<Duration>, single: Vec<Duration>) {
    let summarise = |mut figures: Vec<Duration>| {
        figures.sort();
        (
            percentile(&figures, 0.5),
            percentile(&figures, 0.99),
            figures.len(),
        )
    };
    let (burst_p50, burst_p99, burst_n) = summarise(burst);
    let (single_p50, single_p99, single_n) = summarise(single);
    println!(
        "{worker:<9} burst of {burst_n:>4}: p50 {:>8.1} ms  p99 {:>8.1} ms | one at a time ({single_n:>4}): p50 {:>6.1} ms  p99 {:>6.1} ms | burst p50 / single p50 = {:.1}",
        burst_p50.as_secs_f64() * 1e3,
        burst_p99.as_secs_f64() * 1e3,
        single_p50.as_secs_f64() * 1e3,
        single_p99.as_secs_f64() * 1e3,
        burst_p50.as_secs_f64() / single_p50.as_secs_f64().max(1e-9),
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|arg| {
            arg.parse()
                .expect("numbers: BURST ONE_AT_A_TIME LATENCY_MS")
        })
        .collect();
    let burst_count = args.first().copied().unwrap_or(1000);
    let single_count = args.get(1).copied().unwrap_or(100);
    let latency = Duration::from_millis(args.get(2).copied().unwrap_or(50) as u64);
    println!(
        "approval-to-message latency, fake platform adding {} ms per call",
        latency.as_millis()
    );

    // Telegram.
    {
        let server = TestServer::start().await;
        let fake = FakeTelegram::start(BOT_TOKEN).await;
        fake.set_latency(latency);
        let state = tempfile::tempdir().expect("state dir");
        let mut settings =
            countersign_telegram::Settings::new(&server.url(), BOT_TOKEN).expect("settings");
        settings.api_url = fake.api_url();
        settings.default_chat_id = Some(CHAT);
        settings.poll_timeout_secs = 5;
        settings.outbox_path = state.path().join("outbox.jsonl");
        let worker = tokio::spawn(countersign_telegram::run(settings, std::future::pending()));
        let agent = Client::connect(ClientConfig::new(server.url())).expect("agent");
        let platform = Telegram { fake, latency };
        // Started once its first message is out.
        drop(one_at_a_time(&platform, &agent, burst_count, 1).await);
        let burst_figures = burst(&platform, &agent, burst_count).await;
        let single_figures = one_at_a_time(&platform, &agent, burst_count + 1, single_count).await;
        report("telegram", burst_figures, single_figures);
        worker.abort();
    }

    // GitHub.
    {
        let server = TestServer::start().await;
        let fake = FakeGitHub::start().await;
        let issues: Vec<u64> = (0..burst_count + single_count + 1)
            .map(|n| fake.add_issue(REPO, &format!("Change {n}")))
            .collect();
        fake.set_latency(latency);
        let file = FileConfig {
            server: ServerSection {
                url: server.url(),
                ..Default::default()
            },
            github: GitHubSection {
                api_url: Some(fake.url()),
                token: Some(DEFAULT_TOKEN.to_string()),
                bot_login: DEFAULT_BOT_LOGIN.to_string(),
                default_target: Some(format!("{REPO}#{}", issues[0])),
                // GitHub asks for a second between content writes; the benchmark measures the
                // worker, not that pacing.
                write_interval_ms: Some(0),
                ..Default::default()
            },
            webhook: None,
            // Commands are not part of the figure: poll rarely.
            polling: Some(PollingSection {
                interval_ms: Some(60_000),
            }),
            metrics: Default::default(),
        };
        let config = countersign_github::Settings::from_file(file, |_| None).expect("config");
        let worker = countersign_github::Worker::start(config)
            .await
            .expect("start the GitHub worker");
        let agent = Client::connect(ClientConfig::new(server.url())).expect("agent");
        let platform = GitHub {
            fake,
            issues,
            latency,
        };
        drop(one_at_a_time(&platform, &agent, burst_count, 1).await);
        let burst_figures = burst(&platform, &agent, burst_count).await;
        let single_figures = one_at_a_time(&platform, &agent, burst_count + 1, single_count).await;
        report("github", burst_figures, single_figures);
        worker.shutdown().await;
    }
}
