//! An approval asked through OpenID CIBA (`/bc-authorize` on the server's `[http]` listener)
//! is an ordinary approval on Telegram: its binding message is on the request message, and
//! once Alice approves there, the client's token carries the call she approved.

use serde_json::{json, Value};

use crate::common::*;

const CLIENT_SECRET: &str = "platform-secret-0123456789";

/// `text` form-urlencoded (every byte but the unreserved ones as `%XX`).
fn form_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn post_form(http: &reqwest::Client, url: &str, params: &[(&str, &str)]) -> (u16, Value) {
    let body: Vec<String> = params
        .iter()
        .map(|(name, value)| format!("{name}={}", form_encoded(value)))
        .collect();
    let response = http
        .post(url)
        .basic_auth("platform", Some(CLIENT_SECRET))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.join("&"))
        .send()
        .await
        .expect("POST");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ciba_request_shows_its_binding_message_and_its_token_carries_the_approved_call() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let secret_file = secrets.path().join("platform.secret");
    std::fs::write(&secret_file, CLIENT_SECRET).expect("write the secret");
    let listen = countersign_testkit::http::free_addr();
    let server_toml = format!(
        r#"
[http]
listen = "{listen}"

[[http.clients]]
client_id = "platform"
agent = "coder-1"
secret_file = {secret_file:?}
"#
    );
    let harness = Harness::start_with_server_toml(&server_toml).await;
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let details = json!([{
        "type": "countersign_tool_call",
        "tool": "deploy",
        "arguments": {"env": "prod", "version": "1.4.2"},
        "risk": "high",
    }])
    .to_string();
    let (status, asked) = post_form(
        &http,
        &format!("{base}/bc-authorize"),
        &[
            ("authorization_details", &details),
            ("binding_message", "Deploy W4SCT <b>now</b>"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{asked}");
    let auth_req_id = asked["auth_req_id"].as_str().unwrap().to_owned();

    // The binding message is on the request message, escaped as any agent text is.
    let message = harness.request_message(0).await;
    assert!(
        message.text.contains("Deploy W4SCT <b>now</b>"),
        "{}",
        message.text
    );
    assert!(message.text.contains("deploy"), "{}", message.text);
    let approve = button(&message, "Approve");
    harness
        .telegram
        .tap_button(&alice(), CHAT, message.message_id, &approve);
    harness
        .telegram
        .wait_for_message("the approval", CHAT, message.message_id, |m| {
            m.text.contains("Approved")
        })
        .await;

    let (status, tokens) = post_form(
        &http,
        &format!("{base}/token"),
        &[
            ("grant_type", "urn:openid:params:grant-type:ciba"),
            ("auth_req_id", &auth_req_id),
        ],
    )
    .await;
    assert_eq!(status, 200, "{tokens}");
    let details = &tokens["authorization_details"][0];
    assert_eq!(details["tool"], "deploy");
    assert_eq!(
        details["arguments"],
        json!({"env": "prod", "version": "1.4.2"})
    );
    assert!(tokens["access_token"].is_string(), "{tokens}");
}
