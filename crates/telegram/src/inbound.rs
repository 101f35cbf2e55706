//! The inbound side: taps and `/approve` / `/reject <reason>` replies, read by polling
//! `getUpdates`, become Decide calls; the tap is answered at once with the outcome, and the
//! approval (its messages, the one acted on included) is shown in its lane by the runtime.

use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, version, Client, ClientError};
use countersign_worker::retry::{retry_in_line, Backoff};
use countersign_worker::runtime::ShowRequests;
use pb::{Scope, Verdict};
use teloxide::types::{CallbackQuery, InlineKeyboardButtonKind, Message, Update, UpdateKind, User};

use crate::api::BotApi;
use crate::callback::{ButtonAction, CallbackData};
use crate::channel::CHANNEL;
use crate::command::parse_command;
use crate::config::Settings;
use crate::render::{decision_outcome_text, escape};
use crate::shown::MessageBook;

/// Callback answers.
const ANSWER_UNKNOWN_BUTTON: &str = "Unknown or outdated button";
const ANSWER_DISABLED_BUTTON: &str = "This button is disabled";
const ANSWER_NOT_ALLOWED: &str = "Not allowed";
const ANSWER_NO_SUCH_APPROVAL: &str = "This approval does not exist";
const ANSWER_TRY_AGAIN: &str = "Could not record the decision, please try again";
// Edit-on-approve: the tapped message showed another version of the arguments than the
// current one (or, as a button from before the edit, named none).
const ANSWER_EDITED: &str =
    "The arguments were edited since this message was shown: look at the updated message and decide again";
const REPLY_HOW_TO: &str = "Reply to an approval request with /approve or /reject &lt;reason&gt;";
const REPLY_NOT_A_REQUEST: &str = "That message is not an approval request";

pub(crate) struct Inbound {
    pub(crate) client: Client,
    pub(crate) bot: BotApi,
    pub(crate) settings: Settings,
    pub(crate) bot_username: String,
    pub(crate) book: Arc<MessageBook>,
    pub(crate) shows: ShowRequests,
}

impl Inbound {
    /// Polls Telegram for taps and commands and handles each batch concurrently. An update is
    /// confirmed (by the next poll's offset) only after it was handled, so a crash makes
    /// Telegram deliver it again; the decision's idempotency key makes that harmless.
    pub(crate) async fn follow_updates(self: &Arc<Self>) {
        let mut offset: Option<i32> = None;
        let mut pause = self.settings.poll_error_backoff;
        loop {
            match self
                .bot
                .get_updates(offset, self.settings.poll_timeout_secs)
                .await
            {
                Ok(updates) => {
                    pause = self.settings.poll_error_backoff;
                    let next = updates.iter().map(next_offset).max();
                    futures::future::join_all(
                        updates.into_iter().map(|update| self.on_update(update)),
                    )
                    .await;
                    if next.is_some() {
                        offset = next;
                    }
                }
                Err(error) => {
                    let wait = pause.max(error.retry_after().unwrap_or_default());
                    let retry_in_ms = wait.as_millis() as u64;
                    if error.is_polling_conflict() {
                        tracing::error!(retry_in_ms, "Telegram refused getUpdates with 409 Conflict: another process polls updates with this bot token; run exactly one countersign-telegram per bot and no other bot program with its token");
                    } else {
                        tracing::warn!(retry_in_ms, %error, "polling Telegram for updates failed");
                    }
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(self.settings.runtime.server.max_backoff);
                }
            }
        }
    }

    async fn on_update(self: &Arc<Self>, update: Update) {
        match update.kind {
            UpdateKind::CallbackQuery(query) => self.on_callback(query).await,
            UpdateKind::Message(message) => self.on_message(message).await,
            UpdateKind::Error(_) => {
                tracing::warn!(
                    update_id = update.id.0,
                    "ignoring an update teloxide cannot read"
                );
            }
            _ => {}
        }
    }

    /// A tap: Decide, answer the tap at once with the outcome, then have the approval shown
    /// (in its lane), the tapped message included: it is noted as the approval's before Decide,
    /// so that the show of the decision's event edits it too, even if it is a copy the worker
    /// never heard of.
    async fn on_callback(self: &Arc<Self>, query: CallbackQuery) {
        let callback_id = query.id.0.clone();
        let user_id = query.from.id.0;
        let tapped = query
            .message
            .as_ref()
            .map(|message| (message.chat().id.0, message.id().0));
        if let Some((chat_id, message_id)) = tapped {
            self.book.saw_message(chat_id, message_id);
        }
        let data = match query
            .data
            .as_deref()
            .unwrap_or_default()
            .parse::<CallbackData>()
        {
            Ok(data) => data,
            Err(error) => {
                tracing::info!(user_id, %error, "refusing a button press with unusable data");
                self.answer(&callback_id, ANSWER_UNKNOWN_BUTTON).await;
                return;
            }
        };
        if !self.settings.buttons.contains(&data.action) {
            tracing::info!(user_id, approval_id = %data.approval_id, action = ?data.action, "refusing a press of a disabled button");
            self.answer(&callback_id, ANSWER_DISABLED_BUTTON).await;
            return;
        }
        if !self.is_allowed(user_id) {
            tracing::info!(user_id, approval_id = %data.approval_id, "refusing a press by a user not on the allowlist");
            self.answer(&callback_id, ANSWER_NOT_ALLOWED).await;
            return;
        }
        let (verdict, scope) = match data.action {
            ButtonAction::Approve => (Verdict::Approve, Scope::Once),
            ButtonAction::Reject => (Verdict::Reject, Scope::Once),
            ButtonAction::AllowSession => (Verdict::Approve, Scope::Session),
        };
        // An Approve button of an edited approval names the version its message showed.
        let expected_args_digest = match (&data.version, verdict) {
            (Some(shown), Verdict::Approve) => {
                match self.version_named(&data.approval_id, shown).await {
                    Ok(digest) => digest,
                    Err(answer) => {
                        self.answer(&callback_id, answer).await;
                        return;
                    }
                }
            }
            _ => String::new(),
        };
        if let Some((chat_id, message_id)) = tapped {
            self.book
                .remember_message(chat_id, message_id, &data.approval_id);
        }
        let request = pb::DecideRequest {
            approval_id: data.approval_id.clone(),
            verdict: verdict.into(),
            scope: scope.into(),
            reason: String::new(),
            decider: Some(decider(&query.from)),
            idempotency_key: format!("telegram:callback:{callback_id}"),
            expected_args_digest,
            ..Default::default()
        };
        let (answer, approval) = self.decide(request, verdict, scope).await;
        self.answer(&callback_id, &answer).await;
        if let Some(approval) = approval {
            self.shows.show(approval);
        }
    }

    async fn on_message(self: &Arc<Self>, message: Message) {
        let chat_id = message.chat.id.0;
        self.book.saw_message(chat_id, message.id.0);
        let Some(command) = message
            .text()
            .and_then(|text| parse_command(text, &self.bot_username))
        else {
            return;
        };
        let Some(from) = message.from.as_ref() else {
            return;
        };
        let Some(original) = message.reply_to_message() else {
            self.reply(chat_id, message.id.0, REPLY_HOW_TO).await;
            return;
        };
        let approval_id = self
            .book
            .approval_of_message(chat_id, original.id.0)
            .or_else(|| approval_id_from_buttons(original));
        let Some(approval_id) = approval_id else {
            self.reply(chat_id, message.id.0, REPLY_NOT_A_REQUEST).await;
            return;
        };
        if !self.is_allowed(from.id.0) {
            tracing::info!(
                user_id = from.id.0,
                approval_id,
                "refusing a command by a user not on the allowlist"
            );
            self.reply(chat_id, message.id.0, ANSWER_NOT_ALLOWED).await;
            return;
        }
        self.book
            .remember_message(chat_id, original.id.0, &approval_id);
        let request = pb::DecideRequest {
            approval_id,
            verdict: command.verdict.into(),
            scope: Scope::Once.into(),
            reason: command.reason,
            decider: Some(decider(from)),
            idempotency_key: format!("telegram:message:{chat_id}:{}", message.id.0),
            ..Default::default()
        };
        let (answer, approval) = self.decide(request, command.verdict, Scope::Once).await;
        // The message first (in its lane), then the reply, which may have to wait.
        if let Some(approval) = approval {
            self.shows.show(approval);
        }
        self.reply(chat_id, message.id.0, &escape(&answer)).await;
    }

    /// The full digest of the current version of the arguments when it starts with `shown`
    /// (the version a button's message showed), or what to answer the tap instead.
    async fn version_named(&self, approval_id: &str, shown: &str) -> Result<String, &'static str> {
        let approval = match self.client.get_approval(approval_id).await {
            Ok(approval) => approval,
            Err(ClientError::NotFound(_)) => return Err(ANSWER_NO_SUCH_APPROVAL),
            Err(error) => {
                tracing::warn!(approval_id, %error, "cannot read the approval of a tap");
                return Err(ANSWER_TRY_AGAIN);
            }
        };
        let (_, current) = version::current_arguments(&approval);
        if current.starts_with(shown) {
            Ok(current.to_owned())
        } else {
            tracing::info!(
                approval_id,
                "a tap on a message showing an earlier version of the arguments"
            );
            Err(ANSWER_EDITED)
        }
    }

    /// Calls Decide; returns the text to tell the decider and the approval as it is now.
    async fn decide(
        &self,
        request: pb::DecideRequest,
        verdict: Verdict,
        scope: Scope,
    ) -> (String, Option<pb::Approval>) {
        let approval_id = request.approval_id.clone();
        match self.client.decide(request).await {
            Ok(response) => {
                tracing::info!(approval_id, outcome = ?response.outcome(), "decision relayed");
                let answer = decision_outcome_text(&response, verdict, scope);
                (answer, response.approval)
            }
            Err(ClientError::PermissionDenied(reason)) => {
                tracing::info!(approval_id, %reason, "the server refused the decider");
                (refusal_answer(&reason), None)
            }
            Err(ClientError::NotFound(_)) => (ANSWER_NO_SUCH_APPROVAL.to_owned(), None),
            Err(ClientError::FailedPrecondition(reason)) => {
                tracing::info!(approval_id, %reason, "the server refused an approval of an unnamed version");
                (ANSWER_EDITED.to_owned(), None)
            }
            Err(error) => {
                tracing::warn!(approval_id, %error, "Decide failed");
                (ANSWER_TRY_AGAIN.to_owned(), None)
            }
        }
    }

    fn is_allowed(&self, user_id: u64) -> bool {
        let allowlist = &self.settings.allowed_user_ids;
        allowlist.is_empty()
            || i64::try_from(user_id).is_ok_and(|user_id| allowlist.contains(&user_id))
    }

    /// Answers a callback query, retrying briefly (Telegram stops the spinner itself after
    /// some seconds, so a late answer is worth little).
    async fn answer(&self, callback_id: &str, text: &str) {
        let answered = retry_in_line(
            self.call_backoff(),
            3,
            Duration::from_secs(2),
            "answerCallbackQuery",
            || self.bot.answer_callback(callback_id, text),
        )
        .await;
        if let Err(error) = answered {
            // A re-delivered callback was already answered; Telegram says the query is too old.
            tracing::info!(%error, "cannot answer the callback query");
        }
    }

    /// Backoff for calls retried in line (callback answers, replies).
    fn call_backoff(&self) -> Backoff {
        Backoff::new(Duration::from_millis(200), self.settings.runtime.retry.max)
    }

    /// Replies to a command, retrying what may pass (a 5xx, a flood wait) a few times, briefly:
    /// the updates after this one wait meanwhile.
    async fn reply(&self, chat_id: i64, message_id: i32, html: &str) {
        let sent = retry_in_line(
            self.call_backoff(),
            3,
            self.settings.runtime.retry.max.min(REPLY_MAX_WAIT),
            "sendMessage",
            || self.bot.send_message(chat_id, html, &[], Some(message_id)),
        )
        .await;
        if let Err(error) = sent {
            tracing::warn!(chat_id, %error, "cannot reply to a command");
        }
    }
}

/// The longest a command's reply waits before one more try.
const REPLY_MAX_WAIT: Duration = Duration::from_secs(5);

/// The most of a callback answer Telegram shows.
const MAX_ANSWER_CHARS: usize = 200;

/// A server refusal as the decider sees it: why, in the server's words (groups and approvers
/// from the configuration; a requester the agent named appears only quoted), cut to what
/// Telegram shows. A callback answer is plain text: nothing in it is markup.
fn refusal_answer(reason: &str) -> String {
    let text = format!("{ANSWER_NOT_ALLOWED}: {reason}");
    if text.chars().count() <= MAX_ANSWER_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_ANSWER_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// The offset that confirms `update` on the next poll.
fn next_offset(update: &Update) -> i32 {
    i32::try_from(update.id.0)
        .ok()
        .and_then(|id| id.checked_add(1))
        .unwrap_or(i32::MAX)
}

fn decider(user: &User) -> pb::Decider {
    pb::Decider {
        channel: CHANNEL.to_owned(),
        user_id: user.id.0.to_string(),
        display_name: user.mention().unwrap_or_else(|| user.full_name()),
    }
}

/// The approval a request message is about, read from its buttons (a reply to a message the
/// worker has not seen since it started).
fn approval_id_from_buttons(message: &Message) -> Option<String> {
    message
        .reply_markup()?
        .inline_keyboard
        .iter()
        .flatten()
        .find_map(|button| match &button.kind {
            InlineKeyboardButtonKind::CallbackData(data) => data.parse::<CallbackData>().ok(),
            _ => None,
        })
        .map(|data| data.approval_id)
}
