//! corral-agent's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-agent --test integration <file>::`.

#[path = "../../../fuzz/replay.rs"]
#[macro_use]
mod replay;
mod common;
#[path = "common/http.rs"]
mod http;

mod add_waits;
mod api;
mod blocks;
mod capacity;
mod cloud;
mod cluster_link;
mod fuzz_corpus;
mod history;
mod openapi;
mod schemathesis;
mod vanished_state;
