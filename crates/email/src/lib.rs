//! countersign's email worker.
//!
//! It watches the `email` channel of a countersign server through the client SDK and mails
//! each pending approval to its recipients through an SMTP relay (STARTTLS, TLS, or plain to
//! a relay on loopback; lettre with rustls): one multipart mail (plain text and HTML) with
//! Approve, Reject… and Allow for session links. The links are one-time decision links
//! (`countersign-links`, the webhook and ntfy channels' links): a link's GET only shows a
//! confirmation page (mail scanners open links), the page's POST decides, as channel `email`
//! and the recipient's address; a reject page asks for a reason. Quorum progress, edited
//! arguments and the outcome (decided here or elsewhere, expired, cancelled) follow as
//! replies in the same thread. It is a `Channel` of the shared worker runtime
//! (`countersign_worker::runtime`), which owns the loop: one lane per approval, retries,
//! graceful shutdown.
//!
//! [`run`] is the entry point of the `countersign-email` binary, of `countersign up`, of tests,
//! and of anything that runs the worker in its own process.

pub mod api;
mod channel;
pub mod config;
pub mod confirm;
mod error;
pub mod render;
pub mod shown;

use std::future::Future;

use countersign_client::Client;
use countersign_links::pages::Pages;
use countersign_worker::runtime;

use crate::api::Mailer;
use crate::channel::EmailChannel;
pub use crate::channel::CHANNEL;
pub use crate::config::Settings;
pub use crate::error::WorkerError;
use crate::shown::{Store, StoreError};

/// Runs the worker until `shutdown` completes (the sends in flight are then finished, within
/// the grace period, and it returns `Ok`) or an error that retrying cannot fix occurs.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let store = Store::open(&settings.database_path()).await?;
    let client = Client::connect(settings.runtime.server.client.clone())?;
    let mailer = Mailer::new(&settings.smtp)?;
    let form_key = store.links().form_key().await.map_err(StoreError::from)?;
    let pages = Pages::new(client.clone(), store.links().clone(), form_key, CHANNEL);
    let listen = settings.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| WorkerError::Listen {
            addr: listen,
            source,
        })?;
    tracing::info!(
        server = %settings.runtime.server.client.url,
        smtp = %settings.smtp.host,
        recipients = settings.recipients.len(),
        %listen,
        "email worker started"
    );
    let options = settings.runtime.options();
    let channel = EmailChannel::new(client.clone(), mailer, store, settings);
    let serve = async {
        axum::serve(listener, pages.router())
            .await
            .map_err(|source| WorkerError::Listen {
                addr: listen,
                source,
            })
    };
    tokio::select! {
        result = runtime::run(client, channel, options, shutdown) => Ok(result?),
        result = serve => result,
    }
}
