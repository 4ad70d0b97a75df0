//! Many agents in one process, for the agents' footprint on etcd (issue 25:
//! `benches/agents.rs`, `tests/agents_footprint.rs`): each a whole agent over a `MemoryStore`
//! (`corral_agent::testing::InMemoryAgent`: its node state, committer and API, no socket, no
//! SQLite) whose cluster link is exactly what `corral agent --etcd` runs
//! (`corral_cli::agent_cluster_task`: its own etcd client, registration, liveness lease,
//! watches, demand, holdings, handshake), pods added and deleted through its router as CNI
//! ADDs and DELs; what etcd sees of them is read from etcd's own `/metrics` and from the
//! established TCP connections to its client ports (`/proc/net/tcp`), and optionally through
//! `etcd grpc-proxy` ([`Proxy`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_agent::testing::InMemoryAgent;
use corral_etcd::testing::{EtcdCluster, etcd_binary, free_ports};
use corral_store::MemoryStore;

/// A pool of node CIDRs (/24 and /64 per node: 65,536 nodes) and a pool of blocks (/26 and
/// /122, pre-allocate 8), as the runs configure them.
pub const CIDR_POOL: &str = r#"
[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.0.0.0/8"]
node_prefix_len = 24
[pools.ipv6]
cidrs = ["fd00::/32"]
node_prefix_len = 64
"#;

pub const BLOCK_POOL: &str = r#"
[[pools]]
name = "default"
mode = "blocks"
[pools.ipv4]
cidrs = ["10.0.0.0/8"]
block_prefix_len = 26
[pools.ipv6]
cidrs = ["fd00::/64"]
block_prefix_len = 122
"#;

/// The pool both configurations name.
pub const POOL: &str = "default";

/// `corral cluster init` of cluster `cluster` with `toml` (in `dir`): a process of its own, so
/// that this process holds no etcd connection but its agents'.
pub fn init(etcd: &EtcdCluster, cluster: &str, toml: &str, dir: &Path) {
    let path = dir.join(format!("{cluster}.toml"));
    std::fs::write(&path, toml).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["cluster", "init", "--etcd", &etcd.endpoints().join(",")])
        .args(["--cluster", cluster, "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "cluster init: {output:?}");
}

/// A `corral operator` process (replica `op`) of `cluster` on the members, its log in `dir`;
/// killed (by PID) when dropped.
pub struct Operator(Child);

impl Operator {
    pub fn start(etcd: &EtcdCluster, cluster: &str, dir: &Path) -> Operator {
        let child = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["operator", "--etcd", &etcd.endpoints().join(",")])
            .args(["--cluster", cluster, "--replica", "op"])
            .arg("--api-socket")
            .arg(dir.join(format!("{cluster}-op.sock")))
            .arg("--state-dir")
            .arg(dir.join(format!("{cluster}-op-state")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{cluster}-operator.log"))).unwrap())
            .spawn()
            .expect("corral operator starts");
        Operator(child)
    }
}

impl Drop for Operator {
    /// SIGTERM (it revokes its election lease, which would otherwise expire, a write, in a
    /// later run's window), then SIGKILL if it has not stopped.
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `etcd grpc-proxy start` in front of the members, on 127.0.0.1; killed (by PID) when
/// dropped.
pub struct Proxy {
    child: Child,
    pub port: u16,
    pub metrics_port: u16,
}

impl Proxy {
    pub fn start(etcd: &EtcdCluster, dir: &Path) -> Proxy {
        let ports = free_ports(2).unwrap();
        let members: Vec<String> = etcd
            .endpoints()
            .iter()
            .map(|e| e.trim_start_matches("http://").to_owned())
            .collect();
        // etcd 3.4's proxy takes a client's HTTP/2 ping at most every 5 minutes and closes a
        // connection pinged more often (`too_many_pings`); corral pings every 5 s (a member
        // that stops answering on a watch is found so). 3.5's takes `--grpc-keepalive-min-time`
        // (`make bench-agents` installs one and names it in `CORRAL_ETCD_PROXY_BIN`).
        let binary = std::env::var_os("CORRAL_ETCD_PROXY_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| etcd_binary().expect("etcd (make deps)"));
        let version = corral_etcd::testing::version_of(&binary);
        let keepalive: &[&str] = if version.contains("Version: 3.4.") {
            &[]
        } else {
            &["--grpc-keepalive-min-time=1s"]
        };
        let child = Command::new(&binary)
            .args(["grpc-proxy", "start"])
            .args(keepalive)
            .arg(format!("--endpoints={}", members.join(",")))
            .arg(format!("--listen-addr=127.0.0.1:{}", ports[0]))
            .arg(format!("--metrics-addr=http://127.0.0.1:{}", ports[1]))
            .arg(format!("--data-dir={}", dir.join("proxy").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
            .spawn()
            .expect("etcd grpc-proxy starts");
        eprintln!(
            "proxy: {} ({}){}",
            binary.display(),
            if version.is_empty() {
                "version unknown"
            } else {
                &version
            },
            if keepalive.is_empty() {
                ""
            } else {
                ", --grpc-keepalive-min-time=1s"
            }
        );
        let proxy = Proxy {
            child,
            port: ports[0],
            metrics_port: ports[1],
        };
        // Ready once it answers (its `/metrics` asks a member).
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(proxy.metrics_port, "/metrics").is_err() {
            assert!(Instant::now() < deadline, "etcd grpc-proxy did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    /// The proxy's client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `GET path` on 127.0.0.1:`port`.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other("no 200 answer")),
    }
}

/// Raises the soft open-files limit to the hard one (each agent holds a connection to etcd).
pub fn raise_nofile() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The agents: `node-00000` and up of one cluster, each over its own `MemoryStore` with its
/// own etcd client.
pub struct Fleet {
    agents: Vec<InMemoryAgent>,
    /// Per agent, its pods now (container IDs), oldest first.
    pods: Vec<std::collections::VecDeque<String>>,
    next_pod: u64,
}

/// Agent `i`'s node name.
pub fn node(i: usize) -> String {
    format!("node-{i:05}")
}

/// How many of a batch's agents are registered, and their links' last errors (the three
/// commonest, with counts), from their status.
async fn batch_progress(routers: &[axum::Router]) -> (usize, Vec<(usize, String)>) {
    let mut registered = 0;
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for router in routers {
        let (_, body) =
            corral_agent::testing::call(router.clone(), "GET", corral_api::paths::STATUS, None)
                .await;
        let Ok(status) = serde_json::from_slice::<corral_api::StatusResponse>(&body) else {
            continue;
        };
        let Some(cluster) = status.cluster else {
            continue;
        };
        registered += usize::from(cluster.registered);
        if let Some(error) = cluster.last_error {
            // Node names and numbers vary; the shape of the message is what counts.
            let shape: String = error
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .take(160)
                .collect();
            *errors.entry(shape).or_default() += 1;
        }
    }
    let mut commonest: Vec<(usize, String)> = errors.into_iter().map(|(e, n)| (n, e)).collect();
    commonest.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    commonest.truncate(3);
    (registered, commonest)
}

impl Fleet {
    /// Starts `n` agents of `cluster` on `endpoints` (the members, or a proxy), `batch` at a
    /// time, each batch waited on (up to 10 minutes) until its agents are ready (their links
    /// hold their nodes' liveness keys).
    pub async fn start(cluster: &str, endpoints: &[String], n: usize, batch: usize) -> Fleet {
        let config = AgentConfig {
            pools: corral_agent::config::pools(&[]).unwrap(),
            ..AgentConfig::in_dir(Path::new("/nonexistent"))
        };
        let mut agents = Vec::with_capacity(n);
        while agents.len() < n {
            let first = agents.len();
            let mut started = Vec::new();
            for i in first..(first + batch).min(n) {
                let options = ClusterOptions {
                    endpoints: endpoints.to_vec(),
                    cluster: cluster.into(),
                    node: node(i),
                    uid: format!("uid-{i}"),
                    lease_ttl: ClusterOptions::DEFAULT_LEASE_TTL,
                    demand_refresh: ClusterOptions::DEFAULT_DEMAND_REFRESH,
                    instance_id: None,
                    max_pods: None,
                    epoch_file: None,
                };
                let task = corral_cli::agent_cluster_task(options, Default::default());
                started.push(
                    InMemoryAgent::spawn(&config, MemoryStore::new(), Some(task))
                        .expect("the agent starts"),
                );
            }
            // Bounded, so that a run that cannot get its agents going ends (a hang otherwise);
            // every 10 s, what the batch's links say (a stuck start shows why).
            let routers: Vec<axum::Router> = started.iter().map(InMemoryAgent::router).collect();
            let ready = async move {
                for agent in &mut started {
                    agent.ready().await.expect("the agent gets ready");
                }
                started
            };
            let began = Instant::now();
            let progress = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let (registered, errors) = batch_progress(&routers).await;
                    eprintln!(
                        "agents {first}..{}: {registered} of {} registered after {:.0} s; links' last errors: {errors:?}",
                        first + routers.len(),
                        routers.len(),
                        began.elapsed().as_secs_f64()
                    );
                }
            };
            let started = tokio::select! {
                started = tokio::time::timeout(Duration::from_secs(600), ready) => started
                    .unwrap_or_else(|_| panic!("agents {first}.. not ready within 600 s")),
                () = progress => unreachable!("the progress report loops"),
            };
            agents.extend(started);
        }
        Fleet {
            pods: vec![Default::default(); agents.len()],
            agents,
            next_pod: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Agent `i`'s link as its status shows it.
    pub async fn cluster_status(&self, i: usize) -> corral_api::ClusterStatus {
        let status: corral_api::StatusResponse = serde_json::from_slice(
            &self.agents[i]
                .call("GET", corral_api::paths::STATUS, None)
                .await
                .1,
        )
        .unwrap();
        status.cluster.expect("the agent reports its cluster link")
    }

    /// Waits until every agent is registered and holds a range of `POOL` of each family.
    pub async fn wait_granted(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut from = 0;
        while from < self.agents.len() {
            let status = self.cluster_status(from).await;
            let v4 = status
                .grants
                .iter()
                .any(|g| g.starts_with("default ") && g.contains('.'));
            let v6 = status
                .grants
                .iter()
                .any(|g| g.starts_with("default ") && g.contains(':'));
            if status.registered && v4 && v6 {
                from += 1;
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} agents granted within {limit:?}; {}: {status:?}",
                from,
                self.agents.len(),
                node(from)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One round of pod churn: on each of `agents` agents (round robin from where the last
    /// round ended), a CNI ADD of a new pod, and a DEL of its oldest once it runs more than
    /// `keep` pods. Answers the ADDs and DELs made.
    pub async fn churn_round(&mut self, agents: usize, keep: usize, cursor: &mut usize) -> usize {
        let mut calls = Vec::new();
        for _ in 0..agents {
            let i = *cursor % self.agents.len();
            *cursor += 1;
            self.next_pod += 1;
            let pod = format!("pod-{}", self.next_pod);
            calls.push((i, "add", pod.clone()));
            self.pods[i].push_back(pod);
            if self.pods[i].len() > keep {
                let old = self.pods[i].pop_front().unwrap();
                calls.push((i, "del", old));
            }
        }
        let n = calls.len();
        let futures = calls.into_iter().map(|(i, what, pod)| {
            let agent = &self.agents[i];
            async move {
                let key = corral_api::AttachmentKey {
                    network: "podnet".into(),
                    container_id: pod.clone(),
                    ifname: "eth0".into(),
                };
                let (path, body) = if what == "add" {
                    (
                        corral_api::paths::CNI_ADD,
                        serde_json::to_vec(&corral_api::CniAddRequest {
                            network: podnet(),
                            key,
                            owner: format!("pod/{pod}"),
                            sets: Vec::new(),
                        }),
                    )
                } else {
                    (
                        corral_api::paths::CNI_DEL,
                        serde_json::to_vec(&corral_api::CniKeyRequest {
                            network: podnet(),
                            key,
                        }),
                    )
                };
                let (status, body) = agent.call("POST", path, Some(body.unwrap())).await;
                assert!(
                    (200..300).contains(&status),
                    "{what} {pod} on {}: {status} {}",
                    node(i),
                    String::from_utf8_lossy(&body)
                );
            }
        });
        futures_join_all(futures).await;
        n
    }

    /// Stops every agent (as SIGTERM would).
    pub async fn stop(self) {
        for agent in self.agents {
            let _ = agent.stop().await;
        }
    }
}

/// Runs the futures at once and waits for all of them.
async fn futures_join_all<F: Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// CNI network `podnet` on the node's pool `POOL`.
fn podnet() -> corral_api::CniNetwork {
    corral_api::CniNetwork {
        configured_pool: Some(POOL.into()),
        ..corral_api::CniNetwork::on_node_pool("podnet", POOL)
    }
}

/// What etcd's members show at one moment: their metrics summed (writes: the highest
/// member's, as every member commits every proposal), and the connections to their client
/// ports.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub at: Option<Instant>,
    /// Established TCP connections to the members' client ports (all clients').
    pub connections: f64,
    /// Those of this process (the agents').
    pub ours: f64,
    /// `etcd_debugging_mvcc_watcher_total`: the watches the members serve.
    pub watchers: f64,
    /// `etcd_debugging_mvcc_watch_stream_total`: their watch streams.
    pub watch_streams: f64,
    /// Keep-alive requests received (`grpc_server_msg_received_total` of `LeaseKeepAlive`).
    pub keep_alives: f64,
    /// `etcd_server_proposals_committed_total` (the highest member's): writes through raft.
    pub proposals: f64,
    /// The members' CPU seconds (`process_cpu_seconds_total`) and resident memory
    /// (`process_resident_memory_bytes`), summed.
    pub cpu_seconds: f64,
    pub rss_bytes: f64,
    /// `grpc_server_handled_total` of unary calls, by method.
    pub unary: BTreeMap<String, f64>,
    /// Streams open now (`grpc_server_started_total - grpc_server_handled_total` of stream
    /// calls), by method.
    pub open_streams: BTreeMap<String, f64>,
    /// Streams started so far, by method.
    pub streams_started: BTreeMap<String, f64>,
}

impl Sample {
    pub fn take(etcd: &EtcdCluster) -> Sample {
        let mut sample = Sample {
            at: Some(Instant::now()),
            ..Sample::default()
        };
        let mut ports = Vec::new();
        for i in 0..etcd.len() {
            let text = etcd.metrics(i).expect("etcd's metrics");
            sample.add(&text);
            sample.proposals =
                sample
                    .proposals
                    .max(sum(&text, "etcd_server_proposals_committed_total", &[]));
            let endpoint = etcd.endpoint(i);
            ports.push(endpoint.rsplit(':').next().unwrap().parse::<u16>().unwrap());
        }
        sample.connections = established_to(&ports) as f64;
        sample.ours = ours_to(&ports) as f64;
        sample
    }

    /// What `text` (one member's metrics, or the proxy's) adds.
    fn add(&mut self, text: &str) {
        self.cpu_seconds += sum(text, "process_cpu_seconds_total", &[]);
        self.rss_bytes += sum(text, "process_resident_memory_bytes", &[]);
        self.watchers += sum(text, "etcd_debugging_mvcc_watcher_total", &[]);
        self.watch_streams += sum(text, "etcd_debugging_mvcc_watch_stream_total", &[]);
        self.keep_alives += sum(
            text,
            "grpc_server_msg_received_total",
            &["grpc_method=\"LeaseKeepAlive\""],
        );
        for line in text.lines() {
            let Some(kind) = label(line, "grpc_type") else {
                continue;
            };
            let Some(method) = label(line, "grpc_method") else {
                continue;
            };
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            let unary = kind == "unary";
            if line.starts_with("grpc_server_handled_total{") {
                if unary {
                    *self.unary.entry(method.into()).or_default() += value;
                } else {
                    *self.open_streams.entry(method.into()).or_default() -= value;
                }
            } else if line.starts_with("grpc_server_started_total{") && !unary {
                *self.open_streams.entry(method.into()).or_default() += value;
                *self.streams_started.entry(method.into()).or_default() += value;
            }
        }
    }

    /// The agents' side of the proxy: the connections to it. (Its `/metrics` are a member's
    /// with its own added, so not what its clients asked of it.)
    pub fn of_proxy(proxy: &Proxy) -> Sample {
        Sample {
            at: Some(Instant::now()),
            connections: established_to(&[proxy.port]) as f64,
            ours: ours_to(&[proxy.port]) as f64,
            ..Sample::default()
        }
    }

    /// The seconds from `earlier` to this sample.
    pub fn secs_since(&self, earlier: &Sample) -> f64 {
        self.at
            .unwrap()
            .duration_since(earlier.at.unwrap())
            .as_secs_f64()
    }

    /// Unary calls of `method` since `earlier`.
    pub fn unary_since(&self, earlier: &Sample, method: &str) -> f64 {
        self.unary.get(method).unwrap_or(&0.0) - earlier.unary.get(method).unwrap_or(&0.0)
    }

    /// Every unary call since `earlier`.
    pub fn all_unary_since(&self, earlier: &Sample) -> f64 {
        self.unary.values().sum::<f64>() - earlier.unary.values().sum::<f64>()
    }

    /// Streams open now, all methods.
    pub fn open(&self) -> f64 {
        self.open_streams.values().sum()
    }
}

/// The value of label `name` in a metrics line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &line[start..];
    Some(&rest[..rest.find('"')?])
}

/// The sum of the samples of metric `name` whose labels include each of `labels`.
pub fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && labels.iter().all(|l| line.contains(l))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Established TCP connections whose local port is one of `ports` (the servers' ends: the
/// servers run on this host).
pub fn established_to(ports: &[u16]) -> usize {
    tcp_established(|local, _, _| ports.contains(&local))
}

/// Established TCP connections this process holds to one of `ports` (the clients' ends).
pub fn ours_to(ports: &[u16]) -> usize {
    let inodes: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_str()?.to_owned();
                    target
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    tcp_established(|_, remote, inode| ports.contains(&remote) && inodes.contains(&inode))
}

/// The established TCP connections of this host for which `keep(local port, remote port,
/// socket inode)` holds.
fn tcp_established(keep: impl Fn(u16, u16, u64) -> bool) -> usize {
    let port = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 9
                        && fields[3] == "01"
                        && keep(
                            port(fields[1]),
                            port(fields[2]),
                            fields[9].parse().unwrap_or(0),
                        )
                })
                .count()
        })
        .sum()
}
