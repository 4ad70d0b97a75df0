//! The real agent process (`corral agent`) killed with SIGKILL at random moments while 64
//! clients allocate and release over its socket, then restarted, 50 times. After every
//! restart:
//! - no address is held twice, and every allocation whose answer a client received (and
//!   that it did not release with an answer) is held, with the same generation and owner;
//! - every release whose answer a client received is gone (unless the address was handed
//!   out again later, which a 10-minute cooldown rules out here);
//! - every such release is still cooling: it is in the checkpoint's cooldown list.
//!
//! Requests whose answer never arrived (the agent died first) are "in doubt": either outcome
//! is allowed, and the next round learns which from the dump.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_api::{AllocateRequest, ReleaseRequest};
use corral_client::Client;

use crate::common;

use common::Agent;
const ROUNDS: usize = 50;
const CLIENTS: usize = 64;

/// What the clients know for certain about one address.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    /// Allocated to `owner` at `generation`, answer received.
    Held { owner: String, generation: u64 },
    /// Released, answer received.
    Released,
    /// A request about it got no answer.
    InDoubt,
}

fn config_file(dir: &Path) -> PathBuf {
    common::agent_config_file(dir, "10.60.0.0/16", 600_000)
}

fn start(config: &Path, socket: &Path) -> Agent {
    Agent::start(&["--config".as_ref(), config.as_os_str()], socket)
}

fn kill(agent: Agent) {
    agent.kill();
}

/// 64 clients, each allocating and releasing in a loop until the agent dies or `stop` passes.
fn load(socket: &Path, known: &Arc<Mutex<HashMap<IpAddr, Known>>>, round: usize, stop: Instant) {
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let socket = socket.to_path_buf();
            let known = Arc::clone(known);
            std::thread::spawn(move || {
                let mut client =
                    Client::unix(&socket).with_read_timeout(Some(Duration::from_secs(10)));
                let mut mine: Vec<(IpAddr, u64)> = Vec::new();
                let mut i = 0usize;
                while Instant::now() < stop {
                    i += 1;
                    let owner = format!("r{round}-c{c}-{i}");
                    // Mostly allocate; release one of ours every third step.
                    if i.is_multiple_of(3)
                        && let Some((addr, generation)) = mine.pop()
                    {
                        let request = ReleaseRequest {
                            scope: corral_api::NODE_SCOPE.into(),
                            address: Some(addr),
                            generation: Some(generation),
                            ..ReleaseRequest::default()
                        };
                        match client.release(&request) {
                            Ok(_) => {
                                known.lock().unwrap().insert(addr, Known::Released);
                            }
                            Err(_) => {
                                known.lock().unwrap().insert(addr, Known::InDoubt);
                                return;
                            }
                        }
                        continue;
                    }
                    let request = AllocateRequest {
                        scope: corral_api::NODE_SCOPE.into(),
                        pool: corral_api::DEFAULT_POOL.into(),
                        family: None,
                        address: None,
                        owner: owner.clone(),
                        key: None,
                        lease_ms: None,
                    };
                    match client.allocate(&request) {
                        Ok(answer) => {
                            let a = &answer.allocations[0];
                            let mut known = known.lock().unwrap();
                            assert!(
                                !matches!(known.get(&a.address), Some(Known::Held { .. })),
                                "{} handed out while held",
                                a.address
                            );
                            known.insert(
                                a.address,
                                Known::Held {
                                    owner,
                                    generation: a.generation,
                                },
                            );
                            mine.push((a.address, a.generation));
                        }
                        // The agent died: this allocation may or may not exist. Its address
                        // is unknown, so nothing is recorded; the dump will show it.
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread panicked");
    }
}

/// Compares the restarted agent's state with what the clients know, then adopts the
/// agent's answer for everything in doubt.
fn verify(socket: &Path, known: &mut HashMap<IpAddr, Known>, round: usize) {
    let mut client = Client::unix(socket);
    let dump = client.dump(Some(corral_api::NODE_SCOPE)).expect("dump");
    let mut held: HashMap<IpAddr, (String, u64)> = HashMap::new();
    for pool in &dump.scopes[0].pools {
        for entry in &pool.allocations {
            assert!(
                held.insert(entry.address, (entry.owner.clone(), entry.generation))
                    .is_none(),
                "round {round}: {} is held twice",
                entry.address
            );
        }
    }
    let checkpoint = client.export_checkpoint().expect("export");
    let cooling: Vec<String> = checkpoint["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["scope"] == corral_api::NODE_SCOPE)
        .flat_map(|s| s["cooling"].as_array().cloned().unwrap_or_default())
        .map(|c| c["address"].as_str().unwrap().to_owned())
        .collect();
    for (addr, state) in known.iter() {
        match state {
            Known::Held { owner, generation } => assert_eq!(
                held.get(addr),
                Some(&(owner.clone(), *generation)),
                "round {round}: acknowledged allocation of {addr} lost"
            ),
            Known::Released => {
                assert!(
                    !held.contains_key(addr),
                    "round {round}: acknowledged release of {addr} undone"
                );
                assert!(
                    cooling.contains(&addr.to_string()),
                    "round {round}: {addr}'s cooldown was lost"
                );
            }
            Known::InDoubt => {}
        }
    }
    // What the dump says now is known.
    for state in known.values_mut() {
        if *state == Known::InDoubt {
            *state = Known::Released;
        }
    }
    for (addr, (owner, generation)) in held {
        known.insert(addr, Known::Held { owner, generation });
    }
    // An in-doubt release that did happen is cooling; one that did not is held (above).
    known.retain(|addr, state| *state != Known::Released || cooling.contains(&addr.to_string()));
}

#[test]
fn sigkill_during_load_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let socket = dir.path().join("agent.sock");
    let known = Arc::new(Mutex::new(HashMap::new()));
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut agent = start(&config, &socket);
    for round in 0..ROUNDS {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let run_for = Duration::from_millis(20 + seed % 180);
        let stop = Instant::now() + Duration::from_secs(5);
        let load_thread = {
            let socket = socket.clone();
            let known = Arc::clone(&known);
            std::thread::spawn(move || load(&socket, &known, round, stop))
        };
        std::thread::sleep(run_for);
        kill(agent);
        load_thread.join().unwrap();
        agent = start(&config, &socket);
        verify(&socket, &mut known.lock().unwrap(), round);
    }
    let held = known
        .lock()
        .unwrap()
        .values()
        .filter(|k| matches!(k, Known::Held { .. }))
        .count();
    assert!(
        held > ROUNDS * 10,
        "the load did little: {held} allocations held"
    );
    kill(agent);
}
