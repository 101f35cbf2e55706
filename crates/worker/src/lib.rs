//! The runtime every countersign channel worker (Telegram, GitHub, Slack, ntfy, the webhook
//! channel; the web inbox uses some of its pieces) shares, so that each channel crate keeps only its platform's parts
//! (rendering, parsing, API calls):
//!
//! - [`runtime::run`]: the loop itself — the watch with its persisted cursor (or a snapshot
//!   and reconciliation), lanes, retries, graceful shutdown — driving a [`channel::Channel`],
//!   which holds only platform operations. The pieces below are what it is built from.
//! - [`lanes::Lanes`]: one ordered queue per approval, many approvals in flight at once, so
//!   that one slow or failing approval never delays another; graceful shutdown finishes the
//!   writes in flight.
//! - [`retry`]: which platform failures are worth retrying ([`retry::Verdict`]: transport
//!   errors, 429 and every 5xx whatever its body; 4xx are final), a per-approval schedule
//!   with exponential backoff that never retries before the platform's retry-after, and the
//!   hold a retry-after puts on every call in its scope ([`retry::PlatformHold`]).
//! - [`outbox::Outbox`]: a durable local record of the intent of each platform write that
//!   creates something, so that a crash between the write and its record on the server is
//!   reconciled on restart instead of repeated blindly.
//! - [`cursor::Cursor`]: the persisted watch cursor, which only ever names a seq whose event
//!   and every earlier one were fully handled, so that a restarted worker resumes after it.
//! - [`agent_text`]: text an agent wrote, made unable to pass for the worker's own lines.
//! - [`approval`]: facts about an approval every channel shows the same way.
//! - [`facts`]: an approval's facts worked out once ([`facts::ApprovalFacts`]), which every
//!   renderer formats in its own markup.
//! - [`config`]: the `[server]` section and configuration errors every worker shares.
//! - [`metrics`]: the runtime's `/healthz` and `/metrics` on `[metrics] listen`.
//! - [`shutdown`]: the signals that ask a worker binary to stop.
//! - [`logging`]: how a worker binary logs.

pub mod agent_text;
pub mod approval;
pub mod channel;
pub mod config;
pub mod cursor;
pub mod facts;
pub mod lanes;
pub mod logging;
pub mod metrics;
pub mod outbox;
pub mod retry;
pub mod runtime;
pub mod shown;
pub mod shutdown;
