//! A picture of a message on the fake Telegram as a phone shows it, for the documentation:
//! the text with its entities (bold, code, quotes…) and the inline buttons as an HTML page,
//! and a PNG of that page taken by headless Chromium (Debian's `chromium`, which `.ci/run`
//! installs). The text is escaped: what the agent wrote shows as text. A mail's HTML part
//! (from the fake SMTP relay) is drawn the same way, under a mail app's header.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::discord::DiscordMessage;
use crate::telegram::ChatMessage;

/// The message as a self-contained HTML page in a chat bubble from `bot`.
pub fn message_html(message: &ChatMessage, bot: &str) -> String {
    let mut page = String::from(PAGE_HEAD);
    let _ = write!(
        page,
        "<div class=\"chat\"><div class=\"from\">{}</div><div class=\"bubble\">{}</div>",
        escape(bot),
        text_html(&message.text, &message.entities)
    );
    for row in button_rows(message) {
        page.push_str("<div class=\"row\">");
        for label in row {
            let _ = write!(page, "<div class=\"button\">{}</div>", escape(&label));
        }
        page.push_str("</div>");
    }
    page.push_str("</div></body></html>\n");
    page
}

/// A mail as a phone's mail app opens it: a header with the subject, the sender and the
/// recipient (escaped), above the mail's own HTML part (a whole document, shown as sent).
pub fn mail_html(subject: &str, from: &str, to: &str, html_part: &str) -> String {
    let header = format!(
        "<div style=\"font-family:-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;padding:12px;border-bottom:1px solid #d0d7de;background:#f6f8fa\">\
         <div style=\"font-size:17px;font-weight:600;margin-bottom:6px\">{}</div>\
         <div style=\"color:#57606a;font-size:13px\">From {}<br>To {}</div></div>",
        escape(subject),
        escape(from),
        escape(to)
    );
    match html_part
        .find("<body")
        .and_then(|at| html_part[at..].find('>').map(|end| at + end + 1))
    {
        Some(body) => format!("{}{header}{}", &html_part[..body], &html_part[body..]),
        None => format!("{header}{html_part}"),
    }
}

/// Why a picture could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    #[error("cannot write {0}: {1}")]
    Write(String, std::io::Error),
    #[error("cannot run chromium (Debian package chromium; .ci/run installs it): {0}")]
    Chromium(std::io::Error),
    #[error("chromium took longer than {0:?}")]
    TimedOut(Duration),
    #[error("chromium made no picture at {0}")]
    NoPicture(String),
}

/// Writes `<dir>/<name>.html` and a 412 by 600 pixel (a phone's width) `<dir>/<name>.png` of it.
pub async fn screenshot(
    message: &ChatMessage,
    bot: &str,
    dir: &Path,
    name: &str,
) -> Result<std::path::PathBuf, PictureError> {
    screenshot_page(&message_html(message, bot), (412, 600), dir, name).await
}

/// Like [`screenshot`], for a message on the fake Discord.
pub async fn discord_screenshot(
    message: &DiscordMessage,
    bot: &str,
    dir: &Path,
    name: &str,
) -> Result<std::path::PathBuf, PictureError> {
    screenshot_page(&discord_html(message, bot), (412, 600), dir, name).await
}

/// Writes the page `html` to `<dir>/<name>.html` and a picture of it, `size` pixels (width,
/// height), to `<dir>/<name>.png` (a mail's HTML part as a phone shows it, for one).
pub async fn screenshot_page(
    html_text: &str,
    (width, height): (u32, u32),
    dir: &Path,
    name: &str,
) -> Result<std::path::PathBuf, PictureError> {
    std::fs::create_dir_all(dir)
        .map_err(|error| PictureError::Write(dir.display().to_string(), error))?;
    let html = dir.join(format!("{name}.html"));
    let png = dir.join(format!("{name}.png"));
    std::fs::write(&html, html_text)
        .map_err(|error| PictureError::Write(html.display().to_string(), error))?;
    let _ = std::fs::remove_file(&png);
    let profile = tempfile::tempdir()
        .map_err(|error| PictureError::Write("a Chromium profile".into(), error))?;
    let run = tokio::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(CHROMIUM_LIMIT, run).await {
        Err(_) => return Err(PictureError::TimedOut(CHROMIUM_LIMIT)),
        Ok(Err(error)) => return Err(PictureError::Chromium(error)),
        Ok(Ok(_)) => {}
    }
    match std::fs::read(&png) {
        Ok(bytes) if bytes.starts_with(b"\x89PNG") => Ok(png),
        _ => Err(PictureError::NoPicture(png.display().to_string())),
    }
}

const CHROMIUM_LIMIT: Duration = Duration::from_secs(60);

const PAGE_HEAD: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><style>\
body{margin:0;background:#8fb3a0;font:15px/1.35 -apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif}\
.chat{padding:14px 10px}\
.from{color:#2b5278;font-weight:600;margin:0 0 4px 4px}\
.bubble{background:#fff;border-radius:12px;padding:8px 10px;white-space:pre-wrap;word-wrap:break-word}\
.bubble code,.bubble pre{font-family:'DejaVu Sans Mono',monospace;font-size:13px;color:#a33}\
.bubble pre{margin:2px 0;white-space:pre-wrap}\
.bubble blockquote{margin:4px 0;padding:2px 8px;border-left:3px solid #3a8ee6;background:#eef5fd;border-radius:4px}\
.row{display:flex;gap:4px;margin-top:4px}\
.button{flex:1;text-align:center;background:rgba(60,90,80,.55);color:#fff;border-radius:8px;padding:9px 4px;font-weight:600}\
</style></head><body>";

/// A Discord message as a self-contained HTML page (Discord's dark theme): the bot's name,
/// the content's markdown as Discord renders it (bold, inline code, code blocks, quotes; no
/// mention is rendered, as none is allowed), and the buttons in their styles.
pub fn discord_html(message: &DiscordMessage, bot: &str) -> String {
    let mut page = String::from(DISCORD_HEAD);
    let _ = write!(
        page,
        "<div class=\"msg\"><div class=\"from\">{} <span class=\"app\">APP</span></div>",
        escape(bot)
    );
    let mut in_block = false;
    for line in message.content.lines() {
        if line.starts_with("```") {
            page.push_str(if in_block { "</pre>" } else { "<pre>" });
            in_block = !in_block;
        } else if in_block {
            let _ = writeln!(page, "{}", escape(line));
        } else if let Some(quoted) = line.strip_prefix("> ") {
            let _ = write!(page, "<blockquote>{}</blockquote>", discord_inline(quoted));
        } else {
            let _ = write!(page, "<div>{}</div>", discord_inline(line));
        }
    }
    let rows = message.components.as_array().into_iter().flatten();
    for row in rows {
        page.push_str("<div class=\"row\">");
        for button in row["components"].as_array().into_iter().flatten() {
            let style = button["style"].as_u64().unwrap_or(2);
            let label = button["label"].as_str().unwrap_or_default();
            let _ = write!(
                page,
                "<div class=\"button s{style}\">{}</div>",
                escape(label)
            );
        }
        page.push_str("</div>");
    }
    page.push_str("</div></body></html>\n");
    page
}

/// One line of Discord markdown: `**bold**` and `` `code` `` (nothing inside code is markup).
fn discord_inline(line: &str) -> String {
    let mut html = String::new();
    let (mut bold, mut code) = (false, false);
    let mut rest = line;
    while let Some(character) = rest.chars().next() {
        if !code && rest.starts_with("**") {
            html.push_str(if bold { "</b>" } else { "<b>" });
            bold = !bold;
            rest = &rest[2..];
            continue;
        }
        if character == '`' {
            html.push_str(if code { "</code>" } else { "<code>" });
            code = !code;
        } else {
            html.push_str(&escape(&character.to_string()));
        }
        rest = &rest[character.len_utf8()..];
    }
    html
}

const DISCORD_HEAD: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><style>\
body{margin:0;background:#313338;color:#dbdee1;font:15px/1.4 'gg sans','Noto Sans','DejaVu Sans',sans-serif}\
.msg{padding:14px 12px}\
.from{color:#f2f3f5;font-weight:600;margin-bottom:4px}\
.app{background:#5865f2;color:#fff;font-size:10px;border-radius:3px;padding:1px 4px;vertical-align:middle}\
code,pre{font-family:'DejaVu Sans Mono',monospace;font-size:13px;background:#2b2d31;border-radius:4px}\
code{padding:1px 3px}\
pre{margin:4px 0;padding:6px 8px;border:1px solid #1e1f22;white-space:pre-wrap;word-wrap:break-word}\
blockquote{margin:2px 0;padding-left:10px;border-left:4px solid #4e5058}\
.row{display:flex;flex-wrap:wrap;gap:8px;margin-top:8px}\
.button{color:#fff;border-radius:4px;padding:7px 14px;font-weight:500;font-size:14px}\
.s1{background:#5865f2}.s2{background:#4e5058}.s3{background:#248046}.s4{background:#da373c}\
</style></head><body>";

/// The labels of the inline keyboard, row by row.
fn button_rows(message: &ChatMessage) -> Vec<Vec<String>> {
    let rows = message
        .reply_markup
        .as_ref()
        .and_then(|markup| markup.get("inline_keyboard"))
        .and_then(Value::as_array);
    rows.map(|rows| {
        rows.iter()
            .map(|row| {
                row.as_array()
                    .map(|buttons| {
                        buttons
                            .iter()
                            .filter_map(|button| button.get("text").and_then(Value::as_str))
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The text with its entities as HTML elements. Telegram's entities count UTF-16 code units
/// and nest properly (a parsed HTML text cannot make them overlap).
fn text_html(text: &str, entities: &[Value]) -> String {
    // (start, end, opening tag, closing tag), the outer entity first when two start together.
    let mut spans: Vec<(usize, usize, &str, &str)> = entities
        .iter()
        .filter_map(|entity| {
            let offset = entity.get("offset")?.as_u64()? as usize;
            let length = entity.get("length")?.as_u64()? as usize;
            let (open, close) = match entity.get("type")?.as_str()? {
                "bold" => ("<b>", "</b>"),
                "italic" => ("<i>", "</i>"),
                "underline" => ("<u>", "</u>"),
                "strikethrough" => ("<s>", "</s>"),
                "code" => ("<code>", "</code>"),
                "pre" => ("<pre>", "</pre>"),
                "blockquote" | "expandable_blockquote" => ("<blockquote>", "</blockquote>"),
                _ => return None,
            };
            Some((offset, offset + length, open, close))
        })
        .collect();
    spans.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let units: Vec<u16> = text.encode_utf16().collect();
    let mut html = String::new();
    let mut open: Vec<(usize, &str)> = Vec::new();
    let mut next_span = spans.iter().peekable();
    let mut position = 0;
    while position <= units.len() {
        while open.last().is_some_and(|(end, _)| *end == position) {
            if let Some((_, close)) = open.pop() {
                html.push_str(close);
            }
        }
        while let Some((_, end, opening, closing)) =
            next_span.next_if(|(start, ..)| *start == position)
        {
            html.push_str(opening);
            open.push((*end, closing));
        }
        if position == units.len() {
            break;
        }
        // One character: a surrogate pair is two units.
        let width = if (0xD800..0xDC00).contains(&units[position]) {
            2
        } else {
            1
        };
        let end = (position + width).min(units.len());
        html.push_str(&escape(&String::from_utf16_lossy(&units[position..end])));
        position = end;
    }
    while let Some((_, close)) = open.pop() {
        html.push_str(close);
    }
    html
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entities_nest_and_agent_text_stays_text() {
        // "😀" is two UTF-16 units: the bold after it starts at 3, not 2.
        let text = "😀 <b>rm</b> ok";
        let entities = vec![
            json!({"type": "blockquote", "offset": 3, "length": 9}),
            json!({"type": "bold", "offset": 3, "length": 9}),
            json!({"type": "code", "offset": 13, "length": 2}),
        ];
        assert_eq!(
            text_html(text, &entities),
            "😀 <blockquote><b>&lt;b&gt;rm&lt;/b&gt;</b></blockquote> <code>ok</code>"
        );
    }

    #[test]
    fn the_page_shows_the_buttons_row_by_row() {
        let message = ChatMessage {
            chat_id: 1,
            message_id: 2,
            text: "hi".into(),
            entities: Vec::new(),
            reply_markup: Some(json!({"inline_keyboard": [
                [{"text": "✅ Approve", "callback_data": "a"}, {"text": "❌ Reject", "callback_data": "r"}],
                [{"text": "<x>", "callback_data": "s"}]
            ]})),
            reply_to_message_id: None,
            from_bot: true,
            edit_count: 0,
            date: 0,
        };
        let page = message_html(&message, "Some<Bot>");
        assert!(page.contains("Some&lt;Bot&gt;"), "{page}");
        assert!(page.contains(
            "<div class=\"row\"><div class=\"button\">✅ Approve</div><div class=\"button\">❌ Reject</div></div><div class=\"row\"><div class=\"button\">&lt;x&gt;</div></div>"
        ), "{page}");
    }
}
