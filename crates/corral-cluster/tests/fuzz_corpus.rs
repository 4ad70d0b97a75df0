//! Replays the committed inputs of corral-cluster's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    cluster_config => corral_cluster::fuzz::cluster_config,
    cluster_keys => corral_cluster::fuzz::cluster_keys,
    cluster_records => corral_cluster::fuzz::cluster_records,
    epoch_file => corral_cluster::fuzz::epoch_file,
}
