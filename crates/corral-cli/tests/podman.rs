//! A real container runtime: Debian's podman (CNI backend, runc) runs containers on a bridge
//! network whose IPAM is corral-ipam in agent mode, the agent joined to a cluster on real etcd
//! with a real operator granting it the node's range. The image is imported from Debian's
//! busybox-static (nothing is pulled from a registry). Each container sees its address inside,
//! `podman rm` gives it back (also while the agent is down: once it is back), a container that
//! exited holds none, and a `podman run` that fails after the IPAM ADD (the command is not in
//! the image; a later plugin of the network fails) leaves nothing behind.
//!
//! podman is configured for this test only: `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF`
//! name files in the test's temporary directory (storage, run state, CNI configuration and
//! events there too; only libcni's cache is global, /var/lib/cni/results, and the test checks
//! it keeps nothing of its networks); the plugin directory holds Debian's bridge and tuning
//! plugins and the built corral-ipam. What podman needed on this machine (the containers'
//! ulimits) is in docs/install.md, "Container runtimes".
//!
//! Needs root, podman, runc, busybox-static, Debian's CNI plugins and etcd (`make deps`
//! installs them); without them the test fails and says what is missing. Every container,
//! the networks, their bridge and the containers' network namespaces are removed afterwards,
//! also when an assertion fails.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use corral_api::history::{HistoryFilter, HistoryKind};
use corral_client::Client;

use crate::cluster_common;
use crate::common;

use cluster_common::*;

/// The cluster's pool: /24s of 10.237.0.0/16 for the nodes (a CIDR no other test uses: the
/// bridge and its route live in the host's network namespace).
const CLUSTER: &str = r#"[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.237.0.0/16"]
node_prefix_len = 24
"#;

/// The network's name (its configuration lives in the test's own directory).
const NETWORK: &str = "corral-podman";

/// The same bridge, then a plugin that fails (Debian's tuning, setting a sysctl that does not
/// exist): the CNI ADD fails after corral-ipam's.
const CHAIN: &str = "corral-podman-fails";

/// The image, imported from busybox-static.
const IMAGE: &str = "localhost/corral-busybox:test";

/// How many containers run at once.
const CONTAINERS: usize = 4;

/// Debian's CNI plugins (containernetworking-plugins).
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// Debian's busybox-static.
const BUSYBOX: &str = "/bin/busybox";

fn require(ok: bool, what: &str) {
    assert!(
        ok,
        "this test needs {what}; run `make test`, which installs it (as root)"
    );
}

/// podman with this test's configuration, its state under one directory.
struct Podman {
    dir: PathBuf,
    /// The bridge the network's configuration names (at most 15 bytes, unique to this run).
    bridge: String,
}

impl Podman {
    /// Writes the configuration files: `containers.conf` (CNI backend, runc, cgroupfs, events
    /// to a file, the ulimits this machine needs), `storage.conf` (vfs, under `dir`), the
    /// plugin directory (Debian's bridge and tuning, and `plugin`) and the networks: a bridge
    /// whose IPAM asks the agent on `socket` (recording a DEL it is not there for in
    /// `data_dir`), and the same followed by a plugin that fails.
    fn configure(dir: &Path, plugin: &Path, socket: &Path, data_dir: &Path) -> Podman {
        let bridge = format!("corral{}", std::process::id() % 1_000_000);
        let bin = dir.join("cni-bin");
        let networks = dir.join("cni-conf");
        for sub in [&bin, &networks, &dir.join("tmp")] {
            std::fs::create_dir_all(sub).unwrap();
        }
        std::os::unix::fs::symlink(Path::new(CNI_PLUGINS).join("bridge"), bin.join("bridge"))
            .unwrap();
        std::os::unix::fs::symlink(plugin, bin.join("corral-ipam")).unwrap();
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\n\
                 default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\n\
                 [engine]\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\n\
                 events_logfile_path = {:?}\n\
                 runtime = \"runc\"\n\
                 tmp_dir = {:?}\n\n\
                 [network]\n\
                 network_backend = \"cni\"\n\
                 cni_plugin_dirs = [{:?}]\n\
                 network_config_dir = {:?}\n",
                dir.join("events.log"),
                dir.join("tmp"),
                bin,
                networks,
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = {:?}\nrunroot = {:?}\n",
                dir.join("root"),
                dir.join("run"),
            ),
        )
        .unwrap();
        let network = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "corral-ipam",
                    "agent": socket,
                    "dataDir": data_dir,
                },
            }],
        });
        std::fs::write(
            networks.join(format!("{NETWORK}.conflist")),
            serde_json::to_vec_pretty(&network).unwrap(),
        )
        .unwrap();
        let mut chain = network.clone();
        chain["name"] = CHAIN.into();
        chain["plugins"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "type": "tuning",
                "sysctl": {"net.ipv4.conf.eth0.no_such_setting": "1"},
            }));
        std::fs::write(
            networks.join(format!("{CHAIN}.conflist")),
            serde_json::to_vec_pretty(&chain).unwrap(),
        )
        .unwrap();
        std::os::unix::fs::symlink(Path::new(CNI_PLUGINS).join("tuning"), bin.join("tuning"))
            .unwrap();
        Podman {
            dir: dir.to_path_buf(),
            bridge,
        }
    }

    /// `podman ARGS`: what it did.
    fn run(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run podman (make deps installs it): {e}"))
    }

    /// `podman ARGS`, which must succeed: its standard output, trimmed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `podman run --name NAME --network NETWORK IMAGE COMMAND` in the foreground: what it did,
    /// and the container's ID (it stays: exited, or created and never started).
    fn run_once(&self, name: &str, network: &str, command: &str) -> (Output, String) {
        let out = self.run(&["run", "--name", name, "--network", network, IMAGE, command]);
        let id = self.ok(&["inspect", "--format", "{{.Id}}", name]);
        (out, id)
    }

    /// The image: `/bin/busybox` and symlinks to it in a tar, `podman import`ed.
    fn import_busybox(&self) {
        let root = self.dir.join("image");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::copy(BUSYBOX, root.join("bin/busybox")).unwrap();
        for applet in ["sh", "ip", "sleep", "true"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let tar = self.dir.join("image.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.ok(&["import", tar.to_str().unwrap(), IMAGE]);
    }

    /// The container's network namespace (a file under /run/netns).
    fn netns(&self, container: &str) -> PathBuf {
        PathBuf::from(self.ok(&[
            "inspect",
            "--format",
            "{{.NetworkSettings.SandboxKey}}",
            container,
        ]))
    }

    /// The IPv4 addresses of `eth0` as the container sees them (`ip -4 addr` inside).
    fn addresses_inside(&self, container: &str) -> Vec<IpAddr> {
        let shown = self.ok(&[
            "exec", container, "ip", "-4", "-o", "addr", "show", "dev", "eth0",
        ]);
        // One line per address: `2: eth0    inet 10.237.0.2/24 brd ...`.
        shown
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                words.find(|word| *word == "inet")?;
                words.next()
            })
            .map(|cidr| cidr.split('/').next().unwrap().parse().unwrap())
            .collect()
    }

    fn bridge_exists(&self) -> bool {
        Path::new("/sys/class/net").join(&self.bridge).exists()
    }
}

impl Drop for Podman {
    /// Removes every container, the image, the network and its bridge, whatever the test got
    /// to (errors ignored: some of it may never have been made).
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["network", "rm", "--force", NETWORK, CHAIN]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        if self.bridge_exists() {
            let _ = Command::new("ip")
                .args(["link", "delete", &self.bridge])
                .output();
        }
    }
}

/// What the agent holds in its node scope: address → the container it is attached to.
fn held(socket: &Path) -> Vec<(IpAddr, String)> {
    let dump = Client::unix(socket).dump(Some("node")).unwrap();
    dump.scopes
        .iter()
        .flat_map(|s| &s.pools)
        .flat_map(|p| &p.allocations)
        .map(|a| {
            let key = a.key.as_ref().expect("a CNI allocation has its attachment");
            assert!([NETWORK, CHAIN].contains(&key.network.as_str()), "{a:?}");
            assert_eq!(key.ifname, "eth0", "{a:?}");
            (a.address, key.container_id.clone())
        })
        .collect()
}

/// The agent's history of container `id`'s attachment, oldest first: (event, address).
fn history(socket: &Path, id: &str) -> Vec<(HistoryKind, IpAddr)> {
    let filter = HistoryFilter {
        key: Some(id.to_owned()),
        ..HistoryFilter::default()
    };
    let mut events: Vec<(HistoryKind, IpAddr)> = Client::unix(socket)
        .history(&filter)
        .unwrap()
        .events
        .iter()
        .map(|e| (e.event, e.address))
        .collect();
    events.reverse();
    events
}

/// Container `id` took an address and gave it back (one ADD, one DEL), saying `what` it was.
fn assert_given_back(socket: &Path, id: &str, what: &str) {
    let events = history(socket, id);
    assert!(
        matches!(
            events.as_slice(),
            [(HistoryKind::Allocated, a), (HistoryKind::Released, b)] if a == b
        ),
        "{what}: {events:?}"
    );
}

/// [`assert_given_back`] once the DEL came: after a container's process ends, podman's cleanup
/// (by the `podman run` that waited on it, or the exit command conmon runs) may still be under
/// way when `podman run` returns.
fn wait_given_back(socket: &Path, id: &str, what: &str) {
    wait_showing(
        &format!("{what} gives its address back"),
        std::time::Duration::from_secs(30),
        || history(socket, id).len() >= 2,
        || format!("{:?}", history(socket, id)),
    );
    assert_given_back(socket, id, what);
}

/// The agent holds exactly `expected` (address, container), saying `when`.
fn assert_held(socket: &Path, expected: &[(IpAddr, String)], when: &str) {
    let mut listed = held(socket);
    listed.sort();
    assert_eq!(listed, expected, "the agent's allocations {when}");
}

#[test]
#[ignore = "needs root, podman and etcd (make deps)"]
fn podman_containers_take_and_give_back_the_agents_addresses() {
    require(rustix::process::geteuid().is_root(), "root");
    require(
        Command::new("podman").arg("--version").output().is_ok(),
        "podman (Debian: podman, runc)",
    );
    require(Path::new(BUSYBOX).exists(), "busybox-static (/bin/busybox)");
    require(
        Path::new(CNI_PLUGINS).join("bridge").exists(),
        "Debian's CNI plugins (containernetworking-plugins: /usr/lib/cni/bridge)",
    );
    // The corral-ipam of this build, next to the corral binary (`make test` builds every
    // binary of the workspace before it runs a test), or CORRAL_IPAM_BIN.
    let plugin = std::env::var_os("CORRAL_IPAM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(common::BINARY).with_file_name("corral-ipam"));
    require(
        plugin.exists(),
        &format!("{} (cargo build -p corral-cni)", plugin.display()),
    );

    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(CLUSTER);
    // corral-ipam records a DEL the agent is not there for under the network's `dataDir`; the
    // agent applies it when it starts.
    let cni_data = dir.path().join("cni-data");
    let agent_args = ["--cni-data-dir", cni_data.to_str().unwrap()];
    let mut agent = start_agent_with(&etcd, &dir.path().join("agent"), "n1", &agent_args);
    wait_ranges("n1 holds its range", &agent.socket, 1, 20);
    let ranges = agent_ranges(&agent.socket);
    let range = ranges[0].split(' ').nth(1).unwrap().to_owned();

    let podman = Podman::configure(
        &dir.path().join("podman"),
        &plugin,
        &agent.socket,
        &cni_data,
    );
    podman.import_busybox();

    // N containers at once: each sees its own address inside, in the node's granted range,
    // and the agent lists exactly those, each attached to its container.
    let mut containers: Vec<(String, IpAddr, PathBuf)> = Vec::new();
    for i in 0..CONTAINERS {
        let name = format!("corral-test-{i}");
        let id = podman.ok(&[
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            NETWORK,
            IMAGE,
            "sleep",
            "600",
        ]);
        let inside = podman.addresses_inside(&id);
        assert_eq!(inside.len(), 1, "{name} sees {inside:?}");
        let address = inside[0];
        assert!(
            contains(&range, address),
            "{name}'s {address} is outside the node's range {range}"
        );
        let netns = podman.netns(&id);
        assert!(netns.exists(), "{name}'s network namespace {netns:?}");
        containers.push((id, address, netns));
    }
    let distinct: BTreeSet<IpAddr> = containers.iter().map(|(_, a, _)| *a).collect();
    assert_eq!(distinct.len(), CONTAINERS, "{containers:?}");
    let mut expected: Vec<(IpAddr, String)> = containers
        .iter()
        .map(|(id, address, _)| (*address, id.clone()))
        .collect();
    expected.sort();
    assert_held(&agent.socket, &expected, "with the containers running");
    // Every address lies in a grant of this node in etcd, and nowhere else.
    assert_sound(&etcd, &[("n1", &agent.socket)]);

    // `podman rm` gives the first container's address back: released in the agent's history,
    // gone from its allocations; the others keep theirs.
    let (first, first_address, first_netns) = containers.remove(0);
    podman.ok(&["rm", "--force", "--time", "0", &first]);
    assert_given_back(&agent.socket, &first, "the removed container");
    assert_eq!(
        history(&agent.socket, &first)[0],
        (HistoryKind::Allocated, first_address)
    );
    expected.retain(|(address, _)| *address != first_address);
    assert_held(&agent.socket, &expected, "after podman rm");
    assert!(!first_netns.exists(), "{first_netns:?} outlived podman rm");

    // A container that ran and exited holds no address while it is still there: podman tears
    // its network down once it stops.
    let (out, id) = podman.run_once("corral-test-exits", NETWORK, "true");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_given_back(&agent.socket, &id, "the exited container");
    // Still there, not removed (`stopped` until podman's cleanup records it `exited`).
    let status = podman.ok(&["inspect", "--format", "{{.State.Status}}", &id]);
    assert!(["stopped", "exited"].contains(&status.as_str()), "{status}");
    assert_held(&agent.socket, &expected, "after a container exited");
    podman.ok(&["rm", &id]);

    // Runs that fail after the IPAM ADD leave no address behind: the agent allocated one and
    // got it back. runc cannot exec a command the image lacks, once the network is set up;
    // a plugin after corral-ipam's in the network's chain fails.
    for (name, network, command) in [
        ("corral-test-fails", NETWORK, "/no/such/command"),
        ("corral-test-chain", CHAIN, "true"),
    ] {
        let (out, id) = podman.run_once(name, network, command);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} ran");
        wait_given_back(&agent.socket, &id, &format!("{name} ({stderr})"));
        assert_held(&agent.socket, &expected, &format!("after {name}"));
        podman.ok(&["rm", "--force", "--time", "0", &id]);
    }

    // `podman rm` while the agent is away (SIGKILL) succeeds, and the address is free once the
    // agent is back, before it serves anything; the others keep theirs across the restart.
    drop(agent);
    let (away, away_address, away_netns) = containers.remove(0);
    podman.ok(&["rm", "--force", "--time", "0", &away]);
    assert!(!away_netns.exists(), "{away_netns:?} outlived podman rm");
    agent = start_agent_with(&etcd, &dir.path().join("agent"), "n1", &agent_args);
    assert_given_back(&agent.socket, &away, "removed while the agent was away");
    expected.retain(|(address, _)| *address != away_address);
    assert_held(&agent.socket, &expected, "after the agent's restart");

    // The rest go: nothing held, no container, no namespace; removing the networks takes
    // their bridge.
    for (id, address, netns) in &containers {
        podman.ok(&["rm", "--force", "--time", "0", id]);
        assert_eq!(
            history(&agent.socket, id).last(),
            Some(&(HistoryKind::Released, *address))
        );
        assert!(!netns.exists(), "{netns:?} outlived podman rm");
    }
    assert_eq!(held(&agent.socket), Vec::new());
    assert_eq!(podman.ok(&["ps", "--all", "--quiet"]), "");
    assert!(podman.bridge_exists(), "the bridge {}", podman.bridge);
    podman.ok(&["network", "rm", NETWORK, CHAIN]);
    assert!(
        !podman.bridge_exists(),
        "{} outlived the networks",
        podman.bridge
    );
    // libcni's cache (the one file podman's CNI backend keeps outside the test's directory)
    // holds nothing of the network.
    let cached: Vec<String> = std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&format!("{NETWORK}-")))
        .collect();
    assert_eq!(cached, Vec::<String>::new(), "left in /var/lib/cni/results");
    assert_sound(&etcd, &[("n1", &agent.socket)]);
}
