//! Replays the committed inputs of corral-agent's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

#[path = "../../../fuzz/replay.rs"]
mod replay;

#[test]
fn agent_config() {
    replay::replay("agent_config", corral_agent::fuzz::config);
}

#[test]
fn agent_api() {
    replay::replay("agent_api", corral_agent::fuzz::api_body);
}

#[test]
fn agent_history_query() {
    replay::replay("agent_history_query", corral_agent::fuzz::history_query);
}

#[test]
fn agent_records() {
    replay::replay("agent_records", corral_agent::fuzz::records);
}

#[test]
fn ipamd_checkpoint() {
    replay::replay("ipamd_checkpoint", corral_agent::fuzz::ipamd_checkpoint);
}

#[test]
fn every_fuzz_target_is_replayed() {
    replay::every_target_is_replayed();
}
