//! The cloud node manager's decisions, as values: Cilium's `NodeManager` / `NodeOperations`
//! (`PrepareIPAllocation`, `CreateInterface`, `PrepareIPRelease`, prefix delegation) and AWS VPC
//! CNI ipamd's warm targets, for nodes of a cloud pool (CLUSTER-DESIGN sections 1 and 2).
//!
//! The operator (`corral-operator`'s `leader/cloud/`) reads the cloud (through
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

use crate::blocks::{self, Statistics};
use crate::config::{CloudPoolConfig, ReleasePolicy, Watermarks};
use crate::keys::{CloudId, FamilyDemand, ReleaseState};

mod choice;
mod empty;
mod gc;
mod ladder;
mod node_cidr;
mod records;
mod replay;
mod targets;
#[cfg(test)]
mod tests;
pub mod to_cloud;

pub use choice::{
    PREFIX_REFUSAL_TTL_MS, PrefixFallback, ServeKey, choose_subnet, next_device_index,
    prefix_fallback, prefix_refusal_holds, serve_order,
};
pub use empty::{empty_interface_to_delete, is_empty_managed, track_empty};
pub use gc::{GcPlan, LeakCandidate, plan_leak_gc};
pub use ladder::{Attaching, FirstStep, InstanceLife, Ladder, NodeFacts, first_step};
pub use node_cidr::{
    FromCloudInput, FromCloudPlan, FromCloudProblem, FromCloudReport, Sight, plan_from_cloud,
};
pub use records::{
    MissingInCloud, RecordConflict, RecordIndex, confirm_missing, missing_in_cloud,
    record_conflicts,
};
pub use replay::{DESCRIBE_LAG_BOUND_MS, ObservedInterface, Replay, replay_intent};
pub use targets::{WarmMode, warm_excess_releasing, warm_mode, warm_needed_and_excess};

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

/// An address (or prefix) of the node in an open release handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Releasing {
    /// The address or prefix (the `release/` key's CIDR).
    pub address: IpNet,
    /// Where the handshake stands: a `Ready` (surrendered) address is not counted as
    /// available; a `Marked` one still is (the agent may refuse it).
    pub state: ReleaseState,
    /// When the leader marked it, in milliseconds on its clock (oldest complete first).
    pub marked_ms: u64,
}

/// Everything the decision for one node, cloud pool and family rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCloudInput<'a> {
    /// The family decided for.
    pub family: Family,
    /// The node's watermarks in the pool (used when `cloud.warm` is `None`; its
    /// `max_allocate` caps the node in both cases).
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
    /// The instance's interfaces, the primary included. Only those at or above the pool's
    /// first interface index and not excluded serve the pool ("usable"): their addresses are
    /// the node's, they get new ones, and they give back excess.
    pub interfaces: &'a [InterfaceView],
    /// The subnets of the instance's VPC.
    pub subnets: &'a [SubnetView],
    /// Device indexes the cloud said are taken though no interface above has them (an
    /// attachment not visible yet): skipped when choosing one.
    pub occupied_indexes: &'a [u32],
    /// The agent's last demand report for this family, if any (none: nothing is released,
    /// and a node holding nothing is served as if it used nothing).
    pub demand: Option<&'a FamilyDemand>,
    /// The node's open release handshakes in this pool and family.
    pub releasing: &'a [Releasing],
    /// Since when the node has been in excess, if it has.
    pub excess_since_ms: Option<u64>,
    /// Now, on the leader's clock.
    pub now_ms: u64,
    /// The pool's release delay.
    pub release_delay_ms: u64,
}

/// What the leader does next for one node, pool and family: at most one cloud mutation (or
/// one round of marks).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CloudAction {
    /// Nothing: between the watermarks (or waiting for the release delay, for an interface
    /// still attaching that has room, or at capacity).
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
    /// Unassign addresses the agent surrendered (`ready`) and that are still excess, all on
    /// one interface (the oldest mark's first); then complete their handshakes.
    Unassign {
        /// The interface.
        interface: CloudId,
        /// What.
        addresses: Vec<IpNet>,
    },
}

impl CloudAction {
    /// Whether the action calls the cloud (`Assign`, `Create`, `Unassign`).
    pub fn is_cloud_call(&self) -> bool {
        matches!(
            self,
            CloudAction::Assign { .. } | CloudAction::Create { .. } | CloudAction::Unassign { .. }
        )
    }
}

/// The decision for one node, pool and family, and why.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudPlan {
    /// Cilium's statistics of the node (capacity: the instance's limit, or max-allocate when
    /// smaller). `available` leaves surrendered addresses out.
    pub stats: Statistics,
    /// What to do.
    pub action: CloudAction,
    /// The node needs addresses but its instance is at its limits (or max-allocate) or no
    /// subnet has room: no call is made (the action is `Nothing`), and the node is reported
    /// at capacity. A node that can get part of what it wants gets it first (not at capacity
    /// yet).
    pub at_capacity: bool,
    /// Since when the node is in excess (`None`: it is not); the leader keeps it for the next
    /// round.
    pub excess_since_ms: Option<u64>,
    /// Handshakes to end because the address is no longer excess (Cilium's
    /// `abortNoLongerExcessIPs`): delete the release key, the agent takes it back.
    pub unmark: Vec<IpNet>,
    /// Refused handshakes to forget (delete the release key); the excess clock restarts.
    pub forget: Vec<IpNet>,
}

/// Addresses an entry counts: a /32 or /128 one, a /28 16, a /80 2^48 (clipped to `u64`).
pub fn units(net: &IpNet) -> u64 {
    let bits = match net {
        IpNet::V4(n) => 32 - u32::from(n.prefix_len()),
        IpNet::V6(n) => 128 - u32::from(n.prefix_len()),
    };
    if bits >= 64 { u64::MAX } else { 1u64 << bits }
}

/// The family of an address or prefix.
pub fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// The length of a delegated prefix of `family` (/28, /80).
pub fn delegated_prefix_len(family: Family) -> u8 {
    match family {
        Family::V4 => 28,
        Family::V6 => 80,
    }
}

/// Addresses one delegated prefix of `family` counts (16, 2^48).
pub fn prefix_units(family: Family) -> u64 {
    match family {
        Family::V4 => 16,
        Family::V6 => 1 << 48,
    }
}

/// Whether an interface serves the pool: not excluded and at or above its first interface
/// index.
pub fn is_usable(interface: &InterfaceView, first_interface_index: u32) -> bool {
    !interface.excluded && interface.device_index >= first_interface_index
}

/// Address slots of one interface for `family`: IPv4 less the primary; a prefix takes one.
pub fn slots_per_interface(limits: &InstanceLimits, family: Family) -> u64 {
    match family {
        Family::V4 => u64::from(limits.ipv4_per_interface.saturating_sub(1)),
        Family::V6 => u64::from(limits.ipv6_per_interface),
    }
}

/// Free address slots of an interface for `family`.
pub fn free_slots(interface: &InterfaceView, limits: &InstanceLimits, family: Family) -> u64 {
    let taken = interface
        .addresses
        .iter()
        .filter(|a| family_of(a) == family)
        .count() as u64;
    slots_per_interface(limits, family).saturating_sub(taken)
}

/// Whether an interface takes prefixes: the pool asks, the instance supports it, and its
/// subnet never refused one for it.
pub fn interface_takes_prefixes(
    interface: &InterfaceView,
    cloud: &CloudPoolConfig,
    limits: &InstanceLimits,
) -> bool {
    cloud.prefix_delegation && limits.prefix_delegation && !interface.secondaries_only
}

/// What a subnet can still give in `family`, in slots (prefixes when `prefixes`); a new
/// interface (`create`) also takes a primary IPv4 address. IPv6: unbounded if the subnet has an
/// IPv6 CIDR. A subnet that refused a prefix lately gives no prefixes.
pub fn subnet_room(subnet: &SubnetView, family: Family, prefixes: bool, create: bool) -> u64 {
    if prefixes && subnet.no_free_prefix {
        return 0;
    }
    let free_v4 = u64::from(subnet.free_ipv4).saturating_sub(u64::from(create));
    match family {
        Family::V4 if prefixes => free_v4 / 16,
        Family::V4 => free_v4,
        Family::V6 => {
            let has_v6 = subnet.cidrs.iter().any(|c| matches!(c, IpNet::V6(_)));
            if has_v6 && (!create || subnet.free_ipv4 > 0) {
                u64::MAX
            } else {
                0
            }
        }
    }
}

/// The most the node can hold in `family` on its instance, in addresses: what its usable
/// interfaces hold plus the room left on them (a prefix slot counting a whole prefix where the
/// interface takes prefixes), plus the free device indexes at full size. Without
/// `secondaries_only` interfaces this is Cilium's `(max_interfaces - first_interface_index) *
/// (ipv4_per_interface - 1)`, x16 under prefix delegation.
pub fn instance_capacity(input: &NodeCloudInput<'_>) -> u64 {
    let first = input.cloud.first_interface_index;
    let mut total = 0u64;
    for interface in input.interfaces.iter().filter(|i| is_usable(i, first)) {
        let (held, taken) = held_and_taken(interface, input.family);
        total = total.saturating_add(interface_capacity(
            interface,
            &input.limits,
            input.cloud,
            input.family,
            held,
            taken,
        ));
    }
    capacity_with_empty_indexes(total, input)
}

/// What one usable interface holds in `family` (in addresses) and how many slots its entries
/// take, in one pass over its addresses.
fn held_and_taken(interface: &InterfaceView, family: Family) -> (u64, u64) {
    interface
        .addresses
        .iter()
        .filter(|a| family_of(a) == family)
        .fold((0u64, 0u64), |(held, taken), a| {
            (held.saturating_add(units(a)), taken + 1)
        })
}

/// One usable interface's share of [`instance_capacity`]: what it holds plus its free slots
/// (whole prefixes where it takes prefixes).
fn interface_capacity(
    interface: &InterfaceView,
    limits: &InstanceLimits,
    cloud: &CloudPoolConfig,
    family: Family,
    held: u64,
    taken: u64,
) -> u64 {
    let unit = if interface_takes_prefixes(interface, cloud, limits) {
        prefix_units(family)
    } else {
        1
    };
    let free = slots_per_interface(limits, family).saturating_sub(taken);
    held.saturating_add(free.saturating_mul(unit))
}

/// [`instance_capacity`]'s last term added to `total` (the usable interfaces' share): the
/// free device indexes at full size.
fn capacity_with_empty_indexes(total: u64, input: &NodeCloudInput<'_>) -> u64 {
    let limits = &input.limits;
    let prefix = prefix_units(input.family);
    let empty = (input.cloud.first_interface_index..limits.max_interfaces)
        .filter(|i| {
            !input.interfaces.iter().any(|f| f.device_index == *i)
                && !input.occupied_indexes.contains(i)
        })
        .count() as u64;
    let unit = if input.cloud.prefix_delegation && limits.prefix_delegation {
        prefix
    } else {
        1
    };
    total.saturating_add(
        empty
            .saturating_mul(slots_per_interface(limits, input.family))
            .saturating_mul(unit),
    )
}

/// How much the node wants and may give back, before any placement.
struct Demand {
    /// To ask for (surge included), capped by max-allocate and the instance.
    want: u64,
    /// The same without any cap (to tell "at capacity").
    want_uncapped: u64,
    /// Needed to reach the targets (no surge, no max-above-watermark), capped.
    needed: u64,
    /// Fill whole interfaces (WARM_ENI).
    fill_whole: bool,
}

/// Decides what to do for one node, pool and family.
pub fn plan_node(input: &NodeCloudInput<'_>) -> CloudPlan {
    let family = input.family;
    let first = input.cloud.first_interface_index;
    let mut usable: Vec<&InterfaceView> = Vec::with_capacity(input.interfaces.len());
    usable.extend(input.interfaces.iter().filter(|i| is_usable(i, first)));
    let order = |a: &&InterfaceView, b: &&InterfaceView| {
        (a.device_index, &a.id).cmp(&(b.device_index, &b.id))
    };
    if !usable.is_sorted_by(|a, b| order(a, b).is_le()) {
        usable.sort_by(order);
    }
    // One pass over the node's entries in this family (usable interfaces by device index):
    // what it holds, the instance's capacity, and (only when handshakes are open) the entries
    // in one, in that order: surrendered (`ready`), marked, and both (`open`).
    let handshake = |a: &IpNet| input.releasing.iter().find(|r| r.address == *a);
    let mut held_total = 0u64;
    let mut physical = 0u64;
    let mut ready: Vec<(&InterfaceView, Releasing)> = Vec::new();
    let mut marked: Vec<Releasing> = Vec::new();
    let mut open: Vec<IpNet> = Vec::new();
    for interface in &usable {
        let (held, taken) = held_and_taken(interface, family);
        held_total = held_total.saturating_add(held);
        physical = physical.saturating_add(interface_capacity(
            interface,
            &input.limits,
            input.cloud,
            family,
            held,
            taken,
        ));
        if input.releasing.is_empty() {
            continue;
        }
        for a in interface
            .addresses
            .iter()
            .filter(|a| family_of(a) == family)
        {
            let Some(r) = handshake(a) else {
                continue;
            };
            match r.state {
                ReleaseState::Ready => ready.push((interface, *r)),
                ReleaseState::Marked => marked.push(*r),
                _ => continue,
            }
            open.push(*a);
        }
    }
    ready.sort_by_key(|(_, r)| (r.marked_ms, r.address));
    let ready_size = ready
        .iter()
        .fold(0u64, |s, (_, r)| s.saturating_add(units(&r.address)));
    let available = held_total.saturating_sub(ready_size);
    let (used, pending) = input.demand.map_or((0, 0), |d| (d.used, d.pending));
    let pd = input.cloud.prefix_delegation && input.limits.prefix_delegation;
    let physical = capacity_with_empty_indexes(physical, input);
    let max = input.watermarks.max_allocate;
    let capacity = if max > 0 { physical.min(max) } else { physical };
    // A release begun (the node was in excess at its last plan) goes on to the target.
    let releasing = input.excess_since_ms.is_some();
    let excess_at = |avail: u64| -> u64 {
        match &input.cloud.warm {
            None => blocks::excess(&input.watermarks, avail, used),
            Some(t) if releasing => warm_excess_releasing(t, &input.limits, pd, avail, used),
            Some(t) => warm_needed_and_excess(t, &input.limits, pd, avail, used, 0).1,
        }
    };
    let demand = demand(input, pd, available, used, pending, capacity);
    let excess_now = if input.demand.is_some() {
        excess_at(available)
    } else {
        0
    };
    let mut out = CloudPlan {
        stats: Statistics {
            used,
            available,
            capacity,
            needed: demand.needed,
            excess: excess_now,
        },
        ..CloudPlan::default()
    };
    out.forget = input
        .releasing
        .iter()
        .filter(|r| r.state == ReleaseState::Refused)
        .map(|r| r.address)
        .collect();
    if demand.want_uncapped > 0 {
        // Growing: every open handshake ends; surrendered addresses come back first.
        out.unmark = open;
        let still = demand.want_uncapped.saturating_sub(ready_size);
        let room = capacity.saturating_sub(held_total);
        let want = demand.want.saturating_sub(ready_size).min(room);
        if still == 0 {
            return out;
        }
        if want == 0 {
            out.at_capacity = true;
            return out;
        }
        let wanted = if demand.fill_whole { room } else { want };
        match place(input, &usable, pd, wanted) {
            Some(action) => out.action = action,
            None => out.at_capacity = true,
        }
        return out;
    }
    if input.demand.is_none() {
        return out;
    }
    release(input, marked, &ready, ready_size, available, excess_at, out)
}

/// Needed and wanted addresses under the pool's watermarks or warm targets.
fn demand(
    input: &NodeCloudInput<'_>,
    pd: bool,
    available: u64,
    used: u64,
    pending: u64,
    capacity: u64,
) -> Demand {
    match &input.cloud.warm {
        None => {
            let w = input.watermarks;
            let uncapped = Watermarks {
                max_allocate: 0,
                ..w
            };
            let want_uncapped = blocks::to_allocate(&uncapped, available, used, pending);
            if capacity == 0 {
                return Demand {
                    want: 0,
                    want_uncapped,
                    needed: 0,
                    fill_whole: false,
                };
            }
            let capped = Watermarks {
                max_allocate: capacity,
                ..w
            };
            Demand {
                want: blocks::to_allocate(&capped, available, used, pending)
                    .min(capacity.saturating_sub(available)),
                want_uncapped,
                needed: blocks::needed(&capped, available, used),
                fill_whole: false,
            }
        }
        Some(t) => {
            let (needed, _) =
                warm_needed_and_excess(t, &input.limits, pd, available, used, pending);
            let room = capacity.saturating_sub(available);
            Demand {
                want: needed.min(room),
                want_uncapped: needed,
                needed: needed.min(room),
                fill_whole: matches!(warm_mode(t, pd), WarmMode::Eni(_)),
            }
        }
    }
}

/// Where `wanted` addresses go: an existing attached interface with room whose subnet has
/// room (lowest device index first), else (`Nothing`) wait for an interface still attaching
/// that has such room, else a new interface; `None` when neither can be had. (WARM_ENI asks
/// for all the room under the caps: a whole interface's worth.)
fn place(
    input: &NodeCloudInput<'_>,
    usable: &[&InterfaceView],
    pd: bool,
    wanted: u64,
) -> Option<CloudAction> {
    let family = input.family;
    let subnet = |id: &str| input.subnets.iter().find(|s| s.id == id);
    for interface in usable.iter().filter(|i| i.attached) {
        let slots = free_slots(interface, &input.limits, family);
        if slots == 0 {
            continue;
        }
        let Some(s) = subnet(&interface.subnet_id) else {
            continue;
        };
        let wants_prefixes = interface_takes_prefixes(interface, input.cloud, &input.limits);
        // A prefix interface whose subnet cannot give a whole prefix takes single addresses
        // this once (it stays a prefix interface).
        let modes: &[bool] = if wants_prefixes {
            &[true, false]
        } else {
            &[false]
        };
        for &prefixes in modes {
            let room = subnet_room(s, family, prefixes, false);
            if room == 0 {
                continue;
            }
            let unit = if prefixes { prefix_units(family) } else { 1 };
            let asked = wanted.div_ceil(unit);
            let count = slots.min(room).min(asked).max(1);
            return Some(CloudAction::Assign {
                interface: interface.id.clone(),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                prefixes,
            });
        }
    }
    // An interface still attaching (just created) with room in a subnet with room: the node
    // waits for it (seconds) rather than creating another interface beside it, which would
    // take a device index, a primary address and two slow calls for addresses it will have.
    let attaching_with_room = usable.iter().filter(|i| !i.attached).any(|i| {
        free_slots(i, &input.limits, family) > 0
            && subnet(&i.subnet_id).is_some_and(|s| subnet_room(s, family, false, false) > 0)
    });
    if attaching_with_room {
        return Some(CloudAction::Nothing);
    }
    let device_index = next_device_index(
        input.interfaces,
        input.cloud.first_interface_index,
        input.limits.max_interfaces,
        input.occupied_indexes,
        None,
    )?;
    let per_interface = slots_per_interface(&input.limits, family);
    if per_interface == 0 {
        return None;
    }
    let modes: &[bool] = if pd { &[true, false] } else { &[false] };
    for &prefixes in modes {
        let unit = if prefixes { prefix_units(family) } else { 1 };
        let asked = wanted.div_ceil(unit).min(per_interface);
        let asked32 = u32::try_from(asked).unwrap_or(u32::MAX);
        let Some(s) = choose_subnet(
            input.cloud,
            input.zone,
            input.node_subnet,
            family,
            input.subnets,
            asked32,
            prefixes,
            &[],
        ) else {
            continue;
        };
        let count = asked.min(subnet_room(s, family, prefixes, true)).max(1);
        return Some(CloudAction::Create {
            subnet_id: s.id.clone(),
            device_index,
            count: u32::try_from(count).unwrap_or(u32::MAX),
            prefixes,
        });
    }
    None
}

/// The release side: complete surrendered addresses within the excess, end handshakes beyond
/// it, and after the release delay mark free addresses of one interface.
fn release(
    input: &NodeCloudInput<'_>,
    mut marked: Vec<Releasing>,
    ready: &[(&InterfaceView, Releasing)],
    ready_size: u64,
    available: u64,
    excess_at: impl Fn(u64) -> u64,
    mut out: CloudPlan,
) -> CloudPlan {
    // Surrendered addresses still count as held when judging how many may go, so a release
    // never leaves the node below its keep level (block mode's rule). Under prefix delegation
    // growth comes in whole prefixes and may overshoot the keep level by up to one prefix:
    // only whole prefixes' worth are released (single addresses too), so growing never
    // triggers a release.
    let unit = if input.cloud.prefix_delegation && input.limits.prefix_delegation {
        prefix_units(input.family)
    } else {
        1
    };
    let budget = excess_at(available.saturating_add(ready_size)) / unit * unit;
    let mut completing: Vec<(&InterfaceView, IpNet)> = Vec::with_capacity(ready.len());
    let mut completing_size = 0u64;
    for (interface, r) in ready {
        let size = units(&r.address);
        if completing_size.saturating_add(size) <= budget {
            completing_size = completing_size.saturating_add(size);
            completing.push((*interface, r.address));
        } else {
            out.unmark.push(r.address);
        }
    }
    let to_release = budget.saturating_sub(completing_size);
    marked.sort_by_key(|r| (r.marked_ms, r.address));
    let mut kept = 0u64;
    for r in &marked {
        let size = units(&r.address);
        if kept.saturating_add(size) <= to_release {
            kept = kept.saturating_add(size);
        } else {
            out.unmark.push(r.address);
        }
    }
    if let Some((first, _)) = completing.first() {
        let interface = first.id.clone();
        out.action = CloudAction::Unassign {
            addresses: completing
                .iter()
                .filter(|(i, _)| i.id == interface)
                .map(|(_, a)| *a)
                .collect(),
            interface,
        };
    }
    let since = input.excess_since_ms.unwrap_or(input.now_ms);
    if to_release == 0 {
        // A release is over once what it surrendered is unassigned: until then its clock
        // stays (a release begun goes on to the target, `warm_excess_releasing`).
        out.excess_since_ms = (!completing.is_empty()).then_some(since);
        return out;
    }
    out.excess_since_ms = Some(since);
    if !out.forget.is_empty() {
        // A refusal just came back: the excess clock starts again.
        out.excess_since_ms = Some(input.now_ms);
        return out;
    }
    if input.now_ms.saturating_sub(since) < input.release_delay_ms
        || out.action != CloudAction::Nothing
    {
        return out;
    }
    let more = to_release.saturating_sub(kept);
    if more == 0 {
        return out;
    }
    if let Some((interface, addresses)) = choose_marks(input, more) {
        out.action = CloudAction::Mark {
            interface,
            addresses,
        };
    }
    out
}

/// The interface to take free addresses from, and up to `more` addresses' worth of them,
/// whole entries only (a prefix goes whole or not at all), never one in a handshake, among the
/// usable attached interfaces with addresses the agent reported free (counted in addresses: a
/// free /28 counts 16), by the pool's [`ReleasePolicy`]:
/// - `spread` (Cilium's `PrepareIPRelease`): the one with most free; ties: lowest ID;
/// - `empty-interfaces` (ipamd's): the largest release; among releases of the same size, one
///   that leaves an interface corral created empty (it is given back after the release
///   delay), then the one leaving fewest addresses; ties: lowest ID.
fn choose_marks(input: &NodeCloudInput<'_>, more: u64) -> Option<(CloudId, Vec<IpNet>)> {
    let policy = input.cloud.release_policy();
    let empty = input.demand.map_or(&[][..], |d| d.empty.as_slice());
    let first = input.cloud.first_interface_index;
    // The best so far: its interface, its score (higher wins) and what it would mark.
    type Candidate = (CloudId, (u64, u64, u64), Vec<IpNet>);
    let mut best: Option<Candidate> = None;
    let mut interfaces: Vec<&InterfaceView> = Vec::with_capacity(input.interfaces.len());
    interfaces.extend(
        input
            .interfaces
            .iter()
            .filter(|i| is_usable(i, first) && i.attached),
    );
    interfaces.sort_by(|a, b| a.id.cmp(&b.id));
    for interface in interfaces {
        let free = empty
            .iter()
            .filter(|a| family_of(a) == input.family)
            .filter(|a| interface.addresses.contains(a))
            .filter(|a| !input.releasing.iter().any(|r| r.address == **a));
        let mut picked = Vec::new();
        let mut size = 0u64;
        let mut count = 0u64;
        for a in free {
            let u = units(a);
            count = count.saturating_add(u);
            if size.saturating_add(u) <= more {
                size = size.saturating_add(u);
                picked.push(*a);
            }
        }
        if picked.is_empty() {
            continue;
        }
        let score = match policy {
            ReleasePolicy::Spread => (count, 0, 0),
            ReleasePolicy::EmptyInterfaces => {
                let left = interface.addresses.len().saturating_sub(picked.len()) as u64;
                let empties = left == 0 && interface.managed && interface.device_index != 0;
                (size, u64::from(empties), u64::MAX - left)
            }
        };
        if best.as_ref().is_none_or(|(_, s, _)| score > *s) {
            best = Some((interface.id.clone(), score, picked));
        }
    }
    best.map(|(id, _, picked)| (id, picked))
}
