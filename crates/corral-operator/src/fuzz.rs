//! Entry point for the fuzz target `operator_history_query` (`fuzz/fuzz_targets/`) and its
//! corpus replay (`tests/fuzz_corpus.rs`): the query string of the operator's only route that
//! takes one, `GET /v1/history`, read as axum reads it and checked as the handler checks it.
//! (The operator's configuration and etcd records are `corral_cluster::fuzz`'s.)

use axum::extract::Query;
use axum::http::Uri;
use corral_api::history::{format_time, parse_time};

use crate::api::{HistoryParams, history_request};

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
