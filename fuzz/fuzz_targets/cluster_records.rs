//! Fuzz target: etcd's records, as the operator's view and `corral cluster check` read them (`corral_cluster::fuzz::cluster_records`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cluster::fuzz::cluster_records(data));
