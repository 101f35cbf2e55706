//! Passkeys (docs/security.md#passkey-step-up): approvers register them on `/passkeys` (the
//! browser's WebAuthn `create()` response goes to the server, which verifies and stores it),
//! remove them there
//! and approve step-up approvals with them (the approval page's form carries the challenge,
//! `assets/app.js` asks the browser for an assertion, the decision goes with it). The server
//! checks both; the inbox only relays.

use std::sync::Arc;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use countersign_client::{pb, ClientError};
use countersign_core::{step_up, webauthn};

use crate::app::App;
use crate::auth::{SignedForm, Viewer};
use crate::config::CHANNEL;
use crate::http::{render, FormFields, Refusal};
use crate::layout::Layout;
use crate::sessions::random_token;

/// The step-up part of a pending approval's decide form.
pub struct StepUpForm {
    /// Random; the challenge is made with it and the decision names it.
    pub nonce: String,
    /// base64url of `step_up::challenge(approval id, current digest, nonce)`.
    pub challenge: String,
    /// The approver's credential ids, comma-separated (the browser's allowCredentials).
    pub credentials: String,
}

impl StepUpForm {
    /// The form of approval `approval_id` at the version `current_digest`, for `viewer`'s
    /// passkeys.
    pub async fn of(
        app: &App,
        viewer: &Viewer,
        approval_id: &str,
        current_digest: &str,
    ) -> Result<StepUpForm, ClientError> {
        let listed = app.client.list_passkeys(decider(viewer)).await?;
        let nonce = random_token();
        let challenge = step_up::challenge(approval_id, current_digest, &nonce);
        Ok(StepUpForm {
            nonce,
            challenge: webauthn::base64url(&challenge),
            credentials: credential_ids(&listed.passkeys),
        })
    }
}

fn credential_ids(passkeys: &[pb::Passkey]) -> String {
    passkeys
        .iter()
        .map(|p| p.credential_id.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The viewer as the server knows deciders of channel `web`.
pub fn decider(viewer: &Viewer) -> pb::Decider {
    pb::Decider {
        channel: CHANNEL.to_owned(),
        user_id: viewer.approver.id.clone(),
        display_name: viewer.approver.name.clone(),
    }
}

/// The passkey assertion a decide form carries (app.js fills it in), when it carries one.
pub fn assertion_of(form: &FormFields) -> Result<Option<pb::PasskeyAssertion>, String> {
    let field = |name: &str| form.get(name).unwrap_or("").trim();
    if field("passkey_signature").is_empty() {
        return Ok(None);
    }
    let bytes = |name: &'static str| {
        webauthn::from_base64url(field(name), name)
            .map_err(|e| format!("Nothing was decided: the passkey's answer is damaged ({e})."))
    };
    Ok(Some(pb::PasskeyAssertion {
        nonce: field("nonce").to_owned(),
        credential_id: field("passkey_credential_id").to_owned(),
        client_data_json: bytes("passkey_client_data")?,
        authenticator_data: bytes("passkey_authenticator_data")?,
        signature: bytes("passkey_signature")?,
    }))
}

struct PasskeyRow {
    name: String,
    credential_id: String,
    algorithm: &'static str,
    created: String,
}

#[derive(Template)]
#[template(path = "passkeys.html")]
struct PasskeysPage {
    layout: Layout,
    passkeys: Vec<PasskeyRow>,
    /// Empty when the server has no `[passkeys] inbox_url`.
    rp_id: String,
    challenge: String,
    /// base64url of the approver id (WebAuthn's user handle).
    user_handle: String,
    user_name: String,
    credentials: String,
    message: String,
    error: String,
}

async fn page(
    app: &App,
    viewer: &Viewer,
    message: String,
    error: String,
) -> Result<Response, Refusal> {
    let listed = app.client.list_passkeys(decider(viewer)).await?;
    let mut challenge = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut challenge);
    Ok(render(&PasskeysPage {
        layout: Layout::of(app, viewer),
        passkeys: listed
            .passkeys
            .iter()
            .map(|p| PasskeyRow {
                name: p.name.clone(),
                credential_id: p.credential_id.clone(),
                algorithm: match i64::from(p.algorithm) {
                    webauthn::COSE_ES256 => "ES256",
                    webauthn::COSE_EDDSA => "EdDSA",
                    _ => "other",
                },
                created: crate::view::time_text(p.created_at.as_ref()),
            })
            .collect(),
        rp_id: listed.rp_id,
        challenge: webauthn::base64url(&challenge),
        user_handle: webauthn::base64url(viewer.approver.id.as_bytes()),
        user_name: viewer.approver.name.clone(),
        credentials: credential_ids(&listed.passkeys),
        message,
        error,
    }))
}

/// `/passkeys`: the approver's passkeys and the form that registers one.
pub async fn passkeys(State(app): State<Arc<App>>, viewer: Viewer) -> Result<Response, Refusal> {
    page(&app, &viewer, String::new(), String::new()).await
}

/// Registers the passkey the browser made (the form's `create()` response).
pub async fn register(
    State(app): State<Arc<App>>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    let field = |name: &str| form.get(name).unwrap_or("").trim();
    let decoded = (|| {
        Ok::<_, webauthn::WebauthnError>(pb::RegisterPasskeyRequest {
            decider: Some(decider(&viewer)),
            challenge: webauthn::from_base64url(field("challenge"), "challenge")?,
            client_data_json: webauthn::from_base64url(field("client_data"), "client_data")?,
            attestation_object: webauthn::from_base64url(
                field("attestation_object"),
                "attestation_object",
            )?,
            name: field("name").to_owned(),
        })
    })();
    let request = match decoded {
        Ok(request) => request,
        Err(e) => return refused(&app, &viewer, format!("No passkey was registered: {e}.")).await,
    };
    match app.client.register_passkey(request).await {
        Ok(passkey) => done(&app, &viewer, &passkey, "registered").await,
        Err(
            ClientError::InvalidArgument(why)
            | ClientError::AlreadyExists(why)
            | ClientError::FailedPrecondition(why)
            | ClientError::ResourceExhausted(why)
            | ClientError::PermissionDenied(why),
        ) => refused(&app, &viewer, format!("No passkey was registered: {why}")).await,
        Err(error) => Err(error.into()),
    }
}

/// Removes one of the viewer's passkeys (a lost or replaced device); it approves nothing
/// from then on.
pub async fn remove(
    State(app): State<Arc<App>>,
    SignedForm { viewer, form }: SignedForm,
) -> Result<Response, Refusal> {
    let credential_id = form.get("credential_id").unwrap_or("").trim();
    match app
        .client
        .delete_passkey(decider(&viewer), credential_id)
        .await
    {
        Ok(passkey) => done(&app, &viewer, &passkey, "removed").await,
        Err(ClientError::NotFound(why) | ClientError::InvalidArgument(why)) => {
            refused(&app, &viewer, format!("No passkey was removed: {why}")).await
        }
        Err(error) => Err(error.into()),
    }
}

/// The page again, saying what was done with `passkey` (`registered`, `removed`).
async fn done(
    app: &App,
    viewer: &Viewer,
    passkey: &pb::Passkey,
    done: &str,
) -> Result<Response, Refusal> {
    tracing::info!(approver = %viewer.approver.id, credential_id = %passkey.credential_id, done, "passkey changed");
    let message = format!("Passkey {:?} {done}.", passkey.name);
    page(app, viewer, message, String::new()).await
}

/// The page again with why nothing was registered or removed.
async fn refused(app: &App, viewer: &Viewer, why: String) -> Result<Response, Refusal> {
    let page = page(app, viewer, String::new(), why).await?;
    Ok((StatusCode::BAD_REQUEST, page).into_response())
}
