//! Fuzz target: corral-ipam's environment (CNI_COMMAND, CNI_ARGS, ...) and stdin together (`corral_cni::fuzz::invocation`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cni::fuzz::invocation(data));
