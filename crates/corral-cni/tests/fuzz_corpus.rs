//! Replays the committed inputs of corral-cni's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn cni_config() {
    replay::replay("cni_config", corral_cni::fuzz::config);
}

#[test]
fn cni_invocation() {
    replay::replay("cni_invocation", corral_cni::fuzz::invocation);
}

#[test]
fn every_fuzz_target_is_replayed() {
    replay::every_target_is_replayed();
}
