//! Codex runs a hook only once the person trusted it: a project's hooks load only in a trusted
//! project (`[projects."<dir>"] trust_level = "trusted"`), and each hook runs only once trusted
//! in `/hooks` (`[hooks.state."<hooks.json>:<event>:<group>:<hook>"] trusted_hash`), both in
//! Codex's user `config.toml`. An untrusted hook is skipped with a warning on stderr, and the
//! tools run ungated. `install codex` says so; `doctor codex` reads that file.

use std::path::{Path, PathBuf};

use toml::Value;

/// Codex's home: `$CODEX_HOME`, else `~/.codex`.
pub fn codex_home() -> Option<PathBuf> {
    let from = |variable: &str| {
        std::env::var_os(variable)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    };
    from("CODEX_HOME").or_else(|| from("HOME").map(|home| home.join(".codex")))
}

/// Codex's user `config.toml`, where it records what the person trusted (and its `notify`).
pub fn user_config() -> Option<PathBuf> {
    codex_home().map(|home| home.join("config.toml"))
}

/// The project whose `.codex/hooks.json` this is; `None` for the user's own hooks file.
fn project_of(hooks_file: &Path) -> Option<&Path> {
    let dot_codex = hooks_file.parent()?;
    if codex_home().is_some_and(|home| home == dot_codex) {
        return None;
    }
    dot_codex.parent()
}

/// What the person has to do in Codex before the hook runs, for `install codex` to print.
pub fn trust_steps(hooks_file: &Path) -> String {
    let config = user_config().map_or("~/.codex/config.toml".into(), |path| {
        path.display().to_string()
    });
    let project = match project_of(hooks_file) {
        Some(project) => format!(
            "trust the project when Codex asks (or add [projects.{:?}] trust_level = \"trusted\" to {config}), then ",
            project.display().to_string()
        ),
        None => String::new(),
    };
    format!(
        "Codex runs this hook only once you trust it; until then it runs tools without asking countersign (it only warns): start codex, {project}type /hooks and trust the countersign hook (again after every change to it). countersign doctor codex checks it."
    )
}

/// Codex's label of a hook event in its hook-state keys.
fn event_label(event: &str) -> String {
    match event {
        "PreToolUse" => "pre_tool_use".into(),
        "PermissionRequest" => "permission_request".into(),
        other => other.to_lowercase(),
    }
}

/// Whether Codex runs the hook `handler_index` of group `group_index` under `event` in
/// `hooks_file`, as far as its user config records: the line for `doctor`, or what is missing
/// with the fix. A trusted hook that changed since (its hash no longer the trusted one) shows
/// only in Codex's `/hooks`: that hash is Codex's own.
pub fn check(
    hooks_file: &Path,
    event: &str,
    group_index: usize,
    handler_index: usize,
) -> Result<String, String> {
    let config_path = user_config().ok_or("cannot find Codex's home: set $CODEX_HOME or $HOME")?;
    let config = match std::fs::read_to_string(&config_path) {
        Ok(text) => text
            .parse::<toml::Table>()
            .map_err(|error| format!("{} is not valid TOML: {error}", config_path.display()))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => toml::Table::new(),
        Err(error) => return Err(format!("cannot read {}: {error}", config_path.display())),
    };
    let config_shown = config_path.display();
    if let Some(project) = project_of(hooks_file) {
        if !project_trusted(&config, project) {
            let project = project.display().to_string();
            return Err(format!(
                "Codex loads no hook of the untrusted project {project}, so it runs tools ungated: start codex there and trust the project, or add [projects.{project:?}] trust_level = \"trusted\" to {config_shown}"
            ));
        }
    }
    let key = format!(
        "{}:{}:{group_index}:{handler_index}",
        hooks_file.display(),
        event_label(event)
    );
    let state = config
        .get("hooks")
        .and_then(|hooks| hooks.get("state"))
        .and_then(|states| states.get(&key));
    if state.and_then(|state| state.get("enabled")) == Some(&Value::Boolean(false)) {
        return Err(format!(
            "the hook is disabled in Codex ({config_shown}), so it runs tools ungated: start codex, type /hooks and enable the countersign hook"
        ));
    }
    match state.and_then(|state| state.get("trusted_hash")) {
        Some(Value::String(_)) => Ok(format!("trusted in Codex once ({config_shown}); Codex skips a hook changed since it was trusted, so after each install codex trust it again in /hooks")),
        _ => Err(format!(
            "Codex has not trusted this hook ({config_shown} records no trust for it), so it skips it and runs tools ungated: start codex, type /hooks and trust the countersign hook (codex --dangerously-bypass-hook-trust skips the review for one run)"
        )),
    }
}

/// Codex's trust of `project` as its user config records it: the entry for the directory
/// itself, else for its project root (the nearest directory holding `.git`), the first found.
fn project_trusted(config: &toml::Table, project: &Path) -> bool {
    let Some(projects) = config.get("projects").and_then(Value::as_table) else {
        return false;
    };
    let root = project
        .ancestors()
        .find(|dir| dir.join(".git").exists())
        .unwrap_or(project);
    [project, root]
        .iter()
        .find_map(|dir| projects.get(&dir.display().to_string()))
        .and_then(|entry| entry.get("trust_level"))
        .and_then(Value::as_str)
        == Some("trusted")
}
