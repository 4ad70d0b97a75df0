//! corral-client's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-client --test integration <file>::`.

#[path = "../../../fuzz/replay.rs"]
#[macro_use]
mod replay;
mod fuzz_corpus;
