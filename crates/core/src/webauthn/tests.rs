//! The checks against responses made by a software authenticator written here from the
//! specification (CBOR encoded by hand), so that every field can be altered one at a time.

use ed25519_dalek::Signer as _;

use super::*;

const ORIGIN: &str = "http://localhost:8080";

fn rp() -> RelyingParty {
    RelyingParty::from_url("http://localhost:8080/").unwrap()
}

/// CBOR head of major type `major` with argument `n`.
fn head(major: u8, n: usize) -> Vec<u8> {
    let major = major << 5;
    match n {
        0..=23 => vec![major | n as u8],
        24..=0xff => vec![major | 24, n as u8],
        _ => {
            let mut out = vec![major | 25];
            out.extend_from_slice(&(n as u16).to_be_bytes());
            out
        }
    }
}

fn int(n: i64) -> Vec<u8> {
    if n >= 0 {
        head(0, n as usize)
    } else {
        head(1, (-1 - n) as usize)
    }
}

fn bytes(b: &[u8]) -> Vec<u8> {
    let mut out = head(2, b.len());
    out.extend_from_slice(b);
    out
}

fn text(t: &str) -> Vec<u8> {
    let mut out = head(3, t.len());
    out.extend_from_slice(t.as_bytes());
    out
}

fn map(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = head(5, entries.len());
    for (k, v) in entries {
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out
}

enum Key {
    Es256(p256::ecdsa::SigningKey),
    EdDsa(ed25519_dalek::SigningKey),
}

struct Authenticator {
    key: Key,
    credential_id: Vec<u8>,
    flags: u8,
    counter: u32,
}

impl Authenticator {
    fn es256() -> Authenticator {
        Authenticator {
            key: Key::Es256(p256::ecdsa::SigningKey::from_bytes(&[7u8; 32].into()).unwrap()),
            credential_id: vec![1, 2, 3, 4],
            flags: FLAG_UP | FLAG_UV,
            counter: 1,
        }
    }

    fn eddsa() -> Authenticator {
        Authenticator {
            key: Key::EdDsa(ed25519_dalek::SigningKey::from_bytes(&[9u8; 32])),
            credential_id: vec![5, 6, 7],
            flags: FLAG_UP | FLAG_UV | FLAG_BE | FLAG_BS,
            counter: 0,
        }
    }

    fn cose_key(&self) -> Vec<u8> {
        match &self.key {
            Key::Es256(key) => {
                let point = key.verifying_key().to_encoded_point(false);
                map(&[
                    (int(1), int(2)),
                    (int(3), int(-7)),
                    (int(-1), int(1)),
                    (int(-2), bytes(point.x().unwrap())),
                    (int(-3), bytes(point.y().unwrap())),
                ])
            }
            Key::EdDsa(key) => map(&[
                (int(1), int(1)),
                (int(3), int(-8)),
                (int(-1), int(6)),
                (int(-2), bytes(key.verifying_key().as_bytes())),
            ]),
        }
    }

    fn auth_data(&self, rp_id: &str, attested: bool) -> Vec<u8> {
        let mut out = Sha256::digest(rp_id.as_bytes()).to_vec();
        out.push(self.flags | if attested { FLAG_AT } else { 0 });
        out.extend_from_slice(&self.counter.to_be_bytes());
        if attested {
            out.extend_from_slice(&[0u8; 16]);
            out.extend_from_slice(&(self.credential_id.len() as u16).to_be_bytes());
            out.extend_from_slice(&self.credential_id);
            out.extend_from_slice(&self.cose_key());
        }
        out
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        match &self.key {
            Key::Es256(key) => {
                let signature: p256::ecdsa::Signature = key.sign(message);
                signature.to_der().as_bytes().to_vec()
            }
            Key::EdDsa(key) => key.sign(message).to_bytes().to_vec(),
        }
    }

    fn create(&self, challenge: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let client_data = client_data("webauthn.create", challenge, ORIGIN);
        let attestation = map(&[
            (text("fmt"), text("none")),
            (text("attStmt"), map(&[])),
            (text("authData"), bytes(&self.auth_data("localhost", true))),
        ]);
        (client_data, attestation)
    }

    /// (clientDataJSON, authenticatorData, signature)
    fn get(&self, challenge: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let client_data = client_data("webauthn.get", challenge, ORIGIN);
        let auth_data = self.auth_data("localhost", false);
        let signature = self.signature_over(&auth_data, &client_data);
        (client_data, auth_data, signature)
    }

    fn signature_over(&self, auth_data: &[u8], client_data: &[u8]) -> Vec<u8> {
        let mut signed = auth_data.to_vec();
        signed.extend_from_slice(&Sha256::digest(client_data));
        self.sign(&signed)
    }

    fn register(&self) -> RegisteredCredential {
        let (client_data, attestation) = self.create(b"registration challenge");
        verify_registration(
            &rp(),
            b"registration challenge",
            &Registration {
                client_data_json: &client_data,
                attestation_object: &attestation,
            },
        )
        .unwrap()
    }
}

fn client_data(kind: &str, challenge: &[u8], origin: &str) -> Vec<u8> {
    serde_json::json!({
        "type": kind,
        "challenge": base64url(challenge),
        "origin": origin,
        "crossOrigin": false,
    })
    .to_string()
    .into_bytes()
}

fn assert(
    credential: &RegisteredCredential,
    stored: u32,
    challenge: &[u8],
    (client_data, auth_data, signature): &(Vec<u8>, Vec<u8>, Vec<u8>),
) -> Result<u32, WebauthnError> {
    verify_assertion(
        &rp(),
        challenge,
        &credential.cose_key,
        stored,
        &Assertion {
            client_data_json: client_data,
            authenticator_data: auth_data,
            signature,
        },
    )
}

#[test]
fn relying_party_comes_from_the_inbox_url() {
    assert_eq!(
        RelyingParty::from_url("https://Inbox.Example.com/approvals").unwrap(),
        RelyingParty {
            id: "inbox.example.com".into(),
            origin: "https://inbox.example.com".into()
        }
    );
    assert_eq!(rp().origin, ORIGIN);
    assert_eq!(
        RelyingParty::from_url("https://a.example:443")
            .unwrap()
            .origin,
        "https://a.example"
    );
    for bad in [
        "http://127.0.0.1:8080",
        "https://10.0.0.1",
        "http://inbox.example.com",
        "ftp://localhost",
        "localhost:8080",
        "https://user@inbox.example.com",
        "https://[::1]:8080",
    ] {
        assert!(RelyingParty::from_url(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn registers_es256_and_eddsa_credentials() {
    for authenticator in [Authenticator::es256(), Authenticator::eddsa()] {
        let credential = authenticator.register();
        assert_eq!(credential.credential_id, authenticator.credential_id);
        assert_eq!(credential.cose_key, authenticator.cose_key());
        assert_eq!(credential.sign_count, authenticator.counter);
    }
    assert_eq!(Authenticator::es256().register().algorithm, COSE_ES256);
    assert_eq!(Authenticator::eddsa().register().algorithm, COSE_EDDSA);
}

#[test]
fn registration_refuses_what_section_7_1_refuses() {
    let authenticator = Authenticator::es256();
    let (client_data, attestation) = authenticator.create(b"registration challenge");
    let verify = |challenge: &[u8], client_data: &[u8], attestation: &[u8]| {
        verify_registration(
            &rp(),
            challenge,
            &Registration {
                client_data_json: client_data,
                attestation_object: attestation,
            },
        )
    };
    assert_eq!(
        verify(b"another challenge", &client_data, &attestation),
        Err(WebauthnError::Challenge)
    );
    let get_type = client_data_of("webauthn.get", b"registration challenge", ORIGIN);
    assert!(matches!(
        verify(b"registration challenge", &get_type, &attestation),
        Err(WebauthnError::Type { .. })
    ));
    let elsewhere = client_data_of(
        "webauthn.create",
        b"registration challenge",
        "https://evil.example",
    );
    assert!(matches!(
        verify(b"registration challenge", &elsewhere, &attestation),
        Err(WebauthnError::Origin { .. })
    ));
    let packed = map(&[
        (text("fmt"), text("packed")),
        (text("attStmt"), map(&[])),
        (
            text("authData"),
            bytes(&authenticator.auth_data("localhost", true)),
        ),
    ]);
    assert_eq!(
        verify(b"registration challenge", &client_data, &packed),
        Err(WebauthnError::AttestationFormat("packed".into()))
    );
    let other_rp = map(&[
        (text("fmt"), text("none")),
        (text("attStmt"), map(&[])),
        (
            text("authData"),
            bytes(&authenticator.auth_data("example.com", true)),
        ),
    ]);
    assert_eq!(
        verify(b"registration challenge", &client_data, &other_rp),
        Err(WebauthnError::RpIdHash)
    );
    let unverified = Authenticator {
        flags: FLAG_UP,
        ..Authenticator::es256()
    };
    let (client_data, attestation) = unverified.create(b"registration challenge");
    assert_eq!(
        verify(b"registration challenge", &client_data, &attestation),
        Err(WebauthnError::UserVerification)
    );
    let rs256 = map(&[(int(1), int(3)), (int(3), int(-257))]);
    let mut auth_data = Sha256::digest(b"localhost").to_vec();
    auth_data.push(FLAG_UP | FLAG_UV | FLAG_AT);
    auth_data.extend_from_slice(&[0, 0, 0, 0]);
    auth_data.extend_from_slice(&[0u8; 16]);
    auth_data.extend_from_slice(&[0, 1, 9]);
    auth_data.extend_from_slice(&rs256);
    let rsa = map(&[
        (text("fmt"), text("none")),
        (text("attStmt"), map(&[])),
        (text("authData"), bytes(&auth_data)),
    ]);
    assert_eq!(
        verify(b"registration challenge", &client_data, &rsa),
        Err(WebauthnError::Algorithm(-257))
    );
    assert!(verify(b"registration challenge", &client_data, &attestation[..10]).is_err());
}

fn client_data_of(kind: &str, challenge: &[u8], origin: &str) -> Vec<u8> {
    client_data(kind, challenge, origin)
}

#[test]
fn assertions_verify_with_either_algorithm() {
    let es256 = Authenticator {
        counter: 2,
        ..Authenticator::es256()
    };
    let credential = Authenticator::es256().register();
    assert_eq!(
        assert(&credential, 1, b"step-up", &es256.get(b"step-up")),
        Ok(2)
    );
    let eddsa = Authenticator::eddsa();
    let credential = eddsa.register();
    assert_eq!(
        assert(&credential, 0, b"step-up", &eddsa.get(b"step-up")),
        Ok(0)
    );
}

#[test]
fn assertion_for_another_challenge_is_refused() {
    let authenticator = Authenticator::es256();
    let credential = authenticator.register();
    let made = authenticator.get(b"approval one");
    assert_eq!(
        assert(&credential, 0, b"approval two", &made),
        Err(WebauthnError::Challenge)
    );
}

#[test]
fn assertion_refuses_what_section_7_2_refuses() {
    let authenticator = Authenticator::es256();
    let credential = authenticator.register();
    let (client_data, auth_data, signature) = authenticator.get(b"c");
    // Signed by another key.
    let other = Authenticator::eddsa().register();
    assert_eq!(
        assert(
            &other,
            0,
            b"c",
            &(client_data.clone(), auth_data.clone(), signature.clone())
        ),
        Err(WebauthnError::Signature)
    );
    // Authenticator data altered after signing (the counter).
    let mut altered = auth_data.clone();
    altered[36] ^= 1;
    assert_eq!(
        assert(
            &credential,
            0,
            b"c",
            &(client_data.clone(), altered, signature.clone())
        ),
        Err(WebauthnError::Signature)
    );
    // A registration's client data replayed as an assertion.
    let created = client_data_of("webauthn.create", b"c", ORIGIN);
    let signed = authenticator.signature_over(&auth_data, &created);
    assert!(matches!(
        assert(&credential, 0, b"c", &(created, auth_data.clone(), signed)),
        Err(WebauthnError::Type { .. })
    ));
    // Made for a page of another origin.
    let elsewhere = client_data_of("webauthn.get", b"c", "http://localhost:9999");
    let signed = authenticator.signature_over(&auth_data, &elsewhere);
    assert!(matches!(
        assert(
            &credential,
            0,
            b"c",
            &(elsewhere, auth_data.clone(), signed)
        ),
        Err(WebauthnError::Origin { .. })
    ));
    // In a cross-origin frame.
    let framed = serde_json::json!({
        "type": "webauthn.get", "challenge": base64url(b"c"), "origin": ORIGIN, "crossOrigin": true
    })
    .to_string()
    .into_bytes();
    let signed = authenticator.signature_over(&auth_data, &framed);
    assert_eq!(
        assert(&credential, 0, b"c", &(framed, auth_data.clone(), signed)),
        Err(WebauthnError::CrossOrigin)
    );
    // For another relying party.
    let other_rp = authenticator.auth_data("example.com", false);
    let signed = authenticator.signature_over(&other_rp, &client_data);
    assert_eq!(
        assert(
            &credential,
            0,
            b"c",
            &(client_data.clone(), other_rp, signed)
        ),
        Err(WebauthnError::RpIdHash)
    );
    // Without user verification.
    let unverified = Authenticator {
        flags: FLAG_UP,
        ..Authenticator::es256()
    };
    assert_eq!(
        assert(&credential, 0, b"c", &unverified.get(b"c")),
        Err(WebauthnError::UserVerification)
    );
    let absent = Authenticator {
        flags: FLAG_UV,
        ..Authenticator::es256()
    };
    assert_eq!(
        assert(&credential, 0, b"c", &absent.get(b"c")),
        Err(WebauthnError::UserPresence)
    );
}

#[test]
fn a_counter_that_does_not_move_forward_is_refused() {
    let authenticator = Authenticator {
        counter: 5,
        ..Authenticator::es256()
    };
    let credential = authenticator.register();
    let made = authenticator.get(b"c");
    assert_eq!(assert(&credential, 4, b"c", &made), Ok(5));
    assert_eq!(
        assert(&credential, 5, b"c", &made),
        Err(WebauthnError::SignCount {
            stored: 5,
            found: 5
        })
    );
    let counterless = Authenticator {
        counter: 0,
        ..Authenticator::es256()
    };
    assert_eq!(
        assert(&credential, 5, b"c", &counterless.get(b"c")),
        Err(WebauthnError::SignCount {
            stored: 5,
            found: 0
        })
    );
}

#[test]
fn cbor_reader_refuses_what_it_does_not_read() {
    assert!(cbor::decode(&[0x9f, 0xff]).is_err(), "indefinite array");
    assert!(cbor::decode(&[0xc1, 0x00]).is_err(), "tag");
    assert!(
        cbor::decode(&[0xfb, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(),
        "float"
    );
    assert!(
        cbor::decode(&[0x5a, 0xff, 0xff, 0xff, 0xff]).is_err(),
        "short bytes"
    );
    assert!(cbor::decode(&[0x01, 0x02]).is_err(), "trailing");
    let deep = [vec![0x81; 40], vec![0x00]].concat();
    assert!(cbor::decode(&deep).is_err(), "deep");
    assert_eq!(cbor::decode(&int(-7)).unwrap(), cbor::Value::Int(-7));
}
