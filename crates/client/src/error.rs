use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

/// Everything a call through the SDK can fail with.
///
/// Each gRPC status the server uses has its own variant (carrying the server's message); other
/// statuses stay as [`ClientError::Other`]. No variant ever means "approved": code that gates an
/// action on an approval must act only on `Ok(approval)` with state
/// [`ApprovalState::Approved`](crate::pb::ApprovalState::Approved).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached, or the connection broke.
    #[error("server unavailable: {0}")]
    Unavailable(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// No token, or the server does not accept it.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// For example a second consume, or an idempotency key reused with other arguments.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// A size limit, a limit on pending approvals, or (on a watch) a consumer too slow for the
    /// server's buffer.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// A rate limit (RESOURCE_EXHAUSTED with `retry-after-ms`): the same call may succeed after
    /// `retry_after`.
    #[error("rate limited: {message}")]
    RateLimited {
        message: String,
        retry_after: Duration,
    },
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// Any other gRPC status.
    #[error("gRPC error: {0}")]
    Other(tonic::Status),
    /// The client configuration cannot be used (bad URL, CA certificate or token).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The approval's decision receipt does not verify: the call must not run. The message
    /// names what did not match (signature, key, approval id, arguments digest, expiry).
    #[error("the decision receipt does not verify: {0}")]
    Receipt(#[from] countersign_core::receipt::ReceiptError),
}

impl ClientError {
    /// True when the same call may succeed later: the server was unreachable, the connection
    /// broke mid-call, or the call timed out. Retrying a non-transient error cannot help.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unavailable(_) | ClientError::DeadlineExceeded(_) => true,
            // A connection torn down mid-call surfaces as CANCELLED or UNKNOWN (an h2 or
            // transport error), a server-side abort as ABORTED. A server going away (HTTP/2
            // GOAWAY during a restart) surfaces as INTERNAL carrying the transport error.
            ClientError::Other(status) => match status.code() {
                Code::Cancelled | Code::Unknown | Code::Aborted => true,
                Code::Internal => std::error::Error::source(status)
                    .is_some_and(|source| source.is::<tonic::transport::Error>()),
                _ => false,
            },
            _ => false,
        }
    }

    /// How long the server asked to wait before the same call (a rate limit); `None` for every
    /// other error.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// When to send a rate-limited call again: after the server's retry-after, when that is
    /// before `deadline_at`; `None` for any other error, or a retry the deadline leaves no
    /// room for.
    pub fn retry_before(&self, deadline_at: Instant) -> Option<Instant> {
        let retry_at = Instant::now() + self.retry_after()?;
        (retry_at < deadline_at).then_some(retry_at)
    }

    /// The gRPC status code this error corresponds to (`None` for [`ClientError::Config`]).
    pub fn code(&self) -> Option<Code> {
        Some(match self {
            ClientError::Unavailable(_) => Code::Unavailable,
            ClientError::NotFound(_) => Code::NotFound,
            ClientError::InvalidArgument(_) => Code::InvalidArgument,
            ClientError::PermissionDenied(_) => Code::PermissionDenied,
            ClientError::Unauthenticated(_) => Code::Unauthenticated,
            ClientError::AlreadyExists(_) => Code::AlreadyExists,
            ClientError::FailedPrecondition(_) => Code::FailedPrecondition,
            ClientError::ResourceExhausted(_) | ClientError::RateLimited { .. } => {
                Code::ResourceExhausted
            }
            ClientError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            ClientError::Other(status) => status.code(),
            ClientError::Config(_) | ClientError::Receipt(_) => return None,
        })
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::Unavailable => ClientError::Unavailable(message),
            Code::NotFound => ClientError::NotFound(message),
            Code::InvalidArgument => ClientError::InvalidArgument(message),
            Code::PermissionDenied => ClientError::PermissionDenied(message),
            Code::Unauthenticated => ClientError::Unauthenticated(message),
            Code::AlreadyExists => ClientError::AlreadyExists(message),
            Code::FailedPrecondition => ClientError::FailedPrecondition(message),
            Code::ResourceExhausted => match retry_after_of(&status) {
                Some(retry_after) => ClientError::RateLimited {
                    message,
                    retry_after,
                },
                None => ClientError::ResourceExhausted(message),
            },
            Code::DeadlineExceeded => ClientError::DeadlineExceeded(message),
            _ => ClientError::Other(status),
        }
    }
}

/// The server's `retry-after-ms` metadata on a rate-limit refusal.
fn retry_after_of(status: &tonic::Status) -> Option<Duration> {
    let millis = status.metadata().get("retry-after-ms")?.to_str().ok()?;
    millis.parse().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_status_is_transient_only_when_the_transport_broke() {
        let server_bug = ClientError::from(tonic::Status::internal("storage failure"));
        assert!(!server_bug.is_transient());
        let endpoint = tonic::transport::Endpoint::from_static("http://[::1]:1");
        let transport = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(endpoint.connect())
            .unwrap_err();
        let mut gone = tonic::Status::internal("h2 protocol error: http2 error");
        gone.set_source(std::sync::Arc::new(transport));
        assert!(ClientError::from(gone).is_transient());
    }

    #[test]
    fn statuses_map_to_their_variants_and_back() {
        let codes = [
            Code::Unavailable,
            Code::NotFound,
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::OutOfRange,
            Code::Internal,
        ];
        for code in codes {
            let error = ClientError::from(tonic::Status::new(code, "why"));
            assert_eq!(error.code(), Some(code));
            assert!(error.to_string().contains("why"), "{error}");
        }
        assert!(matches!(
            ClientError::from(tonic::Status::internal("x")),
            ClientError::Other(_)
        ));
        let mut limited = tonic::Status::resource_exhausted("over the rate");
        limited
            .metadata_mut()
            .insert("retry-after-ms", "1500".parse().unwrap());
        let limited = ClientError::from(limited);
        assert_eq!(limited.retry_after(), Some(Duration::from_millis(1500)));
        assert_eq!(limited.code(), Some(Code::ResourceExhausted));
        assert!(!limited.is_transient());
    }

    #[test]
    fn only_connection_and_timeout_errors_are_transient() {
        let transient = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
            Code::Aborted,
        ];
        for code in transient {
            assert!(ClientError::from(tonic::Status::new(code, "")).is_transient());
        }
        let permanent = [
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::ResourceExhausted,
            Code::Internal,
        ];
        for code in permanent {
            assert!(!ClientError::from(tonic::Status::new(code, "")).is_transient());
        }
        assert!(!ClientError::Config("bad url".into()).is_transient());
    }
}
