//! Tests of the to-cloud delegation decisions: worked cases, and a proptest of random grants,
//! removals and cloud faults against a simulated cloud that would let one prefix sit on two
//! instances (so only the decisions keep it from happening).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::tests::{id, net, node, pods};

fn pools() -> Vec<ToCloudPool> {
    vec![
        ToCloudPool {
            pool: pods(),
            family: Family::V4,
            cidrs: vec![net("10.0.32.0/19")],
            node_prefix_len: 28,
        },
        ToCloudPool {
            pool: pods(),
            family: Family::V6,
            cidrs: vec![net("2600:1f14:1:100::/64")],
            node_prefix_len: 80,
        },
    ]
}

const EC2: [Option<u8>; 2] = [Some(28), Some(80)];
const NOW: u64 = 1_700_000_000_000;

fn primary(interface: &str, prefixes: &[&str]) -> InstanceSight {
    InstanceSight::Primary(PrimarySight {
        interface: id(interface),
        subnet_cidrs: vec![net("10.0.0.0/18"), net("2600:1f14:1:100::/64")],
        prefixes: prefixes.iter().map(|p| net(p)).collect(),
    })
}

fn key(cidr: &str, instance: &str, interface: &str, at_ms: u64) -> Delegated {
    let cidr = net(cidr);
    Delegated {
        pool: pods(),
        family: family_of(&cidr),
        cidr,
        record: Some(DelegationRecord {
            instance_id: instance.to_owned(),
            interface: id(interface),
            at_ms,
        }),
        revision: 7,
    }
}

fn grant(cidr: &str) -> (PoolName, Family, IpNet) {
    let cidr = net(cidr);
    (pods(), family_of(&cidr), cidr)
}

struct Case {
    instance: Option<&'static str>,
    grants: Vec<(PoolName, Family, IpNet)>,
    keys: Vec<Delegated>,
    taken: BTreeSet<(PoolName, IpNet)>,
    sights: BTreeMap<String, InstanceSight>,
    delegable: [Option<u8>; 2],
}

impl Case {
    fn new() -> Case {
        Case {
            instance: Some("i-1"),
            grants: vec![grant("10.0.32.0/28"), grant("2600:1f14:1:100:1::/80")],
            keys: Vec::new(),
            taken: BTreeSet::new(),
            sights: BTreeMap::new(),
            delegable: EC2,
        }
    }

    fn plan(&self) -> DelegationPlan {
        let name = node("n1");
        let pools = pools();
        plan_delegations(&DelegationInput {
            node: &name,
            instance_id: self.instance,
            pools: &pools,
            delegable: self.delegable,
            grants: &self.grants,
            delegations: &self.keys,
            taken_elsewhere: &self.taken,
            sights: &self.sights,
            now_ms: NOW,
        })
    }
}

#[test]
fn an_unseen_instance_is_described_first() {
    let plan = Case::new().plan();
    assert_eq!(
        plan.steps,
        vec![DelegationStep::Describe {
            instance_id: "i-1".into()
        }]
    );
}

#[test]
fn missing_grants_are_delegated_to_the_primary_and_nothing_once_there() {
    let mut case = Case::new();
    case.sights.insert("i-1".into(), primary("eni-1", &[]));
    let plan = case.plan();
    assert_eq!(plan.steps.len(), 2, "{plan:?}");
    assert!(matches!(
        &plan.steps[0],
        DelegationStep::Delegate { cidr, interface, revision: 0, .. }
            if *cidr == net("10.0.32.0/28") && interface.as_str() == "eni-1"
    ));
    assert!(plan.problems.is_empty());
    // In sync: the prefixes there, the keys written.
    case.sights.insert(
        "i-1".into(),
        primary("eni-1", &["10.0.32.0/28", "2600:1f14:1:100:1::/80"]),
    );
    case.keys = vec![
        key("10.0.32.0/28", "i-1", "eni-1", NOW - 60_000),
        key("2600:1f14:1:100:1::/80", "i-1", "eni-1", NOW - 60_000),
    ];
    let plan = case.plan();
    assert_eq!(plan, DelegationPlan::default());
}

#[test]
fn a_grant_found_there_without_a_key_is_adopted_without_a_call() {
    let mut case = Case::new();
    case.grants.truncate(1);
    case.sights
        .insert("i-1".into(), primary("eni-1", &["10.0.32.0/28"]));
    let plan = case.plan();
    assert!(matches!(
        plan.steps.as_slice(),
        [DelegationStep::Adopt { cidr, .. }] if *cidr == net("10.0.32.0/28")
    ));
}

#[test]
fn a_length_the_provider_cannot_take_is_reported_and_nothing_is_called() {
    let mut case = Case::new();
    case.delegable = [Some(28), None];
    case.grants = vec![grant("10.0.32.0/28"), grant("2600:1f14:1:100:1::/80")];
    case.sights.insert("i-1".into(), primary("eni-1", &[]));
    let plan = case.plan();
    assert_eq!(plan.steps.len(), 1);
    assert_eq!(plan.problems.len(), 1, "{plan:?}");
    assert!(
        plan.problems[0].contains("delegates no ipv6 range"),
        "{plan:?}"
    );
    case.delegable = [Some(26), Some(80)];
    let plan = case.plan();
    assert!(plan.problems[0].contains("/28, the cloud provider delegates only /26"));
}

#[test]
fn a_grant_outside_the_subnet_or_held_elsewhere_is_reported_not_called() {
    let mut case = Case::new();
    case.grants = vec![grant("10.0.96.0/28")];
    case.sights.insert("i-1".into(), primary("eni-1", &[]));
    let plan = case.plan();
    assert!(plan.steps.is_empty());
    assert!(plan.problems[0].contains("outside the subnet"));
    case.grants = vec![grant("10.0.32.0/28")];
    case.taken.insert((pods(), net("10.0.32.0/28")));
    let plan = case.plan();
    assert!(plan.steps.is_empty());
    assert!(plan.problems[0].contains("still delegated to another instance"));
}

#[test]
fn a_key_whose_grant_is_gone_is_taken_back_then_forgotten() {
    let mut case = Case::new();
    case.grants.clear();
    case.keys = vec![key("10.0.32.0/28", "i-1", "eni-1", NOW - 60_000)];
    case.sights
        .insert("i-1".into(), primary("eni-1", &["10.0.32.0/28"]));
    assert!(matches!(
        case.plan().steps.as_slice(),
        [DelegationStep::Undelegate { revision: 7, .. }]
    ));
    case.sights.insert("i-1".into(), primary("eni-1", &[]));
    assert!(matches!(
        case.plan().steps.as_slice(),
        [DelegationStep::Forget { revision: 7, .. }]
    ));
    // The instance gone: the cloud freed it.
    case.sights.insert("i-1".into(), InstanceSight::Gone);
    assert!(matches!(
        case.plan().steps.as_slice(),
        [DelegationStep::Forget { .. }]
    ));
}

#[test]
fn a_removed_node_s_key_is_taken_back_from_its_instance() {
    let mut case = Case::new();
    case.instance = None;
    case.grants.clear();
    case.keys = vec![key("10.0.32.0/28", "i-9", "eni-9", NOW - 60_000)];
    assert_eq!(
        case.plan().steps,
        vec![DelegationStep::Describe {
            instance_id: "i-9".into()
        }]
    );
    case.sights
        .insert("i-9".into(), primary("eni-9", &["10.0.32.0/28"]));
    assert!(matches!(
        case.plan().steps.as_slice(),
        [DelegationStep::Undelegate { instance_id, .. }] if instance_id == "i-9"
    ));
}

#[test]
fn a_fresh_key_not_yet_visible_waits_for_the_describe_lag() {
    let mut case = Case::new();
    case.grants.truncate(1);
    case.keys = vec![key("10.0.32.0/28", "i-1", "eni-1", NOW - 2_000)];
    case.sights.insert("i-1".into(), primary("eni-1", &[]));
    let plan = case.plan();
    assert!(plan.steps.is_empty(), "{plan:?}");
    assert_eq!(plan.recheck_at_ms, Some(NOW + 8_000));
    // Older than the bound and still not there: it vanished, delegated again over the key.
    case.keys = vec![key("10.0.32.0/28", "i-1", "eni-1", NOW - 20_000)];
    assert!(matches!(
        case.plan().steps.as_slice(),
        [DelegationStep::Delegate { revision: 7, .. }]
    ));
}

#[test]
fn a_foreign_prefix_in_the_pool_is_reported_and_left_alone() {
    let mut case = Case::new();
    case.grants.truncate(1);
    case.keys = vec![key("10.0.32.0/28", "i-1", "eni-1", NOW - 60_000)];
    case.sights.insert(
        "i-1".into(),
        primary("eni-1", &["10.0.32.0/28", "10.0.33.0/28", "10.0.1.0/28"]),
    );
    let plan = case.plan();
    assert!(plan.steps.is_empty(), "{plan:?}");
    assert_eq!(plan.problems.len(), 1, "{plan:?}");
    assert!(plan.problems[0].contains("10.0.33.0/28"));
}

#[test]
fn replays_finish_or_forget() {
    let delegate = CloudOp::DelegatePrefix {
        interface: id("eni-1"),
        prefix: net("10.0.32.0/28"),
    };
    let undelegate = CloudOp::UndelegatePrefix {
        interface: id("eni-1"),
        prefix: net("10.0.32.0/28"),
    };
    assert_eq!(
        replay_delegation(&delegate, Some(true), 0),
        DelegationReplay::Record
    );
    assert_eq!(
        replay_delegation(&delegate, Some(false), 1_000),
        DelegationReplay::Wait
    );
    assert_eq!(
        replay_delegation(&delegate, Some(false), 60_000),
        DelegationReplay::Forget
    );
    assert_eq!(
        replay_delegation(&delegate, None, 0),
        DelegationReplay::Forget
    );
    assert_eq!(
        replay_delegation(&undelegate, Some(true), 0),
        DelegationReplay::Undelegate
    );
    assert_eq!(
        replay_delegation(&undelegate, Some(false), 0),
        DelegationReplay::Undelegated
    );
    assert_eq!(
        replay_delegation(&undelegate, None, 0),
        DelegationReplay::Undelegated
    );
}

/// The simulated world of the proptest: a cloud that never refuses a prefix held elsewhere,
/// the store's keys and intents, grants as etcd would hold them (one node per CIDR).
#[derive(Default, Debug)]
struct World {
    /// Instance → its primary's prefixes (the truth; `None`: terminated).
    cloud: BTreeMap<String, Option<BTreeSet<IpNet>>>,
    /// Node → its current instance (registered).
    registered: BTreeMap<NodeName, String>,
    /// Node → its grant.
    grants: BTreeMap<NodeName, IpNet>,
    /// CIDRs whose grant was deleted, still delegated somewhere maybe (quarantined).
    quarantined: BTreeSet<IpNet>,
    /// (node, cidr) → (instance, at).
    keys: BTreeMap<(NodeName, IpNet), (String, u64)>,
    /// Open intents: (node, op, instance).
    intents: Vec<(NodeName, CloudOp, String)>,
    /// Calls made and whether the truth already satisfied them (futile).
    calls: u64,
    futile: u64,
    next_instance: u32,
}

#[derive(Debug, Clone)]
enum Op {
    Register(u8),
    Grant(u8, u8),
    Remove(u8),
    Terminate(u8),
    Serve(u8, Fault),
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    /// The call refused (not applied).
    Refused,
    /// Applied, the answer lost (the intent stays open).
    Lost,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..6).prop_map(Op::Register),
        1 => (0u8..6, 0u8..8).prop_map(|(n, c)| Op::Grant(n, c)),
        1 => (0u8..6).prop_map(Op::Remove),
        1 => (0u8..6).prop_map(Op::Terminate),
        4 => (0u8..6, prop_oneof![
            4 => Just(Fault::None),
            1 => Just(Fault::Refused),
            1 => Just(Fault::Lost),
        ]).prop_map(|(n, f)| Op::Serve(n, f)),
    ]
}

fn cidr_of(c: u8) -> IpNet {
    IpNet::V4(ipnet::Ipv4Net::new([10, 0, 32, c * 16].into(), 28).unwrap())
}

fn nname(n: u8) -> NodeName {
    node(&format!("n{n}"))
}

impl World {
    fn sights(&self) -> BTreeMap<String, InstanceSight> {
        self.cloud
            .iter()
            .map(|(instance, prefixes)| {
                let sight = match prefixes {
                    None => InstanceSight::Gone,
                    Some(prefixes) => InstanceSight::Primary(PrimarySight {
                        interface: id(&format!("eni-{instance}")),
                        subnet_cidrs: vec![net("10.0.0.0/18")],
                        prefixes: prefixes.iter().copied().collect(),
                    }),
                };
                (instance.clone(), sight)
            })
            .collect()
    }

    fn plan(&self, name: &NodeName, now_ms: u64) -> DelegationPlan {
        let pools = vec![pools()[0].clone()];
        let grants: Vec<(PoolName, Family, IpNet)> = self
            .grants
            .get(name)
            .map(|c| (pods(), Family::V4, *c))
            .into_iter()
            .collect();
        let delegations: Vec<Delegated> = self
            .keys
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, cidr), (instance, at))| Delegated {
                pool: pods(),
                family: Family::V4,
                cidr: *cidr,
                record: Some(DelegationRecord {
                    instance_id: instance.clone(),
                    interface: id(&format!("eni-{instance}")),
                    at_ms: *at,
                }),
                revision: 1,
            })
            .collect();
        let mut taken: BTreeSet<(PoolName, IpNet)> = self
            .keys
            .keys()
            .filter(|(n, _)| n != name)
            .map(|(_, c)| (pods(), *c))
            .collect();
        for (n, op, _) in &self.intents {
            if let (
                false,
                CloudOp::DelegatePrefix { prefix, .. } | CloudOp::UndelegatePrefix { prefix, .. },
            ) = (n == name, op)
            {
                taken.insert((pods(), *prefix));
            }
        }
        let sights = self.sights();
        let instance = self.registered.get(name).map(String::as_str);
        plan_delegations(&DelegationInput {
            node: name,
            instance_id: instance,
            pools: &pools,
            delegable: EC2,
            grants: &grants,
            delegations: &delegations,
            taken_elsewhere: &taken,
            sights: &sights,
            now_ms,
        })
    }

    fn on(&self, instance: &str, cidr: &IpNet) -> Option<bool> {
        self.cloud
            .get(instance)
            .and_then(|p| p.as_ref())
            .map(|p| p.contains(cidr))
    }

    /// A call on the truth: a naive cloud that assigns whatever it is asked.
    fn call(&mut self, instance: &str, cidr: IpNet, assign: bool) {
        self.calls += 1;
        if let Some(Some(prefixes)) = self.cloud.get_mut(instance) {
            let futile = if assign {
                !prefixes.insert(cidr)
            } else {
                !prefixes.remove(&cidr)
            };
            if futile {
                self.futile += 1;
            }
        }
    }

    /// One node's task: an open intent first, else the plan's first step.
    fn serve(&mut self, name: &NodeName, fault: Fault, now_ms: u64) {
        if let Some(index) = self.intents.iter().position(|(n, ..)| n == name) {
            let (_, op, instance) = self.intents[index].clone();
            let cidr = match &op {
                CloudOp::DelegatePrefix { prefix, .. }
                | CloudOp::UndelegatePrefix { prefix, .. } => *prefix,
                _ => unreachable!(),
            };
            // Intents are replayed settled (the sim's describes never lag).
            match replay_delegation(&op, self.on(&instance, &cidr), 60_000) {
                DelegationReplay::Record => {
                    self.keys.insert((name.clone(), cidr), (instance, now_ms));
                    self.intents.remove(index);
                }
                DelegationReplay::Forget => {
                    self.intents.remove(index);
                }
                DelegationReplay::Wait => unreachable!("settled"),
                DelegationReplay::Undelegate => {
                    if !matches!(fault, Fault::Refused) {
                        self.call(&instance, cidr, false);
                    }
                    if matches!(fault, Fault::None) {
                        self.keys.remove(&(name.clone(), cidr));
                        self.intents.remove(index);
                    }
                }
                DelegationReplay::Undelegated => {
                    self.keys.remove(&(name.clone(), cidr));
                    self.intents.remove(index);
                }
            }
            return;
        }
        let plan = self.plan(name, now_ms);
        let Some(step) = plan.steps.first().cloned() else {
            return;
        };
        match step {
            DelegationStep::Describe { instance_id } => {
                panic!("the sim knows every instance, asked to describe {instance_id}")
            }
            DelegationStep::Forget { cidr, .. } => {
                self.keys.remove(&(name.clone(), cidr));
            }
            DelegationStep::Adopt {
                cidr, instance_id, ..
            } => {
                self.keys
                    .insert((name.clone(), cidr), (instance_id, now_ms));
            }
            DelegationStep::Delegate {
                cidr,
                instance_id,
                interface,
                ..
            } => {
                let op = CloudOp::DelegatePrefix {
                    interface,
                    prefix: cidr,
                };
                match fault {
                    Fault::Refused => {}
                    Fault::Lost => {
                        self.call(&instance_id, cidr, true);
                        self.intents.push((name.clone(), op, instance_id));
                    }
                    Fault::None => {
                        self.call(&instance_id, cidr, true);
                        self.keys
                            .insert((name.clone(), cidr), (instance_id, now_ms));
                    }
                }
            }
            DelegationStep::Undelegate {
                cidr,
                instance_id,
                interface,
                ..
            } => {
                let op = CloudOp::UndelegatePrefix {
                    interface,
                    prefix: cidr,
                };
                match fault {
                    Fault::Refused => {}
                    Fault::Lost => {
                        self.call(&instance_id, cidr, false);
                        self.intents.push((name.clone(), op, instance_id));
                    }
                    Fault::None => {
                        self.call(&instance_id, cidr, false);
                        self.keys.remove(&(name.clone(), cidr));
                    }
                }
            }
        }
    }

    fn apply(&mut self, op: &Op, now_ms: u64) {
        match *op {
            Op::Register(n) => {
                let name = nname(n);
                if !self.registered.contains_key(&name) {
                    self.next_instance += 1;
                    let instance = format!("i-{}", self.next_instance);
                    self.cloud.insert(instance.clone(), Some(BTreeSet::new()));
                    self.registered.insert(name, instance);
                }
            }
            Op::Grant(n, c) => {
                let name = nname(n);
                let cidr = cidr_of(c);
                let held = self.grants.values().any(|g| *g == cidr);
                // A quarantined CIDR is not granted until its quarantine ends, which the sim
                // lets happen whenever (possibly before corral took it back).
                if self.registered.contains_key(&name) && !self.grants.contains_key(&name) && !held
                {
                    self.quarantined.remove(&cidr);
                    self.grants.insert(name, cidr);
                }
            }
            Op::Remove(n) => {
                let name = nname(n);
                self.registered.remove(&name);
                if let Some(cidr) = self.grants.remove(&name) {
                    self.quarantined.insert(cidr);
                }
            }
            Op::Terminate(n) => {
                // Only instances of removed nodes end (a node's own end is another path).
                let name = nname(n);
                let ended: Vec<String> = self
                    .keys
                    .iter()
                    .filter(|((k, _), _)| *k == name)
                    .map(|(_, (i, _))| i.clone())
                    .filter(|i| !self.registered.values().any(|r| r == i))
                    .collect();
                for instance in ended {
                    self.cloud.insert(instance, None);
                }
            }
            Op::Serve(n, fault) => self.serve(&nname(n), fault, now_ms),
        }
    }

    /// No prefix on two live instances.
    fn assert_no_double(&self) {
        let mut seen: BTreeMap<IpNet, &String> = BTreeMap::new();
        for (instance, prefixes) in &self.cloud {
            for cidr in prefixes.iter().flatten() {
                if let Some(other) = seen.insert(*cidr, instance) {
                    panic!("{cidr} on {other} and {instance}: {self:#?}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random registrations, grants, removals, terminations and served nodes with refused and
    /// lost calls: no prefix is ever on two instances, no call is futile (asks for what is
    /// already so), and once the faults stop the world converges to exactly the grants on
    /// their instances, nothing else corral put there, and no call after that.
    #[test]
    fn delegations_never_double_and_converge(ops in proptest::collection::vec(op(), 1..120)) {
        let mut world = World::default();
        let mut now = NOW;
        for op in &ops {
            now += 1_000;
            world.apply(op, now);
            world.assert_no_double();
        }
        // No more faults: serve every node until nothing changes.
        let names: Vec<NodeName> = (0..6).map(nname).collect();
        for _ in 0..20 {
            now += 60_000;
            for name in &names {
                for _ in 0..4 {
                    world.serve(name, Fault::None, now);
                    world.assert_no_double();
                }
            }
        }
        prop_assert_eq!(world.futile, 0, "futile calls");
        prop_assert!(world.intents.is_empty(), "{:?}", world.intents);
        for (name, cidr) in &world.grants {
            let instance = &world.registered[name];
            prop_assert_eq!(world.on(instance, cidr), Some(true), "{} {}", name, cidr);
        }
        for (instance, prefixes) in &world.cloud {
            for cidr in prefixes.iter().flatten() {
                let owner = world.registered.iter().find(|(_, i)| *i == instance).map(|(n, _)| n);
                prop_assert!(
                    owner.is_some_and(|n| world.grants.get(n) == Some(cidr)),
                    "{} left on {}", cidr, instance
                );
            }
        }
        let calls = world.calls;
        for name in &names {
            world.serve(name, Fault::None, now + 60_000);
            prop_assert!(world.plan(name, now + 60_000).steps.is_empty());
        }
        prop_assert_eq!(world.calls, calls, "calls after convergence");
    }
}
