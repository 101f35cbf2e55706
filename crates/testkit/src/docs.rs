//! Configuration examples from the documentation, so that tests run on what the docs show
//! and the docs cannot drift from what works.

/// The worked example of groups, delegation, reminders and escalation in
/// docs/configuration.md: a server TOML with approvers, groups and rules.
pub fn groups_example() -> &'static str {
    let doc = include_str!("../../../docs/configuration.md");
    block_under(doc, "### Worked example", "toml")
        .expect("a TOML block under \"### Worked example\" in docs/configuration.md")
}

/// The first code block of `language` after `heading` in `doc`.
fn block_under<'a>(doc: &'a str, heading: &str, language: &str) -> Option<&'a str> {
    doc.split(heading)
        .nth(1)
        .and_then(|section| section.split(&format!("```{language}\n")).nth(1))
        .and_then(|rest| rest.split("```").next())
}

/// The commands docs/quickstart.md tells a new user to type, in order: the lines of the
/// first `sh` block under "## The three commands".
pub fn quickstart_commands() -> Vec<&'static str> {
    let doc = include_str!("../../../docs/quickstart.md");
    block_under(doc, "## The three commands", "sh")
        .expect("a sh block under \"## The three commands\" in docs/quickstart.md")
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect()
}

/// The defaults a configuration table documents: for each row whose key (first cell, in
/// backticks) starts with `prefix`, the key without it and the first backticked value of the
/// default (second) cell; `—` where it has none.
pub fn table_defaults(doc: &str, prefix: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let key = key.strip_prefix(prefix)?;
            let default = cells.get(2)?.split('`').nth(1).unwrap_or("—").to_owned();
            Some((key.to_owned(), default))
        })
        .collect()
}
