//! The CLI's tests through the real `countersign` binary, one test binary (linked once): each
//! module is a suite; `support` holds their shared helpers.

mod claude_session;
mod cli;
mod hooks;
mod install;
mod mcp;
mod notify;
mod policy;
mod policy_report;
mod quickstart;
mod rate_limits;
mod receipts;
mod rules_suggest;
mod setup_channels;
mod setup_discord;
mod setup_email;
mod setup_ntfy;
mod setup_slack;
mod support;
mod up_channels;
mod version;
