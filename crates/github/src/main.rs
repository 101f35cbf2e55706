//! `countersign-github`: the GitHub worker of countersign. See `--help` and the crate README.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_github::config::{
    ENV_APP_PRIVATE_KEY, ENV_GITHUB_TOKEN, ENV_WEBHOOK_SECRET, ENV_WORKER_TOKEN,
};
use countersign_github::Settings;
use countersign_worker::config::{WorkerSettings, WORKER_TOKEN_NEEDED};
use countersign_worker::logging::{self, LogFormat};

/// Posts countersign approval requests as GitHub issue comments and turns `/approve` and
/// `/reject <reason>` comments from people with write access into decisions.
#[derive(Debug, Parser)]
#[command(
    name = "countersign-github",
    version,
    after_help = secrets_help()
)]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, env = "COUNTERSIGN_GITHUB_CONFIG")]
    config: PathBuf,
    /// Log format (filter with RUST_LOG, default "info").
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "COUNTERSIGN_LOG_FORMAT"
    )]
    log_format: LogFormat,
}

fn secrets_help() -> String {
    format!(
        "Secrets may come from the environment instead of the file: {ENV_WORKER_TOKEN} (a worker \
         token for channel \"github\", {WORKER_TOKEN_NEEDED}), {ENV_GITHUB_TOKEN} (personal access token), {ENV_APP_PRIVATE_KEY} (GitHub App \
         key, PEM), {ENV_WEBHOOK_SECRET} (webhook secret)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    countersign_worker::shutdown::run_until_signal(
        "GitHub worker",
        Settings::load(&cli.config),
        countersign_github::run,
    )
    .await
}
