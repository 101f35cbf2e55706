//! countersign's GitHub worker.
//!
//! It watches the `github` channel of a countersign server, posts each approval request as a
//! comment on the routed issue or pull request (`owner/repo#N`; `owner/repo` opens an issue per
//! approval), and turns `/approve` and `/reject <reason>` comments by people with write access
//! into decisions. Comments arrive by webhook (`POST /webhook`, HMAC-verified), by polling, or
//! both. The request comment is edited as the approval is decided, expires or is cancelled,
//! wherever that happened.
//!
//! After a restart it finds its comments again through the deliveries recorded on the server
//! and, failing that, through a hidden marker in each comment. With a state directory it also
//! keeps a watch cursor there and resumes after the last event it fully handled; without one
//! every start takes a snapshot and corrects the 50 most recently resolved approvals.

pub mod api;
pub mod command;
pub mod config;
mod incoming;
pub mod permission;
mod poller;
mod recent;
pub mod render;
pub mod target;
mod webhook;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use countersign_client::{Client, ClientError, WatchItem, WatchOptions};
use countersign_worker::cursor::{Cursor, CursorError};
use countersign_worker::lanes::Lanes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::api::{ApiError, GitHubApi};
use crate::config::Config;
use crate::incoming::PollTargets;
use crate::worker::{Input, Relay, Resume, Runtime, CHANNEL};

/// Inputs waiting for the worker (watch items and incoming comments).
const INPUT_QUEUE: usize = 1024;
/// How long a shutdown waits for the requests being posted.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    GitHub(#[from] ApiError),
    #[error("countersign server: {0}")]
    Server(#[from] ClientError),
    #[error("cannot listen for webhooks on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("a worker task ended unexpectedly: {0}")]
    Task(String),
    #[error(transparent)]
    Cursor(#[from] CursorError),
}

/// A running worker.
pub struct Worker {
    webhook_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    watch_task: JoinHandle<Result<(), WorkerError>>,
    other_tasks: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Connects (lazily) to the server and GitHub, binds the webhook listener when configured,
    /// and starts watching, polling and serving.
    pub async fn start(config: Config) -> Result<Worker, WorkerError> {
        let api = Arc::new(GitHubApi::new(config.github.clone())?);
        let client = Client::connect(config.server.client.clone())?;
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
                let mut stop = shutdown_rx.clone();
                other_tasks.push(tokio::spawn(async move {
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(async move {
                            let _ = stop.changed().await;
                        })
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

        let resume = config.cursor_path.as_deref().map(|path| {
            let (cursor, after) = Cursor::open(path);
            Resume { cursor, after }
        });
        let cursor = resume.as_ref().map(|resume| resume.cursor.clone());
        let resume_after = resume.as_ref().and_then(|resume| resume.after);
        let lanes = Lanes::new();
        let relay = Relay::new(
            client.clone(),
            Arc::clone(&api),
            config.default_target.clone(),
            poll_targets,
            inputs.clone(),
            config.retry_interval,
            Runtime {
                lanes: lanes.clone(),
                resume,
            },
        );
        let mut stop = shutdown_rx.clone();
        let relay_cursor = cursor.clone();
        other_tasks.push(tokio::spawn(async move {
            // Dropped with this task (an abort): the deliveries in flight stop too.
            let _stop_lanes = lanes.abort_on_drop();
            tokio::select! {
                _ = stop.changed() => {
                    // Finish posting what is under way (each is recorded on the server).
                    lanes.shutdown(SHUTDOWN_GRACE).await;
                    if let Some(cursor) = relay_cursor {
                        if let Err(error) = cursor.flush().await {
                            tracing::error!(%error, "cannot write the watch cursor at shutdown");
                        }
                    }
                }
                _ = relay.run(inputs_rx) => {}
            }
        }));

        let mut stop = shutdown_rx;
        let (heartbeat_timeout, max_backoff) =
            (config.server.heartbeat_timeout, config.server.max_backoff);
        let watch_task = tokio::spawn(async move {
            let options = WatchOptions {
                heartbeat_timeout,
                max_backoff,
                ..WatchOptions::channel(CHANNEL).resume_after(resume_after)
            };
            let mut stream = client.watch(options);
            let persisted = async {
                match &cursor {
                    Some(cursor) => cursor.persist().await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(persisted);
            loop {
                let item = tokio::select! {
                    _ = stop.changed() => return Ok(()),
                    written = &mut persisted => return written.map_err(WorkerError::from),
                    item = stream.next() => item?,
                };
                let part = cursor.as_ref().map(|cursor| {
                    let seq = match &item {
                        WatchItem::Snapshot(_) => stream.cursor().unwrap_or(0),
                        WatchItem::Event(event) => event.seq,
                    };
                    cursor.begin(seq)
                });
                if inputs
                    .send(Input::Watch(Box::new(item), part))
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
        });

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
