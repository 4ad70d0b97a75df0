//! The cloud node manager's decisions, as values: Cilium's `NodeManager` / `NodeOperations`
//! (`PrepareIPAllocation`, `CreateInterface`, `PrepareIPRelease`, prefix delegation) and AWS VPC
//! CNI ipamd's warm targets, for nodes of a cloud pool (CLUSTER-DESIGN sections 1 and 2).
//!
//! The operator (`corral-operator`'s `leader/cloud.rs`) reads the cloud (through
//! `corral_cloud::CloudProvider`) and etcd, turns what it saw into the inputs here, and carries
//! out the returned action: one cloud mutation at a time per node, each behind a fenced intent
//! record. Nothing here does I/O or reads a clock.
//!
//! Counted per node and family, in addresses: a delegated /28 counts 16, a /80 counts 2^48
//! (clipped to `u64`). An interface's primary address is never a pod address and never counted.
//!
//! Rules every function keeps:
//! - never flapping: a node released down to `blocks::keep_level` needs nothing next round, and
//!   one just grown has no excess (the worked examples of CLUSTER-DESIGN 1.1 and 2.1 are tests);
//! - no futile calls: an instance at its interface and address limits, or whose subnets have
//!   no room, is reported at capacity and gets no action;
//! - prefix delegation is a property of each interface, not of the node: an interface whose
//!   subnet refused a /28 (`InsufficientCidrBlocks`) takes single addresses from then on, the
//!   node's other interfaces keep their prefixes;
//! - only addresses the agent reported free (its demand's `empty` list) are ever marked for
//!   release, and only after the node stayed in excess for the release delay.

use std::collections::BTreeMap;

use corral_core::Family;
use ipnet::IpNet;

use crate::blocks::Statistics;
use crate::config::{CloudPoolConfig, WarmTargets, Watermarks};
use crate::keys::{CloudId, CloudIntentRecord, CloudInterfaceRecord, FamilyDemand};

/// The interface and address limits of the node's instance type (EC2's
/// `DescribeInstanceTypes`; corral-cloud's `InstanceTypeInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Interfaces the instance can have attached (the primary included).
    pub max_interfaces: u32,
    /// IPv4 addresses per interface, the primary included (a /28 prefix takes one slot).
    pub ipv4_per_interface: u32,
    /// IPv6 addresses per interface (a /80 prefix takes one slot).
    pub ipv6_per_interface: u32,
    /// Whether the instance takes delegated prefixes (Nitro).
    pub prefix_delegation: bool,
}

/// One interface of the node's instance, as the leader last saw it (cloud and etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceView {
    /// The interface.
    pub id: CloudId,
    /// Its device index (0: the primary).
    pub device_index: u32,
    /// Its subnet.
    pub subnet_id: String,
    /// Whether corral created it (only these are ever detached or deleted).
    pub managed: bool,
    /// Never given pod addresses (a trunk, EFA, or excluded by configuration).
    pub excluded: bool,
    /// Attached (not attaching or detaching).
    pub attached: bool,
    /// Its secondary addresses and delegated prefixes, both families (not the primary).
    pub addresses: Vec<IpNet>,
    /// Its subnet refused a prefix: single addresses only from now on (per interface).
    pub secondaries_only: bool,
}

/// A subnet new interfaces may be created in, as the leader last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetView {
    /// The subnet.
    pub id: String,
    /// Its availability zone.
    pub zone: String,
    /// Its CIDRs (IPv4, then IPv6 if any).
    pub cidrs: Vec<IpNet>,
    /// Free IPv4 addresses (EC2's `AvailableIpAddressCount`).
    pub free_ipv4: u32,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// It refused a prefix lately (`InsufficientCidrBlocks`): not chosen for prefixes.
    pub no_free_prefix: bool,
}

/// Everything the decision for one node, cloud pool and family rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCloudInput<'a> {
    /// The family decided for.
    pub family: Family,
    /// The node's watermarks in the pool (used when `cloud.warm` is `None`).
    pub watermarks: Watermarks,
    /// The pool's cloud settings (warm targets, prefix delegation, subnet choice, first
    /// interface index).
    pub cloud: &'a CloudPoolConfig,
    /// The instance's limits.
    pub limits: InstanceLimits,
    /// The instance's availability zone.
    pub zone: &'a str,
    /// The instance's own subnet (its primary interface's).
    pub node_subnet: &'a str,
    /// The instance's interfaces, the primary included.
    pub interfaces: &'a [InterfaceView],
    /// The subnets of the instance's VPC.
    pub subnets: &'a [SubnetView],
    /// Device indexes the cloud said are taken though no interface above has them (an
    /// attachment not visible yet): skipped when choosing one.
    pub occupied_indexes: &'a [u32],
    /// The agent's last demand report for this family, if any (none: nothing is released,
    /// and a node holding nothing is served as if it used nothing).
    pub demand: Option<&'a FamilyDemand>,
    /// Addresses in an open release handshake: not counted as available.
    pub releasing: &'a [IpNet],
    /// Since when the node has been in excess, if it has.
    pub excess_since_ms: Option<u64>,
    /// Now, on the leader's clock.
    pub now_ms: u64,
    /// The pool's release delay.
    pub release_delay_ms: u64,
}

/// What the leader does next for one node, pool and family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CloudAction {
    /// Nothing: between the watermarks (or waiting for the release delay).
    #[default]
    Nothing,
    /// Assign `count` addresses (or `count` prefixes) to an existing attached interface.
    Assign {
        /// The interface: the first (lowest device index) with room whose subnet has room.
        interface: CloudId,
        /// How many addresses, or prefixes when `prefixes`.
        count: u32,
        /// Delegated prefixes instead of single addresses.
        prefixes: bool,
    },
    /// Create an interface with `count` addresses (or prefixes) and attach it at
    /// `device_index`.
    Create {
        /// The subnet: the pool's explicit ones > by tags > the node's own if it has room >
        /// the one of the node's zone with most free addresses.
        subnet_id: String,
        /// The first free device index at or above the pool's first interface index.
        device_index: u32,
        /// How many addresses, or prefixes when `prefixes`.
        count: u32,
        /// Delegated prefixes instead of single addresses.
        prefixes: bool,
    },
    /// Ask the agent to give these free addresses (or prefixes) of one interface back: the
    /// release handshake's `marked`.
    Mark {
        /// The interface.
        interface: CloudId,
        /// What to mark: free per the agent's report, at most the excess.
        addresses: Vec<IpNet>,
    },
}

/// The decision for one node, pool and family, and why.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudPlan {
    /// Cilium's statistics of the node (capacity: the instance's limit, or max-allocate).
    pub stats: Statistics,
    /// What to do.
    pub action: CloudAction,
    /// The node needs addresses but its instance is at its limits or no subnet has room: no
    /// call is made, and the node is reported at capacity.
    pub at_capacity: bool,
    /// Since when the node is in excess (`None`: it is not); the leader keeps it for the next
    /// round.
    pub excess_since_ms: Option<u64>,
}

/// Decides what to do for one node, pool and family.
pub fn plan_node(input: &NodeCloudInput<'_>) -> CloudPlan {
    let _ = input;
    todo!("cloud decisions (issue 14)")
}

/// How many addresses the node needs and has in excess under AWS VPC CNI's targets
/// (CLUSTER-DESIGN 2.1: `short`, `over`, WARM_ENI, WARM_PREFIX), with corral's no-flap rule;
/// `(needed, excess)`.
pub fn warm_needed_and_excess(
    targets: &WarmTargets,
    limits: &InstanceLimits,
    prefixes: bool,
    available: u64,
    used: u64,
    pending: u64,
) -> (u64, u64) {
    let _ = (targets, limits, prefixes, available, used, pending);
    todo!("cloud decisions (issue 14)")
}

/// The subnet a new interface goes in, or `None` if none has room for `count` addresses (or
/// prefixes); `avoid` lists subnets that just refused (a sibling retry).
pub fn choose_subnet<'a>(
    cloud: &CloudPoolConfig,
    zone: &str,
    node_subnet: &str,
    subnets: &'a [SubnetView],
    count: u32,
    prefixes: bool,
    avoid: &[String],
) -> Option<&'a SubnetView> {
    let _ = (cloud, zone, node_subnet, subnets, count, prefixes, avoid);
    todo!("cloud decisions (issue 14)")
}

/// The device index for a new interface: the first at or above `first` that no interface has
/// and `occupied` does not list, below the instance's interface limit; after the cloud said
/// `after` is taken, the next one above it.
pub fn next_device_index(
    interfaces: &[InterfaceView],
    first: u32,
    max_interfaces: u32,
    occupied: &[u32],
    after: Option<u32>,
) -> Option<u32> {
    let _ = (interfaces, first, max_interfaces, occupied, after);
    todo!("cloud decisions (issue 14)")
}

/// What to do when a prefix request was refused with `InsufficientCidrBlocks` (the subnet has
/// no free aligned /28, though it may have single addresses left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixFallback {
    /// A new interface: try a sibling subnet of the same zone (not yet tried) with prefixes.
    Sibling {
        /// The subnet.
        subnet_id: String,
    },
    /// Single addresses on that interface (or a new interface in that subnet) instead: the
    /// interface is `secondaries_only` from now on; the node's others keep prefixes.
    Secondaries,
}

/// Chooses the fallback after `InsufficientCidrBlocks` for `action` (an `Assign` or `Create`
/// with `prefixes`); `tried` lists the subnets already refused.
pub fn prefix_fallback(
    action: &CloudAction,
    cloud: &CloudPoolConfig,
    zone: &str,
    subnets: &[SubnetView],
    tried: &[String],
) -> PrefixFallback {
    let _ = (action, cloud, zone, subnets, tried);
    todo!("cloud decisions (issue 14)")
}

/// An interface the leaked-interface collector looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakCandidate {
    /// The interface.
    pub id: CloudId,
    /// It carries corral's tags for this cluster (never touch anything else).
    pub tagged: bool,
    /// It is `available`: not attached, not attaching, not detaching.
    pub available: bool,
    /// When corral created it (its creation tag), if known.
    pub created_ms: Option<u64>,
    /// A `cloud-if/` record or an open intent names it (then it is not a leak).
    pub recorded: bool,
}

/// What one collector run does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GcPlan {
    /// Delete these now: tagged, available, unrecorded, seen so on a run at least the
    /// interval ago and created at least the interval ago; at most the cap.
    pub delete: Vec<CloudId>,
    /// The first sightings to keep for the next run (candidates not deleted now).
    pub seen: BTreeMap<CloudId, u64>,
    /// Leaks left for a later run by the cap.
    pub over_cap: usize,
}

/// Cilium's two-observation rule for leaked interfaces, with AWS VPC CNI's minimum age.
pub fn plan_leak_gc(
    candidates: &[LeakCandidate],
    seen: &BTreeMap<CloudId, u64>,
    now_ms: u64,
    interval_ms: u64,
    cap: usize,
) -> GcPlan {
    let _ = (candidates, seen, now_ms, interval_ms, cap);
    todo!("cloud decisions (issue 14)")
}

/// An interface as the cloud shows it, for replaying an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedInterface {
    /// The interface.
    pub id: CloudId,
    /// The instance and device index it is attached (or attaching) to.
    pub attached_to: Option<(String, u32)>,
    /// Its secondary addresses and prefixes, both families.
    pub addresses: Vec<IpNet>,
}

/// What the next leader does with an intent it found open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Nothing was applied (or all of it is recorded already): delete the intent.
    Forget,
    /// The call was applied: record the interface as observed, then delete the intent.
    Record(ObservedInterface),
    /// A created interface never got attached, and the node still needs it: attach it.
    Attach {
        /// The interface.
        interface: CloudId,
        /// Where.
        device_index: u32,
    },
    /// Undo: delete the interface (created, unattached, not needed any more).
    Delete {
        /// The interface.
        interface: CloudId,
    },
    /// Addresses surrendered by the agent are still on the interface: unassign them again.
    Unassign {
        /// The interface.
        interface: CloudId,
        /// What.
        addresses: Vec<IpNet>,
    },
    /// The cloud's view is not settled (the interface may not be visible yet): ask again
    /// after a resync, change nothing.
    Wait,
}

/// Decides how to finish or undo an open intent from what the cloud shows now: `found` is the
/// interface the intent is about (for a create: the one carrying the intent's client token or
/// tag), `record` the node's `cloud-if/` record of it, `node_present` whether the node is still
/// registered with this instance, `age_ms` how long ago the intent was written.
pub fn replay_intent(
    intent: &CloudIntentRecord,
    found: Option<&ObservedInterface>,
    record: Option<&CloudInterfaceRecord>,
    node_present: bool,
    age_ms: u64,
) -> Replay {
    let _ = (intent, found, record, node_present, age_ms);
    todo!("cloud decisions (issue 14)")
}

/// The order nodes are served in (Cilium's `GetNodesByIPWatermarkLocked`): largest need first,
/// then nothing to do, then releases (largest excess last); IPv4 need before IPv6 need.
/// Returns the indexes of `plans` in that order; stable for equal keys.
pub fn serve_order(plans: &[(u64, u64)]) -> Vec<usize> {
    let _ = plans;
    todo!("cloud decisions (issue 14)")
}
