//! `countersign`: the command-line client of a countersign server.

fn main() -> std::process::ExitCode {
    countersign_cli::main()
}
