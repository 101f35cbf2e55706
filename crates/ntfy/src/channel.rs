//! The ntfy channel: each pending approval of the `ntfy` channel becomes a notification on
//! its topics, with Approve / Reject… / Allow for session buttons that decide through
//! one-time links; the notification is updated in place (same sequence id) to the outcome
//! when the approval is decided (there or elsewhere), expires or is cancelled.
//!
//! The loop around it (watch, lanes, retries on the approval's schedule never before ntfy's
//! `Retry-After`, shutdown) is the shared runtime's (`countersign_worker::runtime`). Every
//! start reconciles: a snapshot of the pending approvals, then every approval whose
//! notification does not show a final state yet (from the local store), so an approval
//! resolved while the worker was down is corrected however long it was down.

use std::time::Duration;

use countersign_client::{pb, version, Client};
use countersign_links::pages::Pages;
use countersign_links::store::NewLink;
use countersign_links::{expires_ms, LinkVerdict};
use countersign_worker::approval::{configured_places, record_delivery_once};
use countersign_worker::channel::Channel;
use countersign_worker::retry::{Classify, Verdict};
use pb::ApprovalState;

use crate::api::{NtfyApi, NtfyError, Publish};
use crate::config::{DecisionPath, Settings, Topic};
use crate::render::{self, Buttons};
use crate::replies;
use crate::shown::{Store, StoreError};

/// The channel name this worker serves.
pub const CHANNEL: &str = "ntfy";

/// How far before a publish started its message may carry ntfy's timestamp (clock skew).
const CLOCK_SKEW_SECS: i64 = 5;

/// How a delivery names a topic: `topic-` and the first 12 hex digits of its SHA-256, which
/// tell topics apart without giving one away.
pub fn topic_fingerprint(topic: &str) -> String {
    format!("topic-{}", &countersign_links::token_hash(topic)[..12])
}

/// Why one notification could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error(transparent)]
    Ntfy(#[from] NtfyError),
    /// The state database failed (a read, or the intent written before a publish, without
    /// which nothing is published): check its disk and permissions (`state_dir`).
    #[error("{0} (check the disk and the permissions of state_dir)")]
    Store(#[from] StoreError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::Ntfy(error) => error.verdict(),
            // Without the intent on disk a crash could lose track of the publish.
            ShowError::Store(_) => Verdict::Retry { after: None },
        }
    }
}

pub struct NtfyChannel {
    client: Client,
    api: NtfyApi,
    store: Store,
    pages: Pages,
    settings: Settings,
}

impl Channel for NtfyChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Brings every notification of the approval in line with its state. A topic refused
    /// for good is logged and the others go on; when any failed for a reason that may pass,
    /// the error with the longest retry-after is returned (the retry shows every topic again,
    /// which costs nothing where the notification is up to date).
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        let mut retry: Option<(Option<Duration>, ShowError)> = None;
        for topic in self.topics_of(approval) {
            let Err(error) = self.show_on(approval, topic).await else {
                continue;
            };
            match error.verdict() {
                Verdict::Retry { after } => {
                    tracing::warn!(approval_id = %approval.id, %error, "cannot publish now; will retry");
                    if retry.as_ref().is_none_or(|(longest, _)| after > *longest) {
                        retry = Some((after, error));
                    }
                }
                Verdict::Final => {
                    tracing::error!(approval_id = %approval.id, %error, "ntfy refused the notification");
                }
            }
        }
        retry.map_or(Ok(()), |(_, error)| Err(error))
    }

    async fn unfinished(&self) -> Result<Vec<String>, ShowError> {
        Ok(self.store.unfinished().await?)
    }
}

impl NtfyChannel {
    pub fn new(
        client: Client,
        api: NtfyApi,
        store: Store,
        pages: Pages,
        settings: Settings,
    ) -> NtfyChannel {
        NtfyChannel {
            client,
            api,
            store,
            pages,
            settings,
        }
    }

    async fn show_on(&self, approval: &pb::Approval, topic: &Topic) -> Result<(), ShowError> {
        let pending = approval.state() == ApprovalState::Pending;
        let wanted = if pending {
            format!("pending:{}", version::current_arguments(approval).1)
        } else {
            format!("final:{}", approval.state().as_str_name())
        };
        let Some(known) = self.store.notification(&approval.id, &topic.name).await? else {
            // Never shown: a resolved approval needs no notification.
            return if pending {
                self.publish_request(approval, topic, &wanted).await
            } else {
                Ok(())
            };
        };
        if known.shown.as_deref() == Some(wanted.as_str()) {
            return Ok(());
        }
        if pending && known.intended.starts_with("final:") {
            // An older copy of an approval already shown resolved.
            return Ok(());
        }
        if known.shown.is_none() && known.intended.starts_with("pending:") {
            // A request publish whose answer never came (a crash, a lost connection): when
            // ntfy has it, it is adopted, not published again.
            let since = known.started_ms / 1000 - CLOCK_SKEW_SECS;
            let sequence_id = render::sequence_id(&approval.id);
            if self
                .api
                .has_message(&topic.name, &sequence_id, since)
                .await?
            {
                tracing::info!(approval_id = %approval.id, "found the message of an interrupted publish; adopting it");
                self.store
                    .shown(&approval.id, &topic.name, &known.intended)
                    .await?;
                self.record_delivery(approval, topic).await;
                if known.intended == wanted {
                    return Ok(());
                }
            }
        }
        if pending {
            self.publish_request(approval, topic, &wanted).await
        } else {
            let outcome = render::outcome(approval, &topic.name);
            self.store
                .intend(&approval.id, &topic.name, &wanted, Vec::new())
                .await?;
            self.publish_or_minimal(approval, outcome).await?;
            self.store.shown(&approval.id, &topic.name, &wanted).await?;
            tracing::info!(approval_id = %approval.id, state = ?approval.state(), "notification updated to the outcome");
            Ok(())
        }
    }

    /// Publishes the request with fresh links (stored, with the intent, before the publish:
    /// the links of every message ever published keep working).
    async fn publish_request(
        &self,
        approval: &pb::Approval,
        topic: &Topic,
        wanted: &str,
    ) -> Result<(), ShowError> {
        let digest = version::current_arguments(approval).1.to_owned();
        let expires = expires_ms(approval);
        let mint = |verdict| NewLink::mint(verdict, &topic.approver, expires);
        let (approve, approve_link) = mint(LinkVerdict::Approve);
        let (reject, reject_link) = mint(LinkVerdict::Reject);
        let (session, session_link) = mint(LinkVerdict::AllowSession);
        let buttons = match &self.settings.decisions {
            DecisionPath::ReplyTopic(reply) => {
                let url = format!("{}/{reply}", self.settings.ntfy_url);
                let button = |label, token: &str| {
                    let body = replies::body(token, &self.pages.form_token(token), &digest);
                    render::reply_button(label, url.clone(), body)
                };
                Buttons {
                    approve: button("Approve", &approve),
                    reject: button("Reject", &reject),
                    allow_session: button("Allow for session", &session),
                }
            }
            DecisionPath::PublicUrl(base) => Buttons {
                approve: render::deciding_button(
                    "Approve",
                    format!("{base}/decide/{approve}"),
                    &self.pages.form_token(&approve),
                    &digest,
                ),
                reject: render::page_button("Reject…", format!("{base}/decide/{reject}")),
                allow_session: render::deciding_button(
                    "Allow for session",
                    format!("{base}/decide/{session}"),
                    &self.pages.form_token(&session),
                    &digest,
                ),
            },
        };
        let message = render::request(approval, &topic.name, buttons);
        self.store
            .intend(
                &approval.id,
                &topic.name,
                wanted,
                vec![approve_link, reject_link, session_link],
            )
            .await?;
        self.publish_or_minimal(approval, message).await?;
        self.store.shown(&approval.id, &topic.name, wanted).await?;
        tracing::info!(approval_id = %approval.id, "published the approval request");
        self.record_delivery(approval, topic).await;
        Ok(())
    }

    /// Publishes `message`; when ntfy refuses its content (400, 413), publishes the minimal
    /// form in its place, so that the approval is never left unseen.
    async fn publish_or_minimal(
        &self,
        approval: &pb::Approval,
        message: Publish,
    ) -> Result<(), NtfyError> {
        match self.api.publish(&message).await {
            Err(
                error @ NtfyError::Status {
                    status: 400 | 413, ..
                },
            ) => {
                tracing::warn!(approval_id = %approval.id, %error, "ntfy refused the notification's content; publishing its minimal form");
                self.api.publish(&render::minimal(approval, message)).await
            }
            result => result,
        }
    }

    /// Records the notification on the server (best effort: the local store is what a
    /// restarted worker goes by).
    /// The topic is named by a fingerprint, never by its name: whoever reads a topic can
    /// press its buttons, and an approval (deliveries included) is read by its agent too.
    async fn record_delivery(&self, approval: &pb::Approval, topic: &Topic) {
        let target = topic_fingerprint(&topic.name);
        let message_ref = format!("{target}/{}", render::sequence_id(&approval.id));
        record_delivery_once(&self.client, approval, CHANNEL, &target, message_ref).await;
    }

    /// The topics an approval goes to: each `ntfy` route's target (a topic), the default topic
    /// for an empty target, a target that is not a configured topic (logged: the approval
    /// still reaches approvers, and an agent still cannot publish anywhere else), or an
    /// approval without routes.
    fn topics_of(&self, approval: &pb::Approval) -> Vec<&Topic> {
        let default = self.settings.default_topic.as_deref();
        configured_places(
            approval,
            CHANNEL,
            |target| self.settings.topic(target),
            default.and_then(|name| self.settings.topic(name)),
            "an ntfy route names a topic that is not a [[topics]] entry: publishing to the default topic instead",
            "no ntfy.default_topic is configured for this approval's route: it is published to no topic",
        )
    }
}
