//! The agent's configuration: a TOML file, overridden by command-line flags.
//!
//! ```toml
//! data_dir = "/var/lib/corral"          # the SQLite state
//! socket = "/run/corral/agent.sock"     # the REST API (mode 0660)
//! socket_group = "corral"               # optional; the socket's group (else the agent's)
//! tcp = "127.0.0.1:9876"                # optional; needs a token
//! token_file = "/etc/corral/token"      # the bearer token for TCP
//! cni_data_dirs = ["/var/lib/cni/networks"]  # where corral-ipam records DELs for the agent
//! pool_wait_ms = 20000                  # an ADD waits for restore and for a grant (see below)
//! history_max_events = 1000000          # the allocation history keeps at most this many events
//! history_max_age = "30d"               # ... and none older (ms, s, m, h or d)
//!
//! [connections]                         # optional; these are the defaults
//! max_unix = 512                        # served at once on the socket
//! max_tcp = 128                         # served at once on tcp
//! header_timeout_ms = 10000             # idle, or sending a request's head
//! body_timeout_ms = 10000               # sending a request's body
//!
//! [log]                                 # optional; --log-format and --log-level win
//! format = "text"                       # or "json": one JSON object a line
//! level = "info"                        # error, warn, info, debug or trace
//!
//! [cluster]                             # optional; --etcd, --cluster, --etcd-* flags win
//! endpoints = ["https://10.0.0.1:2379"] # etcd's client URLs: the agent joins the cluster
//! name = "default"                      # the cluster's name
//! etcd_cacert = "/etc/corral/etcd-ca.pem"   # the CA of etcd's certificate (https:// URLs)
//! etcd_cert = "/etc/corral/etcd-client.pem" # a client certificate, for --client-cert-auth
//! etcd_key = "/etc/corral/etcd-client-key.pem"  # its key (others may not read it)
//!
//! [[pools]]
//! name = "default"
//! ranges = ["10.88.0.0/16", "fd88::/64"]
//! cooldown_ms = 30000
//! lowest_free = false
//! exclusions = [{ network = "10.88.0.0/28", reason = "infrastructure" }]
//! ```
//!
//! Without pools in a file, the embedded default is one dual-stack pool `default` (10.88.0.0/16 and
//! fd88::/64, 30 s cooldown) with production paths; an agent that joins a cluster (`--etcd`)
//! starts with no pools instead, and the cluster's grants make them.

/// The token type of [`AgentConfig`], read with its file checks (`BearerToken::read_file`).
pub use corral_http::BearerToken;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The tables the operator's file has too (`corral_cluster::daemon`).
pub use corral_cluster::daemon::{ClusterTable, LogTable};
use corral_core::{Exclusion, PoolName, RangeSpec, ReusePolicy};
use corral_store::{
    DEFAULT_HISTORY_MAX_AGE, DEFAULT_HISTORY_MAX_EVENTS, HistoryLimits, PoolSpec, RangeSource,
    ScopeConfig,
};
use serde::Deserialize;

/// The production state directory.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/corral";
/// The production socket.
pub const DEFAULT_SOCKET: &str = "/run/corral/agent.sock";
/// corral-ipam's default `dataDir` (host-local's), where it records the DELs it could not
/// deliver while the agent was away.
pub const DEFAULT_CNI_DATA_DIR: &str = "/var/lib/cni/networks";

/// Everything the agent runs with, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    /// A TCP address on the loopback interface, served only with a token.
    pub tcp: Option<SocketAddr>,
    /// The socket's group, so its members (a CNI runtime's, an operator's) may connect
    /// (`socket_group`, `--socket-group`); without it the agent's own group.
    pub socket_group: Option<SocketGroup>,
    /// Its bearer token (`Debug` shows `***`).
    pub token: Option<BearerToken>,
    /// The agent's own pools (scope `node`).
    pub pools: ScopeConfig,
    /// The CNI `dataDir`s whose pending DELs (recorded by corral-ipam while the agent was
    /// away) the agent applies when it starts, before it serves anything.
    pub cni_data_dirs: Vec<PathBuf>,
    /// How many connections each listener serves at once, and how long a client may take.
    pub connections: ConnectionLimits,
    /// How long a CNI ADD waits, from when it arrives: for the agent to finish restoring (a
    /// DEL too), and in a cluster for a grant when its node pool has nothing free; then it
    /// fails with code 11 (`pool_wait_ms`, `--pool-wait`).
    pub pool_wait: Duration,
    /// How much allocation history the state keeps (`history_max_events`,
    /// `history_max_age`, `--history-max-events`, `--history-max-age`).
    pub history: HistoryLimits,
}

/// The default of [`AgentConfig::pool_wait`]: longer than an operator failover, so an ADD
/// that needs a new block while the leader dies is served by its successor. A failover takes
/// the dead leader's election lease TTL (the operator's `--lease-ttl`, default 10 s) for its
/// key to expire, then the standby's rebuild of the cluster's state and its first grants (a
/// second or two): 8 to 9 s measured with the default TTL. 20 s covers that twice over less
/// the margin; an operator run with a longer TTL wants a longer wait (about TTL + 10 s). The
/// runtime's own deadline for a CNI ADD is longer (the kubelet's CRI calls, minutes; podman
/// none), and corral-ipam waits up to 60 s for the agent's answer.
pub const DEFAULT_POOL_WAIT: Duration = Duration::from_secs(20);

/// What one client may hold of the agent: the connections served at once per listener, and
/// how long a connection may sit idle or send a request. Past the cap a listener accepts
/// nothing more until a connection closes (new ones wait in the kernel's queue), so clients of
/// one listener can never take the connections or file descriptors of the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once on the unix socket.
    pub max_unix: usize,
    /// Connections served at once on the TCP listener, which anyone can open without the
    /// token: fewer than on the socket.
    pub max_tcp: usize,
    /// How long a connection may take to send a request's head, counted from when it opened
    /// or its previous answer was sent: both the header-read and the idle (keep-alive)
    /// timeout. The agent then closes it.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive after its head (answered 400).
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_unix: 512,
            max_tcp: 128,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// The group the agent's socket is given (mode 0660: its members may connect).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketGroup {
    /// As given: a group name or a numeric GID.
    pub name: String,
    pub gid: u32,
}

impl SocketGroup {
    /// The group `name`: a number is a GID as it is, a name is looked up in the system's
    /// group database (`/etc/group`, where `groupadd` and systemd-sysusers put local groups).
    /// A group that does not exist is an error naming it.
    pub fn resolve(name: &str) -> Result<SocketGroup, ConfigError> {
        Self::resolve_in(name, Path::new("/etc/group"))
    }

    fn resolve_in(name: &str, database: &Path) -> Result<SocketGroup, ConfigError> {
        if name.is_empty() {
            return Err(ConfigError("socket_group: empty group name".into()));
        }
        if let Ok(gid) = name.parse::<u32>() {
            return Ok(SocketGroup {
                name: name.to_owned(),
                gid,
            });
        }
        let groups = std::fs::read_to_string(database).map_err(|e| {
            ConfigError(format!(
                "socket_group {name}: cannot read {}: {e}",
                database.display()
            ))
        })?;
        groups
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(':');
                let group = fields.next()?;
                let gid = fields.nth(1)?.parse::<u32>().ok()?;
                (group == name).then_some(gid)
            })
            .next()
            .map(|gid| SocketGroup {
                name: name.to_owned(),
                gid,
            })
            .ok_or_else(|| {
                ConfigError(format!(
                    "socket_group {name}: no such group in {} (create it, e.g. groupadd \
                     --system {name}, or give a numeric GID)",
                    database.display()
                ))
            })
    }
}

/// The file's shape; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    /// See [`AgentConfig::socket_group`].
    pub socket_group: Option<String>,
    pub tcp: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    pub cni_data_dirs: Option<Vec<PathBuf>>,
    pub connections: Option<ConnectionsFile>,
    pub pools: Option<Vec<PoolFile>>,
    /// See [`AgentConfig::pool_wait`].
    pub pool_wait_ms: Option<u64>,
    /// How the agent logs; the binary reads it ([`log_table`]) before anything else.
    pub log: Option<LogTable>,
    /// Which cluster the agent joins, and how it reaches etcd; the binary reads it
    /// ([`cluster_table`]).
    pub cluster: Option<ClusterTable>,
    /// See [`AgentConfig::history`].
    pub history_max_events: Option<u64>,
    /// See [`AgentConfig::history`]: a duration such as `30d` ([`parse_duration`]).
    pub history_max_age: Option<String>,
}

/// The `[cluster]` table of the configuration file `config` (empty without a file or a
/// table), checked: how `corral agent` joins its cluster (the flags win). A file that cannot
/// be read or parsed is refused as [`AgentConfig::load`] refuses it.
pub fn cluster_table(config: Option<&Path>) -> Result<ClusterTable, ConfigError> {
    let table = read_table(config, |file| file.cluster)?;
    table.check().map_err(|problem| {
        let path = config.map(|p| p.display().to_string()).unwrap_or_default();
        ConfigError(format!("{path}: {problem}"))
    })?;
    Ok(table)
}

/// The `[log]` table of the configuration file `config` (empty without a file or a table),
/// which the binary checks as it layers its flags over it. A file that cannot be read or
/// parsed is refused as [`AgentConfig::load`] refuses it.
pub fn log_table(config: Option<&Path>) -> Result<LogTable, ConfigError> {
    read_table(config, |file| file.log)
}

/// The `[connections]` table; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsFile {
    pub max_unix: Option<usize>,
    pub max_tcp: Option<usize>,
    pub header_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    pub name: String,
    #[serde(default)]
    pub ranges: Vec<String>,
    #[serde(default = "default_cooldown_ms")]
    pub cooldown_ms: u64,
    #[serde(default)]
    pub lowest_free: bool,
    #[serde(default)]
    pub exclusions: Vec<ExclusionFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExclusionFile {
    pub network: String,
    #[serde(default)]
    pub reason: String,
}

fn default_cooldown_ms() -> u64 {
    30_000
}

/// A configuration problem, naming the file or flag and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Command-line overrides.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    /// When given, replaces the file's `socket_group`.
    pub socket_group: Option<String>,
    pub tcp: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    /// When given, replaces the file's `cni_data_dirs`.
    pub cni_data_dirs: Option<Vec<PathBuf>>,
    /// The agent joins a cluster (`--etcd`): without pools in the file it starts with none,
    /// not the embedded default, since the cluster grants its ranges.
    pub in_cluster: bool,
    /// When given, replaces the file's `pool_wait_ms`.
    pub pool_wait: Option<Duration>,
    /// When given, replaces the file's `history_max_events`.
    pub history_max_events: Option<u64>,
    /// When given, replaces the file's `history_max_age`.
    pub history_max_age: Option<Duration>,
}

/// A duration as the configuration gives it: a whole number and its unit, `ms`, `s`, `m`,
/// `h` or `d` (`30d`, `12h`, `90s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || {
        format!("{text:?} is not a duration: give a whole number and ms, s, m, h or d (e.g. 30d)")
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    number
        .checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(bad)
}

/// The embedded default pools.
pub fn default_pools() -> Vec<PoolFile> {
    vec![PoolFile {
        name: "default".into(),
        ranges: vec!["10.88.0.0/16".into(), "fd88::/64".into()],
        cooldown_ms: default_cooldown_ms(),
        lowest_free: false,
        exclusions: Vec::new(),
    }]
}

impl AgentConfig {
    /// Reads the file named by `--config` (if any), applies the flags, and validates.
    pub fn load(overrides: &Overrides) -> Result<AgentConfig, ConfigError> {
        let file = match &overrides.config {
            Some(path) => read_file(path)?,
            None => ConfigFile::default(),
        };
        let token_file = overrides.token_file.clone().or(file.token_file);
        let token = match &token_file {
            Some(path) => Some(BearerToken::read_file(path).map_err(ConfigError)?),
            None => std::env::var("CORRAL_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .map(BearerToken::new),
        };
        let tcp = overrides.tcp.or(file.tcp);
        if let Some(addr) = tcp {
            if !addr.ip().is_loopback() {
                return Err(ConfigError(format!(
                    "tcp {addr}: the agent listens on the loopback interface only"
                )));
            }
            if token.is_none() {
                return Err(ConfigError(format!(
                    "tcp {addr} needs a bearer token (token_file, --token-file or CORRAL_TOKEN)"
                )));
            }
        }
        Ok(AgentConfig {
            data_dir: overrides
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            socket: overrides
                .socket
                .clone()
                .or(file.socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            socket_group: match overrides
                .socket_group
                .as_ref()
                .or(file.socket_group.as_ref())
            {
                Some(name) => Some(SocketGroup::resolve(name)?),
                None => None,
            },
            tcp,
            token,
            pools: pools(&file.pools.unwrap_or_else(|| {
                if overrides.in_cluster {
                    Vec::new()
                } else {
                    default_pools()
                }
            }))?,
            cni_data_dirs: overrides
                .cni_data_dirs
                .clone()
                .or(file.cni_data_dirs)
                .unwrap_or_else(|| vec![PathBuf::from(DEFAULT_CNI_DATA_DIR)]),
            connections: connection_limits(&file.connections.unwrap_or_default())?,
            pool_wait: overrides
                .pool_wait
                .or(file.pool_wait_ms.map(Duration::from_millis))
                .unwrap_or(DEFAULT_POOL_WAIT),
            history: HistoryLimits {
                max_events: overrides
                    .history_max_events
                    .or(file.history_max_events)
                    .unwrap_or(DEFAULT_HISTORY_MAX_EVENTS),
                max_age: match (overrides.history_max_age, &file.history_max_age) {
                    (Some(age), _) => age,
                    (None, Some(text)) => parse_duration(text)
                        .map_err(|e| ConfigError(format!("history_max_age: {e}")))?,
                    (None, None) => DEFAULT_HISTORY_MAX_AGE,
                },
            },
        })
    }
}

impl AgentConfig {
    /// Everything in one local directory: the state in `dir/state`, the socket
    /// `dir/agent.sock`, no TCP, the embedded default pools, no CNI data directory to scan
    /// (for tests and embedding; change the fields as needed).
    pub fn in_dir(dir: &Path) -> AgentConfig {
        AgentConfig {
            data_dir: dir.join("state"),
            socket: dir.join("agent.sock"),
            socket_group: None,
            tcp: None,
            token: None,
            // The embedded default is valid by construction (a unit test loads it).
            pools: pools(&default_pools()).unwrap_or_default(),
            cni_data_dirs: Vec::new(),
            connections: ConnectionLimits::default(),
            pool_wait: DEFAULT_POOL_WAIT,
            history: HistoryLimits::default(),
        }
    }
}

/// The table `table` takes from the configuration file `config` (empty without a file or a
/// table).
fn read_table<T: Default>(
    config: Option<&Path>,
    table: impl FnOnce(ConfigFile) -> Option<T>,
) -> Result<T, ConfigError> {
    match config {
        Some(path) => Ok(table(read_file(path)?).unwrap_or_default()),
        None => Ok(T::default()),
    }
}

fn read_file(path: &Path) -> Result<ConfigFile, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    ConfigFile::parse(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
}

impl ConfigFile {
    /// The file's text, parsed (not yet validated: [`pools`] and the rest of
    /// [`AgentConfig::load`] do that).
    pub fn parse(text: &str) -> Result<ConfigFile, toml::de::Error> {
        toml::from_str(text)
    }
}

/// The `[connections]` table over the defaults; zero is refused (it would serve nothing).
pub(crate) fn connection_limits(file: &ConnectionsFile) -> Result<ConnectionLimits, ConfigError> {
    let defaults = ConnectionLimits::default();
    let positive = |name: &str, value: Option<u64>| match value {
        Some(0) => Err(ConfigError(format!(
            "connections.{name} must be greater than 0"
        ))),
        other => Ok(other),
    };
    let count = |name: &str, value: Option<usize>, default: usize| {
        positive(name, value.map(|v| v as u64)).map(|v| v.map_or(default, |v| v as usize))
    };
    let millis = |name: &str, value: Option<u64>, default: Duration| {
        positive(name, value).map(|v| v.map_or(default, Duration::from_millis))
    };
    Ok(ConnectionLimits {
        max_unix: count("max_unix", file.max_unix, defaults.max_unix)?,
        max_tcp: count("max_tcp", file.max_tcp, defaults.max_tcp)?,
        header_timeout: millis(
            "header_timeout_ms",
            file.header_timeout_ms,
            defaults.header_timeout,
        )?,
        body_timeout: millis(
            "body_timeout_ms",
            file.body_timeout_ms,
            defaults.body_timeout,
        )?,
    })
}

/// Validates the declared pools into the node scope's configuration.
pub fn pools(declared: &[PoolFile]) -> Result<ScopeConfig, ConfigError> {
    let mut out = Vec::new();
    for pool in declared {
        let name = PoolName::new(&pool.name)
            .map_err(|e| ConfigError(format!("pool {:?}: {e}", pool.name)))?;
        if out.iter().any(|p: &PoolSpec| p.name == pool.name) {
            return Err(ConfigError(format!(
                "pool {:?} is declared twice",
                pool.name
            )));
        }
        let ranges = pool
            .ranges
            .iter()
            .map(|r| {
                r.parse::<RangeSpec>()
                    .map_err(|e| ConfigError(format!("pool {}: range {r:?}: {e}", pool.name)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let exclusions = pool
            .exclusions
            .iter()
            .map(|e| {
                if crate::local_routes::is_local_reason(&e.reason) {
                    return Err(ConfigError(format!(
                        "pool {}: exclusion {:?}: a reason starting with {:?} is kept for \
                         the exclusions that reserving local routes makes",
                        pool.name,
                        e.network,
                        e.reason.split(' ').take(2).collect::<Vec<_>>().join(" ")
                    )));
                }
                Exclusion::parse(&e.network, &e.reason).map_err(|err| {
                    ConfigError(format!(
                        "pool {}: exclusion {:?}: {err}",
                        pool.name, e.network
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(
            PoolSpec::new(
                &name,
                Duration::from_millis(pool.cooldown_ms),
                if pool.lowest_free {
                    ReusePolicy::LowestFree
                } else {
                    ReusePolicy::NextFit
                },
                &ranges,
                &exclusions,
            )
            .with_source(RangeSource::File),
        );
    }
    let config = ScopeConfig { pools: out };
    // The file must fit together on its own; how it combines with what was changed at run
    // time is `capacity.rs`'s job.
    crate::capacity::check_disjoint(&config).map_err(ConfigError)?;
    Ok(config)
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

    /// The overrides of `--config FILE` alone.
    fn from_file(file: &tempfile::NamedTempFile) -> Overrides {
        Overrides {
            config: Some(file.path().into()),
            ..Overrides::default()
        }
    }

    /// The configuration of `file` alone.
    fn load(file: &tempfile::NamedTempFile) -> Result<AgentConfig, ConfigError> {
        AgentConfig::load(&from_file(file))
    }

    #[test]
    fn the_cluster_table_names_the_etcd_user_and_password_file() {
        let file = write(
            "[cluster]\netcd_user = \"corral-t-node-a\"\netcd_password_file = \"/etc/corral/a.password\"\n",
        );
        let cluster = cluster_table(Some(file.path())).unwrap();
        assert_eq!(cluster.etcd_user.as_deref(), Some("corral-t-node-a"));
        assert_eq!(
            cluster.etcd_password_file.as_deref(),
            Some(Path::new("/etc/corral/a.password"))
        );
        assert_eq!(cluster_table(None).unwrap(), ClusterTable::default());
        let unknown = write("[cluster]\netcd_password = \"x\"\n");
        let error = cluster_table(Some(unknown.path())).unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
    }

    #[test]
    fn the_cluster_table_names_the_cluster_as_the_operators_does() {
        let file = write("[cluster]\nendpoints = [\"http://10.0.0.1:2379\"]\nname = \"blue\"\n");
        let cluster = cluster_table(Some(file.path())).unwrap();
        assert_eq!(
            cluster.endpoints,
            Some(vec!["http://10.0.0.1:2379".to_owned()])
        );
        assert_eq!(cluster.name.as_deref(), Some("blue"));
        // The operator's checks and messages, naming the file.
        for (text, expected) in [
            (
                "[cluster]\nendpoints = [\"10.0.0.1:2379\"]",
                "cluster.endpoints \"10.0.0.1:2379\" is not an http:// or https:// URL",
            ),
            (
                "[cluster]\nendpoints = []",
                "cluster.endpoints [] is not one URL or more",
            ),
            (
                "[cluster]\netcd_user = \"\"",
                "cluster.etcd_user \"\" is not a user name",
            ),
        ] {
            let bad = write(text);
            let error = cluster_table(Some(bad.path())).unwrap_err();
            assert_eq!(error.0, format!("{}: {expected}", bad.path().display()));
        }
    }

    #[test]
    fn the_cluster_table_names_etcds_tls_files_and_nothing_else() {
        let file = write(
            "[cluster]\netcd_cacert = \"/ca.pem\"\netcd_cert = \"/c.pem\"\netcd_key = \"/k.pem\"\n",
        );
        let cluster = cluster_table(Some(file.path())).unwrap();
        assert_eq!(cluster.etcd_cacert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(cluster.etcd_cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(cluster.etcd_key, Some(PathBuf::from("/k.pem")));
        // The rest of the file is unaffected, and no table means no files.
        load(&file).unwrap();
        assert_eq!(cluster_table(None).unwrap(), ClusterTable::default());
        let unknown = write("[cluster]\netcd_ca = \"/ca.pem\"\n");
        let error = cluster_table(Some(unknown.path())).unwrap_err().to_string();
        assert!(error.contains("etcd_ca"), "{error}");
    }

    #[test]
    fn an_agent_in_a_cluster_has_no_pools_but_those_its_file_declares() {
        let config = AgentConfig::load(&Overrides {
            in_cluster: true,
            ..Overrides::default()
        })
        .unwrap();
        assert!(config.pools.pools.is_empty(), "{:?}", config.pools);
    }

    #[test]
    fn the_embedded_default_is_a_dual_stack_pool_on_production_paths() {
        let config = AgentConfig::load(&Overrides::default()).unwrap();
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(config.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(config.pools.pools.len(), 1);
        let ranges: Vec<&str> = config.pools.pools[0]
            .ranges
            .iter()
            .map(|r| r.range.as_str())
            .collect();
        assert_eq!(ranges, ["10.88.0.0/16", "fd88::/64"]);
        assert!(
            config.pools.pools[0]
                .ranges
                .iter()
                .all(|r| r.source == RangeSource::File)
        );
        assert_eq!(config.cni_data_dirs, [PathBuf::from(DEFAULT_CNI_DATA_DIR)]);
    }

    #[test]
    fn a_file_is_read_and_flags_win() {
        let file = write(
            "data_dir = \"/tmp/x\"\nsocket = \"/tmp/x.sock\"\n\
             cni_data_dirs = [\"/tmp/cni\"]\n\
             [[pools]]\nname = \"blue\"\nranges = [\"10.1.0.0/24\"]\n\
             exclusions = [{ network = \"10.1.0.0/28\", reason = \"infra\" }]\n",
        );
        let config = AgentConfig::load(&Overrides {
            socket: Some("/tmp/flag.sock".into()),
            ..from_file(&file)
        })
        .unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(config.socket, PathBuf::from("/tmp/flag.sock"));
        assert_eq!(config.pools.pools[0].name, "blue");
        assert_eq!(config.pools.pools[0].exclusions.len(), 1);
        assert_eq!(config.cni_data_dirs, [PathBuf::from("/tmp/cni")]);
        assert_eq!(config.connections, ConnectionLimits::default());
        let flagged = AgentConfig::load(&Overrides {
            cni_data_dirs: Some(vec!["/a".into(), "/b".into()]),
            ..from_file(&file)
        })
        .unwrap();
        assert_eq!(
            flagged.cni_data_dirs,
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
    }

    #[test]
    fn history_bounds_come_from_the_file_and_flags_win() {
        let defaults = AgentConfig::load(&Overrides::default()).unwrap();
        assert_eq!(defaults.history, HistoryLimits::default());
        assert_eq!(defaults.history.max_events, 1_000_000);
        assert_eq!(defaults.history.max_age, Duration::from_secs(30 * 86_400));
        let file = write("history_max_events = 5000\nhistory_max_age = \"12h\"\n");
        let config = load(&file).unwrap();
        assert_eq!(
            config.history,
            HistoryLimits {
                max_events: 5000,
                max_age: Duration::from_secs(12 * 3600),
            }
        );
        let flagged = AgentConfig::load(&Overrides {
            history_max_events: Some(7),
            history_max_age: Some(Duration::from_secs(90)),
            ..from_file(&file)
        })
        .unwrap();
        assert_eq!(flagged.history.max_events, 7);
        assert_eq!(flagged.history.max_age, Duration::from_secs(90));
        let bad = write("history_max_age = \"a month\"\n");
        let error = load(&bad).unwrap_err();
        assert!(error.0.contains("history_max_age"), "{}", error.0);
        for (text, millis) in [
            ("250ms", 250),
            ("90s", 90_000),
            ("2m", 120_000),
            ("1d", 86_400_000),
        ] {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(millis)));
        }
        for bad in ["", "30", "d", "1.5h", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn connection_limits_come_from_the_connections_table() {
        let file = write("[connections]\nmax_tcp = 16\nheader_timeout_ms = 1500\n");
        let config = load(&file).unwrap();
        assert_eq!(
            config.connections,
            ConnectionLimits {
                max_tcp: 16,
                header_timeout: Duration::from_millis(1500),
                ..ConnectionLimits::default()
            }
        );
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (text, needle) in [
            ("nonsense = 1", "unknown field"),
            (
                "[[pools]]\nname = \"a\"\nexclusions = [{ network = \"10.1.0.5\", reason = \"local address of the VIP\" }]",
                "kept for the exclusions that reserving local routes makes",
            ),
            ("[[pools]]\nname = \"a b\"", "pool \"a b\""),
            (
                "[[pools]]\nname = \"p\"\nranges = [\"10.0.0.0/33\"]",
                "range",
            ),
            (
                "[[pools]]\nname = \"p\"\n[[pools]]\nname = \"p\"",
                "declared twice",
            ),
            (
                "[connections]\nmax_tcp = 0",
                "connections.max_tcp must be greater than 0",
            ),
            ("[connections]\nheader_timeout_ms = 0", "header_timeout_ms"),
            ("[connections]\nmax_files = 1", "unknown field"),
            ("tcp = \"10.1.2.3:80\"", "loopback"),
            ("tcp = \"127.0.0.1:80\"", "token"),
        ] {
            let file = write(text);
            // The TCP checks must not see a token from the environment.
            let error = AgentConfig::load(&Overrides {
                token_file: None,
                ..from_file(&file)
            })
            .map(|_| ())
            .unwrap_err();
            if needle == "token" && std::env::var_os("CORRAL_TOKEN").is_some() {
                continue;
            }
            assert!(error.0.contains(needle), "{text}: {}", error.0);
        }
    }

    #[test]
    fn a_socket_group_is_a_gid_or_a_name_in_the_group_database() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("group");
        std::fs::write(&database, "root:x:0:\ncorral:x:991:alice,bob\nbroken\n").unwrap();
        let named = SocketGroup::resolve_in("corral", &database).unwrap();
        assert_eq!((named.name.as_str(), named.gid), ("corral", 991));
        assert_eq!(
            SocketGroup::resolve_in("4242", &database).unwrap().gid,
            4242
        );
        let error = SocketGroup::resolve_in("nobody-here", &database).unwrap_err();
        assert_eq!(
            error.0,
            format!(
                "socket_group nobody-here: no such group in {} (create it, e.g. groupadd \
                 --system nobody-here, or give a numeric GID)",
                database.display()
            )
        );
        assert!(SocketGroup::resolve_in("", &database).is_err());
    }

    #[test]
    fn a_configuration_printed_with_debug_never_shows_its_token() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "config-dump-secret-0123456789").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let config = AgentConfig::load(&Overrides {
            data_dir: Some(dir.path().join("state")),
            tcp: Some("127.0.0.1:9876".parse().unwrap()),
            token_file: Some(token),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(
            config.token.as_ref().map(BearerToken::as_str),
            Some("config-dump-secret-0123456789")
        );
        let dump = format!("{config:?} {config:#?}");
        assert!(!dump.contains("config-dump-secret"), "{dump}");
        assert!(dump.contains("BearerToken(***)"), "{dump}");
    }
}
