//! Conversions between the wire types (`countersign_proto::v1`) and the domain types.

use countersign_core::groups::{Delegation, FollowUp, GroupQuorum, OnTimeout};
use countersign_core::validate::RequestInput;
use countersign_core::{
    Approval, ConsumeOutcome, DecideOutcome, Decider, Decision, Delivery, Error, EventKind, Millis,
    ResolvedBy, Risk, Route, Scope, State, Verdict,
};
use countersign_proto::v1 as pb;
use prost_types::Timestamp;

use crate::store::AuditedEvent;
use crate::store::{Grant, StoredEvent};

pub fn timestamp(ms: Millis) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// Milliseconds since the epoch of a wire timestamp.
pub fn millis_of(ts: &Timestamp) -> Millis {
    ts.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(ts.nanos) / 1_000_000)
}

pub fn risk_to_pb(risk: Risk) -> pb::Risk {
    match risk {
        Risk::Low => pb::Risk::Low,
        Risk::Medium => pb::Risk::Medium,
        Risk::High => pb::Risk::High,
        Risk::Critical => pb::Risk::Critical,
    }
}

/// `None` for RISK_UNSPECIFIED; an error for a number outside the enum.
pub fn risk_from_pb(field: &str, value: i32) -> Result<Option<Risk>, Error> {
    match pb::Risk::try_from(value) {
        Ok(pb::Risk::Unspecified) => Ok(None),
        Ok(pb::Risk::Low) => Ok(Some(Risk::Low)),
        Ok(pb::Risk::Medium) => Ok(Some(Risk::Medium)),
        Ok(pb::Risk::High) => Ok(Some(Risk::High)),
        Ok(pb::Risk::Critical) => Ok(Some(Risk::Critical)),
        Err(_) => Err(Error::invalid(field, format!("{value} is not a Risk"))),
    }
}

pub fn state_to_pb(state: State) -> pb::ApprovalState {
    match state {
        State::Pending => pb::ApprovalState::Pending,
        State::Approved => pb::ApprovalState::Approved,
        State::Rejected => pb::ApprovalState::Rejected,
        State::Expired => pb::ApprovalState::Expired,
        State::Cancelled => pb::ApprovalState::Cancelled,
        State::Consumed => pb::ApprovalState::Consumed,
    }
}

pub fn state_from_pb(field: &str, value: i32) -> Result<State, Error> {
    match pb::ApprovalState::try_from(value) {
        Ok(pb::ApprovalState::Pending) => Ok(State::Pending),
        Ok(pb::ApprovalState::Approved) => Ok(State::Approved),
        Ok(pb::ApprovalState::Rejected) => Ok(State::Rejected),
        Ok(pb::ApprovalState::Expired) => Ok(State::Expired),
        Ok(pb::ApprovalState::Cancelled) => Ok(State::Cancelled),
        Ok(pb::ApprovalState::Consumed) => Ok(State::Consumed),
        Ok(pb::ApprovalState::Unspecified) | Err(_) => Err(Error::invalid(
            field,
            format!("{value} is not an approval state"),
        )),
    }
}

pub fn verdict_to_pb(verdict: Option<Verdict>) -> pb::Verdict {
    match verdict {
        Some(Verdict::Approve) => pb::Verdict::Approve,
        Some(Verdict::Reject) => pb::Verdict::Reject,
        None => pb::Verdict::Unspecified,
    }
}

pub fn verdict_from_pb(value: i32) -> Result<Verdict, Error> {
    match pb::Verdict::try_from(value) {
        Ok(pb::Verdict::Approve) => Ok(Verdict::Approve),
        Ok(pb::Verdict::Reject) => Ok(Verdict::Reject),
        _ => Err(Error::invalid(
            "verdict",
            "is required (VERDICT_APPROVE or VERDICT_REJECT)",
        )),
    }
}

pub fn scope_to_pb(scope: Scope) -> pb::Scope {
    match scope {
        Scope::Once => pb::Scope::Once,
        Scope::Session => pb::Scope::Session,
    }
}

/// SCOPE_UNSPECIFIED means ONCE: the narrower grant.
pub fn scope_from_pb(value: i32) -> Result<Scope, Error> {
    match pb::Scope::try_from(value) {
        Ok(pb::Scope::Unspecified) | Ok(pb::Scope::Once) => Ok(Scope::Once),
        Ok(pb::Scope::Session) => Ok(Scope::Session),
        Err(_) => Err(Error::invalid("scope", format!("{value} is not a Scope"))),
    }
}

pub fn consume_outcome_from_pb(value: i32) -> Result<ConsumeOutcome, Error> {
    match pb::ConsumeOutcome::try_from(value) {
        Ok(pb::ConsumeOutcome::Succeeded) => Ok(ConsumeOutcome::Succeeded),
        Ok(pb::ConsumeOutcome::Failed) => Ok(ConsumeOutcome::Failed),
        Ok(pb::ConsumeOutcome::HandedOff) => Ok(ConsumeOutcome::HandedOff),
        _ => Err(Error::invalid(
            "outcome",
            "is required (CONSUME_OUTCOME_SUCCEEDED, CONSUME_OUTCOME_FAILED or CONSUME_OUTCOME_HANDED_OFF)",
        )),
    }
}

fn consume_outcome_to_pb(outcome: ConsumeOutcome) -> pb::ConsumeOutcome {
    match outcome {
        ConsumeOutcome::Succeeded => pb::ConsumeOutcome::Succeeded,
        ConsumeOutcome::Failed => pb::ConsumeOutcome::Failed,
        ConsumeOutcome::HandedOff => pb::ConsumeOutcome::HandedOff,
    }
}

fn resolved_by_to_pb(by: ResolvedBy) -> pb::ResolvedBy {
    match by {
        ResolvedBy::Decision => pb::ResolvedBy::Decision,
        ResolvedBy::Rule => pb::ResolvedBy::Rule,
        ResolvedBy::Grant => pb::ResolvedBy::Grant,
        ResolvedBy::Expiry => pb::ResolvedBy::Expiry,
        ResolvedBy::Cancellation => pb::ResolvedBy::Cancellation,
    }
}

pub fn decide_outcome_to_pb(outcome: DecideOutcome) -> pb::DecideOutcome {
    match outcome {
        DecideOutcome::Recorded => pb::DecideOutcome::Recorded,
        DecideOutcome::Resolved => pb::DecideOutcome::Resolved,
        DecideOutcome::AlreadyResolved => pb::DecideOutcome::AlreadyResolved,
        DecideOutcome::Duplicate => pb::DecideOutcome::Duplicate,
    }
}

pub fn event_kind_to_pb(kind: EventKind) -> pb::EventKind {
    match kind {
        EventKind::Requested => pb::EventKind::Requested,
        EventKind::DecisionRecorded => pb::EventKind::DecisionRecorded,
        EventKind::DecisionRefused => pb::EventKind::DecisionRefused,
        EventKind::Resolved => pb::EventKind::Resolved,
        EventKind::Expired => pb::EventKind::Expired,
        EventKind::Cancelled => pb::EventKind::Cancelled,
        EventKind::Consumed => pb::EventKind::Consumed,
        EventKind::Delivered => pb::EventKind::Delivered,
        EventKind::GrantRevoked => pb::EventKind::GrantRevoked,
        EventKind::RuleAccepted => pb::EventKind::RuleAccepted,
        EventKind::Reminded => pb::EventKind::Reminded,
        EventKind::Escalated => pb::EventKind::Escalated,
    }
}

/// The stored kinds only; markers and heartbeats are never stored.
pub fn event_kind_from_pb(field: &str, value: i32) -> Result<EventKind, Error> {
    EventKind::ALL
        .into_iter()
        .find(|kind| event_kind_to_pb(*kind) as i32 == value)
        .ok_or_else(|| Error::invalid(field, format!("{value} is not a stored event kind")))
}

pub fn decider_from_pb(decider: Option<pb::Decider>) -> Decider {
    let decider = decider.unwrap_or_default();
    Decider {
        channel: decider.channel,
        user_id: decider.user_id,
        display_name: decider.display_name,
    }
}

fn decider_to_pb(decider: &Decider) -> pb::Decider {
    pb::Decider {
        channel: decider.channel.clone(),
        user_id: decider.user_id.clone(),
        display_name: decider.display_name.clone(),
    }
}

pub fn decision_to_pb(decision: &Decision) -> pb::Decision {
    pb::Decision {
        verdict: verdict_to_pb(Some(decision.verdict)) as i32,
        scope: scope_to_pb(decision.scope) as i32,
        reason: decision.reason.clone(),
        decider: Some(decider_to_pb(&decision.decider)),
        idempotency_key: decision.idempotency_key.clone(),
        decided_at: Some(timestamp(decision.decided_at)),
        args_digest: decision.args_digest.clone(),
        edited_arguments_json: decision.edited_arguments_json.clone(),
        restarts_count: decision.restarts_count,
        approver: decision.approver.clone(),
        delegate: decision.delegate.clone().unwrap_or_default(),
    }
}

pub fn routes_to_pb(routes: &[Route]) -> Vec<pb::Route> {
    routes
        .iter()
        .map(|r| pb::Route {
            channel: r.channel.clone(),
            target: r.target.clone(),
        })
        .collect()
}

fn routes_from_pb(routes: Vec<pb::Route>) -> Vec<Route> {
    routes
        .into_iter()
        .map(|r| Route {
            channel: r.channel,
            target: r.target,
        })
        .collect()
}

fn group_to_pb(group: &GroupQuorum, approved: usize) -> pb::GroupQuorum {
    pb::GroupQuorum {
        group: group.group.clone(),
        required: group.required,
        members: group.members.clone(),
        destinations: routes_to_pb(&group.destinations),
        contacts: routes_to_pb(&group.contacts),
        approved: u32::try_from(approved).unwrap_or(u32::MAX),
    }
}

fn follow_up_to_pb(follow_up: &FollowUp) -> pb::FollowUp {
    pb::FollowUp {
        remind_after_seconds: follow_up.remind_after_seconds,
        escalate_after_seconds: follow_up.escalate_after_seconds,
        escalate_to: follow_up
            .escalate_to
            .as_ref()
            .map(|g| g.group.clone())
            .unwrap_or_default(),
        on_timeout: match follow_up.on_timeout {
            OnTimeout::Reject => pb::OnTimeout::Reject,
            OnTimeout::Escalate => pb::OnTimeout::Escalate,
        } as i32,
        reminded_at: follow_up.reminded_at.map(timestamp),
        escalated_at: follow_up.escalated_at.map(timestamp),
        escalation_group: follow_up.escalate_to.as_ref().map(|g| group_to_pb(g, 0)),
    }
}

/// The requested plan: only the seconds, the escalation group's name and the timeout policy.
fn follow_up_from_pb(follow_up: pb::FollowUp) -> Result<FollowUp, Error> {
    let on_timeout = match pb::OnTimeout::try_from(follow_up.on_timeout) {
        Ok(pb::OnTimeout::Unspecified | pb::OnTimeout::Reject) => OnTimeout::Reject,
        Ok(pb::OnTimeout::Escalate) => OnTimeout::Escalate,
        Err(_) => {
            return Err(Error::invalid(
                "follow_up.on_timeout",
                format!("{} is not an OnTimeout", follow_up.on_timeout),
            ))
        }
    };
    Ok(FollowUp {
        remind_after_seconds: follow_up.remind_after_seconds,
        escalate_after_seconds: follow_up.escalate_after_seconds,
        escalate_to: (!follow_up.escalate_to.is_empty()).then(|| GroupQuorum {
            group: follow_up.escalate_to,
            ..GroupQuorum::default()
        }),
        on_timeout,
        reminded_at: None,
        escalated_at: None,
    })
}

pub fn delivery_to_pb(delivery: &Delivery) -> pb::Delivery {
    pb::Delivery {
        channel: delivery.channel.clone(),
        target: delivery.target.clone(),
        message_ref: delivery.message_ref.clone(),
        recorded_at: Some(timestamp(delivery.recorded_at)),
    }
}

pub fn approval_to_pb(approval: &Approval) -> pb::Approval {
    pb::Approval {
        id: approval.id.clone(),
        agent_id: approval.agent_id.clone(),
        session_id: approval.session_id.clone(),
        requester: approval.requester.clone(),
        idempotency_key: approval.idempotency_key.clone(),
        tool_name: approval.tool_name.clone(),
        arguments_json: approval.arguments_json.clone(),
        args_digest: approval.args_digest.clone(),
        action: approval.action.clone(),
        reason: approval.reason.clone(),
        risk: risk_to_pb(approval.effective_risk()) as i32,
        routes: routes_to_pb(&approval.routes),
        required_approvals: approval.effective_required_approvals(),
        labels: approval
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        state: state_to_pb(approval.state) as i32,
        decisions: approval.decisions.iter().map(decision_to_pb).collect(),
        resolution: approval.resolution.as_ref().map(|r| pb::Resolution {
            verdict: verdict_to_pb(r.verdict) as i32,
            resolved_by: resolved_by_to_pb(r.resolved_by) as i32,
            deciders: r.deciders.iter().map(decider_to_pb).collect(),
            rule: r.rule.clone().unwrap_or_default(),
            grant_id: r.grant_id.clone().unwrap_or_default(),
            reason: r.reason.clone(),
            resolved_at: Some(timestamp(r.resolved_at)),
            args_digest: r.args_digest.clone(),
        }),
        deliveries: approval.deliveries.iter().map(delivery_to_pb).collect(),
        created_at: Some(timestamp(approval.created_at)),
        expires_at: Some(timestamp(approval.expires_at)),
        resolved_at: approval.resolved_at().map(timestamp),
        consumption: approval.consumption.as_ref().map(|c| pb::Consumption {
            outcome: consume_outcome_to_pb(c.outcome) as i32,
            detail: c.detail.clone(),
            consumed_at: Some(timestamp(c.consumed_at)),
        }),
        policy_rule: approval.policy_rule.clone().unwrap_or_default(),
        edited_arguments_json: approval
            .edit
            .as_ref()
            .map(|e| e.arguments_json.clone())
            .unwrap_or_default(),
        edited_args_digest: approval
            .edit
            .as_ref()
            .map(|e| e.args_digest.clone())
            .unwrap_or_default(),
        editor: approval.edit.as_ref().map(|e| decider_to_pb(&e.editor)),
        edited_at: approval.edit.as_ref().map(|e| timestamp(e.edited_at)),
        approver_groups: approval
            .group_progress()
            .into_iter()
            .map(|(g, approved)| group_to_pb(g, approved))
            .collect(),
        follow_up: approval.follow_up.as_ref().map(follow_up_to_pb),
        withdraw_when_caller_leaves: approval.withdraw_when_caller_leaves,
        receipt: approval.receipt.clone().unwrap_or_default(),
        step_up: approval
            .step_up
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
    }
}

pub fn event_to_pb(event: &StoredEvent) -> pb::ApprovalEvent {
    pb::ApprovalEvent {
        seq: event.seq.max(0) as u64,
        kind: event_kind_to_pb(event.kind) as i32,
        approval: Some(approval_to_pb(&event.approval)),
        at: Some(timestamp(event.at)),
        decision: event.decision.as_ref().map(decision_to_pb),
        delivery: event.delivery.as_ref().map(delivery_to_pb),
        detail: event.detail.clone().unwrap_or_default(),
        // Set by the watch, which knows the log's history (`watch.rs`).
        history_id: String::new(),
    }
}

pub fn audited_event_to_pb(audited: &AuditedEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        event: Some(event_to_pb(&audited.event)),
        detail: audited.event.detail.clone().unwrap_or_default(),
        prev_hash: audited.prev_hash.clone(),
        hash: audited.hash.clone(),
    }
}

pub fn grant_to_pb(grant: &Grant, now: Millis) -> pb::Grant {
    pb::Grant {
        id: grant.id.clone(),
        agent_id: grant.agent_id.clone(),
        session_id: grant.session_id.clone(),
        tool_name: grant.tool_name.clone(),
        approval_id: grant.approval_id.clone(),
        granted_by: grant.granted_by.clone(),
        created_at: Some(timestamp(grant.created_at)),
        expires_at: grant.expires_at.map(timestamp),
        revoked_at: grant.revoked_at.map(timestamp),
        active: grant.is_active(now),
    }
}

pub fn request_from_pb(request: pb::RequestApprovalRequest) -> Result<RequestInput, Error> {
    Ok(RequestInput {
        risk: risk_from_pb("risk", request.risk)?,
        agent_id: request.agent_id,
        session_id: request.session_id,
        requester: request.requester,
        idempotency_key: request.idempotency_key,
        tool_name: request.tool_name,
        arguments_json: request.arguments_json,
        action: request.action,
        reason: request.reason,
        routes: routes_from_pb(request.routes),
        required_approvals: request.required_approvals,
        ttl_seconds: request.ttl_seconds,
        labels: request.labels.into_iter().collect(),
        approver_groups: request
            .approver_groups
            .into_iter()
            .map(|g| GroupQuorum {
                group: g.group,
                required: g.required,
                ..GroupQuorum::default()
            })
            .collect(),
        follow_up: request.follow_up.map(follow_up_from_pb).transpose()?,
        withdraw_when_caller_leaves: request.withdraw_when_caller_leaves,
    })
}

pub fn delegation_to_pb(delegation: &Delegation, now: Millis) -> pb::Delegation {
    pb::Delegation {
        id: delegation.id.clone(),
        delegator: delegation.delegator.clone(),
        delegate: delegation.delegate.clone(),
        created_at: Some(timestamp(delegation.created_at)),
        until: Some(timestamp(delegation.until)),
        revoked_at: delegation.revoked_at.map(timestamp),
        reason: delegation.reason.clone(),
        created_by: delegation.created_by.clone(),
        active: delegation.is_active(now),
    }
}
