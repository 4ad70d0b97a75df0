//! Fuzz target: a pending-DEL record of corral-ipam (corral.pending/) (`corral_store::fuzz::pending_del`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_store::fuzz::pending_del(data));
