//! Repository rules for the cluster's users: only corral-etcd links etcd-client (the operator
//! library and the agent are generic over `corral_kv::Kv`; the binary chooses etcd), and every
//! file of the operator says what it is for.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/<name>")
        .to_path_buf()
}

/// The crates `package` depends on (normal dependencies, transitively).
fn dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "tree",
            "-p",
            package,
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
        tree.contains(package),
        "unexpected cargo tree output: {tree}"
    );
    tree.lines()
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn only_corral_etcd_links_an_etcd_client() {
    for package in [
        "corral-operator",
        "corral-agent",
        "corral-kv",
        "corral-cluster",
    ] {
        let crates = dependencies(package);
        for forbidden in ["etcd-client", "tonic", "prost"] {
            assert!(
                !crates.iter().any(|c| c == forbidden),
                "{package} depends on {forbidden}: only corral-etcd may"
            );
        }
    }
    assert!(
        dependencies("corral-etcd")
            .iter()
            .any(|c| c == "etcd-client")
    );
}

#[test]
fn every_file_opens_with_a_doc_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stack = vec![root.join("src"), root.join("tests")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    text.starts_with("//!"),
                    "{} does not open with `//!`",
                    path.display()
                );
            }
        }
    }
}
