//! Block mode under churn: a seeded discrete-event simulation of the protocol of
//! ARCHITECTURE.md ("Block mode: demand, grants and the release handshake") with faults.
//!
//! No real time and no threads: the clock is a number moved in ticks of 100 ms. The parts:
//!
//! - a simulated etcd ([`Store`]): keys with create and mod revisions, one global revision
//!   per transaction that changes anything, leases, and transactions with compares (absent,
//!   created at, modified at), all or nothing; its log of revisions is what watches deliver;
//! - the operator ([`Leader`]): a `ClusterView` fed by a watch that runs late, the leader's
//!   clocks in memory (first sight of each grant, excess since), `blocks::plan` per node, and
//!   one fenced transaction per action as the protocol says; failovers lose the clocks and
//!   the cache, and the deposed leader keeps acting a while (its transactions must fail their
//!   fence);
//! - 100 agents ([`Agent`]): a durable local pool (blocks recorded from grants, surrendered
//!   marks, allocations: what SQLite keeps over a crash) and volatile state (the watch of
//!   their own `owned/` and `release/` keys, ADDs waiting, the demand debounce); crashes and
//!   restarts;
//! - pods created at 30/s cluster-wide on nodes chosen by weights that change every two
//!   minutes, each living about a minute, for a simulated 10 minutes; every 8 s or so a
//!   burst of 10–25 pods on one node, and a scale-down deleting most pods of one node;
//! - faults: watch events delivered late (each observer in order, at its own lag, with
//!   spikes), leader failovers, agent crashes (also between the local surrender and the
//!   `ready` answer), transaction answers lost (applied, the caller does not know) and
//!   transactions not applied with an unknown outcome.
//!
//! An auditor follows the store's log revision by revision (right after each step, so the
//! pods it sees are those of the moment) and asserts: grants are aligned blocks of the pool,
//! pairwise disjoint (one key per block) and never overlap a quarantine; no grant is deleted
//! while a pod holds an address in it, nor before its agent surrendered it, nor within the
//! release delay of its grant, nor without a `ready` answer deleted in the same revision.
//! Agents assert at each allocation that the address is held by no other pod and lies in a
//! block granted to their node whose handshake is not `ready`; every 5 s the simulation
//! checks every pod's address against the store's grants, and `corral_cluster::check` runs on
//! the store every 30 s. No flap: a grant that follows a release of the same node within the
//! release delay must rest on demand grown by more than max-above-watermark since that
//! release. Deficits (ADDs waiting or fewer than pre-allocate free on a node) are met within
//! [`DEFICIT_BOUND_MS`] outside of failover windows, of the node's own crashes and of its
//! max-allocate.
//!
//! `CHURN_SEEDS=200` runs more seeds (default 4, split over two tests that run in parallel);
//! `CHURN_SEED=n` runs one; `CHURN_DEBUG=1` prints each refused txn and each grant that
//! follows a release of the same node within a minute.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use crate::common;

use common::node_record;

use corral_cluster::blocks::{self, BlockInput, HeldBlock};
use corral_cluster::net::addr_u128;
use corral_cluster::{
    ClusterConfig, ClusterName, ClusterView, DemandRecord, Family, FamilyDemand, GrantRecord,
    IpNet, Key, Keys, NodeName, OwnedRecord, PoolName, QuarantineRecord, ReleaseRecord,
    ReleaseState, Watermarks, block_capacity, block_range, decode_value, encode_value,
};

const TICK_MS: u64 = 100;
const SIM_MS: u64 = 600_000;
const NODES: usize = 100;
/// 30 pods a second.
const PODS_PER_TICK: usize = 3;
const POD_LIFETIME_MS: f64 = 60_000.0;
/// How long an ADD waits for a free address before it fails.
const PENDING_MS: u64 = 5_000;
/// Watch lag: usually up to `LAG_MS`, sometimes a spike up to `SPIKE_MS`.
const LAG_MS: u64 = 800;
const SPIKE_MS: u64 = 3_000;
/// A deficit is met within: the demand's debounce (1 s) + the leader's watch lag + a tick +
/// a conflict's catch-up (another lag) + the agent's watch lag, with spikes, rounded up.
const DEFICIT_BOUND_MS: u64 = 1_000 + 3 * SPIKE_MS + 2_000;
/// A leader's catch-up after it takes over, counted in its failover window.
const TAKEOVER_MS: u64 = 2 * SPIKE_MS;

const CONFIG: &str = include_str!("configs/churn.toml");

/// SplitMix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    fn lag(&mut self) -> u64 {
        if self.chance(0.05) {
            self.between(LAG_MS, SPIKE_MS)
        } else {
            self.below(LAG_MS + 1)
        }
    }
}

// ---------------------------------------------------------------------------------------
// The simulated etcd.

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    create: i64,
    modified: i64,
    lease: Option<u64>,
}

#[derive(Debug, Clone)]
enum Cmp {
    Absent(String),
    CreatedAt(String, i64),
    ModifiedAt(String, i64),
}

#[derive(Debug, Clone)]
enum Op {
    Put(String, Vec<u8>, Option<u64>),
    Delete(String),
}

#[derive(Debug, Clone)]
enum Event {
    Put {
        key: String,
        value: Vec<u8>,
        create: i64,
    },
    Delete {
        key: String,
    },
}

#[derive(Debug)]
struct Revision {
    revision: i64,
    at_ms: u64,
    events: Vec<Event>,
}

/// The outcome of a transaction as its caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed(i64),
    /// A compare failed; nothing changed.
    Refused,
    /// The answer was lost: applied or not, the caller cannot tell.
    Unknown,
}

struct Store {
    keys: Keys,
    kv: BTreeMap<String, Entry>,
    revision: i64,
    /// `log[i]` is revision `i + 1`.
    log: Vec<Revision>,
    leases: BTreeMap<u64, (u64, BTreeSet<String>)>,
    next_lease: u64,
    /// Per node, the log indices of revisions touching its `owned/` or `release/` keys (what
    /// its agent watches).
    by_node: BTreeMap<NodeName, Vec<usize>>,
}

impl Store {
    fn new(keys: Keys) -> Store {
        Store {
            keys,
            kv: BTreeMap::new(),
            revision: 0,
            log: Vec::new(),
            leases: BTreeMap::new(),
            next_lease: 1,
            by_node: BTreeMap::new(),
        }
    }

    fn holds(&self, cmp: &Cmp) -> bool {
        match cmp {
            Cmp::Absent(k) => !self.kv.contains_key(k),
            Cmp::CreatedAt(k, r) => self.kv.get(k).is_some_and(|e| e.create == *r),
            Cmp::ModifiedAt(k, r) => self.kv.get(k).is_some_and(|e| e.modified == *r),
        }
    }

    /// Applies `ops` if every compare holds: one new revision if anything changed.
    fn txn(&mut self, now: u64, cmps: &[Cmp], ops: &[Op]) -> Option<i64> {
        if !cmps.iter().all(|c| self.holds(c)) {
            return None;
        }
        let rev = self.revision + 1;
        let mut events = Vec::new();
        for op in ops {
            match op {
                Op::Put(key, value, lease) => {
                    let old = self.kv.get(key);
                    let create = old.map_or(rev, |e| e.create);
                    if let Some(l) = old.and_then(|e| e.lease) {
                        self.leases.get_mut(&l).map(|(_, ks)| ks.remove(key));
                    }
                    if let Some(l) = lease {
                        self.leases
                            .get_mut(l)
                            .expect("put on a live lease")
                            .1
                            .insert(key.clone());
                    }
                    self.kv.insert(
                        key.clone(),
                        Entry {
                            value: value.clone(),
                            create,
                            modified: rev,
                            lease: *lease,
                        },
                    );
                    events.push(Event::Put {
                        key: key.clone(),
                        value: value.clone(),
                        create,
                    });
                }
                Op::Delete(key) => {
                    if let Some(e) = self.kv.remove(key) {
                        if let Some(l) = e.lease {
                            self.leases.get_mut(&l).map(|(_, ks)| ks.remove(key));
                        }
                        events.push(Event::Delete { key: key.clone() });
                    }
                }
            }
        }
        if events.is_empty() {
            return Some(self.revision);
        }
        self.commit(now, events);
        Some(rev)
    }

    fn commit(&mut self, now: u64, events: Vec<Event>) {
        self.revision += 1;
        let index = self.log.len();
        let mut touched = BTreeSet::new();
        for event in &events {
            let key = match event {
                Event::Put { key, .. } | Event::Delete { key } => key,
            };
            if let Ok(Key::Owned { node, .. } | Key::Release { node, .. }) = self.keys.parse(key) {
                touched.insert(node);
            }
        }
        for node in touched {
            self.by_node.entry(node).or_default().push(index);
        }
        self.log.push(Revision {
            revision: self.revision,
            at_ms: now,
            events,
        });
    }

    fn grant_lease(&mut self, now: u64, ttl_ms: u64) -> u64 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(id, (now + ttl_ms, BTreeSet::new()));
        id
    }

    /// Deletes the keys of every lease run out, one revision per lease.
    fn expire(&mut self, now: u64) {
        let due: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let (_, keys) = self.leases.remove(&id).unwrap_or_default();
            let events: Vec<Event> = keys
                .into_iter()
                .filter(|k| self.kv.remove(k).is_some())
                .map(|key| Event::Delete { key })
                .collect();
            if !events.is_empty() {
                self.commit(now, events);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The world: store, pods, figures.

#[derive(Debug, Clone)]
struct Pod {
    node: usize,
    addr: Option<u128>,
}

#[derive(Debug, Default)]
struct Figures {
    pods_created: u64,
    bursts: u64,
    scale_downs: u64,
    adds_failed_waiting: u64,
    adds_failed_waiting_excluded: u64,
    adds_failed_at_capacity: u64,
    adds_on_down_agents: u64,
    adds_lost_in_crash: u64,
    grant_txns: u64,
    blocks_granted: u64,
    releases: u64,
    marks: u64,
    refusals: u64,
    unmarks: u64,
    takebacks: u64,
    forgets: u64,
    refused_txns: BTreeMap<&'static str, u64>,
    fenced_txns: u64,
    unknown_txns: u64,
    regrants: u64,
    min_regrant_growth: Option<i64>,
    deficits: u64,
    max_deficit_ms: u64,
    max_deficit_excluded_ms: u64,
    failovers: u64,
    agent_crashes: u64,
    crashes_after_surrender: u64,
    demand_writes: u64,
    pool_full: u64,
    checks: u64,
}

struct World {
    rng: Rng,
    now: u64,
    keys: Keys,
    config: ClusterConfig,
    pool: PoolName,
    block_size: u64,
    names: Vec<NodeName>,
    /// Each node's watermarks in the pool.
    watermarks: Vec<Watermarks>,
    index: BTreeMap<NodeName, usize>,
    store: Store,
    pods: BTreeMap<u64, Pod>,
    /// Pods by end of life.
    ends: BinaryHeap<Reverse<(u64, u64)>>,
    next_pod: u64,
    /// Every address held, by pod: two pods never share one.
    addrs: BTreeMap<u128, u64>,
    figures: Figures,
    /// When the pool had no free block last (deficits then are not the protocol's fault).
    full_at: Option<u64>,
    /// Failover windows: from the old leader's loss to the new one's catch-up.
    windows: Vec<(u64, u64)>,
    /// Per node, the last release any leader completed: (when, used in the demand it rested
    /// on), for the no-flap check of the next grant.
    last_release: Vec<Option<(u64, u64)>>,
}

impl World {
    /// A transaction with the faults of the network: an answer lost after the txn applied
    /// (3%), a txn not applied whose outcome is unknown (1%).
    fn txn(&mut self, cmps: &[Cmp], ops: &[Op]) -> Outcome {
        if self.rng.chance(0.01) {
            return Outcome::Unknown;
        }
        let result = self.store.txn(self.now, cmps, ops);
        if self.rng.chance(0.03) {
            return Outcome::Unknown;
        }
        match result {
            Some(rev) => Outcome::Committed(rev),
            None => Outcome::Refused,
        }
    }

    fn watermarks(&self, node: usize) -> Watermarks {
        self.watermarks[node]
    }

    fn release_delay_ms(&self) -> u64 {
        self.config
            .pool(&self.pool)
            .and_then(|p| p.blocks())
            .expect("block pool")
            .release_delay_ms()
    }

    fn in_window(&self, from: u64, to: u64) -> bool {
        self.windows.iter().any(|(s, e)| *s <= to && from <= *e)
    }
}

/// The addresses an agent hands out from a block.
fn block_addrs(cidr: &IpNet) -> (u128, u128) {
    let spec = block_range(*cidr).expect("a block range");
    (addr_u128(spec.start()), addr_u128(spec.end()))
}

fn block_of(addr: u128) -> IpNet {
    let base = std::net::Ipv4Addr::from((addr as u32) & !0xf);
    IpNet::V4(ipnet::Ipv4Net::new(base, 28).expect("a /28"))
}

// ---------------------------------------------------------------------------------------
// Agents.

#[derive(Debug, Clone, Copy)]
struct LocalBlock {
    surrendered: bool,
    /// Its addresses ([`block_addrs`]).
    range: (u128, u128),
}

struct Agent {
    node: usize,
    // Durable (survives a crash, as SQLite would).
    blocks: BTreeMap<IpNet, LocalBlock>,
    allocated: BTreeMap<u128, u64>,
    // Volatile.
    up: bool,
    down_until: u64,
    cursor: usize,
    lag: u64,
    owned_seen: BTreeSet<IpNet>,
    releases_seen: BTreeMap<IpNet, (i64, ReleaseRecord)>,
    answered: BTreeSet<(IpNet, i64)>,
    pending: VecDeque<(u64, u64)>,
    last_written: Option<FamilyDemand>,
    last_write_ms: Option<u64>,
    changed_since: Option<u64>,
    // The simulation's bookkeeping.
    deficit_since: Option<u64>,
    restarted_ms: u64,
}

impl Agent {
    fn new(node: usize) -> Agent {
        Agent {
            node,
            blocks: BTreeMap::new(),
            allocated: BTreeMap::new(),
            up: true,
            down_until: 0,
            cursor: 0,
            lag: 0,
            owned_seen: BTreeSet::new(),
            releases_seen: BTreeMap::new(),
            answered: BTreeSet::new(),
            pending: VecDeque::new(),
            last_written: None,
            last_write_ms: None,
            changed_since: None,
            deficit_since: None,
            restarted_ms: 0,
        }
    }

    fn used_in(&self, cidr: &IpNet) -> usize {
        let (first, last) = self
            .blocks
            .get(cidr)
            .map_or_else(|| block_addrs(cidr), |b| b.range);
        self.allocated.range(first..=last).count()
    }

    fn active_capacity(&self, block_size: u64) -> u64 {
        self.blocks.values().filter(|b| !b.surrendered).count() as u64 * block_size
    }

    fn demand(&self, block_size: u64) -> FamilyDemand {
        let used = self.allocated.len() as u64;
        let active: Vec<&IpNet> = self
            .blocks
            .iter()
            .filter(|(_, b)| !b.surrendered)
            .map(|(c, _)| c)
            .collect();
        let empty = active
            .iter()
            .rev()
            .filter(|c| {
                let (first, last) = self.blocks[**c].range;
                self.allocated.range(first..=last).next().is_none()
            })
            .take(FamilyDemand::MAX_EMPTY)
            .map(|c| **c)
            .collect();
        FamilyDemand {
            used,
            free: (active.len() as u64 * block_size).saturating_sub(used),
            pending: self.pending.len() as u64,
            blocks: active.len() as u64,
            empty,
        }
    }

    /// A free address of a block not surrendered: the lowest, or (`spread`) the lowest of a
    /// random block with room (an allocator that does not pack keeps some blocks from
    /// emptying, and races the leader's marks).
    fn free_addr(&self, spread: Option<u64>) -> Option<u128> {
        let open: Vec<u128> = self
            .blocks
            .values()
            .filter(|b| !b.surrendered)
            .filter_map(|b| (b.range.0..=b.range.1).find(|a| !self.allocated.contains_key(a)))
            .collect();
        match spread {
            Some(r) if !open.is_empty() => Some(open[(r % open.len() as u64) as usize]),
            _ => open.first().copied(),
        }
    }
}

/// Applies the events of log entry `index` to the agent's picture of its keys: all of them,
/// or (`releases`) only its release keys or only its grants (`owned/` keys).
fn apply_events(w: &World, agent: &mut Agent, index: usize, releases: Option<bool>) {
    let rev = &w.store.log[index];
    let name = &w.names[agent.node];
    for event in &rev.events {
        let key = match event {
            Event::Put { key, .. } | Event::Delete { key } => key,
        };
        match (w.keys.parse(key), event) {
            (Ok(Key::Owned { node, cidr, .. }), _) if &node == name && releases != Some(true) => {
                if matches!(event, Event::Put { .. }) {
                    agent.owned_seen.insert(cidr);
                } else {
                    agent.owned_seen.remove(&cidr);
                }
            }
            (Ok(Key::Release { node, cidr, .. }), Event::Put { value, .. })
                if &node == name && releases != Some(false) =>
            {
                if let Ok(record) = decode_value::<ReleaseRecord>(value) {
                    agent.releases_seen.insert(cidr, (rev.revision, record));
                }
            }
            (Ok(Key::Release { node, cidr, .. }), Event::Delete { .. })
                if &node == name && releases != Some(false) =>
            {
                agent.releases_seen.remove(&cidr);
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// The operator.

struct Leader {
    election_key: String,
    election_rev: i64,
    view: ClusterView,
    /// Next log index to apply.
    cursor: usize,
    lag: u64,
    grant_revs: BTreeMap<IpNet, i64>,
    /// First sight of each grant (block, create revision): the leader's own clock.
    seen: BTreeMap<(IpNet, i64), u64>,
    excess_since: Vec<Option<u64>>,
    dirty: BTreeSet<usize>,
    last_full: Option<u64>,
    /// Nodes whose last txn was refused or lost: planned again once the watch passed the
    /// revision then current (a stale cache refused again would only conflict again).
    retry: BTreeMap<usize, i64>,
    /// Blocks of grants whose answer was lost, not chosen again before the watch passes the
    /// revision then current.
    doubtful: Vec<(IpNet, i64)>,
    /// Deposed: acts until then, not knowing.
    acts_until: Option<u64>,
}

impl Leader {
    fn observe_put(&mut self, w: &World, key: &str, value: &[u8], create: i64, modified: i64) {
        self.view.apply_put(key, value, create, modified);
        match w.keys.parse(key) {
            Ok(Key::Grant { cidr, .. }) => {
                self.grant_revs.insert(cidr, create);
            }
            Ok(Key::Owned { node, .. } | Key::Demand { node, .. } | Key::Release { node, .. }) => {
                if let Some(n) = w.index.get(&node) {
                    self.dirty.insert(*n);
                }
            }
            _ => {}
        }
    }

    fn observe_delete(&mut self, w: &World, key: &str, revision: i64) {
        self.view.apply_delete(key, revision);
        match w.keys.parse(key) {
            Ok(Key::Grant { cidr, .. }) => {
                if let Some(create) = self.grant_revs.remove(&cidr) {
                    self.seen.remove(&(cidr, create));
                }
            }
            Ok(Key::Owned { node, .. } | Key::Demand { node, .. } | Key::Release { node, .. }) => {
                if let Some(n) = w.index.get(&node) {
                    self.dirty.insert(*n);
                }
            }
            _ => {}
        }
    }

    /// Takes over: a full read at the current revision, then a watch from there.
    fn start(w: &mut World) -> Leader {
        let election_key = w.keys.election(w.rng.next() >> 1);
        let rev = w
            .store
            .txn(
                w.now,
                &[Cmp::Absent(election_key.clone())],
                &[Op::Put(election_key.clone(), b"{}".to_vec(), None)],
            )
            .expect("the election key is new");
        let mut leader = Leader {
            election_key,
            election_rev: rev,
            view: ClusterView::new(w.keys.clone(), w.config.clone()),
            cursor: w.store.log.len(),
            lag: 0,
            grant_revs: BTreeMap::new(),
            seen: BTreeMap::new(),
            excess_since: vec![None; NODES],
            dirty: BTreeSet::new(),
            last_full: None,
            retry: BTreeMap::new(),
            doubtful: Vec::new(),
            acts_until: None,
        };
        let entries: Vec<(String, Entry)> = w
            .store
            .kv
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        for (key, e) in entries {
            leader.observe_put(w, &key, &e.value, e.create, e.modified);
        }
        leader
    }

    fn fence(&self) -> Cmp {
        Cmp::CreatedAt(self.election_key.clone(), self.election_rev)
    }

    fn catch_up(&mut self, w: &World) {
        let horizon = w.now.saturating_sub(self.lag);
        while let Some(rev) = w.store.log.get(self.cursor) {
            if rev.at_ms > horizon {
                break;
            }
            for event in &rev.events {
                match event {
                    Event::Put { key, value, create } => {
                        self.observe_put(w, key, value, *create, rev.revision);
                    }
                    Event::Delete { key } => self.observe_delete(w, key, rev.revision),
                }
            }
            self.cursor += 1;
        }
    }

    /// Applies what its own committed txn wrote, at once (as `ClusterView::commit` does).
    fn apply_own(&mut self, w: &World, ops: &[Op], rev: i64) {
        for op in ops {
            match op {
                Op::Put(key, value, _) => self.observe_put(w, key, value, rev, rev),
                Op::Delete(key) => self.observe_delete(w, key, rev),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The auditor: the store's history, revision by revision.

#[derive(Default)]
struct Auditor {
    cursor: usize,
    /// Granted blocks: node, create revision, when.
    grants: BTreeMap<IpNet, (usize, i64, u64)>,
    quarantined: BTreeSet<IpNet>,
    releases: BTreeMap<IpNet, ReleaseState>,
    /// Per node: times of grants and releases.
    history: Vec<Vec<(u64, bool)>>,
}

struct Sim {
    w: World,
    agents: Vec<Agent>,
    leaders: Vec<Leader>,
    auditor: Auditor,
    next_failover: u64,
    leaderless_until: Option<u64>,
    weights: Vec<u64>,
    next_reweight: u64,
    /// The agent watches its release keys and its grants apart, and handles a release key's
    /// deletion before its grant's (the protocol forbids this; a test shows why).
    split_watches: bool,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let keys = Keys::new(ClusterName::new("churn").unwrap());
        let config = ClusterConfig::from_toml(CONFIG).unwrap();
        let pool = config.pools[0].name.clone();
        let names: Vec<NodeName> = (0..NODES)
            .map(|i| NodeName::new(&format!("node-{i}")).unwrap())
            .collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        let probe: IpNet = "10.64.0.0/28".parse().unwrap();
        let (first, last) = block_addrs(&probe);
        let block_size = block_capacity(probe);
        assert_eq!(block_size as u128, last - first + 1, "block_range's size");
        let watermarks = names
            .iter()
            .map(|n| config.pools[0].blocks().unwrap().watermarks_for(n.as_str()))
            .collect();
        let mut w = World {
            rng: Rng(seed),
            watermarks,
            now: 0,
            store: Store::new(keys.clone()),
            keys,
            config,
            pool,
            block_size,
            names,
            index,
            pods: BTreeMap::new(),
            ends: BinaryHeap::new(),
            next_pod: 0,
            addrs: BTreeMap::new(),
            figures: Figures::default(),
            full_at: None,
            windows: Vec::new(),
            last_release: vec![None; NODES],
        };
        let config_json = w.config.to_json().unwrap().into_bytes();
        let config_key = w.keys.config();
        w.store
            .txn(0, &[], &[Op::Put(config_key, config_json, None)]);
        for (i, name) in w.names.clone().iter().enumerate() {
            let key = w.keys.node(name);
            let record = node_record(format!("uid-{i}"));
            w.store.txn(0, &[], &[Op::Put(key, record, None)]);
        }
        let leader = Leader::start(&mut w);
        let weights = (0..NODES).map(|_| 0).collect();
        let mut sim = Sim {
            agents: (0..NODES).map(Agent::new).collect(),
            leaders: vec![leader],
            auditor: Auditor {
                history: vec![Vec::new(); NODES],
                ..Auditor::default()
            },
            next_failover: 0,
            leaderless_until: None,
            weights,
            next_reweight: 0,
            split_watches: false,
            w,
        };
        sim.next_failover = sim.w.rng.between(40_000, 120_000);
        sim
    }

    fn run(&mut self, until_ms: u64) {
        while self.w.now < until_ms {
            self.w.now += TICK_MS;
            self.tick();
        }
    }

    fn tick(&mut self) {
        let now = self.w.now;
        if now >= self.next_reweight {
            // Hot, normal and quiet nodes, reshuffled every two minutes.
            for weight in &mut self.weights {
                *weight = [1, 5, 5, 15][self.w.rng.below(4) as usize];
            }
            self.next_reweight = now + 120_000;
        }
        self.w.store.expire(now);
        self.audit();
        self.faults();
        // Watch lags are re-drawn now and then (each observer stays in order).
        for agent in &mut self.agents {
            if self.w.rng.chance(0.02) {
                agent.lag = self.w.rng.lag();
            }
        }
        for leader in &mut self.leaders {
            if self.w.rng.chance(0.02) {
                leader.lag = self.w.rng.lag();
            }
        }
        self.pods_come_and_go();
        for i in 0..NODES {
            self.agent_tick(i);
            self.audit();
        }
        for li in 0..self.leaders.len() {
            self.leader_tick(li);
        }
        self.leaders
            .retain(|l| l.acts_until.is_none_or(|until| until > now));
        self.track_deficits();
        if now.is_multiple_of(5_000) {
            self.check_pods();
        }
        if now.is_multiple_of(30_000) {
            self.check_store();
        }
    }

    fn faults(&mut self) {
        let now = self.w.now;
        // Leader failover: the lease of the leader's key runs out; a standby takes over after
        // a gap, the deposed one keeps acting a while.
        if now >= self.next_failover {
            self.w.figures.failovers += 1;
            let gap = self.w.rng.between(1_000, 6_000);
            if let Some(current) = self.leaders.iter_mut().find(|l| l.acts_until.is_none()) {
                current.acts_until = Some(now + gap + 3_000);
                let key = current.election_key.clone();
                self.w.store.txn(now, &[], &[Op::Delete(key)]);
            }
            self.leaderless_until = Some(now + gap);
            self.w.windows.push((now, now + gap + TAKEOVER_MS));
            self.next_failover = now + self.w.rng.between(40_000, 120_000);
        }
        if self.leaderless_until.is_some_and(|t| t <= now) {
            self.leaderless_until = None;
            let mut leader = Leader::start(&mut self.w);
            leader.lag = self.w.rng.lag();
            self.leaders.push(leader);
        }
        // Agent crashes: about one every 5 s across the cluster, down 1–10 s.
        if self.w.rng.chance(TICK_MS as f64 / 5_000.0) {
            let n = self.w.rng.below(NODES as u64) as usize;
            if self.agents[n].up {
                let down = self.w.rng.between(1_000, 10_000);
                self.crash(n, down);
            }
        }
        for n in 0..NODES {
            let agent = &self.agents[n];
            if !agent.up && agent.down_until <= now {
                self.restart(n);
            }
        }
    }

    fn crash(&mut self, n: usize, down_ms: u64) {
        let now = self.w.now;
        self.w.figures.agent_crashes += 1;
        let agent = &mut self.agents[n];
        agent.up = false;
        agent.down_until = now + down_ms;
        // ADDs waiting fail (kubelet retries them elsewhere).
        for (pod, _) in agent.pending.drain(..) {
            self.w.pods.remove(&pod);
            self.w.figures.adds_lost_in_crash += 1;
        }
        agent.owned_seen.clear();
        agent.releases_seen.clear();
        agent.answered.clear();
        agent.last_written = None;
        agent.last_write_ms = None;
        agent.changed_since = None;
        agent.deficit_since = None;
    }

    /// A restart: the node's keys read at the current revision, then a watch from there.
    fn restart(&mut self, n: usize) {
        let w = &mut self.w;
        let agent = &mut self.agents[n];
        agent.up = true;
        agent.restarted_ms = w.now;
        let name = &w.names[n];
        let owned_prefix = w.keys.owned_prefix(name);
        let release_prefix = w.keys.release_of_node_prefix(name);
        for (key, _) in w.store.kv.range(owned_prefix.clone()..) {
            if !key.starts_with(&owned_prefix) {
                break;
            }
            if let Ok(Key::Owned { cidr, .. }) = w.keys.parse(key) {
                agent.owned_seen.insert(cidr);
            }
        }
        for (key, e) in w.store.kv.range(release_prefix.clone()..) {
            if !key.starts_with(&release_prefix) {
                break;
            }
            if let (Ok(Key::Release { cidr, .. }), Ok(record)) =
                (w.keys.parse(key), decode_value::<ReleaseRecord>(&e.value))
            {
                agent.releases_seen.insert(cidr, (e.modified, record));
            }
        }
        agent.cursor = w.store.by_node.get(name).map_or(0, Vec::len);
        self.reconcile(n);
    }

    fn pods_come_and_go(&mut self) {
        let now = self.w.now;
        // Deletions due (a DEL on a down agent waits for it: kubelet retries).
        let mut later = Vec::new();
        while let Some(&Reverse((ends, id))) = self.w.ends.peek() {
            if ends > now {
                break;
            }
            self.w.ends.pop();
            let Some(pod) = self.w.pods.get(&id) else {
                continue;
            };
            let node = pod.node;
            if !self.agents[node].up || pod.addr.is_none() {
                later.push(Reverse((now + TICK_MS, id)));
                continue;
            }
            let pod = self.w.pods.remove(&id).expect("a pod");
            let addr = pod.addr.expect("an address");
            self.agents[node].allocated.remove(&addr);
            self.w.addrs.remove(&addr);
            self.agents[node].changed_since.get_or_insert(now);
        }
        self.w.ends.extend(later);
        // Now and then a deployment scales up on one node, or down.
        let mut burst = None;
        if self.w.rng.chance(TICK_MS as f64 / 8_000.0) {
            let node = self.w.rng.below(NODES as u64) as usize;
            burst = Some((node, self.w.rng.between(10, 25)));
            self.w.figures.bursts += 1;
        }
        if self.w.rng.chance(TICK_MS as f64 / 8_000.0) {
            let node = self.w.rng.below(NODES as u64) as usize;
            let ids: Vec<u64> = self
                .w
                .pods
                .iter()
                .filter(|(_, p)| p.node == node)
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                if self.w.rng.chance(0.7) {
                    self.w.ends.push(Reverse((now, id)));
                }
            }
            self.w.figures.scale_downs += 1;
        }
        let total: u64 = self.weights.iter().sum();
        let picks = (0..PODS_PER_TICK)
            .map(|_| None)
            .chain((0..burst.map_or(0, |(_, k)| k)).map(|_| burst.map(|(n, _)| n)))
            .collect::<Vec<_>>();
        for fixed in picks {
            let mut pick = self.w.rng.below(total);
            let node = fixed.unwrap_or_else(|| {
                self.weights
                    .iter()
                    .position(|wt| {
                        if pick < *wt {
                            true
                        } else {
                            pick -= wt;
                            false
                        }
                    })
                    .expect("a node")
            });
            self.w.figures.pods_created += 1;
            if !self.agents[node].up {
                self.w.figures.adds_on_down_agents += 1;
                continue;
            }
            let id = self.w.next_pod;
            self.w.next_pod += 1;
            let life = (-POD_LIFETIME_MS * (1.0 - self.w.rng.unit()).ln()) as u64;
            let ends_ms = now + life.max(TICK_MS);
            self.w.pods.insert(id, Pod { node, addr: None });
            self.w.ends.push(Reverse((ends_ms, id)));
            self.agents[node].pending.push_back((id, now + PENDING_MS));
            self.agents[node].changed_since.get_or_insert(now);
        }
    }

    fn agent_tick(&mut self, n: usize) {
        if !self.agents[n].up {
            return;
        }
        self.deliver(n);
        self.serve_adds(n);
        self.write_demand(n);
    }

    /// The node's watch: whole revisions, in order, late by the agent's lag. A revision is
    /// handled whole before the next: the completion txn deletes the grant and the release
    /// key together, and seen apart the agent would take back a released block.
    fn deliver(&mut self, n: usize) {
        while self.agents[n].up {
            let w = &self.w;
            let agent = &self.agents[n];
            let Some(&i) = w
                .store
                .by_node
                .get(&w.names[n])
                .and_then(|l| l.get(agent.cursor))
            else {
                return;
            };
            if w.store.log[i].at_ms > w.now.saturating_sub(agent.lag) {
                return;
            }
            if self.split_watches {
                // The hazard: release keys and grants on two watches, a release key's deletion
                // seen before its grant's.
                apply_events(&self.w, &mut self.agents[n], i, Some(true));
                self.reconcile(n);
                if !self.agents[n].up {
                    return;
                }
                apply_events(&self.w, &mut self.agents[n], i, Some(false));
            } else {
                apply_events(&self.w, &mut self.agents[n], i, None);
            }
            self.agents[n].cursor += 1;
            self.reconcile(n);
        }
    }

    /// The agent's reaction to what it has seen of its keys.
    fn reconcile(&mut self, n: usize) {
        let now = self.w.now;
        let name = self.w.names[n].clone();
        let agent = &mut self.agents[n];
        // New grants are recorded durably.
        for cidr in &agent.owned_seen {
            if !agent.blocks.contains_key(cidr) {
                agent.blocks.insert(
                    *cidr,
                    LocalBlock {
                        surrendered: false,
                        range: block_addrs(cidr),
                    },
                );
                agent.changed_since.get_or_insert(now);
            }
        }
        // Grants gone: forget the block (only a surrendered one may go).
        let gone: Vec<IpNet> = agent
            .blocks
            .keys()
            .filter(|c| !agent.owned_seen.contains(c))
            .copied()
            .collect();
        for cidr in gone {
            let block = agent.blocks.remove(&cidr).expect("a block");
            assert!(
                block.surrendered,
                "{name} lost {cidr} without surrendering it"
            );
            assert_eq!(agent.used_in(&cidr), 0, "{name} lost {cidr} holding pods");
            agent.changed_since.get_or_insert(now);
        }
        // Take back a surrendered block whose release key is gone while its grant lasts.
        for (cidr, block) in agent.blocks.iter_mut() {
            if block.surrendered && !agent.releases_seen.contains_key(cidr) {
                block.surrendered = false;
                self.w.figures.takebacks += 1;
                agent.changed_since.get_or_insert(now);
            }
        }
        // Answer marks (again after a restart: `answered` is volatile).
        let marks: Vec<(IpNet, i64, ReleaseRecord)> = agent
            .releases_seen
            .iter()
            .filter(|(c, (modrev, r))| {
                r.state == ReleaseState::Marked && !agent.answered.contains(&(**c, *modrev))
            })
            .map(|(c, (m, r))| (*c, *m, r.clone()))
            .collect();
        for (cidr, modrev, record) in marks {
            let agent = &mut self.agents[n];
            agent.answered.insert((cidr, modrev));
            let empty = agent.used_in(&cidr) == 0;
            let (state, reason) = match agent.blocks.get_mut(&cidr) {
                Some(block) if block.surrendered || empty => {
                    // One local transaction: the block leaves the pool.
                    if !block.surrendered {
                        block.surrendered = true;
                        agent.changed_since.get_or_insert(now);
                    }
                    (ReleaseState::Ready, None)
                }
                Some(_) => (ReleaseState::Refused, Some("in use".to_owned())),
                None => (ReleaseState::Refused, Some("not held".to_owned())),
            };
            if state == ReleaseState::Ready && self.w.rng.chance(0.05) {
                // Crashed between the local surrender and the answer.
                self.w.figures.crashes_after_surrender += 1;
                let down = self.w.rng.between(500, 5_000);
                self.crash(n, down);
                return;
            }
            let key = self.w.keys.release(&name, &self.w.pool, Family::V4, &cidr);
            let answer = ReleaseRecord {
                state,
                answered_ms: now,
                reason,
                ..record
            };
            let outcome = self.w.txn(
                &[Cmp::ModifiedAt(key.clone(), modrev)],
                &[Op::Put(key, encode_value(&answer).unwrap(), None)],
            );
            if state == ReleaseState::Refused && outcome != Outcome::Refused {
                self.w.figures.refusals += 1;
            }
        }
    }

    fn serve_adds(&mut self, n: usize) {
        let now = self.w.now;
        loop {
            let Some(&(pod, deadline)) = self.agents[n].pending.front() else {
                return;
            };
            if !self.w.pods.contains_key(&pod) {
                self.agents[n].pending.pop_front();
                continue;
            }
            let spread = self.w.rng.chance(0.3).then(|| self.w.rng.next());
            match self.agents[n].free_addr(spread) {
                Some(addr) => {
                    self.agents[n].pending.pop_front();
                    self.allocate(n, pod, addr);
                }
                None if deadline <= now => {
                    self.agents[n].pending.pop_front();
                    self.w.pods.remove(&pod);
                    let start = deadline - PENDING_MS;
                    if self.at_capacity(n) {
                        self.w.figures.adds_failed_at_capacity += 1;
                    } else if self.w.in_window(start, now)
                        || self.agents[n].restarted_ms >= start
                        || self.w.full_at.is_some_and(|t| t >= start)
                    {
                        self.w.figures.adds_failed_waiting_excluded += 1;
                    } else {
                        self.w.figures.adds_failed_waiting += 1;
                        let a = &self.agents[n];
                        eprintln!(
                            "DEBUG node-{n} ADD from {start} failed at {now}: agent lag {} \
                             last write {:?} written {:?} changed {:?} blocks {:?} history {:?} \
                             leader lags {:?}",
                            a.lag,
                            a.last_write_ms,
                            a.last_written,
                            a.changed_since,
                            a.blocks,
                            &self.auditor.history[n],
                            self.leaders
                                .iter()
                                .map(|l| (l.lag, l.acts_until, l.cursor))
                                .collect::<Vec<_>>()
                        );
                    }
                }
                None => return,
            }
        }
    }

    fn allocate(&mut self, n: usize, pod: u64, addr: u128) {
        let w = &mut self.w;
        let name = &w.names[n];
        let cidr = block_of(addr);
        if let Some(other) = w.addrs.get(&addr) {
            panic!("{addr:x} given to pod {pod} on {name} is held by pod {other}");
        }
        let grant = w.store.kv.get(&w.keys.grant(&w.pool, Family::V4, &cidr));
        let holder = grant.and_then(|e| decode_value::<GrantRecord>(&e.value).ok());
        assert_eq!(
            holder.map(|g| g.node).as_ref(),
            Some(name),
            "{name} allocates from {cidr}, not granted to it"
        );
        let release = w
            .store
            .kv
            .get(&w.keys.release(name, &w.pool, Family::V4, &cidr))
            .and_then(|e| decode_value::<ReleaseRecord>(&e.value).ok());
        assert!(
            release.is_none_or(|r| r.state != ReleaseState::Ready),
            "{name} allocates from {cidr}, which it surrendered"
        );
        w.addrs.insert(addr, pod);
        w.pods.get_mut(&pod).expect("the pod").addr = Some(addr);
        self.agents[n].allocated.insert(addr, pod);
        self.agents[n].changed_since.get_or_insert(w.now);
    }

    /// Demand: at most one put a second, only on change, coalesced for a second unless free
    /// fell below pre-allocate or ADDs wait.
    fn write_demand(&mut self, n: usize) {
        let now = self.w.now;
        let pre = self.w.watermarks(n).pre_allocate;
        let agent = &self.agents[n];
        let Some(since) = agent.changed_since else {
            return;
        };
        if agent.last_write_ms.is_some_and(|t| now < t + 1_000) {
            return;
        }
        let free = agent
            .active_capacity(self.w.block_size)
            .saturating_sub(agent.allocated.len() as u64);
        let urgent = free < pre || !agent.pending.is_empty();
        if !urgent && now < since + 1_000 {
            return;
        }
        let demand = agent.demand(self.w.block_size);
        if agent.last_written.as_ref() == Some(&demand) {
            self.agents[n].changed_since = None;
            return;
        }
        let record = DemandRecord {
            ipv4: Some(demand.clone()),
            ipv6: None,
            at_ms: now,
        };
        let key = self.w.keys.demand(&self.w.names[n], &self.w.pool);
        self.w.figures.demand_writes += 1;
        let outcome = self
            .w
            .txn(&[], &[Op::Put(key, encode_value(&record).unwrap(), None)]);
        let agent = &mut self.agents[n];
        agent.last_write_ms = Some(now);
        if let Outcome::Committed(_) = outcome {
            agent.last_written = Some(demand);
            agent.changed_since = None;
        }
    }

    fn leader_tick(&mut self, li: usize) {
        let now = self.w.now;
        let mut leader = std::mem::replace(
            &mut self.leaders[li],
            Leader {
                election_key: String::new(),
                election_rev: 0,
                view: ClusterView::new(self.w.keys.clone(), self.w.config.clone()),
                cursor: 0,
                lag: 0,
                grant_revs: BTreeMap::new(),
                seen: BTreeMap::new(),
                excess_since: Vec::new(),
                dirty: BTreeSet::new(),
                last_full: None,
                retry: BTreeMap::new(),
                doubtful: Vec::new(),
                acts_until: None,
            },
        );
        leader.catch_up(&self.w);
        // Every node every 2 s (the release clocks), else those whose keys changed.
        let applied = leader.cursor as i64;
        leader.doubtful.retain(|(_, rev)| *rev > applied);
        let nodes: Vec<usize> = if leader.last_full.is_none_or(|t| now >= t + 2_000) {
            leader.last_full = Some(now);
            (0..NODES).collect()
        } else {
            let due: Vec<usize> = leader
                .retry
                .iter()
                .filter(|(_, rev)| **rev <= applied)
                .map(|(n, _)| *n)
                .collect();
            leader.dirty.iter().chain(&due).copied().collect()
        };
        leader.dirty.clear();
        leader.retry.retain(|_, rev| *rev > applied);
        let nodes: Vec<usize> = nodes
            .into_iter()
            .filter(|n| !leader.retry.contains_key(n))
            .collect();
        for n in nodes {
            self.leader_node(&mut leader, n);
            self.audit();
        }
        self.leaders[li] = leader;
    }

    /// One fenced txn of the leader for node `n`; what it wrote is applied to its cache at
    /// once; a node whose txn was refused or lost waits for the watch to pass the revision.
    fn leader_txn(
        &mut self,
        leader: &mut Leader,
        n: usize,
        kind: &'static str,
        cmps: &[Cmp],
        ops: &[Op],
    ) -> Outcome {
        let fenced = !self.w.store.holds(&leader.fence());
        let mut all = cmps.to_vec();
        all.push(leader.fence());
        let outcome = self.w.txn(&all, ops);
        match outcome {
            Outcome::Committed(rev) => {
                assert!(!fenced, "a deposed leader's txn went through");
                leader.apply_own(&self.w, ops, rev);
            }
            Outcome::Refused if fenced => self.w.figures.fenced_txns += 1,
            Outcome::Refused => {
                if std::env::var("CHURN_DEBUG").is_ok() {
                    let failed: Vec<&Cmp> =
                        cmps.iter().filter(|c| !self.w.store.holds(c)).collect();
                    eprintln!("DEBUG {} {kind} node-{n} refused: {failed:?}", self.w.now);
                }
                *self.w.figures.refused_txns.entry(kind).or_default() += 1;
                leader.retry.insert(n, self.w.store.revision);
            }
            Outcome::Unknown => {
                self.w.figures.unknown_txns += 1;
                leader.retry.insert(n, self.w.store.revision);
            }
        }
        outcome
    }

    /// One node: its input from the leader's cache, the plan, the plan's txns.
    fn leader_node(&mut self, leader: &mut Leader, n: usize) {
        let now = self.w.now;
        let name = self.w.names[n].clone();
        let pool = self.w.pool.clone();
        let keys = self.w.keys.clone();
        let Some(registration) = leader.view.registration(&name).cloned() else {
            return;
        };
        let mut held = Vec::new();
        let mut modrevs = BTreeMap::new();
        for grant in leader.view.grants_of(&name) {
            if grant.pool != pool || grant.family != Family::V4 {
                continue;
            }
            let Some(&create) = leader.grant_revs.get(&grant.cidr) else {
                continue;
            };
            let seen_ms = *leader.seen.entry((grant.cidr, create)).or_insert(now);
            let release = leader
                .view
                .releases_of(&name)
                .find(|((_, p, f, c), _)| *p == pool && *f == Family::V4 && *c == grant.cidr)
                .map(|(_, (modrev, record))| (*modrev, record.clone()));
            let release = match release {
                Some((modrev, record)) if record.grant_revision == create => {
                    modrevs.insert(grant.cidr, (modrev, create));
                    Some((record.state, record.marked_ms))
                }
                Some((_, record)) => panic!(
                    "{name}: release of {} names grant revision {}, the grant is {create}",
                    grant.cidr, record.grant_revision
                ),
                None => None,
            };
            held.push(HeldBlock {
                cidr: grant.cidr,
                size: block_capacity(grant.cidr),
                seen_ms,
                release,
            });
        }
        for block in &held {
            modrevs
                .entry(block.cidr)
                .or_insert((0, leader.grant_revs[&block.cidr]));
        }
        let demand = leader
            .view
            .demand(&name, &pool)
            .and_then(|d| d.family(Family::V4))
            .cloned();
        let watermarks = self.w.watermarks(n);
        let input = BlockInput {
            watermarks,
            block_size: self.w.block_size,
            blocks: &held,
            demand: demand.as_ref(),
            excess_since_ms: leader.excess_since[n],
            now_ms: now,
            release_delay_ms: self.w.release_delay_ms(),
        };
        let plan = blocks::plan(&input);
        leader.excess_since[n] = plan.excess_since_ms;
        let release_key = |cidr: &IpNet| keys.release(&name, &pool, Family::V4, cidr);
        for cidr in plan.forget.iter().chain(&plan.unmark) {
            let (modrev, _) = modrevs[cidr];
            let unmark = plan.unmark.contains(cidr);
            let ok = matches!(
                self.leader_txn(
                    leader,
                    n,
                    if unmark { "unmark" } else { "forget" },
                    &[Cmp::ModifiedAt(release_key(cidr), modrev)],
                    &[Op::Delete(release_key(cidr))],
                ),
                Outcome::Committed(_)
            );
            if ok && unmark {
                self.w.figures.unmarks += 1;
            } else if ok {
                self.w.figures.forgets += 1;
            }
        }
        for cidr in &plan.complete {
            let (modrev, create) = modrevs[cidr];
            let ttl = self.w.config.quarantine_secs * 1_000;
            let lease = self.w.store.grant_lease(now, ttl);
            let quarantine = QuarantineRecord {
                from_node: name.clone(),
                reason: "released".into(),
                since_ms: now,
                state: Default::default(),
            };
            let grant_key = keys.grant(&pool, Family::V4, cidr);
            let ops = [
                Op::Delete(grant_key.clone()),
                Op::Delete(keys.owned(&name, &pool, Family::V4, cidr)),
                Op::Delete(release_key(cidr)),
                Op::Put(
                    keys.quarantine(&pool, Family::V4, cidr),
                    encode_value(&quarantine).unwrap(),
                    Some(lease),
                ),
            ];
            let cmps = [
                Cmp::ModifiedAt(release_key(cidr), modrev),
                Cmp::CreatedAt(grant_key, create),
            ];
            if let Outcome::Committed(_) = self.leader_txn(leader, n, "complete", &cmps, &ops) {
                let used = demand.as_ref().map_or(0, |d| d.used);
                self.w.last_release[n] = Some((now, used));
            }
        }
        for cidr in &plan.mark {
            let (_, create) = modrevs[cidr];
            let record = ReleaseRecord {
                state: ReleaseState::Marked,
                grant_revision: create,
                marked_ms: now,
                answered_ms: 0,
                reason: None,
            };
            let cmps = [
                Cmp::Absent(release_key(cidr)),
                Cmp::CreatedAt(keys.grant(&pool, Family::V4, cidr), create),
            ];
            let ops = [Op::Put(
                release_key(cidr),
                encode_value(&record).unwrap(),
                None,
            )];
            if let Outcome::Committed(_) = self.leader_txn(leader, n, "mark", &cmps, &ops) {
                self.w.figures.marks += 1;
            }
        }
        if plan.grant > 0 {
            let Some(mut space) = leader.view.space(&pool, Family::V4).cloned() else {
                panic!("the pool's space");
            };
            let mut chosen = Vec::new();
            while (chosen.len() as u64) < plan.grant.min(25) {
                let Some(cidr) = space.lowest_free() else {
                    self.w.figures.pool_full += 1;
                    self.w.full_at = Some(now);
                    break;
                };
                space.propose(&cidr).expect("free");
                if !leader.doubtful.iter().any(|(c, _)| *c == cidr) {
                    chosen.push(cidr);
                }
            }
            if chosen.is_empty() {
                return;
            }
            let grant = GrantRecord {
                node: name.clone(),
                uid: registration.record.uid.clone(),
                node_revision: registration.create_revision,
                granted_ms: None,
            };
            let owned = OwnedRecord {
                node_revision: registration.create_revision,
            };
            let mut cmps = vec![
                Cmp::CreatedAt(keys.node(&name), registration.create_revision),
                Cmp::ModifiedAt(keys.config(), leader.view.config_revision()),
            ];
            let mut ops = Vec::new();
            for cidr in &chosen {
                cmps.push(Cmp::Absent(keys.grant(&pool, Family::V4, cidr)));
                cmps.push(Cmp::Absent(keys.quarantine(&pool, Family::V4, cidr)));
                ops.push(Op::Put(
                    keys.grant(&pool, Family::V4, cidr),
                    encode_value(&grant).unwrap(),
                    None,
                ));
                ops.push(Op::Put(
                    keys.owned(&name, &pool, Family::V4, cidr),
                    encode_value(&owned).unwrap(),
                    None,
                ));
            }
            let outcome = self.leader_txn(leader, n, "grant", &cmps, &ops);
            if outcome == Outcome::Unknown {
                let revision = self.w.store.revision;
                leader
                    .doubtful
                    .extend(chosen.iter().map(|c| (*c, revision)));
            }
            if let Outcome::Committed(_) = outcome {
                self.w.figures.grant_txns += 1;
                self.w.figures.blocks_granted += chosen.len() as u64;
                let delay = self.w.release_delay_ms();
                if let (Some((at, used_r)), Some(d)) = (self.w.last_release[n], &demand)
                    && now < at + delay
                {
                    // No flap: growing again soon after a release needs demand grown by
                    // more than max-above-watermark.
                    self.w.figures.regrants += 1;
                    if std::env::var("CHURN_DEBUG").is_ok() {
                        eprintln!("DEBUG regrant {name} released {at} granted {now}");
                    }
                    let growth = (d.used + d.pending) as i64 - used_r as i64;
                    let f = &mut self.w.figures;
                    f.min_regrant_growth =
                        Some(f.min_regrant_growth.map_or(growth, |g| g.min(growth)));
                    assert!(
                        growth > watermarks.max_above_watermark as i64,
                        "{name} flaps: released at {at} ms with {used_r} used, grows at {now} ms \
                         with {} used and {} waiting ({input:?})",
                        d.used,
                        d.pending
                    );
                }
            }
        }
    }

    /// Follows the store's log and checks each revision.
    fn audit(&mut self) {
        let delay = self.w.release_delay_ms();
        while let Some(rev) = self.w.store.log.get(self.auditor.cursor) {
            self.auditor.cursor += 1;
            let a = &mut self.auditor;
            let mut released = Vec::new();
            for event in &rev.events {
                match event {
                    Event::Put { key, value, create } => match self.w.keys.parse(key) {
                        Ok(Key::Grant { cidr, .. }) => {
                            assert_eq!(cidr.prefix_len(), 28, "{cidr} is not a block");
                            assert_eq!(cidr.trunc(), cidr, "{cidr} is not aligned");
                            assert!(
                                "10.64.0.0/19".parse::<IpNet>().unwrap().contains(&cidr),
                                "{cidr} is outside the pool"
                            );
                            assert_eq!(*create, rev.revision, "a grant is never overwritten");
                            let record: GrantRecord = decode_value(value).unwrap();
                            let node = self.w.index[&record.node];
                            if std::env::var("CHURN_DEBUG").is_ok()
                                && let Some((t, false)) = a.history[node].last()
                                && rev.at_ms < t + 60_000
                            {
                                eprintln!(
                                    "DEBUG cycle node-{node} released {t} granted {}",
                                    rev.at_ms
                                );
                            }
                            a.grants.insert(cidr, (node, *create, rev.at_ms));
                            a.history[node].push((rev.at_ms, true));
                        }
                        Ok(Key::Quarantine { cidr, .. }) => {
                            a.quarantined.insert(cidr);
                        }
                        Ok(Key::Release { cidr, .. }) => {
                            let record: ReleaseRecord = decode_value(value).unwrap();
                            if record.state == ReleaseState::Ready {
                                let (node, ..) = a.grants[&cidr];
                                let block = self.agents[node].blocks.get(&cidr);
                                assert!(
                                    block.is_some_and(|b| b.surrendered),
                                    "{cidr} answered ready, not surrendered"
                                );
                            }
                            a.releases.insert(cidr, record.state);
                        }
                        _ => {}
                    },
                    Event::Delete { key } => match self.w.keys.parse(key) {
                        Ok(Key::Grant { cidr, .. }) => {
                            let (node, _, at) = a.grants.remove(&cidr).expect("a known grant");
                            released.push((cidr, node, at));
                            a.history[node].push((rev.at_ms, false));
                        }
                        Ok(Key::Quarantine { cidr, .. }) => {
                            a.quarantined.remove(&cidr);
                        }
                        Ok(Key::Release { cidr, .. }) => {
                            let state = a.releases.remove(&cidr);
                            if released.iter().any(|(c, ..)| *c == cidr) {
                                assert_eq!(
                                    state,
                                    Some(ReleaseState::Ready),
                                    "{cidr} released without a ready answer"
                                );
                            }
                        }
                        _ => {}
                    },
                }
            }
            for (cidr, node, at) in released {
                let (first, last) = block_addrs(&cidr);
                let holders: Vec<_> = self.w.addrs.range(first..=last).collect();
                assert!(
                    holders.is_empty(),
                    "{cidr} of node-{node} released holding {holders:?}"
                );
                assert!(
                    self.agents[node]
                        .blocks
                        .get(&cidr)
                        .is_none_or(|b| b.surrendered),
                    "{cidr} released, node-{node} did not surrender it"
                );
                assert!(
                    rev.at_ms >= at + delay,
                    "{cidr} of node-{node} granted at {at} ms, released at {} ms",
                    rev.at_ms
                );
                assert!(
                    !a.releases.contains_key(&cidr),
                    "{cidr}'s release key outlives its grant"
                );
                self.w.figures.releases += 1;
            }
            for event in &rev.events {
                if let Event::Put { key, .. } = event
                    && let Ok(Key::Grant { cidr, .. } | Key::Quarantine { cidr, .. }) =
                        self.w.keys.parse(key)
                {
                    assert!(
                        !(a.grants.contains_key(&cidr) && a.quarantined.contains(&cidr)),
                        "{cidr} granted and quarantined"
                    );
                }
            }
        }
    }

    /// Every pod's address lies in a block granted to its node; every block an agent
    /// allocates from is granted to it.
    fn check_pods(&mut self) {
        for (id, pod) in &self.w.pods {
            let Some(addr) = pod.addr else { continue };
            let cidr = block_of(addr);
            let holder = self.auditor.grants.get(&cidr).map(|g| g.0);
            assert_eq!(
                holder,
                Some(pod.node),
                "pod {id} on node-{} holds {addr:x} in {cidr}, granted to {holder:?}",
                pod.node
            );
        }
        for agent in &self.agents {
            for (cidr, block) in &agent.blocks {
                if !block.surrendered {
                    assert_eq!(
                        self.auditor.grants.get(cidr).map(|g| g.0),
                        Some(agent.node),
                        "node-{} allocates from {cidr}, not granted to it",
                        agent.node
                    );
                }
            }
        }
    }

    /// `corral cluster check` on the store.
    fn check_store(&mut self) {
        let entries: Vec<corral_cluster::Entry> = self
            .w
            .store
            .kv
            .iter()
            .map(|(k, e)| (k.clone(), e.value.clone(), e.create))
            .collect();
        let problems = corral_cluster::check(&self.w.keys, &entries);
        assert!(problems.is_empty(), "cluster check: {problems:?}");
        self.w.figures.checks += 1;
    }

    fn track_deficits(&mut self) {
        let now = self.w.now;
        for n in 0..NODES {
            let pre = self.w.watermarks(n).pre_allocate;
            let agent = &self.agents[n];
            if !agent.up {
                continue;
            }
            let free = agent
                .active_capacity(self.w.block_size)
                .saturating_sub(agent.allocated.len() as u64);
            // At max-allocate a node is refused more by design (`at_capacity`).
            let short = (!agent.pending.is_empty() || free < pre) && !self.at_capacity(n);
            match (short, agent.deficit_since) {
                (true, None) => self.agents[n].deficit_since = Some(now),
                (false, Some(start)) => {
                    self.agents[n].deficit_since = None;
                    self.end_deficit(n, start);
                }
                _ => {}
            }
        }
    }

    /// The node holds as many blocks as its max-allocate allows.
    fn at_capacity(&self, n: usize) -> bool {
        blocks::max_blocks(&self.w.watermarks(n), self.w.block_size)
            .is_some_and(|cap| self.agents[n].blocks.len() as u64 >= cap)
    }

    fn end_deficit(&mut self, n: usize, start: u64) {
        let now = self.w.now;
        let wait = now - start;
        let excluded = self.w.in_window(start, now)
            || self.agents[n].restarted_ms >= start
            || self.w.full_at.is_some_and(|t| t >= start);
        let f = &mut self.w.figures;
        f.deficits += 1;
        if excluded {
            f.max_deficit_excluded_ms = f.max_deficit_excluded_ms.max(wait);
        } else {
            f.max_deficit_ms = f.max_deficit_ms.max(wait);
            assert!(
                wait <= DEFICIT_BOUND_MS,
                "node-{n}'s deficit from {start} ms met after {wait} ms"
            );
        }
    }

    fn report(&self, seed: u64) {
        let f = &self.w.figures;
        let held: Vec<u64> = self
            .agents
            .iter()
            .map(|a| a.active_capacity(self.w.block_size))
            .collect();
        let used: Vec<u64> = self
            .agents
            .iter()
            .map(|a| a.allocated.len() as u64)
            .collect();
        let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
        let cycles = self
            .auditor
            .history
            .iter()
            .map(|h| {
                h.windows(2)
                    .filter(|p| !p[0].1 && p[1].1 && p[1].0 < p[0].0 + 60_000)
                    .count()
            })
            .sum::<usize>();
        eprintln!(
            "seed {seed}: pods {} ({} bursts, {} scale-downs; ADDs failed waiting {} + {} in fault windows + {} at max-allocate, on down agents \
             {}, lost in crashes {}); blocks granted {} in {} txns, released {}; handshakes: \
             marked {}, refused {}, un-marked {}, taken back {}, refusals forgotten {}; \
             regrants within the delay {} (least demand growth {:?}), release→grant cycles \
             within 60 s {}; max deficit wait {} ms ({} ms in fault windows) over {} deficits; \
             txns refused {:?} ({:.3} per granting txn), fenced {}, unknown {}; demand writes {}; \
             failovers {}, agent crashes {} ({} after a surrender); pool full {}; checks {}; \
             at the end per node: held {}..{} (mean {:.1}), used {}..{} (mean {:.1}); blocks \
             granted {}",
            f.pods_created,
            f.bursts,
            f.scale_downs,
            f.adds_failed_waiting,
            f.adds_failed_waiting_excluded,
            f.adds_failed_at_capacity,
            f.adds_on_down_agents,
            f.adds_lost_in_crash,
            f.blocks_granted,
            f.grant_txns,
            f.releases,
            f.marks,
            f.refusals,
            f.unmarks,
            f.takebacks,
            f.forgets,
            f.regrants,
            f.min_regrant_growth,
            cycles,
            f.max_deficit_ms,
            f.max_deficit_excluded_ms,
            f.deficits,
            f.refused_txns,
            f.refused_txns.values().sum::<u64>() as f64 / f.grant_txns.max(1) as f64,
            f.fenced_txns,
            f.unknown_txns,
            f.demand_writes,
            f.failovers,
            f.agent_crashes,
            f.crashes_after_surrender,
            f.pool_full,
            f.checks,
            held.iter().min().unwrap(),
            held.iter().max().unwrap(),
            mean(&held),
            used.iter().min().unwrap(),
            used.iter().max().unwrap(),
            mean(&used),
            self.auditor.grants.len(),
        );
    }
}

/// The seeds of one of the two tests (they run in parallel): `CHURN_SEED=n` runs seed n,
/// `CHURN_SEEDS=k` seeds 1..=k (default 4), each test half of them.
fn seeds(half: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return if half == 0 { vec![seed] } else { vec![] };
    }
    let count = std::env::var("CHURN_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    (1..=count).filter(|s| s % 2 == half).collect()
}

fn run_seeds(half: u64) {
    let mut handshakes_ended_early = 0;
    for seed in seeds(half) {
        eprintln!("seed {seed}");
        let mut sim = Sim::new(seed);
        sim.run(SIM_MS);
        sim.report(seed);
        let f = &sim.w.figures;
        // The simulation did exercise the protocol.
        assert!(
            f.releases > 0 && f.marks > 0 && f.failovers > 0,
            "seed {seed}"
        );
        assert!(f.fenced_txns > 0 && f.crashes_after_surrender + f.agent_crashes > 0);
        handshakes_ended_early += f.refusals + f.unmarks;
        assert_eq!(f.adds_failed_waiting, 0, "seed {seed}: ADDs failed waiting");
    }
    assert!(
        handshakes_ended_early > 0 || seeds(half).is_empty(),
        "no handshake was refused or un-marked"
    );
}

#[test]
fn block_mode_survives_churn_with_faults_even_seeds() {
    run_seeds(0);
}

#[test]
fn block_mode_survives_churn_with_faults_odd_seeds() {
    run_seeds(1);
}

/// Why an agent must see the completion txn whole: had it handled the deletion of a release
/// key before the deletion of the grant (two watches, one per prefix), it would take the
/// released block back as if un-marked and allocate from a block in quarantine. The
/// simulation catches that at the first release.
#[test]
#[should_panic(expected = "without surrendering it")]
fn an_agent_that_sees_the_release_key_go_before_the_grant_takes_back_a_released_block() {
    let mut sim = Sim::new(1);
    sim.split_watches = true;
    // Blocks are released from about 70 s on (the release delay after the first excess).
    sim.run(SIM_MS / 2);
}
