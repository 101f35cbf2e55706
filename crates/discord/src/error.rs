//! Why the worker stopped: the one error its entry point returns.

use countersign_client::ClientError;
use countersign_worker::runtime::RuntimeError;

use crate::shown::StoreError;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot set up the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the Discord Gateway refused the bot (check DISCORD_BOT_TOKEN): {0}")]
    Gateway(String),
    #[error("cannot serve Discord's interactions on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}
