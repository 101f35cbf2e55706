//! Exit codes, and the errors that end the CLI with each of them.

use countersign_client::ClientError;

/// How `countersign` exits. `exec` exits with the command's own status when it ran it; every
/// other outcome has its own code, chosen outside the range most commands use (after the BSD
/// `sysexits.h` convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; `request --wait`: approved.
    Success = 0,
    /// Bad usage: an unknown flag, a missing or malformed argument, an unreadable config file.
    Usage = 64,
    /// The approval was rejected.
    Rejected = 65,
    /// The approval expired before anyone decided.
    Expired = 66,
    /// The approval was cancelled.
    Cancelled = 67,
    /// Still pending when the wait ended (`exec` cancels its request then).
    TimedOut = 68,
    /// The server could not be reached.
    Unavailable = 69,
    /// Any other error: the server refused the call (not found, invalid, ...) or answered
    /// something unexpected, or a local I/O error.
    Failure = 70,
    /// `approve` / `reject`: the approval was already resolved; the decision was not applied.
    NotApplied = 71,
    /// `verify-audit`: the audit trail does not verify.
    AuditBroken = 72,
    /// The server refused the token or the caller's permission.
    Denied = 77,
    /// `exec`: the command was approved but could not be started.
    CannotExecute = 126,
    /// `exec`: the command was approved but not found.
    CommandNotFound = 127,
}

impl Exit {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// An error that ends the CLI: what to print and which exit code to use.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("{0}")]
    Failure(String),
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::Failure(_) => Exit::Failure,
            CliError::Client(error) => match error {
                ClientError::Unavailable(_) => Exit::Unavailable,
                ClientError::Unauthenticated(_) | ClientError::PermissionDenied(_) => Exit::Denied,
                ClientError::Config(_) => Exit::Usage,
                _ => Exit::Failure,
            },
        }
    }
}
