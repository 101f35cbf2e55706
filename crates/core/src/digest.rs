//! Arguments with one meaning: strict parsing, canonical JSON and the arguments digest.
//!
//! Parsing refuses what different JSON parsers read differently: an object with the same key
//! twice (many parsers keep the first value, serde_json the last) and an integer that does
//! not fit in 64 bits (one parser keeps it exact, another rounds it to a double). Numbers
//! with a fraction or an exponent are IEEE doubles, as every mainstream JSON parser reads them.
//!
//! Canonical form (RFC 8785, JCS, with two stated differences): no insignificant whitespace;
//! object keys sorted by Unicode code point (JCS sorts by UTF-16 code unit: the orders differ
//! only between a key character above U+FFFF and one in U+E000..U+FFFF); strings escaped as
//! JCS does (`\"`, `\\`, `\b \f \n \r \t`, other controls as lowercase `\u00xx`, everything
//! else as itself); integers that fit in 64 bits written exactly (JCS would round those beyond
//! 2^53 to a double); other numbers in ECMAScript's shortest form (`1e+21`, `0.002`, `100`),
//! `-0` as `0`. Written by hand rather than relying on serde_json's map order, which a
//! dependency's `preserve_order` feature could change.

use std::fmt;
use std::fmt::Write as _;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// Why an arguments text has no single meaning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StrictJsonError(String);

/// Parses `text` as JSON, refusing duplicate keys (naming the key's JSON pointer) and numbers
/// that cannot be held exactly (integers beyond 64 bits, numbers beyond the double range).
pub fn parse_strict(text: &str) -> Result<Value, StrictJsonError> {
    check_number_literals(text)?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Strict {
        path: String::new(),
    }
    .deserialize(&mut deserializer)
    .map_err(|e| StrictJsonError(e.to_string()))?;
    deserializer
        .end()
        .map_err(|e| StrictJsonError(e.to_string()))?;
    Ok(value)
}

/// Checks every number literal outside strings: an integer must fit in i64 or u64, any other
/// number must be a finite double.
fn check_number_literals(text: &str) -> Result<(), StrictJsonError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                check_number(&text[start..i])?;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn check_number(literal: &str) -> Result<(), StrictJsonError> {
    let integer = !literal.contains(['.', 'e', 'E']);
    let exact = if integer {
        literal.parse::<i64>().is_ok() || literal.parse::<u64>().is_ok()
    } else {
        literal.parse::<f64>().is_ok_and(f64::is_finite)
    };
    if exact {
        Ok(())
    } else if integer {
        Err(StrictJsonError(format!(
            "the integer {literal} does not fit in 64 bits; send it as a string"
        )))
    } else {
        Err(StrictJsonError(format!(
            "the number {literal} is beyond the range of a double; send it as a string"
        )))
    }
}

/// Builds a `Value`, refusing a key seen twice in one object. `path` is the JSON pointer of
/// the value being read.
struct Strict {
    path: String,
}

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{}: a number must be finite", self.path)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict {
            path: format!("{}/{}", self.path, items.len()),
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = format!("{}/{}", self.path, pointer_token(&key));
            if object.contains_key(&key) {
                return Err(A::Error::custom(format!(
                    "the key {path} appears twice; parsers disagree on which value counts"
                )));
            }
            let value = map.next_value_seed(Strict { path })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A key as an RFC 6901 pointer token.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

// Written straight into `out`: the chain hash of every event is made from this, on the
// calls' threads, so no key or number gets a string of its own.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // UTF-8 byte order is code point order.
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
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
        Value::Number(number) => {
            // Writing into a String cannot fail.
            let _ = match (number.as_i64(), number.as_u64(), number.as_f64()) {
                (Some(i), _, _) => write!(out, "{i}"),
                (_, Some(u), _) => write!(out, "{u}"),
                (_, _, Some(f)) => out.write_str(&ecmascript_number(f)),
                _ => write!(out, "{number}"),
            };
        }
        Value::String(text) => write_string(text, out),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Null => out.push_str("null"),
    }
}

/// A JSON string as JCS escapes it (see the module's comment).
pub(crate) fn write_string(text: &str, out: &mut String) {
    out.push('"');
    let mut plain = 0;
    for (at, byte) in text.bytes().enumerate() {
        let short = match byte {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x00..=0x1f => None,
            _ => continue,
        };
        // Escaped bytes are ASCII, so `at` is a character boundary.
        out.push_str(&text[plain..at]);
        match short {
            Some(escape) => out.push_str(escape),
            None => {
                let _ = write!(out, "\\u{byte:04x}");
            }
        }
        plain = at + 1;
    }
    out.push_str(&text[plain..]);
    out.push('"');
}

/// ECMAScript's `Number.prototype.toString` of a finite double (RFC 8785, 3.2.2.3).
pub(crate) fn ecmascript_number(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if value < 0.0 {
        return format!("-{}", ecmascript_number(-value));
    }
    // Rust's `{:e}` writes the shortest digits that read back as `value`: "d.ddde±x".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i32;
    // The decimal point sits after `n` digits.
    let n = exponent + 1;
    if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let sign = if n > 0 { '+' } else { '-' };
        let fraction = if k > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        format!("{}{fraction}e{sign}{}", &digits[..1], (n - 1).abs())
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

    fn parse(text: &str) -> Value {
        parse_strict(text).unwrap()
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_digest() {
        let a = parse(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#);
        let b = parse(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(args_digest(&a), args_digest(&b));
    }

    #[test]
    fn different_values_give_different_digests() {
        let a = parse(r#"{"cmd": "ls"}"#);
        let b = parse(r#"{"cmd": "rm"}"#);
        let c = parse(r#"{"cmd": ["ls"]}"#);
        assert_ne!(args_digest(&a), args_digest(&b));
        assert_ne!(args_digest(&a), args_digest(&c));
    }

    /// Vectors computed independently of this code: the first is RFC 8785's own example
    /// (section 3.2.2, input and output as published). The canonical texts and SHA-256
    /// digests of all were produced by a one-off Python 3 script: `json.loads` the input,
    /// serialize objects with keys in `sorted()` order and strings, integers, `null` and
    /// booleans with `json.dumps(v, ensure_ascii=False)`, doubles by rewriting Python's
    /// shortest `repr()` digits into ECMAScript's number format, then
    /// `hashlib.sha256(out.encode()).hexdigest()`.
    const VECTORS: [(&str, &str, &str); 5] = [
        (
            r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}"#,
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#,
            "2d5e01a318d0f0879ab568c4be289c8b1f64ef8921a53c6277d5e069978baacb",
        ),
        (
            r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#,
            r#"{"a":{"x":"s","y":[1,2]},"b":1}"#,
            "0d1dbd3b30eaebbff7eaaff9c3f5bfb754d82a189175edb050d9006def74ca09",
        ),
        (
            r#"{"cmd":"rm -rf /","cwd":"/srv","n":-9223372036854775808,"u":18446744073709551615}"#,
            r#"{"cmd":"rm -rf /","cwd":"/srv","n":-9223372036854775808,"u":18446744073709551615}"#,
            "c9bf1c3a42b9692caac31618002375bbb3deb09ff841de2075945dd7ed17b9ba",
        ),
        (
            r#"{"\u00e9":1,"e":2,"\ud83d\ude00":3,"\uffff":4,"z\u0000":"\u001f\u007f"}"#,
            "{\"e\":2,\"z\\u0000\":\"\\u001f\u{7f}\",\"é\":1,\"\u{ffff}\":4,\"😀\":3}",
            "6704bff73b97dd8e6aa07be33096d05d293583900b675c79560d66afd85f1729",
        ),
        (
            r#"{"f":[100.0,1e21,1e-7,-0.0,0.1,1.5e-6,1.2345678901234568e20]}"#,
            r#"{"f":[100,1e+21,1e-7,0,0.1,0.0000015,123456789012345680000]}"#,
            "70d4b779ed48599f9d2ea676d587fd691153a7accfd9786a61a29596872f99d7",
        ),
    ];

    #[test]
    fn canonical_form_and_digest_match_independent_vectors() {
        for (input, canonical, digest) in VECTORS {
            let value = parse(input);
            assert_eq!(canonical_json(&value), canonical, "{input}");
            assert_eq!(args_digest(&value), digest, "{input}");
        }
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_path() {
        for (text, path) in [
            (r#"{"cmd":"ls","cmd":"rm -rf /"}"#, "/cmd"),
            (r#"{"a":[{"x":1},{"b":{"c":1,"c":2}}]}"#, "/a/1/b/c"),
            (r#"{"a/b~":{"k":1,"k":1}}"#, "/a~1b~0/k"),
        ] {
            let error = parse_strict(text).unwrap_err().to_string();
            assert!(
                error.contains(&format!("the key {path} appears twice")),
                "{error}"
            );
        }
    }

    #[test]
    fn numbers_that_parsers_read_differently_are_refused() {
        for text in [
            r#"{"n":18446744073709551616}"#,
            r#"{"n":-9223372036854775809}"#,
            r#"{"n":[1,123456789012345678901234567890]}"#,
            r#"{"n":1e400}"#,
            r#"{"n":-1E309}"#,
        ] {
            assert!(parse_strict(text).is_err(), "{text}");
        }
        // Number-like text inside strings is text.
        assert!(parse_strict(r#"{"n":"18446744073709551616","m\"1e999":"x"}"#).is_ok());
    }

    #[test]
    fn strings_are_escaped_in_canonical_form() {
        let v = parse(r#"{"k\"ey": "line\nbreak"}"#);
        assert_eq!(canonical_json(&v), r#"{"k\"ey":"line\nbreak"}"#);
    }
}
