//! The channel workers of the local instance, as `up` runs them: each one's settings built
//! from its section of the one config file with the server's address and the generated worker
//! token filled in, then run by the worker crate's own code (`countersign_telegram::run`,
//! `countersign_ntfy::run`, `countersign_slack::run`, `countersign_github::Worker`, `countersign_webhook::run`,
//! `countersign_web::serve`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use countersign_telegram::config::{FileConfig as TelegramFile, ServerSection, BOT_TOKEN_ENV};
use countersign_worker::config::env_var;
use countersign_worker::config::WorkerSettings;
use tokio::sync::watch;

use crate::exit::CliError;
use crate::instance::{create_private_dir, local_url, Instance, InstanceConfig, Secret};

/// A channel worker running in this process; its error says which one stopped.
pub type WorkerRun = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// What `up` needs to start the workers: where the server is and the token they use.
pub struct Pieces<'a> {
    pub instance: &'a Instance,
    pub server_url: String,
    pub worker_token: String,
    pub admin_token: String,
}

/// The workers the config file sets up, ready to run: their settings are checked (and the web
/// inbox's address bound) before anything starts, so that a mistake stops `up` at once.
pub async fn prepare(
    config: &mut InstanceConfig,
    pieces: &Pieces<'_>,
) -> Result<Vec<Prepared>, CliError> {
    let mut prepared = Vec::new();
    if let Some(section) = config.telegram.take() {
        prepared.push(telegram(section, pieces)?);
    }
    if let Some((section, topics)) = config.ntfy.take() {
        prepared.push(ntfy(section, topics, pieces)?);
    }
    if let Some(section) = config.slack.take() {
        prepared.push(slack(section, pieces)?);
    }
    if let Some(file) = config.github.take() {
        prepared.push(github(file, pieces)?);
    }
    if let Some(file) = config.webhook.take() {
        prepared.push(webhook(file, pieces)?);
    }
    if let Some(section) = config.web.take() {
        prepared.push(web(section, pieces).await?);
    }
    Ok(prepared)
}

/// A worker with its settings, not yet started.
pub enum Prepared {
    Telegram(countersign_telegram::Settings),
    Ntfy(countersign_ntfy::Settings),
    Slack(countersign_slack::Settings),
    GitHub(countersign_github::config::Config),
    Webhook(countersign_webhook::Settings),
    Web(countersign_web::Settings, tokio::net::TcpListener),
}

impl Prepared {
    /// Says in the log what the worker does and, for those that listen, where.
    pub fn announce(&self, approvers: usize) {
        match self {
            Prepared::Telegram(settings) => tracing::info!(
                default_chat_id = ?settings.default_chat_id,
                approvers,
                "countersign up: the Telegram worker sends approvals to your chat"
            ),
            Prepared::Ntfy(settings) => tracing::info!(
                ntfy = %settings.ntfy_url,
                topics = settings.topics.len(),
                decision_links = %settings.public_url,
                "countersign up: the ntfy worker publishes approvals to your topics"
            ),
            Prepared::Slack(settings) => tracing::info!(
                channels = settings.channels.len(),
                default_channel = ?settings.default_channel,
                "countersign up: the Slack worker posts approvals to your channels"
            ),
            Prepared::GitHub(config) => tracing::info!(
                github = %config.github.api_url,
                default_target = %config.default_target.as_ref().map(ToString::to_string).unwrap_or_default(),
                polling_ms = config.polling.as_ref().map(|polling| polling.interval.as_millis() as u64),
                webhook = %config.webhook.as_ref().map(|webhook| format!("http://{}/webhook", webhook.listen)).unwrap_or_default(),
                "countersign up: the GitHub worker posts approvals as comments and reads /approve and /reject"
            ),
            Prepared::Webhook(settings) => tracing::info!(
                endpoints = settings.endpoints.len(),
                decision_links = %settings.public_url,
                listen = %settings.listen,
                "countersign up: the webhook worker delivers approvals to your endpoints; decision links at {}",
                settings.public_url
            ),
            Prepared::Web(settings, _) => tracing::info!(
                url = %settings.public_url,
                "countersign up: the web inbox is at {} (a sign-in link: countersign setup web)",
                settings.public_url
            ),
        }
    }

    /// Runs the worker until `stopped` turns true; when it ends, for whatever reason, it sets
    /// `stop` so that every other piece stops too.
    pub fn run(self, stopped: watch::Receiver<bool>, stop: watch::Sender<bool>) -> WorkerRun {
        let shutdown = until_stopped(stopped);
        match self {
            Prepared::Telegram(settings) => Box::pin(stopping_all(
                "Telegram worker",
                countersign_telegram::run(settings, shutdown),
                stop,
            )),
            Prepared::Ntfy(settings) => Box::pin(stopping_all(
                "ntfy worker",
                countersign_ntfy::run(settings, shutdown),
                stop,
            )),
            Prepared::Slack(settings) => Box::pin(stopping_all(
                "Slack worker",
                countersign_slack::run(settings, shutdown),
                stop,
            )),
            Prepared::GitHub(config) => Box::pin(stopping_all(
                "GitHub worker",
                async move {
                    let worker = countersign_github::Worker::start(config).await?;
                    worker.run_until(shutdown).await
                },
                stop,
            )),
            Prepared::Webhook(settings) => Box::pin(stopping_all(
                "webhook worker",
                countersign_webhook::run(settings, shutdown),
                stop,
            )),
            Prepared::Web(settings, listener) => Box::pin(stopping_all(
                "web inbox",
                countersign_web::serve(settings, listener, shutdown),
                stop,
            )),
        }
    }
}

/// Runs a piece; when it ends, for whatever reason, every other piece stops too.
pub async fn stopping_all<E: std::fmt::Display>(
    piece: &str,
    ran: impl Future<Output = Result<(), E>>,
    stop: watch::Sender<bool>,
) -> Result<(), String> {
    let ran = ran.await;
    let _ = stop.send(true);
    ran.map_err(|error| format!("the {piece} stopped: {error}"))
}

/// Completes once `stop` is set (or its sender is gone).
pub async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

impl Pieces<'_> {
    /// A secret a worker reads from the environment: the generated worker token under the
    /// name every worker reads it from, the others from the process environment.
    fn secret(&self, name: &str) -> Option<String> {
        if name == countersign_worker::config::WORKER_TOKEN_ENV {
            return Some(self.worker_token.clone());
        }
        env_var(name)
    }
}

/// A config file mistake in a worker's section, with where to look.
fn invalid(instance: &Instance, error: impl std::fmt::Display, fix: &str) -> CliError {
    CliError::Usage(format!(
        "config file {}: {error} ({fix})",
        instance.config_file.display()
    ))
}

fn server_section(pieces: &Pieces<'_>) -> ServerSection {
    ServerSection {
        url: pieces.server_url.clone(),
        ..ServerSection::default()
    }
}

fn telegram(
    section: countersign_telegram::config::TelegramSection,
    pieces: &Pieces<'_>,
) -> Result<Prepared, CliError> {
    let bot_token = match env_var(BOT_TOKEN_ENV) {
        Some(token) => Some(token),
        None => pieces.instance.read_secret(Secret::TelegramBotToken)?,
    };
    let file = TelegramFile {
        server: server_section(pieces),
        telegram: section,
        // `[metrics]` in the instance's file is the server's; the workers inside `up` have
        // no endpoint of their own.
        metrics: Default::default(),
    };
    let settings = countersign_telegram::Settings::from_file(
        file,
        Some(pieces.worker_token.clone()),
        bot_token,
    )
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup telegram"))?;
    // The worker keeps its outbox and watch cursor there; it does not create it.
    if let Some(dir) = settings.cursor_path.parent() {
        create_private_dir(dir)?;
    }
    Ok(Prepared::Telegram(settings))
}

fn ntfy(
    section: countersign_ntfy::config::NtfySection,
    topics: Vec<countersign_ntfy::config::TopicSection>,
    pieces: &Pieces<'_>,
) -> Result<Prepared, CliError> {
    let file = countersign_ntfy::config::FileConfig {
        server: server_section(pieces),
        ntfy: section,
        topics,
        // `[metrics]` in the instance's file is the server's; the workers inside `up` have
        // no endpoint of their own.
        metrics: Default::default(),
    };
    let settings = countersign_ntfy::Settings::from_file(file, |name| pieces.secret(name))
        .map_err(|error| invalid(pieces.instance, error, "see docs/quickstart.md, ntfy"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(Prepared::Ntfy(settings))
}

fn slack(
    section: countersign_slack::config::SlackSection,
    pieces: &Pieces<'_>,
) -> Result<Prepared, CliError> {
    let file = countersign_slack::config::FileConfig {
        server: server_section(pieces),
        slack: section,
        metrics: Default::default(),
    };
    let settings = countersign_slack::Settings::from_file(file, |name| pieces.secret(name))
        .map_err(|error| invalid(pieces.instance, error, "see crates/slack/README.md"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(Prepared::Slack(settings))
}

/// The GitHub worker's secrets: the generated worker token, the GitHub token from its
/// environment variable or the file `setup github` wrote, the rest from the environment.
struct GitHubEnvironment<'a> {
    pieces: &'a Pieces<'a>,
    github_token: Option<String>,
}

impl countersign_github::config::Environment for GitHubEnvironment<'_> {
    fn get(&self, name: &str) -> Option<String> {
        match name {
            countersign_github::config::ENV_GITHUB_TOKEN => self.github_token.clone(),
            _ => self.pieces.secret(name),
        }
    }
}

fn github(
    mut file: countersign_github::config::FileConfig,
    pieces: &Pieces<'_>,
) -> Result<Prepared, CliError> {
    file.server.url = pieces.server_url.clone();
    let github_token = match env_var(countersign_github::config::ENV_GITHUB_TOKEN) {
        Some(token) => Some(token),
        None => pieces.instance.read_secret(Secret::GitHubToken)?,
    };
    let environment = GitHubEnvironment {
        pieces,
        github_token,
    };
    let config = countersign_github::config::Config::from_file(file, &environment)
        .map_err(|error| invalid(pieces.instance, error, "run countersign setup github"))?;
    if let Some(path) = &config.cursor_path {
        if let Some(dir) = path.parent() {
            create_private_dir(dir)?;
        }
    }
    Ok(Prepared::GitHub(config))
}

fn webhook(
    mut file: countersign_webhook::config::FileConfig,
    pieces: &Pieces<'_>,
) -> Result<Prepared, CliError> {
    file.server = server_section(pieces);
    // On one machine the decision-link pages are where they listen.
    if file.webhook.public_url.is_empty() {
        file.webhook.public_url = local_url(file.webhook.listen);
    }
    let settings = countersign_webhook::Settings::from_file(file, |name| pieces.secret(name))
        .map_err(|error| invalid(pieces.instance, error, "see docs/quickstart.md, webhooks"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(Prepared::Webhook(settings))
}

async fn web(section: toml::Table, pieces: &Pieces<'_>) -> Result<Prepared, CliError> {
    let public_url_set = section.contains_key("public_url");
    let tokens = WebTokens {
        worker: Some(pieces.worker_token.clone()),
        // The inbox shows the audit timeline and who may decide what.
        admin: Some(pieces.admin_token.clone()),
    };
    let mut settings = web_settings(pieces.instance, section, &pieces.server_url, tokens)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|error| {
            CliError::Failure(format!(
                "the web inbox cannot listen on {}: {error} (set listen in [web] of {})",
                settings.listen,
                pieces.instance.config_file.display()
            ))
        })?;
    if !public_url_set {
        settings.public_url = local_url(local_address(&listener)?);
    }
    Ok(Prepared::Web(settings, listener))
}

/// The tokens the web inbox talks to the server with.
#[derive(Default)]
pub struct WebTokens {
    pub worker: Option<String>,
    pub admin: Option<String>,
}

/// The web inbox's settings from the `[web]` section (its state directory created); without
/// `public_url` the inbox is where it listens, on this machine.
pub fn web_settings(
    instance: &Instance,
    mut section: toml::Table,
    server_url: &str,
    tokens: WebTokens,
) -> Result<countersign_web::Settings, CliError> {
    let public_url_set = section.contains_key("public_url");
    let mut server = toml::Table::new();
    server.insert("url".into(), server_url.into());
    section.insert("server".into(), server.into());
    let fix = "see docs/quickstart.md, web inbox";
    let file: countersign_web::config::FileConfig = toml::Value::Table(section)
        .try_into()
        .map_err(|error| invalid(instance, format!("[web]: {error}"), fix))?;
    let mut settings = countersign_web::Settings::from_file(file, |name| match name {
        countersign_web::config::WORKER_TOKEN_ENV => tokens.worker.clone(),
        countersign_web::config::ADMIN_TOKEN_ENV => tokens.admin.clone(),
        _ => None,
    })
    .map_err(|error| invalid(instance, error, fix))?;
    if !public_url_set {
        settings.public_url = local_url(settings.listen);
    }
    create_private_dir(&settings.state_dir)?;
    Ok(settings)
}

fn local_address(listener: &tokio::net::TcpListener) -> Result<SocketAddr, CliError> {
    listener
        .local_addr()
        .map_err(|error| CliError::Failure(format!("the listener has no address: {error}")))
}
