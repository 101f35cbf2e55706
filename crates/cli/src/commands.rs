//! The subcommands (except `exec`, in its own module).

use std::io::Write;
use std::time::SystemTime;

use countersign_client::{pb, receipts, Client, WatchItem, WatchOptions};
use serde_json::Value;

use crate::agent::install::InstallFlags;
use crate::agent::waiting::{
    approval_request, await_decision, outcome_text, request_to_wait, verdict_exit,
};
use crate::args::{
    ApproveArgs, Cli, Command, DecideArgs, DelegationsCommand, EventsArgs, FullCli, GrantsCommand,
    GrantsListArgs, HookCommand, ListArgs, Output, PolicyCommand, PolicyReportArgs, RequestArgs,
    RulesCommand, RulesSuggestArgs, SetupCommand, WatchArgs,
};
use crate::exit::{CliError, Exit};
use crate::instance::{Instance, Token};
use crate::render;
use crate::settings::Settings;

/// The most approvals one `ListApprovals` call returns.
const MAX_PAGE_SIZE: usize = 500;

/// The most events or grants one `ListEvents` / `ListGrants` call returns.
const MAX_ADMIN_PAGE_SIZE: usize = 1000;

/// Runs `countersign hook` (the command line of `countersign-hook`); returns the process exit
/// code. It reaches no other command, so that `countersign-hook` links none.
pub async fn run_hook(cli: Cli<HookCommand>) -> i32 {
    let settings = Settings::resolve(&cli, Token::Agent);
    let HookCommand::Hook(args) = cli.command;
    crate::agent::hook::run(settings, args).await
}

/// Runs the command line; returns the process exit code.
pub async fn run(cli: FullCli) -> i32 {
    // `up`, `setup`, `notify` and `policy` (but its report) read the local instance's file, not
    // the client's config file.
    let local = match &cli.command {
        Command::Up(_) | Command::Setup(_) | Command::Notify(_) => true,
        Command::Policy(command) => !matches!(command, PolicyCommand::Report(_)),
        _ => false,
    };
    if local {
        let done = match Instance::locate(cli.config.as_deref()) {
            Ok(instance) => match cli.command {
                Command::Setup(SetupCommand::Telegram(args)) => {
                    crate::local::setup::telegram(&instance, args).await
                }
                Command::Setup(SetupCommand::Github(args)) => {
                    crate::local::setup_github::github(&instance, args).await
                }
                Command::Setup(SetupCommand::Web(args)) => {
                    crate::local::setup_web::web(&instance, args).await
                }
                Command::Setup(SetupCommand::Ntfy(args)) => {
                    crate::local::setup_ntfy::ntfy(&instance, args).await
                }
                Command::Setup(SetupCommand::Email(args)) => {
                    crate::local::setup_email::email(&instance, args).await
                }
                Command::Setup(SetupCommand::Discord(args)) => {
                    crate::local::setup_discord::discord(&instance, args).await
                }
                Command::Setup(SetupCommand::Slack(args)) => {
                    crate::local::setup_slack::slack(&instance, args).await
                }
                Command::Up(args) => crate::local::up::up(&instance, args).await,
                Command::Policy(command) => {
                    crate::operator::policy::run(&instance, command, cli.output)
                }
                Command::Notify(args) => crate::agent::notify::notify(&instance, args).await,
                _ => Err(CliError::Failure(
                    "not a command of the local instance".into(),
                )),
            },
            Err(error) => Err(error),
        };
        return match done {
            Ok(exit) => exit.code(),
            Err(error) => fail(&error),
        };
    }
    let settings = Settings::resolve(&cli, Settings::local_token(&cli.command));
    let install_flags = InstallFlags {
        config: cli.config.clone(),
        server: cli.server.clone(),
        token_file: cli.token_file.clone(),
        receipt_pin: cli.receipt_pin.clone(),
    };
    let command = match cli.command {
        // A hook answers the host on stdout whatever goes wrong, bad settings included.
        Command::Hook(args) => return crate::agent::hook::run(settings, args).await,
        command => command,
    };
    let settings = match settings {
        Ok(settings) => settings,
        Err(error) => return fail(&error),
    };
    match dispatch(command, cli.output, &install_flags, &settings).await {
        Ok(code) => code,
        Err(error) if error.exit() == Exit::Unavailable => {
            eprintln!(
                "countersign: cannot reach the server at {}",
                settings.client.url
            );
            fail(&error)
        }
        Err(error) => fail(&error),
    }
}

fn fail(error: &CliError) -> i32 {
    eprintln!("countersign: {error}");
    error.exit().code()
}

async fn dispatch(
    command: Command,
    output: Output,
    install_flags: &InstallFlags,
    settings: &Settings,
) -> Result<i32, CliError> {
    let client = settings.connect()?;
    let out = Printer { format: output };
    let exit = match command {
        Command::Request(args) => request(&client, settings, &out, args).await?,
        Command::Get { id } => {
            out.approval(&client.get_approval(&id).await?)?;
            Exit::Success
        }
        Command::List(args) => list(&client, &out, args).await?,
        Command::Watch(args) => watch(&client, &out, args).await?,
        Command::Approve(ApproveArgs {
            decision,
            scope,
            edit,
            args_digest,
        }) => {
            let version = if edit {
                let approval = client.get_approval(&decision.id).await?;
                let edited = crate::operator::edit::edit_arguments(&approval)?;
                Version {
                    expected_digest: edited.seen_digest,
                    edited_arguments: edited.arguments.unwrap_or_default(),
                }
            } else {
                Version {
                    expected_digest: args_digest.unwrap_or_default(),
                    edited_arguments: String::new(),
                }
            };
            decide(
                &client,
                settings,
                &out,
                decision,
                pb::Verdict::Approve,
                scope.into(),
                version,
            )
            .await?
        }
        Command::Reject(decision) => {
            decide(
                &client,
                settings,
                &out,
                decision,
                pb::Verdict::Reject,
                pb::Scope::Once,
                Version::default(),
            )
            .await?
        }
        Command::Cancel { id, reason } => {
            out.approval(&client.cancel_approval(&id, &reason).await?)?;
            Exit::Success
        }
        Command::Consume {
            id,
            outcome,
            detail,
        } => {
            out.approval(&client.consume(&id, outcome.into(), &detail).await?)?;
            Exit::Success
        }
        Command::Exec(args) => return crate::agent::exec::exec(&client, settings, args).await,
        Command::Events(args) => events(&client, &out, args).await?,
        Command::Grants(GrantsCommand::List(args)) => grants(&client, &out, args).await?,
        Command::Grants(GrantsCommand::Revoke { id, reason }) => {
            let grant = client.revoke_grant(&id, &reason).await?;
            match out.format {
                Output::Table => out.write(&render::grants_table(&[grant]))?,
                Output::Json => out.json(&render::grant_json(&grant), true)?,
            }
            Exit::Success
        }
        Command::Delegate(args) => {
            let request = pb::CreateDelegationRequest {
                delegator: settings.decider(args.delegator.as_deref())?,
                delegate: args.delegate,
                until: Some(args.until.into()),
                reason: args.reason,
            };
            let delegation = client.create_delegation(request).await?;
            print_delegations(&out, &[delegation])?;
            Exit::Success
        }
        Command::Delegations(DelegationsCommand::List { approver, all }) => {
            print_delegations(&out, &client.list_delegations(&approver, all).await?)?;
            Exit::Success
        }
        Command::Delegations(DelegationsCommand::Revoke { id }) => {
            print_delegations(&out, &[client.revoke_delegation(&id).await?])?;
            Exit::Success
        }
        Command::Policy(PolicyCommand::Report(args)) => policy_report(&client, &out, args).await?,
        Command::Rules(RulesCommand::Suggest(args)) => rules_suggest(&client, &out, args).await?,
        Command::VerifyAudit => verify_audit(&client, &out).await?,
        Command::Verify(args) => {
            let verified =
                crate::operator::receipt::verify(&client, settings.receipt_pin.as_deref(), args)
                    .await?;
            out.json(&verified, true)?;
            Exit::Success
        }
        Command::Keys => {
            out.json(&crate::operator::receipt::keys(&client).await?, true)?;
            Exit::Success
        }
        Command::Backup { name } => {
            let made = client.backup_database(&name).await?;
            match out.format {
                Output::Table => out.write(&format!("{}\n", render::backup_text(&made)))?,
                Output::Json => out.json(&render::backup_json(&made), true)?,
            }
            Exit::Success
        }
        Command::Hook(args) => return Ok(crate::agent::hook::run(Ok(settings.clone()), args).await),
        Command::Mcp(args) => crate::agent::mcp::serve(client, settings, args).await?,
        Command::Install(args) => {
            let flags = crate::agent::install::pin_receipts(install_flags, &client).await?;
            crate::agent::install::install(&flags, args)?
        }
        Command::Doctor { host } => crate::agent::install::doctor(&client, host).await,
        Command::Up(_) | Command::Setup(_) | Command::Notify(_) | Command::Policy(_) => {
            return Err(CliError::Failure(
                "up, setup, notify and policy run before the client settings".into(),
            ))
        }
    };
    Ok(exit.code())
}

/// Writes results to stdout in the chosen format.
pub struct Printer {
    pub format: Output,
}

impl Printer {
    fn write(&self, text: &str) -> Result<(), CliError> {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|error| CliError::Failure(format!("cannot write the output: {error}")))
    }

    fn json(&self, value: &Value, pretty: bool) -> Result<(), CliError> {
        let text = if pretty {
            serde_json::to_string_pretty(value)
        } else {
            serde_json::to_string(value)
        }
        .map_err(|error| CliError::Failure(format!("cannot encode JSON: {error}")))?;
        self.write(&format!("{text}\n"))
    }

    pub fn approval(&self, approval: &pb::Approval) -> Result<(), CliError> {
        match self.format {
            Output::Table => self.write(&render::approval_text(approval)),
            Output::Json => self.json(&render::approval_json(approval), true),
        }
    }
}

async fn request(
    client: &Client,
    settings: &Settings,
    out: &Printer,
    args: RequestArgs,
) -> Result<Exit, CliError> {
    let request = approval_request(
        settings,
        &args.call,
        args.tool,
        args.arguments_json,
        String::new(),
    )?;
    if !args.wait {
        let response = client.request_approval(request).await?;
        let approval = response
            .approval
            .ok_or_else(|| CliError::Failure("the server answered without an approval".into()))?;
        out.approval(&approval)?;
        return Ok(Exit::Success);
    }
    let arguments_json = request.arguments_json.clone();
    let approval = request_to_wait(client, request, args.timeout).await?;
    let approval = await_decision(client, approval, args.timeout).await?;
    out.approval(&approval)?;
    if approval.state() == pb::ApprovalState::Approved {
        // Exit 0 says "go ahead": only for what the server signed.
        let requested = receipts::digest_of(&arguments_json)?;
        client
            .verify_receipt(&approval, &receipts::digest_to_run(&approval, &requested)?)
            .await?;
    }
    Ok(verdict_exit(&approval))
}

async fn list(client: &Client, out: &Printer, args: ListArgs) -> Result<Exit, CliError> {
    let filter = pb::ListApprovalsRequest {
        states: args
            .states
            .iter()
            .map(|&s| pb::ApprovalState::from(s).into())
            .collect(),
        agent_id: args.agent_id,
        channel: args.channel,
        session_id: args.session_id,
        tool_name: args.tool,
        ..Default::default()
    };
    let approvals = collect_pages(args.limit, MAX_PAGE_SIZE, |page_size, page_token| {
        let request = pb::ListApprovalsRequest {
            page_size,
            page_token,
            ..filter.clone()
        };
        async move {
            let page = client.list_approvals(request).await?;
            Ok((page.approvals, page.next_page_token))
        }
    })
    .await?;
    match out.format {
        Output::Table => out.write(&render::approvals_table(&approvals))?,
        Output::Json => {
            let items: Vec<Value> = approvals.iter().map(render::approval_json).collect();
            out.json(&Value::Array(items), true)?;
        }
    }
    Ok(Exit::Success)
}

/// Fetches up to `limit` items page by page: `fetch(page_size, page_token)` answers one page
/// and the token of the next (empty on the last).
async fn collect_pages<T, F, Fut>(
    limit: usize,
    max_page: usize,
    mut fetch: F,
) -> Result<Vec<T>, CliError>
where
    F: FnMut(u32, String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), CliError>>,
{
    let mut items = Vec::new();
    let mut page_token = String::new();
    while items.len() < limit {
        let page_size = u32::try_from((limit - items.len()).min(max_page)).unwrap_or(u32::MAX);
        let (page, next) = fetch(page_size, page_token).await?;
        items.extend(page);
        if next.is_empty() {
            break;
        }
        page_token = next;
    }
    items.truncate(limit);
    Ok(items)
}

fn wire_time(at: SystemTime) -> countersign_client::Timestamp {
    let since_epoch = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    countersign_client::Timestamp {
        seconds: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0),
    }
}

async fn events(client: &Client, out: &Printer, args: EventsArgs) -> Result<Exit, CliError> {
    let filter = pb::ListEventsRequest {
        approval_id: args.approval_id,
        kinds: args
            .kinds
            .iter()
            .map(|&k| pb::EventKind::from(k).into())
            .collect(),
        agent_id: args.agent_id,
        decider: args.decider,
        since: args.since.map(wire_time),
        until: args.until.map(wire_time),
        newest_first: args.newest_first,
        ..Default::default()
    };
    let events = collect_pages(args.limit, MAX_ADMIN_PAGE_SIZE, |page_size, page_token| {
        let request = pb::ListEventsRequest {
            page_size,
            page_token,
            ..filter.clone()
        };
        async move {
            let page = client.list_events(request).await?;
            Ok((page.events, page.next_page_token))
        }
    })
    .await?;
    match out.format {
        Output::Table => out.write(&render::audit_events_table(&events))?,
        Output::Json => out.json(
            &Value::Array(events.iter().map(render::audit_event_json).collect()),
            true,
        )?,
    }
    Ok(Exit::Success)
}

async fn policy_report(
    client: &Client,
    out: &Printer,
    args: PolicyReportArgs,
) -> Result<Exit, CliError> {
    let events = approval_events(client, args.since, args.until, args.limit).await?;
    let report = crate::operator::policy_report::summarize(&events);
    match out.format {
        Output::Table => out.write(&crate::operator::policy_report::text(&report))?,
        Output::Json => out.json(&crate::operator::policy_report::json(&report), true)?,
    }
    Ok(Exit::Success)
}

async fn rules_suggest(
    client: &Client,
    out: &Printer,
    args: RulesSuggestArgs,
) -> Result<Exit, CliError> {
    let events = approval_events(client, args.since, None, args.limit).await?;
    let suggestions = crate::operator::rules_suggest::suggest(&events, args.min_approvals);
    if args.accept.is_empty() {
        match out.format {
            Output::Table => out.write(&crate::operator::rules_suggest::text(&suggestions))?,
            Output::Json => out.json(&crate::operator::rules_suggest::json(&suggestions), true)?,
        }
        return Ok(Exit::Success);
    }
    let instance = Instance::locate(args.to.as_deref())?;
    let mut doc = crate::config_file::read(&instance)?;
    let accepted_by = crate::settings::local_user().unwrap_or_else(|| "an unknown user".into());
    let mut names = Vec::new();
    let mut accepted = Vec::new();
    for id in &args.accept {
        let suggestion = suggestions
            .iter()
            .find(|suggestion| suggestion.id() == *id)
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "there is no suggestion {id:?} now (there are {}: {}); the history may have changed it since it was listed: run `countersign rules suggest` again",
                    suggestions.len(),
                    suggestions
                        .iter()
                        .map(crate::operator::rules_suggest::Suggestion::id)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        crate::operator::rules_suggest::accept(
            &mut doc,
            suggestion,
            &accepted_by,
            SystemTime::now(),
        )?;
        names.push(suggestion.rule_name());
        accepted.push(crate::operator::rules_suggest::acceptance(
            suggestion,
            &accepted_by,
        ));
    }
    // On the audit trail before the file: a rule never takes effect unrecorded.
    for acceptance in accepted {
        client.record_rule_accepted(acceptance).await?;
    }
    crate::config_file::write(&instance, &doc)?;
    for name in names {
        out.write(&format!(
            "added rule {name} to {}; restart the server (countersign up) to apply it\n",
            instance.config_file.display()
        ))?;
    }
    Ok(Exit::Success)
}

/// The audit trail's events that carry an approval as it was left (requested, resolved,
/// expired, cancelled, consumed): the newest `limit` of them, oldest first. When older events
/// were left out, says so on stderr (what is read is then not the whole history).
async fn approval_events(
    client: &Client,
    since: Option<SystemTime>,
    until: Option<SystemTime>,
    limit: usize,
) -> Result<Vec<pb::AuditEvent>, CliError> {
    let kinds = [
        pb::EventKind::Requested,
        pb::EventKind::Resolved,
        pb::EventKind::Expired,
        pb::EventKind::Cancelled,
        pb::EventKind::Consumed,
    ];
    let filter = pb::ListEventsRequest {
        kinds: kinds.iter().map(|&k| k.into()).collect(),
        since: since.map(wire_time),
        until: until.map(wire_time),
        newest_first: true,
        ..Default::default()
    };
    // One more than the limit: whether it comes tells whether the limit cut the history.
    let mut events = collect_pages(
        limit.saturating_add(1),
        MAX_ADMIN_PAGE_SIZE,
        |page_size, page_token| {
            let request = pb::ListEventsRequest {
                page_size,
                page_token,
                ..filter.clone()
            };
            async move {
                let page = client.list_events(request).await?;
                Ok((page.events, page.next_page_token))
            }
        },
    )
    .await?;
    if events.len() > limit {
        events.truncate(limit);
        eprintln!(
            "countersign: only the newest {limit} events of the period were read; older ones were left out (raise --limit or narrow --since)"
        );
    }
    events.reverse();
    Ok(events)
}

async fn grants(client: &Client, out: &Printer, args: GrantsListArgs) -> Result<Exit, CliError> {
    let filter = pb::ListGrantsRequest {
        agent_id: args.agent_id,
        session_id: args.session_id,
        tool_name: args.tool,
        include_inactive: args.all,
        ..Default::default()
    };
    let grants = collect_pages(args.limit, MAX_ADMIN_PAGE_SIZE, |page_size, page_token| {
        let request = pb::ListGrantsRequest {
            page_size,
            page_token,
            ..filter.clone()
        };
        async move {
            let page = client.list_grants(request).await?;
            Ok((page.grants, page.next_page_token))
        }
    })
    .await?;
    match out.format {
        Output::Table => out.write(&render::grants_table(&grants))?,
        Output::Json => out.json(
            &Value::Array(grants.iter().map(render::grant_json).collect()),
            true,
        )?,
    }
    Ok(Exit::Success)
}

fn print_delegations(out: &Printer, delegations: &[pb::Delegation]) -> Result<(), CliError> {
    match out.format {
        Output::Table => out.write(&render::delegations_table(delegations))?,
        Output::Json => out.json(
            &Value::Array(delegations.iter().map(render::delegation_json).collect()),
            true,
        )?,
    }
    Ok(())
}

async fn verify_audit(client: &Client, out: &Printer) -> Result<Exit, CliError> {
    let report = client.verify_audit().await?;
    match out.format {
        Output::Table => out.write(&format!("{}\n", render::audit_report_text(&report)))?,
        Output::Json => out.json(&render::audit_report_json(&report), true)?,
    }
    Ok(if report.intact {
        Exit::Success
    } else {
        Exit::AuditBroken
    })
}

async fn watch(client: &Client, out: &Printer, args: WatchArgs) -> Result<Exit, CliError> {
    let mut options = WatchOptions::channel(args.channel);
    options.heartbeat_timeout = args.heartbeat_timeout;
    let mut watch = client.watch(options);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let item = tokio::select! {
            _ = &mut interrupted => return Ok(Exit::Success),
            item = watch.next() => item?,
        };
        match (item, out.format) {
            (WatchItem::Snapshot(pending), Output::Table) => {
                out.write(&render::snapshot_text(&pending))?
            }
            (WatchItem::Snapshot(pending), Output::Json) => {
                out.json(&render::snapshot_json(&pending), false)?
            }
            (WatchItem::Event(event), Output::Table) => {
                out.write(&format!("{}\n", render::event_line(&event)))?
            }
            (WatchItem::Event(event), Output::Json) => {
                out.json(&render::event_json(&event), false)?
            }
        }
    }
}

/// Which version of the arguments a decision is about (edit-on-approve).
#[derive(Default)]
struct Version {
    /// The args digest the decider reviewed; empty: none named.
    expected_digest: String,
    /// Edited arguments to approve instead; empty: none.
    edited_arguments: String,
}

async fn decide(
    client: &Client,
    settings: &Settings,
    out: &Printer,
    args: DecideArgs,
    verdict: pb::Verdict,
    scope: pb::Scope,
    version: Version,
) -> Result<Exit, CliError> {
    let user = settings.decider(args.user.as_deref())?;
    let response = client
        .decide(pb::DecideRequest {
            approval_id: args.id,
            verdict: verdict.into(),
            scope: scope.into(),
            reason: args.reason,
            decider: Some(pb::Decider {
                channel: "cli".into(),
                user_id: user.clone(),
                display_name: user,
            }),
            // Each invocation is a new action; a repeat by the same user is recognised by the
            // server as DUPLICATE anyway.
            idempotency_key: format!("cli-{}", uuid::Uuid::now_v7()),
            edited_arguments_json: version.edited_arguments,
            expected_args_digest: version.expected_digest,
        })
        .await?;
    let outcome = render::decide_outcome(&response);
    let approval = response
        .approval
        .as_ref()
        .ok_or_else(|| CliError::Failure("the server answered without an approval".into()))?;
    match out.format {
        Output::Table => out.write(&format!("{outcome}: {}\n", outcome_text(approval)))?,
        Output::Json => out.json(
            &serde_json::json!({"outcome": outcome, "approval": render::approval_json(approval)}),
            true,
        )?,
    }
    Ok(match response.outcome() {
        pb::DecideOutcome::AlreadyResolved => {
            eprintln!(
                "countersign: the approval was already resolved; this decision was not applied"
            );
            Exit::NotApplied
        }
        pb::DecideOutcome::Unspecified => Exit::Failure,
        _ => Exit::Success,
    })
}
