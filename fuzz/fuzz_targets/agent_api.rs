//! Fuzz target: a request body of the agent's REST API, read and checked at its edge (`corral_agent::fuzz::api_body`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_agent::fuzz::api_body(data));
