//! The Rust SDK of countersign, the control plane for human approval of AI-agent tool calls.
//!
//! Agent runtimes, the channel workers (Telegram, GitHub) and the `countersign` CLI all talk to
//! the server through this crate, so reconnects, resuming and fail-closed behaviour live here:
//!
//! - [`Client`]: one typed method per RPC, plus [`Client::request_and_wait`], which survives a
//!   server restart mid-wait (it retries with the same idempotency key and re-attaches to the
//!   same approval by id) and never turns an error or a timeout into an approval.
//! - [`Watch`]: a stream of the approvals routed to a channel that resumes from the last seq
//!   it delivered, with backoff and jitter, detects dead connections by missed heartbeats and
//!   re-snapshots when the server cannot resume.
//!
//! Agent side:
//!
//! ```no_run
//! use std::time::Duration;
//! use countersign_client::{pb, Client, ClientConfig};
//!
//! # async fn run() -> Result<(), countersign_client::ClientError> {
//! let mut config = ClientConfig::new("https://countersign.example.com:50051");
//! config.token = std::env::var("COUNTERSIGN_TOKEN").ok();
//! let client = Client::connect(config)?;
//! let request = pb::RequestApprovalRequest {
//!     agent_id: "coder-1".into(),
//!     session_id: "session-7".into(),
//!     idempotency_key: "call_abc123".into(),
//!     tool_name: "bash".into(),
//!     arguments_json: r#"{"command":"rm -rf build/"}"#.into(),
//!     action: "delete the build directory".into(),
//!     risk: pb::Risk::Medium.into(),
//!     routes: vec![pb::Route { channel: "telegram".into(), target: String::new() }],
//!     ..Default::default()
//! };
//! match client.request_and_wait(request, Duration::from_secs(300)).await {
//!     Ok(approval) if approval.state() == pb::ApprovalState::Approved => { /* run the tool */ }
//!     Ok(approval) => println!("not approved: {:?}", approval.state()),
//!     Err(error) => println!("no decision ({error}); not running"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Channel side: see [`Watch`] for reading approvals, [`Client::decide`] and
//! [`Client::record_delivery`] for answering them.

mod backoff;
mod client;
mod connection;
pub mod decider;
mod error;
pub mod gate;
pub mod groups;
pub mod receipts;
pub mod version;
mod watch;
pub mod withdrawal;

pub use client::Client;
pub use connection::ClientConfig;
pub use countersign_core::receipt::{ReceiptClaims, ReceiptError};
pub use countersign_proto::v1 as pb;
/// The protobuf timestamp used by the [`pb`] types.
pub use countersign_proto::Timestamp;
pub use error::ClientError;
/// The gRPC status carried by [`ClientError::Other`] and its code.
pub use tonic::{Code, Status};
pub use watch::{Watch, WatchCursor, WatchItem, WatchOptions};

// Workers move clients and watches into spawned tasks: keep them movable.
const _: () = {
    fn movable<T: Send + Sync + 'static>() {}
    fn movable_unshared<T: Send + 'static>() {}
    let _ = movable::<Client>;
    let _ = movable::<ClientConfig>;
    let _ = movable::<ClientError>;
    let _ = movable::<WatchItem>;
    let _ = movable_unshared::<Watch>;
};
