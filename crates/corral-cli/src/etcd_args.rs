//! How the commands that talk to etcd reach it. [`EtcdArgs`] declares each flag once
//! (`--etcd`, `--cluster`, TLS, auth, with their help and environment variables); a command
//! that needs etcd less strictly wraps it and changes only what `--etcd` requires and says
//! (`cluster::MaybeEtcd`, `operator_config::OperatorEtcdArgs`). TLS and auth are each one
//! option set, flattened there and into the agent's options. `EtcdTlsArgs`: `--etcd-cacert`, `--etcd-cert`, `--etcd-key` (as etcdctl's
//! `--cacert`, `--cert`, `--key`), also from the environment. `EtcdAuthArgs`: `--etcd-user`
//! and `--etcd-password-file` (etcd's auth), likewise. A daemon's options are a `[cluster]`
//! table ([`table`]) layered over its file's (`ClusterTable::or`), then turned back into these.

use std::path::PathBuf;

use clap::Args;
use corral_cluster::daemon::{ClusterTable, DEFAULT_CLUSTER};
use corral_etcd::{Credentials, EtcdOptions, EtcdTls};

use crate::exit::Failure;

/// etcd's client options with these TLS files and credentials.
pub fn options(tls: &EtcdTlsArgs, auth: &EtcdAuthArgs) -> Result<EtcdOptions, Failure> {
    Ok(EtcdOptions {
        tls: tls.tls()?,
        credentials: auth.credentials()?,
        ..EtcdOptions::default()
    })
}

/// A daemon's etcd options from its command line (and environment) as a `[cluster]` table,
/// each given or not, to layer over its configuration file's (`ClusterTable::or`).
pub fn table(
    endpoints: &[String],
    cluster: Option<&String>,
    tls: &EtcdTlsArgs,
    auth: &EtcdAuthArgs,
) -> ClusterTable {
    ClusterTable {
        endpoints: (!endpoints.is_empty()).then(|| endpoints.to_vec()),
        name: cluster.cloned(),
        etcd_cacert: tls.etcd_cacert.clone(),
        etcd_cert: tls.etcd_cert.clone(),
        etcd_key: tls.etcd_key.clone(),
        etcd_user: auth.etcd_user.clone(),
        etcd_password_file: auth.etcd_password_file.clone(),
    }
}

/// The TLS files of a configuration file's `[cluster]` table.
impl From<&ClusterTable> for EtcdTlsArgs {
    fn from(table: &ClusterTable) -> EtcdTlsArgs {
        EtcdTlsArgs {
            etcd_cacert: table.etcd_cacert.clone(),
            etcd_cert: table.etcd_cert.clone(),
            etcd_key: table.etcd_key.clone(),
        }
    }
}

/// The etcd user and password file of a configuration file's `[cluster]` table.
impl From<&ClusterTable> for EtcdAuthArgs {
    fn from(table: &ClusterTable) -> EtcdAuthArgs {
        EtcdAuthArgs {
            etcd_user: table.etcd_user.clone(),
            etcd_password_file: table.etcd_password_file.clone(),
        }
    }
}

/// Options of every command that talks to etcd.
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// etcd's client URLs, comma-separated (e.g. http://127.0.0.1:2379)
    #[arg(
        long,
        env = "CORRAL_ETCD",
        value_name = "URL[,URL…]",
        value_delimiter = ',',
        required = true
    )]
    pub etcd: Vec<String>,
    /// The cluster's name: its keys live under /corral/<cluster>/v1/ [default: default]
    #[arg(long, env = "CORRAL_CLUSTER")]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub tls: EtcdTlsArgs,
    #[command(flatten)]
    pub auth: EtcdAuthArgs,
}

impl EtcdArgs {
    /// The cluster's name: `--cluster`, else `default`.
    pub fn cluster_name(&self) -> &str {
        self.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER)
    }

    /// These options as a `[cluster]` table, each given or not, to layer over a daemon's
    /// configuration file's (`ClusterTable::or`).
    pub fn table(&self) -> ClusterTable {
        table(&self.etcd, self.cluster.as_ref(), &self.tls, &self.auth)
    }
}

/// TLS to etcd: the CA bundle that etcd's certificate must verify against, and the client
/// certificate and key for an etcd that asks for one.
#[derive(Clone, Debug, Default, Args)]
pub struct EtcdTlsArgs {
    /// The CA certificate (PEM) that etcd's server certificate must verify against; needed
    /// with https:// URLs (no system roots are used)
    #[arg(long, env = "CORRAL_ETCD_CACERT", value_name = "FILE")]
    pub etcd_cacert: Option<PathBuf>,
    /// The client certificate (PEM) for an etcd run with --client-cert-auth (with --etcd-key)
    #[arg(long, env = "CORRAL_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM; refused if others can read it)
    #[arg(long, env = "CORRAL_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// The TLS files given, if any: a client certificate or key without the CA bundle is
    /// refused (the files are checked when connecting).
    pub fn tls(&self) -> Result<Option<EtcdTls>, Failure> {
        let Some(ca) = &self.etcd_cacert else {
            return match (&self.etcd_cert, &self.etcd_key) {
                (None, None) => Ok(None),
                _ => Err(Failure::Usage(
                    "--etcd-cert and --etcd-key need --etcd-cacert (the CA that signs etcd's \
                     certificate)"
                        .into(),
                )),
            };
        };
        let mut tls = EtcdTls::new(ca);
        tls.cert.clone_from(&self.etcd_cert);
        tls.key.clone_from(&self.etcd_key);
        Ok(Some(tls))
    }
}

/// The etcd user and its password file (etcd's auth). The password is read from the file (its
/// first line) when connecting, and is never logged or shown.
#[derive(Debug, Clone, Default, Args)]
pub struct EtcdAuthArgs {
    /// The etcd user to authenticate as (with --etcd-password-file)
    #[arg(long, env = "CORRAL_ETCD_USER", value_name = "NAME")]
    pub etcd_user: Option<String>,
    /// The file holding the etcd user's password (its first line), e.g. one `corral node
    /// credentials` wrote
    #[arg(long, env = "CORRAL_ETCD_PASSWORD_FILE", value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdAuthArgs {
    /// The credentials to connect with: none without a user; a user needs its password file,
    /// which must be readable and not empty.
    pub fn credentials(&self) -> Result<Option<Credentials>, Failure> {
        match (&self.etcd_user, &self.etcd_password_file) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(Failure::Usage(
                "--etcd-user needs --etcd-password-file".into(),
            )),
            (None, Some(_)) => Err(Failure::Usage(
                "--etcd-password-file needs --etcd-user".into(),
            )),
            (Some(user), Some(file)) => Credentials::from_file(user, file)
                .map(Some)
                .map_err(|e| Failure::Usage(e.to_string())),
        }
    }
}
