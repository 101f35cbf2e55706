//! The worker through its library entry point, against a real server and the fake Bot API.

use std::time::Duration;

use crate::common::{alice, bob, button, mallory, request, Harness, BOT_TOKEN, CHAT};
use countersign_client::pb::{self, ApprovalState, ResolvedBy, Scope, Verdict};
use countersign_testkit::telegram::{ChatMessage, InjectedError, RecordedRequest, MAX_TEXT_UTF16};

/// The answers to one callback query, in order.
fn answers_to(harness: &Harness, callback_id: &str) -> Vec<RecordedRequest> {
    harness
        .telegram
        .requests_of("answerCallbackQuery")
        .into_iter()
        .filter(|request| request.param_str("callback_query_id") == Some(callback_id))
        .collect()
}

async fn wait_for_answer(harness: &Harness, callback_id: &str, nth: usize) -> RecordedRequest {
    harness
        .telegram
        .wait_for_requests("the answer to a callback query", |requests| {
            requests
                .iter()
                .filter(|request| {
                    request.method == "answerCallbackQuery"
                        && request.param_str("callback_query_id") == Some(callback_id)
                })
                .count()
                > nth
        })
        .await;
    answers_to(harness, callback_id).remove(nth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_becomes_one_message_and_a_tap_approves_it() {
    let harness = Harness::start().await;
    let approval = harness
        .request("call-1", r#"{"command":"rm -rf build/"}"#)
        .await;

    let message = harness.request_message(0).await;
    assert_eq!(
        message.button_texts(),
        vec!["✅ Approve", "❌ Reject", "🔓 Allow for session"]
    );
    assert!(message
        .callback_data()
        .iter()
        .all(|data| data.contains(&approval.id) && data.len() <= 64));
    for expected in [
        "Approval request",
        "bash",
        "delete the build directory",
        "clean rebuild",
        "HIGH",
        "coder-1",
        "session-7",
        "dev@example.com",
        "\"command\": \"rm -rf build/\"",
        &approval.args_digest[..12],
        "Waiting for a decision",
    ] {
        assert!(
            message.text.contains(expected),
            "{expected:?} not in {}",
            message.text
        );
    }
    let sent = harness.telegram.requests_of("sendMessage");
    assert_eq!(sent[0].param_str("parse_mode"), Some("HTML"));

    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    let decided = harness.agent_waits(&approval.id).await;
    assert_eq!(decided.state(), ApprovalState::Approved);
    let resolution = decided.resolution.expect("a resolution");
    assert_eq!(resolution.resolved_by(), ResolvedBy::Decision);
    assert_eq!(resolution.deciders.len(), 1);
    assert_eq!(resolution.deciders[0].channel, "telegram");
    assert_eq!(resolution.deciders[0].user_id, alice().id.to_string());
    assert_eq!(resolution.deciders[0].display_name, "@alice");
    assert_eq!(
        decided.decisions[0].idempotency_key,
        format!("telegram:callback:{callback_id}")
    );

    let answer = wait_for_answer(&harness, &callback_id, 0).await;
    assert!(answer.succeeded());
    assert_eq!(answer.param_str("text"), Some("Approved"));

    let edited = harness
        .telegram
        .wait_for_message(
            "the message to show the approval",
            CHAT,
            message.message_id,
            |m| m.reply_markup.is_none(),
        )
        .await;
    assert!(
        edited.text.contains("Approved by @alice at "),
        "{}",
        edited.text
    );
    assert!(edited.text.contains("delete the build directory"));
    assert_eq!(harness.sent_count(), 1, "exactly one message per approval");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_for_session_creates_a_grant_for_later_calls() {
    let harness = Harness::start().await;
    let first = harness.request("call-1", r#"{"command":"ls"}"#).await;
    let message = harness.request_message(0).await;
    let (_, callback_id) = harness.telegram.tap_button(
        &bob(),
        CHAT,
        message.message_id,
        &button(&message, "Allow for session"),
    );
    let decided = harness.agent_waits(&first.id).await;
    assert_eq!(decided.state(), ApprovalState::Approved);
    assert_eq!(decided.decisions[0].scope(), Scope::Session);
    assert_eq!(
        wait_for_answer(&harness, &callback_id, 0)
            .await
            .param_str("text"),
        Some("Approved for this session")
    );
    let edited = harness
        .telegram
        .wait_for_message("the session approval", CHAT, message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(
        edited.text.contains("Approved by @bob for this session"),
        "{}",
        edited.text
    );

    // The same tool in the same session is now approved by the grant, without a request
    // message: a short notice (no buttons) tells the approvers the grant was used.
    let later = harness.request("call-2", r#"{"command":"ls -la"}"#).await;
    assert_eq!(later.state(), ApprovalState::Approved);
    let resolution = later.resolution.expect("a resolution");
    assert_eq!(resolution.resolved_by(), ResolvedBy::Grant);
    assert!(!resolution.grant_id.is_empty());
    let is_notice = |r: &RecordedRequest| {
        r.method == "sendMessage"
            && r.succeeded()
            && r.param_str("text")
                .is_some_and(|t| t.contains("session grant"))
    };
    let requests = harness
        .telegram
        .wait_for_requests("the notice of the grant's use", |requests| {
            requests.iter().any(is_notice)
        })
        .await;
    let notice = requests.iter().find(|r| is_notice(r)).unwrap();
    let shown = harness
        .telegram
        .message(CHAT, notice.result_message_id().unwrap())
        .unwrap();
    assert!(shown.reply_markup.is_none());
    assert!(
        shown.text.contains("Approved by a session grant"),
        "{}",
        shown.text
    );
    assert!(
        shown.text.contains(&later.id[later.id.len() - 8..]),
        "{}",
        shown.text
    );
    // Another tool still needs a human: its message is the second one the bot sends.
    let other = harness
        .request_with(pb::RequestApprovalRequest {
            tool_name: "deploy".into(),
            ..request("call-3")
        })
        .await;
    let second = harness.request_message(1).await;
    assert!(second.callback_data()[0].contains(&other.id));
    assert_eq!(
        harness.sent_count(),
        3,
        "two request messages and the grant's notice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taps_that_are_not_allowed_or_malformed_change_nothing() {
    let harness = Harness::start().await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;

    let (_, refused) = harness.telegram.tap_button(
        &mallory(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    assert_eq!(
        wait_for_answer(&harness, &refused, 0)
            .await
            .param_str("text"),
        Some("Not allowed")
    );
    // Data a client could forge: another version, an unknown action, a bad id, garbage.
    for data in [
        format!("cs2:a:{}", approval.id),
        format!("cs1:x:{}", approval.id),
        "cs1:a:not-an-id".to_owned(),
        "Hello world!".to_owned(),
    ] {
        let (_, callback_id) =
            harness
                .telegram
                .tap_button(&alice(), CHAT, message.message_id, &data);
        assert_eq!(
            wait_for_answer(&harness, &callback_id, 0)
                .await
                .param_str("text"),
            Some("Unknown or outdated button"),
            "{data}"
        );
    }

    let unchanged = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(unchanged.state(), ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());
    let shown = harness.telegram.message(CHAT, message.message_id).unwrap();
    assert_eq!(shown.edit_count, 0);
    assert_eq!(shown.button_texts().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_the_servers_approver_registry_refuses_changes_nothing() {
    // Both are on the worker's allowlist; only Alice is an approver on the server.
    let harness = Harness::start_with_server_toml(&format!(
        "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = {{ telegram = [\"{}\"] }}\n",
        alice().id
    ))
    .await;
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;

    let (_, refused) = harness.telegram.tap_button(
        &bob(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    let answer = wait_for_answer(&harness, &refused, 0).await;
    let refusal = answer.param_str("text").unwrap_or_default();
    assert!(
        refusal.starts_with("Not allowed: ") && refusal.contains("not a registered approver"),
        "{refusal}"
    );
    let unchanged = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(unchanged.state(), ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());
    assert_eq!(
        harness
            .telegram
            .message(CHAT, message.message_id)
            .unwrap()
            .button_texts()
            .len(),
        3
    );

    let (_, accepted) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    assert_eq!(
        wait_for_answer(&harness, &accepted, 0)
            .await
            .param_str("text"),
        Some("Approved")
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Approved
    );
}

/// Edit-on-approve elsewhere: the message shows the edited arguments and who edited them, and
/// its Approve button names that version. A tap on the message as it was before the edit
/// decides nothing; a tap on the updated message approves the edited version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_made_elsewhere_is_shown_and_a_tap_approves_only_the_version_shown() {
    let harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            required_approvals: 2,
            ..request("call-edit")
        })
        .await;
    let before = harness.request_message(0).await;
    let stale_approve = button(&before, "Approve");
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: approval.id.clone(),
            verdict: Verdict::Approve.into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "carol".into(),
                display_name: "<b>Carol</b>".into(),
            }),
            idempotency_key: "cli-edit".into(),
            edited_arguments_json: r#"{"command":"rm -rf build/<tmp>"}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let shown = harness
        .telegram
        .wait_for_message("the edit to be shown", CHAT, before.message_id, |m| {
            m.text.contains("Arguments edited by")
        })
        .await;
    assert!(shown.text.contains("<b>Carol</b> (cli)"), "{}", shown.text);
    assert!(shown.text.contains("rm -rf build/<tmp>"), "{}", shown.text);
    assert!(
        shown.text.contains("Waiting: 1 of 2 approvals"),
        "{}",
        shown.text
    );
    assert_eq!(
        shown.button_texts(),
        vec!["✅ Approve", "❌ Reject"],
        "no session grant for an edit"
    );

    // The button as it was before the edit names no version: refused, nothing changes.
    let (_, stale_tap) =
        harness
            .telegram
            .tap_button(&alice(), CHAT, before.message_id, &stale_approve);
    let answer = wait_for_answer(&harness, &stale_tap, 0).await;
    assert!(
        answer
            .param_str("text")
            .unwrap_or_default()
            .contains("arguments were edited"),
        "{answer:?}"
    );
    assert_eq!(
        harness
            .agent
            .get_approval(&approval.id)
            .await
            .unwrap()
            .decisions
            .len(),
        1
    );

    let (_, tap) =
        harness
            .telegram
            .tap_button(&alice(), CHAT, shown.message_id, &button(&shown, "Approve"));
    let decided = harness.agent_waits(&approval.id).await;
    assert_eq!(decided.state(), ApprovalState::Approved);
    assert_eq!(
        decided.decisions[1].args_digest, decided.edited_args_digest,
        "the tap approved the edited version"
    );
    assert!(wait_for_answer(&harness, &tap, 0).await.succeeded());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_follow_decisions_elsewhere_expiry_and_cancellation() {
    let harness = Harness::start().await;
    let decided_elsewhere = harness.request("call-1", "{}").await;
    let cancelled = harness.request("call-2", "{}").await;
    let expiring = harness
        .request_with(pb::RequestApprovalRequest {
            ttl_seconds: 1,
            ..request("call-3")
        })
        .await;
    let mut messages = Vec::new();
    for nth in 0..3 {
        messages.push(harness.request_message(nth).await);
    }
    let message_of = |approval: &pb::Approval| message_id_of(&messages, approval);

    // Decided through another channel (the CLI uses the same Decide call).
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: decided_elsewhere.id.clone(),
            verdict: Verdict::Reject.into(),
            reason: "not during the freeze".into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "carol".into(),
                display_name: "Carol".into(),
            }),
            idempotency_key: "cli-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    harness
        .agent
        .cancel_approval(&cancelled.id, "the agent found another way")
        .await
        .unwrap();

    shown_resolved(
        &harness,
        "the rejection from the CLI",
        message_of(&decided_elsewhere),
        &["Rejected by Carol (cli)", "not during the freeze"],
    )
    .await;
    shown_resolved(
        &harness,
        "the cancellation",
        message_of(&cancelled),
        &["Cancelled", "the agent found another way"],
    )
    .await;
    let expired = harness
        .telegram
        .wait_for_message("the expiry", CHAT, message_of(&expiring), |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(expired.text.contains("Expired"), "{}", expired.text);
    assert_eq!(
        harness.agent_waits(&expiring.id).await.state(),
        ApprovalState::Expired
    );

    // A tap on a message of an approval that is no longer pending says who won.
    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message_of(&decided_elsewhere),
        &format!("cs1:a:{}", decided_elsewhere.id),
    );
    assert_eq!(
        wait_for_answer(&harness, &callback_id, 0)
            .await
            .param_str("text"),
        Some("Already rejected by Carol (cli)")
    );
    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message_of(&expiring),
        &format!("cs1:a:{}", expiring.id),
    );
    assert_eq!(
        wait_for_answer(&harness, &callback_id, 0)
            .await
            .param_str("text"),
        Some("Expired")
    );
    assert_eq!(harness.sent_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_and_approve_commands_as_replies_decide_with_the_reason() {
    let harness = Harness::start().await;
    let to_reject = harness.request("call-1", "{}").await;
    let to_approve = harness.request("call-2", "{}").await;
    let first = harness.request_message(0).await;
    let second = harness.request_message(1).await;
    let (reject_message, approve_message) = if first.callback_data()[0].contains(&to_reject.id) {
        (first, second)
    } else {
        (second, first)
    };

    let (_, command_id) = harness.telegram.send_text(
        &bob(),
        CHAT,
        "/reject touches production <prod> & staging",
        Some(reject_message.message_id),
    );
    let rejected = harness.agent_waits(&to_reject.id).await;
    assert_eq!(rejected.state(), ApprovalState::Rejected);
    assert_eq!(
        rejected.decisions[0].reason,
        "touches production <prod> & staging"
    );
    assert_eq!(
        rejected.decisions[0].decider.as_ref().unwrap().display_name,
        "@bob"
    );
    let shown = harness
        .telegram
        .wait_for_message("the rejection", CHAT, reject_message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(shown.text.contains("Rejected by @bob"), "{}", shown.text);
    assert!(
        shown.text.contains("touches production <prod> & staging"),
        "{}",
        shown.text
    );
    let replies = harness
        .telegram
        .wait_for_requests("the reply to the command", |requests| {
            requests.iter().any(|r| {
                r.method == "sendMessage"
                    && r.params["reply_parameters"]["message_id"] == command_id
            })
        })
        .await;
    let reply = replies
        .iter()
        .find(|r| r.params["reply_parameters"]["message_id"] == command_id)
        .unwrap();
    assert_eq!(reply.param_str("text"), Some("Rejected"));

    harness.telegram.send_text(
        &alice(),
        CHAT,
        "/approve@SomeBot",
        Some(approve_message.message_id),
    );
    assert_eq!(
        harness.agent_waits(&to_approve.id).await.state(),
        ApprovalState::Approved
    );

    // A command from someone not allowed, on a pending approval, is refused.
    let third = harness.request("call-3", "{}").await;
    let message = harness.request_message(2).await;
    let (_, refused_id) =
        harness
            .telegram
            .send_text(&mallory(), CHAT, "/approve", Some(message.message_id));
    harness
        .telegram
        .wait_for_requests("the refusal", |requests| {
            requests.iter().any(|r| {
                r.method == "sendMessage"
                    && r.params["reply_parameters"]["message_id"] == refused_id
                    && r.param_str("text") == Some("Not allowed")
            })
        })
        .await;
    let still = harness.agent.get_approval(&third.id).await.unwrap();
    assert_eq!(still.state(), ApprovalState::Pending);
    assert!(still.decisions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_edits_its_message_and_a_redelivered_tap_decides_once() {
    let mut harness = Harness::start().await;
    let approval = harness
        .request_with(pb::RequestApprovalRequest {
            required_approvals: 2,
            ..request("call-1")
        })
        .await;
    let message = harness.request_message(0).await;
    assert!(
        message.text.contains("0 of 2 approvals"),
        "{}",
        message.text
    );
    let delivery = harness.wait_for_delivery(&approval.id).await;
    assert_eq!(
        delivery.message_ref,
        format!("{CHAT}:{}", message.message_id)
    );

    // Killed and restarted between the request and the tap, without its watch cursor (a lost
    // state directory): the watch starts with a snapshot.
    harness.kill_worker().await;
    forget_cursor(&harness).await;
    let edits_before = harness.telegram.requests_of("editMessageText").len();
    harness.start_worker();
    // The new worker finds its message in the delivery record and re-renders it in place:
    // Telegram says "not modified", which is success.
    let edits = harness
        .telegram
        .wait_for_requests("the restarted worker to re-attach", |requests| {
            requests
                .iter()
                .filter(|r| r.method == "editMessageText")
                .count()
                > edits_before
        })
        .await;
    let reattach = edits
        .iter()
        .filter(|r| r.method == "editMessageText")
        .nth(edits_before)
        .unwrap();
    assert_eq!(reattach.param_i64("message_id"), Some(message.message_id));
    assert!(reattach
        .error()
        .unwrap_or_default()
        .contains("message is not modified"));

    // The tap on the old message works with the new worker. Telegram holds the answer to it,
    // so the worker is still handling that update when it is killed below, and has not
    // confirmed it (its next poll's offset would).
    harness
        .telegram
        .hold_answers("answerCallbackQuery", Duration::from_secs(3600));
    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    assert_eq!(
        wait_for_answer(&harness, &callback_id, 0)
            .await
            .param_str("text"),
        Some("Approval recorded: 1 of 2")
    );
    let progress = harness
        .telegram
        .wait_for_message("the progress", CHAT, message.message_id, |m| {
            m.text.contains("1 of 2 approvals (by @alice)")
        })
        .await;
    assert_eq!(
        progress.button_texts().len(),
        3,
        "buttons stay until the quorum is met"
    );

    // A crash before the update was confirmed: Telegram delivers the same tap again.
    harness.kill_worker().await;
    harness
        .telegram
        .hold_answers("answerCallbackQuery", Duration::ZERO);
    harness.start_worker();
    let again = wait_for_answer(&harness, &callback_id, 1).await;
    assert!(
        !again.succeeded(),
        "Telegram refuses a second answer to one query"
    );
    let after = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(after.state(), ApprovalState::Pending);
    assert_eq!(
        after.decisions.len(),
        1,
        "the re-delivered tap decided once"
    );

    let (_, bob_callback) = harness.telegram.tap_button(
        &bob(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    assert_eq!(
        wait_for_answer(&harness, &bob_callback, 0)
            .await
            .param_str("text"),
        Some("Approved")
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Approved
    );
    let done = harness
        .telegram
        .wait_for_message("the approval", CHAT, message.message_id, |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(
        done.text.contains("Approved by @alice, @bob"),
        "{}",
        done.text
    );
    assert_eq!(harness.sent_count(), 1, "no second message across restarts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_resolved_while_the_worker_was_down_are_shown_resolved_after_a_restart() {
    let mut harness = Harness::start().await;
    let decided_elsewhere = harness.request("call-1", "{}").await;
    let cancelled = harness.request("call-2", "{}").await;
    let decided_before = harness.request("call-4", "{}").await;
    let mut messages = Vec::new();
    for (nth, approval) in [&decided_elsewhere, &cancelled, &decided_before]
        .into_iter()
        .enumerate()
    {
        messages.push(harness.request_message(nth).await);
        harness.wait_for_delivery(&approval.id).await;
    }
    // One approval is decided, and its message made final, while the worker runs.
    let decided_before_message = message_id_of(&messages, &decided_before);
    harness.telegram.tap_button(
        &alice(),
        CHAT,
        decided_before_message,
        &format!("cs1:r:{}", decided_before.id),
    );
    let final_before = harness
        .telegram
        .wait_for_message("the rejection", CHAT, decided_before_message, |m| {
            m.reply_markup.is_none()
        })
        .await;
    // Still pending when the worker is stopped, expired soon after: asked last, just before
    // the stop, so that a slow machine cannot let it expire while the worker still runs.
    let expiring = harness
        .request_with(pb::RequestApprovalRequest {
            ttl_seconds: 5,
            ..request("call-3")
        })
        .await;
    messages.push(harness.request_message(3).await);
    harness.wait_for_delivery(&expiring.id).await;
    let message_of = |approval: &pb::Approval| message_id_of(&messages, approval);

    harness.kill_worker().await;
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: decided_elsewhere.id.clone(),
            verdict: Verdict::Reject.into(),
            reason: "not during the freeze".into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "carol".into(),
                display_name: "Carol".into(),
            }),
            idempotency_key: "cli-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    harness
        .agent
        .cancel_approval(&cancelled.id, "the agent found another way")
        .await
        .unwrap();
    assert_eq!(
        harness.agent_waits(&expiring.id).await.state(),
        ApprovalState::Expired
    );
    for approval in [&decided_elsewhere, &cancelled, &expiring] {
        let stale = harness
            .telegram
            .message(CHAT, message_of(approval))
            .unwrap();
        assert_eq!(
            stale.button_texts().len(),
            3,
            "resolved only after the worker was stopped: {stale:?}"
        );
    }

    // The fake shows an edit a moment before it records it: count once all are recorded.
    harness.telegram.settled().await;
    let sent_before = harness.sent_count();
    let edits_before = harness.telegram.requests_of("editMessageText").len();
    // Without its watch cursor (lost, or older than the server retains) the worker takes a
    // snapshot and corrects the most recently resolved approvals; the cursor's own path is
    // in tests/e2e/cursor.rs.
    forget_cursor(&harness).await;
    harness.start_worker();
    shown_resolved(
        &harness,
        "the rejection from the CLI",
        message_of(&decided_elsewhere),
        &["Rejected by Carol (cli)", "not during the freeze"],
    )
    .await;
    shown_resolved(
        &harness,
        "the cancellation",
        message_of(&cancelled),
        &["Cancelled", "the agent found another way"],
    )
    .await;
    let expired = harness
        .telegram
        .wait_for_message("the expiry", CHAT, message_of(&expiring), |m| {
            m.reply_markup.is_none()
        })
        .await;
    assert!(expired.text.contains("Expired"), "{}", expired.text);
    // The message that was final already costs one edit, which Telegram answers "not
    // modified", and stays as it was.
    let is_edit_of = |request: &RecordedRequest, approval: &pb::Approval| {
        request.method == "editMessageText"
            && request.param_i64("message_id") == Some(message_of(approval))
    };
    let requests = harness
        .telegram
        .wait_for_requests("the re-edit of the final message", |requests| {
            requests
                .iter()
                .filter(|r| r.method == "editMessageText")
                .skip(edits_before)
                .any(|r| is_edit_of(r, &decided_before))
        })
        .await;
    let re_edits: Vec<&RecordedRequest> = requests
        .iter()
        .filter(|r| r.method == "editMessageText")
        .skip(edits_before)
        .filter(|r| is_edit_of(r, &decided_before))
        .collect();
    assert_eq!(re_edits.len(), 1, "{re_edits:#?}");
    assert!(re_edits[0]
        .error()
        .unwrap_or_default()
        .contains("message is not modified"));
    assert_eq!(
        harness.telegram.message(CHAT, message_of(&decided_before)),
        Some(final_before)
    );
    assert_eq!(
        harness.sent_count(),
        sent_before,
        "no new message for a resolved approval"
    );

    // Restarted once more, with a message Telegram no longer lets the bot edit: the worker
    // cannot know whether an earlier run replied already, so it does not reply at each start.
    harness.kill_worker().await;
    harness.telegram.settled().await;
    let edits_before = harness.telegram.requests_of("editMessageText").len();
    harness
        .telegram
        .fail_next("editMessageText", 1, InjectedError::MessageCantBeEdited);
    forget_cursor(&harness).await;
    harness.start_worker();
    let requests = harness
        .telegram
        .wait_for_requests("the re-edits of the four resolved messages", |requests| {
            requests
                .iter()
                .filter(|r| r.method == "editMessageText")
                .count()
                >= edits_before + messages.len()
        })
        .await;
    let re_edits: Vec<&RecordedRequest> = requests
        .iter()
        .filter(|r| r.method == "editMessageText")
        .skip(edits_before)
        .collect();
    // The fake records a call when it answers, so under load the refused edit need not be
    // the first recorded.
    let (refused, unchanged): (Vec<&RecordedRequest>, Vec<&RecordedRequest>) =
        re_edits.iter().partition(|re_edit| {
            re_edit
                .error()
                .unwrap_or_default()
                .contains("message can't be edited")
        });
    assert_eq!(refused.len(), 1, "{re_edits:#?}");
    for re_edit in unchanged {
        let message_id = re_edit.param_i64("message_id").unwrap_or_default();
        // Every edit of that message, to tell which run wrote the text this one changed.
        let history: Vec<(u16, String, String)> = harness
            .telegram
            .requests_of("editMessageText")
            .into_iter()
            .filter(|r| r.param_i64("message_id") == Some(message_id))
            .map(|r| {
                let text = r.params["text"].as_str().unwrap_or_default().to_owned();
                (r.status, text, r.error().unwrap_or_default().to_owned())
            })
            .collect();
        assert!(
            re_edit
                .error()
                .unwrap_or_default()
                .contains("message is not modified"),
            "{re_edit:#?}\nevery edit of message {message_id} (status, text, error), {edits_before} edits before this start: {history:#?}"
        );
    }
    // A reply would have gone out right after the refused edit, before the next one.
    assert_eq!(
        harness.sent_count(),
        sent_before,
        "no reply for a message whose state the restarted worker cannot know"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_limits_are_honoured_for_sends_and_edits() {
    let harness = Harness::start().await;
    harness.telegram.fail_next(
        "sendMessage",
        1,
        InjectedError::TooManyRequests { retry_after: 1 },
    );
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    let sends = harness.telegram.requests_of("sendMessage");
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0].status, 429);
    assert!(sends[1].received_at - sends[0].received_at >= Duration::from_secs(1));

    harness.telegram.fail_next(
        "editMessageText",
        1,
        InjectedError::TooManyRequests { retry_after: 1 },
    );
    harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Reject"),
    );
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Rejected
    );
    harness
        .telegram
        .wait_for_message(
            "the edit after the flood wait",
            CHAT,
            message.message_id,
            |m| m.reply_markup.is_none(),
        )
        .await;
    let edits = harness.telegram.requests_of("editMessageText");
    assert_eq!(edits[0].status, 429);
    let retried = edits.iter().find(|edit| edit.succeeded()).unwrap();
    assert!(retried.received_at - edits[0].received_at >= Duration::from_secs(1));
    assert_eq!(harness.sent_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_wait_beyond_the_limit_is_retried_later_and_holds_every_message_until_it_passed() {
    let mut harness = Harness::without_worker().await;
    harness.settings.runtime.retry.max = Duration::from_secs(1);
    harness.start_worker();
    harness.telegram.fail_next(
        "sendMessage",
        1,
        InjectedError::TooManyRequests { retry_after: 2 },
    );
    let delayed = harness.request("call-1", "{}").await;
    harness
        .telegram
        .wait_for_requests("the first sendMessage", |requests| {
            requests.iter().any(|r| r.method == "sendMessage")
        })
        .await;
    // The flood wait holds every message, another approval's too, until it has passed; then
    // both are sent, in either order (issue 44, item 5).
    let other = harness.request("call-2", "{}").await;
    let shown = [
        harness.request_message(0).await,
        harness.request_message(1).await,
    ];
    let shows = |approval: &pb::Approval| {
        shown
            .iter()
            .find(|m| m.callback_data()[0].contains(&approval.id))
            .cloned()
    };
    assert!(shows(&other).is_some(), "{shown:?}");
    let later = shows(&delayed).expect("the delayed approval's message");
    let sends = harness.telegram.requests_of("sendMessage");
    assert_eq!(sends.len(), 3);
    assert_eq!(sends[0].status, 429);
    for send in &sends[1..] {
        assert!(
            send.received_at - sends[0].received_at >= Duration::from_secs(2),
            "sent again before the flood wait was over"
        );
    }
    harness.wait_for_delivery(&delayed.id).await;

    // An edit refused the same way is retried too.
    harness.telegram.fail_next(
        "editMessageText",
        1,
        InjectedError::TooManyRequests { retry_after: 2 },
    );
    harness
        .agent
        .cancel_approval(&delayed.id, "no longer needed")
        .await
        .unwrap();
    harness
        .telegram
        .wait_for_message("the retried edit", CHAT, later.message_id, |m| {
            m.reply_markup.is_none() && m.text.contains("Cancelled")
        })
        .await;
    assert_eq!(harness.sent_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_modified_is_success_and_an_uneditable_message_gets_a_short_reply() {
    let harness = Harness::start().await;
    // Telegram's two wordings of "not modified", each on the edit after a tap. The tap's
    // Decide answer and the watch both bring the new state; if "not modified" counted as a
    // failure the second of them would edit again, or a fallback reply would be sent.
    let wordings = [
        InjectedError::MessageNotModifiedShort,
        InjectedError::MessageNotModified,
    ];
    for (nth, wording) in wordings.into_iter().enumerate() {
        let approval = harness.request(&format!("call-{nth}"), "{}").await;
        let message = harness.request_message(2 * nth).await;
        harness.telegram.fail_next("editMessageText", 1, wording);
        let (_, callback_id) = harness.telegram.tap_button(
            &alice(),
            CHAT,
            message.message_id,
            &button(&message, "Approve"),
        );
        assert_eq!(
            harness.agent_waits(&approval.id).await.state(),
            ApprovalState::Approved
        );
        wait_for_answer(&harness, &callback_id, 0).await;
        // The watch handles events in order: the next request's message shows it is past
        // this approval's events.
        harness.request(&format!("sync-{nth}"), "{}").await;
        harness.request_message(2 * nth + 1).await;
        let edits: Vec<RecordedRequest> = harness
            .telegram
            .requests_of("editMessageText")
            .into_iter()
            .filter(|edit| edit.param_i64("message_id") == Some(message.message_id))
            .collect();
        assert_eq!(edits.len(), 1, "a not-modified edit is done: {edits:#?}");
        assert!(edits[0]
            .error()
            .unwrap()
            .contains("message is not modified"));
    }
    assert_eq!(
        harness.sent_count(),
        4,
        "no fallback message for not-modified"
    );

    // A message too old to edit: the outcome goes out as a short reply to it.
    let third = harness.request("call-uneditable", "{}").await;
    let third_message = harness.request_message(4).await;
    harness
        .telegram
        .fail_next("editMessageText", 1, InjectedError::MessageCantBeEdited);
    harness.telegram.tap_button(
        &bob(),
        CHAT,
        third_message.message_id,
        &button(&third_message, "Reject"),
    );
    assert_eq!(
        harness.agent_waits(&third.id).await.state(),
        ApprovalState::Rejected
    );
    let requests = harness
        .telegram
        .wait_for_requests("the short reply", |requests| {
            requests.iter().any(|r| {
                r.method == "sendMessage"
                    && r.params["reply_parameters"]["message_id"] == third_message.message_id
            })
        })
        .await;
    let reply = requests
        .iter()
        .find(|r| r.params["reply_parameters"]["message_id"] == third_message.message_id)
        .unwrap();
    let reply_id = reply.result_message_id().unwrap();
    let shown = harness.telegram.message(CHAT, reply_id).unwrap();
    assert!(shown.text.contains("Rejected by @bob"), "{}", shown.text);
    assert!(shown.reply_markup.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_characters_and_10_kb_of_arguments_render_without_a_telegram_400() {
    let harness = Harness::start().await;
    let nasty = serde_json::json!({
        "html": "<b>bold</b> <i>i</i> <a href=\"x\">a</a> </pre></code> <tg-spoiler>s</tg-spoiler>",
        "entities": "&amp; &lt; &gt; &quot; &#60; &#x3c; &nbsp; & < > \" '",
        "markdown": "_*[]()~`>#+-=|{}.!\\",
        "unicode": "😀 é 中文 \u{200b}",
    });
    let special = harness
        .request_with(pb::RequestApprovalRequest {
            action: "write <html> & \"quotes\"".into(),
            reason: "because </b> & <tags>".into(),
            arguments_json: nasty.to_string(),
            ..request("call-1")
        })
        .await;
    let message = harness.request_message(0).await;
    assert!(message.callback_data()[0].contains(&special.id));
    assert!(
        message.text.contains("write <html> & \"quotes\""),
        "{}",
        message.text
    );
    assert!(
        message.text.contains("because </b> & <tags>"),
        "{}",
        message.text
    );
    assert!(
        message
            .text
            .contains("&amp; &lt; &gt; &quot; &#60; &#x3c; &nbsp; & < >"),
        "{}",
        message.text
    );
    assert!(
        message
            .text
            .contains("</pre></code> <tg-spoiler>s</tg-spoiler>"),
        "{}",
        message.text
    );
    assert!(message.text.contains("😀 é 中文"), "{}", message.text);

    let big = serde_json::json!({
        "script": "echo '<&>' \"$HOME\"\n".repeat(512),
        "blob": "x".repeat(2048),
    });
    assert!(big.to_string().len() > 10 * 1024);
    let large = harness.request("call-2", &big.to_string()).await;
    let message = harness.request_message(1).await;
    assert!(message.callback_data()[0].contains(&large.id));
    assert!(message.text.encode_utf16().count() <= MAX_TEXT_UTF16);
    assert!(
        message.text.contains("arguments truncated"),
        "{}",
        message.text
    );
    assert!(
        message.text.contains(r#"echo '<&>' \"$HOME\""#),
        "{}",
        message.text
    );
    assert!(
        message.text.contains("Waiting for a decision"),
        "{}",
        message.text
    );

    // Both resolve and are edited without a 400 either.
    for approval in [&special, &large] {
        harness
            .agent
            .cancel_approval(approval.id.as_str(), "done <here> & now")
            .await
            .unwrap();
    }
    for nth in 0..2 {
        let message = harness.request_message(nth).await;
        harness
            .telegram
            .wait_for_message("the cancellation", CHAT, message.message_id, |m| {
                m.text.contains("done <here> & now")
            })
            .await;
    }
    let failures: Vec<_> = harness
        .telegram
        .requests()
        .into_iter()
        .filter(|r| r.method != "getUpdates" && !r.succeeded())
        .collect();
    assert!(failures.is_empty(), "Telegram refused: {failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_go_to_their_routed_chat_or_the_default_chat() {
    let harness = Harness::start().await;
    let ops_chat = -100_777;
    let routed = harness
        .request_with(pb::RequestApprovalRequest {
            routes: vec![
                pb::Route {
                    channel: "telegram".into(),
                    target: ops_chat.to_string(),
                },
                pb::Route {
                    channel: "github".into(),
                    target: "acme/infra#12".into(),
                },
            ],
            ..request("call-1")
        })
        .await;
    let unrouted = harness
        .request_with(pb::RequestApprovalRequest {
            routes: Vec::new(),
            ..request("call-2")
        })
        .await;
    let in_ops = harness.request_message_in(ops_chat, 0).await;
    assert!(in_ops.callback_data()[0].contains(&routed.id));
    let in_default = harness.request_message(0).await;
    assert!(in_default.callback_data()[0].contains(&unrouted.id));

    harness.wait_for_delivery(&routed.id).await;
    let recorded = harness.agent.get_approval(&routed.id).await.unwrap();
    let telegram: Vec<&pb::Delivery> = recorded
        .deliveries
        .iter()
        .filter(|d| d.channel == "telegram")
        .collect();
    assert_eq!(telegram.len(), 1);
    assert_eq!(telegram[0].target, ops_chat.to_string());
    assert_eq!(
        telegram[0].message_ref,
        format!("{ops_chat}:{}", in_ops.message_id)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_polling_conflict_is_logged_clearly_and_polling_goes_on() {
    let logs = LogCapture::default();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    );
    let harness = Harness::start().await;
    harness
        .telegram
        .wait_for_requests("the first poll", |requests| {
            requests.iter().any(|r| r.method == "getUpdates")
        })
        .await;
    harness
        .telegram
        .fail_next("getUpdates", 1, InjectedError::TerminatedByOtherGetUpdates);
    // Wake the current long poll so that the next one meets the conflict.
    let approval = harness.request("call-1", "{}").await;
    let message = harness.request_message(0).await;
    harness.telegram.send_text(&alice(), CHAT, "hello", None);
    harness
        .telegram
        .wait_for_requests("the conflict", |requests| {
            requests
                .iter()
                .any(|r| r.method == "getUpdates" && r.status == 409)
        })
        .await;
    let (_, callback_id) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    wait_for_answer(&harness, &callback_id, 0).await;
    assert_eq!(
        harness.agent_waits(&approval.id).await.state(),
        ApprovalState::Approved
    );
    let text = logs.text();
    assert!(
        text.contains("409 Conflict: another process polls updates with this bot token"),
        "{text}"
    );
    assert!(
        !text.contains(BOT_TOKEN),
        "the bot token must never be logged"
    );
}

/// Collects log output for assertions.
#[derive(Clone, Default)]
struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

/// Removes the stopped worker's watch cursor, so that its next start takes a snapshot.
/// Removes the stopped worker's watch cursor. The worker was aborted in-process, so a cursor
/// write it had handed to a blocking thread may still land just after the abort (a killed
/// process's would not): the file must stay gone for a while.
async fn forget_cursor(harness: &Harness) {
    let mut absent_checks = 0;
    while absent_checks < 3 {
        match std::fs::remove_file(harness.cursor_path()) {
            Ok(()) => absent_checks = 0,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => absent_checks += 1,
            Err(error) => panic!("cannot remove the watch cursor: {error}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Waits until message `message_id` of the default chat has lost its buttons, then checks it
/// says each of `expected`.
async fn shown_resolved(
    harness: &Harness,
    what: &str,
    message_id: i64,
    expected: &[&str],
) -> ChatMessage {
    let shown = harness
        .telegram
        .wait_for_message(what, CHAT, message_id, |m| m.reply_markup.is_none())
        .await;
    for text in expected {
        assert!(shown.text.contains(text), "{what}: {}", shown.text);
    }
    shown
}

/// The id of the request message, among `messages`, whose buttons name `approval`.
fn message_id_of(messages: &[ChatMessage], approval: &pb::Approval) -> i64 {
    messages
        .iter()
        .find(|m| m.callback_data()[0].contains(&approval.id))
        .expect("a message per approval")
        .message_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_on_a_step_up_approval_answers_with_the_inbox_link_and_approves_nothing() {
    // Every call needs a passkey (docs/security.md#passkey-step-up).
    let harness = Harness::start_with_server_toml(
        "[passkeys]\ninbox_url = \"http://localhost:8080\"\n\n[[rules]]\nname = \"passkey for all\"\naction = \"require\"\nstep_up = \"passkey\"\n",
    )
    .await;
    let approval = harness.request("call-1", "{}").await;
    assert_eq!(approval.step_up, "passkey");
    let message = harness.request_message(0).await;

    let (_, tapped) = harness.telegram.tap_button(
        &alice(),
        CHAT,
        message.message_id,
        &button(&message, "Approve"),
    );
    let answer = wait_for_answer(&harness, &tapped, 0).await;
    let text = answer.param_str("text").unwrap_or_default();
    assert!(
        text.starts_with("Not allowed: this approval needs a passkey")
            && text.contains(&format!("http://localhost:8080/approvals/{}", approval.id)),
        "{text}"
    );
    let unchanged = harness.agent.get_approval(&approval.id).await.unwrap();
    assert_eq!(unchanged.state(), ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());
}
