//! The inbox in headless Chromium: sign in, live rows, approve for the session, a decision
//! from Telegram updating the open page, a batch of five, a rejection reaching the agent, and
//! an agent's `<script>` shown as text. Screenshots go to target/tmp/web-screenshots/.

use std::time::Duration;

use countersign_client::pb;
use fantoccini::elements::Element;
use fantoccini::{Client, Locator};

use crate::chromium::Chromium;
use crate::common::{eventually, Mode, Setup};

pub const WAIT: Duration = Duration::from_secs(15);

pub async fn element(browser: &Client, css: &str) -> Element {
    browser
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|error| panic!("no {css} on the page: {error}"))
}

pub async fn click(browser: &Client, css: &str) {
    element(browser, css)
        .await
        .click()
        .await
        .unwrap_or_else(|error| panic!("cannot click {css}: {error}"));
}

pub async fn text(browser: &Client, css: &str) -> String {
    element(browser, css).await.text().await.expect("text")
}

/// Waits until the element's text contains `expected` (the element may be replaced
/// meanwhile, by a navigation or a live update).
pub async fn text_becomes(browser: &Client, css: &str, expected: &str) {
    let started = std::time::Instant::now();
    loop {
        let now = match browser.find(Locator::Css(css)).await {
            Ok(found) => found.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if now.to_lowercase().contains(&expected.to_lowercase()) {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{css} shows {now:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ticks every row of `agent` with the inbox's "Select all of…" control.
pub async fn select_all_of(browser: &Client, agent: &str) {
    element(browser, "#select-agent")
        .await
        .select_by_value(agent)
        .await
        .unwrap_or_else(|error| panic!("cannot select all of {agent}: {error}"));
}

/// Types `key` on the page itself (not into a form field).
pub async fn press(browser: &Client, key: &str) {
    script(
        browser,
        "document.activeElement && document.activeElement.blur(); return null;",
    )
    .await;
    element(browser, "body")
        .await
        .send_keys(key)
        .await
        .expect("key press");
}

/// Signs in as Alice with a one-time link; the inbox is shown.
pub async fn sign_in(browser: &Client, setup: &Setup) {
    let link = setup.web.issue_login("alice", "Alice").await;
    browser.goto(&link).await.unwrap();
    click(browser, "#sign-in").await;
    element(browser, "#inbox").await;
}

pub async fn script(browser: &Client, code: &str) -> serde_json::Value {
    browser.execute(code, Vec::new()).await.expect("script")
}

#[tokio::test]
async fn an_approver_works_through_the_inbox_in_a_real_browser() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;

    // Sign in with a one-time link.
    sign_in(browser, &setup).await;
    assert_eq!(text(browser, "#who").await, "Alice");

    // A new approval appears without a reload; the agent's markup is text.
    script(browser, "window.sameDocument = 'yes'; return null;").await;
    let hostile =
        "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"> deploy v1.2";
    let first = setup.request("coder", hostile, pb::Risk::High).await;
    let row = format!("#row-{}", first.id);
    assert_eq!(text(browser, &format!("{row} td.action a")).await, hostile);
    assert_eq!(script(browser, "return window.sameDocument;").await, "yes");
    assert_eq!(
        script(browser, "return typeof window.pwned;").await,
        "undefined"
    );
    assert_eq!(
        script(
            browser,
            "return document.querySelectorAll('#rows script, #rows img').length;"
        )
        .await,
        0
    );
    chromium.screenshot("01-inbox-live-row").await;

    // Keyboard: j selects the first row, ? opens the help.
    press(browser, "j").await;
    assert_eq!(
        script(
            browser,
            "return document.querySelector('#rows tr.selected').dataset.id;"
        )
        .await,
        first.id.as_str()
    );
    press(browser, "?").await;
    assert_eq!(
        script(browser, "return document.getElementById('help').open;").await,
        true
    );
    script(
        browser,
        "document.getElementById('help').close(); return null;",
    )
    .await;

    // Approve with session scope on the approval page.
    click(browser, &format!("{row} td.action a")).await;
    assert_eq!(text(browser, "#action").await, hostile);
    assert!(text(browser, "pre.diff").await.contains("-env=staging"));
    click(browser, "#scope-session").await;
    // "a" approves, with the scope chosen in the form.
    press(browser, "a").await;
    text_becomes(browser, "#state", "approved").await;
    assert!(text(browser, "#outcome")
        .await
        .contains("Approved by Alice (web)"));
    chromium.screenshot("02-approved-for-session").await;
    let grants = setup
        .admin
        .list_grants(pb::ListGrantsRequest::default())
        .await
        .unwrap()
        .grants;
    assert!(
        grants
            .iter()
            .any(|g| g.approval_id == first.id && g.active && g.session_id == "coder-session"),
        "{grants:?}"
    );

    // A decision on another channel updates the open page in place.
    let second = setup
        .request("coder-2", "restart the database", pb::Risk::Medium)
        .await;
    browser
        .goto(&format!("{}/approvals/{}", setup.web.url, second.id))
        .await
        .unwrap();
    assert!(element(browser, "#decide")
        .await
        .is_displayed()
        .await
        .unwrap());
    script(browser, "window.sameDocument = 'still'; return null;").await;
    setup.decide_on_telegram(&second.id, "2222", "Bob").await;
    text_becomes(browser, "#outcome", "Approved by Bob (telegram)").await;
    assert_eq!(text(browser, "#state").await.to_lowercase(), "approved");
    assert!(!element(browser, "#decide")
        .await
        .is_displayed()
        .await
        .unwrap());
    assert_eq!(
        script(browser, "return window.sameDocument;").await,
        "still"
    );
    chromium.screenshot("03-decided-elsewhere").await;

    // Batch: select all of one agent, review, approve all five, per-item results.
    let mut batch = Vec::new();
    for shard in 1..=5 {
        batch.push(
            setup
                .request(
                    "batcher",
                    &format!("migrate shard {shard}"),
                    pb::Risk::Medium,
                )
                .await,
        );
    }
    let decoy = setup
        .request("other-agent", "not in the batch", pb::Risk::Medium)
        .await;
    browser.goto(&format!("{}/", setup.web.url)).await.unwrap();
    for approval in &batch {
        element(browser, &format!("#row-{}", approval.id)).await;
    }
    select_all_of(browser, "batcher").await;
    chromium.screenshot("04-inbox-batch-selected").await;
    click(browser, "#batch button[type=submit]").await;
    element(browser, "#batch-decide").await;
    let items = browser
        .find_all(Locator::Css("section.batch-item"))
        .await
        .unwrap();
    assert_eq!(items.len(), 5);
    assert!(!browser.source().await.unwrap().contains(&decoy.id));
    click(browser, "#approve-all").await;
    element(browser, "#results").await;
    let resolved = browser
        .find_all(Locator::Css("tr.result-resolved"))
        .await
        .unwrap();
    assert_eq!(resolved.len(), 5);
    assert!(text(browser, "#results")
        .await
        .contains("resolved: Approved by Alice (web)"));
    chromium.screenshot("05-batch-results").await;
    for approval in &batch {
        let now = setup.agent.get_approval(&approval.id).await.unwrap();
        assert_eq!(now.state(), pb::ApprovalState::Approved);
    }

    // A rejection with a reason reaches the waiting agent.
    let third = setup
        .request("coder-3", "drop table users", pb::Risk::Critical)
        .await;
    let waiting = {
        let agent = setup.agent.clone();
        let id = third.id.clone();
        tokio::spawn(async move {
            agent
                .wait_until_resolved(&id, Duration::from_secs(30))
                .await
        })
    };
    browser
        .goto(&format!("{}/approvals/{}", setup.web.url, third.id))
        .await
        .unwrap();
    element(browser, "#reason")
        .await
        .send_keys("not without a backup")
        .await
        .unwrap();
    click(browser, "#reject").await;
    text_becomes(browser, "#state", "rejected").await;
    let resolved = waiting.await.unwrap().expect("the agent's wait");
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.resolution.unwrap().reason, "not without a backup");
    chromium.screenshot("06-rejected").await;

    // The decided approvals are in the history.
    browser
        .goto(&format!("{}/history", setup.web.url))
        .await
        .unwrap();
    eventually("the history to list the rejection", || async {
        browser
            .source()
            .await
            .unwrap_or_default()
            .contains(&third.id)
    })
    .await;

    // On a phone-sized window the inbox is one column without a table header.
    browser.set_window_size(390, 844).await.unwrap();
    browser.goto(&format!("{}/", setup.web.url)).await.unwrap();
    element(browser, &format!("#row-{}", decoy.id)).await;
    assert_eq!(
        script(
            browser,
            "return getComputedStyle(document.querySelector('#inbox thead')).display;"
        )
        .await,
        "none"
    );
    chromium.screenshot("07-phone-inbox").await;

    chromium.stop().await;
    setup.web.stop().await;
}

/// Edit-on-approve in the browser: a malformed edit is refused with the server's reason and
/// decides nothing; a valid edit approves the edited arguments, which the agent receives.
#[tokio::test]
async fn an_approver_edits_the_arguments_before_approving_in_a_real_browser() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    sign_in(browser, &setup).await;

    let approval = setup
        .request("editor", "deploy to production", pb::Risk::Medium)
        .await;
    let page = format!("{}/approvals/{}", setup.web.url, approval.id);
    let set_edit = |arguments: &'static str| {
        format!(
            "document.getElementById('edit').open = true; document.getElementById('edit-arguments').value = {}; return null;",
            serde_json::Value::from(arguments)
        )
    };

    browser.goto(&page).await.unwrap();
    let prefilled = script(
        browser,
        "return document.getElementById('edit-arguments').value;",
    )
    .await;
    let shown: serde_json::Value = serde_json::from_str(prefilled.as_str().unwrap()).unwrap();
    assert_eq!(shown["command"], "make deploy", "prefilled, pretty-printed");
    assert!(prefilled.as_str().unwrap().contains("\n  \"command\""));
    script(
        browser,
        &set_edit(r#"{"command": "make deploy", "command": "rm -rf /"}"#),
    )
    .await;
    click(browser, "#approve").await;
    text_becomes(browser, "body", "edited_arguments_json").await;
    assert!(browser.source().await.unwrap().contains("appears twice"));
    chromium.screenshot("10-edit-refused").await;
    let unchanged = setup.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(unchanged.state(), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());

    browser.goto(&page).await.unwrap();
    script(
        browser,
        &set_edit(r#"{"command": "make deploy", "env": "staging"}"#),
    )
    .await;
    click(browser, "#approve").await;
    text_becomes(browser, "#state", "approved").await;
    assert_eq!(text(browser, "#edited-by").await, "Alice (web)");
    assert!(text(browser, "#arguments").await.contains("staging"));
    chromium.screenshot("11-approved-with-edits").await;
    let approved = setup.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(approved.state(), pb::ApprovalState::Approved);
    let edited: serde_json::Value = serde_json::from_str(&approved.edited_arguments_json).unwrap();
    assert_eq!(
        edited,
        serde_json::json!({"command": "make deploy", "env": "staging"})
    );
    assert_eq!(approved.editor.unwrap().display_name, "Alice");
}
