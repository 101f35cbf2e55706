//! The one place where errors become gRPC statuses.

use countersign_core::Error as DomainError;
use tonic::Status;

use crate::store::StoreError;

pub fn status_of_domain(error: DomainError) -> Status {
    match error {
        e @ DomainError::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
        DomainError::NotFound(m) => Status::not_found(m),
        DomainError::AlreadyExists(m) => Status::already_exists(m),
        DomainError::FailedPrecondition(m) => Status::failed_precondition(m),
        DomainError::PermissionDenied(m) => Status::permission_denied(m),
        DomainError::ResourceExhausted(m) => Status::resource_exhausted(m),
    }
}

pub fn status_of(error: StoreError) -> Status {
    match error {
        StoreError::Domain(e) => status_of_domain(e),
        StoreError::Closed => Status::unavailable("the server is shutting down"),
        e @ StoreError::Unavailable(_) => Status::unavailable(e.to_string()),
        other => {
            tracing::error!(error = %other, "storage failure");
            Status::internal("storage failure; see the server log")
        }
    }
}
