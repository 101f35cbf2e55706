//! Test support for countersign: fakes of the platforms on loopback.

pub mod github;
pub mod server;
pub mod telegram;
