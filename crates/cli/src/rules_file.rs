//! The policy rules in the local instance's config file: reading them (with the line each
//! starts on), compiling them as the server would, and writing a starter preset after the
//! user's own rules. `setup`, `install` and `countersign policy` share it.

use countersign_core::policy::{Policy, RuleSpec};

use crate::config_file;
use crate::exit::CliError;
use crate::instance::Instance;

/// The presets: rules in TOML, appended to the config file as they are (config/presets/).
/// The preset that writes the `balanced` rules with `[policy] mode = "observe"`: they are
/// evaluated and recorded, and every call is asked as without them.
const OBSERVE: &str = "observe";

const PRESETS: [(&str, &str); 2] = [
    (
        "balanced",
        include_str!("../../../config/presets/balanced.toml"),
    ),
    (
        "strict",
        include_str!("../../../config/presets/strict.toml"),
    ),
];

/// The names `policy preset` takes.
fn preset_names() -> Vec<&'static str> {
    PRESETS
        .iter()
        .map(|(name, _)| *name)
        .chain([OBSERVE])
        .collect()
}

/// Refuses a name that is not a preset's; the rules it writes.
pub fn check_preset(name: &str) -> Result<&'static str, CliError> {
    let rules_of = if name == OBSERVE { "balanced" } else { name };
    PRESETS
        .iter()
        .find(|(preset, _)| *preset == rules_of)
        .map(|(_, text)| *text)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "no preset {name:?}; the presets are {}",
                preset_names().join(", ")
            ))
        })
}

/// After `setup` and `install`: writes preset `name` when one is given; otherwise, while the
/// config file has no rules, says how to write one.
pub fn offer_preset(instance: &Instance, name: Option<&str>) -> Result<(), CliError> {
    match name {
        Some(name) => {
            let written = write_preset(instance, name)?;
            println!(
                "Wrote the {name} preset's {written} policy rules into {} (countersign up reads them at start).",
                instance.config_file.display()
            );
        }
        None if !config_file::read(instance)?.contains_key("rules") => println!(
            "No policy rules yet, so every call a hook gates is asked: `countersign policy preset balanced` lets reads and read-only commands (ls, git status, ...) through without asking, `strict` only reads (docs/policies.md)."
        ),
        None => {}
    }
    Ok(())
}

/// Replaces the rules of any preset in the config file with preset `name`'s, after the
/// user's own rules, and sets `[policy] mode` (`observe` for the observe preset, else the
/// default, enforce); returns how many rules it wrote.
pub fn write_preset(instance: &Instance, name: &str) -> Result<usize, CliError> {
    let preset = check_preset(name)?;
    let mut doc = config_file::read(instance)?;
    if name == OBSERVE {
        let policy = doc
            .entry("policy")
            .or_insert_with(toml_edit::table)
            .as_table_like_mut()
            .ok_or_else(|| config_file::invalid(instance, "policy is not a [policy] table"))?;
        policy.insert("mode", toml_edit::value(OBSERVE));
    } else if let Some(policy) = doc.get_mut("policy").and_then(|p| p.as_table_like_mut()) {
        policy.remove("mode");
        if policy.is_empty() {
            doc.remove("policy");
        }
    }
    if let Some(item) = doc.get_mut("rules") {
        let rules = item.as_array_of_tables_mut().ok_or_else(|| {
            config_file::invalid(instance, "rules is not a list of [[rules]] tables")
        })?;
        rules.retain(|rule| {
            let name = rule
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or_default();
            !PRESETS
                .iter()
                .any(|(preset, _)| name.starts_with(&format!("{preset}: ")))
        });
        if rules.is_empty() {
            doc.remove("rules");
        }
    }
    let mut text = doc.to_string();
    if !text.is_empty() && !text.ends_with("\n\n") {
        text.push_str(if text.ends_with('\n') { "\n" } else { "\n\n" });
    }
    text.push_str(preset);
    let (specs, _) = rules_of(&text).map_err(|what| config_file::invalid(instance, &what))?;
    compile(&specs).map_err(|what| config_file::invalid(instance, &what))?;
    let doc = text
        .parse()
        .map_err(|error| config_file::invalid(instance, &format!("{error}")))?;
    config_file::write(instance, &doc)?;
    let rules_of = if name == OBSERVE { "balanced" } else { name };
    Ok(specs
        .iter()
        .filter(|rule| rule.name.starts_with(&format!("{rules_of}: ")))
        .count())
}

/// The `[[rules]]` of a config file's text and the line each starts on.
pub fn rules_of(text: &str) -> Result<(Vec<RuleSpec>, Vec<Option<usize>>), String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|error| error.to_string())?;
    let specs: Vec<RuleSpec> = match table.remove("rules") {
        Some(rules) => rules
            .try_into()
            .map_err(|error| format!("rules: {error}"))?,
        None => Vec::new(),
    };
    let spans = toml_edit::ImDocument::parse(text)
        .ok()
        .and_then(|doc| {
            doc.get("rules")
                .and_then(|rules| rules.as_array_of_tables())
                .map(|rules| rules.iter().map(|rule| rule.span()).collect::<Vec<_>>())
        })
        .unwrap_or_default();
    let lines = (0..specs.len())
        .map(|i| {
            spans
                .get(i)
                .cloned()
                .flatten()
                .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1)
        })
        .collect();
    Ok((specs, lines))
}

/// The rules compiled as the server compiles them; the error names the rule that failed.
pub fn compile(specs: &[RuleSpec]) -> Result<Policy, String> {
    Policy::compile(specs, &countersign_core::validate::Limits::default())
        .map_err(|error| error.to_string())
}
