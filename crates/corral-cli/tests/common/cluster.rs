//! Helpers of the cluster tests (`tests/cluster.rs`, `tests/blocks.rs`): etcd started here on
//! 127.0.0.1, `corral operator` replicas and `corral agent`s as child processes, and reads of
//! what etcd and the agents hold. On etcd started with `EtcdCluster::start_tls`, every command
//! and process they run gets the cluster's client TLS files (`tls_args`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use corral_api::{AllocateRequest, FamilyChoice};
use corral_client::Client;
use corral_etcd::testing::EtcdCluster;
use corral_kv::{Compare, Kv, Txn, TxnOp};

use crate::common::{Agent, BINARY};

pub use corral_etcd::testing::block_on;

/// A dual-stack pool of node CIDRs: /24s of 10.192.0.0/12 (the first reserved) and /64s.
pub const DUAL: &str = include_str!("../configs/dual.toml");

/// `members` etcd members, the cluster `t` initialised with `toml`.
pub fn initialized(members: usize, dir: &Path, toml: &str) -> EtcdCluster {
    let etcd = start_etcd(members);
    init(&etcd, dir, toml);
    etcd
}

/// [`initialized`] in a new temporary directory; bound as `let (dir, etcd) = ...`, the cluster
/// is dropped before the directory, as when each is bound in turn.
pub fn initialized_in_tempdir(members: usize, toml: &str) -> (tempfile::TempDir, EtcdCluster) {
    let dir = tempfile::tempdir().unwrap();
    let etcd = initialized(members, dir.path(), toml);
    (dir, etcd)
}

/// One etcd member, the cluster `t` initialised with `toml`, and operator replica `op-a`.
pub fn cluster_with_operator(dir: &Path, toml: &str) -> (EtcdCluster, Operator) {
    let etcd = initialized(1, dir, toml);
    let operator = Operator::start(&etcd, dir, "op-a");
    (etcd, operator)
}

/// [`cluster_with_operator`] in a new temporary directory (answered first, as
/// [`initialized_in_tempdir`] answers it).
pub fn cluster_with_operator_in_tempdir(toml: &str) -> (tempfile::TempDir, EtcdCluster, Operator) {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, operator) = cluster_with_operator(dir.path(), toml);
    (dir, etcd, operator)
}

/// Replicas `op-a` and `op-b`, started one after the other (not waited on).
pub fn two_operators(etcd: &EtcdCluster, dir: &Path) -> (Operator, Operator) {
    let a = Operator::start(etcd, dir, "op-a");
    (a, Operator::start(etcd, dir, "op-b"))
}

/// Replicas `op-a`, waited on until it leads (20 s at most), and `op-b`, its standby.
pub fn leader_and_standby(etcd: &EtcdCluster, dir: &Path) -> (Operator, Operator) {
    let leader = Operator::start(etcd, dir, "op-a");
    wait_leads(etcd, "op-a", Duration::from_secs(20));
    let standby = Operator::start(etcd, dir, "op-b");
    (leader, standby)
}

pub fn start_etcd(members: usize) -> EtcdCluster {
    block_on(EtcdCluster::start(members)).expect("etcd starts (make deps installs it)")
}

pub fn kv(etcd: &EtcdCluster) -> corral_etcd::EtcdKv {
    block_on(etcd.client(Default::default())).unwrap()
}

/// `--etcd-cacert CA --etcd-cert CERT --etcd-key KEY` of a client etcd accepts, on etcd that
/// serves TLS; nothing on plaintext etcd.
pub fn tls_args(etcd: &EtcdCluster) -> Vec<String> {
    let Some(tls) = etcd.client_tls() else {
        return Vec::new();
    };
    let path = |path: &Path| path.display().to_string();
    let mut args = vec!["--etcd-cacert".to_owned(), path(&tls.ca_cert)];
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        args.extend(["--etcd-cert".to_owned(), path(cert)]);
        args.extend(["--etcd-key".to_owned(), path(key)]);
    }
    args
}

pub fn endpoints(etcd: &EtcdCluster) -> String {
    etcd.endpoints().join(",")
}

/// Runs `corral <args>`; answers (exit code, stdout, stderr).
pub fn corral(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BINARY).args(args).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Writes the cluster configuration and `corral cluster init`s it.
pub fn init(etcd: &EtcdCluster, dir: &Path, toml: &str) {
    let path = dir.join("cluster.toml");
    std::fs::write(&path, toml).unwrap();
    let (code, out, err) = cluster_command(etcd, "init", &["--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "cluster init: {out}{err}");
}

/// `corral node remove NODE FLAGS` (`--drain`, `--force`); answers (exit code, output).
pub fn remove(etcd: &EtcdCluster, node: &str, flags: &[&str]) -> (i32, String) {
    let (code, out, err) = on_cluster(etcd, &["node", "remove", node], flags);
    (code, format!("{out}{err}"))
}

/// `corral cluster check`, given agents' sockets; answers (exit code, output).
pub fn check(etcd: &EtcdCluster, agents: &[&Path]) -> (i32, String) {
    check_with(etcd, &[], agents)
}

/// [`check`] with `extra` arguments (`--cloud fake`, say).
pub fn check_with(etcd: &EtcdCluster, extra: &[&str], agents: &[&Path]) -> (i32, String) {
    let mut args = extra.to_vec();
    let sockets: Vec<String> = agents.iter().map(|p| p.display().to_string()).collect();
    for socket in &sockets {
        args.push("--agent");
        args.push(socket);
    }
    let (code, out, err) = cluster_command(etcd, "check", &args);
    (code, format!("{out}{err}"))
}

/// `corral cluster check` finds nothing and the promise holds strictly, given the agents as
/// (node name, socket).
pub fn assert_sound(etcd: &EtcdCluster, agents: &[(&str, &Path)]) {
    let sockets: Vec<&Path> = agents.iter().map(|(_, socket)| *socket).collect();
    assert_check(etcd, &sockets);
    assert_invariant(etcd, agents, true);
}

pub fn assert_check(etcd: &EtcdCluster, agents: &[&Path]) {
    let (code, output) = check(etcd, agents);
    assert_eq!(code, 0, "corral cluster check found problems:\n{output}");
}

/// A `corral operator` replica.
pub struct Operator {
    pub child: Child,
    pub log: PathBuf,
    /// Its API socket (`--api-socket`).
    pub socket: PathBuf,
}

impl Operator {
    /// Replica `name` (lease TTL 2 s) with its state in `dir/NAME-state`.
    pub fn start(etcd: &EtcdCluster, dir: &Path, name: &str) -> Operator {
        Operator::with_state(etcd, dir, name, &["--lease-ttl".as_ref(), "2".as_ref()])
    }

    /// Replica `name` with `args` and its state in `dir/NAME-state`, on the operator's
    /// defaults otherwise (its election lease: 10 s).
    pub fn with_state(etcd: &EtcdCluster, dir: &Path, name: &str, args: &[&OsStr]) -> Operator {
        let state = dir.join(format!("{name}-state"));
        let mut args = args.to_vec();
        args.extend(["--state-dir".as_ref(), state.as_os_str()]);
        Operator::spawn(etcd, dir, name, &args)
    }

    /// `corral operator --cloud fake --fake-cloud SEED` replica `name`.
    pub fn start_fake_cloud(etcd: &EtcdCluster, dir: &Path, name: &str, seed: &Path) -> Operator {
        let args: [&OsStr; 4] = [
            "--cloud".as_ref(),
            "fake".as_ref(),
            "--fake-cloud".as_ref(),
            seed.as_os_str(),
        ];
        Operator::start_with(etcd, dir, name, &args)
    }

    /// Replica `name` of cluster `t` (lease TTL 2 s) with `extra` arguments, its API on
    /// `dir/NAME.sock`, what it says in `dir/NAME.log`.
    pub fn start_with(etcd: &EtcdCluster, dir: &Path, name: &str, extra: &[&OsStr]) -> Operator {
        let mut args: Vec<&OsStr> = vec!["--lease-ttl".as_ref(), "2".as_ref()];
        args.extend_from_slice(extra);
        Operator::spawn(etcd, dir, name, &args)
    }

    /// Replica `name` of cluster `t` on the operator's defaults but for `args`, its API on
    /// `dir/NAME.sock`, what it says in `dir/NAME.log`.
    pub fn spawn(etcd: &EtcdCluster, dir: &Path, name: &str, args: &[&OsStr]) -> Operator {
        let log = dir.join(format!("{name}.log"));
        let socket = dir.join(format!("{name}.sock"));
        let child = crate::common::spawn_logged(
            Command::new(BINARY)
                .args(["operator", "--etcd", &endpoints(etcd), "--cluster", "t"])
                .args(["--replica", name])
                .args(tls_args(etcd))
                .args(args)
                .arg("--api-socket")
                .arg(&socket),
            &log,
        );
        Operator { child, log, socket }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The highest etcd revision the replica saw (`corral_operator_etcd_revision_seen`), 0
    /// if its API does not answer.
    pub fn revision_seen(&self) -> i64 {
        Client::unix(&self.socket)
            .metrics()
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("corral_operator_etcd_revision_seen "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // A paused process dies of SIGKILL as well.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on an operator's socket: (status code, JSON body; `null` if it has none).
pub fn operator_get(socket: &Path, path: &str) -> (u16, serde_json::Value) {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (
        code,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// The replica named in the lowest election key: who leads.
pub fn leader(etcd: &EtcdCluster) -> Option<String> {
    let kv = kv(etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/election/", 100)).ok()?;
    keys.into_iter()
        .min_by_key(|k| k.create_revision)
        .map(|k| String::from_utf8_lossy(&k.value).into_owned())
}

/// Waits until replica `name` leads.
pub fn wait_leads(etcd: &EtcdCluster, name: &str, timeout: Duration) {
    wait_until(&format!("{name} leads"), timeout, || {
        leader(etcd).as_deref() == Some(name)
    });
}

/// Waits (saying `what`, `secs` seconds at most) until the agent on `socket` holds `n`
/// active cluster ranges.
pub fn wait_ranges(what: &str, socket: &Path, n: usize, secs: u64) {
    wait_until(what, Duration::from_secs(secs), || {
        agent_ranges(socket).len() == n
    });
}

pub fn wait_until(what: &str, timeout: Duration, done: impl FnMut() -> bool) {
    wait_showing(what, timeout, done, String::new);
}

/// [`wait_until`], and on a timeout what `show` says (the processes' logs, say).
pub fn wait_showing(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
    show: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            panic!("timed out waiting until {what}\n{}", show());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Grants in etcd: node → its CIDRs (from the `grants/` keys).
pub fn grants(etcd: &EtcdCluster) -> BTreeMap<String, Vec<String>> {
    let kv = kv(etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/grants/", 5000)).unwrap();
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in keys {
        // Garbage a test put there is not a grant.
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&entry.value) else {
            continue;
        };
        let node = value["node"].as_str().unwrap().to_owned();
        by_node
            .entry(node)
            .or_default()
            .push(entry.key_str().into_owned());
    }
    by_node
}

/// A node's registration record, as an agent writes it.
pub fn node_record(name: &str) -> Vec<u8> {
    corral_cluster::encode_value(&corral_cluster::NodeRecord {
        uid: format!("uid-{name}"),
        addresses: Vec::new(),
        registered_ms: 0,
        instance_id: None,
        max_pods: None,
    })
    .unwrap()
}

/// A node's registration, as an agent writes it: its record, created if absent.
pub fn registration(name: &str) -> Txn {
    let key = format!("/corral/t/v1/nodes/{name}");
    let value = String::from_utf8(node_record(name)).unwrap();
    Txn {
        compares: vec![Compare::absent(key.clone())],
        success: vec![TxnOp::put(key, value)],
        failure: vec![],
    }
}

/// Applies `ops` in one unconditional transaction.
pub fn apply(kv: &corral_etcd::EtcdKv, ops: Vec<TxnOp>) {
    block_on(kv.txn(Txn {
        compares: vec![],
        success: ops,
        failure: vec![],
    }))
    .unwrap();
}

/// Registers nodes directly in etcd, as agents do (create if absent, with a uid).
pub fn register(etcd: &EtcdCluster, names: impl IntoIterator<Item = String>) {
    let kv = kv(etcd);
    block_on(async {
        for name in names {
            let txn = registration(&name);
            // Member failures mid-burst are retried, as an agent would.
            for attempt in 0.. {
                match kv.txn(txn.clone()).await {
                    Ok(_) => break,
                    Err(error) if attempt < 50 => {
                        let _ = error;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => panic!("registering {name}: {error}"),
                }
            }
        }
    });
}

pub fn agent_config(dir: &Path) -> PathBuf {
    crate::common::agent_toml(
        dir,
        "cni_data_dirs = []\n\n[[pools]]\nname = \"local\"\nranges = [\"192.168.250.0/24\"]\n",
    )
}

/// [`start_agent`] in `dir/sub`, waited on (20 s at most) until it holds `ranges` active
/// cluster ranges.
pub fn agent_holding(
    etcd: &EtcdCluster,
    dir: &Path,
    sub: &str,
    node: &str,
    ranges: usize,
) -> Agent {
    let agent = start_agent(etcd, &dir.join(sub), node);
    wait_ranges(
        &format!("{node} holds its ranges"),
        &agent.socket,
        ranges,
        20,
    );
    agent
}

/// `corral COMMAND --etcd ETCD --cluster t EXTRA`; answers (exit code, stdout, stderr).
pub fn on_cluster(etcd: &EtcdCluster, command: &[&str], extra: &[&str]) -> (i32, String, String) {
    let endpoints = endpoints(etcd);
    let tls = tls_args(etcd);
    let mut args = command.to_vec();
    args.extend(["--etcd", &endpoints, "--cluster", "t"]);
    args.extend(tls.iter().map(String::as_str));
    args.extend(extra);
    corral(&args)
}

/// `corral cluster SUBCOMMAND` of cluster `t` with `extra` arguments; answers (exit code,
/// stdout, stderr).
pub fn cluster_command(
    etcd: &EtcdCluster,
    subcommand: &str,
    extra: &[&str],
) -> (i32, String, String) {
    on_cluster(etcd, &["cluster", subcommand], extra)
}

pub fn start_agent(etcd: &EtcdCluster, dir: &Path, node: &str) -> Agent {
    start_agent_with(etcd, dir, node, &[])
}

/// An agent for each of `nodes`, node NODE's in `dir/NODE`.
pub fn start_agents(etcd: &EtcdCluster, dir: &Path, nodes: &[&str]) -> Vec<Agent> {
    nodes
        .iter()
        .map(|node| start_agent(etcd, &dir.join(node), node))
        .collect()
}

/// `start_agent` with more arguments (e.g. `--instance-id`).
pub fn start_agent_with(etcd: &EtcdCluster, dir: &Path, node: &str, extra: &[&str]) -> Agent {
    std::fs::create_dir_all(dir).unwrap();
    let config = agent_config(dir);
    let endpoints = endpoints(etcd);
    let tls = tls_args(etcd);
    let mut args = agent_args(&config, &endpoints, node);
    args.extend(SHORT_LEASE.map(OsStr::new));
    args.extend(tls.iter().map(OsStr::new));
    args.extend(extra.iter().map(OsStr::new));
    Agent::start(&args, &dir.join("agent.sock"))
}

/// A 3 s liveness lease for `corral agent`: a killed agent's node is seen gone soon.
pub const SHORT_LEASE: [&str; 2] = ["--lease-ttl", "3"];

/// `corral agent`'s arguments: configuration file `config`, node `node` of cluster `t` on the
/// etcd at `endpoints`.
pub fn agent_args<'a>(config: &'a Path, endpoints: &'a str, node: &'a str) -> Vec<&'a OsStr> {
    [
        "--config".as_ref(),
        config.as_os_str(),
        "--etcd".as_ref(),
        endpoints.as_ref(),
        "--cluster".as_ref(),
        "t".as_ref(),
        "--node".as_ref(),
        node.as_ref(),
    ]
    .into()
}

/// The agent's cluster link as its status reports it (`None` when the agent does not answer
/// or has no cluster link).
pub fn link_status(socket: &Path) -> Option<corral_api::ClusterStatus> {
    Client::unix(socket)
        .status(None)
        .ok()
        .and_then(|s| s.cluster)
}

/// The cluster ranges an agent holds (active ones), as `pool range`.
pub fn agent_ranges(socket: &Path) -> Vec<String> {
    let pools = Client::unix(socket).pools(Some("node")).unwrap();
    let mut ranges: Vec<String> = pools
        .pools
        .iter()
        .flat_map(|p| {
            p.ranges
                .iter()
                .filter(|r| r.source == corral_api::RangeSource::Cluster && !r.draining)
                .map(move |r| format!("{} {}", p.name, r.range))
        })
        .collect();
    ranges.sort();
    ranges
}

/// An allocation request of the node's pool `default` for `owner`.
pub fn node_request(family: FamilyChoice, owner: &str) -> AllocateRequest {
    AllocateRequest {
        scope: "node".into(),
        pool: "default".into(),
        family: Some(family),
        address: None,
        owner: owner.into(),
        key: None,
        lease_ms: None,
    }
}

pub fn alloc_dual(socket: &Path, owner: &str) -> Vec<IpAddr> {
    let mut client = Client::unix(socket);
    let response = client
        .allocate(&node_request(FamilyChoice::Dual, owner))
        .unwrap();
    response.allocations.iter().map(|a| a.address).collect()
}

/// One IPv4 address of the node's pool `default` for `owner`.
pub fn alloc_v4(socket: &Path, owner: &str) -> IpAddr {
    let response = Client::unix(socket)
        .allocate(&node_request(FamilyChoice::Ipv4, owner))
        .unwrap();
    response.allocations[0].address
}

/// The addresses the agent on `socket` holds in its node scope.
pub fn node_addresses(socket: &Path) -> BTreeSet<IpAddr> {
    addresses(&Client::unix(socket).dump(Some("node")).unwrap())
}

pub fn addresses(dump: &corral_api::DumpResponse) -> BTreeSet<IpAddr> {
    dump.scopes
        .iter()
        .flat_map(|s| &s.pools)
        .flat_map(|p| &p.allocations)
        .map(|a| a.address)
        .collect()
}

pub fn contains(range: &str, address: IpAddr) -> bool {
    // A range as the agent lists it: `SUBNET[,gateway=IP]`.
    let cidr = range.split(',').next().unwrap();
    cidr.parse::<ipnet::IpNet>().unwrap().contains(&address)
}

/// A grant of etcd as the independent check reads it: its CIDR, its node (empty if its value
/// names none) and its key.
pub type GrantEntry = (ipnet::IpNet, String, String);

/// Every `grants/` key whose last part is a CIDR, in key order (see [`GrantEntry`]).
pub fn grant_entries(etcd: &EtcdCluster) -> Vec<GrantEntry> {
    let kv = kv(etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/grants/", 5000)).unwrap();
    let mut grants = Vec::new();
    for entry in keys {
        let key = entry.key_str().into_owned();
        let Some(cidr) = key
            .rsplit('/')
            .next()
            .and_then(|c| c.replacen('-', "/", 1).parse::<ipnet::IpNet>().ok())
        else {
            continue;
        };
        let node = serde_json::from_slice::<serde_json::Value>(&entry.value)
            .ok()
            .and_then(|v| v["node"].as_str().map(str::to_owned))
            .unwrap_or_default();
        grants.push((cidr, node, key));
    }
    grants
}

/// A CIDR as (family, first address, last address): IPv4 before IPv6, addresses as numbers.
fn span(cidr: &ipnet::IpNet) -> (bool, u128, u128) {
    match cidr {
        ipnet::IpNet::V4(net) => (
            false,
            u32::from(net.network()).into(),
            u32::from(net.broadcast()).into(),
        ),
        ipnet::IpNet::V6(net) => (true, net.network().into(), net.broadcast().into()),
    }
}

/// Every pair `(i, j)`, `i < j`, of `cidrs` that share an address (one contains the other),
/// in order: a sweep over the CIDRs sorted by first address, each compared with those before
/// it whose last address it has not passed (none, unless CIDRs overlap), so n log n.
pub fn overlapping(cidrs: &[ipnet::IpNet]) -> Vec<(usize, usize)> {
    let spans: Vec<(bool, u128, u128)> = cidrs.iter().map(span).collect();
    let mut order: Vec<usize> = (0..cidrs.len()).collect();
    order.sort_by_key(|&i| (spans[i].0, spans[i].1));
    let mut pairs = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    for i in order {
        let (family, first, _) = spans[i];
        open.retain(|&o| spans[o].0 == family && spans[o].2 >= first);
        pairs.extend(open.iter().map(|&o| (o.min(i), o.max(i))));
        open.push(i);
    }
    pairs.sort_unstable();
    pairs
}

/// The grants containing an address, found by its network at each prefix length granted (a
/// few lookups whatever the cluster's size).
pub struct GrantIndex<'a> {
    grants: &'a [GrantEntry],
    by_network: std::collections::HashMap<ipnet::IpNet, Vec<usize>>,
    prefix_lens: BTreeSet<(bool, u8)>,
}

impl<'a> GrantIndex<'a> {
    pub fn new(grants: &'a [GrantEntry]) -> GrantIndex<'a> {
        let mut by_network: std::collections::HashMap<ipnet::IpNet, Vec<usize>> =
            Default::default();
        let mut prefix_lens = BTreeSet::new();
        for (i, (cidr, _, _)) in grants.iter().enumerate() {
            by_network.entry(cidr.trunc()).or_default().push(i);
            prefix_lens.insert((cidr.addr().is_ipv6(), cidr.prefix_len()));
        }
        GrantIndex {
            grants,
            by_network,
            prefix_lens,
        }
    }

    /// The grants whose CIDR contains `address`, in key order.
    pub fn containing(&self, address: IpAddr) -> Vec<&'a GrantEntry> {
        let mut found: Vec<usize> = self
            .prefix_lens
            .iter()
            .filter(|(v6, _)| *v6 == address.is_ipv6())
            .filter_map(|&(_, len)| ipnet::IpNet::new(address, len).ok())
            .filter_map(|net| self.by_network.get(&net.trunc()))
            .flatten()
            .copied()
            .collect();
        found.sort_unstable();
        found.iter().map(|&i| &self.grants[i]).collect()
    }
}

/// The independent check of corral's one promise, from etcd and the agents alone (no corral
/// code decides anything here): given each agent as (node name, socket),
/// - no two `grants/` keys of one family overlap (whatever their pools),
/// - no address is allocated on two agents,
/// - every address an agent has allocated from a cluster range lies in no other node's grant,
/// - with `strict`, every such address lies in one of its own node's grants (a node being
///   drained or removed may hold addresses in ranges no longer granted to it: pass `false`).
///
/// Answers the violations, one sentence each (empty: the promise holds). Addresses of the
/// agents' own configured pools (not cluster ranges) are left out: they are not the
/// cluster's to arbitrate.
pub fn invariant_violations(
    etcd: &EtcdCluster,
    agents: &[(&str, &Path)],
    strict: bool,
) -> Vec<String> {
    violations_of(&grant_entries(etcd), agents, strict)
}

/// [`invariant_violations`] over grants already read (n log n in the grants: the nemesis
/// checks 30,000 nodes' after every step).
pub fn violations_of(grants: &[GrantEntry], agents: &[(&str, &Path)], strict: bool) -> Vec<String> {
    let cidrs: Vec<ipnet::IpNet> = grants.iter().map(|(cidr, _, _)| *cidr).collect();
    let mut violations: Vec<String> = overlapping(&cidrs)
        .into_iter()
        .map(|(i, j)| {
            let ((_, node_a, key_a), (_, node_b, key_b)) = (&grants[i], &grants[j]);
            format!("grants overlap: {key_a} ({node_a}) and {key_b} ({node_b})")
        })
        .collect();
    let index = GrantIndex::new(grants);
    let mut holder: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for &(node, socket) in agents {
        let cluster_ranges: Vec<ipnet::IpNet> = Client::unix(socket)
            .pools(Some("node"))
            .map(|pools| {
                pools
                    .pools
                    .iter()
                    .flat_map(|p| &p.ranges)
                    .filter(|r| r.source == corral_api::RangeSource::Cluster)
                    .filter_map(|r| r.range.split(',').next()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let Ok(dump) = Client::unix(socket).dump(Some("node")) else {
            violations.push(format!(
                "agent of {node} at {} does not answer",
                socket.display()
            ));
            continue;
        };
        for address in addresses(&dump) {
            if !cluster_ranges.iter().any(|r| r.contains(&address)) {
                continue;
            }
            if let Some(other) = holder.insert(address, node)
                && other != node
            {
                violations.push(format!("{address} is allocated on {other} and on {node}"));
            }
            let containing = index.containing(address);
            for (_, owner, key) in &containing {
                if owner != node {
                    violations.push(format!(
                        "{address} allocated on {node} lies in {owner}'s grant {key}"
                    ));
                }
            }
            if strict && !containing.iter().any(|(_, owner, _)| owner == node) {
                violations.push(format!(
                    "{address} allocated on {node} lies in none of its grants"
                ));
            }
        }
    }
    violations
}

/// `invariant_violations` finds nothing.
pub fn assert_invariant(etcd: &EtcdCluster, agents: &[(&str, &Path)], strict: bool) {
    let violations = invariant_violations(etcd, agents, strict);
    assert!(
        violations.is_empty(),
        "no address twice is broken:\n{}",
        violations.join("\n")
    );
}

/// A cluster configuration with one block pool, `pods`: IPv4 `cidr` in /28 blocks (14
/// addresses each), watermarks that ask for one block per node (pre-allocate 4), a 2 s
/// release delay and `quarantine_secs`.
pub fn block_pool(quarantine_secs: u64, cidr: &str) -> String {
    format!("quarantine_secs = {quarantine_secs}\n") + &blocks_table("pods", cidr, 28, Some(2))
}

/// One `[[pools]]` table of a block pool: `name` over `cidr` (IPv6 if it has a `:`) in blocks
/// of `/block_prefix_len`, watermarks that ask for one block per node (pre-allocate 4), and
/// `release_delay_secs` when given (the default otherwise).
pub fn blocks_table(
    name: &str,
    cidr: &str,
    block_prefix_len: u8,
    release_delay_secs: Option<u64>,
) -> String {
    let family = if cidr.contains(':') { "ipv6" } else { "ipv4" };
    let delay = release_delay_secs
        .map(|secs| format!("release_delay_secs = {secs}\n"))
        .unwrap_or_default();
    format!(
        r#"[[pools]]
name = "{name}"
mode = "blocks"
{delay}[pools.watermarks]
pre_allocate = 4
[pools.{family}]
cidrs = ["{cidr}"]
block_prefix_len = {block_prefix_len}
"#
    )
}

/// Grows the pool of configuration `toml` whose CIDRs are `[cidr]` to `[cidr, more]` with
/// `corral cluster apply` (the file `dir/wider.toml`), which must succeed.
pub fn widen(etcd: &EtcdCluster, dir: &Path, toml: &str, cidr: &str, more: &str) {
    let wider = toml.replace(
        &format!("cidrs = [\"{cidr}\"]"),
        &format!("cidrs = [\"{cidr}\", \"{more}\"]"),
    );
    assert_ne!(wider, toml, "no pool of {cidr} alone");
    apply_config(etcd, dir, "wider.toml", &wider);
}

/// Writes `toml` to `dir/name` and applies it with `corral cluster apply --config`, which
/// must succeed.
pub fn apply_config(etcd: &EtcdCluster, dir: &Path, name: &str, toml: &str) {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    let (code, out, err) = cluster_command(etcd, "apply", &["--config", path.to_str().unwrap()]);
    assert_eq!(code, 0, "cluster apply: {out}{err}");
}
