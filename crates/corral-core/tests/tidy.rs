//! Repository rules that keep the architecture honest: the core's dependency list and file docs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/<name>")
        .to_path_buf()
}

/// corral-core does no I/O: it must never depend (even indirectly) on a runtime, a database,
/// an HTTP stack or an etcd client.
#[test]
fn core_pulls_in_no_io_crates() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "tree",
            "-p",
            "corral-core",
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
        tree.contains("corral-core"),
        "unexpected cargo tree output: {tree}"
    );
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split(' ').next())
        .collect();
    for forbidden in [
        "tokio",
        "rusqlite",
        "hyper",
        "etcd-client",
        "reqwest",
        "axum",
        "mio",
        "libc",
    ] {
        assert!(
            !crates.contains(&forbidden),
            "corral-core depends on {forbidden}:\n{tree}"
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
