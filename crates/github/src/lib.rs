//! countersign's GitHub worker.
//!
//! It watches the `github` channel of a countersign server, posts each approval request as a
//! comment on the routed issue or pull request (`owner/repo#N`; `owner/repo` opens an issue per
//! approval), and turns `/approve` and `/reject <reason>` comments by people with write access
//! into decisions. Comments arrive by webhook (`POST /webhook`, HMAC-verified), by polling, or
//! both. The request comment is edited as the approval is decided, expires or is cancelled,
//! wherever that happened.
//!
//! The loop around it (the watch, lanes, retries, shutdown) is the shared worker runtime
//! (`countersign_worker::runtime`), driving [`channel::GitHubChannel`]; the comments that come
//! in are handled by `commands`. After a restart it finds its comments again through the
//! deliveries recorded on the server, the outbox (with a state directory) and, failing
//! those, through a hidden marker in each comment. With a state directory it also keeps a
//! watch cursor there and resumes after the last event it fully handled; without one every
//! start takes a snapshot and corrects the 50 most recently resolved approvals.

pub mod api;
pub mod channel;
pub mod command;
pub mod config;
mod error;
mod inbound;
mod incoming;
pub mod permission;
mod poller;
mod recent;
pub mod render;
mod shown;
pub mod target;
mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;

use countersign_client::Client;
use countersign_worker::outbox::Outbox;
use countersign_worker::runtime;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::api::GitHubApi;
use crate::channel::GitHubChannel;
pub use crate::config::Settings;
pub use crate::error::WorkerError;
use crate::inbound::Commands;
use crate::incoming::PollTargets;
use crate::shown::Board;

/// Comments waiting for the commands.
const INPUT_QUEUE: usize = 1024;

/// Runs the worker until `shutdown` completes (then the requests being posted are finished,
/// within the grace period, and it returns `Ok`) or the watch fails for good (bad token, no
/// permission).
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    tracing::info!(
        server = %settings.runtime.server.client.url,
        github = %settings.github.api_url,
        bot = %settings.github.bot_login,
        webhook = settings.webhook.is_some(),
        polling = settings.polling.is_some(),
        "starting the GitHub worker"
    );
    Worker::start(settings).await?.run_until(shutdown).await
}

/// A running worker (what [`run`] runs; tests start one to learn its webhook address).
pub struct Worker {
    webhook_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    watch_task: JoinHandle<Result<(), WorkerError>>,
    other_tasks: Vec<JoinHandle<()>>,
}

/// Completes once a shutdown is asked for (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

impl Worker {
    /// Connects (lazily) to the server and GitHub, binds the webhook listener when configured,
    /// and starts watching, polling and serving.
    pub async fn start(config: Settings) -> Result<Worker, WorkerError> {
        let api = Arc::new(GitHubApi::new(config.github.clone())?);
        let client = Client::connect(config.runtime.server.client.clone())?;
        let outbox = config
            .outbox_path
            .as_deref()
            .map(Outbox::open)
            .transpose()?;
        let (inputs, inputs_rx) = mpsc::channel(INPUT_QUEUE);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut other_tasks = Vec::new();

        let webhook_addr = match &config.webhook {
            Some(settings) => {
                let listener = tokio::net::TcpListener::bind(settings.listen)
                    .await
                    .map_err(|source| WorkerError::Listen {
                        addr: settings.listen,
                        source,
                    })?;
                let addr = listener
                    .local_addr()
                    .map_err(|source| WorkerError::Listen {
                        addr: settings.listen,
                        source,
                    })?;
                let router = webhook::router(&settings.secret, inputs.clone());
                let stop = stopped(shutdown_rx.clone());
                other_tasks.push(tokio::spawn(async move {
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(stop)
                        .await;
                    if let Err(error) = served {
                        tracing::error!(%error, "webhook server failed");
                    }
                }));
                tracing::info!(%addr, "listening for GitHub webhooks on POST /webhook");
                Some(addr)
            }
            None => None,
        };

        let poll_targets = config
            .polling
            .as_ref()
            .map(|_| Arc::new(PollTargets::default()));
        if let (Some(settings), Some(targets)) = (&config.polling, &poll_targets) {
            tracing::info!(
                interval_ms = settings.interval.as_millis() as u64,
                "polling GitHub for comments"
            );
            other_tasks.push(tokio::spawn(poller::run(
                Arc::clone(&api),
                Arc::clone(targets),
                settings.interval,
                inputs.clone(),
                shutdown_rx.clone(),
            )));
        }

        let board = Arc::new(Board::default());
        let commands = Commands::new(
            client.clone(),
            Arc::clone(&api),
            Arc::clone(&board),
            inputs.clone(),
            config.runtime.retry.first,
        );
        // Commands wait until every pending approval's request is on the board (see
        // `GitHubChannel::adopt_pending`); they queue up meanwhile.
        let (ready, adopted) = watch::channel(false);
        let stop = stopped(shutdown_rx.clone());
        let mut commands_wait = adopted.clone();
        other_tasks.push(tokio::spawn(async move {
            tokio::select! {
                () = stop => {}
                () = async {
                    // A start-up adoption that ended without a word lets them go too.
                    let _ = commands_wait.wait_for(|adopted| *adopted).await;
                    commands.run(inputs_rx).await;
                } => {}
            }
        }));

        let channel = GitHubChannel {
            client: client.clone(),
            api,
            board,
            outbox,
            default_target: config.default_target.clone(),
            poll_targets,
            inputs,
            adopted,
        };
        let adopting = channel.clone();
        let (stop, max_backoff) = (
            stopped(shutdown_rx.clone()),
            config.runtime.server.max_backoff,
        );
        other_tasks.push(tokio::spawn(async move {
            tokio::select! {
                () = stop => {}
                () = adopting.adopt_pending(max_backoff, ready) => {}
            }
        }));
        let options = config.runtime.options();
        let stop = stopped(shutdown_rx);
        let watch_task =
            tokio::spawn(async move { Ok(runtime::run(client, channel, options, stop).await?) });

        Ok(Worker {
            webhook_addr,
            shutdown,
            watch_task,
            other_tasks,
        })
    }

    /// The address the webhook receiver listens on (useful with port 0).
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook_addr
    }

    /// Runs until `signal` completes (then stops cleanly) or the watch fails for good (bad
    /// token, no permission), which is returned.
    pub async fn run_until(
        mut self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), WorkerError> {
        let ended = tokio::select! {
            _ = signal => None,
            ended = &mut self.watch_task => Some(ended),
        };
        let result = match ended {
            None => Ok(()),
            Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(error))) => Err(error),
            Some(Err(error)) => Err(WorkerError::Task(error.to_string())),
        };
        self.stop().await;
        result
    }

    /// Stops every task and waits for them.
    pub async fn shutdown(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        if !self.watch_task.is_finished() {
            let _ = (&mut self.watch_task).await;
        }
        for task in self.other_tasks.drain(..) {
            let _ = task.await;
        }
    }
}
