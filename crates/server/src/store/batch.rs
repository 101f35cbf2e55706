//! Applies a batch of changes in memory, whatever the backend: what the batch needs is read
//! from the database once ([`BatchKeys`] → [`Loaded`]), every change is applied in queue order
//! to that state (so a later change sees the earlier ones: two decisions on one approval in one
//! batch, the first wins), and what changed is collected as one [`WriteSet`] that the backend
//! writes (PostgreSQL with a fixed number of set-based statements, SQLite one prepared
//! statement per row, stepped in place).
//!
//! Over 800 lines: one [`Plan`] applies every kind of change (request, decide, cancel,
//! consume, delivery, sweep, grants, delegations, pruning) to one view with one undo log, and
//! each change's code is short; split by kind, every piece would reach into the same private
//! state.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use countersign_core::groups::Delegation;
use countersign_core::{
    Approval, ApprovalRequest, ConsumeOutcome, DecideOutcome, Decision, Delivery, Disposition,
    EditedVersion, Error as DomainError, EventKind, Millis, ResolvedBy, State, Verdict,
};

use super::error::StoreError;
use super::event::{EventBody, StoredEvent};
use super::records::{ChainHead, Grant, PasskeyWrite, Requested};
use crate::audit::{chain_hash_at, content_before_seq_of, Columns};
use crate::receipts::ReceiptKeys;

/// How many due approvals one expiry sweep expires at most; the next sweep takes the rest.
pub const EXPIRY_SWEEP_LIMIT: i64 = 1000;

// A request is the common change and the largest; boxing it would add an allocation to every
// request for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Change {
    Request {
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        max_pending: u32,
        /// The new approval as the caller's task made it, if the request creates one.
        prepared: Option<Box<PreparedRequest>>,
    },
    Decide {
        approval_id: String,
        decision: Decision,
        /// Edit-on-approve: the edited arguments, validated, with what policy requires.
        edit: Option<EditedVersion>,
        grant_ttl_seconds: u32,
    },
    RefuseDecision {
        approval_id: String,
        decision: Decision,
        why: String,
    },
    RevokeGrant {
        grant_id: String,
        revoked_by: String,
        reason: String,
    },
    /// A RULE_ACCEPTED event on the approval, with `detail`; the approval is unchanged.
    RecordRuleAccepted {
        approval_id: String,
        detail: String,
    },
    Cancel {
        approval_id: String,
        reason: String,
    },
    Consume {
        approval_id: String,
        outcome: ConsumeOutcome,
        detail: String,
    },
    RecordDelivery {
        approval_id: String,
        delivery: Delivery,
    },
    /// Expires, escalates and reminds the pending approvals whose next due time passed.
    FollowUpDue,
    CreateDelegation {
        delegation: Delegation,
    },
    RevokeDelegation {
        delegation_id: String,
    },
    PruneEvents {
        before: Millis,
    },
    /// A passkey registered, its sign counter advanced, or it removed.
    WritePasskey(PasskeyWrite),
    /// The first use of an OpenID CIBA client assertion, remembered until `expires_at`
    /// (answered `Reply::FirstUse`); rows of expired ones are deleted.
    UseClientAssertion {
        client_id: String,
        jti: String,
        expires_at: Millis,
    },
}

/// What a batch reads before it is applied.
#[derive(Debug, Default)]
pub struct BatchKeys {
    /// Approvals a change names by id.
    pub approval_ids: Vec<String>,
    /// (agent id, idempotency key) of each request.
    pub request_keys: Vec<(String, String)>,
    /// Grants to revoke (their approvals are read too).
    pub grant_ids: Vec<String>,
    /// (agent id, session id) of requests a session grant may approve.
    pub grant_scopes: Vec<(String, String)>,
    /// Agents whose pending approvals a request counts against its limit.
    pub pending_agents: Vec<String>,
    /// For a follow-up sweep: approvals pending with a next due time (deadline, reminder,
    /// escalation) at or before this time.
    pub due_at: Option<Millis>,
    /// Delegations to revoke.
    pub delegation_ids: Vec<String>,
    /// (client id, jti) of client assertions to use.
    pub client_assertions: Vec<(String, String)>,
}

impl BatchKeys {
    pub(crate) fn of<'a>(changes: impl Iterator<Item = (&'a Change, Millis)>) -> BatchKeys {
        let mut keys = BatchKeys::default();
        for (change, now) in changes {
            match change {
                Change::Request {
                    request,
                    disposition,
                    max_pending,
                    ..
                } => {
                    keys.request_keys
                        .push((request.agent_id.clone(), request.idempotency_key.clone()));
                    if *disposition == Disposition::RequireHuman {
                        if !request.session_id.is_empty() {
                            keys.grant_scopes
                                .push((request.agent_id.clone(), request.session_id.clone()));
                        }
                        if *max_pending > 0 {
                            keys.pending_agents.push(request.agent_id.clone());
                        }
                    }
                }
                Change::Decide { approval_id, .. }
                | Change::RefuseDecision { approval_id, .. }
                | Change::Cancel { approval_id, .. }
                | Change::Consume { approval_id, .. }
                | Change::RecordDelivery { approval_id, .. }
                | Change::RecordRuleAccepted { approval_id, .. } => {
                    keys.approval_ids.push(approval_id.clone());
                }
                Change::RevokeGrant { grant_id, .. } => keys.grant_ids.push(grant_id.clone()),
                Change::FollowUpDue => keys.due_at = Some(keys.due_at.unwrap_or(now).max(now)),
                Change::RevokeDelegation { delegation_id } => {
                    keys.delegation_ids.push(delegation_id.clone())
                }
                Change::UseClientAssertion { client_id, jti, .. } => keys
                    .client_assertions
                    .push((client_id.clone(), jti.clone())),
                Change::CreateDelegation { .. }
                | Change::PruneEvents { .. }
                | Change::WritePasskey(_) => {}
            }
        }
        keys.grant_scopes.sort_unstable();
        keys.grant_scopes.dedup();
        keys.pending_agents.sort_unstable();
        keys.pending_agents.dedup();
        keys
    }
}

/// A grant with the bounds of the approval that made it.
#[derive(Debug, Clone)]
pub struct BoundedGrant {
    pub grant: Grant,
    pub max_risk_rank: i64,
    pub max_required_approvals: i64,
    /// The canonical argument parts the grant covers (empty: any arguments of the tool).
    pub scope: String,
}

/// What the database holds for a batch's keys.
#[derive(Debug, Default)]
pub struct Loaded {
    pub approvals: Vec<Approval>,
    /// Grants by id, and the unrevoked grants of the requested sessions.
    pub grants: Vec<BoundedGrant>,
    /// (agent id, deadline) of each pending approval of the agents in `pending_agents`.
    pub pending: Vec<(String, Millis)>,
    /// The delegations named by id.
    pub delegations: Vec<Delegation>,
    /// Of `client_assertions`, the ones already used.
    pub used_client_assertions: Vec<(String, String)>,
}

/// One event row to append.
pub struct EventWrite {
    pub seq: i64,
    pub approval_id: String,
    pub kind: EventKind,
    pub at: Millis,
    /// The stored JSON, encoded.
    pub body: String,
    pub columns: Columns,
    pub prev_hash: String,
    pub hash: String,
}

/// Everything a batch writes.
#[derive(Default)]
pub struct WriteSet {
    /// New or changed approvals, as they are at the end of the batch.
    pub approvals: BTreeMap<String, Approval>,
    pub events: Vec<EventWrite>,
    pub new_grants: Vec<BoundedGrant>,
    /// (grant id, revoked at).
    pub revoked_grants: Vec<(String, Millis)>,
    /// Approvals whose stored events still carry argument values to blank.
    pub redact: Vec<String>,
    /// Delete events older than this (the newest event always stays).
    pub prune_before: Option<Millis>,
    /// New or revoked delegations, as they are at the end of the batch.
    pub delegations: BTreeMap<String, Delegation>,
    /// Passkeys registered, counted and removed, in order.
    pub passkeys: Vec<PasskeyWrite>,
    /// Row bodies of `approvals` encoded before the writer had them (new approvals made in
    /// their callers' tasks); an approval changed later in the batch is no longer here.
    pub encoded: HashMap<String, String>,
    /// (client id, jti, expires at) of client assertions used for the first time.
    pub client_assertions: Vec<(String, String, Millis)>,
    /// Delete the used client assertions that expired by then.
    pub forget_assertions_before: Option<Millis>,
}

impl WriteSet {
    /// Each approval to write with its row body (the stored JSON).
    pub fn approval_rows(&self) -> Result<Vec<(&Approval, Cow<'_, str>)>, serde_json::Error> {
        self.approvals
            .values()
            .map(|approval| {
                let body = match self.encoded.get(&approval.id) {
                    Some(body) => Cow::Borrowed(body.as_str()),
                    None => Cow::Owned(serde_json::to_string(approval)?),
                };
                Ok((approval, body))
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.approvals.is_empty()
            && self.events.is_empty()
            && self.new_grants.is_empty()
            && self.revoked_grants.is_empty()
            && self.prune_before.is_none()
            && self.delegations.is_empty()
            && self.passkeys.is_empty()
            && self.client_assertions.is_empty()
            && self.forget_assertions_before.is_none()
    }
}

/// An event in its stored form before it has a place in the chain: its encoded body, its
/// columns and the canonical content its hash covers up to the seq. Nothing of it depends on
/// the order of the batch, so a caller's task can make it before it queues.
pub(crate) struct SealedEvent {
    kind: EventKind,
    at: Millis,
    text: String,
    columns: Columns,
    before_seq: String,
}

impl SealedEvent {
    pub(crate) fn of(
        kind: EventKind,
        at: Millis,
        body: &EventBody,
    ) -> Result<SealedEvent, StoreError> {
        let stored = body.stored_form(kind)?;
        Ok(SealedEvent {
            kind,
            at,
            before_seq: content_before_seq_of(&body.approval.id, kind.as_str(), at, &stored.hashed),
            text: stored.text,
            columns: stored.columns,
        })
    }
}

/// A request's new approval, its row body and its REQUESTED event, made in the caller's task
/// (the serializing, canonical JSON and most of the hashing are then off the writer's serial
/// path). The writer uses them when the request creates the approval that was expected: its
/// idempotency key is new and no session grant approves it.
pub(crate) struct PreparedRequest {
    approval: Approval,
    row_body: String,
    requested: SealedEvent,
}

impl PreparedRequest {
    /// None for a request that is resolved at once (the writer then makes its events).
    pub(crate) fn of(
        request: &ApprovalRequest,
        ttl_seconds: u32,
        disposition: &Disposition,
        now: Millis,
    ) -> Result<Option<PreparedRequest>, StoreError> {
        if *disposition != Disposition::RequireHuman {
            return Ok(None);
        }
        let approval = Approval::new(
            uuid::Uuid::now_v7().to_string(),
            request.clone(),
            ttl_seconds,
            disposition.clone(),
            now,
        );
        // The body owns the approval while the event is sealed, then gives it back (no copy).
        let body = EventBody {
            approval,
            decision: None,
            delivery: None,
            detail: None,
        };
        let requested = SealedEvent::of(EventKind::Requested, now, &body)?;
        let approval = body.approval;
        Ok(Some(PreparedRequest {
            row_body: serde_json::to_string(&approval)?,
            approval,
            requested,
        }))
    }
}

fn event_body(
    approval: &Approval,
    decision: Option<Decision>,
    delivery: Option<Delivery>,
) -> EventBody {
    EventBody {
        approval: approval.clone(),
        decision,
        delivery,
        detail: None,
    }
}

/// What a change answers its caller with.
pub(crate) enum Reply {
    Requested(Requested),
    Decided(DecideOutcome, Approval),
    Approval(Approval),
    Grant(Grant),
    Delegation(Delegation),
    Count(u64),
    /// Events were pruned; how many is known once the batch is written.
    Pruned,
    /// Whether a client assertion was used for the first time.
    FirstUse(bool),
}

/// What one change produced in its batch.
pub(crate) struct Applied {
    pub(super) reply: Reply,
    pub(super) events: Vec<StoredEvent>,
}

/// The batch's view of the database: what was read, with the batch's own changes applied.
pub(crate) struct Plan {
    approvals: HashMap<String, Approval>,
    by_key: HashMap<(String, String), String>,
    grants: Vec<BoundedGrant>,
    pending: HashMap<String, Vec<Millis>>,
    delegations: HashMap<String, Delegation>,
    used_client_assertions: HashSet<(String, String)>,
    head: ChainHead,
    redact_arguments: bool,
    receipts: Option<Arc<ReceiptKeys>>,
    writes: WriteSet,
    /// The approvals the current change saved, as they were before it (in the batch's view
    /// and in the write set; None: not there), to undo a change that fails half way.
    undo: Vec<(String, Option<Approval>, Option<Approval>)>,
}

/// Where a plan stood before a change.
struct Mark {
    head: ChainHead,
    events: usize,
    redact: usize,
}

impl Plan {
    pub fn new(
        loaded: Loaded,
        head: ChainHead,
        redact_arguments: bool,
        receipts: Option<Arc<ReceiptKeys>>,
    ) -> Plan {
        let mut approvals = HashMap::with_capacity(loaded.approvals.len());
        let mut by_key = HashMap::with_capacity(loaded.approvals.len());
        for approval in loaded.approvals {
            by_key.insert(
                (approval.agent_id.clone(), approval.idempotency_key.clone()),
                approval.id.clone(),
            );
            approvals.insert(approval.id.clone(), approval);
        }
        let mut pending: HashMap<String, Vec<Millis>> = HashMap::new();
        for (agent, expires_at) in loaded.pending {
            pending.entry(agent).or_default().push(expires_at);
        }
        Plan {
            approvals,
            by_key,
            grants: loaded.grants,
            pending,
            delegations: loaded
                .delegations
                .into_iter()
                .map(|d| (d.id.clone(), d))
                .collect(),
            used_client_assertions: loaded.used_client_assertions.into_iter().collect(),
            head,
            redact_arguments,
            receipts,
            writes: WriteSet::default(),
            undo: Vec::new(),
        }
    }

    /// The chain head after the batch and what to write.
    pub fn finish(self) -> (ChainHead, WriteSet) {
        (self.head, self.writes)
    }

    /// Applies one change. A change that fails leaves the plan as it was. (Grants are created
    /// and revoked as the last, infallible step of a change, so only approvals and events need
    /// undoing.)
    pub fn apply(&mut self, change: Change, now: Millis) -> Result<Applied, StoreError> {
        let mark = Mark {
            head: self.head.clone(),
            events: self.writes.events.len(),
            redact: self.writes.redact.len(),
        };
        self.undo.clear();
        let result = self.apply_change(change, now);
        match result {
            Ok(mut applied) => {
                if self.redact_arguments {
                    self.redact_resolved(&mut applied);
                }
                self.sign_receipts(&mut applied);
                Ok(applied)
            }
            Err(e) => {
                self.undo(mark);
                Err(e)
            }
        }
    }

    fn undo(&mut self, mark: Mark) {
        self.head = mark.head;
        self.writes.events.truncate(mark.events);
        self.writes.redact.truncate(mark.redact);
        for (id, before, written_before) in std::mem::take(&mut self.undo).into_iter().rev() {
            match written_before {
                Some(previous) => self.writes.approvals.insert(id.clone(), previous),
                None => self.writes.approvals.remove(&id),
            };
            match before {
                Some(previous) => {
                    self.approvals.insert(id, previous);
                }
                None => {
                    if let Some(removed) = self.approvals.remove(&id) {
                        self.by_key
                            .remove(&(removed.agent_id, removed.idempotency_key));
                    }
                }
            }
        }
    }

    fn load(&self, approval_id: &str) -> Result<Approval, StoreError> {
        self.approvals.get(approval_id).cloned().ok_or_else(|| {
            DomainError::NotFound(format!("approval {approval_id} not found")).into()
        })
    }

    /// Keeps a new or changed approval for the rest of the batch and for the write.
    fn save(&mut self, approval: &Approval) {
        let before = self.approvals.get(&approval.id).cloned();
        if let Some(deadlines) = self.pending.get_mut(&approval.agent_id) {
            let was_pending = before.as_ref().is_some_and(Approval::is_pending);
            let old_deadline = before.as_ref().map(|b| b.expires_at);
            if was_pending {
                if let Some(at) = deadlines.iter().position(|&at| Some(at) == old_deadline) {
                    deadlines.swap_remove(at);
                }
                if approval.is_pending() {
                    // A timeout escalation moved the deadline.
                    deadlines.push(approval.expires_at);
                }
            } else if before.is_none() && approval.is_pending() {
                deadlines.push(approval.expires_at);
            }
        }
        if before.is_none() {
            self.by_key.insert(
                (approval.agent_id.clone(), approval.idempotency_key.clone()),
                approval.id.clone(),
            );
        }
        self.writes.encoded.remove(&approval.id);
        let written_before = self
            .writes
            .approvals
            .insert(approval.id.clone(), approval.clone());
        self.undo
            .push((approval.id.clone(), before, written_before));
        self.approvals.insert(approval.id.clone(), approval.clone());
    }

    /// Appends an event, chained to the newest one by its hash.
    fn append(
        &mut self,
        kind: EventKind,
        at: Millis,
        body: EventBody,
    ) -> Result<StoredEvent, StoreError> {
        let sealed = SealedEvent::of(kind, at, &body)?;
        Ok(self.append_sealed(sealed, body))
    }

    /// Appends an event made before: only its seq and hash depend on the order.
    fn append_sealed(&mut self, sealed: SealedEvent, body: EventBody) -> StoredEvent {
        let seq = self.head.seq + 1;
        let hash = chain_hash_at(&self.head.hash, &sealed.before_seq, seq);
        let prev_hash = std::mem::replace(
            &mut self.head,
            ChainHead {
                seq,
                hash: hash.clone(),
            },
        )
        .hash;
        self.writes.events.push(EventWrite {
            seq,
            approval_id: body.approval.id.clone(),
            kind: sealed.kind,
            at: sealed.at,
            body: sealed.text,
            columns: sealed.columns,
            prev_hash,
            hash,
        });
        StoredEvent {
            seq,
            kind: sealed.kind,
            at: sealed.at,
            approval: body.approval,
            decision: body.decision,
            delivery: body.delivery,
            detail: body.detail,
        }
    }

    fn append_event(
        &mut self,
        kind: EventKind,
        at: Millis,
        approval: &Approval,
        decision: Option<Decision>,
        delivery: Option<Delivery>,
    ) -> Result<StoredEvent, StoreError> {
        self.append(kind, at, event_body(approval, decision, delivery))
    }

    /// Keeps a new or revoked delegation for the rest of the batch and for the write.
    fn save_delegation(&mut self, delegation: Delegation) -> Applied {
        self.delegations
            .insert(delegation.id.clone(), delegation.clone());
        self.writes
            .delegations
            .insert(delegation.id.clone(), delegation.clone());
        Applied {
            reply: Reply::Delegation(delegation),
            events: Vec::new(),
        }
    }

    /// Saves a changed approval and logs the event that changed it.
    fn save_and_log(
        &mut self,
        approval: Approval,
        kind: EventKind,
        now: Millis,
        delivery: Option<Delivery>,
    ) -> Result<Applied, StoreError> {
        self.save(&approval);
        let event = self.append_event(kind, now, &approval, None, delivery)?;
        Ok(Applied {
            reply: Reply::Approval(approval),
            events: vec![event],
        })
    }

    fn apply_change(&mut self, change: Change, now: Millis) -> Result<Applied, StoreError> {
        match change {
            Change::Request {
                request,
                ttl_seconds,
                disposition,
                max_pending,
                prepared,
            } => self.request(
                request,
                ttl_seconds,
                disposition,
                max_pending,
                prepared,
                now,
            ),
            Change::Decide {
                approval_id,
                decision,
                edit,
                grant_ttl_seconds,
            } => {
                let mut approval = self.load(&approval_id)?;
                let effect = approval.decide(decision.clone(), edit, now)?;
                let mut events = Vec::new();
                if let Some(kind) = effect.event {
                    // The decision as recorded (with the version it settled on).
                    let recorded = (kind != EventKind::Expired)
                        .then(|| approval.decisions.last().cloned())
                        .flatten();
                    self.save(&approval);
                    events.push(self.append_event(kind, now, &approval, recorded, None)?);
                }
                if effect.grants_session {
                    let grant = BoundedGrant {
                        grant: Grant {
                            id: uuid::Uuid::now_v7().to_string(),
                            agent_id: approval.agent_id.clone(),
                            session_id: approval.session_id.clone(),
                            tool_name: approval.tool_name.clone(),
                            approval_id: approval.id.clone(),
                            granted_by: decision.approver,
                            created_at: now,
                            expires_at: (grant_ttl_seconds > 0)
                                .then(|| now + i64::from(grant_ttl_seconds) * 1000),
                            revoked_at: None,
                        },
                        max_risk_rank: approval.effective_risk().rank(),
                        max_required_approvals: i64::from(approval.effective_required_approvals()),
                        scope: approval.grant_scope.clone(),
                    };
                    self.grants.push(grant.clone());
                    self.writes.new_grants.push(grant);
                }
                Ok(Applied {
                    reply: Reply::Decided(effect.outcome, approval),
                    events,
                })
            }
            Change::RefuseDecision {
                approval_id,
                decision,
                why,
            } => {
                let approval = self.load(&approval_id)?;
                let body = EventBody {
                    approval,
                    decision: Some(decision),
                    delivery: None,
                    detail: Some(why),
                };
                let event = self.append(EventKind::DecisionRefused, now, body)?;
                Ok(Applied {
                    reply: Reply::Approval(event.approval.clone()),
                    events: vec![event],
                })
            }
            Change::RevokeGrant {
                grant_id,
                revoked_by,
                reason,
            } => self.revoke_grant(&grant_id, &revoked_by, &reason, now),
            Change::RecordRuleAccepted {
                approval_id,
                detail,
            } => {
                let approval = self.load(&approval_id)?;
                let body = EventBody {
                    approval,
                    decision: None,
                    delivery: None,
                    detail: Some(detail),
                };
                let event = self.append(EventKind::RuleAccepted, now, body)?;
                Ok(Applied {
                    reply: Reply::Approval(event.approval.clone()),
                    events: vec![event],
                })
            }
            Change::Cancel {
                approval_id,
                reason,
            } => {
                let mut approval = self.load(&approval_id)?;
                let kind = approval.cancel(&reason, now)?;
                self.save_and_log(approval, kind, now, None)
            }
            Change::Consume {
                approval_id,
                outcome,
                detail,
            } => {
                let mut approval = self.load(&approval_id)?;
                if approval.expire_if_due(now) {
                    return self.save_and_log(approval, EventKind::Expired, now, None);
                }
                let kind = approval.consume(outcome, &detail, now)?;
                self.save_and_log(approval, kind, now, None)
            }
            Change::RecordDelivery {
                approval_id,
                delivery,
            } => {
                let mut approval = self.load(&approval_id)?;
                let kind = approval.record_delivery(delivery.clone());
                self.save_and_log(approval, kind, now, Some(delivery))
            }
            Change::FollowUpDue => {
                let mut due: Vec<&Approval> = self
                    .approvals
                    .values()
                    .filter(|a| a.is_pending() && a.next_due() <= now)
                    .collect();
                due.sort_by(|a, b| (a.next_due(), &a.id).cmp(&(b.next_due(), &b.id)));
                let due: Vec<Approval> = due
                    .into_iter()
                    .take(EXPIRY_SWEEP_LIMIT as usize)
                    .cloned()
                    .collect();
                let mut events = Vec::with_capacity(due.len());
                for mut approval in due {
                    if let Some((kind, detail)) = approval.follow_up_if_due(now) {
                        self.save(&approval);
                        let body = EventBody {
                            approval,
                            decision: None,
                            delivery: None,
                            detail: Some(detail),
                        };
                        events.push(self.append(kind, now, body)?);
                    }
                }
                Ok(Applied {
                    reply: Reply::Count(events.len() as u64),
                    events,
                })
            }
            Change::CreateDelegation { delegation } => Ok(self.save_delegation(delegation)),
            Change::RevokeDelegation { delegation_id } => {
                let mut delegation =
                    self.delegations
                        .get(&delegation_id)
                        .cloned()
                        .ok_or_else(|| {
                            DomainError::NotFound(format!("delegation {delegation_id} not found"))
                        })?;
                if delegation.revoked_at.is_some() {
                    return Ok(Applied {
                        reply: Reply::Delegation(delegation),
                        events: Vec::new(),
                    });
                }
                delegation.revoked_at = Some(now);
                Ok(self.save_delegation(delegation))
            }
            Change::WritePasskey(write) => {
                self.writes.passkeys.push(write);
                Ok(Applied {
                    reply: Reply::Count(1),
                    events: Vec::new(),
                })
            }
            Change::PruneEvents { before } => {
                self.writes.prune_before =
                    Some(self.writes.prune_before.unwrap_or(before).max(before));
                Ok(Applied {
                    reply: Reply::Pruned,
                    events: Vec::new(),
                })
            }
            Change::UseClientAssertion {
                client_id,
                jti,
                expires_at,
            } => {
                let first = self
                    .used_client_assertions
                    .insert((client_id.clone(), jti.clone()));
                if first {
                    self.writes
                        .client_assertions
                        .push((client_id, jti, expires_at));
                }
                self.writes.forget_assertions_before = Some(now);
                Ok(Applied {
                    reply: Reply::FirstUse(first),
                    events: Vec::new(),
                })
            }
        }
    }

    fn request(
        &mut self,
        request: ApprovalRequest,
        ttl_seconds: u32,
        disposition: Disposition,
        max_pending: u32,
        prepared: Option<Box<PreparedRequest>>,
        now: Millis,
    ) -> Result<Applied, StoreError> {
        let key = (request.agent_id.clone(), request.idempotency_key.clone());
        if let Some(existing) = self.by_key.get(&key) {
            let approval = self.load(existing)?;
            if !approval.is_same_call(&request) {
                return Err(DomainError::AlreadyExists(format!(
                    "idempotency_key {:?} of agent {:?} was used for approval {} of another call (tool {:?}, session {:?}, arguments digest {}); a changed call needs a new idempotency_key",
                    request.idempotency_key, request.agent_id, approval.id, approval.tool_name, approval.session_id, approval.args_digest
                ))
                .into());
            }
            return Ok(Applied {
                reply: Reply::Requested(Requested {
                    approval,
                    created: false,
                }),
                events: Vec::new(),
            });
        }

        let needs_human = disposition == Disposition::RequireHuman;
        // A session grant never stands in for a step-up: such a call is always asked.
        let grant_id = if needs_human && !request.session_id.is_empty() && request.step_up.is_none()
        {
            self.covering_grant(&request, now)
        } else {
            None
        };
        let disposition = match grant_id {
            Some(grant_id) => Disposition::Resolve {
                verdict: Verdict::Approve,
                resolved_by: ResolvedBy::Grant,
                rule: None,
                reason: format!("session grant {grant_id}"),
                grant_id: Some(grant_id),
            },
            None => disposition,
        };
        if max_pending > 0 && disposition == Disposition::RequireHuman {
            let deadlines = self
                .pending
                .get(&request.agent_id)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let live = deadlines.iter().filter(|&&at| at > now);
            let pending = live.clone().count() as i64;
            let next_expiry = live.min().copied();
            check_pending_limit(&request.agent_id, pending, next_expiry, max_pending, now)?;
        }
        if let Some(prepared) =
            prepared.filter(|p| disposition == Disposition::RequireHuman && p.approval.is_pending())
        {
            let PreparedRequest {
                approval,
                row_body,
                requested,
            } = *prepared;
            self.save(&approval);
            self.writes.encoded.insert(approval.id.clone(), row_body);
            let event = self.append_sealed(requested, event_body(&approval, None, None));
            return Ok(Applied {
                reply: Reply::Requested(Requested {
                    approval,
                    created: true,
                }),
                events: vec![event],
            });
        }
        let approval = Approval::new(
            uuid::Uuid::now_v7().to_string(),
            request,
            ttl_seconds,
            disposition,
            now,
        );
        self.save(&approval);
        let mut events =
            vec![self.append_event(EventKind::Requested, now, &approval, None, None)?];
        if !approval.is_pending() {
            events.push(self.append_event(EventKind::Resolved, now, &approval, None, None)?);
        }
        Ok(Applied {
            reply: Reply::Requested(Requested {
                approval,
                created: true,
            }),
            events,
        })
    }

    /// The oldest active grant of the request's session and tool that covers its risk, quorum
    /// and argument scope (a grant covers no more than the approval that made it).
    /// A request that names groups is never covered: a grant does not stand for their members.
    fn covering_grant(&self, request: &ApprovalRequest, now: Millis) -> Option<String> {
        if !request.approver_groups.is_empty() {
            return None;
        }
        self.grants
            .iter()
            .filter(|g| {
                g.grant.agent_id == request.agent_id
                    && g.grant.session_id == request.session_id
                    && g.grant.tool_name == request.tool_name
                    && g.grant.is_active(now)
                    && g.max_risk_rank >= request.risk.rank()
                    && g.max_required_approvals >= i64::from(request.required_approvals)
                    && g.scope == request.grant_scope
            })
            .min_by_key(|g| g.grant.created_at)
            .map(|g| g.grant.id.clone())
    }

    fn revoke_grant(
        &mut self,
        grant_id: &str,
        revoked_by: &str,
        reason: &str,
        now: Millis,
    ) -> Result<Applied, StoreError> {
        let mut grant = self
            .grants
            .iter()
            .find(|g| g.grant.id == grant_id)
            .map(|g| g.grant.clone())
            .ok_or_else(|| DomainError::NotFound(format!("grant {grant_id} not found")))?;
        if grant.revoked_at.is_some() {
            return Ok(Applied {
                reply: Reply::Grant(grant),
                events: Vec::new(),
            });
        }
        let approval = self.load(&grant.approval_id)?;
        let mut detail = format!(
            "grant {grant_id} (agent {:?}, session {:?}, tool {:?}) revoked by {revoked_by}",
            grant.agent_id, grant.session_id, grant.tool_name
        );
        if !reason.is_empty() {
            detail.push_str(": ");
            detail.push_str(reason);
        }
        let body = EventBody {
            approval,
            decision: None,
            delivery: None,
            detail: Some(detail),
        };
        let event = self.append(EventKind::GrantRevoked, now, body)?;
        grant.revoked_at = Some(now);
        if let Some(stored) = self.grants.iter_mut().find(|g| g.grant.id == grant_id) {
            stored.grant.revoked_at = Some(now);
        }
        self.writes.revoked_grants.push((grant_id.to_owned(), now));
        Ok(Applied {
            reply: Reply::Grant(grant),
            events: vec![event],
        })
    }

    /// Signs the receipt of each approval a RESOLVED event of this change resolved by a
    /// verdict, with that event's seq, and keeps it on the approval (its row, the events'
    /// copies published to watchers, the reply). Infallible, so it needs no undo.
    fn sign_receipts(&mut self, applied: &mut Applied) {
        let Some(keys) = self.receipts.clone() else {
            return;
        };
        let resolved: Vec<(String, i64)> = applied
            .events
            .iter()
            .filter(|event| event.kind == EventKind::Resolved)
            .map(|event| (event.approval.id.clone(), event.seq))
            .collect();
        for (id, seq) in resolved {
            let Some(receipt) = self
                .approvals
                .get(&id)
                .filter(|approval| approval.receipt.is_none())
                .and_then(|approval| keys.sign(approval, seq))
            else {
                continue;
            };
            let reply_approval = match &mut applied.reply {
                Reply::Requested(requested) => Some(&mut requested.approval),
                Reply::Decided(_, approval) | Reply::Approval(approval) => Some(approval),
                Reply::Grant(_)
                | Reply::Delegation(_)
                | Reply::Count(_)
                | Reply::Pruned
                | Reply::FirstUse(_) => None,
            };
            for approval in applied
                .events
                .iter_mut()
                .map(|event| &mut event.approval)
                .chain(reply_approval)
                .chain(self.approvals.get_mut(&id))
                .chain(self.writes.approvals.get_mut(&id))
                .filter(|approval| approval.id == id && !approval.is_pending())
            {
                approval.receipt = Some(receipt.clone());
            }
            self.writes.encoded.remove(&id);
        }
    }

    /// With `storage.redact_arguments`: blanks the argument values of every approval this
    /// change resolved: in the approval written (events store none) and, through the write
    /// set, in events stored before migration 0007 (which do); and in what the change returns
    /// and publishes. The digest stays; the hash chain does not cover argument values.
    /// Arguments an approver edited stay until the call is consumed: the runtime, which knows
    /// only the arguments it sent, needs them to run the call.
    fn redact_resolved(&mut self, applied: &mut Applied) {
        let reply_approval = match &mut applied.reply {
            Reply::Requested(requested) => Some(&mut requested.approval),
            Reply::Decided(_, approval) | Reply::Approval(approval) => Some(approval),
            Reply::Grant(_)
            | Reply::Delegation(_)
            | Reply::Count(_)
            | Reply::Pruned
            | Reply::FirstUse(_) => None,
        };
        let mut resolved: Vec<String> = Vec::new();
        for approval in applied
            .events
            .iter_mut()
            .map(|event| &mut event.approval)
            .chain(reply_approval)
            .filter(|approval| !approval.is_pending())
        {
            redact(approval);
            if !resolved.contains(&approval.id) {
                resolved.push(approval.id.clone());
            }
        }
        for id in resolved {
            if let Some(approval) = self.approvals.get_mut(&id) {
                redact(approval);
            }
            if let Some(approval) = self.writes.approvals.get_mut(&id) {
                redact(approval);
                self.writes.encoded.remove(&id);
            }
            if !self.writes.redact.contains(&id) {
                self.writes.redact.push(id);
            }
        }
    }
}

/// Blanks a resolved approval's argument values, but an approved edit's until it is consumed.
fn redact(approval: &mut Approval) {
    if approval.state == State::Approved && approval.edit.is_some() {
        approval.arguments_json.clear();
    } else {
        approval.clear_argument_values();
    }
}

/// Refuses a new pending approval for an agent that has `max_pending` pending already, saying
/// when one of them expires at the latest.
fn check_pending_limit(
    agent_id: &str,
    pending: i64,
    next_expiry: Option<Millis>,
    max_pending: u32,
    now: Millis,
) -> Result<(), StoreError> {
    if pending < i64::from(max_pending) {
        return Ok(());
    }
    let retry = next_expiry
        .map(|at| {
            format!(
                ", or in {} s when the next one expires",
                (at - now + 999) / 1000
            )
        })
        .unwrap_or_default();
    Err(DomainError::ResourceExhausted(format!(
        "agent {agent_id:?} has {pending} pending approvals, the limit (limits.max_pending_per_agent) is {max_pending}; retry once one of them is decided or cancelled{retry}"
    ))
    .into())
}
