//! The local instance: `up` (the server and the channel workers in one process) and the
//! `setup` commands that connect a channel to it; `doctor`'s checks of it.

pub mod channels;
pub mod instance_check;
pub mod setup;
pub mod setup_discord;
pub mod setup_email;
pub mod setup_github;
pub mod setup_ntfy;
pub mod setup_slack;
pub mod setup_web;
pub mod up;
