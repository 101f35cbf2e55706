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
