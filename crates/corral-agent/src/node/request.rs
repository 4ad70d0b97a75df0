//! The arguments of the node state's operations, in domain terms: pools are [`PoolName`]s,
//! keys [`AttachmentKey`]s, addresses and families parsed, a CNI network's pools a
//! [`ScopeConfig`] that parses. Whoever builds one has checked what it came from: the REST
//! API at its edge (`api.rs`, `TryFrom` each body, with the messages the API answers), which
//! also checks the DELs recorded while the agent was away (`pending.rs`); tests build them
//! directly. So the state machine never parses a wire string of its requests.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Exclusion, Family, GcPolicy, InterfaceId, IpNet, MacAddr, PoolName, RangeSpec,
    Uuid,
};
use corral_store::ScopeConfig;

use crate::ipamd::IpamdAllocation;

/// The allocation history asked ([`Op::History`](super::Op::History)): the events `query`
/// matches, and with `held_at`, who held that address at that instant.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub query: corral_store::HistoryQuery,
    pub held_at: Option<(IpAddr, corral_core::Timestamp)>,
}

/// What an allocation asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// The next free address of a family.
    Next(Family),
    /// The next free address of each family, both or neither.
    Dual,
    /// This address.
    Address(IpAddr),
}

/// An allocation from a pool of a scope ([`Op::Allocate`](super::Op::Allocate)).
#[derive(Clone, Debug)]
pub struct Allocate {
    pub scope: String,
    pub pool: PoolName,
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub wanted: Wanted,
    /// A lease: the allocation expires after this long unless renewed.
    pub lease: Option<Duration>,
}

/// What a release names: exactly one of these.
#[derive(Clone, Debug)]
pub enum ReleaseOf {
    /// Every address an attachment holds.
    Key(AttachmentKey),
    /// One address, only if it still has this generation when one is given.
    Address {
        address: IpAddr,
        generation: Option<u64>,
    },
    /// Every address of an owner.
    Owner(String),
}

/// A release in a scope ([`Op::Release`](super::Op::Release)).
#[derive(Clone, Debug)]
pub struct Release {
    pub scope: String,
    pub of: ReleaseOf,
}

/// Where a CNI network's addresses come from.
#[derive(Clone, Debug)]
pub enum NetworkPools {
    /// A pool of the agent's own (`node`) scope.
    Node(PoolName),
    /// The network's own pools, its scope's configuration (which parses, and whose name is
    /// not the node scope's).
    Own(ScopeConfig),
}

/// A CNI network as a verb acts on it.
#[derive(Clone, Debug)]
pub struct CniNetwork {
    pub name: String,
    pub pools: NetworkPools,
}

/// One address of a CNI ADD on a network's own pools.
#[derive(Clone, Debug)]
pub struct CniSet {
    pub pool: PoolName,
    pub family: Family,
    /// An address of that family the call asks for.
    pub requested: Option<IpAddr>,
}

/// What a CNI ADD takes, by where it takes it from.
#[derive(Clone, Debug)]
pub enum CniAddSets {
    /// A node pool: one address per family the pool serves, these requested ones (at most
    /// one per family) included.
    Node {
        pool: PoolName,
        requested: Vec<(Family, IpAddr)>,
    },
    /// The network's own pools, under its configuration: the sets, all or nothing.
    Own {
        config: ScopeConfig,
        sets: Vec<CniSet>,
    },
}

/// A CNI ADD ([`Op::CniAdd`](super::Op::CniAdd)).
#[derive(Clone, Debug)]
pub struct CniAdd {
    /// The network's name.
    pub network: String,
    pub key: AttachmentKey,
    pub owner: String,
    pub sets: CniAddSets,
}

/// A CNI DEL ([`Op::CniDel`](super::Op::CniDel)): the attachment's addresses.
#[derive(Clone, Debug)]
pub struct CniDel {
    pub network: CniNetwork,
    pub key: AttachmentKey,
}

/// A CNI CHECK ([`Op::CniCheck`](super::Op::CniCheck)): it reads the network's scope by
/// name (or the node pool), under whatever configuration the scope has.
#[derive(Clone, Debug)]
pub struct CniCheck {
    /// The network's name: its scope's.
    pub network: String,
    /// The node pool the network allocates from, if it does.
    pub node_pool: Option<PoolName>,
    pub key: AttachmentKey,
}

/// CNI STATUS ([`Op::CniStatus`](super::Op::CniStatus)): the use of the network's pools.
#[derive(Clone, Debug)]
pub struct CniStatus {
    pub network: CniNetwork,
}

/// CNI GC ([`Op::CniGc`](super::Op::CniGc)): the leak collector over the network's
/// attachments, `live` being the ones the runtime still has.
#[derive(Clone, Debug)]
pub struct CniGc {
    pub network: CniNetwork,
    pub live: HashSet<AttachmentKey>,
    pub policy: GcPolicy,
}

/// The leak collector over a scope's attachments ([`Op::Gc`](super::Op::Gc)).
#[derive(Clone, Debug)]
pub struct Gc {
    pub scope: String,
    pub live: HashSet<AttachmentKey>,
    pub policy: GcPolicy,
    /// Decide and report only: nothing is recorded or released.
    pub dry_run: bool,
}

/// A lease put on an allocated address ([`Op::LeaseStart`](super::Op::LeaseStart)).
#[derive(Clone, Debug)]
pub struct LeaseStart {
    pub scope: String,
    pub address: IpAddr,
    pub duration: Duration,
}

/// A lease taken off its address ([`Op::LeaseStop`](super::Op::LeaseStop)): the address stays
/// allocated, without a timer.
#[derive(Clone, Debug)]
pub struct LeaseStop {
    pub scope: String,
    pub address: IpAddr,
    pub id: Uuid,
}

/// A range of a pool, added or removed ([`Op::AddRange`](super::Op::AddRange),
/// [`Op::RemoveRange`](super::Op::RemoveRange)).
#[derive(Clone, Debug)]
pub struct PoolRange {
    pub scope: String,
    pub pool: PoolName,
    pub range: RangeSpec,
}

/// An exclusion added to a pool, or its reason replaced
/// ([`Op::AddExclusion`](super::Op::AddExclusion)); a reason the agent keeps for its own
/// exclusions is refused.
#[derive(Clone, Debug)]
pub struct AddExclusion {
    pub scope: String,
    pub pool: PoolName,
    pub exclusion: Exclusion,
}

/// An exclusion removed from a pool ([`Op::RemoveExclusion`](super::Op::RemoveExclusion)).
#[derive(Clone, Debug)]
pub struct RemoveExclusion {
    pub scope: String,
    pub pool: PoolName,
    pub network: IpNet,
}

/// An interface added to an interface-backed pool of the node scope, with its addresses, all
/// or nothing ([`Op::AddInterface`](super::Op::AddInterface)).
#[derive(Clone, Debug)]
pub struct AddInterface {
    pub pool: PoolName,
    pub id: InterfaceId,
    /// The attachment's device index (0 is the primary interface).
    pub device_number: u32,
    pub mac: MacAddr,
    /// At least one.
    pub subnets: Vec<IpNet>,
    pub gateways: Vec<IpAddr>,
    pub routes: Vec<IpNet>,
    pub primary: bool,
    pub primary_addresses: Vec<IpAddr>,
    pub trunk: bool,
    pub excluded: bool,
    /// Secondary addresses (as /32 or /128) and delegated prefixes.
    pub addresses: Vec<IpNet>,
}

/// AWS VPC CNI's ipamd checkpoint, read, into an interface-backed pool
/// ([`Op::ImportIpamd`](super::Op::ImportIpamd)).
#[derive(Clone, Debug)]
pub struct ImportIpamd {
    pub pool: PoolName,
    pub allocations: Vec<IpamdAllocation>,
}
