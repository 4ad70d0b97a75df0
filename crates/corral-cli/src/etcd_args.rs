//! The options that secure the connection to etcd, shared by every command that talks to it
//! (flattened into `cluster::EtcdArgs`, `cluster::MaybeEtcd` and the agent's options).

use std::path::{Path, PathBuf};

use clap::Args;
use corral_etcd::{Credentials, EtcdOptions};

use crate::exit::Failure;

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
    /// These options, each one given here or else taken from the configuration file's.
    pub fn or(&self, user: Option<&str>, password_file: Option<&Path>) -> EtcdAuthArgs {
        EtcdAuthArgs {
            etcd_user: self.etcd_user.clone().or(user.map(str::to_owned)),
            etcd_password_file: self
                .etcd_password_file
                .clone()
                .or(password_file.map(Path::to_path_buf)),
        }
    }

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

    /// etcd client options with these credentials.
    pub fn options(&self) -> Result<EtcdOptions, Failure> {
        Ok(EtcdOptions {
            credentials: self.credentials()?,
            ..EtcdOptions::default()
        })
    }
}
