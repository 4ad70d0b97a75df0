//! The cluster's commands: `corral operator` (the daemon), `corral cluster init|apply|status|
//! check|recover|history` (`history_cluster.rs`) and `corral node list|show|remove|plan`. They talk to etcd directly (`--etcd`), so
//! they work whether or not an operator runs; only the operator grants, and removal is a
//! request the leading operator carries out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use corral_cluster::{
    ClusterConfig, ClusterName, Keys, NodeName, NodePlan, RemovalMode, RemovalPhase, RemovalRecord,
    encode_value,
};
use corral_etcd::EtcdKv;
use corral_kv::{Compare, Kv, Txn, TxnOp};

use crate::Output;
use crate::cloud::{Cloud, Providers};
use crate::exit::{Exit, Failure, Outcome};

pub use crate::etcd_args::EtcdArgs;

/// etcd for a command that can do without it (`explain`, `history`): [`EtcdArgs`] whose
/// `--etcd` is not required, asked only when URLs are given.
#[derive(Debug, Args)]
#[command(mut_arg("etcd", |etcd| etcd
    .required(false)
    .help("etcd's client URLs, comma-separated (without them etcd is not asked)")))]
pub struct MaybeEtcd {
    #[command(flatten)]
    pub flags: EtcdArgs,
}

impl MaybeEtcd {
    /// The etcd to ask, if URLs were given.
    pub fn given(&self) -> Option<EtcdArgs> {
        (!self.flags.etcd.is_empty()).then(|| self.flags.clone())
    }
}

/// `--cloud` and its settings.
#[derive(Debug, Args)]
pub struct CloudArgs {
    /// The cloud: `fake`, an in-process fake EC2 seeded from --fake-cloud (a demo and test
    /// backend), or `aws` in the AWS build (the `corral-aws` binary: region and credentials
    /// from the environment as every AWS tool finds them)
    #[arg(long, value_name = "NAME")]
    pub cloud: Option<String>,
    /// The fake cloud's seed file (JSON: `seed`, `subnets` [{id, vpc, zone, ipv4, ipv6?}],
    /// `instances` [{id, type, subnet, ipv4_prefixes?, ipv6_prefixes?}]: prefixes delegated to
    /// the instance's primary interface)
    #[arg(long, value_name = "FILE", requires = "cloud")]
    pub fake_cloud: Option<PathBuf>,
    /// The cloud API's endpoint URL instead of the provider's own (a VPC endpoint, or an
    /// emulator such as moto); for aws, AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_EC2 also do
    #[arg(long, value_name = "URL", requires = "cloud")]
    pub cloud_endpoint: Option<String>,
}

impl CloudArgs {
    /// Connects the named cloud, if any.
    pub(crate) async fn connect(
        &self,
        providers: &Providers,
    ) -> Result<Option<Arc<dyn Cloud>>, Failure> {
        let Some(name) = &self.cloud else {
            return Ok(None);
        };
        let settings = crate::cloud::CloudSettings {
            endpoint: self.cloud_endpoint.clone(),
            fake_cloud: self.fake_cloud.clone(),
        };
        providers.connect(name, settings).await.map(Some)
    }
}

/// `corral cluster status`'s options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// An operator's API socket (e.g. /run/corral/operator.sock): its current problems are
    /// listed, each with since when
    #[arg(long, value_name = "PATH")]
    pub operator_socket: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Write the cluster configuration (TOML) to etcd, once: refused if one is there
    Init(ConfigArgs),
    /// Change the cluster configuration: refused where grants may rest on it (a pool's node
    /// prefix length, a removed pool or CIDR)
    Apply(ConfigArgs),
    /// Pools (capacity, granted, quarantined, free per family), nodes, the leader; given
    /// --operator-socket, that operator's current problems and since when
    Status(StatusArgs),
    /// Verify from etcd alone (and, given agent sockets, each agent's ranges; given --cloud,
    /// the cloud pools' interface records against the cloud's own view) that no CIDR, node ID
    /// or cloud address is held twice; exit code 5 if anything is wrong
    Check(CheckArgs),
    /// After etcd went back in time (restored from a snapshot, wiped and initialised again):
    /// tell the leader to grant again without waiting for the agents to assert what they
    /// hold; prints what that means, and does it only with --yes
    Recover(RecoverArgs),
    /// Who held an address or CIDR (optionally at a time), or everything a node held: grants
    /// of node CIDRs and blocks with when they began and ended and why, newest first
    History(ClusterHistoryArgs),
    /// Make etcd's roles and users of the cluster: `corral-<cluster>-operator` (read and write
    /// the cluster's keys) and `corral-<cluster>-reader` (read them: status, check, node list
    /// and show), each user's password in --password-dir; with --enable-auth also the `root`
    /// user, then auth on. Idempotent: an existing user keeps its password
    Rbac(RbacArgs),
}

/// `corral cluster rbac`'s options.
#[derive(Debug, Args)]
pub struct RbacArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Where the passwords of the users it makes go (`<user>.password`, mode 0600); a file
    /// already there gives a new user its password
    #[arg(long, value_name = "DIR")]
    pub password_dir: PathBuf,
    /// Also make the `root` user (etcd needs it first) and enable etcd's auth
    #[arg(long)]
    pub enable_auth: bool,
}

#[derive(Debug, Args)]
pub struct ClusterHistoryArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    #[command(flatten)]
    pub options: crate::history_cluster::HistoryOptions,
}

#[derive(Debug, Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Do it (without: only say what it would do, and exit 1)
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The cluster configuration file (TOML)
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// `apply` over a stored configuration that cannot be read (still refused if it would
    /// free space nodes hold)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// An agent's socket whose ranges must equal its node's grants (repeatable)
    #[arg(long = "agent", value_name = "SOCKET")]
    pub agents: Vec<PathBuf>,
    /// Also compare the cloud pools' `interfaces/` records with the cloud's own view of its
    /// interfaces (read-only calls)
    #[command(flatten)]
    pub cloud: CloudArgs,
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Every registered node with its grants, node ID and liveness
    List(EtcdArgs),
    /// One node
    Show(NodeArgs),
    /// Remove a node: what it holds goes to quarantine once its agent gave it up (or it showed
    /// no liveness for the quarantine time), then back to the free space. A live node that
    /// holds allocations needs --drain or --force
    Remove(RemoveArgs),
    /// The node's address plan derived from its node ID (node-ID clusters)
    Plan(NodeArgs),
    /// Make the node's etcd role and user, `corral-<cluster>-node-<name>`: it may write only
    /// its own keys (registration, liveness, holdings, demand, release answers) and read what
    /// its agent needs; the password goes to --password-dir. Idempotent
    Credentials(CredentialsArgs),
}

/// `corral node credentials`'s options.
#[derive(Debug, Args)]
pub struct CredentialsArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Where the node user's password goes (`<user>.password`, mode 0600)
    #[arg(long, value_name = "DIR")]
    pub password_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Drain a live node: it takes no new pods, and its space comes back as its pods go
    #[arg(long, conflicts_with = "force")]
    pub drain: bool,
    /// Remove a node its operator knows is dead, whatever it last said it holds (it keeps its
    /// space if it comes back before the quarantine time passed)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The node's name
    pub name: String,
}

#[path = "cluster_config.rs"]
mod config_paths;

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::Runtime)
}

pub(crate) async fn connect(args: &EtcdArgs) -> Result<(EtcdKv, Keys), Failure> {
    let keys = Keys::new(
        ClusterName::new(args.cluster_name())
            .map_err(|e| Failure::Usage(format!("--cluster: {e}")))?,
    );
    let kv = EtcdKv::connect(
        &args.etcd,
        crate::etcd_args::options(&args.tls, &args.auth)?,
    )
    .await?;
    Ok((kv, keys))
}

/// Logs each reload of etcd's TLS files by `kv` (a rotation), and each change refused, for
/// as long as the client lives.
pub(crate) fn log_tls_reloads(kv: &EtcdKv) {
    let mut news = kv.tls_reloads();
    tokio::spawn(async move {
        while news.changed().await.is_ok() {
            let news = news.borrow_and_update().clone();
            match news.refused {
                Some(refused) => tracing::warn!(
                    %refused,
                    "etcd's TLS files changed but cannot be used: keeping the ones in use"
                ),
                None => tracing::info!(reloads = news.reloads, "etcd's TLS files reloaded"),
            }
        }
    });
}

/// The cluster's grant history `request` asks for, read from etcd (`corral history --etcd`).
pub fn grant_history(
    etcd: &EtcdArgs,
    request: &corral_operator::history::HistoryRequest,
) -> Result<corral_api::operator::GrantHistory, Failure> {
    runtime()?.block_on(async {
        let (kv, keys) = connect(etcd).await?;
        crate::history_cluster::events(&kv, &keys, request).await
    })
}

fn kv_failure(error: corral_kv::KvError) -> Failure {
    Failure::Cluster(error)
}

/// Every key under the cluster's prefix but its history, at one revision, and that revision:
/// kind by kind, in ranges of about a page (`corral_kv::Scan`), as the leader's rebuild reads.
async fn read_cluster(
    kv: &EtcdKv,
    keys: &Keys,
) -> Result<(Vec<corral_kv::KeyValue>, corral_kv::Revision), Failure> {
    corral_kv::Scan::new(keys.prefix().as_bytes(), 10_000)
        .skipping(keys.history_prefix().as_bytes())
        .by_segments(&keys.kinds())
        .read_all(kv)
        .await
        .map_err(kv_failure)
}

pub fn cluster(
    command: ClusterCommand,
    output: Output,
    providers: &Providers,
) -> Result<Outcome, Failure> {
    runtime()?.block_on(async move {
        match command {
            ClusterCommand::Init(args) => write_config(args, true).await,
            ClusterCommand::Apply(args) => write_config(args, false).await,
            ClusterCommand::Status(args) => status(args, output).await,
            ClusterCommand::Check(args) => check(args, output, providers).await,
            ClusterCommand::Recover(args) => recover(args).await,
            ClusterCommand::History(args) => {
                // Usage errors before connecting.
                args.options.request()?;
                let (kv, keys) = connect(&args.etcd).await?;
                crate::history_cluster::show(&kv, &keys, &args.options, output).await
            }
            ClusterCommand::Rbac(args) => {
                let (kv, keys) = connect(&args.etcd).await?;
                crate::rbac::cluster_rbac(&kv, &keys, &args.password_dir, args.enable_auth).await
            }
        }
    })
}

async fn write_config(args: ConfigArgs, init: bool) -> Result<Outcome, Failure> {
    if init && args.force {
        return Err(Failure::Usage(
            "--force applies to `corral cluster apply` only".into(),
        ));
    }
    let text = std::fs::read_to_string(&args.config).map_err(|source| Failure::File {
        action: "read",
        path: args.config.clone(),
        source,
    })?;
    let config = ClusterConfig::from_toml(&text)
        .map_err(|e| Failure::Usage(format!("{}: {e}", args.config.display())))?;
    let (kv, keys) = connect(&args.etcd).await?;
    config_paths::write(
        &kv,
        &keys,
        args.etcd.cluster_name(),
        &config,
        init,
        args.force,
    )
    .await
}

pub(crate) async fn read_view(
    kv: &EtcdKv,
    keys: &Keys,
) -> Result<(corral_cluster::ClusterView, i64), Failure> {
    config_paths::read_view(kv, keys, &keys.cluster().to_string()).await
}

async fn status(args: StatusArgs, output: Output) -> Result<Outcome, Failure> {
    let operator = args.operator_socket.map(|socket| {
        let status = corral_client::Client::unix(&socket).operator_status();
        (socket, status)
    });
    let args = args.etcd;
    let (kv, keys) = connect(&args).await?;
    let (view, revision) = read_view(&kv, &keys).await?;
    let (election, _) = corral_kv::read_all(&kv, keys.election_prefix().as_bytes(), 100)
        .await
        .map_err(kv_failure)?;
    // The leader is the lowest candidate: a key not on its lease (written by hand) leads
    // nothing, and is reported.
    let leader = corral_cluster::election_leader(
        &keys,
        election.iter().map(|e| {
            let lease = e.lease.map(|l| l.0);
            (e.key_str(), lease, e.create_revision, e.value.as_slice())
        }),
    );
    let mut report = view.status_report(revision, leader);
    report.problems.extend(election_problems(&keys, &election));
    Ok(Outcome::ok(match output {
        Output::Json => {
            let mut json = serde_json::to_value(&report).unwrap_or_default();
            if let (Some((_, Ok(status))), Some(object)) = (&operator, json.as_object_mut()) {
                object.insert(
                    "operator_problems".into(),
                    serde_json::to_value(&status.current).unwrap_or_default(),
                );
            }
            serde_json::to_string_pretty(&json).unwrap_or_default() + "\n"
        }
        Output::Table => {
            let mut text = report.to_table();
            if let Some((socket, status)) = &operator {
                text.push_str(&operator_problems(socket, status, now_ms()));
            }
            text
        }
    }))
}

/// An operator's current problems, one a line with since when and how long ago (not the
/// past: `events` of its `/v1/status`), or why they could not be read.
fn operator_problems(
    socket: &std::path::Path,
    status: &Result<corral_api::operator::OperatorStatus, corral_client::Error>,
    now_ms: u64,
) -> String {
    let status = match status {
        Ok(status) => status,
        Err(error) => {
            return format!(
                "operator at {}: cannot read its status: {error}\n",
                socket.display()
            );
        }
    };
    let mut text = match status.current.len() {
        0 => format!("operator {}: no problems\n", status.replica),
        1 => format!("operator {}: 1 problem\n", status.replica),
        n => format!("operator {}: {n} problems\n", status.replica),
    };
    for problem in &status.current {
        let _ = writeln!(
            text,
            "  since {} ({} ago): {}",
            crate::output::utc(problem.since_ms),
            crate::output::duration(now_ms.saturating_sub(problem.since_ms) / 1000 * 1000),
            problem.message
        );
    }
    text
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn check(args: CheckArgs, output: Output, providers: &Providers) -> Result<Outcome, Failure> {
    let cloud = args.cloud.connect(providers).await?;
    let (kv, keys) = connect(&args.etcd).await?;
    let (all, revision) = read_cluster(&kv, &keys).await?;
    if !all.iter().any(|e| e.key == keys.config().as_bytes()) {
        return Err(config_paths::no_configuration(args.etcd.cluster_name()));
    }
    let entries: Vec<corral_cluster::Entry> = all
        .iter()
        .map(|e| (e.key_str().into_owned(), e.value.clone(), e.create_revision))
        .collect();
    let mut problems = corral_cluster::check(&keys, &entries);
    // The agents' assertions (`holdings/`) against the grants: holdings without a grant, a
    // range asserted by two nodes, grants a live node does not assert.
    let mod_revisions: BTreeMap<String, i64> = all
        .iter()
        .map(|e| (e.key_str().into_owned(), e.mod_revision))
        .collect();
    problems.extend(corral_cluster::holdings_problems(
        &keys,
        &entries,
        &mod_revisions,
    ));
    let election: Vec<corral_kv::KeyValue> = all
        .iter()
        .filter(|e| e.key.starts_with(keys.election_prefix().as_bytes()))
        .cloned()
        .collect();
    problems.extend(election_problems(&keys, &election));
    let mut holdings = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    // The keys parsed once for every agent.
    let judge = corral_cluster::AgentCheck::new(&keys, &entries);
    for socket in &args.agents {
        // The same socket twice is one agent.
        if !seen.insert(std::fs::canonicalize(socket).unwrap_or_else(|_| socket.clone())) {
            continue;
        }
        // An agent that cannot be asked is not a finding about the cluster: exit code 3,
        // as for any unreachable agent.
        let (found, held) = check_agent(&keys, &entries, &judge, socket)?;
        problems.extend(found);
        holdings.extend(held);
    }
    // Between agents: two serving one node, overlapping ranges, an address on two.
    problems.extend(corral_cluster::agents_problems(&holdings));
    if let Some(cloud) = cloud {
        // The cloud is read after etcd: an interface or address the operator added since is
        // in the cloud but not in the records read, and reported (run the check again); one
        // it took away since is in the records but not the cloud, likewise.
        let interfaces = cloud.interfaces().await.map_err(Failure::Cloud)?;
        let truth = crate::cloud::cloud_truth(interfaces);
        problems.extend(corral_cluster::cloud_problems(&keys, &entries, &truth));
    }
    let text = match output {
        Output::Json => {
            serde_json::to_string_pretty(&serde_json::json!({
                "revision": revision,
                "problems": problems,
            }))
            .unwrap_or_default()
                + "\n"
        }
        Output::Table => {
            let mut text = String::new();
            for problem in &problems {
                let _ = writeln!(text, "problem: {problem}");
            }
            let _ = writeln!(
                text,
                "cluster {} at revision {revision}: {}",
                args.etcd.cluster_name(),
                if problems.is_empty() {
                    "ok".to_owned()
                } else {
                    format!("{} problems", problems.len())
                }
            );
            text
        }
    };
    Ok(Outcome {
        stdout: text,
        exit: if problems.is_empty() {
            Exit::Ok
        } else {
            Exit::ProblemsFound
        },
    })
}

/// `corral cluster recover`: says what resuming the grants now means (the live nodes whose
/// holdings etcd has no record of), and with `--yes` writes `recover` for the leader.
async fn recover(args: RecoverArgs) -> Result<Outcome, Failure> {
    let (kv, keys) = connect(&args.etcd).await?;
    let (all, revision) = read_cluster(&kv, &keys).await?;
    let mut registered = std::collections::BTreeSet::new();
    let mut live = std::collections::BTreeSet::new();
    let mut asserted = std::collections::BTreeSet::new();
    for entry in &all {
        match keys.parse(&entry.key_str()) {
            Ok(corral_cluster::Key::Node { node }) => {
                registered.insert(node);
            }
            Ok(corral_cluster::Key::Live { node }) => {
                live.insert(node);
            }
            Ok(corral_cluster::Key::Holdings { node }) => {
                asserted.insert(node);
            }
            _ => {}
        }
    }
    let unasserted: Vec<String> = registered
        .iter()
        .filter(|n| live.contains(*n) && !asserted.contains(*n))
        .map(ToString::to_string)
        .collect();
    let mut text = format!(
        "corral cluster recover: the leader of cluster {} will grant again at once, without \
         waiting for the live agents to assert what they hold after etcd went back in time.\n",
        args.etcd.cluster_name()
    );
    let _ = writeln!(
        text,
        "  live nodes with no holdings record: {}",
        if unasserted.is_empty() {
            "none".to_owned()
        } else {
            format!(
                "{} (space they hold that etcd forgot may be granted to other nodes)",
                unasserted.join(", ")
            )
        }
    );
    let _ = writeln!(
        text,
        "  nodes with a holdings record: {} (what they assert stays occupied, whatever the grants say)",
        asserted.len()
    );
    if !args.yes {
        text.push_str("nothing done: run again with --yes to do it\n");
        return Ok(Outcome {
            stdout: text,
            exit: Exit::Refused,
        });
    }
    let record = corral_cluster::RecoverRecord {
        requested_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        unasserted,
    };
    let value = encode_value(&record).map_err(|e| Failure::Internal(e.to_string()))?;
    let response = kv
        .txn(Txn {
            compares: vec![],
            success: vec![TxnOp::put(keys.recover(), value)],
            failure: vec![],
        })
        .await
        .map_err(kv_failure)?;
    let _ = writeln!(
        text,
        "done: {} written at revision {} (read at {revision}); the leader grants again once it \
         sees it",
        keys.recover(),
        response.revision
    );
    Ok(Outcome::ok(text))
}

/// An agent's cluster ranges against its node's grants.
/// Besides equality of the active ranges with the grants, every cluster range the agent still
/// has, draining ones included (their pods keep their addresses), must not overlap a CIDR
/// granted to another node: that is where a removed node's pods would meet a new node's.
fn check_agent(
    keys: &Keys,
    entries: &[corral_cluster::Entry],
    judge: &corral_cluster::AgentCheck,
    socket: &std::path::Path,
) -> Result<(Vec<String>, Option<corral_cluster::AgentHoldings>), Failure> {
    let mut client = corral_client::Client::unix(socket);
    let status = client.status(None)?;
    let Some(cluster) = status.cluster else {
        return Ok((
            vec![format!("agent {}: not in a cluster", socket.display())],
            None,
        ));
    };
    let pools = client.pools(Some(corral_api::NODE_SCOPE))?;
    let cluster_ranges: Vec<(&str, &corral_api::RangeInfo)> = pools
        .pools
        .iter()
        .flat_map(|pool| {
            pool.ranges
                .iter()
                .filter(|r| r.source == corral_api::RangeSource::Cluster)
                .map(move |r| (pool.name.as_str(), r))
        })
        .collect();
    let mut problems = Vec::new();
    let others: Vec<(&corral_cluster::IpNet, &NodeName)> = judge
        .granted_cidrs()
        .filter(|(_, node)| node.as_str() != cluster.node)
        .collect();
    for (pool, range) in &cluster_ranges {
        let Ok(spec) = range.range.parse::<corral_core::RangeSpec>() else {
            continue;
        };
        let (first, last) = (
            corral_core::addr_value(spec.start()),
            corral_core::addr_value(spec.end()),
        );
        for (cidr, node) in &others {
            let (low, high) = corral_cluster::net::net_range(cidr);
            let same_family = cidr.addr().is_ipv4() == spec.start().is_ipv4();
            if same_family && first <= high && low <= last {
                problems.push(format!(
                    "agent {} (node {}) still holds {} in pool {pool}{}, which overlaps {cidr} granted to node {node}",
                    socket.display(),
                    cluster.node,
                    range.range,
                    if range.draining { " (draining)" } else { "" },
                ));
            }
        }
    }
    let active: Vec<(String, String)> = cluster_ranges
        .iter()
        .filter(|(_, r)| !r.draining)
        .map(|(pool, r)| ((*pool).to_owned(), r.range.clone()))
        .collect();
    // Block pools: each range one of the node's blocks, each block held or surrendered.
    problems.extend(
        judge
            .block_problems(&cluster.node, &active)
            .into_iter()
            .map(|p| format!("agent {}: {p}", socket.display())),
    );
    // Cloud pools: every address the agent serves on an interface is on its record.
    problems.extend(
        check_agent_cloud(keys, entries, &cluster.node, &mut client, &pools)?
            .into_iter()
            .map(|p| format!("agent {} (node {}): {p}", socket.display(), cluster.node)),
    );
    let block_pools: std::collections::BTreeSet<String> = active
        .iter()
        .map(|(pool, _)| pool.clone())
        .filter(|pool| judge.is_block_pool(pool))
        .collect();
    let mut held: Vec<(String, String)> = active
        .into_iter()
        .filter(|(pool, _)| !block_pools.contains(pool))
        .collect();
    held.sort();
    let plan_pool = corral_core::PoolName::new(corral_agent::link::ClusterOptions::PLAN_POOL)
        .expect("a valid pool name");
    let mut granted: Vec<(String, String)> = judge
        .expected_ranges(&cluster.node, &plan_pool)
        .into_iter()
        .map(|(pool, range)| (pool.to_string(), range.to_string()))
        .collect();
    granted.sort();
    if held != granted {
        problems.push(format!(
            "agent {} (node {}): holds {:?} but is granted {:?}",
            socket.display(),
            cluster.node,
            held,
            granted
        ));
    }
    // What it serves, for the checks between agents.
    let ranges: Vec<(String, corral_cluster::IpNet)> = cluster_ranges
        .iter()
        .filter_map(|(pool, r)| {
            Some(((*pool).to_owned(), r.range.split(',').next()?.parse().ok()?))
        })
        .collect();
    let dump = client.dump(Some(corral_api::NODE_SCOPE))?;
    let addresses = dump
        .scopes
        .iter()
        .flat_map(|s| &s.pools)
        .flat_map(|p| &p.allocations)
        .map(|a| a.address)
        .filter(|a| ranges.iter().any(|(_, r)| r.contains(a)))
        .collect();
    let holdings = corral_cluster::AgentHoldings {
        agent: socket.display().to_string(),
        node: cluster.node.clone(),
        ranges,
        addresses,
    };
    Ok((problems, Some(holdings)))
}

/// The `election/` keys no replica counts as a candidate (a key written by hand blocks no
/// election, but people should know).
fn election_problems(keys: &Keys, election: &[corral_kv::KeyValue]) -> Vec<String> {
    let entries: Vec<(String, Option<i64>)> = election
        .iter()
        .map(|e| (e.key_str().into_owned(), e.lease.map(|l| l.0)))
        .collect();
    corral_cluster::election_problems(keys, &entries)
}

pub fn node(command: NodeCommand, output: Output) -> Result<Outcome, Failure> {
    runtime()?.block_on(async move {
        match command {
            NodeCommand::Credentials(args) => {
                let node =
                    NodeName::new(&args.node.name).map_err(|e| Failure::Usage(e.to_string()))?;
                let (kv, keys) = connect(&args.node.etcd).await?;
                crate::rbac::node_credentials(&kv, &keys, &node, &args.password_dir).await
            }
            NodeCommand::List(args) => {
                let (kv, keys) = connect(&args).await?;
                let (view, _) = read_view(&kv, &keys).await?;
                let live = live_nodes(&kv, &keys).await?;
                let nodes = view.node_reports(Some(&live));
                Ok(Outcome::ok(match output {
                    Output::Json => serde_json::to_string_pretty(&nodes).unwrap_or_default() + "\n",
                    Output::Table => corral_cluster::NodeReport::table(&nodes),
                }))
            }
            NodeCommand::Show(args) => {
                let (kv, keys) = connect(&args.etcd).await?;
                let (view, _) = read_view(&kv, &keys).await?;
                let live = live_nodes(&kv, &keys).await?;
                let Some(node) = view
                    .node_reports(Some(&live))
                    .into_iter()
                    .find(|n| n.name == args.name)
                else {
                    // Removed: shown until its space is back.
                    let removed = NodeName::new(&args.name).ok().and_then(|name| {
                        view.removed_node_report(&name, live.contains(&args.name))
                    });
                    let Some(removed) = removed else {
                        return Err(Failure::Refused(format!(
                            "node {} is not registered",
                            args.name
                        )));
                    };
                    return Ok(Outcome::ok(match output {
                        Output::Json => {
                            serde_json::to_string_pretty(&removed).unwrap_or_default() + "\n"
                        }
                        Output::Table => crate::removed_node::table(&removed),
                    }));
                };
                Ok(Outcome::ok(match output {
                    Output::Json => serde_json::to_string_pretty(&node).unwrap_or_default() + "\n",
                    Output::Table => {
                        let mut text =
                            corral_cluster::NodeReport::table(std::slice::from_ref(&node));
                        // Block pools: Cilium's statistics per pool and family.
                        for blocks in &node.blocks {
                            text.push_str(&blocks.summary());
                            text.push('\n');
                        }
                        // Cloud pools: the node's interfaces as the operator recorded them.
                        if let Ok(name) = NodeName::new(&args.name) {
                            text.push_str(&cloud_interfaces_table(&view, &name));
                        }
                        text
                    }
                }))
            }
            NodeCommand::Plan(args) => {
                let (kv, keys) = connect(&args.etcd).await?;
                let (view, _) = read_view(&kv, &keys).await?;
                let Some(plan_config) = view.config().node_ids.clone() else {
                    return Err(Failure::Refused(
                        "the cluster has no node-ID plan ([node_ids])".into(),
                    ));
                };
                let name = NodeName::new(&args.name).map_err(|e| Failure::Usage(e.to_string()))?;
                let Some(id) = view.node_id_of(&name) else {
                    return Err(Failure::Refused(format!(
                        "node {} has no node ID",
                        args.name
                    )));
                };
                let plan = NodePlan::derive(&plan_config, id)
                    .map_err(|e| Failure::Refused(e.to_string()))?;
                Ok(Outcome::ok(match output {
                    Output::Json => serde_json::to_string_pretty(&plan).unwrap_or_default() + "\n",
                    Output::Table => plan.to_table(),
                }))
            }
            NodeCommand::Remove(remove) => {
                let args = &remove.node;
                let (kv, keys) = connect(&args.etcd).await?;
                let name = NodeName::new(&args.name).map_err(|e| Failure::Usage(e.to_string()))?;
                let node_key = keys.node(&name);
                let Some(node) = kv.get(node_key.as_bytes()).await.map_err(kv_failure)? else {
                    return Err(Failure::Refused(format!(
                        "node {} is not registered",
                        args.name
                    )));
                };
                let mode = if remove.drain {
                    RemovalMode::Drain
                } else if remove.force {
                    RemovalMode::Force
                } else {
                    RemovalMode::Plain
                };
                if mode == RemovalMode::Plain
                    && let Some(holding) = live_holding(&kv, &keys, &name).await?
                {
                    return Err(Failure::Refused(format!(
                        "node {} is live and {holding}; removing it would take space its pods \
                         use: `corral node remove {} --drain` stops it taking new pods and gives \
                         its space back as they go, `--force` is for a node you know is dead",
                        args.name, args.name
                    )));
                }
                let request = RemovalRecord {
                    node_revision: node.create_revision,
                    requested_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64),
                    mode,
                    phase: RemovalPhase::Requested,
                };
                let response = kv
                    .txn(Txn {
                        compares: vec![Compare::created_at(node_key, node.create_revision)],
                        success: vec![TxnOp::put(
                            keys.removal(&name),
                            encode_value(&request).map_err(|e| Failure::Usage(e.to_string()))?,
                        )],
                        failure: vec![],
                    })
                    .await
                    .map_err(kv_failure)?;
                if !response.succeeded {
                    return Err(Failure::Refused(format!(
                        "node {} registered again meanwhile; look again (corral node show)",
                        args.name
                    )));
                }
                Ok(Outcome::ok(format!(
                    "node {}: removal requested{}; the leading operator takes its grants away, \
                     and what it holds goes into quarantine once its agent gave it up (or it \
                     showed no liveness for the quarantine time)\n",
                    args.name,
                    match mode {
                        RemovalMode::Drain => " (drain: it takes no new pods)",
                        RemovalMode::Force => " (forced)",
                        RemovalMode::Plain => "",
                    }
                )))
            }
        }
    })
}

/// What a live node holds, as a phrase, if it is live and holds allocations (its `holdings/`
/// record counts them; a live node without a record is taken to hold some); `None` if it is
/// not live or holds none.
async fn live_holding(
    kv: &EtcdKv,
    keys: &Keys,
    node: &NodeName,
) -> Result<Option<String>, Failure> {
    if kv
        .get(keys.live(node).as_bytes())
        .await
        .map_err(kv_failure)?
        .is_none()
    {
        return Ok(None);
    }
    let Some(entry) = kv
        .get(keys.holdings(node).as_bytes())
        .await
        .map_err(kv_failure)?
    else {
        return Ok(Some(
            "has not said what it holds (no holdings record): it may have pods".into(),
        ));
    };
    let Ok(record) = corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&entry.value)
    else {
        return Ok(Some(
            "its holdings record cannot be read: it may have pods".into(),
        ));
    };
    let allocations: u64 = record.ranges.iter().map(|r| r.allocations).sum::<u64>()
        + record.cloud.iter().map(|c| c.allocations).sum::<u64>();
    Ok((allocations > 0).then(|| format!("holds {allocations} allocation(s)")))
}

async fn live_nodes(kv: &EtcdKv, keys: &Keys) -> Result<Vec<String>, Failure> {
    let (live, _) = corral_kv::read_all(kv, keys.live_prefix().as_bytes(), 2000)
        .await
        .map_err(kv_failure)?;
    Ok(live
        .iter()
        .filter_map(|e| match keys.parse(&e.key_str()) {
            Ok(corral_cluster::Key::Live { node }) => Some(node.to_string()),
            _ => None,
        })
        .collect())
}

/// The node's `interfaces/` records as `corral node show` prints them (nothing without any).
fn cloud_interfaces_table(view: &corral_cluster::ClusterView, node: &NodeName) -> String {
    let mut text = String::new();
    for (id, entry) in view.cloud_interfaces_of(node) {
        if text.is_empty() {
            text.push_str("cloud interfaces:\n");
        }
        let Some(record) = &entry.record else {
            text.push_str(&format!("  {id}: a record that cannot be read\n"));
            continue;
        };
        let addresses: Vec<String> = record.addresses.iter().map(ToString::to_string).collect();
        text.push_str(&format!(
            "  {id} pool {} device {} {} subnet {} mac {}{}: {}\n",
            record.pool,
            record.device_index,
            match record.attachment {
                corral_cluster::CloudAttachment::Attached => "attached",
                corral_cluster::CloudAttachment::Attaching => "attaching",
            },
            record.subnet_id,
            record.mac,
            if record.managed {
                ""
            } else {
                " (not corral's)"
            },
            if addresses.is_empty() {
                "no addresses".to_owned()
            } else {
                addresses.join(", ")
            }
        ));
    }
    text
}

/// The cloud part of an agent's check: reads the agent's interfaces of the configuration's
/// cloud pools and compares them with the node's `interfaces/` records ([`cloud_agent_problems`]).
fn check_agent_cloud(
    keys: &Keys,
    entries: &[corral_cluster::Entry],
    node: &str,
    client: &mut corral_client::Client,
    pools: &corral_api::PoolsResponse,
) -> Result<Vec<String>, Failure> {
    let config = entries.iter().find_map(|(key, value, _)| {
        matches!(keys.parse(key), Ok(corral_cluster::Key::Config))
            .then(|| ClusterConfig::from_json(value).ok())
            .flatten()
    });
    let Some(config) = config else {
        return Ok(Vec::new());
    };
    let cloud_pools: Vec<String> = config
        .pools
        .iter()
        .filter(|p| p.is_cloud())
        .map(|p| p.name.to_string())
        .collect();
    if cloud_pools.is_empty() {
        return Ok(Vec::new());
    }
    let mut records: BTreeMap<String, Option<corral_cluster::CloudInterfaceRecord>> =
        BTreeMap::new();
    for (key, value, _) in entries {
        if let Ok(corral_cluster::Key::CloudInterface {
            node: owner,
            interface,
        }) = keys.parse(key)
            && owner.as_str() == node
        {
            records.insert(
                interface.as_str().to_owned(),
                corral_cluster::decode_value(value).ok(),
            );
        }
    }
    let interfaces = client.interfaces(None)?;
    let frozen: Vec<(String, String)> = pools
        .pools
        .iter()
        .flat_map(|p| {
            p.exclusions
                .iter()
                .filter(|e| e.reason == corral_agent::node::FROZEN_REASON)
                .map(move |e| (p.name.clone(), e.network.clone()))
        })
        .collect();
    Ok(cloud_agent_problems(
        &cloud_pools,
        &records,
        &interfaces,
        &frozen,
    ))
}

/// What an agent serves from its cloud pools that the cluster does not give it: an address on
/// an interface must be listed by the node's record of that interface (same pool), unless it
/// is frozen (gone from the record while in use: nothing new is handed out from it).
fn cloud_agent_problems(
    cloud_pools: &[String],
    records: &BTreeMap<String, Option<corral_cluster::CloudInterfaceRecord>>,
    interfaces: &corral_api::InterfacesResponse,
    frozen: &[(String, String)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for pool in interfaces
        .pools
        .iter()
        .filter(|p| cloud_pools.contains(&p.pool))
    {
        for interface in &pool.interfaces {
            let record = records.get(&interface.id);
            for address in &interface.addresses {
                let listed = record.is_some_and(|r| {
                    r.as_ref().is_some_and(|r| {
                        r.pool.as_str() == pool.pool
                            && r.addresses.iter().any(|a| a.to_string() == *address)
                    })
                });
                // A record that cannot be read: the agent keeps what it had, as it should.
                let unreadable = record.is_some_and(Option::is_none);
                let is_frozen = frozen.iter().any(|(p, n)| *p == pool.pool && n == address);
                if !(listed || unreadable || is_frozen) {
                    problems.push(format!(
                        "serves {address} on interface {} of cloud pool {}, which no interfaces/ \
                         record of the node lists",
                        interface.id, pool.pool
                    ));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface(id: &str, addresses: &[&str]) -> corral_api::InterfaceInfo {
        corral_api::InterfaceInfo {
            id: id.into(),
            pool: "vpc".into(),
            device_number: 1,
            primary: false,
            trunk: false,
            excluded: false,
            mac: "02:00:00:00:00:01".into(),
            subnets: vec!["10.0.1.0/24".into()],
            gateways: vec![],
            routes: vec![],
            primary_addresses: vec![],
            created_at_ms: 0,
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            n_addresses: addresses.len() as u64,
            n_prefixes: 0,
            total: addresses.len() as u64,
            assigned: 0,
            cooling: 0,
            freeable: vec![],
        }
    }

    #[test]
    fn an_agent_serving_a_cloud_address_no_record_lists_is_a_problem() {
        let record = corral_cluster::CloudInterfaceRecord {
            pool: corral_cluster::PoolName::new("vpc").unwrap(),
            instance_id: "i-1".into(),
            device_index: 1,
            subnet_id: "s".into(),
            subnets: vec!["10.0.1.0/24".parse().unwrap()],
            mac: "02:00:00:00:00:01".into(),
            primary_ipv4: None,
            addresses: vec!["10.0.1.10/32".parse().unwrap()],
            assigned_ms: Default::default(),
            attachment: corral_cluster::CloudAttachment::Attached,
            managed: true,
            prefixes_refused_ms: None,
        };
        let records = BTreeMap::from([
            ("eni-a".to_owned(), Some(record)),
            ("eni-c".to_owned(), None),
        ]);
        let served = corral_api::InterfacesResponse {
            pools: vec![corral_api::InterfacePool {
                pool: "vpc".into(),
                total: 0,
                assigned: 0,
                cooling: 0,
                interfaces: vec![
                    interface("eni-a", &["10.0.1.10/32", "10.0.1.11/32", "10.0.1.12/32"]),
                    interface("eni-b", &["10.0.2.10/32"]),
                    interface("eni-c", &["10.0.3.10/32"]),
                ],
            }],
        };
        let frozen = vec![("vpc".to_owned(), "10.0.1.12/32".to_owned())];
        let problems = cloud_agent_problems(&["vpc".into()], &records, &served, &frozen);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("10.0.1.11/32") && problems[0].contains("eni-a"));
        assert!(problems[1].contains("10.0.2.10/32") && problems[1].contains("eni-b"));
        // Not a cloud pool: not checked here.
        assert!(cloud_agent_problems(&[], &records, &served, &frozen).is_empty());
    }
}
