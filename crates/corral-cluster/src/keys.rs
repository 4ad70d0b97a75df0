//! The etcd key layout under `/corral/<cluster>/v1/`, its typed parse, and the JSON value records.
//!
//! Every key has one canonical text: CIDRs are written with `-` for `/` in ipnet's canonical
//! form (`10.244.3.0-24`, `fd00:10:244:1::-64`), families as `ipv4`/`ipv6`, numbers in decimal
//! (lease IDs in lower-case hex) without leading zeros, but the history's times in 16
//! zero-padded digits, so its keys sort by time. `Keys::parse` accepts exactly what the
//! builders write, so a key round-trips, and anything else is a `KeyError`, never a panic.
//! `config` sorts before every other kind of key under the prefix (a full read finds it on its
//! first page); a new kind must be named to sort after it.
//!
//! One writer role per key kind (the table in ARCHITECTURE.md), and nothing is written per pod: no
//! counter or other shared key is written per node or per pod, because etcd manages far fewer
//! writes per second on one contended key than on distinct keys (BENCHMARKS.md).

use std::fmt;
use std::str::FromStr;

use corral_core::{Family, PoolName};
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod envelope;

/// The schema version of the layout (`meta/schema`'s value and every record's `schema`).
pub const SCHEMA_VERSION: u32 = 1;

/// Longest cluster name, in bytes.
pub const MAX_CLUSTER_NAME_LEN: usize = 63;
/// Longest node name (a DNS-1123 subdomain), in bytes.
pub const MAX_NODE_NAME_LEN: usize = 253;

/// Why a name, key or value was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The cluster name breaks its rules.
    #[error("invalid cluster name {name:?}: 1 to 63 lower-case letters, digits and '-'")]
    ClusterName {
        /// The refused name (at most 64 characters of it).
        name: String,
    },
    /// The node name is not a DNS-1123 subdomain.
    #[error(
        "invalid node name {name:?}: 1 to 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
    )]
    NodeName {
        /// The refused name (at most 64 characters of it).
        name: String,
    },
    /// The key is not under this cluster's prefix.
    #[error("key {key:?} is not under {prefix}")]
    Foreign {
        /// The key (at most 64 characters of it).
        key: String,
        /// The cluster's prefix.
        prefix: String,
    },
    /// The key is under the prefix but is no kind of key the layout has.
    #[error("key {key:?} is not a corral key: {problem}")]
    Malformed {
        /// The key (at most 64 characters of it).
        key: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// Why a value did not decode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    /// The bytes are not the JSON of the record.
    #[error("value of {record} does not decode: {message}")]
    Decode {
        /// The record type expected.
        record: &'static str,
        /// The JSON parser's message.
        message: String,
    },
    /// The record was written by a newer layout.
    #[error("value of {record} has schema {schema}, this build reads schema {SCHEMA_VERSION}")]
    Schema {
        /// The record type expected.
        record: &'static str,
        /// The schema it declares.
        schema: u32,
    },
    /// The record does not serialize (never for the records of this module).
    #[error("value of {record} does not encode: {message}")]
    Encode {
        /// The record type.
        record: &'static str,
        /// The serializer's message.
        message: String,
    },
}

/// At most 64 characters of an input, for messages.
fn echo(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A cluster's name: 1..=63 bytes of lower-case letters, digits and `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(String);

impl ClusterName {
    /// Validates a cluster name.
    pub fn new(name: &str) -> Result<ClusterName, KeyError> {
        let valid = !name.is_empty()
            && name.len() <= MAX_CLUSTER_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if valid {
            Ok(ClusterName(name.to_owned()))
        } else {
            Err(KeyError::ClusterName { name: echo(name) })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's name: a DNS-1123 subdomain (as Kubernetes node names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeName(String);

impl NodeName {
    /// Validates a node name.
    pub fn new(name: &str) -> Result<NodeName, KeyError> {
        let bytes = name.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let valid = !name.is_empty()
            && name.len() <= MAX_NODE_NAME_LEN
            && bytes.first().copied().is_some_and(alnum)
            && bytes.last().copied().is_some_and(alnum)
            && bytes.iter().all(|&b| alnum(b) || b == b'-' || b == b'.');
        if valid {
            Ok(NodeName(name.to_owned()))
        } else {
            Err(KeyError::NodeName { name: echo(name) })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for NodeName {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeName::new(s)
    }
}

impl TryFrom<String> for NodeName {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        NodeName::new(&value)
    }
}

impl From<NodeName> for String {
    fn from(value: NodeName) -> Self {
        value.0
    }
}

/// A CIDR as written in a key: `10.244.3.0-24`.
pub fn cidr_segment(cidr: &IpNet) -> String {
    format!("{}-{}", cidr.network(), cidr.prefix_len())
}

/// Parses a key's CIDR segment, accepting only the canonical form with host bits zero. An
/// IPv4 address that parses is in its one form (std refuses leading zeros), so only IPv6 is
/// written back to compare (a full read parses one a key; it formatted both twice before).
pub fn parse_cidr_segment(segment: &str) -> Option<IpNet> {
    let (text, len) = segment.rsplit_once('-')?;
    let addr: std::net::IpAddr = text.parse().ok()?;
    let len = u8::try_from(parse_decimal(len)?).ok()?;
    let cidr = IpNet::new(addr, len).ok()?;
    let canonical = match addr {
        std::net::IpAddr::V4(_) => true,
        std::net::IpAddr::V6(v6) => {
            // Written back on the stack (a rebuild parses hundreds of thousands of these).
            let mut written = StackText::default();
            fmt::Write::write_fmt(&mut written, format_args!("{v6}")).is_ok()
                && written.as_bytes() == text.as_bytes()
        }
    };
    (canonical && cidr.trunc() == cidr).then_some(cidr)
}

/// Text of at most 45 bytes (an IPv6 address's longest form) written without allocating.
struct StackText {
    bytes: [u8; 45],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        StackText {
            bytes: [0; 45],
            len: 0,
        }
    }
}

impl StackText {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A family as written in a key.
pub fn family_segment(family: Family) -> &'static str {
    family.name()
}

/// `<pool>/<family>/<cidr>`: the segments that name one CIDR of a pool, in every key of a
/// grant, a quarantine, an owned CIDR, a delegation, a release or a history event.
struct CidrPath<'a>(&'a PoolName, Family, &'a IpNet);

impl fmt::Display for CidrPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let CidrPath(pool, family, cidr) = self;
        write!(
            f,
            "{pool}/{}/{}",
            family_segment(*family),
            cidr_segment(cidr)
        )
    }
}

fn parse_family_segment(segment: &str) -> Option<Family> {
    match segment {
        "ipv4" => Some(Family::V4),
        "ipv6" => Some(Family::V6),
        _ => None,
    }
}

/// Parses a canonical decimal number (no sign, no leading zeros).
fn parse_decimal(segment: &str) -> Option<u32> {
    let canonical = !segment.is_empty()
        && segment.bytes().all(|b| b.is_ascii_digit())
        && (segment == "0" || !segment.starts_with('0'));
    if canonical {
        segment.parse().ok()
    } else {
        None
    }
}

/// Parses a canonical lower-case hex lease ID.
fn parse_lease_hex(segment: &str) -> Option<u64> {
    let canonical = !segment.is_empty()
        && segment.len() <= 16
        && segment
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && (segment == "0" || !segment.starts_with('0'));
    if canonical {
        u64::from_str_radix(segment, 16).ok()
    } else {
        None
    }
}

/// A parsed corral key, one variant per kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `meta/schema`: the layout version.
    Schema,
    /// `config`: the `ClusterConfig` JSON.
    Config,
    /// `config-applied`: the configuration the leader last installed (`AppliedConfigRecord`),
    /// written by the leader, fenced; it sorts right after `config`.
    ConfigApplied,
    /// `recover`: `corral cluster recover --yes` asked the leader to grant again without
    /// waiting for the agents' assertions after etcd went back in time.
    Recover,
    /// `meta/census`: the node count the agents pace their demand writes by (`CensusRecord`),
    /// written by the leader, fenced, only when the count outgrows it or falls below half.
    Census,
    /// `reassert`: a leader that saw etcd go back in time asks every agent to put its
    /// `holdings/` record again (`ReassertRecord`); records older than this key's mod revision
    /// do not count as asserted after the regression.
    Reassert,
    /// `election/<lease-hex>`: an operator replica campaigning.
    Election {
        /// The replica's lease ID.
        lease: u64,
    },
    /// `nodes/<node>`: a node's registration.
    Node {
        /// The node.
        node: NodeName,
    },
    /// `live/<node>`: a node's liveness, on its agent's lease.
    Live {
        /// The node.
        node: NodeName,
    },
    /// `grants/<pool>/<family>/<cidr>`: a node CIDR grant.
    Grant {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR.
        cidr: IpNet,
    },
    /// `owned/<node>/<pool>/<family>/<cidr>`: the same grant indexed by node.
    Owned {
        /// The node holding the grant.
        node: NodeName,
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR.
        cidr: IpNet,
    },
    /// `owned/<node>/waiting`: why the leader cannot serve the node now (`WaitingRecord`),
    /// written by the leader only when its decision changes and deleted once the node is
    /// served. Three segments, so never a grant (`owned/<node>/<pool>/<family>/<cidr>`).
    Waiting {
        /// The node.
        node: NodeName,
    },
    /// `quarantine/<pool>/<family>/<cidr>`: a released node CIDR waiting before reuse.
    Quarantine {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR.
        cidr: IpNet,
    },
    /// `nodeids/id/<n>`: a granted node ID.
    NodeId {
        /// The node ID.
        id: u32,
    },
    /// `nodeids/node/<node>`: the node ID of a node.
    NodeIdOfNode {
        /// The node.
        node: NodeName,
    },
    /// `quarantine-ids/<n>`: a released node ID waiting before reuse.
    QuarantineId {
        /// The node ID.
        id: u32,
    },
    /// `removals/<node>`: an administrator's request to remove the node (`corral node
    /// remove`), carried out by the leading operator, which deletes it in the same txn.
    Removal {
        /// The node.
        node: NodeName,
    },
    /// `demand/<node>/<pool>`: what a node's agent uses, has free and waits for in a
    /// block-mode pool (written by the agent, debounced).
    Demand {
        /// The node.
        node: NodeName,
        /// The pool.
        pool: PoolName,
    },
    /// `release/<node>/<pool>/<family>/<cidr>`: the release handshake of one block (the
    /// leader writes `marked`, the agent `ready` or `refused`; the leader deletes it when it
    /// releases the block, un-marks it, or forgets a refusal).
    Release {
        /// The node holding the block.
        node: NodeName,
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The block.
        cidr: IpNet,
    },
    /// `interfaces/<node>/<interface-id>`: one cloud interface of a node in a cloud pool, with
    /// the addresses and prefixes the operator assigned to it (the cloud-mode chunk; written
    /// by the leader after the cloud confirmed, watched by the node's agent).
    CloudInterface {
        /// The node whose instance the interface is attached to.
        node: NodeName,
        /// The cloud's interface ID (`eni-...`).
        interface: CloudId,
    },
    /// `intents/<id>`: a cloud mutation the leader is about to make, written (fenced)
    /// before the call and deleted after its outcome is recorded; the next leader finishes or
    /// undoes every one it finds.
    CloudIntent {
        /// The intent's ID (also the call's client token where the cloud takes one).
        id: CloudId,
    },
    /// `delegations/<node>/<pool>/<family>/<cidr>`: a node CIDR of a `to-cloud` pool that the
    /// operator delegated to the node's instance (its primary interface) in the cloud: the
    /// evidence that corral put the prefix there, kept until it is taken back (or the instance
    /// is gone), beyond the grant and the node's registration.
    Delegation {
        /// The node it was delegated for.
        node: NodeName,
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR (the delegated prefix).
        cidr: IpNet,
    },
    /// `holdings/<node>`: what the node's agent holds and serves from (its assertion; written
    /// by the agent, not on a lease, put again whenever it changes or goes missing). The
    /// leader counts every held range as occupied whatever the grants say.
    Holdings {
        /// The node.
        node: NodeName,
    },
    /// `silence/<node>`: a removed node has shown no liveness since the leader put it (on a
    /// lease of the quarantine time; its expiry, while the removal says `silent`, proves the
    /// node gone for a whole quarantine).
    Silence {
        /// The node.
        node: NodeName,
    },
    /// `history/...`: one ended grant (a node CIDR or block) in one of its three indexes,
    /// written by the leader in the fenced transaction that deleted the grant, trimmed by it
    /// by count and age (`crate::history`): `history/at/<to>/<pool>/<family>/<cidr>` (by end
    /// time), `history/cidr/<pool>/<family>/<cidr>/<to>` (who held a CIDR when),
    /// `history/node/<node>/<to>/<pool>/<family>/<cidr>` (everything of a node). `<to>` is
    /// the end in milliseconds since the epoch, 16 zero-padded digits, so keys sort by time.
    History {
        /// Which index.
        index: HistoryIndex,
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR or block.
        cidr: IpNet,
        /// When the grant ended, in milliseconds since the epoch.
        to_ms: u64,
    },
}

/// The index a `history/` key belongs to (each holds the same [`HistoryRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryIndex {
    /// `history/at/`: every event by end time (trimming, the newest events).
    At,
    /// `history/cidr/`: by CIDR, then end time.
    Cidr,
    /// `history/node/<node>/`: by holder, then end time.
    Node(NodeName),
}

/// A time as written in a `history/` key: 16 zero-padded decimal digits of milliseconds.
pub fn time_segment(ms: u64) -> String {
    format!("{ms:016}")
}

fn parse_time_segment(segment: &str) -> Option<u64> {
    (segment.len() == 16 && segment.bytes().all(|b| b.is_ascii_digit()))
        .then(|| segment.parse().ok())
        .flatten()
}

/// A cloud resource or intent ID as it appears in a key: 1 to 128 characters of
/// `[A-Za-z0-9._-]`, so it is one key segment (EC2's IDs: `eni-0123abcd`, `i-...`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CloudId(String);

impl CloudId {
    /// Validates an ID.
    pub fn new(id: &str) -> Result<CloudId, KeyError> {
        let valid = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(CloudId(id.to_owned()))
        } else {
            Err(KeyError::Malformed {
                key: echo(id),
                problem: "not a cloud ID (1 to 128 of A-Z a-z 0-9 . _ -)".to_owned(),
            })
        }
    }

    /// The ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An ID sorting before every other (`"-"`; a range start).
    pub fn min() -> CloudId {
        CloudId("-".to_owned())
    }
}

impl fmt::Display for CloudId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for CloudId {
    type Error = KeyError;
    fn try_from(id: String) -> Result<CloudId, KeyError> {
        CloudId::new(&id)
    }
}

impl From<CloudId> for String {
    fn from(id: CloudId) -> String {
        id.0
    }
}

/// The key builder and parser of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    cluster: ClusterName,
    prefix: String,
}

impl Keys {
    /// The layout of cluster `cluster`.
    pub fn new(cluster: ClusterName) -> Keys {
        let prefix = format!("/corral/{cluster}/v1/");
        Keys { cluster, prefix }
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &ClusterName {
        &self.cluster
    }

    /// `/corral/<cluster>/v1/`: the prefix of every key of the cluster.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, rest: fmt::Arguments<'_>) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// `meta/schema`.
    pub fn schema(&self) -> String {
        self.key(format_args!("meta/schema"))
    }
    /// `config`.
    pub fn config(&self) -> String {
        self.key(format_args!("config"))
    }
    /// `config-applied`.
    pub fn config_applied(&self) -> String {
        self.key(format_args!("config-applied"))
    }
    /// `meta/census`.
    pub fn census(&self) -> String {
        self.key(format_args!("meta/census"))
    }
    /// `election/<lease-hex>`.
    pub fn election(&self, lease: u64) -> String {
        self.key(format_args!("election/{lease:x}"))
    }
    /// `election/`: the prefix of every campaigning replica.
    pub fn election_prefix(&self) -> String {
        self.key(format_args!("election/"))
    }
    /// `nodes/<node>`.
    pub fn node(&self, node: &NodeName) -> String {
        self.key(format_args!("nodes/{node}"))
    }
    /// `nodes/`.
    pub fn nodes_prefix(&self) -> String {
        self.key(format_args!("nodes/"))
    }
    /// `live/<node>`.
    pub fn live(&self, node: &NodeName) -> String {
        self.key(format_args!("live/{node}"))
    }
    /// `live/`.
    pub fn live_prefix(&self) -> String {
        self.key(format_args!("live/"))
    }
    /// `grants/<pool>/<family>/<cidr>`.
    pub fn grant(&self, pool: &PoolName, family: Family, cidr: &IpNet) -> String {
        self.key(format_args!("grants/{}", CidrPath(pool, family, cidr)))
    }
    /// `grants/`.
    pub fn grants_prefix(&self) -> String {
        self.key(format_args!("grants/"))
    }
    /// `owned/<node>/<pool>/<family>/<cidr>`.
    pub fn owned(&self, node: &NodeName, pool: &PoolName, family: Family, cidr: &IpNet) -> String {
        self.key(format_args!(
            "owned/{node}/{}",
            CidrPath(pool, family, cidr)
        ))
    }
    /// `owned/<node>/waiting`: the leader's record of why it cannot serve the node (beside
    /// its grants, under the prefix the node's agent already watches).
    pub fn waiting(&self, node: &NodeName) -> String {
        self.key(format_args!("owned/{node}/waiting"))
    }
    /// `owned/<node>/`: what an agent watches.
    pub fn owned_prefix(&self, node: &NodeName) -> String {
        self.key(format_args!("owned/{node}/"))
    }
    /// `owned/`.
    pub fn all_owned_prefix(&self) -> String {
        self.key(format_args!("owned/"))
    }
    /// `quarantine/<pool>/<family>/<cidr>`.
    pub fn quarantine(&self, pool: &PoolName, family: Family, cidr: &IpNet) -> String {
        self.key(format_args!("quarantine/{}", CidrPath(pool, family, cidr)))
    }
    /// `quarantine/`.
    pub fn quarantine_prefix(&self) -> String {
        self.key(format_args!("quarantine/"))
    }
    /// `nodeids/id/<n>`.
    pub fn node_id(&self, id: u32) -> String {
        self.key(format_args!("nodeids/id/{id}"))
    }
    /// `nodeids/node/<node>`.
    pub fn node_id_of_node(&self, node: &NodeName) -> String {
        self.key(format_args!("nodeids/node/{node}"))
    }
    /// `nodeids/`: both node-ID indexes.
    pub fn node_ids_prefix(&self) -> String {
        self.key(format_args!("nodeids/"))
    }
    /// `quarantine-ids/<n>`.
    pub fn quarantine_id(&self, id: u32) -> String {
        self.key(format_args!("quarantine-ids/{id}"))
    }
    /// `quarantine-ids/`.
    pub fn quarantine_ids_prefix(&self) -> String {
        self.key(format_args!("quarantine-ids/"))
    }

    /// `removals/<node>`.
    pub fn removal(&self, node: &NodeName) -> String {
        self.key(format_args!("removals/{node}"))
    }
    /// `removals/`.
    pub fn removals_prefix(&self) -> String {
        self.key(format_args!("removals/"))
    }

    /// The key text of a parsed key (the inverse of `parse`).
    pub fn format(&self, key: &Key) -> String {
        match key {
            Key::Schema => self.schema(),
            Key::Config => self.config(),
            Key::ConfigApplied => self.config_applied(),
            Key::Recover => self.recover(),
            Key::Reassert => self.reassert(),
            Key::Census => self.census(),
            Key::Election { lease } => self.election(*lease),
            Key::Node { node } => self.node(node),
            Key::Live { node } => self.live(node),
            Key::Grant { pool, family, cidr } => self.grant(pool, *family, cidr),
            Key::Owned {
                node,
                pool,
                family,
                cidr,
            } => self.owned(node, pool, *family, cidr),
            Key::Waiting { node } => self.waiting(node),
            Key::Quarantine { pool, family, cidr } => self.quarantine(pool, *family, cidr),
            Key::NodeId { id } => self.node_id(*id),
            Key::NodeIdOfNode { node } => self.node_id_of_node(node),
            Key::QuarantineId { id } => self.quarantine_id(*id),
            Key::Removal { node } => self.removal(node),
            Key::Demand { node, pool } => self.demand(node, pool),
            Key::Release {
                node,
                pool,
                family,
                cidr,
            } => self.release(node, pool, *family, cidr),
            Key::CloudInterface { node, interface } => self.cloud_interface(node, interface),
            Key::CloudIntent { id } => self.cloud_intent(id),
            Key::Delegation {
                node,
                pool,
                family,
                cidr,
            } => self.delegation(node, pool, *family, cidr),
            Key::Holdings { node } => self.holdings(node),
            Key::Silence { node } => self.silence(node),
            Key::History {
                index,
                pool,
                family,
                cidr,
                to_ms,
            } => match index {
                HistoryIndex::At => self.history_at(*to_ms, pool, *family, cidr),
                HistoryIndex::Cidr => self.history_cidr(pool, *family, cidr, *to_ms),
                HistoryIndex::Node(node) => self.history_node(node, *to_ms, pool, *family, cidr),
            },
        }
    }

    /// `history/`: every history key (which a full read of the cluster skips).
    pub fn history_prefix(&self) -> String {
        format!("{}history/", self.prefix)
    }

    /// `history/at/<to>/<pool>/<family>/<cidr>`.
    pub fn history_at(&self, to_ms: u64, pool: &PoolName, family: Family, cidr: &IpNet) -> String {
        format!(
            "{}history/at/{}/{}",
            self.prefix,
            time_segment(to_ms),
            CidrPath(pool, family, cidr)
        )
    }

    /// `history/at/`: every event, oldest end first.
    pub fn history_at_prefix(&self) -> String {
        format!("{}history/at/", self.prefix)
    }

    /// `history/cidr/<pool>/<family>/<cidr>/<to>`.
    pub fn history_cidr(
        &self,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
        to_ms: u64,
    ) -> String {
        format!(
            "{}{}",
            self.history_of_cidr_prefix(pool, family, cidr),
            time_segment(to_ms)
        )
    }

    /// `history/cidr/<pool>/<family>/<cidr>/`: every holder of one CIDR, oldest first.
    pub fn history_of_cidr_prefix(&self, pool: &PoolName, family: Family, cidr: &IpNet) -> String {
        format!(
            "{}history/cidr/{}/",
            self.prefix,
            CidrPath(pool, family, cidr)
        )
    }

    /// `history/node/<node>/<to>/<pool>/<family>/<cidr>`.
    pub fn history_node(
        &self,
        node: &NodeName,
        to_ms: u64,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
    ) -> String {
        format!(
            "{}{}/{}",
            self.history_of_node_prefix(node),
            time_segment(to_ms),
            CidrPath(pool, family, cidr)
        )
    }

    /// `history/node/<node>/`: every grant a node ended, oldest first.
    pub fn history_of_node_prefix(&self, node: &NodeName) -> String {
        format!("{}history/node/{node}/", self.prefix)
    }

    /// `recover`.
    pub fn recover(&self) -> String {
        format!("{}recover", self.prefix)
    }

    /// `reassert`.
    pub fn reassert(&self) -> String {
        format!("{}reassert", self.prefix)
    }

    /// `holdings/<node>`.
    pub fn holdings(&self, node: &NodeName) -> String {
        format!("{}holdings/{node}", self.prefix)
    }

    /// `silence/<node>`.
    pub fn silence(&self, node: &NodeName) -> String {
        format!("{}silence/{node}", self.prefix)
    }

    /// `holdings/`.
    pub fn holdings_prefix(&self) -> String {
        format!("{}holdings/", self.prefix)
    }

    /// `interfaces/<node>/<interface-id>`.
    pub fn cloud_interface(&self, node: &NodeName, interface: &CloudId) -> String {
        format!("{}interfaces/{node}/{interface}", self.prefix)
    }

    /// `interfaces/<node>/`: every cloud interface record of one node.
    pub fn cloud_interfaces_of_node_prefix(&self, node: &NodeName) -> String {
        format!("{}interfaces/{node}/", self.prefix)
    }

    /// `interfaces/`.
    pub fn cloud_interfaces_prefix(&self) -> String {
        format!("{}interfaces/", self.prefix)
    }

    /// `intents/<id>`.
    pub fn cloud_intent(&self, id: &CloudId) -> String {
        format!("{}intents/{id}", self.prefix)
    }

    /// `intents/`.
    pub fn cloud_intents_prefix(&self) -> String {
        format!("{}intents/", self.prefix)
    }

    /// `delegations/<node>/<pool>/<family>/<cidr>`.
    pub fn delegation(
        &self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
    ) -> String {
        format!(
            "{}delegations/{node}/{}",
            self.prefix,
            CidrPath(pool, family, cidr)
        )
    }

    /// `demand/<node>/<pool>`.
    pub fn demand(&self, node: &NodeName, pool: &PoolName) -> String {
        format!("{}demand/{node}/{pool}", self.prefix)
    }

    /// `demand/<node>/`: every demand key of one node.
    pub fn demand_of_node_prefix(&self, node: &NodeName) -> String {
        format!("{}demand/{node}/", self.prefix)
    }

    /// `demand/`.
    pub fn demands_prefix(&self) -> String {
        format!("{}demand/", self.prefix)
    }

    /// `release/<node>/<pool>/<family>/<cidr>`.
    pub fn release(
        &self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
    ) -> String {
        format!(
            "{}release/{node}/{}",
            self.prefix,
            CidrPath(pool, family, cidr)
        )
    }

    /// `release/<node>/`: every release key of one node.
    pub fn release_of_node_prefix(&self, node: &NodeName) -> String {
        format!("{}release/{node}/", self.prefix)
    }

    /// `release/`.
    pub fn releases_prefix(&self) -> String {
        format!("{}release/", self.prefix)
    }

    /// The prefix of every kind of key there can be many of (per node, grant, CIDR, lease or
    /// event). A full read asks for each with ranges of its own (`corral_kv::Scan`), so what
    /// etcd walks to answer stays in proportion to what is read.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds = vec![
            self.election_prefix(),
            self.nodes_prefix(),
            self.live_prefix(),
            self.grants_prefix(),
            self.all_owned_prefix(),
            self.quarantine_prefix(),
            self.node_ids_prefix(),
            self.quarantine_ids_prefix(),
            self.removals_prefix(),
            self.history_prefix(),
            self.holdings_prefix(),
            self.cloud_interfaces_prefix(),
            self.cloud_intents_prefix(),
            self.demands_prefix(),
            self.releases_prefix(),
        ];
        kinds.extend(["silence/", "delegations/"].map(|kind| format!("{}{kind}", self.prefix)));
        kinds
    }

    /// Parses a key of this cluster into its kind.
    pub fn parse(&self, key: &str) -> Result<Key, KeyError> {
        let Some(rest) = key.strip_prefix(self.prefix.as_str()) else {
            return Err(KeyError::Foreign {
                key: echo(key),
                prefix: self.prefix.clone(),
            });
        };
        let malformed = |problem: &str| KeyError::Malformed {
            key: echo(key),
            problem: problem.to_owned(),
        };
        // The longest kind has 7 segments (`history/node/...`); a key with more is of no kind.
        let mut segments = [""; 8];
        let mut count = 0;
        for segment in rest.split('/') {
            if count == segments.len() {
                break;
            }
            segments[count] = segment;
            count += 1;
        }
        let parts = &segments[..count];
        let node = |text: &str| NodeName::new(text).map_err(|_| malformed("invalid node name"));
        let pool = |text: &str| PoolName::new(text).map_err(|_| malformed("invalid pool name"));
        let family =
            |text: &str| parse_family_segment(text).ok_or_else(|| malformed("invalid family"));
        let cidr = |text: &str, family: Family| match parse_cidr_segment(text) {
            Some(cidr) if crate::net::family_of(&cidr) == family => Ok(cidr),
            Some(_) => Err(malformed("CIDR of the wrong family")),
            None => Err(malformed("invalid CIDR")),
        };
        let id = |text: &str| match parse_decimal(text) {
            Some(id) if id > 0 => Ok(id),
            _ => Err(malformed("invalid node ID")),
        };
        match parts {
            ["meta", "schema"] => Ok(Key::Schema),
            ["config"] => Ok(Key::Config),
            ["config-applied"] => Ok(Key::ConfigApplied),
            ["recover"] => Ok(Key::Recover),
            ["reassert"] => Ok(Key::Reassert),
            ["meta", "census"] => Ok(Key::Census),
            ["election", lease] => parse_lease_hex(lease)
                .map(|lease| Key::Election { lease })
                .ok_or_else(|| malformed("invalid lease ID")),
            ["nodes", name] => Ok(Key::Node { node: node(name)? }),
            ["live", name] => Ok(Key::Live { node: node(name)? }),
            ["grants", p, f, c] => {
                let family = family(f)?;
                Ok(Key::Grant {
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                })
            }
            ["owned", n, p, f, c] => {
                let family = family(f)?;
                Ok(Key::Owned {
                    node: node(n)?,
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                })
            }
            ["owned", n, "waiting"] => Ok(Key::Waiting { node: node(n)? }),
            ["quarantine", p, f, c] => {
                let family = family(f)?;
                Ok(Key::Quarantine {
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                })
            }
            ["nodeids", "id", n] => Ok(Key::NodeId { id: id(n)? }),
            ["nodeids", "node", name] => Ok(Key::NodeIdOfNode { node: node(name)? }),
            ["quarantine-ids", n] => Ok(Key::QuarantineId { id: id(n)? }),
            ["removals", name] => Ok(Key::Removal { node: node(name)? }),
            ["demand", n, p] => Ok(Key::Demand {
                node: node(n)?,
                pool: pool(p)?,
            }),
            ["release", n, p, f, c] => {
                let family = family(f)?;
                Ok(Key::Release {
                    node: node(n)?,
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                })
            }
            ["interfaces", n, i] => Ok(Key::CloudInterface {
                node: node(n)?,
                interface: CloudId::new(i).map_err(|_| malformed("invalid cloud ID"))?,
            }),
            ["intents", i] => Ok(Key::CloudIntent {
                id: CloudId::new(i).map_err(|_| malformed("invalid cloud ID"))?,
            }),
            ["delegations", n, p, f, c] => {
                let family = family(f)?;
                Ok(Key::Delegation {
                    node: node(n)?,
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                })
            }
            ["holdings", name] => Ok(Key::Holdings { node: node(name)? }),
            ["silence", name] => Ok(Key::Silence { node: node(name)? }),
            ["history", rest @ ..] => {
                let time = |text: &str| {
                    parse_time_segment(text).ok_or_else(|| malformed("invalid history time"))
                };
                let (index, p, f, c, t) = match rest {
                    ["at", t, p, f, c] => (HistoryIndex::At, p, f, c, t),
                    ["cidr", p, f, c, t] => (HistoryIndex::Cidr, p, f, c, t),
                    ["node", n, t, p, f, c] => (HistoryIndex::Node(node(n)?), p, f, c, t),
                    _ => return Err(malformed("unknown kind of key")),
                };
                let family = family(f)?;
                Ok(Key::History {
                    index,
                    pool: pool(p)?,
                    family,
                    cidr: cidr(c, family)?,
                    to_ms: time(t)?,
                })
            }
            _ => Err(malformed("unknown kind of key")),
        }
    }
}

/// `owned/<node>/waiting`'s value: the leader's decision about a node it cannot serve now,
/// and why (what `ClusterView::waits` works out, with what only the leader knows: granting
/// paused after etcd went back in time, a cloud instance at its limit). Written only when the
/// decision changes; deleted when the node is served. The node's agent reads it from the
/// watch it keeps on its grants, so a CNI ADD can name the cause without asking etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingRecord {
    /// Since when the node waits for this (milliseconds since the epoch): kept while the
    /// node waits, whatever the reasons become.
    pub since_ms: u64,
    /// What the node waits for, one entry per pool and family (or the node ID).
    pub waits: Vec<WaitingEntry>,
    /// Granting is paused for the whole cluster, and why (etcd went back in time and the
    /// leader waits for the agents' assertions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// A removal of the node is in progress: nothing more is granted to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removing: bool,
}

impl WaitingRecord {
    /// The decision without its time: two records that say the same thing.
    pub fn same_decision(&self, other: &WaitingRecord) -> bool {
        self.waits == other.waits && self.paused == other.paused && self.removing == other.removing
    }

    /// Why the node gets nothing in `pool`, in a sentence, if the record says (granting
    /// paused first, then each family's cause); `until` prints a time.
    pub fn cause_of_pool(&self, pool: &str, until: impl Fn(u64) -> String) -> Option<String> {
        let mut parts: Vec<String> = self
            .paused
            .iter()
            .map(|why| format!("granting is paused cluster-wide ({why})"))
            .collect();
        parts.extend(self.of_pool(pool).map(|w| w.cause_text(&until)));
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// The entries of one pool.
    pub fn of_pool<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = &'a WaitingEntry> + 'a {
        self.waits
            .iter()
            .filter(move |w| w.pool.as_ref().is_some_and(|p| p.as_str() == pool))
    }
}

/// One thing a node waits for, in a [`WaitingRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingEntry {
    /// The pool (`None`: a node ID).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "waiting_text::pool"
    )]
    pub pool: Option<PoolName>,
    /// The family (`ipv4`, `ipv6`).
    #[serde(with = "waiting_text::family")]
    pub family: Family,
    /// What it lacks: `CIDR`, `block`, `node ID` or `address` (a cloud pool's).
    pub unit: String,
    /// Why, as a kind.
    pub cause: WaitingCause,
    /// How many units are in quarantine (`quarantined`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub quarantined: u64,
    /// When the first of them leaves quarantine (milliseconds since the epoch), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// Why, in words: `no free block: the pool is exhausted`.
    pub why: String,
}

impl WaitingEntry {
    /// The cause in a sentence (an ADD's error, `corral explain`): `the cluster's pool pods
    /// (IPv4) is exhausted: no free block for the node`. `until`: `until_ms` as the caller
    /// prints times.
    pub fn cause_text(&self, until: impl Fn(u64) -> String) -> String {
        let family = match self.family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        let Some(pool) = &self.pool else {
            return format!("the cluster's node IDs are exhausted ({})", self.why);
        };
        let unit = &self.unit;
        match self.cause {
            WaitingCause::NotGranted => {
                format!("the cluster's pool {pool} ({family}): {unit} not granted yet")
            }
            WaitingCause::Exhausted => format!(
                "the cluster's pool {pool} ({family}) is exhausted: no free {unit} for the node"
            ),
            WaitingCause::Quarantined => format!(
                "the cluster's pool {pool} ({family}) has no free {unit}: its only space is in \
                 quarantine ({} {unit}{}){}",
                self.quarantined,
                if self.quarantined == 1 { "" } else { "s" },
                match self.until_ms {
                    Some(ms) => format!(" until {}", until(ms)),
                    None => " held by a removed node until it gives it up".to_owned(),
                }
            ),
            WaitingCause::AtCapacity => {
                format!("in the cluster's pool {pool} ({family}), {}", self.why)
            }
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A waiting entry's pool and family as text (`pods`, `ipv4`).
mod waiting_text {
    pub(super) mod pool {
        use corral_core::PoolName;
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            pool: &Option<PoolName>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match pool {
                Some(pool) => serializer.serialize_str(pool.as_str()),
                None => serializer.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<PoolName>, D::Error> {
            Option::<String>::deserialize(deserializer)?
                .map(|text| PoolName::new(&text).map_err(serde::de::Error::custom))
                .transpose()
        }
    }

    pub(super) mod family {
        use corral_core::Family;
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            family: &Family,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.serialize_str(super::super::family_segment(*family))
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Family, D::Error> {
            let text = String::deserialize(deserializer)?;
            super::super::parse_family_segment(&text)
                .ok_or_else(|| serde::de::Error::custom(format!("{text:?}: not a family")))
        }
    }
}

/// Why a node waits, as a kind (see [`WaitingEntry::why`] for the words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingCause {
    /// Space is free: the leader grants it next (recorded only while granting is paused or
    /// the node is being removed).
    NotGranted,
    /// The pool (or the node-ID plan) has no free space and none in quarantine.
    Exhausted,
    /// The only space is in quarantine.
    Quarantined,
    /// A cloud pool: the node's instance is at its limit of interfaces or addresses.
    AtCapacity,
}

/// `meta/schema`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaRecord {
    /// The layout version (`SCHEMA_VERSION`).
    pub version: u32,
}

/// `nodes/<node>`'s value, written by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The machine's identity (instance or boot ID): a new uid needs the node removed first.
    pub uid: String,
    /// The node's addresses.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// When the agent registered, in milliseconds since the epoch.
    #[serde(default)]
    pub registered_ms: u64,
    /// The cloud instance the node runs on (cloud pools: the operator manages this
    /// instance's interfaces for the node), if the agent was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The most pods the node runs (the agent's `--max-pods`, as the kubelet's): block and
    /// cloud pools never grow its holdings past it (`DemandConfig::capped_watermarks_for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<u64>,
}

/// `live/<node>`'s value, on the agent's lease. One agent process holds it at a time: it is
/// created only if absent, and names its holder so a second agent can say who holds it and
/// tell an earlier process of its own machine (gone, its lease not yet expired) from a live
/// one. Fields added later are `#[serde(default)]`: an older agent's record reads with them
/// empty (such a holder is waited for, never presumed gone).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LiveRecord {
    /// The agent's process ID.
    pub pid: u32,
    /// The agent's version.
    pub version: String,
    /// When the agent took the key, in milliseconds since the epoch.
    pub started_ms: u64,
    /// The host name of the machine the agent runs on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`): a new one at every boot and
    /// on every machine, so a clone of a machine has another.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// The agent's PID namespace (`/proc/self/ns/pid`, e.g. `pid:[4026531836]`): a PID means
    /// the same process only within one namespace (containers on one host share a boot ID).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pid_namespace: String,
    /// The process's start time in clock ticks after boot (`/proc/<pid>/stat`, field 22):
    /// with the boot ID, the namespace and the PID, it names one process, whatever PIDs
    /// are reused.
    #[serde(default)]
    pub process_start: u64,
    /// The lease's TTL in milliseconds: how long the key outlives its holder at most (a
    /// waiting agent waits about this long for it to expire).
    #[serde(default)]
    pub ttl_ms: u64,
}

/// `grants/...`'s value: who holds the node CIDR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// The node holding it.
    pub node: NodeName,
    /// The node's uid when granted.
    pub uid: String,
    /// The create revision of `nodes/<node>` when granted.
    pub node_revision: i64,
    /// When it was granted, in milliseconds since the epoch (`None`: granted before the
    /// history was kept, or by a caller that gave no time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_ms: Option<u64>,
}

/// `owned/...`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OwnedRecord {
    /// The create revision of `nodes/<node>` when granted.
    #[serde(default)]
    pub node_revision: i64,
}

/// `quarantine/...`'s and `quarantine-ids/...`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineRecord {
    /// The node that held it.
    pub from_node: NodeName,
    /// Why it was released (e.g. `node removed`).
    pub reason: String,
    /// When the quarantine began, in milliseconds since the epoch.
    pub since_ms: u64,
    /// `waiting`: a removed node may still serve from it (not on a lease: nothing is
    /// proposed there, and its quarantine has not begun); `quarantined` (the default, and
    /// what records written before had): on a lease of the quarantine time.
    #[serde(default, skip_serializing_if = "QuarantineState::is_quarantined")]
    pub state: QuarantineState,
}

/// `recover`'s value, written by `corral cluster recover --yes`: the leader that sees it put
/// stops waiting for the agents' assertions after etcd went back in time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverRecord {
    /// When it was asked for, in milliseconds since the epoch.
    pub requested_ms: u64,
    /// The live nodes that had not asserted their holdings when it was asked for.
    #[serde(default)]
    pub unasserted: Vec<String>,
}

/// `reassert`'s value, put by a leader that saw etcd go back in time: every agent that sees it
/// change puts its `holdings/` record again, so the leader can tell assertions made since from
/// records that came back with a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReassertRecord {
    /// When it was asked for, in milliseconds since the epoch.
    #[serde(default)]
    pub requested_ms: u64,
    /// The replica that asked.
    #[serde(default)]
    pub replica: String,
    /// What it saw (the regression, in words).
    #[serde(default)]
    pub reason: String,
}

/// Where a quarantine key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuarantineState {
    /// On a lease of the quarantine time: free when etcd deletes it.
    #[default]
    Quarantined,
    /// Held by its removed node (`from_node`) until it gives it up or is proven gone: not on
    /// a lease.
    Waiting,
}

impl QuarantineState {
    /// Whether it is `Quarantined`.
    pub fn is_quarantined(&self) -> bool {
        *self == QuarantineState::Quarantined
    }
}

/// `removals/<node>`'s value, written by `corral node remove` (phase `requested`) and kept
/// by the leader through the node's drain (phases `draining`, `silent`) until what it held
/// was given up or it was proven gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalRecord {
    /// The create revision of `nodes/<node>` the request is about: a node registered again
    /// since is not removed by an old request.
    pub node_revision: i64,
    /// When it was asked, in milliseconds since the epoch.
    #[serde(default)]
    pub requested_ms: u64,
    /// How it was asked (`corral node remove --drain`, `--force`, or plain).
    #[serde(default, skip_serializing_if = "RemovalMode::is_plain")]
    pub mode: RemovalMode,
    /// Where the removal stands.
    #[serde(default, skip_serializing_if = "RemovalPhase::is_requested")]
    pub phase: RemovalPhase,
}

/// `silence/<node>`'s value, put by the leader on a lease of the quarantine time when a
/// removed node shows no liveness.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SilenceRecord {
    /// When the leader saw it without liveness, in milliseconds since the epoch.
    #[serde(default)]
    pub since_ms: u64,
}

/// How a removal was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalMode {
    /// A node that is not live, or holds no allocation.
    #[default]
    Plain,
    /// A live node with pods: it takes no new pods, its space comes back as it empties.
    Drain,
    /// A node its operator knows is dead.
    Force,
}

impl RemovalMode {
    /// Whether it is `Plain`.
    pub fn is_plain(&self) -> bool {
        *self == RemovalMode::Plain
    }
}

/// Where a removal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalPhase {
    /// Asked for: the leader has not removed the registration yet.
    #[default]
    Requested,
    /// The registration and grants are gone; what the node held waits (quarantine keys in
    /// state `waiting`) until its agent gives it up.
    Draining,
    /// As `draining`, and the node showed no liveness when the leader put `silence/<node>`
    /// (on a lease of the quarantine time) in the same transaction.
    Silent,
}

impl RemovalPhase {
    /// Whether it is `Requested`.
    pub fn is_requested(&self) -> bool {
        *self == RemovalPhase::Requested
    }
}

/// `holdings/<node>`'s value, written by the node's agent (never on a lease): every range of
/// the cluster's space the agent holds and may serve pods from, granted or draining, and the
/// node IDs whose plan it serves. etcd decides who *gets* space; this record is the holder's
/// word on what it has not given up, so space etcd forgot (a node removed while alive, a
/// configuration written around the CLI, a restored snapshot) is never handed to another
/// node while its holder still holds it. The agent puts it whenever what it holds changes
/// and again whenever the key goes missing or says something else.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HoldingsRecord {
    /// The machine's identity (`nodes/<node>`'s uid) of the agent that wrote it.
    pub uid: String,
    /// The cluster ranges it holds (node CIDRs, blocks, from-cloud prefixes).
    #[serde(default)]
    pub ranges: Vec<HeldRange>,
    /// The node ID whose plan it serves, if any (the highest, when it serves several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u32>,
    /// Node IDs besides `node_id` whose plan's pod range it still serves pods from: draining,
    /// after its node ID changed (a restored snapshot lost its grant, or the node was removed
    /// and registered again). Each is as occupied as `node_id`; [`Self::node_ids`] reads both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_node_ids: Vec<u32>,
    /// Addresses and prefixes of cloud interfaces it holds (cloud pools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cloud: Vec<HeldCloudAddress>,
    /// Grants to the node it does not take up: made before the highest revision the agent
    /// had seen, of space it does not hold (etcd handed back a grant it had given up: restored
    /// from a snapshot). The leader revokes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedGrant>,
    /// A node ID granted to the node that it does not take up, on the same grounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_node_id: Option<RefusedNodeId>,
    /// When it was written, in milliseconds since the epoch.
    #[serde(default)]
    pub written_ms: u64,
}

/// A node ID an agent does not take up (see [`HoldingsRecord::refused_node_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RefusedNodeId {
    /// The ID.
    pub id: u32,
    /// The create revision of its grant (`node-id-of-node/<node>`, created with `node-ids/<id>`).
    pub revision: i64,
}

/// A grant an agent does not take up (see [`HoldingsRecord::refused`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RefusedGrant {
    /// The pool it was granted in.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The range (its family is the CIDR's).
    #[serde(with = "crate::text")]
    pub cidr: IpNet,
    /// The create revision of the grant (its `owned/` key, created with `grants/`).
    pub grant_revision: i64,
}

impl HoldingsRecord {
    /// Whether it holds nothing at all (ranges, node IDs, cloud addresses).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.node_ids().next().is_none() && self.cloud.is_empty()
    }

    /// Every node ID it holds: `node_id`, then `other_node_ids`.
    pub fn node_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.node_id
            .into_iter()
            .chain(self.other_node_ids.iter().copied())
    }
}

/// One cluster range an agent holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeldRange {
    /// The pool it was granted in.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The range (a node CIDR or block; its family is the CIDR's).
    #[serde(with = "crate::text")]
    pub cidr: IpNet,
    /// Draining: nothing new is handed out from it, its allocations stay until released.
    #[serde(default)]
    pub draining: bool,
    /// How many addresses are allocated in it.
    #[serde(default)]
    pub allocations: u64,
}

impl HeldRange {
    /// The range's family.
    pub fn family(&self) -> Family {
        match self.cidr {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

/// One address or prefix of a cloud interface an agent holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeldCloudAddress {
    /// The cloud pool.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The interface it is on.
    pub interface: CloudId,
    /// The address (/32, /128) or prefix (/28, /80).
    #[serde(with = "crate::text")]
    pub address: IpNet,
    /// How many addresses are allocated in it.
    #[serde(default)]
    pub allocations: u64,
}

/// One family of a node's demand in a block-mode pool, counted in addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FamilyDemand {
    /// Addresses allocated.
    pub used: u64,
    /// Addresses free to allocate now (in blocks not surrendered).
    pub free: u64,
    /// Allocations waiting for a grant (CNI ADDs held while the pool has nothing free).
    #[serde(default)]
    pub pending: u64,
    /// Blocks the agent holds in use or free (not surrendered in a release handshake).
    #[serde(default)]
    pub blocks: u64,
    /// Some of the blocks holding no allocation, highest address first (at most
    /// [`FamilyDemand::MAX_EMPTY`]): the candidates the operator may mark for release.
    #[serde(default, with = "crate::text::list")]
    pub empty: Vec<IpNet>,
}

impl FamilyDemand {
    /// The most empty blocks a demand record lists (keeps the value small).
    pub const MAX_EMPTY: usize = 16;
}

/// `demand/<node>/<pool>`'s value, written by the node's agent: at most one write a second,
/// only when something changed (at once when free falls below pre-allocate).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DemandRecord {
    /// IPv4, if the pool has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyDemand>,
    /// IPv6, if the pool has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyDemand>,
    /// When it was measured, in milliseconds since the epoch.
    #[serde(default)]
    pub at_ms: u64,
}

impl DemandRecord {
    /// The demand of one family.
    pub fn family(&self, family: Family) -> Option<&FamilyDemand> {
        match family {
            Family::V4 => self.ipv4.as_ref(),
            Family::V6 => self.ipv6.as_ref(),
        }
    }

    /// The demand of one family, to fill in.
    pub fn family_mut(&mut self, family: Family) -> &mut Option<FamilyDemand> {
        match family {
            Family::V4 => &mut self.ipv4,
            Family::V6 => &mut self.ipv6,
        }
    }
}

/// Where a block's release handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseState {
    /// The leader asks for the block back (it stayed excess for the release delay).
    Marked,
    /// The agent found it empty and surrendered it in one local transaction: nothing is
    /// allocated from it any more. The leader may now delete the grant.
    Ready,
    /// The agent found it in use (or does not hold it); the leader forgets the request.
    Refused,
}

impl ReleaseState {
    /// The state's name as stored.
    pub fn name(self) -> &'static str {
        match self {
            ReleaseState::Marked => "marked",
            ReleaseState::Ready => "ready",
            ReleaseState::Refused => "refused",
        }
    }
}

/// `release/<node>/<pool>/<family>/<cidr>`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRecord {
    /// Where the handshake stands.
    pub state: ReleaseState,
    /// The create revision of the block's `grants/` key the request is about: a block
    /// released and granted again is not touched by an old request.
    pub grant_revision: i64,
    /// When the leader marked it, in milliseconds since the epoch.
    #[serde(default)]
    pub marked_ms: u64,
    /// When the agent answered, in milliseconds since the epoch (0 before).
    #[serde(default)]
    pub answered_ms: u64,
    /// Why the agent refused, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Whether a cloud interface is attached yet, as the leader last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CloudAttachment {
    /// Attach was called; the cloud has not confirmed it yet (the agent waits: the device may
    /// not exist on the node).
    Attaching,
    /// Attached to the node's instance: its addresses may be handed out.
    Attached,
}

/// `interfaces/<node>/<interface-id>`'s value: one interface of a node in a cloud pool and what
/// the cloud assigned to it, as the leader last confirmed it. The agent serves exactly these
/// addresses and prefixes (less those it surrendered in a release handshake) from its
/// interface-backed pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudInterfaceRecord {
    /// The cloud pool the interface serves.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The instance it is attached to.
    pub instance_id: String,
    /// Its device index on the instance (0: the primary interface).
    pub device_index: u32,
    /// Its subnet.
    pub subnet_id: String,
    /// The subnet's CIDRs: IPv4, then IPv6 if it has one.
    #[serde(default, with = "crate::text::list")]
    pub subnets: Vec<IpNet>,
    /// Its MAC address (`aa:bb:cc:dd:ee:ff`).
    pub mac: String,
    /// Its primary IPv4 address (never handed to a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_ipv4: Option<std::net::Ipv4Addr>,
    /// Secondary IPv4 addresses and delegated /28 prefixes, then IPv6 addresses and /80
    /// prefixes: each one range of the agent's pool.
    #[serde(default, with = "crate::text::list")]
    pub addresses: Vec<IpNet>,
    /// When each of `addresses` was assigned (first recorded on this interface, on the
    /// leader's wall clock, milliseconds since the epoch): where its history starts, as a
    /// grant's `granted_ms`. An address without one was recorded before these times were kept.
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        with = "crate::text::map"
    )]
    pub assigned_ms: std::collections::BTreeMap<IpNet, u64>,
    /// Attaching or attached.
    pub attachment: CloudAttachment,
    /// Whether corral created it (a corral-tagged interface; the primary and interfaces made
    /// by others are not), so only these are ever detached or deleted.
    #[serde(default)]
    pub managed: bool,
    /// When a prefix request for it was refused (`InsufficientCidrBlocks`: its subnet had no
    /// free aligned prefix), on the leader's wall clock: it takes single addresses until
    /// [`crate::cloud::PREFIX_REFUSAL_TTL_MS`] later, and if corral created it its subnet is
    /// not chosen for a new interface's prefixes either. Kept here so a new leader does not
    /// repeat the futile call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefixes_refused_ms: Option<u64>,
}

impl CloudInterfaceRecord {
    /// Stamps `assigned_ms` for this record replacing `old` (the interface's record before, if
    /// any) at `now_ms`: an address `old` held in the same pool keeps its time (or its lack
    /// of one), any other is assigned now; addresses no longer held lose theirs.
    pub fn stamp_assigned(&mut self, old: Option<&CloudInterfaceRecord>, now_ms: u64) {
        let old = old.filter(|old| old.pool == self.pool);
        self.assigned_ms = self
            .addresses
            .iter()
            .filter_map(|net| match old {
                Some(old) if old.addresses.contains(net) => {
                    old.assigned_ms.get(net).map(|ms| (*net, *ms))
                }
                _ => Some((*net, now_ms)),
            })
            .collect();
    }
}

/// What a cloud intent is about to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub enum CloudOp {
    /// Create an interface (client token = the intent's ID) and attach it at `device_index`.
    CreateAttach {
        /// The subnet.
        subnet_id: String,
        /// The device index.
        device_index: u32,
    },
    /// Assign addresses or prefixes to an interface (by count: reconciled by describing).
    Assign {
        /// The interface.
        interface: CloudId,
        /// How many.
        count: u32,
        /// Prefixes (/28, /80) instead of single addresses.
        prefixes: bool,
        /// IPv6 instead of IPv4.
        ipv6: bool,
        /// What the interface held before the call (to tell the call's addresses apart).
        #[serde(default, with = "crate::text::list")]
        before: Vec<IpNet>,
    },
    /// Unassign addresses or prefixes the agent surrendered.
    Unassign {
        /// The interface.
        interface: CloudId,
        /// What.
        #[serde(with = "crate::text::list")]
        addresses: Vec<IpNet>,
    },
    /// Detach (if attached) and delete an interface: a leak or an unneeded one.
    Delete {
        /// The interface.
        interface: CloudId,
    },
    /// Delegate a node CIDR of a `to-cloud` pool to the node's primary interface (explicit
    /// prefix: repeating it cannot assign a second one).
    DelegatePrefix {
        /// The interface (the instance's primary).
        interface: CloudId,
        /// The node CIDR.
        #[serde(with = "crate::text")]
        prefix: IpNet,
    },
    /// Take back a prefix corral delegated (its grant gone, or the node removed).
    UndelegatePrefix {
        /// The interface.
        interface: CloudId,
        /// The prefix.
        #[serde(with = "crate::text")]
        prefix: IpNet,
    },
}

impl CloudOp {
    /// Whether the op is a node-CIDR delegation's (`to-cloud` pools), replayed by
    /// `cloud::to_cloud`, not by `replay_intent`.
    pub fn is_delegation(&self) -> bool {
        matches!(
            self,
            CloudOp::DelegatePrefix { .. } | CloudOp::UndelegatePrefix { .. }
        )
    }
}

/// `delegations/...`'s value: where the prefix was delegated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegationRecord {
    /// The instance.
    pub instance_id: String,
    /// Its primary interface, which holds the prefix.
    pub interface: CloudId,
    /// When the cloud confirmed it, in milliseconds since the epoch.
    pub at_ms: u64,
}

/// `intents/<id>`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudIntentRecord {
    /// The node it is for (none for the leak collector's deletions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeName>,
    /// The pool.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The operation.
    #[serde(flatten)]
    pub op: CloudOp,
    /// When the leader wrote it, in milliseconds since the epoch.
    pub started_ms: u64,
}

/// `nodeids/id/<n>`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdRecord {
    /// The node holding the ID.
    pub node: NodeName,
    /// The node's uid when granted.
    pub uid: String,
    /// The create revision of `nodes/<node>` when granted.
    pub node_revision: i64,
}

/// Every `history/...` key's value: one grant of a node CIDR or block, from its grant to its
/// end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The pool.
    #[serde(with = "crate::text")]
    pub pool: PoolName,
    /// The node CIDR or block (its family is the CIDR's).
    #[serde(with = "crate::text")]
    pub cidr: IpNet,
    /// The node that held it.
    pub node: NodeName,
    /// When it was granted, in milliseconds since the epoch (`None`: before the history was
    /// kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_ms: Option<u64>,
    /// When the grant ended (was deleted), in milliseconds since the epoch.
    pub to_ms: u64,
    /// Why it ended.
    pub why: GrantEnd,
}

/// Why a grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantEnd {
    /// Its agent gave it back through the release handshake (block pools).
    Released,
    /// The node was removed (`corral node remove`); its space waits for the agent or a
    /// quarantine before reuse.
    NodeRemoved,
    /// Its agent refused it (etcd handed back a grant it had given up) and the leader revoked
    /// it.
    Revoked,
    /// The cloud no longer delegates it to the node's instance (from-cloud pools).
    Withdrawn,
}

impl GrantEnd {
    /// Its name on the wire and in output (`released`, `node_removed`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            GrantEnd::Released => "released",
            GrantEnd::NodeRemoved => "node_removed",
            GrantEnd::Revoked => "revoked",
            GrantEnd::Withdrawn => "withdrawn",
        }
    }
}

/// `nodeids/node/<node>`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdOfNodeRecord {
    /// The node's ID.
    pub id: u32,
}

/// Encodes a record as its stored JSON, with the `schema` field.
pub fn encode_value<T: Serialize>(record: &T) -> Result<Vec<u8>, ValueError> {
    serde_json::to_vec(&envelope::Envelope {
        schema: SCHEMA_VERSION,
        record,
    })
    .map_err(|e| ValueError::Encode {
        record: short_type_name::<T>(),
        message: e.to_string(),
    })
}

/// Decodes a stored value; unknown fields are ignored (a newer writer may add some), a missing
/// `schema` reads as 1, and anything that is not the record's JSON is an error (a value of
/// another schema is told as such, whether or not it reads as the record).
pub fn decode_value<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ValueError> {
    use envelope::Enveloped;
    let record = short_type_name::<T>();
    let other_schema = |schema: Option<u32>| {
        schema
            .filter(|&schema| schema != SCHEMA_VERSION)
            .map(|schema| ValueError::Schema { record, schema })
    };
    match serde_json::from_slice::<Enveloped<T>>(bytes) {
        Ok(envelope) => match other_schema(envelope.schema) {
            Some(error) => Err(error),
            None => Ok(envelope.record),
        },
        // Not the record: another schema's, or no record at all.
        Err(e) => {
            let envelope = serde_json::from_slice::<Enveloped<serde::de::IgnoredAny>>(bytes);
            Err(envelope
                .ok()
                .and_then(|envelope| other_schema(envelope.schema))
                .unwrap_or_else(|| ValueError::Decode {
                    record,
                    message: e.to_string(),
                }))
        }
    }
}

fn short_type_name<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    name.rsplit("::").next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::interface_record;

    /// The allocation-free parse answers as the old one did (format `addr/len`, parse, write
    /// it back and compare), on canonical and non-canonical segments of both families.
    #[test]
    fn cidr_segments_parse_as_written_and_canonical_only() {
        let old = |segment: &str| -> Option<IpNet> {
            let (addr, len) = segment.rsplit_once('-')?;
            let cidr: IpNet = format!("{addr}/{len}").parse().ok()?;
            (cidr_segment(&cidr) == segment && cidr.trunc() == cidr).then_some(cidr)
        };
        let cases = [
            "10.0.0.0-24",
            "10.0.0.0-026",
            "010.0.0.0-24",
            "10.0.0.1-24",
            "10.0.0.0-33",
            "10.0.0.0-+24",
            "10.0.0.0--24",
            "10.0.0.0-",
            "-24",
            "10.0.0.0",
            "10.0.0.0-24-1",
            "0.0.0.0-0",
            "255.255.255.255-32",
            "fd00::-64",
            "fd00:0::-64",
            "FD00::-64",
            "fd00::1-64",
            "fd00::-129",
            "fd00:0:0:1::-64",
            "fd00::1:0:0:0-64",
            "::-0",
            "::ffff:10.0.0.0-120",
            "::ffff:a00:0-120",
            "fd00:10:244:1::-64",
            "fd00::-064",
            "1:2:3:4:5:6:7:8-128",
            "1:2:3:4:5:6:7::-112",
            "1:0:0:4:5:0:0:0-128",
            "1::4:5:0:0:0-128",
            "1:0:0:4:5::-128",
            "10.0.0.0-24 ",
            " 10.0.0.0-24",
        ];
        for case in cases {
            assert_eq!(parse_cidr_segment(case), old(case), "{case:?}");
        }
        for i in 0..2000u32 {
            let v4 = IpNet::new(
                std::net::Ipv4Addr::from(i.wrapping_mul(2_654_435_761)).into(),
                (i % 33) as u8,
            )
            .unwrap()
            .trunc();
            let v6 = IpNet::new(
                std::net::Ipv6Addr::from(
                    u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                )
                .into(),
                (i % 129) as u8,
            )
            .unwrap()
            .trunc();
            for cidr in [v4, v6] {
                let segment = cidr_segment(&cidr);
                assert_eq!(parse_cidr_segment(&segment), Some(cidr), "{segment}");
            }
        }
    }

    fn keys() -> Keys {
        Keys::new(ClusterName::new("prod-1").unwrap())
    }

    #[test]
    fn every_kind_round_trips() {
        let keys = keys();
        let node = NodeName::new("node-1.example").unwrap();
        let pool = PoolName::new("default").unwrap();
        let v4: IpNet = "10.244.3.0/24".parse().unwrap();
        let v6: IpNet = "fd00:10:244:1::/64".parse().unwrap();
        let all = [
            Key::Schema,
            Key::Config,
            Key::ConfigApplied,
            Key::Recover,
            Key::Reassert,
            Key::Census,
            Key::Election {
                lease: 0x694d_77aa_9e38_260f,
            },
            Key::Node { node: node.clone() },
            Key::Live { node: node.clone() },
            Key::Grant {
                pool: pool.clone(),
                family: Family::V4,
                cidr: v4,
            },
            Key::Owned {
                node: node.clone(),
                pool: pool.clone(),
                family: Family::V6,
                cidr: v6,
            },
            Key::Quarantine {
                pool: pool.clone(),
                family: Family::V6,
                cidr: v6,
            },
            Key::NodeId { id: 5 },
            Key::NodeIdOfNode { node: node.clone() },
            Key::QuarantineId { id: 4_000_000_000 },
            Key::Removal { node: node.clone() },
            Key::Silence { node: node.clone() },
            Key::Waiting { node: node.clone() },
            Key::CloudInterface {
                node: node.clone(),
                interface: CloudId::new("eni-0a1b2c3d4e5f").unwrap(),
            },
            Key::CloudIntent {
                id: CloudId::new("corral-7f3a").unwrap(),
            },
            Key::Delegation {
                node: node.clone(),
                pool: pool.clone(),
                family: Family::V6,
                cidr: v6,
            },
            Key::History {
                index: HistoryIndex::At,
                pool: pool.clone(),
                family: Family::V4,
                cidr: v4,
                to_ms: 1_764_000_000_000,
            },
            Key::History {
                index: HistoryIndex::Cidr,
                pool: pool.clone(),
                family: Family::V6,
                cidr: v6,
                to_ms: 0,
            },
            Key::History {
                index: HistoryIndex::Node(node.clone()),
                pool: pool.clone(),
                family: Family::V4,
                cidr: v4,
                to_ms: 7,
            },
        ];
        let kinds = keys.kinds();
        let singletons = [
            Key::Schema,
            Key::Census,
            Key::Config,
            Key::ConfigApplied,
            Key::Recover,
            Key::Reassert,
        ];
        for key in all {
            let text = keys.format(&key);
            // Every key there can be many of is read by the kind's own ranges.
            assert!(
                singletons.contains(&key) || kinds.iter().any(|kind| text.starts_with(kind)),
                "{text} is under no kind"
            );
            assert!(text.starts_with("/corral/prod-1/v1/"), "{text}");
            assert_eq!(keys.parse(&text).unwrap(), key, "{text}");
            // The leader finds `config` on the first page of a full read: every other kind of
            // key sorts after it.
            if key != Key::Config {
                assert!(text > keys.config(), "{text} sorts before the config key");
            }
        }
        assert_eq!(
            keys.grant(&pool, Family::V4, &v4),
            "/corral/prod-1/v1/grants/default/ipv4/10.244.3.0-24"
        );
        assert_eq!(
            keys.owned(&node, &pool, Family::V6, &v6),
            "/corral/prod-1/v1/owned/node-1.example/default/ipv6/fd00:10:244:1::-64"
        );
        assert_eq!(keys.election(0xab), "/corral/prod-1/v1/election/ab");
        for text in [
            keys.holdings(&node),
            keys.demand(&node, &pool),
            keys.release(&node, &pool, Family::V4, &v4),
        ] {
            assert!(kinds.iter().any(|kind| text.starts_with(kind)), "{text}");
        }
        assert!(
            keys.owned(&node, &pool, Family::V6, &v6)
                .starts_with(&keys.owned_prefix(&node))
        );
        // The waiting record is under the prefix the agent watches, and never a grant, even
        // of a pool named `waiting`.
        let waiting = keys.waiting(&node);
        assert_eq!(waiting, "/corral/prod-1/v1/owned/node-1.example/waiting");
        assert!(waiting.starts_with(&keys.owned_prefix(&node)));
        let pool_waiting = PoolName::new("waiting").unwrap();
        assert!(matches!(
            keys.parse(&keys.owned(&node, &pool_waiting, Family::V4, &v4)),
            Ok(Key::Owned { .. })
        ));
    }

    #[test]
    fn a_waiting_record_round_trips_with_its_pool_and_family_as_text() {
        let record = WaitingRecord {
            since_ms: 5,
            waits: vec![WaitingEntry {
                pool: Some(PoolName::new("pods").unwrap()),
                family: Family::V6,
                unit: "block".into(),
                cause: WaitingCause::Quarantined,
                quarantined: 2,
                until_ms: Some(9),
                why: "no free block: the only space is in quarantine (2 blocks)".into(),
            }],
            paused: None,
            removing: false,
        };
        let bytes = encode_value(&record).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains(r#""pool":"pods","family":"ipv6","unit":"block","cause":"quarantined""#),
            "{text}"
        );
        assert_eq!(decode_value::<WaitingRecord>(&bytes).unwrap(), record);
        assert!(decode_value::<WaitingRecord>(br#"{"since_ms":1,"waits":[{"family":"ipv5","unit":"x","cause":"exhausted","why":""}]}"#).is_err());
    }

    #[test]
    fn garbage_keys_are_errors() {
        let keys = keys();
        let p = keys.prefix().to_owned();
        let garbage = [
            "".to_owned(),
            "/corral/other/v1/config".to_owned(),
            p.clone(),
            format!("{p}config/x"),
            format!("{p}meta/other"),
            format!("{p}election/0ab"),
            format!("{p}election/AB"),
            format!("{p}election/12345678901234567"),
            format!("{p}nodes/"),
            format!("{p}nodes/Node"),
            format!("{p}nodes/-a"),
            format!("{p}nodes/a/b"),
            format!("{p}grants/default/ipv4/10.244.3.1-24"),
            format!("{p}grants/default/ipv4/10.244.3.0-33"),
            format!("{p}grants/default/ipv4/10.244.3.0/24"),
            format!("{p}grants/default/ipv6/10.244.3.0-24"),
            format!("{p}grants/default/ipv5/10.244.3.0-24"),
            format!("{p}grants/default/ipv6/fd00:0010:244:1::-64"),
            format!("{p}grants/bad pool/ipv4/10.244.3.0-24"),
            format!("{p}grants/default/ipv4"),
            format!("{p}owned/n/default/ipv4/10.0.0.0-+8"),
            format!("{p}nodeids/id/0"),
            format!("{p}nodeids/id/05"),
            format!("{p}nodeids/id/-5"),
            format!("{p}nodeids/id/99999999999"),
            format!("{p}quarantine-ids/x"),
            format!("{p}\u{0}\u{ffff}/\u{7f}"),
        ];
        for key in garbage {
            assert!(keys.parse(&key).is_err(), "{key:?}");
        }
        assert!(ClusterName::new("Prod").is_err());
        assert!(ClusterName::new(&"a".repeat(64)).is_err());
        assert!(NodeName::new(&"a".repeat(254)).is_err());
        assert!(NodeName::new(&"a".repeat(253)).is_ok());
    }

    #[test]
    fn values_round_trip_and_garbage_is_an_error() {
        let record = GrantRecord {
            node: NodeName::new("n1").unwrap(),
            uid: "u".into(),
            node_revision: 7,
            granted_ms: None,
        };
        let bytes = encode_value(&record).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            r#"{"schema":1,"node":"n1","uid":"u","node_revision":7}"#
        );
        assert_eq!(decode_value::<GrantRecord>(&bytes).unwrap(), record);
        // Tolerant: no schema field, an extra field.
        let tolerant = br#"{"node":"n1","uid":"u","node_revision":7,"later":true}"#;
        assert_eq!(decode_value::<GrantRecord>(tolerant).unwrap(), record);
        for garbage in [
            &b""[..],
            b"\xff\xfe",
            b"null",
            b"[]",
            br#"{"schema":2,"node":"n1","uid":"u","node_revision":7}"#,
            br#"{"node":"N1","uid":"u","node_revision":7}"#,
            br#"{"node":"n1","uid":"u","node_revision":"7"}"#,
        ] {
            assert!(decode_value::<GrantRecord>(garbage).is_err(), "{garbage:?}");
        }
        assert_eq!(
            decode_value::<OwnedRecord>(b"{}").unwrap(),
            OwnedRecord::default()
        );
        let schema = encode_value(&SchemaRecord { version: 1 }).unwrap();
        assert_eq!(decode_value::<SchemaRecord>(&schema).unwrap().version, 1);
    }

    /// A cloud address's history starts when it is first recorded: kept across records that
    /// keep it, now for a new one, unknown for one recorded before the times were kept.
    #[test]
    fn cloud_addresses_keep_the_time_they_were_first_recorded() {
        let net = |a: &str| a.parse::<IpNet>().unwrap();
        let mut first = interface_record("vpc", "i-1", &["10.0.1.11/32", "10.0.1.32/28"]);
        first.stamp_assigned(None, 1000);
        assert_eq!(
            first.assigned_ms,
            [(net("10.0.1.11/32"), 1000), (net("10.0.1.32/28"), 1000)].into()
        );
        let mut second = interface_record("vpc", "i-1", &["10.0.1.11/32", "10.0.1.12/32"]);
        second.stamp_assigned(Some(&first), 2000);
        assert_eq!(
            second.assigned_ms,
            [(net("10.0.1.11/32"), 1000), (net("10.0.1.12/32"), 2000)].into()
        );
        // Another pool's record: everything is new there.
        let mut moved = interface_record("other", "i-1", &["10.0.1.11/32"]);
        moved.stamp_assigned(Some(&second), 3000);
        assert_eq!(moved.assigned_ms, [(net("10.0.1.11/32"), 3000)].into());
        // Written before the times were kept: its addresses stay without one.
        let old = interface_record("vpc", "i-1", &["10.0.1.11/32"]);
        let mut after = interface_record("vpc", "i-1", &["10.0.1.11/32", "10.0.1.12/32"]);
        after.stamp_assigned(Some(&old), 4000);
        assert_eq!(after.assigned_ms, [(net("10.0.1.12/32"), 4000)].into());
        // Kept in the value; an old value without them reads as none.
        let bytes = encode_value(&after).unwrap();
        assert!(
            String::from_utf8_lossy(&bytes).contains(r#""assigned_ms":{"10.0.1.12/32":4000}"#),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(decode_value::<CloudInterfaceRecord>(&bytes).unwrap(), after);
        let bytes = encode_value(&old).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("assigned_ms"));
    }

    #[test]
    fn cloud_ids_are_one_segment_and_cloud_records_round_trip() {
        for bad in ["", "a/b", "eni 1", &"x".repeat(129), "é"] {
            assert!(CloudId::new(bad).is_err(), "{bad:?}");
        }
        assert!(CloudId::min() < CloudId::new("0").unwrap());
        let keys = keys();
        assert!(
            keys.parse("/corral/prod-1/v1/interfaces/node-1/a/b")
                .is_err()
        );
        assert!(keys.parse("/corral/prod-1/v1/intents/").is_err());
        let interface = CloudInterfaceRecord {
            subnets: vec!["10.0.1.0/24".parse().unwrap()],
            primary_ipv4: Some("10.0.1.10".parse().unwrap()),
            assigned_ms: [("10.0.1.11/32".parse().unwrap(), 1_795_788_120_000)].into(),
            ..interface_record("vpc", "i-0123", &["10.0.1.11/32", "10.0.1.32/28"])
        };
        let bytes = encode_value(&interface).unwrap();
        assert_eq!(
            decode_value::<CloudInterfaceRecord>(&bytes).unwrap(),
            interface
        );
        let intent = CloudIntentRecord {
            node: Some(NodeName::new("node-1").unwrap()),
            pool: PoolName::new("vpc").unwrap(),
            instance_id: Some("i-0123".into()),
            op: CloudOp::Assign {
                interface: CloudId::new("eni-1").unwrap(),
                count: 8,
                prefixes: false,
                ipv6: false,
                before: vec!["10.0.1.11/32".parse().unwrap()],
            },
            started_ms: 5,
        };
        let bytes = encode_value(&intent).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""op":"assign""#), "{text}");
        assert_eq!(decode_value::<CloudIntentRecord>(&bytes).unwrap(), intent);
        assert!(decode_value::<CloudIntentRecord>(br#"{"schema":1,"op":"explode"}"#).is_err());
    }
}
