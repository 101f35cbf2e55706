//! The version a decision names: an edit restarts a quorum's count, and consume is bound to the edited version.

use super::*;

#[tokio::test]
async fn with_a_quorum_an_edit_restarts_the_count_and_approvals_must_name_the_version() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let original = r#"{"env": "staging", "service": "api"}"#;
    let approval = create(&mut client, call("k1", "deploy", original, 2)).await;

    let first = client
        .decide(approve(&approval.id, "3003", "c1", "", ""))
        .await
        .expect("carol approves the request as it is")
        .into_inner();
    assert_eq!(first.outcome(), pb::DecideOutcome::Recorded);

    let edited = r#"{"env": "staging", "service": "api", "dry_run": true}"#;
    let edit = client
        .decide(approve(&approval.id, "1001", "a1", "", edited))
        .await
        .expect("alice approves an edit")
        .into_inner();
    assert_eq!(
        edit.outcome(),
        pb::DecideOutcome::Recorded,
        "the count restarted"
    );
    let now = edit.approval.expect("approval");
    let made = now.decisions.last().expect("alice's decision");
    assert!(
        made.restarts_count,
        "the edit is marked as restarting the count"
    );
    assert_eq!(now.edited_args_digest, digest_of(edited));

    // Carol approved the old version: approving again without naming a version, or naming the
    // old one, is refused and changes nothing.
    for expected in [String::new(), digest_of(original)] {
        let stale = refused(
            &mut client,
            approve(&approval.id, "3003", "c2", &expected, ""),
        )
        .await;
        assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
        assert!(stale.message().contains(&digest_of(edited)), "{stale:?}");
    }
    assert_eq!(
        state(&get(&mut client, &approval.id).await),
        pb::ApprovalState::Pending
    );

    let second = client
        .decide(approve(&approval.id, "3003", "c3", &digest_of(edited), ""))
        .await
        .expect("carol approves the edited version")
        .into_inner();
    assert_eq!(second.outcome(), pb::DecideOutcome::Resolved);
    let approved = second.approval.expect("approval");
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    let deciders: Vec<String> = approved
        .resolution
        .expect("resolution")
        .deciders
        .iter()
        .map(|d| d.user_id.clone())
        .collect();
    assert_eq!(
        deciders,
        ["1001", "3003"],
        "only approvals of the edited version"
    );
}

/// A runtime that reports running the original arguments of an edited approval is refused
/// and consumes nothing; reporting the edited version consumes it.
#[tokio::test]
async fn consume_is_bound_to_the_edited_version() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let original = r#"{"command": "make clean"}"#;
    let edited = r#"{"command": "make clean-cache"}"#;
    let approval = create(&mut client, call("k1", "bash", original, 1)).await;
    let consume_ran = |digest: String| pb::ConsumeRequest {
        approval_id: approval.id.clone(),
        outcome: pb::ConsumeOutcome::Succeeded as i32,
        detail: String::new(),
        args_digest: digest,
    };
    // Not approved yet: nothing ran that could be reported.
    let early = client
        .consume(consume_ran(digest_of(original)))
        .await
        .unwrap_err();
    assert_eq!(early.code(), Code::FailedPrecondition, "{early:?}");
    client
        .decide(approve(&approval.id, "1001", "a1", "", edited))
        .await
        .expect("approve with edits");

    let refused = client
        .consume(consume_ran(digest_of(original)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains(&digest_of(edited)),
        "{}",
        refused.message()
    );
    let malformed = client
        .consume(consume_ran("not-a-digest".into()))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed:?}");
    assert!(malformed.message().contains("args_digest"));
    let unchanged = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&unchanged), pb::ApprovalState::Approved);

    let consumed = client
        .consume(consume_ran(digest_of(edited)))
        .await
        .expect("the edited version consumes")
        .into_inner();
    assert_eq!(state(&consumed), pb::ApprovalState::Consumed);
}
