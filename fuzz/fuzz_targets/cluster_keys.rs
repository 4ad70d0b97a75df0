//! Fuzz target: an etcd key under a cluster's prefix (`corral_cluster::fuzz::cluster_keys`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cluster::fuzz::cluster_keys(data));
