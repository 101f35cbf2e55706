//! `up`: the whole of countersign for one machine in one process — the approval server on the
//! embedded SQLite, and every channel worker the config file sets up — running the same code
//! as the separate binaries (`countersign_server::serve`, `countersign_telegram::run`,
//! `countersign_ntfy::run`).
//!
//! The tokens the pieces use to talk to each other are generated on first start into files
//! only the user can read; the server knows them by their SHA-256 only. Ctrl-C or SIGTERM
//! stops every piece gracefully; a piece that stops on its own error stops the others.

use std::future::Future;
use std::net::SocketAddr;

use countersign_server::config::{Role, TokenConfig};
use countersign_telegram::config::{FileConfig as TelegramFile, ServerSection, BOT_TOKEN_ENV};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::args::UpArgs;
use crate::exit::{CliError, Exit};
use crate::instance::{create_private_dir, Instance, Secret, Token};

pub async fn up(instance: &Instance, args: UpArgs) -> Result<Exit, CliError> {
    let loaded = instance.load_config()?;
    let mut server = loaded.server;
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

    let telegram = match loaded.telegram {
        None => None,
        Some(section) => {
            let bot_token = std::env::var(BOT_TOKEN_ENV)
                .ok()
                .filter(|token| !token.is_empty())
                .or(instance.read_secret(Secret::TelegramBotToken)?);
            let file = TelegramFile {
                server: ServerSection {
                    url: url.clone(),
                    ..ServerSection::default()
                },
                telegram: section,
            };
            let settings = countersign_telegram::Settings::from_file(
                file,
                Some(worker_token.clone()),
                bot_token,
            )
            .map_err(|error| {
                CliError::Usage(format!(
                    "config file {}: {error} (run countersign setup telegram)",
                    instance.config_file.display()
                ))
            })?;
            // The worker keeps its outbox and watch cursor there; it does not create it.
            if let Some(dir) = settings.cursor_path.parent() {
                create_private_dir(dir)?;
            }
            Some(settings)
        }
    };

    let ntfy = match loaded.ntfy {
        None => None,
        Some((section, topics)) => {
            let file = countersign_ntfy::config::FileConfig {
                server: ServerSection {
                    url: url.clone(),
                    ..ServerSection::default()
                },
                ntfy: section,
                topics,
            };
            let settings = countersign_ntfy::Settings::from_file(file, |name| {
                if name == countersign_ntfy::config::WORKER_TOKEN_ENV {
                    return Some(worker_token.clone());
                }
                std::env::var(name).ok().filter(|value| !value.is_empty())
            })
            .map_err(|error| {
                CliError::Usage(format!(
                    "config file {}: {error} (see docs/quickstart.md, ntfy)",
                    instance.config_file.display()
                ))
            })?;
            create_private_dir(&settings.state_dir)?;
            Some(settings)
        }
    };

    tracing::info!(
        grpc = %url,
        database = %countersign_server::config::Database::of(&server.database),
        config = %instance.config_file.display(),
        "countersign up: the approval server listens on {url}"
    );
    if let Some(settings) = &telegram {
        tracing::info!(
            default_chat_id = ?settings.default_chat_id,
            approvers = server.approvers.len(),
            "countersign up: the Telegram worker sends approvals to your chat"
        );
    }
    if let Some(settings) = &ntfy {
        tracing::info!(
            ntfy = %settings.ntfy_url,
            topics = settings.topics.len(),
            decision_links = %settings.public_url,
            "countersign up: the ntfy worker publishes approvals to your topics"
        );
    }
    if telegram.is_none() && ntfy.is_none() {
        tracing::warn!(
            "countersign up: no channel is configured, so nobody is asked: run `countersign setup telegram` (or add an [ntfy] section), then start `countersign up` again"
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
    let mut workers: Vec<WorkerRun> = Vec::new();
    if let Some(settings) = telegram {
        let ran = countersign_telegram::run(settings, until_stopped(stopped.clone()));
        workers.push(Box::pin(stopping_all("Telegram worker", ran, stop.clone())));
    }
    if let Some(settings) = ntfy {
        let ran = countersign_ntfy::run(settings, until_stopped(stopped.clone()));
        workers.push(Box::pin(stopping_all("ntfy worker", ran, stop.clone())));
    }
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

/// A channel worker running in this process; its error says which one stopped.
type WorkerRun = std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Runs a channel worker; when it ends, for whatever reason, every other piece stops too.
async fn stopping_all<E: std::fmt::Display>(
    worker: &str,
    ran: impl Future<Output = Result<(), E>>,
    stop: watch::Sender<bool>,
) -> Result<(), String> {
    let ran = ran.await;
    let _ = stop.send(true);
    ran.map_err(|error| format!("the {worker} stopped: {error}"))
}

/// Completes once `stop` is set (or its sender is gone).
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The server's entry for a generated token: its digest, never its value.
fn token_config(token: Token, value: &str) -> TokenConfig {
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

/// The URL this machine's clients reach the server at (loopback for a wildcard address).
pub fn local_url(listen: SocketAddr) -> String {
    let mut address = listen;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{address}")
}
