//! Reply-topic mode: the buttons publish a one-time decision token to the reply topic on the
//! ntfy server, and the worker follows that topic's JSON stream. The worker serves nothing:
//! the phone (here `tap`, which performs an `http` action as the ntfy app does) only ever
//! talks to the ntfy server.

use super::*;

async fn started() -> Harness {
    let mut harness = Harness::without_worker_in(Mode::Replies).await;
    harness.start_worker();
    harness
}

/// The reply topic's URL on the fake: where every button publishes.
fn reply_url(harness: &Harness) -> String {
    format!("{}/{REPLY_TOPIC}", harness.ntfy.url())
}

/// A message published on the reply topic by someone who is not the worker's phone.
async fn post_reply(harness: &Harness, body: &str) -> u16 {
    tap(&json!({"method": "POST", "url": reply_url(harness), "body": body}))
        .await
        .0
}

/// Waits until the worker's stream on the reply topic has delivered the last message
/// published there: a later message, which decides something observable, was decided.
async fn stream_caught_up(harness: &Harness) {
    let marker = harness.request_to("", "marker", 600).await;
    let shown = harness.request_notification(&marker.id).await;
    let (status, _) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 200);
    harness.resolved(&marker.id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_buttons_post_to_the_ntfy_server_and_approve_decides_once() {
    let harness = started().await;
    let approval = harness.request("approve", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    assert_eq!(shown.labels(), ["Approve", "Reject", "Allow for session"]);
    for label in ["Approve", "Reject", "Allow for session"] {
        let button = action(&shown, label);
        assert_eq!(button["action"], "http");
        // Every button goes to the ntfy server: no address of the worker's.
        assert_eq!(button["url"], reply_url(&harness), "{button}");
        assert!(button["body"]
            .as_str()
            .unwrap()
            .starts_with("countersign-decision token="));
    }
    let (status, answer) = tap(action(&shown, "Approve")).await;
    assert_eq!(status, 200, "ntfy took the reply: {answer}");
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    let decision = &resolved.decisions[0];
    assert_eq!(decision.decider.as_ref().unwrap().channel, "ntfy");
    assert_eq!(decision.approver, "alice");
    assert_eq!(decision.scope(), pb::Scope::Once);
    let updated = harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "✅ Approved: bash");
    assert!(
        updated.message.starts_with("By alice (ntfy)"),
        "{}",
        updated.message
    );
    // The first stream read the reply topic from its oldest cached message.
    assert_eq!(
        harness.ntfy.stream_sinces(REPLY_TOPIC)[0].as_deref(),
        Some("all")
    );
}

/// ntfy's action body is fixed when the notification is published, so it cannot carry text
/// the approver types: Reject rejects without a reason (a reason is given in the web inbox or
/// with `countersign reject ID --reason …`; or in link mode, whose Reject… page asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_reject_rejects_and_a_reason_is_given_elsewhere() {
    let harness = started().await;
    let approval = harness.request("reject", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    assert_eq!(tap(action(&shown, "Reject")).await.0, 200);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions[0].reason, "");
    let updated = harness
        .notification_where(&approval.id, "the outcome", |m| m.actions.is_empty())
        .await;
    assert_eq!(updated.title, "❌ Rejected: bash");
    // Its siblings went with it: Approve afterwards decides nothing.
    assert_eq!(tap(action(&shown, "Approve")).await.0, 200);
    stream_caught_up(&harness).await;
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Rejected);
    assert_eq!(after.decisions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_allow_for_session_approves_with_a_session_grant() {
    let harness = started().await;
    let approval = harness.request("session-1", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    assert_eq!(tap(action(&shown, "Allow for session")).await.0, 200);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions[0].scope(), pb::Scope::Session);
    let next = harness.request("session-2", 600).await;
    assert_eq!(next.state(), pb::ApprovalState::Approved);
}

/// Anyone who knows the reply topic can publish to it; only a token the worker handed out,
/// with its form token, decides, and it decides once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_forged_and_replayed_messages_decide_nothing() {
    let harness = started().await;
    let approval = harness.request("forged", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    let approve = action(&shown, "Approve").clone();
    let body = approve["body"].as_str().unwrap().to_owned();
    let form_token = body
        .split('&')
        .find_map(|pair| pair.strip_prefix("form_token="))
        .unwrap();
    // Free text, a token never handed out, the real token with a form token of its own
    // making.
    assert_eq!(post_reply(&harness, "approve").await, 200);
    assert_eq!(
        post_reply(
            &harness,
            &format!(
                "countersign-decision token={}&form_token={form_token}&args_digest={}",
                "A".repeat(43),
                approval.args_digest
            )
        )
        .await,
        200
    );
    let wrong_form = body.replace(form_token, &"00".repeat(32));
    assert_eq!(post_reply(&harness, &wrong_form).await, 200);
    // The real button still works after them, and decides once.
    assert_eq!(tap(&approve).await.0, 200);
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    // Replayed: the same token again, twice.
    assert_eq!(tap(&approve).await.0, 200);
    assert_eq!(post_reply(&harness, &body).await, 200);
    stream_caught_up(&harness).await;
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.decisions.len(), 1, "{:?}", after.decisions);
}

/// ntfy (behind its proxy) down when the worker starts: neither the publish nor the reply
/// topic's stream gets through; both are retried, and once ntfy is back the notification
/// is published and its buttons decide. Down again while the stream is open: the stream
/// ends, is opened again from the last message read, and a reply published after decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_ntfy_down_at_publish_and_at_subscribe_is_retried() {
    let mut harness = Harness::without_worker_in(Mode::Replies).await;
    harness.ntfy.set_down(true);
    harness.start_worker();
    let approval = harness.request("down", 600).await;
    harness
        .ntfy
        .wait_for("a refused publish and a refused subscribe", |ntfy| {
            let requests = ntfy.requests();
            let refused = |method: &str| {
                requests
                    .iter()
                    .any(|r| r.method == method && r.status == 502)
            };
            (refused("POST") && refused("GET")).then_some(())
        })
        .await;
    harness.ntfy.set_down(false);
    let shown = harness.request_notification(&approval.id).await;
    assert_eq!(tap(action(&shown, "Approve")).await.0, 200);
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );

    let streams = harness.ntfy.stream_sinces(REPLY_TOPIC).len();
    let before = harness.ntfy.requests().len();
    harness.ntfy.set_down(true);
    harness
        .ntfy
        .wait_for("a refused reconnect", |ntfy| {
            ntfy.requests()[before..]
                .iter()
                .any(|r| r.method == "GET" && r.status == 502)
                .then_some(())
        })
        .await;
    let second = harness.request("down-again", 600).await;
    harness.ntfy.set_down(false);
    let shown = harness.request_notification(&second.id).await;
    assert_eq!(tap(action(&shown, "Approve")).await.0, 200);
    assert_eq!(
        harness.resolved(&second.id).await.state(),
        pb::ApprovalState::Approved
    );
    // Opened again from the last message read, not from the start.
    let sinces = harness.ntfy.stream_sinces(REPLY_TOPIC);
    assert!(sinces.len() > streams, "{sinces:?}");
    let last = sinces.last().unwrap().as_deref().unwrap();
    assert_ne!(last, "all", "{sinces:?}");
    assert_eq!(harness.state_of(&approval.id).await.decisions.len(), 1);
}

/// The binary is killed (SIGKILL) after one reply was decided; while it is down the phone
/// taps a button (ntfy keeps the reply). The restarted worker reads the reply topic from
/// after the last message it dealt with (`since=` its id): the reply that came while it was
/// down decides, once, and the one before it is not read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_worker_killed_before_a_reply_is_decided_decides_it_once_after_restart() {
    let harness = Harness::without_worker_in(Mode::Replies).await;
    let mut worker = spawn_worker(&harness.config);
    let first = harness.request("first", 600).await;
    let shown = harness.request_notification(&first.id).await;
    assert_eq!(tap(action(&shown, "Approve")).await.0, 200);
    harness.resolved(&first.id).await;
    let first_reply = harness
        .ntfy
        .messages()
        .into_iter()
        .find(|m| m.topic == REPLY_TOPIC)
        .unwrap()
        .id;
    let second = harness.request("second", 600).await;
    let shown = harness.request_notification(&second.id).await;
    worker.kill().await.unwrap();

    assert_eq!(tap(action(&shown, "Allow for session")).await.0, 200);
    assert_eq!(
        harness.state_of(&second.id).await.state(),
        pb::ApprovalState::Pending,
        "nothing decides while the worker is down"
    );
    let mut worker = spawn_worker(&harness.config);
    let resolved = harness.resolved(&second.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(resolved.decisions[0].scope(), pb::Scope::Session);
    assert_eq!(harness.state_of(&first.id).await.decisions.len(), 1);
    let sinces = harness.ntfy.stream_sinces(REPLY_TOPIC);
    assert_eq!(
        sinces.last().unwrap().as_deref(),
        Some(first_reply.as_str()),
        "{sinces:?}"
    );
    worker.kill().await.unwrap();
}

/// The worker claimed a token (its link and siblings marked used) and stopped before the
/// server heard the decision. The token comes back on the reply topic (here: the phone's tap
/// read after the restart): the link that claimed itself sends its decision again, under the
/// same idempotency key, and the approval is decided once; a sibling stays spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_topic_a_claim_whose_decision_was_lost_is_decided_after_restart() {
    use countersign_links::token_hash;
    use countersign_ntfy::shown::Store;

    let mut harness = Harness::without_worker_in(Mode::Replies).await;
    harness.start_worker();
    let approval = harness.request("claimed", 600).await;
    let shown = harness.request_notification(&approval.id).await;
    harness.worker.take().unwrap().abort();

    let body = action(&shown, "Approve")["body"]
        .as_str()
        .unwrap()
        .to_owned();
    let token = body
        .split(['=', '&'])
        .nth(1)
        .expect("the body's token")
        .to_owned();
    let store = Store::open(&harness.settings.database_path())
        .await
        .unwrap();
    let link = store
        .links()
        .link(&token_hash(&token))
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .links()
        .claim(&token_hash(&token), &link)
        .await
        .unwrap());

    assert_eq!(tap(action(&shown, "Approve")).await.0, 200);
    harness.start_worker();
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions.len(), 1);
    // The sibling went with the claim: Reject after it decides nothing.
    assert_eq!(tap(action(&shown, "Reject")).await.0, 200);
    stream_caught_up(&harness).await;
    let after = harness.state_of(&approval.id).await;
    assert_eq!(after.state(), pb::ApprovalState::Approved);
    assert_eq!(after.decisions.len(), 1);
}
