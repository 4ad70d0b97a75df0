//! The tables both daemons' configuration files share (`corral agent --config`, `corral
//! operator --config`): `[cluster]`, which cluster and how its etcd is reached, and `[log]`,
//! how the daemon logs. Each daemon's file embeds them; the binary layers its flags over them
//! (the flags win) and makes the connection and the log. [`Invalid`] is a value a daemon
//! cannot use, named `table.key value is not expected`.
//!
//! With the `testing` feature, [`shipped`] holds what the daemons' tests of their packaged
//! files (`packaging/*.toml`) read those files with.

use std::path::PathBuf;

use serde::Deserialize;

use crate::keys::ClusterName;

/// The cluster's name without `--cluster` or `[cluster] name`.
pub const DEFAULT_CLUSTER: &str = "default";

/// The `[cluster]` table: etcd and the cluster, as the `--etcd*` and `--cluster` flags name
/// them. Relative paths are relative to the working directory, as the flags' are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTable {
    /// etcd's client URLs (`--etcd`, `CORRAL_ETCD`).
    pub endpoints: Option<Vec<String>>,
    /// The cluster's name: its keys live under `/corral/<name>/v1/` (`--cluster`).
    pub name: Option<String>,
    /// The CA bundle etcd's certificate must verify against (`--etcd-cacert`).
    pub etcd_cacert: Option<PathBuf>,
    /// The client certificate (`--etcd-cert`).
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's key (`--etcd-key`).
    pub etcd_key: Option<PathBuf>,
    /// The etcd user (`--etcd-user`).
    pub etcd_user: Option<String>,
    /// The file holding that user's password (`--etcd-password-file`).
    pub etcd_password_file: Option<PathBuf>,
}

impl ClusterTable {
    /// These settings, each taken from `lower` where not given here (the command line over
    /// the file).
    pub fn or(self, lower: ClusterTable) -> ClusterTable {
        ClusterTable {
            endpoints: self.endpoints.or(lower.endpoints),
            name: self.name.or(lower.name),
            etcd_cacert: self.etcd_cacert.or(lower.etcd_cacert),
            etcd_cert: self.etcd_cert.or(lower.etcd_cert),
            etcd_key: self.etcd_key.or(lower.etcd_key),
            etcd_user: self.etcd_user.or(lower.etcd_user),
            etcd_password_file: self.etcd_password_file.or(lower.etcd_password_file),
        }
    }

    /// Refuses a value no daemon can use: no URL, a URL that is not http(s), a name that is no
    /// cluster name, an empty user. A user without its password file (which may come from a
    /// flag) is checked where both are known.
    pub fn check(&self) -> Result<(), Invalid> {
        if let Some(endpoints) = &self.endpoints {
            if endpoints.is_empty() {
                return Err(Invalid::new(
                    "cluster.endpoints",
                    "[]".into(),
                    "one URL or more",
                ));
            }
            if let Some(bad) = endpoints
                .iter()
                .find(|url| !(url.starts_with("http://") || url.starts_with("https://")))
            {
                return Err(Invalid::new(
                    "cluster.endpoints",
                    format!("{bad:?}"),
                    "an http:// or https:// URL",
                ));
            }
        }
        if let Some(name) = &self.name
            && let Err(e) = ClusterName::new(name)
        {
            return Err(Invalid::new(
                "cluster.name",
                format!("{name:?}"),
                &format!("a cluster name ({e})"),
            ));
        }
        if let Some(user) = &self.etcd_user
            && user.is_empty()
        {
            return Err(Invalid::new(
                "cluster.etcd_user",
                "\"\"".into(),
                "a user name",
            ));
        }
        Ok(())
    }
}

/// The log's format without `--log-format` or `[log] format`.
pub const DEFAULT_LOG_FORMAT: &str = "text";
/// The lowest level logged without `--log-level` or `[log] level`.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// The `[log]` table (`--log-format`, `--log-level`): checked here, applied by the binary,
/// which alone chooses how logs are written (the libraries only emit).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogTable {
    /// `text` or `json`.
    pub format: Option<String>,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub level: Option<String>,
}

impl LogTable {
    /// What `--log-format` must be, as [`Invalid::expected`] says it.
    pub const FORMATS: &str = "text or json";
    /// What `--log-level` must be, as [`Invalid::expected`] says it.
    pub const LEVELS: &str = "error, warn, info, debug or trace";

    /// These settings, each taken from `lower` where not given here.
    pub fn or(self, lower: LogTable) -> LogTable {
        LogTable {
            format: self.format.or(lower.format),
            level: self.level.or(lower.level),
        }
    }

    /// Refuses a format that is neither `text` nor `json` and a level `tracing` does not
    /// parse.
    pub fn check(&self) -> Result<(), Invalid> {
        if let Some(format) = &self.format
            && !matches!(format.as_str(), "text" | "json")
        {
            return Err(Invalid::new(
                "log.format",
                format!("{format:?}"),
                Self::FORMATS,
            ));
        }
        if let Some(level) = &self.level
            && level
                .parse::<tracing::level_filters::LevelFilter>()
                .is_err()
        {
            return Err(Invalid::new(
                "log.level",
                format!("{level:?}"),
                Self::LEVELS,
            ));
        }
        Ok(())
    }
}

/// A setting's value a daemon cannot use: `key value is not expected`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key} {value} is not {expected}")]
pub struct Invalid {
    /// The key, with its table (`cluster.endpoints`).
    pub key: &'static str,
    /// The value as the file gives it.
    pub value: String,
    /// What it must be.
    pub expected: String,
}

impl Invalid {
    /// `key`'s `value` is not `expected`.
    pub fn new(key: &'static str, value: String, expected: &str) -> Invalid {
        Invalid {
            key,
            value,
            expected: expected.to_owned(),
        }
    }
}

/// How the daemons' tests read the configuration files the packages install
/// (`packaging/agent.toml`, `packaging/operator.toml`): settings are shown commented out as
/// `#key = value` (a `#` right before the key), prose as `# text`, and every field of the
/// file's format must be shown.
#[cfg(any(test, feature = "testing"))]
pub mod shipped {
    use serde::Deserialize;
    use serde::de::{self, Visitor};

    /// A line that is a commented-out setting or table header: `#key = value`, `#[table]`.
    pub fn commented_setting(line: &str) -> Option<&str> {
        let rest = line.strip_prefix('#')?;
        rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '[')
            .then_some(rest)
    }

    /// The key of a `key = value` line.
    pub fn key(line: &str) -> Option<&str> {
        line.split_once('=').map(|(key, _)| key.trim())
    }

    /// `shipped` with its settings uncommented, but those `keep` says stay commented.
    pub fn uncommented(shipped: &str, keep: impl Fn(&str) -> bool) -> String {
        shipped
            .lines()
            .map(|line| match commented_setting(line) {
                Some(setting) if !keep(setting) => setting,
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A deserializer that answers every request with an error, the field names of a struct
    /// when asked for one: the names serde reads, so a field added to the format is seen.
    struct FieldNames;

    impl<'de> de::Deserializer<'de> for FieldNames {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom(fields.join(" ")))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    /// The field names of the file-format struct `T`.
    pub fn fields<'de, T: Deserialize<'de>>() -> Vec<String> {
        match T::deserialize(FieldNames) {
            Ok(_) => panic!("a struct deserialized from nothing"),
            Err(error) => error.to_string().split(' ').map(str::to_owned).collect(),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_fields_are_those_serde_reads() {
            assert_eq!(fields::<super::super::LogTable>(), ["format", "level"]);
            assert_eq!(commented_setting("#[log]"), Some("[log]"));
            assert_eq!(commented_setting("# prose"), None);
            assert_eq!(
                uncommented("#a = 1\n#b = 2", |s| key(s) == Some("b")),
                "a = 1\n#b = 2"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_setting_wins_over_the_files_one_by_one() {
        let file = ClusterTable {
            endpoints: Some(vec!["http://a:1".into()]),
            name: Some("blue".into()),
            etcd_user: Some("u".into()),
            ..ClusterTable::default()
        };
        let flags = ClusterTable {
            name: Some("red".into()),
            ..ClusterTable::default()
        };
        let both = flags.or(file);
        assert_eq!(both.name.as_deref(), Some("red"));
        assert_eq!(both.endpoints, Some(vec!["http://a:1".to_owned()]));
        assert_eq!(both.etcd_user.as_deref(), Some("u"));
        let log = LogTable {
            format: Some("json".into()),
            level: None,
        }
        .or(LogTable {
            format: Some("text".into()),
            level: Some("debug".into()),
        });
        assert_eq!(
            (log.format.as_deref(), log.level.as_deref()),
            (Some("json"), Some("debug"))
        );
    }
}
