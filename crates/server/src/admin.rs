//! `AdminService`: the audit trail (history and verification), session grants and
//! delegations, online backups. Admin tokens only.

use std::path::PathBuf;
use std::sync::Arc;

use countersign_core::groups::Delegation;
use countersign_core::validate::{optional, required};
use countersign_core::Decider;
use countersign_core::Error as DomainError;
use countersign_proto::v1 as pb;
use countersign_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::backup::{self, BackupError};
use crate::convert::{
    audited_event_to_pb, delegation_to_pb, event_kind_from_pb, grant_to_pb, millis_of, risk_to_pb,
    routes_to_pb,
};
use crate::error::{status_of, status_of_backup, status_of_domain};
use crate::history::{EventFilter, GrantFilter};
use crate::security::Security;
use crate::service::paginate;
use crate::store::{now_millis, Store};

const DEFAULT_PAGE_SIZE: u32 = 100;
const MAX_PAGE_SIZE: u32 = 1000;
const MAX_ID_CHARS: usize = 128;
const MAX_REASON_CHARS: usize = 4096;

pub struct AdminApi {
    store: Store,
    security: Arc<Security>,
    /// Where `BackupDatabase` writes; None on PostgreSQL.
    backups: Option<PathBuf>,
}

impl AdminApi {
    pub fn new(store: Store, security: Arc<Security>, backups: Option<PathBuf>) -> Self {
        AdminApi {
            store,
            security,
            backups,
        }
    }

    /// The configured id of the approver `field` names: an approver id, else an approver's
    /// `cli` identity (the user name the `countersign` CLI runs as); or an error naming the
    /// field.
    fn approver_id(&self, field: &str, id: &str) -> Result<String, Status> {
        required(field, id, MAX_ID_CHARS).map_err(status_of_domain)?;
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
                status_of_domain(DomainError::invalid(
                    field,
                    format!(
                        "{id:?} is neither the id nor the cli identity of a configured approver"
                    ),
                ))
            })
    }
}

/// The page size asked for, or the default; too large is an error naming the field.
fn page_size(asked: u32) -> Result<u32, Status> {
    match asked {
        0 => Ok(DEFAULT_PAGE_SIZE),
        n if n > MAX_PAGE_SIZE => Err(status_of_domain(DomainError::invalid(
            "page_size",
            format!("must be at most {MAX_PAGE_SIZE}"),
        ))),
        n => Ok(n),
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_events(
        &self,
        request: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        Caller::of(&request)?.allow("ListEvents", &[])?;
        let request = request.into_inner();
        let page_size = page_size(request.page_size)?;
        let kinds = request
            .kinds
            .iter()
            .map(|kind| event_kind_from_pb("kinds", *kind))
            .collect::<Result<Vec<_>, _>>()
            .map_err(status_of_domain)?;
        let after_seq = match request.page_token.as_str() {
            "" => None,
            token => Some(token.parse::<i64>().map_err(|_| {
                status_of_domain(DomainError::invalid(
                    "page_token",
                    "is not a token from a previous response",
                ))
            })?),
        };
        let approvers = &self.security.approvers;
        let decider_identities = approvers
            .approver(&request.decider)
            .map(|id| approvers.identities_of(id))
            .unwrap_or_default()
            .into_iter()
            .map(|identity| format!("{}:{}", identity.channel, identity.target))
            .collect();
        let filter = EventFilter {
            approval_id: request.approval_id,
            kinds,
            agent_id: request.agent_id,
            decider: request.decider,
            decider_identities,
            since: request.since.as_ref().map(millis_of),
            until: request.until.as_ref().map(millis_of),
            newest_first: request.newest_first,
            after_seq,
            limit: page_size + 1,
        };
        let mut events = self.store.list_events(&filter).await.map_err(status_of)?;
        let next_page_token = paginate(&mut events, page_size, |e| e.event.seq.to_string());
        Ok(Response::new(pb::ListEventsResponse {
            events: events.iter().map(audited_event_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn verify_audit(
        &self,
        request: Request<pb::VerifyAuditRequest>,
    ) -> Result<Response<pb::VerifyAuditResponse>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("VerifyAudit", &[])?;
        let report = self.store.verify_audit().await.map_err(status_of)?;
        let (broken_seq, problem) = report.broken.unwrap_or_default();
        if broken_seq > 0 {
            tracing::error!(broken_seq, problem = %problem, token = %caller.name, "the audit trail does not verify");
        }
        Ok(Response::new(pb::VerifyAuditResponse {
            intact: broken_seq == 0,
            events_checked: report.events_checked,
            first_seq: report.first_seq.max(0) as u64,
            last_seq: report.last_seq.max(0) as u64,
            broken_seq: broken_seq.max(0) as u64,
            problem,
        }))
    }

    async fn backup_database(
        &self,
        request: Request<pb::BackupDatabaseRequest>,
    ) -> Result<Response<pb::BackupDatabaseResponse>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("BackupDatabase", &[])?;
        let directory = self
            .backups
            .as_deref()
            .ok_or(BackupError::Postgres)
            .map_err(status_of_backup)?;
        let into = backup::file_in(directory, &request.into_inner().file_name)
            .map_err(status_of_backup)?;
        let made = match self.store.backup(&into).await {
            Ok(made) => made,
            Err(e) => {
                tracing::error!(path = %into.display(), error = %e, token = %caller.name, "backup failed");
                return Err(status_of_backup(e));
            }
        };
        tracing::info!(
            path = %made.path.display(),
            bytes = made.bytes,
            newest_seq = made.report.last_seq,
            token = %caller.name,
            "backup written and verified"
        );
        Ok(Response::new(pb::BackupDatabaseResponse {
            path: made.path.display().to_string(),
            bytes: made.bytes,
            events_checked: made.report.events_checked,
            first_seq: made.report.first_seq.max(0) as u64,
            newest_seq: made.report.last_seq.max(0) as u64,
        }))
    }

    async fn list_grants(
        &self,
        request: Request<pb::ListGrantsRequest>,
    ) -> Result<Response<pb::ListGrantsResponse>, Status> {
        Caller::of(&request)?.allow("ListGrants", &[])?;
        let request = request.into_inner();
        let page_size = page_size(request.page_size)?;
        let filter = GrantFilter {
            agent_id: request.agent_id,
            session_id: request.session_id,
            tool_name: request.tool_name,
            include_inactive: request.include_inactive,
            before_id: request.page_token,
            limit: page_size + 1,
        };
        let now = now_millis();
        let mut grants = self
            .store
            .list_grants(&filter, now)
            .await
            .map_err(status_of)?;
        let next_page_token = paginate(&mut grants, page_size, |g| g.id.clone());
        Ok(Response::new(pb::ListGrantsResponse {
            grants: grants.iter().map(|g| grant_to_pb(g, now)).collect(),
            next_page_token,
        }))
    }

    async fn revoke_grant(
        &self,
        request: Request<pb::RevokeGrantRequest>,
    ) -> Result<Response<pb::Grant>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("RevokeGrant", &[])?;
        let request = request.into_inner();
        required("grant_id", &request.grant_id, MAX_ID_CHARS).map_err(status_of_domain)?;
        optional("reason", &request.reason, MAX_REASON_CHARS).map_err(status_of_domain)?;
        let now = now_millis();
        let grant = self
            .store
            .revoke_grant(&request.grant_id, &caller.name, &request.reason, now)
            .await
            .map_err(status_of)?;
        tracing::info!(grant_id = %grant.id, token = %caller.name, "grant revoked");
        Ok(Response::new(grant_to_pb(&grant, now)))
    }

    async fn create_delegation(
        &self,
        request: Request<pb::CreateDelegationRequest>,
    ) -> Result<Response<pb::Delegation>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("CreateDelegation", &[])?;
        let request = request.into_inner();
        let delegator = self.approver_id("delegator", &request.delegator)?;
        let delegate = self.approver_id("delegate", &request.delegate)?;
        if delegator == delegate {
            return Err(status_of_domain(DomainError::invalid(
                "delegate",
                "is the delegator: an approver cannot delegate to themself",
            )));
        }
        optional("reason", &request.reason, MAX_REASON_CHARS).map_err(status_of_domain)?;
        let now = now_millis();
        let until = request
            .until
            .as_ref()
            .map(millis_of)
            .ok_or_else(|| status_of_domain(DomainError::invalid("until", "is required")))?;
        if until <= now {
            return Err(status_of_domain(DomainError::invalid(
                "until",
                "is in the past; a delegation must end in the future",
            )));
        }
        let delegation = Delegation {
            id: uuid::Uuid::now_v7().to_string(),
            delegator,
            delegate,
            created_at: now,
            until,
            revoked_at: None,
            reason: request.reason,
            created_by: caller.name.clone(),
        };
        let delegation = self
            .store
            .create_delegation(delegation, now)
            .await
            .map_err(status_of)?;
        tracing::info!(
            delegation_id = %delegation.id,
            delegator = %delegation.delegator,
            delegate = %delegation.delegate,
            until = delegation.until,
            token = %caller.name,
            "delegation created"
        );
        Ok(Response::new(delegation_to_pb(&delegation, now)))
    }

    async fn list_delegations(
        &self,
        request: Request<pb::ListDelegationsRequest>,
    ) -> Result<Response<pb::ListDelegationsResponse>, Status> {
        Caller::of(&request)?.allow("ListDelegations", &[])?;
        let request = request.into_inner();
        let approver = match request.approver.as_str() {
            "" => String::new(),
            id => self.approver_id("approver", id)?,
        };
        let now = now_millis();
        let delegations = self
            .store
            .list_delegations(&approver, request.include_inactive, now)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ListDelegationsResponse {
            delegations: delegations
                .iter()
                .map(|d| delegation_to_pb(d, now))
                .collect(),
        }))
    }

    async fn list_approvers(
        &self,
        request: Request<pb::ListApproversRequest>,
    ) -> Result<Response<pb::ListApproversResponse>, Status> {
        Caller::of(&request)?.allow("ListApprovers", &[])?;
        let approvers = self
            .security
            .approvers
            .summaries()
            .map(|(id, name, max_risk)| pb::RegisteredApprover {
                id: id.to_owned(),
                name: name.to_owned(),
                max_risk: risk_to_pb(max_risk).into(),
                identities: routes_to_pb(&self.security.approvers.identities_of(id)),
            })
            .collect();
        Ok(Response::new(pb::ListApproversResponse { approvers }))
    }

    async fn revoke_delegation(
        &self,
        request: Request<pb::RevokeDelegationRequest>,
    ) -> Result<Response<pb::Delegation>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("RevokeDelegation", &[])?;
        let request = request.into_inner();
        required("delegation_id", &request.delegation_id, MAX_ID_CHARS)
            .map_err(status_of_domain)?;
        let now = now_millis();
        let delegation = self
            .store
            .revoke_delegation(&request.delegation_id, now)
            .await
            .map_err(status_of)?;
        tracing::info!(delegation_id = %delegation.id, token = %caller.name, "delegation revoked");
        Ok(Response::new(delegation_to_pb(&delegation, now)))
    }
}
