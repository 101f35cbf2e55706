//! The signals that ask a worker binary to stop gracefully.

/// Completes on Ctrl-C or SIGTERM (a signal that cannot be listened for is never awaited).
pub async fn signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// The body of every worker binary's `main`: `settings` (or why they were refused, logged as
/// "cannot start"), then `run` with them until Ctrl-C or SIGTERM; failure is logged as
/// "the `worker` stopped". The process's exit code, the same for every worker: 0 stopped on
/// a signal, 1 settings refused or stopped on an error (clap exits 2 on an unusable command
/// line before this runs).
pub async fn run_until_signal<S, E, F, R>(
    worker: &str,
    settings: Result<S, E>,
    run: impl FnOnce(S, std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> F,
) -> std::process::ExitCode
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<(), R>>,
    R: std::fmt::Display,
{
    let settings = match settings {
        Ok(settings) => settings,
        Err(error) => {
            tracing::error!(%error, "cannot start");
            return std::process::ExitCode::FAILURE;
        }
    };
    match run(settings, Box::pin(signal())).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "the {worker} stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
