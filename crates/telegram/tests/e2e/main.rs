//! End-to-end tests of the Telegram worker: a real countersign server (gRPC on loopback), the
//! worker (library entry point, and the binary), the fake Telegram Bot API on 127.0.0.1
//! serving the real response shapes, and the client SDK on the agent side.

mod binary;
mod ciba;
mod common;
mod cursor;
mod fake_bot_api;
mod faults;
mod groups;
mod worker;
