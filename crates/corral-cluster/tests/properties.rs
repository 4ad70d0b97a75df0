//! Operator replicas with stale caches against a simulated etcd: granted CIDRs never overlap, node IDs stay one-to-one, nodes get served.
//!
//! The simulated store is a `BTreeMap` of key → (value, create revision, mod revision) with a
//! global revision, an event log, and an atomic txn that applies its puts only if every listed
//! key (and prefix) is absent, the node's registration is the proposal's, and the writer's
//! leader token is current. Replicas are `ClusterView`s fed from the log at their own pace;
//! a deposed replica keeps proposing. After every step the invariants are checked from the
//! store alone, by brute force (pairwise overlap of every granted range).

use std::collections::{BTreeMap, BTreeSet};

use crate::common;

use common::{
    Event, Stored, delete_logged, keys_of, node_record, put_logged, quarantine_to_expire,
};

use corral_cluster::net::{family_of, net_range, overlaps};
use corral_cluster::{
    ClusterConfig, ClusterName, ClusterView, Family, GrantRecord, IpNet, Key, Keys, NodeIdRecord,
    NodeName, PoolName, ProposeError, QuarantineRecord, decode_value, encode_value,
};
use proptest::prelude::*;

const TINY: &str = include_str!("configs/tiny.toml");

const BIG: &str = include_str!("configs/big.toml");

/// The grants of one pool and family: CIDR and record (None when the value is garbage).
type GrantList = Vec<(IpNet, Option<GrantRecord>)>;

#[derive(Debug, Default)]
struct Store {
    kv: Stored,
    revision: i64,
    log: Vec<Event>,
    leader_token: u64,
}

impl Store {
    fn put(&mut self, key: String, value: Vec<u8>) {
        self.revision += 1;
        put_logged(&mut self.kv, &mut self.log, self.revision, key, value);
    }

    fn delete(&mut self, key: &str) {
        if delete_logged(&mut self.kv, &mut self.log, self.revision + 1, key) {
            self.revision += 1;
        }
    }

    /// Applies `deletes` then `puts` atomically if the token is current, every key of
    /// `absent` and every prefix of `empty` is absent, and `registration` has its create
    /// revision (when given).
    fn txn(
        &mut self,
        token: u64,
        registration: Option<(&str, i64)>,
        absent: &[String],
        empty: &[String],
        deletes: &[String],
        puts: &[(String, Vec<u8>)],
    ) -> bool {
        if token != self.leader_token {
            return false;
        }
        if let Some((key, revision)) = registration
            && self.kv.get(key).map(|(_, c, _)| *c) != Some(revision)
        {
            return false;
        }
        if absent.iter().any(|k| self.kv.contains_key(k)) {
            return false;
        }
        if empty.iter().any(|p| {
            self.kv
                .range(p.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(p.as_str()))
        }) {
            return false;
        }
        for key in deletes {
            self.delete(key);
        }
        for (key, value) in puts {
            self.put(key.clone(), value.clone());
        }
        true
    }
}

#[derive(Debug)]
struct Replica {
    view: ClusterView,
    applied: usize,
    token: u64,
}

impl Replica {
    fn catch_up(&mut self, store: &Store, max: usize) {
        let end = store.log.len().min(self.applied.saturating_add(max));
        for event in &store.log[self.applied..end] {
            event.apply(&mut self.view);
        }
        self.applied = end;
    }

    /// A restart: the view rebuilt from a full read, then watching from there.
    fn rebuild(&mut self, store: &Store, keys: &Keys, config: &ClusterConfig) {
        let mut view = ClusterView::new(keys.clone(), config.clone());
        for (key, (value, create, modified)) in &store.kv {
            view.apply_put(key, value, *create, *modified);
        }
        self.view = view;
        self.applied = store.log.len();
    }
}

#[derive(Debug, Clone)]
enum Op {
    Register(usize),
    Remove(usize, usize),
    Expire(usize),
    Restart(usize),
    LeaderChange(usize),
    CatchUp(usize, usize),
    Propose(usize, usize),
    Garbage(usize),
}

const NODES: usize = 8;
const REPLICAS: usize = 3;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..NODES).prop_map(Op::Register),
        1 => (0..NODES, 0..REPLICAS).prop_map(|(n, r)| Op::Remove(n, r)),
        1 => (0..16usize).prop_map(Op::Expire),
        1 => (0..REPLICAS).prop_map(Op::Restart),
        1 => (0..REPLICAS).prop_map(Op::LeaderChange),
        3 => (0..REPLICAS, 1..12usize).prop_map(|(r, k)| Op::CatchUp(r, k)),
        6 => (0..REPLICAS, 0..NODES).prop_map(|(r, n)| Op::Propose(r, n)),
        1 => (0..4usize).prop_map(Op::Garbage),
    ]
}

fn node_name(i: usize) -> NodeName {
    NodeName::new(&format!("node-{i}")).unwrap()
}

struct Sim {
    keys: Keys,
    config: ClusterConfig,
    store: Store,
    replicas: Vec<Replica>,
}

impl Sim {
    fn new(config_text: &str) -> Sim {
        let keys = Keys::new(ClusterName::new("sim").unwrap());
        let config = ClusterConfig::from_toml(config_text).unwrap();
        let mut store = Store::default();
        store.put(keys.config(), config.to_json().unwrap().into_bytes());
        let replicas = (0..REPLICAS)
            .map(|_| Replica {
                view: ClusterView::new(keys.clone(), config.clone()),
                applied: 0,
                token: 0,
            })
            .collect();
        Sim {
            keys,
            config,
            store,
            replicas,
        }
    }

    /// Proposes for `node` from replica `r` and commits the proposal; returns the propose
    /// outcome and whether the txn committed.
    fn propose(&mut self, r: usize, node: &NodeName) -> (Result<(), ProposeError>, bool) {
        let replica = &mut self.replicas[r];
        let proposal = match replica.view.propose(node) {
            Ok(p) => p,
            Err(e) => return (Err(e), false),
        };
        let committed = self.store.txn(
            replica.token,
            Some((
                &proposal.registration_key(&self.keys),
                proposal.node_revision,
            )),
            &proposal.absent_keys(&self.keys),
            &proposal.absent_prefixes(&self.keys),
            &[],
            &proposal.puts(&self.keys).unwrap(),
        );
        replica.view.abandon(&proposal);
        (Ok(()), committed)
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Register(n) => {
                let key = self.keys.node(&node_name(n));
                if !self.store.kv.contains_key(&key) {
                    let uid = format!("uid-{n}-{}", self.store.revision);
                    self.store.put(key, node_record(uid));
                }
            }
            Op::Remove(n, r) => {
                // The operator removes from a fresh read of the node's keys.
                let replica = &mut self.replicas[r];
                replica.catch_up(&self.store, usize::MAX);
                let removal = replica.view.removal(&node_name(n));
                if !self.store.kv.contains_key(&removal.node_key) {
                    return;
                }
                let record = encode_value(&QuarantineRecord {
                    from_node: node_name(n),
                    reason: "node removed".into(),
                    since_ms: 0,
                    state: Default::default(),
                })
                .unwrap();
                let puts: Vec<(String, Vec<u8>)> = removal
                    .quarantines()
                    .into_iter()
                    .map(|k| (k, record.clone()))
                    .collect();
                self.store
                    .txn(replica.token, None, &[], &[], &removal.deletes(), &puts);
            }
            Op::Expire(i) => {
                if let Some(key) = quarantine_to_expire(&self.keys, self.store.kv.keys(), i) {
                    self.store.delete(&key);
                }
            }
            Op::Restart(r) => {
                let (keys, config) = (self.keys.clone(), self.config.clone());
                self.replicas[r].rebuild(&self.store, &keys, &config);
            }
            Op::LeaderChange(r) => {
                self.store.leader_token += 1;
                self.replicas[r].token = self.store.leader_token;
            }
            Op::CatchUp(r, k) => self.replicas[r].catch_up(&self.store, k),
            Op::Propose(r, n) => {
                let node = node_name(n);
                let _ = self.propose(r, &node);
            }
            Op::Garbage(kind) => {
                let prefix = self.keys.prefix().to_owned();
                let (key, value) = match kind {
                    0 => (format!("{prefix}grants/x/ipv4/10.0.0.1-30"), b"{}".to_vec()),
                    1 => (format!("{prefix}nodes/UPPER"), b"garbage".to_vec()),
                    2 => (format!("{prefix}unknown/kind"), vec![0xff]),
                    // A well-formed grant key (highest CIDR of a pool) with a garbage value.
                    _ => {
                        let pool = &self.config.pools[0];
                        let (family, fc) = pool.families().next().unwrap();
                        let cidr = fc.cidrs[0];
                        let (_, end) = net_range(&cidr);
                        let last =
                            corral_cluster::net::net_of(family, end, fc.node_prefix_len).unwrap();
                        (
                            self.keys.grant(&pool.name, family, &last),
                            b"not json".to_vec(),
                        )
                    }
                };
                if !self.store.kv.contains_key(&key) {
                    self.store.put(key, value);
                }
            }
        }
    }

    /// The invariants, from the store alone.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut grants: BTreeMap<(PoolName, Family), GrantList> = BTreeMap::new();
        let mut quarantined: BTreeMap<(PoolName, Family), Vec<IpNet>> = BTreeMap::new();
        let mut owned = BTreeSet::new();
        let mut nodes = BTreeMap::new();
        let mut ids = BTreeMap::new();
        let mut id_of_node = BTreeMap::new();
        let mut quarantined_ids = BTreeSet::new();
        for (key, (value, create, _)) in &self.store.kv {
            match self.keys.parse(key) {
                Ok(Key::Grant { pool, family, cidr }) => grants
                    .entry((pool, family))
                    .or_default()
                    .push((cidr, decode_value::<GrantRecord>(value).ok())),
                Ok(Key::Quarantine { pool, family, cidr }) => {
                    quarantined.entry((pool, family)).or_default().push(cidr)
                }
                Ok(Key::Owned {
                    node,
                    pool,
                    family,
                    cidr,
                }) => {
                    owned.insert((node, pool, family, cidr));
                }
                Ok(Key::Node { node }) => {
                    nodes.insert(node, *create);
                }
                Ok(Key::NodeId { id }) => {
                    ids.insert(id, decode_value::<NodeIdRecord>(value).unwrap());
                }
                Ok(Key::NodeIdOfNode { node }) => {
                    let id: corral_cluster::NodeIdOfNodeRecord = decode_value(value).unwrap();
                    id_of_node.insert(node, id.id);
                }
                Ok(Key::QuarantineId { id }) => {
                    quarantined_ids.insert(id);
                }
                _ => {}
            }
        }
        for ((pool, family), list) in &grants {
            let pool_config = self.config.pool(pool);
            let Some(fc) = pool_config.and_then(|p| p.family(*family)) else {
                // Only the injected garbage key names an unconfigured pool.
                prop_assert!(list.iter().all(|(_, r)| r.is_none()), "{pool}: {list:?}");
                continue;
            };
            let mut per_node = BTreeSet::new();
            for (i, (cidr, record)) in list.iter().enumerate() {
                prop_assert_eq!(family_of(cidr), *family);
                prop_assert_eq!(cidr.prefix_len(), fc.node_prefix_len);
                prop_assert!(
                    fc.cidrs.iter().any(|c| c.contains(cidr)),
                    "{cidr} outside pool"
                );
                prop_assert!(
                    !fc.reserved.iter().any(|r| overlaps(r, cidr)),
                    "{cidr} overlaps reserved"
                );
                // A grant key with a garbage value is the test's own injection (`Op::Garbage`,
                // written past arbitration, even over a quarantined CIDR): no replica granted it.
                let q = quarantined.get(&(pool.clone(), *family));
                prop_assert!(
                    record.is_none() || !q.into_iter().flatten().any(|q| overlaps(q, cidr)),
                    "{cidr} is quarantined"
                );
                for (other, _) in &list[..i] {
                    prop_assert!(!overlaps(cidr, other), "{cidr} overlaps {other}");
                }
                if let Some(record) = record {
                    prop_assert_eq!(
                        nodes.get(&record.node),
                        Some(&record.node_revision),
                        "grant {} names a stale or unknown node {:?}",
                        cidr,
                        record
                    );
                    prop_assert!(
                        per_node.insert(record.node.clone()),
                        "node {} holds two {} CIDRs of pool {}",
                        record.node,
                        family.name(),
                        pool
                    );
                    prop_assert!(owned.contains(&(
                        record.node.clone(),
                        pool.clone(),
                        *family,
                        *cidr
                    )));
                }
            }
        }
        for (node, pool, family, cidr) in &owned {
            let holder = grants.get(&(pool.clone(), *family)).and_then(|l| {
                l.iter()
                    .find(|(c, _)| c == cidr)
                    .and_then(|(_, r)| r.as_ref())
                    .map(|r| r.node.clone())
            });
            prop_assert_eq!(holder.as_ref(), Some(node), "owned key without its grant");
        }
        // Node IDs one-to-one, never quarantined while granted.
        let mut holders = BTreeSet::new();
        for (id, record) in &ids {
            prop_assert!(
                holders.insert(record.node.clone()),
                "two IDs for {}",
                record.node
            );
            prop_assert_eq!(id_of_node.get(&record.node), Some(id));
            prop_assert_eq!(nodes.get(&record.node), Some(&record.node_revision));
            prop_assert!(!quarantined_ids.contains(id), "node ID {} quarantined", id);
            prop_assert!(*id >= 1 && *id <= self.config.max_node_id());
        }
        prop_assert_eq!(id_of_node.len(), ids.len());
        Ok(())
    }

    /// Brute force: is every node CIDR of this pool and family occupied in the store?
    fn truly_full(&self, pool: &PoolName, family: Family) -> bool {
        let fc = self.config.pool(pool).unwrap().family(family).unwrap();
        let occupied: Vec<IpNet> = self
            .store
            .kv
            .keys()
            .filter_map(|k| match self.keys.parse(k) {
                Ok(
                    Key::Grant {
                        pool: p,
                        family: f,
                        cidr,
                    }
                    | Key::Quarantine {
                        pool: p,
                        family: f,
                        cidr,
                    },
                ) if &p == pool && f == family => Some(cidr),
                _ => None,
            })
            .chain(fc.reserved.iter().copied())
            .collect();
        fc.cidrs.iter().all(|cluster| {
            // Only small spaces are enumerated; a big one is never full in these tests.
            if fc.node_prefix_len - cluster.prefix_len() > 12 {
                return false;
            }
            cluster
                .subnets(fc.node_prefix_len)
                .unwrap()
                .all(|s| occupied.iter().any(|o| overlaps(o, &s)))
        })
    }

    /// The leader, caught up, serves every node that needs something until nothing changes;
    /// a node left unserved must be refused for real lack of space.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        self.store.leader_token += 1;
        let leader = 0;
        self.replicas[leader].token = self.store.leader_token;
        let mut refused = BTreeSet::new();
        for _ in 0..3 * NODES {
            self.replicas[leader].catch_up(&self.store, usize::MAX);
            let needing = self.replicas[leader].view.nodes_needing_grants();
            let Some(node) = needing.into_iter().find(|n| !refused.contains(n)) else {
                return Ok(());
            };
            let (outcome, committed) = self.propose(leader, &node);
            self.check()?;
            match outcome {
                Ok(()) => prop_assert!(committed, "a caught-up leader's proposal failed"),
                Err(ProposeError::Full { pool, family }) => {
                    prop_assert!(
                        self.truly_full(&pool, family),
                        "{pool} {family:?} is not full"
                    );
                    refused.insert(node);
                }
                Err(ProposeError::NodeIdsFull { max }) => {
                    let held = keys_of(&self.keys, self.store.kv.keys(), |key| {
                        matches!(key, Key::NodeId { .. } | Key::QuarantineId { .. })
                    })
                    .len();
                    prop_assert_eq!(held as u32, max);
                    refused.insert(node);
                }
                Err(e) => prop_assert!(false, "unexpected refusal: {e}"),
            }
        }
        prop_assert!(false, "settling did not finish");
        Ok(())
    }
}

fn run(config: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(config);
    for op in ops {
        sim.step(op);
        sim.check()?;
    }
    sim.settle()?;
    // The settled leader's view agrees with the store.
    let view = &sim.replicas[0].view;
    for (pool, family, stats) in view.space_stats() {
        let in_store = sim
            .store
            .kv
            .keys()
            .filter(|k| {
                matches!(sim.keys.parse(k),
                    Ok(Key::Grant { pool: p, family: f, .. }) if p == pool && f == family)
            })
            .count();
        prop_assert_eq!(stats.granted, in_store as u128);
        prop_assert_eq!(stats.in_flight, 0);
        // Free is exactly the node CIDRs nothing occupies (reserved, granted, quarantined or
        // blocked, each once), where the space is small enough to walk.
        let space = view.space(&pool, family).unwrap();
        if stats.capacity <= 4096 {
            let fam = view
                .config()
                .pools
                .iter()
                .find(|p| p.name == pool)
                .and_then(|p| {
                    p.families()
                        .find(|(f, _)| *f == family)
                        .map(|(_, c)| c.clone())
                })
                .unwrap();
            let mut free = 0u128;
            for cidr in &fam.cidrs {
                for sub in cidr.subnets(fam.node_prefix_len).unwrap() {
                    free += u128::from(space.is_free(&sub));
                }
            }
            prop_assert_eq!(stats.free, free, "{}/{:?}: {:?}", pool, family, stats);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    #[test]
    fn tiny_spaces_never_double_grant(ops in proptest::collection::vec(op(), 1..80)) {
        run(TINY, &ops)?;
    }

    #[test]
    fn big_spaces_never_double_grant(ops in proptest::collection::vec(op(), 1..80)) {
        run(BIG, &ops)?;
    }
}
