//! Exit codes, and the failures that lead to each: what the command line promises scripts.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use corral_client::Error as ClientError;
use corral_cloud::CloudError;
use corral_kv::KvError;

/// The process's exit code (listed in the crate documentation and `corral --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The agent refused the request (4xx).
    Refused = 1,
    /// Bad arguments (clap exits with 2 itself), or a file that cannot be read or written.
    Usage = 2,
    /// The agent is unreachable, timed out, or the connection broke.
    Unreachable = 3,
    /// The agent failed: 5xx, or an answer that is not the API's.
    AgentFailed = 4,
    /// `check` found problems.
    ProblemsFound = 5,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// What a subcommand prints on stdout, and how the process ends.
#[derive(Debug)]
pub struct Outcome {
    pub stdout: String,
    pub exit: Exit,
}

impl Outcome {
    pub fn ok(stdout: String) -> Outcome {
        Outcome {
            stdout,
            exit: Exit::Ok,
        }
    }
}

/// Why a subcommand failed; printed on stderr after `corral: `.
#[derive(Debug)]
pub enum Failure {
    /// Talking to the agent failed, or it refused.
    Agent(ClientError),
    /// An input the arguments point to is not usable (a line of the live list, a
    /// checkpoint that is not JSON, an option that does not apply).
    Usage(String),
    /// `corral agent` could not start (its configuration, state directory or socket), or
    /// stopped with an error.
    Daemon(corral_agent::AgentError),
    /// `corral operator` could not start, or stopped with an error.
    Operator(OperatorFailure),
    /// The async runtime could not be built (threads, file descriptors).
    Runtime(io::Error),
    /// etcd (the cluster store) could not be reached, or refused or failed the request.
    Cluster(KvError),
    /// The TLS options or files for etcd cannot be used (a file unreadable, readable by
    /// others, expired, a key that does not match; an https:// URL without a CA).
    EtcdTls(corral_etcd::TlsError),
    /// The cloud's API could not be asked, or refused or failed (`cluster check --cloud`).
    Cloud(CloudError),
    /// A bug in corral: a record it made could not be encoded.
    Internal(String),
    /// The cluster refused the change (a configuration already there, a node not
    /// registered, a change that grants may rest on).
    Refused(String),
    /// A file named on the command line cannot be read or written.
    File {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Why `corral operator` could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorFailure {
    /// Its API's socket or TCP listener could not be bound.
    #[error("{0}")]
    Api(#[from] corral_operator::api::BindError),
    /// The replica stopped with an error (the cluster store, the cloud call scheduler).
    #[error("{0}")]
    Run(#[from] corral_operator::OperatorError),
}

impl From<corral_etcd::ConnectError> for Failure {
    fn from(error: corral_etcd::ConnectError) -> Failure {
        match error {
            corral_etcd::ConnectError::Tls(error) => Failure::EtcdTls(error),
            corral_etcd::ConnectError::Store(error) => Failure::Cluster(error),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        Failure::Agent(error)
    }
}

impl Failure {
    pub fn exit(&self) -> Exit {
        match self {
            Failure::Agent(error) => match error {
                ClientError::Unreachable { .. }
                | ClientError::Timeout { .. }
                | ClientError::Io { .. } => Exit::Unreachable,
                ClientError::Api { status, .. } | ClientError::Status { status, .. } => {
                    if (400..500).contains(status) {
                        Exit::Refused
                    } else {
                        Exit::AgentFailed
                    }
                }
                ClientError::Protocol(_) => Exit::AgentFailed,
            },
            Failure::Usage(_) | Failure::File { .. } | Failure::EtcdTls(_) => Exit::Usage,
            Failure::Daemon(_)
            | Failure::Operator(_)
            | Failure::Runtime(_)
            | Failure::Internal(_) => Exit::AgentFailed,
            // Only what never reached etcd is "unreachable": a refusal (a limit, a malformed
            // request), a compacted revision or an unknown lease is etcd answering.
            Failure::Cluster(error) => match error {
                KvError::Unavailable(_) | KvError::Closed => Exit::Unreachable,
                KvError::Compacted { .. }
                | KvError::LeaseNotFound(_)
                | KvError::Refused(_)
                | KvError::TooManyOps(_) => Exit::AgentFailed,
            },
            // Likewise the cloud: no answer, a throttle or a server-side failure is
            // "unreachable" (try again); a refusal of the call is a refusal.
            Failure::Cloud(error) => {
                if error.is_ambiguous() || error.is_retryable() {
                    Exit::Unreachable
                } else {
                    Exit::Refused
                }
            }
            Failure::Refused(_) => Exit::Refused,
        }
    }
}

impl fmt::Display for Failure {
    /// The error and each of its sources, separated by `: `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Agent(error) => {
                write!(f, "{error}")?;
                let mut source = error.source();
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
                if matches!(error, ClientError::Unreachable { .. }) {
                    write!(
                        f,
                        "\nis the agent running? (`--socket` or CORRAL_SOCKET names its socket)"
                    )?;
                }
                Ok(())
            }
            Failure::Usage(message) => write!(f, "{message}"),
            Failure::Daemon(error) => write!(f, "agent: {error}"),
            Failure::Cluster(error) => {
                write!(f, "cluster store: {error}")?;
                match error {
                    KvError::Unavailable(message) if message.contains("no leader") => write!(
                        f,
                        "\netcd has no leader: are more than half of its members running and \
                         connected to each other?"
                    ),
                    KvError::Unavailable(message) if message.contains("TLS") => write!(
                        f,
                        "\nare etcd's TLS files right? (`--etcd-cacert`, `--etcd-cert`, \
                         `--etcd-key` or CORRAL_ETCD_CACERT, CORRAL_ETCD_CERT, CORRAL_ETCD_KEY)"
                    ),
                    KvError::Unavailable(_) | KvError::Closed => {
                        write!(f, "\nis etcd running? (`--etcd` or CORRAL_ETCD names it)")
                    }
                    KvError::Compacted { .. }
                    | KvError::LeaseNotFound(_)
                    | KvError::Refused(_)
                    | KvError::TooManyOps(_) => Ok(()),
                }
            }
            Failure::Cloud(error) => write!(
                f,
                "cloud: {error}\nare the cloud's endpoint, region and credentials right?"
            ),
            Failure::Internal(message) => write!(f, "internal error (a bug in corral): {message}"),
            Failure::Refused(message) => write!(f, "{message}"),
            Failure::EtcdTls(error) => write!(f, "etcd TLS: {error}"),
            Failure::Operator(error) => write!(f, "operator: {error}"),
            Failure::Runtime(error) => write!(f, "cannot start the async runtime: {error}"),
            Failure::File {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_refusal_is_a_failure_not_unreachable() {
        let refused = Failure::Cluster(KvError::Refused("too many operations in txn".into()));
        assert_eq!(refused.exit(), Exit::AgentFailed);
        assert!(
            !refused.to_string().contains("is etcd running"),
            "{refused}"
        );
        let down = Failure::Cluster(KvError::Unavailable("tcp connect error".into()));
        assert_eq!(down.exit(), Exit::Unreachable);
        assert!(down.to_string().contains("is etcd running"), "{down}");
        let tls = Failure::Cluster(KvError::Unavailable(
            "etcd refused the TLS client certificate (alert BadCertificate)".into(),
        ));
        assert_eq!(tls.exit(), Exit::Unreachable);
        assert!(!tls.to_string().contains("is etcd running"), "{tls}");
        assert!(tls.to_string().contains("--etcd-cacert"), "{tls}");
        let no_quorum = Failure::Cluster(KvError::Unavailable("etcdserver: no leader".into()));
        assert_eq!(no_quorum.exit(), Exit::Unreachable);
        assert!(
            no_quorum
                .to_string()
                .contains("more than half of its members"),
            "{no_quorum}"
        );
    }

    #[test]
    fn the_cloud_refusing_a_call_is_a_refusal_and_no_answer_is_unreachable() {
        let refused = Failure::Cloud(CloudError::Other {
            code: "UnauthorizedOperation".into(),
            message: "not allowed".into(),
        });
        assert_eq!(refused.exit(), Exit::Refused);
        let throttled = Failure::Cloud(CloudError::RequestLimitExceeded {
            action: corral_cloud::Action::DescribeInstances,
        });
        assert_eq!(throttled.exit(), Exit::Unreachable);
    }
}
