//! How a worker binary logs: `tracing` to stderr (stdout stays for what a subcommand prints),
//! as text or JSON, at the level `RUST_LOG` names (default `info`).

use tracing_subscriber::EnvFilter;

/// The `--log-format` of every worker binary.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
