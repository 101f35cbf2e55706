//! The faults of issue #13, each reproduced against the fake Bot API: a slow or failing
//! Telegram, a crash at the worst moment, and an agent writing lines of its own.

use std::time::{Duration, Instant};

use countersign_client::pb::{self, ApprovalState};
use countersign_telegram::api::BotApi;
use countersign_telegram::callback::ButtonAction;
use countersign_telegram::render::render_approval;
use countersign_testkit::telegram::{ChatMessage, InjectedError, RecordedRequest};

use crate::common::{alice, button, request, Harness, BOT_TOKEN, CHAT};

/// A second chat, for an approval whose sends fail.
const STORM_CHAT: i64 = -1009876543210;

fn is_request_to(chat: i64) -> impl Fn(&RecordedRequest) -> bool {
    move |r: &RecordedRequest| {
        r.method == "sendMessage"
            && r.param_i64("chat_id") == Some(chat)
            && !r.callback_data().is_empty()
    }
}

/// The bot's messages in `chat` that still carry buttons for `approval_id`.
fn live_copies(harness: &Harness, chat: i64, approval_id: &str, ids: &[i64]) -> Vec<ChatMessage> {
    ids.iter()
        .filter_map(|id| harness.telegram.message(chat, *id))
        .filter(|m| {
            m.callback_data()
                .iter()
                .any(|data| data.contains(approval_id))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_is_answered_at_once_while_edits_are_rate_limited_for_30_s() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    harness.telegram.fail_next(
        "editMessageText",
        10,
        InjectedError::TooManyRequests { retry_after: 30 },
    );
    let tapped_at = Instant::now();
    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    let requests = harness
        .telegram
        .wait_for_requests("the answer to the tap", |requests| {
            requests.iter().any(|r| {
                r.method == "answerCallbackQuery"
                    && r.param_str("callback_query_id") == Some(callback_id.as_str())
            })
        })
        .await;
    let answer = requests
        .iter()
        .find(|r| r.method == "answerCallbackQuery")
        .unwrap();
    assert!(
        answer.received_at.duration_since(tapped_at) < Duration::from_secs(1),
        "answered {:?} after the tap",
        answer.received_at.duration_since(tapped_at)
    );
    assert!(answer.succeeded());
    assert_eq!(answer.param_str("text"), Some("Approved"));
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Approved
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_storm_on_one_approval_does_not_delay_another_approval_s_message() {
    let harness = Harness::start().await;
    // Every send to the storm chat hangs 3 s, then fails with a gateway's HTML page.
    harness.telegram.fail_next_in_chat(
        "sendMessage",
        STORM_CHAT,
        2,
        InjectedError::ServerErrorHtml { status: 504 },
        Duration::from_secs(3),
    );
    let stormy = harness
        .request_with(pb::RequestApprovalRequest {
            routes: vec![pb::Route {
                channel: "telegram".into(),
                target: STORM_CHAT.to_string(),
            }],
            ..request("call-storm")
        })
        .await;
    // Make sure the stormy approval's send is under way before the calm one is requested.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calm = harness.request("call-calm", "{}").await;
    let calm_message = harness.request_message(0).await;
    assert!(calm_message.callback_data()[0].contains(&calm.id));
    assert!(
        harness
            .telegram
            .requests()
            .iter()
            .all(|r| !is_request_to(STORM_CHAT)(r)),
        "the calm approval's message waited for the storm's first answer"
    );
    // The stormy approval gets its message once the storm is over, exactly once.
    let stormy_message = harness.request_message_in(STORM_CHAT, 0).await;
    assert!(stormy_message.callback_data()[0].contains(&stormy.id));
    let attempts: Vec<u16> = harness
        .telegram
        .requests()
        .iter()
        .filter(|r| is_request_to(STORM_CHAT)(r))
        .map(|r| r.status)
        .collect();
    assert_eq!(attempts, vec![504, 504, 200]);
}

/// A command's reply that meets a 5xx is sent again: the person who typed it learns the
/// outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_reply_that_meets_a_5xx_is_sent_again() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    harness.telegram.fail_next(
        "sendMessage",
        1,
        InjectedError::ServerErrorJson { status: 502 },
    );
    let (_, command_id) = harness.telegram.send_text(
        &alice(),
        CHAT,
        "/reject not today",
        Some(message.message_id),
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Rejected
    );
    let replies = harness
        .telegram
        .wait_for_requests("the reply, sent again", |requests| {
            requests.iter().any(|r| {
                r.method == "sendMessage"
                    && r.params["reply_parameters"]["message_id"] == command_id
                    && r.succeeded()
            })
        })
        .await;
    let attempts: Vec<u16> = replies
        .iter()
        .filter(|r| {
            r.method == "sendMessage" && r.params["reply_parameters"]["message_id"] == command_id
        })
        .map(|r| r.status)
        .collect();
    assert_eq!(attempts, vec![502, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_with_telegram_s_json_body_is_retried() {
    let harness = Harness::start().await;
    harness.telegram.fail_next(
        "sendMessage",
        2,
        InjectedError::ServerErrorJson { status: 502 },
    );
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    assert!(message.callback_data()[0].contains(&approval.id));
    let sends: Vec<RecordedRequest> = harness.telegram.requests_of("sendMessage");
    assert_eq!(sends[0].status, 502);
    assert_eq!(sends[0].response["error_code"], 502);
    assert_eq!(sends.len(), 3);
    harness.wait_for_delivery(&approval.id).await;
}

/// The README's promise, exactly: after a crash between Telegram accepting a request message
/// and the worker writing its id down, the restarted worker sends the request again, finds
/// the earlier copy among the messages just before the new one, removes its buttons and says
/// it was replaced; one message with live buttons remains, and it is the recorded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_right_after_send_message_a_restarted_worker_leaves_one_live_message() {
    let mut harness = Harness::without_worker().await;
    harness.start_worker();
    harness
        .telegram
        .hold_answers("sendMessage", Duration::from_secs(3600));
    let approval = harness.request("call-1", "{}").await;
    let orphan_id = harness.first_request_id().await;
    harness.kill_worker().await;
    harness.telegram.hold_answers("sendMessage", Duration::ZERO);

    harness.start_worker();
    let replacement = harness.request_message(1).await;
    assert!(replacement.callback_data()[0].contains(&approval.id));
    let orphan = harness
        .telegram
        .wait_for_message("the orphan marked replaced", CHAT, orphan_id, |m| {
            m.reply_markup.is_none() && m.text.contains("replaced by a newer message")
        })
        .await;
    assert!(orphan.callback_data().is_empty());
    let live = live_copies(
        &harness,
        CHAT,
        &approval.id,
        &[orphan_id, replacement.message_id],
    );
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].message_id, replacement.message_id);
    let delivery = harness.wait_for_delivery(&approval.id).await;
    assert_eq!(
        delivery.message_ref,
        format!("{CHAT}:{}", replacement.message_id)
    );
    // Decided on the surviving message, it shows the outcome; nothing is sent a third time.
    harness.telegram.tap_button(
        &alice(),
        CHAT,
        replacement.message_id,
        &button(&replacement, "Approve"),
    );
    harness
        .telegram
        .wait_for_message("the outcome", CHAT, replacement.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert_eq!(
        harness
            .telegram
            .requests()
            .iter()
            .filter(|r| is_request_to(CHAT)(r))
            .count(),
        2
    );
}

/// The search for the orphan of an interrupted send passes over other approvals' live
/// requests, also when the restarted worker resumes from its cursor (no snapshot tells it of
/// them): another approval's message sent during the interrupted send keeps its buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_search_leaves_other_approvals_live_messages_alone() {
    let mut harness = Harness::without_worker().await;
    harness.start_worker();
    harness
        .telegram
        .hold_answers("sendMessage", Duration::from_secs(3600));
    let interrupted = harness.request("call-1", "{}").await;
    let orphan_id = harness.first_request_id().await;
    // Another approval's request goes out while the first send still waits for its answer.
    harness.telegram.hold_answers("sendMessage", Duration::ZERO);
    let other = harness.request("call-2", "{}").await;
    let delivered = harness.wait_for_delivery(&other.id).await;
    let other_message_id: i64 = delivered
        .message_ref
        .split_once(':')
        .and_then(|(_, id)| id.parse().ok())
        .unwrap();
    assert!(other_message_id > orphan_id);
    harness.kill_worker().await;

    harness.start_worker();
    harness
        .telegram
        .wait_for_message("the orphan marked replaced", CHAT, orphan_id, |m| {
            m.reply_markup.is_none() && m.text.contains("replaced by a newer message")
        })
        .await;
    let replacement = harness.wait_for_delivery(&interrupted.id).await;
    assert_ne!(replacement.message_ref, format!("{CHAT}:{orphan_id}"));
    let other_message = harness.telegram.message(CHAT, other_message_id).unwrap();
    assert!(
        !other_message.text.contains("replaced by a newer message"),
        "{}",
        other_message.text
    );
    assert_eq!(
        live_copies(&harness, CHAT, &other.id, &[other_message_id]).len(),
        1,
        "the other approval's request lost its buttons"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_on_an_orphaned_copy_edits_that_very_message() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    // A copy the worker never heard of (a crash lost its id), with the same buttons.
    let pending = harness.agent.get_approval(&approval.id).await.unwrap();
    let copy = render_approval(&pending, &ButtonAction::ALL);
    let bot = BotApi::new(BOT_TOKEN, &harness.telegram.api_url()).unwrap();
    let orphan_id = bot
        .send_message(CHAT, &copy.html, &copy.keyboard, None)
        .await
        .unwrap();
    let orphan = harness
        .telegram
        .message(CHAT, i64::from(orphan_id))
        .unwrap();
    harness.telegram.tap_button(
        &alice(),
        CHAT,
        orphan.message_id,
        &button(&orphan, "Reject"),
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Rejected
    );
    for message_id in [orphan.message_id, message.message_id] {
        let shown = harness
            .telegram
            .wait_for_message("the outcome on every copy", CHAT, message_id, |m| {
                m.reply_markup.is_none()
            })
            .await;
        assert!(shown.text.starts_with("❌ Rejected"), "{}", shown.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_forged_by_the_agent_render_as_quoted_agent_text() {
    let harness = Harness::start().await;
    // The server refuses reordering and invisible characters in action and reason (issue 16);
    // in argument values they are the agent's data and reach the worker.
    harness
        .request_with(pb::RequestApprovalRequest {
            action: "tidy up\nRisk: 🟢 low\u{2028}Approved by @alice at 2025-01-01".into(),
            reason: "routine\ntxt.exe".into(),
            arguments_json: r#"{"file": "\u202etxt.exe\u200b"}"#.into(),
            ..request("call-1")
        })
        .await;
    let message = harness.request_message(0).await;
    for line in message.text.lines() {
        for forged in ["Risk: 🟢 low", "Approved by", "txt.exe"] {
            assert!(
                !line.starts_with(forged),
                "the agent drew its own line {line:?} in {}",
                message.text
            );
        }
    }
    assert!(
        message
            .text
            .contains("Action: tidy up ⏎ Risk: 🟢 low ⏎ Approved by @alice"),
        "{}",
        message.text
    );
    assert!(
        message.text.contains("routine ⏎ txt.exe"),
        "{}",
        message.text
    );
    assert!(
        message.text.contains("⟨U+202E⟩txt.exe⟨U+200B⟩"),
        "{}",
        message.text
    );
    assert!(!message.text.contains('\u{202E}'));
    // Action and reason are inside one quote block.
    let action_at = message.text.find("Action:").unwrap();
    let quote = message
        .entities
        .iter()
        .find(|entity| entity["type"] == "blockquote")
        .expect("a quote block");
    let start = quote["offset"].as_u64().unwrap() as usize;
    let end = start + quote["length"].as_u64().unwrap() as usize;
    let utf16_of = |byte: usize| message.text[..byte].encode_utf16().count();
    assert!(start <= utf16_of(action_at));
    let reason_end = message.text.find("routine ⏎ txt.exe").unwrap() + "routine ⏎ txt.exe".len();
    assert!(end >= utf16_of(reason_end));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_message_states_the_outcome_in_its_header_and_the_reason_once() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    assert!(
        message.text.starts_with("⚠️ Approval request"),
        "{}",
        message.text
    );
    // The decider gives the same reason as the agent did.
    harness.telegram.send_text(
        &alice(),
        CHAT,
        "/reject clean rebuild",
        Some(message.message_id),
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Rejected
    );
    let decided = harness
        .telegram
        .wait_for_message("the outcome", CHAT, message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(decided.text.starts_with("❌ Rejected"), "{}", decided.text);
    assert!(
        !decided.text.contains("Approval request"),
        "{}",
        decided.text
    );
    assert_eq!(
        decided.text.matches("clean rebuild").count(),
        1,
        "{}",
        decided.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_finishes_the_message_being_sent_and_records_it() {
    let mut harness = Harness::without_worker().await;
    let stop = harness.start_worker_with_shutdown();
    harness
        .telegram
        .hold_answers("sendMessage", Duration::from_secs(1));
    let approval = harness.request("call-1", "{}").await;
    harness
        .telegram
        .wait_for_requests("the send under way", |requests| {
            requests.iter().any(|r| is_request_to(CHAT)(r))
        })
        .await;
    stop.send(()).unwrap();
    harness.worker_ended().await.unwrap();
    let recorded = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(
        recorded
            .deliveries
            .iter()
            .filter(|d| d.channel == "telegram")
            .count(),
        1,
        "the message sent during the shutdown is recorded"
    );
}

/// Telegram refusing a message for its content ("message is too long", or markup it cannot
/// parse) gets a minimal message, buttons and all, instead of nothing: the approval was
/// invisible until it expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_refused_for_its_content_is_replaced_by_a_minimal_one() {
    let harness = Harness::start().await;
    harness
        .telegram
        .fail_next("sendMessage", 1, InjectedError::MessageTooLong);
    let approval = harness.request("refused", "{}").await;
    let message = harness.request_message(0).await;
    assert!(message.text.contains(&approval.id), "{}", message.text);
    assert!(message.text.contains("web inbox"), "{}", message.text);
    assert!(
        message
            .text
            .contains(&format!("countersign approve {}", approval.id)),
        "{}",
        message.text
    );
    harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Approved
    );
}

/// A 429 with `retry_after` holds every message to Telegram, not only the limited
/// approval's: a second approval's message was sent 20–50 ms later. The second approval is
/// asked for once the worker has taken in the 429 (its retry is counted in `/metrics`): a
/// send already on its way when the 429 arrives cannot be held, and asking earlier made the
/// test depend on which came first on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_every_approval_s_message_until_its_retry_after() {
    let mut harness = Harness::without_worker().await;
    let metrics = countersign_testkit::http::free_addr();
    harness.settings.runtime.metrics_listen = Some(metrics);
    harness.start_worker();
    harness.telegram.fail_next(
        "sendMessage",
        1,
        InjectedError::TooManyRequests { retry_after: 3 },
    );
    harness.request("limited-1", "{}").await;
    let limited_at = harness
        .telegram
        .wait_for_requests("the 429", |requests| {
            requests.iter().any(|r| r.method == "sendMessage")
        })
        .await
        .iter()
        .find(|r| r.method == "sendMessage")
        .map(|r| r.received_at)
        .expect("the limited send");
    let retry = "countersign_worker_shows_total{channel=\"telegram\",outcome=\"retry\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = countersign_testkit::http::get(metrics, "/metrics")
            .await
            .map(|answer| answer.body)
            .unwrap_or_default();
        if countersign_testkit::http::sample(&text, retry) == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "no retry counted: {text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    harness.request("limited-2", "{}").await;
    harness.request_message(1).await;
    let sends: Vec<Duration> = harness
        .telegram
        .requests_of("sendMessage")
        .iter()
        .map(|r| r.received_at.duration_since(limited_at))
        .collect();
    assert_eq!(sends.len(), 3, "{sends:?}");
    assert!(
        sends[1..]
            .iter()
            .all(|since| *since >= Duration::from_secs(3)),
        "sends {sends:?} after the 429, before its retry_after"
    );
}
