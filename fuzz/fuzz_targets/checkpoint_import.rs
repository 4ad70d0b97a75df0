//! Fuzz target: a checkpoint document imported into a store (`corral_store::fuzz::checkpoint_import`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_store::fuzz::checkpoint_import(data));
