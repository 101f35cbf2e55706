//! Why the worker stopped: the one error its entry point returns.

use countersign_client::ClientError;
use countersign_worker::runtime::RuntimeError;
use slack_morphism::errors::SlackClientError;

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
    #[error("cannot set up the Slack client: {0}")]
    Tls(#[from] std::io::Error),
    #[error("cannot start Socket Mode (check SLACK_APP_TOKEN and that Socket Mode is on): {0}")]
    SocketMode(#[from] SlackClientError),
    #[error("cannot serve Slack's requests on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
