//! Edits on the audit trail: redaction keeps an approved edit until it is consumed, and edited arguments changed by hand fail VerifyAudit.

use super::*;

/// With `storage.redact_arguments`, the edited arguments stay until the call is consumed (the
/// runtime needs them to run it), and are blanked then, the digests staying.
#[tokio::test]
async fn redaction_keeps_an_approved_edit_until_the_call_is_consumed() {
    let server = server_redacting(true).await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        call("k1", "bash", r#"{"command": "make clean"}"#, 1),
    )
    .await;
    let edited = r#"{"command": "make clean-cache"}"#;
    client
        .decide(approve(&approval.id, "1001", "a1", "", edited))
        .await
        .expect("approve with edits");
    let approved = get(&mut client, &approval.id).await;
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    assert!(
        approved.arguments_json.is_empty(),
        "the request's arguments are redacted"
    );
    assert_eq!(
        approved.edited_arguments_json, edited,
        "the edit stays to be run"
    );

    let consumed = consume(&mut client, &approval.id).await;
    assert!(consumed.edited_arguments_json.is_empty());
    assert_eq!(consumed.edited_args_digest, digest_of(edited));
    let stored = get(&mut client, &approval.id).await;
    assert!(stored.edited_arguments_json.is_empty());
    assert!(stored
        .decisions
        .iter()
        .all(|d| d.edited_arguments_json.is_empty()));
    let verified = verify(&server).await;
    assert!(verified.intact, "{verified:?}");
}

/// The edited arguments in an approval's row are covered by their digest, which the chained
/// decision event carries: changing them by hand breaks VerifyAudit.
#[tokio::test]
async fn edited_arguments_changed_by_hand_fail_verify_audit() {
    let server = edit_server().await;
    let mut client = connect(&server).await;
    let approval = create(
        &mut client,
        call("k1", "bash", r#"{"command": "make clean"}"#, 1),
    )
    .await;
    client
        .decide(approve(
            &approval.id,
            "1001",
            "a1",
            "",
            r#"{"command": "make clean-cache"}"#,
        ))
        .await
        .expect("approve with edits");
    assert!(verify(&server).await.intact);

    let changed = tamper(
        &server,
        &format!(
            "UPDATE approvals SET body = replace(body, 'clean-cache', 'rm-everything') WHERE id = '{}'",
            approval.id
        ),
    )
    .await;
    assert_eq!(changed, 1);
    let report = verify(&server).await;
    assert!(!report.intact, "{report:?}");
    assert!(
        report.problem.contains("edited arguments do not match"),
        "{report:?}"
    );
}
