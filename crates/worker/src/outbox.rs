//! The durable local outbox: the intent of each platform write that creates something (a
//! Telegram message, a GitHub comment) is on disk before the write, and its result right
//! after, so that a worker restarted after a crash knows which writes may have happened.
//!
//! One JSON object per line, appended and flushed to disk (`fsync`) before the call goes on:
//! - `intent`: about to create something for approval `key` in `target`; `after` is the
//!   newest platform reference the worker knew there (where to start looking for an orphan);
//! - `sent`: the platform created it and named it `message_ref`;
//! - `done`: the server has recorded it (or the intent was settled otherwise).
//!
//! After a crash an entry is in one of three states: done (nothing to do); sent but not done
//! (the worker adopts `message_ref` and records it on the server); intent only (the write may
//! or may not have reached the platform: the channel decides how to find or neutralise an
//! orphan). Opening the outbox drops settled entries and a line torn by the crash.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// Why the outbox cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("outbox {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("outbox {path}, line {line}: {reason}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Line {
    Intent {
        id: u64,
        key: String,
        target: String,
        after: Option<String>,
    },
    Sent {
        id: u64,
        message_ref: String,
    },
    Done {
        id: u64,
    },
}

/// One create the outbox knows about and that is not settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    /// The approval.
    pub key: String,
    /// Where on the platform (a chat, an issue).
    pub target: String,
    /// The newest platform reference the worker knew in `target` when it formed the intent.
    pub after: Option<String>,
    /// What the platform created, once it answered.
    pub message_ref: Option<String>,
}

/// The outbox of one worker.
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    file: Mutex<File>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
}

impl Outbox {
    /// Opens (or creates) the outbox at `path`, keeping only unsettled entries.
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        let io = |source| OutboxError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let state = match File::open(path) {
            Ok(file) => read_state(path, file)?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(error) => return Err(io(error)),
        };
        // Rewrite with the unsettled entries only, atomically (a crash keeps the old file).
        let fresh = path.with_extension("compacting");
        {
            let mut file = File::create(&fresh).map_err(io)?;
            for entry in state.entries.values() {
                write_line(&mut file, &intent_line(entry)).map_err(io)?;
                if let Some(message_ref) = &entry.message_ref {
                    let sent = Line::Sent {
                        id: entry.id,
                        message_ref: message_ref.clone(),
                    };
                    write_line(&mut file, &sent).map_err(io)?;
                }
            }
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&fresh, path).map_err(io)?;
        let file = OpenOptions::new().append(true).open(path).map_err(io)?;
        Ok(Outbox {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                file: Mutex::new(file),
                state: Mutex::new(state),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is one insert or remove; a panicking holder cannot leave it half-done.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records, durably, the intent to create something for `key` in `target`.
    pub async fn intend(
        &self,
        key: &str,
        target: &str,
        after: Option<String>,
    ) -> Result<u64, OutboxError> {
        let entry = {
            let mut state = self.state();
            state.next_id += 1;
            let entry = Entry {
                id: state.next_id,
                key: key.to_owned(),
                target: target.to_owned(),
                after,
                message_ref: None,
            };
            state.entries.insert(entry.id, entry.clone());
            entry
        };
        self.append(intent_line(&entry)).await?;
        Ok(entry.id)
    }

    /// Records, durably, what the platform created for intent `id`.
    pub async fn sent(&self, id: u64, message_ref: &str) -> Result<(), OutboxError> {
        if let Some(entry) = self.state().entries.get_mut(&id) {
            entry.message_ref = Some(message_ref.to_owned());
        }
        self.append(Line::Sent {
            id,
            message_ref: message_ref.to_owned(),
        })
        .await
    }

    /// Settles intent `id`.
    pub async fn done(&self, id: u64) -> Result<(), OutboxError> {
        if self.state().entries.remove(&id).is_none() {
            return Ok(());
        }
        self.append(Line::Done { id }).await
    }

    /// The unsettled entries of `key`, oldest first.
    pub fn unsettled(&self, key: &str) -> Vec<Entry> {
        self.state()
            .entries
            .values()
            .filter(|entry| entry.key == key)
            .cloned()
            .collect()
    }

    /// Every unsettled entry, oldest first.
    pub fn all_unsettled(&self) -> Vec<Entry> {
        self.state().entries.values().cloned().collect()
    }

    /// Appends one line and flushes it to disk, off the async threads.
    async fn append(&self, line: Line) -> Result<(), OutboxError> {
        let inner = self.inner.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut file = inner
                .file
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            write_line(&mut file, &line)?;
            file.sync_data()
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined.to_string())));
        written.map_err(|source| OutboxError::Io {
            path: self.inner.path.clone(),
            source,
        })
    }
}

fn intent_line(entry: &Entry) -> Line {
    Line::Intent {
        id: entry.id,
        key: entry.key.clone(),
        target: entry.target.clone(),
        after: entry.after.clone(),
    }
}

fn write_line(file: &mut File, line: &Line) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    text.push('\n');
    file.write_all(text.as_bytes())
}

fn read_state(path: &Path, file: File) -> Result<State, OutboxError> {
    let mut state = State::default();
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| OutboxError::Io {
            path: path.to_owned(),
            source,
        })?;
    let count = lines.len();
    for (index, text) in lines.iter().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = match serde_json::from_str(text) {
            Ok(line) => line,
            // The last line may be torn by a crash mid-write; its call never started.
            Err(_) if index + 1 == count => {
                tracing::warn!(path = %path.display(), "ignoring the torn last line of the outbox");
                continue;
            }
            Err(error) => {
                return Err(OutboxError::Corrupt {
                    path: path.to_owned(),
                    line: index + 1,
                    reason: error.to_string(),
                })
            }
        };
        match line {
            Line::Intent {
                id,
                key,
                target,
                after,
            } => {
                state.next_id = state.next_id.max(id);
                state.entries.insert(
                    id,
                    Entry {
                        id,
                        key,
                        target,
                        after,
                        message_ref: None,
                    },
                );
            }
            Line::Sent { id, message_ref } => {
                if let Some(entry) = state.entries.get_mut(&id) {
                    entry.message_ref = Some(message_ref);
                }
            }
            Line::Done { id } => {
                state.entries.remove(&id);
            }
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unsettled_entries_survive_a_reopen_and_settled_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/outbox.jsonl");
        let outbox = Outbox::open(&path).unwrap();
        let settled = outbox.intend("a1", "chat-1", None).await.unwrap();
        outbox.sent(settled, "chat-1:101").await.unwrap();
        outbox.done(settled).await.unwrap();
        let sent = outbox
            .intend("a2", "chat-1", Some("101".into()))
            .await
            .unwrap();
        outbox.sent(sent, "chat-1:102").await.unwrap();
        let uncertain = outbox
            .intend("a3", "chat-1", Some("102".into()))
            .await
            .unwrap();
        drop(outbox);
        // A crash tore the last line.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"op":"sent","id":3,"mess"#).unwrap();
        drop(file);

        let outbox = Outbox::open(&path).unwrap();
        assert!(outbox.unsettled("a1").is_empty());
        assert_eq!(
            outbox.unsettled("a2"),
            vec![Entry {
                id: sent,
                key: "a2".into(),
                target: "chat-1".into(),
                after: Some("101".into()),
                message_ref: Some("chat-1:102".into()),
            }]
        );
        assert_eq!(outbox.unsettled("a3")[0].id, uncertain);
        assert_eq!(outbox.unsettled("a3")[0].message_ref, None);
        let next = outbox.intend("a4", "chat-2", None).await.unwrap();
        assert!(next > uncertain);
        assert_eq!(outbox.all_unsettled().len(), 3);
    }

    #[test]
    fn a_corrupt_line_before_the_end_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.jsonl");
        std::fs::write(&path, "garbage\n{\"op\":\"done\",\"id\":1}\n").unwrap();
        let error = Outbox::open(&path).err().unwrap();
        assert!(error.to_string().contains("line 1"), "{error}");
    }
}
