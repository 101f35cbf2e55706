//! `setup slack`: connects a Slack app to the local instance with no id typed. The bot token
//! and the app-level token come from the environment or a prompt and are checked
//! (`auth.test`, `apps.connections.open`); the channel is picked by name from those the bot
//! is in (a public one it is not in is joined); a "This is me" button posted there, tapped
//! over Socket Mode, tells whose Slack user id is the approver's. Only then is anything
//! written: the tokens (files only the user can read), the `[slack]` section and the
//! approver's `slack` identity. Any refusal (a token Slack refuses, no such channel, no tap in
//! time) leaves the config file as it was, byte for byte, and writes no secret.

use std::sync::Arc;
use std::time::Duration;

use countersign_slack::api::{self, SlackApi, SlackError};
use countersign_slack::config::{APP_TOKEN_ENV, BOT_TOKEN_ENV};
use countersign_slack::setup::{manifest, pair, PairError};
use toml_edit::{value, Array, Item};

use crate::args::SetupSlackArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::{Instance, Secret};
use crate::local::setup::{prompt, prompt_secret};

const DEFAULT_API_URL: &str = "https://slack.com/api";

/// One Web API call's limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The app's name in the printed manifest.
const APP_NAME: &str = "countersign";

pub async fn slack(instance: &Instance, args: SetupSlackArgs) -> Result<Exit, CliError> {
    if args.manifest {
        print!("{}", manifest(APP_NAME));
        return Ok(Exit::Success);
    }
    let mut doc = config_file::read(instance)?;
    let configured = doc
        .get("slack")
        .and_then(|slack| slack.get("api_url"))
        .and_then(Item::as_str)
        .map(str::to_owned);
    let api_url = args
        .api_url
        .clone()
        .or(configured)
        .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
    let api_url = api_url.trim_end_matches('/').to_owned();

    let from_env = |name: &str| std::env::var(name).ok().filter(|token| !token.is_empty());
    let (bot_token, app_token) = match (from_env(BOT_TOKEN_ENV), from_env(APP_TOKEN_ENV)) {
        (Some(bot), Some(app)) => (bot, app),
        (bot, app) => {
            println!("Create the Slack app at https://api.slack.com/apps → Create New App → From an app manifest, with this manifest:\n");
            print!("{}", manifest(APP_NAME));
            println!("\nThen install it to the workspace (Install App), and make an app-level token with the scope connections:write (Basic Information → App-Level Tokens).\n");
            let bot = match bot {
                Some(bot) => bot,
                None => prompt_secret("Bot User OAuth Token (xoxb-…, from OAuth & Permissions)")?,
            };
            let app = match app {
                Some(app) => app,
                None => prompt_secret("App-level token (xapp-…)")?,
            };
            (bot, app)
        }
    };
    check_form(&bot_token, "xoxb-", "bot token", BOT_TOKEN_ENV)?;
    check_form(&app_token, "xapp-", "app-level token", APP_TOKEN_ENV)?;

    let client = Arc::new(
        api::client(&api_url).map_err(|error| CliError::Failure(format!("Slack: {error}")))?,
    );
    let bot = SlackApi::new(client.clone(), &bot_token, REQUEST_TIMEOUT);
    let owner = bot
        .owner()
        .await
        .map_err(|error| slack_error(error, "the bot token", BOT_TOKEN_ENV))?;
    SlackApi::new(client, &app_token, REQUEST_TIMEOUT)
        .open_connection()
        .await
        .map_err(|error| slack_error(error, "the app-level token", APP_TOKEN_ENV))?;
    println!(
        "The tokens work: bot {} in workspace {}; Socket Mode is on.",
        owner.user.as_deref().unwrap_or(&owner.user_id),
        owner.team
    );

    let channel = pick_channel(&bot, args.channel.as_deref()).await?;
    let wait = Duration::from_secs(args.wait_secs);
    println!(
        "Posted a \"This is me\" button in #{}: the approver taps it in Slack (waiting up to {} s; stop countersign up while pairing, it listens on the same Socket Mode)…",
        channel.name,
        wait.as_secs()
    );
    let paired = pair(&bot, &api_url, &app_token, &channel.id, wait)
        .await
        .map_err(|error| match error {
            PairError::NoTap(_) => CliError::Failure(format!(
                "{error}: nothing was written; run countersign setup slack again (--wait-secs for longer)"
            )),
            error => CliError::Failure(format!("{error}; nothing was written")),
        })?;

    let newly = NewApprover {
        id: format!("slack:{}", paired.user_id),
        name: &paired.name,
        channel: countersign_slack::CHANNEL,
        identity: &paired.user_id,
    };
    let owner = match &args.approver_id {
        Some(id) => Owner::Approver(id),
        None => Owner::TheOnlyOne { else_new: true },
    };
    let registered = config_file::register_identity(&mut doc, instance, &newly, owner)?;
    let slack = config_file::table(&mut doc, instance, "slack")?;
    if api_url != DEFAULT_API_URL {
        slack["api_url"] = value(api_url.as_str());
    }
    let channels = slack
        .entry("channels")
        .or_insert(value(Array::new()))
        .as_array_mut()
        .ok_or_else(|| config_file::invalid(instance, "slack.channels is not an array"))?;
    if !channels.iter().any(|id| id.as_str() == Some(&channel.id)) {
        channels.push(channel.id.as_str());
    }
    slack["default_channel"] = value(channel.id.as_str());
    if !slack.contains_key("state_dir") {
        let state_dir = instance.data_dir.join("slack");
        slack["state_dir"] = value(state_dir.display().to_string());
    }
    instance.write_secret(Secret::SlackBotToken, &bot_token)?;
    instance.write_secret(Secret::SlackAppToken, &app_token)?;
    config_file::write(instance, &doc)?;

    println!(
        "Slack is set up: approvals go to #{} ({}).",
        channel.name, channel.id
    );
    match &registered {
        Registered::Added(id) => println!("{} ({}) decides as approver {id}.", paired.name, paired.user_id),
        Registered::Joined(id) | Registered::Already(id) => println!(
            "{} ({}) decides as approver {id} (one person on several channels, counted once in a quorum).",
            paired.name, paired.user_id
        ),
    }
    println!(
        "The tokens are in {} (only you can read it).\nWritten to {}.\nNext: countersign up (restart it if it is running).",
        instance
            .secret_path(Secret::SlackBotToken)
            .parent()
            .unwrap_or(&instance.data_dir)
            .display(),
        instance.config_file.display()
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// Refuses a token of the wrong kind before Slack sees it (the token itself is not shown).
fn check_form(token: &str, prefix: &str, what: &str, env: &str) -> Result<(), CliError> {
    if token.starts_with(prefix) {
        return Ok(());
    }
    let fix = if token.is_empty() {
        "none was given"
    } else {
        "the one given does not start so"
    };
    Err(CliError::Usage(format!(
        "the {what} starts with {prefix} ({fix}): type it at the prompt or set {env}; nothing was written"
    )))
}

/// The channel named `named` (or the one picked at the prompt): one the bot is in, else a
/// public one the bot then joins.
async fn pick_channel(bot: &SlackApi, named: Option<&str>) -> Result<api::Conversation, CliError> {
    let member = bot
        .member_channels()
        .await
        .map_err(|error| slack_error(error, "the bot token", BOT_TOKEN_ENV))?;
    let name = match named {
        Some(name) => name.to_owned(),
        None => {
            if member.is_empty() {
                println!("The bot is in no channel yet.");
            } else {
                println!("The bot is in these channels:");
                for channel in &member {
                    let kind = if channel.private { " (private)" } else { "" };
                    println!("  #{}{kind}", channel.name);
                }
            }
            prompt("Channel for approvals (a name; a public channel the bot is not in is joined)")?
        }
    };
    let name = name.trim().trim_start_matches('#').to_owned();
    if name.is_empty() {
        return Err(CliError::Usage(
            "no channel given: name the channel approvals go to (--channel NAME); nothing was written".into(),
        ));
    }
    if let Some(channel) = member.into_iter().find(|channel| channel.name == name) {
        return Ok(channel);
    }
    let found = bot
        .public_channel(&name)
        .await
        .map_err(|error| slack_error(error, "the bot token", BOT_TOKEN_ENV))?;
    let Some(public) = found else {
        return Err(CliError::Usage(format!(
            "no channel #{name} that the bot is in or can join: for a private channel, invite the bot there first (/invite @{APP_NAME}); nothing was written"
        )));
    };
    let joined = bot.join(&public.id).await.map_err(|error| {
        CliError::Failure(format!("cannot join #{name}: {error}; nothing was written"))
    })?;
    println!("The bot joined #{}.", joined.name);
    Ok(joined)
}

/// What Slack's refusal of a token means for the user.
fn slack_error(error: SlackError, what: &str, env: &str) -> CliError {
    match error.code() {
        Some(
            code @ ("invalid_auth" | "not_authed" | "account_inactive" | "token_revoked"
            | "token_expired" | "not_allowed_token_type"),
        ) => CliError::Usage(format!(
            "Slack refused {what} ({code}): copy it again from the app's settings (or set {env}); nothing was written"
        )),
        Some("missing_scope") => CliError::Usage(format!(
            "{what} lacks a scope (missing_scope): create the app from the manifest (countersign setup slack --manifest) and reinstall it; nothing was written"
        )),
        _ => CliError::Failure(format!("Slack: {error}; nothing was written")),
    }
}
