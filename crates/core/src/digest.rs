//! Canonical JSON and the arguments digest.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings and numbers as serde_json writes them. Written by hand rather than relying on
//! serde_json's map order, which a dependency's `preserve_order` feature could change.

use serde_json::Value;
use sha2::{Digest, Sha256};

pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn args_digest(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_whitespace_do_not_change_the_digest() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(args_digest(&a), args_digest(&b));
    }

    #[test]
    fn different_values_give_different_digests() {
        let a: Value = serde_json::from_str(r#"{"cmd": "ls"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"cmd": "rm"}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"cmd": ["ls"]}"#).unwrap();
        assert_ne!(args_digest(&a), args_digest(&b));
        assert_ne!(args_digest(&a), args_digest(&c));
    }

    #[test]
    fn strings_are_escaped_in_canonical_form() {
        let v: Value = serde_json::from_str(r#"{"k\"ey": "line\nbreak"}"#).unwrap();
        assert_eq!(canonical_json(&v), r#"{"k\"ey":"line\nbreak"}"#);
    }
}
