//! End to end: a real countersign server (in process, loopback gRPC), the fake SMTP relay
//! (STARTTLS with a test CA, AUTH PLAIN), the worker through its library entry point (and as
//! the binary, killed with SIGKILL), the client SDK as the agent, and the mails' links opened
//! as a browser (or a mail scanner) does.

use std::path::{Path, PathBuf};

use countersign_client::{pb, Client, ClientConfig};
use countersign_email::config::{FileConfig, SMTP_PASSWORD_ENV};
use countersign_email::Settings;
use countersign_testkit::ntfy::tap;
use countersign_testkit::server::TestServer;
use countersign_testkit::smtp::{FakeSmtp, SmtpFailure, SmtpMessage, Stage};
use countersign_worker::config::WorkerSettings;
use serde_json::json;

const ALICE: &str = "alice@example.com";
const SMTP_USER: &str = "approvals";
const SMTP_PASSWORD: &str = "smtp-password-0123";
const APPROVERS: &str = "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { email = [\"Alice@Example.com\"] }\n\n[[approvers]]\nid = \"bob\"\nname = \"Bob\"\nmax_risk = \"critical\"\nidentities = { telegram = [\"2002\"] }\n";

fn config_toml(server_url: &str, smtp: &FakeSmtp, state: &Path, ca_file: &Path) -> String {
    let port = countersign_testkit::http::free_addr().port();
    format!(
        "[server]\nurl = \"{server_url}\"\nmax_backoff_secs = 1\n\
         [email]\nsmtp_host = \"{}\"\nsmtp_port = {}\ntls = \"starttls\"\nca_file = \"{}\"\n\
         username = \"{SMTP_USER}\"\nfrom = \"countersign <approvals@example.com>\"\n\
         default_recipient = \"{ALICE}\"\nlisten = \"127.0.0.1:{port}\"\n\
         public_url = \"http://127.0.0.1:{port}\"\nstate_dir = \"{}\"\nrequest_timeout_ms = 5000\n\
         retry_interval_ms = 50\nmax_retry_wait_ms = 500\n\
         [[recipients]]\naddress = \"{ALICE}\"\n",
        smtp.host(),
        smtp.port(),
        ca_file.display(),
        state.display()
    )
}

struct Harness {
    _server: TestServer,
    smtp: FakeSmtp,
    agent: Client,
    settings: Settings,
    config: PathBuf,
    worker: Option<tokio::task::JoinHandle<Result<(), countersign_email::WorkerError>>>,
    _state: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

impl Harness {
    async fn without_worker() -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start_with_toml(APPROVERS).await;
        let smtp = FakeSmtp::start_with(Some((SMTP_USER, SMTP_PASSWORD)), true).await;
        let state = tempfile::tempdir().unwrap();
        let ca_file = state.path().join("ca.pem");
        std::fs::write(&ca_file, smtp.ca_pem().unwrap()).unwrap();
        let toml = config_toml(&server.url(), &smtp, &state.path().join("state"), &ca_file);
        let config = state.path().join("email.toml");
        std::fs::write(&config, &toml).unwrap();
        let file: FileConfig = toml::from_str(&toml).unwrap();
        let settings = Settings::from_file(file, |name| {
            (name == SMTP_PASSWORD_ENV).then(|| SMTP_PASSWORD.to_owned())
        })
        .unwrap();
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        Harness {
            _server: server,
            smtp,
            agent,
            settings,
            config,
            worker: None,
            _state: state,
        }
    }

    async fn start() -> Harness {
        let mut harness = Harness::without_worker().await;
        harness.worker = Some(tokio::spawn(countersign_email::run(
            harness.settings.clone(),
            std::future::pending(),
        )));
        harness
    }

    async fn request(&self, key: &str, ttl_seconds: u32) -> pb::Approval {
        self.request_with(pb::RequestApprovalRequest {
            idempotency_key: key.into(),
            ttl_seconds,
            ..request_message()
        })
        .await
    }

    async fn request_with(&self, request: pb::RequestApprovalRequest) -> pb::Approval {
        self.agent
            .request_approval(request)
            .await
            .unwrap()
            .approval
            .unwrap()
    }

    /// The mails of the approval's thread, once `count` arrived.
    async fn thread(&self, approval_id: &str, count: usize) -> Vec<SmtpMessage> {
        let root = root_id(approval_id);
        self.smtp
            .wait_for(&format!("{count} mails of {approval_id}"), |smtp| {
                let thread: Vec<SmtpMessage> = smtp
                    .messages()
                    .into_iter()
                    .filter(|m| {
                        m.header("Message-ID").as_deref() == Some(root.as_str())
                            || m.header("References").as_deref() == Some(root.as_str())
                    })
                    .collect();
                (thread.len() >= count).then_some(thread)
            })
            .await
    }

    async fn request_mail(&self, approval_id: &str) -> SmtpMessage {
        self.thread(approval_id, 1).await.remove(0)
    }

    async fn state_of(&self, approval_id: &str) -> pb::Approval {
        self.agent.get_approval(approval_id).await.unwrap()
    }
}

fn request_message() -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: "coder-1".into(),
        session_id: "session-7".into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"echo '<script>alert(1)</script>'"}"#.into(),
        action: "<b>delete</b> the build directory\nBcc: eve@example.com\nRisk: LOW".into(),
        reason: "clean rebuild".into(),
        risk: pb::Risk::High.into(),
        routes: vec![pb::Route {
            channel: "email".into(),
            target: String::new(),
        }],
        ..Default::default()
    }
}

fn root_id(approval_id: &str) -> String {
    format!("<countersign.{approval_id}@example.com>")
}

/// The link labelled `label` in a request mail's plain text part.
fn link(mail: &SmtpMessage, label: &str) -> String {
    let plain = mail.part("text/plain").expect("a plain text part");
    let prefix = format!("{label}: ");
    plain
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {label} link in {plain}"))
        .to_owned()
}

/// A browser's (or a mail scanner's) GET of a link.
async fn open(url: &str) -> (u16, String) {
    tap(&json!({"method": "GET", "url": url})).await
}

/// A browser's POST of a page's form.
async fn submit(url: &str, form: &str) -> (u16, String) {
    tap(&json!({
        "method": "POST",
        "url": url,
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        "body": form,
    }))
    .await
}

fn hidden_field(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page.find(&marker).expect("the field") + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

/// Opens the link's page and submits its form (with `extra` fields).
async fn confirm(url: &str, extra: &str) -> (u16, String) {
    let (status, page) = open(url).await;
    assert_eq!(status, 200, "{page}");
    let form = format!(
        "form_token={}&args_digest={}{extra}",
        hidden_field(&page, "form_token"),
        hidden_field(&page, "args_digest")
    );
    submit(url, &form).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_is_one_multipart_mail_with_agent_text_escaped() {
    let harness = Harness::start().await;
    let approval = harness.request("sent", 600).await;
    let mail = harness.request_mail(&approval.id).await;
    assert_eq!(mail.rcpt_to, vec![ALICE.to_owned()]);
    assert_eq!(mail.mail_from, "approvals@example.com");
    assert!(mail.tls, "sent after STARTTLS");
    assert_eq!(mail.authenticated_as.as_deref(), Some(SMTP_USER));
    assert_eq!(
        mail.header("Message-ID").as_deref(),
        Some(root_id(&approval.id).as_str())
    );
    assert!(mail.header("In-Reply-To").is_none());
    // Agent text cannot add a header (the subject's agent text, the tool name, is a plain
    // name the server checks; the rest is in the base64 parts).
    assert!(mail.header("Bcc").is_none(), "{}", mail.data);
    let subject = mail.header("Subject").unwrap();
    assert!(
        subject.starts_with("⚠️ Approve bash? (high risk, …"),
        "{subject}"
    );
    assert!(mail
        .header("Content-Type")
        .unwrap()
        .starts_with("multipart/alternative"));
    let plain = mail.part("text/plain").unwrap();
    assert!(
        plain.contains(
            "│ Action: <b>delete</b> the build directory ⏎ Bcc: eve@example.com ⏎ Risk: LOW"
        ),
        "{plain}"
    );
    let html = mail.part("text/html").unwrap();
    assert!(
        !html.contains("<script>") && !html.contains("<b>delete"),
        "{html}"
    );
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(html.contains("&lt;b&gt;delete&lt;/b&gt;"), "{html}");
    for label in ["Approve", "Reject…", "Allow for session"] {
        let url = link(&mail, label);
        assert!(html.contains(&format!("href=\"{url}\"")), "{html}");
    }
    let deliveries = loop {
        let deliveries = harness.state_of(&approval.id).await.deliveries;
        if !deliveries.is_empty() {
            break deliveries;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    };
    assert_eq!(deliveries[0].channel, "email");
    assert_eq!(deliveries[0].target, ALICE);
    assert_eq!(deliveries[0].message_ref, root_id(&approval.id));
    assert_eq!(harness.smtp.messages().len(), 1);
}

/// A GET (what a mail scanner does with every link) only shows the page; the page's POST
/// decides, once, as the recipient's email identity; the outcome follows in the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_never_decides_and_the_page_approves_once() {
    let harness = Harness::start().await;
    let approval = harness.request("approve", 600).await;
    let mail = harness.request_mail(&approval.id).await;
    let approve = link(&mail, "Approve");
    for _ in 0..3 {
        let (status, page) = open(&approve).await;
        assert_eq!(status, 200, "{page}");
    }
    let (status, _) = open(&link(&mail, "Reject…")).await;
    assert_eq!(status, 200);
    let pending = harness.state_of(&approval.id).await;
    assert_eq!(pending.state(), pb::ApprovalState::Pending);
    assert!(pending.decisions.is_empty());

    let (status, page) = open(&approve).await;
    assert_eq!(status, 200);
    let form = format!(
        "form_token={}&args_digest={}",
        hidden_field(&page, "form_token"),
        hidden_field(&page, "args_digest")
    );
    let (status, answer) = submit(&approve, &form).await;
    assert_eq!(status, 200, "{answer}");
    let decided = harness.state_of(&approval.id).await;
    assert_eq!(decided.state(), pb::ApprovalState::Approved);
    let decider = decided.decisions[0].decider.clone().unwrap();
    assert_eq!(
        (decider.channel.as_str(), decider.user_id.as_str()),
        ("email", ALICE)
    );
    // The same form again, and a sibling link: used.
    assert_eq!(submit(&approve, &form).await.0, 409);
    assert_eq!(open(&link(&mail, "Allow for session")).await.0, 409);
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);

    let thread = harness.thread(&approval.id, 2).await;
    let outcome = &thread[1];
    let root = root_id(&approval.id);
    assert_eq!(
        outcome.header("In-Reply-To").as_deref(),
        Some(root.as_str())
    );
    assert_eq!(outcome.header("References").as_deref(), Some(root.as_str()));
    assert_ne!(outcome.header("Message-ID").as_deref(), Some(root.as_str()));
    assert!(outcome
        .header("Subject")
        .unwrap()
        .starts_with("Re: ⚠️ Approve bash"));
    let plain = outcome.part("text/plain").unwrap();
    assert!(plain.starts_with("✅ Approved: bash"), "{plain}");
    assert!(plain.contains("By alice@example.com (email)"), "{plain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_asks_for_a_reason_on_its_page() {
    let harness = Harness::start().await;
    let approval = harness.request("reject", 600).await;
    let mail = harness.request_mail(&approval.id).await;
    let reject = link(&mail, "Reject…");
    let (status, page) = open(&reject).await;
    assert_eq!(status, 200);
    assert!(page.contains("<textarea name=\"reason\""), "{page}");
    let (status, answer) = confirm(&reject, "&reason=not+%3Cnow%3E").await;
    assert_eq!(status, 200, "{answer}");
    let rejected = harness.state_of(&approval.id).await;
    assert_eq!(rejected.state(), pb::ApprovalState::Rejected);
    assert_eq!(rejected.decisions[0].reason, "not <now>");
    let thread = harness.thread(&approval.id, 2).await;
    let html = thread[1].part("text/html").unwrap();
    assert!(html.contains("“not &lt;now&gt;”"), "{html}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tampered_and_replayed_links_are_refused() {
    let harness = Harness::start().await;
    let approval = harness.request("forged", 600).await;
    let mail = harness.request_mail(&approval.id).await;
    let approve = link(&mail, "Approve");
    let (base, token) = approve.rsplit_once('/').unwrap();
    assert_eq!(open(&format!("{base}/{}", "A".repeat(43))).await.0, 404);
    let flipped = if token.starts_with('A') { "B" } else { "A" };
    let altered = format!("{base}/{flipped}{}", &token[1..]);
    assert_eq!(open(&altered).await.0, 404);
    let digest = approval.args_digest.clone();
    let forged_form = format!("form_token={}&args_digest={digest}", "00".repeat(32));
    assert_eq!(submit(&altered, &forged_form).await.0, 404);
    assert_eq!(submit(&approve, &forged_form).await.0, 403);
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
    let (status, page) = open(&approve).await;
    assert_eq!(status, 200);
    let form = format!(
        "form_token={}&args_digest={digest}",
        hidden_field(&page, "form_token")
    );
    assert_eq!(submit(&approve, &form).await.0, 200);
    // Replayed: the same request again decides nothing.
    assert_eq!(submit(&approve, &form).await.0, 409);
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Approved);
    assert_eq!(after.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_is_mailed_expired_and_its_links_are_refused() {
    let harness = Harness::start().await;
    let approval = harness.request("expires", 1).await;
    let thread = harness.thread(&approval.id, 2).await;
    let plain = thread[1].part("text/plain").unwrap();
    assert!(plain.starts_with("⌛ Expired: bash"), "{plain}");
    assert_eq!(thread[1].header("In-Reply-To"), Some(root_id(&approval.id)));
    let (status, page) = open(&link(&thread[0], "Approve")).await;
    assert_eq!(status, 410, "{page}");
    assert!(harness.state_of(&approval.id).await.decisions.is_empty());
}

/// A quorum of two: the first approval (elsewhere) is mailed as progress in the thread, the
/// second decides, and the email links then decide nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_a_decision_elsewhere_follow_in_the_thread() {
    let harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            idempotency_key: "quorum".into(),
            ttl_seconds: 600,
            required_approvals: 2,
            ..request_message()
        })
        .await;
    let mail = harness.request_mail(&approval.id).await;
    assert!(mail
        .part("text/plain")
        .unwrap()
        .contains("Waiting: 0 of 2 approvals"));
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Once.into(),
            decider: Some(pb::Decider {
                channel: "telegram".into(),
                user_id: "2002".into(),
                display_name: "Bob".into(),
            }),
            idempotency_key: "telegram:callback:1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let thread = harness.thread(&approval.id, 2).await;
    let progress = thread[1].part("text/plain").unwrap();
    assert!(
        progress.contains("Waiting: 1 of 2 approvals (by Bob)"),
        "{progress}"
    );
    assert_eq!(thread[1].header("References"), Some(root_id(&approval.id)));
    let reject = link(&mail, "Reject…");
    let (status, answer) = confirm(&reject, "&reason=no").await;
    assert_eq!(status, 200, "{answer}");
    let thread = harness.thread(&approval.id, 3).await;
    let outcome = thread[2].part("text/plain").unwrap();
    assert!(outcome.starts_with("❌ Rejected: bash"), "{outcome}");
    assert_eq!(open(&link(&mail, "Approve")).await.0, 409);
}

/// The relay answers 451 (try again later) twice, then takes the mail: it is retried and
/// arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_then_accepting_gets_the_mail_once() {
    let harness = Harness::start().await;
    for stage in [Stage::Rcpt, Stage::Data] {
        harness.smtp.fail_next(SmtpFailure {
            stage,
            code: 451,
            text: "4.3.0 try again later".into(),
        });
    }
    let approval = harness.request("refused", 600).await;
    let mail = harness.request_mail(&approval.id).await;
    assert_eq!(harness.smtp.refused(), 2);
    assert_eq!(harness.smtp.messages().len(), 1);
    // The links of the mail that arrived decide.
    let (status, answer) = confirm(&link(&mail, "Approve"), "").await;
    assert_eq!(status, 200, "{answer}");
    harness.thread(&approval.id, 2).await;
    assert_eq!(harness.smtp.messages().len(), 2);
}

fn spawn_worker(config: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-email"))
        .arg("--config")
        .arg(config)
        .env(SMTP_PASSWORD_ENV, SMTP_PASSWORD)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The binary is killed with SIGKILL after it wrote its intent and while the relay holds its
/// DATA command (the mail not yet handed over). The restarted worker sends it: one mail,
/// whose links decide, recorded as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_intent_and_send_mails_once() {
    let harness = Harness::without_worker().await;
    harness.smtp.hold_data(true);
    let mut worker = spawn_worker(&harness.config);
    let approval = harness.request("crash", 600).await;
    harness
        .smtp
        .wait_for("a DATA command held", |smtp| {
            (smtp.held() > 0).then_some(())
        })
        .await;
    worker.kill().await.unwrap(); // SIGKILL, the mail not handed over
    harness.smtp.hold_data(false);
    assert!(harness.smtp.messages().is_empty());

    let mut worker = spawn_worker(&harness.config);
    let mail = harness.request_mail(&approval.id).await;
    let (status, answer) = confirm(&link(&mail, "Approve"), "").await;
    assert_eq!(status, 200, "{answer}");
    harness.thread(&approval.id, 2).await;
    let requests = harness
        .smtp
        .messages()
        .iter()
        .filter(|m| m.header("Message-ID") == Some(root_id(&approval.id)))
        .count();
    assert_eq!(requests, 1, "mailed once");
    assert_eq!(harness.state_of(&approval.id).await.deliveries.len(), 1);
    worker.kill().await.unwrap();
}

/// The picture in docs/quickstart.md (docs/quickstart-email.png): the request mail's HTML part
/// as the fake relay received it, drawn by headless Chromium at a phone's width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picture_of_the_request_mail_on_a_phone() {
    let harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            idempotency_key: "picture".into(),
            ttl_seconds: 540,
            tool_name: "Bash".into(),
            arguments_json: r#"{"command":"rm -rf build/ && cargo build --release"}"#.into(),
            action: "Delete the build directory and rebuild".into(),
            reason: "the incremental build is corrupted".into(),
            ..request_message()
        })
        .await;
    let mail = harness.request_mail(&approval.id).await;
    let page = countersign_testkit::phone::mail_html(
        &mail.header("Subject").unwrap(),
        &mail.header("From").unwrap(),
        &mail.header("To").unwrap(),
        &mail.part("text/html").unwrap(),
    );
    let picture = countersign_testkit::phone::screenshot_page(
        &page,
        (412, 680),
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("phone-screenshots"),
        "email-request",
    )
    .await
    .unwrap();
    eprintln!("the phone shows {}", picture.display());
}
