//! The CLI's tests through the real `countersign` binary, one test binary (linked once): each
//! module is a suite; `support` holds their shared helpers.

mod cli;
mod hooks;
mod install;
mod mcp;
mod policy;
mod quickstart;
mod setup_channels;
mod support;
mod up_channels;
