//! Random interleavings of registrations, removals, leader kills, clean stops, store outages,
//! lost answers and compactions across two or three replicas on one `MemKv` (paused clock,
//! fixed seeds so a failure replays). After every step the store is checked (zero consistency
//! problems, no CIDR or node ID written while held); after the last, every node is served.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use corral_kv::Kv;

const STEPS: usize = 60;

async fn scenario(seed: u64) {
    let mut rng = Rng(seed);
    let mut started = 0;
    let (kv, auditor, mut replicas) = faulty_pair(DUAL, &mut started).await;
    // Registered nodes and their registration's create revision; removed names.
    let mut nodes: BTreeMap<String, i64> = BTreeMap::new();
    let mut removed: Vec<String> = Vec::new();
    let mut next_node = 0;
    let mut log = Vec::new();
    for step in 0..STEPS {
        let action = rng.below(10);
        match action {
            0..=3 => {
                let name = format!("node-{next_node}");
                next_node += 1;
                let revision = register(&kv, &name).await;
                log.push(format!("register {name}"));
                nodes.insert(name, revision);
            }
            4 if !nodes.is_empty() => {
                let index = rng.below(nodes.len() as u64) as usize;
                let (name, revision) = nodes
                    .iter()
                    .nth(index)
                    .map(|(n, r)| (n.clone(), *r))
                    .unwrap();
                request_removal(&kv, &name, revision).await;
                log.push(format!("remove {name}"));
                nodes.remove(&name);
                removed.push(name);
            }
            5 if !removed.is_empty() => {
                // A removed name comes back (once its removal went through).
                let name = removed.remove(rng.below(removed.len() as u64) as usize);
                if kv
                    .get(keys().node(&node(&name)).as_bytes())
                    .await
                    .unwrap()
                    .is_none()
                    && under(&kv, &format!("removals/{name}")).await.is_empty()
                {
                    let revision = register(&kv, &name).await;
                    log.push(format!("re-register {name}"));
                    nodes.insert(name, revision);
                } else {
                    removed.push(name);
                }
            }
            6 => {
                // The leader (or any replica, if none leads yet) dies without resigning.
                kill_leader(&kv, &mut replicas, &mut started, &mut rng, &mut log);
            }
            7 => {
                outage(&kv, Duration::from_millis(200 + rng.below(6000)), &mut log).await;
            }
            8 => {
                let (_, revision) = corral_kv::read_all(&kv, b"/", 100).await.unwrap();
                log.push(format!("compact {revision}"));
                // Nothing written since the last compaction is `Compacted`: nothing to do.
                match kv.compact(revision).await {
                    Ok(()) | Err(corral_kv::KvError::Compacted { .. }) => {}
                    Err(error) => panic!("compact: {error}"),
                }
                if rng.below(2) == 0 {
                    // And the next watch of a leader starts behind the compaction.
                    kv.faults.lock().unwrap().compact_before_prefix_watch = Some(vec![]);
                }
            }
            _ => {
                log.push("lose an answer".into());
                kv.faults.lock().unwrap().lose_answers += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        assert_step(&kv, &auditor, &format!("seed {seed} step {step}"), &log).await;
        for replica in &replicas {
            assert!(
                !replica.finished(),
                "seed {seed}: replica {} ended",
                replica.name
            );
        }
    }
    // Settle: every registered node that fits (they all do) is served, removals done.
    kv.faults.lock().unwrap().lose_answers = 0;
    let names: Vec<String> = nodes.keys().cloned().collect();
    wait_until(
        &format!("seed {seed}: every node served after {log:#?}"),
        Duration::from_secs(120),
        || async {
            let grants = grants(&kv).await;
            let mut served = under(&kv, "removals/").await.is_empty();
            for name in &names {
                served &= grants.get(name).is_some_and(|g| g.len() == 2)
                    && node_id(&kv, name).await.is_some();
            }
            served
        },
    )
    .await;
    let grants = grants(&kv).await;
    for name in &removed {
        assert!(
            !grants.contains_key(name),
            "seed {seed}: removed {name} still holds {:?}",
            grants[name]
        );
    }
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn random_interleavings_keep_the_invariant() {
    for seed in [0x9E37_79B9_7F4A_7C15, 1, 42, 0xC0FFEE, 7_777_777, 31_337] {
        scenario(seed).await;
    }
}
