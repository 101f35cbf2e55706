//! Log output in which no field can forge a line or reorder what an operator reads.
//!
//! The text format writes every field, the message included, with control, invisible and
//! bidirectional characters escaped (`\n`, `\u{202e}`), so a value an agent chose cannot
//! start a new log line or hide text. The JSON format escapes through JSON itself.

use std::fmt::Write as _;

use countersign_core::fields::is_invisible;
use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat};

/// Writes through to `W` with what could break a log line or change how it reads escaped:
/// a field's value is formatted into the line directly, with no string of its own.
struct Escaping<'a, W: std::fmt::Write>(&'a mut W);

impl<W: std::fmt::Write> std::fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        // Most values are printable ASCII: nothing to escape, nothing to decode.
        if text
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'\\')
        {
            return self.0.write_str(text);
        }
        let mut plain = 0;
        for (at, c) in text.char_indices() {
            let short = match c {
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\\' => Some("\\\\"),
                c if c.is_control() || is_invisible(c) || c == '\u{2028}' || c == '\u{2029}' => {
                    None
                }
                _ => continue,
            };
            self.0.write_str(&text[plain..at])?;
            match short {
                Some(escape) => self.0.write_str(escape)?,
                None => write!(self.0, "\\u{{{:x}}}", u32::from(c))?,
            }
            plain = at + c.len_utf8();
        }
        self.0.write_str(&text[plain..])
    }
}

/// The text format's field writer: `name=value`, values escaped, separated by spaces.
pub(crate) fn escaped_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |writer: &mut Writer<'_>, field: &Field, value: &dyn std::fmt::Debug| {
            if field.name() != "message" {
                write!(writer, "{}=", field.name())?;
            }
            write!(Escaping(writer), "{value:?}")
        },
    )
    .delimited(" ")
}

/// Installs the global subscriber for `config.log`.
pub fn init(config: &Config) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.fmt_fields(escaped_fields()).init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escape(text: &str) -> String {
        let mut out = String::new();
        write!(Escaping(&mut out), "{text}").unwrap();
        out
    }

    #[test]
    fn every_field_is_escaped() {
        assert_eq!(escape("a\nb"), "a\\nb");
        assert_eq!(escape("x\u{202e}y\u{200b}"), "x\\u{202e}y\\u{200b}");
        assert_eq!(escape("tab\there\\"), "tab\\there\\\\");
        assert_eq!(escape("ÉVE ok"), "ÉVE ok");
    }

    #[test]
    fn the_text_format_writes_no_raw_newline() {
        use std::sync::{Arc, Mutex};
        let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .without_time()
            .with_ansi(false)
            .with_writer(move || SharedWriter(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let agent_id = "a\n2026-01-01T00:00:00Z  INFO forged: approved";
            tracing::info!(agent_id = %agent_id, reason = ?"x\u{202e}y", "approval\nrequested");
        });
        let text = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.contains("agent_id=a\\n2026"), "{text}");
        assert!(text.contains("approval\\nrequested"), "{text}");
        assert!(text.contains("\\u{202e}"), "{text}");
    }

    struct SharedWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
