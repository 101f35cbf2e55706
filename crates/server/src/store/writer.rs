//! The single writer: one task owns the only writing connection, takes every change waiting
//! in its queue as one batch (group commit), plans it in memory ([`super::batch`]; what does
//! not depend on the order inside the batch, a request's new approval with its encoded row and
//! event, is made in the caller's task before it queues, and the writer only assigns the seq
//! and chain hash), writes it and commits, answers each caller only after that commit,
//! and then publishes the events to the hub. On a shared database (PostgreSQL) the hub is fed
//! instead by the follower ([`follow`]), which reads every server's events in seq order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::Millis;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::backend::{Backend, WriterConnection};
use super::batch::{Applied, BatchKeys, Change, Plan, Reply};
use super::error::StoreError;
use super::records::{now_millis, ChainHead};
use crate::receipts::ReceiptKeys;
use crate::store::hub::Hub;

/// One change waiting in the writer's queue, with the caller to answer.
pub(super) struct Job {
    pub(super) change: Change,
    pub(super) now: Millis,
    pub(super) reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// Commit statistics, observed after every group commit.
pub trait CommitObserver: Send + Sync {
    fn committed(&self, batch_size: usize, latency: Duration);
}

/// How often the follower reads the log when no commit woke it: the bound on how late an event
/// whose notification was lost reaches this server's watchers.
const CATCH_UP_POLL: Duration = Duration::from_millis(500);
/// Events the follower reads at a time.
const FOLLOW_PAGE: u32 = 1000;

/// Publishes every committed event after `cursor`, whichever server wrote it, in seq order:
/// woken by this server's commits and the database's notifications, and every
/// [`CATCH_UP_POLL`] in case a notification was lost. Ends with the writer (`writer_alive`
/// closes).
pub(super) async fn follow(
    backend: Arc<dyn Backend>,
    hub: Hub,
    wake: Arc<Notify>,
    mut cursor: i64,
    mut writer_alive: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(CATCH_UP_POLL) => {}
            changed = writer_alive.changed() => if changed.is_err() { break },
        }
        loop {
            match backend.events_after(cursor, FOLLOW_PAGE).await {
                Ok(events) => {
                    let full = events.len() == FOLLOW_PAGE as usize;
                    for event in events {
                        cursor = event.seq;
                        hub.publish(event);
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, after_seq = cursor, "cannot read the event log to publish it; retrying");
                    break;
                }
            }
        }
    }
    tracing::debug!("event follower stopped");
}

/// How often the writer, while the database refuses writes, tries a write of its own, so that
/// health recovers when space returns even if no caller writes (a load balancer sends none to
/// a replica that is NOT_SERVING).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The single writer: owns the only writing connection and the head of the audit chain.
pub(super) struct Writer {
    pub(super) backend: Arc<dyn Backend>,
    /// None until the first batch and after a failed one: the next batch connects.
    pub(super) conn: Option<Box<dyn WriterConnection>>,
    /// The head of the audit chain as committed; None when it must be read again from the
    /// database (after a failed batch).
    pub(super) chain: Option<ChainHead>,
    pub(super) health: watch::Sender<bool>,
    pub(super) redact_arguments: bool,
    /// Signs the receipt of each approval a verdict resolves; none: no receipts.
    pub(super) receipts: Option<Arc<ReceiptKeys>>,
    /// On a shared database: the follower to wake after a commit, which publishes the events
    /// (the writer then publishes none itself).
    pub(super) follower: Option<Arc<Notify>>,
}

type Outcomes = Vec<Result<Applied, StoreError>>;

impl Writer {
    /// Commits batches from `queue` until every sender is gone or `stop` is notified; at a
    /// stop, the changes already queued are committed and later ones refused.
    pub(super) async fn run(
        mut self,
        mut queue: mpsc::Receiver<Job>,
        max_batch: usize,
        hub: Hub,
        observer: Option<Arc<dyn CommitObserver>>,
        stop: Arc<Notify>,
    ) {
        let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
        let mut next_probe = Instant::now();
        let mut stopping = false;
        loop {
            if !*self.health.borrow() && Instant::now() >= next_probe {
                self.probe().await;
                next_probe = Instant::now() + PROBE_INTERVAL;
            }
            let healthy = *self.health.borrow();
            let receiving = async {
                if healthy {
                    Some(queue.recv_many(&mut batch, max_batch).await)
                } else {
                    let deadline = tokio::time::Instant::from_std(next_probe);
                    tokio::time::timeout_at(deadline, queue.recv_many(&mut batch, max_batch))
                        .await
                        .ok()
                }
            };
            let received = tokio::select! {
                () = stop.notified(), if !stopping => {
                    stopping = true;
                    queue.close();
                    continue;
                }
                received = receiving => match received {
                    Some(received) => received,
                    None => continue,
                },
            };
            if received == 0 {
                break;
            }
            let started = Instant::now();
            let size = batch.len();
            let (work, replies): (Vec<(Change, Millis)>, Vec<_>) = batch
                .drain(..)
                .map(|job| ((job.change, job.now), job.reply))
                .unzip();
            let outcome = self.commit(work).await;
            if let Some(observer) = &observer {
                observer.committed(size, started.elapsed());
            }
            match outcome {
                Ok(results) => {
                    if let Some(follower) = &self.follower {
                        follower.notify_one();
                    }
                    let direct = self.follower.is_none();
                    for (reply, result) in replies.into_iter().zip(results) {
                        let answer = result.map(|applied| {
                            if direct {
                                for event in applied.events {
                                    hub.publish(event);
                                }
                            }
                            applied.reply
                        });
                        // A caller that went away does not undo a committed change.
                        let _ = reply.send(answer);
                    }
                }
                Err(e) => {
                    next_probe = Instant::now() + PROBE_INTERVAL;
                    let reason = e.to_string();
                    for reply in replies {
                        let _ = reply.send(Err(StoreError::Unavailable(reason.clone())));
                    }
                }
            }
        }
        tracing::debug!("store writer stopped");
    }

    /// Commits a batch. On any failure the connection is dropped: after a failed COMMIT
    /// (SQLITE_FULL, an I/O error) the database has already rolled the transaction back, and
    /// a connection whose transaction state is unknown must not take the next batch (with
    /// sqlx's own transactions it turned every later BEGIN into a SAVEPOINT of a transaction
    /// that never committed, acknowledging writes that were never stored).
    async fn commit(&mut self, work: Vec<(Change, Millis)>) -> Result<Outcomes, StoreError> {
        match self.commit_connected(work).await {
            Ok((results, wrote)) => {
                // Only a commit that wrote something shows that writes are accepted again
                // (an empty expiry sweep commits even on a full disk).
                if wrote {
                    self.set_writable(true);
                }
                Ok(results)
            }
            Err(e) => {
                tracing::error!(error = %e, "storage refused a batch; every change of it was rolled back and answered with an error; reconnecting");
                self.set_writable(false);
                self.chain = None;
                Err(e)
            }
        }
    }

    /// Commits a batch on the writer's connection, opening one first when there is none.
    async fn commit_connected(
        &mut self,
        work: Vec<(Change, Millis)>,
    ) -> Result<(Outcomes, bool), StoreError> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.backend.connect_writer().await?,
        };
        let committed = self.commit_on(conn.as_mut(), work).await?;
        self.conn = Some(conn);
        Ok(committed)
    }

    /// Reads what the batch needs, applies its changes in queue order, writes and commits.
    /// A change refused by the domain changes nothing, and its refusal is its answer; the
    /// others still commit. Returns the outcomes and whether anything was written.
    async fn commit_on(
        &mut self,
        conn: &mut dyn WriterConnection,
        work: Vec<(Change, Millis)>,
    ) -> Result<(Outcomes, bool), StoreError> {
        let head = match (conn.begin().await?, self.chain.take()) {
            (Some(shared), _) => shared,
            (None, Some(head)) => head,
            (None, None) => conn.chain_head().await?,
        };
        let keys = BatchKeys::of(work.iter().map(|(change, now)| (change, *now)));
        let loaded = conn.load(&keys).await?;
        let mut plan = Plan::new(loaded, head, self.redact_arguments, self.receipts.clone());
        let mut results: Outcomes = work
            .into_iter()
            .map(|(change, now)| plan.apply(change, now))
            .collect();
        let (head, writes) = plan.finish();
        let wrote = !writes.is_empty();
        let pruned = if wrote { conn.write(&writes).await? } else { 0 };
        conn.commit().await?;
        self.chain = Some(head);
        for applied in results.iter_mut().flatten() {
            if matches!(applied.reply, Reply::Pruned) {
                applied.reply = Reply::Count(pruned);
            }
        }
        Ok((results, wrote))
    }

    /// Tries one small write; health follows its outcome.
    async fn probe(&mut self) {
        let written = async {
            let mut conn = match self.conn.take() {
                Some(conn) => conn,
                None => self.backend.connect_writer().await?,
            };
            conn.probe(now_millis()).await?;
            self.conn = Some(conn);
            Ok::<(), StoreError>(())
        }
        .await;
        match written {
            Ok(()) => {
                tracing::info!("storage accepts writes again");
                self.set_writable(true);
            }
            Err(e) => tracing::warn!(error = %e, "storage still refuses writes"),
        }
    }

    fn set_writable(&self, writable: bool) {
        self.health.send_if_modified(|current| {
            let changed = *current != writable;
            *current = writable;
            changed
        });
    }
}
