//! corral: the command line people use to talk to the corral agent, over its unix socket.
//!
//! A library with a thin binary around it: `corral` (`src/main.rs`) is [`main`], the build that
//! knows the in-process fake cloud only; another binary adds cloud providers through
//! [`main_with`] (corral-aws's `corral-aws` adds `--cloud aws` on the AWS SDK, which nothing
//! else links: it takes minutes to build). See [`cloud`].
//!
//! [`main_with`] parses the arguments (clap), runs one subcommand from [`commands`], prints what it
//! rendered (aligned tables by default, the API's JSON with `-o json`) and exits with a code
//! scripts can act on:
//!
//! | code | meaning                                                                   |
//! |------|---------------------------------------------------------------------------|
//! | 0    | done                                                                      |
//! | 1    | the agent refused the request (a 4xx answer: in use, exhausted, ...), or  |
//! |      | the cluster did (a change grants rest on; a cluster with no configuration, |
//! |      | e.g. a typo in `--cluster`), or the cloud's API refused a call            |
//! | 2    | usage error: bad arguments, or an input or output file that cannot be used |
//! | 3    | the agent is unreachable, timed out, or the connection to it broke (or  |
//! |      | etcd, or the cloud's API: no answer, a throttle, a server-side failure)   |
//! | 4    | the agent or operator failed (a 5xx answer, an answer that is not the     |
//! |      | API's, a daemon that could not start), or etcd refused or failed a request |
//! | 5    | `check` found problems                                                    |
//!
//! The codes are a contract, asserted by `tests/cli.rs`.

mod check;
pub mod cloud;
mod cluster;
mod cni_network;
mod commands;
mod etcd_args;
mod exit;
mod explain;
mod history;
mod history_cluster;
mod hostlocal;
mod interfaces;
mod local_routes;
mod logging;
mod operator;
mod operator_config;
mod output;
mod parse;
mod rbac;
mod removed_node;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use cloud::Providers;
use commands::Session;
use exit::{Exit, Failure, Outcome};

/// Where the agent listens unless told otherwise.
const DEFAULT_SOCKET: &str = "/run/corral/agent.sock";

/// The exit codes, for `corral --help` (kept in step with the module documentation).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  done
  1  the agent refused the request (a 4xx answer: in use, exhausted, not found, ...), or
     the cluster did (a change grants rest on, a cluster with no configuration), or the
     cloud's API refused a call
  2  usage error: bad arguments, or an input or output file that cannot be used
  3  the agent is unreachable, timed out, or the connection to it broke (or etcd, or the
     cloud's API: no answer, a throttle or a server-side failure)
  4  the agent or operator failed (a 5xx answer, an answer that is not the API's, or the
     daemon could not start), or etcd refused or failed a request it answered
  5  `corral check` found problems";

/// IP address management for container clusters: talk to the node's corral agent.
#[derive(Debug, Parser)]
#[command(name = "corral", version, after_long_help = EXIT_CODES_HELP)]
struct Cli {
    #[command(flatten)]
    before: BeforeOptions,
    #[command(subcommand)]
    command: Command,
}

/// The options a subcommand takes may also come before it (`corral --socket S status`, as
/// the agent's banner prints): each is the same option as the subcommand's own, given earlier.
/// A subcommand that does not honour one refuses it (exit 2) rather than ignoring it.
/// Separate ids from the subcommands' options, so that clap does not merge them: [`run`] does.
#[derive(Debug, Args)]
#[command(next_help_heading = "Options also taken after the subcommand")]
struct BeforeOptions {
    /// The agent's unix socket (agent client subcommands, and the socket `corral agent`
    /// serves) [default: /run/corral/agent.sock, or CORRAL_SOCKET]
    #[arg(long = "socket", id = "before_socket", value_name = "PATH")]
    socket: Option<PathBuf>,

    /// How to print results (agent client, cluster and node subcommands) [default: table]
    #[arg(
        short = 'o',
        long = "output",
        id = "before_output",
        value_enum,
        value_name = "OUTPUT"
    )]
    output: Option<Output>,

    /// The scope to act on (agent client subcommands) [default: node]
    #[arg(long = "scope", id = "before_scope", value_name = "SCOPE")]
    scope: Option<String>,

    /// Show every scope instead of one (status, dump, pool list and check only)
    #[arg(long = "all-scopes", id = "before_all_scopes")]
    all_scopes: bool,
}

/// The options of the subcommands that talk to the agent (status, alloc, pool, ...), accepted
/// after any of their own subcommands too (`corral pool list --socket S`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Agent client options")]
pub(crate) struct ClientOptions {
    /// The agent's unix socket [default: /run/corral/agent.sock, or CORRAL_SOCKET]
    // An Option, not a clap default, so `corral agent` can tell whether it was given; the
    // environment is read by hand so that a flag before the subcommand beats it.
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// How to print results: aligned tables for people, or the API's JSON for scripts
    /// [default: table]
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,

    /// The scope to act on: "node" (the agent's own pools) or a CNI network's name
    /// [default: node]
    #[arg(long, global = true, value_name = "SCOPE")]
    scope: Option<String>,

    /// Show every scope instead of one (status, dump, pool list and check only)
    #[arg(long, global = true, conflicts_with = "scope")]
    all_scopes: bool,
}

/// `-o/--output` of the cluster and node subcommands (which talk to etcd, not to an agent).
#[derive(Debug, Args)]
struct OutputOption {
    /// How to print results: aligned tables for people, or the API's JSON for scripts
    /// [default: table]
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,
}

/// The agent client's options, merged from both positions: what a subcommand works with.
#[derive(Debug)]
pub(crate) struct Globals {
    socket: Option<PathBuf>,
    output: Output,
    scope: String,
    all_scopes: bool,
}

/// The socket given on the command line, else `CORRAL_SOCKET` (when set and not empty).
fn socket_or_env(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| {
        std::env::var_os("CORRAL_SOCKET")
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    })
}

impl Globals {
    /// The options given after the subcommand, else before it, else their defaults.
    fn merge(before: BeforeOptions, after: ClientOptions) -> Result<Globals, Failure> {
        let scope = after.scope.or(before.scope);
        let all_scopes = after.all_scopes || before.all_scopes;
        if all_scopes && scope.is_some() {
            return Err(Failure::Usage(
                "the argument '--all-scopes' cannot be used with '--scope <SCOPE>'".to_owned(),
            ));
        }
        Ok(Globals {
            socket: socket_or_env(after.socket.or(before.socket)),
            output: after.output.or(before.output).unwrap_or(Output::Table),
            scope: scope.unwrap_or_else(|| corral_api::NODE_SCOPE.to_owned()),
            all_scopes,
        })
    }

    /// The agent's socket: `--socket`, else `CORRAL_SOCKET`, else the default.
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
    }
}

impl BeforeOptions {
    /// Refuses the options given before a subcommand that does not honour them, by name.
    fn refuse(&self, subcommand: &str, honoured: &[&str]) -> Result<(), Failure> {
        let given = [
            ("--socket", self.socket.is_some()),
            ("--output", self.output.is_some()),
            ("--scope", self.scope.is_some()),
            ("--all-scopes", self.all_scopes),
        ];
        match given
            .iter()
            .find(|(flag, is_given)| *is_given && !honoured.contains(flag))
        {
            Some((flag, _)) => Err(Failure::Usage(format!(
                "{flag} does not apply to `corral {subcommand}`"
            ))),
            None => Ok(()),
        }
    }
}

/// `corral agent`'s own options.
#[derive(Debug, Args)]
struct AgentArgs {
    /// The unix socket to serve the API on [default: the configuration file's, else
    /// /run/corral/agent.sock; or CORRAL_SOCKET]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The socket's group (a name or a GID): its members may connect (mode 0660) [default:
    /// the configuration file's socket_group, else the agent's own group]
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// The agent's TOML configuration file
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The state directory (SQLite), locked for as long as the agent runs
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Also serve the API on this loopback TCP address (needs a token)
    #[arg(long, value_name = "ADDR")]
    tcp: Option<std::net::SocketAddr>,
    /// A file holding the bearer token for --tcp (or set CORRAL_TOKEN)
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// A CNI dataDir whose DELs, recorded by corral-ipam while the agent was away, are
    /// applied at start (repeatable) [default: /var/lib/cni/networks]
    #[arg(long, value_name = "DIR")]
    cni_data_dir: Vec<PathBuf>,
    /// Join a cluster: etcd, the cluster's name, TLS and credentials (the configuration file's
    /// `[cluster]` table otherwise)
    #[command(flatten)]
    etcd: AgentEtcdArgs,
    /// This node's name in the cluster (with --etcd)
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The liveness lease's TTL in seconds (with --etcd; at most etcd's longest lease,
    /// 9000000000)
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=corral_cluster::MAX_LEASE_TTL_SECS))]
    lease_ttl: u64,
    /// How long a CNI ADD waits for the agent to finish restoring and, with --etcd, for the
    /// cluster to grant a block to a node pool with nothing free, in milliseconds, before it
    /// fails with code 11 (default 20000, or the file's pool_wait_ms: longer than an operator
    /// failover with its default 10 s lease, which takes 8 to 9 s; about the operators'
    /// --lease-ttl plus 10 s if theirs is longer)
    #[arg(long, value_name = "MS")]
    pool_wait: Option<u64>,
    /// The most events the allocation history keeps (default 1000000, or the file's
    /// history_max_events); 0 records none
    #[arg(long, value_name = "N")]
    history_max_events: Option<u64>,
    /// How long the allocation history keeps an event: a whole number and ms, s, m, h or d
    /// (default 30d, or the file's history_max_age)
    #[arg(long, value_name = "AGE", value_parser = corral_agent::config::parse_duration)]
    history_max_age: Option<std::time::Duration>,
    /// The cloud instance this node runs on (with --etcd), written into its registration: the
    /// operator manages this instance's interfaces for cloud pools. On EC2, the instance
    /// metadata service's instance-id (e.g. from `ec2-metadata --instance-id` or IMDSv2);
    /// a node registered with another instance is refused until it is removed
    #[arg(long, env = "CORRAL_INSTANCE_ID", value_name = "ID")]
    instance_id: Option<String>,
    /// The most pods this node runs, as the kubelet's --max-pods (with --etcd), written into
    /// its registration: block and cloud pools never grow the node's addresses past it (the
    /// pool's max_pods caps every node too; the lower one holds)
    #[arg(long, env = "CORRAL_MAX_PODS", value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_pods: Option<u64>,
    #[command(flatten)]
    log: logging::LogArgs,
}

/// The agent's etcd options: those of [`etcd_args::EtcdArgs`], each optional (the
/// configuration file's `[cluster]` table may give them), `--etcd` with `--node`.
#[derive(Debug, Args)]
#[command(
    mut_arg("etcd", |etcd| etcd.required(false).requires("node").help(
        "Join a cluster: etcd's client URLs, comma-separated (else the configuration file's \
         [cluster] endpoints). The agent registers --node, keeps its liveness key, and adds the \
         node's grants to its pools")),
    mut_arg("cluster", |cluster| cluster.help(
        "The cluster's name (with --etcd); unset, the configuration file's [cluster] name, \
         else `default`")),
)]
struct AgentEtcdArgs {
    #[command(flatten)]
    flags: etcd_args::EtcdArgs,
}

/// Runs the agent until SIGINT or SIGTERM.
fn agent(args: AgentArgs) -> Result<Outcome, Failure> {
    // The log first, so everything after it is logged as asked: the flags over the file's
    // `[log]` table.
    let log_file = corral_agent::log_table(args.config.as_deref())
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let (format, level) = args.log.over_file(&log_file, args.config.as_deref())?;
    logging::install(format, level)?;
    let cluster_file = corral_agent::cluster_table(args.config.as_deref())
        .map_err(|e| Failure::Usage(e.to_string()))?;
    // The cluster joined: the flags and their environment variables over the file's table.
    let cluster = args.etcd.flags.table().or(cluster_file);
    let etcd_options = etcd_args::options(&(&cluster).into(), &(&cluster).into())?;
    let endpoints = cluster.endpoints.unwrap_or_default();
    let cluster_name = cluster
        .name
        .unwrap_or_else(|| corral_cluster::daemon::DEFAULT_CLUSTER.to_owned());
    let config = corral_agent::AgentConfig::load(&corral_agent::Overrides {
        config: args.config,
        data_dir: args.data_dir,
        socket: args.socket.clone(),
        socket_group: args.socket_group,
        tcp: args.tcp,
        token_file: args.token_file,
        cni_data_dirs: (!args.cni_data_dir.is_empty()).then_some(args.cni_data_dir),
        in_cluster: !endpoints.is_empty(),
        pool_wait: args.pool_wait.map(std::time::Duration::from_millis),
        history_max_events: args.history_max_events,
        history_max_age: args.history_max_age,
    })
    .map_err(|e| Failure::Usage(e.to_string()))?;
    let cluster_task = match (endpoints.is_empty(), args.node) {
        (true, _) => None,
        (false, None) if args.etcd.flags.etcd.is_empty() => {
            return Err(Failure::Usage(
                "the configuration file's [cluster] endpoints need --node NAME".into(),
            ));
        }
        (false, None) => return Err(Failure::Usage("--etcd needs --node NAME".into())),
        (false, Some(node)) => {
            // The TLS files are checked before the agent starts: a file that cannot be used
            // is a start-up error naming it, not a retry loop.
            corral_etcd::check_tls(&endpoints, etcd_options.tls.as_ref())
                .map_err(Failure::EtcdTls)?;
            let uid =
                corral_agent::link::machine_uid(&config.data_dir).map_err(|e| Failure::File {
                    action: "read or create the machine uid in",
                    path: config.data_dir.clone(),
                    source: e,
                })?;
            let options = corral_agent::link::ClusterOptions {
                endpoints,
                cluster: cluster_name,
                node,
                uid,
                lease_ttl: std::time::Duration::from_secs(args.lease_ttl.max(1)),
                demand_refresh: corral_agent::link::ClusterOptions::DEFAULT_DEMAND_REFRESH,
                instance_id: args.instance_id.clone().filter(|id| !id.trim().is_empty()),
                max_pods: args.max_pods,
                epoch_file: Some(config.data_dir.join("etcd-epoch")),
            };
            Some(agent_cluster_task(options, etcd_options))
        }
    };
    let (data_dir, socket, tcp) = (
        config.data_dir.display().to_string(),
        config.socket.display().to_string(),
        config.tcp,
    );
    corral_agent::run_with(config, cluster_task, move || {
        // What to try next goes with it, for whoever reads the log on a terminal.
        let hint = format!("try: corral --socket {socket} status");
        match tcp {
            Some(tcp) => tracing::info!(data_dir, socket, %tcp, hint, "ready"),
            None => tracing::info!(data_dir, socket, hint, "ready"),
        }
    })
    .map_err(Failure::Daemon)?;
    Ok(Outcome::ok(String::new()))
}

/// The cluster link `corral agent --etcd` runs: connect to etcd (serving what the node holds,
/// degraded, while it cannot), then `corral_agent::link::run`. Public so that the agents'
/// footprint bench and test (`benches/agents.rs`, `tests/agents_footprint.rs`) run many of
/// exactly these links in one process.
pub fn agent_cluster_task(
    options: corral_agent::link::ClusterOptions,
    etcd_options: corral_etcd::EtcdOptions,
) -> corral_agent::ClusterTask {
    Box::new(move |committer, state, mut stop| {
        Box::pin(async move {
            let kv = loop {
                let connected = tokio::select! {
                    connected = corral_etcd::EtcdKv::connect(&options.endpoints, etcd_options.clone()) => connected,
                    _ = stop.changed() => return,
                };
                match connected {
                    Ok(kv) => {
                        cluster::log_tls_reloads(&kv);
                        break kv;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "connecting to etcd");
                        // The agent serves what it holds meanwhile (degraded).
                        state.unreachable(&format!("connecting to etcd: {error}"));
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                            _ = stop.changed() => return,
                        }
                    }
                }
            };
            corral_agent::link::run(kv, options, committer, state, stop).await;
        })
    })
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent in the foreground: the pools, and the REST API on --socket
    ///
    /// Configuration: a TOML file (--config), overridden by the flags; without either, the
    /// embedded default (a dual-stack pool `default`, state in /var/lib/corral, the socket
    /// /run/corral/agent.sock). Stops on SIGINT or SIGTERM.
    Agent(AgentArgs),
    /// Capacity and use of each pool, per address family
    Status {
        #[command(flatten)]
        client: ClientOptions,
    },
    /// Every allocation, with its owner, attachment and lease
    Dump {
        #[command(flatten)]
        client: ClientOptions,
    },
    /// The agent's allocation history: who held ADDRESS --at a time, or the events of an
    /// address, a pod (--pod), an attachment (--key) or a span (--since, --until), newest first
    ///
    /// The agent records every allocation and release (allocated, released, expired,
    /// collected by `corral gc`, surrendered with an interface) in the same commit as the
    /// change, and keeps the newest history_max_events (default 1000000) for history_max_age
    /// (default 30d). Times are RFC 3339 (2026-11-27T14:02:00Z; UTC without a zone) or
    /// milliseconds since the epoch.
    History {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: history::HistoryArgs,
    },
    /// Allocate the next free address (or a given one), of one family or both
    Alloc {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::AllocArgs,
    },
    /// Release addresses: of an attachment, one address, or everything an owner holds
    Release {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::ReleaseArgs,
    },
    /// List pools, add and remove their address ranges, or reserve the node's local routes
    Pool {
        #[command(flatten)]
        client: ClientOptions,
        #[command(subcommand)]
        command: commands::PoolCommand,
    },
    /// Exclude an address or network from a pool (or, with --remove, allow it again)
    Exclude {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::ExcludeArgs,
    },
    /// Start or stop an expiration timer on an allocated address
    Lease {
        #[command(flatten)]
        client: ClientOptions,
        #[command(subcommand)]
        command: commands::LeaseCommand,
    },
    /// The node's cloud interfaces (interface-backed pools): list, add, remove, their
    /// addresses and prefixes, and the import of AWS VPC CNI's ipamd checkpoint
    Interface {
        #[command(flatten)]
        client: ClientOptions,
        #[command(subcommand)]
        command: interfaces::InterfaceCommand,
    },
    /// Write the agent's state (every scope) as a checkpoint document
    Export {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::ExportArgs,
    },
    /// Restore a checkpoint document into scopes that hold no allocations
    Import {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::ImportArgs,
    },
    /// Report stale allocations, overdue leases and full pools (exit code 5 if any)
    ///
    /// Computed here from the agent's dump and status. An allocation is stale when its
    /// attachment is not in the --live list (allocations made without a key are not judged);
    /// a lease is overdue when its expiry has passed; a pool family is exhausted when it has
    /// capacity but no free address (addresses in cooldown count as free), and nearly full
    /// when more than 90% of its usable (not excluded) addresses are in use.
    Check {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::CheckArgs,
    },
    /// Release leaked addresses: those of attachments missing from --live at two runs, the
    /// grace period apart
    ///
    /// Calico's rule: an allocation whose attachment is not in the --live list is recorded
    /// (in the agent's store) as a suspect, with when it was first seen missing; a later run
    /// releases it only if --grace has passed since then, the attachment is still missing,
    /// and it still holds exactly the addresses recorded. A suspect that is live again, or
    /// whose addresses changed or went, is cleared. An attachment's addresses (every pool and
    /// family) go together or not at all; at most --max attachments go per run. Allocations
    /// made without a key are never touched. Applies to --scope (default: the node's pools).
    /// With --grace 0s one run is enough: what is missing from --live goes at once.
    Gc {
        #[command(flatten)]
        client: ClientOptions,
        #[command(flatten)]
        args: commands::GcArgs,
    },
    /// Go back from corral-ipam to host-local: write a network's allocations as its files
    #[command(subcommand, name = "host-local")]
    HostLocal(hostlocal::HostLocalCommand),
    /// Run a replica of the cluster operator in the foreground (leader elected through etcd)
    Operator(operator_config::OperatorArgs),
    /// The cluster's configuration, status and consistency check (in etcd)
    Cluster {
        #[command(flatten)]
        output: OutputOption,
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Why a pod has no address, who holds an address, why a node waits: each link of the
    /// chain an ADD walks checked (ok, broken, could not check), stopping at the first broken
    /// one with its evidence and what to do (exit code 5 if one is)
    Explain {
        #[command(flatten)]
        output: OutputOption,
        #[command(subcommand)]
        command: explain::ExplainCommand,
    },
    /// The cluster's nodes: list, show, remove, and a node's address plan
    Node {
        #[command(flatten)]
        output: OutputOption,
        #[command(subcommand)]
        command: cluster::NodeCommand,
    },
}

/// The `corral` binary: the command line with the clouds every build knows ([`Providers::builtin`]:
/// the in-process fake).
pub fn main() -> ExitCode {
    main_with(Providers::builtin())
}

/// The command line with these cloud providers for `--cloud` (`corral operator`, `corral cluster
/// check`): parses the arguments, runs one subcommand, prints, and answers the exit code.
pub fn main_with(providers: Providers) -> ExitCode {
    let cli = Cli::parse();
    let (stdout, exit) = match run(cli, &providers) {
        Ok(Outcome { stdout, exit }) => (stdout, exit),
        Err(failure) => {
            if logging::installed() == Some(logging::LogFormat::Json) {
                // A daemon logging JSON ends with a JSON line too, for its log collector.
                tracing::error!(error = %failure, "stopped");
            } else {
                // Nothing to do if stderr itself is gone; the exit code still says it.
                let _ = writeln!(io::stderr(), "corral: {failure}");
            }
            (String::new(), failure.exit())
        }
    };
    let mut out = io::stdout().lock();
    if let Err(error) = out.write_all(stdout.as_bytes()).and_then(|()| out.flush()) {
        // A closed pipe (`corral dump | head`) is the reader's choice, not a failure.
        if error.kind() != io::ErrorKind::BrokenPipe {
            let _ = writeln!(io::stderr(), "corral: cannot write the output: {error}");
            return Exit::Usage.into();
        }
    }
    exit.into()
}

/// Runs one subcommand; what it prints is returned, not printed, so main alone writes.
fn run(cli: Cli, providers: &Providers) -> Result<Outcome, Failure> {
    let before = cli.before;
    let client = |before: BeforeOptions, after: ClientOptions| Globals::merge(before, after);
    match cli.command {
        Command::Agent(mut args) => {
            before.refuse("agent", &["--socket"])?;
            args.socket = socket_or_env(args.socket.or(before.socket));
            agent(args)
        }
        Command::Status { client: after } => {
            commands::status(&mut Session::new(&client(before, after)?))
        }
        Command::Dump { client: after } => {
            commands::dump(&mut Session::new(&client(before, after)?))
        }
        Command::History {
            client: after,
            args,
        } => history::run(Session::new(&client(before, after)?), args),
        Command::Alloc {
            client: after,
            args,
        } => commands::alloc(&mut Session::new(&client(before, after)?), args),
        Command::Release {
            client: after,
            args,
        } => commands::release(&mut Session::new(&client(before, after)?), args),
        Command::Pool {
            client: after,
            command,
        } => commands::pool(&mut Session::new(&client(before, after)?), command),
        Command::Exclude {
            client: after,
            args,
        } => commands::exclude(&mut Session::new(&client(before, after)?), args),
        Command::Lease {
            client: after,
            command,
        } => commands::lease(&mut Session::new(&client(before, after)?), command),
        Command::Interface {
            client: after,
            command,
        } => interfaces::run(&mut Session::new(&client(before, after)?), command),
        Command::Export {
            client: after,
            args,
        } => commands::export(&mut Session::new(&client(before, after)?), args),
        Command::Import {
            client: after,
            args,
        } => commands::import(&mut Session::new(&client(before, after)?), args),
        Command::Check {
            client: after,
            args,
        } => commands::check(&mut Session::new(&client(before, after)?), args),
        Command::Gc {
            client: after,
            args,
        } => commands::gc(&mut Session::new(&client(before, after)?), args),
        Command::HostLocal(command) => {
            before.refuse("host-local", &[])?;
            hostlocal::run(command)
        }
        Command::Operator(args) => {
            before.refuse("operator", &[])?;
            operator::run(args, providers)
        }
        Command::Cluster { output, command } => {
            before.refuse("cluster", &["--output"])?;
            let output = output.output.or(before.output).unwrap_or(Output::Table);
            cluster::cluster(command, output, providers)
        }
        Command::Explain { output, command } => {
            before.refuse("explain", &["--output"])?;
            let output = output.output.or(before.output).unwrap_or(Output::Table);
            explain::run(command, output)
        }
        Command::Node { output, command } => {
            before.refuse("node", &["--output"])?;
            let output = output.output.or(before.output).unwrap_or(Output::Table);
            cluster::node(command, output)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn etcd_tls_flags_win_over_the_file_and_a_client_certificate_needs_a_ca() {
        use etcd_args::EtcdTlsArgs;
        let file = EtcdTlsArgs {
            etcd_cacert: Some("/file/ca.pem".into()),
            etcd_cert: Some("/file/cert.pem".into()),
            etcd_key: Some("/file/key.pem".into()),
        };
        let flags = EtcdTlsArgs {
            etcd_cacert: Some("/flag/ca.pem".into()),
            ..EtcdTlsArgs::default()
        };
        let table = |tls: &EtcdTlsArgs| {
            etcd_args::table(&[], None, tls, &etcd_args::EtcdAuthArgs::default())
        };
        let layered = table(&flags).or(table(&file));
        let tls = EtcdTlsArgs::from(&layered).tls().unwrap().expect("TLS");
        assert_eq!(tls.ca_cert, PathBuf::from("/flag/ca.pem"));
        assert_eq!(tls.cert, Some(PathBuf::from("/file/cert.pem")));
        assert_eq!(tls.key, Some(PathBuf::from("/file/key.pem")));
        assert!(EtcdTlsArgs::default().tls().unwrap().is_none());
        let no_ca = EtcdTlsArgs {
            etcd_cacert: None,
            ..file
        };
        let error = no_ca.tls().unwrap_err().to_string();
        assert!(error.contains("need --etcd-cacert"), "{error}");
    }
}
