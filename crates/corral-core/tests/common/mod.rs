//! What corral-core's property tests share: how many cases a run tries.

use proptest::prelude::ProptestConfig;

/// `cases` unless `PROPTEST_CASES` asks for another number (for long runs).
pub fn proptest_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // Failures print their minimal input; do not write regression files into the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
