//! `doctor`'s checks of the local instance: the config file, each channel it sets up (and
//! the ones it could), the approvers and the secret files. Prints what is fine and what is
//! optional; returns what is missing, each with the command that fixes it. Never a secret.

use super::up::token_config;
use crate::instance::{open_to_others, Instance, InstanceConfig, Secret, Token};
use countersign_telegram::config::BOT_TOKEN_ENV;

const SETUP_TELEGRAM: &str = "run countersign setup telegram";
const SETUP_GITHUB: &str = "run countersign setup github";
const SETUP_WEB: &str = "run countersign setup web";
const SETUP_EMAIL: &str = "run countersign setup email";
const SETUP_DISCORD: &str = "run countersign setup discord";

/// What the local instance lacks, each with the command that fixes it.
pub fn check_instance(instance: &Instance) -> Vec<String> {
    let mut problems = Vec::new();
    match instance.load_config() {
        Err(error) => problems.push(format!("{error}")),
        Ok(config) if !config.exists => problems.push(format!(
            "no config file {}: no channel asks anyone ({SETUP_TELEGRAM}, or setup ntfy, slack, discord, email, github or web)",
            instance.config_file.display()
        )),
        Ok(config) => {
            println!("ok    config file {}", instance.config_file.display());
            check_server_settings(instance, &config, &mut problems);
            check_channels(instance, &config, &mut problems);
            match config.server.approvers.len() {
                0 => problems.push(format!(
                    "no approvers: any decider a worker sends is accepted ({SETUP_TELEGRAM}, or countersign setup github)"
                )),
                approvers => println!("ok    {approvers} approver(s) registered"),
            }
        }
    }
    let secrets = Token::ALL
        .into_iter()
        .map(Secret::Token)
        .chain([Secret::TelegramBotToken, Secret::GitHubToken])
        .chain([
            Secret::SmtpPassword,
            Secret::DiscordBotToken,
            Secret::SlackBotToken,
            Secret::SlackAppToken,
        ]);
    for secret in secrets {
        let path = instance.secret_path(secret);
        if open_to_others(&path) == Some(true) {
            problems.push(format!(
                "{} can be read by other users (chmod 600 {})",
                path.display(),
                path.display()
            ));
        }
    }
    if instance.server_url().is_none() {
        problems.push("countersign up never started (run countersign up)".to_owned());
    }
    problems
}

/// What `up` would refuse in the server's settings (a step-up rule without `[passkeys]`, a
/// TTL outside its bounds, ...), with the tokens `up` adds counted as set.
fn check_server_settings(instance: &Instance, config: &InstanceConfig, problems: &mut Vec<String>) {
    let mut server = config.server.clone();
    for token in Token::ALL {
        server.tokens.push(token_config(token, "doctor"));
    }
    if let Err(error) = server.validate() {
        problems.push(format!(
            "{error}: countersign up refuses to start (fix it in {})",
            instance.config_file.display()
        ));
    }
}

/// A secret is set: in its environment variable, its file, or the config file.
fn secret_set(instance: &Instance, env: &str, secret: Secret, in_file: bool) -> bool {
    std::env::var(env).is_ok_and(|value| !value.is_empty())
        || matches!(instance.read_secret(secret), Ok(Some(_)))
        || in_file
}

fn check_channels(instance: &Instance, config: &InstanceConfig, problems: &mut Vec<String>) {
    let mut configured = 0;
    let mut optional = Vec::new();
    match &config.telegram {
        None => optional.push(format!("Telegram is not set up ({SETUP_TELEGRAM})")),
        Some(telegram) => {
            configured += 1;
            let token = secret_set(
                instance,
                BOT_TOKEN_ENV,
                Secret::TelegramBotToken,
                telegram.bot_token.is_some(),
            );
            if !token {
                problems.push(format!("no Telegram bot token ({SETUP_TELEGRAM})"));
            }
            match telegram.default_chat_id {
                Some(chat) => println!("ok    Telegram: approvals go to chat {chat}"),
                None => problems.push(format!("Telegram has no default chat ({SETUP_TELEGRAM})")),
            }
        }
    }
    match &config.github {
        None => optional.push(format!("GitHub is not set up ({SETUP_GITHUB})")),
        Some(file) => {
            configured += 1;
            let github = &file.github;
            let token = secret_set(
                instance,
                countersign_github::config::ENV_GITHUB_TOKEN,
                Secret::GitHubToken,
                github.token.is_some() || github.app_id.is_some(),
            );
            if !token {
                problems.push(format!("no GitHub token ({SETUP_GITHUB})"));
            }
            if file.polling.is_none() && file.webhook.is_none() {
                problems.push(format!(
                    "GitHub: neither [github.polling] nor [github.webhook], so no comment is read ({SETUP_GITHUB})"
                ));
            }
            match &github.default_target {
                Some(target) => println!(
                    "ok    GitHub: approvals go to {target}, commented as {}",
                    github.bot_login
                ),
                None => problems.push(format!("GitHub has no default target ({SETUP_GITHUB})")),
            }
        }
    }
    match &config.discord {
        None => optional.push(format!("Discord is not set up ({SETUP_DISCORD})")),
        Some(discord) => {
            configured += 1;
            let token_env = countersign_discord::config::BOT_TOKEN_ENV;
            if !secret_set(instance, token_env, Secret::DiscordBotToken, false) {
                problems.push(format!("no Discord bot token ({SETUP_DISCORD})"));
            }
            match &discord.default_channel {
                Some(channel) => println!("ok    Discord: approvals go to channel {channel}"),
                None => problems.push(format!("Discord has no default channel ({SETUP_DISCORD})")),
            }
        }
    }
    match &config.web {
        None => optional.push(format!("the web inbox is off ({SETUP_WEB})")),
        Some(_) => {
            configured += 1;
            let can_sign_in = config.server.approvers.iter().any(|approver| {
                approver
                    .identities
                    .get(countersign_web::config::CHANNEL)
                    .is_some_and(|ids| !ids.is_empty())
            });
            if can_sign_in {
                println!(
                    "ok    web inbox: a sign-in link for another browser: countersign setup web"
                );
            } else {
                problems.push(format!(
                    "no approver can sign in to the web inbox ({SETUP_WEB})"
                ));
            }
        }
    }
    match &config.email {
        None => optional.push(format!("email is not set up ({SETUP_EMAIL})")),
        Some((email, _)) => {
            configured += 1;
            if let Some(username) = &email.username {
                let password = secret_set(
                    instance,
                    countersign_email::config::SMTP_PASSWORD_ENV,
                    Secret::SmtpPassword,
                    false,
                );
                if !password {
                    problems.push(format!("no SMTP password for {username} ({SETUP_EMAIL})"));
                }
            }
            match &email.default_recipient {
                Some(address) => println!(
                    "ok    email: approvals go to {address} through {}",
                    email.smtp_host
                ),
                None => problems.push(format!("email has no default recipient ({SETUP_EMAIL})")),
            }
        }
    }
    if let Some((ntfy, topics)) = &config.ntfy {
        configured += 1;
        match (&ntfy.reply_topic, &ntfy.public_url) {
            (Some(_), None) => println!(
                "ok    ntfy: {} topic(s); the buttons decide through the reply topic on {} (no inbound port)",
                topics.len(),
                ntfy.server_url
            ),
            (None, Some(url)) => println!(
                "ok    ntfy: {} topic(s); the buttons decide through the decision-link pages at {url} (the phone must reach it)",
                topics.len()
            ),
            _ => problems.push(
                "ntfy has neither a reply topic nor a public_url, or both (countersign setup ntfy)"
                    .to_owned(),
            ),
        }
    }
    if let Some(slack) = &config.slack {
        configured += 1;
        check_slack(instance, slack, problems);
    }
    if let Some(file) = &config.webhook {
        configured += 1;
        println!("ok    webhook: {} endpoint(s)", file.endpoints.len());
        for endpoint in &file.endpoints {
            // `up` may well run with another environment than this shell's: a note, no failure.
            if !std::env::var(&endpoint.secret_env).is_ok_and(|value| !value.is_empty()) {
                optional.push(format!(
                    "webhook endpoint {}: its signing secret comes from {}, not set here (countersign up needs it)",
                    endpoint.name, endpoint.secret_env
                ));
            }
        }
    }
    // Deciding in a terminal only is a valid set-up (docs/integrations.md): a note, no failure.
    if configured == 0 {
        println!(
            "--    no channel is set up: approvals are decided in a terminal only (countersign watch, countersign approve ID); to be asked on a phone or in a browser, {SETUP_TELEGRAM}, or setup ntfy, slack, discord, email, github or web"
        );
    } else {
        for line in optional {
            println!("--    {line}");
        }
    }
}

/// The Slack worker's channel and tokens (present, not their values).
fn check_slack(
    instance: &Instance,
    slack: &countersign_slack::config::SlackSection,
    problems: &mut Vec<String>,
) {
    use countersign_slack::config::{Mode, APP_TOKEN_ENV, BOT_TOKEN_ENV, SIGNING_SECRET_ENV};
    const SETUP_SLACK: &str = "run countersign setup slack";
    let bot = secret_set(instance, BOT_TOKEN_ENV, Secret::SlackBotToken, false);
    let taps = match slack.mode {
        Mode::Socket => secret_set(instance, APP_TOKEN_ENV, Secret::SlackAppToken, false),
        Mode::Http => std::env::var(SIGNING_SECRET_ENV).is_ok_and(|value| !value.is_empty()),
    };
    if !bot {
        problems.push(format!("no Slack bot token ({SETUP_SLACK})"));
    }
    if !taps {
        problems.push(match slack.mode {
            Mode::Socket => format!("no Slack app-level token for Socket Mode ({SETUP_SLACK})"),
            Mode::Http => format!("Slack's HTTP mode needs {SIGNING_SECRET_ENV}, not set here"),
        });
    }
    match &slack.default_channel {
        Some(channel) if bot && taps => println!(
            "ok    slack: channel {channel} (default); the bot token and the {} are present",
            match slack.mode {
                Mode::Socket => "app-level token",
                Mode::Http => "signing secret",
            }
        ),
        Some(_) => {}
        None if slack.channels.is_empty() => {
            problems.push(format!("Slack has no channel ({SETUP_SLACK})"))
        }
        None => println!(
            "ok    slack: {} channel(s), no default (routes name one)",
            slack.channels.len()
        ),
    }
}
