//! `countersign`: the command-line client of a countersign server.

mod agent;
mod args;
mod commands;
mod config_file;
mod exit;
mod instance;
mod local;
mod notify_config;
mod operator;
mod render;
mod rules_file;
mod settings;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, FullCli, HookCommand};
use crate::exit::Exit;

fn main() -> ExitCode {
    // The hook's own parser only for a line that starts with `hook`, as installed hooks' do:
    // before it, an option such as --help belongs to the whole command line.
    let parsed = if std::env::args().nth(1).as_deref() == Some("hook") {
        Cli::<HookCommand>::try_parse().map(FullCli::from)
    } else {
        FullCli::try_parse()
    };
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version end here too, on stdout and with success.
            let _ = error.print();
            let code = if !error.use_stderr() {
                Exit::Success.code()
            } else if is_hook(std::env::args()) {
                // Hosts go on with the tool call after most exit codes; 2 blocks it in all.
                HOOK_BLOCK
            } else {
                Exit::Usage.code()
            };
            return exit_code(code);
        }
    };
    // Diagnostics (reconnects, retries) go to stderr; RUST_LOG adjusts them. `up` logs as the
    // server does, with the format and level of its config file.
    if !matches!(cli.command, args::Command::Up(_)) {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_env_filter(
                EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
            )
            .init();
    }
    // A hook makes one call and answers: one thread does it, without starting (and waking)
    // a pool of workers on every tool call of the agent.
    let runtime = match if matches!(cli.command, args::Command::Hook(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(2);
        builder
    }
    .enable_all()
    .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("countersign: cannot start the async runtime: {error}");
            return exit_code(Exit::Failure.code());
        }
    };
    let code = runtime.block_on(commands::run(cli));
    // A read of stdin that its writer never closed (a hook's host) must not keep the process,
    // and so the host's wait, alive once the answer is out: dropping the runtime would wait
    // for that blocking read forever.
    runtime.shutdown_timeout(Duration::from_millis(100));
    exit_code(code)
}

/// The exit code Claude Code, Codex and Gemini CLI all read as "block this tool call".
const HOOK_BLOCK: i32 = 2;

/// The global options that take a value (the word after them is not a subcommand).
const GLOBALS_WITH_VALUES: [&str; 8] = [
    "--server",
    "--token",
    "--token-file",
    "--ca-cert",
    "--config",
    "--output",
    "-o",
    "--receipt-pin",
];

/// True when the command line runs `hook`: its first word that is not an option or an
/// option's value.
fn is_hook(args: impl Iterator<Item = String>) -> bool {
    let mut args = args.skip(1);
    while let Some(arg) = args.next() {
        if GLOBALS_WITH_VALUES.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            return arg == "hook";
        }
    }
    false
}

/// Process exit codes are one byte; anything outside it reports a failure.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(Exit::Failure as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_is_recognised_after_global_options_and_their_values() {
        fn line(words: &[&str]) -> impl Iterator<Item = String> {
            let words: Vec<String> = std::iter::once("countersign")
                .chain(words.iter().copied())
                .map(str::to_owned)
                .collect();
            words.into_iter()
        }
        assert!(is_hook(line(&["hook", "codex", "--bogus"])));
        assert!(is_hook(line(&[
            "--server", "http://x", "-o", "json", "hook"
        ])));
        assert!(!is_hook(line(&["--server", "hook", "list"])));
        assert!(is_hook(line(&["--receipt-pin", "Kx9", "hook", "gemini"])));
        assert!(!is_hook(line(&["request", "--tool", "hook"])));
        assert!(!is_hook(line(&["--bogus"])));
    }

    #[test]
    fn every_global_option_with_a_value_is_known_to_is_hook() {
        use clap::CommandFactory;
        for arg in FullCli::command().get_arguments() {
            if arg.is_global_set() && arg.get_action().takes_values() {
                let long = format!("--{}", arg.get_long().expect("global options are long"));
                assert!(GLOBALS_WITH_VALUES.contains(&long.as_str()), "{long}");
            }
        }
    }
}
