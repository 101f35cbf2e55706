use super::*;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn claims() -> ReceiptClaims {
    ReceiptClaims {
        iss: ISSUER.into(),
        sub: "a1".into(),
        iat: 100,
        exp: 200,
        approval_id: "a1".into(),
        agent_id: "agent".into(),
        session_id: "s".into(),
        tool: "bash".into(),
        args_digest: "d1".into(),
        verdict: "APPROVE".into(),
        resolved_by: "DECISION".into(),
        deciders: vec![],
        rule: None,
        grant_id: None,
        scope: "ONCE".into(),
        resolved_at_ms: 100_000,
        seq: 7,
        step_up: None,
    }
}

fn set_of(keys: &[&SigningKey]) -> KeySet {
    let mut set = KeySet::default();
    for (i, k) in keys.iter().enumerate() {
        set.keys.push(PublicKey {
            kid: key_id(&k.verifying_key()),
            key: k.verifying_key(),
            endorsement: (i > 0).then(|| endorse(keys[i - 1], &k.verifying_key(), 0)),
        });
    }
    set
}

#[test]
fn a_signed_receipt_verifies_and_allows_exactly_its_call() {
    let k = key(1);
    let set = KeySet::from_jwks(&set_of(&[&k]).to_jwks()).unwrap();
    let token = sign_receipt(&k, &claims());
    let read = verify_receipt(&token, &set).unwrap();
    assert_eq!(read, claims());
    read.allows("a1", "d1", 150_000).unwrap();
    assert!(matches!(
        read.allows("a2", "d1", 150_000),
        Err(ReceiptError::ApprovalId { .. })
    ));
    assert!(matches!(
        read.allows("a1", "d2", 150_000),
        Err(ReceiptError::ArgsDigest { .. })
    ));
    assert!(matches!(
        read.allows("a1", "d1", 200_000),
        Err(ReceiptError::Expired { .. })
    ));
}

#[test]
fn an_altered_payload_or_signature_or_unknown_key_is_refused() {
    let k = key(1);
    let set = set_of(&[&k]);
    let token = sign_receipt(&k, &claims());
    let parts: Vec<&str> = token.split('.').collect();
    let mut altered = claims();
    altered.args_digest = "d2".into();
    let forged_payload = b64(canonical_json(&serde_json::to_value(&altered).unwrap()).as_bytes());
    let forged = format!("{}.{}.{}", parts[0], forged_payload, parts[2]);
    assert!(matches!(
        verify_receipt(&forged, &set),
        Err(ReceiptError::Signature(_))
    ));
    let other = sign_receipt(&key(2), &claims());
    assert!(matches!(
        verify_receipt(&other, &set),
        Err(ReceiptError::UnknownKey(_))
    ));
    assert!(matches!(
        verify_receipt("", &set),
        Err(ReceiptError::Missing)
    ));
}

#[test]
fn a_rotated_set_keeps_old_receipts_and_its_fingerprint_and_refuses_an_unendorsed_key() {
    let (k1, k2) = (key(1), key(2));
    let old = sign_receipt(&k1, &claims());
    let rotated = KeySet::from_jwks(&set_of(&[&k1, &k2]).to_jwks()).unwrap();
    assert_eq!(
        rotated.fingerprint(),
        Some(key_id(&k1.verifying_key()).as_str())
    );
    verify_receipt(&old, &rotated).unwrap();
    verify_receipt(&sign_receipt(&k2, &claims()), &rotated).unwrap();
    let mut injected = set_of(&[&k1]);
    injected.keys.push(PublicKey {
        kid: key_id(&k2.verifying_key()),
        key: k2.verifying_key(),
        endorsement: Some(endorse(&k2, &k2.verifying_key(), 0)),
    });
    assert!(matches!(
        KeySet::from_jwks(&injected.to_jwks()),
        Err(ReceiptError::KeySet(_))
    ));
    let pin = key_id(&key(3).verifying_key());
    assert!(matches!(
        rotated.pinned(Some(&pin)),
        Err(ReceiptError::Fingerprint { .. })
    ));
}

#[test]
fn the_key_id_is_the_rfc_7638_thumbprint() {
    // RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
    let x = URL_SAFE_NO_PAD
        .decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
        .unwrap();
    let key = VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap();
    assert_eq!(key_id(&key), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
}
