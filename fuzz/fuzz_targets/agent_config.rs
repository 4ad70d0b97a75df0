//! Fuzz target: the agent's TOML configuration file (`corral_agent::fuzz::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_agent::fuzz::config(data));
