//! RequestApproval: the caller's rights and rates, validation, policy (which may resolve the
//! call at once), the groups that decide, and the store's idempotent insert.

use countersign_core::validate::{validate_request, RequestInput};
use countersign_core::Disposition;

use super::observe::observe;
use super::rates::check_rate;
use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::PolicyMode;
use crate::config::Role;
use crate::store::{now_millis, Requested};

impl App {
    /// Creates an approval, or finds the one with the same `(agent_id, idempotency_key)`.
    pub async fn request(
        &self,
        caller: &Caller,
        input: RequestInput,
    ) -> Result<Requested, AppError> {
        caller.allow("RequestApproval", &[Role::Agent])?;
        caller.for_agent(&input.agent_id)?;
        check_rate(
            &self.store,
            &self.rates.requests_per_token,
            &caller.name,
            &format!("token {:?}", caller.name),
            "requests_per_minute_per_token",
        )
        .await?;
        let request = validate_request(input, &self.limits)?;
        let (mut request, disposition) = match self.config.policy.mode {
            PolicyMode::Enforce => self.security.policy.apply(request),
            PolicyMode::Observe => observe(&self.security.policy, request),
        };
        // The per-agent limit guards people's attention: a call a rule allows or denies asks
        // nobody, so only the calls left to a human count (the per-token limit above still
        // bounds everything a caller sends).
        if matches!(disposition, Disposition::RequireHuman) {
            check_rate(
                &self.store,
                &self.rates.requests_per_agent,
                &request.agent_id,
                &format!("agent {:?}", request.agent_id),
                "requests_per_minute",
            )
            .await?;
        }
        self.security.groups.resolve(&mut request)?;
        let ttl = request
            .ttl_seconds
            .unwrap_or(self.config.approvals.default_ttl_seconds);
        let requested = self
            .store
            .request(
                request,
                ttl,
                disposition,
                self.config.limits.max_pending_per_agent,
                now_millis(),
            )
            .await?;
        if requested.approval.withdraw_when_caller_leaves && requested.approval.is_pending() {
            self.callers.requested(&requested.approval.id);
        }
        if requested.created {
            tracing::info!(
                approval_id = %requested.approval.id,
                agent_id = %requested.approval.agent_id,
                tool = %requested.approval.tool_name,
                args_digest = %requested.approval.args_digest,
                rule = requested.approval.policy_rule.as_deref().unwrap_or_default(),
                state = requested.approval.state.as_str(),
                token = %caller.name,
                "approval requested"
            );
        }
        Ok(requested)
    }
}
