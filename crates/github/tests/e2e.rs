//! End-to-end tests of the GitHub worker: a real countersign server, the worker, the fake
//! GitHub REST API on 127.0.0.1 serving the recorded shapes, and webhook deliveries built from
//! GitHub's published payload examples, signed here.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{github_decider, Harness, Mode, PATIENCE, REPO, SECRET};
use countersign_client::groups::quorum;
use countersign_client::pb;
use countersign_github::config::WorkerSettings;
use countersign_github::render::{marked_approval_id, short_id};
use countersign_testkit::github::{
    captured_bot_comment_payload, issue_comment_payload, post_webhook, sign_webhook, Comment,
    CommentAction, Endpoint, Failure, PermissionShape, Role, UserKind, DEFAULT_BOT_LOGIN,
    MAX_BODY_CHARS, WEBHOOK_PING_PAYLOAD,
};

/// The agent waits; a writer approves; the wait returns APPROVED, the command gets +1 and the
/// request comment shows who approved.
async fn approve_by_writer(mode: Mode) {
    let harness = Harness::start(mode).await;
    let agent = harness.agent.clone();
    let request = harness.request("call-approve", "");
    let waiting = tokio::spawn(async move {
        agent
            .request_and_wait(request, Duration::from_secs(30))
            .await
    });

    let approval_id = harness
        .github
        .wait_for("the approval to exist", PATIENCE, |github| {
            github
                .comments(REPO, harness.issue)
                .into_iter()
                .find_map(|c| marked_approval_id(&c.body).map(str::to_string))
        })
        .await;
    let request_comment = harness.request_comment(&approval_id).await;
    assert!(request_comment.body.contains("restart the production API"));
    assert!(request_comment.body.contains("Waiting for approval"));
    assert_eq!(request_comment.user.login, DEFAULT_BOT_LOGIN);

    let command = harness
        .say(&harness.writer, "Checked the diff.\n\n/approve")
        .await;
    let approval = waiting
        .await
        .expect("agent task")
        .expect("request and wait");
    assert_eq!(approval.state(), pb::ApprovalState::Approved);
    assert_eq!(approval.decisions.len(), 1);
    let decision = &approval.decisions[0];
    assert_eq!(decision.decider, Some(github_decider(&harness.writer)));
    assert_eq!(decision.idempotency_key, command.id.to_string());

    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    let edited = harness
        .request_comment_where(request_comment.id, "the approved comment", |body| {
            body.contains("✅ **Approved** by @alice")
        })
        .await;
    assert!(!edited.body.contains("To answer"));
    // One request comment, no replies.
    assert_eq!(harness.requests_comments(harness.issue).len(), 2);
    let delivery = &harness.approval(&approval_id).await.deliveries[0];
    assert_eq!(delivery.channel, "github");
    assert_eq!(delivery.target, format!("{REPO}#{}", harness.issue));
    assert_eq!(
        delivery.message_ref,
        format!("comment/{}", request_comment.id)
    );
}

#[tokio::test]
async fn webhook_approve_by_a_writer() {
    approve_by_writer(Mode::Webhook).await;
}

#[tokio::test]
async fn polling_approve_by_a_writer() {
    approve_by_writer(Mode::Polling).await;
}

#[tokio::test]
async fn reject_with_a_reason_by_a_maintainer() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-reject", ""))
        .await;
    let request_comment = harness.request_comment(&approval.id).await;

    let command = harness
        .say(&harness.maintainer, "/REJECT looks wrong")
        .await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(
        resolved.resolution.as_ref().map(|r| r.reason.as_str()),
        Some("looks wrong")
    );
    assert_eq!(
        resolved.decisions[0].decider,
        Some(github_decider(&harness.maintainer))
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["-1"]);
    harness
        .request_comment_where(request_comment.id, "the rejected comment", |body| {
            body.contains("❌ **Rejected** by @alecharp: looks wrong")
        })
        .await;
}

#[tokio::test]
async fn a_readers_approve_is_refused_and_decides_nothing() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-reader", ""))
        .await;
    harness.request_comment(&approval.id).await;

    let command = harness.say(&harness.reader, "/approve").await;
    let reply = harness.reply_to(harness.issue, command.id).await;
    assert!(reply
        .body
        .contains("@dude deciding needs write access to `acme/widgets`"));
    assert!(reply.body.contains("your permission is read"));
    assert_eq!(harness.reactions(command.id, 1).await, vec!["confused"]);

    let unchanged = harness.approval(&approval.id).await;
    assert_eq!(unchanged.state(), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());
    let permission_checks = harness.github.requests_to(Endpoint::GetPermission);
    assert_eq!(permission_checks.len(), 1);
    assert_eq!(
        permission_checks[0].path,
        "/repos/acme/widgets/collaborators/dude/permission"
    );
}

/// The server's approver registry stays authoritative: a maintainer with write access who
/// is not a registered approver is refused by the server, and the command says so.
#[tokio::test]
async fn a_command_the_servers_approver_registry_refuses_decides_nothing() {
    let harness = Harness::start_with_server_toml(
        Mode::Webhook,
        "[[approvers]]\nid = \"alice\"\nname = \"Alice\"\nmax_risk = \"critical\"\nidentities = { github = [\"alice\"] }\n",
    )
    .await;
    let approval = harness
        .request_approval(harness.request("call-registry", ""))
        .await;
    harness.request_comment(&approval.id).await;

    let command = harness.say(&harness.maintainer, "/approve").await;
    let reply = harness.reply_to(harness.issue, command.id).await;
    assert!(
        reply.body.contains("countersign refused this decision"),
        "{}",
        reply.body
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["confused"]);
    let unchanged = harness.approval(&approval.id).await;
    assert_eq!(unchanged.state(), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());

    harness.say(&harness.writer, "/approve").await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
}

/// Commands in code or quotes, an edited comment, a bot's comment and the worker's own
/// account decide nothing; the writer's plain command after them is the only decision.
#[tokio::test]
async fn webhook_ignores_code_quotes_edits_and_bots() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-ignored", ""))
        .await;
    harness.request_comment(&approval.id).await;

    let in_code = harness
        .say(&harness.writer, "Try this:\n```\n/approve\n```")
        .await;
    let in_quote = harness
        .say(&harness.writer, "> /approve\nis what they said")
        .await;

    let edited = harness.say(&harness.writer, "looking").await;
    // GitHub's times are whole seconds: an edit within the creation second would look
    // unedited to a catch-up listing (which a watch resync may run at any moment).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let edited = harness.github.edit_comment(edited.id, "/approve");
    let payload = issue_comment_payload(
        &harness.github,
        CommentAction::Edited,
        &edited,
        Some("looking"),
    );
    assert_eq!(harness.deliver("issue_comment", &payload).await.0, 200);

    let app = harness
        .github
        .add_user("gagbo-test-app[bot]", UserKind::Bot);
    let by_app = harness
        .github
        .add_comment(REPO, harness.issue, &app, "/approve");
    let payload = captured_bot_comment_payload(&harness.github, &by_app);
    assert_eq!(harness.deliver("issue_comment", &payload).await.0, 202);

    let by_self = harness.say(&harness.github.bot(), "/approve").await;

    only_the_sentinel_decides(
        &harness,
        &approval.id,
        &[in_code.id, in_quote.id, edited.id, by_app.id, by_self.id],
    )
    .await;
}

/// A writer's plain `/reject sentinel` is the approval's only decision; the `ignored`
/// comments got no reaction.
async fn only_the_sentinel_decides(harness: &Harness, approval_id: &str, ignored: &[u64]) {
    let sentinel = harness.say(&harness.writer, "/reject sentinel").await;
    let resolved = harness.resolved(approval_id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        sentinel.id.to_string()
    );
    harness.reactions(sentinel.id, 1).await;
    for id in ignored {
        assert!(
            harness.github.reactions(*id).is_empty(),
            "comment {id} got a reaction"
        );
    }
}

#[tokio::test]
async fn polling_ignores_edited_comments() {
    let harness = Harness::start(Mode::Polling).await;
    let approval = harness
        .request_approval(harness.request("call-poll-edit", ""))
        .await;
    harness.request_comment(&approval.id).await;

    let comment = harness.say(&harness.writer, "looking at it").await;
    let polled_at = harness.github.requests().len();
    // Once a poll after the comment has been answered, the worker has seen it.
    harness
        .github
        .wait_for("a poll after the comment", PATIENCE, |github| {
            github.requests()[polled_at..]
                .iter()
                .any(|r| r.endpoint == Some(Endpoint::ListComments) && r.status == 200)
                .then_some(())
        })
        .await;
    harness.github.edit_comment(comment.id, "/approve");

    let sentinel = harness.say(&harness.writer, "/reject sentinel").await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        sentinel.id.to_string()
    );
    assert!(harness.github.reactions(comment.id).is_empty());
    // Polls name `since`, to the second.
    let polls = harness.github.requests_to(Endpoint::ListComments);
    assert!(polls.iter().all(|r| r
        .query
        .as_deref()
        .is_some_and(|q| q.contains("since=") && q.ends_with("Z"))));
}

#[tokio::test]
async fn two_pending_and_a_bare_approve_lists_the_ids() {
    let harness = Harness::start(Mode::Webhook).await;
    let first = harness
        .request_approval(harness.request("call-first", ""))
        .await;
    let second = harness
        .request_approval(harness.request("call-second", ""))
        .await;
    harness.request_comment(&first.id).await;
    harness.request_comment(&second.id).await;

    let bare = harness.say(&harness.writer, "/approve").await;
    let reply = harness.reply_to(harness.issue, bare.id).await;
    assert!(reply.body.contains("several approvals are pending"));
    assert!(reply.body.contains(&format!("`{}`", short_id(&first.id))));
    assert!(reply.body.contains(&format!("`{}`", short_id(&second.id))));
    assert_eq!(harness.reactions(bare.id, 1).await, vec!["confused"]);
    assert!(harness.approval(&first.id).await.decisions.is_empty());
    assert!(harness.approval(&second.id).await.decisions.is_empty());

    let named = harness
        .say(
            &harness.writer,
            &format!("/approve {}", short_id(&second.id)),
        )
        .await;
    let resolved = harness.resolved(&second.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions[0].idempotency_key, named.id.to_string());
    let first_now = harness.approval(&first.id).await;
    assert_eq!(first_now.state(), pb::ApprovalState::Pending);
    assert!(first_now.decisions.is_empty());

    // With one left, a bare command applies to it; the full id works too.
    let full = harness
        .say(&harness.writer, &format!("/reject {} not today", first.id))
        .await;
    let first_resolved = harness.resolved(&first.id).await;
    assert_eq!(first_resolved.state(), pb::ApprovalState::Rejected);
    assert_eq!(
        first_resolved.decisions[0].idempotency_key,
        full.id.to_string()
    );
}

#[tokio::test]
async fn webhook_signatures_duplicates_and_ping() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-signature", ""))
        .await;
    let request_comment = harness.request_comment(&approval.id).await;
    let url = harness.webhook_url();

    // A forger's payload names a comment that does not exist on GitHub (a real one could also
    // reach the worker through its catch-up listing, rightly).
    let forged_comment = Comment {
        id: request_comment.id + 1_000_000,
        body: "/approve".to_string(),
        user: harness.writer.clone(),
        ..request_comment.clone()
    };
    let forged_payload = issue_comment_payload(
        &harness.github,
        CommentAction::Created,
        &forged_comment,
        None,
    );
    let forged = sign_webhook("not the secret", &forged_payload);
    let (status, _) = post_webhook(
        &url,
        "issue_comment",
        "d-forged",
        &forged_payload,
        Some(&forged),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) =
        post_webhook(&url, "issue_comment", "d-unsigned", &forged_payload, None).await;
    assert_eq!(status, 401);
    let mut tampered = forged_payload.clone();
    tampered.extend_from_slice(b" ");
    let (status, _) = post_webhook(
        &url,
        "issue_comment",
        "d-tampered",
        &tampered,
        Some(&sign_webhook(SECRET, &forged_payload)),
    )
    .await;
    assert_eq!(status, 401);
    // Refused deliveries are not queued: nothing changed.
    assert!(harness.approval(&approval.id).await.decisions.is_empty());
    assert!(harness.github.reactions(forged_comment.id).is_empty());

    let comment = harness
        .github
        .add_comment(REPO, harness.issue, &harness.writer, "/approve");
    let payload = issue_comment_payload(&harness.github, CommentAction::Created, &comment, None);
    let signature = sign_webhook(SECRET, &payload);
    let (first, _) = post_webhook(&url, "issue_comment", "d-1", &payload, Some(&signature)).await;
    let (again, body) =
        post_webhook(&url, "issue_comment", "d-1", &payload, Some(&signature)).await;
    assert_eq!((first, again), (202, 200));
    assert_eq!(body, "duplicate delivery");
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(harness.reactions(comment.id, 1).await, vec!["+1"]);

    let ping = WEBHOOK_PING_PAYLOAD.as_bytes();
    let (status, body) = post_webhook(
        &url,
        "ping",
        "d-ping",
        ping,
        Some(&sign_webhook(SECRET, ping)),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "pong"));
    let deleted = issue_comment_payload(&harness.github, CommentAction::Deleted, &comment, None);
    assert_eq!(harness.deliver("issue_comment", &deleted).await.0, 200);
    let issues_event = br#"{"action":"opened"}"#;
    assert_eq!(harness.deliver("issues", issues_event).await.0, 200);
}

/// With webhook and polling both on, a comment arrives twice and is applied once.
#[tokio::test]
async fn a_comment_seen_by_webhook_and_poll_is_applied_once() {
    let harness = Harness::start(Mode::Both).await;
    let first = harness
        .request_approval(harness.request("call-both-1", ""))
        .await;
    let second = harness
        .request_approval(harness.request("call-both-2", ""))
        .await;
    harness.request_comment(&first.id).await;
    harness.request_comment(&second.id).await;

    let command = harness
        .say(
            &harness.writer,
            &format!("/approve {}", short_id(&first.id)),
        )
        .await;
    harness.resolved(&first.id).await;
    // Only polling brings this one. By the time it is applied, every poll that returned the
    // first command has been handled too (the issue stays polled while `second` is pending).
    let sentinel = harness.github.add_comment(
        REPO,
        harness.issue,
        &harness.writer,
        &format!("/approve {}", short_id(&second.id)),
    );
    harness.resolved(&second.id).await;

    assert_eq!(harness.approval(&first.id).await.decisions.len(), 1);
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    assert_eq!(harness.reactions(sentinel.id, 1).await, vec!["+1"]);
    assert_eq!(
        harness.github.requests_to(Endpoint::CreateReaction).len(),
        2
    );
}

#[tokio::test]
async fn decided_elsewhere_expired_and_cancelled_are_shown() {
    let harness = Harness::start(Mode::Webhook).await;
    let elsewhere = harness
        .request_approval(harness.request("call-elsewhere", ""))
        .await;
    let mut short_lived = harness.request("call-expire", "");
    short_lived.ttl_seconds = 1;
    let expiring = harness.request_approval(short_lived).await;
    let cancelled = harness
        .request_approval(harness.request("call-cancel", ""))
        .await;
    let elsewhere_comment = harness.request_comment(&elsewhere.id).await;
    let expiring_comment = harness.request_comment(&expiring.id).await;
    let cancelled_comment = harness.request_comment(&cancelled.id).await;

    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: elsewhere.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            decider: Some(pb::Decider {
                channel: "telegram".to_string(),
                user_id: "777000".to_string(),
                display_name: "Alice Smith".to_string(),
            }),
            idempotency_key: "callback-1".to_string(),
            ..Default::default()
        })
        .await
        .expect("decide on telegram");
    harness
        .agent
        .cancel_approval(&cancelled.id, "agent stopped")
        .await
        .expect("cancel");

    harness
        .request_comment_where(elsewhere_comment.id, "approved on telegram", |body| {
            body.contains("✅ **Approved** by Alice Smith (telegram)")
        })
        .await;
    harness
        .request_comment_where(expiring_comment.id, "expired", |body| {
            body.contains("⌛ **Expired** without a decision")
        })
        .await;
    harness
        .request_comment_where(cancelled_comment.id, "cancelled", |body| {
            body.contains("🚫 **Cancelled**: agent stopped")
        })
        .await;
}

/// The answer to the comment POST is lost (502 after GitHub created it): the worker finds the
/// comment by its marker instead of posting a second one.
#[tokio::test]
async fn a_lost_post_answer_does_not_duplicate_the_comment() {
    let harness = Harness::start(Mode::Webhook).await;
    harness
        .github
        .fail_next(Endpoint::CreateComment, 1, Failure::BadGatewayAfterWrite);
    let approval = harness
        .request_approval(harness.request("call-lost", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    let delivered = wait_delivered(&harness, &approval.id).await;
    assert_eq!(delivered.message_ref, format!("comment/{}", comment.id));
    assert_eq!(harness.github.requests_to(Endpoint::CreateComment).len(), 1);
    assert_eq!(harness.requests_comments(harness.issue).len(), 1);
}

async fn wait_delivered(harness: &Harness, approval_id: &str) -> pb::Delivery {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let approval = harness.approval(approval_id).await;
        if let Some(delivery) = approval
            .deliveries
            .into_iter()
            .find(|d| d.channel == "github")
        {
            return delivery;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no GitHub delivery recorded for {approval_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A 403 secondary rate limit on the comment POST and a 429 on the reaction are waited out
/// (Retry-After) and the requests sent again; a used-up primary limit waits for its reset.
#[tokio::test]
async fn rate_limits_are_waited_out_and_retried() {
    let harness = Harness::start(Mode::Webhook).await;
    harness.github.fail_next(
        Endpoint::CreateComment,
        1,
        Failure::SecondaryRateLimit {
            retry_after_secs: 1,
        },
    );
    harness.github.fail_next(
        Endpoint::CreateReaction,
        1,
        Failure::TooManyRequests {
            retry_after_secs: 1,
        },
    );
    harness.github.fail_next(
        Endpoint::GetPermission,
        1,
        Failure::PrimaryRateLimit {
            reset_after_secs: 1,
        },
    );
    let approval = harness
        .request_approval(harness.request("call-limits", ""))
        .await;
    let request_comment = harness.request_comment(&approval.id).await;
    let command = harness.say(&harness.writer, "/approve").await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    harness
        .request_comment_where(request_comment.id, "the approved comment", |body| {
            body.contains("Approved")
        })
        .await;

    for (endpoint, limited, then) in [
        (Endpoint::CreateComment, 403, 201),
        (Endpoint::CreateReaction, 429, 201),
        (Endpoint::GetPermission, 403, 200),
    ] {
        let requests = harness.github.requests_to(endpoint);
        let statuses: Vec<u16> = requests.iter().map(|r| r.status).collect();
        assert_eq!(&statuses[..2], &[limited, then], "{endpoint:?}");
        // Retry-After / X-RateLimit-Reset said one second.
        let waited = requests[1].received_at - requests[0].received_at;
        assert!(
            waited >= Duration::from_millis(900),
            "{endpoint:?} retried after {waited:?}"
        );
    }
    assert_eq!(harness.requests_comments(harness.issue).len(), 2);
}

/// A secondary rate limit is GitHub's for the account, not for one call: after a 403 with
/// `Retry-After` no other approval's comment may be posted before it has passed (it was
/// posted at once, while only the limited call waited).
#[tokio::test]
async fn a_secondary_rate_limit_holds_every_approval_s_comment() {
    let harness = Harness::start(Mode::Webhook).await;
    harness.github.fail_next(
        Endpoint::CreateComment,
        1,
        Failure::SecondaryRateLimit {
            retry_after_secs: 3,
        },
    );
    let first = harness
        .request_approval(harness.request("limited-1", ""))
        .await;
    let limited_at = harness
        .github
        .wait_for("the secondary limit", PATIENCE, |github| {
            github
                .requests_to(Endpoint::CreateComment)
                .first()
                .map(|request| request.received_at)
        })
        .await;
    let second = harness
        .request_approval(harness.request("limited-2", ""))
        .await;
    harness.request_comment(&first.id).await;
    harness.request_comment(&second.id).await;
    let posts: Vec<Duration> = harness
        .github
        .requests_to(Endpoint::CreateComment)
        .iter()
        .map(|request| request.received_at.duration_since(limited_at))
        .collect();
    assert_eq!(posts.len(), 3, "{posts:?}");
    assert!(
        posts[1..]
            .iter()
            .all(|since| *since >= Duration::from_secs(3)),
        "comments {posts:?} after the limit, before its Retry-After"
    );
}

/// A repository target opens one issue per approval, with the request in its body.
#[tokio::test]
async fn a_repository_target_opens_an_issue() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-issue", REPO))
        .await;
    let issue = harness
        .github
        .wait_for("the opened issue", PATIENCE, |github| {
            github
                .issues(REPO)
                .into_iter()
                .find(|i| marked_approval_id(&i.body) == Some(approval.id.as_str()))
        })
        .await;
    assert!(issue.title.starts_with("Approval requested: bash"));
    let delivered = wait_delivered(&harness, &approval.id).await;
    assert_eq!(delivered.target, format!("{REPO}#{}", issue.number));
    assert_eq!(delivered.message_ref, format!("issue/{}", issue.number));

    let command = harness
        .say_on(issue.number, &harness.writer, "/approve")
        .await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    harness
        .github
        .wait_for("the issue body edited", PATIENCE, |github| {
            github
                .issue(REPO, issue.number)
                .filter(|i| i.body.contains("✅ **Approved** by @alice"))
        })
        .await;
}

/// The worker process is killed after GitHub created the request comment but before it heard
/// back (so before it recorded the delivery). The restarted worker finds that comment by its
/// marker: no second comment, and it goes on to apply commands.
#[tokio::test]
async fn killed_after_posting_and_restarted_posts_no_second_comment() {
    let harness = Harness::start_without_worker(Mode::Polling).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let config_path = write_worker_config(&harness, dir.path(), "[polling]\ninterval_ms = 100\n");

    harness.github.hold(Endpoint::CreateComment);
    let mut first_run = spawn_worker_process(&config_path);
    let approval = harness
        .request_approval(harness.request("call-crash", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    first_run.kill().await.expect("kill the worker");
    harness.github.release(Endpoint::CreateComment);
    // It died waiting for GitHub's answer, so it cannot have recorded the delivery.
    assert!(harness.approval(&approval.id).await.deliveries.is_empty());

    let mut second_run = spawn_worker_process(&config_path);
    let delivered = wait_delivered(&harness, &approval.id).await;
    assert_eq!(delivered.message_ref, format!("comment/{}", comment.id));
    assert_eq!(harness.github.requests_to(Endpoint::CreateComment).len(), 1);
    assert_eq!(harness.requests_comments(harness.issue).len(), 1);

    let command = harness.say(&harness.writer, "/approve").await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    second_run.kill().await.expect("kill the worker");
}

/// Issue 26, webhooks only (no polling): the worker process is killed after GitHub stored its
/// request comment but before it recorded the delivery, and an `/approve` is written while it
/// is down (GitHub does not deliver that webhook again). The restarted worker finds its
/// comment by the marker and then lists the issue's comments from it on: the command is
/// applied, reacted to, and the request comment shows the outcome (README, "Restarts").
#[tokio::test]
async fn webhook_only_killed_before_recording_applies_a_command_written_while_down() {
    killed_before_recording_applies_a_command_written_while_down(None).await;
}

/// The same with a state directory: the outbox holds the intent of the post (written before
/// it) without the comment's id; the restarted worker looks for the comment by its marker
/// and adopts it.
#[tokio::test]
async fn with_an_outbox_killed_before_recording_applies_a_command_written_while_down() {
    let state = tempfile::tempdir().expect("a state directory");
    killed_before_recording_applies_a_command_written_while_down(Some(state.path())).await;
    let outbox = std::fs::read_to_string(state.path().join("outbox.jsonl")).expect("the outbox");
    // The intent of the first run, settled by the second once it adopted the comment.
    assert!(outbox.contains(r#""op":"intent""#), "{outbox}");
    assert!(outbox.contains(r#""op":"done""#), "{outbox}");
}

async fn killed_before_recording_applies_a_command_written_while_down(
    state_dir: Option<&std::path::Path>,
) {
    let harness = Harness::start_without_worker(Mode::Webhook).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let state = state_dir
        .map(|dir| format!("state_dir = {:?}\n\n", dir.display().to_string()))
        .unwrap_or_default();
    let config_path = write_worker_config(
        &harness,
        dir.path(),
        &format!("{state}[webhook]\nlisten = \"127.0.0.1:0\"\nsecret = \"unused-by-this-test\"\n"),
    );

    harness.github.hold(Endpoint::CreateComment);
    let mut first_run = spawn_worker_process(&config_path);
    let approval = harness
        .request_approval(harness.request("call-crash-webhook", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    first_run.kill().await.expect("kill the worker");
    harness.github.release(Endpoint::CreateComment);
    assert!(harness.approval(&approval.id).await.deliveries.is_empty());
    // Written while the worker is down: its webhook delivery is lost for good.
    let command = harness
        .github
        .add_comment(REPO, harness.issue, &harness.writer, "/approve");

    let mut second_run = spawn_worker_process(&config_path);
    let delivered = wait_delivered(&harness, &approval.id).await;
    assert_eq!(delivered.message_ref, format!("comment/{}", comment.id));
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        command.id.to_string()
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    harness
        .request_comment_where(comment.id, "the approved comment", |body| {
            body.contains("✅ **Approved** by @alice")
        })
        .await;
    assert_eq!(harness.github.requests_to(Endpoint::CreateComment).len(), 1);
    second_run.kill().await.expect("kill the worker");
}

/// A configuration file for the binary against the harness's server and fake GitHub, with
/// `receiving` (a `[polling]` or `[webhook]` section) at its end.
fn write_worker_config(
    harness: &Harness,
    dir: &std::path::Path,
    receiving: &str,
) -> std::path::PathBuf {
    let path = dir.join("github-worker.toml");
    let config = format!(
        "[server]\nurl = \"{server}\"\n\n[github]\napi_url = \"{github}\"\ntoken = \"{token}\"\nbot_login = \"{bot}\"\ndefault_target = \"{REPO}#{issue}\"\nwrite_interval_ms = 20\nretry_interval_ms = 200\n\n{receiving}",
        server = harness.server.url(),
        github = harness.github.url(),
        token = countersign_testkit::github::DEFAULT_TOKEN,
        bot = DEFAULT_BOT_LOGIN,
        issue = harness.issue,
    );
    std::fs::write(&path, config).expect("write the worker config");
    path
}

fn spawn_worker_process(config: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_countersign-github"))
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start countersign-github")
}

#[test]
fn the_binary_has_help() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_countersign-github"))
        .arg("--help")
        .output()
        .expect("run countersign-github --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "--config",
        "--log-format",
        "COUNTERSIGN_GITHUB_TOKEN",
        "COUNTERSIGN_GITHUB_WEBHOOK_SECRET",
    ] {
        assert!(help.contains(expected), "--help lacks {expected}:\n{help}");
    }
}

/// With GitHub App credentials the worker exchanges its JWT for an installation token and
/// works as the app's bot account.
#[tokio::test]
async fn github_app_credentials() {
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    let mut file = harness.file_config();
    file.github.token = None;
    file.github.app_id = Some(360617);
    file.github.installation_id = Some(7777777);
    file.github.private_key_path = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/test-app-private-key.pem"),
    );
    let app_bot = harness.github.app_bot();
    file.github.bot_login = app_bot.login.clone();
    let config =
        countersign_github::Settings::from_file(file, common::no_environment).expect("app config");
    harness.worker = Some(
        countersign_github::Worker::start(config)
            .await
            .expect("start the worker"),
    );

    let approval = harness
        .request_approval(harness.request("call-app", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    assert_eq!(comment.user, app_bot);
    let exchanges = harness
        .github
        .requests_to(Endpoint::CreateInstallationToken);
    assert_eq!(
        exchanges[0].path,
        "/app/installations/7777777/access_tokens"
    );
    let jwt = exchanges[0].authorization.as_deref().unwrap_or_default();
    assert_eq!(
        jwt.strip_prefix("Bearer ").map(|t| t.split('.').count()),
        Some(3)
    );
    let posted = harness.github.requests_to(Endpoint::CreateComment);
    assert!(posted[0]
        .authorization
        .as_deref()
        .is_some_and(|auth| auth.starts_with("Bearer ghs_")));

    let command = harness.say(&harness.writer, "/approve").await;
    assert_eq!(
        harness.resolved(&approval.id).await.state(),
        pb::ApprovalState::Approved
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
}

/// Approvals resolved while the worker was down still have "waiting" comments; the restarted
/// worker corrects them.
#[tokio::test]
async fn a_restarted_worker_corrects_comments_resolved_meanwhile() {
    let mut harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-downtime", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;
    harness.stop_worker().await;
    harness
        .agent
        .cancel_approval(&approval.id, "superseded")
        .await
        .expect("cancel");
    assert!(harness
        .github
        .comment(comment.id)
        .is_some_and(|c| c.body.contains("Waiting")));

    harness.start_worker().await;
    harness
        .request_comment_where(comment.id, "the cancelled comment", |body| {
            body.contains("🚫 **Cancelled**: superseded")
        })
        .await;
    assert_eq!(harness.requests_comments(harness.issue).len(), 1);
}

/// After a restart, a `/approve` that arrives by webhook before the worker has adopted the
/// watch snapshot is not written off: it is applied once the approval is known.
#[tokio::test]
async fn a_command_received_before_the_snapshot_is_applied_after_it() {
    let mut harness = Harness::start(Mode::Both).await;
    let approval = harness
        .request_approval(harness.request("call-early", ""))
        .await;
    harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;
    harness.stop_worker().await;
    // With the server down the restarted worker gets no snapshot, so the delivery below is
    // queued (and handled) before it.
    harness.server.stop().await;
    harness.start_worker().await;
    let command = harness.say(&harness.writer, "/approve").await;
    harness.server.restart().await;

    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.decisions.len(), 1);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        command.id.to_string()
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
}

/// Webhooks only: a command written while the worker was down is never delivered again by
/// GitHub; the restarted worker lists the issue's comments once and applies it.
#[tokio::test]
async fn webhook_only_catches_up_commands_written_while_down() {
    let mut harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-while-down", ""))
        .await;
    let request_comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;
    harness.stop_worker().await;
    // Written while the worker is down: the webhook delivery fails and is not repeated.
    let command = harness
        .github
        .add_comment(REPO, harness.issue, &harness.writer, "/approve");

    let listed_before = harness.github.requests_to(Endpoint::ListComments).len();
    harness.start_worker().await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        command.id.to_string()
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
    let listings = &harness.github.requests_to(Endpoint::ListComments)[listed_before..];
    assert_eq!(listings.len(), 1, "one catch-up listing");
    // From the request comment on, to the second (the raw query has `:` encoded).
    let since = request_comment
        .created_at
        .replace_nanosecond(0)
        .expect("whole second")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format the time")
        .replace(':', "%3A");
    let query = listings[0].query.as_deref().unwrap_or_default();
    assert!(query.contains(&format!("since={since}")), "{query}");
}

/// The server stays unreachable through every attempt at a command: the worker gives up with
/// a confused reaction and a reply asking for the command again, which then works.
#[tokio::test]
async fn a_command_that_cannot_be_recorded_asks_to_be_repeated() {
    let mut harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-unrecorded", ""))
        .await;
    let request_comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;

    harness.server.stop().await;
    let command = harness.say(&harness.writer, "/approve").await;
    let reply = harness.reply_to(harness.issue, command.id).await;
    assert!(
        reply
            .body
            .contains("@alice this command could not be recorded"),
        "{}",
        reply.body
    );
    assert!(reply.body.contains("Please repeat it."));
    assert_eq!(harness.reactions(command.id, 1).await, vec!["confused"]);

    harness.server.restart().await;
    let unchanged = harness.approval(&approval.id).await;
    assert_eq!(unchanged.state(), pb::ApprovalState::Pending);
    assert!(unchanged.decisions.is_empty());
    let repeated = harness.say(&harness.writer, "/approve").await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        repeated.id.to_string()
    );
    harness
        .request_comment_where(request_comment.id, "the approved comment", |body| {
            body.contains("✅ **Approved** by @alice")
        })
        .await;
}

/// `/approve` in every form GitHub shows as code (indented, fenced inside a list item or a
/// quote, `<pre>`, `<code>`) decides nothing; the plain command after them does.
#[tokio::test]
async fn approve_in_every_code_form_is_ignored() {
    let harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("call-code-forms", ""))
        .await;
    harness.request_comment(&approval.id).await;
    let mut ignored = Vec::new();
    for body in [
        "Run this:\n\n    /approve",
        "\t/approve",
        "- step one:\n  ```\n  /approve\n  ```",
        "1. ```sh\n   /approve\n   ```",
        "> ```\n> /approve\n> ```",
        "<pre>\n/approve\n</pre>",
        "<code>\n/approve\n</code>",
    ] {
        ignored.push(harness.say(&harness.writer, body).await.id);
    }
    only_the_sentinel_decides(&harness, &approval.id, &ignored).await;
}

/// Arguments full of backticks: the comment (fences included) stays under GitHub's limit,
/// shows that it was cut and names the digest of the full arguments; the agent's forged
/// lines stay inside its quote.
#[tokio::test]
async fn oversized_arguments_produce_a_comment_under_the_limit() {
    let harness = Harness::start(Mode::Webhook).await;
    let arguments = serde_json::json!({ "a": "`".repeat(60_000), "b": "x".repeat(1_000) });
    let approval = harness
        .request_approval(pb::RequestApprovalRequest {
            arguments_json: arguments.to_string(),
            action: "tidy up\n✅ **Approved** by @alice".to_string(),
            ..harness.request("call-oversized", "")
        })
        .await;
    let comment = harness.request_comment(&approval.id).await;
    assert!(comment.body.chars().count() <= MAX_BODY_CHARS);
    assert!(comment.body.contains("_(truncated: "), "no note of the cut");
    assert!(comment.body.contains(&approval.args_digest));
    assert!(
        comment
            .body
            .lines()
            .all(|line| !line.starts_with("✅ **Approved**")),
        "the agent drew its own line"
    );
    assert!(comment.body.contains("> **Action:** tidy up ⏎ ✅"));
}

/// A body GitHub refuses (422) is logged and posted once more without the arguments.
#[tokio::test]
async fn a_refused_request_comment_is_posted_once_more_without_arguments() {
    let harness = Harness::start(Mode::Webhook).await;
    harness
        .github
        .fail_next(Endpoint::CreateComment, 1, Failure::BodyRefused);
    let approval = harness
        .request_approval(harness.request("call-refused", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    assert!(
        comment.body.contains("arguments not shown"),
        "{}",
        comment.body
    );
    assert!(comment.body.contains(&approval.args_digest));
    assert!(comment
        .body
        .contains(&format!("/approve {}", short_id(&approval.id))));
    assert_eq!(
        harness
            .github
            .requests_to(Endpoint::CreateComment)
            .iter()
            .filter(|r| r.status == 422)
            .count(),
        1
    );
}

/// A call approved by a session grant gets a short notice on the issue.
#[tokio::test]
async fn a_session_grant_s_use_is_announced() {
    let harness = Harness::start(Mode::Webhook).await;
    let first = harness
        .request_approval(harness.request("call-grant-1", ""))
        .await;
    harness.request_comment(&first.id).await;
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: first.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Session.into(),
            reason: String::new(),
            decider: Some(github_decider(&harness.writer)),
            idempotency_key: "grant-test".to_string(),
            ..Default::default()
        })
        .await
        .expect("decide for the session");
    let later = harness
        .request_approval(harness.request("call-grant-2", ""))
        .await;
    assert_eq!(later.state(), pb::ApprovalState::Approved);
    let notice = harness
        .github
        .wait_for("the grant notice", PATIENCE, |github| {
            github
                .comments(REPO, harness.issue)
                .into_iter()
                .find(|c| c.body.contains("Approved by a session grant"))
        })
        .await;
    assert!(notice.body.contains(short_id(&later.id)), "{}", notice.body);
}

/// One approval's request stuck on GitHub (its issue creation never answered) does not hold
/// up another approval's comment; the stuck one is posted once GitHub answers.
#[tokio::test]
async fn a_stuck_approval_does_not_delay_another_approval_s_comment() {
    let harness = Harness::start(Mode::Webhook).await;
    harness.github.hold(Endpoint::CreateIssue);
    let stuck = harness
        .request_approval(harness.request("call-stuck", REPO))
        .await;
    harness
        .github
        .wait_for("the stuck issue creation", PATIENCE, |github| {
            github
                .issues(REPO)
                .into_iter()
                .find(|i| marked_approval_id(&i.body) == Some(stuck.id.as_str()))
        })
        .await;
    let calm = harness
        .request_approval(harness.request("call-calm", ""))
        .await;
    harness.request_comment(&calm.id).await;
    // The worker gives up on a call after 5 s (request_timeout_ms): the calm comment came
    // well before, while the stuck call was still waiting.
    let stuck_at = harness.github.requests_to(Endpoint::CreateIssue)[0].received_at;
    let calm_at = harness
        .github
        .requests_to(Endpoint::CreateComment)
        .iter()
        .find(|r| r.body.contains(&calm.id))
        .expect("the calm comment's request")
        .received_at;
    assert!(
        calm_at.duration_since(stuck_at) < Duration::from_secs(4),
        "the calm approval waited {:?} for the stuck one",
        calm_at.duration_since(stuck_at)
    );
    harness.github.release(Endpoint::CreateIssue);
    let delivered = wait_delivered(&harness, &stuck.id).await;
    assert!(delivered.message_ref.starts_with("issue/"));
}

/// Edits run in their approval's lane too: while GitHub holds the edit of one approval's
/// request (an issue body), another approval's comment is edited to its outcome at once.
#[tokio::test]
async fn a_stuck_edit_does_not_delay_another_approval_s_edit() {
    let harness = Harness::start(Mode::Webhook).await;
    let stuck = harness
        .request_approval(harness.request("call-stuck", REPO))
        .await;
    let calm = harness
        .request_approval(harness.request("call-calm", ""))
        .await;
    let calm_comment = harness.request_comment(&calm.id).await;
    wait_delivered(&harness, &stuck.id).await;
    wait_delivered(&harness, &calm.id).await;

    harness.github.hold(Endpoint::UpdateIssue);
    harness
        .agent
        .cancel_approval(&stuck.id, "superseded")
        .await
        .expect("cancel");
    harness
        .github
        .wait_for("the held issue edit", PATIENCE, |github| {
            (!github.requests_to(Endpoint::UpdateIssue).is_empty()).then_some(())
        })
        .await;
    let held_at = tokio::time::Instant::now();
    harness
        .agent
        .cancel_approval(&calm.id, "not needed")
        .await
        .expect("cancel");
    harness
        .request_comment_where(calm_comment.id, "the calm comment cancelled", |body| {
            body.contains("🚫 **Cancelled**: not needed")
        })
        .await;
    // A held call is given up after 5 s (request_timeout_ms): the calm edit came well before.
    assert!(
        held_at.elapsed() < Duration::from_secs(4),
        "the calm approval's edit waited {:?} for the stuck one",
        held_at.elapsed()
    );
    harness.github.release(Endpoint::UpdateIssue);
}

/// An edit GitHub keeps failing with 502s beyond the API's own attempts is tried again on the
/// runtime's per-approval schedule until it goes through.
#[tokio::test]
async fn a_failing_edit_is_retried_until_it_goes_through() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.max_attempts = Some(2);
    harness.start_worker().await;
    let approval = harness
        .request_approval(harness.request("call-1", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;

    harness
        .github
        .fail_next(Endpoint::UpdateComment, 5, Failure::BadGateway);
    harness
        .agent
        .cancel_approval(&approval.id, "superseded")
        .await
        .expect("cancel");
    harness
        .request_comment_where(comment.id, "the cancelled comment", |body| {
            body.contains("🚫 **Cancelled**: superseded")
        })
        .await;
    // Two attempts per edit: at least three edits, the last two scheduled by the runtime.
    assert!(harness.github.requests_to(Endpoint::UpdateComment).len() >= 6);
}

/// With a state directory the worker keeps a watch cursor there: an approval cancelled while
/// the worker was stopped, behind more newer resolved approvals than the correction pass
/// after a snapshot looks at (50), still gets its comment corrected, because the restarted
/// worker replays every event after its cursor. The approvals created and cancelled meanwhile
/// get no comment.
#[tokio::test]
async fn with_a_state_dir_a_comment_resolved_behind_60_newer_approvals_is_corrected() {
    let state = tempfile::tempdir().expect("a state directory");
    let cursor_file = state.path().join("watch-cursor");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.start_worker().await;
    let approval = harness.request_approval(harness.request("old", "")).await;
    let comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;
    let persisted = || {
        std::fs::read_to_string(&cursor_file)
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse::<u64>().ok())
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while persisted().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no cursor written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    harness.stop_worker().await;

    cancel_behind_60_newer(&harness, &approval.id).await;
    let mut watch = harness
        .agent
        .watch(countersign_client::WatchOptions::channel("github"));
    watch.next().await.expect("a snapshot");
    let head = watch.cursor().expect("the head seq").seq;

    harness.start_worker().await;
    harness
        .request_comment_where(comment.id, "the cancelled comment", |body| {
            body.contains("🚫 **Cancelled**: superseded")
        })
        .await;
    while persisted().is_none_or(|seq| seq < head) {
        assert!(
            tokio::time::Instant::now() < deadline + PATIENCE,
            "the cursor never reached {head}: {:?}",
            persisted()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        harness.requests_comments(harness.issue).len(),
        1,
        "no comment for approvals cancelled before the worker saw them"
    );
}

/// Edit-on-approve: `/approve` followed by a ```json block approves edited arguments; a plain
/// `/approve` after an edit is refused with the reason; repeating the edited arguments
/// approves that version.
#[tokio::test]
async fn an_approve_with_a_json_block_approves_the_edited_arguments() {
    let harness = Harness::start(Mode::Webhook).await;
    let request = pb::RequestApprovalRequest {
        required_approvals: 2,
        ..harness.request("call-edit", "")
    };
    let approval = harness.request_approval(request).await;
    let request_comment = harness.request_comment(&approval.id).await;
    assert!(request_comment.body.contains("```json"), "says how to edit");

    let edited = r#"{"command": "kubectl rollout restart deploy/api", "namespace": "staging"}"#;
    let edit = harness
        .say(
            &harness.writer,
            &format!("Staging first.\n/approve\n```json\n{edited}\n```"),
        )
        .await;
    assert_eq!(harness.reactions(edit.id, 1).await, vec!["+1"]);
    let now = harness.approval(&approval.id).await;
    assert_eq!(
        now.state(),
        pb::ApprovalState::Pending,
        "two approvals needed"
    );
    assert_eq!(now.edited_arguments_json, edited);
    assert_eq!(
        now.editor.as_ref().map(|e| e.display_name.as_str()),
        Some("alice")
    );
    harness
        .request_comment_where(request_comment.id, "the comment shows the edit", |body| {
            body.contains("**Edited by** @alice") && body.contains("\"staging\"")
        })
        .await;

    // A plain /approve names no version: after an edit it is refused, with the reason.
    let plain = harness.say(&harness.maintainer, "/approve").await;
    let reply = harness.reply_to(harness.issue, plain.id).await;
    assert!(reply.body.contains("was edited"), "{}", reply.body);
    assert_eq!(harness.approval(&approval.id).await.decisions.len(), 1);

    // Malformed edits are refused and change nothing.
    let broken = harness
        .say(
            &harness.maintainer,
            "/approve\n```json\n{\"a\": 1, \"a\": 2}\n```",
        )
        .await;
    let reply = harness.reply_to(harness.issue, broken.id).await;
    assert!(reply.body.contains("appears twice"), "{}", reply.body);

    // The same edited arguments again: an approval of that version.
    harness
        .say(
            &harness.maintainer,
            &format!("/approve\n\n```json\n{edited}\n```"),
        )
        .await;
    let resolved = harness.resolved(&approval.id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(resolved.edited_arguments_json, edited);
    assert_eq!(
        resolved.resolution.expect("resolution").args_digest,
        resolved.edited_args_digest
    );
}

/// Groups on GitHub, with the worked example of docs/configuration.md as the server's
/// configuration: the request comment shows the quorum progress, a non-member's `/approve`
/// is refused, and the reminder comment mentions the members still awaited.
#[tokio::test]
async fn group_progress_refusals_and_a_reminder_that_mentions_the_group() {
    let harness =
        Harness::start_with_server_toml(Mode::Webhook, countersign_testkit::docs::groups_example())
            .await;
    let member = |login: &str| {
        let user = harness.github.add_user(login, UserKind::User);
        harness
            .github
            .set_permission(REPO, login, Role::Write, PermissionShape::Modern);
        user
    };
    let (alice, dave) = (member("alice-gh"), member("dave-gh"));
    let approval = harness
        .request_approval(pb::RequestApprovalRequest {
            approver_groups: vec![quorum("security", 2)],
            // Late enough for alice's approval to come first.
            follow_up: Some(pb::FollowUp {
                remind_after_seconds: 3,
                ..Default::default()
            }),
            ..harness.request("call-groups", "")
        })
        .await;
    let comment = harness.request_comment(&approval.id).await;
    assert!(
        comment.body.contains("0 of 2 from security"),
        "{}",
        comment.body
    );

    // dave is in db, not security: refused with the server's reason.
    let command = harness.say(&dave, "/approve").await;
    let reply = harness.reply_to(harness.issue, command.id).await;
    assert!(
        reply.body.contains("not a member of security"),
        "{}",
        reply.body
    );
    harness.say(&alice, "/approve").await;
    harness
        .request_comment_where(comment.id, "the progress", |body| {
            body.contains("1 of 2 from security")
        })
        .await;

    let reminder = harness
        .github
        .wait_for("the reminder", PATIENCE, |github| {
            github
                .comments(REPO, harness.issue)
                .into_iter()
                .find(|c| c.body.contains("Reminder"))
        })
        .await;
    // alice approved: the reminder says what is missing, not "no decision from security".
    assert!(
        reminder
            .body
            .contains("**Reminder**: only 1 of 2 approvals from security after "),
        "{}",
        reminder.body
    );
    assert!(reminder.body.contains("@bob-gh"), "{}", reminder.body);
    assert!(
        !reminder.body.contains("@dave-gh"),
        "not in security: {}",
        reminder.body
    );
    assert!(
        !reminder.body.contains("@alice-gh"),
        "approved already: {}",
        reminder.body
    );
    assert_eq!(
        harness.approval(&approval.id).await.state(),
        pb::ApprovalState::Pending
    );
}

/// An escalation brings a pending approval to the escalation group's issue as well.
#[tokio::test]
async fn an_escalation_posts_the_request_on_the_escalation_groups_issue() {
    let harness =
        Harness::start_with_server_toml(Mode::Webhook, countersign_testkit::docs::groups_example())
            .await;
    // The example's security group is shown on acme/infra#7.
    let mut infra_issue = 0;
    for n in 1..=7 {
        infra_issue = harness
            .github
            .add_issue("acme/infra", &format!("issue {n}"));
    }
    assert_eq!(infra_issue, 7);
    let approval = harness
        .request_approval(pb::RequestApprovalRequest {
            approver_groups: vec![quorum("db", 1)],
            follow_up: Some(pb::FollowUp {
                escalate_after_seconds: 1,
                escalate_to: "security".into(),
                ..Default::default()
            }),
            ..harness.request("call-escalated", "")
        })
        .await;
    harness.request_comment(&approval.id).await;
    let escalated = harness
        .github
        .wait_for("the request on the escalation issue", PATIENCE, |github| {
            github
                .comments("acme/infra", infra_issue)
                .into_iter()
                .find(|c| marked_approval_id(&c.body) == Some(approval.id.as_str()))
        })
        .await;
    assert!(
        escalated.body.contains("escalated to security"),
        "{}",
        escalated.body
    );
}

/// With a state directory the restarted worker resumes its watch after the cursor, so no
/// event of an approval it had fully handled comes again: it still adopts the request comment
/// of every pending approval, applies the command written under it while it was down (webhooks
/// only: GitHub does not deliver that one again), and a command written after the restart.
#[tokio::test]
async fn with_a_state_dir_a_resumed_worker_applies_commands_on_earlier_requests() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.start_worker().await;
    let first = harness.request_approval(harness.request("first", "")).await;
    let comment = harness.request_comment(&first.id).await;
    wait_delivered(&harness, &first.id).await;
    harness.stop_worker().await;
    assert!(state.path().join("watch-cursor").exists());
    let written_while_down = harness.github.add_comment(
        REPO,
        harness.issue,
        &harness.writer,
        &format!("/approve {}", short_id(&first.id)),
    );
    let second = harness
        .request_approval(harness.request("second", ""))
        .await;

    harness.start_worker().await;
    let resolved = harness.resolved(&first.id).await;
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        written_while_down.id.to_string()
    );
    assert_eq!(
        harness.reactions(written_while_down.id, 1).await,
        vec!["+1"]
    );
    harness
        .request_comment_where(comment.id, "the approved comment", |body| {
            body.contains("✅ **Approved** by @alice")
        })
        .await;
    harness.request_comment(&second.id).await;
    let command = harness
        .say(
            &harness.writer,
            &format!("/reject {} not now", short_id(&second.id)),
        )
        .await;
    assert_eq!(
        harness.resolved(&second.id).await.state(),
        pb::ApprovalState::Rejected
    );
    assert_eq!(harness.reactions(command.id, 1).await, vec!["-1"]);
}

/// Two requests pending on one issue, and commands written under them while the worker was
/// down. The restarted worker checks them only once both requests are adopted (here the
/// second adoption's read is held): a bare `/approve` is refused as ambiguous instead of
/// approving the one adopted first, and `/approve <second>` approves the second instead of
/// being answered "unknown id". Each issue is listed once.
#[tokio::test]
async fn commands_written_while_down_wait_until_every_pending_request_is_adopted() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.start_worker().await;
    let first = harness.request_approval(harness.request("first", "")).await;
    let second = harness
        .request_approval(harness.request("second", ""))
        .await;
    wait_delivered(&harness, &first.id).await;
    wait_delivered(&harness, &second.id).await;
    harness.stop_worker().await;
    let bare = harness
        .github
        .add_comment(REPO, harness.issue, &harness.writer, "/approve");
    let named = harness.github.add_comment(
        REPO,
        harness.issue,
        &harness.writer,
        &format!("/approve {}", short_id(&second.id)),
    );

    let (read_before, listed_before) = (
        harness.github.requests_to(Endpoint::GetComment).len(),
        harness.github.requests_to(Endpoint::ListComments).len(),
    );
    harness.github.hold_after(Endpoint::GetComment, 1);
    harness.start_worker().await;
    harness
        .github
        .wait_for(
            "the second adoption's read",
            Duration::from_secs(20),
            |github| {
                (github.requests_to(Endpoint::GetComment).len() >= read_before + 2).then_some(())
            },
        )
        .await;
    // One request adopted, the other not yet: nothing listed, nothing checked.
    assert_eq!(
        harness.github.requests_to(Endpoint::ListComments).len(),
        listed_before
    );
    harness.github.release(Endpoint::GetComment);

    approved_by(&harness, &second.id, &named).await;
    let reply = harness.reply_to(harness.issue, bare.id).await;
    assert!(
        reply.body.contains("several approvals are pending"),
        "{}",
        reply.body
    );
    assert_eq!(harness.reactions(bare.id, 1).await, vec!["confused"]);
    assert!(harness.approval(&first.id).await.decisions.is_empty());
    assert_eq!(
        harness.github.requests_to(Endpoint::ListComments).len(),
        listed_before + 1,
        "one catch-up listing for the issue"
    );
}

/// GitHub cannot answer the read of a pending approval's request comment at a start (502
/// past every attempt). The comment stays the approval's, with a body taken as unknown: a
/// command under it is applied, and the comment is rewritten to show the outcome.
#[tokio::test]
async fn a_request_comment_unreadable_at_a_start_still_takes_commands() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.max_attempts = Some(2);
    harness.start_worker().await;
    let approval = harness
        .request_approval(harness.request("unreadable", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;
    restart_with_failing_reads(&mut harness, 2, Failure::BadGateway).await;
    let command = harness.say(&harness.writer, "/approve").await;
    approved_by(&harness, &approval.id, &command).await;
    harness
        .request_comment_where(comment.id, "the approved comment", |body| {
            body.contains("✅ **Approved** by @alice")
        })
        .await;
}

/// One of a pending approval's two request comments is on an issue deleted while the worker
/// was down (410). The restarted worker leaves that one alone and adopts the other: a command
/// under it is applied.
#[tokio::test]
async fn a_deleted_issue_does_not_cost_the_approval_its_other_request() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.start_worker().await;
    let other = harness.github.add_issue(REPO, "a second issue");
    let mut request = harness.request("two-issues", "");
    request.routes.push(pb::Route {
        channel: "github".to_string(),
        target: format!("{REPO}#{other}"),
    });
    let approval = harness.request_approval(request).await;
    harness.request_comment(&approval.id).await;
    harness.request_comment_on(other, &approval.id).await;
    for _ in 0..200 {
        if harness.approval(&approval.id).await.deliveries.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(harness.approval(&approval.id).await.deliveries.len(), 2);
    let read_before = restart_with_failing_reads(&mut harness, 1, Failure::Gone).await;
    // The comment read second is the one still there.
    let readable = harness.github.requests_to(Endpoint::GetComment)[read_before + 1]
        .path
        .clone();
    let issue = if harness
        .github
        .comments(REPO, other)
        .iter()
        .any(|c| readable.ends_with(&format!("/comments/{}", c.id)))
    {
        other
    } else {
        harness.issue
    };
    let command = harness.say_on(issue, &harness.writer, "/approve").await;
    approved_by(&harness, &approval.id, &command).await;
}

/// The catch-up listing of a restarted worker fails (502 past every attempt): it is tried
/// again, and the command written while the worker was down is applied.
#[tokio::test]
async fn a_failed_catch_up_listing_is_tried_again() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    harness.max_attempts = Some(2);
    harness.start_worker().await;
    let approval = harness
        .request_approval(harness.request("unlisted", ""))
        .await;
    wait_delivered(&harness, &approval.id).await;
    harness.stop_worker().await;
    let command = harness
        .github
        .add_comment(REPO, harness.issue, &harness.writer, "/approve");

    harness
        .github
        .fail_next(Endpoint::ListComments, 2, Failure::BadGateway);
    harness.start_worker().await;
    approved_by(&harness, &approval.id, &command).await;
    assert_eq!(harness.reactions(command.id, 1).await, vec!["+1"]);
}

/// A TCP relay between the worker and the server that the test can cut: while cut, every
/// connection is dropped at once.
struct Relay {
    addr: std::net::SocketAddr,
    open: Arc<std::sync::atomic::AtomicBool>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (accepting, tasks) = (Arc::clone(&open), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accepting.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let relayed = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                tasks.lock().expect("relay tasks").push(relayed);
            }
        });
        Relay {
            addr,
            open,
            connections,
            task,
        }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for connection in self.connections.lock().expect("relay tasks").drain(..) {
            connection.abort();
        }
    }

    fn mend(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// In mid-run the worker loses the server for longer than the server keeps events: it
/// resumes with a snapshot. An approval it showed as pending, cancelled in the gap behind
/// more newer resolved approvals than the correction pass looks at (50), still gets its
/// comment corrected: what the worker shows as pending counts as unfinished.
#[tokio::test]
async fn a_comment_resolved_in_a_gap_past_retention_is_corrected() {
    let server = countersign_testkit::server::TestServer::start_with(|config| {
        config.watch.retention_seconds = 1;
        config.approvals.sweep_interval_ms = 100;
    })
    .await;
    let mut harness = Harness::with_server_without_worker(Mode::Webhook, server).await;
    let relay = Relay::start(harness.server.addr()).await;
    let mut file = harness.file_config();
    file.server.url = format!("http://{}", relay.addr);
    file.server.max_backoff_secs = 1;
    let config = countersign_github::Settings::from_file(file, common::no_environment)
        .expect("worker config");
    harness.worker = Some(
        countersign_github::Worker::start(config)
            .await
            .expect("start the worker"),
    );
    let approval = harness.request_approval(harness.request("old", "")).await;
    let comment = harness.request_comment(&approval.id).await;
    wait_delivered(&harness, &approval.id).await;

    let mut watch = harness
        .agent
        .watch(countersign_client::WatchOptions::channel("github"));
    watch.next().await.expect("a snapshot");
    let head_at_cut = watch.cursor().expect("the head seq");
    drop(watch);
    relay.cut();
    cancel_behind_60_newer(&harness, &approval.id).await;
    // Until the server no longer keeps the events after the cut (it keeps the newest).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut resumed = harness.agent.watch(countersign_client::WatchOptions {
            resume_after: Some(head_at_cut.clone()),
            ..countersign_client::WatchOptions::channel("github")
        });
        if let countersign_client::WatchItem::Snapshot(_) =
            resumed.next().await.expect("a watch item")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "events after {} never pruned",
            head_at_cut.seq
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.mend();

    harness
        .request_comment_where(comment.id, "the cancelled comment", |body| {
            body.contains("🚫 **Cancelled**: superseded")
        })
        .await;
}

/// The worker process is killed while GitHub holds the answer to its post (the outbox has
/// the intent only), and the approval is cancelled while it is down. The restarted worker
/// posts nothing, finds the comment by its marker, records it, edits it to the outcome and
/// settles the outbox entry.
#[tokio::test]
async fn a_post_cut_off_by_a_crash_for_an_approval_resolved_meanwhile_is_corrected() {
    let harness = Harness::start_without_worker(Mode::Webhook).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let state = tempfile::tempdir().expect("a state directory");
    let config_path = write_worker_config(
        &harness,
        dir.path(),
        &format!(
            "state_dir = {:?}\n\n[webhook]\nlisten = \"127.0.0.1:0\"\nsecret = \"unused-by-this-test\"\n",
            state.path().display().to_string()
        ),
    );

    harness.github.hold(Endpoint::CreateComment);
    let mut first_run = spawn_worker_process(&config_path);
    let approval = harness
        .request_approval(harness.request("call-cut-off", ""))
        .await;
    let comment = harness.request_comment(&approval.id).await;
    first_run.kill().await.expect("kill the worker");
    harness.github.release(Endpoint::CreateComment);
    harness
        .agent
        .cancel_approval(&approval.id, "superseded")
        .await
        .expect("cancel");

    let mut second_run = spawn_worker_process(&config_path);
    harness
        .request_comment_where(comment.id, "the cancelled comment", |body| {
            body.contains("🚫 **Cancelled**: superseded")
        })
        .await;
    let delivered = wait_delivered(&harness, &approval.id).await;
    assert_eq!(delivered.message_ref, format!("comment/{}", comment.id));
    assert_eq!(harness.github.requests_to(Endpoint::CreateComment).len(), 1);
    let outbox = std::fs::read_to_string(state.path().join("outbox.jsonl")).expect("the outbox");
    assert!(outbox.contains(r#""op":"done""#), "{outbox}");
    second_run.kill().await.expect("kill the worker");
}

/// An earlier run's outbox names a comment it posted (its id known, the delivery not yet
/// recorded) that has since been deleted, and the approval is no longer pending. The worker
/// settles that entry instead of keeping it (and the approval) unfinished for ever; it posts
/// nothing.
#[tokio::test]
async fn an_outbox_entry_for_a_deleted_comment_is_settled() {
    let state = tempfile::tempdir().expect("a state directory");
    let mut harness = Harness::start_without_worker(Mode::Webhook).await;
    harness.state_dir = Some(state.path().to_owned());
    let approval = harness
        .request_approval(harness.request("deleted-comment", ""))
        .await;
    harness
        .agent
        .cancel_approval(&approval.id, "superseded")
        .await
        .expect("cancel");
    let outbox_path = state.path().join("outbox.jsonl");
    std::fs::write(
        &outbox_path,
        format!(
            "{{\"op\":\"intent\",\"id\":1,\"key\":\"{id}\",\"target\":\"{REPO}#{issue}\",\"after\":null}}\n{{\"op\":\"sent\",\"id\":1,\"message_ref\":\"comment/987654321\"}}\n",
            id = approval.id,
            issue = harness.issue
        ),
    )
    .expect("write the outbox");

    harness.start_worker().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let outbox = std::fs::read_to_string(&outbox_path).expect("the outbox");
        if outbox.contains(r#""op":"done""#) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the entry was never settled: {outbox}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(harness
        .github
        .requests_to(Endpoint::CreateComment)
        .is_empty());
    assert!(harness.approval(&approval.id).await.deliveries.is_empty());
}

/// Waits until `approval_id` is resolved, and checks it was approved by `command`.
async fn approved_by(harness: &Harness, approval_id: &str, command: &Comment) {
    let resolved = harness.resolved(approval_id).await;
    assert_eq!(resolved.state(), pb::ApprovalState::Approved);
    assert_eq!(
        resolved.decisions[0].idempotency_key,
        command.id.to_string()
    );
}

/// Restarts the worker with the next `count` reads of a comment answered with `failure`, and
/// waits for the second read of its start-up adoption; returns the reads made before.
async fn restart_with_failing_reads(
    harness: &mut Harness,
    count: usize,
    failure: Failure,
) -> usize {
    harness.stop_worker().await;
    let read_before = harness.github.requests_to(Endpoint::GetComment).len();
    harness
        .github
        .fail_next(Endpoint::GetComment, count, failure);
    harness.start_worker().await;
    harness
        .github
        .wait_for("two reads of the adoption", PATIENCE, |github| {
            (github.requests_to(Endpoint::GetComment).len() >= read_before + 2).then_some(())
        })
        .await;
    read_before
}

/// Cancels `approval_id`, then requests and cancels 60 more: more newer resolved approvals
/// than the correction pass after a snapshot looks at (50).
async fn cancel_behind_60_newer(harness: &Harness, approval_id: &str) {
    harness
        .agent
        .cancel_approval(approval_id, "superseded")
        .await
        .expect("cancel");
    for n in 0..60 {
        let newer = harness
            .request_approval(harness.request(&format!("newer-{n}"), ""))
            .await;
        harness
            .agent
            .cancel_approval(&newer.id, "superseded")
            .await
            .expect("cancel");
    }
}

/// A start without a state directory: the snapshot shows the pending approval while the
/// start-up adoption is reading its request comment (held here). The comment is read once,
/// not once by each, and a command under it is applied.
#[tokio::test]
async fn a_start_adopts_a_pending_request_once() {
    let mut harness = Harness::start(Mode::Webhook).await;
    let approval = harness
        .request_approval(harness.request("adopted-once", ""))
        .await;
    wait_delivered(&harness, &approval.id).await;
    harness.stop_worker().await;

    let read_before = harness.github.requests_to(Endpoint::GetComment).len();
    harness.github.hold(Endpoint::GetComment);
    harness.start_worker().await;
    harness
        .github
        .wait_for("the adoption's read", PATIENCE, |github| {
            (github.requests_to(Endpoint::GetComment).len() > read_before).then_some(())
        })
        .await;
    // Time for the snapshot's show to read it too, were it to.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        harness.github.requests_to(Endpoint::GetComment).len(),
        read_before + 1
    );
    harness.github.release(Endpoint::GetComment);

    let command = harness.say(&harness.writer, "/approve").await;
    approved_by(&harness, &approval.id, &command).await;
    assert_eq!(
        harness.github.requests_to(Endpoint::GetComment).len(),
        read_before + 1
    );
}
