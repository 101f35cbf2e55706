//! The gRPC edge of the approval service: each method takes the caller the authenticator put
//! on the request, converts the wire types, calls its use case in [`crate::app`] and converts
//! the answer back; errors become statuses once, through `From<AppError> for Status`.

use std::sync::Arc;

use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_server::ApprovalService;
use tonic::{Request, Response, Status};

use crate::app::AppError;
use crate::app::{
    App, ConsumeInput, DecideInput, DeliveryInput, ListQuery, NewPasskey, PasskeyAssertion,
};
use crate::auth::caller_of;
use crate::convert::{
    approval_to_pb, consume_outcome_from_pb, decide_outcome_to_pb, decider_from_pb,
    request_from_pb, scope_from_pb, state_from_pb, verdict_from_pb,
};
use crate::receipts::ReceiptKeys;
use crate::watch::WatchStream;

pub struct ApprovalApi {
    app: Arc<App>,
    keys: Arc<ReceiptKeys>,
}

impl ApprovalApi {
    pub fn new(app: Arc<App>, keys: Arc<ReceiptKeys>) -> Self {
        ApprovalApi { app, keys }
    }
}

/// A domain conversion's refusal as a status.
fn invalid(error: countersign_core::Error) -> Status {
    AppError::from(error).into()
}

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn request_approval(
        &self,
        request: Request<pb::RequestApprovalRequest>,
    ) -> Result<Response<pb::RequestApprovalResponse>, Status> {
        let caller = caller_of(&request)?;
        let input = request_from_pb(request.into_inner()).map_err(invalid)?;
        let requested = self.app.request(&caller, input).await?;
        Ok(Response::new(pb::RequestApprovalResponse {
            approval: Some(approval_to_pb(&requested.approval)),
            created: requested.created,
        }))
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let approval = self
            .app
            .get(&caller, &request.get_ref().approval_id)
            .await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn wait_for_decision(
        &self,
        request: Request<pb::WaitForDecisionRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let approval = self
            .app
            .wait(&caller, &request.approval_id, request.timeout_ms)
            .await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let states = request
            .states
            .iter()
            .map(|s| state_from_pb("states", *s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let query = ListQuery {
            states,
            agent_id: request.agent_id,
            channel: request.channel,
            session_id: request.session_id,
            tool_name: request.tool_name,
            page_token: request.page_token,
            page_size: request.page_size,
        };
        let (approvals, next_page_token) = self.app.list(&caller, query).await?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: approvals.iter().map(approval_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn cancel_approval(
        &self,
        request: Request<pb::CancelApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let approval = self
            .app
            .cancel(&caller, &request.approval_id, &request.reason)
            .await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn consume(
        &self,
        request: Request<pb::ConsumeRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let input = ConsumeInput {
            outcome: consume_outcome_from_pb(request.outcome).map_err(invalid)?,
            approval_id: request.approval_id,
            detail: request.detail,
            args_digest: request.args_digest,
        };
        let approval = self.app.consume(&caller, input).await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    type WatchApprovalsStream = WatchStream;

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let watch = self
            .app
            .watch(
                &caller,
                request.channel,
                request.after_seq,
                request.history_id,
                request.include_snapshot,
            )
            .await?;
        let stream = crate::watch::stream(watch);
        Ok(Response::new(stream))
    }

    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let caller = caller_of(&request)?;
        self.decided(&caller, request.into_inner(), None).await
    }

    async fn decide_with_passkey(
        &self,
        request: Request<pb::DecideWithPasskeyRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let decision = request
            .decision
            .ok_or_else(|| Status::invalid_argument("decision: required"))?;
        let passkey = request
            .passkey
            .ok_or_else(|| Status::invalid_argument("passkey: required"))?;
        let passkey = PasskeyAssertion {
            nonce: passkey.nonce,
            credential_id: passkey.credential_id,
            client_data_json: passkey.client_data_json,
            authenticator_data: passkey.authenticator_data,
            signature: passkey.signature,
        };
        self.decided(&caller, decision, Some(passkey)).await
    }

    async fn register_passkey(
        &self,
        request: Request<pb::RegisterPasskeyRequest>,
    ) -> Result<Response<pb::Passkey>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let input = NewPasskey {
            decider: decider_from_pb(request.decider),
            challenge: request.challenge,
            client_data_json: request.client_data_json,
            attestation_object: request.attestation_object,
            name: request.name,
        };
        let passkey = self.app.register_passkey(&caller, input).await?;
        Ok(Response::new(passkey_to_pb(&passkey)))
    }

    async fn list_passkeys(
        &self,
        request: Request<pb::ListPasskeysRequest>,
    ) -> Result<Response<pb::ListPasskeysResponse>, Status> {
        let caller = caller_of(&request)?;
        let decider = decider_from_pb(request.into_inner().decider);
        let (passkeys, rp_id) = self.app.list_passkeys(&caller, &decider).await?;
        Ok(Response::new(pb::ListPasskeysResponse {
            passkeys: passkeys.iter().map(passkey_to_pb).collect(),
            rp_id,
        }))
    }

    async fn delete_passkey(
        &self,
        request: Request<pb::DeletePasskeyRequest>,
    ) -> Result<Response<pb::Passkey>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let decider = decider_from_pb(request.decider);
        let passkey = self
            .app
            .delete_passkey(&caller, &decider, &request.credential_id)
            .await?;
        Ok(Response::new(passkey_to_pb(&passkey)))
    }

    async fn record_delivery(
        &self,
        request: Request<pb::RecordDeliveryRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = caller_of(&request)?;
        let request = request.into_inner();
        let input = DeliveryInput {
            approval_id: request.approval_id,
            channel: request.channel,
            target: request.target,
            message_ref: request.message_ref,
        };
        let approval = self.app.record_delivery(&caller, input).await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    /// Public keys: any caller the authenticator let in.
    async fn get_signing_keys(
        &self,
        _request: Request<pb::GetSigningKeysRequest>,
    ) -> Result<Response<pb::SigningKeys>, Status> {
        Ok(Response::new(pb::SigningKeys {
            jwks_json: self.keys.jwks(),
            fingerprint: self.keys.fingerprint().to_owned(),
        }))
    }
}

impl ApprovalApi {
    /// Decide, with or without a passkey assertion.
    async fn decided(
        &self,
        caller: &crate::caller::Caller,
        request: pb::DecideRequest,
        passkey: Option<PasskeyAssertion>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let input = DecideInput {
            verdict: verdict_from_pb(request.verdict).map_err(invalid)?,
            scope: scope_from_pb(request.scope).map_err(invalid)?,
            decider: decider_from_pb(request.decider),
            approval_id: request.approval_id,
            reason: request.reason,
            idempotency_key: request.idempotency_key,
            expected_args_digest: request.expected_args_digest,
            edited_arguments_json: request.edited_arguments_json,
            passkey,
        };
        let (outcome, approval) = self.app.decide(caller, input).await?;
        Ok(Response::new(pb::DecideResponse {
            outcome: decide_outcome_to_pb(outcome) as i32,
            approval: Some(approval_to_pb(&approval)),
        }))
    }
}

fn passkey_to_pb(passkey: &crate::store::Passkey) -> pb::Passkey {
    pb::Passkey {
        credential_id: passkey.credential_id.clone(),
        approver: passkey.approver.clone(),
        name: passkey.name.clone(),
        algorithm: i32::try_from(passkey.algorithm).unwrap_or_default(),
        created_at: Some(crate::convert::timestamp(passkey.created_at)),
    }
}
