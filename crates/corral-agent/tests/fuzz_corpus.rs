//! Replays the committed inputs of corral-agent's fuzz targets (`fuzz/corpus/<target>/`, and the
//! crashes found and fixed, `fuzz/regressions/<target>/`) through the same functions the
//! targets call, on stable Rust: a parser change that panics on a known input fails here,
//! without nightly or cargo-fuzz.

replay_tests! {
    agent_config => corral_agent::fuzz::config,
    agent_api => corral_agent::fuzz::api_body,
    agent_history_query => corral_agent::fuzz::history_query,
    agent_records => corral_agent::fuzz::records,
    ipamd_checkpoint => corral_agent::fuzz::ipamd_checkpoint,
}
