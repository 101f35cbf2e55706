//! `countersign-hook`: `countersign hook` in an executable of its own, which `countersign
//! install` writes into hosts' hook settings: it starts faster, since it links the hook's code
//! only (docs/performance.md, "The hook's added latency").

fn main() -> std::process::ExitCode {
    countersign_cli::hook_main()
}
