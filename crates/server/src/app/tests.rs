//! The use cases called directly, without gRPC: a real store on a temporary SQLite file, the
//! callers of configured tokens.

use std::sync::Arc;

use countersign_core::validate::RequestInput;
use countersign_core::{
    ConsumeOutcome, DecideOutcome, Decider, Error as DomainError, EventKind, Risk, Scope, State,
    Verdict,
};
use sha2::{Digest, Sha256};

use super::{App, ConsumeInput, DecideInput, ListQuery};
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Config;
use crate::security::Security;
use crate::store::hub::Hub;
use crate::store::EventFilter;
use crate::store::Store;

const AGENT_SECRET: &str = "agent-secret-0123456789abcdef";
const OTHER_AGENT_SECRET: &str = "other-agent-secret-0123456789";
const WORKER_SECRET: &str = "worker-secret-0123456789abcdef";

struct Fixture {
    app: App,
    agent: Arc<Caller>,
    other_agent: Arc<Caller>,
    worker: Arc<Caller>,
    _dir: tempfile::TempDir,
}

fn sha256(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

async fn fixture(extra: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
database = "{db}"

[[tokens]]
name = "coder"
role = "agent"
agents = ["coder-1"]
sha256 = "{agent}"

[[tokens]]
name = "other"
role = "agent"
agents = ["other-1"]
sha256 = "{other}"

[[tokens]]
name = "telegram-worker"
role = "worker"
channels = ["telegram"]
sha256 = "{worker}"

[[approvers]]
id = "alice"
max_risk = "critical"
identities = {{ telegram = ["1001"] }}
{extra}
"#,
        db = dir.path().join("app.db").display(),
        agent = sha256(AGENT_SECRET),
        other = sha256(OTHER_AGENT_SECRET),
        worker = sha256(WORKER_SECRET),
    );
    let config = Config::parse(&toml).unwrap();
    let security = Security::from_config(&config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let hub = Hub::new(64);
    let store = Store::open(&config.database, &config.storage, hub.clone(), None, None)
        .await
        .unwrap();
    let caller = |secret: &str| security.tokens.find(secret).unwrap();
    let (agent, other_agent, worker) = (
        caller(AGENT_SECRET),
        caller(OTHER_AGENT_SECRET),
        caller(WORKER_SECRET),
    );
    let (_, shutdown) = tokio::sync::watch::channel(false);
    Fixture {
        app: App::new(store, hub, Arc::new(config), Arc::new(security), shutdown),
        agent,
        other_agent,
        worker,
        _dir: dir,
    }
}

fn input(key: &str) -> RequestInput {
    RequestInput {
        agent_id: "coder-1".into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command":"make deploy"}"#.into(),
        action: "run: make deploy".into(),
        risk: Some(Risk::High),
        ..RequestInput::default()
    }
}

fn decision(approval_id: &str, verdict: Verdict, user_id: &str, key: &str) -> DecideInput {
    DecideInput {
        approval_id: approval_id.into(),
        verdict,
        scope: Scope::Once,
        decider: Decider {
            channel: "telegram".into(),
            user_id: user_id.into(),
            display_name: format!("@{user_id}"),
        },
        reason: String::new(),
        idempotency_key: key.into(),
        expected_args_digest: String::new(),
        edited_arguments_json: String::new(),
        passkey: None,
    }
}

fn permission_denied(result: Result<impl std::fmt::Debug, AppError>) -> String {
    match result {
        Err(AppError::Domain(DomainError::PermissionDenied(message))) => message,
        other => panic!("expected a permission refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_request_is_idempotent_and_only_for_the_caller_s_own_agents() {
    let f = fixture("").await;
    let first = f.app.request(&f.agent, input("k1")).await.unwrap();
    let again = f.app.request(&f.agent, input("k1")).await.unwrap();
    assert!(first.created && !again.created);
    assert_eq!(first.approval.id, again.approval.id);

    let refused = permission_denied(f.app.request(&f.other_agent, input("k2")).await);
    assert!(refused.contains("coder-1"), "{refused}");
    let foreign = permission_denied(f.app.get(&f.other_agent, &first.approval.id).await);
    assert!(foreign.contains("other-1"), "{foreign}");
    let (listed, _) = f.app.list(&f.agent, ListQuery::default()).await.unwrap();
    assert_eq!(listed.len(), 1, "the refused request stored nothing");
}

#[tokio::test]
async fn a_decision_resolves_once_and_the_waiter_and_consume_see_it() {
    let f = fixture("").await;
    let approval = f.app.request(&f.agent, input("k1")).await.unwrap().approval;
    let (outcome, approved) = f
        .app
        .decide(
            &f.worker,
            decision(&approval.id, Verdict::Approve, "1001", "d1"),
        )
        .await
        .unwrap();
    assert_eq!(outcome, DecideOutcome::Resolved);
    assert_eq!(approved.state, State::Approved);
    let (late, _) = f
        .app
        .decide(
            &f.worker,
            decision(&approval.id, Verdict::Reject, "1001", "d2"),
        )
        .await
        .unwrap();
    assert_eq!(late, DecideOutcome::AlreadyResolved);

    let waited = f.app.wait(&f.agent, &approval.id, 50).await.unwrap();
    assert_eq!(waited.state, State::Approved);
    let consume = || ConsumeInput {
        approval_id: approval.id.clone(),
        outcome: ConsumeOutcome::Succeeded,
        detail: "deployed".into(),
        args_digest: String::new(),
    };
    let consumed = f.app.consume(&f.agent, consume()).await.unwrap();
    assert_eq!(consumed.state, State::Consumed);
    assert!(matches!(
        f.app.consume(&f.agent, consume()).await,
        Err(AppError::Store(_) | AppError::Domain(DomainError::FailedPrecondition(_)))
    ));
}

#[tokio::test]
async fn a_stranger_s_decision_is_refused_on_the_record_and_changes_nothing() {
    let f = fixture("").await;
    let approval = f.app.request(&f.agent, input("k1")).await.unwrap().approval;
    let refused = permission_denied(
        f.app
            .decide(
                &f.worker,
                decision(&approval.id, Verdict::Approve, "666", "d1"),
            )
            .await,
    );
    assert!(refused.contains("not a registered approver"), "{refused}");
    assert_eq!(
        f.app.get(&f.agent, &approval.id).await.unwrap().state,
        State::Pending
    );
    let refusals = f
        .app
        .store()
        .list_events(&EventFilter {
            approval_id: approval.id.clone(),
            kinds: vec![EventKind::DecisionRefused],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(refusals.len(), 1);
    // An agent token may not decide at all.
    permission_denied(
        f.app
            .decide(
                &f.agent,
                decision(&approval.id, Verdict::Approve, "1001", "d2"),
            )
            .await,
    );
}

#[tokio::test]
async fn a_request_over_the_agent_s_rate_is_refused_with_when_to_retry() {
    let f = fixture("[limits]\nrequests_per_minute = 1\nrequest_burst = 1\n").await;
    f.app.request(&f.agent, input("k1")).await.unwrap();
    match f.app.request(&f.agent, input("k2")).await {
        Err(AppError::RateLimited { message, retry_ms }) => {
            assert!(message.contains("limits.requests_per_minute"), "{message}");
            assert!(retry_ms > 0);
        }
        other => panic!("expected a rate refusal, got {other:?}"),
    }
}
