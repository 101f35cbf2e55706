//! The persisted watch cursor: a restarted worker resumes after the last event it fully
//! handled, so nothing that happened while it was stopped is missed, however much happened.

use std::time::Duration;

use countersign_client::pb::{self, Verdict};
use countersign_client::{WatchItem, WatchOptions};

use crate::common::{Harness, CHAT};

/// The seq in the worker's cursor file (the seq, then the log's history id), if it wrote one.
fn persisted_cursor(harness: &Harness) -> Option<u64> {
    let text = std::fs::read_to_string(harness.cursor_path()).ok()?;
    let seq = text
        .split_whitespace()
        .next()
        .expect("the cursor file holds a seq");
    Some(seq.parse().expect("the cursor file holds a seq"))
}

/// Waits until the worker's cursor file names `seq` or later.
async fn wait_for_cursor(harness: &Harness, seq: u64) {
    for _ in 0..1500 {
        if persisted_cursor(harness).is_some_and(|persisted| persisted >= seq) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the cursor never reached {seq}; it is {:?}",
        persisted_cursor(harness)
    );
}

/// The seq of the newest event on the server (the head of a fresh watch's snapshot).
async fn head_seq(harness: &Harness) -> u64 {
    let mut watch = harness.agent.watch(WatchOptions::channel("telegram"));
    match watch.next().await.expect("a snapshot") {
        WatchItem::Snapshot(_) => watch.cursor().expect("a snapshot head").seq,
        WatchItem::Event(event) => panic!("expected a snapshot, got {event:?}"),
    }
}

fn rejected_by_carol(approval_id: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        approval_id: approval_id.to_owned(),
        verdict: Verdict::Reject.into(),
        reason: "not during the freeze".into(),
        decider: Some(pb::Decider {
            channel: "cli".into(),
            user_id: "carol".into(),
            display_name: "Carol".into(),
        }),
        idempotency_key: format!("cli-{approval_id}"),
        ..Default::default()
    }
}

/// An approval resolved while the worker was stopped, with more newer resolved approvals than
/// the correction pass after a snapshot looks at (50), still gets its message corrected: the
/// restarted worker resumes after its cursor and replays every event it missed. The approvals
/// created and cancelled meanwhile get no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_resolved_while_stopped_behind_60_newer_ones_is_corrected_after_a_restart() {
    let mut harness = Harness::start().await;
    let old = harness.request("old", "{}").await;
    let message = harness.request_message(0).await;
    harness.wait_for_delivery(&old.id).await;
    wait_for_cursor(&harness, 1).await;

    harness.kill_worker().await;
    harness
        .agent
        .decide(rejected_by_carol(&old.id))
        .await
        .expect("Decide");
    for n in 0..60 {
        let newer = harness.request(&format!("newer-{n}"), "{}").await;
        harness
            .agent
            .cancel_approval(&newer.id, "superseded")
            .await
            .expect("CancelApproval");
    }
    let head = head_seq(&harness).await;
    let sent_before = harness.sent_count();

    harness.start_worker();
    let corrected = harness
        .telegram
        .wait_for_message("the rejection", CHAT, message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(
        corrected.text.contains("Rejected by Carol (cli)")
            && corrected.text.contains("not during the freeze"),
        "{}",
        corrected.text
    );
    wait_for_cursor(&harness, head).await;
    assert_eq!(
        harness.sent_count(),
        sent_before,
        "no message for approvals cancelled before the worker saw them"
    );
}

/// The cursor never passes an event whose Telegram write has not finished, even when later
/// events are handled meanwhile: a request message whose sendMessage is unanswered when the
/// worker is killed is sent (and recorded) by the restarted worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cursor_never_passes_a_message_still_being_sent() {
    let mut harness = Harness::start().await;
    let first = harness.request("first", "{}").await;
    let first_message = harness.request_message(0).await;
    harness.wait_for_delivery(&first.id).await;

    harness
        .telegram
        .hold_answers("sendMessage", Duration::from_secs(3600));
    let held = harness.request("held", "{}").await;
    harness
        .telegram
        .wait_for_requests("the held send", |requests| {
            requests.iter().any(|r| {
                r.method == "sendMessage"
                    && r.callback_data().iter().any(|data| data.contains(&held.id))
            })
        })
        .await;
    // A later event of another approval is fully handled meanwhile.
    harness
        .agent
        .decide(rejected_by_carol(&first.id))
        .await
        .expect("Decide");
    harness
        .telegram
        .wait_for_message("the rejection", CHAT, first_message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    let head = head_seq(&harness).await;
    // Give a cursor that would pass the held send time to be written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let persisted = persisted_cursor(&harness).unwrap_or(0);
    assert!(
        persisted < head,
        "the cursor ({persisted}) passed the unfinished send (head {head})"
    );

    harness.kill_worker().await;
    harness.telegram.hold_answers("sendMessage", Duration::ZERO);
    harness.start_worker();
    let delivery = harness.wait_for_delivery(&held.id).await;
    let (_, message_id) = delivery.message_ref.split_once(':').expect("chat:message");
    let message = harness
        .telegram
        .message(CHAT, message_id.parse().expect("a message id"))
        .expect("the recorded message exists");
    assert!(
        message
            .callback_data()
            .iter()
            .any(|data| data.contains(&held.id)),
        "{message:?}"
    );
}
