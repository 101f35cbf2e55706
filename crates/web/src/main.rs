//! `countersign-web`: the web inbox of countersign, and its admin commands.

use countersign_worker::config::WorkerSettings;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use countersign_web::config::{ADMIN_TOKEN_ENV, WORKER_TOKEN_ENV, WORKER_TOKEN_NEEDED};
use countersign_web::sessions::{Approver, Sessions};
use countersign_web::Settings;
use countersign_worker::logging::{self, LogFormat};

/// A browser inbox where approvers see every pending countersign approval live, read the
/// full call and decide one by one or in batches. Without a command it serves the inbox.
#[derive(Debug, Parser)]
#[command(name = "countersign-web", version, after_help = secrets_help())]
struct Cli {
    /// The TOML configuration file.
    #[arg(long, short, env = "COUNTERSIGN_WEB_CONFIG")]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "COUNTERSIGN_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the inbox (the default).
    Serve,
    /// Print a one-time login link for an approver (built-in sign-in). The approver id must be
    /// the approver's `web` identity in the server's [[approvers]].
    IssueLogin {
        /// The approver's web identity.
        #[arg(long)]
        approver: String,
        /// Display name (default: the id).
        #[arg(long)]
        name: Option<String>,
    },
    /// Sign an approver out everywhere: revoke their sessions and unused login links.
    RevokeSessions {
        #[arg(long)]
        approver: String,
    },
}

fn secrets_help() -> String {
    format!(
        "Secrets come from the environment: {WORKER_TOKEN_ENV} (a worker token for channel \
         \"web\", {WORKER_TOKEN_NEEDED}) and, optionally, {ADMIN_TOKEN_ENV} (an admin token: audit timeline and \
         grants). Log levels: RUST_LOG (default info)."
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let settings = match Settings::load(&cli.config) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("countersign-web: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => countersign_web::run(settings, countersign_worker::shutdown::signal())
            .await
            .map_err(|error| error.to_string()),
        Command::IssueLogin { approver, name } => issue_login(&settings, approver, name).await,
        Command::RevokeSessions { approver } => revoke_sessions(&settings, &approver).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("countersign-web: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn issue_login(settings: &Settings, id: String, name: Option<String>) -> Result<(), String> {
    let sessions = Sessions::open(&settings.state_dir)
        .await
        .map_err(|error| error.to_string())?;
    let approver = Approver {
        name: name.unwrap_or_else(|| id.clone()),
        id,
    };
    let token = sessions
        .issue_login(&approver, settings.login_ttl)
        .await
        .map_err(|error| error.to_string())?;
    println!("{}/login/{token}", settings.public_url);
    eprintln!(
        "One-time link for {} ({}), valid for {} minutes.",
        approver.name,
        approver.id,
        settings.login_ttl.as_secs() / 60
    );
    Ok(())
}

async fn revoke_sessions(settings: &Settings, approver: &str) -> Result<(), String> {
    let sessions = Sessions::open(&settings.state_dir)
        .await
        .map_err(|error| error.to_string())?;
    let revoked = sessions
        .revoke_approver(approver)
        .await
        .map_err(|error| error.to_string())?;
    println!("revoked {revoked} session(s) of {approver}");
    Ok(())
}
