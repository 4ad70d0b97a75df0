//! The agent's connection caps, fitted under the open-files limit with a reserve, so
//! accepting never runs the process out of file descriptors; the listeners themselves are
//! served by `corral-http`.
//!
//! Each listener has its own cap, so connections that never send a request (anyone can open
//! them on TCP, without the token) wait only on their own listener: the unix socket keeps
//! being served.

use crate::config::ConnectionLimits;

/// File descriptors kept out of the connection caps: stdio, SQLite's database, log, lock and
/// index files, the runtime's epoll and wake-up descriptors, the listeners, and a margin.
pub(crate) const RESERVED_FDS: u64 = 64;

/// The caps of both listeners, fitted under the open-files limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    pub unix: usize,
    pub tcp: usize,
}

/// Fits the configured caps under `open_files_limit` (the soft RLIMIT_NOFILE): after
/// [`RESERVED_FDS`], TCP gets at most a quarter of what is left and the socket at most half,
/// so even both listeners full leave descriptors for the store and for what else the agent
/// opens. `None` is an unlimited limit.
pub(crate) fn fit_caps(
    limits: &ConnectionLimits,
    open_files_limit: Option<u64>,
    with_tcp: bool,
) -> Caps {
    let budget = open_files_limit.map_or(u64::MAX, |limit| limit.saturating_sub(RESERVED_FDS));
    let share = |divisor: u64| {
        usize::try_from(budget / divisor)
            .unwrap_or(usize::MAX)
            .max(1)
    };
    Caps {
        unix: limits.max_unix.min(share(2)),
        tcp: if with_tcp {
            limits.max_tcp.min(share(4))
        } else {
            0
        },
    }
}

/// Raises the soft open-files limit to the hard one, so the caps rarely need lowering, and
/// returns the soft limit in force (`None`: unlimited).
pub(crate) fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        let raised = Rlimit {
            current: Some(maximum),
            maximum: Some(maximum),
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = current, to = maximum, "open files limit raised");
                return Some(maximum);
            }
            Err(error) => tracing::warn!(
                from = current,
                to = maximum,
                %error,
                "cannot raise the open files limit"
            ),
        }
    }
    limit.current
}

/// The soft open-files limit in force (`None`: unlimited).
pub(crate) fn open_files_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_under_the_open_files_limit_with_tcp_below_the_socket() {
        let limits = ConnectionLimits::default();
        assert_eq!(
            fit_caps(&limits, Some(1 << 20), true),
            Caps {
                unix: 512,
                tcp: 128
            }
        );
        assert_eq!(fit_caps(&limits, None, false), Caps { unix: 512, tcp: 0 });
        // The usual 1,024: both listeners full still leave a quarter of the budget free.
        let caps = fit_caps(&limits, Some(1024), true);
        assert_eq!(
            caps,
            Caps {
                unix: 480,
                tcp: 128
            }
        );
        assert!(caps.unix + caps.tcp + (RESERVED_FDS as usize) < 1024);
        // A tiny limit still serves one connection on each.
        assert_eq!(fit_caps(&limits, Some(10), true), Caps { unix: 1, tcp: 1 });
    }
}
