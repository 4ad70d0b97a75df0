//! The daemons stop when asked (issue 24): `corral operator` and `corral agent` as real
//! processes, each brought into one state (proved by what it logs or what etcd holds, never by
//! a sleep), then sent SIGTERM or SIGINT. Each must exit with status 0, and leave behind what a
//! clean stop leaves: a replica's election key revoked (its standby leads at once, not after
//! the lease's TTL), an agent's state directory with its allocations. The bound on each wait
//! only catches a hang; a hang is the failure (before, a replica waiting for `cluster init`
//! ignored both signals and ran for 10 minutes until killed).

use crate::cluster_common;
use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use cluster_common::{
    DUAL, alloc_dual, block_on, endpoints, initialized, initialized_in_tempdir, kv, start_agent,
    start_etcd, wait_leads, wait_ranges, wait_showing,
};
use common::{Agent, BINARY};
use corral_client::Client;
use corral_etcd::testing::EtcdCluster;
use corral_kv::Kv as _;
use rustix::process::Signal;

/// Long enough for any clean stop on a loaded machine; only a hang takes longer.
const HANG: Duration = Duration::from_secs(60);

/// A daemon (a `corral operator` replica of cluster `t`, or an agent not waited on until it
/// is ready), what it says in its log file.
struct Replica {
    child: Child,
    log: PathBuf,
}

impl Replica {
    /// `corral ARGS`, its stderr in `log`; not waited on.
    fn command(args: &[&OsStr], log: PathBuf) -> Replica {
        let child = common::spawn_logged(Command::new(BINARY).args(args), &log);
        Replica { child, log }
    }

    /// Replica `name` on the etcd at `etcd` (comma-separated URLs) with `extra` arguments.
    fn spawn(etcd: &str, dir: &Path, name: &str, extra: &[&OsStr]) -> Replica {
        let log = dir.join(format!("{name}.log"));
        let child = common::spawn_logged(
            Command::new(BINARY)
                .args([
                    "operator",
                    "--etcd",
                    etcd,
                    "--cluster",
                    "t",
                    "--replica",
                    name,
                ])
                .arg("--api-socket")
                .arg(dir.join(format!("{name}.sock")))
                .args(extra),
            &log,
        );
        Replica { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the replica's log says `line` (and fails if it exits first).
    fn wait_log(&mut self, line: &str) {
        let log = self.log.clone();
        let read = || std::fs::read_to_string(&log).unwrap_or_default();
        let child = &mut self.child;
        wait_showing(
            &format!("the daemon logs {line:?}"),
            HANG,
            || {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "the daemon exited: {}",
                    read()
                );
                read().contains(line)
            },
            read,
        );
    }

    fn signal(&self, signal: Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits for the replica to exit; `HANG` only catches a hang.
    fn wait_exit(&mut self) -> ExitStatus {
        common::wait_exit(&mut self.child, HANG, "the daemon", &self.log)
    }

    /// Sends `signal` and checks the replica exits with status 0 and says why it stopped.
    fn stop_with(&mut self, signal: Signal, name: &str) {
        self.signal(signal);
        let status = self.wait_exit();
        let log = self.log();
        assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
        assert!(
            log.contains("stopping") && log.contains(name),
            "the daemon does not say it stops on {name}:\n{log}"
        );
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An etcd URL nothing listens on.
fn unreachable_etcd() -> String {
    let port = corral_etcd::testing::free_ports(1).unwrap()[0];
    format!("http://127.0.0.1:{port}")
}

/// The election keys of cluster `t`, as (replica, lease).
fn election_keys(etcd: &EtcdCluster) -> Vec<String> {
    let kv = kv(etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/election/", 100)).unwrap();
    keys.into_iter()
        .map(|k| String::from_utf8_lossy(&k.value).into_owned())
        .collect()
}

/// Waits until `n` replicas are in the election (each has its key).
fn wait_candidates(etcd: &EtcdCluster, n: usize) {
    wait_showing(
        &format!("{n} replicas campaign"),
        HANG,
        || election_keys(etcd).len() == n,
        || format!("{:?}", election_keys(etcd)),
    );
}

/// One etcd member and cluster `t` on it (`DUAL`), with replicas op-a, the leader, and op-b,
/// its standby in the election (leases of 60 s).
fn leader_and_standby(dir: &Path) -> (EtcdCluster, Replica, Replica) {
    let etcd = initialized(1, dir, DUAL);
    let ttl: [&OsStr; 2] = ["--lease-ttl".as_ref(), "60".as_ref()];
    let leader = Replica::spawn(&endpoints(&etcd), dir, "op-a", &ttl);
    wait_leads(&etcd, "op-a", HANG);
    let standby = Replica::spawn(&endpoints(&etcd), dir, "op-b", &ttl);
    wait_candidates(&etcd, 2);
    (etcd, leader, standby)
}

/// A leader on `members` etcd members, then `killed` of them killed: it says it stopped
/// leading, and stops on `signal` (`name`) all the same.
fn leader_losing_etcd_stops(members: usize, killed: usize, signal: Signal, name: &str) {
    let (dir, mut etcd) = initialized_in_tempdir(members, DUAL);
    let mut leader = Replica::spawn(&endpoints(&etcd), dir.path(), "op-a", &[]);
    wait_leads(&etcd, "op-a", HANG);
    for member in 0..killed {
        etcd.kill(member).unwrap();
    }
    leader.wait_log("stopped leading");
    leader.stop_with(signal, name);
}

/// The regression: a replica started before `cluster init` leads and waits for the
/// configuration; SIGTERM used to be ignored there. It stops, and its election key goes with it.
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_operator_waiting_for_cluster_init_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(1);
    let mut replica = Replica::spawn(&endpoints(&etcd), dir.path(), "op-a", &[]);
    replica.wait_log("waiting for `corral cluster init`");
    replica.stop_with(Signal::TERM, "SIGTERM");
    assert_eq!(election_keys(&etcd), Vec::<String>::new());
}

/// A standby (its campaign waiting for the leader's key to go) stops on SIGINT, and the
/// leader leads on undisturbed.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_standby_operator_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, _leader, mut standby) = leader_and_standby(dir.path());
    standby.stop_with(Signal::INT, "SIGINT");
    assert_eq!(election_keys(&etcd), vec!["op-a".to_owned()]);
}

/// The leader, granting to a burst of registered nodes, stops on SIGTERM and resigns: its
/// election key is gone when it has exited (its lease of 60 s did not have to run out), and
/// the standby leads and grants the rest.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_leading_operator_stops_on_sigterm_and_its_standby_leads_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, mut leader, _standby) = leader_and_standby(dir.path());
    let nodes: Vec<String> = (0..40).map(|i| format!("node-{i:02}")).collect();
    cluster_common::register(&etcd, nodes.clone());
    // Mid-grant: the first grants are in, not all of them.
    wait_showing(
        "the leader grants",
        HANG,
        || !cluster_common::grants(&etcd).is_empty(),
        || leader.log(),
    );
    leader.stop_with(Signal::TERM, "SIGTERM");
    // Resigned: only the standby's key is left, well within the leader's lease.
    assert_eq!(election_keys(&etcd), vec!["op-b".to_owned()]);
    wait_leads(&etcd, "op-b", HANG);
    wait_showing(
        "every node has its grants",
        HANG,
        || cluster_common::grants(&etcd).len() == nodes.len(),
        String::new,
    );
}

/// A leader whose etcd is gone (killed) stops on SIGTERM all the same.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_leading_operator_whose_etcd_is_gone_stops_on_sigterm() {
    leader_losing_etcd_stops(1, 1, Signal::TERM, "SIGTERM");
}

/// A leader whose etcd lost quorum (two of three members killed: the one left answers "no
/// leader", its calls wait for one until their timeout) stops on SIGINT all the same.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_leading_operator_whose_etcd_lost_quorum_stops_on_sigint() {
    leader_losing_etcd_stops(3, 2, Signal::INT, "SIGINT");
}

/// A replica that never reached etcd (nothing listens there) keeps retrying the election; it
/// stops on SIGTERM and on SIGINT.
#[test]
fn an_operator_that_cannot_reach_etcd_stops_on_sigterm_and_sigint() {
    let dir = tempfile::tempdir().unwrap();
    for (name, signal) in [("SIGTERM", Signal::TERM), ("SIGINT", Signal::INT)] {
        let mut replica = Replica::spawn(&unreachable_etcd(), dir.path(), name, &[]);
        replica.wait_log("joining the election");
        replica.stop_with(signal, name);
    }
}

/// An agent serving its allocations stops on SIGTERM (and another time on SIGINT), and its
/// allocations are there when it starts again.
#[test]
fn a_serving_agent_stops_on_sigterm_and_sigint_and_keeps_its_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let (state, socket) = (dir.path().join("state"), dir.path().join("agent.sock"));
    let mut expected = Vec::new();
    for (name, signal) in [("SIGTERM", Signal::TERM), ("SIGINT", Signal::INT)] {
        let mut agent = Agent::serve(&state, &socket);
        assert_eq!(
            cluster_common::node_addresses(&socket).len(),
            expected.len()
        );
        expected.extend(alloc_dual(&socket, &format!("pod-{name}")));
        stop_agent(&mut agent, signal, name);
        assert!(!socket.exists(), "the socket is removed on a clean stop");
    }
    let _agent = Agent::serve(&state, &socket);
    let held = cluster_common::node_addresses(&socket);
    assert!(expected.iter().all(|a| held.contains(a)), "{held:?}");
}

/// An agent still restoring its state (held there for good by a debug build's test switch;
/// it answers 503 meanwhile) stops on SIGTERM without waiting for the restore, and the
/// state directory is whole: the next agent restores the allocations it held.
#[test]
fn an_agent_restoring_its_state_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (state, socket) = (dir.path().join("state"), dir.path().join("agent.sock"));
    let mut agent = Agent::serve(&state, &socket);
    let held = alloc_dual(&socket, "pod-a");
    stop_agent(&mut agent, Signal::TERM, "SIGTERM");
    let log = dir.path().join("restoring.log");
    let child = common::spawn_logged(
        Command::new(BINARY)
            .args(["agent", "--data-dir"])
            .arg(&state)
            .arg("--socket")
            .arg(&socket)
            .env("CORRAL_AGENT_TEST_HOLD_RESTORE", "1"),
        &log,
    );
    let mut restoring = Replica { child, log };
    restoring.wait_log("the restore is held");
    // Its socket answers, and says it is restoring.
    let refused = Client::unix(&socket).readyz().unwrap_err().to_string();
    assert!(refused.contains("restoring"), "{refused}");
    restoring.stop_with(Signal::TERM, "SIGTERM");
    assert!(
        restoring
            .log()
            .contains("stopped before the agent was ready"),
        "{}",
        restoring.log()
    );
    assert!(!socket.exists(), "the socket is removed on a clean stop");
    let _agent = Agent::serve(&state, &socket);
    let now = cluster_common::node_addresses(&socket);
    assert!(held.iter().all(|a| now.contains(a)), "{now:?}");
}

/// An agent with a request in flight (its head sent, its body not yet) stops on SIGTERM: the
/// request is answered or its connection closed, and the agent exits.
#[test]
fn an_agent_with_a_request_in_flight_stops_on_sigterm() {
    use std::io::{Read, Write};
    let (_dir, mut agent) = Agent::start_in_tempdir();
    let mut stream = std::os::unix::net::UnixStream::connect(&agent.socket).unwrap();
    write!(
        stream,
        "POST /v1/allocate HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"scope\":"
    )
    .unwrap();
    stream.flush().unwrap();
    // The agent has the connection once it answers another: requests are served in order of
    // arrival on one listener.
    Client::unix(&agent.socket).readyz().unwrap();
    stop_agent(&mut agent, Signal::TERM, "SIGTERM");
    // The connection ends (answered or closed); it does not hang.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
}

/// An agent joined to a cluster whose etcd is unreachable from the start (it serves what it
/// holds, degraded, and retries) stops on SIGTERM.
#[test]
fn an_agent_waiting_for_an_unreachable_etcd_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let config = cluster_common::agent_config(dir.path());
    let etcd = unreachable_etcd();
    let args: Vec<&OsStr> = vec![
        "--config".as_ref(),
        config.as_os_str(),
        "--etcd".as_ref(),
        etcd.as_ref(),
        "--node".as_ref(),
        "node-a".as_ref(),
    ];
    let mut agent = Agent::start(&args, &socket);
    stop_after_a_failed_round(&mut agent, "the agent says etcd is unreachable");
}

/// An agent whose node's liveness key is held by a process it cannot judge (a record it
/// cannot read, on a live lease) waits for that lease before it registers as live and serves
/// anything; it stops on SIGTERM there, and revokes its own lease (its node's key stays the
/// other's).
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_waiting_for_its_nodes_liveness_key_stops_on_sigterm() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let kv = kv(&etcd);
    let key = "/corral/t/v1/live/node-a";
    let lease = block_on(kv.lease_grant(Duration::from_secs(600))).unwrap();
    block_on(kv.txn(corral_kv::Txn {
        compares: vec![],
        success: vec![corral_kv::TxnOp::put_on_lease(key, "not a record", lease)],
        failure: vec![],
    }))
    .unwrap();
    let config = cluster_common::agent_config(dir.path());
    let endpoints = endpoints(&etcd);
    let mut args: Vec<&OsStr> = vec!["agent".as_ref()];
    args.extend(cluster_common::agent_args(&config, &endpoints, "node-a"));
    let mut agent = Replica::command(&args, dir.path().join("agent.log"));
    agent.wait_log("waiting up to");
    agent.stop_with(Signal::TERM, "SIGTERM");
    let held = block_on(kv.get(key.as_bytes())).unwrap().unwrap();
    assert_eq!(held.lease, Some(lease));
    // Only the other's lease is left: the agent revoked the one it made for its own key.
    let listed = Command::new(corral_etcd::testing::etcdctl_binary().unwrap())
        .args(["--endpoints", &endpoints, "lease", "list"])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.starts_with("found 1 leases"), "{listed}");
    assert!(listed.contains(&format!("{:x}", lease.0)), "{listed}");
}

/// An agent holding its node's grants, whose etcd then goes, stops on SIGTERM; its grants and
/// allocations are in its state when it starts again (etcd back).
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_whose_etcd_is_gone_stops_on_sigterm_and_keeps_its_state() {
    let (dir, mut etcd) = initialized_in_tempdir(1, DUAL);
    let operator = Replica::spawn(&endpoints(&etcd), dir.path(), "op-a", &[]);
    let path = dir.path().join("a");
    let mut agent = start_agent(&etcd, &path, "node-a");
    wait_ranges("node-a holds its ranges", &agent.socket, 2, 60);
    let pod = alloc_dual(&agent.socket, "pod-1");
    drop(operator);
    etcd.kill(0).unwrap();
    stop_after_a_failed_round(&mut agent, "the agent sees etcd gone");
    etcd.restart(0).unwrap();
    let agent = start_agent(&etcd, &path, "node-a");
    let held = cluster_common::node_addresses(&agent.socket);
    assert!(pod.iter().all(|a| held.contains(a)), "{held:?}");
}

/// Waits until `agent` logs a failed round of its cluster link (`what`, if it never does),
/// then stops it with SIGTERM as `stop_agent` does.
fn stop_after_a_failed_round(agent: &mut Agent, what: &str) {
    wait_showing(
        what,
        HANG,
        || agent.log().contains("cluster link round failed"),
        || agent.log(),
    );
    stop_agent(agent, Signal::TERM, "SIGTERM");
}

/// Sends `signal` to the agent and checks it exits with status 0, saying it stops.
fn stop_agent(agent: &mut Agent, signal: Signal, name: &str) {
    agent.signal(signal);
    let status = agent.wait_exit(HANG);
    let log = agent.log();
    assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
    assert!(
        log.contains("stopping") && log.contains(name),
        "the agent does not say it stops on {name}:\n{log}"
    );
}
