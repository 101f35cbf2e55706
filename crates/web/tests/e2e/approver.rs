//! The inbox as an approver meets it, in headless Chromium with its default settings: Enter in
//! a form never decides, pages kept in the back/forward cache do not starve later pages of
//! connections, a lost server is said so, and a whole walk through the inbox (laptop and
//! phone windows, a rejection with Enter in the reason, a batch, losing and regaining the
//! server) decides exactly what the approver meant. The walk's screenshots are the ones in
//! docs/web.md.

use std::time::{Duration, Instant};

use countersign_client::pb;
use fantoccini::{Client, Locator};

use crate::browser::{click, element, script, select_all_of, sign_in, text, text_becomes, WAIT};
use crate::chromium::Chromium;
use crate::common::{eventually, Mode};
use crate::common::{request, Setup};

/// WebDriver's Enter key.
const ENTER: &str = "\u{E007}";

/// Long enough for a form submitted by a key press to reach the server and be decided.
const SETTLE: Duration = Duration::from_millis(700);

const LAPTOP: (u32, u32) = (1280, 800);
pub const PHONE: (u32, u32) = (390, 844);

/// A call as an agent asks for it.
pub async fn ask(
    setup: &Setup,
    agent: &str,
    tool: &str,
    arguments: serde_json::Value,
    action: &str,
    reason: &str,
    risk: pb::Risk,
) -> pb::Approval {
    let mut call = request(agent, action, risk);
    call.tool_name = tool.into();
    call.arguments_json = arguments.to_string();
    call.reason = reason.into();
    call.requester = "dana".into();
    setup
        .agent
        .request_approval(call)
        .await
        .expect("request approval")
        .approval
        .expect("approval")
}

/// A shell command, with the action line the hooks give it.
pub async fn run(
    setup: &Setup,
    agent: &str,
    command: &str,
    reason: &str,
    risk: pb::Risk,
) -> pb::Approval {
    let arguments = serde_json::json!({"command": command});
    ask(
        setup,
        agent,
        "bash",
        arguments,
        &format!("run: {command}"),
        reason,
        risk,
    )
    .await
}

/// The call that must never be approved by accident.
async fn drop_database(setup: &Setup) -> pb::Approval {
    ask(
        setup,
        "db-migrator",
        "sql",
        serde_json::json!({"database": "prod", "statement": "DROP DATABASE prod;"}),
        "DROP DATABASE prod",
        "cleanup after the migration",
        pb::Risk::Critical,
    )
    .await
}

async fn state_of(setup: &Setup, approval: &pb::Approval) -> pb::Approval {
    setup.agent.get_approval(&approval.id).await.expect("get")
}

/// Fails when anything was decided on `approval`: it is pending without a single decision.
async fn undecided(setup: &Setup, approval: &pb::Approval, after: &str) {
    let now = state_of(setup, approval).await;
    assert_eq!(
        now.state(),
        pb::ApprovalState::Pending,
        "{after} decided {:?}: {:?}",
        approval.action,
        now.resolution
    );
    assert!(now.decisions.is_empty(), "{after}: {:?}", now.decisions);
}

/// Opens `path` and waits until its live stream is open.
pub async fn open_live(browser: &Client, setup: &Setup, path: &str) {
    browser
        .goto(&format!("{}{path}", setup.web.url))
        .await
        .expect("navigate");
    eventually("the page's live stream to open", || async {
        script(browser, "return document.body.dataset.live || '';").await == "open"
    })
    .await;
}

/// The ids of the form's fields an approver can type Enter into, in page order.
async fn typable_fields(browser: &Client, form: &str) -> Vec<String> {
    let ids = script(
        browser,
        &format!(
            "return Array.from(document.querySelectorAll('#{form} input:not([type=hidden]), #{form} textarea:not([hidden])'))
                .map(function (field, index) {{ if (!field.id) field.id = '{form}-field-' + index; return field.id; }});"
        ),
    )
    .await;
    ids.as_array()
        .expect("an array")
        .iter()
        .map(|id| id.as_str().expect("an id").to_owned())
        .collect()
}

/// Types `words` and Enter into every typable field of `form`, one after the other; the
/// caller checks after each what the server holds.
async fn enter_in_each_field(browser: &Client, form: &str, words: &str) -> Vec<String> {
    let fields = typable_fields(browser, form).await;
    assert!(!fields.is_empty(), "no fields in #{form}");
    for field in &fields {
        let element = element(browser, &format!("#{field}")).await;
        let kind = script(
            browser,
            &format!("return document.getElementById('{field}').type;"),
        )
        .await;
        if kind == "radio" || kind == "checkbox" {
            element.click().await.expect("focus the field");
            element.send_keys(ENTER).await.expect("Enter");
        } else {
            element.click().await.expect("focus the field");
            element
                .send_keys(&format!("{words}{ENTER}"))
                .await
                .expect("type and Enter");
        }
        tokio::time::sleep(SETTLE).await;
        assert_eq!(
            script(browser, "return window.probe || '';").await,
            "unchanged",
            "Enter in #{field} of #{form} submitted the form"
        );
    }
    fields
}

/// Types `words` and Enter into the form's Reason: the form says Enter does not decide.
async fn enter_in_the_reason(browser: &Client, words: &str) {
    element(browser, "#reason")
        .await
        .send_keys(&format!("{words}{ENTER}"))
        .await
        .expect("type the reason and Enter");
    text_becomes(browser, "#form-error", "Enter does not decide").await;
}

#[tokio::test]
async fn enter_in_any_field_of_a_decision_form_decides_nothing() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    sign_in(browser, &setup).await;

    // The approval page: reason, scope, the edit box (opened, as an approver editing would).
    let drop = drop_database(&setup).await;
    open_live(browser, &setup, &format!("/approvals/{}", drop.id)).await;
    script(
        browser,
        "window.probe = 'unchanged'; document.getElementById('edit').open = true; return null;",
    )
    .await;
    let fields = enter_in_each_field(browser, "decide", "NO - this would destroy prod").await;
    assert!(fields.contains(&"reason".to_owned()), "{fields:?}");
    assert!(fields.contains(&"edit-arguments".to_owned()), "{fields:?}");
    undecided(&setup, &drop, "Enter on the approval page").await;
    // The page says why nothing happened.
    text_becomes(browser, "#form-error", "Enter does not decide").await;

    // The batch page: two approvals, a reason, Enter.
    let first = run(
        &setup,
        "release-bot",
        "git push --force origin main",
        "rewrite history after the leak",
        pb::Risk::High,
    )
    .await;
    let second = run(
        &setup,
        "release-bot",
        "npm publish",
        "release 2.4.0",
        pb::Risk::High,
    )
    .await;
    open_live(browser, &setup, "/").await;
    element(browser, &format!("#row-{}", second.id)).await;
    select_all_of(browser, "release-bot").await;
    click(browser, "#batch button[type=submit]").await;
    element(browser, "#batch-decide").await;
    script(browser, "window.probe = 'unchanged'; return null;").await;
    enter_in_each_field(browser, "batch-decide", "no, reject both").await;
    undecided(&setup, &first, "Enter on the batch page").await;
    undecided(&setup, &second, "Enter on the batch page").await;
    text_becomes(browser, "#form-error", "Enter does not decide").await;

    // Without the script's guard (a clone of the form has no listeners), Enter submits the
    // form with its first submit button, which names no verdict: the server decides nothing
    // and answers with the form, the error and the reason typed.
    open_live(browser, &setup, &format!("/approvals/{}", drop.id)).await;
    script(
        browser,
        "window.probe = 'unchanged';
         const form = document.getElementById('decide');
         form.replaceWith(form.cloneNode(true));
         return null;",
    )
    .await;
    element(browser, "#reason")
        .await
        .send_keys(&format!("NO{ENTER}"))
        .await
        .unwrap();
    text_becomes(browser, "#form-error", "Enter does not decide").await;
    assert_eq!(
        script(browser, "return window.probe || 'a new page';").await,
        "a new page"
    );
    assert_eq!(
        script(browser, "return document.getElementById('reason').value;").await,
        "NO"
    );
    undecided(&setup, &drop, "Enter without the script").await;

    // The shortcut still rejects: r, the reason, Enter.
    open_live(browser, &setup, &format!("/approvals/{}", drop.id)).await;
    crate::browser::press(browser, "r").await;
    element(browser, "#reason")
        .await
        .send_keys(&format!("this would destroy prod{ENTER}"))
        .await
        .unwrap();
    text_becomes(browser, "#state", "rejected").await;
    let rejected = state_of(&setup, &drop).await;
    assert_eq!(rejected.state(), pb::ApprovalState::Rejected);
    assert_eq!(
        rejected.resolution.unwrap().reason,
        "this would destroy prod"
    );

    chromium.stop().await;
    setup.web.stop().await;
}

/// Twenty page loads in a row with the back/forward cache on (Chromium's default). Chromium
/// keeps six HTTP/1.1 connections per host; a cached page that kept its event stream open
/// held one, and the sixth or seventh load waited about a minute for one to free up. The
/// bound is a generous 5 s, a check that nothing stalls, not a measure of speed.
#[tokio::test]
async fn twenty_page_loads_in_a_row_do_not_stall() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    sign_in(browser, &setup).await;
    let mut approvals = Vec::new();
    for shard in 1..=10 {
        approvals.push(
            run(
                &setup,
                "migrator",
                &format!("./migrate --shard {shard}"),
                "schema 42",
                pb::Risk::Medium,
            )
            .await,
        );
    }
    let mut cached = 0;
    for load in 0..20 {
        let path = match load % 2 {
            0 => "/".to_owned(),
            _ => format!("/approvals/{}", approvals[load / 2].id),
        };
        let started = Instant::now();
        open_live(browser, &setup, &path).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "load {load} ({path}) took {took:?} to show its page with a live stream"
        );
        // Going back shows the cached page (the cache is on), then forward again.
        if load == 1 {
            browser.back().await.expect("back");
            script(
                browser,
                "window.addEventListener('pageshow', function (event) { window.restored = event.persisted; }); return null;",
            )
            .await;
            browser.forward().await.expect("forward");
            browser.back().await.expect("back again");
            cached = i32::from(script(browser, "return window.restored === true;").await == true);
            browser.forward().await.expect("forward again");
        }
    }
    assert_eq!(cached, 1, "the back/forward cache should be on");
    chromium.stop().await;
    setup.web.stop().await;
}

/// The window's size in CSS pixels.
pub async fn resize(browser: &Client, (width, height): (u32, u32)) {
    browser
        .set_window_size(width, height)
        .await
        .expect("resize");
}

/// Whether the arguments (and their digest) come before the decision buttons on the page.
async fn arguments_before_buttons(browser: &Client) -> bool {
    script(
        browser,
        "const top = (css) => document.querySelector(css).getBoundingClientRect().top;
         return top('#arguments') < top('#approve') && top('#digest') < top('#approve');",
    )
    .await
        == true
}

#[tokio::test]
async fn an_approver_walks_the_whole_inbox_and_decides_only_what_they_meant() {
    let mut setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    resize(browser, LAPTOP).await;

    let scale = ask(
        &setup,
        "deploy-agent",
        "Edit",
        serde_json::json!({
            "file_path": "deploy/production.yaml",
            "old_string": "replicas: 2\nimage: api:2.3.1\n",
            "new_string": "replicas: 4\nimage: api:2.4.0\n",
        }),
        "edit deploy/production.yaml: api 2.3.1 → 2.4.0, 4 replicas",
        "roll out release 2.4.0 for the launch",
        pb::Risk::High,
    )
    .await;
    let drop = drop_database(&setup).await;
    let mut release = Vec::new();
    for (command, why) in [
        ("git tag v2.4.0", "tag the release"),
        ("git push origin v2.4.0", "publish the tag"),
        ("npm publish", "publish the package"),
    ] {
        release.push(run(&setup, "release-bot", command, why, pb::Risk::Medium).await);
    }

    // Sign in; everything is listed, and the inbox has a favicon (the browser asks for it).
    sign_in(browser, &setup).await;
    element(browser, &format!("#row-{}", release[2].id)).await;
    let favicon = browser
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/favicon.ico').then(function (r) { done(r.status + ' ' + r.headers.get('content-type')); });",
            Vec::new(),
        )
        .await
        .expect("fetch the favicon");
    assert_eq!(favicon, "200 image/x-icon");

    // Read the file edit on a laptop: the diff, the arguments and their digest before the
    // buttons.
    open_live(browser, &setup, &format!("/approvals/{}", scale.id)).await;
    assert!(text(browser, "pre.diff").await.contains("+replicas: 4"));
    assert!(arguments_before_buttons(browser).await);
    // The picture in docs/web.md: the whole page, down to the buttons.
    resize(browser, (1280, 1400)).await;
    chromium.screenshot("web-approval").await;

    // Read the DROP on a phone: the arguments still come first.
    resize(browser, PHONE).await;
    open_live(browser, &setup, &format!("/approvals/{}", drop.id)).await;
    assert!(arguments_before_buttons(browser).await);
    assert!(text(browser, "#arguments")
        .await
        .contains("DROP DATABASE prod;"));
    // Reject without a reason: the form says so and keeps the page.
    click(browser, "#reject").await;
    text_becomes(browser, "#form-error", "needs a reason").await;
    element(browser, "#decide").await;
    undecided(&setup, &drop, "Reject without a reason").await;
    // Type the reason and press Enter: nothing is decided, the form says why.
    enter_in_the_reason(browser, "NO - this would destroy prod").await;
    undecided(&setup, &drop, "Enter in the reason").await;
    chromium.screenshot("walk-phone-enter-refused").await;
    // Then Reject, deliberately.
    click(browser, "#reject").await;
    text_becomes(browser, "#state", "rejected").await;

    // The phone inbox: each row's cells carry their labels.
    open_live(browser, &setup, "/").await;
    element(browser, &format!("#row-{}", scale.id)).await;
    let label = |cell: &str| {
        format!(
            "const label = document.querySelector('#row-{} td.{cell} .label');
             return label && getComputedStyle(label).display !== 'none' ? label.textContent : '';",
            scale.id
        )
    };
    for (cell, expected) in [
        ("agent", "Agent"),
        ("tool", "Tool"),
        ("left", "Time left"),
        ("quorum", "Quorum"),
    ] {
        assert_eq!(script(browser, &label(cell)).await, expected, "td.{cell}");
    }
    chromium.screenshot("walk-phone-inbox").await;

    // Back on the laptop: "Review selected" with nothing ticked says so on the inbox.
    resize(browser, LAPTOP).await;
    open_live(browser, &setup, "/").await;
    assert_eq!(text(browser, "#review").await, "Review selected (0)");
    click(browser, "#review").await;
    text_becomes(browser, "#form-error", "Tick").await;
    element(browser, "#inbox").await;
    // Tick the release, which the button counts (and the error goes), and review it.
    select_all_of(browser, "release-bot").await;
    assert_eq!(text(browser, "#review").await, "Review selected (3)");
    assert!(!element(browser, "#form-error")
        .await
        .is_displayed()
        .await
        .unwrap());
    chromium.screenshot("web-inbox").await;
    click(browser, "#review").await;
    element(browser, "#batch-decide").await;
    // Enter in the batch's reason decides nothing; Approve all does.
    enter_in_the_reason(browser, "release 2.4.0 checked").await;
    for approval in &release {
        undecided(&setup, approval, "Enter in the batch's reason").await;
    }
    click(browser, "#approve-all").await;
    element(browser, "#results").await;
    assert_eq!(
        browser
            .find_all(Locator::Css("tr.result-resolved"))
            .await
            .unwrap()
            .len(),
        3
    );

    // The server goes away: the open inbox says so, then recovers on its own.
    open_live(browser, &setup, "/").await;
    setup.server.stop().await;
    text_becomes(
        browser,
        "#connection",
        "not connected to the countersign server",
    )
    .await;
    assert!(element(browser, "#connection")
        .await
        .is_displayed()
        .await
        .unwrap());
    chromium.screenshot("walk-server-lost").await;
    setup.server.restart().await;
    let hidden = "return document.getElementById('connection').hidden;";
    wait_long("the banner to go once the server is back", || async {
        script(browser, hidden).await == true
    })
    .await;
    let late = run(
        &setup,
        "deploy-agent",
        "kubectl rollout status deploy/api",
        "watch the rollout",
        pb::Risk::Low,
    )
    .await;
    element(browser, &format!("#row-{}", late.id)).await;

    // The inbox itself goes away: the page says so, then reconnects.
    setup.web.kill().await;
    text_becomes(browser, "#connection", "lost the connection to the inbox").await;
    setup.web.relaunch().await;
    wait_long("the banner to go once the inbox is back", || async {
        script(browser, hidden).await == true
    })
    .await;

    // Exactly what was meant: the DROP rejected with the reason typed, the release approved,
    // the rest untouched.
    let dropped = state_of(&setup, &drop).await;
    assert_eq!(dropped.state(), pb::ApprovalState::Rejected);
    assert_eq!(
        dropped.resolution.unwrap().reason,
        "NO - this would destroy prod"
    );
    for approval in &release {
        assert_eq!(
            state_of(&setup, approval).await.state(),
            pb::ApprovalState::Approved
        );
    }
    undecided(&setup, &scale, "the walk").await;
    undecided(&setup, &late, "the walk").await;
    chromium.stop().await;
    setup.web.stop().await;
}

/// Like `eventually`, for what takes a reconnect with backoff (up to the watch's 10 s pause).
async fn wait_long<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < WAIT * 3, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
