//! End to end: a real countersign server (testkit), the webhook worker (library entry point,
//! or the real binary), a receiver on loopback that records every request and can answer
//! 5xx, 4xx or hang, and the client SDK as the agent.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use countersign_client::{pb, Client, ClientConfig};
use countersign_testkit::server::TestServer;
use countersign_webhook::config::FileConfig;
use countersign_webhook::store::Store;
use countersign_webhook::{Settings, WorkerError};
use countersign_worker::config::WorkerSettings;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::task::JoinHandle;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SECRET_ENV: &str = "TEST_WEBHOOK_SECRET";
const APPROVERS: &str = "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { webhook = [\"alice\"] }\n\n[[approvers]]\nid = \"bob\"\nname = \"Bob\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"2002\"] }\n";

// ---------------------------------------------------------------------------------------
// The receiver.

#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// 503 with `Retry-After: <seconds>`.
    RetryAfter(u64),
    /// Never answers (the worker's timeout ends the attempt).
    Hang,
    /// Records, then answers 200 after this long (a worker killed meanwhile never hears it).
    SlowOk(Duration),
}

#[derive(Clone, Debug)]
struct Received {
    webhook_id: String,
    timestamp: String,
    signature: String,
    at: std::time::Instant,
    body: String,
    answered: Option<u16>,
}

#[derive(Clone, Default)]
struct Receiver {
    script: Arc<Mutex<VecDeque<Answer>>>,
    /// Once `script` is used up: the answers to the first, second, … request of each
    /// webhook-id (then 200).
    each_id: Arc<Mutex<Vec<Answer>>>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn script(&self, answers: &[Answer]) {
        self.script.lock().unwrap().extend(answers.iter().copied());
    }

    fn script_each_id(&self, answers: &[Answer]) {
        *self.each_id.lock().unwrap() = answers.to_vec();
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until `done` holds for what was received; returns it.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        for _ in 0..1000 {
            let received = self.received();
            if done(&received) {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the receiver never saw {what}: {:#?}", self.received());
    }

    /// Waits until a request with `webhook_id` was answered 2xx; returns its body.
    async fn accepted(&self, webhook_id: &str) -> Value {
        let received = self
            .wait_for(webhook_id, |received| {
                received
                    .iter()
                    .any(|r| r.webhook_id == webhook_id && r.answered == Some(200))
            })
            .await;
        let body = &received
            .iter()
            .find(|r| r.webhook_id == webhook_id)
            .unwrap()
            .body;
        serde_json::from_str(body).unwrap()
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap) {
    let answer;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let scripted = receiver.script.lock().unwrap().pop_front();
    let index = {
        let mut received = receiver.received.lock().unwrap();
        let webhook_id = header("webhook-id");
        let before = received
            .iter()
            .filter(|r| r.webhook_id == webhook_id)
            .count();
        answer = scripted
            .or_else(|| receiver.each_id.lock().unwrap().get(before).copied())
            .unwrap_or(Answer::Status(200));
        received.push(Received {
            webhook_id: header("webhook-id"),
            timestamp: header("webhook-timestamp"),
            signature: header("webhook-signature"),
            at: std::time::Instant::now(),
            body: String::from_utf8(body.to_vec()).unwrap(),
            answered: None,
        });
        received.len() - 1
    };
    let mut answer_headers = HeaderMap::new();
    let status = match answer {
        Answer::Status(status) => status,
        Answer::RetryAfter(seconds) => {
            answer_headers.insert("retry-after", seconds.into());
            503
        }
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            200
        }
        Answer::SlowOk(pause) => {
            tokio::time::sleep(pause).await;
            200
        }
    };
    receiver.received.lock().unwrap()[index].answered = Some(status);
    (StatusCode::from_u16(status).unwrap(), answer_headers)
}

/// A verifier written from the Standard Webhooks spec, independent of the worker's signer:
/// the key is the base64 after `whsec_`; the signed content is `id.timestamp.body`; the
/// header holds space-separated `v1,<base64 HMAC-SHA256>`; the timestamp is recent.
fn verify(secret: &str, received: &Received) -> bool {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let Ok(timestamp) = received.timestamp.parse::<i64>() else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    if (now - timestamp).abs() > 300 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", received.webhook_id, timestamp, received.body).as_bytes());
    let expected = STANDARD.encode(mac.finalize().into_bytes());
    received.signature.split(' ').any(|part| {
        part.split_once(',')
            .is_some_and(|(version, signature)| version == "v1" && signature == expected)
    })
}

#[test]
fn the_test_verifier_accepts_the_published_vector_and_nothing_else() {
    // The vector of the Standard Webhooks reference libraries, checked by the test's own
    // verifier (the timestamp made current, so the signature is recomputed by the worker's
    // signer and compared too).
    let secret = countersign_webhook::signature::Secret::parse(OLD_SECRET).unwrap();
    let body = r#"{"email":"test@example.com","username":"test_user"}"#;
    assert_eq!(
        secret.sign("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1649367553, body),
        "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut received = Received {
        webhook_id: "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk".into(),
        timestamp: now.to_string(),
        signature: format!(
            "v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= {}",
            secret.sign("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", now, body)
        ),
        at: std::time::Instant::now(),
        body: body.into(),
        answered: None,
    };
    assert!(verify(OLD_SECRET, &received));
    assert!(!verify(SECRET, &received));
    received.body.push(' ');
    assert!(!verify(OLD_SECRET, &received));
}

// ---------------------------------------------------------------------------------------
// The harness.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config_toml(
    server_url: &str,
    hook_url: &str,
    state_dir: &std::path::Path,
    port: u16,
    extra: &str,
) -> String {
    format!(
        "[server]\nurl = \"{server_url}\"\nheartbeat_timeout_secs = 5\nmax_backoff_secs = 1\n\
         [webhook]\nstate_dir = \"{}\"\nlisten = \"127.0.0.1:{port}\"\npublic_url = \"http://127.0.0.1:{port}\"\n\
         default_endpoints = [\"ops\"]\n{extra}\n\
         [[endpoints]]\nname = \"ops\"\nurl = \"{hook_url}\"\nsecret_env = \"{SECRET_ENV}\"\napprover = \"alice\"\n",
        state_dir.display()
    )
}

struct Harness {
    server: TestServer,
    receiver: Receiver,
    agent: Client,
    settings: Settings,
    worker: Option<JoinHandle<Result<(), WorkerError>>>,
    _state: tempfile::TempDir,
    /// The worker's configuration file (for the binary's commands).
    config: PathBuf,
    port: u16,
    http: reqwest::Client,
}

impl Harness {
    async fn start() -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start_with_toml(APPROVERS).await;
        let (receiver, hook_url) = Receiver::start().await;
        let state = tempfile::tempdir().unwrap();
        let port = free_port();
        let toml = config_toml(
            &server.url(),
            &hook_url,
            state.path(),
            port,
            "request_timeout_ms = 300\nretry_interval_ms = 30\nmax_retry_wait_ms = 200\n",
        );
        let file: FileConfig = toml::from_str(&toml).unwrap();
        // The same configuration for the binary's operator commands.
        let config = state.path().join("webhook.toml");
        std::fs::write(&config, &toml).unwrap();
        // Rotation: the new secret and the old one, both signing.
        let settings = Settings::from_file(file, |name| {
            (name == SECRET_ENV).then(|| format!("{SECRET} {OLD_SECRET}"))
        })
        .unwrap();
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        let mut harness = Harness {
            server,
            receiver,
            agent,
            settings,
            worker: None,
            _state: state,
            config,
            port,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        };
        harness.worker = Some(tokio::spawn(countersign_webhook::run(
            harness.settings.clone(),
            std::future::pending(),
        )));
        harness
    }

    async fn store(&self) -> Store {
        countersign_webhook::open_store(&self.settings)
            .await
            .unwrap()
    }

    async fn request(&self, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_with(request_message(key, ttl_seconds)).await
    }

    async fn request_with(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        self.agent
            .request_approval(request)
            .await
            .unwrap()
            .approval
            .unwrap()
    }

    async fn state_of(&self, approval_id: &str) -> pb::ApprovalState {
        self.agent.get_approval(approval_id).await.unwrap().state()
    }

    async fn get(&self, url: &str) -> (u16, String) {
        let response = self.http.get(url).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn post(&self, url: &str, form_token: &str) -> (u16, String) {
        self.post_form(url, &format!("form_token={form_token}"))
            .await
    }

    async fn post_form(&self, url: &str, form: &str) -> (u16, String) {
        let response = self
            .http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned())
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

/// The request the tests make: `key`, `ttl_seconds` (0: the default), routed to webhooks.
fn request_message(key: &str, ttl_seconds: u32) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "session-7".into(),
        requester: "dev@example.com".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"rm -rf build/ <script>alert(1)</script>"}"#.into(),
        action: "delete <b>the build</b> directory".into(),
        reason: "clean rebuild\nRisk: LOW".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: "webhook".into(),
            target: String::new(),
        }],
        ttl_seconds,
        ..Default::default()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

fn requested_id(approval: &pb::Approval) -> String {
    format!("msg_{}_requested", approval.id)
}

fn resolved_id(approval: &pb::Approval) -> String {
    format!("msg_{}_resolved", approval.id)
}

fn form_token(page: &str) -> String {
    let start = page.find("name=\"form_token\" value=\"").expect("a form") + 25;
    page[start..start + 64].to_owned()
}

// ---------------------------------------------------------------------------------------
// Delivery.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_through_5xx_and_timeouts_lose_nothing_and_every_signature_verifies() {
    let harness = Harness::start().await;
    harness.receiver.script(&[
        Answer::Status(503),
        Answer::Hang,
        Answer::Status(500),
        Answer::Status(429),
        Answer::Hang,
    ]);
    let approval = harness.request("call-1", 0).await;
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    assert_eq!(body["type"], "approval.requested");
    assert_eq!(body["data"]["approval_id"], approval.id.as_str());
    assert_eq!(body["data"]["action"], "delete <b>the build</b> directory");
    assert!(body["data"]["decision_links"]["approve"]
        .as_str()
        .unwrap()
        .starts_with(&format!("http://127.0.0.1:{}/decide/", harness.port)));

    harness
        .agent
        .cancel_approval(&approval.id, "not needed")
        .await
        .unwrap();
    let resolved = harness.receiver.accepted(&resolved_id(&approval)).await;
    assert_eq!(resolved["type"], "approval.resolved");
    assert_eq!(resolved["data"]["state"], "cancelled");

    let received = harness.receiver.received();
    let attempts: Vec<&Received> = received
        .iter()
        .filter(|r| r.webhook_id == requested_id(&approval))
        .collect();
    assert_eq!(
        attempts.len(),
        6,
        "five failures, then success: {received:#?}"
    );
    for attempt in &attempts {
        assert_eq!(
            attempt.body, attempts[0].body,
            "a retry sends the same body"
        );
    }
    for request in &received {
        assert!(verify(SECRET, request), "new secret: {request:?}");
        assert!(
            verify(OLD_SECRET, request),
            "old secret (rotation): {request:?}"
        );
    }
    let accepted: Vec<&str> = received
        .iter()
        .filter(|r| r.answered == Some(200))
        .map(|r| r.webhook_id.as_str())
        .collect();
    assert_eq!(
        accepted,
        vec![requested_id(&approval), resolved_id(&approval)]
    );
    assert!(harness
        .store()
        .await
        .dead_letters()
        .await
        .unwrap()
        .is_empty());
}

/// The requests of each webhook-id in `received`, in order.
fn by_webhook_id(received: &[Received]) -> std::collections::BTreeMap<&str, Vec<&Received>> {
    let mut by_id = std::collections::BTreeMap::<&str, Vec<&Received>>::new();
    for request in received {
        by_id.entry(&request.webhook_id).or_default().push(request);
    }
    by_id
}

/// A burst of deliveries each answered 500 three times, then 204: every retry comes after
/// its backoff (at least three quarters of `retry_interval_ms`, 30 ms here), none is sent
/// again after its 2xx, and every request carries the event's body. An attempt that ended
/// between the dispatcher's read of the queue and its in-flight check was dispatched again
/// from that stale read: too early, and, when it then failed, it put the delivered row
/// (body erased) back in the queue, to be POSTed with an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_retried_deliveries_is_sent_on_schedule_once_each_and_never_empty() {
    let harness = Harness::start().await;
    harness.receiver.script_each_id(&[
        Answer::Status(500),
        Answer::Status(500),
        Answer::Status(500),
        Answer::Status(204),
    ]);
    let approvals = futures::future::join_all(
        (0..40).map(|i| harness.request_with(request_message(&format!("burst-{i}"), 0))),
    )
    .await;
    let ids: Vec<String> = approvals.iter().map(requested_id).collect();
    harness
        .receiver
        .wait_for("every delivery accepted", |received| {
            ids.iter().all(|id| {
                received
                    .iter()
                    .any(|r| &r.webhook_id == id && r.answered == Some(204))
            })
        })
        .await;
    // Anything sent again after its 2xx would arrive within the retry cap (200 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let received = harness.receiver.received();
    for (id, requests) in by_webhook_id(&received) {
        let answers: Vec<Option<u16>> = requests.iter().map(|r| r.answered).collect();
        assert_eq!(
            answers,
            vec![Some(500), Some(500), Some(500), Some(204)],
            "{id}: three failures, one success, nothing after it"
        );
        for pair in requests.windows(2) {
            let gap = pair[1].at - pair[0].at;
            assert!(
                gap >= Duration::from_millis(22),
                "{id}: retried {gap:?} after a 500"
            );
        }
        for request in &requests {
            assert!(!request.body.is_empty(), "{id}: an empty body was sent");
            assert_eq!(request.body, requests[0].body, "{id}");
            assert!(verify(SECRET, request), "{id}");
        }
    }
}

/// A burst of deliveries each refused finally (410): each is POSTed once and is a dead
/// letter; none is sent again from a stale read of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_finally_refused_deliveries_is_sent_once_each() {
    let harness = Harness::start().await;
    harness.receiver.script_each_id(&[Answer::Status(410)]);
    let approvals = futures::future::join_all(
        (0..40).map(|i| harness.request_with(request_message(&format!("gone-{i}"), 0))),
    )
    .await;
    let store = harness.store().await;
    for _ in 0..500 {
        if store.dead_letters().await.unwrap().len() == approvals.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.dead_letters().await.unwrap().len(), approvals.len());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = harness.receiver.received();
    let by_id = by_webhook_id(&received);
    assert_eq!(by_id.len(), approvals.len());
    for (id, requests) in by_id {
        assert_eq!(requests.len(), 1, "{id} was POSTed again after its 410");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_4xx_is_a_dead_letter_that_can_be_sent_again() {
    let harness = Harness::start().await;
    harness.receiver.script(&[Answer::Status(404)]);
    let approval = harness.request("call-1", 0).await;
    let store = harness.store().await;
    let mut letters = Vec::new();
    for _ in 0..500 {
        letters = store.dead_letters().await.unwrap();
        if !letters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].webhook_id, requested_id(&approval));
    assert_eq!(letters[0].last_error.as_deref(), Some("HTTP 404 Not Found"));
    // Final: not tried again on its own.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(harness.receiver.received().len(), 1);

    let (ok, text) = run_command(&harness.config, &["dead-letters", "list"]).await;
    assert!(ok, "{text}");
    assert!(
        text.contains(&requested_id(&approval)) && text.contains("HTTP 404"),
        "{text}"
    );
    let number = letters[0].seq.to_string();
    let (ok, text) = run_command(&harness.config, &["dead-letters", "retry", &number]).await;
    assert!(ok && text.contains("queued again"), "{text}");
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    assert_eq!(body["data"]["approval_id"], approval.id.as_str());
    let received = harness.receiver.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].body, received[1].body);
    assert!(store.dead_letters().await.unwrap().is_empty());
    assert!(!store.retry_dead_letter(letters[0].seq).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_failing_beyond_the_retry_window_is_a_dead_letter() {
    let mut harness = Harness::start().await;
    if let Some(worker) = harness.worker.take() {
        worker.abort();
    }
    // Long enough for a retry (30 ms apart) on a loaded machine: at 150 ms a full test run on
    // two cores gave up after the first attempt.
    harness.settings.give_up_after = Duration::from_secs(1);
    harness.worker = Some(tokio::spawn(countersign_webhook::run(
        harness.settings.clone(),
        std::future::pending(),
    )));
    harness.receiver.script(&[Answer::Status(503); 50]);
    let approval = harness.request("call-1", 0).await;
    let store = harness.store().await;
    for _ in 0..500 {
        if !store.dead_letters().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let letters = store.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].webhook_id, requested_id(&approval));
    assert!(letters[0].attempts >= 2, "{letters:?}");
    assert_eq!(
        letters[0].last_error.as_deref(),
        Some("HTTP 503 Service Unavailable")
    );
}

// ---------------------------------------------------------------------------------------
// Decision links.

fn link(body: &Value, verdict: &str) -> String {
    body["data"]["decision_links"][verdict]
        .as_str()
        .expect("a decision link")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_link_decides_once_and_only_after_the_confirmation() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", 0).await;
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    assert_eq!(body["data"]["decision_links"]["approver"], "alice");
    let approve = link(&body, "approve");

    // Following the link (as a mail scanner would) shows a page and decides nothing.
    let (status, page) = harness.get(&approve).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("Approve this request as <strong>alice</strong>?"),
        "{page}"
    );
    assert!(
        page.contains("delete &lt;b&gt;the build&lt;/b&gt; directory"),
        "{page}"
    );
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>") && !page.contains("<b>"),
        "{page}"
    );
    assert!(page.contains("clean rebuild ⏎ Risk: LOW"), "{page}");
    let (status, _) = harness.get(&approve).await;
    assert_eq!(status, 200);
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Pending
    );

    // A POST without the page's form token (a cross-site form) decides nothing.
    let (status, page) = harness.post(&approve, "").await;
    assert_eq!(status, 403, "{page}");
    let (status, _) = harness.post(&approve, &"0".repeat(64)).await;
    assert_eq!(status, 403);
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Pending
    );

    let waiter = {
        let agent = harness.agent.clone();
        let id = approval.id.clone();
        tokio::spawn(async move { agent.wait_for_decision(&id, Duration::from_secs(20)).await })
    };
    let (_, page) = harness.get(&approve).await;
    let token = form_token(&page);
    let (status, page) = harness.post(&approve, &token).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Approved"), "{page}");
    let decided = waiter.await.unwrap().unwrap();
    assert_eq!(decided.state(), pb::ApprovalState::Approved);
    let deciders = &decided.resolution.unwrap().deciders;
    assert_eq!(deciders.len(), 1);
    assert_eq!(
        (deciders[0].channel.as_str(), deciders[0].user_id.as_str()),
        ("webhook", "alice")
    );

    // Used: the link, and its sibling, are refused with a clear page.
    let (status, page) = harness.post(&approve, &token).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("already used"), "{page}");
    let (status, page) = harness.get(&link(&body, "reject")).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("already used"), "{page}");
    let resolved = harness.receiver.accepted(&resolved_id(&approval)).await;
    assert_eq!(resolved["data"]["state"], "approved");
    assert_eq!(resolved["data"]["deciders"][0]["user_id"], "alice");
}

/// Edit-on-approve: a confirmation page names the version of the arguments it shows; after
/// an edit elsewhere, confirming it decides nothing (the link stays usable), and the page then
/// shows the edited arguments, which the decision approves. The resolution carries the edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_link_approves_the_version_its_page_showed() {
    let harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            required_approvals: 2,
            ..request_message("call-edit", 0)
        })
        .await;
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    let approve = link(&body, "approve");
    let (_, page) = harness.get(&approve).await;
    let token = form_token(&page);
    assert!(page.contains(&approval.args_digest), "{page}");

    let edited = r#"{"command":"rm -rf build/tmp"}"#;
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            decider: Some(pb::Decider {
                channel: "telegram".into(),
                user_id: "2002".into(),
                display_name: "Bob".into(),
            }),
            idempotency_key: "tg-edit".into(),
            edited_arguments_json: edited.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let stale = format!("form_token={token}&args_digest={}", approval.args_digest);
    let (status, page) = harness.post_form(&approve, &stale).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("Nothing was decided"), "{page}");
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Pending
    );

    let (status, page) = harness.get(&approve).await;
    assert_eq!(status, 200, "the link is still usable: {page}");
    assert!(page.contains("edited by Bob (telegram)"), "{page}");
    assert!(page.contains("rm -rf build/tmp"), "{page}");
    let current = harness.agent.get_approval(&approval.id).await.unwrap();
    let confirmed = format!(
        "form_token={}&args_digest={}",
        form_token(&page),
        current.edited_args_digest
    );
    let (status, page) = harness.post_form(&approve, &confirmed).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Approved"), "{page}");
    let resolved = harness.receiver.accepted(&resolved_id(&approval)).await;
    assert_eq!(resolved["data"]["state"], "approved");
    assert_eq!(
        resolved["data"]["edit"]["arguments"]["command"],
        "rm -rf build/tmp"
    );
    assert_eq!(resolved["data"]["edit"]["editor"]["user_id"], "2002");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_confirmation_does_not_decide_twice() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", 0).await;
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    let reject = link(&body, "reject");
    let (_, page) = harness.get(&reject).await;
    let token = form_token(&page);
    let (first, second) =
        tokio::join!(harness.post(&reject, &token), harness.post(&reject, &token));
    let mut statuses = [first.0, second.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{first:?} {second:?}");
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Rejected
    );
    let decided = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(decided.decisions.len(), 1, "one decision recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_revoked_and_unknown_links_are_refused_with_a_clear_page() {
    let harness = Harness::start().await;
    let short = harness.request("short", 1).await;
    let long = harness.request("long", 0).await;
    let short_body = harness.receiver.accepted(&requested_id(&short)).await;
    let long_body = harness.receiver.accepted(&requested_id(&long)).await;

    let revoked = harness
        .store()
        .await
        .links()
        .revoke(&long.id)
        .await
        .unwrap();
    assert_eq!(revoked, 2);
    let (status, page) = harness.get(&link(&long_body, "approve")).await;
    assert_eq!(status, 410, "{page}");
    assert!(page.contains("revoked"), "{page}");
    let (status, _) = harness
        .post(&link(&long_body, "approve"), &"0".repeat(64))
        .await;
    assert_eq!(status, 410);
    assert_eq!(harness.state_of(&long.id).await, pb::ApprovalState::Pending);

    for _ in 0..200 {
        if harness.state_of(&short.id).await == pb::ApprovalState::Expired {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, page) = harness.get(&link(&short_body, "approve")).await;
    assert_eq!(status, 410, "{page}");
    assert!(page.contains("expired"), "{page}");

    let unknown = format!(
        "http://127.0.0.1:{}/decide/{}",
        harness.port,
        "A".repeat(43)
    );
    let (status, page) = harness.get(&unknown).await;
    assert_eq!(status, 404, "{page}");
    assert!(page.contains("Unknown link"), "{page}");
}

// ---------------------------------------------------------------------------------------
// The binary.

const BINARY: &str = env!("CARGO_BIN_EXE_countersign-webhook");

/// A configuration file in `dir` for the binary, its state beside it, retrying fast.
fn binary_config(server: &TestServer, hook_url: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("webhook.toml");
    std::fs::write(
        &config,
        config_toml(
            &server.url(),
            hook_url,
            &dir.join("state"),
            free_port(),
            "retry_interval_ms = 50\n",
        ),
    )
    .unwrap();
    config
}

fn spawn_binary(config: &std::path::Path) -> tokio::process::Child {
    spawn_binary_with(config, None)
}

/// The binary with `worker_token` in COUNTERSIGN_WORKER_TOKEN; `None`: without any.
fn spawn_binary_with(
    config: &std::path::Path,
    worker_token: Option<&str>,
) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(BINARY);
    command
        .arg("--config")
        .arg(config)
        .env(SECRET_ENV, SECRET)
        .env_remove(countersign_webhook::config::WORKER_TOKEN_ENV);
    if let Some(token) = worker_token {
        command.env(countersign_webhook::config::WORKER_TOKEN_ENV, token);
    }
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn run_command(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let output = tokio::process::Command::new(BINARY)
        .arg("--config")
        .arg(config)
        .args(args)
        .env(SECRET_ENV, SECRET)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_binary_duplicates_nothing_beyond_at_least_once() {
    let server = TestServer::start_with_toml(APPROVERS).await;
    let (receiver, hook_url) = Receiver::start().await;
    let state = tempfile::tempdir().unwrap();
    let config = binary_config(&server, &hook_url, state.path());
    let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
    let request = |key: &'static str| {
        let agent = agent.clone();
        async move {
            agent
                .request_approval(pb::RequestApprovalRequest {
                    agent_id: "coder-1".into(),
                    requester: "dev@example.com".into(),
                    idempotency_key: key.into(),
                    tool_name: "bash".into(),
                    arguments_json: "{}".into(),
                    risk: pb::Risk::Low.into(),
                    routes: vec![pb::Route {
                        channel: "webhook".into(),
                        target: "ops".into(),
                    }],
                    ..Default::default()
                })
                .await
                .unwrap()
                .approval
                .unwrap()
        }
    };

    let mut worker = spawn_binary(&config);
    let first = request("first").await;
    receiver.accepted(&requested_id(&first)).await;

    // The receiver takes the second event but answers only after the worker is dead.
    receiver.script(&[Answer::SlowOk(Duration::from_secs(1))]);
    let second = request("second").await;
    receiver
        .wait_for("the second request", |r| {
            r.iter().any(|r| r.webhook_id == requested_id(&second))
        })
        .await;
    worker.kill().await.unwrap(); // SIGKILL
    let third = request("third").await; // while the worker is down
    agent.cancel_approval(&first.id, "done").await.unwrap();

    let mut worker = spawn_binary(&config);
    receiver.accepted(&resolved_id(&first)).await;
    receiver.accepted(&requested_id(&third)).await;
    receiver
        .wait_for("the second request again", |r| {
            r.iter()
                .filter(|r| r.webhook_id == requested_id(&second))
                .count()
                == 2
        })
        .await;
    receiver.accepted(&requested_id(&second)).await;
    // Settle: nothing else arrives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    worker.kill().await.unwrap();

    let received = receiver.received();
    let count = |id: &str| received.iter().filter(|r| r.webhook_id == id).count();
    assert_eq!(
        count(&requested_id(&first)),
        1,
        "delivered before the kill: never again"
    );
    assert_eq!(count(&resolved_id(&first)), 1);
    assert_eq!(count(&requested_id(&third)), 1);
    // In flight at the kill: sent again after the restart, same webhook-id and body (the
    // documented at-least-once; the receiver deduplicates by webhook-id).
    let seconds: Vec<&Received> = received
        .iter()
        .filter(|r| r.webhook_id == requested_id(&second))
        .collect();
    assert_eq!(seconds.len(), 2);
    assert_eq!(seconds[0].body, seconds[1].body);
    assert_eq!(received.len(), 5, "{received:#?}");
    for request in &received {
        assert!(verify(SECRET, request), "{request:?}");
    }

    // The operator commands work on the same state.
    let (ok, text) = run_command(&config, &["dead-letters", "list"]).await;
    assert!(ok && text.contains("no dead letters"), "{text}");
    let (ok, text) = run_command(&config, &["dead-letters", "retry", "42"]).await;
    assert!(!ok && text.contains("no dead letter number 42"), "{text}");
    let (ok, text) = run_command(&config, &["revoke-links", &third.id]).await;
    assert!(ok && text.contains("revoked 2 decision link(s)"), "{text}");
}

/// However many approvals were resolved while the worker was stopped, each gets its
/// resolution event after the restart: more of them than one page of recent resolutions, and
/// the oldest among them too.
#[tokio::test]
async fn every_approval_resolved_while_the_worker_was_down_gets_its_resolution() {
    const COUNT: usize = 60;
    let server = TestServer::start_with_toml(APPROVERS).await;
    let (receiver, hook_url) = Receiver::start().await;
    let state = tempfile::tempdir().unwrap();
    let config = binary_config(&server, &hook_url, state.path());
    let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
    let mut worker = spawn_binary(&config);
    let mut approvals = Vec::new();
    for n in 0..COUNT {
        let approval = agent
            .request_approval(request_message(&format!("away-{n}"), 600))
            .await
            .unwrap()
            .approval
            .unwrap();
        approvals.push(approval);
    }
    for approval in &approvals {
        receiver.accepted(&requested_id(approval)).await;
    }
    worker.kill().await.unwrap();
    for approval in &approvals {
        agent
            .cancel_approval(&approval.id, "not needed")
            .await
            .unwrap();
    }

    let mut worker = spawn_binary(&config);
    for approval in &approvals {
        receiver.accepted(&resolved_id(approval)).await;
    }
    worker.kill().await.unwrap();
}

/// The worker token is needed when the server has `[[tokens]]` (docs/webhooks.md): the binary
/// delivers with none from a server without tokens, and with its worker token from a server
/// that has tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_needs_its_worker_token_only_when_the_server_has_tokens() {
    const WORKER_TOKEN: &str = "webhook-worker-token-0123456789";
    const AGENT_TOKEN: &str = "agent-token-for-webhook-tests-0123";
    let hash = |token: &str| format!("{:x}", <Sha256 as sha2::Digest>::digest(token));
    let tokens = format!(
        "\n[[tokens]]\nname = \"webhook-worker\"\nrole = \"worker\"\nchannels = [\"webhook\"]\nsha256 = \"{}\"\n\
         \n[[tokens]]\nname = \"agent\"\nrole = \"agent\"\nagents = [\"*\"]\nsha256 = \"{}\"\n",
        hash(WORKER_TOKEN),
        hash(AGENT_TOKEN)
    );
    for with_tokens in [false, true] {
        let server_toml = if with_tokens {
            format!("{APPROVERS}{tokens}")
        } else {
            APPROVERS.to_string()
        };
        let server = TestServer::start_with_toml(&server_toml).await;
        let (receiver, hook_url) = Receiver::start().await;
        let state = tempfile::tempdir().unwrap();
        let config = binary_config(&server, &hook_url, state.path());
        let mut worker = spawn_binary_with(&config, with_tokens.then_some(WORKER_TOKEN));
        let agent = Client::connect(ClientConfig {
            token: with_tokens.then(|| AGENT_TOKEN.to_string()),
            ..ClientConfig::new(server.url())
        })
        .unwrap();
        let approval = agent
            .request_approval(request_message("token", 0))
            .await
            .unwrap()
            .approval
            .unwrap();
        receiver.accepted(&requested_id(&approval)).await;
        worker.kill().await.unwrap();
    }
}

#[test]
fn the_binary_has_help_and_names_a_bad_config() {
    let output = std::process::Command::new(BINARY)
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "--config",
        "dead-letters",
        "revoke-links",
        "COUNTERSIGN_WORKER_TOKEN",
        "needed when the countersign server has [[tokens]]",
        "secret_env",
    ] {
        assert!(help.contains(expected), "{expected}: {help}");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("webhook.toml");
    std::fs::write(
        &config,
        "[server]\nurl = \"http://127.0.0.1:1\"\n[[endpoints]]\nname = \"ops\"\nurl = \"ftp://x\"\nsecret_env = \"X\"\n",
    )
    .unwrap();
    let output = std::process::Command::new(BINARY)
        .args(["--config", config.to_str().unwrap(), "dead-letters", "list"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = String::from_utf8(output.stderr).unwrap();
    assert!(
        error.contains("endpoint ops: url must start with http:// or https://"),
        "{error}"
    );
}

/// The Python receiver of docs/webhooks.md, run as written against the real worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_python_receiver_verifies_the_worker_s_signatures() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/webhooks.md"
    ))
    .unwrap();
    let start = docs.find("```python\n").expect("a Python block") + 10;
    let script = &docs[start..start + docs[start..].find("```").unwrap()];
    let port = free_port();
    let mut python = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("WEBHOOK_SECRET", OLD_SECRET)
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    let hook_url = format!("http://127.0.0.1:{port}/");
    let http = reqwest::Client::new();
    // A forged request is refused.
    let mut status = 0;
    for _ in 0..250 {
        if let Ok(response) = http
            .post(&hook_url)
            .header("webhook-id", "msg_forged")
            .header("webhook-timestamp", "1649367553")
            .header(
                "webhook-signature",
                "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
            )
            .body("{}")
            .send()
            .await
        {
            status = response.status().as_u16();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 401);

    let server = TestServer::start_with_toml(APPROVERS).await;
    let state = tempfile::tempdir().unwrap();
    let toml = config_toml(&server.url(), &hook_url, state.path(), free_port(), "");
    let settings = Settings::from_file(toml::from_str(&toml).unwrap(), |_| {
        Some(format!("{SECRET} {OLD_SECRET}"))
    })
    .unwrap();
    let worker = tokio::spawn(countersign_webhook::run(settings, std::future::pending()));
    let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
    let approval = agent
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "coder-1".into(),
            idempotency_key: "call-1".into(),
            tool_name: "bash".into(),
            arguments_json: "{}".into(),
            risk: pb::Risk::Low.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .approval
        .unwrap();
    let stdout = python.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the receiver printed the event")
        .unwrap()
        .unwrap();
    assert_eq!(line, format!("approval.requested {}", approval.id));
    worker.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_s_resolution_waits_behind_its_request_being_retried() {
    let harness = Harness::start().await;
    harness.receiver.script(&[Answer::Status(503); 4]);
    let approval = harness.request("call-1", 0).await;
    harness
        .receiver
        .wait_for("a first attempt", |r| !r.is_empty())
        .await;
    harness
        .agent
        .cancel_approval(&approval.id, "changed my mind")
        .await
        .unwrap();
    harness.receiver.accepted(&resolved_id(&approval)).await;
    let order: Vec<(String, Option<u16>)> = harness
        .receiver
        .received()
        .into_iter()
        .map(|r| (r.webhook_id, r.answered))
        .collect();
    let first_resolved = order
        .iter()
        .position(|(id, _)| *id == resolved_id(&approval))
        .unwrap();
    let requested_ok = order
        .iter()
        .position(|(id, answered)| *id == requested_id(&approval) && *answered == Some(200))
        .expect("the request was delivered");
    assert!(requested_ok < first_resolved, "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_never_comes_before_the_endpoint_s_retry_after() {
    let harness = Harness::start().await;
    harness.receiver.script(&[Answer::RetryAfter(1)]);
    let approval = harness.request("call-1", 0).await;
    harness.receiver.accepted(&requested_id(&approval)).await;
    let received = harness.receiver.received();
    assert_eq!(received.len(), 2);
    // The backoff alone would retry after 30 ms.
    assert!(received[1].at - received[0].at >= Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_the_server_refuses_is_shown_as_refused_and_decides_nothing() {
    let harness = Harness::start().await;
    // Alice asks herself: the server refuses her approval (separation of duties).
    let approval = harness
        .agent
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "coder-1".into(),
            requester: "alice".into(),
            idempotency_key: "own".into(),
            tool_name: "bash".into(),
            arguments_json: "{}".into(),
            risk: pb::Risk::Low.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .approval
        .unwrap();
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    let approve = link(&body, "approve");
    let (_, page) = harness.get(&approve).await;
    let (status, page) = harness.post(&approve, &form_token(&page)).await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("Not allowed"), "{page}");
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Pending
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_used_while_the_server_is_down_still_works_afterwards() {
    let mut harness = Harness::start().await;
    let approval = harness.request("call-1", 0).await;
    let body = harness.receiver.accepted(&requested_id(&approval)).await;
    let approve = link(&body, "approve");
    let (_, page) = harness.get(&approve).await;
    let token = form_token(&page);

    harness.server.stop().await;
    let (status, page) = harness.post(&approve, &token).await;
    assert_eq!(status, 503, "{page}");
    assert!(page.contains("the link still works"), "{page}");

    harness.server.restart().await;
    let mut outcome = (0, String::new());
    for _ in 0..100 {
        outcome = harness.post(&approve, &token).await;
        if outcome.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(outcome.0, 200, "{}", outcome.1);
    assert_eq!(
        harness.state_of(&approval.id).await,
        pb::ApprovalState::Approved
    );
}
