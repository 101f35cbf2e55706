//! Passkey step-up: registering an approver's passkey (a worker, the web inbox, relays the
//! browser's `create()` response) and checking the assertion a decision on a step-up approval
//! carries. The WebAuthn checks themselves are `countersign_core::webauthn`; the rule that a
//! step-up approval is approved only with a verified factor is the domain's
//! (`Approval::check_step_up`).

use countersign_core::fields::required;
use countersign_core::validate::validate_decider;
use countersign_core::webauthn::{self, Assertion, Registration, RelyingParty};
use countersign_core::{
    step_up, Approval, Decider, Decision, Error as DomainError, Millis, Scope, StepUp, StepUpProof,
};

use super::shared::App;
use crate::app::AppError;
use crate::caller::Caller;
use crate::config::Role;
use crate::store::{Passkey, PasskeyWrite};

/// The most passkeys one approver may register.
const MAX_PASSKEYS: usize = 20;
/// The longest nonce a step-up challenge is made with.
const MAX_NONCE_CHARS: usize = 128;

/// A browser's `create()` response, relayed by the inbox for the signed-in approver.
#[derive(Debug, Clone)]
pub struct NewPasskey {
    pub decider: Decider,
    pub challenge: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub attestation_object: Vec<u8>,
    pub name: String,
}

/// A browser's `get()` response for a step-up challenge.
#[derive(Debug, Clone, Default)]
pub struct PasskeyAssertion {
    pub nonce: String,
    pub credential_id: String,
    pub client_data_json: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub signature: Vec<u8>,
}

impl App {
    /// Verifies a `create()` response (WebAuthn §7.1, attestation "none") and stores the
    /// passkey for the decider's approver.
    pub async fn register_passkey(
        &self,
        caller: &Caller,
        input: NewPasskey,
    ) -> Result<Passkey, AppError> {
        caller.allow("RegisterPasskey", &[Role::Worker])?;
        validate_decider(&input.decider, "", "registration")?;
        caller.for_channel(&input.decider.channel)?;
        required("name", &input.name, 64)?;
        let rp = self.relying_party()?;
        let credential = webauthn::verify_registration(
            &rp,
            &input.challenge,
            &Registration {
                client_data_json: &input.client_data_json,
                attestation_object: &input.attestation_object,
            },
        )
        .map_err(|e| DomainError::invalid("attestation_object", e.to_string()))?;
        let approver = self.passkey_owner(&input.decider);
        let known = self.store.list_passkeys(&approver).await?;
        if known.len() >= MAX_PASSKEYS {
            return Err(DomainError::ResourceExhausted(format!(
                "{approver} has {MAX_PASSKEYS} passkeys, the most one approver may register"
            ))
            .into());
        }
        let passkey = Passkey {
            credential_id: webauthn::base64url(&credential.credential_id),
            approver: approver.clone(),
            name: input.name,
            cose_key: webauthn::base64url(&credential.cose_key),
            algorithm: credential.algorithm,
            sign_count: i64::from(credential.sign_count),
            created_at: crate::store::now_millis(),
        };
        self.store
            .write_passkey(PasskeyWrite::Register(passkey.clone()), passkey.created_at)
            .await?;
        // A credential id another approver registered keeps its row (the write leaves it).
        let stored = self.store.list_passkeys(&approver).await?;
        if !stored
            .iter()
            .any(|p| p.credential_id == passkey.credential_id)
        {
            return Err(DomainError::AlreadyExists(
                "this passkey is registered to another approver".into(),
            )
            .into());
        }
        tracing::info!(approver = %approver, credential_id = %passkey.credential_id, token = %caller.name, "passkey registered");
        Ok(passkey)
    }

    /// The decider's approver's passkeys and the relying party id they are made for (empty
    /// when passkeys are not configured).
    pub async fn list_passkeys(
        &self,
        caller: &Caller,
        decider: &Decider,
    ) -> Result<(Vec<Passkey>, String), AppError> {
        caller.allow("ListPasskeys", &[Role::Worker])?;
        validate_decider(decider, "", "list")?;
        caller.for_channel(&decider.channel)?;
        let rp_id = self
            .config
            .passkeys
            .relying_party()
            .ok()
            .flatten()
            .map(|rp| rp.id)
            .unwrap_or_default();
        let passkeys = self
            .store
            .list_passkeys(&self.passkey_owner(decider))
            .await?;
        Ok((passkeys, rp_id))
    }

    /// Removes one of the decider's approver's passkeys (a lost or replaced device): it
    /// approves nothing from then on. The passkey removed; NotFound when they have none of
    /// that id (another approver's included).
    pub async fn delete_passkey(
        &self,
        caller: &Caller,
        decider: &Decider,
        credential_id: &str,
    ) -> Result<Passkey, AppError> {
        caller.allow("DeletePasskey", &[Role::Worker])?;
        validate_decider(decider, "", "removal")?;
        caller.for_channel(&decider.channel)?;
        required("credential_id", credential_id, 1024)?;
        let approver = self.passkey_owner(decider);
        let Some(passkey) = self
            .store
            .list_passkeys(&approver)
            .await?
            .into_iter()
            .find(|p| p.credential_id == credential_id)
        else {
            return Err(DomainError::NotFound(format!(
                "{approver} has no passkey {credential_id:?}"
            ))
            .into());
        };
        let remove = PasskeyWrite::Remove {
            credential_id: passkey.credential_id.clone(),
            approver: approver.clone(),
        };
        self.store
            .write_passkey(remove, crate::store::now_millis())
            .await?;
        tracing::info!(approver = %approver, credential_id = %passkey.credential_id, token = %caller.name, "passkey removed");
        Ok(passkey)
    }

    /// The second factor of an approval of a step-up approval: the proof to record, a
    /// refusal for the decider (no assertion: where to approve instead; one that does not
    /// verify: why), or the store's error.
    pub(super) async fn step_up(
        &self,
        current: &Approval,
        decision: &Decision,
        passkey: Option<&PasskeyAssertion>,
        edited: bool,
        now: Millis,
    ) -> Result<Result<StepUpProof, DomainError>, AppError> {
        let Some(assertion) = passkey else {
            return Ok(Err(DomainError::PermissionDenied(
                self.where_to_step_up(current),
            )));
        };
        // Edits and session grants are refused whatever the assertion.
        if edited || decision.scope == Scope::Session {
            if let Err(refusal) =
                current.check_step_up(decision.verdict, decision.scope, None, edited)
            {
                return Ok(Err(refusal));
            }
        }
        let rp = match self.relying_party() {
            Ok(rp) => rp,
            Err(AppError::Domain(refusal)) => return Ok(Err(refusal)),
            Err(error) => return Err(error),
        };
        if assertion.nonce.is_empty() || assertion.nonce.chars().count() > MAX_NONCE_CHARS {
            return Ok(Err(DomainError::invalid(
                "passkey.nonce",
                format!("must be 1 to {MAX_NONCE_CHARS} characters"),
            )));
        }
        let owner = self.passkey_owner(&decision.decider);
        let passkeys = self.store.list_passkeys(&owner).await?;
        let Some(passkey) = passkeys
            .into_iter()
            .find(|p| p.credential_id == assertion.credential_id)
        else {
            return Ok(Err(DomainError::PermissionDenied(format!(
                "the passkey is not one {owner} registered"
            ))));
        };
        let cose_key = webauthn::from_base64url(&passkey.cose_key, "the stored public key")
            .map_err(|e| crate::store::StoreError::Corrupt(e.to_string()))?;
        // The challenge commits to this approval and the arguments as they are now: an
        // assertion made for another approval, or for another version, does not verify.
        let challenge = step_up::challenge(&current.id, current.current_digest(), &assertion.nonce);
        let verified = webauthn::verify_assertion(
            &rp,
            &challenge,
            &cose_key,
            u32::try_from(passkey.sign_count).unwrap_or(u32::MAX),
            &Assertion {
                client_data_json: &assertion.client_data_json,
                authenticator_data: &assertion.authenticator_data,
                signature: &assertion.signature,
            },
        );
        let sign_count = match verified {
            Ok(sign_count) => sign_count,
            Err(why) => {
                return Ok(Err(DomainError::PermissionDenied(format!(
                    "the passkey assertion is refused: {why}"
                ))))
            }
        };
        if sign_count != 0 {
            let credential_id = passkey.credential_id;
            let count = PasskeyWrite::Count {
                credential_id: credential_id.clone(),
                approver: passkey.approver,
                sign_count: i64::from(sign_count),
            };
            self.store.write_passkey(count, now).await?;
            tracing::debug!(%credential_id, sign_count, "passkey sign counter stored");
        }
        Ok(Ok(StepUpProof {
            method: StepUp::Passkey,
            credential_id: assertion.credential_id.clone(),
        }))
    }

    /// The refusal a decider without a passkey assertion gets (a chat tap): where to approve
    /// the approval with one. Short, so that a chat's answer shows it whole.
    fn where_to_step_up(&self, approval: &Approval) -> String {
        match &self.config.passkeys.inbox_url {
            Some(url) => format!(
                "this approval needs a passkey: approve it in the web inbox, {}/approvals/{}",
                url.trim_end_matches('/'),
                approval.id
            ),
            None => "this approval needs a passkey, and passkeys are not configured (passkeys.inbox_url)".into(),
        }
    }

    fn relying_party(&self) -> Result<RelyingParty, AppError> {
        match self.config.passkeys.relying_party() {
            Ok(Some(rp)) => Ok(rp),
            _ => Err(DomainError::FailedPrecondition(
                "passkeys are not configured: set passkeys.inbox_url to the web inbox's public URL"
                    .into(),
            )
            .into()),
        }
    }

    /// Whose passkeys a decider uses: the registry approver they are, or (without a
    /// registry) their channel identity.
    fn passkey_owner(&self, decider: &Decider) -> String {
        self.security
            .approvers
            .identify(decider)
            .map_or_else(|| decider.identity(), str::to_owned)
    }
}
