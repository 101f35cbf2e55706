//! `countersign`, the command-line client of a countersign server, as the library of its two
//! executables: `countersign` (every command) and `countersign-hook` (`countersign hook`
//! alone). Hosts run a hook on every tool call of an agent, and the dynamic loader's work at
//! each start grows with the binary: `countersign-hook` links the hook's code only, not the
//! server, the channel workers and the other commands (docs/performance.md).

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

use clap::{CommandFactory, FromArgMatches, Parser};
use tracing_subscriber::EnvFilter;

use crate::args::{Cli, FullCli, HookCommand};
use crate::exit::Exit;

/// `countersign ARGS`.
pub fn main() -> ExitCode {
    // The hook's own parser only for a line that starts with `hook`, as installed hooks' do:
    // before it, an option such as --help belongs to the whole command line.
    let parsed = if std::env::args().nth(1).as_deref() == Some("hook") {
        Cli::<HookCommand>::try_parse().map(FullCli::from)
    } else {
        FullCli::try_parse()
    };
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => return parse_failure(&error, is_hook(std::env::args())),
    };
    let hook = matches!(cli.command, args::Command::Hook(_));
    let up = matches!(cli.command, args::Command::Up(_));
    run_to_exit(hook, up, commands::run(cli))
}

/// `countersign-hook ARGS`, which is `countersign hook ARGS`. Nothing here reaches the other
/// commands, so the linker leaves them out of this executable.
pub fn hook_main() -> ExitCode {
    let mut words = std::env::args_os();
    let line = words
        .next()
        .into_iter()
        .chain(std::iter::once("hook".into()))
        .chain(words);
    // Its help and errors show the line as typed: `countersign-hook [OPTIONS] <HOST>`.
    let parser = Cli::<HookCommand>::command().mut_subcommand("hook", |hook| {
        hook.override_usage("countersign-hook [OPTIONS] <HOST>")
    });
    match parser
        .try_get_matches_from(line)
        .and_then(|matches| Cli::<HookCommand>::from_arg_matches(&matches))
    {
        Ok(cli) => run_to_exit(true, false, commands::run_hook(cli)),
        Err(error) => parse_failure(&error, true),
    }
}

/// A command line that does not parse: clap's message, and the exit code (--help and
/// --version end here too, on stdout and with success).
fn parse_failure(error: &clap::Error, hook: bool) -> ExitCode {
    let _ = error.print();
    let code = if !error.use_stderr() {
        Exit::Success.code()
    } else if hook {
        // Hosts go on with the tool call after most exit codes; 2 blocks it in all.
        HOOK_BLOCK
    } else {
        Exit::Usage.code()
    };
    exit_code(code)
}

/// Runs `work` (a parsed command) to its exit code: diagnostics on stderr, then a runtime,
/// one thread for a hook.
fn run_to_exit(hook: bool, up: bool, work: impl std::future::Future<Output = i32>) -> ExitCode {
    // Diagnostics (reconnects, retries) go to stderr; RUST_LOG adjusts them. `up` logs as the
    // server does, with the format and level of its config file.
    if !up {
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
    let runtime = match if hook {
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
    let code = runtime.block_on(work);
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
    fn a_receipt_pin_that_starts_with_a_hyphen_is_a_value() {
        let pin = "-XbsKDG3nS0ZrqVLV6NY3MkQ1WxdCo-HT7bQx1lpU5g";
        for line in [
            vec!["countersign", "hook", "claude-code", "--receipt-pin", pin],
            vec!["countersign", "--receipt-pin", pin, "hook", "claude-code"],
        ] {
            let cli = FullCli::try_parse_from(&line).unwrap();
            assert_eq!(cli.receipt_pin.as_deref(), Some(pin), "{line:?}");
        }
        let hook = Cli::<HookCommand>::try_parse_from([
            "countersign",
            "hook",
            "codex",
            "--receipt-pin",
            pin,
        ])
        .unwrap();
        assert_eq!(hook.receipt_pin.as_deref(), Some(pin));
    }

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
