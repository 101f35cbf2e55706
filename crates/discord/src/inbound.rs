//! What approvers do in Discord, as the Gateway delivers it (INTERACTION_CREATE): a button tap
//! (type 3, MESSAGE_COMPONENT) and the reject modal's submission (type 5, MODAL_SUBMIT).
//! Approve and Allow for session decide at once; Reject… answers with a modal (type 9) that
//! asks for the reason, and its submission decides. Before anything reaches Decide the tap must
//! come from the message this worker posted for that approval, showing the arguments the button
//! names (checked against the stored message); the server then checks that the Discord user id
//! is one of an approver's `discord` identities. A refusal is answered ephemerally (flag 64) and
//! decides nothing. The idempotency key is the interaction's id, so an interaction delivered
//! twice decides once. The message itself is edited by the watch, like every change. The same
//! handling serves interactions POSTed to the HTTP endpoint (`http.rs`); only where the first
//! answer goes differs ([`Reply`]).

use std::sync::Arc;

use countersign_client::{pb, Client, ClientError};
use pb::{Scope, Verdict};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use twilight_gateway::{
    ConfigBuilder, Event, EventTypeFlags, Intents, Shard, ShardId, StreamExt as _,
};
use twilight_model::application::interaction::{Interaction, InteractionData};

use crate::api::{snowflake_at, DiscordApi};
use crate::channel::CHANNEL;
use crate::render::{self, ALLOW_SESSION, APPROVE, DIGEST_PREFIX, REASON, REASON_INPUT, REJECT};
use crate::shown::Store;
use crate::WorkerError;

/// A Gateway session for `intents`, at Discord's Gateway or `gateway_url` (a fake's).
pub fn shard(bot_token: &str, gateway_url: Option<&str>, intents: Intents) -> Shard {
    let mut config = ConfigBuilder::new(bot_token.to_owned(), intents);
    if let Some(url) = gateway_url {
        config = config.proxy_url(url.to_owned());
    }
    Shard::with_config(ShardId::ONE, config.build())
}

pub struct Inbound {
    pub client: Client,
    pub api: DiscordApi,
    pub store: Store,
}

/// Where an interaction's first answer goes.
pub enum Reply {
    /// Over the Gateway: the callback endpoint (`POST /interactions/{id}/{token}/callback`).
    Callback,
    /// Over HTTP: the body of the response to Discord's request.
    Http(oneshot::Sender<Value>),
}

/// A tap: who, on which message, and what its `custom_id` says.
struct Tap {
    interaction_id: String,
    application_id: String,
    token: String,
    user: pb::Decider,
    channel: String,
    message_id: String,
    verb: String,
    approval_id: String,
    digest_prefix: String,
    custom_id: String,
    reason: String,
}

impl Tap {
    fn of(interaction: &Interaction) -> Option<Tap> {
        let (custom_id, reason) = match interaction.data.as_ref()? {
            InteractionData::MessageComponent(data) => (data.custom_id.clone(), String::new()),
            InteractionData::ModalSubmit(data) => {
                let inputs = data.components.iter().flat_map(|row| &row.components);
                let mut reasons = inputs.filter(|input| input.custom_id == REASON_INPUT);
                let reason = reasons
                    .find_map(|input| input.value.clone())
                    .unwrap_or_default();
                (data.custom_id.clone(), reason)
            }
            _ => return None,
        };
        let mut parts = custom_id.splitn(4, ':');
        let (Some("countersign"), Some(verb), Some(approval_id), Some(digest_prefix)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let user = interaction.author()?;
        let message = interaction.message.as_ref()?;
        Some(Tap {
            interaction_id: interaction.id.to_string(),
            application_id: interaction.application_id.to_string(),
            token: interaction.token.clone(),
            user: pb::Decider {
                channel: CHANNEL.to_owned(),
                user_id: user.id.to_string(),
                display_name: user
                    .global_name
                    .clone()
                    .unwrap_or_else(|| user.name.clone()),
            },
            channel: message.channel_id.to_string(),
            message_id: message.id.to_string(),
            verb: verb.to_owned(),
            approval_id: approval_id.to_owned(),
            digest_prefix: digest_prefix.to_owned(),
            reason,
            custom_id,
        })
    }
}

impl Inbound {
    /// Listens on the Gateway until it closes for good (a refused token); each interaction is
    /// handled beside the others (Discord wants an answer within 3 seconds).
    pub async fn listen(self: Arc<Self>, mut shard: Shard) -> Result<(), WorkerError> {
        while let Some(item) = shard
            .next_event(EventTypeFlags::INTERACTION_CREATE | EventTypeFlags::READY)
            .await
        {
            match item {
                Ok(Event::InteractionCreate(interaction)) => {
                    let inbound = self.clone();
                    tokio::spawn(
                        async move { inbound.handle(&interaction.0, Reply::Callback).await },
                    );
                }
                Ok(Event::Ready(_)) => tracing::info!("connected to the Discord Gateway"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "a Gateway event could not be read"),
            }
        }
        Err(WorkerError::Gateway(format!(
            "closed with {:?}",
            shard.state()
        )))
    }

    /// Answers the interaction through `reply` and then decides; an interaction that is no
    /// countersign tap gets no answer.
    pub async fn handle(&self, interaction: &Interaction, reply: Reply) {
        let Some(tap) = Tap::of(interaction) else {
            return;
        };
        let decision = match tap.verb.as_str() {
            APPROVE => Some((Verdict::Approve, Scope::Once)),
            ALLOW_SESSION => Some((Verdict::Approve, Scope::Session)),
            REASON => Some((Verdict::Reject, Scope::Once)),
            _ => None,
        };
        let (digest, (verdict, scope)) = match (self.admitted(&tap).await, decision) {
            (Err(refusal), _) => return self.answer(&tap, reply, render::ephemeral(refusal)).await,
            (Ok(_), None) if tap.verb == REJECT => {
                return self
                    .answer(&tap, reply, render::reject_modal(&tap.custom_id))
                    .await
            }
            (Ok(_), None) => return,
            (Ok(digest), Some(decision)) => (digest, decision),
        };
        // Acknowledged at once (type 6, DEFERRED_UPDATE_MESSAGE: Discord wants an answer
        // within 3 seconds, and the edit follows from the watch); a refusal follows ephemerally.
        self.answer(&tap, reply, json!({"type": 6})).await;
        if let Some(refusal) = self.decide(&tap, verdict, scope, digest).await {
            let message = render::ephemeral_message(refusal);
            let sent = self
                .api
                .follow_up(&tap.application_id, &tap.token, &message);
            if let Err(error) = sent.await {
                tracing::warn!(approval_id = %tap.approval_id, %error, "cannot tell the user");
            }
        }
    }

    async fn answer(&self, tap: &Tap, reply: Reply, answer: Value) {
        let answered = match reply {
            Reply::Callback => self
                .api
                .respond(&tap.interaction_id, &tap.token, &answer)
                .await
                .map_err(|error| error.to_string()),
            Reply::Http(response) => response
                .send(answer)
                .map_err(|_| "the HTTP request is gone".to_owned()),
        };
        if let Err(error) = answered {
            tracing::warn!(approval_id = %tap.approval_id, %error, "cannot answer the interaction");
        }
    }

    /// The full digest of the arguments the tapped message shows, when the tap came from this
    /// approval's message and names those arguments; else what to tell the user.
    async fn admitted(&self, tap: &Tap) -> Result<String, &'static str> {
        let post = self
            .store
            .load(&tap.approval_id)
            .ok()
            .and_then(|mut posts| posts.remove(&tap.channel));
        let posted = match &post {
            Some(post) => match &post.message_ref {
                Some(id) => *id == tap.message_id,
                // Discord answered the post, but the worker has not recorded the id yet.
                None => self
                    .api
                    .find(
                        &tap.channel,
                        snowflake_at(post.search_from_ms()),
                        &tap.approval_id,
                    )
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|id| id == tap.message_id),
            },
            None => false,
        };
        let digest = post.as_ref().and_then(|post| {
            let (digest, _) = post.intended.strip_prefix("pending:")?.rsplit_once(':')?;
            Some(digest.to_owned())
        });
        match digest {
            _ if !posted => {
                tracing::warn!(approval_id = %tap.approval_id, user = %tap.user.user_id, "refused a tap not on this approval's message");
                Err("This button is not on the message countersign posted for that request; nothing was decided.")
            }
            Some(digest) if digest.get(..DIGEST_PREFIX) == Some(tap.digest_prefix.as_str()) => Ok(digest),
            Some(_) => Err("The arguments changed since this message was shown; look again. Nothing was decided."),
            None => Err("This request was already resolved."),
        }
    }

    /// Decides; what to tell the user when nothing was decided.
    async fn decide(
        &self,
        tap: &Tap,
        verdict: Verdict,
        scope: Scope,
        digest: String,
    ) -> Option<&'static str> {
        let request = pb::DecideRequest {
            approval_id: tap.approval_id.clone(),
            verdict: verdict.into(),
            scope: scope.into(),
            reason: tap.reason.clone(),
            decider: Some(tap.user.clone()),
            idempotency_key: format!("discord:interaction:{}", tap.interaction_id),
            expected_args_digest: digest,
            ..Default::default()
        };
        let refusal = match self.client.decide(request).await {
            Ok(response) => {
                tracing::info!(approval_id = %tap.approval_id, outcome = ?response.outcome(), "decision relayed");
                match response.outcome() {
                    pb::DecideOutcome::AlreadyResolved => "This request was already resolved.",
                    _ => return None,
                }
            }
            Err(ClientError::PermissionDenied(reason)) => {
                tracing::info!(approval_id = %tap.approval_id, %reason, "the server refused the decider");
                "countersign does not know you as an approver of this request (your Discord user id must be in an approver's identities); nothing was decided."
            }
            Err(error) => {
                tracing::warn!(approval_id = %tap.approval_id, %error, "cannot relay the decision");
                "countersign could not take the decision now; try again."
            }
        };
        Some(refusal)
    }
}
