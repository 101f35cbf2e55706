//! Approvals requested with `withdraw_when_caller_leaves`: withdrawn once no WaitForDecision
//! call of their caller has been open for the grace (the caller was killed, its connection is
//! gone), kept while a caller waits or re-attaches within the grace; other approvals are never
//! withdrawn for it. On a database shared by replicas only a wait dropped before it answered
//! counts as the caller leaving (a request, or a wait that answered, may be followed by a
//! wait on another replica).

use super::*;

/// The grace the tests configure: long against a call reaching the server over loopback.
const GRACE_MS: u64 = 1500;

async fn server() -> TestServer {
    TestServer::start_with(|config| config.approvals.caller_grace_ms = GRACE_MS).await
}

fn request_of(key: &str, withdraw_when_caller_leaves: bool) -> pb::RequestApprovalRequest {
    pb::RequestApprovalRequest {
        withdraw_when_caller_leaves,
        ..request("agent-1", key)
    }
}

/// Time for a call sent over loopback to reach its handler; only a wait the server has seen
/// can be dropped (nothing asserts on it).
const SETTLE: Duration = Duration::from_millis(300);

fn shared_database() -> bool {
    countersign_testkit::postgres::enabled()
}

/// A WaitForDecision call on a connection of its own, as a separate caller process makes it,
/// once it has had time to reach the server; aborting it is the caller's death: the call and
/// its connection are gone.
async fn waiter(server: &TestServer, approval_id: &str) -> tokio::task::JoinHandle<()> {
    let waiting = answering_waiter(server, approval_id, 0).await;
    tokio::time::sleep(SETTLE).await;
    waiting
}

/// A WaitForDecision call that answers after `timeout_ms` (0: the server's maximum wait).
async fn answering_waiter(
    server: &TestServer,
    approval_id: &str,
    timeout_ms: u32,
) -> tokio::task::JoinHandle<()> {
    let mut caller = connect(server).await;
    let approval_id = approval_id.to_owned();
    tokio::spawn(async move {
        let _ = caller
            .wait_for_decision(pb::WaitForDecisionRequest {
                approval_id,
                timeout_ms,
            })
            .await;
    })
}

/// The ids of the next `count` approvals cancelled, with their cancellation reasons.
async fn next_cancelled(events: &mut Events, count: usize) -> Vec<(String, String)> {
    let mut cancelled = Vec::new();
    while cancelled.len() < count {
        let event = next_event(events, PATIENCE).await;
        if kind(&event) == pb::EventKind::Cancelled {
            let approval = event.approval.expect("the cancelled approval");
            let reason = approval.resolution.expect("a resolution").reason;
            cancelled.push((approval.id, reason));
        }
    }
    cancelled
}

async fn get(client: &mut Client, approval_id: &str) -> pb::Approval {
    client
        .get_approval(pb::GetApprovalRequest {
            approval_id: approval_id.into(),
        })
        .await
        .expect("get approval")
        .into_inner()
}

#[tokio::test]
async fn an_approval_whose_caller_left_is_withdrawn_and_one_that_did_not_ask_is_kept() {
    let server = server().await;
    let mut agent = connect(&server).await;
    let mut events = watch(&mut agent, pb::WatchApprovalsRequest::default()).await;
    // Its caller leaves first: were it withdrawn, it would be before the others.
    let kept = create(&mut agent, request_of("unflagged", false)).await;
    let kept_waiter = waiter(&server, &kept.id).await;
    kept_waiter.abort();
    let left = create(&mut agent, request_of("flagged", true)).await;
    assert!(left.withdraw_when_caller_leaves, "the approval says it");
    let left_waiter = waiter(&server, &left.id).await;
    left_waiter.abort();
    // A caller killed between its request and its wait: seen on a database of its own only.
    let never_waited = create(&mut agent, request_of("never-waited", true)).await;

    let withdrawn_reason = || "withdrawn: the caller left".to_owned();
    let mut expected = vec![(left.id.clone(), withdrawn_reason())];
    if !shared_database() {
        expected.push((never_waited.id.clone(), withdrawn_reason()));
    }
    let mut cancelled = next_cancelled(&mut events, expected.len()).await;
    cancelled.sort();
    expected.sort();
    assert_eq!(cancelled, expected);
    let withdrawn = get(&mut agent, &left.id).await;
    assert_eq!(state(&withdrawn), pb::ApprovalState::Cancelled);
    assert_eq!(
        withdrawn.resolution.unwrap().resolved_by(),
        pb::ResolvedBy::Cancellation
    );
    assert_eq!(
        state(&get(&mut agent, &kept.id).await),
        pb::ApprovalState::Pending,
        "an approval that did not ask is not withdrawn"
    );
}

#[tokio::test]
async fn a_caller_that_waits_or_re_attaches_within_the_grace_keeps_its_approval() {
    let server = server().await;
    let mut agent = connect(&server).await;
    let mut events = watch(&mut agent, pb::WatchApprovalsRequest::default()).await;
    let approval = create(&mut agent, request_of("re-attached", true)).await;
    let first = waiter(&server, &approval.id).await;
    let second = waiter(&server, &approval.id).await;
    // Another wait of the caller stays open.
    first.abort();
    // The caller's connection breaks and it re-attaches at once.
    second.abort();
    let third = waiter(&server, &approval.id).await;
    // A control whose caller leaves after all of that: by the time it is withdrawn, the grace
    // of every wait closed above has passed.
    let control = create(&mut agent, request_of("control", true)).await;
    waiter(&server, &control.id).await.abort();

    let cancelled = next_cancelled(&mut events, 1).await;
    assert_eq!(cancelled[0].0, control.id, "only the control was withdrawn");
    assert_eq!(
        state(&get(&mut agent, &approval.id).await),
        pb::ApprovalState::Pending
    );

    // Then the caller leaves for good.
    third.abort();
    let cancelled = next_cancelled(&mut events, 1).await;
    assert_eq!(
        cancelled,
        [(approval.id.clone(), "withdrawn: the caller left".to_owned())]
    );
}

#[tokio::test]
async fn a_decided_approval_stays_decided_when_its_caller_leaves() {
    let server = server().await;
    let mut agent = connect(&server).await;
    let mut worker = connect(&server).await;
    let approval = create(&mut agent, request_of("decided", true)).await;
    let waiting = waiter(&server, &approval.id).await;
    worker
        .decide(decide(&approval.id, pb::Verdict::Approve, "bob", "tap-1"))
        .await
        .expect("decide");
    waiting.await.expect("the wait ends with the decision");
    // A control withdrawn after the grace of the decided approval's wait.
    let mut events = watch(&mut agent, pb::WatchApprovalsRequest::default()).await;
    let control = create(&mut agent, request_of("control", true)).await;
    waiter(&server, &control.id).await.abort();
    let cancelled = next_cancelled(&mut events, 1).await;
    assert_eq!(cancelled[0].0, control.id);
    assert_eq!(
        state(&get(&mut agent, &approval.id).await),
        pb::ApprovalState::Approved
    );
}

/// A wait that answers (its deadline passed) is followed by the caller's next wait, which a
/// balancer may send to another replica: on a shared database it does not count as the caller
/// leaving, on a database of its own the grace runs from it.
#[tokio::test]
async fn a_wait_that_answered_withdraws_only_on_a_database_of_its_own() {
    let server = server().await;
    let mut agent = connect(&server).await;
    let mut events = watch(&mut agent, pb::WatchApprovalsRequest::default()).await;
    let approval = create(&mut agent, request_of("answered", true)).await;
    answering_waiter(&server, &approval.id, 100)
        .await
        .await
        .expect("the wait answers");
    // A control whose wait is dropped after the answered one: withdrawn on both backends, and
    // after the grace of the answered wait.
    let control = create(&mut agent, request_of("control", true)).await;
    waiter(&server, &control.id).await.abort();
    let mut cancelled: Vec<String> =
        next_cancelled(&mut events, if shared_database() { 1 } else { 2 })
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
    cancelled.sort();
    let mut expected = vec![control.id.clone()];
    if !shared_database() {
        expected.push(approval.id.clone());
    }
    expected.sort();
    assert_eq!(cancelled, expected);
    let kept = if shared_database() {
        pb::ApprovalState::Pending
    } else {
        pb::ApprovalState::Cancelled
    };
    assert_eq!(state(&get(&mut agent, &approval.id).await), kept);
}
