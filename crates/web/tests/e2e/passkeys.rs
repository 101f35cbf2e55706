//! Passkey step-up in headless Chromium with the browser's virtual authenticator (WebDriver's
//! WebAuthn extension): an approver registers a passkey and approves a step-up approval with
//! it; a Telegram tap on the same kind of approval approves nothing; an assertion made for
//! another approval's challenge is refused; the approver removes the passkey. The server
//! verifies every step (docs/security.md#passkey-step-up).

use countersign_client::{pb, ClientError};
use countersign_core::webauthn::from_base64url;

use crate::browser::{click, element, script, sign_in, text_becomes};
use crate::chromium::Chromium;
use crate::common::{eventually, Setup};

async fn state_of(setup: &Setup, id: &str) -> pb::ApprovalState {
    setup.agent.get_approval(id).await.expect("get").state()
}

#[tokio::test]
async fn an_approver_registers_a_passkey_and_approves_a_step_up_approval_with_it() {
    let setup = Setup::start_with_step_up().await;
    let chromium = Chromium::start().await;
    chromium.add_virtual_authenticator().await;
    let browser = &chromium.client;
    sign_in(browser, &setup).await;

    // Register a passkey.
    browser
        .goto(&format!("{}/passkeys", setup.web.url))
        .await
        .unwrap();
    element(browser, "#passkey-name")
        .await
        .send_keys("laptop")
        .await
        .unwrap();
    click(browser, "#register").await;
    text_becomes(browser, "#passkey-message", "registered").await;
    text_becomes(browser, "#passkeys tbody", "laptop").await;

    let first = setup
        .request("deployer", "deploy billing", pb::Risk::High)
        .await;
    let second = setup
        .request("deployer", "deploy search", pb::Risk::High)
        .await;
    assert_eq!(
        (first.step_up.as_str(), second.step_up.as_str()),
        ("passkey", "passkey")
    );

    // A Telegram tap (Alice's Telegram identity) approves nothing and says where to approve.
    let tapped = setup
        .admin
        .decide(pb::DecideRequest {
            approval_id: first.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            decider: Some(pb::Decider {
                channel: "telegram".into(),
                user_id: "1111".into(),
                display_name: "Alice".into(),
            }),
            idempotency_key: "tg-tap".into(),
            ..Default::default()
        })
        .await;
    match tapped {
        Err(ClientError::PermissionDenied(why)) => assert!(
            why.contains(&format!("{}/approvals/{}", setup.web.url, first.id)),
            "{why}"
        ),
        other => panic!("a tap without a passkey was not refused: {other:?}"),
    }
    assert_eq!(
        state_of(&setup, &first.id).await,
        pb::ApprovalState::Pending
    );

    // The first approval's page made to carry the second's challenge: the passkey signs the
    // second approval's challenge, and the server refuses it for the first.
    browser
        .goto(&format!("{}/approvals/{}", setup.web.url, second.id))
        .await
        .unwrap();
    element(browser, "#step-up").await;
    let other = script(
        browser,
        "const form = document.getElementById('decide'); \
         return [form.dataset.challenge, form.querySelector('input[name=nonce]').value];",
    )
    .await;
    browser
        .goto(&format!("{}/approvals/{}", setup.web.url, first.id))
        .await
        .unwrap();
    element(browser, "#step-up").await;
    browser
        .execute(
            "const form = document.getElementById('decide'); \
             form.dataset.challenge = arguments[0][0]; \
             form.querySelector('input[name=nonce]').value = arguments[0][1]; return null;",
            vec![other],
        )
        .await
        .expect("swap the challenge");
    click(browser, "#approve").await;
    text_becomes(browser, "#form-error", "challenge").await;
    assert_eq!(
        state_of(&setup, &first.id).await,
        pb::ApprovalState::Pending
    );

    // Approve with the passkey, as the page asks.
    browser
        .goto(&format!("{}/approvals/{}", setup.web.url, first.id))
        .await
        .unwrap();
    click(browser, "#approve").await;
    eventually("the passkey approval", || async {
        state_of(&setup, &first.id).await == pb::ApprovalState::Approved
    })
    .await;
    let approved = setup.agent.get_approval(&first.id).await.unwrap();
    let payload = approved.receipt.split('.').nth(1).expect("a compact JWS");
    let claims: serde_json::Value =
        serde_json::from_slice(&from_base64url(payload, "payload").unwrap()).unwrap();
    assert_eq!(claims["step_up"][0]["method"], "passkey");
    assert_eq!(claims["step_up"][0]["approver"], "alice");
    chromium.screenshot("web-passkey-approved").await;

    // The second one is still pending: nothing was approved with the other's assertion.
    assert_eq!(
        state_of(&setup, &second.id).await,
        pb::ApprovalState::Pending
    );

    // A lost laptop: Alice removes its passkey on the same page; it is listed no more.
    browser
        .goto(&format!("{}/passkeys", setup.web.url))
        .await
        .unwrap();
    click(browser, "#passkeys tbody button").await;
    text_becomes(browser, "#passkey-message", "\"laptop\" removed").await;
    let rows = script(
        browser,
        "return document.querySelectorAll('#passkeys tbody tr').length;",
    )
    .await;
    assert_eq!(rows, serde_json::json!(0));
    chromium.stop().await;
}
