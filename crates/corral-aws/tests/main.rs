//! corral-aws's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-aws --test integration <file>::`.

mod common;

mod e2e;
mod http;
mod moto;
