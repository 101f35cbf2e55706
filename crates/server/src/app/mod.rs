//! The server's use cases, free of gRPC and HTTP: request, evaluate, decide, wait, cancel,
//! consume, record a delivery, read and list; and the admin's (audit trail, backups, grants,
//! delegations). Each takes domain inputs and the caller (a token's name, role and scope),
//! checks what the caller may do, the limits and the domain's rules, has the store persist the
//! change and returns domain values or an [`AppError`]. The gRPC services (`crate::service`)
//! and the HTTP standards endpoints (`crate::standards`) only convert wire types and map that
//! one error to a status.
//!
//! This file only declares and re-exports; what the use cases share ([`App`]) is `shared.rs`.

mod admin;
mod assertions;
mod callers;
mod decide;
mod error;
mod evaluate;
mod lifecycle;
pub(crate) mod observe;
mod passkeys;
mod rates;
mod reads;
mod request;
mod shared;
mod sweep;
mod watch;

#[cfg(test)]
mod tests;

pub(crate) use admin::{EventsQuery, GrantsQuery, NewDelegation, RuleAccepted};
pub(crate) use decide::DecideInput;
pub(crate) use error::AppError;
pub(crate) use evaluate::Evaluation;
pub(crate) use lifecycle::{ConsumeInput, DeliveryInput};
pub(crate) use passkeys::{NewPasskey, PasskeyAssertion};
pub(crate) use reads::ListQuery;

pub(crate) use shared::App;
pub(crate) use sweep::sweep;
pub(crate) use watch::{Watch, WatchItem};
