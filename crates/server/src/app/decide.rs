//! Decide: validation, the caller's channel and rates, the approval as read, delegations,
//! policy again on edited arguments, the approver's authorisation, the store's
//! first-resolution-wins write — and every refusal on the audit trail.

use countersign_core::groups::Delegation;
use countersign_core::validate::{validate_arguments, validate_decider, validate_digest};
use countersign_core::{
    Approval, DecideOutcome, Decider, Decision, EditedVersion, Error as DomainError, Millis, Scope,
    Verdict,
};

use super::passkeys::PasskeyAssertion;
use super::rates::check_rate;
use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Role;
use crate::store::now_millis;

/// A decision as a worker (or an admin) sends it.
#[derive(Debug, Clone)]
pub struct DecideInput {
    pub approval_id: String,
    pub verdict: Verdict,
    pub scope: Scope,
    pub decider: Decider,
    pub reason: String,
    pub idempotency_key: String,
    /// The version the decider saw; empty: none named.
    pub expected_args_digest: String,
    /// An approval with edits: the arguments to run instead; empty: none.
    pub edited_arguments_json: String,
    /// Passkey step-up: the decider's passkey assertion for this approval.
    pub passkey: Option<PasskeyAssertion>,
}

impl App {
    /// Records a decision (the first resolution wins); an approval no longer pending is not an
    /// error: the outcome says `AlreadyResolved` and carries it.
    pub async fn decide(
        &self,
        caller: &Caller,
        input: DecideInput,
    ) -> Result<(DecideOutcome, Approval), AppError> {
        caller.allow("Decide", &[Role::Worker])?;
        super::shared::approval_id_of(&input.approval_id)?;
        let DecideInput {
            approval_id,
            verdict,
            scope,
            decider,
            reason,
            idempotency_key,
            expected_args_digest,
            edited_arguments_json,
            passkey,
        } = input;
        validate_decider(&decider, &reason, &idempotency_key)?;
        validate_digest("expected_args_digest", &expected_args_digest)?;
        let edited_digest = if edited_arguments_json.is_empty() {
            None
        } else if verdict != Verdict::Approve {
            return Err(DomainError::invalid(
                "edited_arguments_json",
                "edited arguments go with VERDICT_APPROVE only; a rejection has nothing to edit",
            )
            .into());
        } else {
            Some(validate_arguments(
                "edited_arguments_json",
                &edited_arguments_json,
                &self.limits,
            )?)
        };
        caller.for_channel(&decider.channel)?;
        self.check_decision_rates(caller, &decider).await?;
        let current = self.load(&approval_id).await?;
        caller.routed_to(&decider.channel, &current)?;
        let now = now_millis();
        let decision = Decision {
            verdict,
            scope,
            reason,
            approver: String::new(),
            decider,
            idempotency_key,
            decided_at: now,
            // The version the decider saw. An edit that names none is made on the version read
            // here, which its authorization below is checked against: the store refuses it
            // when the approval was edited meanwhile.
            args_digest: if expected_args_digest.is_empty() && edited_digest.is_some() {
                current.current_digest().to_owned()
            } else {
                expected_args_digest
            },
            edited_arguments_json: String::new(),
            restarts_count: false,
            delegate: None,
            step_up: None,
        };
        let delegations = self.delegations_to(&decision.decider, now).await?;
        // Policy on the edited arguments: a deny rule refuses the edit, a higher risk or
        // quorum applies to it.
        let edit: Option<EditedVersion> = match edited_digest {
            None => None,
            Some(digest) => {
                match self
                    .security
                    .policy
                    .reevaluate(&current, edited_arguments_json, digest)
                {
                    Ok(version) => Some(version),
                    Err(refusal) => {
                        return Err(self.refuse(caller, &current, decision, refusal, now).await)
                    }
                }
            }
        };
        // Checked against the approval as read (with the edit applied): its risk, requester and
        // separation-of-duties setting change only by an edit, and the store refuses the
        // decision when the approval was edited meanwhile.
        let checked = match &edit {
            Some(version) => current.with_edit(version, &decision.decider, now),
            None => current.clone(),
        };
        let authorized =
            self.security
                .approvers
                .authorize(&decision.decider, verdict, &checked, &delegations);
        let decision = match authorized {
            Ok(authorized) => Decision {
                approver: authorized.approver,
                delegate: authorized.delegate,
                ..decision
            },
            Err(refusal) => {
                return Err(self.refuse(caller, &current, decision, refusal, now).await)
            }
        };
        // Step-up: approving needs the second factor, verified here (rejecting does not).
        let decision = if verdict == Verdict::Approve && current.step_up.is_some() {
            let proved = self
                .step_up(&current, &decision, passkey.as_ref(), edit.is_some(), now)
                .await?;
            match proved {
                Ok(proof) => Decision {
                    step_up: Some(proof),
                    ..decision
                },
                Err(refusal) => {
                    return Err(self.refuse(caller, &current, decision, refusal, now).await)
                }
            }
        } else {
            decision
        };
        let (outcome, approval) = self
            .store
            .decide(
                &approval_id,
                decision,
                edit,
                self.config.grants.ttl_seconds,
                now,
            )
            .await?;
        tracing::info!(
            approval_id = %approval.id,
            outcome = ?outcome,
            state = approval.state.as_str(),
            args_digest = %approval.current_digest(),
            edited = approval.edit.is_some(),
            token = %caller.name,
            "decision"
        );
        Ok((outcome, approval))
    }

    /// One decision from the caller's token and one from the decider, or a refusal.
    async fn check_decision_rates(
        &self,
        caller: &Caller,
        decider: &Decider,
    ) -> Result<(), AppError> {
        check_rate(
            &self.store,
            &self.rates.decisions_per_token,
            &caller.name,
            &format!("token {:?}", caller.name),
            "decisions_per_minute_per_token",
        )
        .await?;
        let decider_key = format!(
            "{}:{}",
            decider.channel,
            countersign_core::fields::identity_key(&decider.user_id)
        );
        check_rate(
            &self.store,
            &self.rates.decisions_per_decider,
            &decider_key,
            &format!("decider {decider_key:?}"),
            "decisions_per_minute",
        )
        .await
    }

    /// Puts a refused decision on the audit trail (the approval stays as it is) and returns
    /// the refusal for the caller.
    async fn refuse(
        &self,
        caller: &Caller,
        current: &Approval,
        decision: Decision,
        refusal: DomainError,
        now: Millis,
    ) -> AppError {
        let why = refusal.to_string();
        tracing::warn!(
            approval_id = %current.id,
            decider = %decision.decider.identity(),
            token = %caller.name,
            why = %why,
            "decision refused"
        );
        match self
            .store
            .refuse_decision(&current.id, decision, &why, now)
            .await
        {
            Ok(_) => refusal.into(),
            Err(e) => e.into(),
        }
    }

    /// The active delegations to the registered approver `decider` is (none for a stranger).
    async fn delegations_to(
        &self,
        decider: &Decider,
        now: Millis,
    ) -> Result<Vec<Delegation>, AppError> {
        let Some(id) = self.security.approvers.identify(decider) else {
            return Ok(Vec::new());
        };
        let mut delegations = self.store.list_delegations(id, false, now).await?;
        delegations.retain(|d| d.delegate == id && d.is_active(now));
        Ok(delegations)
    }
}
