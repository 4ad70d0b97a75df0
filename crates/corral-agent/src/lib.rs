//! corral-agent: the node daemon. It owns a state directory (SQLite, locked for as long as
//! it runs), keeps one engine per scope in memory, and answers the REST API of `corral-api`
//! on a unix socket (and optionally on TCP at the loopback address, with a bearer token).
//!
//! Start-up: the socket is bound first, so `/healthz` answers and `/readyz` says "not ready"
//! while the state is restored; every allocation, lease and cooldown comes back, and only
//! then are overdue leases released (the first tick) and the DELs corral-ipam recorded while
//! the agent was away applied (`pending.rs`). Requests before that get 503.
//! Every change is durable before it is answered; concurrent requests share one commit
//! (`committer.rs`).

pub mod adds;
pub mod api;
mod capacity;
pub mod committer;
pub mod config;
pub mod error;
pub mod fuzz;
pub mod ipamd;
pub mod link;
mod listen;
pub mod local_routes;
pub mod metrics;
mod netlink;
pub mod node;
pub mod openapi;
pub mod pending;
mod server;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{
    AgentConfig, ClusterTable, ConfigError, ConnectionLimits, LogTable, Overrides, cluster_table,
    log_table,
};
pub use server::{
    AgentError, ClusterTask, Running, run, run_with, serve, serve_with, shutdown_signal,
};
