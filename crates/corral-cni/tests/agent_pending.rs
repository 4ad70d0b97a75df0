//! corral-ipam in agent mode while the agent is away: a DEL never fails, it is recorded under
//! `dataDir` and applied by the agent when it starts, before it serves anything; and a late
//! release never frees what a later ADD of the same attachment obtained.
//!
//! The agent runs as a real process (this test binary, re-executed into
//! [`helper_agent_process`]), so it can be killed with SIGKILL.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common;

use common::Outcome;

/// Set in the environment of the re-executed test binary: the agent's directory.
const AGENT_DIR: &str = "CORRAL_TEST_AGENT_DIR";
/// Set with it: the CNI data directory the agent scans for pending DELs (none when unset).
const AGENT_CNI_DIR: &str = "CORRAL_TEST_AGENT_CNI_DIR";

/// Not a test of its own: the agent process the other tests start and kill. Run without
/// the variables (a plain `cargo test`), it returns at once.
#[test]
fn helper_agent_process() {
    let Some(dir) = std::env::var_os(AGENT_DIR) else {
        return;
    };
    let mut config = corral_agent::AgentConfig::in_dir(Path::new(&dir));
    config.cni_data_dirs = std::env::var_os(AGENT_CNI_DIR)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    corral_agent::run(config, || {}).expect("the agent runs");
}

/// A real agent process on `dir` (socket `dir/agent.sock`), scanning `cni_dir` if given.
struct AgentProcess {
    child: Child,
}

impl AgentProcess {
    fn start(dir: &Path, cni_dir: Option<&Path>) -> AgentProcess {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "agent_pending::helper_agent_process",
                "--nocapture",
            ])
            .env(AGENT_DIR, dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(cni_dir) = cni_dir {
            command.env(AGENT_CNI_DIR, cni_dir);
        }
        AgentProcess {
            child: command.spawn().expect("the agent process starts"),
        }
    }

    /// SIGKILL: nothing of the agent runs after this returns.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The network configuration of a plugin delegating to the agent on `agent_dir` (its
/// socket), with its data in `cni_dir`.
fn conf(agent_dir: &Path, cni_dir: &Path) -> Vec<u8> {
    let socket = agent_dir.join("agent.sock");
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "pendnet",
        "type": "bridge",
        "ipam": {
            "type": "corral-ipam",
            "agent": socket,
            "dataDir": cni_dir,
            // .2 to .6: five addresses.
            "ranges": [[{"subnet": "10.8.0.0/29", "gateway": "10.8.0.1"}]],
        }
    }))
    .unwrap()
}

fn run(command: &str, container: &str, stdin: &[u8]) -> Outcome {
    common::run(command, container, "eth0", &[], stdin)
}

/// Runs `command` until the agent answers it (anything but 11, "try again later": not
/// listening yet, or restoring).
fn when_served(command: &str, container: &str, stdin: &[u8]) -> Outcome {
    let started = Instant::now();
    loop {
        let out = run(command, container, stdin);
        if out.code == 0 || out.error_code() != 11 {
            return out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the agent never served {command} {container}: {}",
            out.stdout
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pending_records(cni_dir: &Path) -> Vec<String> {
    match std::fs::read_dir(cni_dir.join("corral.pending")) {
        Ok(listing) => listing
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn check_holds(stdin: &[u8], container: &str, address: &str) -> Outcome {
    let mut config: Value = serde_json::from_slice(stdin).unwrap();
    config["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": address}]});
    run("CHECK", container, &serde_json::to_vec(&config).unwrap())
}

/// Regression: with the agent down, DEL failed with 11; podman ignores that, so the address
/// leaked (and the bridge plugin stopped early, leaving its iptables chain).
#[test]
fn a_del_while_the_agent_is_down_is_applied_before_the_agent_serves_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (agent_dir, cni_dir) = (dir.path().join("agent"), dir.path().join("cni"));
    let stdin = conf(&agent_dir, &cni_dir);
    let agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    let mut held = Vec::new();
    for c in ["c1", "c2", "c3", "c4", "c5"] {
        held.extend(when_served("ADD", c, &stdin).addresses());
    }
    assert_eq!(
        held,
        [
            "10.8.0.2/29",
            "10.8.0.3/29",
            "10.8.0.4/29",
            "10.8.0.5/29",
            "10.8.0.6/29"
        ]
    );
    agent.kill();

    let del = run("DEL", "c1", &stdin);
    assert_eq!((del.code, del.stdout.as_str()), (0, ""), "{}", del.stderr);
    assert!(del.stderr.contains("recorded"), "{}", del.stderr);
    // Idempotent while the agent is away, too.
    assert_eq!(run("DEL", "c1", &stdin).code, 0);
    assert_eq!(pending_records(&cni_dir).len(), 1);

    // The first request the restarted agent serves already finds c1's address free: the
    // pool is otherwise full, so this ADD succeeds only if the release came first.
    let _agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    let c6 = when_served("ADD", "c6", &stdin);
    assert_eq!(c6.addresses(), ["10.8.0.2/29"], "{}", c6.stdout);
    assert!(pending_records(&cni_dir).is_empty());
}

/// podman restarts a container with the same ID and interface: a DEL recorded while the agent
/// was away must never release what the ADD after it obtained, whoever applies the record.
#[test]
fn a_late_del_never_releases_what_a_later_add_of_the_same_attachment_got() {
    let dir = tempfile::tempdir().unwrap();
    let (agent_dir, cni_dir) = (dir.path().join("agent"), dir.path().join("cni"));
    let stdin = conf(&agent_dir, &cni_dir);

    // The record settled by the ADD itself: this agent does not scan the CNI directory.
    let agent = AgentProcess::start(&agent_dir, None);
    let first = when_served("ADD", "k1", &stdin).addresses();
    assert_eq!(first, ["10.8.0.2/29"]);
    agent.kill();
    assert_eq!(run("DEL", "k1", &stdin).code, 0);
    let agent = AgentProcess::start(&agent_dir, None);
    // Before the ADD is sent, its own pending DEL is delivered: k1 gets a new address
    // (the old one is cooling), not the one the DEL releases.
    let second = when_served("ADD", "k1", &stdin).addresses();
    assert_eq!(second, ["10.8.0.3/29"]);
    assert!(pending_records(&cni_dir).is_empty());
    agent.kill();
    // An agent that scans the directory finds nothing left to release.
    let agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    assert_eq!(when_served("CHECK", "k1", &stdin).code, 0);
    assert_eq!(check_holds(&stdin, "k1", "10.8.0.3/29").code, 0);

    // The record applied by the agent at its start: the next ADD gets a new address, which a
    // further restart leaves alone.
    agent.kill();
    assert_eq!(run("DEL", "k1", &stdin).code, 0);
    let agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    let third = when_served("ADD", "k1", &stdin).addresses();
    assert_eq!(third, ["10.8.0.4/29"]);
    agent.kill();
    let _agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    let check = when_served("CHECK", "k1", &stdin);
    assert_eq!(check.code, 0, "{}", check.stdout);
    assert_eq!(check_holds(&stdin, "k1", "10.8.0.4/29").code, 0);
}

/// A record the agent cannot read is reported and left alone; the agent still starts.
#[test]
fn a_malformed_record_is_left_alone_and_the_agent_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (agent_dir, cni_dir) = (dir.path().join("agent"), dir.path().join("cni"));
    let pending = cni_dir.join("corral.pending");
    std::fs::create_dir_all(&pending).unwrap();
    std::fs::write(pending.join("0123.del"), "{not a record").unwrap();
    let _agent = AgentProcess::start(&agent_dir, Some(&cni_dir));
    let stdin = conf(&agent_dir, &cni_dir);
    assert_eq!(when_served("ADD", "c1", &stdin).code, 0);
    assert_eq!(
        std::fs::read(pending.join("0123.del")).unwrap(),
        b"{not a record"
    );
}
