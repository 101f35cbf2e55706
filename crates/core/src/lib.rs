//! The countersign domain: approvals, their state machine, decisions and quorum, the
//! canonical arguments digest and request validation. No I/O: the server feeds it the time.

pub mod approval;
pub mod digest;
pub mod error;
pub mod validate;

pub use approval::*;
pub use error::Error;
