//! Repository rules for corral-cluster: no I/O crates in its dependency tree, and every file says what it is for.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/<name>")
        .to_path_buf()
}

/// The crates corral-cluster depends on (normal dependencies, transitively).
fn dependencies() -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "tree",
            "-p",
            "corral-cluster",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        tree.contains("corral-cluster"),
        "unexpected cargo tree output: {tree}"
    );
    tree.lines()
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// The cluster decisions are pure: no runtime, no etcd client, no database, no HTTP, no libc.
#[test]
fn cluster_decisions_pull_in_no_io_crates() {
    let crates = dependencies();
    assert!(crates.iter().any(|c| c == "corral-core"), "{crates:?}");
    for forbidden in ["tokio", "etcd-client", "rusqlite", "hyper", "libc", "mio"] {
        assert!(
            !crates.iter().any(|c| c == forbidden),
            "corral-cluster depends on {forbidden}: {crates:?}"
        );
    }
}

/// Every Rust file of the crate opens with a `//!` line.
#[test]
fn every_file_says_what_it_is_for() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests"] {
        for entry in std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.path().extension().is_some_and(|e| e == "rs") {
                files.push(entry.path());
            }
        }
    }
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
