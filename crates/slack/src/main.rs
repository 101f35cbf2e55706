//! `countersign-slack`: the Slack worker of countersign.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_slack::config::{
    APP_TOKEN_ENV, BOT_TOKEN_ENV, SIGNING_SECRET_ENV, WORKER_TOKEN_ENV,
};
use countersign_slack::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Posts countersign approval requests to Slack as messages with Approve, Reject… and Allow
/// for session buttons, and relays the taps (Socket Mode: no public URL needed).
#[derive(Debug, Parser)]
#[command(name = "countersign-slack", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_SLACK_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {BOT_TOKEN_ENV} (the bot token, xoxb-…; scopes \
         chat:write, channels:history, groups:history), {APP_TOKEN_ENV} (the app-level token, \
         xapp-…, scope connections:write, with Socket Mode and Interactivity on; Socket \
         Mode only), {SIGNING_SECRET_ENV} (the app's signing secret; mode = \"http\" only) and \
         {WORKER_TOKEN_ENV} (the worker token for the countersign server). Log levels: \
         RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "slack worker",
        Settings::load(&cli.config),
        countersign_slack::run,
    )
    .await
}
