//! The operator's configuration file (`corral operator --config FILE`, TOML), as the agent has
//! its own (`corral_agent::config`): every setting of the operator that belongs in a file, the
//! flags and their environment variables winning over it, the built-in defaults under it.
//!
//! ```toml
//! replica = "op-a"                      # optional; the host name and process id otherwise
//! lease_ttl_secs = 10                   # the election lease (--lease-ttl)
//! workers = 64                          # grant transactions in flight at once
//! max_txn_ops = 128                     # etcd's --max-txn-ops: grant batches fill it
//! api_socket = "/run/corral/operator.sock"  # the API (mode 0660)
//! api_tcp = "127.0.0.1:9877"            # optional; loopback only, needs token_file
//! token_file = "/etc/corral/operator-token" # its bearer token (others may not read it)
//! state_dir = "/var/lib/corral-operator"    # optional; etcd's revision and ID seen
//! settle_secs = 40                      # the longest wait for the agents after a rewind
//!
//! [cluster]                             # --etcd, --cluster and the --etcd-* flags win
//! endpoints = ["https://10.0.0.1:2379"] # etcd's client URLs (--etcd, CORRAL_ETCD)
//! name = "default"                      # the cluster's name (--cluster, CORRAL_CLUSTER)
//! etcd_cacert = "/etc/corral/etcd/ca.pem"
//! etcd_cert = "/etc/corral/etcd/operator.pem"
//! etcd_key = "/etc/corral/etcd/operator-key.pem"
//! etcd_user = "corral-default-operator"
//! etcd_password_file = "/etc/corral/etcd/corral-default-operator.password"
//!
//! [cloud]                               # optional; --cloud, --fake-cloud, --cloud-endpoint win
//! name = "fake"                         # fake, or aws in the corral-aws build
//! fake_cloud = "/etc/corral/fake-cloud.json"
//! endpoint = "http://127.0.0.1:5000"
//!
//! [log]                                 # --log-format and --log-level win
//! format = "text"                       # or json
//! level = "info"                        # error, warn, info, debug or trace
//! ```
//!
//! [`OperatorFile::load`] refuses, before anything starts, a file that cannot be read, an
//! unknown key, a value of the wrong type and a value the operator cannot use, each a
//! [`ConfigError`] naming the file and the key. No file is read here but the configuration:
//! the token, password and TLS files are read where they are used (never echoed).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_cluster::MAX_LEASE_TTL_SECS;
/// The tables the agent's file has too, and the refusal of a value.
pub use corral_cluster::daemon::{
    ClusterTable, DEFAULT_CLUSTER, DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL, Invalid, LogTable,
};
use serde::Deserialize;

use crate::OperatorConfig;

/// Where the operator serves its API without `--api-socket` or `api_socket`.
pub const DEFAULT_API_SOCKET: &str = "/run/corral/operator.sock";
/// The longest wait for the live agents after etcd went back in time (`settle_secs`): twice
/// the agents' default liveness lease.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(40);

/// The file's shape; every setting optional. Also what the command line gives, so that
/// [`OperatorFile::over`] layers the two.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorFile {
    /// This replica's name, shown as the leader (`--replica`).
    pub replica: Option<String>,
    /// The election lease's TTL in seconds (`--lease-ttl`).
    pub lease_ttl_secs: Option<u64>,
    /// Grant transactions in flight at once (`--workers`).
    pub workers: Option<usize>,
    /// Operations a transaction may hold, as etcd's own `--max-txn-ops` allows
    /// (`--max-txn-ops`; 128, etcd's default, when absent).
    pub max_txn_ops: Option<usize>,
    /// The API's unix socket (`--api-socket`).
    pub api_socket: Option<PathBuf>,
    /// The API also on this loopback TCP address, with a token (`--api-tcp`).
    pub api_tcp: Option<SocketAddr>,
    /// The file of the bearer token for `api_tcp` (`--token-file`).
    pub token_file: Option<PathBuf>,
    /// Where the replica remembers etcd's revision and ID (`--state-dir`).
    pub state_dir: Option<PathBuf>,
    /// The longest wait in seconds for the agents after a rewind (`--settle-secs`).
    pub settle_secs: Option<u64>,
    /// How the operator reaches etcd.
    pub cluster: Option<ClusterTable>,
    /// The cloud whose interfaces the leader manages.
    pub cloud: Option<CloudTable>,
    /// How the operator logs (checked here, applied by the binary).
    pub log: Option<LogTable>,
}

/// The `[cloud]` table (`--cloud`, `--fake-cloud`, `--cloud-endpoint`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudTable {
    /// The cloud: `fake`, or `aws` in the AWS build.
    pub name: Option<String>,
    /// The fake cloud's seed file.
    pub fake_cloud: Option<PathBuf>,
    /// The cloud API's endpoint URL instead of the provider's own.
    pub endpoint: Option<String>,
}

/// Why a configuration file is refused: each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, an unknown key or a value of the wrong type: where, the key on that line,
    /// and TOML's message (the line itself is not shown: a secret written under a wrong key
    /// would be).
    #[error("{}, {where_}: {message}", path.display())]
    Parse {
        path: PathBuf,
        /// `line N (key)`, or `line N`.
        where_: String,
        message: String,
    },
    /// A value the operator cannot use.
    #[error("{}: {}", path.display(), problem)]
    Invalid { path: PathBuf, problem: Invalid },
}

/// Everything the file and the flags decide, over the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// etcd and the cluster, the name defaulted ([`Settings::endpoints`],
    /// [`Settings::cluster_name`]).
    pub cluster: ClusterTable,
    pub replica: Option<String>,
    pub lease_ttl: Duration,
    pub workers: usize,
    pub max_txn_ops: usize,
    pub api_socket: PathBuf,
    pub api_tcp: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub settle: Duration,
    pub cloud: Option<String>,
    pub fake_cloud: Option<PathBuf>,
    pub cloud_endpoint: Option<String>,
    pub log_format: String,
    pub log_level: String,
}

impl OperatorFile {
    /// The file's text, parsed (not yet checked: [`OperatorFile::check`]).
    pub fn parse(text: &str) -> Result<OperatorFile, toml::de::Error> {
        toml::from_str(text)
    }

    /// The file at `path`, parsed and checked.
    pub fn load(path: &Path) -> Result<OperatorFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file = OperatorFile::parse(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            where_: error_place(&text, e.span()),
            message: e.message().to_owned(),
        })?;
        file.check().map_err(|problem| ConfigError::Invalid {
            path: path.to_path_buf(),
            problem,
        })?;
        Ok(file)
    }

    /// Refuses a value the operator cannot use. What needs a setting of the command line as
    /// well (`api_tcp` and its token, a user and its password file) is checked once both are
    /// known, where the operator starts.
    pub fn check(&self) -> Result<(), Invalid> {
        if let Some(replica) = &self.replica
            && replica.trim().is_empty()
        {
            return Err(Invalid::new("replica", format!("{replica:?}"), "a name"));
        }
        if let Some(ttl) = self.lease_ttl_secs
            && !(1..=MAX_LEASE_TTL_SECS).contains(&ttl)
        {
            return Err(Invalid::new(
                "lease_ttl_secs",
                ttl.to_string(),
                &format!("in 1..={MAX_LEASE_TTL_SECS} (seconds; etcd's longest lease)"),
            ));
        }
        if self.workers == Some(0) {
            return Err(Invalid::new("workers", "0".into(), "1 or more"));
        }
        if let Some(ops) = self.max_txn_ops
            && ops < corral_kv::MAX_TXN_OPS
        {
            return Err(Invalid::new(
                "max_txn_ops",
                ops.to_string(),
                "128 or more (etcd's default --max-txn-ops)",
            ));
        }
        if let Some(addr) = self.api_tcp
            && !addr.ip().is_loopback()
        {
            return Err(Invalid::new(
                "api_tcp",
                addr.to_string(),
                "a loopback address (the operator listens on the loopback interface only)",
            ));
        }
        self.cluster.clone().unwrap_or_default().check()?;
        if let Some(name) = self.cloud.as_ref().and_then(|c| c.name.as_ref())
            && name.trim().is_empty()
        {
            return Err(Invalid::new(
                "cloud.name",
                format!("{name:?}"),
                "a cloud's name",
            ));
        }
        self.log.clone().unwrap_or_default().check()
    }

    /// These settings, each taken from `lower` where not given here (the command line over
    /// the file).
    pub fn over(self, lower: OperatorFile) -> OperatorFile {
        let cloud = self.cloud.unwrap_or_default();
        let lower_cloud = lower.cloud.unwrap_or_default();
        OperatorFile {
            replica: self.replica.or(lower.replica),
            lease_ttl_secs: self.lease_ttl_secs.or(lower.lease_ttl_secs),
            workers: self.workers.or(lower.workers),
            max_txn_ops: self.max_txn_ops.or(lower.max_txn_ops),
            api_socket: self.api_socket.or(lower.api_socket),
            api_tcp: self.api_tcp.or(lower.api_tcp),
            token_file: self.token_file.or(lower.token_file),
            state_dir: self.state_dir.or(lower.state_dir),
            settle_secs: self.settle_secs.or(lower.settle_secs),
            cluster: Some(
                self.cluster
                    .unwrap_or_default()
                    .or(lower.cluster.unwrap_or_default()),
            ),
            cloud: Some(CloudTable {
                name: cloud.name.or(lower_cloud.name),
                fake_cloud: cloud.fake_cloud.or(lower_cloud.fake_cloud),
                endpoint: cloud.endpoint.or(lower_cloud.endpoint),
            }),
            log: Some(
                self.log
                    .unwrap_or_default()
                    .or(lower.log.unwrap_or_default()),
            ),
        }
    }

    /// The settings given, over the defaults.
    pub fn settings(self) -> Settings {
        let cluster = self.cluster.unwrap_or_default();
        let cloud = self.cloud.unwrap_or_default();
        let log = self.log.unwrap_or_default();
        Settings {
            cluster: ClusterTable {
                name: Some(cluster.name.unwrap_or_else(|| DEFAULT_CLUSTER.to_owned())),
                ..cluster
            },
            replica: self.replica,
            lease_ttl: self
                .lease_ttl_secs
                .map_or(OperatorConfig::DEFAULT_LEASE_TTL, Duration::from_secs),
            workers: self.workers.unwrap_or(OperatorConfig::DEFAULT_WORKERS),
            max_txn_ops: self.max_txn_ops.unwrap_or(corral_kv::MAX_TXN_OPS),
            api_socket: self
                .api_socket
                .unwrap_or_else(|| PathBuf::from(DEFAULT_API_SOCKET)),
            api_tcp: self.api_tcp,
            token_file: self.token_file,
            state_dir: self.state_dir,
            settle: self.settle_secs.map_or(DEFAULT_SETTLE, Duration::from_secs),
            cloud: cloud.name,
            fake_cloud: cloud.fake_cloud,
            cloud_endpoint: cloud.endpoint,
            log_format: log.format.unwrap_or_else(|| DEFAULT_LOG_FORMAT.to_owned()),
            log_level: log.level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_owned()),
        }
    }
}

impl Settings {
    /// etcd's client URLs; empty when neither the file nor the flags give any.
    pub fn endpoints(&self) -> &[String] {
        self.cluster.endpoints.as_deref().unwrap_or_default()
    }

    /// The cluster's name.
    pub fn cluster_name(&self) -> &str {
        self.cluster.name.as_deref().unwrap_or(DEFAULT_CLUSTER)
    }
}

/// `line N (key)` of a parse error at `span` of `text`: the key of the line's `key = value`.
fn error_place(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let start = span.map_or(text.len(), |span| span.start.min(text.len()));
    let start = (0..=start)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let number = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(number - 1).unwrap_or_default();
    match line.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() && !key.trim_start().starts_with('#') => {
            format!("line {number} ({})", key.trim())
        }
        _ => format!("line {number}"),
    }
}

#[cfg(test)]
mod shipped;

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        file
    }

    fn refused(text: &str) -> String {
        let file = write(text);
        let error = OperatorFile::load(file.path()).unwrap_err().to_string();
        let path = file.path().display().to_string();
        let rest = error
            .strip_prefix(&path)
            .unwrap_or_else(|| panic!("{error}"));
        rest.strip_prefix(": ")
            .or_else(|| rest.strip_prefix(", "))
            .unwrap_or_else(|| panic!("{error}"))
            .to_owned()
    }

    #[test]
    fn the_module_docs_example_loads_as_written() {
        let text: String = include_str!("config.rs")
            .split("//! ```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("//! ```").next())
            .unwrap()
            .lines()
            .map(|line| line.strip_prefix("//!").unwrap().trim_start_matches(' '))
            .collect::<Vec<_>>()
            .join("\n");
        let file = write(&text);
        let settings = OperatorFile::load(file.path()).unwrap().settings();
        assert_eq!(settings.replica.as_deref(), Some("op-a"));
        assert_eq!(settings.endpoints(), ["https://10.0.0.1:2379"]);
        assert_eq!(settings.api_tcp, Some("127.0.0.1:9877".parse().unwrap()));
        assert_eq!(settings.cloud.as_deref(), Some("fake"));
        assert_eq!(
            settings.cluster.etcd_password_file,
            Some(PathBuf::from(
                "/etc/corral/etcd/corral-default-operator.password"
            ))
        );
    }

    #[test]
    fn no_file_is_the_defaults() {
        let settings = OperatorFile::default().settings();
        assert_eq!(settings.cluster_name(), "default");
        assert_eq!(settings.lease_ttl, Duration::from_secs(10));
        assert_eq!(settings.workers, 64);
        assert_eq!(settings.settle, Duration::from_secs(40));
        assert_eq!(
            settings.api_socket,
            PathBuf::from("/run/corral/operator.sock")
        );
        assert!(settings.endpoints().is_empty() && settings.state_dir.is_none());
    }

    #[test]
    fn the_command_line_wins_over_the_file_setting_by_setting() {
        let file = OperatorFile::parse(
            "workers = 4\nlease_ttl_secs = 3\n[cluster]\nendpoints = [\"http://a:1\"]\n\
             name = \"blue\"\netcd_user = \"u\"\n[log]\nlevel = \"debug\"\n",
        )
        .unwrap();
        let flags = OperatorFile {
            workers: Some(8),
            cluster: Some(ClusterTable {
                name: Some("red".into()),
                ..ClusterTable::default()
            }),
            log: Some(LogTable {
                format: Some("json".into()),
                level: None,
            }),
            ..OperatorFile::default()
        };
        let settings = flags.over(file).settings();
        assert_eq!(settings.workers, 8);
        assert_eq!(settings.lease_ttl, Duration::from_secs(3));
        assert_eq!(settings.endpoints(), ["http://a:1"]);
        assert_eq!(settings.cluster_name(), "red");
        assert_eq!(settings.cluster.etcd_user.as_deref(), Some("u"));
        assert_eq!(
            (settings.log_format.as_str(), settings.log_level.as_str()),
            ("json", "debug")
        );
    }

    #[test]
    fn bad_files_name_the_file_the_key_and_what_is_wrong() {
        for (text, expected) in [
            ("workers = 0", "workers 0 is not 1 or more"),
            (
                "max_txn_ops = 64",
                "max_txn_ops 64 is not 128 or more (etcd's default --max-txn-ops)",
            ),
            (
                "lease_ttl_secs = 0",
                "lease_ttl_secs 0 is not in 1..=9000000000 (seconds; etcd's longest lease)",
            ),
            (
                "api_tcp = \"10.1.2.3:80\"",
                "api_tcp 10.1.2.3:80 is not a loopback address (the operator listens on the \
                 loopback interface only)",
            ),
            ("replica = \" \"", "replica \" \" is not a name"),
            (
                "[cluster]\nendpoints = []",
                "cluster.endpoints [] is not one URL or more",
            ),
            (
                "[cluster]\nendpoints = [\"10.0.0.1:2379\"]",
                "cluster.endpoints \"10.0.0.1:2379\" is not an http:// or https:// URL",
            ),
            (
                "[log]\nformat = \"xml\"",
                "log.format \"xml\" is not text or json",
            ),
            (
                "[log]\nlevel = \"loud\"",
                "log.level \"loud\" is not error, warn, info, debug or trace",
            ),
            (
                "[cloud]\nname = \"\"",
                "cloud.name \"\" is not a cloud's name",
            ),
        ] {
            assert_eq!(refused(text), expected, "{text}");
        }
        let name = refused("[cluster]\nname = \"Blue Team\"");
        assert!(
            name.starts_with("cluster.name \"Blue Team\" is not a cluster name ("),
            "{name}"
        );
        for (text, needles) in [
            (
                "listen = \"x\"",
                &["line 1 (listen): unknown field `listen`"][..],
            ),
            (
                "[cluster]\netcd_password = \"hunter2\"",
                &["line 2 (etcd_password): unknown field `etcd_password`"],
            ),
            ("workers = \"many\"", &["line 1 (workers): invalid type"]),
            ("\n\nlease_ttl_secs = -1", &["line 3 (lease_ttl_secs): "]),
            (
                "[cloud]\nregion = \"x\"",
                &["line 2 (region): unknown field `region`"],
            ),
            ("api_tcp = \"loopback\"", &["line 1 (api_tcp): "]),
            ("[cluster\nname = 1", &["line 1"]),
        ] {
            let error = refused(text);
            for needle in needles {
                assert!(error.starts_with(needle), "{text}: {error}");
            }
            // A value written under a wrong key is not echoed (it may be a password).
            assert!(!error.contains("hunter2"), "{error}");
        }
        let missing = Path::new("/nonexistent/operator.toml");
        let error = OperatorFile::load(missing).unwrap_err().to_string();
        assert!(
            error.starts_with("cannot read /nonexistent/operator.toml: "),
            "{error}"
        );
    }
}
