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
//! A seq means something only in the history of the event log it was read from: a restore
//! gives the log a new history id, and its seqs after the backup's head name other events. So
//! the file holds the seq in decimal and the history id after it (`1234 0193…`); a file from
//! before history ids (the seq alone) is taken as no cursor, and the worker starts with a
//! snapshot. It is replaced atomically (temporary file, `fsync`, rename, `fsync` of the
//! directory) by a writer that coalesces updates.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use countersign_client::WatchCursor;
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
    /// The newest safe cursor, for the writer. Changed only under `state`'s lock, so that a
    /// seq is never paired with another history's id.
    safe: watch::Sender<WatchCursor>,
    /// The cursor last written. Writes take turns under it and never go back within a
    /// history: the writer's write may still be running when a shutdown flushes (both use the
    /// same temporary file).
    written: Mutex<Option<WatchCursor>>,
}

#[derive(Default)]
struct State {
    /// Which log the seqs belong to: a snapshot of another history, or whose head is below
    /// the seqs seen (the server's log started over: a new database, a restore), begins a new
    /// epoch.
    epoch: u64,
    /// The history id of the log the seqs belong to; `None` until known.
    history_id: Option<String>,
    /// Seqs begun and not over.
    in_flight: BTreeSet<u64>,
    /// The highest seq begun.
    highest: u64,
    /// Parts waiting for a retry of their approval.
    parked: HashMap<String, Vec<Part>>,
}

impl Cursor {
    /// Opens the cursor at `path` and returns it with the cursor persisted there (`None`: no
    /// file, one that cannot be read, or one without a history id, which is logged; the caller
    /// then takes a snapshot).
    pub fn open(path: &Path) -> (Cursor, Option<WatchCursor>) {
        let (seq, history_id) = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text).unwrap_or_else(|| {
                tracing::warn!(path = %path.display(), "the watch cursor file is unreadable; starting with a snapshot");
                (0, None)
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => (0, None),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the watch cursor; starting with a snapshot");
                (0, None)
            }
        };
        let saved = match history_id.clone() {
            Some(history_id) => Some(WatchCursor { history_id, seq }),
            None if seq > 0 => {
                // Which log the seq was read from is unknown: it may name other events in a
                // restored one, so resuming after it could skip some.
                tracing::info!(path = %path.display(), seq, "the watch cursor file has no history id (written before history ids); starting with a snapshot");
                None
            }
            None => None,
        };
        let (safe, _) = watch::channel(WatchCursor {
            history_id: history_id.clone().unwrap_or_default(),
            seq,
        });
        let cursor = Cursor {
            shared: Arc::new(Shared {
                path: path.to_owned(),
                state: Mutex::new(State {
                    highest: seq,
                    history_id,
                    ..State::default()
                }),
                safe,
                written: Mutex::new(None),
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

    /// Like [`Cursor::begin`] for a snapshot's head. A head of another history, or below the
    /// seqs seen (or the one persisted), means the server's log is another one (a new
    /// database, a restore, a rechain): what was in flight belongs to the old log and the
    /// snapshot re-shows every pending approval, so the cursor starts again from the head, in
    /// the new history, and may be written lower. Without this, a crash while the new log's
    /// events were in flight would resume after the old seq and skip them.
    pub fn begin_snapshot(&self, head: &WatchCursor) -> Part {
        let mut state = self.state();
        let other_history = state
            .history_id
            .as_ref()
            .is_some_and(|known| *known != head.history_id);
        if other_history || head.seq < state.highest {
            tracing::warn!(
                head = head.seq,
                head_history_id = %head.history_id,
                cursor = state.highest,
                cursor_history_id = state.history_id.as_deref().unwrap_or_default(),
                "the server's event log is another one than the watch cursor's (a new, restored or re-chained database); starting the cursor again from the snapshot"
            );
            state.epoch += 1;
            state.in_flight.clear();
            state.parked.clear();
            state.highest = head.seq;
            *self
                .shared
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            self.shared.safe.send_replace(head.clone());
        } else if state.history_id.is_none() {
            self.shared
                .safe
                .send_modify(|safe| safe.history_id.clone_from(&head.history_id));
        }
        state.history_id = Some(head.history_id.clone());
        drop(state);
        self.begin(head.seq)
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
        self.shared.safe.borrow().seq
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
        // Under the state's lock: a snapshot of another log cannot slip in between.
        self.shared.safe.send_if_modified(|current| {
            let advanced = safe > current.seq;
            current.seq = current.seq.max(safe);
            advanced
        });
        drop(state);
    }

    /// Writes the safe seq whenever it advances; returns only when the file cannot be written.
    pub async fn persist(&self) -> Result<(), CursorError> {
        let mut changes = self.shared.safe.subscribe();
        loop {
            if changes.changed().await.is_err() {
                return Ok(());
            }
            let safe = changes.borrow_and_update().clone();
            self.write(safe).await?;
        }
    }

    /// Writes the safe cursor now (at a graceful shutdown, once the lanes are drained).
    pub async fn flush(&self) -> Result<(), CursorError> {
        let safe = self.shared.safe.borrow().clone();
        self.write(safe).await
    }

    async fn write(&self, cursor: WatchCursor) -> Result<(), CursorError> {
        let shared = self.shared.clone();
        let seq = cursor.seq;
        let written = tokio::task::spawn_blocking(move || {
            let mut written = shared
                .written
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let behind = written.as_ref().is_some_and(|written| {
                written.history_id == cursor.history_id && cursor.seq < written.seq
            });
            // A write from before a snapshot of another log is late: that log is gone. (Within
            // one log the safe seq only grows, so a seq above it is from before.)
            let gone = {
                let safe = shared.safe.borrow();
                safe.history_id != cursor.history_id || cursor.seq > safe.seq
            };
            if behind || gone {
                return Ok(());
            }
            write_atomically(&shared.path, &cursor)?;
            *written = Some(cursor);
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

/// The seq and, when the file has one, the history id; `None` when the file is not a cursor.
fn parse(text: &str) -> Option<(u64, Option<String>)> {
    let mut fields = text.split_whitespace();
    let seq = fields.next()?.parse().ok()?;
    let history_id = fields.next().map(str::to_owned);
    fields.next().is_none().then_some((seq, history_id))
}

fn write_atomically(path: &Path, cursor: &WatchCursor) -> std::io::Result<()> {
    use std::io::Write;
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let fresh = path.with_extension("writing");
    let mut file = std::fs::File::create(&fresh)?;
    writeln!(file, "{} {}", cursor.seq, cursor.history_id)?;
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

    fn at(history_id: &str, seq: u64) -> WatchCursor {
        WatchCursor {
            history_id: history_id.into(),
            seq,
        }
    }

    #[tokio::test]
    async fn the_cursor_stops_below_the_oldest_item_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/cursor");
        let (cursor, saved) = Cursor::open(&path);
        assert_eq!(saved, None);
        cursor.begin_snapshot(&at("h1", 4)).done();
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
        assert_eq!(Cursor::open(&path).1, Some(at("h1", 9)));
    }

    /// A flush at shutdown may meet the writer's last write: neither fails, and the file
    /// keeps the newest seq.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_take_turns_and_keep_the_newest_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "200 h1\n").unwrap();
        let (cursor, _) = Cursor::open(&path);
        let writes: Vec<_> = (1..=200u64)
            .map(|seq| {
                let cursor = cursor.clone();
                tokio::spawn(async move { cursor.write(at("h1", seq)).await })
            })
            .collect();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(Cursor::open(&path).1, Some(at("h1", 200)));
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
        std::fs::write(&path, "50 h1\n").unwrap();
        let (cursor, saved) = Cursor::open(&path);
        assert_eq!(saved, Some(at("h1", 50)));
        let old_work = cursor.begin(51);
        let snapshot = cursor.begin_snapshot(&at("h1", 10));
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
        assert_eq!(
            Cursor::open(&path).1,
            Some(at("h1", 10)),
            "written lower than before"
        );
        in_flight.done();
        assert_eq!(cursor.safe(), 12);
        // A snapshot at or above what was seen is an ordinary resync.
        cursor.begin_snapshot(&at("h1", 12)).done();
        assert_eq!(cursor.safe(), 12);
    }

    /// A restored log that has already passed the cursor: its head is above the seqs seen, but
    /// of another history. The old log's work no longer counts, and the file names the new
    /// history from then on.
    #[tokio::test]
    async fn a_snapshot_of_another_history_starts_the_cursor_again_from_its_head() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "50 old\n").unwrap();
        let (cursor, _) = Cursor::open(&path);
        let old_work = cursor.begin(51);
        let snapshot = cursor.begin_snapshot(&at("restored", 70));
        drop(old_work);
        let in_flight = cursor.begin(71);
        snapshot.done();
        assert_eq!(
            cursor.safe(),
            70,
            "51 of the old log no longer holds it back"
        );
        cursor.flush().await.unwrap();
        assert_eq!(Cursor::open(&path).1, Some(at("restored", 70)));
        in_flight.done();
        assert_eq!(cursor.safe(), 71);
    }

    /// A late write of the old log's cursor, after the snapshot of another one, is dropped:
    /// the file never pairs a seq with a history it was not read from.
    #[tokio::test]
    async fn a_late_write_of_the_old_log_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "50 old\n").unwrap();
        let (cursor, _) = Cursor::open(&path);
        cursor.begin_snapshot(&at("restored", 10)).done();
        cursor.flush().await.unwrap();
        cursor.write(at("old", 60)).await.unwrap();
        cursor.write(at("restored", 60)).await.unwrap();
        assert_eq!(Cursor::open(&path).1, Some(at("restored", 10)));
    }

    /// A file written before history ids names a seq of an unknown log: no cursor, so the
    /// worker re-lists rather than resume after a seq that may name other events now.
    #[test]
    fn a_file_without_a_history_id_means_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "50\n").unwrap();
        assert_eq!(Cursor::open(&path).1, None);
    }

    #[test]
    fn an_unreadable_file_means_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursor");
        std::fs::write(&path, "not a seq").unwrap();
        assert_eq!(Cursor::open(&path).1, None);
    }
}
