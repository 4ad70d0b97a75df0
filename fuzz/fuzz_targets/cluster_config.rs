//! Fuzz target: the cluster configuration (TOML file, stored JSON) (`corral_cluster::fuzz::cluster_config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cluster::fuzz::cluster_config(data));
