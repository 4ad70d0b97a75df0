//! One plugin invocation: the environment and stdin turned into a typed, validated request.

use std::ffi::OsStr;

use corral_core::{AttachmentKey, validate_owner};

use crate::config::{NetConfig, parse_config};
use crate::env::{Command, Env, parse_env};
use crate::error::CniError;
use crate::version::CniVersion;

/// What the runtime asked for, validated in full before anything is acted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Print [`crate::version_json`] in the version stdin names (see [`crate::reply_version`]).
    Version,
    /// Allocate one address from each range set and print the result.
    Add(Attachment),
    /// Release the attachment's addresses; print nothing.
    Del(Attachment),
    /// Confirm the attachment holds its addresses; print nothing.
    Check(Attachment),
    /// Release every allocation of the network whose attachment is not in
    /// `valid_attachments`; print nothing.
    Gc(NetConfig),
    /// Report whether ADD can be served (codes 50 and 51 when not); print nothing.
    Status(NetConfig),
}

/// An ADD, DEL or CHECK: the attachment it concerns and everything the runtime passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// (network name, container ID, interface name).
    pub key: AttachmentKey,
    pub env: Env,
    pub config: NetConfig,
}

impl Attachment {
    /// The owner to record for the attachment's allocations: `namespace/name` of the
    /// Kubernetes pod when the runtime passed `K8S_POD_NAMESPACE` and `K8S_POD_NAME` in
    /// `CNI_ARGS`, else the container ID.
    pub fn owner(&self) -> String {
        let args = &self.env.args;
        if let (Some(namespace), Some(name)) =
            (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME"))
            && !namespace.is_empty()
            && !name.is_empty()
        {
            let owner = format!("{namespace}/{name}");
            if validate_owner(&owner).is_ok() {
                return owner;
            }
        }
        self.key.container_id().to_owned()
    }
}

impl Invocation {
    pub fn command(&self) -> Command {
        match self {
            Invocation::Version => Command::Version,
            Invocation::Add(_) => Command::Add,
            Invocation::Del(_) => Command::Del,
            Invocation::Check(_) => Command::Check,
            Invocation::Gc(_) => Command::Gc,
            Invocation::Status(_) => Command::Status,
        }
    }

    /// The network configuration; VERSION has none.
    pub fn config(&self) -> Option<&NetConfig> {
        match self {
            Invocation::Version => None,
            Invocation::Add(attachment)
            | Invocation::Del(attachment)
            | Invocation::Check(attachment) => Some(&attachment.config),
            Invocation::Gc(config) | Invocation::Status(config) => Some(config),
        }
    }

    /// The version to answer in: the configured one, or the newest for VERSION.
    pub fn cni_version(&self) -> CniVersion {
        self.config()
            .map_or(CniVersion::LATEST, |config| config.cni_version)
    }
}

/// Parses an invocation from the environment (as (name, value) pairs) and stdin.
///
/// The environment is checked first (code 4), then the configuration (codes 1, 2, 6, 7,
/// 102), so the first error a runtime sees is the one it can fix first. On error, answer in
/// [`crate::reply_version`]`(stdin)`.
pub fn parse_invocation<I, K, V>(vars: I, stdin: &[u8]) -> Result<Invocation, CniError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let env = parse_env(vars)?;
    let command = env.command;
    if command == Command::Version {
        return Ok(Invocation::Version);
    }
    let config = parse_config(command, stdin, &env.args)?;
    let attachment = |env: Env, config: NetConfig| -> Result<Attachment, CniError> {
        let key = env.attachment_key(&config.name)?;
        Ok(Attachment { key, env, config })
    };
    Ok(match command {
        Command::Add => Invocation::Add(attachment(env, config)?),
        Command::Del => Invocation::Del(attachment(env, config)?),
        Command::Check => Invocation::Check(attachment(env, config)?),
        Command::Gc => Invocation::Gc(config),
        Command::Status => Invocation::Status(config),
        Command::Version => Invocation::Version,
    })
}
