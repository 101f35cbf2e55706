//! Editing the local instance's config file for `setup`: keeping the user's comments and
//! layout, registering approvers, writing it whole (never half a file).

use toml_edit::{value, Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table};

use crate::exit::CliError;
use crate::instance::{replace_file, Instance};

/// What a config file created by `setup` starts with.
const NEW_CONFIG_HEADER: &str = "\
# The local countersign instance (`countersign up`). Top-level keys are countersign-server's
# options (docs/configuration.md); [telegram], [github], [ntfy], [webhook] and [web] are the
# channel workers'. No secret is kept here: the generated tokens, the bot token and the GitHub
# token are files under $XDG_DATA_HOME/countersign/secrets.
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

/// Adds an `[[approvers]]` entry (who may decide up to critical risk); false when an approver
/// has that identity already (nothing is added).
pub fn add_approver(
    doc: &mut DocumentMut,
    instance: &Instance,
    approver: &NewApprover<'_>,
) -> Result<bool, CliError> {
    let approvers = approvers(doc, instance)?;
    if approvers
        .iter()
        .any(|entry| has_identity(entry, approver.channel, approver.identity))
    {
        return Ok(false);
    }
    // No `cli` identity for the terminal's user: hooks name that user as the requester, and
    // with separation of duties (the default) an approver cannot approve their own request.
    let mut identities = InlineTable::new();
    identities.insert(
        approver.channel,
        Array::from_iter([approver.identity]).into(),
    );
    let mut entry = Table::new();
    entry["id"] = value(approver.id.as_str());
    entry["name"] = value(approver.name);
    entry["max_risk"] = value("critical");
    entry["identities"] = value(identities);
    approvers.push(entry);
    Ok(true)
}
