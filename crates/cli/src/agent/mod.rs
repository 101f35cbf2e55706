//! Agent integrations: what a coding agent or a script runs (the pre-tool hook, the MCP
//! server, `exec`, the "it's done" notices) and `install`/`doctor`, which wire them into an
//! agent's settings and check them.

pub mod codex_trust;
pub mod exec;
pub mod hook;
pub mod install;
pub mod mcp;
pub mod notify;
pub mod stop;
pub mod waiting;
