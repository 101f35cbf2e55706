//! The gRPC edge of `AdminService`: each method converts the wire types, calls its use case in
//! [`crate::app`] (the audit trail, backups, grants, delegations, the approver registry) and
//! converts the answer back. Admin tokens only.

use std::sync::Arc;

use countersign_proto::v1 as pb;
use countersign_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use crate::app::AppError;
use crate::app::{App, EventsQuery, GrantsQuery, NewDelegation, RuleAccepted};
use crate::auth::caller_of;
use crate::convert::{
    approval_to_pb, audited_event_to_pb, delegation_to_pb, event_kind_from_pb, grant_to_pb,
    millis_of, risk_to_pb, routes_to_pb,
};
use crate::store::now_millis;

pub struct AdminApi {
    app: Arc<App>,
}

impl AdminApi {
    pub fn new(app: Arc<App>) -> Self {
        AdminApi { app }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_events(
        &self,
        request: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let kinds = request
            .kinds
            .iter()
            .map(|kind| event_kind_from_pb("kinds", *kind))
            .collect::<Result<Vec<_>, _>>()
            .map_err(AppError::from)?;
        let query = EventsQuery {
            approval_id: request.approval_id,
            kinds,
            agent_id: request.agent_id,
            decider: request.decider,
            since: request.since.as_ref().map(millis_of),
            until: request.until.as_ref().map(millis_of),
            newest_first: request.newest_first,
            page_token: request.page_token,
            page_size: request.page_size,
        };
        let (events, next_page_token) = self.app.list_events(&caller, query).await?;
        Ok(Response::new(pb::ListEventsResponse {
            events: events.iter().map(audited_event_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn verify_audit(
        &self,
        request: Request<pb::VerifyAuditRequest>,
    ) -> Result<Response<pb::VerifyAuditResponse>, Status> {
        let report = self.app.verify_audit(&*caller_of(&request)?).await?;
        let (broken_seq, problem) = report.broken.unwrap_or_default();
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
        let caller = caller_of(&request)?;
        let made = self
            .app
            .backup(&caller, &request.into_inner().file_name)
            .await?;
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
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let query = GrantsQuery {
            agent_id: request.agent_id,
            session_id: request.session_id,
            tool_name: request.tool_name,
            include_inactive: request.include_inactive,
            page_token: request.page_token,
            page_size: request.page_size,
        };
        let now = now_millis();
        let (grants, next_page_token) = self.app.list_grants(&caller, query, now).await?;
        Ok(Response::new(pb::ListGrantsResponse {
            grants: grants.iter().map(|g| grant_to_pb(g, now)).collect(),
            next_page_token,
        }))
    }

    async fn revoke_grant(
        &self,
        request: Request<pb::RevokeGrantRequest>,
    ) -> Result<Response<pb::Grant>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let now = now_millis();
        let grant = self
            .app
            .revoke_grant(&caller, &request.grant_id, &request.reason, now)
            .await?;
        Ok(Response::new(grant_to_pb(&grant, now)))
    }

    async fn record_rule_accepted(
        &self,
        request: Request<pb::RecordRuleAcceptedRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let accepted = RuleAccepted {
            approval_id: request.approval_id,
            rule_name: request.rule_name,
            rule: request.rule,
            evidence: request.evidence,
        };
        let approval = self
            .app
            .record_rule_accepted(&caller, accepted, now_millis())
            .await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn create_delegation(
        &self,
        request: Request<pb::CreateDelegationRequest>,
    ) -> Result<Response<pb::Delegation>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let asked = NewDelegation {
            delegator: request.delegator,
            delegate: request.delegate,
            until: request.until.as_ref().map(millis_of),
            reason: request.reason,
        };
        let delegation = self.app.create_delegation(&caller, asked).await?;
        Ok(Response::new(delegation_to_pb(&delegation, now_millis())))
    }

    async fn list_delegations(
        &self,
        request: Request<pb::ListDelegationsRequest>,
    ) -> Result<Response<pb::ListDelegationsResponse>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let now = now_millis();
        let delegations = self
            .app
            .list_delegations(&caller, &request.approver, request.include_inactive, now)
            .await?;
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
        let approvers = self.app.list_approvers(&*caller_of(&request)?)?;
        Ok(Response::new(pb::ListApproversResponse {
            approvers: approvers
                .iter()
                .map(|approver| pb::RegisteredApprover {
                    id: approver.id.clone(),
                    name: approver.name.clone(),
                    max_risk: risk_to_pb(approver.max_risk).into(),
                    identities: routes_to_pb(&approver.identities),
                })
                .collect(),
        }))
    }

    async fn revoke_delegation(
        &self,
        request: Request<pb::RevokeDelegationRequest>,
    ) -> Result<Response<pb::Delegation>, Status> {
        let caller = caller_of(&request)?;
        let now = now_millis();
        let delegation = self
            .app
            .revoke_delegation(&caller, &request.into_inner().delegation_id, now)
            .await?;
        Ok(Response::new(delegation_to_pb(&delegation, now)))
    }
}
