//! Fuzz target: the network configuration on corral-ipam's stdin (`corral_cni::fuzz::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cni::fuzz::config(data));
