//! A fake SMTP relay on loopback: a real SMTP server (RFC 5321 commands EHLO/HELO, STARTTLS
//! with a test certificate, AUTH PLAIN, MAIL FROM, RCPT TO, DATA, RSET, NOOP, QUIT) that
//! records every mail it accepts, for tests to read back (headers, and the decoded parts of a
//! multipart mail). It answers like a relay does: 530 for MAIL before AUTH when a login is
//! required, 535 for wrong credentials, and whatever refusal (4xx or 5xx) a test queues for a
//! stage. A test can hold the answer to DATA, to stop a client between its intent and its
//! send.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

use crate::server::TestCertificates;

/// Where in a mail's transaction a queued refusal answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The answer to `MAIL FROM`.
    Mail,
    /// The answer to `RCPT TO`.
    Rcpt,
    /// The answer after the mail's data (the final `.`): the mail is not taken.
    Data,
}

/// A refusal queued for the next transaction that reaches its stage.
#[derive(Clone, Debug)]
pub struct SmtpFailure {
    pub stage: Stage,
    /// 4xx (try again later) or 5xx (refused for good).
    pub code: u16,
    pub text: String,
}

/// A mail the relay accepted.
#[derive(Clone, Debug)]
pub struct SmtpMessage {
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The data as received, dot-unstuffed, CRLF line ends.
    pub data: String,
    /// The user AUTH logged in as, if any.
    pub authenticated_as: Option<String>,
    /// Whether the session ran over TLS (after STARTTLS).
    pub tls: bool,
}

#[derive(Default)]
struct State {
    messages: Vec<SmtpMessage>,
    failures: VecDeque<SmtpFailure>,
    refused: usize,
    /// DATA commands that found the relay holding.
    held: usize,
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
    /// While true, DATA gets no answer.
    hold: watch::Sender<bool>,
    /// `(user, password)` AUTH PLAIN must give before MAIL; `None`: no login.
    login: Option<(String, String)>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

pub struct FakeSmtp {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Kept for the certificate files' life; `Some` when STARTTLS is offered.
    certificates: Option<TestCertificates>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeSmtp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeSmtp {
    /// A relay without TLS and without login (a relay on loopback).
    pub async fn start() -> FakeSmtp {
        FakeSmtp::start_with(None, false).await
    }

    /// A relay that requires AUTH PLAIN with `user` and `password` and, with `starttls`,
    /// offers STARTTLS with a certificate for 127.0.0.1 signed by a test CA
    /// ([`FakeSmtp::ca_pem`]).
    pub async fn start_with(login: Option<(&str, &str)>, starttls: bool) -> FakeSmtp {
        let certificates = starttls.then(TestCertificates::generate);
        let tls = certificates.as_ref().map(acceptor);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            hold: watch::channel(false).0,
            login: login.map(|(user, password)| (user.to_owned(), password.to_owned())),
            tls,
        });
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake SMTP relay");
        let addr = listener.local_addr().expect("local address");
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = serving.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, shared).await;
                });
            }
        });
        FakeSmtp {
            addr,
            shared,
            certificates,
            task,
        }
    }

    pub fn host(&self) -> String {
        self.addr.ip().to_string()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The test CA's certificate (PEM) when STARTTLS is offered.
    pub fn ca_pem(&self) -> Option<&str> {
        self.certificates.as_ref().map(|c| c.ca_pem.as_str())
    }

    pub fn messages(&self) -> Vec<SmtpMessage> {
        self.lock().messages.clone()
    }

    /// How many transactions a queued refusal answered.
    pub fn refused(&self) -> usize {
        self.lock().refused
    }

    /// How many DATA commands found the relay holding ([`FakeSmtp::hold_data`]).
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// Queues a refusal for the next transaction reaching its stage.
    pub fn fail_next(&self, failure: SmtpFailure) {
        self.lock().failures.push_back(failure);
    }

    /// While `held`, a DATA command gets no answer (the client waits before sending the mail).
    pub fn hold_data(&self, held: bool) {
        self.shared.hold.send_replace(held);
    }

    /// Waits (up to 20 s) until `check` finds what it looks for.
    pub async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeSmtp) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let changed = self.shared.changed.notified();
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the fake SMTP relay never saw {what}");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn acceptor(certificates: &TestCertificates) -> tokio_rustls::TlsAcceptor {
    use tokio_rustls::rustls;
    let files = certificates.tls_config();
    let pem = std::fs::read(&files.cert_file).expect("test certificate");
    let key = std::fs::read(&files.key_file).expect("test key");
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .expect("test certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(&key).expect("test key PEM");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("test certificate and key");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn serve(stream: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let Some(plain) = session(stream, &shared, false).await? else {
        return Ok(());
    };
    let Some(acceptor) = shared.tls.clone() else {
        return Ok(());
    };
    let secured = acceptor.accept(plain).await?;
    session(secured, &shared, true).await?;
    Ok(())
}

/// One SMTP session (until QUIT or the connection's end); `Some(stream)` when the client
/// asked for STARTTLS and the TLS handshake is to follow.
async fn session<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    shared: &Shared,
    tls: bool,
) -> std::io::Result<Option<S>> {
    let mut stream = BufReader::new(stream);
    if !tls {
        stream.write_all(b"220 fake-smtp ESMTP ready\r\n").await?;
    }
    let mut authenticated_as: Option<String> = None;
    let mut mail_from: Option<String> = None;
    let mut rcpt_to: Vec<String> = Vec::new();
    loop {
        let Some(line) = read_line(&mut stream).await? else {
            return Ok(None);
        };
        let upper = line.to_ascii_uppercase();
        let reply: String = if upper.starts_with("EHLO") {
            let mut reply = "250-fake-smtp greets you\r\n".to_owned();
            if shared.tls.is_some() && !tls {
                reply.push_str("250-STARTTLS\r\n");
            }
            if shared.login.is_some() {
                reply.push_str("250-AUTH PLAIN\r\n");
            }
            reply.push_str("250 8BITMIME\r\n");
            reply
        } else if upper.starts_with("HELO") {
            "250 fake-smtp\r\n".to_owned()
        } else if upper == "STARTTLS" && shared.tls.is_some() && !tls {
            stream.write_all(b"220 go ahead\r\n").await?;
            stream.flush().await?;
            return Ok(Some(stream.into_inner()));
        } else if upper.starts_with("AUTH PLAIN") {
            let initial = line[10..].trim().to_owned();
            let response = if initial.is_empty() {
                stream.write_all(b"334 \r\n").await?;
                read_line(&mut stream).await?.unwrap_or_default()
            } else {
                initial
            };
            let decoded = STANDARD.decode(response.trim()).unwrap_or_default();
            let fields: Vec<&[u8]> = decoded.split(|b| *b == 0).collect();
            match (&shared.login, fields.as_slice()) {
                (Some((user, password)), [_, given_user, given_password])
                    if *given_user == user.as_bytes() && *given_password == password.as_bytes() =>
                {
                    authenticated_as = Some(user.clone());
                    "235 2.7.0 Authentication successful\r\n".to_owned()
                }
                _ => "535 5.7.8 Authentication credentials invalid\r\n".to_owned(),
            }
        } else if upper.starts_with("MAIL FROM:") {
            if shared.login.is_some() && authenticated_as.is_none() {
                "530 5.7.0 Authentication required\r\n".to_owned()
            } else if let Some(refusal) = refusal(shared, Stage::Mail) {
                refusal
            } else {
                mail_from = Some(address(&line[10..]));
                rcpt_to.clear();
                "250 2.1.0 Ok\r\n".to_owned()
            }
        } else if upper.starts_with("RCPT TO:") {
            if mail_from.is_none() {
                "503 5.5.1 MAIL first\r\n".to_owned()
            } else if let Some(refusal) = refusal(shared, Stage::Rcpt) {
                refusal
            } else {
                rcpt_to.push(address(&line[8..]));
                "250 2.1.5 Ok\r\n".to_owned()
            }
        } else if upper == "DATA" {
            if mail_from.is_none() || rcpt_to.is_empty() {
                "503 5.5.1 RCPT first\r\n".to_owned()
            } else {
                let mut hold = shared.hold.subscribe();
                if *hold.borrow_and_update() {
                    shared.state.lock().unwrap_or_else(|e| e.into_inner()).held += 1;
                    shared.changed.notify_waiters();
                }
                let _ = hold.wait_for(|held| !*held).await;
                stream
                    .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                    .await?;
                let mut data = String::new();
                loop {
                    let Some(line) = read_line(&mut stream).await? else {
                        return Ok(None);
                    };
                    if line == "." {
                        break;
                    }
                    data.push_str(line.strip_prefix('.').unwrap_or(&line));
                    data.push_str("\r\n");
                }
                match refusal(shared, Stage::Data) {
                    Some(refusal) => refusal,
                    None => {
                        let message = SmtpMessage {
                            mail_from: mail_from.take().unwrap_or_default(),
                            rcpt_to: std::mem::take(&mut rcpt_to),
                            data,
                            authenticated_as: authenticated_as.clone(),
                            tls,
                        };
                        shared
                            .state
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .messages
                            .push(message);
                        shared.changed.notify_waiters();
                        "250 2.0.0 Ok: queued\r\n".to_owned()
                    }
                }
            }
        } else if upper == "RSET" {
            mail_from = None;
            rcpt_to.clear();
            "250 2.0.0 Ok\r\n".to_owned()
        } else if upper == "NOOP" {
            "250 2.0.0 Ok\r\n".to_owned()
        } else if upper == "QUIT" {
            stream.write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(None);
        } else {
            "502 5.5.2 Command not recognized\r\n".to_owned()
        };
        stream.write_all(reply.as_bytes()).await?;
        stream.flush().await?;
    }
}

/// The queued refusal for `stage`, taken, as a reply line.
fn refusal(shared: &Shared, stage: Stage) -> Option<String> {
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let at = state.failures.iter().position(|f| f.stage == stage)?;
    let failure = state.failures.remove(at)?;
    state.refused += 1;
    drop(state);
    shared.changed.notify_waiters();
    Some(format!("{} {}\r\n", failure.code, failure.text))
}

/// `<a@b> SIZE=…` → `a@b`.
fn address(argument: &str) -> String {
    let argument = argument.trim();
    let end = argument.find('>').map_or(argument.len(), |at| at + 1);
    argument[..end]
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_owned()
}

async fn read_line<S: AsyncRead + Unpin>(
    stream: &mut BufReader<S>,
) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    if stream.read_until(b'\n', &mut line).await? == 0 {
        return Ok(None);
    }
    let line = String::from_utf8_lossy(&line);
    Ok(Some(line.trim_end_matches(['\r', '\n']).to_owned()))
}

impl SmtpMessage {
    /// The header `name`'s value (folded lines joined, encoded words decoded); the first one
    /// when it appears more than once.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers_named(name).into_iter().next()
    }

    /// Every value of header `name`, in order.
    pub fn headers_named(&self, name: &str) -> Vec<String> {
        let head = self.data.split("\r\n\r\n").next().unwrap_or_default();
        headers(head)
            .into_iter()
            .filter(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| decode_words(&value))
            .collect()
    }

    /// The decoded body of the first part whose Content-Type starts with `mime`
    /// (`text/plain`, `text/html`) in a multipart mail.
    pub fn part(&self, mime: &str) -> Option<String> {
        let content_type = self.header("Content-Type")?;
        let boundary = content_type
            .split(';')
            .find_map(|param| param.trim().strip_prefix("boundary="))?
            .trim_matches('"')
            .to_owned();
        let (_, body) = self.data.split_once("\r\n\r\n")?;
        body.split(&format!("--{boundary}")).find_map(|part| {
            let (head, content) = part.trim_start_matches("\r\n").split_once("\r\n\r\n")?;
            let fields = headers(head);
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(header, _)| header.eq_ignore_ascii_case(name))
                    .map(|(_, value)| value.to_ascii_lowercase())
            };
            if !field("Content-Type")?.starts_with(mime) {
                return None;
            }
            let content = content.trim_end_matches("\r\n");
            match field("Content-Transfer-Encoding").as_deref() {
                Some("base64") => {
                    let joined: String = content.split_whitespace().collect();
                    String::from_utf8(STANDARD.decode(joined).ok()?).ok()
                }
                _ => Some(content.replace("\r\n", "\n")),
            }
        })
    }
}

/// A header block's fields, folded lines joined.
fn headers(head: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in head.split("\r\n") {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push_str(line);
            }
        } else if let Some((name, value)) = line.split_once(':') {
            fields.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    fields
}

/// Decodes RFC 2047 encoded words (`=?utf-8?b?…?=`, `=?utf-8?q?…?=`); whitespace between
/// two encoded words is dropped, as the RFC says.
fn decode_words(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    let mut last_was_word = false;
    while let Some(start) = rest.find("=?") {
        let between = &rest[..start];
        if !(last_was_word && between.trim().is_empty()) {
            out.push_str(between);
        }
        let after = &rest[start + 2..];
        let mut pieces = after.splitn(3, '?');
        let (Some(_charset), Some(encoding), Some(tail)) =
            (pieces.next(), pieces.next(), pieces.next())
        else {
            out.push_str(&rest[start..]);
            return out;
        };
        let Some(end) = tail.find("?=") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let text = &tail[..end];
        let bytes = if encoding.eq_ignore_ascii_case("b") {
            STANDARD.decode(text).unwrap_or_default()
        } else {
            quoted_printable_word(text)
        };
        out.push_str(&String::from_utf8_lossy(&bytes));
        last_was_word = true;
        rest = &tail[end + 2..];
    }
    out.push_str(rest);
    out
}

fn quoted_printable_word(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'_' => out.push(b' '),
            b'=' if at + 2 < bytes.len() => {
                if let Ok(byte) = u8::from_str_radix(&text[at + 1..at + 3], 16) {
                    out.push(byte);
                }
                at += 2;
            }
            other => out.push(other),
        }
        at += 1;
    }
    out
}
