//! `setup ntfy`: connects a phone with the ntfy app to the local instance, with no public
//! address. It picks the ntfy server (given, configured, or ntfy.sh), makes two random topics
//! — the one approvals are published to and the reply topic the buttons publish their
//! decisions to — prints the subscription as a link and a QR code, and publishes a test
//! notification whose Confirm button publishes a one-time code to the reply topic. Only when
//! that code comes back (read from the reply topic's JSON stream, as the worker reads
//! decisions) is anything written: the `[ntfy]` section with its topic, and the approver's
//! ntfy identity. Any refusal (the server unreachable or refusing the access token, no
//! Confirm in time) leaves the config file as it was, byte for byte.

use std::time::Duration;

use countersign_ntfy::api::{NtfyApi, NtfyError, Publish};
use countersign_ntfy::config::{random_topic, valid_topic, ACCESS_TOKEN_ENV};
use countersign_ntfy::render;
use countersign_ntfy::replies::SETUP_CONFIRMATION;
use qrcode::render::unicode::Dense1x2;
use qrcode::QrCode;
use toml_edit::{value, ArrayOfTables, Item, Table};

use crate::args::SetupNtfyArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::Instance;
use crate::settings::local_user;

const DEFAULT_SERVER: &str = "https://ntfy.sh";

/// One call to ntfy (connect, send, answer).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn ntfy(instance: &Instance, args: SetupNtfyArgs) -> Result<Exit, CliError> {
    let mut doc = config_file::read(instance)?;
    let configured = doc
        .get("ntfy")
        .and_then(|ntfy| ntfy.get("server_url"))
        .and_then(Item::as_str)
        .map(str::to_owned);
    let server = args
        .server
        .clone()
        .or(configured)
        .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
    let server = server.trim_end_matches('/').to_owned();
    let Some(host) = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .filter(|host| !host.is_empty())
    else {
        return Err(CliError::Usage(format!(
            "the ntfy server {server:?} must start with http:// or https:// (countersign setup ntfy --server URL)"
        )));
    };
    let topic = match &args.topic {
        Some(topic) if valid_topic(topic) => topic.clone(),
        Some(topic) => {
            return Err(CliError::Usage(format!(
                "topic {topic:?}: ntfy topics are 1-64 letters, digits, '_' or '-' (or leave --topic out for a random one)"
            )))
        }
        None => random_topic("cs-"),
    };
    let reply = random_topic("cs-reply-");
    let user = local_user().unwrap_or_else(|| "me".to_owned());
    let token = std::env::var(ACCESS_TOKEN_ENV)
        .ok()
        .filter(|token| !token.is_empty());
    let api = NtfyApi::new(&server, token, REQUEST_TIMEOUT)
        .map_err(|error| CliError::Failure(error.to_string()))?;

    // The subscription first: the test notification reaches a phone only once it listens.
    let secure = if server.starts_with("http://") {
        "?secure=false"
    } else {
        ""
    };
    let deep_link = format!("ntfy://{host}/{topic}{secure}");
    println!("Subscribe to this topic in the ntfy app (Android, iOS, or the web app at {server}):");
    println!("  server: {server}");
    println!("  topic:  {topic}");
    println!("  link:   {server}/{topic}");
    println!("  app:    {deep_link} (scan it; opens the Android app on the topic)");
    println!("{}", qr_code(&deep_link)?);
    println!("The topic is as secret as a password: whoever knows it can read your approvals.");

    let confirm = format!("{SETUP_CONFIRMATION}{}", random_topic(""));
    let test = Publish {
        topic: topic.clone(),
        sequence_id: "countersign-setup".to_owned(),
        title: "countersign: confirm this phone".to_owned(),
        message: format!(
            "Tap Confirm: countersign then knows that this phone gets its approvals, and that its buttons reach {host}."
        ),
        priority: 4,
        tags: vec!["countersign".to_owned()],
        actions: vec![render::reply_button(
            "Confirm",
            format!("{server}/{reply}"),
            confirm.clone(),
        )],
    };
    let wait = Duration::from_secs(args.wait_secs);
    eprintln!(
        "Once subscribed, tap Confirm on the test notification (waiting up to {} s; it is sent again every minute until then)…",
        wait.as_secs()
    );
    let confirmed = tokio::time::timeout(wait, confirm_came_back(&api, &test, &reply, &confirm))
        .await
        .map_err(|_| {
            CliError::Failure(format!(
                "no Confirm came back within {} s: nothing was written. Subscribe to topic {topic} on {server} in the ntfy app, then run countersign setup ntfy again and tap Confirm (--wait-secs for longer)",
                wait.as_secs()
            ))
        })?;
    confirmed.map_err(|error| ntfy_error(&server, error))?;

    let newly = NewApprover {
        id: format!("ntfy:{user}"),
        name: &user,
        channel: countersign_ntfy::CHANNEL,
        identity: &user,
    };
    let owner = match &args.approver_id {
        Some(id) => Owner::Approver(id),
        None => Owner::TheOnlyOne { else_new: false },
    };
    let registered = config_file::register_identity(&mut doc, instance, &newly, owner)?;
    let ntfy = config_file::table(&mut doc, instance, "ntfy")?;
    ntfy["server_url"] = value(server.as_str());
    ntfy["default_topic"] = value(topic.as_str());
    ntfy["reply_topic"] = value(reply.as_str());
    // The reply topic replaces the decision-link pages.
    ntfy.remove("public_url");
    ntfy.remove("listen");
    if !ntfy.contains_key("state_dir") {
        let state_dir = instance.data_dir.join("ntfy");
        ntfy["state_dir"] = value(state_dir.display().to_string());
    }
    let topics = ntfy
        .entry("topics")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| config_file::invalid(instance, "ntfy.topics is not an array of tables"))?;
    let mut entry = Table::new();
    entry["name"] = value(topic.as_str());
    entry["approver"] = value(user.as_str());
    topics.push(entry);
    config_file::write(instance, &doc)?;

    println!("ntfy is set up: approvals go to topic {topic} on {server}; their buttons decide through a reply topic on the same server, so nothing needs to reach this machine.");
    match &registered {
        Registered::Added(id) => println!("The buttons decide as approver {id}."),
        Registered::Joined(id) | Registered::Already(id) => println!(
            "The buttons decide as approver {id} (one person on several channels, counted once in a quorum)."
        ),
    }
    println!(
        "Written to {}.\nNext: countersign up (restart it if it is running).",
        instance.config_file.display()
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// Publishes the test notification (again every minute: the phone may subscribe late) and
/// follows the reply topic until `confirm` comes back on it. Other messages there confirm
/// nothing.
async fn confirm_came_back(
    api: &NtfyApi,
    test: &Publish,
    reply: &str,
    confirm: &str,
) -> Result<(), NtfyError> {
    const AGAIN: Duration = Duration::from_secs(60);
    api.publish(test).await?;
    let mut stream = api.subscribe(reply, "all").await?;
    let mut again = tokio::time::interval_at(tokio::time::Instant::now() + AGAIN, AGAIN);
    loop {
        tokio::select! {
            event = stream.next() => match event? {
                Some(event) if event.event == "message" && event.message.trim() == confirm => {
                    return Ok(());
                }
                Some(_) => {}
                None => stream = api.subscribe(reply, "all").await?,
            },
            _ = again.tick() => api.publish(test).await?,
        }
    }
}

/// The QR code of `text`, drawn with half-block characters for a terminal.
fn qr_code(text: &str) -> Result<String, CliError> {
    let code = QrCode::new(text.as_bytes())
        .map_err(|error| CliError::Failure(format!("cannot draw the QR code: {error}")))?;
    Ok(code
        .render::<Dense1x2>()
        .dark_color(Dense1x2::Light)
        .light_color(Dense1x2::Dark)
        .quiet_zone(true)
        .build())
}

fn ntfy_error(server: &str, error: NtfyError) -> CliError {
    match error {
        NtfyError::Status {
            status: 401 | 403, ..
        } => CliError::Usage(format!(
            "{server} refused the access token ({error}): set {ACCESS_TOKEN_ENV} to a token that may write the topics and read the reply topic, then run countersign setup ntfy again; nothing was written"
        )),
        error => CliError::Failure(format!(
            "cannot use the ntfy server {server}: {error}; nothing was written"
        )),
    }
}
