//! What the repository-rule tests (`layers`, `tidy`) share: where the workspace is.

use std::path::{Path, PathBuf};

/// The workspace's root folder (this crate lives at `crates/corral-core`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/<name>")
        .to_path_buf()
}
