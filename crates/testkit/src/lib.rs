//! Test support for countersign: fakes of the platforms (Telegram, GitHub, ntfy, Slack, an SMTP relay) on loopback, a picture of a fake
//! Telegram message as a phone shows it, the test server, a private PostgreSQL cluster, and a record of the tests that depend on
//! the storage backend.

pub mod discord;
pub mod docs;
pub mod github;
pub mod http;
pub mod mitm;
pub mod ntfy;
pub mod phone;
pub mod postgres;
pub mod server;
pub mod slack;
pub mod smtp;
pub mod storage_use;
pub mod telegram;
