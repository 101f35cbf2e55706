//! The admin use cases: the audit trail (history and verification), online backups, session
//! grants, delegations and the approver registry. Admin tokens only.

use countersign_core::fields::{optional, required};
use countersign_core::groups::Delegation;
use countersign_core::{Approval, Decider, Error as DomainError, EventKind, Millis, Risk, Route};

use super::reads::paginate;
use super::shared::App;
use crate::app::AppError;
use crate::audit::AuditReport;
use crate::caller::Caller;
use crate::store::backup::{self, Backup, BackupError};
use crate::store::{now_millis, Grant};
use crate::store::{AuditedEvent, EventFilter, GrantFilter};

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
const MAX_ID_CHARS: usize = 128;
const MAX_REASON_CHARS: usize = 4096;

/// A page of the audit trail asked for (empty filters filter nothing).
#[derive(Debug, Clone, Default)]
pub struct EventsQuery {
    pub approval_id: String,
    pub kinds: Vec<EventKind>,
    pub agent_id: String,
    /// A decider identity `channel:user_id` or a registered approver's id.
    pub decider: String,
    pub since: Option<Millis>,
    pub until: Option<Millis>,
    pub newest_first: bool,
    pub page_token: String,
    pub page_size: u32,
}

/// A page of session grants asked for.
#[derive(Debug, Clone, Default)]
pub struct GrantsQuery {
    pub agent_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub include_inactive: bool,
    pub page_token: String,
    pub page_size: u32,
}

/// A delegation asked for: `delegator` and `delegate` name approvers (by id or `cli`
/// identity); `until` is required and in the future.
#[derive(Debug, Clone)]
pub struct NewDelegation {
    pub delegator: String,
    pub delegate: String,
    pub until: Option<Millis>,
    pub reason: String,
}

/// A suggested rule an operator accepted (`RecordRuleAccepted`).
#[derive(Debug, Clone)]
pub struct RuleAccepted {
    /// The newest approval of the rule's evidence.
    pub approval_id: String,
    pub rule_name: String,
    /// The rule as written to the config file.
    pub rule: String,
    pub evidence: String,
}

/// A registered approver as operators see it.
#[derive(Debug, Clone)]
pub struct ApproverSummary {
    pub id: String,
    pub name: String,
    pub max_risk: Risk,
    pub identities: Vec<Route>,
}

impl App {
    /// A page of the audit trail and the token of the next page (empty on the last).
    pub async fn list_events(
        &self,
        caller: &Caller,
        query: EventsQuery,
    ) -> Result<(Vec<AuditedEvent>, String), AppError> {
        caller.allow("ListEvents", &[])?;
        let page_size = page_size(query.page_size)?;
        let after_seq = match query.page_token.as_str() {
            "" => None,
            token => Some(token.parse::<i64>().map_err(|_| {
                DomainError::invalid("page_token", "is not a token from a previous response")
            })?),
        };
        let approvers = &self.security.approvers;
        let decider_identities = approvers
            .approver(&query.decider)
            .map(|id| approvers.identities_of(id))
            .unwrap_or_default()
            .into_iter()
            .map(|identity| format!("{}:{}", identity.channel, identity.target))
            .collect();
        let filter = EventFilter {
            approval_id: query.approval_id,
            kinds: query.kinds,
            agent_id: query.agent_id,
            decider: query.decider,
            decider_identities,
            since: query.since,
            until: query.until,
            newest_first: query.newest_first,
            after_seq,
            limit: page_size + 1,
        };
        let mut events = self.store.list_events(&filter).await?;
        let next_page_token = paginate(&mut events, page_size, |e| e.event.seq.to_string());
        Ok((events, next_page_token))
    }

    pub async fn verify_audit(&self, caller: &Caller) -> Result<AuditReport, AppError> {
        caller.allow("VerifyAudit", &[])?;
        let report = self.store.verify_audit().await?;
        if let Some((broken_seq, problem)) = &report.broken {
            tracing::error!(broken_seq, problem = %problem, token = %caller.name, "the audit trail does not verify");
        }
        Ok(report)
    }

    /// An online copy of the database as `file_name` in the backup directory, verified.
    pub async fn backup(&self, caller: &Caller, file_name: &str) -> Result<Backup, AppError> {
        caller.allow("BackupDatabase", &[])?;
        let directory = self.backups.as_deref().ok_or(BackupError::Postgres)?;
        let into = backup::file_in(directory, file_name)?;
        let made = match self.store.backup(&into).await {
            Ok(made) => made,
            Err(e) => {
                tracing::error!(path = %into.display(), error = %e, token = %caller.name, "backup failed");
                return Err(e.into());
            }
        };
        tracing::info!(
            path = %made.path.display(),
            bytes = made.bytes,
            newest_seq = made.report.last_seq,
            token = %caller.name,
            "backup written and verified"
        );
        Ok(made)
    }

    /// A page of session grants as of `now`, and the token of the next page.
    pub async fn list_grants(
        &self,
        caller: &Caller,
        query: GrantsQuery,
        now: Millis,
    ) -> Result<(Vec<Grant>, String), AppError> {
        caller.allow("ListGrants", &[])?;
        let page_size = page_size(query.page_size)?;
        let filter = GrantFilter {
            agent_id: query.agent_id,
            session_id: query.session_id,
            tool_name: query.tool_name,
            include_inactive: query.include_inactive,
            before_id: query.page_token,
            limit: page_size + 1,
        };
        let mut grants = self.store.list_grants(&filter, now).await?;
        let next_page_token = paginate(&mut grants, page_size, |g| g.id.clone());
        Ok((grants, next_page_token))
    }

    pub async fn revoke_grant(
        &self,
        caller: &Caller,
        grant_id: &str,
        reason: &str,
        now: Millis,
    ) -> Result<Grant, AppError> {
        caller.allow("RevokeGrant", &[])?;
        required("grant_id", grant_id, MAX_ID_CHARS)?;
        optional("reason", reason, MAX_REASON_CHARS)?;
        let grant = self
            .store
            .revoke_grant(grant_id, &caller.name, reason, now)
            .await?;
        tracing::info!(grant_id = %grant.id, token = %caller.name, "grant revoked");
        Ok(grant)
    }

    /// Records on the audit trail that the caller accepted the suggested rule `rule_name`
    /// (`rule`, its TOML) on `evidence`, as a RULE_ACCEPTED event on `approval_id`, the
    /// newest approval of that evidence.
    pub async fn record_rule_accepted(
        &self,
        caller: &Caller,
        accepted: RuleAccepted,
        now: Millis,
    ) -> Result<Approval, AppError> {
        caller.allow("RecordRuleAccepted", &[])?;
        required("approval_id", &accepted.approval_id, MAX_ID_CHARS)?;
        required("rule_name", &accepted.rule_name, MAX_ID_CHARS)?;
        required("rule", &accepted.rule, MAX_REASON_CHARS)?;
        optional("evidence", &accepted.evidence, MAX_REASON_CHARS)?;
        let mut detail = format!(
            "rule {:?} accepted by {} from the approvals it was suggested from",
            accepted.rule_name, caller.name
        );
        if !accepted.evidence.is_empty() {
            detail.push_str(": ");
            detail.push_str(&accepted.evidence);
        }
        detail.push('\n');
        detail.push_str(&accepted.rule);
        let approval = self
            .store
            .record_rule_accepted(&accepted.approval_id, &detail, now)
            .await?;
        tracing::info!(approval_id = %approval.id, rule = %accepted.rule_name, token = %caller.name, "suggested rule accepted");
        Ok(approval)
    }

    pub async fn create_delegation(
        &self,
        caller: &Caller,
        asked: NewDelegation,
    ) -> Result<Delegation, AppError> {
        caller.allow("CreateDelegation", &[])?;
        let delegator = self.approver_id("delegator", &asked.delegator)?;
        let delegate = self.approver_id("delegate", &asked.delegate)?;
        if delegator == delegate {
            return Err(DomainError::invalid(
                "delegate",
                "is the delegator: an approver cannot delegate to themself",
            )
            .into());
        }
        optional("reason", &asked.reason, MAX_REASON_CHARS)?;
        let now = now_millis();
        let until = asked
            .until
            .ok_or_else(|| DomainError::invalid("until", "is required"))?;
        if until <= now {
            return Err(DomainError::invalid(
                "until",
                "is in the past; a delegation must end in the future",
            )
            .into());
        }
        let delegation = Delegation {
            id: uuid::Uuid::now_v7().to_string(),
            delegator,
            delegate,
            created_at: now,
            until,
            revoked_at: None,
            reason: asked.reason,
            created_by: caller.name.clone(),
        };
        let delegation = self.store.create_delegation(delegation, now).await?;
        tracing::info!(
            delegation_id = %delegation.id,
            delegator = %delegation.delegator,
            delegate = %delegation.delegate,
            until = delegation.until,
            token = %caller.name,
            "delegation created"
        );
        Ok(delegation)
    }

    /// The delegations from or to `approver` (empty: all), as of `now`.
    pub async fn list_delegations(
        &self,
        caller: &Caller,
        approver: &str,
        include_inactive: bool,
        now: Millis,
    ) -> Result<Vec<Delegation>, AppError> {
        caller.allow("ListDelegations", &[])?;
        let approver = match approver {
            "" => String::new(),
            id => self.approver_id("approver", id)?,
        };
        Ok(self
            .store
            .list_delegations(&approver, include_inactive, now)
            .await?)
    }

    pub async fn revoke_delegation(
        &self,
        caller: &Caller,
        delegation_id: &str,
        now: Millis,
    ) -> Result<Delegation, AppError> {
        caller.allow("RevokeDelegation", &[])?;
        required("delegation_id", delegation_id, MAX_ID_CHARS)?;
        let delegation = self.store.revoke_delegation(delegation_id, now).await?;
        tracing::info!(delegation_id = %delegation.id, token = %caller.name, "delegation revoked");
        Ok(delegation)
    }

    pub fn list_approvers(&self, caller: &Caller) -> Result<Vec<ApproverSummary>, AppError> {
        caller.allow("ListApprovers", &[])?;
        let approvers = &self.security.approvers;
        Ok(approvers
            .summaries()
            .map(|(id, name, max_risk)| ApproverSummary {
                id: id.to_owned(),
                name: name.to_owned(),
                max_risk,
                identities: approvers.identities_of(id),
            })
            .collect())
    }

    /// The configured id of the approver `field` names: an approver id, else an approver's
    /// `cli` identity (the user name the `countersign` CLI runs as); or an error naming the
    /// field.
    fn approver_id(&self, field: &str, id: &str) -> Result<String, AppError> {
        required(field, id, MAX_ID_CHARS)?;
        let approvers = &self.security.approvers;
        let cli_user = Decider {
            channel: "cli".into(),
            user_id: id.to_owned(),
            display_name: String::new(),
        };
        approvers
            .approver(id)
            .or_else(|| approvers.identify(&cli_user))
            .map(str::to_string)
            .ok_or_else(|| {
                DomainError::invalid(
                    field,
                    format!(
                        "{id:?} is neither the id nor the cli identity of a configured approver"
                    ),
                )
                .into()
            })
    }
}

/// The page size asked for, or the default; too large is an error naming the field.
fn page_size(asked: u32) -> Result<u32, AppError> {
    match asked {
        0 => Ok(DEFAULT_PAGE_SIZE),
        n if n > MAX_PAGE_SIZE => Err(DomainError::invalid(
            "page_size",
            format!("must be at most {MAX_PAGE_SIZE}"),
        )
        .into()),
        n => Ok(n),
    }
}
