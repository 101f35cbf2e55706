//! One ordered lane of work per approval, many lanes at once.
//!
//! Everything a worker does to the platform for one approval (send its message, edit it,
//! retry) runs in that approval's lane, in the order it was queued, so two updates of one
//! approval never interleave; different approvals run concurrently, so a slow or failing one
//! never delays another. A lane's task ends when its queue is empty.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinSet;

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The lanes of a worker. Cloning gives another handle to the same lanes.
#[derive(Clone, Default)]
pub struct Lanes {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    tasks: Mutex<JoinSet<()>>,
    /// Signalled whenever the last lane finished.
    idle: Notify,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, VecDeque<Job>>,
    closed: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is a push, pop or remove; a panicking holder cannot leave it half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tasks(&self) -> MutexGuard<'_, JoinSet<()>> {
        self.tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Lanes {
    pub fn new() -> Lanes {
        Lanes::default()
    }

    /// Queues `job` in the lane of `key`, behind the jobs already there. Returns false (and
    /// drops the job) once [`Lanes::shutdown`] began.
    pub fn push(&self, key: &str, job: impl Future<Output = ()> + Send + 'static) -> bool {
        let mut state = self.shared.state();
        if state.closed {
            return false;
        }
        if let Some(queue) = state.queues.get_mut(key) {
            queue.push_back(Box::pin(job));
            return true;
        }
        state
            .queues
            .insert(key.to_owned(), VecDeque::from([Box::pin(job) as Job]));
        drop(state);
        let shared = self.shared.clone();
        let key = key.to_owned();
        let mut tasks = self.shared.tasks();
        // Reap finished lanes so the set does not grow with every approval ever seen.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(run_lane(shared, key));
        true
    }

    /// How many approvals have work queued or running.
    pub fn busy(&self) -> usize {
        self.shared.state().queues.len()
    }

    /// Stops taking jobs and waits, at most `within`, for the queued and running ones to
    /// finish; what is left then is dropped mid-flight.
    pub async fn shutdown(&self, within: Duration) {
        self.shared.state().closed = true;
        let drained = async {
            loop {
                let idle = self.shared.idle.notified();
                if self.busy() == 0 {
                    return;
                }
                idle.await;
            }
        };
        if tokio::time::timeout(within, drained).await.is_err() {
            tracing::warn!(
                unfinished = self.busy(),
                "shutdown: approvals still had work after the grace period; stopping it"
            );
        }
        self.abort();
    }

    /// Stops every lane at once (what a crash would do).
    fn abort(&self) {
        self.shared.tasks().abort_all();
        self.shared.state().queues.clear();
    }

    /// A guard that stops every lane when dropped, for the owner of the worker (the lanes'
    /// jobs hold the worker, so the worker alone would keep them alive).
    pub fn abort_on_drop(&self) -> AbortOnDrop {
        AbortOnDrop {
            lanes: self.clone(),
        }
    }
}

/// Stops every lane when dropped.
pub struct AbortOnDrop {
    lanes: Lanes,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.lanes.abort();
    }
}

async fn run_lane(shared: Arc<Shared>, key: String) {
    loop {
        let job = {
            let mut state = shared.state();
            match state.queues.get_mut(&key).and_then(VecDeque::pop_front) {
                Some(job) => job,
                None => {
                    state.queues.remove(&key);
                    if state.queues.is_empty() {
                        shared.idle.notify_waiters();
                    }
                    return;
                }
            }
        };
        if AssertUnwindSafe(job).catch_unwind().await.is_err() {
            tracing::error!(key, "a job panicked; its lane goes on with the next job");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn jobs_of_one_key_run_in_order_and_other_keys_do_not_wait() {
        let lanes = Lanes::new();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let log = order.clone();
        lanes.push("slow", async move {
            let _ = held.await;
            log.lock().unwrap().push("slow-1");
        });
        let log = order.clone();
        lanes.push("slow", async move { log.lock().unwrap().push("slow-2") });
        let (done, finished) = tokio::sync::oneshot::channel();
        let log = order.clone();
        lanes.push("fast", async move {
            log.lock().unwrap().push("fast");
            let _ = done.send(());
        });
        finished.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["fast"]);
        release.send(()).unwrap();
        lanes.shutdown(Duration::from_secs(5)).await;
        assert_eq!(*order.lock().unwrap(), vec!["fast", "slow-1", "slow-2"]);
        assert!(!lanes.push("late", async {}));
    }

    #[tokio::test]
    async fn shutdown_finishes_work_in_flight_and_a_panic_does_not_stop_a_lane() {
        let lanes = Lanes::new();
        let count = Arc::new(AtomicUsize::new(0));
        lanes.push("a", async { panic!("job failed") });
        for _ in 0..3 {
            let count = count.clone();
            lanes.push("a", async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
        lanes.shutdown(Duration::from_secs(5)).await;
        assert_eq!(count.load(Ordering::SeqCst), 3);
        assert_eq!(lanes.busy(), 0);
    }

    #[tokio::test]
    async fn the_guard_stops_everything() {
        let lanes = Lanes::new();
        let count = Arc::new(AtomicUsize::new(0));
        let guard = lanes.abort_on_drop();
        let counted = count.clone();
        lanes.push("a", async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            counted.fetch_add(1, Ordering::SeqCst);
        });
        drop(guard);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(lanes.busy(), 0);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }
}
