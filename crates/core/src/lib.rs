//! The countersign domain: approvals, their state machine, decisions and quorum, the
//! canonical arguments digest, request validation, policy rules and the approver registry.
//! No I/O: the server feeds it the time and the configuration.

pub mod approval;
pub mod approvers;
pub mod canonical;
pub mod digest;
pub mod error;
pub mod fields;
pub mod groups;
pub mod policy;
pub mod receipt;
mod state_machine;
pub mod step_up;
pub mod validate;
pub mod webauthn;

pub use approval::*;
pub use error::Error;
pub use step_up::{StepUp, StepUpProof};
