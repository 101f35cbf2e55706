//! `countersign-ntfy`: the ntfy worker of countersign.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_ntfy::config::{ACCESS_TOKEN_ENV, WORKER_TOKEN_ENV};
use countersign_ntfy::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Publishes countersign approval requests as ntfy push notifications with Approve, Reject
/// and Allow for session buttons, which decide through one-time tokens the buttons publish to
/// a reply topic on the same ntfy server (`reply_topic`), or through one-time links served by
/// this worker (`public_url`).
#[derive(Debug, Parser)]
#[command(name = "countersign-ntfy", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_NTFY_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {ACCESS_TOKEN_ENV} (the ntfy access token, sent as \
         a Bearer token; none for a server that needs none) and {WORKER_TOKEN_ENV} (the worker \
         token for the countersign server). Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "ntfy worker",
        Settings::load(&cli.config),
        countersign_ntfy::run,
    )
    .await
}
