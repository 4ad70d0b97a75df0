//! Fuzz target: what the agent answers, as corral-client reads it (`corral_client::fuzz::response`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_client::fuzz::response(data));
