//! Editing the local instance's config file for `setup`: keeping the user's comments and
//! layout, registering approvers, writing it whole (never half a file).

use toml_edit::{value, Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table};

use crate::exit::CliError;
use crate::instance::{replace_file, Instance};

/// What a config file created by `setup` starts with.
const NEW_CONFIG_HEADER: &str = "\
# The local countersign instance (`countersign up`). Top-level keys are countersign-server's
# options (docs/configuration.md); [telegram], [github], [ntfy], [slack], [webhook] and [web]
# are the channel workers'. No secret is kept here: the generated tokens, the bot token and the
# GitHub token are files under $XDG_DATA_HOME/countersign/secrets.
";

/// The config file as a document to edit; a missing file gives a new one with a header.
pub fn read(instance: &Instance) -> Result<DocumentMut, CliError> {
    let path = &instance.config_file;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => NEW_CONFIG_HEADER.to_owned(),
        Err(error) => {
            return Err(CliError::Usage(format!(
                "cannot read config file {}: {error}",
                path.display()
            )))
        }
    };
    text.parse()
        .map_err(|error| CliError::Usage(format!("config file {}: {error}", path.display())))
}

/// Replaces the config file with `doc`.
pub fn write(instance: &Instance, doc: &DocumentMut) -> Result<(), CliError> {
    if let Some(dir) = instance.config_file.parent() {
        std::fs::create_dir_all(dir).map_err(|error| {
            CliError::Failure(format!("cannot create {}: {error}", dir.display()))
        })?;
    }
    replace_file(&instance.config_file, doc.to_string().as_bytes(), None)
}

/// A config file that `setup` cannot edit: what is wrong in it.
pub fn invalid(instance: &Instance, what: &str) -> CliError {
    CliError::Usage(format!(
        "config file {}: {what}; not changing it",
        instance.config_file.display()
    ))
}

/// A table of the document (created when missing).
pub fn table<'a>(
    doc: &'a mut DocumentMut,
    instance: &Instance,
    name: &str,
) -> Result<&'a mut Table, CliError> {
    doc.entry(name)
        .or_insert(Item::Table(Table::new()))
        .as_table_mut()
        .ok_or_else(|| invalid(instance, &format!("{name} is not a table")))
}

/// The `[[approvers]]` entries.
pub fn approvers<'a>(
    doc: &'a mut DocumentMut,
    instance: &Instance,
) -> Result<&'a mut ArrayOfTables, CliError> {
    doc.entry("approvers")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| invalid(instance, "approvers is not an array of tables"))
}

/// Whether an approver entry has `identity` on `channel` (compared as the server does for
/// names: ignoring case).
pub fn has_identity(approver: &Table, channel: &str, identity: &str) -> bool {
    approver
        .get("identities")
        .and_then(|identities| identities.get(channel))
        .and_then(Item::as_array)
        .is_some_and(|ids| {
            ids.iter().any(|id| {
                id.as_str()
                    .is_some_and(|id| id.eq_ignore_ascii_case(identity))
            })
        })
}

/// A person to register as an approver, known on one channel.
pub struct NewApprover<'a> {
    pub id: String,
    pub name: &'a str,
    pub channel: &'a str,
    pub identity: &'a str,
}

/// Whose identity a setup registers: a new person, or one of the configured approvers.
pub enum Owner<'a> {
    /// Always a new `[[approvers]]` entry (`setup telegram --add`).
    NewPerson,
    /// The approver with this id (a new entry with this id when there is none).
    Approver(&'a str),
    /// The only configured approver when there is exactly one and it has no identity on the
    /// channel yet (a person alone adding a second channel), a new entry when there is none.
    /// With several: a new entry when `else_new`, else a refusal asking whose it is.
    TheOnlyOne { else_new: bool },
}

impl Owner<'_> {
    /// The owner of an identity paired by a code: the only approver on a first pairing (a
    /// person alone who set up another channel first), a new person with `--add`.
    pub fn pairing(add: bool) -> Self {
        if add {
            Owner::NewPerson
        } else {
            Owner::TheOnlyOne { else_new: true }
        }
    }
}

/// What [`register_identity`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// A new `[[approvers]]` entry with this id.
    Added(String),
    /// The identity added to the approver with this id: one person, counted once in a quorum.
    Joined(String),
    /// An approver (this id) had the identity already; nothing changed.
    Already(String),
}

impl Registered {
    /// Tells the person what pairing `name` did; `goes_to`: where their approvals go.
    pub fn announce(&self, name: &str, goes_to: &str, instance: &Instance) {
        match self {
            Registered::Added(id) | Registered::Joined(id) => println!(
                "Paired {name} as approver {id}; approvals go to {goes_to}.\nWritten to {}. Next: countersign up (restart it if it is running).",
                instance.config_file.display()
            ),
            Registered::Already(id) => {
                println!("{name} ({id}) was already an approver; nothing changed.")
            }
        }
    }
}

/// Registers `approver`'s identity: on the approver `owner` names, or in a new entry (who may
/// decide up to critical risk). Two entries for one person would let them meet a quorum of two
/// alone, so with several approvers configured the caller must say whose identity it is.
pub fn register_identity(
    doc: &mut DocumentMut,
    instance: &Instance,
    approver: &NewApprover<'_>,
    owner: Owner<'_>,
) -> Result<Registered, CliError> {
    let approvers = approvers(doc, instance)?;
    let id_of = |entry: &Table| entry.get("id").and_then(Item::as_str).map(str::to_owned);
    if let Some(entry) = approvers
        .iter()
        .find(|entry| has_identity(entry, approver.channel, approver.identity))
    {
        return Ok(Registered::Already(id_of(entry).unwrap_or_default()));
    }
    let existing = match owner {
        Owner::NewPerson => None,
        Owner::Approver(id) => approvers
            .iter()
            .position(|entry| id_of(entry).as_deref() == Some(id)),
        Owner::TheOnlyOne { else_new } => match approvers.len() {
            0 => None,
            1 if !has_channel(approvers.get(0), approver.channel) => Some(0),
            _ if else_new => None,
            _ => {
                let ids: Vec<String> = approvers.iter().filter_map(id_of).collect();
                return Err(CliError::Usage(format!(
                    "approvers {} are configured already: say whose {} identity {} is with --approver-id ID (a configured id, or a new one for another person)",
                    ids.join(", "),
                    approver.channel,
                    approver.identity
                )));
            }
        },
    };
    if let Some(entry) = existing.and_then(|index| approvers.get_mut(index)) {
        let id = id_of(entry).unwrap_or_default();
        let identities = entry
            .entry("identities")
            .or_insert(value(InlineTable::new()));
        let ids = match identities {
            Item::Value(toml_edit::Value::InlineTable(table)) => table
                .entry(approver.channel)
                .or_insert(Array::new().into())
                .as_array_mut(),
            Item::Table(table) => table
                .entry(approver.channel)
                .or_insert(value(Array::new()))
                .as_array_mut(),
            _ => None,
        }
        .ok_or_else(|| {
            invalid(
                instance,
                &format!(
                    "approver {id}: identities.{} is not a list",
                    approver.channel
                ),
            )
        })?;
        ids.push(approver.identity);
        return Ok(Registered::Joined(id));
    }
    let id = match owner {
        Owner::Approver(id) => id.to_owned(),
        _ => approver.id.clone(),
    };
    // No `cli` identity for the terminal's user: hooks name that user as the requester, and
    // with separation of duties (the default) an approver cannot approve their own request.
    let mut identities = InlineTable::new();
    identities.insert(
        approver.channel,
        Array::from_iter([approver.identity]).into(),
    );
    let mut entry = Table::new();
    entry["id"] = value(id.as_str());
    entry["name"] = value(approver.name);
    entry["max_risk"] = value("critical");
    entry["identities"] = value(identities);
    approvers.push(entry);
    Ok(Registered::Added(id))
}

/// Whether an approver entry has any identity on `channel`.
fn has_channel(approver: Option<&Table>, channel: &str) -> bool {
    approver
        .and_then(|entry| entry.get("identities"))
        .and_then(|identities| identities.get(channel))
        .is_some()
}
