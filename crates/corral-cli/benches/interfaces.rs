//! Interface-backed pools through the real agent (`make bench-agent`): a node with 15
//! interfaces × 50 secondary addresses (m5.24xlarge's limits), as AWS VPC CNI's ipamd keeps
//! them.
//!
//! * Durable assign + unassign by key: N client threads, each with one keep-alive connection,
//!   each looping CNI ADD then CNI DEL of its own attachment on the node pool (what
//!   corral-ipam sends in agent mode; the agent assigns through `Interfaces::assign` and
//!   unassigns through `Interfaces::unassign`), for a fixed time. Every answer is durable.
//!   Reported: cycles (ADD + DEL) per second and p50 / p99 of each call; N = 1, 8, 64. The
//!   pool's 30 s cooldown stays on: a released address cools, and the next comes from the
//!   others (the oldest cooling one once every address cooled).
//! * The same on a plain pool (one /22 range, 1,024 addresses, the same cooldown) in the same
//!   run, for comparison.
//! * Restore: every one of the 750 addresses assigned (and, for comparison, none), the agent
//!   SIGKILLed and started again; the time from spawn to `/readyz` answering, median of 5.
//!
//! `cargo bench` passes `--bench` for the full run (about 30 s); without it every phase is
//! short, as a smoke run.

use std::path::Path;
use std::time::{Duration, Instant};

use corral_api as api;
use corral_client::Client;

#[allow(dead_code)] // the bench uses part of the tests\' harness
#[path = "../tests/common/mod.rs"]
mod common;

use common::{Agent, ms, pct};

const INTERFACES: u32 = 15;
const ADDRESSES: u32 = 50;

fn add_interfaces(socket: &Path) {
    let mut client = Client::unix(socket);
    for i in 0..INTERFACES {
        client
            // From .10 up: 10.0.0.1 is the subnet's gateway, never a pod address.
            .add_interface(&common::eni_request(i, 10, ADDRESSES))
            .expect("the interface is added");
    }
}

fn key(pool: &str, name: &str) -> api::CniKeyRequest {
    api::CniKeyRequest {
        network: api::CniNetwork {
            configured_pool: Some(pool.into()),
            ..api::CniNetwork::on_node_pool("aws-cni", pool)
        },
        key: api::AttachmentKey {
            network: "aws-cni".into(),
            container_id: name.into(),
            ifname: "eth0".into(),
        },
    }
}

fn add(client: &mut Client, pool: &str, name: &str) -> api::AllocateResponse {
    let request = key(pool, name);
    client
        .cni_add(&api::CniAddRequest {
            network: request.network,
            key: request.key,
            owner: name.into(),
            sets: vec![],
        })
        .expect("ADD")
}

/// N clients, ADD then DEL of their own key on `pool`, for `run_for`.
fn assign_unassign(socket: &Path, pool: &'static str, clients: usize, run_for: Duration) {
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut client = Client::unix(&socket);
                let name = format!("bench-{c}");
                let (mut adds, mut dels) = (Vec::new(), Vec::new());
                let end = Instant::now() + run_for;
                while Instant::now() < end {
                    let t = Instant::now();
                    let answer = add(&mut client, pool, &name);
                    adds.push(t.elapsed());
                    assert_eq!(answer.allocations[0].interface.is_some(), pool == "eni");
                    let t = Instant::now();
                    client.cni_del(&key(pool, &name)).expect("DEL");
                    dels.push(t.elapsed());
                }
                (adds, dels)
            })
        })
        .collect();
    let started = Instant::now();
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for thread in threads {
        let (a, d) = thread.join().unwrap();
        adds.extend(a);
        dels.extend(d);
    }
    let elapsed = started.elapsed();
    adds.sort();
    dels.sort();
    println!(
        "{pool:>5}: ADD+DEL, {clients:>2} clients: {:>7.0} cycles/s  ADD p50 {} p99 {} ms  DEL p50 {} p99 {} ms",
        adds.len() as f64 / elapsed.as_secs_f64(),
        ms(pct(&adds, 50.0)),
        ms(pct(&adds, 99.0)),
        ms(pct(&dels, 50.0)),
        ms(pct(&dels, 99.0)),
    );
}

/// SIGKILL, then the time from spawn to `/readyz`, median of `rounds`.
fn restore(dir: &Path, mut agent: Agent, rounds: usize, what: &str) -> Agent {
    let mut times = Vec::new();
    for _ in 0..rounds {
        agent.kill();
        let t = Instant::now();
        agent = Agent::start_in(dir);
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "restore after SIGKILL, {what}: median {} ms (min {}, max {})",
        ms(pct(&times, 50.0)),
        ms(times[0]),
        ms(times[times.len() - 1])
    );
    agent
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (run_for, clients, rounds): (Duration, &[usize], usize) = if full {
        (Duration::from_secs(5), &[1, 8, 64], 5)
    } else {
        (Duration::from_millis(200), &[1, 8], 1)
    };
    let dir = tempfile::Builder::new()
        .prefix("corral-interfaces-bench")
        .tempdir_in("/tmp")
        .unwrap();
    let agent = Agent::start_in(dir.path());
    let socket = agent.socket.clone();
    add_interfaces(&socket);
    println!(
        "node: {INTERFACES} interfaces × {ADDRESSES} secondary addresses, cooldown 30 s, state in {}",
        dir.path().display()
    );
    // The same loop on a plain pool of 1,024 addresses (one /22 range, the same cooldown),
    // in the same run: what the interface pool's 750 ranges cost on the durable path.
    Client::unix(&socket)
        .add_range(&api::RangeRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "plain".into(),
            range: "10.1.0.0/22".into(),
        })
        .unwrap();
    for &n in clients {
        assign_unassign(&socket, "eni", n, run_for);
        assign_unassign(&socket, "plain", n, run_for);
    }
    let agent = restore(
        dir.path(),
        agent,
        rounds,
        "none assigned (released ones cooling)",
    );
    // Every address assigned (those cooling are handed out last, so all 750 go).
    let mut client = Client::unix(&socket);
    for i in 0..INTERFACES * ADDRESSES {
        add(&mut client, "eni", &format!("pod-{i}"));
    }
    let status = client.interfaces(Some("eni")).unwrap();
    assert_eq!(status.pools[0].assigned, u64::from(INTERFACES * ADDRESSES));
    let agent = restore(dir.path(), agent, rounds, "all 750 assigned");
    let status = Client::unix(&socket).interfaces(Some("eni")).unwrap();
    assert_eq!(status.pools[0].assigned, u64::from(INTERFACES * ADDRESSES));
    drop(agent);
}
