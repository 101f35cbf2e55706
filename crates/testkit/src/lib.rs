//! Test support for countersign: fakes of the platforms on loopback, the test server, and a
//! private PostgreSQL cluster.

pub mod docs;
pub mod github;
pub mod postgres;
pub mod server;
pub mod telegram;
