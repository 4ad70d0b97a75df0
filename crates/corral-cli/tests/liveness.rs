//! One live agent per node, and elections that heal, with real processes: etcd started here,
//! `corral operator` replicas and `corral agent`s as child processes. A copied state directory
//! (a cloned machine) started under the node's name exits naming the live holder and serves
//! nothing; an agent killed and restarted takes its own liveness key back at once; an agent
//! whose key another process takes stops serving the node's ranges; a leader whose election key
//! is deleted steps down and a leader grants again; an election key not on a lease blocks no
//! replica and is reported. Every test ends with `corral cluster check` and the independent
//! invariant check.
//!
//! Every test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use corral_client::Client;
use corral_etcd::testing::EtcdCluster;
use corral_kv::{Kv, TxnOp};

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::BINARY;

/// A `corral agent` whose stderr is kept in a file (`Agent` of common/mod.rs discards it), not
/// waited on: some of these never get ready.
struct Proc {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Proc {
    fn spawn(etcd: &EtcdCluster, dir: &Path, node: &str, ttl: &str) -> Proc {
        Proc::spawn_with(
            etcd,
            dir,
            &["--cluster", "t", "--node", node, "--lease-ttl", ttl],
        )
    }

    /// `corral agent --config DIR/agent.toml --etcd ETCD <args>`.
    fn spawn_with(etcd: &EtcdCluster, dir: &Path, args: &[&str]) -> Proc {
        std::fs::create_dir_all(dir).unwrap();
        let config = agent_config(dir);
        let log = dir.join("agent.log");
        let child = common::spawn_logged(
            Command::new(BINARY)
                .arg("agent")
                .arg("--config")
                .arg(&config)
                .args(["--etcd", &endpoints(etcd)])
                .args(args),
            &log,
        );
        Proc {
            child,
            socket: dir.join("agent.sock"),
            log,
        }
    }

    /// [`Proc::spawn`] (lease TTL 3 s), ready and holding the node's two ranges.
    fn serving(etcd: &EtcdCluster, dir: &Path, node: &str) -> Proc {
        Proc::serving_with_ttl(etcd, dir, node, "3")
    }

    /// [`Proc::serving`] with a lease of `ttl` seconds.
    fn serving_with_ttl(etcd: &EtcdCluster, dir: &Path, node: &str, ttl: &str) -> Proc {
        let mut proc = Proc::spawn(etcd, dir, node, ttl);
        proc.wait_ready();
        wait_ranges(&format!("{node} holds its ranges"), &proc.socket, 2, 30);
        proc
    }

    /// Waits until the agent exits (`what`, if it does not), noting whether it was ever ready
    /// meanwhile: (served, its exit code).
    fn wait_exit_noting_service(&mut self, what: &str) -> (bool, Option<i32>) {
        let mut served = false;
        wait_until(what, Duration::from_secs(60), || {
            served |= self.ready();
            self.child.try_wait().unwrap().is_some()
        });
        (served, self.child.wait().unwrap().code())
    }

    fn ready(&self) -> bool {
        Client::unix(&self.socket).readyz().is_ok()
    }

    fn wait_ready(&mut self) {
        wait_until("the agent is ready", Duration::from_secs(60), || {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the agent exited: {}",
                self.log()
            );
            self.ready()
        });
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's state in `dir/a` copied to `dir/b` (a cloned VM image, cluster-uid and
/// ranges with it).
fn clone_state(dir: &Path) {
    copy_dir(&dir.join("a").join("state"), &dir.join("b").join("state"));
}

/// Copies a running agent's state directory, as a machine's disk is cloned: a file that
/// vanishes between listing and copying (the agent's `etcd-epoch.tmp`, renamed into place) is
/// not part of the copy, as rsync has it ("file has vanished"); `cp -a` failed the test there.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        let copied = match entry.file_type() {
            Ok(kind) if kind.is_dir() => {
                copy_dir(&entry.path(), &target);
                Ok(())
            }
            Ok(_) => std::fs::copy(entry.path(), &target).map(drop),
            Err(error) => Err(error),
        };
        match copied {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => panic!("copying {}: {error}", entry.path().display()),
        }
    }
}

fn live_record(etcd: &EtcdCluster, node: &str) -> Option<(corral_cluster::LiveRecord, i64)> {
    let kv = kv(etcd);
    let entry = block_on(kv.get(format!("/corral/t/v1/live/{node}").as_bytes())).unwrap()?;
    Some((
        corral_cluster::decode_value(&entry.value).unwrap(),
        entry.lease.map_or(0, |l| l.0),
    ))
}

/// Node `node-a`'s liveness key written as another machine's agent (host `elsewhere`, pid
/// 4242, another boot) on a lease of its own of `ttl_secs`; answers the lease.
fn hold_elsewhere(kv: &corral_etcd::EtcdKv, ttl_secs: u64) -> corral_kv::LeaseId {
    let lease = block_on(kv.lease_grant(Duration::from_secs(ttl_secs))).unwrap();
    let record = serde_json::json!({
        "pid": 4242,
        "version": "0",
        "started_ms": 1_700_000_000_000u64,
        "host": "elsewhere",
        "boot_id": "another-boot",
        "pid_namespace": "pid:[1]",
        "process_start": 1,
        "ttl_ms": ttl_secs * 1000,
    });
    apply(
        kv,
        vec![TxnOp::put_on_lease(
            "/corral/t/v1/live/node-a",
            record.to_string(),
            lease,
        )],
    );
    lease
}

fn cluster_status(socket: &Path) -> corral_api::ClusterStatus {
    link_status(socket).expect("the agent reports its cluster link")
}

/// A copied state directory under the node's name (a cloned VM image) while the node's agent
/// runs: before, both served the node's CIDR and handed out the same addresses, and the one
/// stopped cleanly deleted the other's liveness key.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_copied_state_directory_under_a_live_nodes_name_exits_naming_the_holder_and_serves_nothing() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let a = Proc::serving(&etcd, &dir.path().join("a"), "node-a");
    let first = alloc_dual(&a.socket, "pod-1");
    let (record, lease) = live_record(&etcd, "node-a").expect("live/node-a");
    assert_eq!(record.pid, a.pid());
    // The clone: the running agent's state directory copied, cluster-uid and ranges with it.
    clone_state(dir.path());
    let mut b = Proc::spawn(&etcd, &dir.path().join("b"), "node-a", "3");
    let (served, code) = b.wait_exit_noting_service("the second agent exits");
    let log = b.log();
    assert!(!served, "the second agent served the node: {log}");
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("node node-a is served by another live agent")
            && log.contains(&format!("pid {}", a.pid()))
            && log.contains("since "),
        "{log}"
    );
    // The first keeps its key (the same lease) and serves on.
    let (after, after_lease) = live_record(&etcd, "node-a").expect("live/node-a stays");
    assert_eq!((after.pid, after_lease), (record.pid, lease));
    let second = alloc_dual(&a.socket, "pod-2");
    assert!(second.iter().all(|x| !first.contains(x)));
    let status = cluster_status(&a.socket);
    assert!(
        status.registered && status.last_error.is_none(),
        "{status:?}"
    );
    // Started again, the clone exits again, and the first one's key stays.
    let mut again = Proc::spawn(&etcd, &dir.path().join("b"), "node-a", "3");
    let (served, _) = again.wait_exit_noting_service("the clone exits again");
    assert!(!served);
    assert_eq!(live_record(&etcd, "node-a").unwrap().0.pid, a.pid());
    assert_sound(&etcd, &[("node-a", &a.socket)]);
}

/// An agent killed with SIGKILL leaves its liveness key until its lease expires: restarted on
/// its state directory, it proves the key its own earlier process's (same boot, that process
/// gone) and takes it at once, without waiting for the TTL (60 s here).
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_killed_and_restarted_takes_its_liveness_key_back_without_waiting_for_the_lease() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let path = dir.path().join("a");
    let a = Proc::serving_with_ttl(&etcd, &path, "node-a", "60");
    let pod = alloc_dual(&a.socket, "pod-1");
    let old_pid = a.pid();
    drop(a); // SIGKILL
    assert_eq!(live_record(&etcd, "node-a").unwrap().0.pid, old_pid);
    let mut a = Proc::spawn(&etcd, &path, "node-a", "60");
    a.wait_ready();
    let log = a.log();
    assert!(
        log.contains("took over") && log.contains("an earlier agent of this machine that is gone"),
        "{log}"
    );
    assert!(!log.contains("waiting up to"), "{log}");
    assert_eq!(live_record(&etcd, "node-a").unwrap().0.pid, a.pid());
    wait_ranges("node-a holds its ranges again", &a.socket, 2, 30);
    let kept = node_addresses(&a.socket);
    assert!(pod.iter().all(|p| kept.contains(p)));
    assert_sound(&etcd, &[("node-a", &a.socket)]);
    // A clean stop deletes its own key.
    a.signal(rustix::process::Signal::TERM);
    let _ = a.child.wait();
    assert!(live_record(&etcd, "node-a").is_none());
}

/// Another process takes the node's liveness key while the agent runs (its lease lapsed, or
/// an older agent overwrote it): the agent stops serving the node's cluster ranges (they
/// drain: pods keep their addresses) and says who holds it, instead of fighting for the key.
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_whose_liveness_key_another_process_takes_stops_serving_the_nodes_ranges() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let path = dir.path().join("a");
    let mut a = Proc::serving(&etcd, &path, "node-a");
    let pod = alloc_dual(&a.socket, "pod-1");
    // Another machine's agent writes the key on its own lease.
    let kv = kv(&etcd);
    let lease = hold_elsewhere(&kv, 5);
    wait_until("node-a's ranges drain", Duration::from_secs(30), || {
        agent_ranges(&a.socket).is_empty()
    });
    let status = cluster_status(&a.socket);
    assert!(!status.registered, "{status:?}");
    let error = status.last_error.unwrap_or_default();
    assert!(
        error.contains("another live agent") && error.contains("host elsewhere, pid 4242"),
        "{error}"
    );
    let (code, out, _) = corral(&["--socket", a.socket.to_str().unwrap(), "status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("cluster error: node node-a is served by another live agent"),
        "{out}"
    );
    // Not fighting: the other's key stays as it was written, and the agent runs on.
    let (held, held_lease) = live_record(&etcd, "node-a").unwrap();
    assert_eq!((held.pid, held_lease), (4242, lease.0));
    assert!(a.child.try_wait().unwrap().is_none());
    // The pod keeps its address in the draining range.
    let kept = node_addresses(&a.socket);
    assert!(pod.iter().all(|p| kept.contains(p)));
    // While the other holds the node, the agent serves nothing of it: check says so.
    let (code, output) = check(&etcd, &[&a.socket]);
    assert_eq!(code, 5, "{output}");
    // The other goes; the agent restarted takes the node back and serves its grants again.
    block_on(kv.lease_revoke(lease)).unwrap();
    a.signal(rustix::process::Signal::TERM);
    let _ = a.child.wait();
    let mut a = Proc::spawn(&etcd, &path, "node-a", "3");
    a.wait_ready();
    wait_ranges("node-a serves its ranges again", &a.socket, 2, 30);
    assert_sound(&etcd, &[("node-a", &a.socket)]);
}

/// The leader's election key deleted by hand (etcdctl del): before, the leader reported
/// `leading: true` for ever, every fenced write failed, and it never campaigned again.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_leader_whose_election_key_is_deleted_steps_down_and_a_leader_grants_again() {
    let (dir, etcd, operator) = cluster_with_operator_in_tempdir(DUAL);
    wait_leads(&etcd, "op-a", Duration::from_secs(30));
    let a = Proc::serving(&etcd, &dir.path().join("a"), "node-a");
    let kv = kv(&etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/election/", 100)).unwrap();
    assert_eq!(keys.len(), 1);
    let deleted = keys[0].key.clone();
    apply(&kv, vec![TxnOp::delete(deleted.clone())]);
    // It steps down and campaigns again: a new key of its own, on a new lease.
    wait_until("op-a campaigns again", Duration::from_secs(30), || {
        let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/election/", 100)).unwrap();
        keys.iter().any(|k| k.key != deleted)
    });
    let socket = dir.path().join("op-a.sock");
    wait_until("op-a leads again", Duration::from_secs(30), || {
        operator_get(&socket, "/v1/status").1["leading"] == serde_json::Value::Bool(true)
    });
    assert!(
        operator
            .log()
            .contains("is gone or replaced; stepping down")
    );
    // A leader grants again: a new node gets its CIDRs.
    let b = Proc::serving(&etcd, &dir.path().join("b"), "node-b");
    assert_sound(&etcd, &[("node-a", &a.socket), ("node-b", &b.socket)]);
}

/// An election key not on a lease (written by hand, lower than any replica's): before, it
/// blocked every replica for ever while `status` named it leader and `check` said ok.
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_election_key_not_on_a_lease_blocks_no_replica_and_is_reported() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let kv = kv(&etcd);
    let rogue = "/corral/t/v1/election/1";
    apply(&kv, vec![TxnOp::put(rogue, "rogue")]);
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    let a = Proc::serving(&etcd, &dir.path().join("a"), "node-a");
    // Reported everywhere, and not named leader.
    let (code, out, err) = cluster_command(&etcd, "status", &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("leader op-a") && out.contains(&format!("{rogue} is not on a lease")),
        "{out}"
    );
    let (code, output) = check(&etcd, &[&a.socket]);
    assert_eq!(code, 5, "{output}");
    assert!(
        output.contains(&format!("election key {rogue}")),
        "{output}"
    );
    let socket = dir.path().join("op-a.sock");
    wait_until("the operator reports it", Duration::from_secs(30), || {
        operator_get(&socket, "/v1/status").1["problems"]
            .as_array()
            .is_some_and(|p| {
                p.iter()
                    .any(|p| p.as_str().is_some_and(|p| p.contains(rogue)))
            })
    });
    apply(&kv, vec![TxnOp::delete(rogue)]);
    assert_sound(&etcd, &[("node-a", &a.socket)]);
}

/// A liveness key of another machine (another boot ID: a cloned VM): the agent cannot tell a
/// live holder from one gone, so it waits for the key's lease, serving nothing meanwhile. Kept
/// alive past its TTL, the holder is live: the agent exits naming it. Left to expire (the
/// holder is gone), the agent takes the node and serves.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_liveness_key_of_another_machine_is_waited_for_and_refused_while_kept_alive() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let kv = kv(&etcd);
    let hold = |kv: &corral_etcd::EtcdKv| hold_elsewhere(kv, 2);
    // Kept alive by "the other machine" (this test) every half second.
    let lease = hold(&kv);
    let keeping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let keeper = {
        let (kv, keeping) = (kv.clone(), std::sync::Arc::clone(&keeping));
        std::thread::spawn(move || {
            while keeping.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = block_on(kv.lease_keep_alive(lease));
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let path = dir.path().join("a");
    let mut a = Proc::spawn(&etcd, &path, "node-a", "3");
    let mut served = false;
    let mut said_why = false;
    wait_until("the agent gives up", Duration::from_secs(60), || {
        served |= a.ready();
        if let Err(error) = Client::unix(&a.socket).readyz() {
            said_why |= error.to_string().contains("host elsewhere, pid 4242");
        }
        a.child.try_wait().unwrap().is_some()
    });
    let code = a.child.wait().unwrap().code();
    let log = a.log();
    assert!(!served, "{log}");
    assert!(said_why, "readyz did not say what the agent waits for");
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("waiting up to")
            && log
                .contains("node node-a is served by another live agent (host elsewhere, pid 4242")
            && log.contains("kept alive past its TTL"),
        "{log}"
    );
    keeping.store(false, std::sync::atomic::Ordering::Relaxed);
    keeper.join().unwrap();
    // Now one that is not kept alive: the agent waits for it to expire, then serves.
    let mut a = Proc::spawn(&etcd, &path, "node-a", "3");
    a.wait_ready();
    assert!(a.log().contains("waiting up to"), "{}", a.log());
    assert_eq!(live_record(&etcd, "node-a").unwrap().0.pid, a.pid());
    wait_ranges("node-a holds its ranges", &a.socket, 2, 30);
    assert_sound(&etcd, &[("node-a", &a.socket)]);
}

/// `corral cluster check --agent A --agent B` with two agents under one node name (a copied
/// state directory started in another cluster under the same name, so both run): before, the
/// check had no rule between agents; now it names both, the overlapping ranges and the address
/// allocated on both.
#[test]
#[ignore = "needs etcd (make deps)"]
fn cluster_check_reports_two_agents_serving_one_node_and_one_address() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let a = Proc::serving(&etcd, &dir.path().join("a"), "node-a");
    let pod = alloc_dual(&a.socket, "pod-1");
    clone_state(dir.path());
    // The copy joins cluster `other` under the same node name: its copied ranges drain there
    // (the pod's addresses stay allocated).
    let mut b = Proc::spawn_with(
        &etcd,
        &dir.path().join("b"),
        &["--cluster", "other", "--node", "node-a"],
    );
    b.wait_ready();
    let (code, output) = check(&etcd, &[&a.socket, &b.socket]);
    assert_eq!(code, 5, "{output}");
    assert!(output.contains("both serve node node-a"), "{output}");
    assert!(output.contains("they overlap"), "{output}");
    for address in &pod {
        assert!(
            output.contains(&format!("{address} is allocated on agent")),
            "{output}"
        );
    }
    // The same agent named twice is one agent.
    let (_, twice) = check(&etcd, &[&a.socket, &a.socket]);
    assert!(!twice.contains("both serve"), "{twice}");
    drop(b);
    assert_sound(&etcd, &[("node-a", &a.socket)]);
}
