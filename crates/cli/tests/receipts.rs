//! Decision receipts at the agent's end (docs/security.md#decision-receipts): the hook lets a
//! call run only when the receipt verifies against the pinned key set for exactly that call,
//! and `countersign verify` checks one offline, naming what did not match.

use crate::support;

use std::process::Output;

use countersign_client::pb;
use countersign_testkit::mitm::{RewritingProxy, STATE_APPROVED, STATE_REJECTED};
use countersign_testkit::server::TestServer;
use serde_json::{json, Value};
use support::*;

/// Claude Code's PreToolUse input for `command` in `session`.
fn pre_tool_use(session: &str, call_id: &str) -> Vec<u8> {
    let mut payload = fixture("claude-code/pre-tool-use.json");
    payload["session_id"] = json!(session);
    payload["tool_use_id"] = json!(call_id);
    serde_json::to_vec(&payload).unwrap()
}

/// What the hook answered Claude Code: (permissionDecision, permissionDecisionReason).
fn decision(output: &Output) -> (String, String) {
    let answer: Value = serde_json::from_str(stdout(output).trim())
        .unwrap_or_else(|_| panic!("stdout: {}\nstderr: {}", stdout(output), stderr(output)));
    let text = |name: &str| {
        answer["hookSpecificOutput"][name]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (text("permissionDecision"), text("permissionDecisionReason"))
}

/// Runs the hook against `url` (the server, or a proxy in front of it) with `extra` flags
/// while an approver decides `verdict` on the real server.
async fn hook_decided(
    server: &TestServer,
    url: &str,
    call_id: &str,
    verdict: pb::Verdict,
    extra: &[&str],
) -> (Output, pb::Approval) {
    let mut watch = watch_requests(&server.url()).await;
    let mut command = countersign(url);
    command.args(["hook", "claude-code"]).args(extra);
    let input = pre_tool_use("receipts", call_id);
    let mut hook = tokio::spawn(async move { run_with_input(command, &input).await });
    // A hook that answers before its request shows up says why (rather than a watch's timeout).
    let approval = tokio::select! {
        approval = next_pending(&mut watch) => approval,
        output = &mut hook => {
            let output = output.unwrap();
            panic!("the hook answered before a request was seen:\nstdout: {}\nstderr: {}", stdout(&output), stderr(&output))
        }
    };
    decide(
        &client(&server.url()),
        &approval.id,
        verdict,
        pb::Scope::Once,
        "",
    )
    .await;
    (hook.await.unwrap(), approval)
}

#[tokio::test]
async fn the_hook_refuses_a_rejection_a_man_in_the_middle_turned_into_an_approval() {
    let server = TestServer::start().await;
    let proxy = RewritingProxy::start(server.addr(), STATE_REJECTED, STATE_APPROVED).await;
    let (output, approval) = hook_decided(
        &server,
        &proxy.url(),
        "toolu_mitm",
        pb::Verdict::Reject,
        &[],
    )
    .await;
    assert!(
        proxy.rewrites() > 0,
        "the proxy turned REJECTED into APPROVED"
    );
    let (permission, reason) = decision(&output);
    assert_eq!(permission, "deny", "{reason}");
    assert_eq!(
        reason,
        format!(
            "countersign: approval {} is not run: the decision receipt does not verify: the receipt's verdict is REJECT, not APPROVE",
            approval.id
        )
    );
}

#[tokio::test]
async fn the_hook_runs_an_approved_call_only_under_the_pinned_key_set() {
    let server = TestServer::start().await;
    let keys = client(&server.url()).signing_keys().await.unwrap();
    let (output, _) = hook_decided(
        &server,
        &server.url(),
        "toolu_pinned",
        pb::Verdict::Approve,
        &["--receipt-pin", &keys.fingerprint],
    )
    .await;
    assert_eq!(decision(&output).0, "allow", "{}", stderr(&output));

    let other = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";
    let (output, approval) = hook_decided(
        &server,
        &server.url(),
        "toolu_other_pin",
        pb::Verdict::Approve,
        &["--receipt-pin", other],
    )
    .await;
    let (permission, reason) = decision(&output);
    assert_eq!(permission, "deny");
    assert_eq!(
        reason,
        format!(
            "countersign: approval {} is not run: the decision receipt does not verify: the key set's fingerprint is {}, not the pinned {other}",
            approval.id, keys.fingerprint
        )
    );
}

#[tokio::test]
async fn the_hook_keeps_the_pinned_key_set_and_reads_it_again_only_when_the_kept_one_does_not_verify(
) {
    let server = TestServer::start().await;
    let keys = client(&server.url()).signing_keys().await.unwrap();
    let pin = ["--receipt-pin", keys.fingerprint.as_str()];
    let kept = cache_home()
        .join("countersign/receipt-keys")
        .join(format!("{}.jwks.json", keys.fingerprint));
    // A man in the middle that spoils every key set the server sends.
    let spoiling = RewritingProxy::start(server.addr(), b"\"OKP\"", b"\"RSA\"").await;

    // Nothing kept yet: the hook reads the set, through the proxy, and refuses the call.
    let (output, _) = hook_decided(
        &server,
        &spoiling.url(),
        "toolu_unkept",
        pb::Verdict::Approve,
        &pin,
    )
    .await;
    let (permission, reason) = decision(&output);
    assert_eq!(permission, "deny", "{reason}");
    assert!(reason.contains("is not an Ed25519 key"), "{reason}");
    assert!(!kept.exists(), "a spoiled key set was kept");

    // From the server itself: allowed, and the set is kept.
    let (output, _) = hook_decided(
        &server,
        &server.url(),
        "toolu_kept",
        pb::Verdict::Approve,
        &pin,
    )
    .await;
    assert_eq!(decision(&output).0, "allow", "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), keys.jwks_json);

    // Through the proxy again: the kept set verifies the receipt, no key set is read.
    let spoiled_before = spoiling.rewrites();
    let (output, _) = hook_decided(
        &server,
        &spoiling.url(),
        "toolu_from_kept",
        pb::Verdict::Approve,
        &pin,
    )
    .await;
    assert_eq!(decision(&output).0, "allow", "{}", stderr(&output));
    assert_eq!(
        spoiling.rewrites(),
        spoiled_before,
        "the hook read the key set again"
    );

    // A kept file that is not the pinned set (another server's) is read again and replaced.
    let other = TestServer::start().await;
    let other_keys = client(&other.url()).signing_keys().await.unwrap();
    std::fs::write(&kept, &other_keys.jwks_json).unwrap();
    let (output, _) = hook_decided(
        &server,
        &server.url(),
        "toolu_replaced",
        pb::Verdict::Approve,
        &pin,
    )
    .await;
    assert_eq!(decision(&output).0, "allow", "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), keys.jwks_json);
}

/// The receipt with claim `name` set to `value`, its signature kept.
fn altered_claim(receipt: &str, name: &str, value: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let parts: Vec<&str> = receipt.split('.').collect();
    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims[name] = json!(value);
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

/// The receipt with one character of its signature changed.
fn altered_signature(receipt: &str) -> String {
    let (signed, signature) = receipt.rsplit_once('.').unwrap();
    let mut chars: Vec<char> = signature.chars().collect();
    chars[4] = if chars[4] == 'A' { 'B' } else { 'A' };
    format!("{signed}.{}", chars.into_iter().collect::<String>())
}

#[tokio::test]
async fn verify_checks_a_receipt_offline_and_names_what_does_not_match() {
    let server = TestServer::start().await;
    let sdk = client(&server.url());
    let arguments =
        r#"{"path": "/srv/app", "note": "caf\u00e9 \ud83d\ude80", "n": [1.0, 1e3, -0]}"#;
    let requested = sdk
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "agent".into(),
            idempotency_key: "call-1".into(),
            tool_name: "deploy".into(),
            arguments_json: arguments.into(),
            action: "deploy".into(),
            risk: pb::Risk::High.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .approval
        .unwrap();
    approve(&sdk, &requested.id, pb::Scope::Once, "").await;
    let approval = sdk.get_approval(&requested.id).await.unwrap();
    let keys = sdk.signing_keys().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, &keys.jwks_json).unwrap();
    // The same call, written differently: the canonical digest is the same.
    let same = dir.path().join("same.json");
    std::fs::write(
        &same,
        r#"{"n":[1,1000,0],"note":"café 🚀","path":"/srv/app"}"#,
    )
    .unwrap();
    let other = dir.path().join("other.json");
    std::fs::write(
        &other,
        r#"{"path": "/srv/other", "note": "café 🚀", "n": [1, 1000, 0]}"#,
    )
    .unwrap();

    // Offline: no server at this address.
    let verify = |receipt: String, args: &std::path::Path, approval_id: &str, pin: &str| {
        let mut command = countersign("http://127.0.0.1:1");
        command
            .args(["verify", &receipt, "--keys"])
            .arg(&jwks)
            .arg("--args")
            .arg(args);
        command.args(["--approval", approval_id, "--receipt-pin", pin]);
        run_with_input(command, b"")
    };
    let ok = verify(
        approval.receipt.clone(),
        &same,
        &approval.id,
        &keys.fingerprint,
    )
    .await;
    assert_exit(&ok, 0);
    let claims: Value = serde_json::from_str(&stdout(&ok)).unwrap();
    assert_eq!(
        claims["claims"]["args_digest"],
        approval.args_digest.as_str()
    );
    assert_eq!(claims["fingerprint"], keys.fingerprint.as_str());

    let refused = |output: &Output, expected: &str| {
        assert_exit(output, 70);
        assert!(
            stderr(output).contains(expected),
            "expected {expected:?} in {}",
            stderr(output)
        );
    };
    let fingerprint = keys.fingerprint.as_str();
    refused(
        &verify(approval.receipt.clone(), &other, &approval.id, fingerprint).await,
        "the receipt approves arguments with digest",
    );
    refused(
        &verify(
            approval.receipt.clone(),
            &same,
            "0190aaaa-0000-7000-8000-000000000000",
            fingerprint,
        )
        .await,
        &format!("the receipt is for approval {}, not 0190aaaa", approval.id),
    );
    for forged in [
        altered_claim(&approval.receipt, "args_digest", &"0".repeat(64)),
        altered_claim(&approval.receipt, "verdict", "REJECT"),
        altered_claim(
            &approval.receipt,
            "approval_id",
            "0190aaaa-0000-7000-8000-000000000000",
        ),
        altered_signature(&approval.receipt),
    ] {
        refused(
            &verify(forged, &same, &approval.id, fingerprint).await,
            "the receipt's signature does not verify with key",
        );
    }
    refused(
        &verify(
            approval.receipt.clone(),
            &same,
            &approval.id,
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k",
        )
        .await,
        "the key set's fingerprint is",
    );
}

#[tokio::test]
async fn exec_does_not_run_a_command_whose_rejection_a_man_in_the_middle_turned_into_an_approval() {
    let server = TestServer::start().await;
    let proxy = RewritingProxy::start(server.addr(), STATE_REJECTED, STATE_APPROVED).await;
    let dir = tempfile::tempdir().unwrap();
    let mut watch = watch_requests(&server.url()).await;
    let mut command = countersign(&proxy.url());
    command
        .args(["exec", "--", "sh", "-c", "echo ran > mark"])
        .current_dir(dir.path());
    let exec = tokio::spawn(async move { run_with_input(command, b"").await });
    let approval = next_pending(&mut watch).await;
    decide(
        &client(&server.url()),
        &approval.id,
        pb::Verdict::Reject,
        pb::Scope::Once,
        "no",
    )
    .await;
    let output = exec.await.unwrap();
    assert!(proxy.rewrites() > 0);
    assert_exit(&output, 70);
    assert!(
        stderr(&output).contains(
            "not running the command: the decision receipt does not verify: the receipt's verdict is REJECT, not APPROVE"
        ),
        "{}",
        stderr(&output)
    );
    assert!(!dir.path().join("mark").exists(), "the command did not run");
}
