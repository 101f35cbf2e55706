//! Canonical JSON written straight from a `Serialize` type: the bytes
//! [`canonical_json`](crate::digest::canonical_json) gives for the type's `serde_json::Value`,
//! without building that value (every string, map and number of it allocated, then walked
//! again). The server hashes every event's content this way on the calls' threads.
//!
//! Each object's entries are written to the output as they come; when they came out of key
//! order (or a key came twice: the last value is kept, as `serde_json::Value`'s map does),
//! the object's text is put in key order once it is closed. Numbers, strings and non-finite
//! floats (`null`) are written as `serde_json::to_value` then `canonical_json` write them;
//! what `to_value` refuses (integers beyond 64 bits, map keys that are not strings, integers,
//! booleans or chars) is refused too.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt::Write as _;
use std::ops::Range;

use serde::ser::{self, Error as _, Impossible, Serialize};

use crate::digest::{ecmascript_number, write_string};

type Error = serde_json::Error;

/// The canonical JSON of `value`.
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    to_canonical_json_without(value, &[])
}

/// The canonical JSON of `value` without the entry that `omit` names by its keys from the
/// top (`["approval", "arguments_json"]`: the key `arguments_json` of the object under
/// `approval`); as if it were removed from the value first. Empty: nothing is left out.
pub fn to_canonical_json_without<T: Serialize + ?Sized>(
    value: &T,
    omit: &[&str],
) -> Result<String, Error> {
    serialize_canonical(
        value,
        Omit {
            path: omit,
            marker: None,
        },
    )
}

/// Both [`to_canonical_json`] and [`to_canonical_json_without`] of `value`, written once: the
/// entry `omit` names is written and its place noted, then cut out of a copy.
pub fn to_canonical_json_with_and_without<T: Serialize + ?Sized>(
    value: &T,
    omit: &[&str],
) -> Result<(String, String), Error> {
    let marker = Cell::new(None);
    let full = serialize_canonical(
        value,
        Omit {
            path: omit,
            marker: Some(&marker),
        },
    )?;
    let without = match marker.get() {
        None => full.clone(),
        // With the comma that separates it from its neighbour, if it has one.
        Some((start, end)) => {
            let cut = if start > 0 && full.as_bytes()[start - 1] == b',' {
                start - 1..end
            } else if full.as_bytes().get(end) == Some(&b',') {
                start..end + 1
            } else {
                start..end
            };
            let mut without = String::with_capacity(full.len() - cut.len());
            without.push_str(&full[..cut.start]);
            without.push_str(&full[cut.end..]);
            without
        }
    };
    Ok((full, without))
}

fn serialize_canonical<T: Serialize + ?Sized>(value: &T, omit: Omit<'_>) -> Result<String, Error> {
    // Room for an event's body: most need no growing.
    let mut out = String::with_capacity(2048);
    value.serialize(Canonical {
        out: &mut out,
        omit,
    })?;
    Ok(out)
}

/// The entry to leave out, by its keys from the value being written; and, when it is to be
/// written after all, where its place in the output is noted.
#[derive(Clone, Copy)]
struct Omit<'p> {
    path: &'p [&'p str],
    /// The entry's range in the output, kept up to date as objects around it are reordered.
    marker: Option<&'p Cell<Option<(usize, usize)>>>,
}

impl Omit<'_> {
    const NOTHING: Omit<'static> = Omit {
        path: &[],
        marker: None,
    };
}

struct Canonical<'o, 'p> {
    out: &'o mut String,
    omit: Omit<'p>,
}

impl<'o, 'p> Canonical<'o, 'p> {
    fn integer(self, value: impl std::fmt::Display) -> Result<(), Error> {
        // Writing into a String cannot fail.
        let _ = write!(self.out, "{value}");
        Ok(())
    }

    fn object(self, len: usize) -> Object<'o, 'p> {
        self.out.push('{');
        Object {
            start: self.out.len(),
            out: self.out,
            omit: self.omit,
            entries: Vec::with_capacity(len),
            key: None,
            in_variant: false,
        }
    }

    /// `{"variant":` … `}` around an enum variant's content.
    fn variant(self, variant: &'static str) -> Canonical<'o, 'p> {
        self.out.push('{');
        write_string(variant, self.out);
        self.out.push(':');
        Canonical {
            out: self.out,
            omit: Omit::NOTHING,
        }
    }
}

impl<'o, 'p> ser::Serializer for Canonical<'o, 'p> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Array<'o>;
    type SerializeTuple = Array<'o>;
    type SerializeTupleStruct = Array<'o>;
    type SerializeTupleVariant = Array<'o>;
    type SerializeMap = Object<'o, 'p>;
    type SerializeStruct = Object<'o, 'p>;
    type SerializeStructVariant = Object<'o, 'p>;

    fn serialize_bool(self, value: bool) -> Result<(), Error> {
        self.out.push_str(if value { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, value: i8) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_i16(self, value: i16) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_i32(self, value: i32) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_i64(self, value: i64) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_i128(self, value: i128) -> Result<(), Error> {
        match (i64::try_from(value), u64::try_from(value)) {
            (Ok(value), _) => self.integer(value),
            (_, Ok(value)) => self.integer(value),
            _ => Err(Error::custom("number out of range")),
        }
    }

    fn serialize_u8(self, value: u8) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_u16(self, value: u16) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_u32(self, value: u32) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_u64(self, value: u64) -> Result<(), Error> {
        self.integer(value)
    }

    fn serialize_u128(self, value: u128) -> Result<(), Error> {
        match u64::try_from(value) {
            Ok(value) => self.integer(value),
            Err(_) => Err(Error::custom("number out of range")),
        }
    }

    fn serialize_f32(self, value: f32) -> Result<(), Error> {
        self.serialize_f64(f64::from(value))
    }

    fn serialize_f64(self, value: f64) -> Result<(), Error> {
        // serde_json's value of a non-finite float is null.
        if value.is_finite() {
            self.out.push_str(&ecmascript_number(value));
        } else {
            self.out.push_str("null");
        }
        Ok(())
    }

    fn serialize_char(self, value: char) -> Result<(), Error> {
        write_string(value.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), Error> {
        write_string(value, self.out);
        Ok(())
    }

    fn serialize_bytes(self, value: &[u8]) -> Result<(), Error> {
        let mut array = self.serialize_seq(Some(value.len()))?;
        for byte in value {
            ser::SerializeSeq::serialize_element(&mut array, byte)?;
        }
        ser::SerializeSeq::end(array)
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        let Canonical { out, .. } = self.variant(variant);
        value.serialize(Canonical {
            out: &mut *out,
            omit: Omit::NOTHING,
        })?;
        out.push('}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Array<'o>, Error> {
        self.out.push('[');
        Ok(Array {
            out: self.out,
            first: true,
            close: "]",
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<Array<'o>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Array<'o>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Array<'o>, Error> {
        let Canonical { out, .. } = self.variant(variant);
        out.push('[');
        Ok(Array {
            out,
            first: true,
            close: "]}",
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Object<'o, 'p>, Error> {
        Ok(self.object(len.unwrap_or(0)))
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Object<'o, 'p>, Error> {
        Ok(self.object(len))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Object<'o, 'p>, Error> {
        let mut object = self.variant(variant).object(len);
        object.in_variant = true;
        Ok(object)
    }
}

/// An array being written: its elements go straight to the output.
struct Array<'o> {
    out: &'o mut String,
    first: bool,
    close: &'static str,
}

impl Array<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        value.serialize(Canonical {
            out: self.out,
            omit: Omit::NOTHING,
        })
    }

    fn close(self) -> Result<(), Error> {
        self.out.push_str(self.close);
        Ok(())
    }
}

/// The four sequence-like serde traits differ only in their names: each element is written
/// in order.
macro_rules! array_impl {
    ($($trait:ident::$method:ident),*) => {$(
        impl ser::$trait for Array<'_> {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }

            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

array_impl!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// An object being written: each entry (`"key":value`) goes to the output as it comes, and
/// the entries are put in key order when the object closes, where they are not.
struct Object<'o, 'p> {
    out: &'o mut String,
    omit: Omit<'p>,
    /// Where the entries start in `out` (after the object's `{`).
    start: usize,
    /// Each entry's key and where the entry is in `out`.
    entries: Vec<(Cow<'static, str>, Range<usize>)>,
    /// The key of a map entry whose value comes next.
    key: Option<String>,
    /// A struct variant's content: the variant's object closes after it.
    in_variant: bool,
}

impl Object<'_, '_> {
    fn entry<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        let (omit, mark) = match self.omit.path.split_first() {
            Some((first, rest)) if *first == key => match (rest, self.omit.marker) {
                ([], None) => return Ok(()),
                ([], Some(marker)) => (Omit::NOTHING, Some(marker)),
                (rest, marker) => (Omit { path: rest, marker }, None),
            },
            _ => (Omit::NOTHING, None),
        };
        if !self.entries.is_empty() {
            self.out.push(',');
        }
        let start = self.out.len();
        write_string(&key, self.out);
        self.out.push(':');
        value.serialize(Canonical {
            out: &mut *self.out,
            omit,
        })?;
        let end = self.out.len();
        if let Some(marker) = mark {
            marker.set(Some((start, end)));
        }
        self.entries.push((key, start..end));
        Ok(())
    }

    fn close(self) -> Result<(), Error> {
        let Object {
            out,
            omit,
            start,
            mut entries,
            in_variant,
            ..
        } = self;
        let in_order = entries
            .windows(2)
            .all(|pair| pair[0].0.as_bytes() < pair[1].0.as_bytes());
        if !in_order {
            let written = out.split_off(start);
            // A noted entry inside this object moves with the entry that holds it.
            let marked = omit
                .marker
                .and_then(|marker| Some((marker, marker.get().filter(|noted| noted.0 >= start)?)));
            // Noted again below unless its entry is a repeated key's dropped value.
            if let Some((marker, _)) = marked {
                marker.set(None);
            }
            // Of equal keys the last written (the later start) comes last, and is kept.
            entries.sort_unstable_by(|a, b| {
                a.0.as_bytes()
                    .cmp(b.0.as_bytes())
                    .then(a.1.start.cmp(&b.1.start))
            });
            let mut first = true;
            for (i, (key, range)) in entries.iter().enumerate() {
                if entries.get(i + 1).is_some_and(|(next, _)| next == key) {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                if let Some((marker, (noted_start, noted_end))) = marked {
                    if range.start <= noted_start && noted_end <= range.end {
                        let moved_to = out.len() + (noted_start - range.start);
                        marker.set(Some((moved_to, moved_to + noted_end - noted_start)));
                    }
                }
                out.push_str(&written[range.start - start..range.end - start]);
            }
        }
        out.push('}');
        if in_variant {
            out.push('}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_, '_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(key.serialize(MapKey)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error::custom("a map value without its key"))?;
        self.entry(Cow::Owned(key), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// A struct and a struct variant's content are written alike: each field an entry.
macro_rules! struct_impl {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Object<'_, '_> {
            type Ok = ();
            type Error = Error;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.entry(Cow::Borrowed(key), value)
            }

            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

struct_impl!(SerializeStruct, SerializeStructVariant);

/// A map key as the text `serde_json::to_value` makes of it.
struct MapKey;

fn key_must_be_a_string() -> Error {
    Error::custom("key must be a string")
}

impl ser::Serializer for MapKey {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = Impossible<String, Error>;
    type SerializeTuple = Impossible<String, Error>;
    type SerializeTupleStruct = Impossible<String, Error>;
    type SerializeTupleVariant = Impossible<String, Error>;
    type SerializeMap = Impossible<String, Error>;
    type SerializeStruct = Impossible<String, Error>;
    type SerializeStructVariant = Impossible<String, Error>;

    fn serialize_bool(self, value: bool) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_i8(self, value: i8) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_i16(self, value: i16) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_i32(self, value: i32) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_i64(self, value: i64) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_u8(self, value: u8) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_u16(self, value: u16) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_u32(self, value: u32) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_u64(self, value: u64) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_f32(self, _value: f32) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_f64(self, _value: f64) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_char(self, value: char) -> Result<String, Error> {
        Ok(value.to_string())
    }
    fn serialize_str(self, value: &str) -> Result<String, Error> {
        Ok(value.to_owned())
    }
    fn serialize_bytes(self, _value: &[u8]) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit(self) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, Error> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(key_must_be_a_string())
    }
}
