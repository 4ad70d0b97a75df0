//! Fuzz target: host-local's data directory, as corral-ipam and the agent import it (`corral_store::fuzz::host_local`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_store::fuzz::host_local(data));
