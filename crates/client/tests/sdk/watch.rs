//! The resuming watch, against a real server (through a loopback proxy where a connection has
//! to go silent).

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_client::{pb, Client, WatchItem};
use countersign_testkit::server::TestServer;

use crate::support::{
    client, decide, next_event, next_item, next_snapshot, request, watch_options, Proxy, STEP,
};

fn routed(idempotency_key: &str, channel: Option<&str>) -> pb::RequestApprovalRequest {
    let mut req = request(idempotency_key);
    req.routes = channel
        .map(|channel| pb::Route {
            channel: channel.into(),
            target: String::new(),
        })
        .into_iter()
        .collect();
    req
}

async fn create(client: &Client, req: pb::RequestApprovalRequest) -> String {
    client
        .request_approval(req)
        .await
        .unwrap()
        .approval
        .unwrap()
        .id
}

fn ids(approvals: &[pb::Approval]) -> HashSet<String> {
    approvals.iter().map(|a| a.id.clone()).collect()
}

#[tokio::test]
async fn a_watch_starts_with_the_channels_pending_approvals_then_follows_its_events() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    let for_telegram = create(&client, routed("a", Some("telegram"))).await;
    let for_github = create(&client, routed("b", Some("github"))).await;
    let for_everyone = create(&client, routed("c", None)).await;
    let rejected = create(&client, routed("d", Some("telegram"))).await;
    decide(&client, &rejected, pb::Verdict::Reject).await;

    let mut watch = client.watch(watch_options("telegram"));
    let pending = next_snapshot(&mut watch).await;
    assert_eq!(
        ids(&pending),
        HashSet::from([for_telegram.clone(), for_everyone])
    );
    assert!(!ids(&pending).contains(&for_github));

    let later = create(&client, routed("e", Some("telegram"))).await;
    create(&client, routed("f", Some("github"))).await;
    decide(&client, &for_telegram, pb::Verdict::Approve).await;

    let mut events = Vec::new();
    for _ in 0..2 {
        events.push(next_event(&mut watch).await);
    }
    let seen: Vec<(pb::EventKind, String)> = events
        .iter()
        .map(|e| (e.kind(), e.approval.as_ref().unwrap().id.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (pb::EventKind::Requested, later),
            // A decision that resolves the approval is one RESOLVED event carrying it.
            (pb::EventKind::Resolved, for_telegram),
        ]
    );
    assert!(events.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert_eq!(watch.cursor().map(|cursor| cursor.seq), Some(events[1].seq));
}

/// `connection()` follows whether a stream is open: not before the first one, not while the
/// server is gone, again once the watch has reconnected (with no item to deliver meanwhile).
#[tokio::test]
async fn the_watch_says_whether_it_is_connected_to_the_server() {
    let mut server = TestServer::start().await;
    let client = client(&server.url());
    let mut watch = client.watch(watch_options(""));
    let mut connection = watch.connection();
    assert!(!*connection.borrow(), "connected before opening anything");
    next_snapshot(&mut watch).await;
    assert!(*connection.borrow_and_update());

    server.stop().await;
    assert!(!next_connection_change(&mut watch, &mut connection).await);
    server.restart().await;
    assert!(next_connection_change(&mut watch, &mut connection).await);
}

/// Polls the watch (as a service does all the time; `next()` is cancel-safe) until its
/// connection state changes; the new state.
async fn next_connection_change(
    watch: &mut countersign_client::Watch,
    connection: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    let polled = async {
        loop {
            let _ = tokio::time::timeout(Duration::from_millis(100), watch.next()).await;
            if connection.has_changed().unwrap_or(false) {
                return *connection.borrow_and_update();
            }
        }
    };
    tokio::time::timeout(STEP, polled)
        .await
        .expect("the connection state changes")
}

/// A connection that stays open but delivers nothing, not even heartbeats, is replaced; the
/// watch resumes after its cursor and delivers what happened meanwhile.
#[tokio::test]
async fn a_silent_connection_is_detected_by_missed_heartbeats_and_resumed() {
    let server = TestServer::start().await;
    let direct = client(&server.url());
    create(&direct, routed("before", None)).await;
    let proxy = Proxy::start(server.addr()).await;
    let proxied = client(&format!("http://{}", proxy.addr()));
    let mut options = watch_options("");
    options.heartbeat_timeout = Duration::from_secs(1);
    let mut watch = proxied.watch(options);
    assert_eq!(next_snapshot(&mut watch).await.len(), 1);
    let cursor = watch.cursor().unwrap().seq;

    proxy.freeze();
    let during = create(&direct, routed("during", None)).await;

    let event = next_event(&mut watch).await;
    assert_eq!(event.kind(), pb::EventKind::Requested);
    assert_eq!(event.approval.unwrap().id, during);
    assert!(event.seq > cursor);
}

/// When the server no longer retains the events after the cursor (OUT_OF_RANGE), the watch
/// takes a new snapshot and yields it.
#[tokio::test]
async fn a_cursor_beyond_retention_yields_a_new_snapshot() {
    let server = TestServer::start_with(|config| config.watch.retention_seconds = 1).await;
    let direct = client(&server.url());
    let before = create(&direct, routed("before", None)).await;
    let proxy = Proxy::start(server.addr()).await;
    let proxied = client(&format!("http://{}", proxy.addr()));
    let mut options = watch_options("");
    options.heartbeat_timeout = Duration::from_secs(1);
    let mut watch = proxied.watch(options);
    assert_eq!(
        ids(&next_snapshot(&mut watch).await),
        HashSet::from([before.clone()])
    );
    let cursor = watch.cursor().unwrap().seq;
    assert!(cursor > 0, "a cursor of 0 would re-snapshot anyway");

    proxy.freeze();
    let first = create(&direct, routed("first", None)).await;
    let second = create(&direct, routed("second", None)).await;
    wait_until_pruned_past(&server.url(), cursor).await;

    let pending = next_snapshot(&mut watch).await;
    assert_eq!(ids(&pending), HashSet::from([before, first, second]));
    assert!(watch.cursor().unwrap().seq > cursor);
}

/// A watch started after a persisted seq delivers the events after it, with no snapshot; one
/// started after a seq the server pruned takes a snapshot instead.
#[tokio::test]
async fn a_watch_resumes_after_a_given_seq_or_snapshots_when_it_is_pruned() {
    let server = TestServer::start().await;
    let client = client(&server.url());
    create(&client, routed("before", None)).await;
    let mut first = client.watch(watch_options(""));
    next_snapshot(&mut first).await;
    let cursor = first.cursor().unwrap();
    let after = create(&client, routed("after", None)).await;
    let mut resumed = client.watch(watch_options("").resume_after(Some(cursor.clone())));
    assert_eq!(resumed.cursor(), Some(cursor.clone()));
    let event = next_event(&mut resumed).await;
    assert_eq!(event.kind(), pb::EventKind::Requested);
    assert_eq!(event.approval.unwrap().id, after);
    assert!(event.seq > cursor.seq);

    let pruning = TestServer::start_with(|config| config.watch.retention_seconds = 1).await;
    let client = self::client(&pruning.url());
    let before = create(&client, routed("before", None)).await;
    let mut first = client.watch(watch_options(""));
    next_snapshot(&mut first).await;
    let cursor = first.cursor().unwrap();
    // The newest event is always retained: two, so that the one after the cursor can go.
    let after = create(&client, routed("after", None)).await;
    let later = create(&client, routed("later", None)).await;
    wait_until_pruned_past(&pruning.url(), cursor.seq).await;
    let mut too_old = client.watch(watch_options("").resume_after(Some(cursor)));
    assert_eq!(
        ids(&next_snapshot(&mut too_old).await),
        HashSet::from([before, after, later])
    );
}

/// Polls until the server refuses to resume after `cursor` because it pruned what follows.
async fn wait_until_pruned_past(url: &str, cursor: u64) {
    let mut raw = pb::approval_service_client::ApprovalServiceClient::connect(url.to_owned())
        .await
        .unwrap();
    tokio::time::timeout(STEP, async {
        loop {
            let request = pb::WatchApprovalsRequest {
                after_seq: cursor,
                channel: String::new(),
                include_snapshot: false,
                history_id: String::new(),
            };
            if let Err(status) = raw.watch_approvals(request).await {
                assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("events were never pruned");
}

/// A consumer that falls behind is cut off by the server (RESOURCE_EXHAUSTED); the watch
/// resumes from its cursor and still delivers every event once, in order.
#[tokio::test]
async fn a_consumer_cut_off_as_too_slow_resumes_without_loss_or_duplicates() {
    let logs = CapturedLogs::default();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .finish(),
    );
    let server = TestServer::start_with(|config| config.watch.buffer_events = 16).await;
    let client = client(&server.url());
    let mut watch = client.watch(watch_options(""));
    assert!(next_snapshot(&mut watch).await.is_empty());

    // Large events, and nobody reading: the stream's flow-control window fills, then its
    // buffer overflows.
    const COUNT: usize = 120;
    let padding = "x".repeat(60 * 1024);
    // Concurrent requests share group commits: much faster than one after the other.
    let creating: Vec<_> = (0..COUNT)
        .map(|i| {
            let client = client.clone();
            let mut req = request(&format!("bulk-{i}"));
            req.arguments_json = format!(r#"{{"padding":"{padding}"}}"#);
            tokio::spawn(async move { create(&client, req).await })
        })
        .collect();
    let mut created = HashSet::new();
    for task in creating {
        created.insert(task.await.unwrap());
    }

    let mut delivered = Vec::new();
    while delivered.len() < COUNT {
        match next_item(&mut watch).await {
            WatchItem::Event(event) => delivered.push(event),
            WatchItem::Snapshot(_) => panic!("the watch re-snapshotted instead of resuming"),
        }
    }
    let delivered_ids: HashSet<String> = delivered
        .iter()
        .map(|e| e.approval.as_ref().unwrap().id.clone())
        .collect();
    assert_eq!(delivered_ids, created, "each approval's event exactly once");
    assert!(delivered.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert!(
        logs.text().contains("cut off as a slow consumer"),
        "the server never cut the stream off, so the test proved nothing"
    );
}

#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedLogs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
