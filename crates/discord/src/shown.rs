//! What each message shows, on local disk: one small JSON file per approval, replaced
//! atomically (temporary file, fsync, rename). Per Discord channel it holds what the worker
//! was about to show (`intended`, written before the call) and, once Discord answered, the
//! message's id and what it shows. A restart after a crash between the post and
//! the record finds the intent without a message id, and looks for the message before posting
//! again.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path} is unreadable ({reason}); remove it to post the approval again")]
    Corrupt { path: PathBuf, reason: String },
    #[error("refusing to keep state for the approval id {0:?} (not a plain identifier)")]
    BadId(String),
}

/// One approval's message in one Discord channel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    /// What the worker set out to show (`pending:…` or `final:…`).
    pub intended: String,
    /// When the first post was started (Unix milliseconds): where to look for an orphan.
    pub started_ms: i64,
    /// The message, once Discord named it.
    pub message_id: Option<String>,
    /// What the message shows, as far as the worker knows.
    pub shown: Option<String>,
}

impl Post {
    /// Where to start looking for the message in the channel's history: a little before the
    /// post started (Discord's clock may be behind ours).
    pub fn search_from_secs(&self) -> i64 {
        const CLOCK_SKEW_SECS: i64 = 5;
        self.started_ms / 1000 - CLOCK_SKEW_SECS
    }
}

/// An approval's messages by Discord channel id.
pub type Posts = BTreeMap<String, Post>;

#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Store {
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        let dir = state_dir.join("messages");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(Store { dir })
    }

    fn path(&self, approval_id: &str) -> Result<PathBuf, StoreError> {
        let plain = !approval_id.is_empty()
            && approval_id.len() <= 64
            && approval_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain {
            return Err(StoreError::BadId(approval_id.to_owned()));
        }
        Ok(self.dir.join(format!("{approval_id}.json")))
    }

    pub fn load(&self, approval_id: &str) -> Result<Posts, StoreError> {
        let path = self.path(approval_id)?;
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| StoreError::Corrupt {
                path,
                reason: error.to_string(),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Posts::new()),
            Err(error) => Err(io(&path)(error)),
        }
    }

    /// Replaces the approval's record; on disk when this returns.
    pub fn save(&self, approval_id: &str, posts: &Posts) -> Result<(), StoreError> {
        let path = self.path(approval_id)?;
        let temporary = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(posts).map_err(|error| StoreError::Corrupt {
            path: path.clone(),
            reason: error.to_string(),
        })?;
        let mut file = std::fs::File::create(&temporary).map_err(io(&temporary))?;
        file.write_all(&bytes).map_err(io(&temporary))?;
        file.sync_all().map_err(io(&temporary))?;
        std::fs::rename(&temporary, &path).map_err(io(&path))?;
        std::fs::File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io(&self.dir))
    }

    /// Changes one channel's record of the approval.
    pub fn update(
        &self,
        approval_id: &str,
        channel: &str,
        change: impl FnOnce(&mut Post),
    ) -> Result<(), StoreError> {
        let mut posts = self.load(approval_id)?;
        change(posts.entry(channel.to_owned()).or_default());
        self.save(approval_id, &posts)
    }

    /// Approvals with a message that does not show a final state yet.
    pub fn unfinished(&self) -> Result<Vec<String>, StoreError> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let path = entry.map_err(io(&self.dir))?.path();
            let Some(id) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_suffix(".json"))
            else {
                continue;
            };
            let open = self.load(id)?.values().any(|post| {
                !post.intended.starts_with("final:")
                    || post.shown.as_deref() != Some(post.intended.as_str())
            });
            if open {
                ids.push(id.to_owned());
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening_and_unfinished_lists_what_is_not_final() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .update("a-1", "C1", |post| post.intended = "pending:x".into())
            .unwrap();
        store
            .update("b-2", "C1", |post| {
                post.intended = "final:APPROVED".into();
                post.shown = Some("final:APPROVED".into());
            })
            .unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load("a-1").unwrap()["C1"].intended, "pending:x");
        assert_eq!(store.unfinished().unwrap(), ["a-1"]);
        assert!(matches!(
            store.load("../etc/passwd"),
            Err(StoreError::BadId(_))
        ));
    }
}
