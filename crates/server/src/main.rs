//! `countersign-server`: the approval server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use countersign_server::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

/// countersign: human approval of AI-agent tool calls, over gRPC, stored in SQLite.
///
/// Settings come from the TOML file given with --config (see config/countersign.example.toml),
/// then from these flags and environment variables, which win over the file.
#[derive(Debug, Parser)]
#[command(name = "countersign-server", version)]
struct Args {
    /// TOML configuration file.
    #[arg(long, env = "COUNTERSIGN_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:50051].
    #[arg(long, env = "COUNTERSIGN_LISTEN")]
    listen: Option<SocketAddr>,
    /// SQLite database file, created when missing [default: ./countersign.db].
    #[arg(long, env = "COUNTERSIGN_DATABASE")]
    database: Option<PathBuf>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "COUNTERSIGN_LOG_FORMAT", value_parser = ["text", "json"])]
    log_format: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(config) => config,
            Err(e) => {
                eprintln!("countersign-server: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(database) = args.database {
        config.database = database;
    }
    match args.log_format.as_deref() {
        Some("json") => config.log.format = LogFormat::Json,
        Some(_) => config.log.format = LogFormat::Text,
        None => {}
    }
    init_logging(&config);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("countersign-server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "countersign-server stopped");
            eprintln!("countersign-server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    countersign_server::serve(config, listener, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

fn init_logging(config: &Config) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
