//! The cluster configuration: parsed from TOML, stored in etcd as JSON, validated, and checked on change.
//!
//! Validation names the field path that is wrong (`pools[0].ipv6.node_prefix_len`), so an
//! operator can fix the file without guessing. What existing grants depend on (node prefix
//! lengths, cluster CIDRs, pools, families, the node-ID plan) can never change once set.

use std::collections::BTreeMap;
use std::net::IpAddr;

use corral_core::{Family, PoolName};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::net::{family_of, overlaps};

mod holdings;
pub(crate) mod node_id_bounds;
mod pool;
mod raw;

pub use holdings::HeldGrant;
pub use node_id_bounds::NodeIdBound;
pub use pool::{CloudPool, DemandConfig, PoolConfig, PoolKind};

/// etcd's longest lease TTL (`MaxLeaseTTL`, 9,000,000,000 s): a quarantine lease asked for
/// longer is refused by etcd, so every removal would fail.
pub const MAX_LEASE_TTL_SECS: u64 = 9_000_000_000;

/// Default budget of demand writes a second, the whole cluster's (`demand_writes_per_sec`):
/// up to 1,000 nodes every node writes its demand up to once a second, as without a budget;
/// at 10,000 nodes once every 10 s, at 100,000 once every 100 s.
pub const DEFAULT_DEMAND_WRITES_PER_SEC: u64 = 1_000;

/// Default quarantine of a released node CIDR or node ID, in seconds.
pub const DEFAULT_QUARANTINE_SECS: u64 = 300;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The text is not valid TOML or JSON of the configuration's shape.
    #[error("cluster configuration does not parse: {message}")]
    Parse {
        /// The parser's message (with its location).
        message: String,
    },
    /// A field holds a value the configuration does not accept.
    #[error("cluster configuration field {field}: {problem}")]
    Invalid {
        /// The field path, e.g. `pools[0].ipv6.node_prefix_len`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

/// nodeipam's resync timing (`Timeout`), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResyncConfig {
    /// Time to the next resync of a node after a success. The leader's full resync waits at
    /// least twenty times as long as its last full read took (a large cluster's read is slow),
    /// and while nodes wait for grants, up to four times this since the last full read.
    #[serde(default = "default_resync_ms")]
    pub resync_ms: u64,
    /// Time to the next try after the first error.
    #[serde(default = "default_initial_retry_ms")]
    pub initial_retry_ms: u64,
    /// The longest wait between tries after repeated errors.
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
}

fn default_resync_ms() -> u64 {
    30_000
}
fn default_initial_retry_ms() -> u64 {
    250
}
fn default_max_backoff_ms() -> u64 {
    10_000
}
fn default_quarantine_secs() -> u64 {
    DEFAULT_QUARANTINE_SECS
}

impl Default for ResyncConfig {
    fn default() -> Self {
        ResyncConfig {
            resync_ms: default_resync_ms(),
            initial_retry_ms: default_initial_retry_ms(),
            max_backoff_ms: default_max_backoff_ms(),
        }
    }
}

/// One family of a pool: the cluster CIDRs node CIDRs are carved from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyConfig {
    /// The cluster CIDRs, in the order given (allocation goes in address order).
    #[serde(with = "crate::text::list")]
    pub cidrs: Vec<IpNet>,
    /// The prefix length of every node CIDR of this family; in a block-mode pool, of every
    /// block (the block size, also spelled `block_prefix_len`). A cloud pool leaves it out
    /// (its CIDRs are the VPC's, and the cloud chooses the addresses).
    #[serde(alias = "block_prefix_len", default)]
    pub node_prefix_len: u8,
    /// Ranges never granted (e.g. service CIDRs); a node CIDR overlapping one is occupied.
    #[serde(default, with = "crate::text::list")]
    pub reserved: Vec<IpNet>,
}

/// How a pool hands its address space to nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolMode {
    /// One node CIDR per node and family, at the family's `node_prefix_len` (nodeipam).
    #[default]
    NodeCidr,
    /// Blocks of `node_prefix_len` (also spelled `block_prefix_len`) granted on demand and
    /// released through the handshake, keeping each node between its watermarks (Cilium's
    /// operator arithmetic, Calico's blocks).
    Blocks,
    /// Addresses and prefixes of cloud interfaces (ENIs) attached to each node's instance,
    /// kept between the watermarks (or AWS VPC CNI's warm targets) by the operator through
    /// the cloud's API; the family's `cidrs` are the VPC's, where every address must lie.
    Cloud,
}

impl PoolMode {
    /// The mode's name as configured.
    pub fn name(self) -> &'static str {
        match self {
            PoolMode::NodeCidr => "node-cidr",
            PoolMode::Blocks => "blocks",
            PoolMode::Cloud => "cloud",
        }
    }
}

/// Where a node-cidr pool's node CIDRs come from besides the cluster (nodeipam's
/// `IPAMFromCloud` and `IPAMFromCluster`); without it the cluster alone grants them
/// (`RangeAllocator`). Needs the operator to run with a cloud provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeCidrSync {
    /// `IPAMFromCloud` (`CloudAllocator`): a node's CIDRs are the prefixes the cloud delegated
    /// to its instance's primary interface (an IPv6 /80, IPv4 /28s) that lie in the family's
    /// `cidrs`, granted through etcd as any node CIDR and kept in sync with the cloud; the
    /// cluster carves nothing itself.
    FromCloud,
    /// `IPAMFromCluster`: the cluster grants node CIDRs as usual and the operator then
    /// delegates each one to the node's instance in the cloud (its primary interface), where
    /// the provider can take a range of that length.
    ToCloud,
}

impl NodeCidrSync {
    /// The setting's name as configured.
    pub fn name(self) -> &'static str {
        match self {
            NodeCidrSync::FromCloud => "from-cloud",
            NodeCidrSync::ToCloud => "to-cloud",
        }
    }
}

/// Default pre-allocate (Cilium's: 0 means 8).
pub const DEFAULT_PRE_ALLOCATE: u64 = 8;
/// Default release delay of an excess block, in seconds (Cilium's `excess-ip-release-delay`).
pub const DEFAULT_RELEASE_DELAY_SECS: u64 = 180;

/// A block pool's watermarks, counted in addresses per node and family (Cilium's
/// `IPAMSpec`): keep at least `pre_allocate` free, hold at least `min_allocate`, take
/// `max_above_watermark` more whenever growing, and never hold more than `max_allocate`
/// (0: no cap; in block mode rounded up to whole blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Watermarks {
    /// Free addresses kept ahead of use.
    #[serde(default = "default_pre_allocate")]
    pub pre_allocate: u64,
    /// Addresses a node holds at least, however few it uses.
    #[serde(default)]
    pub min_allocate: u64,
    /// Extra addresses taken whenever the node grows, and kept above the watermark.
    #[serde(default)]
    pub max_above_watermark: u64,
    /// The most addresses a node holds (0: no cap).
    #[serde(default)]
    pub max_allocate: u64,
}

fn default_pre_allocate() -> u64 {
    DEFAULT_PRE_ALLOCATE
}

impl Default for Watermarks {
    fn default() -> Self {
        Watermarks {
            pre_allocate: DEFAULT_PRE_ALLOCATE,
            min_allocate: 0,
            max_above_watermark: 0,
            max_allocate: 0,
        }
    }
}

/// One node's overrides of a pool's watermarks; a field left out keeps the pool's.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkOverride {
    /// Overrides `pre_allocate`.
    pub pre_allocate: Option<u64>,
    /// Overrides `min_allocate`.
    pub min_allocate: Option<u64>,
    /// Overrides `max_above_watermark`.
    pub max_above_watermark: Option<u64>,
    /// Overrides `max_allocate`.
    pub max_allocate: Option<u64>,
}

impl Watermarks {
    /// These watermarks with `over`'s fields put in.
    pub fn with(self, over: &WatermarkOverride) -> Watermarks {
        Watermarks {
            pre_allocate: over.pre_allocate.unwrap_or(self.pre_allocate),
            min_allocate: over.min_allocate.unwrap_or(self.min_allocate),
            max_above_watermark: over.max_above_watermark.unwrap_or(self.max_above_watermark),
            max_allocate: over.max_allocate.unwrap_or(self.max_allocate),
        }
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if self.max_allocate > 0 {
            for (field, value) in [
                ("min_allocate", self.min_allocate),
                ("pre_allocate", self.pre_allocate),
            ] {
                if value > self.max_allocate {
                    return Err(invalid(
                        format!("{path}.{field}"),
                        format!("{value} is more than max_allocate {}", self.max_allocate),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// AWS VPC CNI's targets (`WARM_IP_TARGET`, `MINIMUM_IP_TARGET`, `WARM_ENI_TARGET`,
/// `WARM_PREFIX_TARGET`), for a cloud pool that uses them instead of watermarks. Counted per
/// node: addresses (IP targets), whole interfaces (ENI target) or /28 prefixes.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmTargets {
    /// Free addresses kept ahead of use.
    pub warm_ip: Option<u64>,
    /// Addresses held at least.
    pub minimum_ip: Option<u64>,
    /// Whole free interfaces kept ahead of use (AWS's default 1 when no IP target is set).
    pub warm_eni: Option<u64>,
    /// Free prefixes kept ahead of use (prefix delegation, without IP targets).
    pub warm_prefix: Option<u64>,
}

/// Default interval of the leaked-interface collector, in seconds (Cilium's ENI GC).
pub const DEFAULT_CLOUD_GC_INTERVAL_SECS: u64 = 300;
/// Default cap of leaked interfaces deleted per collector run (Cilium's).
pub const DEFAULT_CLOUD_GC_MAX_PER_RUN: u32 = 25;
/// Default device index of the first interface corral creates (Cilium's
/// `first-interface-index`: 0 would share the primary's).
pub const DEFAULT_FIRST_INTERFACE_INDEX: u32 = 1;

/// A cloud pool's settings (the `cloud` table of a pool with `mode = "cloud"`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudPoolConfig {
    /// AWS VPC CNI's targets instead of the pool's watermarks.
    pub warm: Option<WarmTargets>,
    /// Delegated prefixes (/28 IPv4, /80 IPv6) instead of single addresses, on instances that
    /// support them; decided per interface (an interface whose subnet has no free aligned /28
    /// takes single addresses, the node's others stay on prefixes).
    #[serde(default)]
    pub prefix_delegation: bool,
    /// Subnets new interfaces are created in (first choice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    /// Tags selecting the subnets new interfaces are created in (second choice; then the
    /// node's own subnet if it has room, then the subnet of its zone with most free).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subnet_tags: BTreeMap<String, String>,
    /// Security groups of new interfaces (default: the primary interface's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// Tags put on every interface corral creates, beside corral's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The device index of the first interface corral creates (default 1).
    #[serde(default = "default_first_interface_index")]
    pub first_interface_index: u32,
    /// How often the leaked-interface collector runs, in seconds (default 300; an interface
    /// is deleted only when seen leaked on two runs at least this far apart).
    #[serde(default = "default_cloud_gc_interval_secs")]
    pub gc_interval_secs: u64,
    /// The most leaked interfaces deleted per run (default 25).
    #[serde(default = "default_cloud_gc_max_per_run")]
    pub gc_max_per_run: u32,
    /// Which interface gives free addresses back when a node holds too many (default:
    /// `empty-interfaces` with warm targets, AWS VPC CNI's way; `spread` with watermarks,
    /// Cilium's).
    pub release_policy: Option<ReleasePolicy>,
}

/// Which interface a cloud pool's release takes free addresses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleasePolicy {
    /// ipamd's: among releases of the same size, the one that empties an interface corral
    /// created (given back once it stayed empty for the release delay, freeing its device
    /// index, attachment and primary address), then the interface with fewest addresses left.
    EmptyInterfaces,
    /// Cilium's (`PrepareIPRelease`): the interface with most free addresses, spreading what
    /// stays over the interfaces.
    Spread,
}

impl CloudPoolConfig {
    /// The release policy in force: the one set, else `empty-interfaces` with warm targets and
    /// `spread` with watermarks.
    pub fn release_policy(&self) -> ReleasePolicy {
        self.release_policy.unwrap_or(if self.warm.is_some() {
            ReleasePolicy::EmptyInterfaces
        } else {
            ReleasePolicy::Spread
        })
    }
}

fn default_first_interface_index() -> u32 {
    DEFAULT_FIRST_INTERFACE_INDEX
}

fn default_cloud_gc_interval_secs() -> u64 {
    DEFAULT_CLOUD_GC_INTERVAL_SECS
}

fn default_cloud_gc_max_per_run() -> u32 {
    DEFAULT_CLOUD_GC_MAX_PER_RUN
}

impl Default for CloudPoolConfig {
    fn default() -> Self {
        CloudPoolConfig {
            warm: None,
            prefix_delegation: false,
            subnet_ids: Vec::new(),
            subnet_tags: BTreeMap::new(),
            security_groups: Vec::new(),
            tags: BTreeMap::new(),
            first_interface_index: DEFAULT_FIRST_INTERFACE_INDEX,
            gc_interval_secs: DEFAULT_CLOUD_GC_INTERVAL_SECS,
            gc_max_per_run: DEFAULT_CLOUD_GC_MAX_PER_RUN,
            release_policy: None,
        }
    }
}

/// Contiv's node-ID address plan (CLUSTER-DESIGN section 4).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeIdPlanConfig {
    /// The pod subnet of all nodes.
    #[serde(with = "crate::text")]
    pub pod_subnet: IpNet,
    /// The prefix length of one node's pod subnet.
    pub pod_subnet_node_prefix_len: u8,
    /// The host interconnect subnet of all nodes (VPP to Linux).
    #[serde(with = "crate::text")]
    pub host_interconnect_subnet: IpNet,
    /// The prefix length of one node's host interconnect subnet.
    pub host_interconnect_node_prefix_len: u8,
    /// The node interconnect network nodes' IPs come from.
    #[serde(with = "crate::text")]
    pub node_interconnect: IpNet,
    /// Addresses of the node interconnect never given to a node.
    #[serde(default)]
    pub node_interconnect_excluded: Vec<IpAddr>,
    /// The VXLAN network nodes' VXLAN IPs come from.
    #[serde(with = "crate::text")]
    pub vxlan: IpNet,
    /// The service network (reported in the plan as is).
    #[serde(with = "crate::text")]
    pub service: IpNet,
    /// The largest node ID, if given: it must fit every network of the plan. Without it the
    /// largest is the most every network holds (`NodeIdPlanConfig::bounds`).
    pub max_node_id: Option<u32>,
}

impl NodeIdPlanConfig {
    /// The largest node ID: `max_node_id` if given, else the fewest node IDs any network of
    /// the plan gives distinct addresses (`bounds`: the pod and host interconnect splits, the
    /// node interconnect's and VXLAN network's usable hosts), at most `u32::MAX`; node IDs run
    /// `1..=max_node_id()`, so no ID wraps onto another's addresses in any network.
    pub fn max_node_id(&self) -> u32 {
        if let Some(max) = self.max_node_id {
            return max;
        }
        let fewest = self.bounds().iter().map(|b| b.node_ids).min().unwrap_or(0);
        u32::try_from(fewest).unwrap_or(u32::MAX)
    }

    /// Each network may be of either family, whatever the pods' (Contiv's IPv6 node
    /// interconnect under IPv4 pods, `TestNodeCIDRIPv6`): each is checked against its own.
    fn validate(&self, config_has: &[(Family, Vec<IpNet>)]) -> Result<(), ConfigError> {
        let bits = family_of(&self.pod_subnet).bits();
        for (field, net) in [
            ("node_ids.pod_subnet", &self.pod_subnet),
            (
                "node_ids.host_interconnect_subnet",
                &self.host_interconnect_subnet,
            ),
            ("node_ids.node_interconnect", &self.node_interconnect),
            ("node_ids.vxlan", &self.vxlan),
            ("node_ids.service", &self.service),
        ] {
            check_host_bits_zero(field, net)?;
        }
        // The pods of a node are hosts 2..broadcast-2: at least 3 host bits.
        let pod = self.pod_subnet_node_prefix_len;
        if pod < self.pod_subnet.prefix_len() || pod > bits - 3 {
            return Err(invalid(
                "node_ids.pod_subnet_node_prefix_len",
                format!(
                    "{pod} must be between the pod subnet's prefix length {} and {} (room for a gateway, a NAT loopback and pods)",
                    self.pod_subnet.prefix_len(),
                    bits - 3
                ),
            ));
        }
        let host = self.host_interconnect_node_prefix_len;
        let host_bits = family_of(&self.host_interconnect_subnet).bits();
        if host < self.host_interconnect_subnet.prefix_len() || host > host_bits - 2 {
            return Err(invalid(
                "node_ids.host_interconnect_node_prefix_len",
                format!(
                    "{host} must be between the host interconnect subnet's prefix length {} and {} (room for the VPP and Linux ends)",
                    self.host_interconnect_subnet.prefix_len(),
                    host_bits - 2
                ),
            ));
        }
        for (field, net) in [
            ("node_ids.node_interconnect", &self.node_interconnect),
            ("node_ids.vxlan", &self.vxlan),
        ] {
            if net.prefix_len() >= family_of(net).bits() {
                return Err(invalid(field, format!("{net} has no host addresses")));
            }
        }
        for (i, addr) in self.node_interconnect_excluded.iter().enumerate() {
            if !self.node_interconnect.contains(addr) {
                return Err(invalid(
                    format!("node_ids.node_interconnect_excluded[{i}]"),
                    format!(
                        "{addr} is not inside node_interconnect {}",
                        self.node_interconnect
                    ),
                ));
            }
        }
        let named = [
            ("node_ids.pod_subnet", &self.pod_subnet),
            (
                "node_ids.host_interconnect_subnet",
                &self.host_interconnect_subnet,
            ),
            ("node_ids.node_interconnect", &self.node_interconnect),
            ("node_ids.vxlan", &self.vxlan),
        ];
        for (i, (field, net)) in named.iter().enumerate() {
            for (other_field, other) in &named[..i] {
                if overlaps(net, other) {
                    return Err(invalid(
                        *field,
                        format!("{net} overlaps {other_field} {other}"),
                    ));
                }
            }
            for (pool_family, cidrs) in config_has {
                if *pool_family != family_of(net) {
                    continue;
                }
                if let Some(cidr) = cidrs.iter().find(|c| overlaps(c, net)) {
                    return Err(invalid(
                        *field,
                        format!("{net} overlaps the pools' cluster CIDR {cidr}"),
                    ));
                }
            }
        }
        self.validate_bounds()
    }
}

/// How many subnets of `prefix_len` a network splits into (saturating).
fn split_count(net: &IpNet, prefix_len: u8) -> u128 {
    let bits = u32::from(prefix_len.saturating_sub(net.prefix_len()));
    crate::net::pow2_saturating(bits)
}

/// The whole cluster configuration (the `config` key's value). It reads and writes in the
/// file's flat form (`config/raw.rs`), and reading it checks every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How long a released node CIDR or node ID waits before reuse, in seconds (>= 1).
    pub quarantine_secs: u64,
    /// Resync timing per node.
    pub resync: ResyncConfig,
    /// The pools of node CIDRs.
    pub pools: Vec<PoolConfig>,
    /// Contiv's node-ID plan, if node IDs are granted.
    pub node_ids: Option<NodeIdPlanConfig>,
    /// The pool a CNI call uses when it names none and its namespace maps to none (default:
    /// `default`).
    pub default_pool: Option<String>,
    /// Pools per workload: a Kubernetes namespace (`K8S_POD_NAMESPACE` in `CNI_ARGS`) to the
    /// pool its pods take addresses from.
    pub namespaces: BTreeMap<String, String>,
    /// The bounds of the grants' history (`history_max_events`, `history_max_age_secs`).
    pub history: HistoryConfig,
    /// The most `demand/` writes a second of every agent together (>= 1): each node writes
    /// its demand at most once per `nodes / demand_writes_per_sec` seconds
    /// (`crate::census::demand_interval`), urgent changes first.
    pub demand_writes_per_sec: u64,
}

/// The bounds of the grants' history the leader keeps in etcd (`crate::history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryConfig {
    /// Events kept at most (the oldest go first); 0 keeps none.
    pub max_events: u64,
    /// How long an event is kept at most, in seconds.
    pub max_age_secs: u64,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            max_events: crate::history::DEFAULT_HISTORY_MAX_EVENTS,
            max_age_secs: crate::history::DEFAULT_HISTORY_MAX_AGE_SECS,
        }
    }
}

impl HistoryConfig {
    /// The bounds as the trimming takes them.
    pub fn bounds(&self) -> crate::history::Bounds {
        crate::history::Bounds {
            max_events: self.max_events,
            max_age_ms: self.max_age_secs.saturating_mul(1000),
        }
    }
}

/// Which rule chose the pool of a CNI call ([`ClusterConfig::choose_pool`]), in the order
/// they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRule {
    /// The call named it (`runtimeConfig.pool`, `args.cni.pool`).
    Requested,
    /// The pod's namespace maps to it (`namespaces`).
    Namespace,
    /// The network's configuration names it (`ipam.pool`).
    Network,
    /// The cluster's `default_pool`.
    DefaultPool,
    /// Nothing named a pool: `default`.
    Default,
}

impl PoolRule {
    /// The rule's name on the wire (`runtime_config`, `namespace`, `network`, `default_pool`,
    /// `default`).
    pub fn as_str(self) -> &'static str {
        match self {
            PoolRule::Requested => "runtime_config",
            PoolRule::Namespace => "namespace",
            PoolRule::Network => "network",
            PoolRule::DefaultPool => "default_pool",
            PoolRule::Default => "default",
        }
    }

    /// The rule named `name` ([`PoolRule::as_str`]).
    pub fn parse(name: &str) -> Option<PoolRule> {
        [
            PoolRule::Requested,
            PoolRule::Namespace,
            PoolRule::Network,
            PoolRule::DefaultPool,
            PoolRule::Default,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

impl ClusterConfig {
    /// The JSON stored under the `config` key.
    pub fn to_json(&self) -> Result<String, ConfigError> {
        serde_json::to_string(self).map_err(|e| ConfigError::Parse {
            message: e.to_string(),
        })
    }

    /// The pool named `name`, if configured.
    pub fn pool(&self, name: &PoolName) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| &p.name == name)
    }

    /// The pool a CNI call takes its address from: the pool the call names
    /// (`runtimeConfig.pool`, `args.cni.pool`), else its Kubernetes namespace's pool
    /// (`namespaces`), else the network's own pool (`ipam.pool`), else `default_pool`, else
    /// `default`. Empty names count as none.
    pub fn pool_for(
        &self,
        named: Option<&str>,
        namespace: Option<&str>,
        configured: Option<&str>,
    ) -> String {
        self.choose_pool(named, namespace, configured).0
    }

    /// [`ClusterConfig::pool_for`], and the rule that chose the pool.
    pub fn choose_pool(
        &self,
        named: Option<&str>,
        namespace: Option<&str>,
        configured: Option<&str>,
    ) -> (String, PoolRule) {
        let given = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        if let Some(pool) = given(named) {
            return (pool, PoolRule::Requested);
        }
        if let Some(pool) = given(namespace).and_then(|ns| self.namespaces.get(&ns).cloned()) {
            return (pool, PoolRule::Namespace);
        }
        if let Some(pool) = given(configured) {
            return (pool, PoolRule::Network);
        }
        match &self.default_pool {
            Some(pool) => (pool.clone(), PoolRule::DefaultPool),
            None => ("default".to_owned(), PoolRule::Default),
        }
    }

    /// The largest node ID of the node-ID plan (0 when there is none).
    pub fn max_node_id(&self) -> u32 {
        self.node_ids
            .as_ref()
            .map_or(0, NodeIdPlanConfig::max_node_id)
    }

    /// Refuses a change existing grants could depend on: a pool, a family or a cluster CIDR
    /// removed, a node prefix length changed, or the node-ID plan's subnets or prefix lengths
    /// changed (or the plan removed). Adding pools, CIDRs and reserved ranges, and changing
    /// quarantine or resync timing, are allowed. `new` must be valid on its own.
    pub fn check_change(old: &ClusterConfig, new: &ClusterConfig) -> Result<(), ConfigError> {
        new.validate()?;
        for old_pool in &old.pools {
            let Some((j, new_pool)) = new
                .pools
                .iter()
                .enumerate()
                .find(|(_, p)| p.name == old_pool.name)
            else {
                return Err(invalid(
                    "pools",
                    format!(
                        "pool {} cannot be removed once set (nodes may hold grants from it)",
                        old_pool.name
                    ),
                ));
            };
            if new_pool.mode() != old_pool.mode() {
                return Err(invalid(
                    format!("pools[{j}].mode"),
                    format!(
                        "cannot change once set (was {}, now {})",
                        old_pool.mode().name(),
                        new_pool.mode().name()
                    ),
                ));
            }
            if new_pool.cloud_sync() != old_pool.cloud_sync() {
                let name = |sync: Option<NodeCidrSync>| sync.map_or("none", NodeCidrSync::name);
                return Err(invalid(
                    format!("pools[{j}].cloud_sync"),
                    format!(
                        "cannot change once set (was {}, now {})",
                        name(old_pool.cloud_sync()),
                        name(new_pool.cloud_sync())
                    ),
                ));
            }
            for (family, old_family) in old_pool.families() {
                let path = format!("pools[{j}].{}", family.name());
                let Some(new_family) = new_pool.family(family) else {
                    return Err(invalid(
                        path,
                        format!(
                            "family {} of pool {} cannot be removed once set",
                            family.name(),
                            old_pool.name
                        ),
                    ));
                };
                if new_family.node_prefix_len != old_family.node_prefix_len {
                    return Err(invalid(
                        format!("{path}.node_prefix_len"),
                        format!(
                            "cannot change once set (was {}, now {})",
                            old_family.node_prefix_len, new_family.node_prefix_len
                        ),
                    ));
                }
                for cidr in &old_family.cidrs {
                    if !new_family.cidrs.contains(cidr) {
                        return Err(invalid(
                            format!("{path}.cidrs"),
                            format!("cluster CIDR {cidr} cannot be removed once set"),
                        ));
                    }
                }
            }
        }
        match (&old.node_ids, &new.node_ids) {
            (None, _) => {}
            (Some(_), None) => {
                return Err(invalid("node_ids", "cannot be removed once set"));
            }
            (Some(a), Some(b)) => {
                let changed = [
                    ("node_ids.pod_subnet", a.pod_subnet != b.pod_subnet),
                    (
                        "node_ids.pod_subnet_node_prefix_len",
                        a.pod_subnet_node_prefix_len != b.pod_subnet_node_prefix_len,
                    ),
                    (
                        "node_ids.host_interconnect_subnet",
                        a.host_interconnect_subnet != b.host_interconnect_subnet,
                    ),
                    (
                        "node_ids.host_interconnect_node_prefix_len",
                        a.host_interconnect_node_prefix_len != b.host_interconnect_node_prefix_len,
                    ),
                    (
                        "node_ids.node_interconnect",
                        a.node_interconnect != b.node_interconnect,
                    ),
                    (
                        "node_ids.node_interconnect_excluded",
                        a.node_interconnect_excluded != b.node_interconnect_excluded,
                    ),
                    ("node_ids.vxlan", a.vxlan != b.vxlan),
                    ("node_ids.service", a.service != b.service),
                ];
                if let Some((field, _)) = changed.iter().find(|(_, c)| *c) {
                    return Err(invalid(*field, "cannot change once set"));
                }
            }
        }
        Ok(())
    }
}

fn check_host_bits_zero(field: &str, net: &IpNet) -> Result<(), ConfigError> {
    if net.trunc() != *net {
        return Err(invalid(
            field,
            format!("{net} has host bits set (did you mean {}?)", net.trunc()),
        ));
    }
    Ok(())
}

fn validate_family(
    path: &str,
    family: Family,
    config: &FamilyConfig,
    cloud: bool,
    seen: &mut Vec<(String, IpNet)>,
) -> Result<(), ConfigError> {
    if config.cidrs.is_empty() {
        return Err(invalid(
            format!("{path}.cidrs"),
            "needs at least one cluster CIDR",
        ));
    }
    let bits = family.bits();
    if config.node_prefix_len > bits {
        return Err(invalid(
            format!("{path}.node_prefix_len"),
            format!("{} is longer than {bits}", config.node_prefix_len),
        ));
    }
    for (k, cidr) in config.cidrs.iter().enumerate() {
        let field = format!("{path}.cidrs[{k}]");
        if family_of(cidr) != family {
            return Err(invalid(
                field,
                format!("{cidr} is not an {} CIDR", family.name()),
            ));
        }
        check_host_bits_zero(&field, cidr)?;
        if !cloud && config.node_prefix_len < cidr.prefix_len() {
            return Err(invalid(
                format!("{path}.node_prefix_len"),
                format!(
                    "{} is shorter than cluster CIDR {cidr}'s prefix length",
                    config.node_prefix_len
                ),
            ));
        }
        if let Some((other_field, other)) = seen.iter().find(|(_, other)| overlaps(other, cidr)) {
            return Err(invalid(
                field,
                format!("{cidr} overlaps {other_field} {other}"),
            ));
        }
        seen.push((field, *cidr));
    }
    for (k, reserved) in config.reserved.iter().enumerate() {
        let field = format!("{path}.reserved[{k}]");
        if family_of(reserved) != family {
            return Err(invalid(
                field,
                format!("{reserved} is not an {} CIDR", family.name()),
            ));
        }
        check_host_bits_zero(&field, reserved)?;
    }
    Ok(())
}

/// `config-applied`'s value: the configuration the leader last installed, and the mod revision
/// of the `config` key it came from. It is the last good configuration: a stored `config` that
/// fails the change rules against it (or against the grants) is not installed, and this one
/// stays in force across restarts and failovers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AppliedConfigRecord {
    /// The `config` key's mod revision when it was installed.
    pub config_revision: i64,
    /// The configuration (checked again when decoded: one that breaks a rule does not decode).
    pub config: ClusterConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::node_ids_toml;

    pub(crate) const EXAMPLE: &str = concat!(
        r#"
quarantine_secs = 300
[resync]
resync_ms = 30000
initial_retry_ms = 250
max_backoff_ms = 10000

[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.244.0.0/16", "10.245.0.0/16"]
node_prefix_len = 24
reserved = ["10.244.0.0/20"]
[pools.ipv6]
cidrs = ["fd00:10:244::/48"]
node_prefix_len = 64

"#,
        node_ids_toml!(),
        "node_interconnect_excluded = [\"192.168.16.1\"]\n"
    );

    const BLOCKS: &str = r#"
default_pool = "pods"
[namespaces]
batch = "batch"

[[pools]]
name = "pods"
mode = "blocks"
release_delay_secs = 60
[pools.watermarks]
pre_allocate = 4
min_allocate = 15
max_above_watermark = 4
[pools.node_watermarks.big-node]
pre_allocate = 32
[pools.ipv4]
cidrs = ["10.64.0.0/16"]
block_prefix_len = 26
[pools.ipv6]
cidrs = ["fd00:64::/64"]
block_prefix_len = 122

[[pools]]
name = "batch"
mode = "blocks"
[pools.ipv4]
cidrs = ["10.65.0.0/16"]
block_prefix_len = 28
"#;

    #[test]
    fn block_pools_parse_with_watermarks_overrides_and_namespaces() {
        let config = ClusterConfig::from_toml(BLOCKS).unwrap();
        assert!(config.pools[0].is_blocks());
        assert_eq!(config.pools[0].ipv4.as_ref().unwrap().node_prefix_len, 26);
        let pods = config.pools[0].blocks().unwrap();
        assert_eq!(pods.release_delay_ms(), 60_000);
        assert_eq!(pods.watermarks_for("small").pre_allocate, 4);
        let big = pods.watermarks_for("big-node");
        assert_eq!((big.pre_allocate, big.min_allocate), (32, 15));
        let batch = config.pools[1].blocks().unwrap();
        assert_eq!(batch.watermarks_for("x"), Watermarks::default());
        assert_eq!(batch.release_delay_ms(), 180_000);
        assert_eq!(config.pool_for(Some("batch"), Some("other"), None), "batch");
        assert_eq!(config.pool_for(None, Some("batch"), Some("net")), "batch");
        assert_eq!(config.pool_for(Some(""), Some("other"), Some("net")), "net");
        assert_eq!(config.pool_for(None, Some("other"), None), "pods");
        assert_eq!(
            config.choose_pool(None, Some("batch"), Some("net")).1,
            PoolRule::Namespace
        );
        assert_eq!(
            config.choose_pool(Some("x"), Some("batch"), None).1,
            PoolRule::Requested
        );
        assert_eq!(
            config.choose_pool(None, None, Some("n")).1,
            PoolRule::Network
        );
        assert_eq!(
            config.choose_pool(None, None, None).1,
            PoolRule::DefaultPool
        );
        for rule in [PoolRule::Requested, PoolRule::Default] {
            assert_eq!(PoolRule::parse(rule.as_str()), Some(rule));
        }
        // Round trip through the stored JSON.
        let json = config.to_json().unwrap();
        assert_eq!(ClusterConfig::from_json(json.as_bytes()).unwrap(), config);
    }

    /// A pod cap (ipamd's max pods) in block and cloud pools: the pool's and the node's own
    /// (its registration), the lower holding, under max_allocate when that is lower still;
    /// refused in a node-CIDR pool (its node holds the whole CIDR) and at 0.
    #[test]
    fn max_pods_caps_block_pools_and_is_refused_where_it_does_not_apply() {
        let capped = BLOCKS.replace(
            "release_delay_secs = 60",
            "release_delay_secs = 60\nmax_pods = 110",
        );
        let config = ClusterConfig::from_toml(&capped).unwrap();
        let pods = config.pools[0].blocks().unwrap();
        assert_eq!(pods.max_pods, Some(110));
        assert_eq!(pods.capped_watermarks_for("small", None).max_allocate, 110);
        assert_eq!(
            pods.capped_watermarks_for("small", Some(30)).max_allocate,
            30
        );
        assert_eq!(
            pods.capped_watermarks_for("small", Some(0)).max_allocate,
            110
        );
        let below = capped.replace(
            "max_above_watermark = 4",
            "max_above_watermark = 4\nmax_allocate = 64",
        );
        let config = ClusterConfig::from_toml(&below).unwrap();
        assert_eq!(
            config.pools[0]
                .blocks()
                .unwrap()
                .capped_watermarks_for("x", Some(100))
                .max_allocate,
            64
        );
        // The batch pool has no cap: a node's own still caps it.
        assert_eq!(
            config.pools[1]
                .blocks()
                .unwrap()
                .capped_watermarks_for("x", Some(100))
                .max_allocate,
            100
        );
        assert_eq!(
            config.pools[1]
                .blocks()
                .unwrap()
                .capped_watermarks_for("x", None)
                .max_allocate,
            0
        );
        let zero = BLOCKS.replace(
            "release_delay_secs = 60",
            "release_delay_secs = 60\nmax_pods = 0",
        );
        let error = ClusterConfig::from_toml(&zero).unwrap_err().to_string();
        assert!(
            error.contains("pools[0].max_pods") && error.contains("at least 1"),
            "{error}"
        );
        let node_cidr = r#"
[[pools]]
name = "default"
max_pods = 110
[pools.ipv4]
cidrs = ["10.244.0.0/16"]
node_prefix_len = 24
"#;
        let error = ClusterConfig::from_toml(node_cidr).unwrap_err().to_string();
        assert!(
            error.contains("pools[0].max_pods") && error.contains("\"blocks\" or \"cloud\""),
            "{error}"
        );
    }

    #[test]
    fn block_fields_are_refused_where_they_do_not_apply() {
        let cases = [
            (
                BLOCKS.replace("default_pool = \"pods\"", "default_pool = \"nope\""),
                "default_pool",
            ),
            (
                BLOCKS.replace("batch = \"batch\"", "batch = \"nope\""),
                "namespaces.batch",
            ),
            (
                BLOCKS.replace("max_above_watermark = 4", "max_allocate = 10"),
                "pools[0].watermarks.min_allocate",
            ),
            (
                BLOCKS.replace("block_prefix_len = 28", "block_prefix_len = 31"),
                "pools[1].ipv4.block_prefix_len",
            ),
            (
                BLOCKS.replace("block_prefix_len = 122", "block_prefix_len = 64"),
                "pools[0].ipv6.block_prefix_len",
            ),
            (
                BLOCKS.replace("release_delay_secs = 60", "release_delay_secs = 0"),
                "pools[0].release_delay_secs",
            ),
            (
                BLOCKS.replace(
                    "release_delay_secs = 60",
                    "release_delay_secs = 18446744073709551615",
                ),
                "pools[0].release_delay_secs",
            ),
            (
                EXAMPLE.replace(
                    "name = \"default\"",
                    "name = \"default\"\nrelease_delay_secs = 5",
                ),
                "pools[0].release_delay_secs",
            ),
        ];
        for (text, field) in cases {
            match ClusterConfig::from_toml(&text) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_pool_mode_cannot_change() {
        let old = ClusterConfig::from_toml(BLOCKS).unwrap();
        let mut new = old.clone();
        new.pools[1].kind = PoolKind::NodeCidr { cloud_sync: None };
        match ClusterConfig::check_change(&old, &new) {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "pools[1].mode"),
            other => panic!("{other:?}"),
        }
    }

    fn field_of(result: Result<ClusterConfig, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { field, problem }) => format!("{field}: {problem}"),
            other => panic!("expected a refused field, got {other:?}"),
        }
    }

    fn edited(from: &str, to: &str) -> String {
        assert!(EXAMPLE.contains(from), "{from}");
        EXAMPLE.replacen(from, to, 1)
    }

    #[test]
    fn the_example_parses_and_round_trips_through_json() {
        let config = ClusterConfig::from_toml(EXAMPLE).unwrap();
        assert_eq!(config.pools[0].ipv4.as_ref().unwrap().cidrs.len(), 2);
        // The pod split holds 256 nodes, the node interconnect /24 253 (.1 excluded).
        assert_eq!(config.max_node_id(), 253);
        let json = config.to_json().unwrap();
        assert_eq!(ClusterConfig::from_json(json.as_bytes()).unwrap(), config);
    }

    #[test]
    fn defaults_fill_quarantine_and_resync() {
        let config = ClusterConfig::from_toml(
            "[[pools]]\nname = \"a\"\n[pools.ipv4]\ncidrs = [\"10.0.0.0/8\"]\nnode_prefix_len = 24\n",
        )
        .unwrap();
        assert_eq!(config.quarantine_secs, 300);
        assert_eq!(config.resync, ResyncConfig::default());
    }

    #[test]
    fn each_refused_field_is_named() {
        let cases = [
            (
                edited("quarantine_secs = 300", "quarantine_secs = 0"),
                "quarantine_secs",
            ),
            (
                edited("node_prefix_len = 64", "node_prefix_len = 129"),
                "pools[0].ipv6.node_prefix_len",
            ),
            (
                edited("node_prefix_len = 64", "node_prefix_len = 40"),
                "pools[0].ipv6.node_prefix_len",
            ),
            (
                edited("\"10.245.0.0/16\"", "\"10.244.128.0/17\""),
                "pools[0].ipv4.cidrs[1]",
            ),
            (
                edited("\"10.245.0.0/16\"", "\"10.245.0.1/16\""),
                "pools[0].ipv4.cidrs[1]",
            ),
            (
                edited("\"fd00:10:244::/48\"", "\"10.9.0.0/16\""),
                "pools[0].ipv6.cidrs[0]",
            ),
            (
                edited(
                    "reserved = [\"10.244.0.0/20\"]",
                    "reserved = [\"fd00::/64\"]",
                ),
                "pools[0].ipv4.reserved[0]",
            ),
            (
                edited(
                    "pod_subnet_node_prefix_len = 24",
                    "pod_subnet_node_prefix_len = 30",
                ),
                "node_ids.pod_subnet_node_prefix_len",
            ),
            (
                edited("vxlan = \"192.168.30.0/24\"", "vxlan = \"192.168.16.0/24\""),
                "node_ids.vxlan",
            ),
            (
                edited("[\"192.168.16.1\"]", "[\"192.168.17.1\"]"),
                "node_ids.node_interconnect_excluded[0]",
            ),
            (
                edited(
                    "pod_subnet = \"10.1.0.0/16\"",
                    "pod_subnet = \"10.244.0.0/16\"",
                ),
                "node_ids.pod_subnet",
            ),
            (
                edited("initial_retry_ms = 250", "initial_retry_ms = 20000"),
                "resync.initial_retry_ms",
            ),
        ];
        for (text, field) in cases {
            let message = field_of(ClusterConfig::from_toml(&text));
            assert!(
                message.starts_with(&format!("{field}: ")),
                "{field}: {message}"
            );
        }
    }

    #[test]
    fn the_demand_write_budget_defaults_is_checked_and_stored_only_when_set() {
        let config = ClusterConfig::from_toml(EXAMPLE).unwrap();
        assert_eq!(config.demand_writes_per_sec, DEFAULT_DEMAND_WRITES_PER_SEC);
        // The default is not written out: a stored configuration reads as it did before.
        assert!(!config.to_json().unwrap().contains("demand_writes_per_sec"));
        let set =
            ClusterConfig::from_toml(&format!("demand_writes_per_sec = 250\n{EXAMPLE}")).unwrap();
        assert_eq!(set.demand_writes_per_sec, 250);
        let json = set.to_json().unwrap();
        assert!(json.contains("\"demand_writes_per_sec\":250"), "{json}");
        assert_eq!(ClusterConfig::from_json(json.as_bytes()).unwrap(), set);
        assert_eq!(
            field_of(ClusterConfig::from_toml(&format!(
                "demand_writes_per_sec = 0\n{EXAMPLE}"
            ))),
            "demand_writes_per_sec: must be at least 1 (the demand writes a second of every \
             node together)"
        );
        assert!(matches!(
            ClusterConfig::from_toml(&format!("demand_writes_per_sec = -1\n{EXAMPLE}")),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn pools_must_not_overlap_each_other_and_need_a_family() {
        let two = format!(
            "{EXAMPLE}\n[[pools]]\nname = \"b\"\n[pools.ipv4]\ncidrs = [\"10.245.128.0/17\"]\nnode_prefix_len = 26\n"
        );
        let message = field_of(ClusterConfig::from_toml(&two));
        assert!(message.starts_with("pools[1].ipv4.cidrs[0]: "), "{message}");
        assert!(message.contains("pools[0].ipv4.cidrs[1]"), "{message}");
        let bare = "[[pools]]\nname = \"b\"\n";
        assert_eq!(
            field_of(ClusterConfig::from_toml(bare)),
            "pools[0]: a pool needs ipv4 or ipv6 (or both)"
        );
        let nothing = field_of(ClusterConfig::from_toml(""));
        assert!(nothing.starts_with("pools: "), "{nothing}");
    }

    #[test]
    fn unknown_fields_and_bad_names_do_not_parse() {
        for text in [
            edited("quarantine_secs", "quarantine_seconds"),
            edited("name = \"default\"", "name = \"bad name\""),
            edited("\"10.245.0.0/16\"", "\"nonsense\""),
        ] {
            assert!(
                matches!(
                    ClusterConfig::from_toml(&text),
                    Err(ConfigError::Parse { .. })
                ),
                "{text}"
            );
        }
        assert!(ClusterConfig::from_json(b"{\"pools\": 5}").is_err());
        assert!(ClusterConfig::from_json(b"\xff").is_err());
    }

    #[test]
    fn changes_under_grants_are_refused_and_others_allowed() {
        let old = ClusterConfig::from_toml(EXAMPLE).unwrap();
        let refused = [
            (
                edited("node_prefix_len = 24", "node_prefix_len = 25"),
                "pools[0].ipv4.node_prefix_len",
            ),
            (
                edited("\"10.244.0.0/16\", \"10.245.0.0/16\"", "\"10.244.0.0/16\""),
                "pools[0].ipv4.cidrs",
            ),
            (
                edited(
                    "[pools.ipv6]\ncidrs = [\"fd00:10:244::/48\"]\nnode_prefix_len = 64\n",
                    "",
                ),
                "pools[0].ipv6",
            ),
            (
                edited(
                    "host_interconnect_node_prefix_len = 24",
                    "host_interconnect_node_prefix_len = 25",
                ),
                "node_ids.host_interconnect_node_prefix_len",
            ),
            (
                edited("vxlan = \"192.168.30.0/24\"", "vxlan = \"192.168.31.0/24\""),
                "node_ids.vxlan",
            ),
        ];
        for (text, field) in refused {
            let new = ClusterConfig::from_toml(&text).unwrap();
            let message = field_of(ClusterConfig::check_change(&old, &new).map(|()| new));
            assert!(
                message.starts_with(&format!("{field}: ")),
                "{field}: {message}"
            );
            assert!(message.contains("once set"), "{message}");
        }
        let renamed =
            ClusterConfig::from_toml(&edited("name = \"default\"", "name = \"other\"")).unwrap();
        let message = field_of(ClusterConfig::check_change(&old, &renamed).map(|()| renamed));
        assert!(
            message.starts_with("pools: pool default cannot be removed once set"),
            "{message}"
        );
        let allowed = edited("quarantine_secs = 300", "quarantine_secs = 60")
            .replace(
                "\"10.245.0.0/16\"]",
                "\"10.245.0.0/16\", \"10.246.0.0/16\"]",
            )
            .replace(
                "reserved = [\"10.244.0.0/20\"]",
                "reserved = [\"10.244.0.0/20\", \"10.245.0.0/24\"]",
            );
        let new = ClusterConfig::from_toml(&allowed).unwrap();
        ClusterConfig::check_change(&old, &new).unwrap();
    }

    const CLOUD: &str = r#"
[[pools]]
name = "vpc"
mode = "cloud"
watermarks = { pre_allocate = 8, max_above_watermark = 4 }
ipv4 = { cidrs = ["10.0.0.0/16"] }
[pools.cloud]
prefix_delegation = true
subnet_tags = { "corral.io/pods" = "yes" }
"#;

    #[test]
    fn a_cloud_pool_parses_with_defaults_and_its_fields_are_checked() {
        let config = ClusterConfig::from_toml(CLOUD).unwrap();
        let pool = &config.pools[0];
        assert!(pool.is_cloud() && pool.demand().is_some() && !pool.is_node_cidr());
        let cloud = pool.cloud().unwrap().settings();
        assert!(cloud.prefix_delegation);
        assert_eq!(cloud.first_interface_index, 1);
        assert_eq!(cloud.gc_interval_secs, 300);
        assert_eq!(cloud.gc_max_per_run, 25);
        assert_eq!(
            pool.demand()
                .unwrap()
                .watermarks_for("n")
                .max_above_watermark,
            4
        );
        let json = config.to_json().unwrap();
        assert_eq!(ClusterConfig::from_json(json.as_bytes()).unwrap(), config);
        let cases = [
            (
                CLOUD.replace(
                    "ipv4 = { cidrs = [\"10.0.0.0/16\"] }",
                    "ipv4 = { cidrs = [\"10.0.0.0/16\"], node_prefix_len = 24 }",
                ),
                "pools[0].ipv4.node_prefix_len",
            ),
            (
                CLOUD
                    .replace(
                        "watermarks = { pre_allocate = 8, max_above_watermark = 4 }\n",
                        "",
                    )
                    .replace("prefix_delegation = true", "warm = { warm_prefix = 1 }"),
                "pools[0].cloud.warm.warm_prefix",
            ),
            (
                CLOUD.replace("prefix_delegation = true", "warm = { warm_ip = 2 }"),
                "pools[0].cloud.warm",
            ),
            (
                CLOUD.replace("prefix_delegation = true", "gc_max_per_run = 0"),
                "pools[0].cloud.gc_max_per_run",
            ),
            // Durations a clock cannot add (`Instant + Duration` panics) are refused.
            (
                CLOUD.replace(
                    "prefix_delegation = true",
                    "gc_interval_secs = 18446744073709551615",
                ),
                "pools[0].cloud.gc_interval_secs",
            ),
            (
                CLOUD.replace(
                    "mode = \"cloud\"",
                    "mode = \"cloud\"\nrelease_delay_secs = 18446744073709551615",
                ),
                "pools[0].release_delay_secs",
            ),
            (
                CLOUD.replace("prefix_delegation = true", "subnet_ids = [\"a/b\"]"),
                "pools[0].cloud.subnet_ids[0]",
            ),
            (
                CLOUD.replace("mode = \"cloud\"", "mode = \"blocks\""),
                "pools[0].cloud",
            ),
        ];
        for (text, field) in cases {
            match ClusterConfig::from_toml(&text) {
                Err(ConfigError::Invalid { field: got, .. }) => assert_eq!(got, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        // A node-CIDR pool still needs its prefix length.
        let text = "[[pools]]\nname = \"p\"\nipv4 = { cidrs = [\"10.0.0.0/16\"] }\n";
        match ClusterConfig::from_toml(text) {
            Err(ConfigError::Invalid { field, problem }) => {
                assert_eq!(field, "pools[0].ipv4.node_prefix_len");
                assert!(problem.contains("required"), "{problem}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cloud_sync_is_for_node_cidr_pools_and_fixed_once_set() {
        let text = "[[pools]]\nname = \"p\"\ncloud_sync = \"from-cloud\"\n\
                    ipv6 = { cidrs = [\"2600:1f14::/56\"], node_prefix_len = 80 }\n";
        let from = ClusterConfig::from_toml(text).unwrap();
        assert_eq!(from.pools[0].cloud_sync(), Some(NodeCidrSync::FromCloud));
        let json = from.to_json().unwrap();
        assert!(json.contains("\"cloud_sync\":\"from-cloud\""), "{json}");
        assert_eq!(ClusterConfig::from_json(json.as_bytes()).unwrap(), from);
        let to = ClusterConfig::from_toml(&text.replace("from-cloud", "to-cloud")).unwrap();
        assert_eq!(to.pools[0].cloud_sync(), Some(NodeCidrSync::ToCloud));
        let plain =
            ClusterConfig::from_toml(&text.replace("cloud_sync = \"from-cloud\"\n", "")).unwrap();
        assert_eq!(plain.pools[0].cloud_sync(), None);
        for (old, new) in [(&from, &to), (&from, &plain), (&plain, &to)] {
            match ClusterConfig::check_change(old, new) {
                Err(ConfigError::Invalid { field, problem }) => {
                    assert_eq!(field, "pools[0].cloud_sync");
                    assert!(problem.contains("once set"), "{problem}");
                }
                other => panic!("{other:?}"),
            }
        }
        for bad in [
            text.replace("from-cloud", "sideways"),
            text.replace("cloud_sync", "mode = \"blocks\"\ncloud_sync"),
        ] {
            assert!(ClusterConfig::from_toml(&bad).is_err(), "{bad}");
        }
        match ClusterConfig::from_toml(&text.replace("cloud_sync", "mode = \"blocks\"\ncloud_sync"))
        {
            Err(ConfigError::Invalid { field, .. }) => assert_eq!(field, "pools[0].cloud_sync"),
            other => panic!("{other:?}"),
        }
    }
}
