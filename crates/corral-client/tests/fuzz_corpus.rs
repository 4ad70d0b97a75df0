//! Replays the committed inputs of corral-client's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn client_response() {
    replay::replay("client_response", corral_client::fuzz::response);
}

#[test]
fn every_fuzz_target_is_replayed() {
    replay::every_target_is_replayed();
}
