//! Exit codes, and the failures that lead to each: what the command line promises scripts.

use std::error::Error as _;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use corral_client::Error as ClientError;

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
    Daemon(String),
    /// `corral operator` could not start, or stopped with an error.
    Operator(String),
    /// etcd (the cluster store) could not be reached or failed.
    Cluster(String),
    /// The cloud's API could not be asked, or failed (`cluster check --cloud`).
    Cloud(String),
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
                ClientError::Api { status, .. } | ClientError::Status { status, .. }
                    if (400..500).contains(status) =>
                {
                    Exit::Refused
                }
                _ => Exit::AgentFailed,
            },
            Failure::Usage(_) | Failure::File { .. } => Exit::Usage,
            Failure::Daemon(_) => Exit::AgentFailed,
            Failure::Operator(_) => Exit::AgentFailed,
            Failure::Cluster(_) | Failure::Cloud(_) => Exit::Unreachable,
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
            Failure::Daemon(message) => write!(f, "agent: {message}"),
            Failure::Cluster(message) => write!(
                f,
                "cluster store: {message}\nis etcd running? (`--etcd` or CORRAL_ETCD names it)"
            ),
            Failure::Cloud(message) => write!(
                f,
                "cloud: {message}\nare the cloud's endpoint, region and credentials right?"
            ),
            Failure::Refused(message) => write!(f, "{message}"),
            Failure::Operator(message) => write!(f, "operator: {message}"),
            Failure::File {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}
