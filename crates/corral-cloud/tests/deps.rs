//! corral-cloud stays light: no AWS SDK (that is corral-aws, which nothing else links), no HTTP
//! stack, no database, and of tokio only the clock and sync.

use std::path::Path;
use std::process::Command;

#[test]
fn cloud_pulls_in_no_sdk_http_or_store() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap();
    let output = Command::new(cargo)
        .current_dir(root)
        .args([
            "tree",
            "-p",
            "corral-cloud",
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
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(crates.contains(&"corral-cloud"), "{tree}");
    assert!(crates.contains(&"rand_distr"), "{tree}");
    for name in &crates {
        assert!(
            !name.starts_with("aws-") && !name.starts_with("corral-aws"),
            "corral-cloud depends on {name}"
        );
        for forbidden in ["hyper", "reqwest", "rusqlite", "etcd-client", "mio", "axum"] {
            assert_ne!(*name, forbidden, "corral-cloud depends on {forbidden}");
        }
    }
}
