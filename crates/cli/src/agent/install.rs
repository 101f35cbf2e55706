//! `install`: add the countersign hook to a coding agent's settings file; `doctor`: check the
//! server, the token and the installed hooks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use countersign_client::{Client, ClientError};
use countersign_server::receipts::ReceiptKeys;
use serde_json::{json, Map, Value};

use crate::agent::hook::{default_timeout, event_name};
use crate::args::{HookEvent, Host, InstallArgs};
use crate::exit::{CliError, Exit};
use crate::instance::local_url;
use crate::instance::{Instance, Secret, Token};
use crate::local::instance_check::check_instance;
use crate::settings::DEFAULT_SERVER;

/// The global flags an installed hook command repeats, so that it talks to the same server
/// with the same config (never the token: settings files are often shared; its file, yes).
pub struct InstallFlags {
    pub config: Option<std::path::PathBuf>,
    pub server: Option<String>,
    pub token_file: Option<std::path::PathBuf>,
    /// The receipt key set's fingerprint, written beside the token file.
    pub receipt_pin: Option<String>,
}

/// `flags` with the fingerprint of the receipt key set the hook will check decisions against:
/// the one given; else the local instance's (read from its keys file, made if `up` never
/// ran); else the one the server serves now (pinned on first use). A server that cannot be
/// asked leaves the hook unpinned (it then checks receipts against the keys the server
/// serves), with a warning.
pub async fn pin_receipts(flags: &InstallFlags, client: &Client) -> Result<InstallFlags, CliError> {
    let mut pinned = InstallFlags {
        config: flags.config.clone(),
        server: flags.server.clone(),
        token_file: flags.token_file.clone(),
        receipt_pin: flags.receipt_pin.clone(),
    };
    if pinned.receipt_pin.is_some() {
        return Ok(pinned);
    }
    if local_instance_flags(flags)?.is_some() {
        let server = Instance::locate(None)?.load_config()?.server;
        let keys =
            ReceiptKeys::load_or_create(&server.receipt_keys_dir(), server.receipts.ttl_seconds)
                .map_err(|error| CliError::Failure(error.to_string()))?;
        pinned.receipt_pin = Some(keys.fingerprint().to_owned());
        return Ok(pinned);
    }
    match client.signing_keys().await {
        Ok(keys) if !keys.fingerprint.is_empty() => pinned.receipt_pin = Some(keys.fingerprint),
        Ok(_) => eprintln!("countersign: warning: the server has no receipt keys; the hook is not pinned to a key set"),
        Err(error) => eprintln!(
            "countersign: warning: cannot read the server's receipt keys ({error}); the hook is not pinned to a key set (pass --receipt-pin)"
        ),
    }
    Ok(pinned)
}

/// How much longer than countersign's wait the host's hook timeout is set, so that countersign
/// always answers first.
const HOST_TIMEOUT_MARGIN: Duration = Duration::from_secs(60);

/// The hosts' own hook timeouts when the settings name none. Codex's is not documented where
/// we could check it: assumed to be Claude Code's 600 s (`install` always writes one).
fn host_default_timeout(host: Host) -> Duration {
    match host {
        Host::Gemini => Duration::from_millis(60_000),
        Host::ClaudeCode | Host::Codex => Duration::from_secs(600),
    }
}

/// The settings file holding the host's hooks.
fn settings_path(host: Host, user: bool) -> Result<PathBuf, CliError> {
    let relative = match host {
        Host::ClaudeCode => ".claude/settings.json",
        Host::Codex => ".codex/hooks.json",
        Host::Gemini => ".gemini/settings.json",
    };
    if user && host == Host::Codex {
        return crate::agent::codex_trust::codex_home()
            .map(|home| home.join("hooks.json"))
            .ok_or_else(|| CliError::Usage("--user needs $CODEX_HOME or $HOME".into()));
    }
    let base = if user {
        std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| CliError::Usage("--user needs $HOME".into()))?
    } else {
        std::env::current_dir().map_err(|error| {
            CliError::Failure(format!("cannot determine the working directory: {error}"))
        })?
    };
    Ok(base.join(relative))
}

/// The tools gated unless `--matcher` says otherwise: shells, file changes, fetches and MCP
/// tools (reads stay local), in each host's names. Gemini CLI names MCP tools
/// `mcp_<server>_<tool>` and matches unanchored, so `^` keeps its `list_mcp_resources` and
/// `read_mcp_resource` (reads) out.
fn default_matcher(host: Host, event: HookEvent) -> &'static str {
    match (host, event) {
        (Host::ClaudeCode, HookEvent::PreToolUse) => {
            "Bash|Edit|Write|MultiEdit|NotebookEdit|WebFetch|mcp__.*"
        }
        (Host::ClaudeCode, HookEvent::PermissionRequest) => "*",
        (Host::Codex, HookEvent::PreToolUse) => "Bash|apply_patch|mcp__.*",
        (Host::Codex, HookEvent::PermissionRequest) => ".*",
        (Host::Gemini, _) => "run_shell_command|write_file|replace|web_fetch|^mcp_.*",
    }
}

/// Tools every matcher must gate, as the host names them to hooks: its shell, and MCP tools
/// (`mcp__<server>__<tool>` in Claude Code and Codex, `mcp_<server>_<tool>` in Gemini CLI) of
/// a well-known server and of one nobody names in a matcher by hand.
fn gated_tool_examples(host: Host) -> [&'static str; 3] {
    match host {
        Host::ClaudeCode | Host::Codex => [
            "Bash",
            "mcp__github__create_issue",
            "mcp__zz_any_server__run",
        ],
        Host::Gemini => [
            "run_shell_command",
            "mcp_github_create_issue",
            "mcp_zz_any_server_run",
        ],
    }
}

/// Whether the host runs a hook whose group has `matcher` for the tool `tool_name`. `*` and
/// the empty matcher match every tool on all three hosts. Claude Code and Codex read a
/// matcher of only letters, digits, `_` and `|` as a list of exact names and any other as an
/// unanchored regex; Gemini CLI reads every matcher as an unanchored regex, one that does not
/// compile as an exact name.
fn matcher_matches(host: Host, matcher: &str, tool_name: &str) -> bool {
    if matcher.is_empty() || matcher == "*" {
        return true;
    }
    let exact_names = matcher
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|');
    match host {
        Host::ClaudeCode | Host::Codex if exact_names => {
            matcher.split('|').any(|name| name == tool_name)
        }
        _ => match regex::Regex::new(matcher) {
            Ok(regex) => regex.is_match(tool_name),
            Err(_) => host == Host::Gemini && matcher == tool_name,
        },
    }
}

fn host_word(host: Host) -> &'static str {
    match host {
        Host::ClaudeCode => "claude-code",
        Host::Codex => "codex",
        Host::Gemini => "gemini",
    }
}

/// The executable installed hooks run: beside `countersign`, `countersign hook` in an
/// executable of its own that starts faster (it links nothing but the hook).
const HOOK_EXECUTABLE: &str = "countersign-hook";

/// The countersign command line an installed hook or MCP server runs: the executable, `words`,
/// then the global flags that pick the server.
fn countersign_command(flags: &InstallFlags, words: &[&str]) -> Result<Vec<String>, CliError> {
    let exe = std::env::current_exe().map_err(|error| {
        CliError::Failure(format!("cannot find the countersign executable: {error}"))
    })?;
    with_server_flags(exe, flags, words)
}

/// `exe`, `words`, then the global flags that pick the server.
fn with_server_flags(
    exe: PathBuf,
    flags: &InstallFlags,
    words: &[&str],
) -> Result<Vec<String>, CliError> {
    let mut argv = vec![exe.to_string_lossy().into_owned()];
    argv.extend(words.iter().map(|word| (*word).to_owned()));
    if let Some(config) = &flags.config {
        let config = std::path::absolute(config).unwrap_or_else(|_| config.clone());
        argv.extend(["--config".into(), config.to_string_lossy().into_owned()]);
    }
    if let Some(server) = &flags.server {
        argv.extend(["--server".into(), server.clone()]);
    }
    if let Some(token_file) = &flags.token_file {
        let token_file = std::path::absolute(token_file).unwrap_or_else(|_| token_file.clone());
        argv.extend([
            "--token-file".into(),
            token_file.to_string_lossy().into_owned(),
        ]);
    }
    if let Some(pin) = &flags.receipt_pin {
        argv.extend(["--receipt-pin".into(), pin.clone()]);
    }
    Ok(argv)
}

/// The shell command the host runs: `countersign-hook HOST ...` when it is installed beside
/// this executable (the archive, the wheel, the npm package and `cargo install` all put it
/// there), else `countersign hook HOST ...`.
fn hook_command(flags: &InstallFlags, args: &InstallArgs) -> Result<String, CliError> {
    let exe = std::env::current_exe().map_err(|error| {
        CliError::Failure(format!("cannot find the countersign executable: {error}"))
    })?;
    let hook_exe = exe.with_file_name(HOOK_EXECUTABLE);
    let (exe, mut words) = if hook_exe.is_file() {
        (hook_exe, vec![host_word(args.host)])
    } else {
        (exe, vec!["hook", host_word(args.host)])
    };
    let timeout = format!("{}s", args.timeout.as_secs());
    if args.event == HookEvent::PermissionRequest {
        words.extend(["--event", "permission-request"]);
    }
    words.extend(["--timeout", timeout.as_str()]);
    Ok(crate::agent::exec::shell_join(&with_server_flags(
        exe, flags, &words,
    )?))
}

/// Without flags naming a server, the hook talks to the local instance (`countersign up`):
/// its address, and the file of its agent token (generated here when `up` never ran yet).
fn local_instance_flags(flags: &InstallFlags) -> Result<Option<InstallFlags>, CliError> {
    if flags.server.is_some() || flags.config.is_some() || flags.token_file.is_some() {
        return Ok(None);
    }
    let instance = Instance::locate(None)?;
    let server = match instance.server_url() {
        Some(url) => url,
        None if instance.config_file.exists() => local_url(instance.load_config()?.server.listen),
        None => return Ok(None),
    };
    instance.ensure_token(Token::Agent)?;
    Ok(Some(InstallFlags {
        config: None,
        server: Some(server),
        token_file: Some(instance.secret_path(Secret::Token(Token::Agent))),
        receipt_pin: flags.receipt_pin.clone(),
    }))
}

/// What [`notice_groups`] names Codex's `notify` setting.
const CODEX_NOTIFY: &str = "notify";

/// Sets Codex's `notify` program to `argv` in its user config, unless the person set another
/// one (Codex runs only one): returns where.
fn install_codex_notify(argv: &Value) -> Result<PathBuf, CliError> {
    let path = crate::agent::codex_trust::user_config()
        .ok_or_else(|| CliError::Usage("--notify needs $CODEX_HOME or $HOME".into()))?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => {
            return Err(CliError::Failure(format!(
                "cannot read {}: {error}",
                path.display()
            )))
        }
    };
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|error| {
        CliError::Failure(format!(
            "{} is not valid TOML: {error}; not changing it",
            path.display()
        ))
    })?;
    let ours = |item: &toml_edit::Item| {
        item.as_array().is_some_and(|words| {
            let words: Vec<&str> = words.iter().filter_map(|word| word.as_str()).collect();
            words.windows(2).any(|pair| pair == ["notify", "codex"])
        })
    };
    if let Some(existing) = doc.get("notify") {
        if !ours(existing) {
            return Err(CliError::Usage(format!(
                "{} sets another notify program ({}); Codex runs only one, so it is left as it is",
                path.display(),
                existing.to_string().trim()
            )));
        }
    }
    let mut array = toml_edit::Array::new();
    for word in argv
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        array.push(word);
    }
    doc.insert("notify", toml_edit::value(array));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|error| {
            CliError::Failure(format!("cannot create {}: {error}", dir.display()))
        })?;
    }
    crate::instance::replace_file(&path, doc.to_string().as_bytes(), None)?;
    Ok(path)
}

/// The host's events whose hooks send notices (`install --notify`): Claude Code's finished,
/// failed and waiting; Gemini CLI's finished turn and tool confirmation (it has no hook for a
/// failed turn). Codex has one `notify` program instead.
fn notice_events(host: Host) -> &'static [&'static str] {
    match host {
        Host::ClaudeCode => &["Stop", "StopFailure", "Notification"],
        Host::Gemini => &["AfterAgent", "Notification"],
        Host::Codex => &[],
    }
}

/// With `--notify`, the groups that run `countersign notify` under each of the host's
/// [`notice_events`]; none without it.
fn notice_groups(
    flags: &InstallFlags,
    args: &InstallArgs,
) -> Result<Vec<(&'static str, Value)>, CliError> {
    if !args.notify {
        return Ok(Vec::new());
    }
    // `notify` reads the local instance's file: only `--config` is passed on.
    let notify_flags = InstallFlags {
        config: flags.config.clone(),
        server: None,
        token_file: None,
        receipt_pin: None,
    };
    let argv = countersign_command(&notify_flags, &["notify", host_word(args.host)])?;
    if args.host == Host::Codex {
        // Codex runs one `notify` program (its argv, the event appended) from its user config.
        return Ok(vec![(CODEX_NOTIFY, json!(argv))]);
    }
    let command = crate::agent::exec::shell_join(&argv);
    // A notice is sent in well under the hosts' timeouts (seconds for Claude Code,
    // milliseconds for Gemini CLI).
    let hook = match args.host {
        Host::Gemini => {
            json!({"name": "countersign-notify", "type": "command", "command": command, "timeout": 30_000})
        }
        Host::ClaudeCode | Host::Codex => {
            json!({"type": "command", "command": command, "timeout": 30})
        }
    };
    let group = json!({ "hooks": [hook] });
    Ok(notice_events(args.host)
        .iter()
        .map(|event| (*event, group.clone()))
        .collect())
}

/// The matcher group to add under the host's event.
fn hook_group(host: Host, args: &InstallArgs, command: String) -> Value {
    let host_timeout = args.timeout + HOST_TIMEOUT_MARGIN;
    let hook = match host {
        Host::Gemini => json!({
            "name": "countersign",
            "type": "command",
            "command": command,
            "timeout": u64::try_from(host_timeout.as_millis()).unwrap_or(u64::MAX),
        }),
        Host::ClaudeCode | Host::Codex => json!({
            "type": "command",
            "command": command,
            "timeout": host_timeout.as_secs(),
        }),
    };
    let matcher = args
        .matcher
        .clone()
        .unwrap_or_else(|| default_matcher(host, args.event).to_owned());
    json!({"matcher": matcher, "hooks": [hook]})
}

/// Whether `hook` runs countersign's `subcommand` (`hook`, `notify`) for `host`.
fn is_countersign_hook(hook: &Value, subcommand: &str, host: Host) -> bool {
    let Some(command) = hook.get("command").and_then(Value::as_str) else {
        return false;
    };
    let words = words_of(command);
    let runs = |pair: &[String]| pair[0] == subcommand && pair[1] == host_word(host);
    words.windows(2).any(runs)
        || (subcommand == "hook"
            && words.len() > 1
            && Path::new(&words[0]).file_name() == Some(HOOK_EXECUTABLE.as_ref())
            && words[1] == host_word(host))
}

/// Merges `group` into `settings` under `hooks.<event>`: replaces the group running
/// countersign's `subcommand` for the same host, keeps everything else.
fn merge(
    settings: &mut Map<String, Value>,
    event: &str,
    subcommand: &str,
    host: Host,
    group: Value,
) -> Result<(), String> {
    let hooks = settings
        .entry("hooks")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("\"hooks\" is not a JSON object")?;
    let groups = hooks
        .entry(event)
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| format!("\"hooks.{event}\" is not a JSON array"))?;
    let ours = groups.iter_mut().find(|existing| {
        existing
            .get("hooks")
            .and_then(Value::as_array)
            .is_some_and(|hooks| {
                hooks
                    .iter()
                    .any(|hook| is_countersign_hook(hook, subcommand, host))
            })
    });
    match ours {
        Some(existing) => *existing = group,
        None => groups.push(group),
    }
    Ok(())
}

pub fn install(flags: &InstallFlags, args: InstallArgs) -> Result<Exit, CliError> {
    if args.host == Host::Gemini && args.event == HookEvent::PermissionRequest {
        return Err(CliError::Usage(
            "Gemini CLI has no PermissionRequest event; install the default (BeforeTool)".into(),
        ));
    }
    if args.timeout < Duration::from_secs(1) {
        return Err(CliError::Usage("--timeout must be at least 1s".into()));
    }
    if args.channel {
        return install_channel(flags, &args);
    }
    let event = event_name(args.host, args.event);
    let local = local_instance_flags(flags)?;
    if args.preset.is_some() && local.is_none() {
        return Err(CliError::Usage(
            "--preset writes the local instance's config file (countersign up); for another server, run `countersign --config FILE policy preset NAME` on its config file".into(),
        ));
    }
    let for_local_instance = local.is_some();
    let group = hook_group(
        args.host,
        &args,
        hook_command(local.as_ref().unwrap_or(flags), &args)?,
    );
    let notices = notice_groups(local.as_ref().unwrap_or(flags), &args)?;
    if args.print {
        let mut snippet = json!({"hooks": {event: [group]}});
        for (notice_event, notice_group) in &notices {
            if args.host != Host::Codex {
                snippet["hooks"][*notice_event] = json!([notice_group]);
            }
        }
        println!("{}", pretty(&snippet)?);
        if let (Host::Codex, Some((_, argv))) = (args.host, notices.first()) {
            println!("# in ~/.codex/config.toml:\nnotify = {argv}");
        }
        return Ok(Exit::Success);
    }
    let path = settings_path(args.host, args.user)?;
    let (existing, mut settings) = read_json_object(&path)?;
    let failed = |problem: String| {
        CliError::Failure(format!("{}: {problem}; not changing it", path.display()))
    };
    merge(&mut settings, event, "hook", args.host, group).map_err(failed)?;
    for (notice_event, notice_group) in &notices {
        if args.host == Host::Codex {
            let config = install_codex_notify(notice_group)?;
            println!(
                "set Codex's notify program in {}: finished turns go to the ntfy topics, Telegram chat and Slack channel of the local instance",
                config.display()
            );
            continue;
        }
        merge(
            &mut settings,
            notice_event,
            "notify",
            args.host,
            notice_group.clone(),
        )
        .map_err(failed)?;
    }
    write_json_object(&path, settings, existing)?;
    println!(
        "installed the countersign {event} hook in {}",
        path.display()
    );
    if !notices.is_empty() && args.host != Host::Codex {
        println!(
            "installed the countersign notify hooks ({}): notices go to the ntfy topics, Telegram chat and Slack channel of the local instance",
            notice_events(args.host).join(", ")
        );
    }
    if let Some(server) = local.and_then(|local| local.server) {
        println!("the hook asks the local countersign instance at {server} (countersign up)");
    }
    if args.host == Host::Codex {
        println!("{}", crate::agent::codex_trust::trust_steps(&path));
    }
    if for_local_instance {
        crate::rules_file::offer_preset(&Instance::locate(None)?, args.preset.as_deref())?;
    }
    Ok(Exit::Success)
}

/// `install claude-code --channel`: `countersign mcp --channel` as the project's MCP server
/// `countersign` (in `.mcp.json`), relaying Claude Code's permission prompts.
fn install_channel(flags: &InstallFlags, args: &InstallArgs) -> Result<Exit, CliError> {
    if args.host != Host::ClaudeCode || args.user || args.event != HookEvent::PreToolUse {
        return Err(CliError::Usage(
            "--channel is for Claude Code, in the project's .mcp.json (no --user, no --event)"
                .into(),
        ));
    }
    let local = local_instance_flags(flags)?;
    let mut argv = countersign_command(local.as_ref().unwrap_or(flags), &["mcp", "--channel"])?;
    let command = argv.remove(0);
    let server = json!({"command": command, "args": argv});
    if args.print {
        println!(
            "{}",
            pretty(&json!({"mcpServers": {CHANNEL_SERVER: server}}))?
        );
        return Ok(Exit::Success);
    }
    let path = std::env::current_dir()
        .map_err(|error| {
            CliError::Failure(format!("cannot determine the working directory: {error}"))
        })?
        .join(".mcp.json");
    let (existing, mut settings) = read_json_object(&path)?;
    settings
        .entry("mcpServers")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| {
            CliError::Failure(format!(
                "{}: \"mcpServers\" is not a JSON object; not changing it",
                path.display()
            ))
        })?
        .insert(CHANNEL_SERVER.to_owned(), server);
    write_json_object(&path, settings, existing)?;
    println!(
        "installed countersign as the MCP server {CHANNEL_SERVER:?} in {}",
        path.display()
    );
    println!("Claude Code channels are a research preview (Claude Code 2.1.81 or later); start it with:\n    claude --dangerously-load-development-channels server:{CHANNEL_SERVER}\nIts permission prompts then also reach your approvers; the first answer, terminal or phone, wins.");
    Ok(Exit::Success)
}

/// The name of the channel's MCP server in `.mcp.json`.
const CHANNEL_SERVER: &str = "countersign";

/// The file's text (`None`: no file) and the JSON object it holds (empty for an empty file).
fn read_json_object(path: &Path) -> Result<(Option<String>, Map<String, Value>), CliError> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            return Err(CliError::Failure(format!(
                "cannot read {}: {error}",
                path.display()
            )))
        }
    };
    let object = match existing.as_deref().map(str::trim) {
        None | Some("") => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(object)) => object,
            Ok(_) => {
                return Err(CliError::Failure(format!(
                    "{} does not hold a JSON object; not changing it",
                    path.display()
                )))
            }
            Err(error) => {
                return Err(CliError::Failure(format!(
                    "{} is not valid JSON ({error}); not changing it",
                    path.display()
                )))
            }
        },
    };
    Ok((existing, object))
}

/// Replaces the file with `object`, keeping `existing` (its former text) as a backup.
fn write_json_object(
    path: &Path,
    object: Map<String, Value>,
    existing: Option<String>,
) -> Result<(), CliError> {
    let text = pretty(&Value::Object(object))?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|error| write_error(parent, &error))?;
    }
    if let Some(original) = existing {
        let backup = backup_path(path);
        std::fs::write(&backup, original).map_err(|error| write_error(&backup, &error))?;
        eprintln!(
            "countersign: saved the previous settings as {}",
            backup.display()
        );
    }
    // Written next to the file and renamed over it, so the host never reads half a file.
    let partial = path.with_extension("json.countersign-partial");
    std::fs::write(&partial, format!("{text}\n")).map_err(|error| write_error(&partial, &error))?;
    std::fs::rename(&partial, path).map_err(|error| write_error(path, &error))
}

fn pretty(value: &Value) -> Result<String, CliError> {
    serde_json::to_string_pretty(value)
        .map_err(|error| CliError::Failure(format!("cannot encode JSON: {error}")))
}

fn write_error(path: &Path, error: &std::io::Error) -> CliError {
    CliError::Failure(format!("cannot write {}: {error}", path.display()))
}

/// `settings.json.bak`, or `.bak.2`, `.bak.3`... when taken.
fn backup_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut backup = path.with_file_name(format!("{name}.bak"));
    let mut n = 2;
    while backup.exists() {
        backup = path.with_file_name(format!("{name}.bak.{n}"));
        n += 1;
    }
    backup
}

/// Checks the local instance (when there is one), the server and the installed hooks; prints
/// one line per check, and with each failure the command that fixes it. Never a secret.
pub async fn doctor(client: &Client, only: Option<Host>) -> Exit {
    let mut exit = Exit::Success;
    let mut fail = |line: String, code: Exit| {
        println!("FAIL  {line}");
        if exit == Exit::Success {
            exit = code;
        }
    };
    // Which binary runs, first: the one an installed hook names may be another.
    match std::env::current_exe() {
        Ok(path) => println!(
            "ok    countersign {} at {}",
            crate::args::VERSION,
            path.display()
        ),
        Err(error) => fail(
            format!(
                "countersign {}: cannot find its own executable: {error}",
                crate::args::VERSION
            ),
            Exit::Failure,
        ),
    }
    // The local instance is checked when doctor talks to it (not to a team's server).
    let instance = Instance::locate(None).ok().filter(|instance| {
        let url = instance.server_url();
        (instance.config_file.exists() || url.is_some())
            && url.as_deref().unwrap_or(DEFAULT_SERVER) == client.url()
    });
    let start_hint = match &instance {
        Some(instance) => {
            for problem in check_instance(instance) {
                fail(problem, Exit::Failure);
            }
            "start the local instance: countersign up"
        }
        None => "set COUNTERSIGN_SERVER, or run countersign on this machine: countersign setup telegram (or github, web), then countersign up",
    };
    // Any answer about a made-up approval proves the server is there and took the token.
    match client
        .get_approval("00000000-0000-7000-8000-000000000000")
        .await
    {
        Ok(_) | Err(ClientError::NotFound(_) | ClientError::InvalidArgument(_)) => {
            println!(
                "ok    server {} answers and accepts the token",
                client.url()
            )
        }
        Err(ClientError::PermissionDenied(_)) => println!(
            "ok    server {} answers and accepts the token (its role may not read approvals)",
            client.url()
        ),
        Err(error @ (ClientError::Unauthenticated(_) | ClientError::Config(_))) => fail(
            format!("server {}: {error} (set COUNTERSIGN_TOKEN)", client.url()),
            Exit::Denied,
        ),
        Err(error @ ClientError::Unavailable(_)) => fail(
            format!("server {}: {error} ({start_hint})", client.url()),
            Exit::Unavailable,
        ),
        Err(error) => fail(format!("server {}: {error}", client.url()), Exit::Failure),
    }
    let hosts: Vec<Host> = match only {
        Some(host) => vec![host],
        None => vec![Host::ClaudeCode, Host::Codex, Host::Gemini],
    };
    let mut installed = 0;
    for host in hosts {
        for user in [false, true] {
            let Ok(path) = settings_path(host, user) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let settings: Value = match serde_json::from_str(&text) {
                Ok(settings) => settings,
                Err(error) => {
                    fail(
                        format!("{} is not valid JSON: {error}", path.display()),
                        Exit::Failure,
                    );
                    continue;
                }
            };
            for installed_hook in countersign_hooks(&settings, host) {
                installed += 1;
                let event = &installed_hook.event;
                let mut checks = vec![check_hook(host, &installed_hook, user)];
                if host == Host::Codex {
                    checks.push(crate::agent::codex_trust::check(
                        &path,
                        event,
                        installed_hook.group_index,
                        installed_hook.handler_index,
                    ));
                }
                for check in checks {
                    match check {
                        Ok(summary) => println!("ok    {} {event}: {summary}", path.display()),
                        Err(problem) => fail(
                            format!("{} {event}: {problem}", path.display()),
                            Exit::Failure,
                        ),
                    }
                }
            }
        }
    }
    if installed == 0 {
        let which = only.map_or("any host".to_owned(), |host| host_word(host).to_owned());
        fail(
            format!("no countersign hook is installed for {which} (run countersign install claude-code, or codex, gemini)"),
            Exit::Failure,
        );
    }
    exit
}

/// A countersign hook found in a settings file.
struct InstalledHook {
    event: String,
    /// Its place: the index of its group under the event, and its index in the group.
    group_index: usize,
    handler_index: usize,
    /// Its group's matcher (`None`: no matcher, every tool).
    matcher: Option<String>,
    hook: Value,
}

/// The countersign hooks of `host` in a settings file.
fn countersign_hooks(settings: &Value, host: Host) -> Vec<InstalledHook> {
    let Some(events) = settings.get("hooks").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (event, groups) in events {
        for (group_index, group) in groups.as_array().into_iter().flatten().enumerate() {
            let hooks = group.get("hooks").and_then(Value::as_array);
            for (handler_index, hook) in hooks.into_iter().flatten().enumerate() {
                if is_countersign_hook(hook, "hook", host) {
                    found.push(InstalledHook {
                        event: event.clone(),
                        group_index,
                        handler_index,
                        matcher: group
                            .get("matcher")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        hook: hook.clone(),
                    });
                }
            }
        }
    }
    found
}

/// The words of a hook's command line, unquoted as `shell_join` quotes them (plain, or in
/// single quotes with `'\''` for a quote).
fn words_of(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut in_word = false;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if !quoted => {
                word.extend(chars.next());
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The hook must be run for MCP tools, and the host must time it out later than countersign
/// gives up waiting.
fn check_hook(host: Host, installed: &InstalledHook, user: bool) -> Result<String, String> {
    let hook = &installed.hook;
    if let Some(matcher) = &installed.matcher {
        let ungated = gated_tool_examples(host)
            .into_iter()
            .find(|tool| !matcher_matches(host, matcher, tool));
        if let Some(tool) = ungated {
            return Err(format!(
                "the matcher {matcher:?} leaves {tool} ungated (this host's shell and MCP tools must be gated): run countersign install {}{} again (its default matcher covers them) or add them to --matcher",
                host_word(host),
                if user { " --user" } else { "" }
            ));
        }
    }
    let command = hook
        .get("command")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // The binary `install` named is gone (uninstalled, moved, or npx's cache cleaned): the host
    // would run nothing, and let every tool call through.
    let program = words_of(command).into_iter().next().unwrap_or_default();
    if Path::new(&program).is_absolute() && !Path::new(&program).is_file() {
        return Err(format!(
            "the hook runs {program}, which is not there: run countersign install {}{} again",
            host_word(host),
            if user { " --user" } else { "" }
        ));
    }
    let wait = command
        .split_whitespace()
        .skip_while(|word| *word != "--timeout")
        .nth(1)
        .map(|value| {
            humantime::parse_duration(value.trim_matches('\''))
                .map_err(|error| format!("--timeout {value}: {error}"))
        })
        .transpose()?
        .unwrap_or_else(|| default_timeout(host));
    let host_timeout = match hook.get("timeout").and_then(Value::as_u64) {
        None => host_default_timeout(host),
        Some(timeout) if host == Host::Gemini => Duration::from_millis(timeout),
        Some(timeout) => Duration::from_secs(timeout),
    };
    let shown = |duration: Duration| humantime::format_duration(duration).to_string();
    if host_timeout <= wait {
        return Err(format!(
            "the host times the hook out after {} but countersign waits {}: raise the hook's timeout",
            shown(host_timeout),
            shown(wait)
        ));
    }
    Ok(format!(
        "countersign waits {}, the host {}",
        shown(wait),
        shown(host_timeout)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_of_reads_back_what_shell_join_wrote() {
        let argv: Vec<String> = [
            "/opt/my tools/countersign-hook",
            "claude-code",
            "it's",
            "",
            "a\\b",
            "--timeout",
            "540s",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(words_of(&crate::agent::exec::shell_join(&argv)), argv);
    }

    #[test]
    fn both_hook_executables_are_recognised_for_their_host_only() {
        let hook = |command: &str| serde_json::json!({ "type": "command", "command": command });
        for command in [
            "/usr/bin/countersign hook claude-code --timeout 540s",
            "'/opt/my tools/countersign' hook claude-code",
            "/usr/bin/countersign-hook claude-code --timeout 540s",
            "'/opt/my tools/countersign-hook' claude-code --server http://127.0.0.1:7777",
        ] {
            assert!(
                is_countersign_hook(&hook(command), "hook", Host::ClaudeCode),
                "{command}"
            );
            assert!(
                !is_countersign_hook(&hook(command), "hook", Host::Codex),
                "{command}"
            );
        }
        for command in [
            "/usr/bin/other-hook claude-code",
            "/usr/bin/countersign notify claude-code",
            "echo countersign-hook claude-code",
        ] {
            assert!(
                !is_countersign_hook(&hook(command), "hook", Host::ClaudeCode),
                "{command}"
            );
        }
    }
}
