//! `setup discord`: connects a Discord bot to the local instance without anyone typing an id.
//! The bot token is checked (`GET /users/@me`); a random pairing code is shown; whoever sends
//! it to the bot in a direct message becomes an approver (`discord:<user id>`), and that
//! conversation the default channel of approvals. The bot confirms in that conversation before
//! anything is written (so it is known to be able to post there); any refusal — a refused
//! token, the code expiring, a conversation the bot cannot post in — leaves the config file and
//! the stored token as they were. The code lives only in this process: it works once, while
//! this command waits for it.

use std::time::Duration;

use countersign_discord::api::{DiscordApi, DiscordError};
use countersign_discord::config::{BOT_TOKEN_ENV, DISCORD_API_URL};
use countersign_discord::inbound;
use countersign_discord::twilight_gateway::{
    Event, EventTypeFlags, Intents, Shard, StreamExt as _,
};
use serde_json::json;
use toml_edit::{value, Array, DocumentMut, Item};

use crate::args::SetupDiscordArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::{Instance, Secret};
use crate::local::setup::{new_code, prompt_secret};

pub async fn discord(instance: &Instance, args: SetupDiscordArgs) -> Result<Exit, CliError> {
    let existing = config_file::read(instance)?;
    let configured = |key: &str| {
        let section = existing.get("discord")?;
        section.get(key).and_then(Item::as_str).map(str::to_owned)
    };
    let api_url = args.api_url.clone().or(configured("api_url"));
    let api_url = api_url.unwrap_or_else(|| DISCORD_API_URL.to_owned());
    let gateway_url = args.gateway_url.clone().or(configured("gateway_url"));
    let token = bot_token(instance, args.add)?;
    let api = DiscordApi::new(&api_url, &token, Duration::from_secs(10))
        .map_err(|error| CliError::Failure(format!("cannot set up the HTTP client: {error}")))?;
    let me = api.me().await.map_err(|error| match error {
        DiscordError::Refused { status: 401, .. } => CliError::Usage(format!(
            "Discord refused the bot token ({error}): copy it again from the Developer Portal (your application → Bot → Reset Token)"
        )),
        error => CliError::Failure(format!("cannot check the bot token: {error}")),
    })?;
    let bot_name = me["username"].as_str().unwrap_or("the bot").to_owned();
    let code = new_code();
    let shard = inbound::shard(&token, gateway_url.as_deref(), Intents::DIRECT_MESSAGES);
    println!("Bot {bot_name} is ready. In Discord, send it this code in a direct message:\n\n    {code}\n");
    println!(
        "Waiting for it (the code works once, for {})...",
        humantime::format_duration(args.code_ttl)
    );
    let waited = tokio::time::timeout(args.code_ttl, wait_for_code(shard, &api, &code)).await;
    let paired = waited.map_err(|_| {
        CliError::Failure(
            "the pairing code expired before anyone sent it; run countersign setup discord again for a new one".into(),
        )
    })??;
    let confirmation = json!({
        "content": "Paired: countersign will show its approval requests in this conversation. Start (or restart) countersign up on your computer.",
        "allowed_mentions": {"parse": []},
    });
    api.post(&paired.channel_id, &confirmation).await.map_err(|error| {
        CliError::Failure(format!(
            "the bot cannot post in the conversation the code came from ({error}); nothing was written"
        ))
    })?;
    instance.write_secret(Secret::DiscordBotToken, &token)?;
    let urls = [("api_url", Some(api_url)), ("gateway_url", gateway_url)];
    register(instance, existing, &paired, &urls, args.add)?.announce(
        &paired.name,
        &format!("the direct-message channel {}", paired.channel_id),
        instance,
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// The bot token: `DISCORD_BOT_TOKEN`, the one stored by an earlier setup (`--add`), or typed.
fn bot_token(instance: &Instance, add: bool) -> Result<String, CliError> {
    if let Some(token) = std::env::var(BOT_TOKEN_ENV).ok().filter(|t| !t.is_empty()) {
        return Ok(token);
    }
    if add {
        if let Some(token) = instance.read_secret(Secret::DiscordBotToken)? {
            return Ok(token);
        }
    }
    let token = prompt_secret("Discord bot token (Developer Portal → your application → Bot)")?;
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "no bot token: type it at the prompt or set {BOT_TOKEN_ENV}"
        )));
    }
    Ok(token)
}

/// Who sent the code, and in which direct-message channel.
struct Paired {
    user_id: String,
    name: String,
    channel_id: String,
}

/// Reads the bot's direct messages over the Gateway until one is `code`; any other text a
/// person sends is answered with why it pairs nothing.
async fn wait_for_code(mut shard: Shard, api: &DiscordApi, code: &str) -> Result<Paired, CliError> {
    while let Some(item) = shard.next_event(EventTypeFlags::MESSAGE_CREATE).await {
        let Ok(Event::MessageCreate(message)) = item else {
            continue;
        };
        if message.author.bot || message.guild_id.is_some() {
            continue;
        }
        let channel_id = message.channel_id.to_string();
        if !message.content.trim().eq_ignore_ascii_case(code) {
            let refusal = json!({
                "content": "That is not the pairing code countersign setup discord shows; nothing was paired.",
                "allowed_mentions": {"parse": []},
            });
            if let Err(error) = api.post(&channel_id, &refusal).await {
                tracing::warn!(%error, "cannot answer in Discord");
            }
            continue;
        }
        let author = &message.author;
        return Ok(Paired {
            user_id: author.id.to_string(),
            name: author
                .global_name
                .clone()
                .unwrap_or_else(|| author.name.clone()),
            channel_id,
        });
    }
    Err(CliError::Failure(
        "the Discord Gateway closed the connection (check the bot token)".into(),
    ))
}

/// Writes the paired approver into the config file: an `[[approvers]]` entry with the Discord
/// identity, the conversation in `[discord] channels` and (unless adding one more) as the
/// default channel. Nothing is written when the user was an approver already.
fn register(
    instance: &Instance,
    mut doc: DocumentMut,
    paired: &Paired,
    urls: &[(&str, Option<String>)],
    add: bool,
) -> Result<Registered, CliError> {
    let approver = NewApprover {
        id: format!("discord:{}", paired.user_id),
        name: &paired.name,
        channel: countersign_discord::CHANNEL,
        identity: &paired.user_id,
    };
    let registered =
        config_file::register_identity(&mut doc, instance, &approver, Owner::pairing(add))?;
    if let Registered::Already(_) = registered {
        return Ok(registered);
    }
    let discord = config_file::table(&mut doc, instance, "discord")?;
    if !add || !discord.contains_key("default_channel") {
        discord["default_channel"] = value(&paired.channel_id);
    }
    let channels = discord.entry("channels").or_insert(value(Array::new()));
    let channels = channels
        .as_array_mut()
        .ok_or_else(|| config_file::invalid(instance, "discord.channels is not an array"))?;
    if !channels
        .iter()
        .any(|id| id.as_str() == Some(paired.channel_id.as_str()))
    {
        channels.push(paired.channel_id.as_str());
    }
    for (key, url) in urls {
        if let Some(url) = url.as_deref().filter(|url| *url != DISCORD_API_URL) {
            discord[*key] = value(url);
        }
    }
    config_file::write(instance, &doc)?;
    Ok(registered)
}
