//! Fuzz target: AWS VPC CNI's ipamd checkpoint, as the agent imports it (`corral_agent::fuzz::ipamd_checkpoint`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_agent::fuzz::ipamd_checkpoint(data));
