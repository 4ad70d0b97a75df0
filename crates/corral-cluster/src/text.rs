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
