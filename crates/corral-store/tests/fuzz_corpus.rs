//! Replays the committed inputs of corral-store's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn checkpoint_import() {
    replay::replay("checkpoint_import", corral_store::fuzz::checkpoint_import);
}

#[test]
fn host_local() {
    replay::replay("host_local", corral_store::fuzz::host_local);
}

#[test]
fn pending_del() {
    replay::replay("pending_del", corral_store::fuzz::pending_del);
}

#[test]
fn every_fuzz_target_is_replayed() {
    replay::every_target_is_replayed();
}
