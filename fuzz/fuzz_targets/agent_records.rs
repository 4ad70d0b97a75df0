//! Fuzz target: etcd's records of a node, as the agent's cluster link reads them (`corral_agent::fuzz::records`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_agent::fuzz::records(data));
