//! Fuzz target: the query string of the operator's GET /v1/history (`corral_operator::fuzz::history_query`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_operator::fuzz::history_query(data));
