//! The channel workers of the local instance, as `up` runs them: one line per channel in
//! [`CHANNELS`] — its section of the one config file, how its settings are made from it (the
//! server's address and the generated worker token filled in), and the worker crate's own
//! `run(settings, shutdown)`, the entry its binary runs too.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use countersign_slack::config::{
    APP_TOKEN_ENV as SLACK_APP_TOKEN_ENV, BOT_TOKEN_ENV as SLACK_BOT_TOKEN_ENV,
};
use countersign_telegram::config::{FileConfig as TelegramFile, ServerSection, BOT_TOKEN_ENV};
use countersign_worker::config::env_var;
use countersign_worker::config::WorkerSettings;
use tokio::sync::watch;

use crate::exit::CliError;
use crate::instance::{create_private_dir, local_url, Instance, InstanceConfig, Secret};

/// A channel worker running in this process; its error says which one stopped.
pub type WorkerRun = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// What asks a worker to stop.
type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One line of `up`'s channel table.
struct Channel<Section, S, F> {
    /// What the log calls it when it stops.
    piece: &'static str,
    /// Its section of the config file, taken out of it; `None`: the channel is not set up.
    section: fn(&mut InstanceConfig) -> Option<Section>,
    /// Its settings from that section.
    load: fn(Section, &Pieces<'_>) -> Result<S, CliError>,
    /// Says in the log what the worker does and, for those that listen, where.
    announce: fn(&S, usize),
    /// The worker crate's entry.
    run: fn(S, Shutdown) -> F,
}

/// Every channel `up` runs, in the order it starts them: adding a channel is one line.
fn channels() -> [Box<dyn Prepare>; 8] {
    [
        Box::new(Channel {
            piece: "Telegram worker",
            section: |config| config.telegram.take(),
            load: telegram,
            announce: announce_telegram,
            run: countersign_telegram::run,
        }),
        Box::new(Channel {
            piece: "ntfy worker",
            section: |config| config.ntfy.take(),
            load: ntfy,
            announce: announce_ntfy,
            run: countersign_ntfy::run,
        }),
        Box::new(Channel {
            piece: "Slack worker",
            section: |config| config.slack.take(),
            load: slack,
            announce: announce_slack,
            run: countersign_slack::run,
        }),
        Box::new(Channel {
            piece: "Discord worker",
            section: |config| config.discord.take(),
            load: discord,
            announce: announce_discord,
            run: countersign_discord::run,
        }),
        Box::new(Channel {
            piece: "GitHub worker",
            section: |config| config.github.take(),
            load: github,
            announce: announce_github,
            run: countersign_github::run,
        }),
        Box::new(Channel {
            piece: "webhook worker",
            section: |config| config.webhook.take(),
            load: webhook,
            announce: announce_webhook,
            run: countersign_webhook::run,
        }),
        Box::new(Channel {
            piece: "email worker",
            section: |config| config.email.take(),
            load: email,
            announce: announce_email,
            run: countersign_email::run,
        }),
        Box::new(Channel {
            piece: "web inbox",
            section: |config| config.web.take(),
            load: web,
            announce: announce_web,
            run: |(settings, listener), shutdown| {
                countersign_web::serve(settings, listener, shutdown)
            },
        }),
    ]
}

/// What `up` needs to start the workers: where the server is and the token they use.
pub struct Pieces<'a> {
    pub instance: &'a Instance,
    pub server_url: String,
    pub worker_token: String,
    pub admin_token: String,
}

/// The workers the config file sets up, ready to run: their settings are checked (and the web
/// inbox's address bound) before anything starts, so that a mistake stops `up` at once.
pub fn prepare(
    config: &mut InstanceConfig,
    pieces: &Pieces<'_>,
) -> Result<Vec<Box<dyn Prepared>>, CliError> {
    let mut prepared = Vec::new();
    for channel in channels() {
        if let Some(worker) = channel.prepare(config, pieces)? {
            prepared.push(worker);
        }
    }
    Ok(prepared)
}

/// A line of the table, its types hidden.
trait Prepare {
    fn prepare(
        &self,
        config: &mut InstanceConfig,
        pieces: &Pieces<'_>,
    ) -> Result<Option<Box<dyn Prepared>>, CliError>;
}

impl<Section, S, F, E> Prepare for Channel<Section, S, F>
where
    S: 'static,
    F: Future<Output = Result<(), E>> + 'static,
    E: std::fmt::Display + 'static,
{
    fn prepare(
        &self,
        config: &mut InstanceConfig,
        pieces: &Pieces<'_>,
    ) -> Result<Option<Box<dyn Prepared>>, CliError> {
        let Some(section) = (self.section)(config) else {
            return Ok(None);
        };
        let settings = (self.load)(section, pieces)?;
        Ok(Some(Box::new(Ready {
            piece: self.piece,
            settings,
            announce: self.announce,
            run: self.run,
        })))
    }
}

/// A worker with its settings, not yet started.
pub trait Prepared {
    /// Says in the log what the worker does and, for those that listen, where.
    fn announce(&self, approvers: usize);

    /// Runs the worker until `stopped` turns true; when it ends, for whatever reason, it sets
    /// `stop` so that every other piece stops too.
    fn run(self: Box<Self>, stopped: watch::Receiver<bool>, stop: watch::Sender<bool>)
        -> WorkerRun;
}

struct Ready<S, F> {
    piece: &'static str,
    settings: S,
    announce: fn(&S, usize),
    run: fn(S, Shutdown) -> F,
}

impl<S, F, E> Prepared for Ready<S, F>
where
    F: Future<Output = Result<(), E>> + 'static,
    E: std::fmt::Display + 'static,
{
    fn announce(&self, approvers: usize) {
        (self.announce)(&self.settings, approvers);
    }

    fn run(
        self: Box<Self>,
        stopped: watch::Receiver<bool>,
        stop: watch::Sender<bool>,
    ) -> WorkerRun {
        let shutdown: Shutdown = Box::pin(until_stopped(stopped));
        Box::pin(stopping_all(
            self.piece,
            (self.run)(self.settings, shutdown),
            stop,
        ))
    }
}

fn announce_telegram(settings: &countersign_telegram::Settings, approvers: usize) {
    tracing::info!(
        default_chat_id = ?settings.default_chat_id,
        approvers,
        "countersign up: the Telegram worker sends approvals to your chat"
    );
}

fn announce_ntfy(settings: &countersign_ntfy::Settings, _approvers: usize) {
    let decisions = match &settings.decisions {
        countersign_ntfy::config::DecisionPath::ReplyTopic(_) => {
            "through the reply topic (no inbound port)".to_owned()
        }
        countersign_ntfy::config::DecisionPath::PublicUrl(url) => format!("through {url}"),
    };
    tracing::info!(
        ntfy = %settings.ntfy_url,
        topics = settings.topics.len(),
        decisions,
        "countersign up: the ntfy worker publishes approvals to your topics"
    );
}

fn announce_slack(settings: &countersign_slack::Settings, _approvers: usize) {
    tracing::info!(
        channels = settings.channels.len(),
        default_channel = ?settings.default_channel,
        "countersign up: the Slack worker posts approvals to your channels"
    );
}

fn announce_discord(settings: &countersign_discord::Settings, _approvers: usize) {
    tracing::info!(
        channels = settings.channels.len(),
        default_channel = ?settings.default_channel,
        "countersign up: the Discord worker posts approvals to your channels"
    );
}

fn announce_github(settings: &countersign_github::Settings, _approvers: usize) {
    tracing::info!(
        github = %settings.github.api_url,
        default_target = %settings.default_target.as_ref().map(ToString::to_string).unwrap_or_default(),
        polling_ms = settings.polling.as_ref().map(|polling| polling.interval.as_millis() as u64),
        webhook = %settings.webhook.as_ref().map(|webhook| format!("http://{}/webhook", webhook.listen)).unwrap_or_default(),
        "countersign up: the GitHub worker posts approvals as comments and reads /approve and /reject"
    );
}

fn announce_webhook(settings: &countersign_webhook::Settings, _approvers: usize) {
    tracing::info!(
        endpoints = settings.endpoints.len(),
        decision_links = %settings.public_url,
        listen = %settings.listen,
        "countersign up: the webhook worker delivers approvals to your endpoints; decision links at {}",
        settings.public_url
    );
}

fn announce_email(settings: &countersign_email::Settings, _approvers: usize) {
    tracing::info!(
        smtp = %settings.smtp.host,
        recipients = settings.recipients.len(),
        decision_links = %settings.public_url,
        "countersign up: the email worker mails approvals to your recipients"
    );
}

fn announce_web(
    (settings, _listener): &(countersign_web::Settings, tokio::net::TcpListener),
    _approvers: usize,
) {
    tracing::info!(
        url = %settings.public_url,
        "countersign up: the web inbox is at {} (a sign-in link: countersign setup web)",
        settings.public_url
    );
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
) -> Result<countersign_telegram::Settings, CliError> {
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
    let settings = countersign_telegram::Settings::from_file(file, |name| match name {
        BOT_TOKEN_ENV => bot_token.clone(),
        _ => pieces.secret(name),
    })
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup telegram"))?;
    // The worker keeps its outbox and watch cursor there; it does not create it.
    if let Some(dir) = settings.outbox_path.parent() {
        create_private_dir(dir)?;
    }
    Ok(settings)
}

fn ntfy(
    (section, topics): (
        countersign_ntfy::config::NtfySection,
        Vec<countersign_ntfy::config::TopicSection>,
    ),
    pieces: &Pieces<'_>,
) -> Result<countersign_ntfy::Settings, CliError> {
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
    Ok(settings)
}

fn slack(
    section: countersign_slack::config::SlackSection,
    pieces: &Pieces<'_>,
) -> Result<countersign_slack::Settings, CliError> {
    let file = countersign_slack::config::FileConfig {
        server: server_section(pieces),
        slack: section,
        metrics: Default::default(),
    };
    // The tokens from their environment variables, else the files `setup slack` wrote.
    let token = |name: &str, secret: Secret| match env_var(name) {
        Some(token) => Ok(Some(token)),
        None => pieces.instance.read_secret(secret),
    };
    let bot_token = token(SLACK_BOT_TOKEN_ENV, Secret::SlackBotToken)?;
    let app_token = token(SLACK_APP_TOKEN_ENV, Secret::SlackAppToken)?;
    let settings = countersign_slack::Settings::from_file(file, |name| match name {
        SLACK_BOT_TOKEN_ENV => bot_token.clone(),
        SLACK_APP_TOKEN_ENV => app_token.clone(),
        _ => pieces.secret(name),
    })
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup slack"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(settings)
}

fn discord(
    section: countersign_discord::config::DiscordSection,
    pieces: &Pieces<'_>,
) -> Result<countersign_discord::Settings, CliError> {
    let file = countersign_discord::config::FileConfig {
        server: server_section(pieces),
        discord: section,
        metrics: Default::default(),
    };
    let bot_token = match env_var(countersign_discord::config::BOT_TOKEN_ENV) {
        Some(token) => Some(token),
        None => pieces.instance.read_secret(Secret::DiscordBotToken)?,
    };
    let settings = countersign_discord::Settings::from_file(file, |name| match name {
        countersign_discord::config::BOT_TOKEN_ENV => bot_token.clone(),
        _ => pieces.secret(name),
    })
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup discord"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(settings)
}

/// The GitHub worker's secrets: the generated worker token, the GitHub token from its
/// environment variable or the file `setup github` wrote, the rest from the environment.
fn github(
    mut file: countersign_github::config::FileConfig,
    pieces: &Pieces<'_>,
) -> Result<countersign_github::Settings, CliError> {
    file.server.url = pieces.server_url.clone();
    let github_token = match env_var(countersign_github::config::ENV_GITHUB_TOKEN) {
        Some(token) => Some(token),
        None => pieces.instance.read_secret(Secret::GitHubToken)?,
    };
    let settings = countersign_github::Settings::from_file(file, |name| match name {
        countersign_github::config::ENV_GITHUB_TOKEN => github_token.clone(),
        _ => pieces.secret(name),
    })
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup github"))?;
    if let Some(path) = &settings.runtime.cursor_path {
        if let Some(dir) = path.parent() {
            create_private_dir(dir)?;
        }
    }
    Ok(settings)
}

fn webhook(
    mut file: countersign_webhook::config::FileConfig,
    pieces: &Pieces<'_>,
) -> Result<countersign_webhook::Settings, CliError> {
    file.server = server_section(pieces);
    // On one machine the decision-link pages are where they listen.
    if file.webhook.public_url.is_empty() {
        file.webhook.public_url = local_url(file.webhook.listen);
    }
    let settings = countersign_webhook::Settings::from_file(file, |name| pieces.secret(name))
        .map_err(|error| invalid(pieces.instance, error, "see docs/quickstart.md, webhooks"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(settings)
}

/// The email worker's secrets: the generated worker token, the SMTP password from its
/// environment variable or the file `setup email` wrote.
fn email(
    (mut section, recipients): (
        countersign_email::config::EmailSection,
        Vec<countersign_email::config::RecipientSection>,
    ),
    pieces: &Pieces<'_>,
) -> Result<countersign_email::Settings, CliError> {
    use countersign_email::config::SMTP_PASSWORD_ENV;
    // On one machine the decision-link pages are where they listen.
    if section.public_url.is_empty() {
        section.public_url = local_url(section.listen);
    }
    let password = match env_var(SMTP_PASSWORD_ENV) {
        Some(password) => Some(password),
        None => pieces.instance.read_secret(Secret::SmtpPassword)?,
    };
    let file = countersign_email::config::FileConfig {
        server: server_section(pieces),
        email: section,
        recipients,
        metrics: Default::default(),
    };
    let settings = countersign_email::Settings::from_file(file, |name| match name {
        SMTP_PASSWORD_ENV => password.clone(),
        _ => pieces.secret(name),
    })
    .map_err(|error| invalid(pieces.instance, error, "run countersign setup email"))?;
    create_private_dir(&settings.state_dir)?;
    Ok(settings)
}

/// The web inbox's settings and its address, bound.
fn web(
    section: toml::Table,
    pieces: &Pieces<'_>,
) -> Result<(countersign_web::Settings, tokio::net::TcpListener), CliError> {
    let public_url_set = section.contains_key("public_url");
    let tokens = WebTokens {
        worker: Some(pieces.worker_token.clone()),
        // The inbox shows the audit timeline and who may decide what.
        admin: Some(pieces.admin_token.clone()),
    };
    let mut settings = web_settings(pieces.instance, section, &pieces.server_url, tokens)?;
    let listener = listen(settings.listen).map_err(|error| {
        CliError::Failure(format!(
            "the web inbox cannot listen on {}: {error} (set listen in [web] of {})",
            settings.listen,
            pieces.instance.config_file.display()
        ))
    })?;
    if !public_url_set {
        settings.public_url = local_url(local_address(&listener)?);
    }
    Ok((settings, listener))
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

/// A listener on `addr`, as `tokio::net::TcpListener::bind` makes one (address reuse on
/// Unix, a backlog of 1024), without waiting: the table's `load` is not async.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

fn local_address(listener: &tokio::net::TcpListener) -> Result<SocketAddr, CliError> {
    listener
        .local_addr()
        .map_err(|error| CliError::Failure(format!("the listener has no address: {error}")))
}
