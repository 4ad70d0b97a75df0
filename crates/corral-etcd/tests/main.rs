//! corral-etcd's integration tests, one binary: a module per file of `tests/`, the shared
//! harness declared here once. (A binary per file linked the workspace once per file.)
//! One file's tests: `cargo test -p corral-etcd --test integration <file>::`.

/// The tests run one at a time, whichever file they are in: each starts its own members, and
/// 2 cores running several clusters at once make elections with a 250 ms timeout flap. (Under
/// cargo-nextest, a process a test, `.config/nextest.toml`'s `etcd-members` group does this.)
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

mod auth;
mod etcd;
mod tls;
