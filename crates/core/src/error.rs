use thiserror::Error;

/// Everything the domain can refuse. The gRPC edge maps each variant to one status code.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    ResourceExhausted(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}
