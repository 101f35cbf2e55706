//! The email channel: each pending approval of the `email` channel becomes a mail to its
//! recipients with Approve / Reject… / Allow for session links (one-time decision links whose
//! pages decide on their POST); later changes (quorum progress, edited arguments) and the
//! outcome (decided here or elsewhere, expired, cancelled) follow as replies in the same
//! thread (`In-Reply-To` and `References` naming the request's Message-ID).
//!
//! A mail cannot be edited once sent, so each state gets a mail of its own, and each mail's
//! Message-ID is derived from the approval and the state it shows: a mail sent again after a
//! crash carries the Message-ID of the one that may have gone out.

use countersign_client::{pb, version, Client};
use countersign_links::store::NewLink;
use countersign_links::{expires_ms, LinkVerdict};
use countersign_worker::approval::{configured_places, record_delivery_once};
use countersign_worker::channel::Channel;
use countersign_worker::retry::{Classify, Verdict};
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;
use pb::ApprovalState;
use sha2::{Digest, Sha256};

use crate::api::{Mailer, SmtpError};
use crate::config::Settings;
use crate::render::{self, Links, Mail};
use crate::shown::{Store, StoreError};

/// The channel name this worker serves.
pub const CHANNEL: &str = "email";

/// Why one thread could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    #[error(transparent)]
    Smtp(#[from] SmtpError),
    /// The state database failed (a read, or the intent written before a send, without which
    /// nothing is sent): check its disk and permissions (`state_dir`).
    #[error("{0} (check the disk and the permissions of state_dir)")]
    Store(#[from] StoreError),
}

impl Classify for ShowError {
    fn verdict(&self) -> Verdict {
        match self {
            ShowError::Smtp(error) => error.verdict(),
            ShowError::Store(_) => Verdict::Retry { after: None },
        }
    }
}

pub struct EmailChannel {
    client: Client,
    mailer: Mailer,
    store: Store,
    settings: Settings,
}

impl Channel for EmailChannel {
    type Error = ShowError;

    fn name(&self) -> &str {
        CHANNEL
    }

    /// Brings every recipient's thread in line with the approval's state. A recipient refused
    /// for good (5xx) is logged and the others go on; when any failed for a reason that may
    /// pass, an error is returned and the retry shows every thread again (a thread up to date
    /// gets no mail).
    async fn show(&self, approval: &pb::Approval) -> Result<(), ShowError> {
        let mut retry = None;
        for address in self.recipients_of(approval) {
            let Err(error) = self.show_to(approval, address).await else {
                continue;
            };
            match error.verdict() {
                Verdict::Retry { .. } => {
                    tracing::warn!(approval_id = %approval.id, %address, %error, "cannot send now; will retry");
                    retry = Some(error);
                }
                Verdict::Final => {
                    tracing::error!(approval_id = %approval.id, %address, %error, "the SMTP relay refused the mail");
                }
            }
        }
        retry.map_or(Ok(()), Err)
    }

    async fn unfinished(&self) -> Result<Vec<String>, ShowError> {
        Ok(self.store.unfinished().await?)
    }
}

/// What a thread is to show for `approval`: `pending:<digest>:<approvals>` while pending (a
/// new approval of a quorum, or edited arguments, is a change worth a mail), else
/// `final:<STATE>`.
fn wanted(approval: &pb::Approval) -> String {
    if approval.state() == ApprovalState::Pending {
        format!(
            "pending:{}:{}",
            version::current_arguments(approval).1,
            version::current_approvals(approval).count()
        )
    } else {
        format!("final:{}", approval.state().as_str_name())
    }
}

impl EmailChannel {
    pub fn new(client: Client, mailer: Mailer, store: Store, settings: Settings) -> EmailChannel {
        EmailChannel {
            client,
            mailer,
            store,
            settings,
        }
    }

    async fn show_to(&self, approval: &pb::Approval, address: &str) -> Result<(), ShowError> {
        let pending = approval.state() == ApprovalState::Pending;
        let wanted = wanted(approval);
        let Some(known) = self.store.thread(&approval.id, address).await? else {
            // Never mailed: a resolved approval needs no mail.
            return if pending {
                self.send_request(approval, address, &wanted).await
            } else {
                Ok(())
            };
        };
        if known.shown.as_deref() == Some(wanted.as_str()) {
            return Ok(());
        }
        if pending && known.intended.starts_with("final:") {
            // An older copy of an approval already shown resolved.
            return Ok(());
        }
        if pending && !known.request_sent {
            // The request's send never got its answer (a crash, a lost connection): sent
            // again, same Message-ID.
            return self.send_request(approval, address, &wanted).await;
        }
        let mail = if pending {
            render::update(approval)
        } else {
            render::outcome(approval)
        };
        self.store
            .intend(&approval.id, address, &wanted, Vec::new())
            .await?;
        let message = self.message(approval, address, mail, Some(&wanted))?;
        self.mailer.send(message).await?;
        self.store
            .sent(&approval.id, address, &wanted, false)
            .await?;
        tracing::info!(approval_id = %approval.id, %address, state = ?approval.state(), "mailed a follow-up in the approval's thread");
        Ok(())
    }

    /// Sends the request with fresh links (stored, with the intent, before the send: the
    /// links of every mail that may have gone out keep working).
    async fn send_request(
        &self,
        approval: &pb::Approval,
        address: &str,
        wanted: &str,
    ) -> Result<(), ShowError> {
        let expires = expires_ms(approval);
        let base = &self.settings.public_url;
        let mint = |verdict| NewLink::mint(verdict, address, expires);
        let (approve, approve_link) = mint(LinkVerdict::Approve);
        let (reject, reject_link) = mint(LinkVerdict::Reject);
        let (session, session_link) = mint(LinkVerdict::AllowSession);
        let links = Links {
            approve: format!("{base}/decide/{approve}"),
            reject: format!("{base}/decide/{reject}"),
            allow_session: format!("{base}/decide/{session}"),
        };
        let message = self.message(approval, address, render::request(approval, &links), None)?;
        self.store
            .intend(
                &approval.id,
                address,
                wanted,
                vec![approve_link, reject_link, session_link],
            )
            .await?;
        self.mailer.send(message).await?;
        self.store.sent(&approval.id, address, wanted, true).await?;
        tracing::info!(approval_id = %approval.id, %address, "mailed the approval request");
        record_delivery_once(
            &self.client,
            approval,
            CHANNEL,
            address,
            self.message_id(&approval.id, None),
        )
        .await;
        Ok(())
    }

    /// The Message-ID of the approval's request (`shows` `None`) or of the follow-up showing
    /// `shows`: the same for a mail sent again.
    fn message_id(&self, approval_id: &str, shows: Option<&str>) -> String {
        let domain = self.settings.message_id_domain();
        match shows {
            None => format!("<countersign.{approval_id}@{domain}>"),
            Some(state) => format!(
                "<countersign.{approval_id}.{}@{domain}>",
                &hex::encode(Sha256::digest(state.as_bytes()))[..16]
            ),
        }
    }

    /// The mail to `address`: plain text and HTML alternatives, a follow-up (`shows` set)
    /// threaded under the request.
    fn message(
        &self,
        approval: &pb::Approval,
        address: &str,
        mail: Mail,
        shows: Option<&str>,
    ) -> Result<Message, SmtpError> {
        let to: Mailbox = address
            .parse()
            .map_err(|error| SmtpError::Setup(format!("recipient {address:?}: {error}")))?;
        let mut builder = Message::builder()
            .from(self.settings.from.clone())
            .to(to)
            .subject(mail.subject)
            .message_id(Some(self.message_id(&approval.id, shows)));
        if shows.is_some() {
            let root = self.message_id(&approval.id, None);
            builder = builder.in_reply_to(root.clone()).references(root);
        }
        // Base64 bodies: any line length and any character survive every relay.
        let part = |content_type: ContentType, body: String| {
            SinglePart::builder()
                .header(content_type)
                .header(ContentTransferEncoding::Base64)
                .body(body)
        };
        Ok(builder.multipart(
            MultiPart::alternative()
                .singlepart(part(ContentType::TEXT_PLAIN, mail.plain))
                .singlepart(part(ContentType::TEXT_HTML, mail.html)),
        )?)
    }

    /// The recipients an approval goes to: each `email` route's target (an address), the
    /// default recipient for an empty target, a target that is not a configured recipient
    /// (logged: an agent cannot mail anyone else), or an approval without routes.
    fn recipients_of(&self, approval: &pb::Approval) -> Vec<&str> {
        let default = self.settings.default_recipient.as_deref();
        configured_places(
            approval,
            CHANNEL,
            |target| self.settings.recipient(target).map(String::as_str),
            default.and_then(|address| self.settings.recipient(address).map(String::as_str)),
            "an email route names an address that is not a [[recipients]] entry: mailing the default recipient instead",
            "no email.default_recipient is configured for this approval's route: it is mailed to no one",
        )
    }
}
