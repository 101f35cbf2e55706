use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use countersign_proto::v1 as pb;
use pb::admin_service_client::AdminServiceClient;
use pb::approval_service_client::ApprovalServiceClient;
use tokio::time::Instant;

use crate::backoff::{log_retry, Backoff};
use crate::connection::{endpoint, AdminRpc, BearerAuth, ClientConfig, Connector, Rpc};
use crate::error::ClientError;
use crate::receipts::{digest_of, digest_to_run, ReceiptTrust};
use crate::watch::{Watch, WatchOptions};

/// How long a call may exceed the wait it asked the server for before the client gives up on
/// the connection: covers the network round trip and a busy server.
const WAIT_GRACE: Duration = Duration::from_secs(5);

/// The longest pause between retries in [`Client::request_and_wait`].
const RETRY_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A long-poll answered "still pending" sooner than this (and sooner than asked) was cut short,
/// e.g. by a server shutting down; the next one waits a backoff delay so as not to spin.
const EARLY_RETURN: Duration = Duration::from_secs(1);

/// A handle on a countersign server. Cheap to clone; clones share one connection.
///
/// ```no_run
/// use std::time::Duration;
/// use countersign_client::{pb, Client, ClientConfig};
///
/// # async fn run() -> Result<(), countersign_client::ClientError> {
/// let client = Client::connect(ClientConfig::new("http://127.0.0.1:50051"))?;
/// let approval = client
///     .request_and_wait(
///         pb::RequestApprovalRequest {
///             agent_id: "deploy-bot".into(),
///             idempotency_key: "tool-call-42".into(),
///             tool_name: "deploy".into(),
///             arguments_json: r#"{"env":"prod"}"#.into(),
///             action: "deploy v1.2 to prod".into(),
///             risk: pb::Risk::High.into(),
///             ..Default::default()
///         },
///         Duration::from_secs(600),
///     )
///     .await?;
/// // Only APPROVED means go ahead; still PENDING at the deadline, REJECTED, EXPIRED and
/// // CANCELLED all mean do not.
/// if approval.state() == pb::ApprovalState::Approved {
///     // ... deploy, then report the outcome:
///     client.consume(&approval.id, pb::ConsumeOutcome::Succeeded, "deployed").await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    url: String,
    connector: Connector,
    rpc: Rpc,
    admin: AdminRpc,
    receipts: Arc<ReceiptTrust>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Prepares a client. The connection is lazy: this never fails for an unreachable server;
    /// calls then fail with [`ClientError::Unavailable`]. It fails with [`ClientError::Config`]
    /// for a URL that is not `http://` or `https://`, an unusable CA certificate or token, a CA
    /// certificate given with an `http://` URL, or when called outside a Tokio runtime.
    pub fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        // The lazy channel spawns its connection task right away.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ClientError::Config(
                "Client::connect must be called within a Tokio runtime".into(),
            ));
        }
        let endpoint = endpoint(&config)?;
        let auth = BearerAuth::new(config.token.as_deref())?;
        // Both services share one connection.
        let channel = endpoint.connect_lazy();
        let rpc = ApprovalServiceClient::with_interceptor(channel.clone(), auth.clone());
        let admin = AdminServiceClient::with_interceptor(channel, auth.clone());
        Ok(Client {
            url: config.url,
            connector: Connector { endpoint, auth },
            rpc,
            admin,
            receipts: Arc::new(ReceiptTrust::default()),
        })
    }

    /// Checks decision receipts against the key set whose fingerprint is `pin` (the first
    /// key's id, as `countersign-server keys show` and `GetSigningKeys` give it); `None`: the
    /// key set the server serves, unpinned.
    pub fn with_receipt_pin(mut self, pin: Option<String>) -> Client {
        self.receipts = Arc::new(ReceiptTrust::pinned(pin));
        self
    }

    /// Keeps the pinned key set in `dir` between processes, so that a process that verifies
    /// one receipt (a hook) does not read the key set from the server each time. The file is
    /// checked against the pin like the server's answer; a rotation reads the set again.
    /// Without a pin nothing is kept. Call after [`Client::with_receipt_pin`].
    pub fn with_receipt_key_cache(mut self, dir: &std::path::Path) -> Client {
        self.receipts = Arc::new(self.receipts.cached_in(dir));
        self
    }

    /// The public keys receipts are signed with, as a JWKS document, and their fingerprint.
    pub async fn signing_keys(&self) -> Result<pb::SigningKeys, ClientError> {
        Ok(self
            .rpc
            .clone()
            .get_signing_keys(pb::GetSigningKeysRequest {})
            .await?
            .into_inner())
    }

    /// Verifies `approval`'s decision receipt before a call runs: signed by the pinned key
    /// set, for this approval, approving the arguments with digest `args_digest` (those about
    /// to run), not expired. [`ClientError::Receipt`] names what did not match.
    pub async fn verify_receipt(
        &self,
        approval: &pb::Approval,
        args_digest: &str,
    ) -> Result<countersign_core::receipt::ReceiptClaims, ClientError> {
        self.receipts
            .verify(&approval.receipt, &approval.id, args_digest, || async {
                Ok(self.signing_keys().await?.jwks_json)
            })
            .await
    }

    /// The server URL this client talks to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Creates an approval, or returns the existing one for the same
    /// `(agent_id, idempotency_key)` (then `created` is false). Policy may return it already
    /// resolved.
    pub async fn request_approval(
        &self,
        req: pb::RequestApprovalRequest,
    ) -> Result<pb::RequestApprovalResponse, ClientError> {
        Ok(self.rpc.clone().request_approval(req).await?.into_inner())
    }

    /// The approval as it is now ([`ClientError::NotFound`] for an unknown id).
    pub async fn get_approval(&self, approval_id: &str) -> Result<pb::Approval, ClientError> {
        let request = pb::GetApprovalRequest {
            approval_id: approval_id.to_owned(),
        };
        Ok(self.rpc.clone().get_approval(request).await?.into_inner())
    }

    /// One long-poll: returns the approval as soon as it is no longer pending, or still pending
    /// once `timeout` (capped by the server's maximum wait) has passed. The call itself gives
    /// up a few seconds after `timeout`, so a dead connection cannot hold it forever. For a
    /// wait that outlasts restarts and the server's cap, see [`Client::wait_until_resolved`].
    pub async fn wait_for_decision(
        &self,
        approval_id: &str,
        timeout: Duration,
    ) -> Result<pb::Approval, ClientError> {
        // 0 would mean "the server's maximum"; the shortest wait that still means "at most
        // `timeout`" is 1 ms.
        let timeout_ms = u32::try_from(timeout.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        let mut request = tonic::Request::new(pb::WaitForDecisionRequest {
            approval_id: approval_id.to_owned(),
            timeout_ms,
        });
        request.set_timeout(Duration::from_millis(timeout_ms.into()) + WAIT_GRACE);
        Ok(self
            .rpc
            .clone()
            .wait_for_decision(request)
            .await?
            .into_inner())
    }

    /// One page of approvals, newest first.
    pub async fn list_approvals(
        &self,
        req: pb::ListApprovalsRequest,
    ) -> Result<pb::ListApprovalsResponse, ClientError> {
        Ok(self.rpc.clone().list_approvals(req).await?.into_inner())
    }

    /// Withdraws a pending approval; it resolves as `CANCELLED`.
    pub async fn cancel_approval(
        &self,
        approval_id: &str,
        reason: &str,
    ) -> Result<pb::Approval, ClientError> {
        let request = pb::CancelApprovalRequest {
            approval_id: approval_id.to_owned(),
            reason: reason.to_owned(),
        };
        Ok(self
            .rpc
            .clone()
            .cancel_approval(request)
            .await?
            .into_inner())
    }

    /// Marks an approved call as executed, with its outcome; a second consume is refused
    /// ([`ClientError::FailedPrecondition`]).
    pub async fn consume(
        &self,
        approval_id: &str,
        outcome: pb::ConsumeOutcome,
        detail: &str,
    ) -> Result<pb::Approval, ClientError> {
        self.consume_ran(approval_id, "", outcome, detail).await
    }

    /// [`Client::consume`], also naming the version of the arguments that ran (its args
    /// digest: the approval's `edited_args_digest` when an approver edited the call, else
    /// `args_digest`). The server refuses ([`ClientError::FailedPrecondition`], nothing
    /// consumed) when that is not the approved version.
    pub async fn consume_ran(
        &self,
        approval_id: &str,
        args_digest: &str,
        outcome: pb::ConsumeOutcome,
        detail: &str,
    ) -> Result<pb::Approval, ClientError> {
        let request = pb::ConsumeRequest {
            approval_id: approval_id.to_owned(),
            outcome: outcome.into(),
            detail: detail.to_owned(),
            args_digest: args_digest.to_owned(),
        };
        Ok(self.rpc.clone().consume(request).await?.into_inner())
    }

    /// Records an approve or reject decision. A decider the server does not accept gets
    /// [`ClientError::PermissionDenied`].
    pub async fn decide(&self, req: pb::DecideRequest) -> Result<pb::DecideResponse, ClientError> {
        Ok(self.rpc.clone().decide(req).await?.into_inner())
    }

    /// Decides with a passkey assertion: the only way to approve an approval whose `step_up`
    /// is `"passkey"` (docs/security.md#passkey-step-up).
    pub async fn decide_with_passkey(
        &self,
        req: pb::DecideWithPasskeyRequest,
    ) -> Result<pb::DecideResponse, ClientError> {
        Ok(self
            .rpc
            .clone()
            .decide_with_passkey(req)
            .await?
            .into_inner())
    }

    /// Registers a passkey (a WebAuthn `create()` response) for the decider's approver.
    pub async fn register_passkey(
        &self,
        req: pb::RegisterPasskeyRequest,
    ) -> Result<pb::Passkey, ClientError> {
        Ok(self.rpc.clone().register_passkey(req).await?.into_inner())
    }

    /// The decider's approver's passkeys, and the relying party id they are made for.
    pub async fn list_passkeys(
        &self,
        decider: pb::Decider,
    ) -> Result<pb::ListPasskeysResponse, ClientError> {
        let request = pb::ListPasskeysRequest {
            decider: Some(decider),
        };
        Ok(self.rpc.clone().list_passkeys(request).await?.into_inner())
    }

    /// Removes one of the decider's approver's passkeys (its credential id, base64url).
    pub async fn delete_passkey(
        &self,
        decider: pb::Decider,
        credential_id: &str,
    ) -> Result<pb::Passkey, ClientError> {
        let request = pb::DeletePasskeyRequest {
            decider: Some(decider),
            credential_id: credential_id.to_owned(),
        };
        Ok(self.rpc.clone().delete_passkey(request).await?.into_inner())
    }

    /// Stores the platform message a worker created for an approval (one per approval,
    /// channel and target; a repeat replaces it).
    pub async fn record_delivery(
        &self,
        req: pb::RecordDeliveryRequest,
    ) -> Result<pb::Approval, ClientError> {
        Ok(self.rpc.clone().record_delivery(req).await?.into_inner())
    }

    /// One page of the audit trail: the events of one approval or of all, filtered by kind,
    /// agent, decider and time. Admin tokens only.
    pub async fn list_events(
        &self,
        req: pb::ListEventsRequest,
    ) -> Result<pb::ListEventsResponse, ClientError> {
        Ok(self.admin.clone().list_events(req).await?.into_inner())
    }

    /// Has the server recompute the audit hash chain; the answer names the first broken row,
    /// if any. Admin tokens only.
    pub async fn verify_audit(&self) -> Result<pb::VerifyAuditResponse, ClientError> {
        let request = pb::VerifyAuditRequest {};
        Ok(self.admin.clone().verify_audit(request).await?.into_inner())
    }

    /// Has the server write an online copy of its SQLite database to the new file
    /// `file_name` in its backup directory and verify the copy's audit chain. Admin tokens
    /// only; on PostgreSQL the answer is FAILED_PRECONDITION naming pg_dump.
    pub async fn backup_database(
        &self,
        file_name: &str,
    ) -> Result<pb::BackupDatabaseResponse, ClientError> {
        let request = pb::BackupDatabaseRequest {
            file_name: file_name.to_owned(),
        };
        Ok(self
            .admin
            .clone()
            .backup_database(request)
            .await?
            .into_inner())
    }

    /// One page of session grants, newest first. Admin tokens only.
    pub async fn list_grants(
        &self,
        req: pb::ListGrantsRequest,
    ) -> Result<pb::ListGrantsResponse, ClientError> {
        Ok(self.admin.clone().list_grants(req).await?.into_inner())
    }

    /// Revokes a session grant: it approves nothing from now on. Admin tokens only.
    pub async fn revoke_grant(
        &self,
        grant_id: &str,
        reason: &str,
    ) -> Result<pb::Grant, ClientError> {
        let request = pb::RevokeGrantRequest {
            grant_id: grant_id.to_owned(),
            reason: reason.to_owned(),
        };
        Ok(self.admin.clone().revoke_grant(request).await?.into_inner())
    }

    /// Records on the audit trail that a suggested rule was accepted (a RULE_ACCEPTED event
    /// on the newest approval of its evidence). Admin tokens only.
    pub async fn record_rule_accepted(
        &self,
        request: pb::RecordRuleAcceptedRequest,
    ) -> Result<pb::Approval, ClientError> {
        Ok(self
            .admin
            .clone()
            .record_rule_accepted(request)
            .await?
            .into_inner())
    }

    /// Lets `delegate` decide on behalf of `delegator` until `until`. Admin tokens only.
    pub async fn create_delegation(
        &self,
        req: pb::CreateDelegationRequest,
    ) -> Result<pb::Delegation, ClientError> {
        Ok(self
            .admin
            .clone()
            .create_delegation(req)
            .await?
            .into_inner())
    }

    /// The registered approvers with their risk ceilings (admin token).
    pub async fn list_approvers(&self) -> Result<Vec<pb::RegisteredApprover>, ClientError> {
        Ok(self
            .admin
            .clone()
            .list_approvers(pb::ListApproversRequest {})
            .await?
            .into_inner()
            .approvers)
    }

    /// Delegations to or from `approver` (everyone when empty), newest first; expired and
    /// revoked ones too with `include_inactive`. Admin tokens only.
    pub async fn list_delegations(
        &self,
        approver: &str,
        include_inactive: bool,
    ) -> Result<Vec<pb::Delegation>, ClientError> {
        let request = pb::ListDelegationsRequest {
            approver: approver.to_owned(),
            include_inactive,
        };
        Ok(self
            .admin
            .clone()
            .list_delegations(request)
            .await?
            .into_inner()
            .delegations)
    }

    /// Ends a delegation now. Admin tokens only.
    pub async fn revoke_delegation(
        &self,
        delegation_id: &str,
    ) -> Result<pb::Delegation, ClientError> {
        let request = pb::RevokeDelegationRequest {
            delegation_id: delegation_id.to_owned(),
        };
        Ok(self
            .admin
            .clone()
            .revoke_delegation(request)
            .await?
            .into_inner())
    }

    /// Requests an approval, then waits until it is resolved or `deadline` has passed.
    ///
    /// Returns the approval as the server last reported it: resolved, or still `PENDING` when
    /// the deadline passed. Only state `APPROVED` means go ahead.
    ///
    /// Survives a server restart or a broken connection: transient errors are retried with
    /// exponential backoff and jitter until the deadline. A lost `RequestApproval` is resent
    /// with the same idempotency key (one is generated when `req.idempotency_key` is empty), so
    /// the server never creates a second approval; the wait then re-attaches to the approval by
    /// id. When the deadline passes while the server is unreachable the last error is returned.
    /// Nothing here turns an error or a timeout into an approval (fail closed). The call may
    /// overrun the deadline by one connection attempt. An APPROVED answer is returned only
    /// when its decision receipt verifies ([`Client::verify_receipt`]) for the arguments sent
    /// (or an approver's edit of them); otherwise [`ClientError::Receipt`].
    pub async fn request_and_wait(
        &self,
        mut req: pb::RequestApprovalRequest,
        deadline: Duration,
    ) -> Result<pb::Approval, ClientError> {
        let deadline_at = Instant::now() + deadline;
        let arguments_json = req.arguments_json.clone();
        let mut approval = self.request_until(&mut req, deadline_at).await?;
        if approval.state() == pb::ApprovalState::Pending {
            approval = self.wait_resolved(&approval.id, deadline_at).await?;
        }
        if approval.state() == pb::ApprovalState::Approved {
            let requested_digest = digest_of(&arguments_json)?;
            self.verify_receipt(&approval, &digest_to_run(&approval, &requested_digest)?)
                .await?;
        }
        Ok(approval)
    }

    /// Requests an approval for a caller that will wait for it. A server unreachable at the
    /// first attempt is an error at once (UNAVAILABLE: nothing was sent). A call that broke
    /// after it may have reached the server (any other transient error: a restart tore the
    /// connection down while the answer was on its way) is resent with the same idempotency
    /// key (one is generated when `req.idempotency_key` is empty) until `deadline`, through
    /// the restart: the caller gets the approval the server may already hold, never a second
    /// one.
    pub async fn request_approval_resending(
        &self,
        mut req: pb::RequestApprovalRequest,
        deadline: Duration,
    ) -> Result<pb::Approval, ClientError> {
        let deadline_at = Instant::now() + deadline;
        ensure_idempotency_key(&mut req);
        match self.request_approval(req.clone()).await {
            Ok(response) => approval_of(response),
            Err(error) if error.is_transient() && !matches!(error, ClientError::Unavailable(_)) => {
                tracing::warn!(%error, agent_id = %req.agent_id, "requesting approval broke off; resending it");
                self.request_until(&mut req, deadline_at).await
            }
            Err(error) if error.retry_before(deadline_at).is_some() => {
                self.request_until(&mut req, deadline_at).await
            }
            Err(error) => Err(error),
        }
    }

    /// Sends `req` until it is answered, resending it on transient errors with the same
    /// idempotency key (generated when empty) until `deadline_at`; a rate limit is waited out
    /// when the server's retry-after ends before `deadline_at`.
    async fn request_until(
        &self,
        req: &mut pb::RequestApprovalRequest,
        deadline_at: Instant,
    ) -> Result<pb::Approval, ClientError> {
        ensure_idempotency_key(req);
        let mut backoff = Backoff::new(RETRY_MAX_BACKOFF);
        let approval = loop {
            match self.request_approval(req.clone()).await {
                Ok(response) => break approval_of(response)?,
                Err(error) if error.is_transient() && Instant::now() < deadline_at => {
                    log_retry!(backoff, %error, agent_id = %req.agent_id, "requesting approval failed; retrying");
                    pause(&mut backoff, deadline_at).await;
                }
                Err(error) => match error.retry_before(deadline_at) {
                    Some(retry_at) => {
                        tracing::warn!(%error, agent_id = %req.agent_id, "rate limited; retrying when the server said");
                        tokio::time::sleep_until(retry_at).await;
                    }
                    None => return Err(error),
                },
            }
        };
        tracing::debug!(approval_id = %approval.id, state = ?approval.state(), "approval requested");
        Ok(approval)
    }

    /// Waits until an existing approval is resolved or `deadline` has passed, with the same
    /// retries and the same answer as [`Client::request_and_wait`]: the approval as last
    /// reported (maybe still `PENDING`), or the last error when the server stayed unreachable.
    pub async fn wait_until_resolved(
        &self,
        approval_id: &str,
        deadline: Duration,
    ) -> Result<pb::Approval, ClientError> {
        self.wait_resolved(approval_id, Instant::now() + deadline)
            .await
    }

    async fn wait_resolved(
        &self,
        approval_id: &str,
        deadline_at: Instant,
    ) -> Result<pb::Approval, ClientError> {
        let mut backoff = Backoff::new(RETRY_MAX_BACKOFF);
        loop {
            let started = Instant::now();
            let remaining = deadline_at.saturating_duration_since(started);
            match self.wait_for_decision(approval_id, remaining).await {
                Ok(approval) => {
                    if approval.state() != pb::ApprovalState::Pending
                        || Instant::now() >= deadline_at
                    {
                        return Ok(approval);
                    }
                    if started.elapsed() < remaining.min(EARLY_RETURN) {
                        pause(&mut backoff, deadline_at).await;
                    } else {
                        backoff.reset();
                    }
                }
                Err(error) if error.is_transient() && Instant::now() < deadline_at => {
                    log_retry!(backoff, %error, approval_id, "waiting for the decision failed; re-attaching");
                    pause(&mut backoff, deadline_at).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Opens a watch of the approvals routed to `options.channel`: a snapshot of the pending
    /// ones, then every event once and in order, across reconnects. See [`Watch`].
    pub fn watch(&self, options: WatchOptions) -> Watch {
        Watch::new(self.connector.clone(), options)
    }
}

/// A resent request must be recognised as the same one.
fn ensure_idempotency_key(req: &mut pb::RequestApprovalRequest) {
    if req.idempotency_key.is_empty() {
        req.idempotency_key = uuid::Uuid::now_v7().to_string();
    }
}

fn approval_of(response: pb::RequestApprovalResponse) -> Result<pb::Approval, ClientError> {
    response.approval.ok_or_else(|| {
        ClientError::Other(tonic::Status::internal(
            "RequestApproval answered without an approval",
        ))
    })
}

/// Sleeps for the next backoff delay, but not past the deadline.
async fn pause(backoff: &mut Backoff, deadline_at: Instant) {
    let delay = backoff.next_delay();
    tokio::time::sleep_until((Instant::now() + delay).min(deadline_at)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_outside_a_runtime_is_a_config_error() {
        let error = Client::connect(ClientConfig::new("http://127.0.0.1:1")).unwrap_err();
        assert!(matches!(error, ClientError::Config(_)), "{error}");
    }

    #[tokio::test]
    async fn unusable_configurations_are_refused() {
        let mut with_ca_on_plaintext = ClientConfig::new("http://127.0.0.1:1");
        with_ca_on_plaintext.ca_cert_pem = Some(b"-----BEGIN CERTIFICATE-----".to_vec());
        let mut garbage_ca = ClientConfig::new("https://127.0.0.1:1");
        garbage_ca.ca_cert_pem = Some(b"not a certificate".to_vec());
        let mut token_with_newline = ClientConfig::new("http://127.0.0.1:1");
        token_with_newline.token = Some("abc\ndef".into());
        for config in [
            ClientConfig::new("127.0.0.1:50051"),
            ClientConfig::new("ftp://127.0.0.1:50051"),
            ClientConfig::new("http://bad host:1"),
            with_ca_on_plaintext,
            garbage_ca,
            token_with_newline,
        ] {
            let error = Client::connect(config.clone()).unwrap_err();
            assert!(
                matches!(error, ClientError::Config(_)),
                "{config:?}: {error}"
            );
        }
    }

    #[test]
    fn debug_output_hides_the_token() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.token = Some("s3cret-token".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret-token"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
