//! `countersign-email`: the email worker of countersign.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_email::config::{SMTP_PASSWORD_ENV, WORKER_TOKEN_ENV};
use countersign_email::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Mails countersign approval requests over SMTP with Approve, Reject… and Allow for session
/// links, which open confirmation pages served by this worker; later changes and the outcome
/// follow in the same thread.
#[derive(Debug, Parser)]
#[command(name = "countersign-email", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_EMAIL_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {SMTP_PASSWORD_ENV} (the SMTP password of \
         email.username; none for a relay that needs no login) and {WORKER_TOKEN_ENV} (the \
         worker token for the countersign server). Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "email worker",
        Settings::load(&cli.config),
        countersign_email::run,
    )
    .await
}
