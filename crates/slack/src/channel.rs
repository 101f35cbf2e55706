//! The Slack channel: each pending approval of the `slack` channel becomes a Block Kit message
//! in its Slack channels (route targets, or the default channel), with Approve, Reject… and
//! Allow for session buttons; the message is updated (`chat.update`) on every change —
//! quorum progress, decided here or elsewhere, expired, cancelled.
//!
//! The loop around it (watch, lanes, retries on the approval's schedule never before Slack's
//! `Retry-After`, shutdown) is the shared runtime's. Crash safety: the intent of a post is
//! on disk before `chat.postMessage`, its `ts` right after; a restart that finds an intent
//! without a `ts` looks the message up (`conversations.history`, by the metadata every
//! request message carries) and adopts it instead of posting a second one.

use std::time::{SystemTime, UNIX_EPOCH};

use countersign_client::{pb, Client};
use countersign_worker::approval::{configured_places, record_delivery_once};
use countersign_worker::channel::Channel;
use countersign_worker::retry::{Classify, Verdict};
use pb::ApprovalState;

use crate::api::{SlackApi, SlackError};
use crate::config::Settings;
use crate::render;
use crate::shown::{is_newer, Post, Store, StoreError};

/// The channel name this worker serves; also the decider channel (`slack:<user id>`).
pub const CHANNEL: &str = "slack";

/// Why one message could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error(transparent)]
    Slack(#[from] SlackError),
    #[error("cannot write the state directory, so not posting: {0}")]
    Store(#[from] StoreError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::Slack(error) => error.verdict(),
            // Without the intent on disk a crash could lose track of the post.
            ShowError::Store(_) => Verdict::Retry { after: None },
        }
    }
}

pub struct SlackChannel {
    client: Client,
    api: SlackApi,
    store: Store,
    settings: Settings,
}

impl Channel for SlackChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Brings the approval's message in every one of its Slack channels in line with its
    /// state. A channel refused for good is logged and the others go on; when any failed for
    /// a reason that may pass, the error with the longest retry-after is returned.
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        let mut retry: Option<(Option<std::time::Duration>, ShowError)> = None;
        for channel in self.channels_of(approval) {
            let Err(error) = self.show_in(approval, &channel).await else {
                continue;
            };
            match error.verdict() {
                Verdict::Retry { after } => {
                    tracing::warn!(approval_id = %approval.id, %channel, %error, "cannot show the approval in Slack now; will retry");
                    if retry.as_ref().is_none_or(|(longest, _)| after > *longest) {
                        retry = Some((after, error));
                    }
                }
                Verdict::Final => {
                    tracing::error!(approval_id = %approval.id, %channel, %error, "Slack refused the message");
                }
            }
        }
        retry.map_or(Ok(()), |(_, error)| Err(error))
    }

    async fn unfinished(&self) -> Result<Vec<String>, ShowError> {
        Ok(self.store.unfinished()?)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

impl SlackChannel {
    pub fn new(client: Client, api: SlackApi, store: Store, settings: Settings) -> SlackChannel {
        SlackChannel {
            client,
            api,
            store,
            settings,
        }
    }

    async fn show_in(&self, approval: &pb::Approval, channel: &str) -> Result<(), ShowError> {
        let wanted = render::shown_key(approval);
        let pending = approval.state() == ApprovalState::Pending;
        let known = self.store.load(&approval.id)?.remove(channel);
        let Some(known) = known else {
            // Never shown: a resolved approval needs no message.
            return if pending {
                self.post_request(approval, channel, &wanted, now_ms())
                    .await
            } else {
                Ok(())
            };
        };
        if let Some(shown) = &known.shown {
            if *shown == wanted || is_newer(shown, &wanted) {
                if let Some(ts) = &known.message_ref {
                    self.record_delivery(approval, channel, ts).await;
                }
                return Ok(());
            }
        }
        let ts = match known.message_ref {
            Some(ts) => ts,
            None => {
                // A post whose answer never came (a crash, a lost connection): when Slack has
                // the message it is adopted, not posted again.
                let since = known.search_from_ms() / 1000;
                match self.api.find(channel, since, &approval.id).await? {
                    Some(ts) => {
                        tracing::info!(approval_id = %approval.id, channel, "found the message of an interrupted post; adopting it");
                        self.store.update(&approval.id, channel, |post| {
                            post.message_ref = Some(ts.clone());
                            post.shown = Some(post.intended.clone());
                        })?;
                        self.record_delivery(approval, channel, &ts).await;
                        if known.intended == wanted {
                            return Ok(());
                        }
                        ts
                    }
                    None if pending => {
                        return self
                            .post_request(approval, channel, &wanted, known.started_ms)
                            .await
                    }
                    None => {
                        // Nothing was posted, and nothing needs to be now.
                        self.store.update(&approval.id, channel, |post| {
                            post.intended = wanted.clone();
                            post.shown = Some(wanted.clone());
                        })?;
                        return Ok(());
                    }
                }
            }
        };
        let full = self
            .api
            .update(channel, &ts, render::message(approval))
            .await;
        match full {
            Err(error) if error.is_content_refused() => {
                tracing::warn!(approval_id = %approval.id, channel, %error, "Slack refused the message for its content; showing a minimal one");
                self.api
                    .update(channel, &ts, render::minimal_message(approval))
                    .await?;
            }
            other => other?,
        }
        self.store.update(&approval.id, channel, |post| {
            post.intended = wanted.clone();
            post.shown = Some(wanted.clone());
        })?;
        tracing::info!(approval_id = %approval.id, channel, state = ?approval.state(), "message updated");
        Ok(())
    }

    /// Posts the request message: the intent on disk first, the `ts` right after.
    async fn post_request(
        &self,
        approval: &pb::Approval,
        channel: &str,
        wanted: &str,
        started_ms: i64,
    ) -> Result<(), ShowError> {
        self.store.update(&approval.id, channel, |post| {
            *post = Post {
                intended: wanted.to_owned(),
                started_ms,
                message_ref: None,
                shown: None,
            }
        })?;
        let ts = match self.api.post(channel, render::message(approval)).await {
            Err(error) if error.is_content_refused() => {
                tracing::warn!(approval_id = %approval.id, channel, %error, "Slack refused the message for its content; posting a minimal one");
                self.api
                    .post(channel, render::minimal_message(approval))
                    .await?
            }
            other => other?,
        };
        self.store.update(&approval.id, channel, |post| {
            post.message_ref = Some(ts.clone());
            post.shown = Some(wanted.to_owned());
        })?;
        tracing::info!(approval_id = %approval.id, channel, "posted the approval request");
        self.record_delivery(approval, channel, &ts).await;
        Ok(())
    }

    /// Records the message on the server (best effort: the local store is what a restarted
    /// worker goes by).
    async fn record_delivery(&self, approval: &pb::Approval, channel: &str, ts: &str) {
        if approval.state() == ApprovalState::Pending {
            let message_ref = format!("{channel}:{ts}");
            record_delivery_once(&self.client, approval, CHANNEL, channel, message_ref).await;
        }
    }

    /// The Slack channels an approval goes to: each `slack` route's target (a channel id),
    /// the default channel for an empty target, a target that is not a configured channel
    /// (logged: the approval still reaches approvers, and an agent still cannot post
    /// anywhere else), or an approval without routes.
    fn channels_of(&self, approval: &pb::Approval) -> Vec<String> {
        configured_places(
            approval,
            CHANNEL,
            |target| self.settings.channels.iter().find(|c| *c == target),
            self.settings.default_channel.as_ref(),
            "a Slack route names a channel that is not in slack.channels: posting in the default channel instead",
            "no slack.default_channel is configured for this approval's route: it is posted in no Slack channel",
        )
        .into_iter()
        .cloned()
        .collect()
    }
}
