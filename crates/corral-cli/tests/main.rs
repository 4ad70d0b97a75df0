//! corral-cli's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-cli --test integration <file>::`.

#[path = "common/cluster.rs"]
mod cluster_common;
mod common;
#[allow(dead_code)] // agents_footprint uses part; the agents bench the rest
#[path = "common/fleet.rs"]
mod fleet;

mod agent_faults;
mod agent_socket;
mod agents_footprint;
mod blocks;
mod capacity_restart;
mod cli;
mod cloud;
mod cloud_records;
mod cluster;
mod cluster_demo;
mod cluster_history;
mod config_paths;
mod connection_limits;
mod dashboard;
mod e2e;
mod etcd_tls;
mod explain;
mod failover_adds;
mod from_cloud;
mod gc;
mod history;
mod host_local;
mod interfaces;
mod liveness;
mod local_routes;
mod logs;
mod nemesis;
mod operator_config;
mod podman;
mod rbac;
mod removal;
mod restore;
mod signals;
mod surfaces;
mod sync_failure;
mod waiting;
