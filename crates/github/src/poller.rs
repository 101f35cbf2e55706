//! Polling, for installations GitHub cannot reach with webhooks: every interval, the comments
//! of each issue with a pending approval are listed with `since`.
//!
//! `since` is inclusive and to the second, and it matches comments *updated* since, so the
//! same comment comes back more than once: the worker deduplicates by comment id. Comments
//! edited after they were written are skipped (only new comments count, and polling can only
//! see the current text). The cursor of an issue starts at its request message's creation and
//! moves to the newest `updated_at` seen.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::api::GitHubApi;
use crate::inbound::Input;
use crate::incoming::{unedited, PollTargets};

pub async fn run(
    api: Arc<GitHubApi>,
    targets: Arc<PollTargets>,
    interval: Duration,
    inputs: mpsc::Sender<Input>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        for (issue, since) in targets.snapshot() {
            let comments = match api.list_comments(&issue, Some(since)).await {
                Ok(comments) => comments,
                Err(error) => {
                    tracing::warn!(%issue, %error, "polling comments failed");
                    continue;
                }
            };
            let Some(newest) = comments.iter().map(|c| c.updated_at).max() else {
                continue;
            };
            let new = unedited(&issue, comments);
            if !new.is_empty() && inputs.send(Input::Comments(new)).await.is_err() {
                return;
            }
            targets.advance(&issue, newest);
        }
    }
}
