//! Fuzz target: the operator's etcd-epoch file (`corral_cluster::fuzz::epoch_file`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cluster::fuzz::epoch_file(data));
