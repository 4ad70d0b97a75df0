//! corral-api: the agent's REST API as data. Paths, request and response bodies, and the
//! error body, shared by the agent (`corral-agent`), the lean blocking client
//! (`corral-client`, used by the CLI and by corral-ipam in agent mode) and the OpenAPI
//! document (`openapi.json` at the repository root, served at `/openapi.json`). The
//! operator's API (`corral operator`) is in [`operator`].
//!
//! Every body is JSON. Unknown fields are refused (`deny_unknown_fields`), so a typo in a
//! request is a 400 that names the field, not a silently ignored option. Addresses are JSON
//! strings in their usual text form; counts that can exceed 2^53 (capacities of IPv6 ranges)
//! are decimal strings.
//!
//! Everything an operation acts on lives in a *scope*: the agent's own pools are in scope
//! [`NODE_SCOPE`]; corral-ipam in agent mode uses one scope per CNI network, as it does on its
//! own database.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
mod examples;
pub mod history;
pub mod interfaces;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod operator;
#[cfg(feature = "testing")]
pub mod testing;

pub use history::{HistoryEvent, HistoryKind, HistoryResponse};
pub use interfaces::*;

/// The scope of the agent's configured pools; the default of every `scope` field.
pub const NODE_SCOPE: &str = "node";
/// The pool used when a request names none.
pub const DEFAULT_POOL: &str = "default";
/// The largest request body the agent reads, in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Paths of the API.
pub mod paths {
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    pub const METRICS: &str = "/metrics";
    pub const OPENAPI: &str = "/openapi.json";
    pub const ALLOCATE: &str = "/v1/allocate";
    pub const RELEASE: &str = "/v1/release";
    pub const LEASE_START: &str = "/v1/leases/start";
    pub const LEASE_STOP: &str = "/v1/leases/stop";
    pub const DUMP: &str = "/v1/dump";
    pub const STATUS: &str = "/v1/status";
    pub const POOLS: &str = "/v1/pools";
    pub const POOL_RANGES_ADD: &str = "/v1/pools/ranges/add";
    pub const POOL_RANGES_REMOVE: &str = "/v1/pools/ranges/remove";
    pub const POOL_EXCLUSIONS_ADD: &str = "/v1/pools/exclusions/add";
    pub const POOL_EXCLUSIONS_REMOVE: &str = "/v1/pools/exclusions/remove";
    pub const POOL_RESERVE_LOCAL_ROUTES: &str = "/v1/pools/reserve-local-routes";
    pub const CHECKPOINT: &str = "/v1/checkpoint";
    pub const CNI_ADD: &str = "/v1/cni/add";
    pub const CNI_DEL: &str = "/v1/cni/del";
    pub const CNI_CHECK: &str = "/v1/cni/check";
    pub const CNI_GC: &str = "/v1/cni/gc";
    pub const CNI_STATUS: &str = "/v1/cni/status";
    pub const GC: &str = "/v1/gc";
    /// `GET` (`?pool=`) lists, `POST` adds.
    pub const INTERFACES: &str = "/v1/interfaces";
    /// `GET` one interface with its use, `DELETE` (`?force=`) removes it.
    pub const INTERFACE: &str = "/v1/interfaces/{id}";
    /// `POST` adds an address or prefix, `DELETE` (`?address=&force=`) removes one.
    pub const INTERFACE_ADDRESSES: &str = "/v1/interfaces/{id}/addresses";
    /// `POST`: AWS VPC CNI's ipamd checkpoint into an interface-backed pool.
    pub const IMPORT_IPAMD: &str = "/v1/import-ipamd";
    /// `GET` (`?address=&at=&pod=&key=&since=&until=&limit=`): the allocation history.
    pub const HISTORY: &str = "/v1/history";

    /// [`INTERFACE`] with its `{id}`, percent-encoded.
    pub fn interface(id: &str) -> String {
        format!("{INTERFACES}/{}", super::percent_encode(id))
    }

    /// [`INTERFACE_ADDRESSES`] with its `{id}`, percent-encoded.
    pub fn interface_addresses(id: &str) -> String {
        format!("{INTERFACES}/{}/addresses", super::percent_encode(id))
    }
}

/// `text` percent-encoded for a path segment or a query value (RFC 3986: every byte but the
/// unreserved characters).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn node_scope() -> String {
    NODE_SCOPE.to_owned()
}

fn default_pool() -> String {
    DEFAULT_POOL.to_owned()
}

/// An address family, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FamilyChoice {
    Ipv4,
    Ipv6,
    /// One address of each family, all or nothing.
    Dual,
}

/// One address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FamilyName {
    Ipv4,
    Ipv6,
}

/// The CNI attachment an allocation belongs to: (network, container ID, interface).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(examples(examples::attachment_key,)))]
#[serde(deny_unknown_fields)]
pub struct AttachmentKey {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

/// An expiration timer on an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The lease's UUID, needed to stop it.
    pub id: String,
    /// When it expires, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

// ---- allocate / release -----------------------------------------------------------------

/// `POST /v1/allocate`: the next free address (or `address`), of one family or both.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"owner": "pod-a"}),
        json!({
            "owner": "pod-b",
            "family": "dual",
            "key": examples::attachment_key()
        }),
        json!({"owner": "pod-c", "address": "10.88.0.10", "lease_ms": 60000}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct AllocateRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    #[serde(default = "default_pool")]
    #[cfg_attr(feature = "openapi", schema(default = default_pool))]
    pub pool: String,
    /// Which family; defaults to the family of `address`, else `ipv4`.
    pub family: Option<FamilyChoice>,
    /// A specific address instead of the next free one.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = "ip"))]
    pub address: Option<IpAddr>,
    /// Who holds the address (free text, used by release-by-owner).
    pub owner: String,
    /// Allocating again with the same key returns the same addresses.
    pub key: Option<AttachmentKey>,
    /// Start an expiration timer of this length with the allocation.
    pub lease_ms: Option<u64>,
}

/// One address handed out.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Allocated {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub family: FamilyName,
    pub pool: String,
    /// Changes every time the address is handed out; release by address can require it.
    pub generation: u64,
    /// True when the key already held this address (nothing changed).
    pub existing: bool,
    /// The subnet of the range the address came from, when it still has one.
    pub subnet: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = "ip"))]
    pub gateway: Option<IpAddr>,
    pub lease: Option<Lease>,
    /// In an interface-backed pool: the interface the address lies on.
    pub interface: Option<AllocatedInterface>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AllocateResponse {
    pub allocations: Vec<Allocated>,
}

/// `POST /v1/release`: exactly one of `key`, `address` (optionally with `generation`), or
/// `owner`. Releasing what is not held is not an error: `released` is then empty.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"owner": "pod-a"}),
        json!({"address": "10.88.0.10"}),
        json!({"key": examples::attachment_key()}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    pub key: Option<AttachmentKey>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = "ip"))]
    pub address: Option<IpAddr>,
    /// With `address`: release only if this is still the address's generation.
    pub generation: Option<u64>,
    pub owner: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleasedAddress {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub pool: String,
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleaseResponse {
    pub released: Vec<ReleasedAddress>,
}

// ---- leases -----------------------------------------------------------------------------

/// `POST /v1/leases/start`: an expiration timer on an allocated address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"address": "10.88.0.10", "duration_ms": 60000}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct LeaseStartRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub duration_ms: u64,
}

/// `POST /v1/leases/stop`: the address stays allocated, without a timer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"address": "10.88.0.10", "id": "0e9b6f3c-2d7a-4c1e-9f4b-5a8d7c6e1f20"}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct LeaseStopRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub id: String,
}

// ---- dump / status ----------------------------------------------------------------------

/// `GET /v1/dump[?scope=]`: every allocation, per scope and pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DumpResponse {
    pub scopes: Vec<ScopeDump>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScopeDump {
    pub scope: String,
    pub pools: Vec<PoolDump>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolDump {
    pub pool: String,
    pub allocations: Vec<DumpEntry>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DumpEntry {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub generation: u64,
    pub lease: Option<Lease>,
}

/// `GET /v1/status[?scope=]`: capacity and use per scope, pool and family.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StatusResponse {
    /// False until the state on disk has been restored.
    pub ready: bool,
    /// One human-readable line per scope.
    pub summary: Vec<String>,
    pub scopes: Vec<ScopeStatus>,
    /// What the agent could not apply as configured (a range of the configuration file that
    /// overlaps one added at run time, say), one sentence each; empty when all is well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The agent's link to its cluster, when it runs in one (`corral agent --etcd`).
    pub cluster: Option<ClusterStatus>,
    /// The latest CNI ADDs on node pools (at most [`AddRecord::KEPT`], one per attachment,
    /// oldest first): the pool each used, the rule that chose it, and how it ended. Kept in
    /// memory only (a restart forgets them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adds: Vec<AddRecord>,
}

/// One CNI ADD on a node pool as the agent saw it: what `corral explain pod` reads to say which
/// pool a pod's ADD used, and why.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AddRecord {
    pub key: AttachmentKey,
    pub owner: String,
    /// The pool the agent allocated from.
    pub pool: String,
    /// Which rule chose it: `runtime_config` (the call named it: `runtimeConfig.pool`,
    /// `args.cni.pool`), `namespace` (the cluster configuration maps the pod's namespace to
    /// it), `network` (the network's `ipam.pool`), `default_pool` (the cluster's), `default`.
    pub rule: String,
    /// The pod's namespace, when the call gave one.
    pub namespace: Option<String>,
    /// When the ADD arrived (milliseconds since the epoch).
    pub at_ms: u64,
    /// `waiting` (for a grant, or the agent's restore), `ok` or `failed`.
    pub outcome: String,
    /// Why it failed.
    pub error: Option<String>,
}

impl AddRecord {
    /// How many ADDs an agent keeps.
    pub const KEPT: usize = 256;
}

/// The agent's link to its cluster. Pod allocations never wait for it: while etcd cannot be
/// reached the agent serves from the grants it holds and says `degraded`.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterStatus {
    pub node: String,
    /// Whether the node is registered (false before the first contact, and after a removal).
    pub registered: bool,
    /// Whether etcd cannot be reached now.
    pub degraded: bool,
    /// Since when (milliseconds since the epoch), while degraded.
    pub degraded_since_ms: Option<u64>,
    /// The last problem of the link, if any.
    pub last_error: Option<String>,
    /// The ranges granted to the node, as `pool range`.
    pub grants: Vec<String>,
    /// The node's ID, in a node-ID cluster.
    pub node_id: Option<u32>,
    /// The cloud instance the node registered with (cloud pools).
    pub instance_id: Option<String>,
    /// What the link could not apply: cloud interface records it skipped, and cloud
    /// addresses gone from their record while still in use (frozen), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ScopeStatus {
    pub scope: String,
    pub pools: Vec<PoolStatus>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolStatus {
    pub pool: String,
    pub families: Vec<FamilyStatus>,
}

/// Counts as decimal strings: an IPv6 range holds more than JSON numbers carry exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FamilyStatus {
    pub family: FamilyName,
    pub capacity: String,
    pub used: String,
    pub free: String,
    pub excluded: String,
    pub cooling: String,
}

// ---- pools ------------------------------------------------------------------------------

/// `GET /v1/pools[?scope=]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolsResponse {
    pub pools: Vec<PoolInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolInfo {
    pub scope: String,
    pub name: String,
    pub cooldown_ms: u64,
    pub lowest_free: bool,
    pub ranges: Vec<RangeInfo>,
    pub exclusions: Vec<ExclusionInfo>,
    /// Ranges the configuration file declares that were removed at run time: they stay out
    /// (a restart does not bring them back) until added again or dropped from the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

/// Where a range came from, which says what may change or remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RangeSource {
    /// The agent's configuration file.
    File,
    /// Added through this API at run time.
    Api,
    /// A CNI network's configuration.
    Cni,
    /// Granted to the node by the cluster authority.
    Cluster,
    /// A secondary address or delegated prefix of an interface of an interface-backed pool.
    Interface,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RangeInfo {
    /// The range in its canonical text form (`10.0.0.0/24`, `10.0.0.10-10.0.0.20/24`, ...).
    pub range: String,
    /// True while a removed range still holds allocations.
    pub draining: bool,
    pub source: RangeSource,
    /// Addresses of the pool allocated in the range (a draining range leaves at zero).
    pub allocated: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExclusionInfo {
    pub network: String,
    pub reason: String,
}

/// `POST /v1/pools/ranges/add`: adds capacity, creating the pool if it does not exist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"pool": "extra", "range": "10.89.0.0/24"}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct RangeRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    pub pool: String,
    pub range: String,
}

/// What removing a range did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RangeRemoval {
    /// The range is gone.
    Removed,
    /// The range still holds allocations: it hands out nothing more and disappears with the
    /// last of them.
    Draining,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RangeRemoved {
    pub outcome: RangeRemoval,
}

/// `POST /v1/pools/exclusions/add` and `.../remove` (where `reason` is ignored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({"pool": "default", "network": "10.88.0.0/28", "reason": "infrastructure"}),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct ExclusionRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    pub pool: String,
    /// An address or a network in CIDR form.
    pub network: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(default = ""))]
    pub reason: String,
}

/// `POST /v1/pools/reserve-local-routes`: the agent reads the node's routes and interface
/// addresses (netlink) and excludes from the scope's pools every address they cover that is
/// not the pool's own, replacing what an earlier reservation excluded. The agent also does
/// this when it starts. Only the agent's own scope [`NODE_SCOPE`] takes local-route
/// exclusions: a CNI network's pools follow its configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(examples(json!({}), json!({"scope": "node"}))))]
#[serde(deny_unknown_fields)]
pub struct ReserveLocalRoutesRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
}

/// Only a JSON object: serde's derived struct would also take an array, positionally, and
/// an empty one (`[]`) would then pass for `{}`, since every field has a default.
impl<'de> Deserialize<'de> for ReserveLocalRoutesRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default = "node_scope")]
            scope: String,
        }
        struct ObjectOnly;
        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Fields, A::Error> {
                Fields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        let fields = deserializer.deserialize_map(ObjectOnly)?;
        Ok(ReserveLocalRoutesRequest {
            scope: fields.scope,
        })
    }
}

/// One exclusion a local route or interface address made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LocalRouteExclusion {
    pub pool: String,
    /// An address or a network in CIDR form.
    pub network: String,
    /// What covers it: `local route 10.0.0.0/24 dev eth0`, `local address 10.88.0.5 of
    /// eth0`, `local subnet 10.88.0.0/24 of eth0`.
    pub reason: String,
}

/// An allocated address that a local route or interface address covers: it stays allocated
/// and is not excluded (nothing is ever released by a reservation), so whoever holds it
/// shares it with the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LocalRouteConflict {
    pub pool: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    /// Who holds the address.
    pub owner: String,
    /// What covers it, as in [`LocalRouteExclusion::reason`].
    pub reason: String,
}

/// What a reservation of local routes found and changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReserveLocalRoutesResponse {
    pub scope: String,
    /// Every local-route exclusion of the scope's pools, after this request.
    pub excluded: Vec<LocalRouteExclusion>,
    /// The exclusions this request made (new, or with a new reason).
    pub added: Vec<LocalRouteExclusion>,
    /// The exclusions this request removed: their route or address is gone.
    pub removed: Vec<LocalRouteExclusion>,
    /// Allocated addresses a local route or address covers (left allocated, not excluded).
    pub conflicts: Vec<LocalRouteConflict>,
}

/// The body of a successful request that returns nothing else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Done {
    pub ok: bool,
}

// ---- CNI (corral-ipam in agent mode) ----------------------------------------------------

/// One pool of a CNI network, as corral-ipam derives it from the network configuration (one
/// pool per range set).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CniPool {
    pub name: String,
    pub cooldown_ms: u64,
    pub lowest_free: bool,
    pub ranges: Vec<String>,
    pub exclusions: Vec<ExclusionInfo>,
}

/// The network a CNI request is about: its name is the scope, its pools replace the scope's
/// configuration when they differ (allocations outside the new ranges are kept until
/// released, never handed out again).
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(examples(examples::cni_network,)))]
#[serde(deny_unknown_fields)]
pub struct CniNetwork {
    pub name: String,
    pub pools: Vec<CniPool>,
    /// A pool of the agent's own scope ([`NODE_SCOPE`]) to allocate from instead of `pools`
    /// (which must then be empty): the node's pool that the cluster grants ranges to, or that
    /// the agent's configuration declares. An ADD takes one address per family the pool has
    /// active ranges in (its `sets` may only carry requested addresses, one per family); DEL,
    /// CHECK, GC and STATUS act on the network's attachments in that pool only. A pool that
    /// does not exist or has no active range yet is refused with `retry_later`.
    pub node_pool: Option<String>,
    /// With `node_pool`: the pool the CNI call itself named (`runtimeConfig.pool`,
    /// `args.cni.pool`), which wins over every other choice.
    pub requested_pool: Option<String>,
    /// With `node_pool`: the network configuration's `ipam.pool`, used when the call names
    /// no pool and its namespace maps to none.
    pub configured_pool: Option<String>,
    /// With `node_pool`: the Kubernetes namespace of the pod (`K8S_POD_NAMESPACE` in
    /// `CNI_ARGS`), which the cluster configuration's `namespaces` may map to a pool. An
    /// agent in a cluster chooses the pool: the requested pool, else the namespace's, else
    /// the configured one, else the cluster's `default_pool`, else `node_pool`'s.
    pub namespace: Option<String>,
}

impl CniNetwork {
    /// The network `name` with its own `pools`, as a standalone network configuration names
    /// them: no node pool, so no pool choice.
    pub fn with_pools(name: impl Into<String>, pools: Vec<CniPool>) -> Self {
        Self {
            name: name.into(),
            pools,
            node_pool: None,
            requested_pool: None,
            configured_pool: None,
            namespace: None,
        }
    }

    /// The network `name` allocating from the agent's node pool `pool`; the call names no
    /// pool of its own, its configuration none and its pod no namespace (set those fields to
    /// add them).
    pub fn on_node_pool(name: impl Into<String>, pool: impl Into<String>) -> Self {
        Self {
            node_pool: Some(pool.into()),
            ..Self::with_pools(name, Vec::new())
        }
    }
}

/// One address wanted by an ADD: from `pool`, of `family`, `requested` if given.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CniSet {
    pub pool: String,
    pub family: FamilyName,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = "ip"))]
    pub requested: Option<IpAddr>,
}

/// `POST /v1/cni/add`: one address per set, all or nothing; idempotent per key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "network": examples::cni_network(),
            "key": examples::attachment_key(),
            "owner": "pod-a",
            "sets": [
                {
                    "pool": "podnet-0",
                    "family": "ipv4"
                },
                {
                    "pool": "podnet-0",
                    "family": "ipv6"
                }
            ]
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct CniAddRequest {
    pub network: CniNetwork,
    pub key: AttachmentKey,
    pub owner: String,
    pub sets: Vec<CniSet>,
}

/// `POST /v1/cni/del` and `/v1/cni/check`: the attachment's addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "network": examples::cni_network(),
            "key": examples::attachment_key()
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct CniKeyRequest {
    pub network: CniNetwork,
    pub key: AttachmentKey,
}

/// `POST /v1/cni/gc`: the leak collector over the network's attachments, `valid_attachments`
/// being the live ones (see [`GcRequest`] for the rule); answered with a [`GcResponse`].
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "network": examples::cni_network(),
            "valid_attachments": [examples::attachment_key()]
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct CniGcRequest {
    pub network: CniNetwork,
    pub valid_attachments: Vec<AttachmentKey>,
    /// The grace period in milliseconds; 15 minutes when absent.
    pub grace_ms: Option<u64>,
    /// Attachments released at most by this run (at least 1); 64 when absent.
    pub max_released: Option<u64>,
}

/// `POST /v1/gc`: the leak collector over the attachments of a scope (by default the node's
/// own), `live` being the ones in use. Calico's rule: an allocation whose attachment is not
/// live is a suspect, recorded with when it was first seen missing; a later run releases it
/// only if the grace period has passed since then, the attachment is still not live, and it
/// still holds exactly the addresses (and generations) recorded. A suspect live again, or
/// whose allocations changed or went, is cleared. An attachment's allocations go together
/// (every pool and family) or not at all; at most `max_released` attachments go per run.
/// Allocations without an attachment key are never touched.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "live": [
                examples::attachment_key()
            ],
            "grace_ms": 900000
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    #[serde(default = "node_scope")]
    #[cfg_attr(feature = "openapi", schema(default = node_scope))]
    pub scope: String,
    /// The attachments in use.
    pub live: Vec<AttachmentKey>,
    /// The grace period in milliseconds; 15 minutes when absent.
    pub grace_ms: Option<u64>,
    /// Attachments released at most by this run (at least 1); 64 when absent.
    pub max_released: Option<u64>,
    /// Decide and report, change nothing (no suspect recorded, nothing released).
    #[serde(default)]
    pub dry_run: bool,
}

/// One address a suspect holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GcAddress {
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub generation: u64,
}

/// An attachment seen missing from the live set, and what it holds.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GcSuspect {
    pub key: AttachmentKey,
    /// When it was first seen missing, in milliseconds since the Unix epoch.
    pub first_seen_ms: u64,
    /// Waiting suspects only: when the grace period ends.
    pub due_ms: Option<u64>,
    pub addresses: Vec<GcAddress>,
}

/// What one run of the leak collector did (with `dry_run`, would do).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GcResponse {
    pub dry_run: bool,
    /// Attachments holding allocations that are live.
    pub live: u64,
    /// Suspects first seen missing by this run.
    pub recorded: Vec<GcSuspect>,
    /// Suspects released (seen missing again past the grace period, unchanged).
    pub released: Vec<GcSuspect>,
    /// Suspects seen missing again before the grace period ended.
    pub waiting: Vec<GcSuspect>,
    /// Suspects due but over the run's cap: the next run releases them.
    pub capped: Vec<GcSuspect>,
    /// Suspects forgotten: live again, or their allocations changed or went.
    pub cleared: Vec<AttachmentKey>,
}

/// `POST /v1/cni/status`: the network's pools with their use (answered with a
/// [`ScopeStatus`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "network": examples::cni_network()
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct CniStatusRequest {
    pub network: CniNetwork,
}

// ---- errors -----------------------------------------------------------------------------

/// Every non-2xx response carries this body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

impl ErrorResponse {
    /// The answer of `code` about no pool, set or CNI code in particular; retryable when the
    /// code is [`ErrorCode::RetryLater`].
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                code,
                message: message.into(),
                pool: None,
                set: None,
                retryable: code == ErrorCode::RetryLater,
                cni_code: None,
            },
        }
    }

    /// Both daemons' answer on their TCP listener to a request without the bearer token.
    pub fn unauthorized() -> ErrorResponse {
        ErrorResponse::new(
            ErrorCode::Unauthorized,
            "this listener needs Authorization: Bearer <token>",
        )
    }
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Machine-readable; one of [`ErrorCode`]'s names.
    pub code: ErrorCode,
    /// What was wrong, for people.
    pub message: String,
    /// The pool concerned, when there is one.
    pub pool: Option<String>,
    /// `/v1/cni/add`: the index of the set that could not be served.
    pub set: Option<usize>,
    /// True when the same request may succeed later as it is (the pool may gain capacity or
    /// release addresses; the agent may finish restoring).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retryable: bool,
    /// The CNI error code of the same refusal in the plugin run on its own (an engine or
    /// input refusal), so corral-ipam answers the same code in agent mode; absent for errors
    /// of the agent itself.
    pub cni_code: Option<u32>,
}

/// Why a request failed, with its HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body is not JSON, a field is missing, unknown or of the wrong type, or a value
    /// is malformed.
    BadRequest,
    /// 401: the TCP listener needs the bearer token.
    Unauthorized,
    /// 404: no such scope, pool, allocation or lease, or no such path.
    NotFound,
    /// 405: the path exists with another method.
    MethodNotAllowed,
    /// 409: the address is held, or the attachment holds a different one.
    InUse,
    /// 409: the pool has no free address of the family.
    Exhausted,
    /// 409: the address is outside the pool, excluded, reserved, or its range is draining.
    Unavailable,
    /// 409: the request conflicts with state (a lease already running, a stale generation, a
    /// checkpoint into a scope that holds allocations).
    Conflict,
    /// 413: the body is larger than [`MAX_BODY_BYTES`].
    TooLarge,
    /// 415: the body is not declared as JSON.
    UnsupportedMediaType,
    /// 409: the CNI attachment holds an address that none of its network's ranges contain any
    /// more (the configuration changed under it).
    AttachmentConflict,
    /// 503: the agent is still restoring its state, or its store failed; retry later.
    RetryLater,
    /// 503: the agent's state store is broken (a failed sync, corrupt or lost state, a schema
    /// from a newer build): the same request will not succeed until an operator acts (see the
    /// message; usually: fix the disk and restart the agent).
    StoreFailed,
    /// 409: an interface of that ID (or device number) is already on the node.
    DuplicateInterface,
    /// 404: no interface of that ID on the node.
    UnknownInterface,
    /// 409: the interface holds allocated or cooling addresses (remove it with `force` to
    /// drain them), or it is the primary or a trunk interface.
    InterfaceInUse,
    /// 409: the address or prefix is already on an interface, or overlaps a range.
    AddressAlreadyPresent,
    /// 404: the interface has no such address or prefix.
    UnknownAddress,
    /// 409: the address or prefix holds allocated or cooling addresses (`force` drains it).
    AddressInUse,
    /// 409: the pool mixes interfaces with plain ranges: an interface-backed pool takes no
    /// range, and a pool of ranges no interface.
    PoolKindMismatch,
}

impl ErrorCode {
    /// The HTTP status of a response with this code.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::InUse | ErrorCode::Exhausted | ErrorCode::Unavailable => 409,
            ErrorCode::Conflict | ErrorCode::AttachmentConflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::RetryLater | ErrorCode::StoreFailed => 503,
            ErrorCode::UnknownInterface | ErrorCode::UnknownAddress => 404,
            ErrorCode::DuplicateInterface
            | ErrorCode::InterfaceInUse
            | ErrorCode::AddressAlreadyPresent
            | ErrorCode::AddressInUse
            | ErrorCode::PoolKindMismatch => 409,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both daemons' 401 body, as they answered it before it was shared.
    #[test]
    fn the_unauthorized_answer_names_the_header() {
        assert_eq!(
            serde_json::to_value(ErrorResponse::unauthorized()).unwrap(),
            serde_json::json!({"error": {
                "code": "unauthorized",
                "message": "this listener needs Authorization: Bearer <token>"
            }})
        );
        assert!(
            ErrorResponse::new(ErrorCode::RetryLater, "later")
                .error
                .retryable
        );
    }

    /// Regression (schemathesis): `[]` was taken for `{}`, as serde's derived structs take
    /// arrays positionally and every field of this request has a default.
    #[test]
    fn an_empty_array_is_not_a_reservation_request() {
        let parse = |text: &str| serde_json::from_str::<ReserveLocalRoutesRequest>(text);
        assert_eq!(parse("{}").unwrap().scope, NODE_SCOPE);
        assert_eq!(parse(r#"{"scope": "other"}"#).unwrap().scope, "other");
        let error = parse("[]").unwrap_err().to_string();
        assert!(error.contains("expected a JSON object"), "{error}");
        assert!(parse(r#"["node"]"#).is_err());
        let error = parse(r#"{"scop": "node"}"#).unwrap_err().to_string();
        assert!(error.contains("unknown field `scop`"), "{error}");
        let request = ReserveLocalRoutesRequest {
            scope: "node".into(),
        };
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(parse(&text).unwrap(), request);
    }
}
