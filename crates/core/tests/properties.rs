//! Property tests of the domain: the arguments digest, and the approval state machine under
//! random sequences of operations.

use std::collections::BTreeMap;

use countersign_core::canonical::{
    to_canonical_json, to_canonical_json_with_and_without, to_canonical_json_without,
};
use countersign_core::digest::{args_digest, canonical_json};
use countersign_core::validate::{validate_request, Limits, RequestInput};
use countersign_core::{
    Approval, ConsumeOutcome, DecideOutcome, Decider, Decision, Disposition, ResolvedBy, Risk,
    Scope, State, Verdict,
};
use proptest::prelude::*;
use serde_json::Value;

// ---------------------------------------------------------------------------------------
// The arguments digest

/// Any JSON value. Numbers are integers or short decimals, which JSON text carries exactly.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1_000_000i64..1_000_000).prop_map(|eighths| Value::from(eighths as f64 / 8.0)),
        "[a-zA-Z0-9 _\"\\\\/\n\t\u{e9}\u{4e2d}\u{1f600}-]{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_\"\\\\\u{e9} ]{0,6}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Whether two JSON values are the same, numbers compared by their value: an independent
/// statement of what the canonical form must identify.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let exact = |n: &serde_json::Number| {
                n.as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
                    .or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                            .map(|f| f as i128)
                    })
            };
            match (exact(x), exact(y)) {
                (Some(x), Some(y)) => x == y,
                (None, None) => x.as_f64() == y.as_f64(),
                _ => false,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_value(x, y)))
        }
        _ => a == b,
    }
}

/// `value` with every integer that a double holds exactly written as a double (1 -> 1.0).
fn integers_as_doubles(value: &Value) -> Value {
    match value {
        Value::Number(n) => match n.as_i64() {
            Some(i) if i.unsigned_abs() <= 1 << 53 => Value::from(i as f64),
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(integers_as_doubles).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (key.clone(), integers_as_doubles(item)))
                .collect(),
        ),
        _ => value.clone(),
    }
}

/// A tiny deterministic generator, to shuffle keys and pick whitespace from a seed.
struct Scramble(u64);

impl Scramble {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn whitespace(&mut self) -> &'static str {
        const CHOICES: [&str; 6] = ["", "", " ", "\n", "\t", "\r\n    "];
        CHOICES[(self.next() % CHOICES.len() as u64) as usize]
    }
}

/// `value` as JSON text with its object keys in a random order and random whitespace
/// between tokens.
fn scrambled(value: &Value, scramble: &mut Scramble) -> String {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            for i in (1..entries.len()).rev() {
                let j = (scramble.next() % (i as u64 + 1)) as usize;
                entries.swap(i, j);
            }
            let mut out = format!("{{{}", scramble.whitespace());
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&format!(",{}", scramble.whitespace()));
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(scramble.whitespace());
                out.push(':');
                out.push_str(scramble.whitespace());
                out.push_str(&scrambled(item, scramble));
                out.push_str(scramble.whitespace());
            }
            out.push('}');
            out
        }
        Value::Array(items) => {
            let mut out = format!("[{}", scramble.whitespace());
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&format!(
                        "{},{}",
                        scramble.whitespace(),
                        scramble.whitespace()
                    ));
                }
                out.push_str(&scrambled(item, scramble));
            }
            out.push_str(scramble.whitespace());
            out.push(']');
            out
        }
        scalar => scalar.to_string(),
    }
}

/// The digest the server stores for `arguments_json`, through request validation.
fn validated_digest(arguments_json: String) -> String {
    let input = RequestInput {
        agent_id: "agent".into(),
        idempotency_key: "call".into(),
        tool_name: "bash".into(),
        arguments_json,
        risk: Some(Risk::High),
        ..RequestInput::default()
    };
    let limits = Limits {
        max_arguments_bytes: usize::MAX,
        ..Limits::default()
    };
    validate_request(input, &limits)
        .expect("valid request")
        .args_digest
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn digest_ignores_key_order_and_whitespace(value in json_value(), seed in any::<u64>()) {
        let text = scrambled(&value, &mut Scramble(seed | 1));
        let reparsed: Value = serde_json::from_str(&text).expect("scrambled JSON parses");
        prop_assert_eq!(&reparsed, &value);
        prop_assert_eq!(canonical_json(&reparsed), canonical_json(&value));
        prop_assert_eq!(args_digest(&reparsed), args_digest(&value));

        // Through the server's own path: the same arguments object, however written.
        let arguments = serde_json::json!({ "payload": value });
        let written = scrambled(&arguments, &mut Scramble(seed.rotate_left(17) | 1));
        prop_assert_eq!(validated_digest(written), args_digest(&arguments));
    }

    #[test]
    fn strings_and_keys_are_escaped_as_serde_json_escapes_them(text in "(?s)\\PC*|[\\x00-\\x7f]*") {
        // The chain hashes of stored events were made with serde_json's escaping: the same
        // bytes, for every string.
        let escaped = serde_json::to_string(&text).expect("serializes");
        prop_assert_eq!(canonical_json(&Value::String(text.clone())), escaped.clone());
        let object = serde_json::json!({ text: [true, null, -1] });
        prop_assert_eq!(canonical_json(&object), format!("{{{escaped}:[true,null,-1]}}"));
    }

    #[test]
    fn canonical_form_is_compact_and_reads_back(value in json_value()) {
        let canonical = canonical_json(&value);
        let back: Value = serde_json::from_str(&canonical).expect("canonical JSON parses");
        // Already canonical: no whitespace or order left to remove. (A double with an integral
        // value reads back as an integer: the same number.)
        prop_assert_eq!(canonical_json(&back), canonical.clone());
        let compact = serde_json::to_string(&value).expect("serializes");
        prop_assert!(canonical.len() <= compact.len());
    }

    #[test]
    fn different_values_have_different_digests(
        a in json_value(),
        other in json_value(),
        pick in 0u8..3,
    ) {
        // One canonical form, and so one digest, for exactly the values that are the same
        // (equal numbers are one value whether written as integer or double: 1 and 1.0). A
        // third of the pairs are the same value, or the same with integral numbers written as
        // doubles, so both directions are tried.
        let b = match pick {
            0 => a.clone(),
            1 => integers_as_doubles(&a),
            _ => other,
        };
        let same = canonical_json(&a) == canonical_json(&b);
        prop_assert_eq!(same, same_value(&a, &b), "{} / {}", a, b);
        prop_assert_eq!(same, args_digest(&a) == args_digest(&b));
    }

    #[test]
    fn a_changed_leaf_changes_the_digest(value in json_value(), extra in json_value()) {
        let original = serde_json::json!({ "a": value.clone(), "b": [1, 2] });
        let changed = serde_json::json!({ "a": [value, extra], "b": [1, 2] });
        prop_assert_ne!(args_digest(&original), args_digest(&changed));
    }
}

// ---------------------------------------------------------------------------------------
// The approval state machine

#[derive(Debug, Clone)]
enum Op {
    Decide {
        approver: u8,
        channel: u8,
        approve: bool,
        session: bool,
        key: u8,
    },
    Cancel,
    Consume {
        succeeded: bool,
    },
    Expire,
    Advance {
        ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0u8..2, any::<bool>(), any::<bool>(), 0u8..8).prop_map(
            |(approver, channel, approve, session, key)| Op::Decide {
                approver,
                channel,
                approve,
                session,
                key,
            }
        ),
        1 => Just(Op::Cancel),
        2 => any::<bool>().prop_map(|succeeded| Op::Consume { succeeded }),
        1 => Just(Op::Expire),
        2 => (0i64..20_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn new_approval(required: u32, ttl_seconds: u32, with_session: bool) -> Approval {
    let input = RequestInput {
        agent_id: "agent".into(),
        session_id: if with_session {
            "s1".into()
        } else {
            String::new()
        },
        requester: "requester".into(),
        idempotency_key: "call-1".into(),
        tool_name: "bash".into(),
        arguments_json: r#"{"command": "ls"}"#.into(),
        risk: Some(Risk::High),
        required_approvals: required,
        ttl_seconds,
        labels: BTreeMap::new(),
        ..RequestInput::default()
    };
    let request = validate_request(input, &Limits::default()).expect("valid request");
    Approval::new(
        "approval-1".into(),
        request,
        ttl_seconds,
        Disposition::RequireHuman,
        0,
    )
}

fn decision(
    approver: u8,
    channel: u8,
    approve: bool,
    session: bool,
    key: u8,
    now: i64,
) -> Decision {
    let decider = Decider {
        channel: ["telegram", "github"][usize::from(channel)].into(),
        user_id: format!("user-{approver}"),
        display_name: format!("User {approver}"),
    };
    Decision {
        verdict: if approve {
            Verdict::Approve
        } else {
            Verdict::Reject
        },
        scope: if session { Scope::Session } else { Scope::Once },
        reason: String::new(),
        // The same person on both channels counts once.
        approver: format!("person-{approver}"),
        decider,
        idempotency_key: format!("key-{key}"),
        decided_at: now,
        args_digest: String::new(),
        edited_arguments_json: String::new(),
        restarts_count: false,
        delegate: None,
        step_up: None,
    }
}

fn allowed_transition(from: State, to: State) -> bool {
    from == to || from == State::Pending || (from == State::Approved && to == State::Consumed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_keep_the_invariants(
        required in 1u32..4,
        ttl_seconds in 1u32..60,
        with_session in any::<bool>(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut approval = new_approval(required, ttl_seconds, with_session);
        let mut now: i64 = 0;
        let mut consumed_once = false;
        for op in ops {
            let before = approval.clone();
            match op {
                Op::Advance { ms } => now += ms,
                Op::Expire => {
                    let changed = approval.expire_if_due(now);
                    prop_assert_eq!(changed, before.is_pending() && now >= before.expires_at);
                }
                Op::Cancel => {
                    let result = approval.cancel("changed my mind", now);
                    if !before.is_pending() {
                        prop_assert!(result.is_err());
                        prop_assert_eq!(&approval, &before);
                    }
                }
                Op::Consume { succeeded } => {
                    let outcome = if succeeded { ConsumeOutcome::Succeeded } else { ConsumeOutcome::Failed };
                    let result = approval.consume(outcome, "done", now);
                    // Consume only after approval, and only once.
                    prop_assert_eq!(result.is_ok(), before.state == State::Approved);
                    if result.is_ok() {
                        prop_assert!(!consumed_once);
                        consumed_once = true;
                        prop_assert_eq!(approval.state, State::Consumed);
                    } else {
                        prop_assert_eq!(&approval, &before);
                    }
                }
                Op::Decide { approver, channel, approve, session, key } => {
                    let d = decision(approver, channel, approve, session, key, now);
                    match approval.decide(d, None, now) {
                        Ok(effect) => match effect.outcome {
                            DecideOutcome::Resolved => {
                                prop_assert!(before.is_pending());
                                prop_assert!(!approval.is_pending());
                            }
                            DecideOutcome::AlreadyResolved => prop_assert!(!approval.is_pending()),
                            DecideOutcome::Recorded => {
                                prop_assert!(approval.is_pending());
                                prop_assert_eq!(approval.decisions.len(), before.decisions.len() + 1);
                            }
                            DecideOutcome::Duplicate => {
                                prop_assert_eq!(&approval.decisions, &before.decisions);
                                prop_assert_eq!(approval.state, before.state);
                            }
                        },
                        Err(_) => prop_assert_eq!(&approval, &before),
                    }
                }
            }

            // State and resolution agree; the first resolution never changes.
            prop_assert_eq!(approval.is_pending(), approval.resolution.is_none());
            if before.resolution.is_some() {
                prop_assert_eq!(&approval.resolution, &before.resolution);
            }
            prop_assert!(allowed_transition(before.state, approval.state),
                "{:?} -> {:?}", before.state, approval.state);
            // No decision is recorded once resolved.
            if !before.is_pending() {
                prop_assert_eq!(&approval.decisions, &before.decisions);
            }
            // Expired is never approved: an approval resolves as approved only before its deadline.
            if matches!(approval.state, State::Approved | State::Consumed) {
                let resolution = approval.resolution.as_ref().expect("resolved");
                prop_assert!(resolution.resolved_at < approval.expires_at);
                prop_assert_eq!(resolution.resolved_by, ResolvedBy::Decision);
                prop_assert!(approval.approvals_so_far() >= approval.required_approvals as usize);
            }
            if approval.state == State::Expired {
                prop_assert!(approval.decisions.iter().all(|d| d.decided_at < approval.expires_at));
            }
            if approval.state == State::Consumed {
                prop_assert!(approval.consumption.is_some());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Canonical JSON written from the types (the server's chain hashes of new events)

/// Every shape serde gives a type: enum variants of each kind, options, tuples, floats (the
/// non-finite ones too), maps with integer keys, a flattened map.
#[derive(Debug, serde::Serialize)]
struct Shapes {
    unit: Shape,
    newtype: Shape,
    tuple: Shape,
    record: Shape,
    maybe: Option<f64>,
    float: f64,
    small: f32,
    pair: (i64, String),
    by_number: BTreeMap<u32, bool>,
    wrapped: Wrapped,
    #[serde(skip_serializing_if = "String::is_empty")]
    skipped: String,
    #[serde(flatten)]
    flattened: BTreeMap<String, Value>,
}

#[derive(Debug, serde::Serialize)]
enum Shape {
    Unit,
    Newtype(String),
    Tuple(u8, Option<String>),
    Record { text: String, value: Value },
}

#[derive(Debug, serde::Serialize)]
struct Wrapped(char);

/// An event body as the server writes it: its keys in another order than sorted.
#[derive(serde::Serialize)]
struct StoredLike<'a> {
    detail: &'a str,
    approval: &'a Approval,
}

/// A key written twice (through `flatten`): the second value is the one kept.
#[derive(serde::Serialize)]
struct Repeated {
    x: Value,
    #[serde(flatten)]
    again: BTreeMap<String, Value>,
}

/// Strings that need every kind of escape, and none.
fn text() -> impl Strategy<Value = String> {
    "(?s)\\PC{0,12}|[\\x00-\\x7f]{0,12}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn canonical_json_from_the_types_is_canonical_json_of_their_value(
        value in json_value(),
        reason in text(),
        labels in prop::collection::btree_map(text(), text(), 0..4),
        decided in any::<bool>(),
        float in any::<f64>(),
        small in any::<f32>(),
        number in any::<i64>(),
        key in any::<u32>(),
        letter in any::<char>(),
        extra in prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3),
    ) {
        // Any JSON value, through its own Serialize.
        prop_assert_eq!(to_canonical_json(&value).expect("serializes"), canonical_json(&value));

        // An approval as the server stores it in a REQUESTED event.
        let mut approval = new_approval(1, 60, decided);
        approval.reason = reason.clone();
        approval.labels = labels;
        approval.arguments_json = value.to_string();
        if decided {
            let _ = approval.decide(decision(0, 0, true, false, 0, 1), None, 1);
        }
        let as_value = serde_json::to_value(&approval).expect("serializes");
        prop_assert_eq!(to_canonical_json(&approval).expect("serializes"), canonical_json(&as_value));

        // Leaving out an entry is removing it from the value first.
        let body = serde_json::json!({ "approval": approval, "detail": reason.clone() });
        let mut removed = body.clone();
        if let Some(object) = removed["approval"].as_object_mut() {
            object.remove("arguments_json");
        }
        prop_assert_eq!(
            to_canonical_json_without(&body, &["approval", "arguments_json"]).expect("serializes"),
            canonical_json(&removed)
        );
        // Both at once: the full text, and the same without the entry.
        let path = ["approval", "arguments_json"];
        prop_assert_eq!(
            to_canonical_json_with_and_without(&body, &path).expect("serializes"),
            (canonical_json(&body), canonical_json(&removed))
        );
        // Written from the types, the approval's fields reordered around the entry; the entry
        // first, last or alone in its object; a path that names nothing; a key repeated (the
        // last value kept, the entry only in the first).
        let typed = StoredLike { approval: &approval, detail: &reason };
        prop_assert_eq!(
            to_canonical_json_with_and_without(&typed, &path).expect("serializes"),
            (canonical_json(&body), canonical_json(&removed))
        );
        for (key, object) in [
            ("a", serde_json::json!({"a": reason.clone(), "b": 1})),
            ("b", serde_json::json!({"a": 1, "b": reason.clone()})),
            ("a", serde_json::json!({"a": reason.clone()})),
            ("zz", serde_json::json!({"a": 1})),
        ] {
            let outer = serde_json::json!({"x": object, "y": [1]});
            let mut cut = outer.clone();
            if let Some(object) = cut["x"].as_object_mut() {
                object.remove(key);
            }
            prop_assert_eq!(
                to_canonical_json_with_and_without(&outer, &["x", key]).expect("serializes"),
                (canonical_json(&outer), canonical_json(&cut))
            );
        }
        let repeated = Repeated {
            x: serde_json::json!({"a": reason.clone(), "b": 2}),
            again: BTreeMap::from([("x".to_owned(), serde_json::json!({"b": 3}))]),
        };
        let as_value = serde_json::to_value(&repeated).expect("serializes");
        prop_assert_eq!(
            to_canonical_json_with_and_without(&repeated, &["x", "a"]).expect("serializes"),
            (canonical_json(&as_value), canonical_json(&as_value))
        );

        let shapes = Shapes {
            unit: Shape::Unit,
            newtype: Shape::Newtype(reason.clone()),
            tuple: Shape::Tuple(7, decided.then(|| reason.clone())),
            record: Shape::Record { text: reason.clone(), value: value.clone() },
            maybe: decided.then_some(float),
            float,
            small,
            pair: (number, reason),
            by_number: BTreeMap::from([(key, decided), (key / 2, !decided)]),
            wrapped: Wrapped(letter),
            skipped: String::new(),
            flattened: extra,
        };
        let as_value = serde_json::to_value(&shapes).expect("serializes");
        prop_assert_eq!(to_canonical_json(&shapes).expect("serializes"), canonical_json(&as_value));
    }
}
