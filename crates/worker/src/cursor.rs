//! The persisted watch cursor: the seq a restarted worker resumes its watch after, instead of
//! taking a snapshot and correcting only the most recently resolved approvals.
//!
//! The watch hands items over in seq order, but their work runs concurrently, one lane per
//! approval, and a failure that may pass is retried later. So each item is [`Cursor::begin`]
//! as it arrives and stays in flight until every part of its work is over — finished, or
//! refused by the platform for good — including retries ([`Cursor::park`]). The cursor names
//! the highest seq below which nothing is in flight: every event up to it was fully handled.
//! Work that is dropped unfinished (a killed worker, a panic) keeps its seq in flight for the
//! rest of the run, so the cursor never passes it.
//!
//! The file holds the seq in decimal. It is replaced atomically (temporary file, `fsync`,
//! rename, `fsync` of the directory) by a writer that coalesces updates.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// Why the cursor file cannot be written.
#[derive(Debug, thiserror::Error)]
#[error("watch cursor {path}: {source}")]
pub struct CursorError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The cursor of one worker. Cloning gives another handle to the same cursor.
#[derive(Clone)]
pub struct Cursor {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    state: Mutex<State>,
    /// The newest safe seq, for the writer.
    safe: watch::Sender<u64>,
    /// The seq last written. Writes take turns under it and never go back: the writer's
    /// write may still be running when a shutdown flushes (both use the same temporary file).
    written: Mutex<u64>,
}

#[derive(Default)]
struct State {
    /// Which log the seqs belong to: a snapshot whose head is below the seqs seen means the
    /// server's log started over (a new database, a restore), and begins a new epoch.
    epoch: u64,
    /// Seqs begun and not over.
    in_flight: BTreeSet<u64>,
    /// The highest seq begun.
    highest: u64,
    /// Parts waiting for a retry of their approval.
    parked: HashMap<String, Vec<Part>>,
}

impl Cursor {
    /// Opens the cursor at `path` and returns it with the seq persisted there (`None`: no
    /// file, or one that cannot be read, which is logged; the caller then takes a snapshot).
    pub fn open(path: &Path) -> (Cursor, Option<u64>) {
        let saved = match std::fs::read_to_string(path) {
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(seq) => Some(seq),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "the watch cursor file is unreadable; starting with a snapshot");
                    None
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the watch cursor; starting with a snapshot");
                None
            }
        };
        let start = saved.unwrap_or(0);
        let (safe, _) = watch::channel(start);
        let cursor = Cursor {
            shared: Arc::new(Shared {
                path: path.to_owned(),
                state: Mutex::new(State {
                    highest: start,
                    ..State::default()
                }),
                safe,
                written: Mutex::new(0),
            }),
        };
        (cursor, saved)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is a few inserts or removes; a panicking holder cannot leave it half-done.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes that the item with `seq` (an event, or a snapshot's head) is being handled; the
    /// returned part, and its clones ([`Part::share`]) handed to each job, keep it in flight
    /// until each is [`Part::done`]. Items must be begun in seq order.
    pub fn begin(&self, seq: u64) -> Part {
        let mut state = self.state();
        state.highest = state.highest.max(seq);
        state.in_flight.insert(seq);
        let epoch = state.epoch;
        drop(state);
        Part {
            item: Arc::new(Item {
                seq,
                epoch,
                cursor: self.clone(),
                abandoned: AtomicBool::new(false),
            }),
            done: false,
        }
    }

    /// Like [`Cursor::begin`] for a snapshot's head. A head below the seqs seen (or the one
    /// persisted) means the server's log started over below them (a new database, a restore):
    /// what was in flight belongs to the old log and the snapshot re-shows every pending
    /// approval, so the cursor starts again from the head, and may be written lower. Without
    /// this, a crash while the new log's events below the old seq were in flight would resume
    /// after the old seq and skip them.
    pub fn begin_snapshot(&self, head: u64) -> Part {
        let mut state = self.state();
        if head < state.highest {
            tracing::warn!(
                head,
                cursor = state.highest,
                "the server's event log is behind the watch cursor (a new or restored database); starting the cursor again from the snapshot"
            );
            state.epoch += 1;
            state.in_flight.clear();
            state.parked.clear();
            state.highest = head;
            *self
                .shared
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = 0;
            self.shared.safe.send_replace(head);
        }
        drop(state);
        self.begin(head)
    }

    /// Keeps `part` in flight until the work of `key` (an approval) succeeds or is given up
    /// ([`Cursor::release`]): its failure will be retried.
    pub fn park(&self, key: &str, part: Part) {
        self.state()
            .parked
            .entry(key.to_owned())
            .or_default()
            .push(part);
    }

    /// The work of `key` is over (succeeded, or refused for good): its parked parts are done.
    pub fn release(&self, key: &str) {
        let parked = self.state().parked.remove(key).unwrap_or_default();
        for part in parked {
            part.done();
        }
    }

    /// The seq every event up to which was fully handled.
    pub fn safe(&self) -> u64 {
        *self.shared.safe.borrow()
    }

    fn finished(&self, seq: u64, epoch: u64) {
        let mut state = self.state();
        if state.epoch != epoch {
            // Work of the old log, forgotten at the new one's snapshot.
            return;
        }
        state.in_flight.remove(&seq);
        let safe = match state.in_flight.first() {
            Some(&oldest) => oldest.saturating_sub(1),
            None => state.highest,
        };
        drop(state);
        self.shared.safe.send_if_modified(|current| {
            let advanced = safe > *current;
            *current = (*current).max(safe);
            advanced
        });
    }

    /// Writes the safe seq whenever it advances; returns only when the file cannot be written.
    pub async fn persist(&self) -> Result<(), CursorError> {
        let mut changes = self.shared.safe.subscribe();
        loop {
            if changes.changed().await.is_err() {
                return Ok(());
            }
            let seq = *changes.borrow_and_update();
            self.write(seq).await?;
        }
    }

    /// Writes the safe seq now (at a graceful shutdown, once the lanes are drained).
    pub async fn flush(&self) -> Result<(), CursorError> {
        self.write(self.safe()).await
    }

    async fn write(&self, seq: u64) -> Result<(), CursorError> {
        let shared = self.shared.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut written = shared
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seq < *written {
                return Ok(());
            }
            write_atomically(&shared.path, seq)?;
            *written = seq;
            Ok(())
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined.to_string())));
        written.map_err(|source| CursorError {
            path: self.shared.path.clone(),
            source,
        })?;
        tracing::debug!(seq, "watch cursor persisted");
        Ok(())
    }
}

fn write_atomically(path: &Path, seq: u64) -> std::io::Result<()> {
    use std::io::Write;
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let fresh = path.with_extension("writing");
    let mut file = std::fs::File::create(&fresh)?;
    writeln!(file, "{seq}")?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&fresh, path)?;
    // The rename itself is durable once the directory is.
    std::fs::File::open(parent)?.sync_all()
}

struct Item {
    seq: u64,
    epoch: u64,
    cursor: Cursor,
    /// A part was dropped unfinished: the item stays in flight for the rest of the run.
    abandoned: AtomicBool,
}

impl Drop for Item {
    fn drop(&mut self) {
        if !self.abandoned.load(Ordering::SeqCst) {
            self.cursor.finished(self.seq, self.epoch);
        }
    }
}

/// A share of the work of one watch item. The item is over when every part is
/// [`Part::done`]; a part dropped without it (its job was killed or panicked) keeps the item
/// in flight.
pub struct Part {
    item: Arc<Item>,
    done: bool,
}

impl Part {
    /// Another part of the same item, for another job.
    pub fn share(&self) -> Part {
        Part {
            item: self.item.clone(),
            done: false,
        }
    }

    /// This part of the work is over.
    pub fn done(mut self) {
        self.done = true;
    }

    pub fn seq(&self) -> u64 {
        self.item.seq
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.done {
            self.item.abandoned.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cursor_stops_below_the_oldest_item_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/cursor");
        let (cursor, saved) = Cursor::open(&path);
        assert_eq!(saved, None);
        let first = cursor.begin(5);
        let second = cursor.begin(7);
        let shared = second.share();
        let third = cursor.begin(9);
        third.done();
        assert_eq!(cursor.safe(), 4, "5 and 7 are in flight");
        first.done();
        assert_eq!(cursor.safe(), 6, "7 is in flight");
        second.done();
        assert_eq!(cursor.safe(), 6, "a share of 7 is in flight");
        cursor.park("a1", shared);
        assert_eq!(cursor.safe(), 6, "7 waits for a retry");
        cursor.release("a1");
        assert_eq!(cursor.safe(), 9);
        cursor.flush().await.unwrap();
        assert_eq!(Cursor::open(&path).1, Some(9));
    }

    /// A flush at shutdown may meet the writer's last write: neither fails, and the file
    /// keeps the newest seq.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_take_turns_and_keep_the_newest_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        let (cursor, _) = Cursor::open(&path);
        let writes: Vec<_> = (1..=200u64)
            .map(|seq| {
                let cursor = cursor.clone();
                tokio::spawn(async move { cursor.write(seq).await })
            })
            .collect();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(Cursor::open(&path).1, Some(200));
    }

    #[tokio::test]
    async fn an_abandoned_part_keeps_its_item_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (cursor, _) = Cursor::open(&dir.path().join("cursor"));
        let killed = cursor.begin(3);
        cursor.begin(4).done();
        drop(killed);
        assert_eq!(cursor.safe(), 2);
    }

    /// The server's log started over below the persisted cursor: the snapshot's head rebases
    /// it, the new log's events count from there, and the old log's work no longer matters.
    #[tokio::test]
    async fn a_snapshot_below_the_cursor_starts_it_again_from_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "50\n").unwrap();
        let (cursor, saved) = Cursor::open(&path);
        assert_eq!(saved, Some(50));
        let old_work = cursor.begin(51);
        let snapshot = cursor.begin_snapshot(10);
        assert_eq!(cursor.safe(), 10);
        let in_flight = cursor.begin(11);
        cursor.begin(12).done();
        snapshot.done();
        drop(old_work);
        assert_eq!(
            cursor.safe(),
            10,
            "11 is in flight: a crash now resumes after 10"
        );
        cursor.flush().await.unwrap();
        assert_eq!(Cursor::open(&path).1, Some(10), "written lower than before");
        in_flight.done();
        assert_eq!(cursor.safe(), 12);
        // A snapshot at or above what was seen is an ordinary resync.
        cursor.begin_snapshot(12).done();
        assert_eq!(cursor.safe(), 12);
    }

    #[test]
    fn an_unreadable_file_means_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "not a seq").unwrap();
        assert_eq!(Cursor::open(&path).1, None);
    }
}
