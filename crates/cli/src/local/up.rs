//! `up`: the whole of countersign for one machine in one process — the approval server on the
//! embedded SQLite, and every channel worker the config file sets up — running the same code
//! as the separate binaries (`countersign_server::serve`, and the workers' own entry points:
//! see `channels`).
//!
//! The tokens the pieces use to talk to each other are generated on first start into files
//! only the user can read; the server knows them by their SHA-256 only. Ctrl-C or SIGTERM
//! stops every piece gracefully; a piece that stops on its own error stops the others.

use countersign_server::config::{Role, TokenConfig};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::args::UpArgs;
use crate::exit::{CliError, Exit};
use crate::instance::{local_url, Instance, Token};
use crate::local::channels::{self, until_stopped, Pieces, WorkerRun};

pub async fn up(instance: &Instance, args: UpArgs) -> Result<Exit, CliError> {
    let mut loaded = instance.load_config()?;
    let mut server = std::mem::take(&mut loaded.server);
    if let Some(listen) = args.listen {
        server.listen = listen;
    }
    if server.tls.is_some() {
        return Err(CliError::Usage(format!(
            "config file {}: `up` serves plaintext for this machine; for TLS run countersign-server and the workers separately (docs/deployment.md)",
            instance.config_file.display()
        )));
    }
    countersign_server::logging::init(&server);
    std::fs::create_dir_all(&instance.data_dir).map_err(|error| {
        CliError::Failure(format!(
            "cannot create {}: {error}",
            instance.data_dir.display()
        ))
    })?;
    for token in Token::ALL {
        let value = instance.ensure_token(token)?;
        server.tokens.push(token_config(token, &value));
    }
    let worker_token = instance.ensure_token(Token::Worker)?;

    let listener = tokio::net::TcpListener::bind(server.listen)
        .await
        .map_err(|error| {
            CliError::Failure(format!(
                "cannot listen on {}: {error} (another `countersign up` or countersign-server running? set listen in {})",
                server.listen,
                instance.config_file.display()
            ))
        })?;
    let listen = listener
        .local_addr()
        .map_err(|error| CliError::Failure(format!("the listener has no address: {error}")))?;
    let url = local_url(listen);
    instance.record_server_url(&url)?;

    let pieces = Pieces {
        instance,
        server_url: url.clone(),
        worker_token,
        admin_token: instance.ensure_token(Token::Admin)?,
    };
    let approvers = server.approvers.len();
    let workers = channels::prepare(&mut loaded, &pieces)?;

    tracing::info!(
        grpc = %url,
        database = %countersign_server::config::Database::of(&server.database),
        config = %instance.config_file.display(),
        "countersign up: the approval server listens on {url}"
    );
    for worker in &workers {
        worker.announce(approvers);
    }
    if workers.is_empty() {
        tracing::warn!(
            "countersign up: no channel is configured, so nobody is asked: run `countersign setup telegram`, `countersign setup github` or `countersign setup web`, then start `countersign up` again"
        );
    }
    tracing::info!(
        "next: run `countersign install claude-code` in your project (--user for every project); `countersign doctor` checks everything; Ctrl-C stops"
    );

    let (stop, stopped) = watch::channel(false);
    let signals = {
        let stopped = stopped.clone();
        let stop = stop.clone();
        async move {
            tokio::select! {
                () = countersign_worker::shutdown::signal() => {
                    tracing::info!("countersign up: stopping");
                    let _ = stop.send(true);
                }
                () = until_stopped(stopped) => {}
            }
        }
    };
    let serving = {
        let stop = stop.clone();
        let shutdown = until_stopped(stopped.clone());
        async move {
            let served = countersign_server::serve(server, listener, shutdown).await;
            let _ = stop.send(true);
            served.map_err(|error| format!("the approval server stopped: {error}"))
        }
    };
    let workers: Vec<WorkerRun> = workers
        .into_iter()
        .map(|worker| worker.run(stopped.clone(), stop.clone()))
        .collect();
    let ((), served, worked) = tokio::join!(signals, serving, futures::future::join_all(workers));
    let worked = worked
        .into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map(drop);
    match served.and(worked) {
        Ok(()) => Ok(Exit::Success),
        Err(error) => {
            tracing::error!(%error, "countersign up stopped");
            Err(CliError::Failure(error))
        }
    }
}

/// The server's entry for a generated token: its digest, never its value.
pub(crate) fn token_config(token: Token, value: &str) -> TokenConfig {
    let (role, agents, channels) = match token {
        Token::Agent => (Role::Agent, vec!["*".to_owned()], Vec::new()),
        Token::Worker => (Role::Worker, Vec::new(), vec!["*".to_owned()]),
        Token::Admin => (Role::Admin, Vec::new(), Vec::new()),
    };
    TokenConfig {
        name: token.name().to_owned(),
        role,
        agents,
        channels,
        value_env: None,
        sha256: Some(hex::encode(Sha256::digest(value.as_bytes()))),
    }
}
