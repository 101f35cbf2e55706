//! Approver groups on Telegram, with the worked example of docs/configuration.md as the
//! server's configuration: the request goes to its group's chat, shows the quorum progress,
//! a non-member's tap is refused, the reminder replies to the first message, and the
//! escalation brings the approval to the on-call chat where its member decides.

use countersign_client::groups::quorum;
use countersign_client::pb::{self, ApprovalState};
use countersign_testkit::telegram::{RecordedRequest, TestUser};

use crate::common::*;

/// Chats of the example's groups.
const SECURITY_CHAT: i64 = -100200300;
const ONCALL_CHAT: i64 = -100900900;

fn member(id: i64, name: &str) -> TestUser {
    TestUser::new(id, name, Some(&name.to_lowercase()))
}

async fn answer_text(harness: &Harness, callback_id: &str) -> String {
    let requests = harness
        .telegram
        .wait_for_requests("the answer to a callback query", |requests| {
            requests.iter().any(|r| {
                r.method == "answerCallbackQuery"
                    && r.param_str("callback_query_id") == Some(callback_id)
            })
        })
        .await;
    requests
        .iter()
        .find(|r| {
            r.method == "answerCallbackQuery"
                && r.param_str("callback_query_id") == Some(callback_id)
        })
        .and_then(|r| r.param_str("text"))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_approval_is_routed_reminded_escalated_and_decided_by_members() {
    let mut harness =
        Harness::without_worker_with_server_toml(countersign_testkit::docs::groups_example()).await;
    // The server decides who may decide; the worker lets every tap through to it.
    harness.settings.allowed_user_ids = Vec::new();
    harness.start_worker();
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            routes: Vec::new(),
            approver_groups: vec![quorum("security", 2)],
            follow_up: Some(pb::FollowUp {
                remind_after_seconds: 1,
                escalate_after_seconds: 2,
                escalate_to: "oncall".into(),
                ..Default::default()
            }),
            ..request("g-1")
        })
        .await;

    // Routed to the security group's chat, not the worker's default chat.
    let message = harness.request_message_in(SECURITY_CHAT, 0).await;
    assert!(
        message.text.contains("0 of 2 from security"),
        "{}",
        message.text
    );

    // erin is on call, not in security: the server refuses her tap and nothing changes.
    let erin = member(1005, "Erin");
    let approve = button(&message, "Approve");
    let (_, refused) =
        harness
            .telegram
            .tap_button(&erin, SECURITY_CHAT, message.message_id, &approve);
    let refusal = answer_text(&harness, &refused).await;
    assert!(
        refusal.starts_with("Not allowed: approver erin")
            && refusal.contains("is not a member of security"),
        "{refusal}"
    );
    assert!(refusal.chars().count() <= 200, "{refusal}");
    let alice = member(1001, "Alice");
    let (_, accepted) =
        harness
            .telegram
            .tap_button(&alice, SECURITY_CHAT, message.message_id, &approve);
    answer_text(&harness, &accepted).await;
    harness
        .telegram
        .wait_for_message("the progress", SECURITY_CHAT, message.message_id, |m| {
            m.text.contains("1 of 2 from security")
        })
        .await;

    // The reminder replies to the request message.
    let is_reminder = |r: &RecordedRequest| {
        r.method == "sendMessage"
            && r.succeeded()
            && r.param_i64("chat_id") == Some(SECURITY_CHAT)
            && r.param_str("text").is_some_and(|t| t.contains("Reminder"))
    };
    let requests = harness
        .telegram
        .wait_for_requests("a reminder", |requests| requests.iter().any(is_reminder))
        .await;
    let reminder_id = requests
        .iter()
        .find(|r| is_reminder(r))
        .and_then(RecordedRequest::result_message_id)
        .unwrap();
    let reminder = harness
        .telegram
        .message(SECURITY_CHAT, reminder_id)
        .unwrap();
    assert_eq!(reminder.reply_to_message_id, Some(message.message_id));
    // It says what is missing as the progress beside it shows it: alice's approval, when it
    // came first, is never "no decision from security".
    let missing = if reminder.text.contains("1 of 2 from security") {
        "only 1 of 2 approvals from security"
    } else {
        "no decision from security"
    };
    assert!(
        reminder.text.contains(&format!("Reminder: {missing}")),
        "{}",
        reminder.text
    );

    // Escalated: the on-call chat gets the request, and erin may now decide there.
    let oncall = harness.request_message_in(ONCALL_CHAT, 0).await;
    assert!(
        oncall.text.contains("escalated to oncall"),
        "{}",
        oncall.text
    );
    let (_, decided) = harness.telegram.tap_button(
        &erin,
        ONCALL_CHAT,
        oncall.message_id,
        &button(&oncall, "Approve"),
    );
    answer_text(&harness, &decided).await;
    let done = harness.agent_waits(&approval.id).await;
    assert_eq!(done.state(), ApprovalState::Approved);
    let shown = harness
        .telegram
        .wait_for_message("the outcome", SECURITY_CHAT, message.message_id, |m| {
            m.text.contains("Approved")
        })
        .await;
    assert!(
        shown.text.contains("2 of 2 from security"),
        "{}",
        shown.text
    );
    assert!(shown.callback_data().is_empty(), "buttons removed");
}

/// An approval with no routes goes to the default chat; once escalated it also reaches the
/// escalation group's chat, although its routes cannot name "every channel" beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrouted_approval_reaches_the_escalation_chat_when_escalated() {
    let mut harness =
        Harness::without_worker_with_server_toml(countersign_testkit::docs::groups_example()).await;
    harness.settings.allowed_user_ids = Vec::new();
    harness.start_worker();
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            routes: Vec::new(),
            follow_up: Some(pb::FollowUp {
                escalate_after_seconds: 1,
                escalate_to: "oncall".into(),
                ..Default::default()
            }),
            ..request("u-1")
        })
        .await;
    assert!(approval.routes.is_empty(), "{:?}", approval.routes);
    let first = harness.request_message(0).await;
    assert!(first.callback_data()[0].contains(&approval.id));
    let escalated = harness.request_message_in(ONCALL_CHAT, 0).await;
    assert!(escalated.callback_data()[0].contains(&approval.id));
}
