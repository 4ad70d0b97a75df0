//! Fuzz target: the query string of the agent's GET /v1/history (`corral_agent::fuzz::history_query`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_agent::fuzz::history_query(data));
