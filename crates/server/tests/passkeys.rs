//! Passkey step-up through gRPC over a real socket (docs/security.md#passkey-step-up): a rule's
//! `step_up = "passkey"` makes an approval approvable only with an assertion of the decider's
//! registered passkey made for that approval's challenge. The authenticator here is a software
//! one (Ed25519, attestation "none"), answering as WebAuthn §6 describes; the browser's own
//! virtual authenticator drives the same RPCs in the web inbox's e2e tests.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use countersign_core::receipt::{verify_receipt, KeySet};
use countersign_core::step_up;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;
use ed25519_dalek::{Signer as _, SigningKey};
use sha2::{Digest as _, Sha256};

use crate::common::*;

const INBOX: &str = "http://localhost:8080";

const CONFIG: &str = r#"
[passkeys]
inbox_url = "http://localhost:8080"

[[rules]]
name = "deploys need a passkey"
action = "require"
step_up = "passkey"
[rules.match]
tool = "deploy"
"#;

/// A software authenticator with one Ed25519 credential for relying party `localhost`.
struct Authenticator {
    key: SigningKey,
    credential_id: Vec<u8>,
    counter: u32,
}

fn cbor_head(major: u8, n: usize) -> Vec<u8> {
    match n {
        0..=23 => vec![(major << 5) | n as u8],
        _ => vec![(major << 5) | 24, n as u8],
    }
}

fn cbor_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = if bytes.len() > 0xff {
        let mut head = vec![(2 << 5) | 25];
        head.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        head
    } else {
        cbor_head(2, bytes.len())
    };
    out.extend_from_slice(bytes);
    out
}

fn cbor_text(text: &str) -> Vec<u8> {
    let mut out = cbor_head(3, text.len());
    out.extend_from_slice(text.as_bytes());
    out
}

impl Authenticator {
    fn new(seed: u8) -> Authenticator {
        Authenticator {
            key: SigningKey::from_bytes(&[seed; 32]),
            credential_id: vec![seed; 16],
            counter: 0,
        }
    }

    fn credential_id(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.credential_id)
    }

    fn auth_data(&self, attested: bool) -> Vec<u8> {
        let mut out = Sha256::digest(b"localhost").to_vec();
        // UP and UV, and AT when the credential is attested.
        out.push(0x05 | if attested { 0x40 } else { 0 });
        out.extend_from_slice(&self.counter.to_be_bytes());
        if attested {
            out.extend_from_slice(&[0u8; 16]);
            out.extend_from_slice(&(self.credential_id.len() as u16).to_be_bytes());
            out.extend_from_slice(&self.credential_id);
            // COSE_Key {1: 1 (OKP), 3: -8 (EdDSA), -1: 6 (Ed25519), -2: x}
            out.extend_from_slice(&[0xa4, 0x01, 0x01, 0x03, 0x27, 0x20, 0x06, 0x21]);
            out.extend_from_slice(&cbor_bytes(self.key.verifying_key().as_bytes()));
        }
        out
    }

    fn client_data(kind: &str, challenge: &[u8]) -> Vec<u8> {
        serde_json::json!({
            "type": kind,
            "challenge": URL_SAFE_NO_PAD.encode(challenge),
            "origin": INBOX,
        })
        .to_string()
        .into_bytes()
    }

    fn register(&self, user: &str) -> pb::RegisterPasskeyRequest {
        let challenge = b"a registration challenge".to_vec();
        let mut attestation = vec![0xa3];
        attestation.extend_from_slice(&cbor_text("fmt"));
        attestation.extend_from_slice(&cbor_text("none"));
        attestation.extend_from_slice(&cbor_text("attStmt"));
        attestation.push(0xa0);
        attestation.extend_from_slice(&cbor_text("authData"));
        attestation.extend_from_slice(&cbor_bytes(&self.auth_data(true)));
        pb::RegisterPasskeyRequest {
            decider: Some(web(user)),
            client_data_json: Authenticator::client_data("webauthn.create", &challenge),
            challenge,
            attestation_object: attestation,
            name: "laptop".into(),
        }
    }

    /// An assertion for the step-up challenge of approval `id` at `digest`.
    fn assert(&mut self, id: &str, digest: &str, nonce: &str) -> pb::PasskeyAssertion {
        self.counter += 1;
        let challenge = step_up::challenge(id, digest, nonce);
        let client_data_json = Authenticator::client_data("webauthn.get", &challenge);
        let authenticator_data = self.auth_data(false);
        let mut signed = authenticator_data.clone();
        signed.extend_from_slice(&Sha256::digest(&client_data_json));
        pb::PasskeyAssertion {
            nonce: nonce.into(),
            credential_id: self.credential_id(),
            client_data_json,
            authenticator_data,
            signature: self.key.sign(&signed).to_bytes().to_vec(),
        }
    }
}

fn web(user: &str) -> pb::Decider {
    pb::Decider {
        channel: "web".into(),
        user_id: user.into(),
        display_name: user.into(),
    }
}

fn deploy(key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        tool_name: "deploy".into(),
        arguments_json: r#"{"service": "billing", "version": "2.4.1"}"#.into(),
        ..request("agent-a", key)
    }
}

fn approve_on_web(id: &str, user: &str, key: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        decider: Some(web(user)),
        ..decide(id, pb::Verdict::Approve, user, key)
    }
}

/// A server with [`CONFIG`], a client of it, and Alice's authenticator (key `seed`) with its
/// passkey registered.
async fn alices_passkey(seed: u8) -> (TestServer, Client, Authenticator, pb::Passkey) {
    let server = TestServer::start_with_toml(CONFIG).await;
    let mut client = connect(&server).await;
    let authenticator = Authenticator::new(seed);
    let registered = client
        .register_passkey(authenticator.register("alice"))
        .await
        .expect("register a passkey")
        .into_inner();
    (server, client, authenticator, registered)
}

async fn alices_passkeys(client: &mut Client) -> pb::ListPasskeysResponse {
    client
        .list_passkeys(pb::ListPasskeysRequest {
            decider: Some(web("alice")),
        })
        .await
        .expect("list passkeys")
        .into_inner()
}

#[tokio::test]
async fn a_step_up_approval_is_approved_only_with_a_passkey_assertion_made_for_it() {
    let (_server, mut client, mut authenticator, registered) = alices_passkey(3).await;
    assert_eq!(registered.credential_id, authenticator.credential_id());
    assert_eq!(
        (registered.approver.as_str(), registered.algorithm),
        ("web:alice", -8)
    );
    let listed = alices_passkeys(&mut client).await;
    assert_eq!(listed.rp_id, "localhost");
    assert_eq!(listed.passkeys, vec![registered.clone()]);

    let first = create(&mut client, deploy("deploy-1")).await;
    let second = create(&mut client, deploy("deploy-2")).await;
    assert_eq!(first.step_up, "passkey");
    assert_eq!(
        create(&mut client, request("agent-a", "plain"))
            .await
            .step_up,
        ""
    );

    // A chat tap: refused with where to approve instead; the approval stays pending.
    let tapped = client
        .decide(decide(&first.id, pb::Verdict::Approve, "alice", "tap"))
        .await
        .expect_err("a tap without a passkey is refused");
    assert_eq!(tapped.code(), tonic::Code::PermissionDenied);
    assert!(
        tapped
            .message()
            .contains(&format!("{INBOX}/approvals/{}", first.id)),
        "{}",
        tapped.message()
    );
    // An assertion made for the other approval's challenge approves nothing.
    let for_second = authenticator.assert(&second.id, &second.args_digest, "n-1");
    let swapped = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&first.id, "alice", "swapped")),
            passkey: Some(for_second),
        })
        .await
        .expect_err("an assertion for another approval is refused");
    assert_eq!(swapped.code(), tonic::Code::PermissionDenied);
    assert!(
        swapped.message().contains("challenge"),
        "{}",
        swapped.message()
    );
    // Another approver's passkey does not count for alice.
    let mut mallory = Authenticator::new(9);
    client
        .register_passkey(mallory.register("mallory"))
        .await
        .expect("mallory registers her own passkey");
    let foreign = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&first.id, "alice", "foreign")),
            passkey: Some(mallory.assert(&first.id, &first.args_digest, "n-2")),
        })
        .await
        .expect_err("another approver's passkey is refused");
    assert!(
        foreign.message().contains("not one web:alice registered"),
        "{}",
        foreign.message()
    );
    let still = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: first.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&still), pb::ApprovalState::Pending);

    let assertion = authenticator.assert(&first.id, &first.args_digest, "n-3");
    let approved = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&first.id, "alice", "passkey")),
            passkey: Some(assertion.clone()),
        })
        .await
        .expect("approve with the passkey")
        .into_inner()
        .approval
        .expect("the approval");
    assert_eq!(state(&approved), pb::ApprovalState::Approved);
    let keys = client
        .get_signing_keys(pb::GetSigningKeysRequest {})
        .await
        .expect("signing keys")
        .into_inner();
    let keys = KeySet::from_jwks(&keys.jwks_json).expect("a key set");
    let claims = verify_receipt(&approved.receipt, &keys).expect("the receipt verifies");
    assert_eq!(
        claims.step_up,
        Some(serde_json::json!([{
            "method": "passkey",
            "credential_id": authenticator.credential_id(),
            "approver": "web:alice",
        }]))
    );
    // The same assertion again (its sign counter did not move) approves nothing more.
    let replayed = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&second.id, "alice", "replayed")),
            passkey: Some(assertion),
        })
        .await
        .expect_err("a replayed assertion is refused");
    assert_eq!(replayed.code(), tonic::Code::PermissionDenied);

    // Rejecting needs no passkey.
    let rejected = client
        .decide(decide(&second.id, pb::Verdict::Reject, "alice", "no"))
        .await
        .expect("reject without a passkey")
        .into_inner()
        .approval
        .expect("the approval");
    assert_eq!(state(&rejected), pb::ApprovalState::Rejected);
}

#[tokio::test]
async fn a_session_grant_never_stands_in_for_a_passkey() {
    let server = TestServer::start_with_toml(
        r#"
[passkeys]
inbox_url = "http://localhost:8080"

[[rules]]
name = "production deploys need a passkey"
action = "require"
step_up = "passkey"
[rules.match]
tool = "deploy"
arguments = [{ pointer = "/environment", glob = "prod" }]
"#,
    )
    .await;
    let mut client = connect(&server).await;
    let staging = create(
        &mut client,
        pb::RequestApprovalRequest {
            tool_name: "deploy".into(),
            arguments_json: r#"{"environment": "staging"}"#.into(),
            ..request("agent-a", "staging")
        },
    )
    .await;
    assert_eq!(staging.step_up, "");
    let mut for_the_session = decide(&staging.id, pb::Verdict::Approve, "alice", "session");
    for_the_session.scope = pb::Scope::Session as i32;
    client
        .decide(for_the_session)
        .await
        .expect("a session grant");
    // The same tool in the same session, now matching the step-up rule: asked, not granted.
    let production = create(
        &mut client,
        pb::RequestApprovalRequest {
            tool_name: "deploy".into(),
            arguments_json: r#"{"environment": "prod"}"#.into(),
            ..request("agent-a", "prod")
        },
    )
    .await;
    assert_eq!(state(&production), pb::ApprovalState::Pending);
    assert_eq!(production.step_up, "passkey");
    // And a passkey approval is for this call only: it grants no session.
    let mut authenticator = Authenticator::new(4);
    client
        .register_passkey(authenticator.register("alice"))
        .await
        .expect("register");
    let mut session = approve_on_web(&production.id, "alice", "with-passkey");
    session.scope = pb::Scope::Session as i32;
    let refused = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(session),
            passkey: Some(authenticator.assert(&production.id, &production.args_digest, "n")),
        })
        .await
        .expect_err("a session approval with a passkey is refused");
    assert!(
        refused.message().contains("cannot grant the session"),
        "{}",
        refused.message()
    );
}

/// An approver removes a passkey (a lost device): from then on it approves nothing, and
/// another approver cannot remove it, nor can it be removed twice.
#[tokio::test]
async fn a_removed_passkey_approves_nothing_and_only_its_approver_removes_it() {
    let (_server, mut client, mut authenticator, registered) = alices_passkey(5).await;
    let approval = create(&mut client, deploy("deploy-removed")).await;
    // Used once (its sign counter stored), so that removing follows a counted use.
    let other = create(&mut client, deploy("deploy-before")).await;
    client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&other.id, "alice", "before")),
            passkey: Some(authenticator.assert(&other.id, &other.args_digest, "n-0")),
        })
        .await
        .expect("approved with the passkey before its removal");
    let remove = |user: &str| pb::DeletePasskeyRequest {
        decider: Some(web(user)),
        credential_id: registered.credential_id.clone(),
    };

    let by_mallory = client
        .delete_passkey(remove("mallory"))
        .await
        .expect_err("another approver's passkey is not hers to remove");
    assert_eq!(by_mallory.code(), tonic::Code::NotFound);
    let removed = client
        .delete_passkey(remove("alice"))
        .await
        .expect("alice removes her passkey")
        .into_inner();
    assert_eq!(removed.credential_id, registered.credential_id);
    assert_eq!(removed.name, "laptop");
    let listed = alices_passkeys(&mut client).await;
    assert_eq!(listed.passkeys, vec![]);
    let again = client
        .delete_passkey(remove("alice"))
        .await
        .expect_err("removed already");
    assert_eq!(again.code(), tonic::Code::NotFound);
    assert!(
        again.message().contains(&registered.credential_id),
        "{}",
        again.message()
    );

    let refused = client
        .decide_with_passkey(pb::DecideWithPasskeyRequest {
            decision: Some(approve_on_web(&approval.id, "alice", "after")),
            passkey: Some(authenticator.assert(&approval.id, &approval.args_digest, "n-1")),
        })
        .await
        .expect_err("a removed passkey approves nothing");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.message().contains("not one web:alice registered"),
        "{}",
        refused.message()
    );
    let unnamed = client
        .delete_passkey(pb::DeletePasskeyRequest {
            decider: Some(web("alice")),
            credential_id: String::new(),
        })
        .await
        .expect_err("a removal names the passkey");
    assert_eq!(unnamed.code(), tonic::Code::InvalidArgument);
    assert!(
        unnamed.message().contains("credential_id"),
        "{}",
        unnamed.message()
    );
}
