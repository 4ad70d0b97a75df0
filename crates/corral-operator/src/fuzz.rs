//! Entry points for the fuzz targets `operator_history_query` and `operator_config`
//! (`fuzz/fuzz_targets/`) and their corpus replay (`tests/fuzz_corpus.rs`): the query string
//! of the operator's only route that takes one, `GET /v1/history`, read as axum reads it and
//! checked as the handler checks it; the operator's own configuration file (`config.rs`).
//! (The cluster's configuration and etcd records are `corral_cluster::fuzz`'s.)

use axum::extract::Query;
use axum::http::Uri;
use corral_api::history::{format_time, parse_time};

use crate::api::{HistoryParams, history_request};
use crate::config::OperatorFile;

/// The first millisecond of the year 10000, which RFC 3339's four-digit years cannot write.
const YEAR_10000_MS: u64 = 253_402_300_800_000;

/// The query string; a time that reads prints (RFC 3339) and reads back the same.
pub fn history_query(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    for part in query.split('&') {
        if let Some(("at", value)) = part.split_once('=')
            && let Ok(ms) = parse_time(value)
            && ms < YEAR_10000_MS
        {
            let printed = format_time(ms);
            assert_eq!(
                parse_time(&printed),
                Ok(ms),
                "{value:?} printed as {printed:?}"
            );
        }
    }
    let Ok(uri) = format!("/v1/history?{query}").parse::<Uri>() else {
        return;
    };
    if let Ok(Query(params)) = Query::<HistoryParams>::try_from_uri(&uri) {
        let _ = history_request(params);
    }
}

/// The operator's TOML configuration file, parsed and checked as `OperatorFile::load` does
/// (reading files is left out). A file that passes gives settings the operator can use, and
/// layering it under an empty command line changes nothing.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = OperatorFile::parse(text) else {
        return;
    };
    if file.check().is_err() {
        return;
    }
    let settings = file.clone().settings();
    assert_eq!(OperatorFile::default().over(file).settings(), settings);
    assert!(settings.workers >= 1, "{settings:?}");
    assert!(
        (1..=corral_cluster::MAX_LEASE_TTL_SECS).contains(&settings.lease_ttl.as_secs()),
        "{settings:?}"
    );
    assert!(
        settings.api_tcp.is_none_or(|addr| addr.ip().is_loopback()),
        "{settings:?}"
    );
    assert!(
        corral_cluster::ClusterName::new(settings.cluster_name()).is_ok(),
        "{settings:?}"
    );
}
