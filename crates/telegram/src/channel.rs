//! The Telegram channel: each pending approval of the `telegram` channel becomes a message
//! with inline buttons in its chats, edited on every change (quorum progress, decided here or
//! elsewhere, expired, cancelled); reminders and grant notices are posted beside it.
//!
//! The loop around it (watch and cursor, snapshots, lanes, retries never before Telegram's
//! `retry_after`, shutdown) is the shared runtime's. Crash safety: the intent of a send is in
//! the outbox before `sendMessage`, the message id right after, then the message is recorded
//! on the server (`RecordDelivery`); a restart adopts a message whose id reached the outbox,
//! and after an intent without an answer it sends again and neutralises the orphaned copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use countersign_client::{pb, Client, ClientError};
use countersign_worker::approval::{
    is_granted, pending_approvals, recently_resolved_with_deliveries, route_targets,
};
use countersign_worker::channel::Channel;
use countersign_worker::outbox::{Entry, Outbox, OutboxError};
use countersign_worker::retry::{keep_longest, retry_in_line, Backoff, Classify, Verdict};
use countersign_worker::runtime::ShowRequests;
use pb::{ApprovalState, EventKind};

use crate::api::{BotApi, BotApiError, EditOutcome};
use crate::config::Settings;
use crate::render::{
    grant_notice_html, reminder_html, render_approval, render_minimal, status_reply_html,
    RenderedMessage, REPLACED_COPY_HTML,
};
use crate::shown::{fingerprint, MessageBook, ShownMessage};

/// The channel name this worker serves.
pub const CHANNEL: &str = "telegram";

/// How often a failed RecordDelivery is tried before the outbox keeps it for later.
const RECORD_DELIVERY_ATTEMPTS: u32 = 5;

/// How many of the most recent resolved approvals are shown as they are after each snapshot,
/// to correct messages left showing buttons while the worker was not watching.
const RESOLVED_CORRECTED: u32 = 50;

/// How many messages before a new request message are searched for an orphaned copy (one
/// whose sending a crash interrupted before its id was written down).
const ORPHAN_SEARCH: i32 = 20;

/// Why an approval's messages could not all be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error("Telegram: {0}")]
    Telegram(#[from] BotApiError),
    #[error("cannot write the outbox, so not sending: {0}")]
    Outbox(#[from] OutboxError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::Telegram(error) => error.verdict(),
            // Without the intent on disk a crash could repeat the message.
            ShowError::Outbox(_) => Verdict::Retry { after: None },
            ShowError::Server(error) if error.is_transient() => Verdict::Retry { after: None },
            ShowError::Server(_) => Verdict::Final,
        }
    }
}

pub struct TelegramChannel {
    client: Client,
    bot: BotApi,
    settings: Settings,
    book: Arc<MessageBook>,
    outbox: Outbox,
    /// The chats a notice (by its event's seq) reached while another of its chats waits for
    /// a retry, so that the retry does not post it there again.
    noticed: Mutex<HashMap<u64, Vec<i64>>>,
}

impl Channel for TelegramChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Edits the approval's messages (every one the worker knows: sent, recorded, in the
    /// outbox, acted on) and sends one to each target chat that has none while it is pending.
    /// A copy older than the one already shown is ignored. A chat refused for good is logged
    /// and the others go on; of failures that may pass, the one with the longest retry-after
    /// is returned.
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        if !self.book.advance(approval) {
            tracing::debug!(approval_id = %approval.id, "skipping an older copy of the approval");
            return Ok(());
        }
        for (chat_id, message_id) in recorded_messages(approval) {
            self.book
                .remember_message(chat_id, message_id, &approval.id);
        }
        self.settle_outbox(approval).await;
        let rendered = render_approval(approval, &self.settings.buttons);
        let shown = fingerprint(&rendered);
        let mut retry = None;
        for message in self.book.messages(&approval.id) {
            if message.shown != Some(shown) {
                if let Err(error) = self.update_message(approval, message, &rendered).await {
                    keep_longest(&mut retry, error);
                }
            }
        }
        if approval.state() != ApprovalState::Pending {
            self.book.finish(&approval.id);
            return retry.map_or(Ok(()), Err);
        }
        let messages = self.book.messages(&approval.id);
        for chat_id in self.target_chats(approval) {
            if messages.iter().any(|m| m.chat_id == chat_id) {
                continue;
            }
            let Err(error) = self.send_request(approval, chat_id, &rendered).await else {
                continue;
            };
            if error.verdict().is_retryable() {
                tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot send the approval request now; will retry");
                keep_longest(&mut retry, error);
            } else {
                tracing::error!(approval_id = %approval.id, chat_id, %error, "Telegram refused the approval request message");
            }
        }
        retry.map_or(Ok(()), Err)
    }

    /// The approvals this run shows unresolved, those the outbox holds unsettled, and the
    /// most recent resolved ones with a message (a message of an approval resolved while the
    /// worker was away would otherwise keep its buttons).
    async fn unfinished(&self) -> Result<Vec<String>, ShowError> {
        let mut ids = self.book.unresolved_approvals();
        ids.extend(
            self.outbox
                .all_unsettled()
                .into_iter()
                .map(|entry| entry.key),
        );
        ids.extend(
            recently_resolved_with_deliveries(&self.client, CHANNEL, RESOLVED_CORRECTED).await?,
        );
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// A reminder (a reply to the approval's first message in each chat) or the notice of a
    /// call a session grant approved.
    async fn notice(&self, event: &pb::ApprovalEvent) -> Result<(), ShowError> {
        let Some(approval) = &event.approval else {
            return Ok(());
        };
        let (html, reply) = match event.kind() {
            EventKind::Reminded => (reminder_html(approval, &event.detail), true),
            EventKind::Requested if is_granted(approval) => (grant_notice_html(approval), false),
            _ => return Ok(()),
        };
        tracing::info!(approval_id = %approval.id, seq = event.seq, kind = ?event.kind(), "posting a notice");
        let recorded = recorded_messages(approval);
        for chat_id in self.target_chats(approval) {
            let reached = self.noticed().get(&event.seq).cloned().unwrap_or_default();
            if reached.contains(&chat_id) {
                continue;
            }
            let first = recorded
                .iter()
                .filter(|(chat, _)| reply && *chat == chat_id)
                .map(|(_, message_id)| *message_id)
                .min();
            match self.bot.send_message(chat_id, &html, &[], first).await {
                Ok(_) => {}
                Err(error) if error.is_transient() => return Err(error.into()),
                Err(error) => {
                    tracing::warn!(approval_id = %approval.id, chat_id, %error, "Telegram refused the notice");
                }
            }
            self.noticed().entry(event.seq).or_default().push(chat_id);
        }
        self.noticed().remove(&event.seq);
        Ok(())
    }
}

impl TelegramChannel {
    pub(crate) fn new(
        client: Client,
        bot: BotApi,
        settings: Settings,
        book: Arc<MessageBook>,
        outbox: Outbox,
    ) -> TelegramChannel {
        TelegramChannel {
            client,
            bot,
            settings,
            book,
            outbox,
            noticed: Mutex::new(HashMap::new()),
        }
    }

    fn noticed(&self) -> MutexGuard<'_, HashMap<u64, Vec<i64>>> {
        self.noticed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before the runtime starts: every live message the worker can know of goes in the book
    /// (the pending approvals' recorded deliveries, the outbox's sent entries), so that a
    /// search for orphans never takes a live request for one, also when the watch resumes
    /// after its cursor and no snapshot lists them; and every approval the outbox holds
    /// unsettled is shown as it is now (a message an earlier run sent and did not record is
    /// recorded then, not at the approval's next event).
    pub(crate) async fn prepare(&self, shows: &ShowRequests) -> Result<(), ClientError> {
        let pending = pending_approvals(
            &self.client,
            CHANNEL,
            self.settings.runtime.server.max_backoff,
        )
        .await?;
        for approval in &pending {
            for (chat_id, message_id) in recorded_messages(approval) {
                self.book
                    .remember_message(chat_id, message_id, &approval.id);
            }
        }
        for entry in self.outbox.all_unsettled() {
            if let Some((chat_id, message_id)) =
                entry.message_ref.as_deref().and_then(parse_message_ref)
            {
                self.book.remember_message(chat_id, message_id, &entry.key);
            }
            shows.show_current(&entry.key);
        }
        Ok(())
    }

    /// Settles what the outbox says an earlier run left unfinished for this approval: a
    /// message Telegram created and the server never recorded is adopted and recorded now.
    /// Intents without an answer stay for [`TelegramChannel::send_request`].
    async fn settle_outbox(&self, approval: &pb::Approval) {
        for entry in self.outbox.unsettled(&approval.id) {
            let Some((chat_id, message_id)) =
                entry.message_ref.as_deref().and_then(parse_message_ref)
            else {
                continue;
            };
            self.book
                .remember_message(chat_id, message_id, &approval.id);
            let recorded = recorded_messages(approval).contains(&(chat_id, message_id));
            if recorded
                || self
                    .record_delivery(&approval.id, chat_id, message_id)
                    .await
            {
                tracing::info!(approval_id = %approval.id, chat_id, message_id, adopted = !recorded, "outbox entry settled");
                self.settle(&approval.id, entry.id).await;
            }
        }
    }

    async fn settle(&self, approval_id: &str, intent: u64) {
        if let Err(error) = self.outbox.done(intent).await {
            tracing::warn!(approval_id, %error, "cannot settle an outbox entry; it is settled again after a restart");
        }
    }

    /// Sends the request message to a chat: the intent is on disk before the call and the
    /// message id right after, then the message is recorded on the server. When an earlier
    /// run left an intent here without an answer (it crashed during the call), the messages
    /// just before the new one are searched for the orphaned copy.
    async fn send_request(
        &self,
        approval: &pb::Approval,
        chat_id: i64,
        rendered: &RenderedMessage,
    ) -> Result<(), ShowError> {
        let chat = chat_id.to_string();
        let uncertain: Vec<Entry> = self
            .outbox
            .unsettled(&approval.id)
            .into_iter()
            .filter(|entry| entry.target == chat && entry.message_ref.is_none())
            .collect();
        let after = self.book.newest_message(chat_id).map(|id| id.to_string());
        let intent = self.outbox.intend(&approval.id, &chat, after).await?;
        let sent = match self
            .bot
            .send_message(chat_id, &rendered.html, &rendered.keyboard, None)
            .await
        {
            Err(error) if error.is_content_refused() => {
                // Telegram made no message; the minimal one goes out under the same intent.
                tracing::warn!(approval_id = %approval.id, chat_id, %error, "Telegram refused the message for its content; sending a minimal one");
                let minimal = render_minimal(approval, &self.settings.buttons);
                self.bot
                    .send_message(chat_id, &minimal.html, &minimal.keyboard, None)
                    .await
            }
            other => other,
        };
        let message_id = match sent {
            Ok(message_id) => message_id,
            Err(error) => {
                // Telegram answered with an error: it made no message, so the next attempt
                // has no orphan to search for. (No answer, or one a proxy wrote, is uncertain.)
                if matches!(error, BotApiError::Api { .. }) {
                    self.settle(&approval.id, intent).await;
                }
                return Err(error.into());
            }
        };
        tracing::info!(approval_id = %approval.id, chat_id, message_id, "sent the approval request");
        self.book
            .remember_message(chat_id, message_id, &approval.id);
        self.book
            .set_shown(&approval.id, chat_id, message_id, fingerprint(rendered));
        self.outbox
            .sent(intent, &format!("{chat_id}:{message_id}"))
            .await?;
        if self
            .record_delivery(&approval.id, chat_id, message_id)
            .await
        {
            self.settle(&approval.id, intent).await;
        }
        for entry in uncertain {
            let after = entry.after.as_deref().and_then(|id| id.parse::<i32>().ok());
            self.neutralise_orphans(chat_id, after, message_id).await;
            self.settle(&approval.id, entry.id).await;
        }
        Ok(())
    }

    /// Looks at the messages between `after` (the newest known when the interrupted send
    /// began; at most [`ORPHAN_SEARCH`] back) and `before` for request messages the worker
    /// does not know: removing buttons changes only a bot message that has some, and every
    /// bot message with buttons there that is not in the book is an orphaned copy. Its text
    /// then says that it was replaced. Users' messages cannot be edited and stay untouched.
    async fn neutralise_orphans(&self, chat_id: i64, after: Option<i32>, before: i32) {
        let lowest = before.saturating_sub(ORPHAN_SEARCH).max(0);
        let first = after.map_or(lowest, |after| after.max(lowest)) + 1;
        for message_id in first..before {
            if self.book.approval_of_message(chat_id, message_id).is_some() {
                continue;
            }
            match self.bot.remove_buttons(chat_id, message_id).await {
                Ok(EditOutcome::Edited) => {
                    tracing::info!(
                        chat_id,
                        message_id,
                        "found an orphaned copy of a request message; replacing its text"
                    );
                    let replaced = self
                        .bot
                        .edit_message(chat_id, message_id, REPLACED_COPY_HTML, &[])
                        .await;
                    if let Err(error) = replaced {
                        tracing::warn!(chat_id, message_id, %error, "cannot mark the orphaned copy as replaced (its buttons are gone)");
                    }
                }
                Ok(EditOutcome::NotModified) => {}
                Err(error) if error.is_cant_edit() => {}
                Err(error) => {
                    tracing::warn!(chat_id, message_id, %error, "cannot check a message for an orphaned copy");
                }
            }
        }
    }

    /// Edits one message; a failure that may pass is returned (the approval is retried as a
    /// whole), one Telegram refuses for good is logged.
    async fn update_message(
        &self,
        approval: &pb::Approval,
        message: ShownMessage,
        rendered: &RenderedMessage,
    ) -> Result<(), ShowError> {
        let ShownMessage {
            chat_id,
            message_id,
            shown,
        } = message;
        let done = || {
            self.book
                .set_shown(&approval.id, chat_id, message_id, fingerprint(rendered))
        };
        let edited = match self
            .bot
            .edit_message(chat_id, message_id, &rendered.html, &rendered.keyboard)
            .await
        {
            Err(error) if error.is_content_refused() => {
                tracing::warn!(approval_id = %approval.id, chat_id, message_id, %error, "Telegram refused the message for its content; showing a minimal one");
                let minimal = render_minimal(approval, &self.settings.buttons);
                self.bot
                    .edit_message(chat_id, message_id, &minimal.html, &minimal.keyboard)
                    .await
            }
            other => other,
        };
        match edited {
            Ok(outcome) => {
                tracing::debug!(approval_id = %approval.id, chat_id, message_id, not_modified = (outcome == EditOutcome::NotModified), "message up to date");
                done();
            }
            Err(error) if error.is_cant_edit() && shown.is_none() => {
                // Found in a delivery record after a restart: what it shows, and whether an
                // earlier run already replied with this state, is unknown. Replying at every
                // start would repeat the same reply; the next change of state gets one.
                tracing::info!(approval_id = %approval.id, chat_id, message_id, %error, "a recorded message cannot be edited; not replying with a state it may already have");
                done();
            }
            Err(error) if error.is_cant_edit() => {
                tracing::info!(approval_id = %approval.id, chat_id, message_id, %error, "message cannot be edited; replying with the state instead");
                let html = status_reply_html(approval);
                match self
                    .bot
                    .send_message(chat_id, &html, &[], Some(message_id))
                    .await
                {
                    Ok(_) => done(),
                    Err(error) if error.is_transient() => return Err(error.into()),
                    Err(error) => {
                        tracing::warn!(approval_id = %approval.id, chat_id, %error, "cannot reply with the state");
                    }
                }
            }
            Err(error) if error.is_transient() => {
                tracing::warn!(approval_id = %approval.id, chat_id, message_id, %error, "cannot update the message now; will retry");
                return Err(error.into());
            }
            Err(error) => {
                tracing::error!(approval_id = %approval.id, chat_id, message_id, %error, "Telegram refused the update of the message");
            }
        }
        Ok(())
    }

    /// Records a sent message on the server, so that a restarted worker edits it instead of
    /// sending another. Returns whether it was recorded.
    async fn record_delivery(&self, approval_id: &str, chat_id: i64, message_id: i32) -> bool {
        let request = pb::RecordDeliveryRequest {
            approval_id: approval_id.to_owned(),
            channel: CHANNEL.to_owned(),
            target: chat_id.to_string(),
            message_ref: format!("{chat_id}:{message_id}"),
        };
        let backoff = Backoff::new(
            Duration::from_millis(100),
            self.settings.runtime.server.max_backoff,
        );
        let recorded = retry_in_line(
            backoff,
            RECORD_DELIVERY_ATTEMPTS,
            Duration::MAX,
            "RecordDelivery",
            || async {
                let recorded = self.client.record_delivery(request.clone()).await;
                recorded.map_err(ShowError::from)
            },
        )
        .await;
        if let Err(error) = &recorded {
            tracing::error!(approval_id, %error, "cannot record the delivery; the outbox keeps it for the next start");
        }
        recorded.is_ok()
    }

    /// The chats an approval goes to: each `telegram` route's target (a chat id), the default
    /// chat for an empty target or an approval without routes.
    fn target_chats(&self, approval: &pb::Approval) -> Vec<i64> {
        let mut chats = Vec::new();
        for target in route_targets(approval, CHANNEL) {
            let chat = if target.is_empty() {
                self.settings.default_chat_id
            } else {
                target.parse::<i64>().ok()
            };
            match chat {
                Some(chat_id) if !chats.contains(&chat_id) => chats.push(chat_id),
                Some(_) => {}
                None if target.is_empty() => {
                    tracing::warn!(approval_id = %approval.id, "approval has no Telegram target and no default chat is configured");
                }
                None => {
                    tracing::warn!(approval_id = %approval.id, "ignoring a Telegram route whose target is not a chat id");
                }
            }
        }
        chats
    }
}

/// The messages recorded on the server for an approval.
fn recorded_messages(approval: &pb::Approval) -> Vec<(i64, i32)> {
    approval
        .deliveries
        .iter()
        .filter(|delivery| delivery.channel == CHANNEL)
        .filter_map(|delivery| {
            let parsed = parse_message_ref(&delivery.message_ref);
            if parsed.is_none() {
                tracing::warn!(approval_id = %approval.id, "ignoring a delivery record with an unreadable message reference");
            }
            parsed
        })
        .collect()
}

/// `chat_id:message_id`, as this worker records deliveries.
fn parse_message_ref(message_ref: &str) -> Option<(i64, i32)> {
    let (chat, message) = message_ref.split_once(':')?;
    Some((chat.parse().ok()?, message.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_refs_round_trip() {
        assert_eq!(parse_message_ref("-100123:42"), Some((-100123, 42)));
        assert_eq!(parse_message_ref("garbage"), None);
        assert_eq!(parse_message_ref("1:x"), None);
    }
}
