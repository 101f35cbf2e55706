//! `countersign-discord`: the Discord worker of countersign.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_discord::config::{BOT_TOKEN_ENV, WORKER_TOKEN_ENV};
use countersign_discord::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Posts countersign approval requests to Discord as messages with Approve, Reject… and Allow
/// for session buttons, and relays the taps (over the Gateway: no public URL needed).
#[derive(Debug, Parser)]
#[command(name = "countersign-discord", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_DISCORD_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {BOT_TOKEN_ENV} (the application's bot token; the \
         bot needs the View Channel, Send Messages and Read Message History permissions in \
         each channel) and {WORKER_TOKEN_ENV} (the worker token for the countersign server). \
         Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "discord worker",
        Settings::load(&cli.config),
        countersign_discord::run,
    )
    .await
}
