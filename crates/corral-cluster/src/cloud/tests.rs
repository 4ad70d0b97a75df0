//! `plan_node`'s unit tests: the worked examples of CLUSTER-DESIGN 1.1 and 2.1, placement,
//! capacity, prefix delegation per interface, and the release side.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::*;
use crate::config::WarmTargets;
use crate::tests::{net, watermarks as w};

pub(super) const DELAY: u64 = 180_000;

pub(super) fn m5_large() -> InstanceLimits {
    InstanceLimits {
        max_interfaces: 3,
        ipv4_per_interface: 10,
        ipv6_per_interface: 10,
        prefix_delegation: true,
    }
}

fn m5_24xlarge() -> InstanceLimits {
    InstanceLimits {
        max_interfaces: 15,
        ipv4_per_interface: 50,
        ipv6_per_interface: 50,
        prefix_delegation: true,
    }
}

fn t2_micro() -> InstanceLimits {
    InstanceLimits {
        max_interfaces: 2,
        ipv4_per_interface: 2,
        ipv6_per_interface: 2,
        prefix_delegation: false,
    }
}

fn id(s: &str) -> CloudId {
    CloudId::new(s).unwrap()
}

/// The `k`-th address of interface `n`: 10.0.n.(10 + k).
fn addr(n: u32, k: u32) -> IpNet {
    IpNet::from(std::net::IpAddr::V4(Ipv4Addr::new(
        10,
        0,
        n as u8,
        (10 + k) as u8,
    )))
}

fn iface(index: u32, held: u32) -> InterfaceView {
    InterfaceView {
        id: id(&format!("eni-{index}")),
        device_index: index,
        subnet_id: "subnet-a".to_owned(),
        managed: index > 0,
        excluded: false,
        attached: true,
        addresses: (0..held).map(|k| addr(index, k)).collect(),
        secondaries_only: false,
    }
}

fn subnet(id: &str, free: u32) -> SubnetView {
    SubnetView {
        id: id.to_owned(),
        zone: "az1".to_owned(),
        cidrs: vec![net("10.0.0.0/16")],
        free_ipv4: free,
        tags: BTreeMap::new(),
        no_free_prefix: false,
    }
}

/// A demand report: `used` of what `interfaces` hold, the rest free; `empty` lists the free
/// ones (highest first, at most 16), taking the last addresses of each interface as free.
fn demand_of(interfaces: &[InterfaceView], used: u64) -> FamilyDemand {
    let all: Vec<IpNet> = interfaces
        .iter()
        .flat_map(|i| i.addresses.iter().copied())
        .collect();
    let total: u64 = all.iter().map(units).sum();
    let mut free: Vec<IpNet> = all.iter().skip(used as usize).copied().collect();
    free.reverse();
    free.truncate(FamilyDemand::MAX_EMPTY);
    FamilyDemand {
        used,
        free: total - used,
        pending: 0,
        blocks: 0,
        empty: free,
    }
}

/// A test node: owns its inputs, lends them to `NodeCloudInput`.
#[derive(Clone)]
pub(super) struct Node {
    pub family: Family,
    pub watermarks: Watermarks,
    pub cloud: CloudPoolConfig,
    pub limits: InstanceLimits,
    pub interfaces: Vec<InterfaceView>,
    pub subnets: Vec<SubnetView>,
    pub occupied: Vec<u32>,
    pub demand: Option<FamilyDemand>,
    pub releasing: Vec<Releasing>,
    pub since: Option<u64>,
    pub now: u64,
}

impl Node {
    pub fn new(limits: InstanceLimits, watermarks: Watermarks) -> Node {
        Node {
            family: Family::V4,
            watermarks,
            cloud: CloudPoolConfig::default(),
            limits,
            interfaces: Vec::new(),
            subnets: vec![subnet("subnet-a", 1000)],
            occupied: Vec::new(),
            demand: None,
            releasing: Vec::new(),
            since: None,
            now: 1_000_000,
        }
    }

    /// The node on `interfaces` with `used` of their addresses in use.
    pub fn serve(&mut self, interfaces: Vec<InterfaceView>, used: u64) {
        self.interfaces = interfaces;
        self.using(used);
    }

    /// `used` of the node's addresses in use.
    pub fn using(&mut self, used: u64) {
        self.demand = Some(demand_of(&self.interfaces, used));
    }

    pub fn plan(&self) -> CloudPlan {
        plan_node(&NodeCloudInput {
            family: self.family,
            watermarks: self.watermarks,
            cloud: &self.cloud,
            limits: self.limits,
            zone: "az1",
            node_subnet: "subnet-a",
            interfaces: &self.interfaces,
            subnets: &self.subnets,
            occupied_indexes: &self.occupied,
            demand: self.demand.as_ref(),
            releasing: &self.releasing,
            excess_since_ms: self.since,
            now_ms: self.now,
            release_delay_ms: DELAY,
        })
    }
}

/// Creating an interface in `subnet_id` at `device_index` with `count` addresses or prefixes.
fn create(subnet_id: &str, device_index: u32, count: u32, prefixes: bool) -> CloudAction {
    CloudAction::Create {
        subnet_id: subnet_id.to_owned(),
        device_index,
        count,
        prefixes,
    }
}

/// Assigning `count` addresses or prefixes to `interface`.
fn assign(interface: &str, count: u32, prefixes: bool) -> CloudAction {
    CloudAction::Assign {
        interface: id(interface),
        count,
        prefixes,
    }
}

/// Marking `addresses` of `interface` for release.
fn mark(interface: &str, addresses: Vec<IpNet>) -> CloudAction {
    CloudAction::Mark {
        interface: id(interface),
        addresses,
    }
}

/// Unassigning `addresses` from `interface`.
fn unassign(interface: &str, addresses: Vec<IpNet>) -> CloudAction {
    CloudAction::Unassign {
        interface: id(interface),
        addresses,
    }
}

/// An m5.large under warm targets `warm`, using its primary interface.
fn warm_m5_large(warm: WarmTargets) -> Node {
    let mut node = Node::new(m5_large(), Watermarks::default());
    node.cloud.warm = Some(warm);
    node.cloud.first_interface_index = 0;
    node
}

/// An m5.large node `n` of cloud pool `pool`, capped by its `max_pods`.
fn capped_m5_large(pool: &crate::config::CloudPool) -> Node {
    let mut node = Node::new(m5_large(), pool.demand.capped_watermarks_for("n", None));
    node.cloud = pool.settings();
    node
}

/// WARM_IP_TARGET `warm_ip` and MINIMUM_IP_TARGET `minimum_ip`.
fn ip_targets(warm_ip: u64, minimum_ip: u64) -> WarmTargets {
    WarmTargets {
        warm_ip: Some(warm_ip),
        minimum_ip: Some(minimum_ip),
        ..WarmTargets::default()
    }
}

/// A cluster of one cloud pool `vpc` on 10.0.0.0/16 with `max_pods`, and `cloud` (TOML) after.
fn vpc_pool(max_pods: u32, cloud: &str) -> Result<crate::ClusterConfig, crate::ConfigError> {
    crate::ClusterConfig::from_toml(&format!(
        "[[pools]]\nname = \"vpc\"\nmode = \"cloud\"\nmax_pods = {max_pods}\n\
         [pools.ipv4]\ncidrs = [\"10.0.0.0/16\"]\n{cloud}\n"
    ))
}

/// The node plans no call and says it is at capacity.
fn assert_at_capacity(node: &Node) {
    let plan = node.plan();
    assert_eq!(plan.action, CloudAction::Nothing);
    assert!(plan.at_capacity);
}

fn count_of(action: &CloudAction) -> u64 {
    match action {
        CloudAction::Assign { count, .. } | CloudAction::Create { count, .. } => u64::from(*count),
        CloudAction::Mark { addresses, .. } | CloudAction::Unassign { addresses, .. } => {
            addresses.len() as u64
        }
        CloudAction::Nothing => 0,
    }
}

/// CLUSTER-DESIGN 1.1's table through `plan_node`: (watermarks, available, used, needed,
/// excess, result). Growth rows assign on the node's interface (or create the first); release
/// rows mark `excess` free addresses once the release delay passed.
#[test]
fn cilium_worked_examples() {
    /// One worked example: the pool's watermarks, the node's addresses (on one secondary
    /// interface) and how many are used, then what the plan says.
    struct Row {
        watermarks: Watermarks,
        available: u32,
        used: u64,
        needed: u64,
        excess: u64,
        /// The addresses the node holds once the plan's action is carried out.
        result: u64,
    }
    let rows = [
        Row {
            watermarks: w(8, 0, 0, 0),
            available: 0,
            used: 0,
            needed: 8,
            excess: 0,
            result: 8,
        },
        Row {
            watermarks: w(8, 0, 0, 0),
            available: 8,
            used: 7,
            needed: 7,
            excess: 0,
            result: 15,
        },
        Row {
            watermarks: w(1, 10, 0, 0),
            available: 10,
            used: 10,
            needed: 1,
            excess: 0,
            result: 11,
        },
        Row {
            watermarks: w(4, 15, 4, 0),
            available: 0,
            used: 0,
            needed: 15,
            excess: 0,
            result: 19,
        },
        Row {
            watermarks: w(4, 15, 4, 0),
            available: 19,
            used: 19,
            needed: 4,
            excess: 0,
            result: 27,
        },
        Row {
            watermarks: w(4, 15, 4, 0),
            available: 27,
            used: 10,
            needed: 0,
            excess: 8,
            result: 19,
        },
        Row {
            watermarks: w(4, 15, 4, 0),
            available: 27,
            used: 0,
            needed: 0,
            excess: 8,
            result: 19,
        },
        Row {
            watermarks: w(8, 0, 0, 20),
            available: 16,
            used: 14,
            needed: 4,
            excess: 0,
            result: 20,
        },
    ];
    for (row, example) in rows.into_iter().enumerate() {
        let Row {
            watermarks: wm,
            available: avail,
            used,
            needed: need,
            excess: exc,
            result,
        } = example;
        let mut node = Node::new(m5_24xlarge(), wm);
        if avail > 0 {
            node.interfaces = vec![iface(1, avail)];
        }
        node.using(used);
        node.since = Some(node.now - DELAY);
        let plan = node.plan();
        assert_eq!(plan.stats.needed, need, "row {row}: needed");
        assert_eq!(plan.stats.excess, exc, "row {row}: excess");
        let after = match &plan.action {
            CloudAction::Assign { interface, .. } => {
                assert_eq!(*interface, id("eni-1"), "row {row}");
                u64::from(avail) + count_of(&plan.action)
            }
            CloudAction::Create { device_index, .. } => {
                assert_eq!(*device_index, 1, "row {row}");
                u64::from(avail) + count_of(&plan.action)
            }
            CloudAction::Mark { .. } => u64::from(avail) - count_of(&plan.action),
            other => panic!("row {row}: {other:?}"),
        };
        assert_eq!(after, result, "row {row}: result");
        assert!(!plan.at_capacity, "row {row}");
    }
}

/// The surge row: 8/0/0, 12 waiting, 10 held, 9 used: needed 7 plus the waiting ones beyond
/// what is free and needed (corral's `to_allocate`: 12 - 1 - 7 = 4).
#[test]
fn waiting_allocations_surge() {
    let mut node = Node::new(m5_24xlarge(), w(8, 0, 0, 0));
    node.interfaces = vec![iface(1, 10)];
    let mut d = demand_of(&node.interfaces, 9);
    d.pending = 12;
    node.demand = Some(d);
    let plan = node.plan();
    assert_eq!(plan.stats.needed, 7);
    assert_eq!(count_of(&plan.action), 11);
}

/// Held at max-allocate while the watermarks ask for more: at capacity, no call.
#[test]
fn max_allocate_caps_and_reports_at_capacity() {
    let mut node = Node::new(m5_24xlarge(), w(8, 0, 0, 20));
    node.serve(vec![iface(1, 20)], 18);
    let plan = node.plan();
    assert_eq!(plan.stats.capacity, 20);
    assert_eq!(plan.action, CloudAction::Nothing);
    assert!(plan.at_capacity);
}

/// CLUSTER-DESIGN 2.1's WARM_ENI rows on an m5.large using its primary interface.
#[test]
fn aws_warm_eni_worked_examples() {
    let mut node = warm_m5_large(WarmTargets::default());
    node.serve(vec![iface(0, 9)], 0);
    assert_eq!(node.plan().action, CloudAction::Nothing);
    assert_eq!(node.plan().stats.capacity, 27);
    // One pod: 8 free < 9: a whole interface with 9.
    node.using(1);
    assert_eq!(node.plan().action, create("subnet-a", 1, 9, false));
    // max-allocate 12 caps the whole interface's worth at 3.
    let mut capped = node.clone();
    capped.watermarks.max_allocate = 12;
    assert_eq!(capped.plan().action, create("subnet-a", 1, 3, false));
    // Ten pods on three full interfaces: 17 free.
    node.serve(vec![iface(0, 9), iface(1, 9), iface(2, 9)], 10);
    let plan = node.plan();
    assert_eq!(plan.action, CloudAction::Nothing);
    assert!(!plan.at_capacity);
    // 25 pods: 2 free < 9 but nothing left: at capacity (max pods 3 * 9 + 2 = 29).
    node.using(25);
    assert_at_capacity(&node);
}

/// CLUSTER-DESIGN 2.1's WARM_IP=2 MIN=10 rows on an m5.large using its primary interface.
#[test]
fn aws_ip_targets_worked_examples() {
    let mut node = warm_m5_large(ip_targets(2, 10));
    node.serve(vec![iface(0, 0)], 0);
    // short 10: 9 on the primary, the next pass a new interface with 1.
    assert_eq!(node.plan().action, assign("eni-0", 9, false));
    node.serve(vec![iface(0, 9)], 0);
    assert_eq!(node.plan().action, create("subnet-a", 1, 1, false));
    // 9 pods on 10: short 1 on the second interface.
    node.serve(vec![iface(0, 9), iface(1, 1)], 9);
    assert_eq!(node.plan().action, assign("eni-1", 1, false));
    // 4 pods deleted: 5 used of 11: over 1, marked after the delay.
    node.serve(vec![iface(0, 9), iface(1, 2)], 5);
    let plan = node.plan();
    assert_eq!(plan.stats.excess, 1);
    assert_eq!(plan.action, CloudAction::Nothing);
    assert_eq!(plan.excess_since_ms, Some(node.now));
    node.since = plan.excess_since_ms;
    node.now += DELAY;
    let plan = node.plan();
    let CloudAction::Mark { addresses, .. } = &plan.action else {
        panic!("{plan:?}")
    };
    assert_eq!(addresses.len(), 1);
}

#[test]
fn tiny_instances_are_at_capacity_without_calls() {
    // t2.micro (no prefix delegation) and t3.nano in a pool without it: 2 interfaces of 2
    // addresses; corral starts at index 1: one pod address in all.
    let t3_nano = InstanceLimits {
        prefix_delegation: true,
        ..t2_micro()
    };
    for (limits, pool_pd) in [(t2_micro(), true), (t2_micro(), false), (t3_nano, false)] {
        let mut node = Node::new(limits, w(8, 0, 0, 0));
        node.cloud.prefix_delegation = pool_pd;
        node.interfaces = vec![iface(0, 0)];
        let plan = node.plan();
        assert_eq!(plan.stats.capacity, 1);
        assert_eq!(plan.action, create("subnet-a", 1, 1, false));
        assert!(!plan.at_capacity, "the one slot is taken first");
        node.interfaces = vec![iface(0, 0), iface(1, 1)];
        node.demand = Some(demand_of(&node.interfaces[1..], 1));
        let plan = node.plan();
        assert_eq!(plan.action, CloudAction::Nothing);
        assert!(plan.at_capacity);
        assert_eq!(plan.stats.capacity, 1);
    }
    // t3.nano with prefix delegation: one /28 covers 8.
    let mut node = Node::new(t3_nano, w(8, 0, 0, 0));
    node.cloud.prefix_delegation = true;
    node.interfaces = vec![iface(0, 0)];
    let plan = node.plan();
    assert_eq!(plan.stats.capacity, 16);
    assert_eq!(count_of(&plan.action), 1);
    assert!(!plan.at_capacity);
    // No subnet with room: at capacity, no call.
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.subnets = vec![subnet("subnet-a", 1)];
    node.interfaces = vec![iface(0, 0)];
    assert_at_capacity(&node);
    // Interface limit reached and every interface full.
    node.subnets = vec![subnet("subnet-a", 1000)];
    node.serve(vec![iface(0, 0), iface(1, 9), iface(2, 9)], 15);
    let plan = node.plan();
    assert_eq!(plan.action, CloudAction::Nothing);
    assert!(plan.at_capacity);
    assert_eq!(plan.stats.capacity, 18);
}

#[test]
fn existing_interfaces_first_lowest_index_whose_subnet_has_room() {
    let mut node = Node::new(m5_24xlarge(), w(8, 0, 0, 0));
    let mut far = iface(2, 3);
    far.subnet_id = "subnet-b".to_owned();
    let mut full_subnet = iface(1, 3);
    full_subnet.subnet_id = "subnet-full".to_owned();
    node.subnets = vec![
        subnet("subnet-a", 1000),
        subnet("subnet-b", 5),
        subnet("subnet-full", 0),
    ];
    node.serve(vec![iface(0, 0), far, full_subnet, iface(3, 49)], 55);
    // 55 held, 55 used: 8 wanted; eni-1's subnet is full, eni-2's has 5.
    assert_eq!(node.plan().action, assign("eni-2", 5, false));
    // An interface still attaching gets nothing, but while it has room in a subnet with room
    // the node waits for it (a few seconds) instead of creating another interface beside it.
    node.interfaces[1].attached = false;
    node.interfaces[3].excluded = true;
    node.demand = Some(demand_of(&node.interfaces[..3], 6));
    let plan = node.plan();
    assert_eq!(plan.action, CloudAction::Nothing);
    assert!(!plan.at_capacity, "waiting is not being at capacity");
    // Excluded ones get nothing either; with the attaching one's subnet full, the next index.
    node.subnets[1].free_ipv4 = 0;
    let plan = node.plan();
    let CloudAction::Create {
        device_index,
        count,
        ..
    } = plan.action
    else {
        panic!("{plan:?}")
    };
    assert_eq!((device_index, count), (4, 8));
    node.occupied = vec![4, 5];
    let CloudAction::Create { device_index, .. } = node.plan().action else {
        panic!()
    };
    assert_eq!(device_index, 6);
}

#[test]
fn prefix_delegation_is_per_interface() {
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.cloud.prefix_delegation = true;
    node.interfaces = vec![iface(0, 0)];
    // A new interface with one /28 for 8 wanted.
    assert_eq!(node.plan().action, create("subnet-a", 1, 1, true));
    assert_eq!(node.plan().stats.capacity, 2 * 9 * 16);
    // eni-1 fell back to /32s: it gets /32s; eni-2 keeps prefixes.
    let mut secondaries = iface(1, 9);
    secondaries.addresses.truncate(4);
    secondaries.secondaries_only = true;
    node.serve(vec![iface(0, 0), secondaries.clone()], 4);
    assert_eq!(node.plan().action, assign("eni-1", 5, false));
    let mut prefixed = iface(2, 0);
    prefixed.addresses = vec![net("10.0.2.16/28")];
    secondaries.addresses = (0..9).map(|k| addr(1, k)).collect();
    node.serve(vec![iface(0, 0), secondaries, prefixed], 25);
    assert_eq!(node.plan().action, assign("eni-2", 1, true));
    // Capacity: 9 /32s on eni-1, 9 slots of 16 on eni-2.
    assert_eq!(node.plan().stats.capacity, 9 + 9 * 16);
    // The instance without prefix delegation: single addresses everywhere.
    node.limits.prefix_delegation = false;
    node.interfaces = vec![iface(0, 0)];
    node.demand = None;
    assert_eq!(node.plan().action, create("subnet-a", 1, 8, false));
}

#[test]
fn a_prefix_interface_in_a_subnet_without_a_whole_prefix_takes_single_addresses() {
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.cloud.prefix_delegation = true;
    let mut one = iface(1, 0);
    one.addresses = vec![net("10.0.1.16/28")];
    node.interfaces = vec![iface(0, 0), one];
    node.subnets = vec![subnet("subnet-a", 10)];
    node.using(12);
    assert_eq!(node.plan().action, assign("eni-1", 4, false));
    // A subnet that refused a prefix lately is not asked for one either.
    node.subnets = vec![SubnetView {
        no_free_prefix: true,
        ..subnet("subnet-a", 100)
    }];
    assert_eq!(node.plan().action, assign("eni-1", 4, false));
}

fn releasing(address: IpNet, state: ReleaseState, marked_ms: u64) -> Releasing {
    Releasing {
        address,
        state,
        marked_ms,
    }
}

#[test]
fn marks_wait_for_the_delay_and_take_one_interface_with_most_free() {
    let mut node = Node::new(m5_24xlarge(), w(8, 0, 4, 0));
    node.interfaces = vec![iface(0, 0), iface(1, 10), iface(2, 10), iface(3, 10)];
    // 30 held, 2 used (on eni-1): keep 14, excess 16.
    let mut d = demand_of(&node.interfaces, 2);
    d.empty = (2..10)
        .map(|k| addr(1, k))
        .chain((5..10).map(|k| addr(2, k)))
        .collect();
    node.demand = Some(d.clone());
    let plan = node.plan();
    assert_eq!(plan.stats.excess, 16);
    assert_eq!(plan.action, CloudAction::Nothing);
    assert_eq!(plan.excess_since_ms, Some(node.now));
    node.since = Some(node.now - DELAY + 1);
    assert_eq!(node.plan().action, CloudAction::Nothing, "not yet");
    node.since = Some(node.now - DELAY);
    let plan = node.plan();
    assert_eq!(
        plan.action,
        mark("eni-1", (2..10).map(|k| addr(1, k)).collect())
    );
    // The marked ones still count; eight more to go, from the next interface.
    node.releasing = (2..10)
        .map(|k| releasing(addr(1, k), ReleaseState::Marked, node.now))
        .collect();
    let plan = node.plan();
    assert_eq!(
        plan.action,
        mark("eni-2", (5..10).map(|k| addr(2, k)).collect())
    );
    assert!(plan.unmark.is_empty());
    // Surrendered: unassigned in the cloud within the excess.
    node.releasing = (2..10)
        .map(|k| releasing(addr(1, k), ReleaseState::Ready, node.now))
        .collect();
    let plan = node.plan();
    assert_eq!(plan.stats.available, 22);
    assert_eq!(
        plan.action,
        unassign("eni-1", (2..10).map(|k| addr(1, k)).collect())
    );
    // Demand rose meanwhile: 12 used of the 22 left: nothing needed, but the keep level is
    // 24 of the 30 held: six complete, two are taken back.
    node.demand = Some(FamilyDemand {
        used: 12,
        ..d.clone()
    });
    let plan = node.plan();
    assert_eq!(count_of(&plan.action), 6, "{plan:?}");
    assert_eq!(plan.unmark.len(), 2);
    // Demand rose further: growing: every handshake ends, the surrendered come back first.
    node.demand = Some(FamilyDemand {
        used: 15,
        ..d.clone()
    });
    let plan = node.plan();
    assert_eq!(plan.unmark.len(), 8);
    assert_eq!(
        plan.action,
        CloudAction::Nothing,
        "8 come back, 5 were wanted"
    );
    // No report: nothing is marked.
    node.releasing.clear();
    node.demand = None;
    let plan = node.plan();
    assert_eq!(plan.action, CloudAction::Nothing);
    assert_eq!(plan.stats.excess, 0);
}

#[test]
fn a_refusal_is_forgotten_and_the_clock_restarts() {
    let mut node = Node::new(m5_24xlarge(), w(8, 0, 0, 0));
    node.serve(vec![iface(1, 20)], 0);
    node.releasing = vec![releasing(addr(1, 19), ReleaseState::Refused, 0)];
    node.since = Some(0);
    let plan = node.plan();
    assert_eq!(plan.forget, vec![addr(1, 19)]);
    assert_eq!(plan.action, CloudAction::Nothing);
    assert_eq!(plan.excess_since_ms, Some(node.now));
}

#[test]
fn prefix_pools_mark_whole_free_prefixes_within_the_excess() {
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.cloud.prefix_delegation = true;
    let mut one = iface(1, 0);
    one.addresses = vec![net("10.0.1.0/28"), net("10.0.1.16/28"), net("10.0.1.32/28")];
    node.interfaces = vec![iface(0, 0), one];
    node.since = Some(0);
    // 48 held, 2 used: keep 10, excess 38: two whole prefixes at most; the agent reports
    // two free prefixes and a free /32 inside the used one (never marked).
    node.demand = Some(FamilyDemand {
        used: 2,
        free: 46,
        pending: 0,
        blocks: 0,
        empty: vec![net("10.0.1.32/28"), net("10.0.1.16/28"), net("10.0.1.5/32")],
    });
    assert_eq!(
        node.plan().action,
        mark("eni-1", vec![net("10.0.1.32/28"), net("10.0.1.16/28")])
    );
    // 7 used: keep 15, excess 33: still two. 20 used: keep 28, excess 20: one.
    node.demand.as_mut().unwrap().used = 20;
    assert_eq!(count_of(&node.plan().action), 1);
    // 40 used: nothing to give back.
    node.demand.as_mut().unwrap().used = 33;
    assert_eq!(node.plan().action, CloudAction::Nothing);
}

#[test]
fn ipv6_prefixes_count_whole() {
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.family = Family::V6;
    node.cloud.prefix_delegation = true;
    let mut v6 = subnet("subnet-a", 100);
    v6.cidrs.push(net("2001:db8::/56"));
    node.subnets = vec![v6];
    node.interfaces = vec![iface(0, 0)];
    assert_eq!(node.plan().action, create("subnet-a", 1, 1, true));
    let mut one = iface(1, 3);
    one.addresses.push(net("2001:db8:0:0:1::/80"));
    node.interfaces = vec![iface(0, 0), one];
    node.demand = Some(FamilyDemand {
        used: 100,
        free: (1 << 48) - 100,
        ..FamilyDemand::default()
    });
    let plan = node.plan();
    assert_eq!(plan.stats.available, 1 << 48);
    assert_eq!(plan.action, CloudAction::Nothing);
}

/// Found by reasoning about the property test: a prefix grown beside free single addresses
/// overshoots the keep level by less than a prefix; those single addresses are not released
/// right after (under prefix delegation only whole prefixes' worth are released).
#[test]
fn growth_by_a_prefix_does_not_release_single_addresses_next() {
    let mut node = Node::new(m5_large(), w(8, 0, 0, 0));
    node.cloud.prefix_delegation = true;
    let mut singles = iface(1, 9);
    singles.secondaries_only = true;
    let mut prefixed = iface(2, 0);
    prefixed.addresses = vec![net("10.0.2.16/28")];
    node.interfaces = vec![iface(0, 0), singles, prefixed];
    // 25 held, 5 used (on the singles): keep 13, excess 12, four single addresses free.
    node.using(5);
    node.since = Some(0);
    let plan = node.plan();
    assert_eq!(plan.stats.excess, 12);
    assert_eq!(plan.action, CloudAction::Nothing, "{plan:?}");
    // 40 held, 5 used: keep 13, excess 27: one prefix's worth goes.
    let mut two = iface(2, 0);
    two.addresses = vec![net("10.0.2.16/28"), net("10.0.2.32/28")];
    node.interfaces[2] = two;
    node.using(5);
    assert_eq!(count_of(&node.plan().action), 1);
}

/// ipamd's `TestIPAMContext_nodeIPPoolTooLow` "max pods exceeded": with WARM_IP a node whose
/// pool holds max-pods addresses is not too low, however few are free. corral: a cloud pool's
/// `max_pods` (and the node's own from its registration) caps the node beside warm targets
/// (`DemandConfig::capped_watermarks_for`); the node is reported at capacity, no call is made.
/// Before, a warm-target pool had no cap but the instance's limits.
#[test]
fn max_pods_caps_warm_ip_targets() {
    let config = vpc_pool(12, "[pools.cloud.warm]\nwarm_ip = 5")
        .expect("max_pods beside warm targets is accepted");
    let pool = config.pools[0].cloud().unwrap();
    let mut node = capped_m5_large(pool);
    node.cloud.first_interface_index = 0;
    // 10 held, 8 used: 2 free, WARM_IP 5 wants 3 more; the cap leaves room for 2.
    node.serve(vec![iface(0, 10)], 8);
    let plan = node.plan();
    assert_eq!(plan.stats.capacity, 12);
    assert_eq!(count_of(&plan.action), 2, "{:?}", plan.action);
    // 12 held (max pods), 11 used: 1 free, nothing more and reported at capacity.
    node.serve(vec![iface(0, 10), iface(1, 2)], 11);
    assert_at_capacity(&node);
    // Without the cap the same node takes 4 more (the instance has room for 27).
    let mut uncapped = node.clone();
    uncapped.watermarks = pool.demand.watermarks_for("n");
    assert_eq!(count_of(&uncapped.plan().action), 4);
    // A node registered with --max-pods 10 is capped lower than the pool: at capacity at 12.
    let mut small = node.clone();
    small.watermarks = pool.demand.capped_watermarks_for("n", Some(10));
    assert_eq!(small.plan().stats.capacity, 10);
    assert!(small.plan().at_capacity);
    // A node's cap above the pool's does not raise it.
    assert_eq!(
        pool.demand
            .capped_watermarks_for("n", Some(50))
            .max_allocate,
        12
    );
}

/// The prefix twin (ipamd counts a /28 as 16 addresses against max pods): with WARM_PREFIX 1
/// and max pods 20, a node holding one full prefix gets one more (32 > 20: a prefix is the
/// unit, as ipamd's chunks are), and one holding two gets nothing and is at capacity.
#[test]
fn max_pods_caps_warm_prefix_targets() {
    let config = vpc_pool(
        20,
        "[pools.cloud]\nprefix_delegation = true\n[pools.cloud.warm]\nwarm_prefix = 1",
    )
    .unwrap();
    let pool = config.pools[0].cloud().unwrap();
    let mut node = capped_m5_large(pool);
    let mut one = iface(1, 0);
    one.addresses = vec![net("10.0.1.16/28")];
    node.serve(vec![iface(0, 0), one.clone()], 16);
    assert_eq!(node.plan().action, assign("eni-1", 1, true));
    one.addresses = vec![net("10.0.1.16/28"), net("10.0.1.32/28")];
    node.serve(vec![iface(0, 0), one], 32);
    assert_at_capacity(&node);
}

/// ipamd's `TestWarmENIInteractions` (WARM_IP 2, MINIMUM_IP 4; the primary with 2 used, ENI-2
/// with 2 free, ENI-3 with 1 free: one address is excess): ipamd releases ENI-3's single free
/// address, emptying it (then gives ENI-3 back). With warm targets corral's default policy
/// (`empty-interfaces`) does the same; `spread` (Cilium's, the default with watermarks) takes
/// it from ENI-2, which has most free, and no interface empties.
#[test]
fn a_release_prefers_emptying_an_interface_under_warm_targets() {
    let mut node = warm_m5_large(ip_targets(2, 4));
    node.serve(vec![iface(0, 2), iface(1, 2), iface(2, 1)], 2);
    node.since = Some(node.now - DELAY);
    assert_eq!(node.cloud.release_policy(), ReleasePolicy::EmptyInterfaces);
    let plan = node.plan();
    assert_eq!(plan.stats.excess, 1);
    assert_eq!(plan.action, mark("eni-2", vec![addr(2, 0)]));
    node.cloud.release_policy = Some(ReleasePolicy::Spread);
    assert!(
        matches!(&node.plan().action, CloudAction::Mark { interface, .. } if *interface == id("eni-1")),
        "{:?}",
        node.plan().action
    );
    // The policy is named in the configuration (kebab-case), and watermarks default to spread.
    let config = crate::ClusterConfig::from_toml(
        r#"
[[pools]]
name = "vpc"
mode = "cloud"
[pools.ipv4]
cidrs = ["10.0.0.0/16"]
[pools.cloud]
release_policy = "empty-interfaces"
"#,
    )
    .unwrap();
    let cloud = config.pools[0].cloud().unwrap().settings();
    assert_eq!(cloud.release_policy(), ReleasePolicy::EmptyInterfaces);
    assert_eq!(
        CloudPoolConfig::default().release_policy(),
        ReleasePolicy::Spread
    );
}
