//! How the commands that talk to etcd secure the connection: each concern is one option set
//! flattened into `cluster::EtcdArgs`, `cluster::MaybeEtcd` and the agent's and operator's
//! options. `EtcdTlsArgs`: `--etcd-cacert`, `--etcd-cert`, `--etcd-key` (as etcdctl's
//! `--cacert`, `--cert`, `--key`), also from the environment and the agent's `[cluster]` table.

use std::path::PathBuf;

use clap::Args;
use corral_etcd::EtcdTls;

use crate::exit::Failure;

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
    /// These options, each taken from `file` where not given here (flags and the environment
    /// win over a configuration file).
    pub fn or(&self, file: &EtcdTlsArgs) -> EtcdTlsArgs {
        EtcdTlsArgs {
            etcd_cacert: self
                .etcd_cacert
                .clone()
                .or_else(|| file.etcd_cacert.clone()),
            etcd_cert: self.etcd_cert.clone().or_else(|| file.etcd_cert.clone()),
            etcd_key: self.etcd_key.clone().or_else(|| file.etcd_key.clone()),
        }
    }

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

    /// etcd's client options with these TLS files.
    pub fn options(&self) -> Result<corral_etcd::EtcdOptions, Failure> {
        Ok(corral_etcd::EtcdOptions {
            tls: self.tls()?,
            ..corral_etcd::EtcdOptions::default()
        })
    }
}
