//! `countersign approve ID --edit`: the approver edits the arguments in their own editor
//! ($VISUAL, else $EDITOR) before approving them.

use std::io::Write as _;

use countersign_client::{pb, version};
use serde_json::Value;

use crate::exit::CliError;

/// What the approver settled on in the editor.
pub struct Edited {
    /// The version they were shown (their approval is refused if it changed meanwhile).
    pub seen_digest: String,
    /// The edited arguments; `None`: saved unchanged, an approval of the version shown.
    pub arguments: Option<String>,
}

/// Opens the editor on the current arguments of `approval`, pretty-printed, and reads back
/// what was saved. Nothing is sent from here: an error decides nothing.
pub fn edit_arguments(approval: &pb::Approval) -> Result<Edited, CliError> {
    let (current, digest) = version::current_arguments(approval);
    if current.is_empty() {
        return Err(CliError::Failure(format!(
            "approval {} has no stored arguments to edit (the server redacts them); nothing was decided",
            approval.id
        )));
    }
    let shown = match serde_json::from_str::<Value>(current) {
        Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_else(|_| current.to_owned()),
        Err(_) => current.to_owned(),
    };
    let mut file = tempfile::Builder::new()
        .prefix("countersign-arguments-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| CliError::Failure(format!("cannot create a file to edit: {e}")))?;
    writeln!(file, "{shown}")
        .and_then(|()| file.flush())
        .map_err(|e| CliError::Failure(format!("cannot write the file to edit: {e}")))?;
    run_editor(file.path())?;
    let saved = std::fs::read_to_string(file.path())
        .map_err(|e| CliError::Failure(format!("cannot read the edited file: {e}")))?;
    let saved = saved.trim();
    if saved.is_empty() {
        return Err(CliError::Usage(
            "the edited arguments are empty; nothing was decided".into(),
        ));
    }
    // Compared as text: anything else goes to the server, whose strict parser decides what it
    // means (an edit equal to the current version is an approval of that version).
    let unchanged = saved == shown.trim();
    Ok(Edited {
        seen_digest: digest.to_owned(),
        arguments: (!unchanged).then(|| saved.to_owned()),
    })
}

/// Runs `$VISUAL` (else `$EDITOR`, else `vi`) on `path` and waits for it. The variable may
/// hold arguments (`code --wait`), split on whitespace.
fn run_editor(path: &std::path::Path) -> Result<(), CliError> {
    let configured = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "vi".to_owned());
    let mut words = configured.split_whitespace();
    let program = words.next().unwrap_or("vi");
    let status = std::process::Command::new(program)
        .args(words)
        .arg(path)
        .status()
        .map_err(|e| {
            CliError::Failure(format!(
                "cannot start the editor {program:?} (set VISUAL or EDITOR): {e}; nothing was decided"
            ))
        })?;
    if !status.success() {
        return Err(CliError::Failure(format!(
            "the editor {program:?} exited with {status}; nothing was decided"
        )));
    }
    Ok(())
}
