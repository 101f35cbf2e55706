//! The worker: each pending approval of the `ntfy` channel becomes a notification on its
//! topics, with Approve / Reject… / Allow for session buttons that decide through one-time
//! links; the notification is updated in place (same sequence id) to the outcome when the
//! approval is decided (there or elsewhere), expires or is cancelled.
//!
//! Everything for one approval runs in its lane; a publish that fails for a reason that may
//! pass (429, 5xx, no answer) is retried on the approval's schedule, never before ntfy's
//! `Retry-After`. Every start reconciles: a snapshot of the pending approvals, then every
//! approval whose notification does not show a final state yet (from the local store), so an
//! approval resolved while the worker was down is corrected however long it was down.

use std::sync::Arc;
use std::time::Duration;

use countersign_client::{pb, version, Client, WatchItem, WatchOptions};
use countersign_links::pages::Pages;
use countersign_links::store::NewLink;
use countersign_links::{expires_ms, LinkVerdict};
use countersign_worker::approval::route_targets;
use countersign_worker::lanes::Lanes;
use countersign_worker::retry::{Backoff, RetrySchedule};
use pb::{ApprovalState, EventKind};

use crate::api::{NtfyApi, NtfyError};
use crate::config::{Settings, Topic};
use crate::error::WorkerError;
use crate::render::{self, Buttons};
use crate::store::{Store, StoreError};

/// The channel name this worker serves.
pub const CHANNEL: &str = "ntfy";

/// How far before a publish started its message may carry ntfy's timestamp (clock skew).
const CLOCK_SKEW_SECS: i64 = 5;

/// Why one notification could not be brought up to date.
#[derive(Debug, thiserror::Error)]
enum ShowError {
    #[error(transparent)]
    Ntfy(#[from] NtfyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Worker {
    client: Client,
    api: NtfyApi,
    store: Store,
    pages: Pages,
    settings: Settings,
    lanes: Lanes,
    retries: RetrySchedule,
}

impl Worker {
    pub fn new(
        client: Client,
        api: NtfyApi,
        store: Store,
        pages: Pages,
        settings: Settings,
        lanes: Lanes,
    ) -> Worker {
        let retries = RetrySchedule::new(Backoff::new(
            settings.retry_interval,
            settings.max_retry_wait,
        ));
        Worker {
            client,
            api,
            store,
            pages,
            settings,
            lanes,
            retries,
        }
    }

    /// Follows the `ntfy` channel: a snapshot at every (re)connection, then its events.
    pub async fn follow_approvals(self: &Arc<Self>) -> Result<(), WorkerError> {
        let mut watch = self.client.watch(WatchOptions {
            channel: CHANNEL.to_owned(),
            heartbeat_timeout: self.settings.server.heartbeat_timeout,
            max_backoff: self.settings.server.max_backoff,
            // Every start reconciles with a snapshot; the store knows what was shown.
            resume_after: None,
        });
        loop {
            match watch.next().await? {
                WatchItem::Snapshot(pending) => {
                    tracing::info!(pending = pending.len(), "snapshot of pending approvals");
                    for approval_id in self.store.unfinished().await? {
                        if !pending.iter().any(|approval| approval.id == approval_id) {
                            self.enqueue_refresh(approval_id);
                        }
                    }
                    for approval in pending {
                        self.enqueue_show(approval);
                    }
                }
                WatchItem::Event(event) => {
                    let kind = event.kind();
                    let Some(approval) = event.approval else {
                        continue;
                    };
                    match kind {
                        EventKind::Requested
                        | EventKind::Resolved
                        | EventKind::Expired
                        | EventKind::Cancelled
                        | EventKind::Consumed
                        | EventKind::DecisionRecorded
                        | EventKind::Escalated => {
                            tracing::debug!(approval_id = %approval.id, seq = event.seq, ?kind, "approval event");
                            self.enqueue_show(approval);
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Tries again the approvals whose notifications failed for a reason that may pass.
    pub async fn retry_failed(self: &Arc<Self>) -> Result<(), WorkerError> {
        loop {
            for approval_id in self.retries.next_due().await {
                self.enqueue_refresh(approval_id);
            }
        }
    }

    fn enqueue_show(self: &Arc<Self>, approval: pb::Approval) {
        let worker = self.clone();
        let key = approval.id.clone();
        self.lanes
            .push(&key, async move { worker.show(&approval).await });
    }

    /// Shows the approval as the server has it now.
    fn enqueue_refresh(self: &Arc<Self>, approval_id: String) {
        let worker = self.clone();
        let key = approval_id.clone();
        self.lanes.push(&key, async move {
            match worker.client.get_approval(&approval_id).await {
                Ok(approval) => worker.show(&approval).await,
                Err(error) if error.is_transient() => {
                    tracing::warn!(approval_id, %error, "cannot read an approval to update its notification; will retry");
                    worker.retries.failed(&approval_id, None);
                }
                Err(error) => {
                    tracing::warn!(approval_id, %error, "giving up on an approval's notification");
                    worker.retries.succeeded(&approval_id);
                }
            }
        });
    }

    /// Brings every notification of the approval in line with its state; a failure that may
    /// pass schedules a retry of the whole approval.
    async fn show(&self, approval: &pb::Approval) {
        if let Some(wait) = self.retries.holds(&approval.id) {
            // ntfy asked for a pause; the scheduled retry shows the latest state after it.
            tracing::debug!(approval_id = %approval.id, wait_ms = wait.as_millis() as u64, "rate limited; leaving the update to the scheduled retry");
            return;
        }
        let mut failed = false;
        let mut retry_after: Option<Duration> = None;
        for topic in self.topics_of(approval) {
            match self.show_on(approval, topic).await {
                Ok(()) => {}
                Err(ShowError::Ntfy(error)) if error.is_transient() => {
                    tracing::warn!(approval_id = %approval.id, topic = %topic.name, %error, "cannot publish now; will retry");
                    failed = true;
                    retry_after = retry_after.max(error.retry_after());
                }
                Err(ShowError::Ntfy(error)) => {
                    tracing::error!(approval_id = %approval.id, topic = %topic.name, %error, "ntfy refused the notification");
                }
                Err(ShowError::Store(error)) => {
                    // Without the intent on disk a crash could lose track of the publish.
                    tracing::error!(approval_id = %approval.id, topic = %topic.name, %error, "cannot write the state database; not publishing, will retry");
                    failed = true;
                }
            }
        }
        if failed {
            let wait = self.retries.failed(&approval.id, retry_after);
            tracing::debug!(approval_id = %approval.id, retry_in_ms = wait.as_millis() as u64, "notification scheduled for a retry");
        } else {
            self.retries.succeeded(&approval.id);
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
                tracing::info!(approval_id = %approval.id, topic = %topic.name, "found the message of an interrupted publish; adopting it");
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
            self.api.publish(&outcome).await?;
            self.store.shown(&approval.id, &topic.name, &wanted).await?;
            tracing::info!(approval_id = %approval.id, topic = %topic.name, state = ?approval.state(), "notification updated to the outcome");
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
        let base = &self.settings.public_url;
        let mint = |verdict| NewLink::mint(verdict, &topic.approver, expires);
        let (approve, approve_link) = mint(LinkVerdict::Approve);
        let (reject, reject_link) = mint(LinkVerdict::Reject);
        let (session, session_link) = mint(LinkVerdict::AllowSession);
        let buttons = Buttons {
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
        self.api.publish(&message).await?;
        self.store.shown(&approval.id, &topic.name, wanted).await?;
        tracing::info!(approval_id = %approval.id, topic = %topic.name, "published the approval request");
        self.record_delivery(approval, topic).await;
        Ok(())
    }

    /// Records the notification on the server (best effort: the local store is what a
    /// restarted worker goes by).
    async fn record_delivery(&self, approval: &pb::Approval, topic: &Topic) {
        let recorded = approval
            .deliveries
            .iter()
            .any(|d| d.channel == CHANNEL && d.target == topic.name);
        if recorded {
            return;
        }
        let request = pb::RecordDeliveryRequest {
            approval_id: approval.id.clone(),
            channel: CHANNEL.to_owned(),
            target: topic.name.clone(),
            message_ref: format!("{}/{}", topic.name, render::sequence_id(&approval.id)),
        };
        if let Err(error) = self.client.record_delivery(request).await {
            tracing::warn!(approval_id = %approval.id, %error, "cannot record the delivery on the server");
        }
    }

    /// The topics an approval goes to: each `ntfy` route's target (a topic), the default topic
    /// for an empty target or an approval without routes.
    fn topics_of(&self, approval: &pb::Approval) -> Vec<&Topic> {
        let mut topics: Vec<&Topic> = Vec::new();
        for target in route_targets(approval, CHANNEL) {
            let name = if target.is_empty() {
                match &self.settings.default_topic {
                    Some(name) => name.as_str(),
                    None => {
                        tracing::warn!(approval_id = %approval.id, "approval for the default ntfy topic, but none is configured");
                        continue;
                    }
                }
            } else {
                target
            };
            match self.settings.topic(name) {
                Some(topic) if !topics.iter().any(|t| t.name == name) => topics.push(topic),
                Some(_) => {}
                None => {
                    tracing::warn!(approval_id = %approval.id, "ignoring an ntfy route whose target is not a configured topic")
                }
            }
        }
        topics
    }
}
