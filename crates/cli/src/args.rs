//! The command line.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand, ValueEnum};
use countersign_client::pb;

const EXIT_CODES: &str = "\
Exit codes:
  0    success; request --wait: approved
  64   bad usage (unknown flag, malformed argument, unreadable config file)
  65   rejected
  66   expired before anyone decided
  67   cancelled
  68   still pending when --timeout ended (exec cancels its request)
  69   server unreachable
  70   other error (the server refused the call, unexpected answer, local I/O)
  71   approve/reject: already resolved, the decision was not applied
  72   verify-audit: the audit trail does not verify
  77   unauthenticated or permission denied
  exec: the command's own exit status when it ran (128+N when killed by signal N),
        126 when it could not be started, 127 when it was not found
  hook: 0 with the decision on stdout, whatever happened; 2 (the hosts' \"block\") for a
        command line it cannot use";

/// What `--version` and `doctor` print: the crate's version and the commit it was built from
/// (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("COUNTERSIGN_COMMIT"),
    ")"
);

/// The countersign command-line client: ask for, inspect, decide and watch approvals of
/// AI-agent tool calls, and gate shell commands on a human's approval.
#[derive(Debug, Parser)]
#[command(name = "countersign", version = VERSION, after_help = EXIT_CODES)]
pub struct Cli<C: Subcommand> {
    /// Server URL (http:// or https://) [default: the local instance `countersign up` started,
    /// with its token; else http://127.0.0.1:50051]
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_SERVER",
        value_name = "URL"
    )]
    pub server: Option<String>,
    /// Bearer token (prefer the environment variable: flags show up in process lists)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// File holding the bearer token (read when no --token is given)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signed the server's certificate (https)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_CA_CERT",
        value_name = "PATH"
    )]
    pub ca_cert: Option<PathBuf>,
    /// TOML config file with defaults for server, token, ca_cert, agent_id and user; for `up`
    /// and `setup`: the local instance's file [default: $XDG_CONFIG_HOME/countersign/countersign.toml]
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_CONFIG",
        value_name = "PATH"
    )]
    pub config: Option<PathBuf>,
    /// Fingerprint of the server's receipt key set (its first key's id): decision receipts
    /// must be signed by a key chained to it (`install` writes it into the hook command)
    /// [default: the config file's receipt_pin; else the key set the server serves]
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COUNTERSIGN_RECEIPT_PIN",
        value_name = "FINGERPRINT",
        // A fingerprint is base64url: one in 64 starts with '-'.
        allow_hyphen_values = true
    )]
    pub receipt_pin: Option<String>,
    /// Output format
    #[arg(long, short, global = true,
        help_heading = "Global options", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: C,
}

/// The command line with every subcommand.
pub type FullCli = Cli<Command>;

/// The command line of `hook` alone. Building the parser of every subcommand is a third of a
/// hook's instructions (docs/performance.md), and hosts run a hook on every tool call.
#[derive(Debug, Subcommand)]
pub enum HookCommand {
    #[command(about = HOOK_ABOUT, long_about = HOOK_LONG_ABOUT)]
    Hook(HookArgs),
}

impl From<Cli<HookCommand>> for FullCli {
    fn from(cli: Cli<HookCommand>) -> Self {
        let HookCommand::Hook(args) = cli.command;
        Cli {
            server: cli.server,
            token: cli.token,
            token_file: cli.token_file,
            ca_cert: cli.ca_cert,
            config: cli.config,
            output: cli.output,
            receipt_pin: cli.receipt_pin,
            command: Command::Hook(args),
        }
    }
}

const HOOK_ABOUT: &str =
    "Gate a coding agent's tool call: the host's hook JSON on stdin, its decision on stdout";
const HOOK_LONG_ABOUT: &str = "\
Gate a coding agent's tool call: the host's hook JSON on stdin, its decision on stdout

Always exits 0 with the decision the host understands, and denies when countersign cannot decide \
(server unreachable, token refused, expiry, unreadable input, --timeout reached), saying why. Set \
--timeout shorter than the host's hook timeout. Logs go to stderr.";

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The receipt (a compact JWS), or a file holding it
    pub receipt: String,
    /// JSON file of the arguments about to run: the receipt must approve exactly them
    #[arg(long, value_name = "FILE")]
    pub args: Option<PathBuf>,
    /// The approval the receipt must be for
    #[arg(long, value_name = "ID")]
    pub approval: Option<String>,
    /// JWKS file of the server's keys (`countersign keys`, or the server's
    /// /.well-known/jwks.json) [default: ask the server]
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// Accept a receipt past its expiry (checking an old decision, not gating a call)
    #[arg(long)]
    pub expired_ok: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable tables and summaries
    Table,
    /// JSON (watch: one JSON object per line)
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ask for approval of a tool call
    Request(RequestArgs),
    /// Show one approval
    Get {
        /// Approval id
        id: String,
    },
    /// List approvals, newest first
    List(ListArgs),
    /// Follow the approvals of a channel live
    ///
    /// Prints a snapshot of the pending approvals, then every event as it happens; reconnects
    /// and resumes by itself after a lost connection or a server restart. Stop with Ctrl-C.
    Watch(WatchArgs),
    /// Approve an approval, as the `cli` channel
    Approve(ApproveArgs),
    /// Reject an approval, as the `cli` channel
    Reject(DecideArgs),
    /// Cancel a pending approval
    Cancel {
        /// Approval id
        id: String,
        /// Why it is cancelled
        #[arg(long, default_value = "", hide_default_value = true)]
        reason: String,
    },
    /// Mark an approved call as executed
    Consume {
        /// Approval id
        id: String,
        /// How the execution went
        #[arg(long, value_enum, default_value_t = Outcome::Succeeded)]
        outcome: Outcome,
        /// A short note on the outcome
        #[arg(long, default_value = "", hide_default_value = true)]
        detail: String,
    },
    /// Run a command only once a human approved it
    ///
    /// Requests approval (the arguments hold the argv and the working directory), waits for the
    /// decision, runs the command only when approved, records its outcome on the approval
    /// (consume) and exits with its status. When rejected, expired, cancelled, timed out or
    /// when the server cannot be reached, the command does not run and the exit code says why.
    /// A request whose answer a broken connection lost (a server restart) is sent again under
    /// the same idempotency key, and waiting survives restarts. The command gets the
    /// terminal's stdin, stdout and stderr; countersign's own messages go to stderr.
    #[command(after_help = EXIT_CODES)]
    Exec(ExecArgs),
    /// Show the audit trail: every event, oldest first (admin token)
    Events(EventsArgs),
    /// List or revoke session grants (admin token)
    #[command(subcommand)]
    Grants(GrantsCommand),
    /// Let one approver decide on behalf of another until a time (admin token)
    ///
    /// While it lasts, the delegate's decisions on approvals of the delegator's groups count
    /// as the delegator's and are recorded as "DELEGATE on behalf of DELEGATOR".
    Delegate(DelegateArgs),
    /// List or revoke delegations (admin token)
    #[command(subcommand)]
    Delegations(DelegationsCommand),
    /// Rules proposed from the history of decisions (admin token)
    #[command(subcommand)]
    Rules(RulesCommand),
    /// Check the audit trail's hash chain; exit 72 naming the first broken row (admin token)
    VerifyAudit,
    /// Check a decision receipt offline: its signature against the key set (pinned with
    /// --receipt-pin), and with --approval and --args that it approves that call; prints its
    /// claims as JSON, or names what did not match and exits 1
    Verify(VerifyArgs),
    /// Print the server's receipt key set (JWKS) and its fingerprint
    Keys,
    /// Have the server write a verified online copy of its SQLite database (admin token)
    ///
    /// The server copies its database into the new file NAME in its backup directory
    /// (`storage.backup_dir` in its configuration, by default the database's directory, on the
    /// server's machine) while it keeps serving, verifies the copy's audit chain and answers
    /// with the copy's path and newest seq. An existing file is never overwritten, and a
    /// database whose chain does not verify is reported and not copied. On PostgreSQL the
    /// server answers that pg_dump is the way. Restoring: docs/deployment.md.
    Backup {
        /// The new file's name: letters, digits, '.', '_' and '-'.
        name: String,
    },
    #[command(about = HOOK_ABOUT, long_about = HOOK_LONG_ABOUT)]
    Hook(HookArgs),
    /// Serve the approval tools to an agent over MCP (stdio, newline-delimited JSON-RPC)
    ///
    /// Tools: `approve` (Claude Code's --permission-prompt-tool), `request_approval` and
    /// `check_approval`. Logs go to stderr.
    Mcp(McpArgs),
    /// Add the countersign hook to a coding agent's settings (merging, with a backup)
    Install(InstallArgs),
    /// Send a coding agent's "finished", "failed" or "waiting for input" event to the local
    /// instance's ntfy topics, Telegram default chat, Slack default channel and webhook
    /// endpoints as a notice (no buttons), outside the quiet hours
    ///
    /// Reads Claude Code's Stop, StopFailure or Notification hook input (Gemini CLI's
    /// AfterAgent or Notification) on stdin, or Codex's `agent-turn-complete` JSON as the last
    /// argument (`countersign install claude-code|codex|gemini --notify` sets them up). Quiet hours:
    /// `[notify] quiet_hours = "22:00-07:00"` (and `utc_offset = "+01:00"`) in the config file.
    Notify(NotifyArgs),
    /// Run countersign on this machine: the server and every configured channel in one process
    ///
    /// The approval server on SQLite in $XDG_DATA_HOME/countersign (~/.local/share/countersign),
    /// plus the channel workers the config file sets up — Telegram, GitHub, the web inbox, ntfy,
    /// Slack, webhooks ($XDG_CONFIG_HOME/countersign/countersign.toml, or --config; written by
    /// `countersign setup`). The tokens the pieces use are generated on first start into files
    /// only you can read. The log says what listens where. A worker that stops stops them all;
    /// Ctrl-C stops it.
    Up(UpArgs),
    /// Connect a channel to the local instance (`countersign up`)
    #[command(subcommand)]
    Setup(SetupCommand),
    /// Policy rules: write a preset, test a call and lint the rules of the local instance;
    /// report what they would have decided in observe mode (admin token)
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Check the local instance, the server, the token and the installed hooks; say how to fix
    /// what is missing
    Doctor {
        /// Only this host's hook [default: every host; at least one must be installed]
        #[arg(value_enum)]
        host: Option<Host>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Write a preset's rules into the config file (`countersign up` reads it), after your own
    ///
    /// balanced: read tools and read-only shell commands (ls, cat, git status, …) run without
    /// asking, destructive commands are asked at high risk, wiping / or home is denied, the
    /// rest is asked. strict: only the read tools run without asking. observe: the balanced
    /// rules with `[policy] mode = "observe"` (recorded, not applied: `policy report`). The
    /// rules are plain [[rules]] entries (names starting with the preset's name); writing a
    /// preset replaces the rules of one written before. See docs/policies.md.
    Preset {
        /// balanced, strict or observe
        name: String,
    },
    /// Show how the rules decide a tool call: the decision, the risk, the rule that decided
    /// and why each other rule did not match
    ///
    /// The call is a host's hook payload, `{"tool_name": "Bash", "tool_input": {"command":
    /// "ls"}}`, as the argument or on stdin. Nothing is sent to the server.
    Test {
        /// The call as JSON [default: read from stdin]
        call: Option<String>,
        /// The agent id the call is tested as
        #[arg(long, default_value = "claude-code")]
        agent: String,
        /// The risk the call declares [default: as the hooks declare it: shells high, reads
        /// low, others medium]
        #[arg(long, value_enum)]
        risk: Option<Risk>,
    },
    /// Find unreachable, shadowed and overlapping rules, with their lines in the config file;
    /// exits 70 when it finds any
    Lint,
    /// What the rules would have decided over a period of observe mode, and where a person
    /// decided otherwise (admin token)
    ///
    /// Reads the audit trail: every approval the server asked about with `[policy] mode =
    /// "observe"` carries the rule that would have decided it and how. The table counts, per
    /// rule, the calls, how people answered them, and the disagreements (a rejection of a call
    /// the rule would allow, an approval of one it would deny), which are listed below it.
    Report(PolicyReportArgs),
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// gRPC listen address [default: the config file's listen, else 127.0.0.1:50051]
    #[arg(long, env = "COUNTERSIGN_LISTEN", value_name = "ADDRESS")]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Subcommand)]
pub enum SetupCommand {
    /// Pair Telegram: check the bot token, then register whoever sends the bot `/start <code>`
    ///
    /// The bot token comes from TELEGRAM_BOT_TOKEN or is asked for (create a bot with
    /// @BotFather). The sender of the code becomes an approver, their chat the default target
    /// of approvals. Codes are single-use and expire. Restart `countersign up` afterwards.
    Telegram(SetupTelegramArgs),
    /// Connect GitHub: check the token, the repository (and issue), and the approver
    ///
    /// The token comes from GITHUB_TOKEN or is asked for; it must belong to the account
    /// countersign comments as (a machine user, or any account other than the approver's), with
    /// read and write access to issues. Approvals are posted on the issue (or a new issue each),
    /// and the approver decides with `/approve` or `/reject <reason>` comments, which needs write
    /// access to the repository. Nothing is written unless every check passes; the token goes
    /// to a file only you can read. Restart `countersign up` afterwards.
    Github(SetupGitHubArgs),
    /// Enable the web inbox and print a one-time sign-in link for an approver
    ///
    /// The inbox is served by `countersign up` (listen in [web], default 127.0.0.1:8080). The
    /// link signs one browser in as the approver (the first registered one unless --approver
    /// names another); it works once and expires. Run it again for another browser.
    Web(SetupWebArgs),
    /// Pair a phone with the ntfy app: no public address or inbound port needed
    ///
    /// Makes a random topic for approvals and a random reply topic on the ntfy server (given,
    /// configured, or ntfy.sh), prints the subscription as a link and a QR code, and sends a
    /// test notification. Its Confirm button answers through the reply topic; only then is the
    /// config written. The approval buttons later decide the same way. An access token, if
    /// the server needs one, comes from NTFY_TOKEN (and `countersign up` needs it too).
    /// Restart `countersign up` afterwards.
    Ntfy(SetupNtfyArgs),
    /// Connect email: check the SMTP relay, then confirm the approver's address by a test mail
    ///
    /// The SMTP password comes from COUNTERSIGN_SMTP_PASSWORD or is asked for (when a user name
    /// is given). A test mail goes to the address through the relay; its link opens a page
    /// served by this command, whose button confirms the address. Nothing is written unless
    /// the relay took the mail and the address was confirmed; the password goes to a file only
    /// you can read. Restart `countersign up` afterwards.
    Email(SetupEmailArgs),
    /// Connect a Discord bot: check the token, then pair an approver by a code sent to the bot
    ///
    /// The bot token comes from DISCORD_BOT_TOKEN or is asked for (Developer Portal → your
    /// application → Bot). Whoever sends the bot the code in a direct message becomes an
    /// approver, and that conversation the default channel of approvals. Nothing is written
    /// unless the bot could confirm there. Restart `countersign up` afterwards.
    Discord(SetupDiscordArgs),
    /// Connect a Slack app: check its tokens, pick the channel, pair the approver by a button
    ///
    /// The bot token (xoxb-…) and the app-level token (xapp-…, connections:write) come from
    /// SLACK_BOT_TOKEN and SLACK_APP_TOKEN or are asked for; without them the app manifest to
    /// create the app from is printed first (--manifest prints only it). The channel is picked
    /// by name among those the bot is in (a public one it is not in is joined). A "This is me"
    /// button posted there pairs whoever taps it as the approver: no user id is typed. Nothing
    /// is written unless every step passes; the tokens go to files only you can read. Stop
    /// `countersign up` while pairing (it listens on the same Socket Mode), restart it after.
    Slack(SetupSlackArgs),
}

/// `--preset NAME` of the `setup` commands: checked as it is parsed, before anything is set up.
#[derive(Debug, Args)]
pub struct PresetArg {
    /// Also write a policy preset's rules (balanced, strict or observe) into the config file, as
    /// `countersign policy preset NAME` does
    #[arg(long = "preset", value_name = "NAME", value_parser = preset_name)]
    pub name: Option<String>,
}

/// A preset's name, when there is a preset of that name.
fn preset_name(name: &str) -> Result<String, String> {
    crate::rules_file::check_preset(name)
        .map(|_| name.to_owned())
        .map_err(|error| error.to_string())
}

#[derive(Debug, Args)]
pub struct SetupSlackArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// Print the app manifest (scopes, Socket Mode, interactivity) and exit
    #[arg(long)]
    pub manifest: bool,
    /// The channel approvals go to, by name [default: asked, from the channels the bot is in]
    #[arg(long, value_name = "NAME")]
    pub channel: Option<String>,
    /// Who taps "This is me", by approver id (as in [[approvers]]) [default: the only one, or a new one when there is none]
    #[arg(long, value_name = "ID")]
    pub approver_id: Option<String>,
    /// How long to wait for the "This is me" tap, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub wait_secs: u64,
    /// The Slack Web API [default: api_url in [slack], else https://slack.com/api]
    #[arg(long, value_name = "URL", hide = true)]
    pub api_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct SetupNtfyArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// The ntfy server [default: server_url in [ntfy], else https://ntfy.sh]
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The topic approvals are published to [default: a new random one]
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
    /// Whose phone it is, by approver id (as in [[approvers]]) [default: the only one, or a new one when there is none]
    #[arg(long, value_name = "ID")]
    pub approver_id: Option<String>,
    /// How long to wait for the Confirm tap, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub wait_secs: u64,
}

#[derive(Debug, Args)]
pub struct SetupEmailArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// The SMTP relay's host name [default: asked]
    #[arg(long, value_name = "HOST")]
    pub smtp_host: Option<String>,
    /// The relay's port [default: 587 for starttls, 465 for tls, 25 for none]
    #[arg(long, value_name = "PORT")]
    pub smtp_port: Option<u16>,
    /// How the connection is protected: starttls, tls (SMTPS), or none (a relay on loopback only)
    #[arg(long, value_name = "MODE", default_value = "starttls", value_parser = ["starttls", "tls", "none"])]
    pub tls: String,
    /// A PEM file of a private CA the relay's certificate is checked against
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The SMTP user name [default: asked; empty for a relay without login]
    #[arg(long, value_name = "USER")]
    pub username: Option<String>,
    /// The sender, NAME <ADDRESS> or ADDRESS [default: asked]
    #[arg(long, value_name = "SENDER")]
    pub from: Option<String>,
    /// The approver's address: approval requests go there [default: asked]
    #[arg(long, value_name = "ADDRESS")]
    pub to: Option<String>,
    /// The configured approver this address belongs to (a new id registers another person)
    /// [default: the only approver, when there is exactly one]
    #[arg(long, value_name = "ID")]
    pub approver_id: Option<String>,
    /// Where the confirmation and decision-link pages listen [default: listen in [email], else 127.0.0.1:8789]
    #[arg(long, value_name = "ADDRESS")]
    pub listen: Option<std::net::SocketAddr>,
    /// How the approver's browser reaches those pages [default: public_url in [email], else where they listen]
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// How long to wait for the test mail's link to be confirmed
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub wait: Duration,
}

#[derive(Debug, Args)]
pub struct SetupDiscordArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// Pair one more approver with the bot already set up (the default channel stays)
    #[arg(long)]
    pub add: bool,
    /// How long the pairing code is valid
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub code_ttl: Duration,
    /// Discord's REST API (a reverse proxy) [default: https://discord.com/api/v10]
    #[arg(long, env = "DISCORD_API_URL", value_name = "URL")]
    pub api_url: Option<String>,
    /// The Gateway's WebSocket URL [default: Discord's own]
    #[arg(long, env = "DISCORD_GATEWAY_URL", value_name = "URL")]
    pub gateway_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct SetupWebArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// The approver to sign in, by id (as in [[approvers]]) [default: the only one; needed when there are several]
    #[arg(long, value_name = "ID")]
    pub approver: Option<String>,
    /// Where the inbox listens [default: listen in [web], else 127.0.0.1:8080]
    #[arg(long, value_name = "ADDRESS")]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub struct SetupGitHubArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// The repository approvals go to, OWNER/REPO [default: asked]
    #[arg(long, value_name = "OWNER/REPO")]
    pub repo: Option<String>,
    /// The issue or pull request to comment on [default: asked; none opens an issue per approval]
    #[arg(long, value_name = "NUMBER", value_parser = clap::value_parser!(u64).range(1..))]
    pub issue: Option<u64>,
    /// The GitHub login of the approver [default: asked]
    #[arg(long, value_name = "LOGIN")]
    pub approver: Option<String>,
    /// The configured approver this login belongs to (a new id registers another person)
    /// [default: the only approver, when there is exactly one]
    #[arg(long, value_name = "ID")]
    pub approver_id: Option<String>,
    /// The GitHub API (GitHub Enterprise Server: https://HOST/api/v3) [default: https://api.github.com]
    #[arg(long, env = "GITHUB_API_URL", value_name = "URL")]
    pub api_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct SetupTelegramArgs {
    #[command(flatten)]
    pub preset: PresetArg,
    /// Pair one more approver with the bot already set up (the default chat stays)
    #[arg(long)]
    pub add: bool,
    /// How long the pairing code is valid
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub code_ttl: Duration,
    /// The Bot API server (a self-hosted one) [default: https://api.telegram.org]
    #[arg(long, env = "TELEGRAM_API_URL", value_name = "URL")]
    pub api_url: Option<String>,
}

/// A coding agent that runs countersign as its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Host {
    /// Claude Code (PreToolUse and PermissionRequest hooks)
    ClaudeCode,
    /// OpenAI Codex CLI (PreToolUse and PermissionRequest hooks)
    Codex,
    /// Gemini CLI (BeforeTool hook)
    Gemini,
}

/// The hook event the host runs countersign for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HookEvent {
    /// Before a tool runs (Gemini CLI: BeforeTool)
    PreToolUse,
    /// When the host would show its permission prompt (Claude Code and Codex)
    PermissionRequest,
}

/// What to answer when countersign cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnError {
    /// Deny the call, saying what went wrong
    Deny,
    /// Hand the call back to the host's own permission prompt
    Ask,
}

/// How a hook or the MCP server asks: agent, routes, risks, deadline.
#[derive(Debug, Args)]
pub struct GateArgs {
    /// Agent id of the requests [default: config agent_id, else the host's name:
    /// claude-code, codex, gemini-cli; for mcp: claude-code for `approve`, mcp-agent for
    /// `request_approval`]
    #[arg(long = "agent", env = "COUNTERSIGN_AGENT_ID", value_name = "ID")]
    pub agent_id: Option<String>,
    /// Where to ask, as CHANNEL or CHANNEL:TARGET; repeatable. None: every channel
    #[arg(long = "route", value_name = "CHANNEL[:TARGET]", value_parser = parse_route)]
    pub routes: Vec<pb::Route>,
    /// The risk of a tool, TOOL=LEVEL (TOOL may end in *); repeatable; before the config
    /// file's [tool_risk] and the defaults (shells high, reads low, others medium)
    #[arg(long = "risk", value_name = "TOOL=LEVEL", value_parser = parse_tool_risk)]
    pub risks: Vec<(String, Risk)>,
    /// How long to wait for a decision; then the request is withdrawn and the call denied.
    /// Keep it below the host's hook timeout [default: 540s (Claude Code and Codex time hooks
    /// out after 600s); gemini: 50s (Gemini CLI: 60000 ms)]
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The agent host whose hook JSON arrives on stdin
    #[arg(value_enum)]
    pub host: Host,
    /// The hook event
    #[arg(long, value_enum, default_value_t = HookEvent::PreToolUse)]
    pub event: HookEvent,
    /// When countersign cannot decide: deny, or fall back to the host's own prompt
    #[arg(long, value_enum, default_value_t = OnError::Deny)]
    pub on_error: OnError,
    #[command(flatten)]
    pub gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub gate: GateArgs,
    /// How often a waiting tool call reports progress (when the client asked for it)
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// Also be a Claude Code channel that relays its permission prompts to the approvers
    /// (Claude Code 2.1.81+, research preview; see docs/integrations.md)
    #[arg(long)]
    pub channel: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The agent host to configure
    #[arg(value_enum)]
    pub host: Host,
    /// The project's settings file, under the current directory (the default)
    #[arg(long, conflicts_with = "user")]
    pub project: bool,
    /// The user's settings file, under the home directory
    #[arg(long)]
    pub user: bool,
    /// The hook event to install
    #[arg(long, value_enum, default_value_t = HookEvent::PreToolUse)]
    pub event: HookEvent,
    /// Which tools to gate: the host's matcher regex [default: shells, edits, fetches, MCP]
    #[arg(long)]
    pub matcher: Option<String>,
    /// countersign's wait; the host's hook timeout is set 60s longer [default: 540s]
    #[arg(long, default_value = "540s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Show the settings snippet instead of writing it
    #[arg(long)]
    pub print: bool,
    /// Also write a preset's policy rules (balanced, strict or observe) into the local instance's
    /// config file, as `countersign policy preset NAME` does
    #[arg(long, value_name = "NAME", conflicts_with_all = ["channel", "print"], value_parser = preset_name)]
    pub preset: Option<String>,
    /// Claude Code: instead of the hook, add `countersign mcp --channel` to the project's
    /// .mcp.json, relaying permission prompts (a research preview; it says how to start Claude
    /// Code)
    #[arg(long, conflicts_with = "user")]
    pub channel: bool,
    /// Also send notices to your ntfy topics, Telegram chat and Slack channel (`countersign
    /// notify`): for Claude Code the Stop, StopFailure and Notification hooks ("finished",
    /// "failed", "waiting for input"); for Gemini CLI the AfterAgent and Notification hooks
    /// ("finished", "waiting for confirmation"); for Codex its `notify` program in
    /// ~/.codex/config.toml ("finished")
    #[arg(long)]
    pub notify: bool,
}

#[derive(Debug, Args)]
pub struct NotifyArgs {
    /// The agent host whose event this is
    #[arg(value_enum)]
    pub host: Host,
    /// Codex: the JSON its `notify` program gets as its last argument (Claude Code's hook
    /// input comes on stdin)
    pub payload: Option<String>,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only the events of this approval
    #[arg(
        long = "approval",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub approval_id: String,
    /// Only events of this kind; repeatable
    #[arg(long = "kind", value_enum)]
    pub kinds: Vec<EventKind>,
    /// Only events of this agent's approvals
    #[arg(
        long = "agent",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub agent_id: String,
    /// Only decisions by this decider: CHANNEL:USER_ID (e.g. telegram:123456) or an approver id
    #[arg(long, default_value = "", hide_default_value = true)]
    pub decider: String,
    /// Only events at or after this time: RFC 3339 (2025-01-31T12:00:00Z) or an age (2h)
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<SystemTime>,
    /// Only events before this time: RFC 3339 or an age
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<SystemTime>,
    /// Newest first
    #[arg(long)]
    pub newest_first: bool,
    /// At most this many events
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Propose allow rules for call shapes people approved again and again and never rejected
    /// (admin token)
    ///
    /// Reads the audit trail's decided approvals. A shape is an agent, a tool and a bound on
    /// the arguments: a shell command's program and subcommand (`npm test`) with further words
    /// of plain characters only (no `;`, `|`, `&`, `$`, quotes or redirections), or a file
    /// directly in one directory (no dotfiles). Each proposal shows its evidence (how many
    /// approvals, by whom), its id (a digest of the rule) and the `[[rules]]` entry it would
    /// add, which allows exactly the argument lists people approved. A rejection blocks every
    /// suggestion for a program its command line runs (or, when that cannot be told, for its
    /// tool). `--accept ID` appends that entry to the server's config file (--to, else the
    /// local instance's), after the rules already there, with a comment recording who
    /// accepted it, when and on what evidence; the server applies it when restarted.
    Suggest(RulesSuggestArgs),
}

#[derive(Debug, Args)]
pub struct RulesSuggestArgs {
    /// Only decisions at or after this time: RFC 3339 or an age (30d)
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<SystemTime>,
    /// The fewest approvals a shape needs to be proposed
    #[arg(long, default_value_t = 3)]
    pub min_approvals: u32,
    /// Add the suggestion with this id (as listed) to the config file; repeatable. Refused
    /// when the history has changed the suggestion since it was listed
    #[arg(long, value_name = "ID")]
    pub accept: Vec<String>,
    /// The server's config file --accept adds to [default: the local instance's,
    /// $XDG_CONFIG_HOME/countersign/countersign.toml]
    #[arg(long, value_name = "PATH")]
    pub to: Option<PathBuf>,
    /// At most this many events read, the newest (a warning says when older ones were left
    /// out)
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub struct PolicyReportArgs {
    /// Only events at or after this time: RFC 3339 (2025-01-31T12:00:00Z) or an age (7d)
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since: Option<SystemTime>,
    /// Only events before this time: RFC 3339 or an age
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until: Option<SystemTime>,
    /// At most this many events read, the newest (a warning says when older ones were left
    /// out)
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
}

#[derive(Debug, Subcommand)]
pub enum GrantsCommand {
    /// List session grants, newest first
    List(GrantsListArgs),
    /// Revoke a session grant: it approves nothing from now on
    Revoke {
        /// Grant id
        id: String,
        /// Why (on the audit trail)
        #[arg(long, default_value = "", hide_default_value = true)]
        reason: String,
    },
}

#[derive(Debug, Args)]
pub struct DelegateArgs {
    /// Approver id of the person who is away [default: you, as `approve` names you: the
    /// config file's user, else $USER, which the server maps through approvers' `cli`
    /// identities]
    #[arg(long = "from", value_name = "APPROVER")]
    pub delegator: Option<String>,
    /// Approver id of the person deciding on their behalf
    #[arg(long = "to", value_name = "APPROVER")]
    pub delegate: String,
    /// When it ends: an RFC 3339 time (2026-12-01T18:00:00Z) or a duration from now (8h, 3days)
    #[arg(long, value_parser = parse_until)]
    pub until: SystemTime,
    /// Why (shown in the list)
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
}

#[derive(Debug, Subcommand)]
pub enum DelegationsCommand {
    /// List active delegations, newest first
    List {
        /// Only delegations to or from this approver id
        #[arg(long, default_value = "", hide_default_value = true)]
        approver: String,
        /// Also expired and revoked ones
        #[arg(long)]
        all: bool,
    },
    /// End a delegation now
    Revoke {
        /// Delegation id
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct GrantsListArgs {
    /// Only this agent's grants
    #[arg(
        long = "agent",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub agent_id: String,
    /// Only this session's grants
    #[arg(
        long = "session",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub session_id: String,
    /// Only grants for this tool
    #[arg(long, default_value = "", hide_default_value = true)]
    pub tool: String,
    /// Also expired and revoked grants
    #[arg(long)]
    pub all: bool,
    /// At most this many grants
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventKind {
    Requested,
    DecisionRecorded,
    DecisionRefused,
    Resolved,
    Expired,
    Cancelled,
    Consumed,
    Delivered,
    GrantRevoked,
    RuleAccepted,
    Reminded,
    Escalated,
}

impl From<EventKind> for pb::EventKind {
    fn from(kind: EventKind) -> Self {
        match kind {
            EventKind::Requested => pb::EventKind::Requested,
            EventKind::DecisionRecorded => pb::EventKind::DecisionRecorded,
            EventKind::DecisionRefused => pb::EventKind::DecisionRefused,
            EventKind::Resolved => pb::EventKind::Resolved,
            EventKind::Expired => pb::EventKind::Expired,
            EventKind::Cancelled => pb::EventKind::Cancelled,
            EventKind::Consumed => pb::EventKind::Consumed,
            EventKind::Delivered => pb::EventKind::Delivered,
            EventKind::GrantRevoked => pb::EventKind::GrantRevoked,
            EventKind::RuleAccepted => pb::EventKind::RuleAccepted,
            EventKind::Reminded => pb::EventKind::Reminded,
            EventKind::Escalated => pb::EventKind::Escalated,
        }
    }
}

/// What a request says about the call, shared by `request` and `exec`.
#[derive(Debug, Args)]
pub struct CallArgs {
    /// One-line summary shown to approvers
    #[arg(long)]
    pub action: Option<String>,
    /// Why the call is needed
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    /// Risk level
    #[arg(long, value_enum, default_value_t = Risk::Medium)]
    pub risk: Risk,
    /// Agent id of the requester [default: config agent_id, else countersign-cli]
    #[arg(long = "agent", env = "COUNTERSIGN_AGENT_ID", value_name = "ID")]
    pub agent_id: Option<String>,
    /// Agent session id (session-scoped approvals apply within it)
    #[arg(
        long = "session",
        default_value = "",
        hide_default_value = true,
        value_name = "ID"
    )]
    pub session_id: String,
    /// Idempotency key: the same key returns the same approval [default: a new random key]
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Where to ask, as CHANNEL or CHANNEL:TARGET (e.g. telegram:-1001234, github:o/r#12);
    /// repeatable. None: every channel
    #[arg(long = "route", value_name = "CHANNEL[:TARGET]", value_parser = parse_route)]
    pub routes: Vec<pb::Route>,
    /// Distinct approvers needed [default: the server's, 1]
    #[arg(long, default_value_t = 0, hide_default_value = true, value_name = "N")]
    pub required_approvals: u32,
    /// How long the approval stays open, e.g. 10m [default: the server's]
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// A label KEY=VALUE; repeatable
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// A group that must approve, with its quorum (repeatable: every group must): `security=2`
    #[arg(long = "group", value_name = "GROUP[=N]", value_parser = parse_group)]
    pub groups: Vec<pb::GroupQuorum>,
    /// Remind the deciders after this long without a decision (e.g. 10m)
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub remind_after: Option<Duration>,
    /// Escalate to --escalate-to after this long without a decision (e.g. 20m)
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub escalate_after: Option<Duration>,
    /// The group an escalation goes to
    #[arg(long, value_name = "GROUP")]
    pub escalate_to: Option<String>,
    /// What the deadline means: reject (the default) or escalate to --escalate-to
    #[arg(long, value_enum)]
    pub on_timeout: Option<OnTimeout>,
}

#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Tool name
    #[arg(long)]
    pub tool: String,
    /// Arguments of the call, a JSON object
    #[arg(long = "args", default_value = "{}", value_name = "JSON")]
    pub arguments_json: String,
    #[command(flatten)]
    pub call: CallArgs,
    /// Wait for the decision; the exit code tells it (0 approved, 65 rejected, ...)
    #[arg(long)]
    pub wait: bool,
    /// With --wait: how long to wait, e.g. 90s [default: until the approval expires]
    #[arg(long, requires = "wait", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Tool name shown to approvers
    #[arg(long, default_value = "exec")]
    pub tool: String,
    #[command(flatten)]
    pub call: CallArgs,
    /// How long to wait for a decision, e.g. 90s [default: until the approval expires]
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// The command and its arguments (after `--`)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only these states; repeatable
    #[arg(long = "state", value_enum)]
    pub states: Vec<State>,
    /// Only this agent's approvals
    #[arg(
        long = "agent",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub agent_id: String,
    /// Only approvals routed to this channel (or to every channel)
    #[arg(long, default_value = "", hide_default_value = true)]
    pub channel: String,
    /// Only this session's approvals
    #[arg(
        long = "session",
        value_name = "ID",
        default_value = "",
        hide_default_value = true
    )]
    pub session_id: String,
    /// Only this tool's approvals
    #[arg(long, default_value = "", hide_default_value = true)]
    pub tool: String,
    /// At most this many approvals
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only approvals routed to this channel (and those with no routes) [default: all]
    #[arg(long, default_value = "", hide_default_value = true)]
    pub channel: String,
    /// Reconnect when the server sent nothing (not even a heartbeat) for this long
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// Approval id
    pub id: String,
    /// Why (shown to the requester and in the audit trail)
    #[arg(long, default_value = "", hide_default_value = true)]
    pub reason: String,
    /// Decide as this user [default: config user, else $USER]
    #[arg(long = "as", value_name = "USER")]
    pub user: Option<String>,
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub decision: DecideArgs,
    /// Approve this call only, or later calls of the same tool in the agent session too
    #[arg(long, value_enum, default_value_t = DecisionScope::Once)]
    pub scope: DecisionScope,
    /// Edit the arguments before approving: opens $VISUAL or $EDITOR on them (pretty-printed
    /// JSON) and approves what you save. Saved unchanged, it approves them as they are. The
    /// server validates the edit and checks policy on it again; a refused edit decides nothing
    #[arg(long, conflicts_with = "args_digest")]
    pub edit: bool,
    /// The version of the arguments you reviewed (args_digest, or edited_args_digest once
    /// edited, as `countersign get` shows them); refused when they changed since. Needed to
    /// approve an approval someone edited
    #[arg(long, value_name = "DIGEST")]
    pub args_digest: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    Low,
    Medium,
    High,
    Critical,
}

impl From<Risk> for pb::Risk {
    fn from(risk: Risk) -> Self {
        match risk {
            Risk::Low => pb::Risk::Low,
            Risk::Medium => pb::Risk::Medium,
            Risk::High => pb::Risk::High,
            Risk::Critical => pb::Risk::Critical,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum State {
    Pending,
    Approved,
    Rejected,
    Expired,
    Cancelled,
    Consumed,
}

impl From<State> for pb::ApprovalState {
    fn from(state: State) -> Self {
        match state {
            State::Pending => pb::ApprovalState::Pending,
            State::Approved => pb::ApprovalState::Approved,
            State::Rejected => pb::ApprovalState::Rejected,
            State::Expired => pb::ApprovalState::Expired,
            State::Cancelled => pb::ApprovalState::Cancelled,
            State::Consumed => pb::ApprovalState::Consumed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DecisionScope {
    Once,
    Session,
}

impl From<DecisionScope> for pb::Scope {
    fn from(scope: DecisionScope) -> Self {
        match scope {
            DecisionScope::Once => pb::Scope::Once,
            DecisionScope::Session => pb::Scope::Session,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Outcome {
    Succeeded,
    Failed,
}

impl From<Outcome> for pb::ConsumeOutcome {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Succeeded => pb::ConsumeOutcome::Succeeded,
            Outcome::Failed => pb::ConsumeOutcome::Failed,
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| format!("{error} (examples: 90s, 10m, 1h)"))
}

/// An RFC 3339 time, or an age before now such as `2h`.
fn parse_time(text: &str) -> Result<SystemTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(at) = time::OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at.into());
    }
    let age = humantime::parse_duration(text).map_err(|_| {
        format!("{text:?} is neither an RFC 3339 time (2025-01-31T12:00:00Z) nor an age (2h)")
    })?;
    SystemTime::now()
        .checked_sub(age)
        .ok_or_else(|| format!("{text:?} reaches back before the epoch"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnTimeout {
    Reject,
    Escalate,
}

impl From<OnTimeout> for pb::OnTimeout {
    fn from(on_timeout: OnTimeout) -> Self {
        match on_timeout {
            OnTimeout::Reject => pb::OnTimeout::Reject,
            OnTimeout::Escalate => pb::OnTimeout::Escalate,
        }
    }
}

fn parse_group(text: &str) -> Result<pb::GroupQuorum, String> {
    let (group, required) = match text.split_once('=') {
        Some((group, n)) => (
            group,
            n.parse::<u32>()
                .map_err(|_| format!("{n:?} is not a number of approvals (GROUP=N)"))?,
        ),
        None => (text, 1),
    };
    if group.is_empty() {
        return Err("the group is empty (expected GROUP or GROUP=N)".into());
    }
    Ok(countersign_client::groups::quorum(group, required))
}

/// An RFC 3339 time, or a duration from now such as `8h`.
fn parse_until(text: &str) -> Result<SystemTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(at) = time::OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at.into());
    }
    let ahead = humantime::parse_duration(text).map_err(|_| {
        format!("{text:?} is neither an RFC 3339 time (2026-12-01T18:00:00Z) nor a duration (8h)")
    })?;
    SystemTime::now()
        .checked_add(ahead)
        .ok_or_else(|| format!("{text:?} is too far ahead"))
}

fn parse_route(text: &str) -> Result<pb::Route, String> {
    let (channel, target) = text.split_once(':').unwrap_or((text, ""));
    if channel.is_empty() {
        return Err("the channel is empty (expected CHANNEL or CHANNEL:TARGET)".into());
    }
    Ok(pb::Route {
        channel: channel.to_owned(),
        target: target.to_owned(),
    })
}

fn parse_tool_risk(text: &str) -> Result<(String, Risk), String> {
    let (tool, level) = text
        .split_once('=')
        .filter(|(tool, _)| !tool.is_empty())
        .ok_or("expected TOOL=LEVEL, e.g. Bash=high")?;
    let risk = Risk::from_str(level, true)
        .map_err(|_| format!("{level:?} is not a risk level (low, medium, high, critical)"))?;
    Ok((tool.to_owned(), risk))
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err("expected KEY=VALUE".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_hook_alone_parses_and_helps_as_the_whole_command_line_does() {
        let line = [
            "countersign",
            "--server",
            "http://127.0.0.1:1",
            "hook",
            "codex",
            "--event",
            "permission-request",
            "--on-error",
            "ask",
            "--timeout",
            "30s",
        ];
        let alone = Cli::<HookCommand>::try_parse_from(line).expect("hook alone parses");
        let whole = FullCli::try_parse_from(line).expect("whole line parses");
        assert_eq!(format!("{:?}", FullCli::from(alone)), format!("{whole:?}"));

        let help = |mut command: clap::Command| {
            command.build();
            command
                .find_subcommand_mut("hook")
                .expect("hook subcommand")
                .render_long_help()
                .to_string()
        };
        let alone_help = help(Cli::<HookCommand>::command());
        assert!(alone_help.contains("denies when countersign cannot decide"));
        assert_eq!(alone_help, help(FullCli::command()));
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        FullCli::command().debug_assert();
    }

    #[test]
    fn routes_take_an_optional_target_after_the_first_colon() {
        let route = parse_route("github:owner/repo#12").unwrap();
        assert_eq!(
            (route.channel.as_str(), route.target.as_str()),
            ("github", "owner/repo#12")
        );
        let route = parse_route("telegram:-100:5").unwrap();
        assert_eq!(
            (route.channel.as_str(), route.target.as_str()),
            ("telegram", "-100:5")
        );
        let route = parse_route("cli").unwrap();
        assert_eq!((route.channel.as_str(), route.target.as_str()), ("cli", ""));
        assert!(parse_route(":x").is_err());
    }

    #[test]
    fn times_are_rfc3339_or_an_age() {
        let at = parse_time("2025-01-31T12:00:00Z").unwrap();
        assert_eq!(
            at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_738_324_800
        );
        let two_hours_ago = parse_time("2h").unwrap();
        let age = SystemTime::now().duration_since(two_hours_ago).unwrap();
        assert!(age >= Duration::from_secs(7200) && age < Duration::from_secs(7260));
        assert!(parse_time("yesterday-ish").is_err());
    }

    #[test]
    fn labels_need_a_key() {
        assert_eq!(
            parse_label("env=prod").unwrap(),
            ("env".into(), "prod".into())
        );
        assert_eq!(
            parse_label("note=a=b").unwrap(),
            ("note".into(), "a=b".into())
        );
        assert!(parse_label("=x").is_err());
        assert!(parse_label("novalue").is_err());
    }
}
