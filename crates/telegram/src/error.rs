//! Why the worker stopped: the one error its entry point returns.

use countersign_client::ClientError;
use countersign_worker::outbox::OutboxError;
use countersign_worker::runtime::RuntimeError;

use crate::api::BotApiError;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("Telegram: {0}")]
    Telegram(#[from] BotApiError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}
