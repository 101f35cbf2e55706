//! The measurements. Each starts what it measures, drives it through gRPC and returns a
//! figure; none asserts anything about the numbers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_client::ApprovalServiceClient;
use futures::StreamExt;
use prost::Message;
use tonic::transport::Channel;

use crate::echo::pb::echo_client::EchoClient;
use crate::echo::pb::EchoMessage;
use crate::error::BenchError;
use crate::load::{self, closed_loop, connections, Load, SharedSamples, Summary};
use crate::report::Figure;

/// How long the latency figures give a waiter to subscribe before the decision is sent.
const WAITER_HEAD_START: Duration = Duration::from_millis(100);
/// Streams per HTTP/2 connection for the idle-stream figure (servers allow 200 by default).
const STREAMS_PER_CONNECTION: usize = 100;
const BENCH_CHANNEL: &str = "bench";
const SENT_LABEL: &str = "bench_sent_us";

/// A realistic request: a shell command with its working directory, routed to one channel.
pub fn approval_request(agent: String, key: String) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        agent_id: agent,
        session_id: "bench-session".into(),
        requester: "bench".into(),
        idempotency_key: key,
        tool_name: "bash".into(),
        arguments_json:
            r#"{"command": "rm -rf /srv/app/build", "cwd": "/srv/app", "env": {"CI": "1"}}"#.into(),
        action: "delete the build directory of the app".into(),
        reason: "clean rebuild before the deploy".into(),
        risk: pb::Risk::High as i32,
        routes: vec![pb::Route {
            channel: BENCH_CHANNEL.into(),
            target: "ops".into(),
        }],
        ..Default::default()
    }
}

/// Encoded size of the requests the figures send: the echo baseline sends as much.
pub fn message_bytes() -> usize {
    approval_request("bench-agent-00".into(), "w00-0000000000".into()).encoded_len()
}

fn decide_request(approval_id: String, verdict: pb::Verdict, user: String) -> pb::DecideRequest {
    pb::DecideRequest {
        idempotency_key: format!("decide-{approval_id}"),
        approval_id,
        verdict: verdict as i32,
        scope: pb::Scope::Once as i32,
        reason: String::new(),
        decider: Some(pb::Decider {
            channel: BENCH_CHANNEL.into(),
            display_name: user.clone(),
            user_id: user,
        }),
        ..Default::default()
    }
}

fn clients(channels: &[Channel]) -> Vec<ApprovalServiceClient<Channel>> {
    channels
        .iter()
        .map(|channel| ApprovalServiceClient::new(channel.clone()))
        .collect()
}

/// A run-unique prefix, so that figures against one long-running server never collide on
/// idempotency keys.
fn run_prefix() -> String {
    uuid::Uuid::now_v7().simple().to_string()[..12].to_string()
}

pub async fn echo_baseline(url: &str, load: &Load) -> Result<Figure, BenchError> {
    let channels = connections(url, load.connections).await?;
    let payload = vec![0x5a_u8; message_bytes()];
    let clients: Vec<_> = channels.into_iter().map(EchoClient::new).collect();
    let summary = closed_loop(load, move |worker, _| {
        let mut client = clients[worker % clients.len()].clone();
        let message = EchoMessage {
            payload: payload.clone(),
        };
        async move {
            client
                .echo(message)
                .await
                .map(drop)
                .map_err(|s| s.to_string())
        }
    })
    .await;
    Ok(Figure::throughput("echo baseline (tonic unary)", &summary))
}

/// `RequestApproval` of distinct new approvals in closed loops.
pub async fn request_throughput(url: &str, load: &Load) -> Result<Summary, BenchError> {
    let clients = clients(&connections(url, load.connections).await?);
    let prefix = run_prefix();
    Ok(closed_loop(load, move |worker, iteration| {
        let mut client = clients[worker % clients.len()].clone();
        let request = approval_request(
            format!("bench-agent-{worker:02}"),
            format!("{prefix}-w{worker:02}-{iteration:010}"),
        );
        async move {
            client
                .request_approval(request)
                .await
                .map(drop)
                .map_err(|s| s.to_string())
        }
    })
    .await)
}

/// request → `Decide` → `WaitForDecision`, one cycle after the other in each loop.
pub async fn full_cycle(url: &str, load: &Load) -> Result<Figure, BenchError> {
    let clients = clients(&connections(url, load.connections).await?);
    let prefix = run_prefix();
    let summary = closed_loop(load, move |worker, iteration| {
        let mut client = clients[worker % clients.len()].clone();
        let request = approval_request(
            format!("bench-agent-{worker:02}"),
            format!("{prefix}-cycle-w{worker:02}-{iteration:010}"),
        );
        async move {
            let created = client
                .request_approval(request)
                .await
                .map_err(|s| format!("request: {s}"))?
                .into_inner();
            let id = created
                .approval
                .map(|a| a.id)
                .ok_or("request: no approval in the answer")?;
            client
                .decide(decide_request(
                    id.clone(),
                    pb::Verdict::Approve,
                    format!("user-{worker}"),
                ))
                .await
                .map_err(|s| format!("decide: {s}"))?;
            let waited = client
                .wait_for_decision(pb::WaitForDecisionRequest {
                    approval_id: id,
                    timeout_ms: 10_000,
                })
                .await
                .map_err(|s| format!("wait: {s}"))?
                .into_inner();
            if waited.state == pb::ApprovalState::Approved as i32 {
                Ok(())
            } else {
                Err(format!("wait returned state {}", waited.state))
            }
        }
    })
    .await;
    Ok(Figure::throughput(
        "cycle: request -> Decide -> WaitForDecision",
        &summary,
    ))
}

/// One approval's whole life, one step after the other in each loop: requested, delivered
/// (a worker records its message), approved, consumed. Returns the summary and the encoded
/// size of the approval as it ends (the size the bytes written per lifecycle are compared to).
pub async fn lifecycle(url: &str, load: &Load) -> Result<(Summary, usize), BenchError> {
    let clients = clients(&connections(url, load.connections).await?);
    let prefix = run_prefix();
    let sample = live_once(clients[0].clone(), format!("{prefix}-lifecycle-sample"))
        .await
        .map_err(BenchError::Setup)?;
    let summary = closed_loop(load, move |worker, iteration| {
        let client = clients[worker % clients.len()].clone();
        let key = format!("{prefix}-lifecycle-w{worker:02}-{iteration:010}");
        async move { live_once(client, key).await.map(|_| ()) }
    })
    .await;
    Ok((summary, sample.encoded_len()))
}

/// Requests, delivers, approves and consumes one approval; returns it as it ends.
async fn live_once(
    mut client: ApprovalServiceClient<Channel>,
    key: String,
) -> Result<pb::Approval, String> {
    let request = approval_request("bench-agent".into(), key);
    let id = client
        .request_approval(request)
        .await
        .map_err(|s| format!("request: {s}"))?
        .into_inner()
        .approval
        .map(|a| a.id)
        .ok_or("request: no approval in the answer")?;
    client
        .record_delivery(pb::RecordDeliveryRequest {
            approval_id: id.clone(),
            channel: BENCH_CHANNEL.into(),
            target: "bench-target".into(),
            message_ref: format!("message-{id}"),
        })
        .await
        .map_err(|s| format!("record delivery: {s}"))?;
    client
        .decide(decide_request(
            id.clone(),
            pb::Verdict::Approve,
            "approver".into(),
        ))
        .await
        .map_err(|s| format!("decide: {s}"))?;
    client
        .consume(pb::ConsumeRequest {
            approval_id: id,
            outcome: pb::ConsumeOutcome::Succeeded as i32,
            detail: "ran".into(),
            ..Default::default()
        })
        .await
        .map(|answer| answer.into_inner())
        .map_err(|s| format!("consume: {s}"))
}

/// Clients of `url`: those of `same` when it is the server they were made for.
async fn clients_of(
    url: &str,
    same: &str,
    made: &[ApprovalServiceClient<Channel>],
    load: &Load,
) -> Result<Vec<ApprovalServiceClient<Channel>>, BenchError> {
    if url == same {
        return Ok(made.to_vec());
    }
    Ok(clients(&connections(url, load.connections).await?))
}

/// At a fixed rate of new approvals: how long until a watcher sees each one, and how long
/// from each `Decide` until the agent's pending `WaitForDecision` returns. Requests, the
/// watcher and the waiters use the server at `url`; the decisions go to `decide_url` (another
/// replica on the same database, or the same server).
pub async fn delivery_latency(
    url: &str,
    decide_url: &str,
    load: &Load,
    rate: u32,
) -> Result<(Figure, Figure), BenchError> {
    let clients = clients(&connections(url, load.connections).await?);
    let deciders = clients_of(decide_url, url, &clients, load).await?;
    let origin = Instant::now();
    let to_watcher: SharedSamples = Arc::default();
    let to_waiter: SharedSamples = Arc::default();

    // The watcher, subscribed before the load starts.
    let mut watcher = clients[0].clone();
    let mut stream = watcher
        .watch_approvals(pb::WatchApprovalsRequest {
            channel: BENCH_CHANNEL.into(),
            include_snapshot: true,
            after_seq: 0,
            history_id: String::new(),
        })
        .await
        .map_err(|s| BenchError::Setup(format!("watch: {s}")))?
        .into_inner();
    loop {
        let item = stream
            .next()
            .await
            .ok_or_else(|| BenchError::Setup("watch ended before its snapshot".into()))?
            .map_err(|s| BenchError::Setup(format!("watch: {s}")))?;
        if item.kind == pb::EventKind::SnapshotComplete as i32 {
            break;
        }
    }
    let warmup_us = u64::try_from(load.warmup.as_micros()).unwrap_or(u64::MAX);
    let watch_task = {
        let samples = to_watcher.clone();
        tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                let Ok(event) = item else { break };
                if event.kind != pb::EventKind::Requested as i32 {
                    continue;
                }
                let sent = event
                    .approval
                    .as_ref()
                    .and_then(|a| a.labels.get(SENT_LABEL))
                    .and_then(|us| us.parse::<u64>().ok());
                if let Some(sent) = sent.filter(|sent| *sent >= warmup_us) {
                    let now = origin.elapsed();
                    load::record(&samples, now.saturating_sub(Duration::from_micros(sent)));
                }
            }
        })
    };

    let prefix = run_prefix();
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let measure_from = origin + load.warmup;
    let end = measure_from + load.duration;
    let mut in_flight = Vec::new();
    let mut sequence = 0u64;
    while Instant::now() < end {
        ticks.tick().await;
        let measured = Instant::now() >= measure_from;
        let mut client = clients[(sequence as usize) % clients.len()].clone();
        let mut decider = deciders[(sequence as usize) % deciders.len()].clone();
        let mut request = approval_request(
            "bench-agent-rate".into(),
            format!("{prefix}-rate-{sequence:010}"),
        );
        request.labels = HashMap::from([(
            SENT_LABEL.to_string(),
            origin.elapsed().as_micros().to_string(),
        )]);
        sequence += 1;
        let to_waiter = to_waiter.clone();
        in_flight.push(tokio::spawn(async move {
            let created = match client.request_approval(request).await {
                Ok(created) => created.into_inner(),
                Err(s) => return load::fail(&to_waiter, format!("request: {s}")),
            };
            let Some(id) = created.approval.map(|a| a.id) else {
                return load::fail(&to_waiter, "request: no approval in the answer".into());
            };
            let waiter = {
                let mut client = client.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    let answer = client
                        .wait_for_decision(pb::WaitForDecisionRequest {
                            approval_id: id,
                            timeout_ms: 30_000,
                        })
                        .await;
                    (answer, Instant::now())
                })
            };
            tokio::time::sleep(WAITER_HEAD_START).await;
            let decided_at = Instant::now();
            let decided = decider
                .decide(decide_request(id, pb::Verdict::Reject, "rate-user".into()))
                .await;
            if let Err(s) = decided {
                return load::fail(&to_waiter, format!("decide: {s}"));
            }
            match waiter.await {
                Ok((Ok(approval), returned)) => {
                    let resolved = approval.get_ref().state == pb::ApprovalState::Rejected as i32;
                    if !resolved {
                        load::fail(&to_waiter, "wait returned before the decision".into());
                    } else if measured {
                        load::record(&to_waiter, returned.saturating_duration_since(decided_at));
                    }
                }
                Ok((Err(s), _)) => load::fail(&to_waiter, format!("wait: {s}")),
                Err(e) => load::fail(&to_waiter, format!("waiter task: {e}")),
            }
        }));
    }
    for task in in_flight {
        let _ = task.await;
    }
    // The last events reach the watcher a moment after their requests were answered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    watch_task.abort();

    let rate_f = f64::from(rate);
    let mut watcher_figure = Figure::throughput(
        format!("request -> watcher delivery @{rate}/s"),
        &load::take(&to_watcher).summarize(load.duration),
    );
    watcher_figure.per_second = Some(rate_f);
    let across = if decide_url == url {
        ""
    } else {
        ", across replicas"
    };
    let mut waiter_figure = Figure::throughput(
        format!("Decide -> waiter returns @{rate}/s{across}"),
        &load::take(&to_waiter).summarize(load.duration),
    );
    waiter_figure.per_second = Some(rate_f);
    Ok((watcher_figure, waiter_figure))
}

/// Opens `streams` idle `WatchApprovals` streams and measures the server's resident memory
/// before and after.
pub async fn idle_streams(
    served: &crate::process::Served,
    streams: usize,
) -> Result<Figure, BenchError> {
    let url = served.url();
    // Let start-up allocations settle before the first reading.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = served.rss_bytes()?;
    let connection_count = streams.div_ceil(STREAMS_PER_CONNECTION).max(1);
    let channels = connections(&url, connection_count).await?;
    let clients = clients(&channels);
    let opened = futures::stream::iter(0..streams)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            async move {
                client
                    .watch_approvals(pb::WatchApprovalsRequest {
                        channel: format!("idle-{}", i % 7),
                        include_snapshot: false,
                        after_seq: 0,
                        history_id: String::new(),
                    })
                    .await
                    .map(|response| response.into_inner())
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    let mut open = Vec::with_capacity(streams);
    let mut failed = 0u64;
    let mut first_error = None;
    for stream in opened {
        match stream {
            Ok(stream) => open.push(stream),
            Err(status) => {
                failed += 1;
                first_error.get_or_insert(status.to_string());
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = served.rss_bytes()?;
    let delta = after.saturating_sub(before);
    let per_stream = delta as f64 / open.len().max(1) as f64;
    let mut figure = Figure::other(
        format!("RSS with {streams} idle watch streams"),
        format!(
            "{:.1} KiB per stream: {:.1} MiB -> {:.1} MiB over {connection_count} connections",
            per_stream / 1024.0,
            before as f64 / 1048576.0,
            after as f64 / 1048576.0
        ),
    );
    figure.errors = failed;
    figure.first_error = first_error;
    figure
        .extra
        .insert("streams_open".into(), serde_json::json!(open.len()));
    figure
        .extra
        .insert("rss_before_bytes".into(), serde_json::json!(before));
    figure
        .extra
        .insert("rss_after_bytes".into(), serde_json::json!(after));
    figure
        .extra
        .insert("rss_bytes_per_stream".into(), serde_json::json!(per_stream));
    drop(open);
    Ok(figure)
}

/// Creates one approval and resolves it; returns its id and idempotency key, the template of
/// the historical approvals.
pub async fn history_template(url: &str) -> Result<(String, String), BenchError> {
    let (mut client, id, key) = template_request(url, "history").await?;
    client
        .decide(decide_request(
            id.clone(),
            pb::Verdict::Approve,
            "history".into(),
        ))
        .await
        .map_err(|s| BenchError::Setup(format!("template decision: {s}")))?;
    Ok((id, key))
}

/// Requests one approval as the throughput figures do (agent `bench-{purpose}`); returns the
/// client, the approval's id and its idempotency key.
pub async fn template_request(
    url: &str,
    purpose: &str,
) -> Result<(ApprovalServiceClient<Channel>, String, String), BenchError> {
    let mut client = clients(&connections(url, 1).await?).remove(0);
    let key = format!("{purpose}-template-{}", run_prefix());
    let created = client
        .request_approval(approval_request(format!("bench-{purpose}"), key.clone()))
        .await
        .map_err(|s| BenchError::Setup(format!("{purpose} template request: {s}")))?
        .into_inner();
    let id = created
        .approval
        .map(|a| a.id)
        .ok_or_else(|| BenchError::Setup(format!("{purpose} template request: no approval")))?;
    Ok((client, id, key))
}

/// Creates `count` pending approvals through the API.
pub async fn create_pending(url: &str, count: u64) -> Result<(), BenchError> {
    let clients = clients(&connections(url, 4).await?);
    let prefix = run_prefix();
    let results = futures::stream::iter(0..count)
        .map(|i| {
            let mut client = clients[(i as usize) % clients.len()].clone();
            let request = approval_request(
                format!("bench-agent-{:02}", i % 32),
                format!("{prefix}-pending-{i:08}"),
            );
            async move { client.request_approval(request).await }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    match results.into_iter().find_map(Result::err) {
        Some(status) => Err(BenchError::Setup(format!(
            "creating pending approvals: {status}"
        ))),
        None => Ok(()),
    }
}

/// `ListApprovals` of the first page of pending approvals, in closed loops.
pub async fn list_pending(url: &str, load: &Load, page_size: u32) -> Result<Summary, BenchError> {
    let clients = clients(&connections(url, load.connections).await?);
    Ok(closed_loop(load, move |worker, _| {
        let mut client = clients[worker % clients.len()].clone();
        async move {
            let page = client
                .list_approvals(pb::ListApprovalsRequest {
                    states: vec![pb::ApprovalState::Pending as i32],
                    page_size,
                    ..Default::default()
                })
                .await
                .map_err(|s| s.to_string())?
                .into_inner();
            if page.approvals.len() == page_size as usize {
                Ok(())
            } else {
                Err(format!(
                    "a page of {} approvals, {page_size} expected",
                    page.approvals.len()
                ))
            }
        }
    })
    .await)
}
