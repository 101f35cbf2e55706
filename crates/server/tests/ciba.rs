//! OpenID CIBA (poll mode) on the `[http]` listener: discovery, client authentication by
//! secret and by signed assertion, `/bc-authorize` making an approval, and the token
//! endpoint's answers to each state of it, over real HTTP against the server.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use countersign_core::receipt::{verify_jws, KeySet};
use countersign_proto::v1 as pb;
use countersign_server::config::{CibaClientConfig, Config, Role};
use countersign_testkit::http::free_addr;
use countersign_testkit::server::{token, TestServer};
use ed25519_dalek::Signer as _;
use serde_json::{json, Value};

use crate::common;

const ADMIN_SECRET: &str = "admin-secret-0123456789";
const AGENT_SECRET: &str = "agent-secret-0123456789";
const CLIENT_SECRET: &str = "client-secret-0123456789";
const OTHER_SECRET: &str = "other-secret-0123456789";
const CIBA_GRANT: &str = "urn:openid:params:grant-type:ciba";
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

const CONFIG: &str = r#"
[[approvers]]
id = "alice"
max_risk = "critical"
identities = { telegram = ["1001"] }

[[approvers]]
id = "bob"
max_risk = "critical"
identities = { telegram = ["1002"] }

[[groups]]
name = "ops"
members = ["alice", "bob"]
destinations = [{ channel = "telegram", target = "-100" }]

[[rules]]
name = "reads-are-fine"
action = "allow"
[rules.match]
tool = "read_file"
"#;

/// The server with three clients: `app` (a secret), `signer` (an Ed25519 and a P-256 key),
/// `other` (a secret, another agent).
struct Front {
    server: TestServer,
    base: String,
    http: reqwest::Client,
    ed25519: ed25519_dalek::SigningKey,
    p256: p256::ecdsa::SigningKey,
    _secrets: tempfile::TempDir,
}

async fn start() -> Front {
    let listen = free_addr();
    let secrets = tempfile::tempdir().expect("temporary directory");
    let secret_file = secrets.path().join("app.secret");
    std::fs::write(&secret_file, format!("{CLIENT_SECRET}\n")).unwrap();
    let other_file = secrets.path().join("other.secret");
    std::fs::write(&other_file, OTHER_SECRET).unwrap();
    let ed25519 = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    let p256 = p256::ecdsa::SigningKey::from_slice(&[9u8; 32]).unwrap();
    let point = p256.verifying_key().to_encoded_point(false);
    let jwks = json!({"keys": [
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": URL_SAFE_NO_PAD.encode(ed25519.verifying_key().as_bytes())},
        {"kty": "EC", "crv": "P-256", "kid": "ec",
         "x": URL_SAFE_NO_PAD.encode(point.x().unwrap()), "y": URL_SAFE_NO_PAD.encode(point.y().unwrap())},
    ]});
    let server = TestServer::start_with(|config| {
        let parsed = Config::parse(CONFIG).expect("config");
        config.approvers = parsed.approvers;
        config.groups = parsed.groups;
        config.rules = parsed.rules;
        config.tokens = vec![
            token("admin", Role::Admin, &[], ADMIN_SECRET),
            token("agent", Role::Agent, &["agent-1"], AGENT_SECRET),
        ];
        config.http.listen = Some(listen);
        config.http.poll_interval_seconds = Some(30);
        config.http.clients = vec![
            CibaClientConfig {
                client_id: "app".into(),
                agent: "agent-1".into(),
                secret_file: Some(secret_file),
                ..Default::default()
            },
            CibaClientConfig {
                client_id: "signer".into(),
                agent: "agent-1".into(),
                jwks: Some(jwks.to_string()),
                ..Default::default()
            },
            CibaClientConfig {
                client_id: "other".into(),
                agent: "agent-2".into(),
                secret_file: Some(other_file),
                ..Default::default()
            },
        ];
    })
    .await;
    let front = Front {
        server,
        base: format!("http://{listen}"),
        http: reqwest::Client::new(),
        ed25519,
        p256,
        _secrets: secrets,
    };
    front
}

/// How a request authenticates its client.
enum Auth<'a> {
    Basic(&'a str, &'a str),
    Assertion(String),
    None,
}

fn tool_call(tool: &str, arguments: Value) -> String {
    json!([{"type": "countersign_tool_call", "tool": tool, "arguments": arguments, "risk": "high"}])
        .to_string()
}

impl Front {
    async fn get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status().as_u16(), 200);
        response.json().await.expect("JSON")
    }

    /// POSTs a form; the status, the `WWW-Authenticate` header and the JSON answer. Every
    /// answer must forbid caching.
    async fn post(
        &self,
        path: &str,
        auth: Auth<'_>,
        params: &[(&str, &str)],
    ) -> (u16, Option<String>, Value) {
        let mut form = form_urlencoded::Serializer::new(String::new());
        for (name, value) in params {
            form.append_pair(name, value);
        }
        if let Auth::Assertion(assertion) = &auth {
            form.append_pair("client_assertion_type", JWT_BEARER);
            form.append_pair("client_assertion", assertion);
        }
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.finish());
        if let Auth::Basic(id, secret) = auth {
            request = request.basic_auth(id, Some(secret));
        }
        let response = request.send().await.expect("POST");
        let status = response.status().as_u16();
        assert_eq!(response.headers()["cache-control"], "no-store");
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, challenge, response.json().await.expect("JSON"))
    }

    /// Asks through `/bc-authorize` as `app`; the `auth_req_id`.
    async fn ask(&self, tool: &str, arguments: Value, extra: &[(&str, &str)]) -> String {
        let details = tool_call(tool, arguments);
        let mut params = vec![("authorization_details", details.as_str())];
        params.extend_from_slice(extra);
        let (status, _, answer) = self
            .post("/bc-authorize", Auth::Basic("app", CLIENT_SECRET), &params)
            .await;
        assert_eq!(status, 200, "{answer}");
        answer["auth_req_id"]
            .as_str()
            .expect("auth_req_id")
            .to_owned()
    }

    async fn poll(&self, client: Auth<'_>, auth_req_id: &str) -> (u16, Value) {
        let (status, _, answer) = self
            .post(
                "/token",
                client,
                &[("grant_type", CIBA_GRANT), ("auth_req_id", auth_req_id)],
            )
            .await;
        (status, answer)
    }

    /// A `private_key_jwt` assertion of `signer` with these claims over the defaults.
    fn assertion(&self, alg: &str, claims: Value) -> String {
        let now = now_seconds();
        let mut all = json!({
            "iss": "signer", "sub": "signer", "aud": format!("{}/token", self.base),
            "exp": now + 60, "iat": now, "jti": format!("jti-{}", rand::random::<u64>()),
        });
        for (name, value) in claims.as_object().unwrap() {
            all[name] = value.clone();
        }
        let header = json!({"alg": alg, "typ": "JWT"});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(all.to_string())
        );
        let signature = match alg {
            "EdDSA" => self.ed25519.sign(input.as_bytes()).to_bytes().to_vec(),
            _ => {
                let signature: p256::ecdsa::Signature = self.p256.sign(input.as_bytes());
                signature.to_bytes().to_vec()
            }
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    async fn agent(&self) -> common::TokenClient {
        common::with_token(&common::channel(&self.server).await, Some(ADMIN_SECRET))
    }

    /// The approval `auth_req_id` names, as the server has it now.
    async fn approval(&self, auth_req_id: &str) -> pb::Approval {
        self.agent()
            .await
            .get_approval(pb::GetApprovalRequest {
                approval_id: approval_id(auth_req_id).into(),
            })
            .await
            .expect("GetApproval")
            .into_inner()
    }
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn approval_id(auth_req_id: &str) -> &str {
    auth_req_id.rsplit_once('.').expect("approval id.MAC").0
}

async fn decide(front: &Front, auth_req_id: &str, verdict: pb::Verdict, edit: &str) {
    let mut admin = front.agent().await;
    admin
        .decide(pb::DecideRequest {
            edited_arguments_json: edit.into(),
            ..common::decide(approval_id(auth_req_id), verdict, "1001", "k")
        })
        .await
        .expect("Decide");
}

#[tokio::test]
async fn discovery_publishes_the_ciba_endpoints_and_the_signing_keys() {
    let front = start().await;
    let base = &front.base;
    let metadata = front.get("/.well-known/openid-configuration").await;
    assert_eq!(metadata["issuer"], *base);
    assert_eq!(
        metadata["backchannel_authentication_endpoint"],
        format!("{base}/bc-authorize")
    );
    assert_eq!(metadata["token_endpoint"], format!("{base}/token"));
    assert_eq!(
        metadata["jwks_uri"],
        format!("{base}/.well-known/jwks.json")
    );
    assert_eq!(
        metadata["backchannel_token_delivery_modes_supported"],
        json!(["poll"])
    );
    assert_eq!(metadata["backchannel_user_code_parameter_supported"], false);
    assert_eq!(metadata["grant_types_supported"], json!([CIBA_GRANT]));
    assert_eq!(
        metadata["token_endpoint_auth_methods_supported"],
        json!(["client_secret_basic", "private_key_jwt"])
    );
    assert_eq!(
        metadata["token_endpoint_auth_signing_alg_values_supported"],
        json!(["EdDSA", "Ed25519", "ES256"])
    );
    assert_eq!(
        metadata["authorization_details_types_supported"],
        json!(["countersign_tool_call"])
    );
    assert_eq!(
        metadata["id_token_signing_alg_values_supported"],
        json!(["EdDSA"])
    );
    let jwks = front.get("/.well-known/jwks.json").await;
    let keys = KeySet::from_jwks(&jwks.to_string()).expect("the receipt key set");
    assert_eq!(keys.keys.len(), 1);
}

#[tokio::test]
async fn an_approval_is_redeemed_once_for_tokens_that_carry_the_edited_call() {
    let front = start().await;
    let auth_req_id = front
        .ask(
            "deploy",
            json!({"env": "staging", "version": "1.2"}),
            &[
                ("scope", "openid"),
                ("binding_message", "Deploy W4SCT"),
                ("login_hint", "ops"),
                ("requested_expiry", "600"),
            ],
        )
        .await;

    // The approval, as every channel sees it: the binding message, the group, the client.
    let approval = front.approval(&auth_req_id).await;
    assert_eq!(approval.agent_id, "agent-1");
    assert_eq!(approval.tool_name, "deploy");
    assert_eq!(approval.action, "Deploy W4SCT");
    assert_eq!(approval.approver_groups[0].group, "ops");
    assert_eq!(approval.routes[0].target, "-100");
    assert_eq!(approval.labels["ciba.client_id"], "app");

    decide(
        &front,
        &auth_req_id,
        pb::Verdict::Approve,
        r#"{"env": "staging", "version": "1.3"}"#,
    )
    .await;
    let (status, tokens) = front
        .poll(Auth::Basic("app", CLIENT_SECRET), &auth_req_id)
        .await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    let keys = KeySet::from_jwks(&front.get("/.well-known/jwks.json").await.to_string()).unwrap();
    let access = verify_jws(tokens["access_token"].as_str().unwrap(), "at+jwt", &keys)
        .expect("the access token verifies against the JWKS");
    assert_eq!(access["iss"], front.base);
    assert_eq!(access["sub"], "alice");
    assert_eq!(access["client_id"], "app");
    let details = &access["authorization_details"][0];
    assert_eq!(details["type"], "countersign_tool_call");
    assert_eq!(details["tool"], "deploy");
    assert_eq!(
        details["arguments"],
        json!({"env": "staging", "version": "1.3"})
    );
    assert_eq!(details["edited"], true);
    assert_eq!(
        tokens["authorization_details"],
        access["authorization_details"]
    );
    let receipt = verify_jws(
        access["receipt"].as_str().expect("the receipt"),
        countersign_core::receipt::RECEIPT_TYPE,
        &keys,
    )
    .expect("the receipt verifies");
    assert_eq!(receipt["approval_id"], approval_id(&auth_req_id));

    let id_token = verify_jws(tokens["id_token"].as_str().unwrap(), "JWT", &keys)
        .expect("the ID token verifies");
    assert_eq!(id_token["iss"], front.base);
    assert_eq!(id_token["sub"], "alice");
    assert_eq!(id_token["aud"], "app");
    assert_eq!(
        id_token["urn:openid:params:jwt:claim:auth_req_id"],
        auth_req_id
    );
    for claim in ["iat", "exp", "auth_time"] {
        assert!(id_token[claim].is_i64(), "{claim}: {id_token}");
    }

    // Once only.
    let (status, again) = front
        .poll(Auth::Basic("app", CLIENT_SECRET), &auth_req_id)
        .await;
    assert_eq!(status, 400);
    assert_eq!(again["error"], "invalid_grant", "{again}");
}

#[tokio::test]
async fn polls_answer_pending_then_slow_down_and_each_ending() {
    let front = start().await;
    let basic = || Auth::Basic("app", CLIENT_SECRET);
    let pending = front.ask("deploy", json!({}), &[]).await;
    let (status, first) = front.poll(basic(), &pending).await;
    assert_eq!(
        (status, first["error"].as_str()),
        (400, Some("authorization_pending"))
    );
    // The interval is 30 s: the next polls come too soon.
    for _ in 0..2 {
        let (status, fast) = front.poll(basic(), &pending).await;
        assert_eq!(
            (status, fast["error"].as_str()),
            (400, Some("slow_down")),
            "{fast}"
        );
    }

    let rejected = front.ask("deploy", json!({"env": "prod"}), &[]).await;
    decide(&front, &rejected, pb::Verdict::Reject, "").await;
    let (_, denied) = front.poll(basic(), &rejected).await;
    assert_eq!(denied["error"], "access_denied", "{denied}");

    let expiring = front
        .ask("deploy", json!({}), &[("requested_expiry", "1")])
        .await;
    let mut admin = front.agent().await;
    let expired = admin
        .wait_for_decision(pb::WaitForDecisionRequest {
            approval_id: approval_id(&expiring).into(),
            timeout_ms: 10_000,
        })
        .await
        .expect("WaitForDecision")
        .into_inner();
    assert_eq!(common::state(&expired), pb::ApprovalState::Expired);
    let (_, answer) = front.poll(basic(), &expiring).await;
    assert_eq!(answer["error"], "expired_token", "{answer}");

    // A call a rule allows is approved at once: its tokens come on the first poll, and its
    // subject is the rule.
    let allowed = front.ask("read_file", json!({"path": "README"}), &[]).await;
    let (status, tokens) = front.poll(basic(), &allowed).await;
    assert_eq!(status, 200, "{tokens}");
    assert!(
        tokens.get("id_token").is_none(),
        "no openid scope: {tokens}"
    );
}

#[tokio::test]
async fn a_request_id_is_bound_to_its_client_and_the_grant() {
    let front = start().await;
    let auth_req_id = front.ask("deploy", json!({}), &[]).await;
    let (status, foreign) = front
        .poll(Auth::Basic("other", OTHER_SECRET), &auth_req_id)
        .await;
    assert_eq!(
        (status, foreign["error"].as_str()),
        (400, Some("invalid_grant"))
    );
    let forged = format!("{}.AAAA", approval_id(&auth_req_id));
    let (_, answer) = front.poll(Auth::Basic("app", CLIENT_SECRET), &forged).await;
    assert_eq!(answer["error"], "invalid_grant");

    let (status, _, answer) = front
        .post(
            "/token",
            Auth::Basic("app", CLIENT_SECRET),
            &[("grant_type", "authorization_code"), ("code", "x")],
        )
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("unsupported_grant_type"))
    );
    let (_, _, answer) = front
        .post(
            "/token",
            Auth::Basic("app", CLIENT_SECRET),
            &[("auth_req_id", &auth_req_id)],
        )
        .await;
    assert_eq!(answer["error"], "invalid_request");
    assert!(answer["error_description"]
        .as_str()
        .unwrap()
        .starts_with("grant_type:"));
}

#[tokio::test]
async fn clients_authenticate_by_secret_or_by_an_assertion_used_once() {
    let front = start().await;
    let details = tool_call("deploy", json!({}));
    let params = [("authorization_details", details.as_str())];
    let ask = |auth| front.post("/bc-authorize", auth, &params);

    for auth in [
        Auth::Basic("app", "wrong-secret-0123456789"),
        Auth::Basic("nobody", CLIENT_SECRET),
        Auth::None,
    ] {
        let (status, challenge, answer) = ask(auth).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (401, Some("invalid_client")),
            "{answer}"
        );
        assert_eq!(challenge.as_deref(), Some("Basic realm=\"countersign\""));
    }

    let ed = front.assertion("EdDSA", json!({}));
    let (status, _, answer) = ask(Auth::Assertion(ed.clone())).await;
    assert_eq!(status, 200, "{answer}");
    let (status, _, replayed) = ask(Auth::Assertion(ed)).await;
    assert_eq!(
        (status, replayed["error"].as_str()),
        (401, Some("invalid_client"))
    );
    assert!(replayed["error_description"]
        .as_str()
        .unwrap()
        .contains("jti"));

    // ES256, with the issuer as the audience.
    let es = front.assertion("ES256", json!({"aud": front.base}));
    let (status, _, answer) = ask(Auth::Assertion(es)).await;
    assert_eq!(status, 200, "{answer}");

    for (claims, why) in [
        (json!({"aud": "https://elsewhere.example"}), "aud"),
        (json!({"exp": now_seconds() - 1}), "expired"),
        (json!({"sub": "someone-else"}), "sub"),
        (json!({"jti": null}), "jti"),
    ] {
        let (status, _, answer) = ask(Auth::Assertion(front.assertion("EdDSA", claims))).await;
        assert_eq!(status, 401, "{why}: {answer}");
        let description = answer["error_description"].as_str().unwrap();
        assert!(description.contains(why), "{why}: {description}");
    }
    // A signature by another key.
    let mut forged = front.assertion("EdDSA", json!({}));
    forged.truncate(forged.rfind('.').unwrap());
    forged.push_str(&format!(".{}", URL_SAFE_NO_PAD.encode([0u8; 64])));
    let (status, _, _) = ask(Auth::Assertion(forged)).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn malformed_requests_are_refused_naming_the_field() {
    let front = start().await;
    let basic = || Auth::Basic("app", CLIENT_SECRET);
    let good = tool_call("deploy", json!({}));
    let cases = [
        (vec![], "invalid_request", "authorization_details:"),
        (
            vec![("authorization_details", "{not json")],
            "invalid_request",
            "authorization_details:",
        ),
        (
            vec![(
                "authorization_details",
                r#"{"type": "countersign_tool_call"}"#,
            )],
            "invalid_request",
            "authorization_details:",
        ),
        (
            vec![(
                "authorization_details",
                r#"[{"type": "countersign_tool_call"}]"#,
            )],
            "invalid_authorization_details",
            "authorization_details[0].tool:",
        ),
        (
            vec![(
                "authorization_details",
                r#"[{"type": "payment_initiation"}]"#,
            )],
            "invalid_authorization_details",
            "authorization_details[0].type:",
        ),
        (
            vec![(
                "authorization_details",
                r#"[{"type": "countersign_tool_call", "tool": "x", "arguments": "rm -rf /"}]"#,
            )],
            "invalid_authorization_details",
            "authorization_details[0].arguments:",
        ),
        (
            vec![
                ("authorization_details", &good),
                ("requested_expiry", "soon"),
            ],
            "invalid_request",
            "requested_expiry:",
        ),
        (
            vec![("authorization_details", &good), ("login_hint", "nobody")],
            "unknown_user_id",
            "login_hint:",
        ),
    ];
    for (params, error, field) in cases {
        let (status, _, answer) = front.post("/bc-authorize", basic(), &params).await;
        assert_eq!(status, 400, "{params:?}: {answer}");
        assert_eq!(answer["error"], error, "{params:?}: {answer}");
        let description = answer["error_description"].as_str().unwrap();
        assert!(description.starts_with(field), "{description}");
    }
    // A form body only.
    let response = front
        .http
        .post(format!("{}/bc-authorize", front.base))
        .basic_auth("app", Some(CLIENT_SECRET))
        .json(&json!({"authorization_details": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
}

#[tokio::test]
async fn an_evaluation_that_needs_a_person_names_the_ciba_request() {
    let front = start().await;
    let answer = front
        .http
        .post(format!("{}/access/v1/evaluation", front.base))
        .bearer_auth(AGENT_SECRET)
        .json(&json!({
            "subject": {"type": "agent", "id": "agent-1"},
            "resource": {"type": "tool", "id": "deploy", "properties": {"arguments": {"env": "prod"}, "risk": "high"}},
            "action": {"name": "deploy"},
        }))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let ciba = &answer["context"]["ask"]["ciba"];
    assert_eq!(
        ciba["backchannel_authentication_endpoint"],
        format!("{}/bc-authorize", front.base)
    );
    let details = ciba["authorization_details"].to_string();
    // What the evaluation names is what /bc-authorize takes.
    let (status, _, asked) = front
        .post(
            "/bc-authorize",
            Auth::Basic("app", CLIENT_SECRET),
            &[("authorization_details", &details)],
        )
        .await;
    assert_eq!(status, 200, "{asked}");
}

#[tokio::test]
async fn a_used_assertion_stays_used_after_a_restart() {
    let mut front = start().await;
    let details = tool_call("deploy", json!({}));
    let params = [("authorization_details", details.as_str())];
    let assertion = front.assertion("EdDSA", json!({}));
    let (status, _, answer) = front
        .post("/bc-authorize", Auth::Assertion(assertion.clone()), &params)
        .await;
    assert_eq!(status, 200, "{answer}");

    front.server.restart().await;
    let (status, _, replayed) = front
        .post("/bc-authorize", Auth::Assertion(assertion), &params)
        .await;
    assert_eq!(status, 401, "{replayed}");
    assert!(replayed["error_description"]
        .as_str()
        .unwrap()
        .contains("already used"));
    // A new assertion of the same client is fine.
    let (status, _, answer) = front
        .post(
            "/bc-authorize",
            Auth::Assertion(front.assertion("EdDSA", json!({}))),
            &params,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn a_login_hint_may_name_one_approver() {
    let front = start().await;
    let auth_req_id = front
        .ask("deploy", json!({}), &[("login_hint", "bob")])
        .await;
    let mut admin = front.agent().await;
    let approval = front.approval(&auth_req_id).await;
    assert_eq!(approval.approver_groups[0].group, "bob");
    assert_eq!(approval.approver_groups[0].members, ["bob"]);

    // Alice is not the one named.
    let refused = admin
        .decide(common::decide(
            &approval.id,
            pb::Verdict::Approve,
            "1001",
            "alice",
        ))
        .await
        .expect_err("alice may not decide");
    assert!(
        refused.message().contains("not a member of bob"),
        "{refused:?}"
    );
    admin
        .decide(common::decide(
            &approval.id,
            pb::Verdict::Approve,
            "1002",
            "bob",
        ))
        .await
        .expect("bob decides");
    let (status, tokens) = front
        .poll(Auth::Basic("app", CLIENT_SECRET), &auth_req_id)
        .await;
    assert_eq!(status, 200, "{tokens}");
    let keys = KeySet::from_jwks(&front.get("/.well-known/jwks.json").await.to_string()).unwrap();
    let access = verify_jws(tokens["access_token"].as_str().unwrap(), "at+jwt", &keys).unwrap();
    assert_eq!(access["sub"], "bob");
}
