//! `countersign setup email` through the real binary against the fake SMTP relay (STARTTLS
//! with a test CA, AUTH PLAIN): the test mail, its link confirmed on the page the command
//! serves (a GET only shows it), what is written then, and nothing written on a refusal.

use crate::support;

use countersign_testkit::smtp::FakeSmtp;
use tokio::process::{Child, Command};

use support::home::{hook_answer, installed_hook, interrupt, spawn_hook, text, Home};
use support::STEP;

const USER: &str = "approvals";
const PASSWORD: &str = "smtp-password-0123";

fn setup_email(home: &Home, smtp: &FakeSmtp, password: &str, to: &str, extra: &[&str]) -> Command {
    let ca_file = home.path().join("relay-ca.pem");
    std::fs::write(&ca_file, smtp.ca_pem().unwrap()).unwrap();
    let port = smtp.port().to_string();
    let listen = countersign_testkit::http::free_addr().to_string();
    let mut args = vec![
        "setup",
        "email",
        "--smtp-host",
        "127.0.0.1",
        "--smtp-port",
        &port,
        "--username",
        USER,
        "--from",
        "countersign <approvals@example.com>",
        "--to",
        to,
        "--listen",
        &listen,
    ];
    let ca = ca_file.display().to_string();
    args.extend(["--ca-file", &ca]);
    args.extend_from_slice(extra);
    let mut command = home.countersign(&args);
    command.env("COUNTERSIGN_SMTP_PASSWORD", password);
    command
}

async fn finished(child: Child) -> std::process::Output {
    tokio::time::timeout(STEP, child.wait_with_output())
        .await
        .expect("setup email did not exit")
        .unwrap()
}

/// The confirmation link in the test mail's plain text part.
async fn confirmation_link(smtp: &FakeSmtp) -> String {
    let mail = smtp
        .wait_for("the test mail", |smtp| smtp.messages().into_iter().next())
        .await;
    assert_eq!(mail.rcpt_to, vec!["alice@example.com".to_owned()]);
    assert!(mail.tls && mail.authenticated_as.as_deref() == Some(USER));
    let plain = mail.part("text/plain").unwrap();
    plain
        .lines()
        .find_map(|line| line.strip_prefix("Confirm it: "))
        .unwrap_or_else(|| panic!("no link in {plain}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_email_writes_only_once_the_test_mail_s_link_is_confirmed() {
    let smtp = FakeSmtp::start_with(Some((USER, PASSWORD)), true).await;
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let before = "# mine\nlisten = \"127.0.0.1:50999\"\n";
    std::fs::write(home.config_file(), before).unwrap();
    let child = setup_email(
        &home,
        &smtp,
        PASSWORD,
        "Alice@Example.com",
        &["--wait", "2m"],
    )
    .spawn()
    .unwrap();
    let link = confirmation_link(&smtp).await;
    let http = reqwest::Client::new();
    let page = http.get(&link).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains("<form method=\"post\">"));
    // A GET (a mail scanner) confirms nothing.
    assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
    let forged = link.rsplit_once('/').unwrap().0.to_owned() + "/forged";
    assert_eq!(http.post(&forged).send().await.unwrap().status(), 404);
    assert_eq!(http.post(&link).send().await.unwrap().status(), 200);

    let output = finished(child).await;
    let shown = text(&output);
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("Email is set up: approval requests go to alice@example.com"),
        "{shown}"
    );
    assert!(!shown.contains(PASSWORD), "{shown}");
    let config = std::fs::read_to_string(home.config_file()).unwrap();
    assert!(config.starts_with(before), "{config}");
    assert!(!config.contains(PASSWORD), "{config}");
    let parsed: toml::Table = toml::from_str(&config).unwrap();
    let email = &parsed["email"];
    assert_eq!(email["smtp_host"].as_str(), Some("127.0.0.1"));
    assert_eq!(
        email["default_recipient"].as_str(),
        Some("alice@example.com")
    );
    assert_eq!(
        email["recipients"][0]["address"].as_str(),
        Some("alice@example.com")
    );
    let approver = &parsed["approvers"].as_array().unwrap()[0];
    assert_eq!(
        approver["identities"]["email"][0].as_str(),
        Some("alice@example.com")
    );
    assert_eq!(home.secret("smtp-password"), PASSWORD);

    let doctor = text(&home.run(&["doctor"]).await);
    assert!(
        doctor.contains("ok    email: approvals go to alice@example.com through 127.0.0.1"),
        "{doctor}"
    );

    // `up` runs the email worker with what was written (the password from its file): a
    // hook's request is mailed, and the mail's link, confirmed on its page, lets the call run.
    let mut up = home.up().await;
    let log = home.up_log();
    assert!(
        log.contains("the email worker mails approvals to your recipients"),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
    let installed = home.run(&["install", "claude-code"]).await;
    assert!(installed.status.success(), "{}", text(&installed));
    let hook = spawn_hook(&home, &installed_hook(&home), "toolu_email_1", "git push");
    let mail = smtp
        .wait_for("the request's mail", |smtp| {
            smtp.messages().into_iter().nth(1)
        })
        .await;
    let plain = mail.part("text/plain").unwrap();
    assert!(plain.contains("git push"), "{plain}");
    let approve = plain
        .lines()
        .find_map(|line| line.strip_prefix("Approve: "))
        .unwrap_or_else(|| panic!("no link in {plain}"))
        .to_owned();
    let page = http
        .get(&approve)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let field = |name: &str| {
        let marker = format!("name=\"{name}\" value=\"");
        let start = page.find(&marker).expect("the field") + marker.len();
        page[start..].split('"').next().unwrap().to_owned()
    };
    let form = [
        ("form_token", field("form_token")),
        ("args_digest", field("args_digest")),
    ];
    let decided = http.post(&approve).form(&form).send().await.unwrap();
    assert_eq!(decided.status(), 200);
    let answer = hook_answer(hook).await;
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "allow",
        "{answer}"
    );
    interrupt(&home, &mut up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_email_refuses_what_does_not_check_out_and_changes_nothing() {
    let smtp = FakeSmtp::start_with(Some((USER, PASSWORD)), true).await;
    let home = Home::new("http://127.0.0.1:9");
    std::fs::create_dir_all(home.config_file().parent().unwrap()).unwrap();
    let before = "# mine\nlisten = \"127.0.0.1:50999\"\n";
    std::fs::write(home.config_file(), before).unwrap();
    let alice = "alice@example.com";
    let cases: [(&str, &str, &[&str], &str); 4] = [
        ("wrong-password", alice, &[], "could not be sent"),
        (PASSWORD, alice, &["--wait", "1s"], "not confirmed"),
        (PASSWORD, alice, &["--public-url", "ftp://x"], "public_url"),
        (PASSWORD, "not an address", &[], "not an email address"),
    ];
    for (password, to, extra, expected) in cases {
        let child = setup_email(&home, &smtp, password, to, extra)
            .spawn()
            .unwrap();
        let output = finished(child).await;
        let shown = text(&output);
        assert_ne!(output.status.code(), Some(0), "{expected}: {shown}");
        assert!(shown.contains(expected), "{expected:?} missing: {shown}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert_eq!(std::fs::read_to_string(home.config_file()).unwrap(), before);
        assert!(!home.data().join("secrets/smtp-password").exists());
    }
}
