//! Repository rules that keep the architecture honest: the dependency lists of the crates
//! that must stay light (the core, the plugin, the cluster's decisions and users) and file docs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::repo;
use repo::workspace_root;

/// `cargo tree ARGS --prefix none --offline` of the workspace: one crate a line, its name first.
fn cargo_tree(args: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .arg("tree")
        .args(args)
        .args(["--prefix", "none", "--offline"])
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    tree.lines()
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// The crates `package` depends on (normal dependencies, transitively).
fn dependencies(package: &str) -> Vec<String> {
    let crates = cargo_tree(&["-p", package, "-e", "normal"]);
    assert!(
        crates.iter().any(|c| c == package),
        "unexpected cargo tree output: {crates:?}"
    );
    crates
}

/// `package`'s dependencies, which must include none of `forbidden`.
fn dependencies_without(package: &str, forbidden: &[&str]) -> Vec<String> {
    let crates = dependencies(package);
    for forbidden in forbidden {
        assert!(
            !crates.iter().any(|c| c == forbidden),
            "{package} depends on {forbidden}: {crates:?}"
        );
    }
    crates
}

/// corral-core does no I/O: it must never depend (even indirectly) on a runtime, a database,
/// an HTTP stack or an etcd client.
#[test]
fn core_pulls_in_no_io_crates() {
    dependencies_without(
        "corral-core",
        &[
            "tokio",
            "rusqlite",
            "hyper",
            "etcd-client",
            "reqwest",
            "axum",
            "mio",
            "libc",
            "netlink-sys",
        ],
    );
}

/// corral-ipam is exec'd once per CNI call and must start fast: no async runtime, no HTTP
/// framework, also not through its agent client (which parses HTTP with httparse); and no
/// netlink, which only the agent reads the node's routes with.
#[test]
fn the_cni_plugin_pulls_in_no_async_runtime() {
    let crates = dependencies_without(
        "corral-cni",
        &[
            "tokio",
            "hyper",
            "axum",
            "mio",
            "async-std",
            "futures-util",
            "reqwest",
            "netlink-sys",
            "netlink-packet-route",
            // It keeps its plain stderr: no logging library to load on every call.
            "tracing",
            "tracing-subscriber",
        ],
    );
    assert!(crates.iter().any(|c| c == "httparse"), "{crates:?}");
}

/// Libraries emit `tracing` events; only the binary's crate chooses how they are written
/// (corral-cli's `logging.rs`): no library links a subscriber.
#[test]
fn only_corral_cli_links_a_log_subscriber() {
    let tree = cargo_tree(&["--invert", "tracing-subscriber", "-e", "normal"]);
    let dependents: Vec<&String> = tree
        .iter()
        .filter(|name| {
            name.starts_with("corral-") && !["corral-cli", "corral-aws"].contains(&name.as_str())
        })
        .collect();
    assert!(
        dependents.is_empty(),
        "{dependents:?} link tracing-subscriber: only corral-cli may (and corral-aws through it)"
    );
    for library in ["corral-agent", "corral-operator", "corral-http"] {
        dependencies_without(library, &["tracing-subscriber"]);
    }
}

/// The cluster decisions are pure: no runtime, no etcd client, no database, no HTTP, no libc.
#[test]
fn cluster_decisions_pull_in_no_io_crates() {
    let crates = dependencies_without(
        "corral-cluster",
        &["tokio", "etcd-client", "rusqlite", "hyper", "libc", "mio"],
    );
    assert!(crates.iter().any(|c| c == "corral-core"), "{crates:?}");
}

/// corral-cloud stays light: no AWS SDK (that is corral-aws, which nothing else links), no HTTP
/// stack, no database, and of tokio only the clock and sync.
#[test]
fn the_cloud_crate_pulls_in_no_sdk_http_or_store() {
    let crates = dependencies("corral-cloud");
    assert!(crates.iter().any(|c| c == "rand_distr"), "{crates:?}");
    for name in &crates {
        assert!(
            !name.starts_with("aws-") && !name.starts_with("corral-aws"),
            "corral-cloud depends on {name}"
        );
        for forbidden in ["hyper", "reqwest", "rusqlite", "etcd-client", "mio", "axum"] {
            assert_ne!(name, forbidden, "corral-cloud depends on {forbidden}");
        }
    }
}

/// Only corral-etcd links an etcd client: the operator library and the agent are generic over
/// `corral_kv::Kv`, and the binary chooses etcd.
#[test]
fn only_corral_etcd_links_an_etcd_client() {
    for package in [
        "corral-operator",
        "corral-agent",
        "corral-kv",
        "corral-cluster",
    ] {
        // Only corral-etcd may.
        dependencies_without(package, &["etcd-client", "tonic", "prost"]);
    }
    assert!(
        dependencies("corral-etcd")
            .iter()
            .any(|c| c == "etcd-client")
    );
}

/// Nothing in the workspace depends on corral-aws (the AWS SDK takes minutes to build), and
/// nothing but corral-aws links the SDK: everything else codes against `corral_cloud`.
#[test]
fn nothing_depends_on_corral_aws_and_only_it_links_the_aws_sdk() {
    for sdk in ["corral-aws", "aws-sdk-ec2", "aws-config"] {
        let tree = cargo_tree(&["--invert", sdk, "-e", "all"]);
        let dependents: Vec<&String> = tree
            .iter()
            .filter(|name| name.starts_with("corral-") && *name != "corral-aws")
            .collect();
        assert!(
            dependents.is_empty(),
            "{dependents:?} depend on {sdk}: only corral-aws may, and nothing on it"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every Rust file opens with a `//!` line saying what it is for.
#[test]
fn every_file_says_what_it_is_for() {
    let mut files = Vec::new();
    rust_files(&workspace_root().join("crates"), &mut files);
    assert!(files.len() > 5, "found only {files:?}");
    let undocumented: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "files without a //! line: {undocumented:?}"
    );
}

/// Every `cargo run -p CRATE --example NAME` of the Makefile has its file: `make demo` broke
/// once when a commit deleted `crates/corral-core/examples/demo.rs`.
#[test]
fn makefile_examples_exist() {
    let makefile = std::fs::read_to_string(workspace_root().join("Makefile")).expect("Makefile");
    let mut checked = 0;
    for line in makefile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |flag: &str| {
            words
                .iter()
                .position(|word| *word == flag)
                .and_then(|at| words.get(at + 1))
                .copied()
        };
        let (Some(package), Some(example)) = (after("-p"), after("--example")) else {
            continue;
        };
        let path = workspace_root()
            .join("crates")
            .join(package)
            .join("examples")
            .join(format!("{example}.rs"));
        assert!(path.is_file(), "Makefile runs {}: missing", path.display());
        checked += 1;
    }
    assert!(checked >= 1, "no example found in the Makefile");
}
