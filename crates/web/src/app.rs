//! What every request handler shares: the settings, the server's clients, the sessions, the
//! live view of the pending approvals and who may decide what.

use std::sync::Arc;

use countersign_client::Client;

use crate::config::Settings;
use crate::deciders::Deciders;
use crate::live::Live;
use crate::sessions::Sessions;

/// What every request handler shares.
pub struct App {
    pub settings: Settings,
    /// The worker token's client (channel `web`).
    pub client: Client,
    /// The admin token's client, when configured (audit timeline, grants).
    pub admin: Option<Client>,
    pub sessions: Sessions,
    pub live: Arc<Live>,
    /// Who may decide what (known with the admin token).
    pub deciders: Arc<Deciders>,
    /// Key of the CSRF tokens of proxy sign-in.
    pub(crate) csrf_key: [u8; 32],
    /// Turns true at shutdown: open event streams end, so the graceful shutdown can finish.
    pub closing: tokio::sync::watch::Receiver<bool>,
}
