//! The configuration as written in the file and stored in etcd: pools flat, every mode's
//! fields side by side (`mode = "blocks"` beside `watermarks`, `cloud`, `cloud_sync`), checked
//! into the typed [`ClusterConfig`] in one pass whose first broken rule names its field.
//!
//! The typed form reads and writes only through this one (`Serialize`, `Deserialize`), so the
//! bytes stored and printed are the flat form's, and every path that reads a configuration
//! (the file, the `config` key, `config-applied`) checks the same rules in the same order.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::pool::{CloudPool, DemandConfig, PoolConfig, PoolKind, families};
use super::{
    CloudPoolConfig, ClusterConfig, ConfigError, FamilyConfig, HistoryConfig, MAX_LEASE_TTL_SECS,
    NodeCidrSync, NodeIdPlanConfig, PoolMode, ResyncConfig, WatermarkOverride, Watermarks,
    default_quarantine_secs, invalid, validate_family,
};
use crate::keys::NodeName;

impl ClusterConfig {
    /// Parses and validates the TOML configuration file's text.
    pub fn from_toml(text: &str) -> Result<ClusterConfig, ConfigError> {
        let raw: RawClusterConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            message: e.to_string().trim().replace('\n', " "),
        })?;
        ClusterConfig::try_from(raw)
    }

    /// Parses and validates the JSON stored under the `config` key.
    pub fn from_json(bytes: &[u8]) -> Result<ClusterConfig, ConfigError> {
        let raw: RawClusterConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Parse {
                message: e.to_string(),
            })?;
        ClusterConfig::try_from(raw)
    }

    /// Checks every rule, as reading the configuration does (a configuration built or
    /// changed in code may break one); the error names the first field that breaks one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ClusterConfig::try_from(RawClusterConfig::from(self.clone())).map(drop)
    }
}

impl Serialize for ClusterConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RawClusterConfig::from(self.clone()).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ClusterConfig {
    /// Reads the flat form and checks it: a configuration that breaks a rule does not decode.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ClusterConfig, D::Error> {
        let raw = RawClusterConfig::deserialize(deserializer)?;
        ClusterConfig::try_from(raw).map_err(serde::de::Error::custom)
    }
}

/// The cluster configuration as written in the file and stored: [`ClusterConfig`] with each
/// pool flat ([`RawPoolConfig`]), not yet checked. Named `ClusterConfig` in parse errors.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "struct ClusterConfig")]
struct RawClusterConfig {
    #[serde(default = "default_quarantine_secs")]
    quarantine_secs: u64,
    #[serde(default)]
    resync: ResyncConfig,
    #[serde(default)]
    pools: Vec<RawPoolConfig>,
    node_ids: Option<NodeIdPlanConfig>,
    default_pool: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    namespaces: BTreeMap<String, String>,
    #[serde(
        default = "default_history_max_events",
        skip_serializing_if = "is_default_history_max_events"
    )]
    history_max_events: u64,
    #[serde(
        default = "default_history_max_age_secs",
        skip_serializing_if = "is_default_history_max_age_secs"
    )]
    history_max_age_secs: u64,
    #[serde(
        default = "default_demand_writes_per_sec",
        skip_serializing_if = "is_default_demand_writes_per_sec"
    )]
    demand_writes_per_sec: u64,
}

fn default_demand_writes_per_sec() -> u64 {
    super::DEFAULT_DEMAND_WRITES_PER_SEC
}
fn is_default_demand_writes_per_sec(value: &u64) -> bool {
    *value == default_demand_writes_per_sec()
}

fn default_history_max_events() -> u64 {
    crate::history::DEFAULT_HISTORY_MAX_EVENTS
}
fn is_default_history_max_events(value: &u64) -> bool {
    *value == default_history_max_events()
}
fn default_history_max_age_secs() -> u64 {
    crate::history::DEFAULT_HISTORY_MAX_AGE_SECS
}
fn is_default_history_max_age_secs(value: &u64) -> bool {
    *value == default_history_max_age_secs()
}

impl From<ClusterConfig> for RawClusterConfig {
    fn from(config: ClusterConfig) -> RawClusterConfig {
        RawClusterConfig {
            quarantine_secs: config.quarantine_secs,
            resync: config.resync,
            pools: config.pools.into_iter().map(RawPoolConfig::from).collect(),
            node_ids: config.node_ids,
            default_pool: config.default_pool,
            namespaces: config.namespaces,
            history_max_events: config.history.max_events,
            history_max_age_secs: config.history.max_age_secs,
            demand_writes_per_sec: config.demand_writes_per_sec,
        }
    }
}

impl TryFrom<RawClusterConfig> for ClusterConfig {
    type Error = ConfigError;

    /// Checks every rule, in order; the error names the first field that breaks one.
    fn try_from(raw: RawClusterConfig) -> Result<ClusterConfig, ConfigError> {
        let RawClusterConfig {
            quarantine_secs,
            resync,
            pools: raw_pools,
            node_ids,
            default_pool,
            namespaces,
            history_max_events,
            history_max_age_secs,
            demand_writes_per_sec,
        } = raw;
        if history_max_age_secs < 1 {
            return Err(invalid("history_max_age_secs", "must be at least 1"));
        }
        if demand_writes_per_sec < 1 {
            return Err(invalid(
                "demand_writes_per_sec",
                "must be at least 1 (the demand writes a second of every node together)",
            ));
        }
        if quarantine_secs < 1 {
            return Err(invalid("quarantine_secs", "must be at least 1"));
        }
        if quarantine_secs > MAX_LEASE_TTL_SECS {
            return Err(invalid(
                "quarantine_secs",
                format!(
                    "{quarantine_secs} is longer than etcd's longest lease ({MAX_LEASE_TTL_SECS} s): every node removal would fail"
                ),
            ));
        }
        let r = &resync;
        for (field, value) in [
            ("resync.resync_ms", r.resync_ms),
            ("resync.initial_retry_ms", r.initial_retry_ms),
            ("resync.max_backoff_ms", r.max_backoff_ms),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be at least 1"));
            }
        }
        if r.initial_retry_ms > r.max_backoff_ms {
            return Err(invalid(
                "resync.initial_retry_ms",
                format!(
                    "{} is more than resync.max_backoff_ms {}",
                    r.initial_retry_ms, r.max_backoff_ms
                ),
            ));
        }
        if raw_pools.is_empty() && node_ids.is_none() {
            return Err(invalid(
                "pools",
                "at least one pool or node_ids must be configured",
            ));
        }
        let mut names = BTreeSet::new();
        // Every cluster CIDR seen so far, with its field path, to refuse overlaps.
        let mut seen: Vec<(String, IpNet)> = Vec::new();
        let mut pools = Vec::with_capacity(raw_pools.len());
        for (i, raw) in raw_pools.into_iter().enumerate() {
            if !names.insert(raw.name.clone()) {
                return Err(invalid(
                    format!("pools[{i}].name"),
                    format!("pool {} is configured twice", raw.name),
                ));
            }
            if raw.ipv4.is_none() && raw.ipv6.is_none() {
                return Err(invalid(
                    format!("pools[{i}]"),
                    "a pool needs ipv4 or ipv6 (or both)",
                ));
            }
            let pool = raw.into_pool(i)?;
            for (family, config) in pool.families() {
                let path = format!("pools[{i}].{}", family.name());
                validate_family(&path, family, config, pool.is_cloud(), &mut seen)?;
            }
            pools.push(pool);
        }
        if let Some(pool) = &default_pool
            && !PoolName::new(pool).is_ok_and(|p| names.contains(&p))
        {
            return Err(invalid(
                "default_pool",
                format!("pool {pool} is not configured"),
            ));
        }
        for (namespace, pool) in &namespaces {
            let field = format!("namespaces.{namespace}");
            if NodeName::new(namespace).is_err() {
                return Err(invalid(field, "not a valid namespace name"));
            }
            match PoolName::new(pool) {
                Ok(name) if names.contains(&name) => {}
                _ => return Err(invalid(field, format!("pool {pool} is not configured"))),
            }
        }
        if let Some(plan) = &node_ids {
            let cidrs: Vec<(Family, Vec<IpNet>)> = pools
                .iter()
                .flat_map(|p| p.families().map(|(f, c)| (f, c.cidrs.clone())))
                .collect();
            plan.validate(&cidrs)?;
        }
        Ok(ClusterConfig {
            quarantine_secs,
            resync,
            pools,
            node_ids,
            default_pool,
            namespaces,
            history: HistoryConfig {
                max_events: history_max_events,
                max_age_secs: history_max_age_secs,
            },
            demand_writes_per_sec,
        })
    }
}

/// A pool as written in the file and stored: every mode's fields side by side, checked
/// against its mode by [`RawPoolConfig::into_pool`]. Named `PoolConfig` in parse errors, as
/// the file knows it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "struct PoolConfig")]
struct RawPoolConfig {
    #[serde(with = "crate::text")]
    name: PoolName,
    #[serde(default, skip_serializing_if = "is_default_mode")]
    mode: PoolMode,
    watermarks: Option<Watermarks>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    node_watermarks: BTreeMap<String, WatermarkOverride>,
    release_delay_secs: Option<u64>,
    cloud: Option<CloudPoolConfig>,
    max_pods: Option<u64>,
    cloud_sync: Option<NodeCidrSync>,
    ipv4: Option<FamilyConfig>,
    ipv6: Option<FamilyConfig>,
}

fn is_default_mode(mode: &PoolMode) -> bool {
    *mode == PoolMode::NodeCidr
}

impl From<PoolConfig> for RawPoolConfig {
    fn from(pool: PoolConfig) -> RawPoolConfig {
        let mode = pool.mode();
        let (demand, cloud, cloud_sync) = match pool.kind {
            PoolKind::NodeCidr { cloud_sync } => (DemandConfig::default(), None, cloud_sync),
            PoolKind::Blocks(demand) => (demand, None, None),
            PoolKind::Cloud(CloudPool { demand, cloud }) => (demand, cloud, None),
        };
        RawPoolConfig {
            name: pool.name,
            mode,
            watermarks: demand.watermarks,
            node_watermarks: demand.node_watermarks,
            release_delay_secs: demand.release_delay_secs,
            cloud,
            max_pods: demand.max_pods,
            cloud_sync,
            ipv4: pool.ipv4,
            ipv6: pool.ipv6,
        }
    }
}

impl RawPoolConfig {
    /// The pool `pools[i]` typed by its mode: a field of another mode is refused (watermarks,
    /// per-node overrides, the release delay and the pod cap belong to block-mode and cloud
    /// pools only, the `cloud` table to cloud pools, `cloud_sync` to node-cidr pools), and so
    /// is a value the mode does not accept.
    fn into_pool(self, i: usize) -> Result<PoolConfig, ConfigError> {
        let path = format!("pools[{i}]");
        if self.cloud.is_some() && self.mode != PoolMode::Cloud {
            return Err(invalid(
                format!("{path}.cloud"),
                "applies only to a pool with mode = \"cloud\"",
            ));
        }
        if self.cloud_sync.is_some() && self.mode != PoolMode::NodeCidr {
            return Err(invalid(
                format!("{path}.cloud_sync"),
                "applies only to a pool with mode = \"node-cidr\"",
            ));
        }
        for (family, config) in families(&self.ipv4, &self.ipv6) {
            let field = format!("{path}.{}.node_prefix_len", family.name());
            if self.mode == PoolMode::Cloud {
                if config.node_prefix_len != 0 && config.node_prefix_len != family.bits() {
                    return Err(invalid(
                        field,
                        "a cloud pool's addresses are chosen by the cloud: leave it out",
                    ));
                }
            } else if config.node_prefix_len == 0 {
                return Err(invalid(field, "is required"));
            }
        }
        if self.max_pods == Some(0) {
            return Err(invalid(format!("{path}.max_pods"), "must be at least 1"));
        }
        let demand = DemandConfig {
            watermarks: self.watermarks,
            node_watermarks: self.node_watermarks,
            release_delay_secs: self.release_delay_secs,
            max_pods: self.max_pods,
        };
        let kind = match self.mode {
            PoolMode::Cloud => {
                let cloud = CloudPool {
                    demand,
                    cloud: self.cloud,
                };
                cloud.validate(&path)?;
                PoolKind::Cloud(cloud)
            }
            PoolMode::NodeCidr => {
                // A node-CIDR pool's node holds its whole CIDR: node_prefix_len sizes it.
                let stray = [
                    ("watermarks", demand.watermarks.is_some()),
                    ("node_watermarks", !demand.node_watermarks.is_empty()),
                    ("release_delay_secs", demand.release_delay_secs.is_some()),
                    ("max_pods", demand.max_pods.is_some()),
                ];
                if let Some((field, _)) = stray.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        format!("{path}.{field}"),
                        "applies only to a pool with mode = \"blocks\" or \"cloud\"",
                    ));
                }
                PoolKind::NodeCidr {
                    cloud_sync: self.cloud_sync,
                }
            }
            PoolMode::Blocks => {
                demand.validate(&path)?;
                validate_block_sizes(&path, &self.ipv4, &self.ipv6)?;
                PoolKind::Blocks(demand)
            }
        };
        Ok(PoolConfig {
            name: self.name,
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            kind,
        })
    }
}

/// At most 2^32 addresses a block (counts stay far from overflow), and no block of fewer than
/// 4 (it would be mostly network and broadcast).
fn validate_block_sizes(
    path: &str,
    ipv4: &Option<FamilyConfig>,
    ipv6: &Option<FamilyConfig>,
) -> Result<(), ConfigError> {
    for (family, config) in families(ipv4, ipv6) {
        if family.bits().saturating_sub(config.node_prefix_len) > 32 {
            return Err(invalid(
                format!("{path}.{}.block_prefix_len", family.name()),
                format!(
                    "/{} blocks are too large (at least /{})",
                    config.node_prefix_len,
                    family.bits() - 32
                ),
            ));
        }
        if family.bits().saturating_sub(config.node_prefix_len) < 2 {
            return Err(invalid(
                format!("{path}.{}.block_prefix_len", family.name()),
                format!(
                    "/{} blocks are too small (at most /{})",
                    config.node_prefix_len,
                    family.bits() - 2
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        AppliedConfigRecord, CloudPool, DemandConfig, NodeCidrSync, PoolKind, ReleasePolicy,
        WarmTargets,
    };
    use crate::keys::{decode_value, encode_value};

    /// One configuration per mode, every field of the mode given and every default spelled out
    /// (as the stored JSON carries them), with the JSON stored for it before pools were typed.
    const ROUND_TRIPS: [(&str, &str); 3] = [
        (
            r#"quarantine_secs = 300

[resync]
resync_ms = 30000
initial_retry_ms = 250
max_backoff_ms = 10000

[[pools]]
name = "nodes"
cloud_sync = "to-cloud"

[pools.ipv4]
cidrs = ["10.1.0.0/16"]
node_prefix_len = 24
reserved = ["10.1.0.0/20"]

[pools.ipv6]
cidrs = ["fd00:1::/48"]
node_prefix_len = 64
reserved = []
"#,
            r#"{"quarantine_secs":300,"resync":{"resync_ms":30000,"initial_retry_ms":250,"max_backoff_ms":10000},"pools":[{"name":"nodes","cloud_sync":"to-cloud","ipv4":{"cidrs":["10.1.0.0/16"],"node_prefix_len":24,"reserved":["10.1.0.0/20"]},"ipv6":{"cidrs":["fd00:1::/48"],"node_prefix_len":64,"reserved":[]}}]}"#,
        ),
        (
            r#"quarantine_secs = 60
default_pool = "pods"

[resync]
resync_ms = 1000
initial_retry_ms = 100
max_backoff_ms = 5000

[[pools]]
name = "pods"
mode = "blocks"
release_delay_secs = 60
max_pods = 110

[pools.watermarks]
pre_allocate = 4
min_allocate = 15
max_above_watermark = 4
max_allocate = 0

[pools.node_watermarks.big-node]
pre_allocate = 32

[pools.ipv4]
cidrs = ["10.64.0.0/16"]
node_prefix_len = 26
reserved = ["10.64.0.0/24"]

[[pools]]
name = "batch"
mode = "blocks"

[pools.ipv6]
cidrs = ["fd00:64::/64"]
node_prefix_len = 122
reserved = []

[namespaces]
batch = "batch"
"#,
            r#"{"quarantine_secs":60,"resync":{"resync_ms":1000,"initial_retry_ms":100,"max_backoff_ms":5000},"pools":[{"name":"pods","mode":"blocks","watermarks":{"pre_allocate":4,"min_allocate":15,"max_above_watermark":4,"max_allocate":0},"node_watermarks":{"big-node":{"pre_allocate":32}},"release_delay_secs":60,"max_pods":110,"ipv4":{"cidrs":["10.64.0.0/16"],"node_prefix_len":26,"reserved":["10.64.0.0/24"]}},{"name":"batch","mode":"blocks","ipv6":{"cidrs":["fd00:64::/64"],"node_prefix_len":122,"reserved":[]}}],"default_pool":"pods","namespaces":{"batch":"batch"}}"#,
        ),
        (
            r#"quarantine_secs = 300

[resync]
resync_ms = 30000
initial_retry_ms = 250
max_backoff_ms = 10000

[[pools]]
name = "vpc"
mode = "cloud"
release_delay_secs = 30
max_pods = 29

[pools.watermarks]
pre_allocate = 8
min_allocate = 0
max_above_watermark = 4
max_allocate = 0

[pools.node_watermarks.n1]
max_allocate = 20

[pools.cloud]
prefix_delegation = true
subnet_ids = ["subnet-1"]
security_groups = ["sg-1"]
first_interface_index = 0
gc_interval_secs = 600
gc_max_per_run = 10
release_policy = "spread"

[pools.cloud.subnet_tags]
"corral.io/pods" = "yes"

[pools.cloud.tags]
team = "net"

[pools.ipv4]
cidrs = ["10.0.0.0/16"]
node_prefix_len = 0
reserved = []

[[pools]]
name = "warm"
mode = "cloud"

[pools.cloud]
prefix_delegation = true
first_interface_index = 1
gc_interval_secs = 300
gc_max_per_run = 25

[pools.cloud.warm]
warm_prefix = 1

[pools.ipv4]
cidrs = ["10.2.0.0/16"]
node_prefix_len = 0
reserved = []

[[pools]]
name = "bare"
mode = "cloud"

[pools.ipv4]
cidrs = ["10.3.0.0/16"]
node_prefix_len = 0
reserved = []
"#,
            r#"{"quarantine_secs":300,"resync":{"resync_ms":30000,"initial_retry_ms":250,"max_backoff_ms":10000},"pools":[{"name":"vpc","mode":"cloud","watermarks":{"pre_allocate":8,"min_allocate":0,"max_above_watermark":4,"max_allocate":0},"node_watermarks":{"n1":{"max_allocate":20}},"release_delay_secs":30,"cloud":{"prefix_delegation":true,"subnet_ids":["subnet-1"],"subnet_tags":{"corral.io/pods":"yes"},"security_groups":["sg-1"],"tags":{"team":"net"},"first_interface_index":0,"gc_interval_secs":600,"gc_max_per_run":10,"release_policy":"spread"},"max_pods":29,"ipv4":{"cidrs":["10.0.0.0/16"],"node_prefix_len":0,"reserved":[]}},{"name":"warm","mode":"cloud","cloud":{"warm":{"warm_prefix":1},"prefix_delegation":true,"first_interface_index":1,"gc_interval_secs":300,"gc_max_per_run":25},"ipv4":{"cidrs":["10.2.0.0/16"],"node_prefix_len":0,"reserved":[]}},{"name":"bare","mode":"cloud","ipv4":{"cidrs":["10.3.0.0/16"],"node_prefix_len":0,"reserved":[]}}]}"#,
        ),
    ];

    /// TOML to typed pools to JSON says what the TOML says, byte for byte the JSON stored
    /// before; the JSON reads back to the same typed pools and writes the same bytes.
    #[test]
    fn every_mode_round_trips_through_the_typed_pools_unchanged() {
        for (text, json) in ROUND_TRIPS {
            let config = ClusterConfig::from_toml(text).unwrap();
            let written: serde_json::Value = toml::from_str(text).unwrap();
            let stored = config.to_json().unwrap();
            let stored_value: serde_json::Value = serde_json::from_str(&stored).unwrap();
            assert_eq!(stored_value, written, "{text}");
            assert_eq!(stored, json);
            let back = ClusterConfig::from_json(json.as_bytes()).unwrap();
            assert_eq!(back, config);
            assert_eq!(back.to_json().unwrap(), json);
            // `config-applied` carries it the same way.
            let record = AppliedConfigRecord {
                config_revision: 7,
                config,
            };
            let bytes = encode_value(&record).unwrap();
            assert_eq!(decode_value::<AppliedConfigRecord>(&bytes).unwrap(), record);
        }
        let pools = |i: usize| ClusterConfig::from_toml(ROUND_TRIPS[i].0).unwrap().pools;
        let nodes = pools(0);
        assert_eq!(
            nodes[0].kind,
            PoolKind::NodeCidr {
                cloud_sync: Some(NodeCidrSync::ToCloud)
            }
        );
        assert_eq!(nodes[0].demand(), None);
        let blocks = pools(1);
        let pods = blocks[0].blocks().unwrap();
        assert_eq!(
            (pods.release_delay_secs, pods.max_pods),
            (Some(60), Some(110))
        );
        assert_eq!(pods.watermarks_for("big-node").pre_allocate, 32);
        assert_eq!(blocks[1].kind, PoolKind::Blocks(DemandConfig::default()));
        assert_eq!(blocks[1].cloud_sync(), None);
        let clouds = pools(2);
        let vpc = clouds[0].cloud().unwrap();
        assert_eq!(vpc.demand.max_pods, Some(29));
        assert_eq!(vpc.settings().release_policy(), ReleasePolicy::Spread);
        assert_eq!(
            clouds[1].cloud().unwrap().settings().warm,
            Some(WarmTargets {
                warm_prefix: Some(1),
                ..WarmTargets::default()
            })
        );
        assert_eq!(clouds[2].kind, PoolKind::Cloud(CloudPool::default()));
        assert!(
            clouds
                .iter()
                .all(|p| p.blocks().is_none() && p.demand().is_some())
        );
    }

    const FIRST: &str =
        "[[pools]]\nname = \"a\"\nipv4 = { cidrs = [\"10.1.0.0/16\"], node_prefix_len = 24 }\n\n";

    /// A field of another mode, in the second pool: refused with the same message as when
    /// pools were checked after parsing (and in the same order among the pool's other rules).
    #[test]
    fn each_field_of_another_mode_is_refused_with_its_path() {
        let second = |mode: &str, lines: &str, family: &str| {
            format!(
                "{FIRST}[[pools]]\nname = \"b\"\n{mode}{lines}\n[pools.ipv4]\ncidrs = [\"10.2.0.0/16\"]\n{family}"
            )
        };
        let node_cidr = |lines: &str| second("", lines, "node_prefix_len = 24\n");
        let blocks = |lines: &str| second("mode = \"blocks\"\n", lines, "node_prefix_len = 26\n");
        let cloud = |lines: &str| second("mode = \"cloud\"\n", lines, "");
        let cases = [
            (
                node_cidr("[pools.cloud]\nprefix_delegation = true\n"),
                r#"pools[1].cloud: applies only to a pool with mode = "cloud""#,
            ),
            (
                blocks("[pools.cloud]\nprefix_delegation = true\n"),
                r#"pools[1].cloud: applies only to a pool with mode = "cloud""#,
            ),
            (
                blocks("cloud_sync = \"from-cloud\"\n"),
                r#"pools[1].cloud_sync: applies only to a pool with mode = "node-cidr""#,
            ),
            (
                cloud("cloud_sync = \"to-cloud\"\n"),
                r#"pools[1].cloud_sync: applies only to a pool with mode = "node-cidr""#,
            ),
            (
                node_cidr("[pools.watermarks]\npre_allocate = 4\n"),
                r#"pools[1].watermarks: applies only to a pool with mode = "blocks" or "cloud""#,
            ),
            (
                node_cidr("[pools.node_watermarks.n1]\npre_allocate = 4\n"),
                r#"pools[1].node_watermarks: applies only to a pool with mode = "blocks" or "cloud""#,
            ),
            (
                node_cidr("release_delay_secs = 60\n"),
                r#"pools[1].release_delay_secs: applies only to a pool with mode = "blocks" or "cloud""#,
            ),
            (
                node_cidr("max_pods = 110\n"),
                r#"pools[1].max_pods: applies only to a pool with mode = "blocks" or "cloud""#,
            ),
            (
                node_cidr("max_pods = 0\n"),
                r#"pools[1].max_pods: must be at least 1"#,
            ),
            (
                second("", "[pools.watermarks]\npre_allocate = 4\n", ""),
                r#"pools[1].ipv4.node_prefix_len: is required"#,
            ),
            (
                second("", "release_delay_secs = 60\n", "node_prefix_len = 33\n"),
                r#"pools[1].release_delay_secs: applies only to a pool with mode = "blocks" or "cloud""#,
            ),
            (
                cloud("release_delay_secs = 9999999\n[pools.cloud]\ngc_max_per_run = 0\n"),
                r#"pools[1].release_delay_secs: must be at most a week (604800)"#,
            ),
            (
                format!("quarantine_secs = 0\n{}", node_cidr("max_pods = 110\n")),
                r#"quarantine_secs: must be at least 1"#,
            ),
        ];
        for (text, message) in cases {
            match ClusterConfig::from_toml(&text) {
                Err(ConfigError::Invalid { field, problem }) => {
                    assert_eq!(format!("{field}: {problem}"), message, "{text}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // A typed pool changed in code is checked as if read: a node-cidr pool with no
        // prefix length is still refused.
        let mut config = ClusterConfig::from_toml(&node_cidr("")).unwrap();
        config.pools[1].ipv4.as_mut().unwrap().node_prefix_len = 0;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "cluster configuration field pools[1].ipv4.node_prefix_len: is required"
        );
        // An applied record breaking a rule does not decode, and says which rule.
        let bad = encode_value(&AppliedConfigRecord {
            config_revision: 1,
            config,
        })
        .unwrap();
        let error = decode_value::<AppliedConfigRecord>(&bad)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("pools[1].ipv4.node_prefix_len: is required"),
            "{error}"
        );
    }
}
