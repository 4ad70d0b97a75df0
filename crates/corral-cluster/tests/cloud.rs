//! The cloud decisions (`corral_cluster::cloud::plan_node`) driven by a tiny pure model of one
//! node: its instance (t3.nano, t2.micro, m5.large, m5.24xlarge), subnets with free counts
//! and fragmentation (prefix requests refused), an agent that allocates and frees pods and
//! answers release handshakes, and a leader that applies each returned action (cloud calls
//! succeed or fail). After every round the model checks: never more interfaces or addresses
//! than the limits; never a mark of an address in use or not reported free; never an
//! unassign of an address not surrendered; never a create while an attached interface has room
//! in a subnet with room; at capacity ⇒ no action; a `secondaries_only` interface never gets
//! prefixes while the others keep them; and once demand stays constant the node settles with
//! no allocation after a release nor a release after an allocation. Also: the serving order
//! is a stable permutation by class, and the leak collector deletes only ripe leaks, at most
//! its cap.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use corral_cluster::cloud::{
    CloudAction, CloudPlan, InstanceLimits, InterfaceView, NodeCloudInput, PrefixFallback,
    Releasing, SubnetView, empty_interface_to_delete, plan_node, prefix_fallback, units,
};
use corral_cluster::{
    CloudId, CloudPoolConfig, Family, FamilyDemand, IpNet, ReleaseState, WarmTargets, Watermarks,
};
use proptest::prelude::*;

const DELAY: u64 = 180_000;
const ROUND_MS: u64 = 30_000;

fn limits(kind: usize) -> InstanceLimits {
    let (max_interfaces, per, pd) = match kind {
        0 => (2, 2, true),   // t3.nano
        1 => (2, 2, false),  // t2.micro (xen: no prefix delegation)
        2 => (3, 10, true),  // m5.large
        _ => (15, 50, true), // m5.24xlarge
    };
    InstanceLimits {
        max_interfaces,
        ipv4_per_interface: per,
        ipv6_per_interface: per,
        prefix_delegation: pd,
    }
}

#[derive(Debug, Clone)]
struct Subnet {
    view: SubnetView,
    /// No aligned /28 left: every prefix request is refused.
    fragmented: bool,
    next_single: u32,
    next_prefix: u32,
    index: u8,
}

impl Subnet {
    fn single(&mut self) -> IpNet {
        let c = self.next_single;
        self.next_single += 1;
        let ip = Ipv4Addr::new(10, self.index, (c / 256) as u8, (c % 256) as u8);
        IpNet::new(IpAddr::V4(ip), 32).unwrap()
    }

    fn prefix(&mut self) -> IpNet {
        let c = self.next_prefix * 16;
        self.next_prefix += 1;
        let ip = Ipv4Addr::new(10, self.index, 128 + (c / 256) as u8, (c % 256) as u8);
        IpNet::new(IpAddr::V4(ip), 28).unwrap()
    }

    /// `count` prefixes or single addresses, taken from the subnet's room.
    fn take(&mut self, count: u32, prefixes: bool) -> Vec<IpNet> {
        (0..count)
            .map(|_| {
                if prefixes {
                    self.view.free_ipv4 -= 16;
                    self.prefix()
                } else {
                    self.view.free_ipv4 -= 1;
                    self.single()
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
struct Model {
    watermarks: Watermarks,
    cloud: CloudPoolConfig,
    limits: InstanceLimits,
    interfaces: Vec<InterfaceView>,
    subnets: Vec<Subnet>,
    /// Pods per entry (address or prefix).
    used: BTreeMap<IpNet, u64>,
    /// Pods the agent could not place.
    pending: u64,
    target: u64,
    releasing: Vec<Releasing>,
    since: Option<u64>,
    now: u64,
    next_interface: u32,
    /// Cloud call outcomes, cycled (false: the call fails).
    outcomes: Vec<bool>,
    calls: usize,
    /// Empty interfaces detached and deleted so far.
    deleted: usize,
    /// Since when each empty managed interface is empty (`track_empty`).
    empty_since: BTreeMap<CloudId, u64>,
}

fn id(n: u32) -> CloudId {
    CloudId::new(&format!("eni-{n}")).unwrap()
}

impl Model {
    fn entries(&self) -> Vec<IpNet> {
        let first = self.cloud.first_interface_index;
        self.interfaces
            .iter()
            .filter(|i| !i.excluded && i.device_index >= first)
            .flat_map(|i| i.addresses.iter().copied())
            .collect()
    }

    fn in_handshake(&self, a: &IpNet) -> bool {
        self.releasing.iter().any(|r| r.address == *a)
    }

    fn used_total(&self) -> u64 {
        self.used.values().sum()
    }

    /// The agent places pods up to the target (never in an entry in a handshake) or frees
    /// the newest ones.
    fn agent(&mut self) {
        let mut total = self.used_total();
        if total > self.target {
            for e in self.entries().iter().rev() {
                while total > self.target && self.used.get(e).copied().unwrap_or(0) > 0 {
                    *self.used.get_mut(e).unwrap() -= 1;
                    total -= 1;
                }
            }
            self.used.retain(|_, n| *n > 0);
        }
        for e in self.entries() {
            if total >= self.target {
                break;
            }
            if self.in_handshake(&e) {
                continue;
            }
            let n = self.used.entry(e).or_insert(0);
            while *n < units(&e) && total < self.target {
                *n += 1;
                total += 1;
            }
        }
        self.used.retain(|_, n| *n > 0);
        self.pending = self.target - total;
        // Handshakes: marked → ready if unused, refused otherwise.
        let used = self.used.clone();
        for r in &mut self.releasing {
            if r.state == ReleaseState::Marked {
                r.state = if used.contains_key(&r.address) {
                    ReleaseState::Refused
                } else {
                    ReleaseState::Ready
                };
            }
        }
    }

    fn demand(&self) -> FamilyDemand {
        let entries = self.entries();
        let held: u64 = entries
            .iter()
            .filter(|e| {
                !self
                    .releasing
                    .iter()
                    .any(|r| r.address == **e && r.state == ReleaseState::Ready)
            })
            .map(units)
            .sum();
        let used = self.used_total();
        let mut empty: Vec<IpNet> = entries
            .iter()
            .filter(|e| !self.used.contains_key(e) && !self.in_handshake(e))
            .copied()
            .collect();
        empty.sort();
        empty.reverse();
        empty.truncate(FamilyDemand::MAX_EMPTY);
        FamilyDemand {
            used,
            free: held.saturating_sub(used),
            pending: self.pending,
            blocks: 0,
            empty,
        }
    }

    fn plan(&self, demand: &FamilyDemand) -> CloudPlan {
        let subnets = self.subnet_views();
        plan_node(&NodeCloudInput {
            family: Family::V4,
            watermarks: self.watermarks,
            cloud: &self.cloud,
            limits: self.limits,
            zone: "az1",
            node_subnet: "subnet-0",
            interfaces: &self.interfaces,
            subnets: &subnets,
            occupied_indexes: &[],
            demand: Some(demand),
            releasing: &self.releasing,
            excess_since_ms: self.since,
            now_ms: self.now,
            release_delay_ms: DELAY,
        })
    }

    fn subnet_views(&self) -> Vec<SubnetView> {
        self.subnets.iter().map(|s| s.view.clone()).collect()
    }

    /// Where interface `id` is in `interfaces`, and its subnet.
    fn interface_and_subnet(&self, id: &CloudId) -> (usize, String) {
        let k = self.interface_index(id);
        (k, self.interfaces[k].subnet_id.clone())
    }

    /// Where interface `id` is in `interfaces`.
    fn interface_index(&self, id: &CloudId) -> usize {
        self.interfaces.iter().position(|i| i.id == *id).unwrap()
    }

    fn call_succeeds(&mut self) -> bool {
        let ok = self.outcomes.is_empty() || self.outcomes[self.calls % self.outcomes.len()];
        self.calls += 1;
        ok
    }

    fn subnet(&mut self, subnet_id: &str) -> &mut Subnet {
        self.subnets
            .iter_mut()
            .find(|s| s.view.id == subnet_id)
            .unwrap()
    }

    /// Checks the plan against the state it was made from.
    fn check(&self, plan: &CloudPlan, demand: &FamilyDemand) -> Result<(), TestCaseError> {
        let pd = self.cloud.prefix_delegation && self.limits.prefix_delegation;
        let first = self.cloud.first_interface_index;
        if plan.at_capacity {
            prop_assert_eq!(
                &plan.action,
                &CloudAction::Nothing,
                "at capacity, yet a call"
            );
        }
        match &plan.action {
            CloudAction::Nothing => {}
            CloudAction::Assign {
                interface,
                count,
                prefixes,
            } => {
                prop_assert!(*count >= 1);
                let i = self.interfaces.iter().find(|i| i.id == *interface).unwrap();
                prop_assert!(i.attached && !i.excluded && i.device_index >= first);
                let room = (self.limits.ipv4_per_interface - 1) as usize - i.addresses.len();
                prop_assert!(*count as usize <= room, "over the interface's limit");
                if i.secondaries_only {
                    prop_assert!(!prefixes, "prefixes on a secondaries-only interface");
                }
                let s = self
                    .subnets
                    .iter()
                    .find(|s| s.view.id == i.subnet_id)
                    .unwrap();
                prop_assert!(!prefixes || pd);
                // The others keep prefixes: one whose subnet can give a whole prefix gets one.
                if pd && !i.secondaries_only && !s.view.no_free_prefix && s.view.free_ipv4 >= 16 {
                    prop_assert!(*prefixes, "a prefix interface got single addresses");
                }
                let need = if *prefixes { 16 } else { 1 } * u64::from(*count);
                prop_assert!(
                    need <= u64::from(s.view.free_ipv4),
                    "beyond the subnet's room"
                );
            }
            CloudAction::Create {
                subnet_id,
                device_index,
                count,
                prefixes,
            } => {
                prop_assert!(*count >= 1);
                prop_assert!(*device_index < self.limits.max_interfaces);
                prop_assert!(*device_index >= first);
                prop_assert!(
                    !self
                        .interfaces
                        .iter()
                        .any(|i| i.device_index == *device_index)
                );
                prop_assert!(*count < self.limits.ipv4_per_interface);
                prop_assert!(!prefixes || pd);
                let s = self
                    .subnets
                    .iter()
                    .find(|s| s.view.id == *subnet_id)
                    .unwrap();
                let need = if *prefixes { 16 } else { 1 } * u64::from(*count) + 1;
                prop_assert!(
                    need <= u64::from(s.view.free_ipv4),
                    "beyond the subnet's room"
                );
                for i in &self.interfaces {
                    if !i.attached || i.excluded || i.device_index < first {
                        continue;
                    }
                    let room = (self.limits.ipv4_per_interface - 1) as usize > i.addresses.len();
                    let s = self
                        .subnets
                        .iter()
                        .find(|s| s.view.id == i.subnet_id)
                        .unwrap();
                    prop_assert!(
                        !(room && s.view.free_ipv4 > 0),
                        "a create while {} has room",
                        i.id
                    );
                }
            }
            CloudAction::Mark {
                interface,
                addresses,
            } => {
                let i = self.interfaces.iter().find(|i| i.id == *interface).unwrap();
                let mut seen = BTreeSet::new();
                for a in addresses {
                    prop_assert!(seen.insert(*a));
                    prop_assert!(demand.empty.contains(a), "marked {} not reported free", a);
                    prop_assert!(!self.used.contains_key(a), "marked {} in use", a);
                    prop_assert!(!self.in_handshake(a), "marked {} twice", a);
                    prop_assert!(i.addresses.contains(a));
                }
                let size: u64 = addresses.iter().map(units).sum();
                prop_assert!(size <= plan.stats.excess, "marked beyond the excess");
            }
            CloudAction::Unassign {
                interface,
                addresses,
            } => {
                let i = self.interfaces.iter().find(|i| i.id == *interface).unwrap();
                for a in addresses {
                    prop_assert!(i.addresses.contains(a));
                    prop_assert!(
                        self.releasing
                            .iter()
                            .any(|r| r.address == *a && r.state == ReleaseState::Ready),
                        "unassigned {} not surrendered",
                        a
                    );
                    prop_assert!(!self.used.contains_key(a), "unassigned {} in use", a);
                }
            }
        }
        Ok(())
    }

    /// The leader applies the plan (its cloud call may fail).
    fn apply(&mut self, plan: &CloudPlan) -> Result<(), TestCaseError> {
        self.releasing
            .retain(|r| !plan.unmark.contains(&r.address) && !plan.forget.contains(&r.address));
        self.since = plan.excess_since_ms;
        // A call to the cloud (not a mark, not nothing) may fail, changing nothing.
        let call = !matches!(plan.action, CloudAction::Nothing | CloudAction::Mark { .. });
        if call && !self.call_succeeds() {
            return Ok(());
        }
        match plan.action.clone() {
            CloudAction::Nothing => {}
            CloudAction::Assign {
                interface,
                count,
                prefixes,
            } => {
                let (k, subnet_id) = self.interface_and_subnet(&interface);
                let s = self.subnet(&subnet_id);
                if prefixes && s.fragmented {
                    // InsufficientCidrBlocks: that interface takes single addresses from now.
                    let subnets = self.subnet_views();
                    let fb = prefix_fallback(
                        &plan.action,
                        &self.cloud,
                        "az1",
                        Family::V4,
                        &subnets,
                        &[],
                    );
                    assert_eq!(fb, PrefixFallback::Secondaries);
                    self.interfaces[k].secondaries_only = true;
                    return Ok(());
                }
                let new = s.take(count, prefixes);
                self.interfaces[k].addresses.extend(new);
            }
            CloudAction::Create {
                subnet_id,
                device_index,
                count,
                prefixes,
            } => {
                let mut subnet_id = subnet_id;
                let mut prefixes = prefixes;
                let mut count = count;
                let mut tried: Vec<String> = Vec::new();
                while prefixes && self.subnet(&subnet_id).fragmented {
                    self.subnet(&subnet_id).view.no_free_prefix = true;
                    tried.push(subnet_id.clone());
                    let subnets = self.subnet_views();
                    let action = CloudAction::Create {
                        subnet_id: subnet_id.clone(),
                        device_index,
                        count,
                        prefixes,
                    };
                    match prefix_fallback(&action, &self.cloud, "az1", Family::V4, &subnets, &tried)
                    {
                        PrefixFallback::Sibling {
                            subnet_id: next,
                            count: n,
                        } => {
                            prop_assert!(n >= 1 && n <= count);
                            subnet_id = next;
                            count = n;
                        }
                        PrefixFallback::Secondaries => {
                            prefixes = false;
                            let room = self.subnet(&subnet_id).view.free_ipv4.saturating_sub(1);
                            count = (count * 16)
                                .min(self.limits.ipv4_per_interface - 1)
                                .min(room);
                        }
                    }
                }
                if count == 0 {
                    return Ok(());
                }
                let n = self.next_interface;
                self.next_interface += 1;
                let s = self.subnet(&subnet_id);
                s.view.free_ipv4 -= 1; // the primary
                let addresses = s.take(count, prefixes);
                // A create that fell back to single addresses: that interface only.
                let secondaries_only =
                    self.cloud.prefix_delegation && self.limits.prefix_delegation && !prefixes;
                self.interfaces.push(InterfaceView {
                    id: id(n),
                    device_index,
                    subnet_id,
                    managed: true,
                    excluded: false,
                    attached: true,
                    addresses,
                    secondaries_only,
                });
            }
            CloudAction::Mark { addresses, .. } => {
                for a in addresses {
                    self.releasing.push(Releasing {
                        address: a,
                        state: ReleaseState::Marked,
                        marked_ms: self.now,
                    });
                }
            }
            CloudAction::Unassign {
                interface,
                addresses,
            } => {
                let (k, subnet_id) = self.interface_and_subnet(&interface);
                let back: u64 = addresses.iter().map(units).sum();
                self.interfaces[k]
                    .addresses
                    .retain(|a| !addresses.contains(a));
                self.releasing.retain(|r| !addresses.contains(&r.address));
                self.subnet(&subnet_id).view.free_ipv4 += back as u32;
            }
        }
        Ok(())
    }

    /// After a round that did nothing: an empty managed interface is detached and deleted
    /// (ipamd's `RemoveUnusedENIFromStore`); never one holding or in a handshake, never the
    /// primary; and the node, planned again on the same demand, still needs nothing (no flap:
    /// the deletion never makes it grow).
    fn delete_empty(
        &mut self,
        plan: &CloudPlan,
        demand: &FamilyDemand,
    ) -> Result<(), TestCaseError> {
        let first = self.cloud.first_interface_index;
        corral_cluster::cloud::track_empty(
            &mut self.empty_since,
            &self.interfaces,
            first,
            self.now,
        );
        let Some(interface) = empty_interface_to_delete(
            &self.interfaces,
            first,
            &[plan],
            &self.empty_since,
            self.now,
            DELAY,
        ) else {
            return Ok(());
        };
        let k = self.interface_index(&interface);
        let gone = self.interfaces[k].clone();
        prop_assert!(gone.managed && gone.device_index != 0 && gone.addresses.is_empty());
        prop_assert!(gone.device_index >= first);
        if !self.call_succeeds() {
            return Ok(());
        }
        let subnet_id = gone.subnet_id;
        self.interfaces.remove(k);
        self.subnet(&subnet_id).view.free_ipv4 += 1;
        self.deleted += 1;
        let again = self.plan(demand);
        prop_assert!(
            again.stats.needed == 0 && !is_grow(&again.action) && !again.at_capacity,
            "deleting {} made the node want: {:?}",
            interface,
            again
        );
        Ok(())
    }

    /// One round: the agent moves, the leader plans, checks, applies; the limits hold.
    fn round(&mut self) -> Result<CloudPlan, TestCaseError> {
        self.agent();
        let demand = self.demand();
        let plan = self.plan(&demand);
        self.check(&plan, &demand)?;
        self.apply(&plan)?;
        self.delete_empty(&plan, &demand)?;
        prop_assert!(self.interfaces.len() as u32 <= self.limits.max_interfaces);
        for i in &self.interfaces {
            prop_assert!(i.addresses.len() < self.limits.ipv4_per_interface as usize);
        }
        self.now += ROUND_MS;
        Ok(plan)
    }
}

#[derive(Debug, Clone)]
enum Targets {
    Watermarks(Watermarks),
    Warm(WarmTargets),
}

fn targets() -> impl Strategy<Value = Targets> {
    prop_oneof![
        (
            0u64..20,
            0u64..30,
            0u64..10,
            prop_oneof![Just(0u64), 30u64..200]
        )
            .prop_map(|(pre, min, maw, max)| {
                let max = if max > 0 { max.max(pre).max(min) } else { 0 };
                Targets::Watermarks(Watermarks {
                    pre_allocate: pre,
                    min_allocate: min,
                    max_above_watermark: maw,
                    max_allocate: max,
                })
            }),
        (
            prop::option::of(0u64..20),
            prop::option::of(0u64..40),
            prop::option::of(0u64..3),
            prop::option::of(0u64..3)
        )
            .prop_map(|(warm_ip, minimum_ip, warm_eni, warm_prefix)| {
                Targets::Warm(WarmTargets {
                    warm_ip,
                    minimum_ip,
                    warm_eni,
                    warm_prefix,
                })
            }),
    ]
}

fn model(
    kind: usize,
    pd: bool,
    first: u32,
    targets: Targets,
    subnets: Vec<(u32, bool)>,
    outcomes: Vec<bool>,
) -> Model {
    let mut cloud = CloudPoolConfig {
        prefix_delegation: pd,
        first_interface_index: first,
        ..CloudPoolConfig::default()
    };
    let watermarks = match targets {
        Targets::Watermarks(w) => w,
        Targets::Warm(t) => {
            cloud.warm = Some(t);
            Watermarks::default()
        }
    };
    let subnets = subnets
        .into_iter()
        .enumerate()
        .map(|(k, (free, fragmented))| Subnet {
            view: SubnetView {
                id: format!("subnet-{k}"),
                zone: "az1".to_owned(),
                cidrs: vec![format!("10.{k}.0.0/16").parse().unwrap()],
                free_ipv4: free,
                tags: BTreeMap::new(),
                no_free_prefix: false,
            },
            fragmented,
            next_single: 0,
            next_prefix: 0,
            index: k as u8,
        })
        .collect();
    Model {
        watermarks,
        cloud,
        limits: limits(kind),
        interfaces: vec![InterfaceView {
            id: id(0),
            device_index: 0,
            subnet_id: "subnet-0".to_owned(),
            managed: false,
            excluded: false,
            attached: true,
            addresses: Vec::new(),
            secondaries_only: false,
        }],
        subnets,
        used: BTreeMap::new(),
        pending: 0,
        target: 0,
        releasing: Vec::new(),
        since: None,
        now: 1_000_000,
        next_interface: 1,
        outcomes,
        calls: 0,
        deleted: 0,
        empty_since: Default::default(),
    }
}

fn is_grow(a: &CloudAction) -> bool {
    matches!(a, CloudAction::Assign { .. } | CloudAction::Create { .. })
}

fn is_release(a: &CloudAction) -> bool {
    matches!(a, CloudAction::Mark { .. } | CloudAction::Unassign { .. })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cloud_decisions_keep_their_invariants_and_settle(
        kind in 0usize..4,
        pd in any::<bool>(),
        first in 0u32..2,
        targets in targets(),
        subnets in prop::collection::vec((0u32..400, any::<bool>()), 1..4),
        outcomes in prop::collection::vec(prop::bool::weighted(0.8), 0..6),
        demands in prop::collection::vec((0u64..150, 1usize..16), 1..10),
        settle_at in 0u64..150,
    ) {
        let mut m = model(kind, pd, first, targets, subnets, outcomes);
        for (target, rounds) in demands {
            m.target = target;
            let mut kinds = Vec::new();
            for _ in 0..rounds {
                let deleted = m.deleted;
                let action = m.round()?.action;
                // No growth after an empty interface was deleted on the same demand.
                prop_assert!(
                    !(is_grow(&action) && kinds.iter().any(|(_, d)| *d)),
                    "grown after a deletion: {:?}",
                    kinds
                );
                kinds.push((action, m.deleted > deleted));
            }
            let kinds: Vec<CloudAction> = kinds.into_iter().map(|(a, _)| a).collect();
            // Even with failing calls, a constant demand never both grows and gives back.
            prop_assert!(
                !(kinds.iter().any(is_grow) && kinds.iter().any(is_release)),
                "flap: {:?}",
                kinds
            );
        }
        // Constant demand, reliable cloud: the node settles, without flapping.
        m.target = settle_at;
        m.outcomes.clear();
        let mut kinds = Vec::new();
        let mut last = None;
        let mut deleted_at = Vec::new();
        for round in 0..80 {
            let deleted = m.deleted;
            let plan = m.round()?;
            if m.deleted > deleted {
                deleted_at.push(round);
            }
            kinds.push(plan.action.clone());
            last = Some(plan);
        }
        let last = last.unwrap();
        // Settled: no interface is deleted at the end either.
        prop_assert!(!deleted_at.contains(&79), "still deleting: {:?}", deleted_at);
        prop_assert_eq!(&last.action, &CloudAction::Nothing, "not settled: {:?}", kinds);
        prop_assert!(last.unmark.is_empty() && last.forget.is_empty());
        // No flap: under constant demand the node only grows or only gives back.
        prop_assert!(
            !(kinds.iter().any(is_grow) && kinds.iter().any(is_release)),
            "flap: {:?}",
            kinds
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The serving order is a permutation: nodes that need come first (by IPv4 need, then
    /// IPv6 need, descending), idle ones next, releasing ones last (largest excess first),
    /// equal keys in their given order.
    #[test]
    fn serve_order_is_a_stable_permutation(
        keys in prop::collection::vec((0u64..4, 0u64..4, 0u64..4), 0..40),
    ) {
        use corral_cluster::cloud::{ServeKey, serve_order};
        let keys: Vec<ServeKey> = keys
            .into_iter()
            .map(|(needed_v4, needed_v6, excess)| ServeKey { needed_v4, needed_v6, excess })
            .collect();
        let order = serve_order(&keys);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..keys.len()).collect::<Vec<_>>());
        let rank = |k: &ServeKey| {
            if k.needed_v4 > 0 || k.needed_v6 > 0 {
                (0, u64::MAX - k.needed_v4, u64::MAX - k.needed_v6)
            } else if k.excess == 0 {
                (1, 0, 0)
            } else {
                (2, u64::MAX - k.excess, 0)
            }
        };
        for pair in order.windows(2) {
            let (a, b) = (rank(&keys[pair[0]]), rank(&keys[pair[1]]));
            prop_assert!(a < b || (a == b && pair[0] < pair[1]), "{:?}", order);
        }
    }

    /// The collector deletes only tagged, available, unrecorded interfaces seen an interval
    /// ago and old enough, at most the cap, and remembers every other candidate.
    #[test]
    fn leak_gc_deletes_only_ripe_leaks(
        candidates in prop::collection::vec(
            (any::<bool>(), any::<bool>(), any::<bool>(), prop::option::of(0u64..2000), prop::option::of(0u64..2000)),
            0..40,
        ),
        now in 0u64..2000,
        interval in 0u64..1000,
        cap in 0usize..10,
    ) {
        use corral_cluster::cloud::{LeakCandidate, plan_leak_gc};
        let mut seen = BTreeMap::new();
        let list: Vec<LeakCandidate> = candidates
            .iter()
            .enumerate()
            .map(|(k, (tagged, available, recorded, created, first))| {
                if let Some(first) = first {
                    seen.insert(id(k as u32), *first);
                }
                LeakCandidate {
                    id: id(k as u32),
                    tagged: *tagged,
                    available: *available,
                    created_ms: *created,
                    recorded: *recorded,
                }
            })
            .collect();
        let plan = plan_leak_gc(&list, &seen, now, interval, cap);
        prop_assert!(plan.delete.len() <= cap);
        let mut ripe = 0;
        for c in &list {
            let leak = c.tagged && c.available && !c.recorded;
            let first = seen.get(&c.id).copied();
            let is_ripe = leak
                && first.is_some_and(|f| now.saturating_sub(f.min(now)) >= interval)
                && c.created_ms.is_none_or(|t| now.saturating_sub(t) >= interval);
            ripe += usize::from(is_ripe);
            let deleted = plan.delete.contains(&c.id);
            prop_assert!(!deleted || is_ripe, "deleted {} unripe", c.id);
            prop_assert_eq!(plan.seen.contains_key(&c.id), leak && !deleted);
        }
        prop_assert_eq!(plan.delete.len() + plan.over_cap, ripe);
    }
}
