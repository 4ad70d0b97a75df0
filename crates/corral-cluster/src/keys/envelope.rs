//! The envelope every stored value is written in: `{"schema":1, ...the record's fields}`.
//!
//! Written with `#[serde(flatten)]`; read by hand: a flattened field makes serde buffer every
//! other field of the object (each string copied into its own allocation) before the record
//! reads them, which was a fifth of what a leader's rebuild spent on a key. [`Enveloped`]
//! hands the record the object's own entries instead, less `schema`, and as flatten does, a
//! struct sees only its own fields (so `deny_unknown_fields` refuses nothing a newer writer
//! adds). A record is an object: a struct, a map, or an internally tagged or untagged enum.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// What [`super::encode_value`] writes.
#[derive(Serialize)]
pub(super) struct Envelope<'a, T> {
    pub schema: u32,
    #[serde(flatten)]
    pub record: &'a T,
}

/// What [`super::decode_value`] reads: the record, and the `schema` field if the object has
/// one.
pub(super) struct Enveloped<T> {
    pub schema: Option<u32>,
    pub record: T,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Enveloped<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvelopeVisitor(PhantomData))
    }
}

struct EnvelopeVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for EnvelopeVisitor<T> {
    type Value = Enveloped<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a stored record (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let mut schema = None;
        let record = T::deserialize(WithoutSchema {
            map,
            schema: &mut schema,
            fields: None,
        })?;
        Ok(Enveloped { schema, record })
    }
}

/// The object's entries as the record's own: a map (or struct) deserializer over them that
/// takes `schema` out on the way.
struct WithoutSchema<'s, A> {
    map: A,
    schema: &'s mut Option<u32>,
    /// A struct's fields: the entries it is handed (the others are skipped, as flatten
    /// skips them).
    fields: Option<&'static [&'static str]>,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for WithoutSchema<'_, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_map(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        mut self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.fields = Some(fields);
        visitor.visit_map(self)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithoutSchema<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            let key = match self.map.next_key::<KeyText<'de>>()? {
                None => return Ok(None),
                Some(key) => key,
            };
            if key.as_str() == "schema" {
                if self.schema.is_some() {
                    return Err(de::Error::duplicate_field("schema"));
                }
                *self.schema = Some(self.map.next_value()?);
                continue;
            }
            if self
                .fields
                .is_some_and(|fields| !fields.contains(&key.as_str()))
            {
                self.map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            return match key {
                KeyText::Borrowed(text) => seed
                    .deserialize(BorrowedStrDeserializer::new(text))
                    .map(Some),
                KeyText::Owned(text) => seed.deserialize(StringDeserializer::new(text)).map(Some),
            };
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A key of the object, borrowed from the input unless it had to be unescaped.
enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyText<'_> {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(text) => text,
            KeyText::Owned(text) => text,
        }
    }
}

impl<'de> Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyText<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(KeyText::Borrowed(text))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(KeyText::Owned(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(KeyText::Owned(text))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use crate::census::CensusRecord;
    use crate::keys::{GrantRecord, NodeName, ValueError, decode_value, encode_value};

    fn grant() -> GrantRecord {
        GrantRecord {
            node: NodeName::new("node-1").unwrap(),
            uid: "u1".into(),
            node_revision: 7,
            granted_ms: Some(5),
        }
    }

    /// What `#[serde(flatten)]` read, this reads: the record with or without `schema`, its
    /// fields in any order, field names escaped, unknown fields ignored, and a record that
    /// refuses unknown fields still reads (`schema` is not its field).
    #[test]
    fn a_stored_value_reads_as_the_flattened_envelope_did() {
        let written = encode_value(&grant()).unwrap();
        assert!(written.starts_with(br#"{"schema":1,"#), "{written:?}");
        assert_eq!(decode_value::<GrantRecord>(&written).unwrap(), grant());
        for text in [
            r#"{"node":"node-1","uid":"u1","node_revision":7,"granted_ms":5}"#,
            r#"{"uid":"u1","node":"node-1","granted_ms":5,"node_revision":7,"schema":1}"#,
            r#"{"schema":1,"\u006eode":"node-1","uid":"u1","node_revision":7,"granted_ms":5}"#,
            r#"{"node":"node-1","uid":"u1","node_revision":7,"granted_ms":5,"new":[1,{"a":2}]}"#,
        ] {
            assert_eq!(
                decode_value::<GrantRecord>(text.as_bytes()).unwrap(),
                grant(),
                "{text}"
            );
        }
        // A record that refuses unknown fields sees only its own, as under flatten: a field a
        // newer writer adds is no error.
        let census = encode_value(&CensusRecord { nodes: 3 }).unwrap();
        assert_eq!(decode_value::<CensusRecord>(&census).unwrap().nodes, 3);
        let newer = br#"{"schema":1,"nodes":3,"other":{"x":1}}"#;
        assert_eq!(decode_value::<CensusRecord>(newer).unwrap().nodes, 3);
    }

    /// Another schema is named as such, whether the record reads or not; what is not a record
    /// is a decode error.
    #[test]
    fn another_schema_is_told_apart_from_garbage() {
        for text in [
            r#"{"schema":2,"node":"node-1","uid":"u1","node_revision":7}"#,
            r#"{"node":"node-1","schema":2}"#,
            r#"{"shape":"new","schema":2}"#,
        ] {
            let error = decode_value::<GrantRecord>(text.as_bytes()).unwrap_err();
            assert!(
                matches!(error, ValueError::Schema { schema: 2, .. }),
                "{text}: {error:?}"
            );
        }
        for text in [
            "",
            "[]",
            "[2]",
            "null",
            r#"{"schema":2,"node":"node-1","uid":"u1","node_revision":7,"schema":1}"#,
            r#"{"node":"node-1"}"#,
            r#"{"schema":"one","node":"node-1","uid":"u1","node_revision":7}"#,
            r#"{"node":"node-1","uid":"u1","node_revision":7"#,
        ] {
            let error = decode_value::<GrantRecord>(text.as_bytes()).unwrap_err();
            assert!(
                matches!(error, ValueError::Decode { .. }),
                "{text}: {error:?}"
            );
        }
    }
}
