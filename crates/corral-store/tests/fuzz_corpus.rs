//! Replays the committed inputs of corral-store's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    checkpoint_import => corral_store::fuzz::checkpoint_import,
    host_local => corral_store::fuzz::host_local,
    pending_del => corral_store::fuzz::pending_del,
}
