//! corral-cluster's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-cluster --test integration <file>::`.

#[path = "../../../fuzz/replay.rs"]
#[macro_use]
mod replay;
mod common;

mod check_holdings;
mod churn;
mod cloud;
mod fuzz_corpus;
mod holdings;
mod holdings_model;
mod properties;
