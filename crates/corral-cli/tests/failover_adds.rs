//! Issue 23: a failover fails no ADD. With real processes (etcd on 127.0.0.1, two `corral
//! operator` replicas on the default election lease, one `corral agent` with the default
//! `--pool-wait`, a block pool), the leader is SIGKILLed and then ADDs that need new blocks
//! arrive: they wait through the failover (the dead leader's lease, then the standby's
//! rebuild) and every one is served by the standby. Before, the default pool wait (5 s) was
//! shorter than a failover (8 to 9 s), and the ADDs that needed a block failed with code 11.
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::path::Path;
use std::time::{Duration, Instant};

use corral_client::Client;
use corral_etcd::testing::EtcdCluster;

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::pod_add;

/// /28 IPv4 blocks (14 addresses each) and /124 IPv6 blocks; pre-allocate 4.
const BLOCKS: &str = include_str!("configs/blocks.toml");

/// ADDs sent at once after the leader dies: several blocks' worth beyond what the node holds.
const ADDS: usize = 60;

/// Replica `name` on the operator's defaults (its election lease: 10 s), unlike the other
/// cluster tests' 2 s: the failover is the one a default deployment sees.
fn operator(etcd: &EtcdCluster, dir: &Path, name: &str) -> Operator {
    Operator::with_state(etcd, dir, name, &[])
}

/// How many operator replicas campaign.
fn campaigning(etcd: &EtcdCluster) -> usize {
    let kv = kv(etcd);
    block_on(corral_kv::read_all(&kv, b"/corral/t/v1/election/", 100))
        .map(|(keys, _)| keys.len())
        .unwrap_or(0)
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn adds_that_need_a_block_while_the_leader_is_sigkilled_all_succeed_on_the_default_wait() {
    let (dir, etcd) = initialized_in_tempdir(1, BLOCKS);
    let first = operator(&etcd, dir.path(), "op-a");
    wait_leads(&etcd, "op-a", Duration::from_secs(30));
    let standby = operator(&etcd, dir.path(), "op-b");
    wait_until("op-b campaigns", Duration::from_secs(30), || {
        campaigning(&etcd) == 2
    });
    // The agent on its defaults: no --pool-wait.
    let path = dir.path().join("agent");
    let agent = start_agent(&etcd, &path, "node-1");
    let socket = path.join("agent.sock");
    // Its first blocks (one per family, the pre-allocate watermark), and nothing more asked.
    wait_until("the first blocks", Duration::from_secs(30), || {
        agent_ranges(&socket).len() >= 2
    });
    let held_before = agent_ranges(&socket).len();
    assert!(held_before <= 4, "{held_before} blocks before the ADDs");

    // The leader dies; the ADDs come, far more than the blocks held can serve.
    first.signal(rustix::process::Signal::KILL);
    let killed = Instant::now();
    let adds: Vec<_> = (0..ADDS)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                // The runtime's deadline is minutes; corral-ipam waits 60 s for the agent.
                let mut client =
                    Client::unix(&socket).with_read_timeout(Some(Duration::from_secs(60)));
                let started = Instant::now();
                let result = pod_add(&mut client, "pods", &format!("c{i}"), format!("pod/c{i}"));
                (i, result, started.elapsed())
            })
        })
        .collect();
    let mut longest = Duration::ZERO;
    let mut failed = Vec::new();
    for add in adds {
        let (i, result, took) = add.join().unwrap();
        longest = longest.max(took);
        match result {
            Ok(response) => assert_eq!(response.allocations.len(), 2, "c{i}: {response:?}"),
            Err(error) => failed.push(format!("c{i} after {took:?}: {error}")),
        }
    }
    eprintln!(
        "{ADDS} ADDs through a failover: the longest took {:.1} s (leader killed {:.1} s ago)",
        longest.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {ADDS} ADDs failed:\n{}\nop-b's log:\n{}",
        failed.len(),
        failed.join("\n"),
        standby.log()
    );
    // They needed the standby: some waited longer than the old default wait (5 s), and the
    // standby leads now and granted the node more blocks.
    assert!(longest > Duration::from_secs(5), "{longest:?}");
    assert_eq!(leader(&etcd).as_deref(), Some("op-b"));
    assert!(agent_ranges(&socket).len() > held_before);
    assert_check(&etcd, &[&socket]);
    drop(agent);
    drop(first);
}
