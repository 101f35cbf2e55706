//! The inbox on the windows approvers use, measured in headless Chromium with
//! getBoundingClientRect: a laptop window decides a one-line command without scrolling, a
//! phone shows the first approval high on the screen with 44 px touch targets, and the
//! offline bar of a page loaded while the server is down never blinks off.

use countersign_client::pb;
use fantoccini::Client;
use serde_json::Value;

use crate::approver::{open_live, resize, run, PHONE};
use crate::browser::{click, element, script, sign_in};
use crate::chromium::Chromium;
use crate::common::{eventually, Mode, Setup};

/// The laptop window of the report: 1280×757.
const LAPTOP: (u32, u32) = (1280, 757);

/// On a phone, the first approval starts within the top third of the screen.
const PHONE_FIRST_CARD_TOP: f64 = 844.0 / 3.0;

/// Apple's and Google's smallest comfortable touch target, in CSS pixels.
const TOUCH: f64 = 44.0;

/// The element's box in the viewport: top, bottom, width, height.
async fn rect(browser: &Client, css: &str) -> (f64, f64, f64, f64) {
    let found = script(
        browser,
        &format!(
            "const r = document.querySelector({css:?}).getBoundingClientRect();
             return [r.top, r.bottom, r.width, r.height];"
        ),
    )
    .await;
    let number = |i: usize| found[i].as_f64().expect("a number");
    (number(0), number(1), number(2), number(3))
}

async fn inner_height(browser: &Client) -> f64 {
    script(browser, "return window.innerHeight;")
        .await
        .as_f64()
        .expect("innerHeight")
}

/// Whether the element is shown (laid out, not in a closed `<details>`).
async fn shown(browser: &Client, css: &str) -> bool {
    script(
        browser,
        &format!("return document.querySelector({css:?}).checkVisibility();"),
    )
    .await
        == true
}

/// Every shown control smaller than a touch target, described; empty when all are big enough.
/// A tick box's target is the label around it.
async fn small_touch_targets(browser: &Client) -> Vec<String> {
    let found = script(
        browser,
        &format!(
            "const small = [];
             document.querySelectorAll('button, select, summary, label.tick, .decide fieldset label').forEach(function (el) {{
               if (!el.checkVisibility()) return;
               const r = el.getBoundingClientRect();
               if (r.width < {TOUCH} || r.height < {TOUCH}) {{
                 small.push(el.tagName + '#' + el.id + '.' + el.className + ' ' + el.textContent.trim().slice(0, 30) + ': ' + r.width + 'x' + r.height);
               }}
             }});
             document.querySelectorAll('#rows input[type=checkbox]').forEach(function (box) {{
               if (!box.closest('label.tick')) small.push('a tick box without its label');
             }});
             return small;"
        ),
    )
    .await;
    serde_json::from_value(found).expect("a list")
}

#[tokio::test]
async fn a_laptop_window_shows_the_approve_button_of_a_one_line_command() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    resize(browser, LAPTOP).await;
    let tag = run(
        &setup,
        "release-bot",
        "git tag v2.4.0",
        "tag the release",
        pb::Risk::Medium,
    )
    .await;
    sign_in(browser, &setup).await;

    open_live(browser, &setup, &format!("/approvals/{}", tag.id)).await;
    let height = inner_height(browser).await;
    let (_, approve_bottom, _, _) = rect(browser, "#approve").await;
    let (arguments_top, _, _, _) = rect(browser, "#arguments").await;
    chromium.screenshot("screen-laptop-approval").await;
    assert!(
        approve_bottom <= height,
        "Approve ends at y={approve_bottom}, below the fold at {height}"
    );
    assert!(arguments_top < approve_bottom, "the arguments come first");

    // The inbox shows its filters without a click.
    open_live(browser, &setup, "/").await;
    assert!(shown(browser, "input[name=agent]").await);
    assert!(!shown(browser, "details.filter-panel > summary").await);
    chromium.stop().await;
    setup.web.stop().await;
}

#[tokio::test]
async fn a_phone_shows_the_first_approval_high_with_touch_sized_controls() {
    let setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    resize(browser, PHONE).await;
    let mut last = None;
    for agent in ["release-bot", "deploy-agent", "db-migrator", "docs-writer"] {
        last = Some(
            run(
                &setup,
                agent,
                "git push origin v2.4.0",
                "publish the tag",
                pb::Risk::High,
            )
            .await,
        );
    }
    let last = last.expect("an approval");
    sign_in(browser, &setup).await;
    open_live(browser, &setup, "/").await;
    element(browser, &format!("#row-{}", last.id)).await;

    let (first_top, first_bottom, _, _) = rect(browser, "#rows tr.row").await;
    chromium.screenshot("screen-phone-inbox").await;
    assert!(
        first_top <= PHONE_FIRST_CARD_TOP,
        "the first approval starts at y={first_top}"
    );
    assert!(first_bottom <= inner_height(browser).await);
    assert_eq!(small_touch_targets(browser).await, Vec::<String>::new());

    // The filters are one tap away.
    assert!(!shown(browser, "input[name=agent]").await);
    click(browser, "details.filter-panel > summary").await;
    assert!(shown(browser, "input[name=agent]").await);
    assert_eq!(small_touch_targets(browser).await, Vec::<String>::new());

    open_live(browser, &setup, &format!("/approvals/{}", last.id)).await;
    chromium.screenshot("screen-phone-approval").await;
    assert_eq!(small_touch_targets(browser).await, Vec::<String>::new());
    chromium.stop().await;
    setup.web.stop().await;
}

/// Records, from a page's first node, each change of whether the offline bar is shown:
/// `window.offlineBar` is the list of states, each different from the one before.
const OFFLINE_BAR_PROBE: &str = "window.offlineBar = [];
new MutationObserver(function () {
  const bar = document.getElementById('connection');
  if (!bar) return;
  const shown = !bar.hidden;
  if (window.offlineBar[window.offlineBar.length - 1] !== shown) window.offlineBar.push(shown);
}).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ['hidden'] });";

/// Loads the inbox afresh and returns what the probe saw once its live stream is open.
async fn offline_bar_on_a_fresh_load(browser: &Client, setup: &Setup) -> Value {
    open_live(browser, setup, "/").await;
    script(browser, "return window.offlineBar;").await
}

#[tokio::test]
async fn the_offline_bar_of_a_page_loaded_while_the_server_is_down_never_blinks_off() {
    let mut setup = Setup::start(Mode::Login).await;
    let chromium = Chromium::start().await;
    let browser = &chromium.client;
    sign_in(browser, &setup).await;
    chromium.run_on_every_page(OFFLINE_BAR_PROBE).await;

    // Server up: the bar is never shown.
    assert_eq!(
        offline_bar_on_a_fresh_load(browser, &setup).await,
        serde_json::json!([false])
    );

    // Server down, and the inbox knows it: the page comes with the bar, which stays up.
    setup.server.stop().await;
    eventually("the inbox to render its pages offline", || async {
        browser
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 fetch('/').then((r) => r.text()).then(function (html) {
                   const page = new DOMParser().parseFromString(html, 'text/html');
                   done(!page.getElementById('connection').hidden);
                 });",
                Vec::new(),
            )
            .await
            .expect("fetch the inbox")
            == true
    })
    .await;
    assert_eq!(
        offline_bar_on_a_fresh_load(browser, &setup).await,
        serde_json::json!([true])
    );
    chromium.stop().await;
    setup.web.stop().await;
}
