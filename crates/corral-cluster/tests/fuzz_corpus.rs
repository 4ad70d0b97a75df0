//! Replays the committed inputs of corral-cluster's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn cluster_config() {
    replay::replay("cluster_config", corral_cluster::fuzz::cluster_config);
}

#[test]
fn cluster_keys() {
    replay::replay("cluster_keys", corral_cluster::fuzz::cluster_keys);
}

#[test]
fn cluster_records() {
    replay::replay("cluster_records", corral_cluster::fuzz::cluster_records);
}

#[test]
fn epoch_file() {
    replay::replay("epoch_file", corral_cluster::fuzz::epoch_file);
}

#[test]
fn every_fuzz_target_is_replayed() {
    replay::every_target_is_replayed();
}
