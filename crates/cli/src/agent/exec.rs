//! `exec`: run a command only once a human approved it, then report how it went.

use std::process::ExitStatus;

use countersign_client::gate::{truncate, MAX_ACTION_CHARS};
use countersign_client::{pb, receipts, version, Client};
use serde_json::json;

use crate::agent::waiting::{
    approval_request, await_decision, outcome_text, request_to_wait, verdict_exit,
};
use crate::args::ExecArgs;
use crate::exit::{CliError, Exit};
use crate::settings::Settings;

/// Requests approval to run `args.command`, waits, and runs it only when approved. Returns the
/// command's exit status, or the code saying why it did not run.
pub async fn exec(client: &Client, settings: &Settings, args: ExecArgs) -> Result<i32, CliError> {
    let cwd = std::env::current_dir().map_err(|error| {
        CliError::Failure(format!("cannot determine the working directory: {error}"))
    })?;
    let arguments = json!({"argv": args.command, "cwd": cwd.to_string_lossy()}).to_string();
    let action = truncate(
        &format!("run: {}", shell_join(&args.command)),
        MAX_ACTION_CHARS,
    );
    let requested_digest = receipts::digest_of(&arguments)?;
    let request = approval_request(settings, &args.call, args.tool, arguments, action)?;
    let approval = request_to_wait(client, request, args.timeout).await?;
    let approval = await_decision(client, approval, args.timeout).await?;
    match approval.state() {
        pb::ApprovalState::Approved => {
            // Run only what the server signed: this approval, these arguments.
            let digest = receipts::digest_to_run(&approval, &requested_digest)?;
            if let Err(error) = client.verify_receipt(&approval, &digest).await {
                eprintln!("countersign: not running the command: {error}");
                return Ok(Exit::Failure.code());
            }
            run_approved(client, &approval, &args.command).await
        }
        pb::ApprovalState::Pending => {
            eprintln!(
                "countersign: no decision on approval {} in time; cancelling it, not running the command",
                approval.id
            );
            // Nobody should approve a command that will not run. Best effort: the approval
            // expires anyway.
            if let Err(error) = client
                .cancel_approval(&approval.id, "countersign exec stopped waiting")
                .await
            {
                eprintln!(
                    "countersign: could not cancel approval {}: {error}",
                    approval.id
                );
            }
            Ok(Exit::TimedOut.code())
        }
        pb::ApprovalState::Consumed => {
            eprintln!(
                "countersign: not running the command: {} (already executed once)",
                outcome_text(&approval)
            );
            Ok(Exit::Failure.code())
        }
        _ => {
            eprintln!(
                "countersign: not running the command: {}",
                outcome_text(&approval)
            );
            Ok(verdict_exit(&approval).code())
        }
    }
}

/// Runs the approved command: as asked, or as an approver edited it.
async fn run_approved(
    client: &Client,
    approval: &pb::Approval,
    command: &[String],
) -> Result<i32, CliError> {
    match approved_command(approval) {
        Ok(Some((argv, cwd))) => run(client, approval, &argv, Some(&cwd)).await,
        Ok(None) => run(client, approval, command, None).await,
        Err(problem) => {
            eprintln!("countersign: not running the command: {problem}");
            Ok(Exit::Failure.code())
        }
    }
}

/// The command an approver approved in place of the one asked about (edit-on-approve), with
/// its working directory; `None` when the call was approved as asked. A command that cannot
/// be run as edited is refused: running the original would run what nobody approved.
fn approved_command(approval: &pb::Approval) -> Result<Option<(Vec<String>, String)>, String> {
    if !version::is_edited(approval) {
        return Ok(None);
    }
    let editor = version::editor_name(approval).unwrap_or_default();
    let edited = version::edited_input(approval).ok_or_else(|| {
        format!("the approved arguments, edited by {editor}, are not available (redacted)")
    })?;
    let argv: Option<Vec<String>> = edited["argv"].as_array().and_then(|argv| {
        argv.iter()
            .map(|word| word.as_str().map(str::to_owned))
            .collect()
    });
    match (argv, edited["cwd"].as_str()) {
        (Some(argv), Some(cwd)) if !argv.is_empty() => {
            eprintln!(
                "countersign: {editor} edited the command: running `{}` in {cwd}",
                shell_join(&argv)
            );
            Ok(Some((argv, cwd.to_owned())))
        }
        _ => Err(format!(
            "{editor} approved arguments without a command to run ({{\"argv\": [...], \"cwd\": ...}} expected)"
        )),
    }
}

/// Runs the approved command (in `cwd` when given, else here) with the terminal's stdio,
/// then consumes the approval with the outcome and the digest of the version it ran.
async fn run(
    client: &Client,
    approval: &pb::Approval,
    argv: &[String],
    cwd: Option<&str>,
) -> Result<i32, CliError> {
    let (program, program_args) = argv
        .split_first()
        .ok_or_else(|| CliError::Usage("no command given".into()))?;
    eprintln!(
        "countersign: {}; running the command",
        outcome_text(approval)
    );
    // Ctrl-C reaches the command too (same process group): stay alive to report its outcome.
    let _held = hold_interrupts();
    let mut command = tokio::process::Command::new(program);
    command.args(program_args);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let (code, outcome, detail) = match command.status().await {
        Ok(status) => {
            let outcome = if status.success() {
                pb::ConsumeOutcome::Succeeded
            } else {
                pb::ConsumeOutcome::Failed
            };
            (status_code(status), outcome, describe(status))
        }
        Err(error) => {
            eprintln!("countersign: cannot run {program}: {error}");
            let exit = if error.kind() == std::io::ErrorKind::NotFound {
                Exit::CommandNotFound
            } else {
                Exit::CannotExecute
            };
            (
                exit.code(),
                pb::ConsumeOutcome::Failed,
                format!("could not start: {error}"),
            )
        }
    };
    let ran = version::current_arguments(approval).1;
    if let Err(error) = client
        .consume_ran(&approval.id, ran, outcome, &detail)
        .await
    {
        eprintln!(
            "countersign: warning: could not record the outcome on approval {}: {error}",
            approval.id
        );
    }
    Ok(code)
}

/// While alive, SIGINT does not end this process (it is queued and never read).
#[cfg(unix)]
fn hold_interrupts() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok()
}

#[cfg(not(unix))]
fn hold_interrupts() {}

/// The exit code a shell would report: the status, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    Exit::Failure.code()
}

fn describe(status: ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => format!("terminated: {status}"),
    }
}

/// The argv as a shell would read it back, quoting where needed.
pub(crate) fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c));
            if plain {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_quotes_arguments_a_shell_would_split() {
        let argv: Vec<String> = ["rm", "-rf", "my dir", "it's", ""]
            .map(String::from)
            .to_vec();
        assert_eq!(shell_join(&argv), r"rm -rf 'my dir' 'it'\''s' ''");
    }
}
