//! Reserving local routes end to end: the real `corral agent` runs inside a network namespace
//! this test creates, with real interfaces, addresses and routes it reads through netlink;
//! the `corral` command line talks to it over its unix socket (a file, reachable from any
//! namespace).
//!
//! Needs root and iproute2 (`make test` runs it); without them the test fails and says what
//! is missing, it never passes quietly. The namespace is deleted afterwards, also on failure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_corral");

fn require(ok: bool, what: &str) {
    assert!(
        ok,
        "this test needs {what}; run `make test`, which installs it (as root)"
    );
}

fn sh(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"))
}

/// Runs `ip -n NS ARGS...` and insists it worked.
fn ip(namespace: &str, args: &str) {
    let mut all = vec!["ip", "-n", namespace];
    all.extend(args.split_whitespace());
    let out = sh(&all);
    assert!(
        out.status.success(),
        "{}: {}",
        all.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    String::from_utf8_lossy(&sh(&["id", "-u"]).stdout).trim() == "0"
}

/// Deletes the namespace (and with it its interfaces and routes) even when an assertion
/// fails.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "delete", &self.0]);
    }
}

/// `corral agent` inside the namespace (`ip netns exec` execs it: the child is the agent),
/// killed when dropped.
struct Agent {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Agent {
    fn start(namespace: &str, dir: &Path) -> Agent {
        let socket = dir.join("agent.sock");
        let log = dir.join("agent.log");
        let child = Command::new("ip")
            .args(["netns", "exec", namespace, BINARY, "agent", "--config"])
            .arg(dir.join("agent.toml"))
            .arg("--data-dir")
            .arg(dir.join("state"))
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("ip netns exec corral agent starts");
        let mut agent = Agent { child, socket, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while corral_client::Client::unix(&agent.socket).readyz().is_err() {
            let exited = agent.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "the agent did not become ready (exit: {exited:?}); its log:\n{}",
                fs::read_to_string(&agent.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        agent
    }

    /// `corral --socket ... ARGS`, from the test's own namespace.
    fn corral(&self, args: &[&str]) -> Output {
        Command::new(BINARY)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// `corral -o json ARGS`, which must succeed.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-o", "json"];
        all.extend(args);
        let out = self.corral(&all);
        assert!(
            out.status.success(),
            "corral {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The default pool's exclusions, as `NETWORK REASON`.
    fn exclusions(&self) -> Vec<String> {
        let pools = self.json(&["pool", "list"]);
        let pool = pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "default")
            .expect("the default pool")
            .clone();
        pool["exclusions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                format!(
                    "{} {}",
                    e["network"].as_str().unwrap(),
                    e["reason"].as_str().unwrap()
                )
            })
            .collect()
    }

    fn allocate(&self, args: &[&str]) -> String {
        let mut all = vec!["alloc", "--owner", "test"];
        all.extend(args);
        self.json(&all)["allocations"][0]["address"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn reserve(&self) -> Value {
        self.json(&["pool", "reserve-local-routes"])
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn networks(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["network"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
#[ignore = "needs root and network namespaces; `make test` runs it"]
fn local_routes_and_addresses_in_a_real_namespace_are_excluded() {
    require(is_root(), "root (to create a network namespace)");
    require(sh(&["ip", "-V"]).status.success(), "iproute2 (`ip`)");
    let namespace = format!("corral-routes-{}", std::process::id());
    let created = sh(&["ip", "netns", "add", &namespace]);
    assert!(
        created.status.success(),
        "ip netns add: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let _namespace = Namespace(namespace.clone());
    let ns = namespace.as_str();
    ip(ns, "link set lo up");
    // The node's uplink (`dummy0`): its own address inside the pod range, and routes into the range.
    // (A veth pair: the dummy driver is not in every kernel, veth is wherever containers
    // run.)
    ip(ns, "link add dummy0 type veth peer name dummy0peer");
    ip(ns, "link set dummy0peer up");
    ip(ns, "link set dummy0 up");
    ip(ns, "addr add 10.77.0.1/32 dev dummy0");
    ip(ns, "addr add fd77::1/128 dev dummy0 nodad");
    ip(ns, "route add 10.77.0.2/31 dev dummy0");
    ip(ns, "route add 10.77.0.8/29 dev dummy0");
    // The pool's bridge: it holds the range's gateway, so its subnet route, its address and
    // the kernel's local and broadcast routes for it are the pool's own.
    ip(ns, "link add cni0 type bridge");
    ip(ns, "link set cni0 up");
    ip(ns, "addr add 10.77.0.254/24 dev cni0");
    // A default route wider than the pool excludes nothing.
    ip(ns, "route add default dev dummy0");

    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("agent.toml"),
        "[[pools]]\nname = \"default\"\n\
         ranges = [\"10.77.0.0/24,gateway=10.77.0.254\", \"fd77::/120\"]\ncooldown_ms = 0\n",
    )
    .unwrap();
    let agent = Agent::start(ns, dir.path());

    // At start, before anything is handed out.
    let expected_at_start = [
        "10.77.0.1/32 local address 10.77.0.1 of dummy0",
        "10.77.0.2/31 local route 10.77.0.2/31 dev dummy0",
        "10.77.0.8/29 local route 10.77.0.8/29 dev dummy0",
        "fd77::1/128 local address fd77::1 of dummy0",
    ];
    let mut exclusions = agent.exclusions();
    exclusions.sort();
    assert_eq!(exclusions, expected_at_start);

    // Allocations skip them.
    let v4: Vec<String> = (0..5).map(|_| agent.allocate(&[])).collect();
    assert_eq!(
        v4,
        [
            "10.77.0.4",
            "10.77.0.5",
            "10.77.0.6",
            "10.77.0.7",
            "10.77.0.16"
        ]
    );
    assert_eq!(agent.allocate(&["--family", "ipv6"]), "fd77::2");
    let refused = agent.corral(&["alloc", "--owner", "test", "--address", "10.77.0.9"]);
    assert_eq!(
        refused.status.code(),
        Some(1),
        "an excluded address is refused"
    );

    // A second request changes nothing.
    let again = agent.reserve();
    assert_eq!(again["added"], Value::Array(vec![]));
    assert_eq!(again["removed"], Value::Array(vec![]));
    assert_eq!(again["conflicts"], Value::Array(vec![]));
    let mut excluded = networks(&again["excluded"]);
    excluded.sort();
    assert_eq!(
        excluded,
        [
            "10.77.0.1/32",
            "10.77.0.2/31",
            "10.77.0.8/29",
            "fd77::1/128"
        ]
    );
    let table = agent.corral(&["pool", "reserve-local-routes"]);
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).contains("unchanged"));

    // A removed route's exclusion goes with the next request.
    ip(ns, "route del 10.77.0.8/29 dev dummy0");
    let after = agent.reserve();
    assert_eq!(networks(&after["removed"]), ["10.77.0.8/29"]);
    assert!(!networks(&after["excluded"]).contains(&"10.77.0.8/29".to_owned()));
    assert_eq!(agent.allocate(&["--address", "10.77.0.9"]), "10.77.0.9");

    // A route over an allocated address: the address stays allocated and is reported; the
    // rest of the route is excluded around it.
    ip(ns, "route add 10.77.0.16/29 dev dummy0");
    let conflicted = agent.reserve();
    assert_eq!(
        networks(&conflicted["added"]),
        ["10.77.0.17/32", "10.77.0.18/31", "10.77.0.20/30"]
    );
    assert_eq!(conflicted["conflicts"][0]["address"], "10.77.0.16");
    assert_eq!(conflicted["conflicts"][0]["owner"], "test");
    let dump = agent.json(&["dump"]);
    assert!(dump.to_string().contains("\"10.77.0.16\""), "{dump}");

    // A route removed while the agent is down is unexcluded when it starts again, and what
    // was allocated is still there.
    drop(agent);
    ip(ns, "route del 10.77.0.2/31 dev dummy0");
    let agent = Agent::start(ns, dir.path());
    let mut exclusions = agent.exclusions();
    exclusions.sort();
    assert_eq!(
        exclusions,
        [
            "10.77.0.1/32 local address 10.77.0.1 of dummy0",
            "10.77.0.17/32 local route 10.77.0.16/29 dev dummy0",
            "10.77.0.18/31 local route 10.77.0.16/29 dev dummy0",
            "10.77.0.20/30 local route 10.77.0.16/29 dev dummy0",
            "fd77::1/128 local address fd77::1 of dummy0",
        ]
    );
    let dump = agent.json(&["dump"]).to_string();
    for address in ["10.77.0.4", "10.77.0.9", "10.77.0.16", "fd77::2"] {
        assert!(
            dump.contains(&format!("\"{address}\"")),
            "{address}: {dump}"
        );
    }
    // The agent logged the conflict it found at start.
    drop(agent);
    let log = fs::read_to_string(dir.path().join("agent.log")).unwrap();
    assert!(
        log.lines()
            .any(|line| line.contains("local routes: conflict")
                && line.contains("address=10.77.0.16 pool=default owner=\"test\"")),
        "{log}"
    );
}
