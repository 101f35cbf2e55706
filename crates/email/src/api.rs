//! The SMTP side: one session per mail (connect, TLS as configured, AUTH when a username is
//! set, MAIL FROM, RCPT TO, DATA, QUIT), through lettre with rustls.

use countersign_worker::retry::{Classify, Verdict};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{Smtp, TlsMode};

/// A send that failed.
#[derive(Debug, thiserror::Error)]
pub enum SmtpError {
    /// The relay refused (its code and text), or the connection, TLS or a reply failed.
    #[error("SMTP: {0}")]
    Send(#[from] lettre::transport::smtp::Error),
    /// The settings cannot make a client (a CA file that holds no certificate).
    #[error("SMTP settings: {0}")]
    Setup(String),
    /// The mail could not be built (an address lettre refuses).
    #[error("cannot build the mail: {0}")]
    Build(#[from] lettre::error::Error),
}

impl Classify for SmtpError {
    /// A 5xx reply is final (the relay refuses this mail for good); a 4xx, a lost
    /// connection or a timeout may pass.
    fn verdict(&self) -> Verdict {
        match self {
            SmtpError::Send(error) if error.is_permanent() => Verdict::Final,
            SmtpError::Send(_) => Verdict::Retry { after: None },
            SmtpError::Setup(_) | SmtpError::Build(_) => Verdict::Final,
        }
    }
}

/// The relay the mails go out through.
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

impl Mailer {
    pub fn new(smtp: &Smtp) -> Result<Mailer, SmtpError> {
        let mut builder =
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smtp.host.clone())
                .port(smtp.port)
                .timeout(Some(smtp.timeout));
        if smtp.tls != TlsMode::None {
            let mut parameters = TlsParameters::builder(smtp.host.clone());
            if let Some(pem) = &smtp.ca_pem {
                let certificate = Certificate::from_pem(pem)
                    .map_err(|error| SmtpError::Setup(format!("email.ca_file: {error}")))?;
                parameters = parameters.add_root_certificate(certificate);
            }
            let parameters = parameters.build_rustls()?;
            builder = builder.tls(match smtp.tls {
                TlsMode::Tls => Tls::Wrapper(parameters),
                // Required: a relay that does not offer STARTTLS gets nothing in plain text.
                _ => Tls::Required(parameters),
            });
        }
        if let (Some(username), Some(password)) = (&smtp.username, &smtp.password) {
            builder = builder.credentials(Credentials::new(username.clone(), password.clone()));
        }
        Ok(Mailer {
            transport: builder.build(),
        })
    }

    /// Sends `message` in one SMTP session; returns once the relay accepted it (250 after
    /// DATA).
    pub async fn send(&self, message: Message) -> Result<(), SmtpError> {
        self.transport.send(message).await?;
        Ok(())
    }
}
