//! `countersign`: the command-line client of a countersign server.

mod args;
mod commands;
mod exec;
mod exit;
mod render;
mod settings;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::args::Cli;
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version end here too, on stdout and with success.
            let _ = error.print();
            let exit = if error.use_stderr() {
                Exit::Usage
            } else {
                Exit::Success
            };
            return exit_code(exit.code());
        }
    };
    // Diagnostics (reconnects, retries) go to stderr; RUST_LOG adjusts them.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("countersign: cannot start the async runtime: {error}");
            return exit_code(Exit::Failure.code());
        }
    };
    exit_code(runtime.block_on(commands::run(cli)))
}

/// Process exit codes are one byte; anything outside it reports a failure.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(Exit::Failure as u8))
}
