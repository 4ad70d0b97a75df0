//! Replays the committed inputs of corral-client's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    client_response => corral_client::fuzz::response,
}
