//! CancelApproval, Consume and RecordDelivery: the changes to an approval that are not
//! decisions.

use countersign_core::fields::{optional, required, validate_channel};
use countersign_core::validate::validate_digest;
use countersign_core::{Approval, ConsumeOutcome, Delivery};

use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Role;
use crate::store::now_millis;

const MAX_TEXT_CHARS: usize = 4096;
const MAX_TARGET_CHARS: usize = 256;
const MAX_MESSAGE_REF_CHARS: usize = 512;

/// A runtime's report that it ran an approved call (`args_digest`: the version it ran,
/// empty when it does not say).
#[derive(Debug, Clone)]
pub struct ConsumeInput {
    pub approval_id: String,
    pub outcome: ConsumeOutcome,
    pub detail: String,
    pub args_digest: String,
}

/// The platform message a worker created for an approval.
#[derive(Debug, Clone)]
pub struct DeliveryInput {
    pub approval_id: String,
    pub channel: String,
    pub target: String,
    pub message_ref: String,
}

impl App {
    pub async fn cancel(
        &self,
        caller: &Caller,
        approval_id: &str,
        reason: &str,
    ) -> Result<Approval, AppError> {
        caller.allow("CancelApproval", &[Role::Agent])?;
        super::shared::approval_id_of(approval_id)?;
        optional("reason", reason, MAX_TEXT_CHARS)?;
        self.check_readable(caller, approval_id).await?;
        Ok(self.store.cancel(approval_id, reason, now_millis()).await?)
    }

    /// Marks an approved call as run, once, and only the version that was approved.
    pub async fn consume(
        &self,
        caller: &Caller,
        input: ConsumeInput,
    ) -> Result<Approval, AppError> {
        caller.allow("Consume", &[Role::Agent])?;
        super::shared::approval_id_of(&input.approval_id)?;
        optional("detail", &input.detail, MAX_TEXT_CHARS)?;
        validate_digest("args_digest", &input.args_digest)?;
        // Read whatever the role: an approval that disagrees with its trail is never consumed.
        let approval = self.readable(caller, &input.approval_id).await?;
        approval.check_ran(&input.args_digest)?;
        Ok(self
            .store
            .consume(
                &input.approval_id,
                input.outcome,
                &input.detail,
                now_millis(),
            )
            .await?)
    }

    /// Stores the platform message a worker created, so that a restarted worker edits it
    /// instead of sending another.
    pub async fn record_delivery(
        &self,
        caller: &Caller,
        input: DeliveryInput,
    ) -> Result<Approval, AppError> {
        caller.allow("RecordDelivery", &[Role::Worker])?;
        super::shared::approval_id_of(&input.approval_id)?;
        validate_channel("channel", &input.channel)?;
        optional("target", &input.target, MAX_TARGET_CHARS)?;
        required("message_ref", &input.message_ref, MAX_MESSAGE_REF_CHARS)?;
        caller.for_channel(&input.channel)?;
        if caller.role == Role::Worker {
            let current = self.store.get(&input.approval_id).await?;
            caller.routed_to(&input.channel, &current)?;
        }
        let now = now_millis();
        let delivery = Delivery {
            channel: input.channel,
            target: input.target,
            message_ref: input.message_ref,
            recorded_at: now,
        };
        Ok(self
            .store
            .record_delivery(&input.approval_id, delivery, now)
            .await?)
    }
}
