//! Replays the committed inputs of corral-operator's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    operator_history_query => corral_operator::fuzz::history_query,
    operator_config => corral_operator::fuzz::config,
}
