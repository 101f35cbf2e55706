//! What each message shows, on local disk, for a channel that edits one message per approval
//! and place (the Slack and Discord workers): one small JSON file per approval, replaced
//! atomically (temporary file, fsync, rename). Per place (a channel id) it holds what the
//! worker was about to show (`intended`, written before the call) and, once the platform
//! answered, the message's reference and what it shows. A restart after a crash between the
//! post and the record finds the intent without a reference, and looks for the message before
//! posting again.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use countersign_client::{pb, version};
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

/// One approval's message in one place.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    /// What the worker set out to show (`pending:…` or `final:…`).
    pub intended: String,
    /// When the first post was started (Unix milliseconds): where to look for an orphan.
    pub started_ms: i64,
    /// The message, once the platform named it (Slack's `ts`, Discord's message id; read
    /// from `ts` as the Slack worker wrote it before).
    #[serde(alias = "ts")]
    pub message_ref: Option<String>,
    /// What the message shows, as far as the worker knows.
    pub shown: Option<String>,
}

impl Post {
    /// Where to start looking for the message in the channel's history (Unix milliseconds): a
    /// little before the post started (the platform's clock may be behind ours).
    pub fn search_from_ms(&self) -> i64 {
        const CLOCK_SKEW_MS: i64 = 5_000;
        self.started_ms - CLOCK_SKEW_MS
    }
}

/// An approval's messages by place.
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

/// What a message shows, as a key: equal keys show the same (the arguments and how many
/// approved them while pending; the state once final).
pub fn shown_key(approval: &pb::Approval) -> String {
    if approval.state() == pb::ApprovalState::Pending {
        let approvals = version::current_approvals(approval).count();
        let digest = version::current_arguments(approval).1;
        format!("pending:{digest}:{approvals}")
    } else {
        format!("final:{}", approval.state().as_str_name())
    }
}

/// Whether a message showing `shown` already shows something newer than `wanted` (a replayed
/// older state must not undo it): a final state beats any pending one, and more approvals of
/// the same arguments beat fewer.
pub fn is_newer(shown: &str, wanted: &str) -> bool {
    if wanted.starts_with("final:") {
        return false;
    }
    if shown.starts_with("final:") {
        return true;
    }
    match (shown.rsplit_once(':'), wanted.rsplit_once(':')) {
        (Some((shown_args, shown_count)), Some((wanted_args, wanted_count))) => {
            shown_args == wanted_args
                && shown_count.parse::<u64>().unwrap_or(0)
                    > wanted_count.parse::<u64>().unwrap_or(0)
        }
        _ => false,
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
        // A file the Slack worker wrote before the store was shared names the reference `ts`.
        let old = r#"{"C1":{"intended":"pending:x","started_ms":1,"ts":"1700000000.000100","shown":null}}"#;
        std::fs::write(dir.path().join("messages/c-3.json"), old).unwrap();
        let read = store.load("c-3").unwrap();
        assert_eq!(read["C1"].message_ref.as_deref(), Some("1700000000.000100"));
        assert!(matches!(
            store.load("../etc/passwd"),
            Err(StoreError::BadId(_))
        ));
    }

    #[test]
    fn a_replayed_older_state_does_not_undo_a_newer_one() {
        assert!(is_newer("final:APPROVED", "pending:d:0"));
        assert!(is_newer("pending:d:2", "pending:d:1"));
        assert!(!is_newer("pending:d:1", "pending:d:2"));
        assert!(!is_newer("pending:d:2", "pending:e:0"), "new arguments");
        assert!(!is_newer("pending:d:0", "final:EXPIRED"));
    }
}
