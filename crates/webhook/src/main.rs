//! `countersign-webhook`: the webhook worker of countersign, and its operator commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use countersign_webhook::config::{WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED};
use countersign_webhook::Settings;
use countersign_worker::config::WorkerSettings;
use countersign_worker::logging::{self, LogFormat};

/// Delivers countersign approval events to HTTP endpoints (Standard Webhooks signatures) with
/// one-time decision links. Without a command it runs the worker.
#[derive(Debug, Parser)]
#[command(name = "countersign-webhook", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_WEBHOOK_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Deliveries that failed for good (or for longer than the retry window).
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// Revokes every unused decision link of an approval.
    RevokeLinks {
        /// The approval id.
        approval_id: String,
    },
}

#[derive(Debug, Subcommand)]
enum DeadLetterAction {
    /// Lists the dead letters: number, endpoint, webhook-id, attempts, last error.
    List,
    /// Queues one dead letter again (same webhook-id, same body), due at once.
    Retry {
        /// Its number, as `list` shows it.
        number: i64,
    },
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {WORKER_TOKEN_ENV} (a worker token for channel \
         \"webhook\", {WORKER_TOKEN_NEEDED}) and, per endpoint, the variable its `secret_env` names (whsec_… \
         secrets, space-separated while rotating; COUNTERSIGN_WEBHOOK_SECRET_OPS in the example \
         configuration). Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let Some(config) = cli.config else {
        eprintln!("error: --config (or COUNTERSIGN_WEBHOOK_CONFIG) is required");
        return ExitCode::from(2);
    };
    let settings = match Settings::load(&config) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match cli.command {
        None => countersign_webhook::run(settings, countersign_worker::shutdown::signal())
            .await
            .map_err(|error| error.to_string()),
        Some(command) => operate(&settings, command).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn operate(settings: &Settings, command: Command) -> Result<(), String> {
    let store = countersign_webhook::open_store(settings)
        .await
        .map_err(|error| error.to_string())?;
    match command {
        Command::DeadLetters {
            action: DeadLetterAction::List,
        } => {
            let letters = store.dead_letters().await.map_err(|e| e.to_string())?;
            if letters.is_empty() {
                println!("no dead letters");
            }
            for letter in letters {
                println!(
                    "{}\t{}\t{}\t{}\tattempts={}\t{}",
                    letter.seq,
                    letter.endpoint,
                    letter.webhook_id,
                    letter.event_type,
                    letter.attempts,
                    letter.last_error.unwrap_or_default()
                );
            }
            Ok(())
        }
        Command::DeadLetters {
            action: DeadLetterAction::Retry { number },
        } => {
            if store
                .retry_dead_letter(number)
                .await
                .map_err(|e| e.to_string())?
            {
                println!("dead letter {number} queued again");
                Ok(())
            } else {
                Err(format!("there is no dead letter number {number}"))
            }
        }
        Command::RevokeLinks { approval_id } => {
            let revoked = store
                .links()
                .revoke(&approval_id)
                .await
                .map_err(|e| e.to_string())?;
            println!("revoked {revoked} decision link(s) of {approval_id}");
            Ok(())
        }
    }
}
