//! GetApproval, WaitForDecision (a long-poll woken by committed events) and ListApprovals.

use std::time::Duration;

use countersign_core::fields::validate_channel;
use countersign_core::{Approval, Error as DomainError, State};
use tokio::sync::broadcast;

use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Role;
use crate::store::ListFilter;

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;

/// A page of approvals asked for: filters as given (an empty one filters nothing), the
/// token of the previous page, the page size (0: the default).
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub states: Vec<State>,
    pub agent_id: String,
    pub channel: String,
    pub session_id: String,
    pub tool_name: String,
    pub page_token: String,
    pub page_size: u32,
}

impl App {
    pub async fn get(&self, caller: &Caller, approval_id: &str) -> Result<Approval, AppError> {
        caller.allow("GetApproval", &[Role::Agent, Role::Worker])?;
        self.readable(caller, approval_id).await
    }

    /// The approval once it is no longer pending, or as it is when `timeout_ms` (0: the
    /// server's maximum wait, which also caps it) passed or the server shuts down. While it
    /// waits on an approval to withdraw when its caller leaves, the call counts as its
    /// caller's (see `callers.rs`).
    pub async fn wait(
        &self,
        caller: &Caller,
        approval_id: &str,
        timeout_ms: u32,
    ) -> Result<Approval, AppError> {
        caller.allow("WaitForDecision", &[Role::Agent])?;
        let max_wait = Duration::from_secs(u64::from(self.config.approvals.max_wait_seconds));
        let timeout = match timeout_ms {
            0 => max_wait,
            ms => Duration::from_millis(u64::from(ms)).min(max_wait),
        };
        // Subscribed before the read: a resolution committed in between is not missed.
        let mut live = self.hub.subscribe();
        let mut shutdown = self.shutdown.clone();
        let approval = self.readable(caller, approval_id).await?;
        if !approval.is_pending() {
            return Ok(approval);
        }
        let open_wait = approval
            .withdraw_when_caller_leaves
            .then(|| self.callers.wait_opened(approval_id));
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let waited = loop {
            tokio::select! {
                _ = &mut deadline => break self.load(approval_id).await,
                _ = shutdown.changed() => break self.load(approval_id).await,
                received = live.recv() => match received {
                    Ok(event) if event.approval.id == approval_id && !event.approval.is_pending() => {
                        break Ok(event.approval.clone());
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let approval = self.load(approval_id).await?;
                        if !approval.is_pending() {
                            break Ok(approval);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break self.load(approval_id).await,
                },
            }
        };
        if let (Some(open_wait), Ok(approval)) = (open_wait, &waited) {
            open_wait.answered(!approval.is_pending());
        }
        waited
    }

    /// A page of the approvals the caller may see, newest first, and the token of the next
    /// page (empty on the last).
    pub async fn list(
        &self,
        caller: &Caller,
        query: ListQuery,
    ) -> Result<(Vec<Approval>, String), AppError> {
        caller.allow("ListApprovals", &[Role::Agent, Role::Worker])?;
        let agent_id = caller.agent_filter(query.agent_id)?;
        let channel = caller.channel_filter(query.channel)?;
        if query.page_size > MAX_PAGE_SIZE {
            return Err(DomainError::invalid(
                "page_size",
                format!("must be at most {MAX_PAGE_SIZE}"),
            )
            .into());
        }
        if !channel.is_empty() {
            validate_channel("channel", &channel)?;
        }
        let page_size = match query.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n,
        };
        let filter = ListFilter {
            states: query.states,
            agent_id,
            channel,
            session_id: query.session_id,
            tool_name: query.tool_name,
            before_id: query.page_token,
            limit: page_size + 1,
        };
        let mut approvals = self.store.list(&filter).await?;
        let next_page_token = paginate(&mut approvals, page_size, |a| a.id.clone());
        Ok((approvals, next_page_token))
    }
}

/// Keeps the first `page_size` of `items` (fetched one more than a page); when there were more,
/// the token to continue with is derived from the last item kept, else it is empty.
pub(crate) fn paginate<T>(
    items: &mut Vec<T>,
    page_size: u32,
    token: impl Fn(&T) -> String,
) -> String {
    if items.len() > page_size as usize {
        items.truncate(page_size as usize);
        items.last().map(token).unwrap_or_default()
    } else {
        String::new()
    }
}
