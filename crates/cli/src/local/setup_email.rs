//! `setup email`: connects email to the local instance. The settings are checked as the
//! worker checks them, the address's approver is found (or a new one made), then a test mail
//! goes through the relay (a refused login, TLS or recipient stops here) and its link must be
//! confirmed on a page this command serves, as the decision links' pages are: its GET only
//! shows a button (mail scanners open links), the button's POST confirms. Only then is
//! anything written: the password to a file only the user can read, the `[email]` section
//! with the address among its `[[email.recipients]]`, and the address as the approver's
//! `email` identity.

use countersign_email::config::{
    recipient_address, EmailSection, FileConfig, RecipientSection, ServerSection, TlsMode,
    SMTP_PASSWORD_ENV,
};
use countersign_email::confirm::{confirm_address, Check, ConfirmError};
use countersign_email::Settings;
use countersign_worker::config::WorkerSettings;
use toml_edit::{value, ArrayOfTables, Item, Table};

use crate::args::SetupEmailArgs;
use crate::config_file::{self, NewApprover, Owner, Registered};
use crate::exit::{CliError, Exit};
use crate::instance::{local_url, Instance, Secret};
use crate::local::setup::{prompt, prompt_secret};

const DEFAULT_LISTEN: &str = "127.0.0.1:8789";

pub async fn email(instance: &Instance, args: SetupEmailArgs) -> Result<Exit, CliError> {
    let mut doc = config_file::read(instance)?;
    let configured = |key: &str| {
        doc.get("email")
            .and_then(|email| email.get(key))
            .and_then(Item::as_str)
            .map(str::to_owned)
    };
    let listen = match args.listen {
        Some(listen) => listen,
        None => configured("listen")
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned())
            .parse()
            .map_err(|error| config_file::invalid(instance, &format!("email.listen: {error}")))?,
    };
    let public_url = args
        .public_url
        .clone()
        .or_else(|| configured("public_url"))
        .unwrap_or_else(|| local_url(listen));
    let smtp_host = asked(
        args.smtp_host.clone(),
        "SMTP server (your provider's submission host)",
    )?;
    let username = match &args.username {
        Some(username) => username.trim().to_owned(),
        None => prompt("SMTP user name (empty: the relay needs no login)")?,
    };
    let username = (!username.is_empty()).then_some(username);
    let password = match &username {
        None => None,
        Some(_) => Some(password()?),
    };
    let from = asked(args.from.clone(), "Sender (Name <address>, or an address)")?;
    let to = asked(args.to.clone(), "Your address (approval requests go there)")?;
    let to = recipient_address(&to).map_err(|error| CliError::Usage(error.to_string()))?;
    let tls: TlsMode =
        args.tls
            .parse()
            .map_err(|error: countersign_email::config::ConfigError| {
                CliError::Usage(format!("--tls: {error}"))
            })?;

    // What the worker will be given, checked as it checks it.
    let section = EmailSection {
        smtp_host: smtp_host.clone(),
        smtp_port: args.smtp_port,
        tls,
        ca_file: args.ca_file.clone(),
        username: username.clone(),
        from: from.clone(),
        default_recipient: Some(to.clone()),
        listen,
        public_url: public_url.clone(),
        state_dir: instance.data_dir.join("email"),
        request_timeout_ms: countersign_worker::config::defaults::request_timeout_ms(),
        retry_interval_ms: countersign_worker::config::defaults::retry_interval_ms(),
        max_retry_wait_ms: countersign_worker::config::defaults::max_retry_wait_ms(),
    };
    let file = FileConfig {
        server: ServerSection {
            url: "http://127.0.0.1:50051".to_owned(),
            ..ServerSection::default()
        },
        email: section,
        recipients: vec![RecipientSection {
            address: to.clone(),
        }],
        metrics: Default::default(),
    };
    let settings = Settings::from_file(file, |name| match name {
        SMTP_PASSWORD_ENV => password.clone(),
        _ => None,
    })
    .map_err(|error| CliError::Usage(format!("{error}; nothing was changed")))?;

    let newly = NewApprover {
        id: format!("email:{to}"),
        name: &to,
        channel: countersign_email::CHANNEL,
        identity: &to,
    };
    let owner = match &args.approver_id {
        Some(id) => Owner::Approver(id),
        None => Owner::TheOnlyOne { else_new: false },
    };
    let registered = config_file::register_identity(&mut doc, instance, &newly, owner)?;

    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|error| {
        CliError::Failure(format!(
            "cannot serve the confirmation page on {listen}: {error} (stop countersign up while setting up, or pass --listen ADDRESS); nothing was changed"
        ))
    })?;
    let check = Check {
        smtp: &settings.smtp,
        from: &settings.from,
        to: &to,
        listener,
        public_url: &settings.public_url,
        wait: args.wait,
    };
    let wait = args.wait;
    confirm_address(check, || {
        eprintln!(
            "A test mail went to {to} through {smtp_host}. Open its link and press Confirm (waiting up to {} s)…",
            wait.as_secs()
        )
    })
    .await
    .map_err(|error| match error {
        ConfirmError::Smtp(error) => CliError::Failure(format!(
            "the test mail to {to} could not be sent through {smtp_host}:{}: {error}; check the host, port, tls mode, user name and password; nothing was changed",
            settings.smtp.port
        )),
        error => CliError::Failure(format!("{error}; nothing was changed, run countersign setup email again")),
    })?;

    if let Some(password) = &password {
        instance.write_secret(Secret::SmtpPassword, password)?;
    }
    let email = config_file::table(&mut doc, instance, "email")?;
    email["smtp_host"] = value(smtp_host.as_str());
    match args.smtp_port {
        Some(port) => email["smtp_port"] = value(i64::from(port)),
        None => {
            email.remove("smtp_port");
        }
    }
    email["tls"] = value(args.tls.as_str());
    match &args.ca_file {
        Some(path) => email["ca_file"] = value(path.display().to_string()),
        None => {
            email.remove("ca_file");
        }
    }
    match &username {
        Some(username) => email["username"] = value(username.as_str()),
        None => {
            email.remove("username");
        }
    }
    email["from"] = value(from.as_str());
    email["default_recipient"] = value(to.as_str());
    if args.listen.is_some() {
        email["listen"] = value(listen.to_string());
    }
    if args.public_url.is_some() {
        email["public_url"] = value(public_url.as_str());
    }
    let recipients = email
        .entry("recipients")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| {
            config_file::invalid(instance, "email.recipients is not a list of tables")
        })?;
    let listed = recipients.iter().any(|recipient| {
        recipient
            .get("address")
            .and_then(Item::as_str)
            .is_some_and(|address| address.eq_ignore_ascii_case(&to))
    });
    if !listed {
        let mut recipient = Table::new();
        recipient["address"] = value(to.as_str());
        recipients.push(recipient);
    }
    config_file::write(instance, &doc)?;

    println!("Email is set up: approval requests go to {to} through {smtp_host}.");
    match &registered {
        Registered::Added(id) => println!("{to} decides through the mails' links, as approver {id}."),
        Registered::Joined(id) => println!(
            "{to} decides through the mails' links, as approver {id} (one person on two channels, counted once in a quorum)."
        ),
        Registered::Already(id) => println!("{to} was already an approver by email ({id})."),
    }
    if public_url.starts_with("http://127.") || public_url.starts_with("http://localhost") {
        println!(
            "The links open {public_url}, on this machine only: to decide from a phone, serve it behind a TLS proxy and pass --public-url."
        );
    }
    let kept = if password.is_some() {
        format!(
            "; the password is kept in {} (readable only by you)",
            instance.secret_path(Secret::SmtpPassword).display()
        )
    } else {
        String::new()
    };
    println!(
        "Written to {}{kept}.\nNext: countersign up (restart it if it is running).",
        instance.config_file.display()
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// `given`, else the answer to `question`; empty is refused.
fn asked(given: Option<String>, question: &str) -> Result<String, CliError> {
    let answer = match given {
        Some(given) => given.trim().to_owned(),
        None => prompt(question)?,
    };
    if answer.is_empty() {
        return Err(CliError::Usage(format!(
            "no answer to {question:?}: type it at the prompt, or pass it as an option (countersign setup email --help)"
        )));
    }
    Ok(answer)
}

/// The SMTP password: `COUNTERSIGN_SMTP_PASSWORD`, or typed at the prompt.
fn password() -> Result<String, CliError> {
    let password = match std::env::var(SMTP_PASSWORD_ENV)
        .ok()
        .filter(|password| !password.is_empty())
    {
        Some(password) => password,
        None => prompt_secret("SMTP password")?,
    };
    if password.is_empty() {
        return Err(CliError::Usage(format!(
            "no SMTP password: type it at the prompt or set {SMTP_PASSWORD_ENV}"
        )));
    }
    Ok(password)
}
