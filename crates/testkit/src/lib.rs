//! Test support for countersign: fakes of the platforms (Telegram, GitHub, ntfy) on loopback, the test server, and a
//! private PostgreSQL cluster.

pub mod docs;
pub mod github;
pub mod ntfy;
pub mod postgres;
pub mod server;
pub mod telegram;
