//! corral-cni's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-cni --test integration <file>::`.

#[path = "../../../fuzz/replay.rs"]
#[macro_use]
mod replay;
mod common;

mod agent_mode;
mod agent_pending;
mod agent_slow;
mod binary;
mod bridge;
mod durability;
mod fuzz_corpus;
mod hostile_files;
mod interfaces;
mod kill;
mod node_pool;
mod protocol;
mod vanished_state;
