//! `corral explain pod|address|node`: why a pod has no address, who has an address, why a node
//! waits. It walks the chain a CNI ADD walks and checks each link: the node's agent (its
//! holdings, its link to etcd), the pool chosen and why (the call's pool, the namespace's, the
//! network's, the cluster's default), the node's registration, the demand it published
//! (`demand/`), a leader present (`election/`), and what the leader decided for the node (its
//! record `owned/<node>/waiting`, else the view's waits worked out here from etcd). Each link
//! is `ok`, `broken` or `could not check` (with why); the walk stops at the first broken link,
//! with its evidence and what to do. Exit 0 when nothing is broken, 5 (as `check`) when
//! something is.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use corral_cluster::{ClusterView, NodeName, PoolName, PoolRule, WaitingCause, WaitingRecord};
use serde::Serialize;

use crate::Output;
use crate::exit::{Exit, Failure, Outcome};

/// `corral explain`'s subjects.
#[derive(Debug, Subcommand)]
pub enum ExplainCommand {
    /// Why a pod has (or has no) address: NAMESPACE/NAME, a CNI key CONTAINERID/IFNAME, or a
    /// container ID, looked up on the node's agent (--socket)
    Pod {
        /// NAMESPACE/NAME, CONTAINERID/IFNAME or CONTAINERID
        pod: String,
        /// The pool the pod's CNI call named (`runtimeConfig.pool`, `args.cni.pool`), if any;
        /// used when the agent has no record of the pod's ADD
        #[arg(long, value_name = "POOL")]
        pool: Option<String>,
        /// The pod's CNI network: its configuration file (.conf, .conflist), or its name in
        /// --cni-conf-dir; its `ipam.pool` is used when the agent has no record of the ADD
        #[arg(long, value_name = "FILE|NETWORK")]
        cni_config: Option<String>,
        /// Where --cni-config looks a network name up
        #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
        cni_conf_dir: PathBuf,
        #[command(flatten)]
        from: Sources,
    },
    /// Who holds an address: the range granted in the cluster and, with --socket, the
    /// allocation on the node
    Address {
        address: IpAddr,
        #[command(flatten)]
        from: Sources,
    },
    /// Why a node waits: its registration, demand, the leader and its decision, per pool
    Node {
        name: String,
        /// Only this pool [default: every pool of the cluster's configuration]
        #[arg(long, value_name = "POOL")]
        pool: Option<String>,
        #[command(flatten)]
        from: Sources,
    },
}

/// Where `explain` looks: the agent, etcd, the operator; each optional, every link it cannot
/// check for want of one is said so.
#[derive(Debug, Args)]
pub struct Sources {
    /// The node's agent socket [default: CORRAL_SOCKET, else none: its links are not checked]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    #[command(flatten)]
    etcd: crate::cluster::MaybeEtcd,
    /// An operator's API socket: its view of who leads and its current problems
    #[arg(long, value_name = "PATH")]
    operator_socket: Option<PathBuf>,
}

/// How a link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    Broken,
    CouldNotCheck,
}

impl State {
    fn word(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Broken => "BROKEN",
            State::CouldNotCheck => "could not check",
        }
    }
}

/// One link of the chain.
#[derive(Debug, Clone, Serialize)]
pub struct Link {
    /// What was checked: `agent`, `pod`, `pool`, `holdings`, `agent's etcd link`, `etcd`,
    /// `registration`, `demand`, `leader`, `decision`.
    pub link: String,
    pub state: State,
    /// What was found (or why it could not be checked).
    pub detail: String,
    /// What to do (broken links).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub todo: Option<String>,
}

fn ok(link: &str, detail: impl Into<String>) -> Link {
    Link {
        link: link.to_owned(),
        state: State::Ok,
        detail: detail.into(),
        todo: None,
    }
}

fn broken(link: &str, detail: impl Into<String>, todo: impl Into<String>) -> Link {
    Link {
        link: link.to_owned(),
        state: State::Broken,
        detail: detail.into(),
        todo: Some(todo.into()),
    }
}

fn unknown(link: &str, why: impl Into<String>) -> Link {
    Link {
        link: link.to_owned(),
        state: State::CouldNotCheck,
        detail: why.into(),
        todo: None,
    }
}

/// The answer: the subject and the links checked, up to and including the first broken one.
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub subject: String,
    pub links: Vec<Link>,
    /// Whether a link is broken.
    pub broken: bool,
}

impl Explanation {
    fn new(subject: String, all: Vec<Link>) -> Explanation {
        let mut links = Vec::new();
        for link in all {
            let stop = link.state == State::Broken;
            links.push(link);
            if stop {
                break;
            }
        }
        let broken = links.iter().any(|l| l.state == State::Broken);
        Explanation {
            subject,
            links,
            broken,
        }
    }

    fn to_table(&self) -> String {
        let mut text = format!("{}\n", self.subject);
        let width = self.links.iter().map(|l| l.link.len()).max().unwrap_or(0);
        for link in &self.links {
            let _ = writeln!(
                text,
                "  {:width$}  {:15}  {}",
                link.link,
                link.state.word(),
                link.detail
            );
            if let Some(todo) = &link.todo {
                let _ = writeln!(text, "  {:width$}  {:15}  what to do: {todo}", "", "");
            }
        }
        if !self.broken {
            text.push_str("nothing broken\n");
        }
        text
    }
}

/// What the sources said: each `Err` is why it could not be read.
struct Gathered {
    agent: Option<Result<Agent, String>>,
    cluster: Result<Cluster, String>,
    operator: Option<Result<corral_api::operator::OperatorStatus, String>>,
}

/// The node's agent as read.
struct Agent {
    status: corral_api::StatusResponse,
    dump: corral_api::DumpResponse,
}

/// The cluster as read from etcd.
pub struct Cluster {
    pub view: ClusterView,
    pub leader: Option<String>,
    /// Candidates under `election/` (whoever leads or not).
    pub candidates: usize,
    /// The leader's election lease as etcd counts it down (`None`: no leader, or not read).
    pub leader_lease: Option<LeaderLease>,
}

/// What is left of the leader's election lease, read at `read_ms`.
#[derive(Debug, Clone, Copy)]
pub struct LeaderLease {
    pub read_ms: u64,
    /// Seconds left (rounded down); `None` when the lease had already expired.
    pub left_secs: Option<u64>,
    pub granted_secs: u64,
}

impl LeaderLease {
    /// Whether the leader has stopped renewing its lease: an operator renews it every third
    /// of its TTL, so more than two renewals missed (and at least two seconds of silence
    /// beyond one) means it no longer answers. Answers since when, and when the lease ends.
    fn stalled(&self) -> Option<(u64, u64)> {
        let period = self.granted_secs.saturating_mul(1000) / 3;
        let left_ms = self.left_secs?.saturating_mul(1000);
        let silent_ms = self
            .granted_secs
            .saturating_mul(1000)
            .saturating_sub(left_ms);
        (silent_ms > (2 * period).max(period + 2000)).then(|| {
            (
                self.read_ms.saturating_sub(silent_ms),
                self.read_ms + left_ms,
            )
        })
    }
}

pub fn run(command: ExplainCommand, output: Output) -> Result<Outcome, Failure> {
    let sources = match &command {
        ExplainCommand::Pod { from, .. }
        | ExplainCommand::Address { from, .. }
        | ExplainCommand::Node { from, .. } => from,
    };
    let socket = crate::socket_or_env(sources.socket.clone());
    let agent = socket.as_ref().map(|socket| {
        let mut client = corral_client::Client::unix(socket);
        let status = client.status(None).map_err(|e| e.to_string())?;
        let dump = client.dump(None).map_err(|e| e.to_string())?;
        Ok(Agent { status, dump })
    });
    let operator = sources.operator_socket.as_ref().map(|socket| {
        corral_client::Client::unix(socket)
            .operator_status()
            .map_err(|e| e.to_string())
    });
    let cluster = match sources.etcd.given() {
        None => Err("no --etcd given".to_owned()),
        Some(etcd) => read_cluster(&etcd),
    };
    let gathered = Gathered {
        agent,
        cluster,
        operator,
    };
    let explanation = match command {
        ExplainCommand::Pod {
            pod,
            pool,
            cni_config,
            cni_conf_dir,
            ..
        } => {
            let network = cni_config.map(|spec| crate::cni_network::read(&spec, &cni_conf_dir));
            let call = CallPools {
                requested: pool,
                network,
            };
            explain_pod(&gathered, &pod, &call)
        }
        ExplainCommand::Address { address, .. } => explain_address(&gathered, address),
        ExplainCommand::Node { name, pool, .. } => {
            let node = NodeName::new(&name).map_err(|e| Failure::Usage(format!("{name}: {e}")))?;
            explain_node(&gathered, &node, pool.as_deref())
        }
    };
    let stdout = match output {
        Output::Json => serde_json::to_string_pretty(&explanation).unwrap_or_default() + "\n",
        Output::Table => explanation.to_table(),
    };
    Ok(Outcome {
        stdout,
        exit: if explanation.broken {
            Exit::ProblemsFound
        } else {
            Exit::Ok
        },
    })
}

/// Reads the whole cluster at one revision, and its election keys.
fn read_cluster(etcd: &crate::cluster::EtcdArgs) -> Result<Cluster, String> {
    let runtime = crate::cluster::runtime().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (kv, keys) = crate::cluster::connect(etcd)
            .await
            .map_err(|e| e.to_string())?;
        let (view, _) = crate::cluster::read_view(&kv, &keys)
            .await
            .map_err(|e| e.to_string())?;
        let (election, _) = corral_kv::read_all(&kv, keys.election_prefix().as_bytes(), 100)
            .await
            .map_err(|e| e.to_string())?;
        let entries: Vec<_> = election
            .iter()
            .map(|e| {
                let lease = e.lease.map(|l| l.0);
                (e.key_str(), lease, e.create_revision, e.value.as_slice())
            })
            .collect();
        let candidates = entries
            .iter()
            .filter(|(key, lease, ..)| corral_cluster::election_candidate(&keys, key, *lease))
            .count();
        let leader_key = entries
            .iter()
            .filter(|(key, lease, ..)| corral_cluster::election_candidate(&keys, key, *lease))
            .min_by_key(|(_, _, created, _)| *created)
            .and_then(|(_, lease, ..)| *lease);
        let leader = corral_cluster::election_leader(&keys, entries);
        // A leader that stopped answering keeps its key until its lease runs out: how much of
        // the lease is left tells a failover in progress before then.
        let leader_lease = match leader_key {
            Some(lease) => kv
                .lease_time_left(corral_kv::LeaseId(lease))
                .await
                .ok()
                .map(|left| LeaderLease {
                    read_ms: now_ms(),
                    left_secs: left.map(|(left, _)| left.as_secs()),
                    granted_secs: left.map_or(0, |(_, granted)| granted.as_secs()),
                }),
            None => None,
        };
        Ok(Cluster {
            view,
            leader,
            candidates,
            leader_lease,
        })
    })
}

/// Milliseconds since the epoch now.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The agent's links: reachable, and its link to etcd. Answers the node it serves, if known.
fn agent_links(gathered: &Gathered, links: &mut Vec<Link>) -> Option<String> {
    match &gathered.agent {
        None => {
            links.push(unknown(
                "agent",
                "no --socket given: the node's holdings are not checked",
            ));
            None
        }
        Some(Err(error)) => {
            links.push(broken(
                "agent",
                format!("the agent does not answer: {error}"),
                "is `corral agent` running on the node, on this socket?",
            ));
            None
        }
        Some(Ok(agent)) => {
            let Some(link) = &agent.status.cluster else {
                links.push(ok("agent", "answers; it is in no cluster (no --etcd)"));
                return None;
            };
            links.push(ok(
                "agent",
                format!(
                    "node {} answers{}",
                    link.node,
                    if agent.status.ready {
                        ""
                    } else {
                        " (still restoring)"
                    }
                ),
            ));
            if link.degraded {
                let since = link
                    .degraded_since_ms
                    .map(|ms| format!(" since {}", crate::output::utc(ms)))
                    .unwrap_or_default();
                let error = link.last_error.as_deref().unwrap_or("no error recorded");
                // What the agent saw, or what explain's own read of etcd says.
                let etcd_says = gathered.cluster.as_ref().err().map_or("", String::as_str);
                let quorum = [error, etcd_says]
                    .iter()
                    .any(|e| e.contains("no leader") || e.contains("lost quorum"));
                let error = if quorum && !error.contains("quorum") && !etcd_says.is_empty() {
                    format!("{error} (etcd says: {etcd_says})")
                } else {
                    error.to_owned()
                };
                links.push(broken(
                    "agent's etcd link",
                    format!("the agent cannot reach etcd{since}: {error}"),
                    if quorum {
                        "etcd has lost quorum: bring its members back (more than half must run); \
                         the node serves from what it holds meanwhile"
                    } else {
                        "check that etcd runs and the node reaches it (--etcd); the node serves \
                         from what it holds meanwhile"
                    },
                ));
            } else {
                links.push(ok(
                    "agent's etcd link",
                    format!(
                        "connected{}",
                        if link.registered {
                            ", registered"
                        } else {
                            ", not registered yet"
                        }
                    ),
                ));
            }
            Some(link.node.clone())
        }
    }
}

/// etcd as explain itself reads it.
fn etcd_link(gathered: &Gathered, links: &mut Vec<Link>) {
    match &gathered.cluster {
        Ok(cluster) => links.push(ok(
            "etcd",
            format!("read ({} nodes registered)", cluster.view.nodes().count()),
        )),
        Err(error) if error == "no --etcd given" => links.push(unknown(
            "etcd",
            "no --etcd given: the cluster is not checked",
        )),
        Err(error) => {
            let quorum = error.contains("no leader") || error.contains("lost quorum");
            links.push(broken(
                "etcd",
                format!("cannot read the cluster: {error}"),
                if quorum {
                    "etcd has lost quorum: bring its members back (more than half must run)"
                } else {
                    "check that etcd runs and --etcd/--cluster name it"
                },
            ));
        }
    }
}

/// The leader: present, who, and what the operator socket says.
fn leader_link(gathered: &Gathered, cluster: &Cluster, links: &mut Vec<Link>) {
    let operator = match &gathered.operator {
        Some(Ok(status)) if status.leading => {
            format!("; operator {} says it leads", status.replica)
        }
        Some(Ok(status)) => format!("; operator {} is a standby", status.replica),
        Some(Err(error)) => format!("; the operator socket does not answer: {error}"),
        None => String::new(),
    };
    let stalled = cluster
        .leader_lease
        .and_then(|l| l.stalled().map(|s| (l, s)));
    match (&cluster.leader, stalled) {
        (Some(leader), Some((lease, (since_ms, until_ms)))) => {
            let standbys = cluster.candidates.saturating_sub(1);
            links.push(broken(
                "leader",
                format!(
                    "failover in progress: the leader ({leader}) stopped answering at about {} \
                     (it has not renewed its election lease since: {} s of {} s left); {}{operator}",
                    crate::output::utc(since_ms),
                    lease.left_secs.unwrap_or(0),
                    lease.granted_secs,
                    if standbys == 0 {
                        format!(
                            "no standby campaigns: no one takes over when its lease ends at {}",
                            crate::output::utc(until_ms)
                        )
                    } else {
                        format!(
                            "a standby ({standbys} campaign) takes over when its lease ends at {}",
                            crate::output::utc(until_ms)
                        )
                    }
                ),
                if standbys == 0 {
                    "restart the leader's `corral operator`, or start another"
                } else {
                    "wait for the standby to take over (the time shown); grants resume then"
                },
            ));
        }
        (Some(leader), None) => {
            links.push(ok("leader", format!("operator {leader} leads{operator}")));
        }
        (None, _) if cluster.candidates == 0 => links.push(broken(
            "leader",
            format!(
                "no operator leads the cluster: none campaigns under election/ (a leader that \
                 died or stopped loses its key when its lease expires){operator}"
            ),
            "if a standby runs, a failover is in progress: it takes over within its lease TTL; \
             else start `corral operator`",
        )),
        (None, _) => links.push(broken(
            "leader",
            format!("no candidate under election/ can lead{operator}"),
            "`corral cluster check` names the election keys that are not candidates",
        )),
    }
}

/// What `explain pod` was told of the pod's CNI call: the pool it named (`--pool`) and its
/// network (`--cni-config`, read or why not).
struct CallPools {
    requested: Option<String>,
    network: Option<Result<crate::cni_network::CniNetwork, String>>,
}

/// Why a rule chose a pool, in words (`network`: where the network's pool was read).
fn rule_text(rule: PoolRule, namespace: Option<&str>, network: &str) -> String {
    match rule {
        PoolRule::Requested => {
            "the pod's CNI call named it (runtimeConfig.pool or args.cni.pool)".to_owned()
        }
        PoolRule::Namespace => format!(
            "namespace {} maps to it (the cluster configuration's namespaces)",
            namespace.unwrap_or("?")
        ),
        PoolRule::Network => format!("the network's pool ({network})"),
        PoolRule::DefaultPool => "the cluster's default pool".to_owned(),
        PoolRule::Default => "no pool named anywhere: `default`".to_owned(),
    }
}

/// The pool of a pod's ADD the agent recorded, and why: the pool link, with the ADD's outcome.
fn recorded_pool(add: &corral_api::AddRecord) -> Link {
    let rule = PoolRule::parse(&add.rule).map_or_else(
        || format!("rule {}", add.rule),
        |rule| rule_text(rule, add.namespace.as_deref(), "ipam.pool"),
    );
    ok(
        "pool",
        format!(
            "{}: {rule} (the agent's record of the pod's ADD at {}, {})",
            add.pool,
            crate::output::utc(add.at_ms),
            add.outcome
        ),
    )
}

/// The pool the pod's ADD would use, worked out from the cluster configuration and what the
/// call was said to carry: the pool link's detail, or why part of it could not be read.
fn pool_choice(
    config: &corral_cluster::ClusterConfig,
    namespace: Option<&str>,
    call: &CallPools,
) -> Result<(String, String), String> {
    let (configured, source) = match &call.network {
        None => (None, String::new()),
        Some(Err(error)) => return Err(format!("--cni-config: {error}")),
        Some(Ok(network)) => match &network.ipam {
            crate::cni_network::NetworkIpam::NodePool(pool) => (
                pool.clone(),
                format!("ipam.pool of network {} in {}", network.name, network.file),
            ),
            crate::cni_network::NetworkIpam::OwnRanges => {
                return Err(format!(
                    "network {} ({}) allocates from its own ranges (ipam.ranges or                      ipam.subnet), not from a pool of the node",
                    network.name, network.file
                ));
            }
            crate::cni_network::NetworkIpam::Local => {
                return Err(format!(
                    "network {} ({}) has no ipam.agent: corral-ipam allocates without the                      agent",
                    network.name, network.file
                ));
            }
            crate::cni_network::NetworkIpam::Other(kind) => {
                return Err(format!(
                    "network {} ({}) uses IPAM plugin {kind}, not corral-ipam",
                    network.name, network.file
                ));
            }
        },
    };
    let (pool, rule) =
        config.choose_pool(call.requested.as_deref(), namespace, configured.as_deref());
    let mut why = rule_text(rule, namespace, &source);
    if rule == PoolRule::Requested {
        why.push_str(" (--pool)");
    }
    Ok((pool, why))
}

/// A pool neither the cluster's configuration nor the agent's own node scope has: the pool
/// link broken (`None` when it exists, or when neither source was read).
fn unknown_pool(gathered: &Gathered, pool: &str) -> Option<Link> {
    let cluster = gathered.cluster.as_ref().ok()?;
    if cluster
        .view
        .config()
        .pools
        .iter()
        .any(|p| p.name.as_str() == pool)
    {
        return None;
    }
    if let Some(Ok(agent)) = &gathered.agent
        && agent
            .status
            .scopes
            .iter()
            .filter(|s| s.scope == corral_api::NODE_SCOPE)
            .any(|s| s.pools.iter().any(|p| p.pool == pool))
    {
        return None;
    }
    Some(broken(
        "pool",
        format!("pool {pool} is not a pool of the cluster, nor of the node's agent"),
        "name a pool that exists (`corral cluster status` lists the cluster's), or add it \
         (`corral cluster apply`)",
    ))
}

/// The node's side of one pool: what the agent holds in it, and what it published.
fn holdings_link(gathered: &Gathered, pool: &str, links: &mut Vec<Link>) {
    let Some(Ok(agent)) = &gathered.agent else {
        links.push(unknown("holdings", "the agent was not read"));
        return;
    };
    let families: Vec<String> = agent
        .status
        .scopes
        .iter()
        .filter(|s| s.scope == corral_api::NODE_SCOPE)
        .flat_map(|s| s.pools.iter())
        .filter(|p| p.pool == pool)
        .flat_map(|p| p.families.iter())
        .map(|f| format!("{:?} {} used, {} free", f.family, f.used, f.free).to_lowercase())
        .collect();
    let ranges: Vec<&str> = agent
        .status
        .cluster
        .iter()
        .flat_map(|c| c.grants.iter())
        .filter_map(|g| g.strip_prefix(pool).and_then(|r| r.strip_prefix(' ')))
        .collect();
    let detail = if families.is_empty() {
        format!("pool {pool}: no range held")
    } else {
        format!(
            "pool {pool}: {} ({})",
            families.join(", "),
            if ranges.is_empty() {
                "no cluster range".to_owned()
            } else {
                ranges.join(", ")
            }
        )
    };
    links.push(ok("holdings", detail));
}

/// The cluster's side of one pool for the node: registration, demand, decision.
fn cluster_links(
    gathered: &Gathered,
    node: &NodeName,
    pool: Option<&PoolName>,
    links: &mut Vec<Link>,
) {
    let Ok(cluster) = &gathered.cluster else {
        for link in ["registration", "demand", "leader", "decision"] {
            links.push(unknown(link, "etcd was not read"));
        }
        return;
    };
    let view = &cluster.view;
    if let Some((_, removal)) = view.removals().get(node) {
        links.push(broken(
            "registration",
            format!(
                "node {node} is being removed (phase {:?}): it takes no new pods",
                removal.phase
            )
            .to_lowercase(),
            "schedule the pod on another node",
        ));
        return;
    }
    if view.registration(node).is_none() {
        links.push(broken(
            "registration",
            format!("node {node} is not registered in the cluster"),
            "start its agent with --etcd and --node (or check the node's name)",
        ));
        return;
    }
    links.push(ok(
        "registration",
        format!(
            "registered, {}",
            if view.is_live(node) {
                "live"
            } else {
                "NOT live (no agent holds its liveness key)"
            }
        ),
    ));
    match pool {
        Some(pool) if view.is_block_pool(pool) || view.is_cloud_pool(pool) => {
            match view.demand(node, pool) {
                Some(demand) => {
                    let families: Vec<String> =
                        [corral_cluster::Family::V4, corral_cluster::Family::V6]
                            .into_iter()
                            .filter_map(|f| {
                                demand.family(f).map(|d| {
                                    format!(
                                        "{}: {} used, {} free, {} waiting",
                                        corral_cluster::keys::family_segment(f),
                                        d.used,
                                        d.free,
                                        d.pending
                                    )
                                })
                            })
                            .collect();
                    links.push(ok(
                        "demand",
                        format!("published for pool {pool} ({})", families.join("; ")),
                    ));
                }
                None => links.push(broken(
                    "demand",
                    format!("node {node} published no demand for pool {pool}"),
                    "the leader grants blocks on demand: check the agent's link (`corral status`)",
                )),
            }
        }
        Some(pool) => links.push(ok(
            "demand",
            format!("pool {pool} grants node CIDRs: no demand needed"),
        )),
        None => {}
    }
    leader_link(gathered, cluster, links);
    decision_link(view, node, pool, links);
}

/// What the leader decided: its published record, else the waits worked out from etcd.
fn decision_link(
    view: &ClusterView,
    node: &NodeName,
    pool: Option<&PoolName>,
    links: &mut Vec<Link>,
) {
    let of_pool = |p: &Option<PoolName>| pool.is_none() || p.as_ref() == pool;
    if let Some(record) = view.stored_waiting(node) {
        let record = WaitingRecord {
            waits: record
                .waits
                .iter()
                .filter(|w| of_pool(&w.pool))
                .cloned()
                .collect(),
            ..record.clone()
        };
        if !record.waits.is_empty() || record.paused.is_some() {
            let causes: Vec<String> = record
                .paused
                .iter()
                .map(|p| format!("granting is paused cluster-wide ({p})"))
                .chain(
                    record
                        .waits
                        .iter()
                        .map(|w| w.cause_text(crate::output::utc)),
                )
                .collect();
            links.push(broken(
                "decision",
                format!(
                    "the leader cannot serve node {node} (its record, since {}): {}",
                    crate::output::utc(record.since_ms),
                    causes.join("; ")
                ),
                todo_of(&record),
            ));
            return;
        }
    }
    let waits: Vec<_> = view
        .waits(node)
        .into_iter()
        .filter(|w| of_pool(&w.pool))
        .collect();
    if let Some(wait) = waits.iter().find(|w| w.is_starving()) {
        let entry = wait.entry(view.quarantine_until(wait.pool.as_ref(), wait.family));
        let record = WaitingRecord {
            since_ms: 0,
            waits: vec![entry.clone()],
            paused: None,
            removing: false,
        };
        links.push(broken(
            "decision",
            format!(
                "{} (worked out from etcd; the leader has not published it yet)",
                entry.cause_text(crate::output::utc)
            ),
            todo_of(&record),
        ));
        return;
    }
    if waits.is_empty() {
        links.push(ok("decision", format!("node {node} is served")));
    } else {
        let what: Vec<String> = waits
            .iter()
            .map(|w| format!("{}: {}", w.what(), w.why()))
            .collect();
        links.push(ok(
            "decision",
            format!(
                "space is free; the leader grants it next ({})",
                what.join("; ")
            ),
        ));
    }
}

/// What to do about a leader's decision.
fn todo_of(record: &WaitingRecord) -> String {
    if record.paused.is_some() {
        return "wait for the live agents to assert their holdings, or `corral cluster recover \
                --yes` if some never will"
            .to_owned();
    }
    match record
        .waits
        .iter()
        .map(|w| w.cause)
        .find(|c| *c != WaitingCause::NotGranted)
    {
        Some(WaitingCause::Exhausted) => "widen the pool (`corral cluster apply` with more CIDRs) \
             or free space (remove idle nodes, or lower other nodes' watermarks)"
            .to_owned(),
        Some(WaitingCause::Quarantined) => "wait for the quarantine to end (the time shown), or \
             widen the pool (`corral cluster apply`)"
            .to_owned(),
        Some(WaitingCause::AtCapacity) => "the instance has no room for more interfaces or \
             addresses: a larger instance type, or a pool with room in the subnets"
            .to_owned(),
        _ if record.removing => "schedule the pod on another node".to_owned(),
        _ => "the leader grants it next; wait".to_owned(),
    }
}

/// The pod's chain: the agent, the pod's addresses, the pool, the node's holdings and the
/// cluster's links for that pool.
fn explain_pod(gathered: &Gathered, pod: &str, call: &CallPools) -> Explanation {
    let mut links = Vec::new();
    let node = agent_links(gathered, &mut links);
    // The agent's record of the pod's latest ADD on a node pool, if it kept one.
    let add = match &gathered.agent {
        Some(Ok(agent)) => agent.status.adds.iter().rev().find(|a| {
            a.owner == pod
                || a.key.container_id == pod
                || format!("{}/{}", a.key.container_id, a.key.ifname) == pod
        }),
        _ => None,
    };
    // The pod's addresses on the node, by owner (NAMESPACE/NAME, or the container ID), CNI
    // key (CONTAINERID/IFNAME) or container ID.
    let mut held = Vec::new();
    if let Some(Ok(agent)) = &gathered.agent {
        for scope in &agent.dump.scopes {
            for pool in &scope.pools {
                for entry in &pool.allocations {
                    let by_key = entry.key.as_ref().is_some_and(|k| {
                        k.container_id == pod || format!("{}/{}", k.container_id, k.ifname) == pod
                    });
                    if entry.owner == pod || by_key {
                        held.push(format!("{} (pool {})", entry.address, pool.pool));
                    }
                }
            }
        }
    }
    if !held.is_empty() {
        links.push(ok("pod", format!("holds {}", held.join(", "))));
        links.extend(add.map(recorded_pool));
        return Explanation::new(format!("pod {pod}"), links);
    }
    let pod_link_at = links.len();
    let namespace = pod
        .split_once('/')
        .map(|(ns, _)| ns)
        .filter(|ns| !ns.chars().all(|c| c.is_ascii_hexdigit()) || ns.len() < 12);
    etcd_link(gathered, &mut links);
    let pool = match (add, &gathered.cluster) {
        (Some(add), _) => {
            links.push(recorded_pool(add));
            Some(add.pool.clone())
        }
        (None, Ok(cluster)) => match pool_choice(cluster.view.config(), namespace, call) {
            Ok((pool, why)) => {
                links.push(ok("pool", format!("{pool}: {why}")));
                Some(pool)
            }
            Err(why) => {
                links.push(unknown("pool", why));
                None
            }
        },
        (None, Err(_)) => {
            let pool = call.requested.clone();
            links.push(unknown(
                "pool",
                match &pool {
                    Some(p) => format!("{p} (--pool); the namespace map was not read"),
                    None => "the cluster configuration was not read".to_owned(),
                },
            ));
            pool
        }
    };
    if let Some(pool) = &pool {
        if let Some(link) = unknown_pool(gathered, pool) {
            links.push(link);
        }
        holdings_link(gathered, pool, &mut links);
    }
    match node.as_deref().map(NodeName::new) {
        Some(Ok(node)) => {
            let pool = pool.as_deref().and_then(|p| PoolName::new(p).ok());
            cluster_links(gathered, &node, pool.as_ref(), &mut links);
        }
        _ => links.push(unknown(
            "registration",
            "the node is not known (the agent was not read)",
        )),
    }
    let mut explanation = Explanation::new(format!("pod {pod}"), links);
    if explanation.broken {
        let failed = add
            .and_then(|a| a.error.as_deref())
            .map(|e| format!(" (its ADD failed: {e})"))
            .unwrap_or_default();
        explanation.links.insert(
            pod_link_at,
            ok(
                "pod",
                format!("holds no address on this node{failed}; why is below"),
            ),
        );
    } else {
        // Nothing down the chain explains it: the pod's own link is the broken one.
        explanation
            .links
            .push(match add.and_then(|a| a.error.as_deref()) {
                Some(error) => broken(
                    "pod",
                    format!(
                        "pod {pod} holds no address on this node: its ADD failed: {error}; \
                     nothing down the chain is broken now"
                    ),
                    "the cause may have passed: the container runtime retries the ADD",
                ),
                None => broken(
                    "pod",
                    format!(
                        "pod {pod} holds no address on this node, and nothing down the chain is \
                     broken"
                    ),
                    "the ADD may not have reached the agent: see the container runtime's and \
                 corral-ipam's logs",
                ),
            });
        explanation.broken = true;
    }
    explanation
}

/// A node's chain, per pool (or one pool).
fn explain_node(gathered: &Gathered, node: &NodeName, pool: Option<&str>) -> Explanation {
    let mut links = Vec::new();
    let agent_node = agent_links(gathered, &mut links);
    if let Some(serving) = &agent_node
        && serving != node.as_str()
    {
        links.push(broken(
            "agent",
            format!("the agent at --socket serves node {serving}, not {node}"),
            "give the socket of the node's own agent",
        ));
        return Explanation::new(format!("node {node}"), links);
    }
    etcd_link(gathered, &mut links);
    let pool = pool.and_then(|p| PoolName::new(p).ok());
    if let Some(pool) = &pool {
        holdings_link(gathered, pool.as_str(), &mut links);
    }
    cluster_links(gathered, node, pool.as_ref(), &mut links);
    Explanation::new(format!("node {node}"), links)
}

/// An address: the range granted that holds it and, with the agent, who holds the address.
fn explain_address(gathered: &Gathered, address: IpAddr) -> Explanation {
    let mut links = Vec::new();
    agent_links(gathered, &mut links);
    if let Some(Ok(agent)) = &gathered.agent {
        let holder = agent
            .dump
            .scopes
            .iter()
            .flat_map(|s| s.pools.iter().map(move |p| (s, p)))
            .flat_map(|(s, p)| p.allocations.iter().map(move |a| (s, p, a)))
            .find(|(_, _, a)| a.address == address);
        links.push(match holder {
            Some((scope, pool, a)) => ok(
                "allocation",
                format!(
                    "held by {} in pool {} (scope {}, generation {}{})",
                    a.owner,
                    pool.pool,
                    scope.scope,
                    a.generation,
                    a.key
                        .as_ref()
                        .map(|k| format!(", CNI key {}/{}", k.container_id, k.ifname))
                        .unwrap_or_default()
                ),
            ),
            None => ok("allocation", "not allocated on this node"),
        });
    }
    etcd_link(gathered, &mut links);
    if let Ok(cluster) = &gathered.cluster {
        let view = &cluster.view;
        let granted = view.nodes().find_map(|(node, _)| {
            view.grants_of(node)
                .into_iter()
                .find(|g| g.cidr.contains(&address))
                .map(|g| (node.clone(), g))
        });
        match granted {
            Some((node, grant)) => links.push(ok(
                "grant",
                format!(
                    "in {} of pool {} ({}), granted to node {node}",
                    grant.cidr,
                    grant.pool,
                    corral_cluster::keys::family_segment(grant.family)
                ),
            )),
            None => {
                let pool = view.config().pools.iter().find(|p| {
                    p.ipv4
                        .iter()
                        .chain(p.ipv6.iter())
                        .flat_map(|f| f.cidrs.iter())
                        .any(|c| c.contains(&address))
                });
                links.push(match pool {
                    Some(pool) => ok(
                        "grant",
                        format!(
                            "in pool {}'s space, granted to no node now (free, or in quarantine)",
                            pool.name
                        ),
                    ),
                    None => broken(
                        "grant",
                        format!("{address} is in no pool of the cluster"),
                        "check the address, or the cluster's configuration (`corral cluster status`)",
                    ),
                });
            }
        }
    }
    Explanation::new(format!("address {address}"), links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counting_down_past_two_renewals_is_a_stalled_leader() {
        let lease = |left: Option<u64>, granted: u64| LeaderLease {
            read_ms: 100_000,
            left_secs: left,
            granted_secs: granted,
        };
        // Renewed every 10/3 s: up to 6.67 s of silence is a leader that answers.
        assert_eq!(lease(Some(10), 10).stalled(), None);
        assert_eq!(lease(Some(4), 10).stalled(), None);
        // 7 s without a renewal: it stopped at 93 s, the lease ends at 103 s.
        assert_eq!(lease(Some(3), 10).stalled(), Some((93_000, 103_000)));
        // A short lease: at least two seconds past one renewal.
        assert_eq!(lease(Some(1), 3).stalled(), None);
        assert_eq!(lease(Some(0), 3).stalled(), None);
        assert_eq!(lease(Some(0), 6).stalled(), Some((94_000, 100_000)));
        // Already expired: the election read will show no leader.
        assert_eq!(lease(None, 10).stalled(), None);
    }
}
