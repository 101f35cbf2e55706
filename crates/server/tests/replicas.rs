//! Three replicas of the server on one PostgreSQL database, with clients spread over them:
//! decisions race across replicas and one wins, every replica's watchers see the same
//! gap-free sequence whichever replica wrote, a waiter on one replica hears of a decision
//! made on another, and an agent's rate and pending limits count its calls on every replica.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use countersign_server::config::Config;
use countersign_testkit::postgres::Cluster;
use countersign_testkit::server::TestServer;
use tokio::sync::Barrier;
use tonic::transport::Channel;

type Client = ApprovalServiceClient<Channel>;

const PATIENCE: Duration = Duration::from_secs(10);

/// Three replicas on a new database, and a client of each.
async fn replicas() -> (Vec<TestServer>, Vec<Client>) {
    replicas_with(|_| {}).await
}

/// [`replicas`], each configured by `adjust`.
async fn replicas_with(adjust: impl Fn(&mut Config)) -> (Vec<TestServer>, Vec<Client>) {
    let database = PathBuf::from(Cluster::shared().create_database().await);
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let server = TestServer::start_with(|config| {
            adjust(config);
            config.database = database.clone();
        })
        .await;
        clients.push(Client::connect(server.url()).await.expect("connect"));
        servers.push(server);
    }
    (servers, clients)
}

fn request(agent: &str, key: &str) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: agent.into(),
        idempotency_key: key.into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command": "deploy"}"#.into(),
        action: "deploy".into(),
        risk: pb::Risk::High as i32,
        ..Default::default()
    }
}

fn decide(id: &str, verdict: pb::Verdict, user: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        approval_id: id.into(),
        verdict: verdict as i32,
        scope: pb::Scope::Once as i32,
        decider: Some(pb::Decider {
            channel: "telegram".into(),
            user_id: user.into(),
            display_name: user.into(),
        }),
        idempotency_key: format!("tap-{user}-{id}"),
        ..Default::default()
    }
}

async fn create(client: &mut Client, request: pb::RequestApprovalRequest) -> pb::Approval {
    client
        .request_approval(request)
        .await
        .expect("request")
        .into_inner()
        .approval
        .expect("approval")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_on_different_replicas_resolve_once() {
    let (_servers, clients) = replicas().await;
    for round in 0..20 {
        let mut requester = clients[round % 3].clone();
        let approval = create(&mut requester, request("agent", &format!("call-{round}"))).await;
        let barrier = Arc::new(Barrier::new(3));
        let racers: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(replica, client)| {
                let mut client = client.clone();
                let barrier = barrier.clone();
                let verdict = if replica == 1 {
                    pb::Verdict::Reject
                } else {
                    pb::Verdict::Approve
                };
                let decision = decide(&approval.id, verdict, &format!("approver-{replica}"));
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.decide(decision).await.expect("decide").into_inner()
                })
            })
            .collect();
        let mut resolved = 0;
        for racer in racers {
            let answer = racer.await.unwrap();
            match pb::DecideOutcome::try_from(answer.outcome).unwrap() {
                pb::DecideOutcome::Resolved => resolved += 1,
                pb::DecideOutcome::AlreadyResolved => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(resolved, 1, "round {round}: exactly one decision resolves");
        for client in &clients {
            let stored = client
                .clone()
                .get_approval(pb::GetApprovalRequest {
                    approval_id: approval.id.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(stored.decisions.len(), 1, "round {round}: {stored:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchers_on_every_replica_see_the_same_gap_free_sequence() {
    let (_servers, clients) = replicas().await;
    let mut streams = Vec::new();
    for client in &clients {
        streams.push(
            client
                .clone()
                .watch_approvals(pb::WatchApprovalsRequest::default())
                .await
                .expect("watch")
                .into_inner(),
        );
    }
    // Writers on every replica at once: requests, each decided on another replica.
    let writers: Vec<_> = (0..3)
        .map(|replica| {
            let mut here = clients[replica].clone();
            let mut there = clients[(replica + 1) % 3].clone();
            tokio::spawn(async move {
                for n in 0..15 {
                    let approval = create(
                        &mut here,
                        request(&format!("agent-{replica}"), &format!("k{n}")),
                    )
                    .await;
                    there
                        .decide(decide(&approval.id, pb::Verdict::Approve, "bob"))
                        .await
                        .expect("decide");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    // 45 approvals: REQUESTED and RESOLVED each.
    let expected: Vec<u64> = (1..=90).collect();
    let mut sequences = Vec::new();
    for mut stream in streams {
        let mut seqs = Vec::new();
        // Until the head, and a heartbeat past it shows nothing more is coming.
        loop {
            let event = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .expect("events in time")
                .expect("stream ok")
                .expect("stream open");
            if event.kind != pb::EventKind::Heartbeat as i32 {
                seqs.push(event.seq);
            } else if event.seq >= 90 {
                break;
            }
        }
        assert_eq!(seqs, expected, "every event once, in order, without a gap");
        sequences.push(seqs);
    }
    assert!(sequences.windows(2).all(|pair| pair[0] == pair[1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_on_one_replica_gets_the_decision_made_on_another() {
    let (_servers, clients) = replicas().await;
    let mut latencies = Vec::new();
    for round in 0..10 {
        let (waiter, decider) = (round % 3, (round + 1) % 3);
        let mut client = clients[waiter].clone();
        let approval = create(&mut client, request("agent", &format!("wait-{round}"))).await;
        let wait = tokio::spawn({
            let id = approval.id.clone();
            async move {
                let answer = client
                    .wait_for_decision(pb::WaitForDecisionRequest {
                        approval_id: id,
                        timeout_ms: 20_000,
                    })
                    .await
                    .expect("wait")
                    .into_inner();
                (answer, Instant::now())
            }
        });
        // The waiter is listening before the decision is made.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let decided_at = Instant::now();
        clients[decider]
            .clone()
            .decide(decide(&approval.id, pb::Verdict::Approve, "carol"))
            .await
            .expect("decide");
        let (answer, woke_at) = tokio::time::timeout(PATIENCE, wait)
            .await
            .expect("the waiter woke")
            .unwrap();
        assert_eq!(
            answer.state,
            pb::ApprovalState::Approved as i32,
            "{answer:?}"
        );
        latencies.push(woke_at.duration_since(decided_at));
    }
    latencies.sort();
    eprintln!(
        "cross-replica Decide -> waiter: median {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}

/// Sends `count` requests of one agent, spread over the replicas in turn; returns how many
/// were accepted, after checking that every refusal is RESOURCE_EXHAUSTED.
async fn accepted_of(clients: &[Client], count: usize) -> usize {
    let mut accepted = 0;
    for n in 0..count {
        match clients[n % clients.len()]
            .clone()
            .request_approval(request("agent", &format!("limited-{n}")))
            .await
        {
            Ok(_) => accepted += 1,
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}"),
        }
    }
    accepted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agents_rate_limit_counts_its_requests_on_every_replica() {
    let (_servers, clients) = replicas_with(|config| {
        config.limits.requests_per_minute = 4;
        config.limits.request_burst = 4;
        config.limits.max_pending_per_agent = 0;
    })
    .await;
    // Each replica alone would accept 4 of its 3 or 4; together they accept 4 of 12.
    assert_eq!(accepted_of(&clients, 12).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agents_pending_limit_counts_its_approvals_on_every_replica() {
    let (_servers, clients) = replicas_with(|config| {
        config.limits.requests_per_minute = 0;
        config.limits.max_pending_per_agent = 3;
    })
    .await;
    assert_eq!(accepted_of(&clients, 9).await, 3);
}
