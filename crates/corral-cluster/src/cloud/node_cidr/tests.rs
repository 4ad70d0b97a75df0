//! `plan_from_cloud`: worked cases, and random interleavings of cloud changes and lagging
//! describes against a model of etcd (grants, quarantine).

use std::collections::{BTreeMap, BTreeSet};

use corral_core::Family;
use ipnet::IpNet;
use proptest::prelude::*;

use super::*;
use crate::keys::NodeName;
use crate::space::CidrSpace;
use crate::tests::{net, node, pods as pool};

const BOUND: u64 = 10_000;
const QUARANTINE: u64 = 5_000;

fn space_v6() -> CidrSpace {
    CidrSpace::new(
        Family::V6,
        &[net("2600:1f14::/56")],
        80,
        &[net("2600:1f14:0:ff::/64")],
    )
}

fn space_v4() -> CidrSpace {
    CidrSpace::new(Family::V4, &[net("10.0.0.0/16")], 28, &[])
}

/// The world of a case: grants, quarantine, sights, clocks.
struct World {
    family: Family,
    space: CidrSpace,
    granted: BTreeMap<IpNet, NodeName>,
    quarantined: BTreeSet<IpNet>,
    nodes: BTreeMap<NodeName, Sight>,
    clocks: BTreeMap<(NodeName, IpNet), u64>,
}

/// The IPv6 /80 the from-cloud tests move between nodes.
const P: &str = "2600:1f14:0:1:1::/80";

impl World {
    fn new(family: Family, space: CidrSpace) -> World {
        World {
            family,
            space,
            granted: BTreeMap::new(),
            quarantined: BTreeSet::new(),
            nodes: BTreeMap::new(),
            clocks: BTreeMap::new(),
        }
    }

    fn see(&mut self, name: &str, at_ms: u64, prefixes: &[&str]) {
        self.nodes.insert(
            node(name),
            Sight::Primary {
                at_ms,
                prefixes: prefixes.iter().map(|p| net(p)).collect(),
            },
        );
    }

    fn grant(&mut self, name: &str, cidr: &str) {
        self.space.occupy_granted(&net(cidr)).unwrap();
        self.granted.insert(net(cidr), node(name));
    }

    /// Plans, and applies the plan as etcd would (every grant and withdrawal here is
    /// uncontested), keeping the clocks.
    fn plan(&mut self) -> FromCloudPlan {
        let pool = pool();
        let plan = plan_from_cloud(&FromCloudInput {
            pool: &pool,
            family: self.family,
            space: &self.space,
            granted: &self.granted,
            quarantined: &self.quarantined,
            nodes: &self.nodes,
            absent_since: &self.clocks,
            lag_bound_ms: BOUND,
        });
        for (n, cidr) in &plan.grant {
            self.space.occupy_granted(cidr).unwrap();
            self.granted.insert(*cidr, n.clone());
        }
        for (_, cidr) in &plan.withdraw {
            self.space.release_granted(cidr).unwrap();
            self.granted.remove(cidr);
            self.space.occupy_quarantined(cidr).unwrap();
            self.quarantined.insert(*cidr);
        }
        self.clocks = plan.absent_since.clone();
        plan
    }

    fn problems(plan: &FromCloudPlan, name: &str) -> Vec<FromCloudProblem> {
        plan.reports
            .iter()
            .filter(|r| r.node == node(name))
            .map(|r| r.problem.clone())
            .collect()
    }
}

#[test]
fn each_node_gets_exactly_its_valid_prefixes_and_the_rest_is_reported() {
    let mut world = World::new(Family::V4, space_v4());
    world.see("a", 1, &["10.0.1.0/28", "10.0.1.16/28", "2600:1f14::/80"]);
    world.see(
        "b",
        1,
        &[
            "10.0.2.0/28",
            "10.0.3.0/24",
            "10.9.0.0/28",
            "192.168.0.0/28",
        ],
    );
    world.see("c", 1, &[]);
    world.nodes.insert(node("d"), Sight::NoInstance);
    world.nodes.insert(node("e"), Sight::Unseen);
    let plan = world.plan();
    assert_eq!(
        plan.grant,
        vec![
            (node("a"), net("10.0.1.0/28")),
            (node("a"), net("10.0.1.16/28")),
            (node("b"), net("10.0.2.0/28")),
        ]
    );
    assert!(plan.withdraw.is_empty());
    assert!(World::problems(&plan, "a").is_empty(), "{plan:?}");
    assert_eq!(
        World::problems(&plan, "b"),
        vec![
            FromCloudProblem::WrongLength {
                cidr: net("10.0.3.0/24"),
                want: 28
            },
            FromCloudProblem::OutsidePool {
                cidr: net("10.9.0.0/28")
            },
            FromCloudProblem::OutsidePool {
                cidr: net("192.168.0.0/28")
            },
        ]
    );
    assert_eq!(
        World::problems(&plan, "c"),
        vec![FromCloudProblem::NoPrefix]
    );
    assert_eq!(
        World::problems(&plan, "d"),
        vec![FromCloudProblem::NoInstance]
    );
    assert_eq!(World::problems(&plan, "e"), vec![FromCloudProblem::Unseen]);
    // Planned again on the same sights: nothing more to do.
    let again = world.plan();
    assert!(
        again.grant.is_empty() && again.withdraw.is_empty(),
        "{again:?}"
    );
}

#[test]
fn reserved_and_quarantined_prefixes_are_reported_not_granted() {
    let mut world = World::new(Family::V6, space_v6());
    world
        .space
        .occupy_quarantined(&net("2600:1f14:0:1:1::/80"))
        .unwrap();
    world.quarantined.insert(net("2600:1f14:0:1:1::/80"));
    world.see(
        "a",
        1,
        &[
            "2600:1f14:0:ff:1::/80",
            "2600:1f14:0:1:1::/80",
            "10.0.0.0/28",
        ],
    );
    let plan = world.plan();
    assert!(plan.grant.is_empty(), "{plan:?}");
    assert_eq!(
        World::problems(&plan, "a"),
        vec![
            FromCloudProblem::Quarantined {
                cidr: net("2600:1f14:0:1:1::/80")
            },
            FromCloudProblem::Reserved {
                cidr: net("2600:1f14:0:ff:1::/80")
            },
        ]
    );
}

#[test]
fn a_prefix_shown_on_two_instances_is_proposed_for_the_newest_describe_only() {
    let mut world = World::new(Family::V6, space_v6());
    world.see("a", 1_000, &[P]);
    world.see("b", 2_000, &[P]);
    let plan = world.plan();
    assert_eq!(plan.grant, vec![(node("b"), net(P))]);
    assert_eq!(
        World::problems(&plan, "a"),
        vec![FromCloudProblem::ShownTwice {
            cidr: net(P),
            other: node("b")
        }]
    );
    let plan = world.plan();
    assert_eq!(
        World::problems(&plan, "a"),
        vec![FromCloudProblem::HeldByOther {
            cidr: net(P),
            holder: node("b")
        }]
    );
}

#[test]
fn a_moved_prefix_is_withdrawn_only_after_two_describes_the_lag_bound_apart() {
    let mut world = World::new(Family::V6, space_v6());
    world.grant("a", P);
    world.see("a", 100_000, &[]);
    world.see("b", 100_000, &[P]);
    let plan = world.plan();
    assert!(
        plan.withdraw.is_empty() && plan.grant.is_empty(),
        "{plan:?}"
    );
    assert!(
        World::problems(&plan, "a").contains(&FromCloudProblem::Withdrawing {
            cidr: net(P),
            since_ms: 100_000
        })
    );
    // A second describe too soon: still kept.
    world.see("a", 100_000 + BOUND - 1, &[]);
    assert!(world.plan().withdraw.is_empty());
    // The bound after the first: withdrawn, into quarantine; b waits for the quarantine.
    world.see("a", 100_000 + BOUND, &[]);
    let plan = world.plan();
    assert_eq!(plan.withdraw, vec![(node("a"), net(P))]);
    assert!(plan.grant.is_empty(), "{plan:?}");
    assert!(world.clocks.is_empty());
    let plan = world.plan();
    assert_eq!(
        World::problems(&plan, "b"),
        vec![FromCloudProblem::Quarantined { cidr: net(P) }]
    );
    // Quarantine over: b gets it.
    world.space.release_quarantined(&net(P)).unwrap();
    world.quarantined.clear();
    assert_eq!(world.plan().grant, vec![(node("b"), net(P))]);
}

#[test]
fn a_prefix_seen_again_stops_the_clock_and_a_silent_node_keeps_its_grant() {
    let mut world = World::new(Family::V6, space_v6());
    world.grant("a", P);
    world.see("a", 1_000, &[]);
    world.plan();
    assert_eq!(world.clocks.len(), 1);
    // Shown again (the first describe lagged): the clock goes.
    world.see("a", 2_000, &[P]);
    world.plan();
    assert!(world.clocks.is_empty());
    // Absent again much later: the clock starts over, one describe withdraws nothing.
    world.see("a", 50_000, &[]);
    assert!(world.plan().withdraw.is_empty());
    // Silent (instance not found) for a long time: kept, the clock kept.
    world.nodes.insert(node("a"), Sight::Unseen);
    for _ in 0..3 {
        assert!(world.plan().withdraw.is_empty());
    }
    assert_eq!(world.clocks.get(&(node("a"), net(P))), Some(&50_000));
    // Seen without it the bound after the first absence: withdrawn.
    world.see("a", 60_000, &[]);
    assert_eq!(world.plan().withdraw, vec![(node("a"), net(P))]);
    // An unregistered node's grant is left to its removal.
    let q = "2600:1f14:0:1:2::/80";
    world.grant("gone", q);
    assert!(world.plan().withdraw.is_empty());
}

#[test]
fn problems_read_as_sentences() {
    let p = net("10.0.3.0/24");
    let text = FromCloudProblem::WrongLength { cidr: p, want: 28 }.to_string();
    assert_eq!(
        text,
        "delegated prefix 10.0.3.0/24 is not a /28: not granted"
    );
    assert_eq!(
        FromCloudProblem::KINDS.len(),
        FromCloudProblem::KINDS
            .iter()
            .collect::<BTreeSet<_>>()
            .len()
    );
}

/// One step of a random run.
#[derive(Debug, Clone)]
enum Op {
    /// The cloud moves a prefix to a node's primary interface (or takes it off).
    Move { prefix: usize, to: Option<usize> },
    /// A describe of one node's primary interface, lagging this long, then a plan.
    Describe { node: usize, lag_ms: u64 },
    /// Time passes.
    Advance { ms: u64 },
}

const NODES: usize = 4;
const PREFIXES: usize = 6;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..PREFIXES, proptest::option::of(0..NODES))
            .prop_map(|(prefix, to)| Op::Move { prefix, to }),
        4 => (0..NODES, 0..=BOUND).prop_map(|(node, lag_ms)| Op::Describe { node, lag_ms }),
        2 => (0u64..6_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn prefix(i: usize) -> IpNet {
    net(&format!("2600:1f14:0:1:{i}::/80"))
}

fn name(i: usize) -> NodeName {
    node(&format!("n{i}"))
}

/// The cloud's truth over time: each prefix's instance from each change on.
struct Truth {
    history: Vec<(u64, BTreeMap<usize, usize>)>,
}

impl Truth {
    fn at(&self, t: u64) -> &BTreeMap<usize, usize> {
        &self
            .history
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .unwrap_or(&self.history[0])
            .1
    }

    fn now(&self) -> &BTreeMap<usize, usize> {
        &self.history.last().unwrap().1
    }

    /// Whether prefix `p` was off node `n` at some moment in `from..=to`.
    fn was_off(&self, p: usize, n: usize, from: u64, to: u64) -> bool {
        if self.at(from).get(&p) != Some(&n) {
            return true;
        }
        self.history
            .iter()
            .filter(|(t, _)| *t > from && *t <= to)
            .any(|(_, placement)| placement.get(&p) != Some(&n))
    }
}

/// The simulation: etcd's grants and quarantine, the planner's clocks.
struct Sim {
    now: u64,
    truth: Truth,
    world: World,
    /// When each live grant was made.
    granted_at: BTreeMap<IpNet, u64>,
    /// Quarantine ends.
    quarantine_ends: BTreeMap<IpNet, u64>,
}

impl Sim {
    fn new() -> Sim {
        let mut world = World::new(Family::V6, space_v6());
        for n in 0..NODES {
            world.nodes.insert(name(n), Sight::Unseen);
        }
        Sim {
            now: 1_000_000,
            truth: Truth {
                history: vec![(0, BTreeMap::new())],
            },
            world,
            granted_at: BTreeMap::new(),
            quarantine_ends: BTreeMap::new(),
        }
    }

    fn expire(&mut self) {
        let now = self.now;
        let ended: Vec<IpNet> = self
            .quarantine_ends
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(cidr, _)| *cidr)
            .collect();
        for cidr in ended {
            self.quarantine_ends.remove(&cidr);
            self.world.quarantined.remove(&cidr);
            self.world.space.release_quarantined(&cidr).unwrap();
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Move { prefix, to } => {
                let mut placement = self.truth.now().clone();
                match to {
                    Some(n) => placement.insert(prefix, n),
                    None => placement.remove(&prefix),
                };
                self.truth.history.push((self.now, placement));
            }
            Op::Advance { ms } => {
                self.now += ms;
                self.expire();
            }
            Op::Describe { node: n, lag_ms } => self.describe(n, lag_ms)?,
        }
        Ok(())
    }

    fn describe(&mut self, n: usize, lag_ms: u64) -> Result<(), TestCaseError> {
        let seen_at = self.now.saturating_sub(lag_ms);
        let prefixes = self
            .truth
            .at(seen_at)
            .iter()
            .filter(|(_, on)| **on == n)
            .map(|(p, _)| prefix(*p))
            .collect();
        self.world.nodes.insert(
            name(n),
            Sight::Primary {
                at_ms: self.now,
                prefixes,
            },
        );
        let pool = pool();
        let plan = plan_from_cloud(&FromCloudInput {
            pool: &pool,
            family: Family::V6,
            space: &self.world.space,
            granted: &self.world.granted,
            quarantined: &self.world.quarantined,
            nodes: &self.world.nodes,
            absent_since: &self.world.clocks,
            lag_bound_ms: BOUND,
        });
        self.world.clocks = plan.absent_since.clone();
        let proposed: BTreeSet<IpNet> = plan.grant.iter().map(|(_, c)| *c).collect();
        prop_assert_eq!(proposed.len(), plan.grant.len(), "a CIDR proposed twice");
        for (holder, cidr) in &plan.withdraw {
            prop_assert_eq!(self.world.granted.get(cidr), Some(holder));
            let p = (0..PREFIXES).find(|i| prefix(*i) == *cidr).unwrap();
            let h = (0..NODES).find(|i| name(*i) == *holder).unwrap();
            let since = self.granted_at[cidr];
            prop_assert!(
                self.truth.was_off(p, h, since, self.now),
                "{} withdrawn from {} though the cloud kept it there since its grant at {}",
                cidr,
                holder,
                since
            );
            // etcd: delete and quarantine.
            self.world.granted.remove(cidr);
            self.granted_at.remove(cidr);
            self.world.space.release_granted(cidr).unwrap();
            self.world.space.occupy_quarantined(cidr).unwrap();
            self.world.quarantined.insert(*cidr);
            self.quarantine_ends.insert(*cidr, self.now + QUARANTINE);
        }
        for (holder, cidr) in &plan.grant {
            // etcd's compares: the view was current, so every proposal lands.
            prop_assert!(!self.world.granted.contains_key(cidr));
            prop_assert!(!self.world.quarantined.contains(cidr));
            self.world.space.occupy_granted(cidr).unwrap();
            self.world.granted.insert(*cidr, holder.clone());
            self.granted_at.insert(*cidr, self.now);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random cloud changes and lagging describes: no CIDR is ever granted twice, no grant is
    /// withdrawn while the cloud kept the prefix on its node all along since the grant (one
    /// stale describe never withdraws), and once the cloud is stable every node ends up holding
    /// exactly the prefixes its primary interface carries.
    #[test]
    fn grants_follow_the_cloud_without_doubles_or_premature_withdrawals(
        ops in proptest::collection::vec(op(), 1..120),
        settle_lags in proptest::collection::vec(0..=BOUND, 64),
    ) {
        let mut sim = Sim::new();
        for op in &ops {
            sim.step(op)?;
        }
        // The cloud stable from now: describes every 3 s, each lagging up to the bound.
        for (i, lag) in settle_lags.iter().enumerate() {
            sim.step(&Op::Advance { ms: 3_000 })?;
            sim.describe(i % NODES, *lag)?;
        }
        let want: BTreeMap<IpNet, NodeName> = sim
            .truth
            .now()
            .iter()
            .map(|(p, n)| (prefix(*p), name(*n)))
            .collect();
        prop_assert_eq!(&sim.world.granted, &want);
    }
}
