//! Why the worker stopped: the one error its entry point returns.

use std::net::SocketAddr;

use countersign_client::ClientError;
use countersign_worker::outbox::OutboxError;
use countersign_worker::runtime::RuntimeError;

use crate::api::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    GitHub(#[from] ApiError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error("cannot listen for webhooks on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("a worker task ended unexpectedly: {0}")]
    Task(String),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{0} (check the disk and the permissions of state_dir)")]
    Outbox(#[from] OutboxError),
}
