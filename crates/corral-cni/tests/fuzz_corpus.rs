//! Replays the committed inputs of corral-cni's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    cni_config => corral_cni::fuzz::config,
    cni_invocation => corral_cni::fuzz::invocation,
}
