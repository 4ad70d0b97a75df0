//! `corral operator`'s options and settings, as the agent's: its flags (and their environment variables:
//! clap reads both as one) over its configuration file (`--config`, read and checked by
//! `corral_operator::config`) over the built-in defaults. Every problem is a usage error
//! (exit code 2) found before the operator starts: the file's naming the file and its key,
//! the flags' naming the flag.

use std::path::{Path, PathBuf};

use clap::Args;
use corral_operator::config::{CloudTable, OperatorFile, Settings};
use tracing_subscriber::filter::LevelFilter;

use crate::cluster::{CloudArgs, EtcdArgs};
use crate::exit::Failure;
use crate::logging::LogFormat;

/// `corral operator`'s options. Those with a default are options, not clap defaults, so that
/// the configuration file fills in what the flags and their environment variables leave out
/// (below).
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// The operator's TOML configuration file: every setting below but the flags given and
    /// their environment variables (packaging/operator.toml shows each with its default)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub etcd: OperatorEtcdArgs,
    /// This replica's name, shown as the leader [default: the host name and process id]
    #[arg(long)]
    pub replica: Option<String>,
    /// The election lease's TTL in seconds: a standby takes over about this long after the
    /// leader dies (at most etcd's longest lease, 9000000000) [default: 10]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=corral_cluster::MAX_LEASE_TTL_SECS))]
    pub lease_ttl: Option<u64>,
    /// Grant transactions in flight at once [default: 64]
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub workers: Option<usize>,
    /// Operations a transaction may hold: etcd's own --max-txn-ops, raised there first; grant
    /// batches fill it (at 512, 84 dual-stack nodes a transaction instead of 21) [default: 128]
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(128..))]
    pub max_txn_ops: Option<usize>,
    /// The operator's API socket (status, nodes, pools, grants, plans, metrics), mode 0660
    /// [default: /run/corral/operator.sock]
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Also serve the API on this loopback TCP address (needs --token-file)
    #[arg(long, value_name = "ADDR", requires = "token_file")]
    pub api_tcp: Option<std::net::SocketAddr>,
    /// A file holding the bearer token (at least 16 characters) for --api-tcp
    #[arg(long, value_name = "FILE", requires = "api_tcp")]
    pub token_file: Option<PathBuf>,
    /// Where the replica remembers the highest etcd revision and the etcd cluster ID it saw
    /// (`etcd-epoch-<cluster>.json`), so etcd restored from a snapshot or wiped is noticed
    /// across restarts [default: none, remembered in memory for the process's life]
    #[arg(long, value_name = "DIR", env = "CORRAL_OPERATOR_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// After etcd went back in time (and at each new term), the longest wait in seconds for
    /// the live agents to assert what they hold before granting resumes (twice the agents'
    /// default liveness lease) [default: 40]
    #[arg(long, value_name = "SECONDS")]
    pub settle_secs: Option<u64>,
    /// The cloud whose interfaces the leader manages for cloud pools
    #[command(flatten)]
    pub cloud: CloudArgs,
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// `corral operator`'s etcd options: those of [`EtcdArgs`], but that the configuration file's
/// `[cluster]` table may give the URLs (and the cluster's name).
#[derive(Debug, Args)]
#[command(mut_arg("etcd", |etcd| etcd
    .required(false)
    .required_unless_present("config")
    .help("etcd's client URLs, comma-separated (e.g. http://127.0.0.1:2379); else the \
           configuration file's [cluster] endpoints")))]
pub struct OperatorEtcdArgs {
    #[command(flatten)]
    pub flags: EtcdArgs,
}

/// What `corral operator` runs with.
#[derive(Debug)]
pub struct Operator {
    /// etcd, the cluster, and how to reach them.
    pub etcd: EtcdArgs,
    /// The API's listeners, with the token read.
    pub api: corral_operator::api::ApiConfig,
    /// The cloud, if any.
    pub cloud: CloudArgs,
    /// The rest (the replica, its lease, workers, state directory, settle time).
    pub settings: Settings,
    pub log_format: LogFormat,
    pub log_level: LevelFilter,
}

/// The command line as the file's shape, each setting given or not.
fn flags(args: &OperatorArgs) -> OperatorFile {
    OperatorFile {
        replica: args.replica.clone(),
        lease_ttl_secs: args.lease_ttl,
        workers: args.workers,
        max_txn_ops: args.max_txn_ops,
        api_socket: args.api_socket.clone(),
        api_tcp: args.api_tcp,
        token_file: args.token_file.clone(),
        state_dir: args.state_dir.clone(),
        settle_secs: args.settle_secs,
        cluster: Some(args.etcd.flags.table()),
        cloud: Some(CloudTable {
            name: args.cloud.cloud.clone(),
            fake_cloud: args.cloud.fake_cloud.clone(),
            endpoint: args.cloud.cloud_endpoint.clone(),
        }),
        // The log's flags are typed: `LogArgs::over_file` layers them.
        log: None,
    }
}

/// The operator's settings from `args` and the file it names, checked.
pub fn resolve(args: &OperatorArgs) -> Result<Operator, Failure> {
    let path = args.config.as_deref();
    let file = match path {
        Some(path) => OperatorFile::load(path).map_err(|e| Failure::Usage(e.to_string()))?,
        None => OperatorFile::default(),
    };
    let (log_format, log_level) = args
        .log
        .over_file(&file.log.clone().unwrap_or_default(), path)?;
    let file_cloud = file.cloud.clone().unwrap_or_default();
    let settings = flags(args).over(file).settings();
    let in_file = |key: &str| match path {
        Some(path) => format!("{}: {key}", path.display()),
        None => key.to_owned(),
    };
    if settings.endpoints().is_empty() {
        return Err(Failure::Usage(format!(
            "no etcd endpoints: give --etcd, CORRAL_ETCD or endpoints in the [cluster] table \
             of {}",
            path.map(|p| p.display().to_string()).unwrap_or_default()
        )));
    }
    if settings.cloud.is_none() {
        for (key, given) in [
            ("cloud.fake_cloud", file_cloud.fake_cloud.is_some()),
            ("cloud.endpoint", file_cloud.endpoint.is_some()),
        ] {
            if given {
                return Err(Failure::Usage(format!(
                    "{} needs a cloud (cloud.name or --cloud)",
                    in_file(key)
                )));
            }
        }
    }
    let api = api_config(args, &settings, path)?;
    Ok(Operator {
        etcd: EtcdArgs {
            etcd: settings.endpoints().to_vec(),
            cluster: Some(settings.cluster_name().to_owned()),
            tls: (&settings.cluster).into(),
            auth: (&settings.cluster).into(),
        },
        api,
        cloud: CloudArgs {
            cloud: settings.cloud.clone(),
            fake_cloud: settings.fake_cloud.clone(),
            cloud_endpoint: settings.cloud_endpoint.clone(),
        },
        settings,
        log_format,
        log_level,
    })
}

/// The operator API's listeners: a loopback TCP address only, with a token of at least 16
/// characters read from its file (`--api-tcp` and `--token-file`, or the file's `api_tcp`
/// and `token_file`).
fn api_config(
    args: &OperatorArgs,
    settings: &Settings,
    path: Option<&Path>,
) -> Result<corral_operator::api::ApiConfig, Failure> {
    let token = match &settings.token_file {
        Some(file) => {
            Some(corral_operator::api::BearerToken::read_file(file).map_err(Failure::Usage)?)
        }
        None => None,
    };
    if let Some(addr) = settings.api_tcp {
        match (args.api_tcp, path) {
            // The flag's address (a file's was checked with the file).
            (Some(_), _) | (None, None) => {
                if !addr.ip().is_loopback() {
                    return Err(Failure::Usage(format!(
                        "--api-tcp {addr}: the operator listens on the loopback interface only"
                    )));
                }
                if token.is_none() {
                    return Err(Failure::Usage(format!(
                        "--api-tcp {addr} needs a bearer token (--token-file)"
                    )));
                }
            }
            (None, Some(path)) => {
                if token.is_none() {
                    return Err(Failure::Usage(format!(
                        "{}: api_tcp {addr} needs a bearer token (token_file or --token-file)",
                        path.display()
                    )));
                }
            }
        }
    }
    Ok(corral_operator::api::ApiConfig {
        socket: settings.api_socket.clone(),
        tcp: settings.api_tcp,
        token,
    })
}
