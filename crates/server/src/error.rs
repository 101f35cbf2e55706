//! The one place where errors become gRPC statuses: the use cases' [`AppError`] (domain
//! refusals, storage failures, rate limits; defined in `crate::app`) and its parts.

use countersign_core::Error as DomainError;
use tonic::Status;

use crate::app::AppError;
use crate::store::backup::BackupError;
use crate::store::StoreError;

impl From<AppError> for Status {
    fn from(error: AppError) -> Status {
        match error {
            AppError::Domain(e) => status_of_domain(e),
            AppError::Store(e) => status_of(e),
            AppError::Backup(e) => status_of_backup(e),
            AppError::CursorOutOfRange(message) => Status::out_of_range(message),
            AppError::RateLimited { message, retry_ms } => {
                let mut status = Status::resource_exhausted(message);
                if let Ok(value) = retry_ms.to_string().parse() {
                    status.metadata_mut().insert("retry-after-ms", value);
                }
                status
            }
        }
    }
}

fn status_of_domain(error: DomainError) -> Status {
    match error {
        e @ DomainError::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
        DomainError::NotFound(m) => Status::not_found(m),
        DomainError::AlreadyExists(m) => Status::already_exists(m),
        DomainError::FailedPrecondition(m) => Status::failed_precondition(m),
        DomainError::PermissionDenied(m) => Status::permission_denied(m),
        DomainError::ResourceExhausted(m) => Status::resource_exhausted(m),
    }
}

fn status_of(error: StoreError) -> Status {
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

fn status_of_backup(error: BackupError) -> Status {
    match error {
        BackupError::Store(e) => status_of(e),
        e @ BackupError::FileName(_) => Status::invalid_argument(e.to_string()),
        e @ BackupError::Exists(_) => Status::already_exists(e.to_string()),
        e @ (BackupError::Postgres
        | BackupError::Broken { .. }
        | BackupError::NoDatabase(_)
        | BackupError::Write { .. }) => Status::failed_precondition(e.to_string()),
    }
}
