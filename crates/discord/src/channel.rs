//! The Discord channel: each pending approval of the `discord` channel becomes a message in its
//! Discord channels (route targets, or the default channel) with Approve, Reject… and Allow for
//! session buttons; the message is edited on every change — quorum progress, decided here or
//! elsewhere, expired, cancelled — and its buttons removed once final.
//!
//! The loop around it (watch, lanes, retries never before Discord's `retry_after`, shutdown) is
//! the shared runtime's. Crash safety: the intent of a post is on disk before the post, the
//! message id right after; a restart that finds an intent without an id looks for the message
//! among the channel's messages since the intent (its buttons name the approval) and adopts
//! it instead of posting a second one.

use std::time::{SystemTime, UNIX_EPOCH};

use countersign_client::{pb, Client};
use countersign_worker::approval::{configured_places, record_delivery_once};
use countersign_worker::channel::Channel;
use countersign_worker::retry::{Classify, Verdict};
use pb::ApprovalState;

use crate::api::{snowflake_at, DiscordApi, DiscordError};
use crate::config::Settings;
use crate::render;
use crate::shown::{is_newer, Post, Store, StoreError};

/// The channel name this worker serves; also the decider channel (`discord:<user id>`).
pub const CHANNEL: &str = "discord";

/// Why one message could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error(transparent)]
    Discord(#[from] DiscordError),
    #[error("cannot write the state directory, so not posting: {0}")]
    Store(#[from] StoreError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::Discord(error) => error.verdict(),
            // Without the intent on disk a crash could lose track of the post.
            ShowError::Store(_) => Verdict::Retry { after: None },
        }
    }
}

pub struct DiscordChannel {
    pub client: Client,
    pub api: DiscordApi,
    pub store: Store,
    pub settings: Settings,
}

impl Channel for DiscordChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Brings the approval's message in each of its Discord channels in line with its state;
    /// a channel refused for good is logged and the others go on.
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        let mut retry: Option<ShowError> = None;
        for channel in self.channels_of(approval) {
            let Err(error) = self.show_in(approval, &channel).await else {
                continue;
            };
            if let Verdict::Retry { .. } = error.verdict() {
                tracing::warn!(approval_id = %approval.id, %channel, %error, "cannot show the approval in Discord now; will retry");
                retry = Some(error);
            } else {
                tracing::error!(approval_id = %approval.id, %channel, %error, "Discord refused the message");
            }
        }
        retry.map_or(Ok(()), Err)
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

impl DiscordChannel {
    async fn show_in(&self, approval: &pb::Approval, channel: &str) -> Result<(), ShowError> {
        let wanted = render::shown_key(approval);
        let pending = approval.state() == ApprovalState::Pending;
        let Some(known) = self.store.load(&approval.id)?.remove(channel) else {
            // Never shown: a resolved approval needs no message.
            if pending {
                self.post_request(approval, channel, &wanted, now_ms())
                    .await?;
            }
            return Ok(());
        };
        if let (Some(shown), Some(id)) = (&known.shown, &known.message_ref) {
            if *shown == wanted || is_newer(shown, &wanted) {
                self.record_delivery(approval, channel, id).await;
                return Ok(());
            }
        }
        let message_id = match known.message_ref {
            Some(id) => id,
            None => {
                // A post whose answer never came (a crash, a lost connection): when Discord
                // has the message it is adopted, not posted again.
                let after = snowflake_at(known.search_from_ms());
                match self.api.find(channel, after, &approval.id).await? {
                    Some(id) => {
                        tracing::info!(approval_id = %approval.id, channel, "found the message of an interrupted post; adopting it");
                        self.store.update(&approval.id, channel, |post| {
                            post.message_ref = Some(id.clone());
                            post.shown = Some(post.intended.clone());
                        })?;
                        self.record_delivery(approval, channel, &id).await;
                        if known.intended == wanted {
                            return Ok(());
                        }
                        id
                    }
                    None if pending => {
                        return self
                            .post_request(approval, channel, &wanted, known.started_ms)
                            .await
                    }
                    None => {
                        // Nothing was posted, and nothing needs to be now.
                        return Ok(self.store.update(&approval.id, channel, |post| {
                            post.intended = wanted.clone();
                            post.shown = Some(wanted.clone());
                        })?);
                    }
                }
            }
        };
        self.api
            .edit(channel, &message_id, &render::message(approval))
            .await?;
        self.store.update(&approval.id, channel, |post| {
            post.intended = wanted.clone();
            post.shown = Some(wanted.clone());
        })?;
        tracing::info!(approval_id = %approval.id, channel, state = ?approval.state(), "message edited");
        Ok(())
    }

    /// Posts the request message: the intent on disk first, the message id right after.
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
        let id = self.api.post(channel, &render::message(approval)).await?;
        self.store.update(&approval.id, channel, |post| {
            post.message_ref = Some(id.clone());
            post.shown = Some(wanted.to_owned());
        })?;
        tracing::info!(approval_id = %approval.id, channel, "posted the approval request");
        self.record_delivery(approval, channel, &id).await;
        Ok(())
    }

    /// Records the message on the server (best effort: the local store is what a restarted
    /// worker goes by).
    async fn record_delivery(&self, approval: &pb::Approval, channel: &str, message_id: &str) {
        if approval.state() == ApprovalState::Pending {
            let message_ref = format!("{channel}:{message_id}");
            record_delivery_once(&self.client, approval, CHANNEL, channel, message_ref).await;
        }
    }

    /// The Discord channels an approval goes to: each `discord` route's target when it is a
    /// configured channel, else the default channel (logged).
    fn channels_of(&self, approval: &pb::Approval) -> Vec<String> {
        configured_places(
            approval,
            CHANNEL,
            |target| self.settings.channels.iter().find(|c| *c == target),
            self.settings.default_channel.as_ref(),
            "a Discord route names a channel that is not in discord.channels: posting in the default channel instead",
            "no discord.default_channel is configured for this approval's route: it is posted in no Discord channel",
        )
        .into_iter()
        .cloned()
        .collect()
    }
}
