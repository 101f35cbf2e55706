//! `countersign-telegram`: the Telegram worker of countersign.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_telegram::config::{BOT_TOKEN_ENV, WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED};
use countersign_telegram::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Shows countersign approval requests in Telegram with inline Approve / Reject / Allow for
/// session buttons, and relays the decisions to the countersign server.
#[derive(Debug, Parser)]
#[command(name = "countersign-telegram", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_TELEGRAM_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {BOT_TOKEN_ENV} (the bot token) and \
         {WORKER_TOKEN_ENV} (a worker token for channel \"telegram\", {WORKER_TOKEN_NEEDED}). \
         Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "Telegram worker",
        Settings::load(&cli.config),
        countersign_telegram::run,
    )
    .await
}
