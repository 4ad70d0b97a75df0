//! The nemesis run of issue 20: 3 etcd members, 2 operators, 4 agents and a client allocating
//! and releasing pods, while a seeded nemesis picks faults for about three minutes; after every
//! step the independent check of corral's one promise runs (no address on two agents, no two
//! grants overlapping, every pod address clear of other nodes' grants).
//!
//! The seed is printed. `NEMESIS_SEED=n` runs one seed, `NEMESIS_SECS=n` sets the length; by
//! default every seed of `tests/nemesis.seeds` runs (a failing seed is kept there as a
//! regression case). The history (faults and allocations with their times) is written to
//! `target/nemesis/seed-<n>.log`, which a failing run leaves behind.
//!
//! `NEMESIS_NODES=n` registers `n` more nodes (no agent: their registrations, granted by the
//! operators) before the run, in a pool wide enough, so the faults, failovers, restores, every
//! step's independent check and the closing `cluster check` happen at that size
//! (`NEMESIS_NODES=30000`: issue 25); the summary line gives the checks' times.
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_api::{AllocateRequest, FamilyChoice, ReleaseRequest};
use corral_client::Client;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cluster_common;
use crate::common;

use cluster_common::*;

const CONFIG: &str = include_str!("configs/nemesis.toml");

/// The pool when `NEMESIS_NODES` adds nodes: /26s of 10.0.0.0/8, enough for 262,144.
const SCALE_CONFIG: &str = include_str!("configs/nemesis_scale.toml");

/// Nodes registered beside the agents' (`NEMESIS_NODES`; none by default).
fn extra_nodes() -> usize {
    std::env::var("NEMESIS_NODES")
        .ok()
        .map_or(0, |n| n.parse().expect("NEMESIS_NODES is a number"))
}

/// Registers `n` nodes as their agents would (`bg-<i>`), 100 per transaction.
fn register_background(etcd: &corral_etcd::testing::EtcdCluster, n: usize) {
    use corral_kv::{Kv, Txn, TxnOp};
    let kv = kv(etcd);
    let keys = corral_cluster::Keys::new(corral_cluster::ClusterName::new("t").unwrap());
    block_on(async {
        for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
            let mut txn = Txn::default();
            for i in chunk {
                let node = corral_cluster::NodeName::new(&format!("bg-{i}")).unwrap();
                let record = corral_cluster::NodeRecord {
                    uid: format!("uid-bg-{i}"),
                    addresses: Vec::new(),
                    registered_ms: 0,
                    instance_id: None,
                    max_pods: None,
                };
                txn.success.push(TxnOp::put(
                    keys.node(&node),
                    corral_cluster::encode_value(&record).unwrap(),
                ));
            }
            kv.txn(txn).await.unwrap();
        }
    });
}

const AGENTS: usize = 4;
const OPERATORS: usize = 2;

/// What happened, with the time since the start, for the history file.
#[derive(Clone)]
struct History {
    started: Instant,
    lines: Arc<Mutex<String>>,
    path: PathBuf,
}

impl History {
    fn new(seed: u64) -> History {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nemesis");
        std::fs::create_dir_all(&dir).unwrap();
        History {
            started: Instant::now(),
            lines: Arc::default(),
            path: dir.join(format!("seed-{seed}.log")),
        }
    }

    fn note(&self, what: impl AsRef<str>) {
        let line = format!(
            "{:9.3} {}\n",
            self.started.elapsed().as_secs_f64(),
            what.as_ref()
        );
        let mut lines = self.lines.lock().unwrap();
        lines.push_str(&line);
        // Written as it goes: a run that dies leaves what it did.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// One agent of the run: its node, directory, and process while it runs.
struct Node {
    name: String,
    dir: PathBuf,
    agent: Option<common::Agent>,
}

impl Node {
    fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }
}

/// Every fault the nemesis picks from.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillOperator,
    PauseOperator,
    KillAgent,
    KillEtcdMember,
    PauseEtcdMember,
    LoseQuorum,
    /// `corral node remove --drain` of a live node: its pods go, its space comes back; the
    /// agent is then restarted and registers the node again.
    DrainNode,
    /// An agent SIGKILLed, `corral node remove --force`, and a new machine (a fresh state
    /// directory) under the node's name once the removal is done.
    ForceDeadNode,
    /// A configuration written with a raw etcd put (as etcdctl or a GitOps tool would): the
    /// pool renamed; the original put back a moment later.
    ConfigAroundCli,
    /// etcd restored from a snapshot taken earlier in the run (`etcdctl snapshot save`, then
    /// every member restored into new data directories); the first pick takes the snapshot.
    RestoreSnapshot,
}

/// The faults `make test` picks from, all but `RestoreSnapshot`, which is picked as often as
/// any (unless `NEMESIS_RESTORE=0`).
const FAULTS: [Fault; 9] = [
    Fault::KillOperator,
    Fault::PauseOperator,
    Fault::KillAgent,
    Fault::KillEtcdMember,
    Fault::PauseEtcdMember,
    Fault::LoseQuorum,
    Fault::DrainNode,
    Fault::ForceDeadNode,
    Fault::ConfigAroundCli,
];

/// `config` with its pool renamed: what a hand-written change would do.
fn renamed(config: &str) -> String {
    config.replace("name = \"default\"", "name = \"renamed\"")
}

/// Whether `/corral/t/v1/<rest>` exists.
fn exists(etcd: &corral_etcd::testing::EtcdCluster, rest: &str) -> bool {
    let kv = kv(etcd);
    let key = format!("/corral/t/v1/{rest}");
    block_on(corral_kv::Kv::get(&kv, key.as_bytes()))
        .ok()
        .flatten()
        .is_some()
}

/// Releases every allocation of the agent's node scope that lies in a cluster range it drains.
fn release_draining(socket: &Path) {
    let Ok(pools) = Client::unix(socket).pools(Some("node")) else {
        return;
    };
    let draining: Vec<ipnet::IpNet> = pools
        .pools
        .iter()
        .flat_map(|p| &p.ranges)
        .filter(|r| r.source == corral_api::RangeSource::Cluster && r.draining)
        .filter_map(|r| r.range.split(',').next()?.parse().ok())
        .collect();
    let Ok(dump) = Client::unix(socket).dump(Some("node")) else {
        return;
    };
    for address in addresses(&dump) {
        if draining.iter().any(|r| r.contains(&address)) {
            let _ = Client::unix(socket).release(&ReleaseRequest {
                scope: "node".into(),
                address: Some(address),
                owner: None,
                key: None,
                generation: None,
            });
        }
    }
}

/// Whether a `holdings/` record lists a grant its agent refused.
fn refused_stands(etcd: &corral_etcd::testing::EtcdCluster) -> bool {
    let Ok((records, _)) = block_on(corral_kv::read_all(
        &kv(etcd),
        b"/corral/t/v1/holdings/",
        1000,
    )) else {
        return true;
    };
    records.iter().any(|e| {
        corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&e.value)
            .is_ok_and(|r| !r.refused.is_empty())
    })
}

struct Run {
    etcd: corral_etcd::testing::EtcdCluster,
    dir: PathBuf,
    operators: Vec<Option<Operator>>,
    nodes: Vec<Node>,
    history: History,
    rng: ChaCha8Rng,
    /// Nodes removed during the run, and every node once etcd was restored from a snapshot
    /// (their addresses may lie outside their grants while they drain ranges etcd took away
    /// or forgot: the check is not strict about them until the run settles).
    removed: std::collections::BTreeSet<String>,
    /// The snapshot taken for `RestoreSnapshot`, if one was.
    snapshot: Option<PathBuf>,
    /// The cluster's configuration: [`CONFIG`], or [`SCALE_CONFIG`] with `NEMESIS_NODES`.
    config: &'static str,
}

impl Run {
    fn start_operator(&mut self, i: usize) {
        self.operators[i] = Some(Operator::start(&self.etcd, &self.dir, &format!("op-{i}")));
        self.history.note(format!("operator op-{i} started"));
    }

    fn start_agent(&mut self, i: usize) {
        let node = &self.nodes[i];
        let agent = start_agent(&self.etcd, &node.dir, &node.name);
        self.history
            .note(format!("agent {} started (pid {})", node.name, agent.pid()));
        self.nodes[i].agent = Some(agent);
    }

    fn pause(&mut self, min_ms: u64, max_ms: u64) -> Duration {
        Duration::from_millis(self.rng.random_range(min_ms..=max_ms))
    }

    fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::KillOperator => {
                let i = self.rng.random_range(0..OPERATORS);
                if let Some(operator) = self.operators[i].take() {
                    self.history
                        .note(format!("SIGKILL operator op-{i} (pid {})", operator.pid()));
                    drop(operator);
                }
                std::thread::sleep(self.pause(0, 4000));
                self.start_operator(i);
            }
            Fault::PauseOperator => {
                let i = self.rng.random_range(0..OPERATORS);
                let pause = self.pause(500, 6000);
                if let Some(operator) = &self.operators[i] {
                    self.history
                        .note(format!("SIGSTOP operator op-{i} for {pause:?}"));
                    operator.signal(rustix::process::Signal::STOP);
                    std::thread::sleep(pause);
                    operator.signal(rustix::process::Signal::CONT);
                    self.history.note(format!("SIGCONT operator op-{i}"));
                }
            }
            Fault::KillAgent => {
                let i = self.rng.random_range(0..AGENTS);
                if let Some(agent) = self.nodes[i].agent.take() {
                    self.history.note(format!(
                        "SIGKILL agent {} (pid {})",
                        self.nodes[i].name,
                        agent.pid()
                    ));
                    agent.kill();
                }
                std::thread::sleep(self.pause(0, 3000));
                self.start_agent(i);
            }
            Fault::KillEtcdMember => {
                let i = self.rng.random_range(0..3);
                self.history.note(format!("SIGKILL etcd member {i}"));
                self.etcd.kill(i).unwrap();
                std::thread::sleep(self.pause(500, 5000));
                self.etcd.restart(i).unwrap();
                self.history.note(format!("etcd member {i} restarted"));
            }
            Fault::PauseEtcdMember => {
                let i = self.rng.random_range(0..3);
                let pause = self.pause(500, 5000);
                self.history
                    .note(format!("SIGSTOP etcd member {i} for {pause:?}"));
                self.etcd.stop_signal(i).unwrap();
                std::thread::sleep(pause);
                self.etcd.cont(i).unwrap();
            }
            Fault::LoseQuorum => {
                let first = self.rng.random_range(0..3);
                let second = (first + 1 + self.rng.random_range(0..2)) % 3;
                self.history.note(format!(
                    "quorum lost: SIGKILL etcd members {first} and {second}"
                ));
                self.etcd.kill(first).unwrap();
                self.etcd.kill(second).unwrap();
                std::thread::sleep(self.pause(1000, 5000));
                self.etcd.restart(first).unwrap();
                self.etcd.restart(second).unwrap();
                self.history.note("quorum regained: members restarted");
            }
            Fault::DrainNode => {
                let i = self.rng.random_range(0..AGENTS);
                let name = self.nodes[i].name.clone();
                if self.nodes[i].agent.is_none() {
                    self.start_agent(i);
                }
                let (code, output) = remove(&self.etcd, &name, &["--drain"]);
                self.history.note(format!(
                    "node remove {name} --drain: exit {code}: {}",
                    output.trim()
                ));
                if code != 0 {
                    return;
                }
                self.removed.insert(name.clone());
                // The pods go (the client's releases of them fail from now on, or find
                // nothing): every allocation of the node is released, again while the removal
                // runs (an allocation may have landed before the agent saw its removal).
                let socket = self.nodes[i].socket();
                let history = self.history.clone();
                let release_all = || {
                    let Ok(dump) = Client::unix(&socket).dump(Some("node")) else {
                        return;
                    };
                    for address in addresses(&dump) {
                        let released = Client::unix(&socket).release(&ReleaseRequest {
                            scope: "node".into(),
                            address: Some(address),
                            owner: None,
                            key: None,
                            generation: None,
                        });
                        history.note(format!(
                            "{name}: released {address} to drain: {}",
                            released.is_ok()
                        ));
                    }
                };
                let etcd = &self.etcd;
                wait_until(
                    &format!("the removal of {name} completes"),
                    Duration::from_secs(90),
                    || {
                        release_all();
                        std::thread::sleep(Duration::from_millis(200));
                        !exists(etcd, &format!("removals/{name}"))
                    },
                );
                self.history.note(format!("removal of {name} done"));
                // The agent is started again and registers the node anew.
                drop(self.nodes[i].agent.take());
                self.start_agent(i);
            }
            Fault::ForceDeadNode => {
                let i = self.rng.random_range(0..AGENTS);
                let name = self.nodes[i].name.clone();
                if let Some(agent) = self.nodes[i].agent.take() {
                    self.history
                        .note(format!("SIGKILL agent {name} (dead machine)"));
                    agent.kill();
                }
                let (code, output) = remove(&self.etcd, &name, &["--force"]);
                self.history.note(format!(
                    "node remove {name} --force: exit {code}: {}",
                    output.trim()
                ));
                assert_eq!(code, 0, "a forced removal of a dead node: {output}");
                self.removed.insert(name.clone());
                wait_until(
                    &format!("the forced removal of {name} completes"),
                    Duration::from_secs(90),
                    || !exists(&self.etcd, &format!("removals/{name}")),
                );
                self.history.note(format!("removal of {name} done"));
                // A new machine under the old name: nothing of the dead one's state.
                let _ = std::fs::remove_dir_all(&self.nodes[i].dir);
                self.start_agent(i);
            }
            Fault::RestoreSnapshot => match self.snapshot.take() {
                None => {
                    let path = self
                        .dir
                        .join(format!("snapshot-{}.db", self.rng.random::<u32>()));
                    self.etcd
                        .snapshot_save(&path)
                        .expect("etcdctl snapshot save");
                    self.history
                        .note(format!("etcd snapshot saved to {}", path.display()));
                    self.snapshot = Some(path);
                }
                Some(path) => {
                    self.history
                        .note(format!("etcd restored from {}", path.display()));
                    block_on(self.etcd.restore(&path)).expect("etcd restores");
                    self.history.note("etcd serves again from the snapshot");
                    // Every node may drain a range etcd forgot.
                    self.removed
                        .extend(self.nodes.iter().map(|n| n.name.clone()));
                    // A restored grant of space its node gave up since stands in etcd until
                    // the node's agent refused it and the leader revoked it (the agent never
                    // serves it): etcd's grants and the agents agree again within a bound. No
                    // address is on two agents meanwhile, ever.
                    let etcd = &self.etcd;
                    let running: Vec<(String, PathBuf)> = self
                        .nodes
                        .iter()
                        .filter(|n| n.agent.is_some())
                        .map(|n| (n.name.clone(), n.socket()))
                        .collect();
                    let agents: Vec<(&str, &Path)> = running
                        .iter()
                        .map(|(n, s)| (n.as_str(), s.as_path()))
                        .collect();
                    let last = std::cell::RefCell::new(Vec::new());
                    wait_showing(
                        "etcd's grants agree with the agents again (restored grants refused and \
                         revoked) and every agent serves",
                        Duration::from_secs(120),
                        || {
                            let violations = invariant_violations(etcd, &agents, false);
                            let twice: Vec<&String> = violations
                                .iter()
                                .filter(|v| v.contains(" is allocated on "))
                                .collect();
                            assert!(twice.is_empty(), "after the restore: {twice:?}");
                            let agree = violations.is_empty();
                            *last.borrow_mut() = violations;
                            agree
                                && !refused_stands(etcd)
                                && running.iter().all(|(_, s)| agent_ranges(s).len() == 2)
                        },
                        || format!("{:?}", last.borrow()),
                    );
                    self.history.note("settled after the restore");
                }
            },
            Fault::ConfigAroundCli => {
                let kv = kv(&self.etcd);
                let key = "/corral/t/v1/config";
                let put = |text: &str| {
                    let json = corral_cluster::ClusterConfig::from_toml(text)
                        .unwrap()
                        .to_json()
                        .unwrap();
                    block_on(corral_kv::Kv::txn(
                        &kv,
                        corral_kv::Txn {
                            compares: vec![],
                            success: vec![corral_kv::TxnOp::put(key, json)],
                            failure: vec![],
                        },
                    ))
                };
                let written = put(&renamed(self.config));
                self.history.note(format!(
                    "config written around the CLI (pool renamed): {:?}",
                    written.map(|r| r.revision)
                ));
                std::thread::sleep(self.pause(1000, 8000));
                let restored = put(self.config);
                self.history.note(format!(
                    "original config put back: {:?}",
                    restored.map(|r| r.revision)
                ));
            }
        }
        block_on(self.etcd.wait_ready_all(Duration::from_secs(60))).expect("etcd heals");
    }

    /// The independent check over the agents that run; answers its time.
    fn check(&self, step: usize) -> Duration {
        let started = Instant::now();
        let running: Vec<(&str, PathBuf)> = self
            .nodes
            .iter()
            .filter(|n| n.agent.is_some())
            .map(|n| (n.name.as_str(), n.socket()))
            .collect();
        let agents: Vec<(&str, &Path)> = running.iter().map(|(n, s)| (*n, s.as_path())).collect();
        // Strict (every address inside its own node's grants) but for nodes removed during the
        // run, whose addresses may lie in ranges they drain.
        let strict: Vec<(&str, &Path)> = agents
            .iter()
            .copied()
            .filter(|(n, _)| !self.removed.contains(*n))
            .collect();
        // etcd's grants read once for both (30,000 nodes' are 60,000 keys).
        let grants = grant_entries(&self.etcd);
        let mut violations = violations_of(&grants, &agents, false);
        violations.extend(violations_of(&grants, &strict, true));
        violations.sort();
        violations.dedup();
        if !violations.is_empty() {
            for v in &violations {
                self.history
                    .note(format!("VIOLATION after step {step}: {v}"));
            }
            panic!(
                "no address twice broken after step {step} (history: {}):\n{}",
                self.history.path.display(),
                violations.join("\n")
            );
        }
        self.history.note(format!("check after step {step}: ok"));
        started.elapsed()
    }
}

/// The client: allocates and releases pods on random agents until told to stop; answers the
/// counts (allocated, released, refused or failed).
fn client(
    sockets: Vec<(String, PathBuf)>,
    seed: u64,
    stop: Arc<AtomicBool>,
    history: History,
) -> (u64, u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc11e);
    let mut held: BTreeMap<String, Vec<(String, IpAddr)>> = BTreeMap::new();
    let (mut allocated, mut released, mut failed) = (0u64, 0u64, 0u64);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (node, socket) = &sockets[rng.random_range(0..sockets.len())];
        let mut agent = Client::unix(socket).with_read_timeout(Some(Duration::from_secs(10)));
        let pods = held.entry(node.clone()).or_default();
        if pods.len() < 3 || (pods.len() < 12 && rng.random_bool(0.6)) {
            n += 1;
            let owner = format!("pod-{n}");
            match agent.allocate(&AllocateRequest {
                scope: "node".into(),
                pool: "default".into(),
                family: Some(FamilyChoice::Dual),
                address: None,
                owner: owner.clone(),
                key: None,
                lease_ms: None,
            }) {
                Ok(response) => {
                    allocated += 1;
                    for a in &response.allocations {
                        history.note(format!("{node}: allocated {} to {owner}", a.address));
                        pods.push((owner.clone(), a.address));
                    }
                }
                Err(error) => {
                    failed += 1;
                    history.note(format!("{node}: allocate {owner} refused: {error}"));
                }
            }
        } else if !pods.is_empty() {
            let (owner, _) = pods[rng.random_range(0..pods.len())].clone();
            match agent.release(&ReleaseRequest {
                scope: "node".into(),
                address: None,
                owner: Some(owner.clone()),
                key: None,
                generation: None,
            }) {
                Ok(_) => {
                    released += 1;
                    history.note(format!("{node}: released {owner}"));
                    pods.retain(|(o, _)| *o != owner);
                }
                Err(error) => {
                    failed += 1;
                    history.note(format!("{node}: release {owner} refused: {error}"));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(20..150)));
    }
    (allocated, released, failed)
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("NEMESIS_SEED") {
        if seed == "random" {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            return vec![now.as_secs() ^ u64::from(now.subsec_nanos())];
        }
        return vec![seed.parse().expect("NEMESIS_SEED is a number or `random`")];
    }
    include_str!("nemesis.seeds")
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.parse().expect("tests/nemesis.seeds holds numbers"))
        .collect()
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn no_address_twice_under_a_seeded_nemesis() {
    let secs: u64 = std::env::var("NEMESIS_SECS")
        .ok()
        .map(|s| s.parse().expect("NEMESIS_SECS is a number"))
        .unwrap_or(180);
    for seed in seeds() {
        run(seed, Duration::from_secs(secs));
    }
}

fn run(seed: u64, length: Duration) {
    let restores = std::env::var("NEMESIS_RESTORE").map_or(true, |v| v != "0");
    println!("nemesis seed {seed} for {length:?} (NEMESIS_SEED={seed} repeats it)");
    let history = History::new(seed);
    let _ = std::fs::remove_file(&history.path);
    history.note(format!("seed {seed}"));
    let dir = tempfile::tempdir().unwrap();
    let extra = extra_nodes();
    // Granting and checking the extra nodes takes its time (a debug build grants about 1,000
    // a second).
    let patience = Duration::from_secs(60 + extra as u64 / 500);
    let config = if extra > 0 { SCALE_CONFIG } else { CONFIG };
    let etcd = initialized(3, dir.path(), config);
    if extra > 0 {
        register_background(&etcd, extra);
        history.note(format!("{extra} more nodes registered"));
    }
    let nodes = (0..AGENTS)
        .map(|i| Node {
            name: format!("n{i}"),
            dir: dir.path().join(format!("n{i}")),
            agent: None,
        })
        .collect();
    let mut run = Run {
        etcd,
        dir: dir.path().to_path_buf(),
        operators: (0..OPERATORS).map(|_| None).collect(),
        nodes,
        history: history.clone(),
        rng: ChaCha8Rng::seed_from_u64(seed),
        removed: Default::default(),
        snapshot: None,
        config,
    };
    for i in 0..OPERATORS {
        run.start_operator(i);
    }
    for i in 0..AGENTS {
        run.start_agent(i);
    }
    let sockets: Vec<(String, PathBuf)> = run
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.socket()))
        .collect();
    wait_until("every agent holds its dual-stack CIDRs", patience, || {
        sockets.iter().all(|(_, s)| agent_ranges(s).len() == 2)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (sockets, stop, history) = (sockets.clone(), Arc::clone(&stop), history.clone());
        std::thread::spawn(move || client(sockets, seed, stop, history))
    };
    let started = Instant::now();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut step = 0;
    let mut slowest_check = Duration::ZERO;
    while started.elapsed() < length {
        step += 1;
        let fault = if restores && run.rng.random_range(0..FAULTS.len() + 1) == FAULTS.len() {
            Fault::RestoreSnapshot
        } else {
            FAULTS[run.rng.random_range(0..FAULTS.len())]
        };
        *faults.entry(format!("{fault:?}")).or_default() += 1;
        run.apply(fault);
        slowest_check = slowest_check.max(run.check(step));
        let quiet = run.pause(500, 3000);
        std::thread::sleep(quiet);
    }
    stop.store(true, Ordering::Relaxed);
    let (allocated, released, failed) = load.join().expect("the client ran");
    // Settled: every agent serves again, the store and the agents agree.
    wait_until(
        "every agent holds its dual-stack CIDRs after the faults",
        patience,
        || sockets.iter().all(|(_, s)| agent_ranges(s).len() == 2),
    );
    run.check(step + 1);
    let agent_sockets: Vec<&Path> = sockets.iter().map(|(_, s)| s.as_path()).collect();
    // Pods still on ranges a node drains (etcd forgot them in a restore) are gone, as they
    // would be rescheduled: the node gives the ranges up and the check is clean.
    for (_, socket) in &sockets {
        release_draining(socket);
    }
    let last = std::cell::RefCell::new(String::new());
    wait_showing(
        "cluster check is clean",
        patience,
        || {
            let (code, output) = check(&run.etcd, &agent_sockets);
            *last.borrow_mut() = output;
            code == 0
        },
        || last.take(),
    );
    let checked = Instant::now();
    assert_check(&run.etcd, &agent_sockets);
    let cluster_check = checked.elapsed();
    let mut summary = String::new();
    for (fault, n) in &faults {
        let _ = write!(summary, "{fault} {n}, ");
    }
    println!(
        "nemesis seed {seed} ({} nodes): {step} faults ({summary}), {allocated} allocations, {released} releases, {failed} refused or failed, in {:.0} s; a step's check {:.2} s at most, cluster check {:.2} s",
        AGENTS + extra,
        started.elapsed().as_secs_f64(),
        slowest_check.as_secs_f64(),
        cluster_check.as_secs_f64()
    );
    history.note("passed");
    // A passing run leaves nothing behind.
    let _ = std::fs::remove_file(&history.path);
}

/// The check's sweep finds exactly the grants that share an address: overlapping and nested
/// ones, never adjacent ones, never across families (`::/96` spans the numbers IPv4 does).
#[test]
fn the_grant_sweep_finds_overlaps_not_neighbours() {
    let cidrs: Vec<ipnet::IpNet> = [
        "10.0.0.64/26",
        "10.0.0.0/26",
        "10.0.0.0/24",
        "10.0.1.0/26",
        "10.0.0.64/26",
        "::/96",
        "fd00::/64",
        "fd00:0:0:1::/64",
        "fd00::/48",
    ]
    .iter()
    .map(|c| c.parse().unwrap())
    .collect();
    assert_eq!(
        overlapping(&cidrs),
        [(0, 2), (0, 4), (1, 2), (2, 4), (6, 8), (7, 8)]
    );
    let grants: Vec<GrantEntry> = cidrs
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, format!("n{i}"), format!("k{i}")))
        .collect();
    let index = GrantIndex::new(&grants);
    let keys = |address: &str| -> Vec<&str> {
        let found = index.containing(address.parse().unwrap());
        found.iter().map(|(_, _, key)| key.as_str()).collect()
    };
    assert_eq!(keys("10.0.0.70"), ["k0", "k2", "k4"]);
    assert_eq!(keys("10.0.1.0"), ["k3"]);
    assert_eq!(keys("10.0.2.0"), Vec::<&str>::new());
    assert_eq!(keys("::a00:1"), ["k5"]);
    assert_eq!(keys("fd00:0:0:1::1"), ["k7", "k8"]);
}

/// The sweep and the index agree with comparing every pair, on random CIDRs of one /16 and
/// one /112 (many overlaps) of both families.
#[test]
fn the_grant_sweep_agrees_with_every_pair() {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    for _ in 0..50 {
        let cidrs: Vec<ipnet::IpNet> = (0..rng.random_range(0..60))
            .map(|_| {
                let low: u16 = rng.random();
                let net: ipnet::IpNet = if rng.random_bool(0.5) {
                    let address = std::net::Ipv4Addr::from(0x0a00_0000 | u32::from(low));
                    ipnet::Ipv4Net::new(address, rng.random_range(18..=32))
                        .unwrap()
                        .into()
                } else {
                    let address = std::net::Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(low));
                    ipnet::Ipv6Net::new(address, rng.random_range(114..=128))
                        .unwrap()
                        .into()
                };
                net.trunc()
            })
            .collect();
        let mut every_pair = Vec::new();
        for (i, a) in cidrs.iter().enumerate() {
            for (j, b) in cidrs.iter().enumerate().skip(i + 1) {
                if a.contains(&b.network()) || b.contains(&a.network()) {
                    every_pair.push((i, j));
                }
            }
        }
        assert_eq!(overlapping(&cidrs), every_pair, "{cidrs:?}");
        let grants: Vec<GrantEntry> = cidrs
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, String::new(), i.to_string()))
            .collect();
        let index = GrantIndex::new(&grants);
        for cidr in &cidrs {
            for address in [cidr.network(), cidr.broadcast()] {
                let found: Vec<&String> = index
                    .containing(address)
                    .into_iter()
                    .map(|(_, _, key)| key)
                    .collect();
                let expected: Vec<&String> = grants
                    .iter()
                    .filter(|(c, _, _)| c.contains(&address))
                    .map(|(_, _, key)| key)
                    .collect();
                assert_eq!(found, expected, "{address} in {cidrs:?}");
            }
        }
    }
}
