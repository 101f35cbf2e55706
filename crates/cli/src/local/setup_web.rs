//! `setup web`: enables the web inbox of the local instance and prints a one-time sign-in link
//! for an approver (the only one registered, or `--approver`). The approver gets a `web`
//! identity in `[[approvers]]` (derived from their id when they have none), so that what they
//! decide in the inbox counts as theirs. The link is the web inbox's own login token
//! (`countersign_web::sessions`): single-use, expiring, kept only as a digest.

use countersign_web::sessions::{Approver, Sessions};
use toml_edit::{value, Array, Item, Table, TableLike};

use crate::args::SetupWebArgs;
use crate::config_file;
use crate::exit::{CliError, Exit};
use crate::instance::{local_url, Instance};
use crate::local::channels::{web_settings, WebTokens};

/// The channel the web inbox decides on.
const CHANNEL: &str = countersign_web::config::CHANNEL;

pub async fn web(instance: &Instance, args: SetupWebArgs) -> Result<Exit, CliError> {
    let mut doc = config_file::read(instance)?;
    let approvers = config_file::approvers(&mut doc, instance)?;
    let ids: Vec<String> = approvers
        .iter()
        .filter_map(|approver| approver.get("id").and_then(Item::as_str))
        .map(str::to_owned)
        .collect();
    let index = match &args.approver {
        Some(wanted) => ids.iter().position(|id| id == wanted).ok_or_else(|| {
            CliError::Usage(format!(
                "no approver {wanted:?} in {}: the approvers are {}",
                instance.config_file.display(),
                if ids.is_empty() { "none yet".to_owned() } else { ids.join(", ") }
            ))
        })?,
        None if ids.is_empty() => {
            return Err(CliError::Usage(
                "no approver yet to sign in: pair yourself first (countersign setup telegram, or countersign setup github), then run countersign setup web".into(),
            ))
        }
        None if ids.len() == 1 => 0,
        None => {
            return Err(CliError::Usage(format!(
                "approvers {} are configured: say who signs in with --approver ID",
                ids.join(", ")
            )))
        }
    };
    let taken: Vec<String> = approvers
        .iter()
        .enumerate()
        .filter(|(other, _)| *other != index)
        .filter_map(|(_, entry)| entry.get("identities")?.get(CHANNEL)?.as_array().cloned())
        .flat_map(|ids| {
            ids.iter()
                .filter_map(|id| id.as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect();
    let approver = approvers
        .get_mut(index)
        .ok_or_else(|| config_file::invalid(instance, "approvers changed while reading"))?;
    let id = ids[index].clone();
    let name = approver
        .get("name")
        .and_then(Item::as_str)
        .filter(|name| !name.is_empty())
        .unwrap_or(id.as_str())
        .to_owned();
    let identity = web_identity(instance, approver, &id)?;
    // Two approvers with one web identity: the server would refuse the file at the next start.
    if taken
        .iter()
        .any(|other| other.eq_ignore_ascii_case(&identity))
    {
        return Err(CliError::Usage(format!(
            "approver {id}'s web identity would be {identity}, which another approver has already: give {id} one of its own in the config file (identities = {{ web = [\"...\"] }}), then run countersign setup web --approver {id} again"
        )));
    }

    let web = config_file::table(&mut doc, instance, "web")?;
    if let Some(listen) = args.listen {
        web["listen"] = value(listen.to_string());
    }
    config_file::write(instance, &doc)?;

    // Only the sessions are touched here: the server's address does not matter.
    let loaded = instance.load_config()?;
    let server_url = local_url(loaded.server.listen);
    let section = loaded.web.unwrap_or_default();
    let settings = web_settings(instance, section, &server_url, WebTokens::default())?;
    let sessions = Sessions::open(&settings.state_dir)
        .await
        .map_err(|error| CliError::Failure(format!("the web inbox's sessions: {error}")))?;
    let login = sessions
        .issue_login(
            &Approver {
                id: identity.clone(),
                name: name.clone(),
            },
            settings.login_ttl,
        )
        .await
        .map_err(|error| CliError::Failure(format!("cannot make a sign-in link: {error}")))?;
    println!(
        "The web inbox is enabled at {} (countersign up serves it; restart it if it is running).\nOpen this link to sign in as {name} ({CHANNEL}:{identity}); it works once, for {}:\n\n    {}/login/{login}\n",
        settings.public_url,
        humantime::format_duration(settings.login_ttl),
        settings.public_url
    );
    crate::rules_file::offer_preset(instance, args.preset.name.as_deref())?;
    Ok(Exit::Success)
}

/// The approver's identity on the web inbox: the one configured, or one made from their id
/// (the characters a web identity may not hold become `-`) and written into the entry.
fn web_identity(instance: &Instance, approver: &mut Table, id: &str) -> Result<String, CliError> {
    let configured = approver
        .get("identities")
        .and_then(|identities| identities.get(CHANNEL))
        .and_then(Item::as_array)
        .and_then(|ids| ids.iter().find_map(|id| id.as_str()))
        .map(str::to_owned);
    if let Some(identity) = configured {
        return Ok(identity);
    }
    let identity: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    let identities: &mut dyn TableLike = match approver
        .entry("identities")
        .or_insert(value(toml_edit::InlineTable::new()))
    {
        Item::Table(table) => table,
        Item::Value(toml_edit::Value::InlineTable(table)) => table,
        _ => {
            return Err(config_file::invalid(
                instance,
                &format!("approver {id}: identities is not a table"),
            ))
        }
    };
    identities.insert(CHANNEL, value(Array::from_iter([identity.as_str()])));
    Ok(identity)
}
