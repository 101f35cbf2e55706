//! The runtime against a real countersign server (in process, loopback gRPC) and a test
//! channel that records every call: the "platform" holds one message per approval (so
//! showing is idempotent), and each approval's next calls can be scripted, by the agent's
//! idempotency key and before the request, to fail with a retry-after, to be held, or to
//! take a while. Notices are recorded too, and can be scripted to fail.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_testkit::http;
use countersign_testkit::server::TestServer;
use countersign_worker::channel::Channel;
use countersign_worker::cursor::Cursor;
use countersign_worker::retry::{Backoff, Classify, RateLimitScope, Verdict};
use countersign_worker::runtime::{self, RuntimeError, RuntimeOptions, ShowRequests};
use pb::ApprovalState;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the next call for an approval does.
enum Step {
    /// Fails with a retryable error carrying this retry-after (a limit of the platform).
    Fail(Option<Duration>),
    /// Fails with a retry-after that the channel says limits this approval alone.
    FailThisApprovalOnly(Duration),
    /// Waits until the sender fires (or is dropped), then shows.
    Hold(oneshot::Receiver<()>),
    /// Takes this long, then shows.
    Slow(Duration),
    /// Waits until the sender fires (or is dropped), then fails as `Fail(None)` does.
    HoldThenFail(oneshot::Receiver<()>),
}

#[derive(Clone, Debug)]
struct Call {
    key: String,
    state: ApprovalState,
    started: Instant,
    /// When the message was shown; `None`: the call failed or has not finished.
    shown: Option<Instant>,
}

#[derive(Default)]
struct Record {
    calls: Vec<Call>,
    /// The platform: the one message of each approval (by key): its id and what it shows.
    messages: HashMap<String, (String, ApprovalState)>,
    script: HashMap<String, VecDeque<Step>>,
    /// Calls running now, per approval.
    running: HashMap<String, usize>,
    /// Two calls for one approval ran at once.
    overlapped: bool,
    /// How many snapshots were reconciled (each asks for the unfinished approvals).
    snapshots: usize,
    /// The notices told, by key: the event kinds, in order.
    notices: Vec<(String, pb::EventKind)>,
    /// How many of the next notices fail with a retryable error.
    failing_notices: usize,
    /// Every notice call: the approval's key, the event's kind, when.
    notice_calls: Vec<(String, pb::EventKind, Instant)>,
    /// Per approval, the retry-afters its next notices fail with.
    notices_failing_after: HashMap<String, VecDeque<Duration>>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Record>>);

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Record> {
        self.0.lock().unwrap()
    }

    fn script(&self, key: &str, step: Step) {
        self.lock()
            .script
            .entry(key.to_owned())
            .or_default()
            .push_back(step);
    }

    fn calls_of(&self, key: &str) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|call| call.key == key)
            .cloned()
            .collect()
    }

    /// The states of every call for the approval, in order, shown or not.
    fn called_states(&self, key: &str) -> Vec<ApprovalState> {
        self.calls_of(key).iter().map(|call| call.state).collect()
    }

    /// Waits until the approval had `count` calls.
    async fn until_calls(&self, key: &str, count: usize) {
        self.until(&format!("{key} had {count} calls"), |record| {
            record.calls.iter().filter(|call| call.key == key).count() == count
        })
        .await;
    }

    /// The states shown for the approval, in order, each change once.
    fn shown_states(&self, key: &str) -> Vec<ApprovalState> {
        let mut states: Vec<ApprovalState> = self
            .calls_of(key)
            .iter()
            .filter(|call| call.shown.is_some())
            .map(|call| call.state)
            .collect();
        states.dedup();
        states
    }

    /// Waits (at most 20 s) until `done` holds of the record.
    async fn until(&self, what: &str, done: impl Fn(&Record) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&self.lock()) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn until_shown(&self, key: &str, state: ApprovalState) {
        self.until(&format!("{key} shows {state:?}"), |record| {
            record.messages.get(key).map(|(_, shown)| *shown) == Some(state)
        })
        .await;
    }

    async fn until_called(&self, key: &str) {
        self.until(&format!("{key} is being shown"), |record| {
            record.calls.iter().any(|call| call.key == key)
        })
        .await;
    }
}

#[derive(Debug)]
struct Unavailable(Option<Duration>, RateLimitScope);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the test platform is unavailable (retry after {:?})",
            self.0
        )
    }
}

impl Classify for Unavailable {
    fn verdict(&self) -> Verdict {
        Verdict::Retry { after: self.0 }
    }
}

struct TestChannel(Recorder);

impl Channel for TestChannel {
    type Error = Unavailable;

    fn name(&self) -> &str {
        "test"
    }

    async fn show(&self, approval: &pb::Approval) -> Result<(), Unavailable> {
        let key = &approval.idempotency_key;
        let (index, step) = {
            let mut record = self.0.lock();
            let running = record.running.entry(key.clone()).or_default();
            *running += 1;
            if *running > 1 {
                record.overlapped = true;
            }
            record.calls.push(Call {
                key: key.clone(),
                state: approval.state(),
                started: Instant::now(),
                shown: None,
            });
            let step = record.script.get_mut(key).and_then(VecDeque::pop_front);
            (record.calls.len() - 1, step)
        };
        let result = match step {
            Some(Step::Fail(after)) => Err(Unavailable(after, RateLimitScope::Platform)),
            Some(Step::FailThisApprovalOnly(after)) => {
                Err(Unavailable(Some(after), RateLimitScope::Approval))
            }
            Some(Step::Hold(release)) => {
                let _ = release.await;
                Ok(())
            }
            Some(Step::HoldThenFail(release)) => {
                let _ = release.await;
                Err(Unavailable(None, RateLimitScope::Platform))
            }
            Some(Step::Slow(pause)) => {
                tokio::time::sleep(pause).await;
                Ok(())
            }
            None => Ok(()),
        };
        let mut record = self.0.lock();
        if let Some(running) = record.running.get_mut(key) {
            *running -= 1;
        }
        if result.is_ok() {
            record.calls[index].shown = Some(Instant::now());
            record
                .messages
                .insert(key.clone(), (approval.id.clone(), approval.state()));
        }
        result
    }

    async fn notice(&self, event: &pb::ApprovalEvent) -> Result<(), Unavailable> {
        let key = event
            .approval
            .as_ref()
            .map(|approval| approval.idempotency_key.clone())
            .unwrap_or_default();
        let mut record = self.0.lock();
        if record.running.get(&key).is_some_and(|running| *running > 0) {
            record.overlapped = true;
        }
        record
            .notice_calls
            .push((key.clone(), event.kind(), Instant::now()));
        let failing_after = record
            .notices_failing_after
            .get_mut(&key)
            .and_then(VecDeque::pop_front);
        if let Some(after) = failing_after {
            return Err(Unavailable(Some(after), RateLimitScope::Platform));
        }
        if record.failing_notices > 0 {
            record.failing_notices -= 1;
            return Err(Unavailable(None, RateLimitScope::Platform));
        }
        record.notices.push((key, event.kind()));
        Ok(())
    }

    fn rate_limit_scope(&self, error: &Unavailable) -> RateLimitScope {
        error.1
    }

    async fn unfinished(&self) -> Result<Vec<String>, Unavailable> {
        let mut record = self.0.lock();
        record.snapshots += 1;
        Ok(record
            .messages
            .values()
            .filter(|(_, state)| *state == ApprovalState::Pending)
            .map(|(id, _)| id.clone())
            .collect())
    }
}

struct Harness {
    server: TestServer,
    agent: Client,
    recorder: Recorder,
    cursor: Option<PathBuf>,
    /// Where the runtime serves `/healthz` and `/metrics`, when it does.
    metrics_listen: Option<SocketAddr>,
    _state: tempfile::TempDir,
}

/// A running runtime, the trigger of its graceful shutdown, and the handle that asks it to
/// show approvals.
struct Running {
    task: JoinHandle<Result<(), RuntimeError>>,
    stop: oneshot::Sender<()>,
    shows: ShowRequests,
}

impl Running {
    async fn shut_down(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    /// What a SIGKILL does to the runtime: everything stops where it is.
    async fn kill(self) {
        self.task.abort();
        assert!(self.task.await.unwrap_err().is_cancelled());
    }
}

impl Harness {
    async fn new(with_cursor: bool) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let server = TestServer::start().await;
        let agent = Client::connect(ClientConfig::new(server.url())).unwrap();
        let state = tempfile::tempdir().unwrap();
        Harness {
            agent,
            recorder: Recorder::default(),
            cursor: with_cursor.then(|| state.path().join("state/watch-cursor")),
            metrics_listen: None,
            server,
            _state: state,
        }
    }

    fn start(&self, shutdown_grace: Duration) -> Running {
        let client = Client::connect(ClientConfig::new(self.server.url())).unwrap();
        let options = RuntimeOptions {
            heartbeat_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(1),
            retry: Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
            shutdown_grace,
            cursor_path: self.cursor.clone(),
            metrics_listen: self.metrics_listen,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let channel = TestChannel(self.recorder.clone());
        let (shows, queue) = runtime::show_requests();
        let task = tokio::spawn(runtime::run_with_requests(
            client,
            channel,
            options,
            queue,
            async {
                let _ = stopped.await;
            },
        ));
        Running { task, stop, shows }
    }

    async fn request(&self, key: &str) -> pb::Approval {
        self.agent
            .request_approval(pb::RequestApprovalRequest {
                agent_id: "coder-1".into(),
                session_id: "session-7".into(),
                idempotency_key: key.into(),
                tool_name: "bash".into(),
                arguments_json: r#"{"command":"make"}"#.into(),
                action: "build".into(),
                risk: pb::Risk::Low.into(),
                ttl_seconds: 600,
                ..Default::default()
            })
            .await
            .unwrap()
            .approval
            .unwrap()
    }

    async fn cancel(&self, approval: &pb::Approval) {
        self.agent
            .cancel_approval(&approval.id, "not needed")
            .await
            .unwrap();
    }

    /// Requests an approval and waits until it is shown pending.
    async fn request_shown(&self, key: &str) -> pb::Approval {
        let approval = self.request(key).await;
        self.recorder.until_shown(key, ApprovalState::Pending).await;
        approval
    }

    /// Restarts the runtime and waits until `key` is shown pending, then until a request
    /// made after that is: every call of the restarted runtime for what came before it has
    /// then been made. Returns the runtime and the keys of its calls, in order.
    async fn restart_until_shown(&self, key: &str) -> (Running, Vec<String>) {
        let before_restart = self.recorder.lock().calls.len();
        let running = self.start(GRACE);
        self.recorder.until_shown(key, ApprovalState::Pending).await;
        self.request_shown("after").await;
        let keys = self.recorder.lock().calls[before_restart..]
            .iter()
            .map(|call| call.key.clone())
            .collect();
        (running, keys)
    }

    fn saved_cursor(&self) -> Option<u64> {
        saved_cursor(self.cursor.as_deref()?)
    }

    /// Waits until the persisted cursor is at least `seq`.
    async fn until_cursor(&self, seq: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.saved_cursor().is_none_or(|saved| saved < seq) {
            assert!(Instant::now() < deadline, "the cursor never reached {seq}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn saved_cursor(path: &Path) -> Option<u64> {
    Cursor::open(path).1.map(|cursor| cursor.seq)
}

const GRACE: Duration = Duration::from_secs(5);

/// A held update of one approval holds up its later updates, which then come in order, and
/// never another approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_s_updates_keep_their_order_and_never_hold_up_another() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    harness
        .recorder
        .until("the first snapshot", |record| record.snapshots == 1)
        .await;
    let (release, held) = oneshot::channel();
    harness.recorder.script("slow", Step::Hold(held));
    let slow = harness.request("slow").await;
    harness.recorder.until_called("slow").await;
    harness.cancel(&slow).await;
    harness.request("fast").await;
    harness
        .recorder
        .until_shown("fast", ApprovalState::Pending)
        .await;
    assert!(
        harness.recorder.shown_states("slow").is_empty(),
        "the held call is still held"
    );
    release.send(()).unwrap();
    harness
        .recorder
        .until_shown("slow", ApprovalState::Cancelled)
        .await;
    assert_eq!(
        harness.recorder.shown_states("slow"),
        vec![ApprovalState::Pending, ApprovalState::Cancelled]
    );
    assert!(
        !harness.recorder.lock().overlapped,
        "two calls for one approval ran at once"
    );
    running.shut_down().await;
}

/// A failure with a retry-after: nothing is tried for the approval before it passed (its
/// cancellation meanwhile makes no call), then the retry shows the approval as it is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_the_platform_s_retry_after_and_shows_the_latest_state() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    let retry_after = Duration::from_millis(1500);
    harness
        .recorder
        .script("limited", Step::Fail(Some(retry_after)));
    let limited = harness.request("limited").await;
    harness.recorder.until_called("limited").await;
    harness.cancel(&limited).await;
    harness
        .recorder
        .until_shown("limited", ApprovalState::Cancelled)
        .await;
    let calls = harness.recorder.calls_of("limited");
    let states: Vec<ApprovalState> = calls.iter().map(|call| call.state).collect();
    assert_eq!(
        states,
        vec![ApprovalState::Pending, ApprovalState::Cancelled],
        "one failed call, then the retry with the state as it is now"
    );
    assert!(calls[0].shown.is_none());
    let waited = calls[1].started - calls[0].started;
    assert!(
        waited >= retry_after,
        "retried after {waited:?}, before the retry-after of {retry_after:?}"
    );
    running.shut_down().await;
}

/// A platform's retry-after holds every call to it, not only the limited approval's: an
/// approval requested after the 429 is not shown before the retry-after passed (it was shown
/// 20–50 ms later), and neither is a notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_holds_the_calls_of_every_approval_until_it_passed() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    let retry_after = Duration::from_secs(2);
    harness
        .recorder
        .script("limited", Step::Fail(Some(retry_after)));
    harness.request("limited").await;
    harness.recorder.until_called("limited").await;
    let limited_at = harness.recorder.calls_of("limited")[0].started;
    harness.request("other").await;
    harness
        .recorder
        .until_shown("other", ApprovalState::Pending)
        .await;
    harness
        .recorder
        .until_shown("limited", ApprovalState::Pending)
        .await;
    let after_the_429: Vec<Duration> = harness
        .recorder
        .lock()
        .calls
        .iter()
        .map(|call| call.started.duration_since(limited_at))
        .filter(|since| !since.is_zero())
        .collect();
    assert_eq!(after_the_429.len(), 2, "the retry and the other approval");
    assert!(
        after_the_429.iter().all(|since| *since >= retry_after),
        "calls {after_the_429:?} after the 429, before its retry-after of {retry_after:?}"
    );
    running.shut_down().await;
}

/// A restarted runtime resumes after its cursor: no snapshot, and what happened while it was
/// stopped is replayed (the cancellation of an approval it showed, a new request), while
/// what it had fully handled is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_after_the_cursor_and_replays_what_came_after() {
    let harness = Harness::new(true).await;
    let running = harness.start(GRACE);
    let shown = harness.request_shown("shown").await;
    running.shut_down().await;
    assert!(harness.saved_cursor().is_some_and(|seq| seq > 0));

    harness.cancel(&shown).await;
    harness.request("while-away").await;
    let before_restart = harness.recorder.lock().calls.len();
    let running = harness.start(GRACE);
    harness
        .recorder
        .until_shown("shown", ApprovalState::Cancelled)
        .await;
    harness
        .recorder
        .until_shown("while-away", ApprovalState::Pending)
        .await;
    {
        let record = harness.recorder.lock();
        assert_eq!(record.snapshots, 1, "only the first start took a snapshot");
        let replayed: Vec<(&str, ApprovalState)> = record.calls[before_restart..]
            .iter()
            .map(|call| (call.key.as_str(), call.state))
            .collect();
        assert!(
            !replayed.contains(&("shown", ApprovalState::Pending)),
            "the request handled before the restart was shown again: {replayed:?}"
        );
    }
    running.shut_down().await;
}

/// Issue 44: the server's database is restored from a backup taken before the runtime's
/// cursor, and agents write past the cursor before the runtime starts again. The seqs between
/// the backup's head and the cursor now name requests the runtime never saw; resuming after
/// the cursor would skip them. The restored log has another history id, so the runtime
/// re-lists and shows every pending approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_past_the_cursor_a_restart_re_lists_and_misses_nothing() {
    if countersign_testkit::postgres::skip_unless_sqlite(
        "restores a SQLite backup file; PostgreSQL's restore is pg_restore and `audit new-history`",
    ) {
        return;
    }
    let mut harness = Harness::new(true).await;
    harness.request("in-backup").await;
    harness.agent.backup_database("backup.db").await.unwrap();
    let running = harness.start(GRACE);
    harness
        .recorder
        .until_shown("in-backup", ApprovalState::Pending)
        .await;
    for key in ["after-backup-1", "after-backup-2"] {
        harness.request_shown(key).await;
    }
    running.shut_down().await;
    let read = harness.saved_cursor().expect("a persisted cursor");
    assert_eq!(read, 3);

    harness.server.stop().await;
    let database = harness.server.database_path();
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", database.display()));
        if file.exists() {
            std::fs::remove_file(file).unwrap();
        }
    }
    std::fs::copy(database.with_file_name("backup.db"), &database).unwrap();
    harness.server.restart().await;
    // The restored log (head 1) goes on past the cursor (3).
    let restored: Vec<String> = (0..3).map(|n| format!("restored-{n}")).collect();
    for key in &restored {
        harness.request(key).await;
    }

    let running = harness.start(GRACE);
    for key in &restored {
        harness
            .recorder
            .until_shown(key, ApprovalState::Pending)
            .await;
    }
    assert_eq!(
        harness.recorder.lock().snapshots,
        2,
        "the restart re-listed instead of resuming"
    );
    running.shut_down().await;
}

/// Killed while a call is in flight (after the platform was asked, before it answered), the
/// restarted runtime shows that approval again and nothing it had fully handled before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_flight_loses_nothing_and_duplicates_nothing() {
    let harness = Harness::new(true).await;
    let running = harness.start(GRACE);
    harness.request_shown("handled").await;
    harness.until_cursor(1).await;
    let (_never_released, held) = oneshot::channel();
    harness.recorder.script("in-flight", Step::Hold(held));
    harness.request("in-flight").await;
    harness.recorder.until_called("in-flight").await;
    running.kill().await;
    assert!(harness.recorder.shown_states("in-flight").is_empty());

    let (running, after_restart) = harness.restart_until_shown("in-flight").await;
    assert_eq!(after_restart, vec!["in-flight", "after"]);
    assert_eq!(
        harness.recorder.lock().snapshots,
        1,
        "the restart resumed after the cursor"
    );
    running.shut_down().await;
}

/// A graceful shutdown lets the work in flight finish within the grace period, stops what
/// would outlast it, and flushes the cursor: the restarted runtime shows the stopped work
/// again and not the finished work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_finishes_work_within_the_grace_period_and_flushes_the_cursor() {
    let harness = Harness::new(true).await;
    // The finishing call needs 500 ms and then its delivery recorded on the server; a grace of
    // 2 s was once too short for both on a loaded two-core machine (the cursor stayed at 0).
    let running = harness.start(Duration::from_secs(5));
    harness
        .recorder
        .script("finishing", Step::Slow(Duration::from_millis(500)));
    harness.request("finishing").await;
    let (_never_released, held) = oneshot::channel();
    harness.recorder.script("outlasting", Step::Hold(held));
    harness.request("outlasting").await;
    harness.recorder.until_called("finishing").await;
    harness.recorder.until_called("outlasting").await;
    running.shut_down().await;
    assert_eq!(
        harness.recorder.shown_states("finishing"),
        vec![ApprovalState::Pending],
        "the call in flight finished"
    );
    assert!(harness.recorder.shown_states("outlasting").is_empty());
    // The writer stopped with the shutdown; only the flush can have saved the cursor past
    // the work that finished during the grace period.
    let saved = harness.saved_cursor().unwrap_or(0);

    let (running, after_restart) = harness.restart_until_shown("outlasting").await;
    assert_eq!(
        after_restart,
        vec!["outlasting", "after"],
        "cursor saved at {saved}"
    );
    running.shut_down().await;
}

/// An approval waiting for its retry at a shutdown keeps its event ahead of the cursor: the
/// restarted runtime shows it, and nothing the first run finished. (Its retry-after is one
/// the channel says limits that approval alone, so the others are shown meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_waiting_for_its_retry_is_shown_after_a_restart() {
    let harness = Harness::new(true).await;
    let running = harness.start(GRACE);
    harness.request_shown("handled").await;
    harness.recorder.script(
        "waiting",
        Step::FailThisApprovalOnly(Duration::from_secs(600)),
    );
    harness.request("waiting").await;
    harness.recorder.until_called("waiting").await;
    harness.request_shown("handled-later").await;
    running.shut_down().await;
    assert!(harness.recorder.shown_states("waiting").is_empty());

    let (running, after_restart) = harness.restart_until_shown("waiting").await;
    // The later request is replayed too (the cursor cannot pass the waiting one); showing
    // it again is what an idempotent channel makes harmless. Lanes run concurrently, so the
    // two replayed calls may start in either order.
    let mut replayed = after_restart;
    replayed.sort();
    assert_eq!(replayed, vec!["after", "handled-later", "waiting"]);
    running.shut_down().await;
}

/// Without a cursor every start takes a snapshot; an approval the channel still showed
/// pending and that was resolved while the runtime was stopped is shown as it is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_corrects_what_was_resolved_while_stopped() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    let resolved = harness.request_shown("resolved-while-away").await;
    harness.request_shown("still-pending").await;
    running.shut_down().await;
    harness.cancel(&resolved).await;

    let running = harness.start(GRACE);
    harness
        .recorder
        .until_shown("resolved-while-away", ApprovalState::Cancelled)
        .await;
    assert_eq!(
        harness.recorder.shown_states("resolved-while-away"),
        vec![ApprovalState::Pending, ApprovalState::Cancelled]
    );
    assert_eq!(harness.recorder.lock().snapshots, 2);
    running.shut_down().await;
}

/// With a cursor, a replayed `Requested` event is shown as the approval is now: an approval
/// requested and cancelled while the runtime was stopped is never shown pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cursor_a_replayed_request_is_shown_as_the_approval_is_now() {
    let harness = Harness::new(true).await;
    let running = harness.start(GRACE);
    harness.request_shown("before").await;
    running.shut_down().await;

    let gone = harness.request("cancelled-while-away").await;
    harness.cancel(&gone).await;
    let (running, _) = harness.restart_until_shown("before").await;
    harness
        .recorder
        .until_shown("cancelled-while-away", ApprovalState::Cancelled)
        .await;
    let states = harness.recorder.called_states("cancelled-while-away");
    assert!(
        !states.contains(&ApprovalState::Pending),
        "shown pending after it was cancelled: {states:?}"
    );
    running.shut_down().await;
}

/// The request of a call a session grant approved at once, an event that changes no
/// message, goes to the channel's notice, in the approval's lane after its show; a notice
/// that fails with a retry-after is tried again, not before it. Requests someone is asked
/// about get no notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_s_use_is_a_notice_retried_after_the_platform_s_retry_after() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    let asked = harness.request_shown("asked").await;
    harness
        .agent
        .decide(pb::DecideRequest {
            approval_id: asked.id.clone(),
            verdict: pb::Verdict::Approve.into(),
            scope: pb::Scope::Session.into(),
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: "carol".into(),
                display_name: "Carol".into(),
            }),
            idempotency_key: "carol-asked".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    harness
        .recorder
        .until_shown("asked", ApprovalState::Approved)
        .await;
    let retry_after = Duration::from_millis(800);
    harness
        .recorder
        .lock()
        .notices_failing_after
        .insert("granted".into(), VecDeque::from([retry_after]));
    let granted = harness.request("granted").await;
    assert_eq!(
        granted.state(),
        ApprovalState::Approved,
        "approved by the grant"
    );
    harness
        .recorder
        .until("the notice is tried again", |record| {
            record
                .notice_calls
                .iter()
                .filter(|n| n.0 == "granted")
                .count()
                == 2
        })
        .await;
    let (notices, overlapped) = {
        let record = harness.recorder.lock();
        (record.notice_calls.clone(), record.overlapped)
    };
    assert!(
        notices
            .iter()
            .all(|n| n.0 == "granted" && n.1 == pb::EventKind::Requested),
        "{notices:?}"
    );
    let waited = notices[1].2 - notices[0].2;
    assert!(waited >= retry_after, "retried after {waited:?}");
    assert!(!overlapped, "a notice ran beside a show of its approval");
    running.shut_down().await;
}

/// An approval asked for through [`ShowRequests`] (a copy, or as it is now) is shown in its
/// lane: after the show in flight, never beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shows_asked_beside_the_loop_run_in_the_approval_s_lane() {
    let harness = Harness::new(false).await;
    let running = harness.start(GRACE);
    let pending = harness.request_shown("asked").await;
    let (release, held) = oneshot::channel();
    harness.recorder.script("asked", Step::Hold(held));
    harness.cancel(&pending).await;
    harness.recorder.until_calls("asked", 2).await;
    running.shows.show(pending.clone());
    running.shows.show_current(&pending.id);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        harness.recorder.calls_of("asked").len(),
        2,
        "waiting behind the held show"
    );
    release.send(()).unwrap();
    harness.recorder.until_calls("asked", 4).await;
    let states = harness.recorder.called_states("asked");
    assert_eq!(
        states,
        vec![
            ApprovalState::Pending,
            ApprovalState::Cancelled,
            ApprovalState::Pending,
            ApprovalState::Cancelled
        ],
        "the copy as given, then the approval as it is now"
    );
    assert!(!harness.recorder.lock().overlapped);
    running.shut_down().await;
}

/// A copy asked for beside the loop while the approval waits for a retry (an older state
/// than the one that failed) leaves the retry alone: the retry shows the approval as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_asked_for_while_a_retry_waits_does_not_cancel_it() {
    let harness = Harness::new(true).await;
    let running = harness.start(GRACE);
    let pending = harness.request_shown("overtaken").await;
    let (release, held) = oneshot::channel();
    harness
        .recorder
        .script("overtaken", Step::HoldThenFail(held));
    harness.cancel(&pending).await;
    harness.recorder.until_calls("overtaken", 2).await;
    // Queued behind the cancelled state's show, which then fails.
    running.shows.show(pending.clone());
    release.send(()).unwrap();
    harness
        .recorder
        .until_shown("overtaken", ApprovalState::Cancelled)
        .await;
    assert_eq!(
        harness.recorder.called_states("overtaken"),
        vec![
            ApprovalState::Pending,
            ApprovalState::Cancelled,
            ApprovalState::Cancelled
        ],
        "the older copy is not shown; the retry shows the cancellation"
    );
    running.shut_down().await;
}

/// The sample of `name` (a counter or gauge of the test channel) whose labels include
/// `label`, in a `/metrics` text.
fn worker_sample(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(&format!("countersign_worker_{name}{{"))?;
        let (labels, value) = rest.split_once("} ")?;
        (labels.contains("channel=\"test\"") && labels.contains(label))
            .then(|| value.trim().parse().ok())?
    })
}

/// Waits (at most 20 s) until `GET path` on the runtime's metrics address answers `status`
/// and `done` holds of its body; returns the body.
async fn until_answer(
    addr: SocketAddr,
    path: &str,
    status: u16,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = http::get(addr, path).await;
        match &answer {
            Ok(answer) if answer.status == status && done(&answer.body) => {
                return answer.body.clone()
            }
            _ => assert!(
                Instant::now() < deadline,
                "{path} never answered {status} as expected; last: {answer:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `/healthz` follows the watch (503 while the server is away), and `/metrics` counts what
/// the runtime did: events, shows by outcome, retries waiting, the cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_watch_and_metrics_count_what_was_shown() {
    let mut harness = Harness::new(true).await;
    let addr = http::free_addr();
    harness.metrics_listen = Some(addr);
    let running = harness.start(GRACE);
    // Connected first: a request made before the watch opened comes in its snapshot, which
    // is not a watch event.
    until_answer(addr, "/healthz", 200, |body| body.starts_with("ok")).await;
    harness.request_shown("first").await;

    harness.recorder.script("flaky", Step::Fail(None));
    harness.request_shown("flaky").await;
    let text = until_answer(addr, "/metrics", 200, |text| {
        worker_sample(text, "cursor_seq", "").is_some_and(|seq| seq >= 2.0)
    })
    .await;
    assert!(
        worker_sample(&text, "events_total", "").unwrap() >= 2.0,
        "{text}"
    );
    assert_eq!(
        worker_sample(&text, "shows_total", "outcome=\"ok\""),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        worker_sample(&text, "shows_total", "outcome=\"retry\""),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        worker_sample(&text, "retries_waiting", ""),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        worker_sample(&text, "watch_connected", ""),
        Some(1.0),
        "{text}"
    );

    harness.server.stop().await;
    let body = until_answer(addr, "/healthz", 503, |_| true).await;
    assert!(
        body.contains("not connected to the countersign server"),
        "{body}"
    );
    let text = until_answer(addr, "/metrics", 200, |_| true).await;
    assert_eq!(
        worker_sample(&text, "watch_connected", ""),
        Some(0.0),
        "{text}"
    );
    harness.server.restart().await;
    until_answer(addr, "/healthz", 200, |_| true).await;
    running.shut_down().await;
}

/// A metrics address that is taken stops the runtime at once with an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_address_is_named() {
    let mut harness = Harness::new(false).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    harness.metrics_listen = Some(addr);
    let error = harness.start(GRACE).task.await.unwrap().unwrap_err();
    assert!(matches!(error, RuntimeError::Metrics(_)), "{error:?}");
    assert!(error.to_string().contains(&addr.to_string()), "{error}");
}

/// A reminder changes no message: it reaches the channel's notice (retried after a failure
/// that may pass), once, and no extra show; the request before it was shown first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_is_a_notice_retried_until_told() {
    let harness = Harness::new(false).await;
    harness.recorder.lock().failing_notices = 2;
    let running = harness.start(GRACE);
    let approval = harness
        .agent
        .request_approval(pb::RequestApprovalRequest {
            agent_id: "coder-1".into(),
            idempotency_key: "reminded".into(),
            risk: pb::Risk::Low.into(),
            action: "build".into(),
            tool_name: "bash".into(),
            arguments_json: "{}".into(),
            ttl_seconds: 600,
            follow_up: Some(pb::FollowUp {
                remind_after_seconds: 1,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .approval
        .unwrap();
    harness
        .recorder
        .until("the reminder is told", |record| !record.notices.is_empty())
        .await;
    {
        let record = harness.recorder.lock();
        assert_eq!(
            record.notices,
            vec![("reminded".to_owned(), pb::EventKind::Reminded)]
        );
        assert_eq!(record.failing_notices, 0, "both failures were retried");
        let shows = record.calls.iter().filter(|c| c.key == "reminded").count();
        assert_eq!(shows, 1, "the reminder shows nothing: {approval:?}");
    }
    running.shut_down().await;
}
