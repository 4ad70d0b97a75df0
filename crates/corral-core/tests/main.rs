//! corral-core's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-core --test integration <file>::`.

mod common;
mod repo;

mod allocate_all;
mod interfaces;
mod layers;
mod parsers;
mod properties;
mod scripts;
mod snapshot;
mod tidy;
