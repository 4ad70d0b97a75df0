//! Fuzz target: the operator's TOML configuration file (`corral_operator::fuzz::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_operator::fuzz::config(data));
