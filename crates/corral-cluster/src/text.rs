//! Serde helpers that write CIDRs and pool names as their text forms (ipnet and corral-core carry no serde here).

use std::fmt::Display;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// Serializes any `Display` value as a string.
pub(crate) fn serialize<T: Display, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Deserializes any `FromStr` value from a string.
pub(crate) fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: Deserializer<'de>,
{
    let text = String::deserialize(deserializer)?;
    text.parse::<T>()
        .map_err(|e| D::Error::custom(format!("{text:?}: {e}")))
}

/// The same for a list of values.
pub(crate) mod list {
    use super::*;
    use serde::ser::SerializeSeq;

    pub(crate) fn serialize<T: Display, S: Serializer>(
        values: &[T],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(values.len()))?;
        for value in values {
            seq.serialize_element(&value.to_string())?;
        }
        seq.end()
    }

    pub(crate) fn deserialize<'de, T, D>(deserializer: D) -> Result<Vec<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .into_iter()
            .map(|text| {
                text.parse::<T>()
                    .map_err(|e| D::Error::custom(format!("{text:?}: {e}")))
            })
            .collect()
    }
}

/// The same for a map whose keys are such values (JSON object keys are strings).
pub(crate) mod map {
    use std::collections::BTreeMap;

    use super::*;
    use serde::Serialize;
    use serde::ser::SerializeMap;

    pub(crate) fn serialize<K: Display, V: Serialize, S: Serializer>(
        values: &BTreeMap<K, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(values.len()))?;
        for (key, value) in values {
            map.serialize_entry(&key.to_string(), value)?;
        }
        map.end()
    }

    pub(crate) fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: FromStr + Ord,
        K::Err: Display,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let texts = BTreeMap::<String, V>::deserialize(deserializer)?;
        texts
            .into_iter()
            .map(|(text, value)| {
                let key = text
                    .parse::<K>()
                    .map_err(|e| D::Error::custom(format!("{text:?}: {e}")))?;
                Ok((key, value))
            })
            .collect()
    }
}
