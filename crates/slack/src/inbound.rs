//! What approvers do in Slack, as Socket Mode delivers it: a button tap (`block_actions`) and
//! the reject modal's submission (`view_submission`). Approve and Allow for session decide at
//! once; Reject… opens a modal (`views.open`) that asks for the reason, and its submission
//! decides. Before anything reaches Decide the tap must come from a message this worker
//! posted for that approval (the button's value is checked against the stored message), and
//! the user must be allowed here (`allowed_user_ids`); the server then checks that the Slack
//! user id is one of an approver's `slack` identities. The idempotency key is the interaction's
//! own id (`trigger_id`, the modal's view id), so a redelivered envelope decides once. The
//! message itself is updated by the watch, like every change.

use countersign_client::{pb, Client, ClientError};
use pb::{Scope, Verdict};
use slack_morphism::prelude::*;

use crate::api::SlackApi;
use crate::channel::CHANNEL;
use crate::config::Settings;
use crate::render::{self, ALLOW_SESSION, APPROVE, REASON_BLOCK, REASON_INPUT, REJECT};
use crate::shown::Store;

/// Where an action came from and what it names.
struct Tap {
    user: SlackBasicUserInfo,
    channel: String,
    message_ts: String,
    approval_id: String,
    digest: String,
}

impl Tap {
    /// The modal's private metadata: enough to check the tap again on submission.
    fn metadata(&self) -> String {
        format!(
            "{} {} {} {}",
            self.approval_id, self.digest, self.channel, self.message_ts
        )
    }
}

pub struct Inbound {
    client: Client,
    api: SlackApi,
    store: Store,
    settings: Settings,
}

impl Inbound {
    pub fn new(client: Client, api: SlackApi, store: Store, settings: Settings) -> Inbound {
        Inbound {
            client,
            api,
            store,
            settings,
        }
    }

    pub async fn handle(&self, event: SlackInteractionEvent) {
        match event {
            SlackInteractionEvent::BlockActions(event) => self.on_buttons(event).await,
            SlackInteractionEvent::ViewSubmission(event) => self.on_reject_reason(event).await,
            _ => {}
        }
    }

    async fn on_buttons(&self, event: SlackInteractionBlockActionsEvent) {
        let (Some(user), SlackInteractionActionContainer::Message(container)) =
            (event.user, &event.container)
        else {
            return;
        };
        let Some(channel) = container
            .channel_id
            .clone()
            .or(event.channel.map(|channel| channel.id))
        else {
            return;
        };
        for action in event.actions.unwrap_or_default() {
            let Some((approval_id, digest)) = action
                .value
                .as_deref()
                .and_then(|value| value.split_once(' '))
            else {
                continue;
            };
            let tap = Tap {
                user: user.clone(),
                channel: channel.0.clone(),
                message_ts: container.message_ts.0.clone(),
                approval_id: approval_id.to_owned(),
                digest: digest.to_owned(),
            };
            let (verdict, scope) = match action.action_id.0.as_str() {
                APPROVE => (Verdict::Approve, Scope::Once),
                ALLOW_SESSION => (Verdict::Approve, Scope::Session),
                REJECT => {
                    if self.admitted(&tap).await {
                        let modal = render::reject_modal(&tap.metadata());
                        if let Err(error) = self.api.open_view(&event.trigger_id.0, modal).await {
                            tracing::warn!(approval_id = %tap.approval_id, %error, "cannot open the reject modal");
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            let key = format!("slack:action:{}", event.trigger_id.0);
            self.decide(&tap, verdict, scope, String::new(), key).await;
        }
    }

    async fn on_reject_reason(&self, event: SlackInteractionViewSubmissionEvent) {
        let SlackView::Modal(modal) = &event.view.view else {
            return;
        };
        if modal.callback_id.as_ref().map(|id| id.0.as_str()) != Some(render::REJECT_VIEW) {
            return;
        }
        let metadata = modal.private_metadata.clone().unwrap_or_default();
        let parts: Vec<&str> = metadata.split(' ').collect();
        let [approval_id, digest, channel, message_ts] = parts[..] else {
            tracing::warn!("a reject modal without its approval; ignored");
            return;
        };
        let reason = event
            .view
            .state_params
            .state
            .as_ref()
            .and_then(|state| state.values.get(&REASON_BLOCK.into()))
            .and_then(|block| block.get(&REASON_INPUT.into()))
            .and_then(|input| input.value.clone())
            .unwrap_or_default();
        let tap = Tap {
            user: event.user,
            channel: channel.to_owned(),
            message_ts: message_ts.to_owned(),
            approval_id: approval_id.to_owned(),
            digest: digest.to_owned(),
        };
        let key = format!("slack:view:{}", event.view.state_params.id.0);
        self.decide(&tap, Verdict::Reject, Scope::Once, reason, key)
            .await;
    }

    /// Whether the tap came from this approval's message, by a user allowed here; a refusal
    /// is told to the user (and logged) and nothing is decided.
    async fn admitted(&self, tap: &Tap) -> bool {
        let post = self
            .store
            .load(&tap.approval_id)
            .ok()
            .and_then(|mut posts| posts.remove(&tap.channel));
        let posted = match post {
            Some(post) => match post.message_ref {
                Some(ts) => ts == tap.message_ts,
                // Slack answered the post, but the worker has not recorded the `ts` yet (or
                // crashed before it did): Slack's history says which message it is.
                None => self
                    .api
                    .find(&tap.channel, post.search_from_ms() / 1000, &tap.approval_id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|ts| ts == tap.message_ts),
            },
            None => false,
        };
        let refusal = if !posted {
            "This button is not on a message countersign posted for that request; nothing was decided."
        } else if !self.settings.may_decide(&tap.user.id.0) {
            "You are not allowed to decide countersign requests here; nothing was decided."
        } else {
            return true;
        };
        tracing::warn!(approval_id = %tap.approval_id, posted, "refused a Slack action");
        self.tell(tap, refusal).await;
        false
    }

    async fn decide(&self, tap: &Tap, verdict: Verdict, scope: Scope, reason: String, key: String) {
        if !self.admitted(tap).await {
            return;
        }
        let user = &tap.user;
        let request = pb::DecideRequest {
            approval_id: tap.approval_id.clone(),
            verdict: verdict.into(),
            scope: scope.into(),
            reason,
            decider: Some(pb::Decider {
                channel: CHANNEL.to_owned(),
                user_id: user.id.0.clone(),
                display_name: user
                    .name
                    .clone()
                    .or(user.username.clone())
                    .unwrap_or_default(),
            }),
            idempotency_key: key,
            expected_args_digest: tap.digest.clone(),
            ..Default::default()
        };
        let answer = match self.client.decide(request).await {
            Ok(response) => {
                tracing::info!(approval_id = %tap.approval_id, outcome = ?response.outcome(), "decision relayed");
                match response.outcome() {
                    pb::DecideOutcome::AlreadyResolved => "This request was already resolved.",
                    _ => return,
                }
            }
            Err(ClientError::PermissionDenied(reason)) => {
                tracing::info!(approval_id = %tap.approval_id, %reason, "the server refused the decider");
                "countersign does not know you as an approver of this request (your Slack user id must be in an approver's identities); nothing was decided."
            }
            Err(error) => {
                tracing::warn!(approval_id = %tap.approval_id, %error, "cannot relay the decision");
                "countersign could not take the decision now; try again."
            }
        };
        self.tell(tap, answer).await;
    }

    async fn tell(&self, tap: &Tap, text: &str) {
        if let Err(error) = self.api.tell(&tap.channel, &tap.user.id.0, text).await {
            tracing::warn!(%error, "cannot answer the Slack user");
        }
    }
}
