//! `notify claude-code|codex|gemini`: a coding agent's "it's done" events (Claude Code's
//! `Stop`, `StopFailure` and `Notification` hooks; Codex's `notify` program; Gemini CLI's
//! `AfterAgent` and `Notification` hooks) sent to the local instance's ntfy topics, Telegram
//! default chat, Slack default channel and webhook endpoints as a notice: a plain notification
//! with no buttons, held back during the configured quiet hours.
//!
//! These hooks cannot block anything, so this command never makes the host wait long: one
//! call per destination with its timeout, and a failure is a warning on stderr (the host
//! shows it) and exit status 1.

use std::time::Duration;

use countersign_ntfy::api::{NtfyApi, Publish};
use serde_json::Value;

use crate::args::{Host, NotifyArgs};
use crate::exit::{CliError, Exit};
use crate::instance::Instance;

/// How a host's event becomes a notice.
type NoticeOf = fn(&Value) -> Option<Notice>;

/// What the person is told.
#[derive(Debug, PartialEq)]
struct Notice {
    title: String,
    message: String,
    tags: Vec<String>,
}

/// Text from the host's payload, on one line and without control characters.
fn plain(text: &str, max: usize) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut cut: String = one_line.chars().take(max).collect();
    if one_line.chars().count() > max {
        cut.push('…');
    }
    cut
}

/// A string field of the host's payload ("" when absent).
fn field<'a>(input: &'a Value, key: &str) -> &'a str {
    input.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The project a payload is about: the last part of its `cwd`.
fn project_of(input: &Value) -> String {
    let project = field(input, "cwd")
        .rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or("a session");
    plain(project, 80)
}

/// The notice for one of Claude Code's hook payloads; `None` for an event it does not send.
fn claude_code_notice(input: &Value) -> Option<Notice> {
    let text = |key: &str| field(input, key);
    let project = project_of(input);
    let (title, message, tag) = match text("hook_event_name") {
        "Stop" => (
            format!("Claude Code finished in {project}"),
            "It is waiting for your next prompt.".to_owned(),
            "white_check_mark",
        ),
        "StopFailure" => (
            format!("Claude Code failed in {project}"),
            format!(
                "{}: {}",
                plain(text("error_type"), 40),
                plain(text("error_message"), 300)
            ),
            "x",
        ),
        "Notification" => (
            format!("Claude Code needs you in {project}"),
            plain(text("message"), 300),
            "hourglass",
        ),
        _ => return None,
    };
    Some(Notice {
        title,
        message,
        tags: vec![tag.to_owned()],
    })
}

/// The notice for Codex's `notify` JSON; `None` for a type it does not send.
fn codex_notice(input: &Value) -> Option<Notice> {
    if field(input, "type") != "agent-turn-complete" {
        return None;
    }
    let last = plain(field(input, "last-assistant-message"), 300);
    Some(Notice {
        title: format!("Codex finished in {}", project_of(input)),
        message: if last.is_empty() {
            "It is waiting for your next prompt.".to_owned()
        } else {
            last
        },
        tags: vec!["white_check_mark".to_owned()],
    })
}

/// The notice for one of Gemini CLI's hook payloads (`AfterAgent`: a turn's final answer;
/// `Notification`: a tool waits for confirmation); `None` for an event it does not send.
/// Gemini CLI has no hook for a failed turn.
fn gemini_notice(input: &Value) -> Option<Notice> {
    let project = project_of(input);
    let (title, message, tag) = match field(input, "hook_event_name") {
        "AfterAgent" => {
            let answer = plain(field(input, "prompt_response"), 300);
            (
                format!("Gemini CLI finished in {project}"),
                if answer.is_empty() {
                    "It is waiting for your next prompt.".to_owned()
                } else {
                    answer
                },
                "white_check_mark",
            )
        }
        "Notification" => (
            format!("Gemini CLI needs you in {project}"),
            plain(field(input, "message"), 300),
            "hourglass",
        ),
        _ => return None,
    };
    Some(Notice {
        title,
        message,
        tags: vec![tag.to_owned()],
    })
}

/// Runs `notify HOST`: reads the event (Claude Code, Gemini CLI: stdin; Codex: the last
/// argument), sends its notice. Never exits 2, which Gemini CLI's `AfterAgent` would take
/// for "retry the turn".
pub async fn notify(instance: &Instance, args: NotifyArgs) -> Result<Exit, CliError> {
    let (input, notice_of): (Vec<u8>, NoticeOf) = match args.host {
        Host::ClaudeCode => (
            crate::agent::hook::read_input()
                .await
                .map_err(|error| CliError::Usage(format!("cannot read the hook input: {error}")))?,
            claude_code_notice,
        ),
        Host::Codex => (
            args.payload
                .ok_or_else(|| {
                    CliError::Usage(
                        "Codex passes its event as the last argument; none was given".into(),
                    )
                })?
                .into_bytes(),
            codex_notice,
        ),
        Host::Gemini => (
            crate::agent::hook::read_input()
                .await
                .map_err(|error| CliError::Usage(format!("cannot read the hook input: {error}")))?,
            gemini_notice,
        ),
    };
    let input: Value = serde_json::from_slice(&input)
        .map_err(|error| CliError::Usage(format!("the event is not JSON: {error}")))?;
    let Some(notice) = notice_of(&input) else {
        eprintln!("countersign: this hook event sends no notice");
        return Ok(Exit::Success);
    };
    let config = instance.load_config()?;
    let quiet = config.notify.quiet_hours().map_err(CliError::Usage)?;
    let now = time::OffsetDateTime::now_utc();
    let minute = i32::from(now.hour()) * 60 + i32::from(now.minute());
    if quiet.is_some_and(|quiet| quiet.contains(minute)) {
        eprintln!("countersign: quiet hours (notify.quiet_hours); the notice is not sent");
        return Ok(Exit::Success);
    }
    let mut sent_to = 0;
    let mut failed = false;
    if let Some((section, topics)) = config.ntfy {
        sent_to += 1;
        failed |= !to_ntfy(&notice, section, topics).await;
    }
    if let Some(section) = config.telegram {
        if let Some(chat_id) = section.default_chat_id {
            sent_to += 1;
            failed |= !to_telegram(instance, &notice, &section.api_url, chat_id).await?;
        }
    }
    if let Some(section) = config.slack {
        sent_to += 1;
        failed |= !to_slack(&notice, &section).await;
    }
    if let Some(file) = config.webhook {
        sent_to += 1;
        failed |= !to_webhooks(&notice, file).await;
    }
    if sent_to == 0 {
        return Err(CliError::Usage(format!(
            "config file {}: notices go to ntfy topics, Telegram's default chat, Slack's default channel and webhook endpoints, and it sets none of them",
            instance.config_file.display()
        )));
    }
    Ok(if failed { Exit::Failure } else { Exit::Success })
}

/// Publishes `notice` to each ntfy topic (or the default one); false when one failed.
async fn to_ntfy(
    notice: &Notice,
    section: countersign_ntfy::config::NtfySection,
    topics: Vec<countersign_ntfy::config::TopicSection>,
) -> bool {
    let token = countersign_worker::config::env_var(countersign_ntfy::config::ACCESS_TOKEN_ENV);
    let api = match NtfyApi::new(
        &section.server_url,
        token,
        Duration::from_millis(section.request_timeout_ms),
    ) {
        Ok(api) => api,
        Err(error) => {
            eprintln!("countersign: cannot reach ntfy: {error}");
            return false;
        }
    };
    let mut names: Vec<String> = topics.into_iter().map(|topic| topic.name).collect();
    if names.is_empty() {
        names.extend(section.default_topic);
    }
    let mut sent = true;
    for topic in names {
        let publish = Publish {
            topic: topic.clone(),
            sequence_id: uuid::Uuid::now_v7().to_string(),
            title: notice.title.clone(),
            message: notice.message.clone(),
            priority: 3,
            tags: notice.tags.clone(),
            actions: Vec::new(),
        };
        if let Err(error) = api.publish(&publish).await {
            eprintln!("countersign: the notice to ntfy topic {topic:?} failed: {error}");
            sent = false;
        }
    }
    sent
}

/// Posts `notice` to Slack's default channel (else its first), without buttons; false when it
/// failed.
async fn to_slack(notice: &Notice, section: &countersign_slack::config::SlackSection) -> bool {
    let Some(channel) = section
        .default_channel
        .as_ref()
        .or(section.channels.first())
    else {
        eprintln!("countersign: [slack] names no channel for the notice");
        return false;
    };
    let Some(token) = countersign_worker::config::env_var(countersign_slack::config::BOT_TOKEN_ENV)
    else {
        eprintln!(
            "countersign: no Slack bot token ({})",
            countersign_slack::config::BOT_TOKEN_ENV
        );
        return false;
    };
    let client = match countersign_slack::api::client(&section.api_url) {
        Ok(client) => std::sync::Arc::new(client),
        Err(error) => {
            eprintln!("countersign: cannot reach Slack: {error}");
            return false;
        }
    };
    let api = countersign_slack::api::SlackApi::new(
        client,
        &token,
        Duration::from_millis(section.request_timeout_ms),
    );
    let content = countersign_slack::render::notice(&notice.title, &notice.message);
    if let Err(error) = api.post(channel, content).await {
        eprintln!("countersign: the notice to Slack channel {channel:?} failed: {error}");
        return false;
    }
    true
}

/// POSTs `notice` as an `agent.notice` event, signed, to the webhook's default endpoints (else
/// every endpoint), once each; false when one failed.
async fn to_webhooks(notice: &Notice, file: countersign_webhook::config::FileConfig) -> bool {
    let defaults = &file.webhook.default_endpoints;
    let timeout = Duration::from_millis(file.webhook.request_timeout_ms);
    let (webhook_id, body) =
        countersign_webhook::event::notice(&notice.title, &notice.message, &notice.tags);
    let mut sent = true;
    for section in file.endpoints {
        if !defaults.is_empty() && !defaults.contains(&section.name) {
            continue;
        }
        let name = section.name.clone();
        let posted = match section.resolve(countersign_worker::config::env_var) {
            Ok(endpoint) => {
                countersign_webhook::channel::send_once(&endpoint, &webhook_id, &body, timeout)
                    .await
            }
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = posted {
            eprintln!("countersign: the notice to webhook endpoint {name:?} failed: {error}");
            sent = false;
        }
    }
    sent
}

/// Sends `notice` to Telegram's default chat, as escaped HTML without buttons; false when it
/// failed.
async fn to_telegram(
    instance: &Instance,
    notice: &Notice,
    api_url: &str,
    chat_id: i64,
) -> Result<bool, CliError> {
    let token =
        match countersign_worker::config::env_var(countersign_telegram::config::BOT_TOKEN_ENV) {
            Some(token) => token,
            None => match instance.read_secret(crate::instance::Secret::TelegramBotToken)? {
                Some(token) => token,
                None => {
                    eprintln!(
                        "countersign: no Telegram bot token (run countersign setup telegram)"
                    );
                    return Ok(false);
                }
            },
        };
    let escape = countersign_telegram::render::escape;
    let html = format!(
        "<b>{}</b>\n{}",
        escape(&notice.title),
        escape(&notice.message)
    );
    let sent = match countersign_telegram::api::BotApi::new(&token, api_url) {
        Ok(api) => api.send_message(chat_id, &html, &[], None).await.map(drop),
        Err(error) => Err(error),
    };
    if let Err(error) = sent {
        eprintln!("countersign: the notice to Telegram failed: {error}");
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_s_events_become_notices_and_others_none() {
        let stop = serde_json::json!({"hook_event_name": "Stop", "cwd": "/home/dev/shop", "stop_hook_active": false});
        assert_eq!(
            claude_code_notice(&stop).unwrap().title,
            "Claude Code finished in shop"
        );
        let other = serde_json::json!({"hook_event_name": "PreToolUse"});
        assert_eq!(claude_code_notice(&other), None);
    }

    #[test]
    fn gemini_cli_s_events_become_notices_and_others_none() {
        let after = serde_json::json!({"hook_event_name": "AfterAgent", "cwd": "/home/dev/shop", "prompt_response": ""});
        let notice = gemini_notice(&after).unwrap();
        assert_eq!(notice.title, "Gemini CLI finished in shop");
        assert_eq!(notice.message, "It is waiting for your next prompt.");
        let other = serde_json::json!({"hook_event_name": "BeforeTool"});
        assert_eq!(gemini_notice(&other), None);
    }
}
