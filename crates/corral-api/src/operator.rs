//! The operator's REST API as data: paths and response bodies of `corral operator`'s API
//! (`openapi-operator.json` at the repository root, served at `/openapi.json`). Every route is
//! a read: changes go through etcd (`corral cluster`, `corral node remove`).
//!
//! Errors are the agent's [`ErrorResponse`](crate::ErrorResponse). Addresses and CIDRs are
//! strings in their usual text form; counts that can exceed 2^53 (node CIDRs of an IPv6
//! space) are decimal strings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Paths of the operator's API.
pub mod paths {
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    pub const METRICS: &str = "/metrics";
    pub const OPENAPI: &str = "/openapi.json";
    pub const STATUS: &str = "/v1/status";
    pub const NODES: &str = "/v1/nodes";
    pub const NODE: &str = "/v1/nodes/{name}";
    pub const NODE_PLAN: &str = "/v1/nodes/{name}/plan";
    pub const POOLS: &str = "/v1/pools";
    pub const GRANTS: &str = "/v1/grants";
    pub const HISTORY: &str = "/v1/history";
}

/// `GET /v1/status`: this replica, and the cluster as its view sees it (only while it leads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OperatorStatus {
    /// This replica's name.
    pub replica: String,
    /// Whether this replica leads and has built its view.
    pub leading: bool,
    /// How long taking the lead took (the first read of the prefix), in milliseconds.
    pub took_lead_ms: Option<u64>,
    /// The last rebuild of the view from a full read of the prefix.
    pub last_rebuild: Option<Rebuild>,
    /// Pools and families (`pool/family`, or `node-ids (max N)/ipv4`) with nodes waiting for
    /// space that is not there, each naming every such node and why (`no free block for 2
    /// nodes (node-a, node-b): the pool is exhausted`), as the leader's view shows them now;
    /// on a standby, what it noted while it last led.
    pub full: BTreeMap<String, String>,
    /// What is wrong now, as this replica sees it (etcd failures, garbage keys), one
    /// sentence per problem, oldest first: the messages of `current`.
    pub problems: Vec<String>,
    /// The current problems with their identity and times; each goes when what it reports
    /// is over (a successful resync, the node's next grant, joining the election again).
    #[serde(default)]
    pub current: Vec<Problem>,
    /// What happened, oldest first (the newest 100): problems raised, changed and over, and
    /// happenings that are no lasting problem (a revocation, a drift a resync corrected).
    #[serde(default)]
    pub events: Vec<ProblemEvent>,
    /// The cluster; `null` on a standby.
    pub cluster: Option<ClusterStatus>,
}

/// A current problem of the operator. Times are milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// What kind of thing is wrong: `election`, `etcd`, `key`, `config`, `grant`, ...
    pub kind: String,
    /// What it is wrong with (a node, a key, the replica); with `kind`, its identity.
    pub subject: String,
    /// The newest sentence.
    pub message: String,
    /// When it began.
    pub since_ms: u64,
    /// When it was last reported.
    pub last_seen_ms: u64,
}

/// Something the operator ran into. Times are milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProblemEvent {
    pub at_ms: u64,
    /// The problem's kind, or `event` for a happening that is no lasting problem.
    pub kind: String,
    /// The problem's subject (empty for a happening).
    pub subject: String,
    pub message: String,
    /// The problem is over (`message` is its last sentence).
    pub resolved: bool,
}

/// A rebuild of the view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rebuild {
    /// Keys read.
    pub keys: u64,
    /// Range requests made.
    pub requests: u64,
    /// Keys etcd walked to answer them (each range's count): about `keys` when every range
    /// is bounded to about a page.
    pub walked: u64,
    /// How long it took, in milliseconds.
    pub ms: u64,
}

/// The cluster as the leader's view sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterStatus {
    /// The etcd revision the view is at.
    pub revision: i64,
    /// The replica that leads.
    pub leader: Option<String>,
    /// Registered nodes.
    pub nodes: u64,
    /// Registered nodes that hold everything the configuration grants.
    pub nodes_served: u64,
    /// Registered nodes that wait for something (a node CIDR, blocks, a node ID):
    /// `nodes - nodes_served`.
    #[serde(default)]
    pub nodes_waiting: u64,
    /// Node CIDRs per pool and family.
    pub pools: Vec<PoolStatus>,
    /// Node IDs, in a node-ID cluster (`pool` is `node-ids`, `family` is `-`).
    pub node_ids: Option<PoolStatus>,
    /// Removals asked for and not done yet.
    pub removals_pending: u64,
    /// What the view found wrong in etcd (garbage keys, conflicting grants).
    pub problems: Vec<String>,
}

/// Node CIDRs (or node IDs) of one pool and family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolStatus {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// The prefix length of a node CIDR (0 for node IDs).
    pub node_prefix_len: u8,
    /// Every node CIDR of the pool's CIDRs (a decimal string).
    pub capacity: String,
    /// Granted to nodes (a decimal string).
    pub granted: String,
    /// Taken from removed nodes, not handed out again until the quarantine ends (a decimal
    /// string).
    pub quarantined: String,
    /// Overlapping a reserved range (a decimal string).
    #[serde(default)]
    pub reserved: String,
    /// Blocked by a key that is not one of the pool's node CIDRs, or held by an agent
    /// without a grant (a decimal string).
    #[serde(default)]
    pub blocked: String,
    /// Free: capacity less every node CIDR anything above occupies, each counted once (a
    /// decimal string).
    pub free: String,
}

/// `GET /v1/nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodesResponse {
    pub nodes: Vec<NodeStatus>,
}

/// `GET /v1/nodes/{name}`: one registered node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeStatus {
    pub name: String,
    /// The machine uid its agent registered with.
    pub uid: String,
    /// The etcd create revision of its registration.
    pub registered_revision: i64,
    /// Its node CIDRs.
    pub grants: Vec<NodeGrant>,
    /// Its node ID, in a node-ID cluster.
    pub node_id: Option<u32>,
    /// What it still lacks, as `pool family` (and `node-id`).
    pub waiting_for: Vec<String>,
    /// The same, with why.
    #[serde(default)]
    pub waiting: Vec<NodeWaiting>,
    /// Whether `corral node remove` asked for its removal.
    pub removal_requested: bool,
    /// Block pools: the node's statistics per pool and family.
    #[serde(default)]
    pub blocks: Vec<NodeBlocks>,
    /// Cloud pools: the node's statistics per pool and family, as the cloud node manager last
    /// planned it.
    #[serde(default)]
    pub cloud: Vec<NodeCloud>,
    /// Cloud pools: the node's interfaces as recorded (`interfaces/`), with their addresses.
    #[serde(default)]
    pub cloud_interfaces: Vec<NodeCloudInterface>,
    /// What its agent asserts it holds (`holdings/<node>`), as `pool range` (with
    /// `draining` and the allocation count) and `node-id N`; empty without a record.
    #[serde(default)]
    pub held: Vec<String>,
    /// Of those, what no grant to it covers (kept occupied, reported until it is given up or
    /// granted back), as `pool range` and `node-id N`.
    #[serde(default)]
    pub uncovered: Vec<String>,
    /// The ranges of `held`, each with its use (the dashboard's per-node bars).
    #[serde(default)]
    pub holdings: Vec<NodeHolding>,
}

/// A range a node's agent asserts it holds (`holdings/<node>`) and how much of it is used, in
/// addresses (decimal strings: an IPv6 range's size passes 2^53).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeHolding {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// A node CIDR, a block or a from-cloud prefix.
    pub cidr: String,
    /// Addresses allocated in it, as its agent last wrote.
    pub allocated: String,
    /// Addresses in it.
    pub size: String,
    /// Nothing new is handed out from it; its allocations stay until released.
    pub draining: bool,
}

/// One thing a node waits for, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeWaiting {
    /// `pool family`, or `node-id` (as in `waiting_for`).
    pub what: String,
    /// `CIDR`, `block` or `node ID`.
    pub unit: String,
    /// Why: `no free block: the pool is exhausted`, `no free CIDR: the only space is in
    /// quarantine (2 CIDRs)`, `block not granted yet`, ...
    pub reason: String,
    /// It waits for space that is not there (the pool exhausted, or its only space in
    /// quarantine): it is named in the status's `full`.
    pub starving: bool,
}

/// One node in one cloud pool and family: Cilium's `Statistics`, in addresses (decimal
/// strings: a /80 prefix counts 2^48), and whether its instance is at its limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeCloud {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// Allocated on the node (its agent's last demand report).
    pub used: String,
    /// Held on its interfaces, less what it surrendered in a handshake.
    pub available: String,
    /// The most its instance can hold (or max-allocate).
    pub capacity: String,
    /// Still to assign to reach its watermarks (or warm targets).
    pub needed: String,
    /// Held beyond what it keeps.
    pub excess: String,
    /// Needs addresses its instance cannot take: no cloud call is made.
    pub at_capacity: bool,
}

/// One cloud interface of a node, as the leader recorded it after the cloud confirmed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeCloudInterface {
    /// The cloud's interface ID.
    pub id: String,
    pub pool: String,
    pub device_index: u32,
    pub subnet_id: String,
    /// `attaching` or `attached`.
    pub attachment: String,
    /// Created by corral (only these are ever deleted).
    pub managed: bool,
    /// Secondary addresses and delegated prefixes.
    pub addresses: Vec<String>,
}

/// One node's blocks of one block pool and family: Cilium's `Statistics`, in addresses
/// (decimal strings: an IPv6 block's count can pass 2^53), and the blocks it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeBlocks {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// Allocated on the node (its agent's last demand report).
    pub used: String,
    /// Held: the addresses of its blocks, less those it surrendered in a handshake.
    pub available: String,
    /// The most it may hold (max-allocate in whole blocks; 0: no cap).
    pub capacity: String,
    /// Still to grant to reach its watermarks.
    pub needed: String,
    /// Held beyond what it keeps (`max(min-allocate, used + pre-allocate) +
    /// max-above-watermark`).
    pub excess: String,
    /// Blocks held.
    pub blocks: u64,
    /// Blocks in a release handshake (marked, ready or refused).
    pub in_handshake: u64,
    /// At max-allocate and still needing addresses.
    pub at_capacity: bool,
    /// Whether its agent reported demand (without, nothing is released).
    pub has_demand: bool,
}

/// A node CIDR held by a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeGrant {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub cidr: String,
}

/// `GET /v1/pools`: the configured pools, each family with its CIDRs and use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterPools {
    pub pools: Vec<ClusterPool>,
}

/// One configured pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterPool {
    pub name: String,
    pub families: Vec<ClusterPoolFamily>,
}

/// One family of a configured pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterPoolFamily {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// The cluster CIDRs node CIDRs are cut from.
    pub cidrs: Vec<String>,
    pub node_prefix_len: u8,
    /// Ranges never granted.
    pub reserved: Vec<String>,
    /// Decimal strings, as in [`PoolStatus`] (`reserved_cidrs` is its `reserved`: the node
    /// CIDRs the ranges above overlap).
    pub capacity: String,
    pub granted: String,
    pub quarantined: String,
    #[serde(default)]
    pub reserved_cidrs: String,
    #[serde(default)]
    pub blocked: String,
    pub free: String,
}

/// `GET /v1/grants`: every node CIDR and node ID granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantsResponse {
    pub grants: Vec<Grant>,
    pub node_ids: Vec<NodeIdGrant>,
}

/// A node CIDR granted to a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub cidr: String,
    pub node: String,
}

/// `GET /v1/history`: grants of node CIDRs and blocks, held and ended, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantHistory {
    pub events: Vec<GrantEvent>,
}

/// One grant of a node CIDR or block: to whom, from when, until when and why it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantEvent {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub cidr: String,
    pub node: String,
    /// Granted at, in milliseconds since the epoch; null when granted before the history was
    /// kept.
    pub from_ms: Option<u64>,
    /// Ended at, in milliseconds since the epoch; null while held.
    pub to_ms: Option<u64>,
    /// Why it ended: `released` (the agent gave it back), `node_removed`, `revoked` (its
    /// agent refused it), `withdrawn` (the cloud no longer delegates it); null while held.
    pub why: Option<String>,
}

/// A node ID granted to a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeIdGrant {
    pub node: String,
    pub id: u32,
}

/// `GET /v1/nodes/{name}/plan`: the node's addresses under the node-ID plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodePlan {
    pub node_id: u32,
    /// The node's pod subnet.
    pub pod_subnet: String,
    /// The pods' gateway: host 1 of the pod subnet.
    pub pod_gateway: String,
    /// The NAT loopback: the pod subnet's broadcast − 1.
    pub nat_loopback: String,
    /// The first pod address.
    pub pod_range_start: String,
    /// The last pod address.
    pub pod_range_end: String,
    /// The node's host interconnect subnet.
    pub host_interconnect: String,
    /// Its VPP end.
    pub host_interconnect_vpp: String,
    /// Its Linux end.
    pub host_interconnect_linux: String,
    /// The node's IP on the node interconnect network.
    pub node_ip: String,
    /// The node interconnect network.
    pub node_interconnect: String,
    /// The node's VXLAN IP.
    pub vxlan_ip: String,
    /// The VXLAN network.
    pub vxlan: String,
    /// The service network.
    pub service: String,
}

/// Parses a time as `GET /v1/history?at=` and `corral cluster history --at` take it, as the
/// agent's history does ([`crate::history::parse_time`]: milliseconds since the epoch or RFC
/// 3339, UTC where no offset is given), with the operator's "invalid time" refusal.
pub fn parse_at(text: &str) -> Result<u64, String> {
    crate::history::parse_time(text).map_err(|why| format!("invalid time: {why}"))
}

#[cfg(test)]
mod history_tests {
    use super::parse_at;

    #[test]
    fn times_read_as_milliseconds_or_rfc3339_in_utc() {
        assert_eq!(parse_at("1764000000123"), Ok(1_764_000_000_123));
        assert_eq!(parse_at("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_at("2026-11-27T14:02"), Ok(1_795_788_120_000));
        assert_eq!(parse_at("2026-11-27T14:02:00Z"), Ok(1_795_788_120_000));
        assert_eq!(
            parse_at("2026-11-27T14:02:00.5+00:00"),
            Ok(1_795_788_120_500)
        );
        assert_eq!(parse_at("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(
            parse_at("2026-11-27T16:02+02:00"),
            Ok(1_795_788_120_000),
            "an offset is honoured"
        );
        for bad in [
            "",
            "x",
            "2026-02-30T00:00Z",
            "2026-11-27",
            "2026-11-27T25:00",
        ] {
            assert!(parse_at(bad).is_err(), "{bad}");
        }
    }
}
