//! The gRPC edge: checks the caller's role and scope, converts wire types to domain types,
//! applies policy, limits and the approver registry, calls the store, maps errors once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use countersign_core::groups::Delegation;
use countersign_core::validate::{
    required, validate_arguments, validate_channel, validate_decider, validate_digest,
    validate_request, Limits,
};
use countersign_core::{
    Approval, Decision, Delivery, EditedVersion, Error as DomainError, Verdict,
};
use countersign_proto::v1 as pb;
use countersign_proto::v1::approval_service_server::ApprovalService;
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, Role};
use crate::config::Config;
use crate::convert::{
    approval_to_pb, consume_outcome_from_pb, decide_outcome_to_pb, decider_from_pb,
    request_from_pb, scope_from_pb, state_from_pb, verdict_from_pb,
};
use crate::error::{status_of, status_of_domain};
use crate::hub::Hub;
use crate::limits::RateLimiter;
use crate::security::Security;
use crate::store::{now_millis, ListFilter, Store};
use crate::watch::{Start, WatchSettings, WatchStream};

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;
const MAX_MESSAGE_REF_CHARS: usize = 512;
const MAX_ID_CHARS: usize = 128;

pub struct ApprovalApi {
    store: Store,
    hub: Hub,
    config: Arc<Config>,
    limits: Limits,
    security: Arc<Security>,
    rates: Rates,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

/// The rate limits, each a token bucket per key; `None` where the limit is off.
struct Rates {
    requests_per_agent: Option<RateLimiter>,
    requests_per_token: Option<RateLimiter>,
    decisions_per_decider: Option<RateLimiter>,
    decisions_per_token: Option<RateLimiter>,
}

impl ApprovalApi {
    pub fn new(
        store: Store,
        hub: Hub,
        config: Arc<Config>,
        security: Arc<Security>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let limits = config.request_limits();
        let limits_config = &config.limits;
        let rates = Rates {
            requests_per_agent: RateLimiter::new(
                limits_config.requests_per_minute,
                limits_config.request_burst,
            ),
            requests_per_token: RateLimiter::new(
                limits_config
                    .requests_per_minute_per_token
                    .unwrap_or(limits_config.requests_per_minute.saturating_mul(10)),
                0,
            ),
            decisions_per_decider: RateLimiter::new(limits_config.decisions_per_minute, 0),
            decisions_per_token: RateLimiter::new(
                limits_config
                    .decisions_per_minute_per_token
                    .unwrap_or(limits_config.decisions_per_minute.saturating_mul(10)),
                0,
            ),
        };
        ApprovalApi {
            store,
            hub,
            config,
            limits,
            security,
            rates,
            shutdown,
        }
    }

    /// The approval `approval_id` as its audit trail confirms it (refused when the stored row
    /// disagrees with its newest event).
    async fn load(&self, approval_id: &str) -> Result<Approval, Status> {
        self.store.get(approval_id).await.map_err(status_of)
    }

    /// The approval `approval_id`, if `caller` may see it.
    async fn readable(&self, caller: &Caller, approval_id: &str) -> Result<Approval, Status> {
        let approval = self.load(approval_id).await?;
        caller.may_read(&approval)?;
        Ok(approval)
    }

    /// Refuses `caller` unless it may act on approval `approval_id`; an admin may act on all,
    /// so that needs no read.
    async fn check_readable(&self, caller: &Caller, approval_id: &str) -> Result<(), Status> {
        if caller.role == Role::Admin {
            return Ok(());
        }
        self.readable(caller, approval_id).await.map(drop)
    }

    fn max_wait(&self) -> Duration {
        Duration::from_secs(u64::from(self.config.approvals.max_wait_seconds))
    }

    async fn wait(
        &self,
        caller: &Caller,
        approval_id: &str,
        timeout: Duration,
    ) -> Result<pb::Approval, Status> {
        let mut live = self.hub.subscribe();
        let mut shutdown = self.shutdown.clone();
        let approval = self.readable(caller, approval_id).await?;
        if !approval.is_pending() {
            return Ok(approval_to_pb(&approval));
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = shutdown.changed() => break,
                received = live.recv() => match received {
                    Ok(event) if event.approval.id == approval_id && !event.approval.is_pending() => {
                        return Ok(approval_to_pb(&event.approval));
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let approval = self.load(approval_id).await?;
                        if !approval.is_pending() {
                            return Ok(approval_to_pb(&approval));
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        let approval = self.load(approval_id).await?;
        Ok(approval_to_pb(&approval))
    }
}

/// Takes one call from `key`'s bucket of `limiter` (shared by every server on the database
/// when it keeps shared buckets), or refuses with RESOURCE_EXHAUSTED naming who (`who`) went
/// over which setting, and when to retry.
async fn check_rate(
    store: &Store,
    limiter: &Option<RateLimiter>,
    key: &str,
    who: &str,
    setting: &str,
) -> Result<(), Status> {
    let Some(limiter) = limiter else {
        return Ok(());
    };
    let bucket = format!("{setting}:{key}");
    limiter
        .check_shared(store, &bucket, Instant::now())
        .await
        .map_err(|wait| {
            let retry_ms = wait.as_millis().max(1);
            tracing::warn!(
                who,
                setting,
                retry_ms = retry_ms as u64,
                "rate limit reached"
            );
            let mut status = Status::resource_exhausted(format!(
                "{who} exceeded its rate (limits.{setting} = {}); retry in {:.1} s",
                limiter.per_minute(),
                wait.as_secs_f64()
            ));
            if let Ok(value) = retry_ms.to_string().parse() {
                status.metadata_mut().insert("retry-after-ms", value);
            }
            status
        })
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

impl ApprovalApi {
    /// Puts a refused decision on the audit trail (the approval stays as it is) and returns
    /// the refusal for the caller.
    async fn refuse(
        &self,
        caller: &Caller,
        current: &Approval,
        decision: Decision,
        refusal: DomainError,
        now: countersign_core::Millis,
    ) -> Status {
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
            Ok(_) => status_of_domain(refusal),
            Err(e) => status_of(e),
        }
    }

    /// The active delegations to the registered approver `decider` is (none for a stranger).
    async fn delegations_to(
        &self,
        decider: &countersign_core::Decider,
        now: countersign_core::Millis,
    ) -> Result<Vec<Delegation>, Status> {
        let Some(id) = self.security.approvers.identify(decider) else {
            return Ok(Vec::new());
        };
        let mut delegations = self
            .store
            .list_delegations(id, false, now)
            .await
            .map_err(status_of)?;
        delegations.retain(|d| d.delegate == id && d.is_active(now));
        Ok(delegations)
    }
}

fn approval_id(value: &str) -> Result<(), Status> {
    required("approval_id", value, MAX_ID_CHARS).map_err(status_of_domain)
}

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn request_approval(
        &self,
        request: Request<pb::RequestApprovalRequest>,
    ) -> Result<Response<pb::RequestApprovalResponse>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("RequestApproval", &[Role::Agent])?;
        let input = request_from_pb(request.into_inner()).map_err(status_of_domain)?;
        caller.for_agent(&input.agent_id)?;
        check_rate(
            &self.store,
            &self.rates.requests_per_token,
            &caller.name,
            &format!("token {:?}", caller.name),
            "requests_per_minute_per_token",
        )
        .await?;
        check_rate(
            &self.store,
            &self.rates.requests_per_agent,
            &input.agent_id,
            &format!("agent {:?}", input.agent_id),
            "requests_per_minute",
        )
        .await?;
        let request = validate_request(input, &self.limits).map_err(status_of_domain)?;
        let (mut request, disposition) = self.security.policy.apply(request);
        self.security
            .groups
            .resolve(&mut request)
            .map_err(status_of_domain)?;
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
            .await
            .map_err(status_of)?;
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
        Ok(Response::new(pb::RequestApprovalResponse {
            approval: Some(approval_to_pb(&requested.approval)),
            created: requested.created,
        }))
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("GetApproval", &[Role::Agent, Role::Worker])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        let approval = self.readable(&caller, &request.approval_id).await?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn wait_for_decision(
        &self,
        request: Request<pb::WaitForDecisionRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("WaitForDecision", &[Role::Agent])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        let timeout = match request.timeout_ms {
            0 => self.max_wait(),
            ms => Duration::from_millis(u64::from(ms)).min(self.max_wait()),
        };
        Ok(Response::new(
            self.wait(&caller, &request.approval_id, timeout).await?,
        ))
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("ListApprovals", &[Role::Agent, Role::Worker])?;
        let mut request = request.into_inner();
        request.agent_id = caller.agent_filter(request.agent_id)?;
        request.channel = caller.channel_filter(request.channel)?;
        if request.page_size > MAX_PAGE_SIZE {
            return Err(status_of_domain(DomainError::invalid(
                "page_size",
                format!("must be at most {MAX_PAGE_SIZE}"),
            )));
        }
        if !request.channel.is_empty() {
            validate_channel("channel", &request.channel).map_err(status_of_domain)?;
        }
        let states = request
            .states
            .iter()
            .map(|s| state_from_pb("states", *s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(status_of_domain)?;
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n,
        };
        let filter = ListFilter {
            states,
            agent_id: request.agent_id,
            channel: request.channel,
            session_id: request.session_id,
            tool_name: request.tool_name,
            before_id: request.page_token,
            limit: page_size + 1,
        };
        let mut approvals = self.store.list(&filter).await.map_err(status_of)?;
        let next_page_token = paginate(&mut approvals, page_size, |a| a.id.clone());
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: approvals.iter().map(approval_to_pb).collect(),
            next_page_token,
        }))
    }

    async fn cancel_approval(
        &self,
        request: Request<pb::CancelApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("CancelApproval", &[Role::Agent])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        countersign_core::validate::optional("reason", &request.reason, 4096)
            .map_err(status_of_domain)?;
        self.check_readable(&caller, &request.approval_id).await?;
        let approval = self
            .store
            .cancel(&request.approval_id, &request.reason, now_millis())
            .await
            .map_err(status_of)?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    async fn consume(
        &self,
        request: Request<pb::ConsumeRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("Consume", &[Role::Agent])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        let outcome = consume_outcome_from_pb(request.outcome).map_err(status_of_domain)?;
        countersign_core::validate::optional("detail", &request.detail, 4096)
            .map_err(status_of_domain)?;
        validate_digest("args_digest", &request.args_digest).map_err(status_of_domain)?;
        // Read whatever the role: an approval that disagrees with its trail is never consumed.
        let approval = self.readable(&caller, &request.approval_id).await?;
        approval
            .check_ran(&request.args_digest)
            .map_err(status_of_domain)?;
        let approval = self
            .store
            .consume(&request.approval_id, outcome, &request.detail, now_millis())
            .await
            .map_err(status_of)?;
        Ok(Response::new(approval_to_pb(&approval)))
    }

    type WatchApprovalsStream = WatchStream;

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("WatchApprovals", &[Role::Worker])?;
        let mut request = request.into_inner();
        request.channel = caller.channel_filter(request.channel)?;
        if !request.channel.is_empty() {
            validate_channel("channel", &request.channel).map_err(status_of_domain)?;
        }
        let after_seq = i64::try_from(request.after_seq)
            .map_err(|_| status_of_domain(DomainError::invalid("after_seq", "is out of range")))?;
        let start = match (request.include_snapshot, after_seq) {
            (true, 0) => Start::Snapshot,
            (true, _) => return Err(status_of_domain(DomainError::invalid(
                "include_snapshot",
                "cannot be combined with after_seq: a snapshot restarts the stream from the head",
            ))),
            (false, 0) => Start::Now,
            (false, seq) => Start::After(seq),
        };
        let settings = WatchSettings {
            heartbeat: Duration::from_millis(self.config.watch.heartbeat_interval_ms),
            buffer_events: self.config.watch.buffer_events,
        };
        let stream = crate::watch::start(
            self.store.clone(),
            &self.hub,
            request.channel,
            start,
            settings,
            self.shutdown.clone(),
        )
        .await?;
        Ok(Response::new(stream))
    }

    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("Decide", &[Role::Worker])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        let verdict = verdict_from_pb(request.verdict).map_err(status_of_domain)?;
        let scope = scope_from_pb(request.scope).map_err(status_of_domain)?;
        let decider = decider_from_pb(request.decider);
        validate_decider(&decider, &request.reason, &request.idempotency_key)
            .map_err(status_of_domain)?;
        validate_digest("expected_args_digest", &request.expected_args_digest)
            .map_err(status_of_domain)?;
        let edited_digest = if request.edited_arguments_json.is_empty() {
            None
        } else if verdict != Verdict::Approve {
            return Err(status_of_domain(DomainError::invalid(
                "edited_arguments_json",
                "edited arguments go with VERDICT_APPROVE only; a rejection has nothing to edit",
            )));
        } else {
            Some(
                validate_arguments(
                    "edited_arguments_json",
                    &request.edited_arguments_json,
                    &self.limits,
                )
                .map_err(status_of_domain)?,
            )
        };
        caller.for_channel(&decider.channel)?;
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
            countersign_core::approvers::identity_key(&decider.user_id)
        );
        check_rate(
            &self.store,
            &self.rates.decisions_per_decider,
            &decider_key,
            &format!("decider {decider_key:?}"),
            "decisions_per_minute",
        )
        .await?;
        let current = self.load(&request.approval_id).await?;
        caller.routed_to(&decider.channel, &current)?;
        let now = now_millis();
        let decision = Decision {
            verdict,
            scope,
            reason: request.reason,
            approver: String::new(),
            decider,
            idempotency_key: request.idempotency_key,
            decided_at: now,
            // The version the decider saw. An edit that names none is made on the version read
            // here, which its authorization below is checked against: the store refuses it
            // when the approval was edited meanwhile.
            args_digest: if request.expected_args_digest.is_empty() && edited_digest.is_some() {
                current.current_digest().to_owned()
            } else {
                request.expected_args_digest
            },
            edited_arguments_json: String::new(),
            restarts_count: false,
            delegate: None,
        };
        let delegations = self.delegations_to(&decision.decider, now).await?;
        // Policy on the edited arguments: a deny rule refuses the edit, a higher risk or
        // quorum applies to it.
        let edit: Option<EditedVersion> = match edited_digest {
            None => None,
            Some(digest) => match self.security.policy.reevaluate(
                &current,
                request.edited_arguments_json,
                digest,
            ) {
                Ok(version) => Some(version),
                Err(refusal) => {
                    return Err(self.refuse(&caller, &current, decision, refusal, now).await)
                }
            },
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
                return Err(self.refuse(&caller, &current, decision, refusal, now).await)
            }
        };
        let (outcome, approval) = self
            .store
            .decide(
                &request.approval_id,
                decision,
                edit,
                self.config.grants.ttl_seconds,
                now,
            )
            .await
            .map_err(status_of)?;
        tracing::info!(
            approval_id = %approval.id,
            outcome = ?outcome,
            state = approval.state.as_str(),
            args_digest = %approval.current_digest(),
            edited = approval.edit.is_some(),
            token = %caller.name,
            "decision"
        );
        Ok(Response::new(pb::DecideResponse {
            outcome: decide_outcome_to_pb(outcome) as i32,
            approval: Some(approval_to_pb(&approval)),
        }))
    }

    async fn record_delivery(
        &self,
        request: Request<pb::RecordDeliveryRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::of(&request)?;
        caller.allow("RecordDelivery", &[Role::Worker])?;
        let request = request.into_inner();
        approval_id(&request.approval_id)?;
        validate_channel("channel", &request.channel).map_err(status_of_domain)?;
        countersign_core::validate::optional("target", &request.target, 256)
            .map_err(status_of_domain)?;
        required("message_ref", &request.message_ref, MAX_MESSAGE_REF_CHARS)
            .map_err(status_of_domain)?;
        caller.for_channel(&request.channel)?;
        if caller.role == Role::Worker {
            let current = self
                .store
                .get(&request.approval_id)
                .await
                .map_err(status_of)?;
            caller.routed_to(&request.channel, &current)?;
        }
        let now = now_millis();
        let delivery = Delivery {
            channel: request.channel,
            target: request.target,
            message_ref: request.message_ref,
            recorded_at: now,
        };
        let approval = self
            .store
            .record_delivery(&request.approval_id, delivery, now)
            .await
            .map_err(status_of)?;
        Ok(Response::new(approval_to_pb(&approval)))
    }
}
