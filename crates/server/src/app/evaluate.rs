//! Evaluate: what the policy would do with a tool call, without asking anybody or storing
//! anything (the AuthZEN front door, `crate::standards`). The same rights, validation and
//! rules as RequestApproval; session grants are not consulted (they belong to approvals).

use countersign_core::validate::{validate_request, RequestInput};
use countersign_core::{ApprovalRequest, Disposition};

use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::{PolicyMode, Role};

/// The policy's answer: how an approval of `request` would start, and the request as the
/// rules shape it (its risk raised by `classify` rules, the rule that matched).
pub(crate) struct Evaluation {
    pub disposition: Disposition,
    pub request: ApprovalRequest,
}

impl App {
    pub async fn evaluate(
        &self,
        caller: &Caller,
        input: RequestInput,
    ) -> Result<Evaluation, AppError> {
        caller.allow("Evaluate", &[Role::Agent])?;
        caller.for_agent(&input.agent_id)?;
        let request = validate_request(input, &self.limits)?;
        let (request, disposition) = match self.config.policy.mode {
            PolicyMode::Enforce => self.security.policy.apply(request),
            // Observed rules decide nothing: every call is asked.
            PolicyMode::Observe => (request, Disposition::RequireHuman),
        };
        Ok(Evaluation {
            disposition,
            request,
        })
    }
}
