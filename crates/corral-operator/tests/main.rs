//! corral-operator's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-operator --test integration <file>::`.

#[path = "../../../fuzz/replay.rs"]
#[macro_use]
mod replay;
mod common;

mod api;
mod blocks;
mod blocks_randomized;
mod cloud;
mod cloud_gaps;
mod cloud_records;
mod cloud_scenarios;
mod config_paths;
mod election;
mod epoch;
mod from_cloud;
mod fuzz_corpus;
mod history;
mod history_etcd;
mod memkv;
mod openapi;
mod problems;
mod randomized;
mod rebuild_cost;
mod refused;
mod removal;
mod schemathesis;
mod to_cloud;
