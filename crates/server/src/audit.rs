//! The tamper-evident audit trail: a SHA-256 hash chain over the event log.
//!
//! Every row of `events` stores `prev_hash` (the hash of the row before it; empty for the first
//! row ever written) and `hash` = SHA-256 over `prev_hash`, a newline and the row's canonical
//! content: the canonical JSON of its seq, approval id, kind, time and body, where the body
//! leaves out the approval's argument values. The approval's `args_digest` stands for them, so
//! redacting arguments keeps every hash valid; verification checks instead that arguments still
//! present match their digest. Editing, removing or reordering a row breaks the chain at that
//! row.

use countersign_core::digest::{args_digest, canonical_json, sha256_hex};
use serde_json::Value;

/// One stored row, as verification reads it.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub seq: i64,
    pub approval_id: String,
    pub kind: String,
    pub at_ms: i64,
    pub body: String,
    pub columns: Columns,
    pub prev_hash: Option<String>,
    pub hash: Option<String>,
}

/// The columns `events` keeps beside the body so that the history can be filtered; they are
/// derived from the body, and verification checks that they still are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Columns {
    pub agent_id: String,
    /// `channel:user_id` of the decision's decider; empty when the event has no decision.
    pub decider: String,
    /// The approver the decision counted for; empty when the event has no decision.
    pub approver: String,
}

impl Columns {
    pub fn of(body: &Value) -> Columns {
        let text = |pointer: &str| {
            body.pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let decider = match (
            body.pointer("/decision/decider/channel")
                .and_then(Value::as_str),
            body.pointer("/decision/decider/user_id")
                .and_then(Value::as_str),
        ) {
            (Some(channel), Some(user_id)) => format!("{channel}:{user_id}"),
            _ => String::new(),
        };
        // A REQUESTED event (and every event before migration 0007) has the approval; a
        // later lean event has its progress.
        let agent_id = match text("/approval/agent_id") {
            id if id.is_empty() => text("/after/agent_id"),
            id => id,
        };
        Columns {
            agent_id,
            decider,
            approver: text("/decision/approver"),
        }
    }
}

/// The hash of a row: over the previous row's hash and the row's canonical content. `body` is
/// given back as it came (the arguments are set aside while hashing, not cloned).
pub fn chain_hash(
    prev_hash: &str,
    seq: i64,
    approval_id: &str,
    kind: &str,
    at_ms: i64,
    body: &mut Value,
) -> String {
    chain_hash_at(
        prev_hash,
        &content_before_seq(approval_id, kind, at_ms, body),
        seq,
    )
}

/// Where a body keeps the argument values its hash leaves out: the approval's
/// `arguments_json` (its `args_digest` stands for them).
pub const ARGUMENT_VALUES: [&str; 2] = ["approval", "arguments_json"];

/// A row's canonical content up to its seq, the last key: everything of its hash that does
/// not depend on its place in the chain, so it can be made before the row has one. `body` is
/// given back as it came.
pub fn content_before_seq(approval_id: &str, kind: &str, at_ms: i64, body: &mut Value) -> String {
    let [outer, inner] = ARGUMENT_VALUES;
    let approval = body.get_mut(outer).and_then(Value::as_object_mut);
    let set_aside = approval.and_then(|approval| approval.remove(inner));
    let content = content_before_seq_of(approval_id, kind, at_ms, &canonical_json(body));
    if let (Some(arguments), Some(approval)) = (
        set_aside,
        body.get_mut(outer).and_then(Value::as_object_mut),
    ) {
        approval.insert(inner.into(), arguments);
    }
    content
}

/// [`content_before_seq`] from the canonical JSON of the body without its argument values
/// ([`ARGUMENT_VALUES`]).
pub fn content_before_seq_of(
    approval_id: &str,
    kind: &str,
    at_ms: i64,
    hashed_body: &str,
) -> String {
    // Keys in byte order, as canonical JSON has them.
    format!(
        "{{\"approval_id\":{},\"at_ms\":{at_ms},\"body\":{hashed_body},\"kind\":{},\"seq\":",
        Value::from(approval_id),
        Value::from(kind),
    )
}

/// The hash of the row at `seq` after `prev_hash`, from its [`content_before_seq`].
pub fn chain_hash_at(prev_hash: &str, before_seq: &str, seq: i64) -> String {
    sha256_hex(format!("{prev_hash}\n{before_seq}{seq}}}").as_bytes())
}

/// The outcome of a verification.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    pub events_checked: u64,
    pub first_seq: i64,
    pub last_seq: i64,
    /// The first row that does not verify, and what is wrong with it.
    pub broken: Option<(i64, String)>,
}

/// Checks rows in seq order; stops at the first broken one.
#[derive(Debug, Default)]
pub struct Verifier {
    previous: Option<(i64, String)>,
    report: AuditReport,
}

impl Verifier {
    /// Checks the next row. Returns false once a row is broken (later rows are not checked).
    pub fn check(&mut self, row: EventRow) -> bool {
        if self.report.broken.is_some() {
            return false;
        }
        if self.report.events_checked == 0 {
            self.report.first_seq = row.seq;
        }
        self.report.events_checked += 1;
        self.report.last_seq = row.seq;
        match self.problem(&row) {
            Some(problem) => {
                self.report.broken = Some((row.seq, problem));
                false
            }
            None => {
                self.previous = row.hash.map(|hash| (row.seq, hash));
                true
            }
        }
    }

    pub fn finish(self) -> AuditReport {
        self.report
    }

    fn problem(&self, row: &EventRow) -> Option<String> {
        let (Some(prev_hash), Some(hash)) = (&row.prev_hash, &row.hash) else {
            return Some("the row has no hash".into());
        };
        match &self.previous {
            Some((previous_seq, _)) if row.seq != previous_seq + 1 => {
                return Some(format!(
                    "rows {} to {} are missing",
                    previous_seq + 1,
                    row.seq - 1
                ));
            }
            Some((previous_seq, previous_hash)) if prev_hash != previous_hash => {
                return Some(format!(
                    "prev_hash is not the hash of row {previous_seq}: a row was edited or replaced"
                ));
            }
            // The first row ever written starts the chain; a later first row (older ones were
            // pruned by retention) is taken as the anchor.
            None if row.seq == 1 && !prev_hash.is_empty() => {
                return Some("the first row must have an empty prev_hash".into());
            }
            _ => {}
        }
        let mut body: Value = match serde_json::from_str(&row.body) {
            Ok(body) => body,
            Err(e) => return Some(format!("the body is not valid JSON: {e}")),
        };
        let expected = chain_hash(
            prev_hash,
            row.seq,
            &row.approval_id,
            &row.kind,
            row.at_ms,
            &mut body,
        );
        if &expected != hash {
            return Some("the row's content does not match its hash: the row was edited".into());
        }
        if let Some(problem) = arguments_problem(&body) {
            return Some(problem);
        }
        if Columns::of(&body) != row.columns {
            return Some(
                "agent_id, decider or approver differ from the event they index: the row was edited"
                    .into(),
            );
        }
        None
    }
}

impl Verifier {
    /// Checks an approval's row against its REQUESTED event, whose content the chain covers:
    /// the row must serve the digest that was requested, and arguments that match it. (Events
    /// since migration 0007 do not repeat the arguments; the row holds them.) A problem is
    /// reported at the REQUESTED event's seq. Returns false once anything is broken.
    pub fn check_approval(&mut self, requested_seq: i64, approval: &str, requested: &str) -> bool {
        if self.report.broken.is_some() {
            return false;
        }
        let problem = match (
            serde_json::from_str::<Value>(approval),
            serde_json::from_str::<Value>(requested),
        ) {
            (Ok(approval), Ok(requested)) => {
                let digest = |body: &Value, pointer: &str| {
                    body.pointer(pointer)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                let wrapped = serde_json::json!({ "approval": approval });
                if digest(&approval, "/args_digest") != digest(&requested, "/approval/args_digest")
                {
                    Some(format!(
                        "approval {}: its args_digest differs from the one requested: the approval's row was edited",
                        digest(&approval, "/id").unwrap_or_default()
                    ))
                } else {
                    arguments_problem(&wrapped)
                        .map(|problem| {
                            problem.replace("the row was edited", "the approval's row was edited")
                        })
                        .or_else(|| edits_problem(&approval))
                }
            }
            _ => Some("an approval's row or its REQUESTED event is not valid JSON".into()),
        };
        match problem {
            Some(problem) => {
                self.report.broken = Some((requested_seq, problem));
                false
            }
            None => true,
        }
    }
}

/// Edited arguments still stored in an approval's row (the edit and the decisions that made
/// each version) must be the ones their digest, which the chained events carry, was made of.
fn edits_problem(approval: &Value) -> Option<String> {
    let id = approval
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let decisions = approval
        .get("decisions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let versions = decisions
        .map(|decision| (decision, "/edited_arguments_json"))
        .chain(approval.get("edit").map(|edit| (edit, "/arguments_json")));
    for (holder, pointer) in versions {
        let Some(text) = holder
            .pointer(pointer)
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
        else {
            continue;
        };
        let digest = holder
            .get("args_digest")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match serde_json::from_str::<Value>(text) {
            Ok(parsed) if args_digest(&parsed) == digest => {}
            _ => {
                return Some(format!(
                    "approval {id}: edited arguments do not match their args_digest: the approval's row was edited"
                ))
            }
        }
    }
    None
}

/// Arguments still stored must be the ones the digest (which the hash covers) was made of.
fn arguments_problem(body: &Value) -> Option<String> {
    let arguments = body
        .pointer("/approval/arguments_json")
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())?;
    let digest = body
        .pointer("/approval/args_digest")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match serde_json::from_str::<Value>(arguments) {
        Ok(parsed) if args_digest(&parsed) == digest => None,
        _ => Some("the arguments do not match args_digest: the row was edited".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(seq: i64, prev_hash: &str, body: Value) -> EventRow {
        let mut hashed = body.clone();
        let hash = chain_hash(prev_hash, seq, "a1", "REQUESTED", 5, &mut hashed);
        assert_eq!(hashed, body, "hashing gives the body back unchanged");
        EventRow {
            seq,
            approval_id: "a1".into(),
            kind: "REQUESTED".into(),
            at_ms: 5,
            columns: Columns::of(&body),
            body: body.to_string(),
            prev_hash: Some(prev_hash.into()),
            hash: Some(hash),
        }
    }

    fn body(arguments: &str) -> Value {
        let digest = if arguments.is_empty() {
            args_digest(&json!({"cmd": "ls"}))
        } else {
            args_digest(&serde_json::from_str(arguments).unwrap())
        };
        json!({"approval": {"agent_id": "ag", "arguments_json": arguments, "args_digest": digest}})
    }

    fn chain() -> Vec<EventRow> {
        let first = row(1, "", body(r#"{"cmd":"ls"}"#));
        let second = row(2, first.hash.as_deref().unwrap(), body(r#"{"cmd":"ls"}"#));
        let third = row(3, second.hash.as_deref().unwrap(), body(r#"{"cmd":"ls"}"#));
        vec![first, second, third]
    }

    fn verify(rows: Vec<EventRow>) -> AuditReport {
        let mut verifier = Verifier::default();
        for row in rows {
            verifier.check(row);
        }
        verifier.finish()
    }

    #[test]
    fn an_intact_chain_verifies_also_with_redacted_arguments() {
        let report = verify(chain());
        assert_eq!(report.broken, None);
        assert_eq!(
            (report.first_seq, report.last_seq, report.events_checked),
            (1, 3, 3)
        );
        let mut redacted = chain();
        redacted[1].body = body("").to_string();
        assert_eq!(verify(redacted).broken, None);
    }

    #[test]
    fn edits_removals_and_bad_arguments_name_the_row() {
        let mut edited = chain();
        edited[1].kind = "RESOLVED".into();
        assert_eq!(verify(edited).broken.unwrap().0, 2);

        let mut removed = chain();
        removed.remove(1);
        let (seq, problem) = verify(removed).broken.unwrap();
        assert_eq!(seq, 3);
        assert!(problem.contains("missing"), "{problem}");

        let mut arguments = chain();
        arguments[0].body = body(r#"{"cmd":"ls"}"#)
            .to_string()
            .replace(r#"\"ls\""#, r#"\"rm\""#);
        let (seq, problem) = verify(arguments).broken.unwrap();
        assert_eq!(seq, 1);
        assert!(problem.contains("args_digest"), "{problem}");

        let mut reindexed = chain();
        reindexed[2].columns.agent_id = "someone-else".into();
        assert_eq!(verify(reindexed).broken.unwrap().0, 3);
    }

    #[test]
    fn a_pruned_chain_starts_at_its_oldest_row() {
        let mut pruned = chain();
        pruned.remove(0);
        assert_eq!(verify(pruned).broken, None);
    }
}
