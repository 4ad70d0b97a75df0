//! SIGKILL at random moments during an ADD/DEL storm of real corral-ipam processes, round
//! after round: no address is ever held twice, every ADD that printed a result is still
//! recorded (unless a DEL of it was attempted since), and the stored snapshot still agrees
//! with the rows.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_core::{EngineConfig, OccupancySnapshot, PoolName};
use corral_store::{Need, ScopeConfig, SqliteStore, Store, Txn, build_engine};
use serde_json::{Value, json};

const NETWORK: &str = "storm";
const CONTAINERS: usize = 48;
const ROUNDS: usize = 60;
const PER_ROUND: usize = 16;

fn conf(dir: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "ipam": {
            "type": "corral-ipam",
            "dataDir": dir,
            "ranges": [[{"subnet": "10.77.0.0/24", "rangeStart": "10.77.0.10", "rangeEnd": "10.77.0.73"}]]
        }
    }))
    .unwrap()
}

fn spawn(verb: &str, container: &str, stdin: &[u8]) -> Child {
    let mut child = common::cni_env(
        &mut Command::new(common::binary()),
        verb,
        container,
        "x",
        "eth0",
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("corral-ipam starts");
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin);
    child
}

/// SIGKILL's number (9 on every Linux architecture).
const SIGKILL: i32 = 9;

/// A small deterministic generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the store holds, read through the store itself: container → address.
fn held(dir: &Path) -> BTreeMap<String, IpAddr> {
    let mut store = SqliteStore::open(dir).unwrap();
    let mut txn = store.begin().unwrap();
    let rows = txn.all_allocations(NETWORK).unwrap();
    let mut out = BTreeMap::new();
    let mut addrs = BTreeSet::new();
    for row in rows {
        assert!(addrs.insert(row.addr), "{} is held twice", row.addr);
        let key = row.key.expect("CNI allocations carry their key");
        assert!(
            out.insert(key.container_id().to_owned(), row.addr)
                .is_none(),
            "container {} holds two addresses",
            key.container_id()
        );
    }
    out
}

/// The stored snapshot must describe exactly the stored rows.
fn snapshot_agrees_with_rows(dir: &Path) {
    let mut store = SqliteStore::open(dir).unwrap();
    let mut txn = store.begin().unwrap();
    let (state, corrupt) = txn.scope_state(NETWORK).unwrap();
    assert!(corrupt.is_none(), "stored state unreadable: {corrupt:?}");
    let Some(state) = state else { return };
    let config: ScopeConfig = state.config.clone();
    let (full, _) = build_engine(
        &mut txn,
        NETWORK,
        &config,
        EngineConfig::default(),
        Need::Full,
    )
    .unwrap();
    full.check_invariants().unwrap();
    let pool = PoolName::new(NETWORK).unwrap();
    let rebuilt = full.pool_snapshot(&pool).unwrap();
    let stored = &state
        .snapshots
        .iter()
        .find(|(name, _)| *name == pool)
        .expect("the network's pool has a snapshot")
        .1;
    assert_eq!(stored.n_allocated, rebuilt.n_allocated);
    for (a, b) in stored.ranges.iter().zip(&rebuilt.ranges) {
        // Cooling addresses are blocked in the stored bitmap; the rebuild restores the same
        // cooldowns from the state, so the bitmaps must match exactly.
        match (&a.occupancy, &b.occupancy) {
            (OccupancySnapshot::Bits(x), OccupancySnapshot::Bits(y)) => assert_eq!(x, y),
            (x, y) => assert_eq!(x, y),
        }
        assert_eq!(a.n_allocated, b.n_allocated);
    }
}

#[test]
fn sigkill_during_an_add_del_storm_loses_no_acknowledged_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let stdin = conf(dir.path());
    let mut rng = Rng(0x5eed);
    // container → address of an ADD that printed a result and has not been DEL'ed since
    // (a DEL counts once attempted, finished or killed).
    let mut acknowledged: BTreeMap<String, IpAddr> = BTreeMap::new();
    let started = Instant::now();
    let mut kills = 0;
    let mut adds_answered = 0;
    for round in 0..ROUNDS {
        let mut containers: Vec<usize> = (0..CONTAINERS).collect();
        let mut children = Vec::new();
        for _ in 0..PER_ROUND {
            let pick = containers.remove(rng.below(containers.len() as u64) as usize);
            let container = format!("ctr{pick}");
            let verb = if rng.below(3) == 0 { "DEL" } else { "ADD" };
            if verb == "DEL" {
                acknowledged.remove(&container);
            }
            let kill_after = (rng.below(3) == 0).then(|| Duration::from_micros(rng.below(2000)));
            let child = spawn(verb, &container, &stdin);
            children.push((container, verb, child, kill_after));
        }
        let spawned = Instant::now();
        let mut pending: Vec<_> = children.into_iter().collect();
        // Kill the chosen ones at their moment, then collect everyone.
        while pending.iter().any(|(_, _, _, k)| k.is_some()) {
            let elapsed = spawned.elapsed();
            for (_, _, child, kill_after) in pending.iter_mut() {
                if let Some(at) = *kill_after
                    && elapsed >= at
                {
                    let _ = child.kill();
                    *kill_after = None;
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        for (container, verb, child, _) in pending {
            let output = child.wait_with_output().unwrap();
            // Only a process that was still running when the signal came counts as killed.
            if output.status.signal() == Some(SIGKILL) {
                kills += 1;
            }
            if verb == "ADD" && output.status.success() {
                let value: Value = serde_json::from_slice(&output.stdout)
                    .unwrap_or_else(|e| panic!("round {round}: bad ADD output ({e})"));
                let address = value["ips"][0]["address"].as_str().unwrap();
                let addr: IpAddr = address.split('/').next().unwrap().parse().unwrap();
                acknowledged.insert(container, addr);
                adds_answered += 1;
            }
        }
        let now_held = held(dir.path());
        for (container, addr) in &acknowledged {
            assert_eq!(
                now_held.get(container),
                Some(addr),
                "round {round}: acknowledged {container} → {addr} is lost"
            );
        }
        snapshot_agrees_with_rows(dir.path());
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "storm took too long"
        );
    }
    assert!(kills > 80, "only {kills} processes died of SIGKILL");
    // The storm must have exercised the plugin: a binary that never answers would leave
    // nothing to check above.
    assert!(
        adds_answered > ROUNDS * PER_ROUND / 4,
        "only {adds_answered} ADDs printed a result"
    );
    eprintln!(
        "{kills} processes died of SIGKILL, {adds_answered} ADDs answered over {ROUNDS} rounds"
    );
}
