//! Why the worker stopped: the one error its entry point returns.

use countersign_client::ClientError;
use countersign_worker::runtime::RuntimeError;

use crate::api::SmtpError;
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
    #[error(transparent)]
    Smtp(#[from] SmtpError),
    #[error("cannot serve the decision links on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
