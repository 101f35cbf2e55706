//! Races through gRPC over a real socket: many calls at the same moment on several
//! connections, and exactly one winner.

use crate::common;

use std::sync::Arc;

use common::*;
use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_testkit::server::TestServer;
use tokio::sync::Barrier;
use tonic::Code;

const RACERS: usize = 100;

/// Several clients, each on its own HTTP/2 connection.
async fn clients(server: &TestServer, count: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = tonic::transport::Endpoint::from_shared(server.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        clients.push(ApprovalServiceClient::new(channel));
    }
    clients
}

fn decision(id: &str, racer: usize, verdict: pb::Verdict) -> pb::DecideRequest {
    let channel = if racer % 4 < 2 { "telegram" } else { "github" };
    pb::DecideRequest {
        approval_id: id.to_string(),
        verdict: verdict as i32,
        scope: pb::Scope::Once as i32,
        reason: format!("racer {racer}"),
        decider: Some(pb::Decider {
            channel: channel.to_string(),
            user_id: format!("user-{racer}"),
            display_name: format!("User {racer}"),
        }),
        idempotency_key: format!("{id}-{racer}"),
        ..Default::default()
    }
}

/// Sends every request at once (released together by a barrier); returns the answers in
/// racer order.
async fn race<T, F, Fut>(clients: &[Client], requests: Vec<T>, call: F) -> Vec<Fut::Output>
where
    T: Send + 'static,
    F: Fn(Client, T) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            let barrier = barrier.clone();
            let call = call(clients[i % clients.len()].clone(), request);
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

async fn events_of(server: &TestServer, approval_id: &str, kind: &str) -> i64 {
    // Both are the server's own ids and names, safe to quote.
    common::count(
        server,
        &format!(
            "SELECT COUNT(*) FROM events WHERE approval_id = '{approval_id}' AND kind = '{kind}'"
        ),
    )
    .await
}

fn outcome(response: &pb::DecideResponse) -> pb::DecideOutcome {
    pb::DecideOutcome::try_from(response.outcome).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_approves_and_rejects_on_two_channels_resolve_once() {
    let server = TestServer::start().await;
    let clients = clients(&server, 8).await;
    for round in 0..3 {
        let approval = create(
            &mut clients[0].clone(),
            request("agent-race", &format!("call-{round}")),
        )
        .await;
        let requests = (0..RACERS)
            .map(|racer| {
                let verdict = if racer.is_multiple_of(2) {
                    pb::Verdict::Approve
                } else {
                    pb::Verdict::Reject
                };
                decision(&approval.id, racer, verdict)
            })
            .collect();
        let answers = race(&clients, requests, |mut client, request| async move {
            client.decide(request).await.map(|r| r.into_inner())
        })
        .await;

        let answers: Vec<pb::DecideResponse> =
            answers.into_iter().map(|a| a.expect("decide")).collect();
        let winners: Vec<usize> = (0..RACERS)
            .filter(|&i| outcome(&answers[i]) == pb::DecideOutcome::Resolved)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let losers = answers
            .iter()
            .filter(|a| outcome(a) == pb::DecideOutcome::AlreadyResolved)
            .count();
        assert_eq!(losers, RACERS - 1, "round {round}");

        // Every answer, and the stored approval, names the one winner.
        let winner = winners[0];
        let expected_state = if winner.is_multiple_of(2) {
            pb::ApprovalState::Approved
        } else {
            pb::ApprovalState::Rejected
        };
        for answer in &answers {
            let shown = answer.approval.as_ref().unwrap();
            assert_eq!(state(shown), expected_state);
        }
        let stored = clients[1]
            .clone()
            .get_approval(pb::GetApprovalRequest {
                approval_id: approval.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(state(&stored), expected_state);
        assert_eq!(stored.decisions.len(), 1);
        let deciders = &stored.resolution.as_ref().unwrap().deciders;
        assert_eq!(deciders.len(), 1);
        assert_eq!(deciders[0].user_id, format!("user-{winner}"));
        assert_eq!(events_of(&server, &approval.id, "RESOLVED").await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_approvals_with_a_quorum_resolve_once_at_the_quorum() {
    let server = TestServer::start().await;
    let clients = clients(&server, 8).await;
    let mut req = request("agent-race", "quorum-call");
    req.required_approvals = 3;
    let approval = create(&mut clients[0].clone(), req).await;
    let requests = (0..RACERS)
        .map(|racer| decision(&approval.id, racer, pb::Verdict::Approve))
        .collect();
    let answers = race(&clients, requests, |mut client, request| async move {
        client.decide(request).await.map(|r| r.into_inner())
    })
    .await;
    let outcomes: Vec<pb::DecideOutcome> = answers
        .iter()
        .map(|a| outcome(a.as_ref().expect("decide")))
        .collect();
    let count = |wanted| outcomes.iter().filter(|&&o| o == wanted).count();
    assert_eq!(count(pb::DecideOutcome::Recorded), 2);
    assert_eq!(count(pb::DecideOutcome::Resolved), 1);
    assert_eq!(count(pb::DecideOutcome::AlreadyResolved), RACERS - 3);
    assert_eq!(events_of(&server, &approval.id, "RESOLVED").await, 1);
    assert_eq!(
        events_of(&server, &approval.id, "DECISION_RECORDED").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_requests_create_one_approval() {
    let server = TestServer::start().await;
    let clients = clients(&server, 8).await;
    let requests = (0..RACERS)
        .map(|_| request("agent-race", "same-call"))
        .collect();
    let answers = race(&clients, requests, |mut client, request| async move {
        client
            .request_approval(request)
            .await
            .map(|r| r.into_inner())
    })
    .await;
    let answers: Vec<pb::RequestApprovalResponse> =
        answers.into_iter().map(|a| a.expect("request")).collect();
    assert_eq!(answers.iter().filter(|a| a.created).count(), 1);
    let id = &answers[0].approval.as_ref().unwrap().id;
    assert!(answers
        .iter()
        .all(|a| &a.approval.as_ref().unwrap().id == id));
    assert_eq!(count_rows(&server, "approvals").await, 1);
    assert_eq!(events_of(&server, id, "REQUESTED").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_with_one_key_and_different_arguments_create_one_approval() {
    let server = TestServer::start().await;
    let clients = clients(&server, 8).await;
    let arguments =
        |racer: usize| format!(r#"{{"command": "deploy", "target": "env-{}"}}"#, racer % 2);
    let requests = (0..RACERS)
        .map(|racer| {
            let mut req = request("agent-race", "contested-call");
            req.arguments_json = arguments(racer);
            req
        })
        .collect();
    let answers = race(&clients, requests, |mut client, request| async move {
        client
            .request_approval(request)
            .await
            .map(|r| r.into_inner())
    })
    .await;
    let created: Vec<usize> = (0..RACERS)
        .filter(|&i| matches!(&answers[i], Ok(a) if a.created))
        .collect();
    assert_eq!(created.len(), 1, "{created:?}");
    let winner = created[0];
    let winning = answers[winner].as_ref().unwrap().approval.clone().unwrap();
    for (racer, answer) in answers.iter().enumerate() {
        match answer {
            // Same arguments as the winner: the same approval.
            Ok(response) => {
                assert_eq!(racer % 2, winner % 2, "racer {racer}");
                assert_eq!(response.approval.as_ref().unwrap().id, winning.id);
            }
            // Other arguments under the same key: refused, nothing stored.
            Err(status) => {
                assert_ne!(racer % 2, winner % 2, "racer {racer}");
                assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
            }
        }
    }
    assert_eq!(count_rows(&server, "approvals").await, 1);
    assert_eq!(events_of(&server, &winning.id, "REQUESTED").await, 1);
}
