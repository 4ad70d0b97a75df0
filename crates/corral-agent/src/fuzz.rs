//! Entry points for the agent's fuzz targets (`fuzz/fuzz_targets/`: `agent_config`,
//! `agent_api`, `agent_history_query`, `ipamd_checkpoint`, `agent_records`) and their corpus
//! replay (`tests/fuzz_corpus.rs`): each takes arbitrary bytes, runs them through what the
//! agent does with such input at its edge, and panics only when an invariant breaks.

use std::collections::HashSet;
use std::fmt::Debug;

use axum::Json;
use axum::extract::Query;
use axum::http::Uri;
use corral_api as api;
use corral_core::Family;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{HistoryParams, JsonObject, json_rejection};
use crate::config::{ConfigFile, connection_limits, default_pools, parse_duration, pools};
use crate::error::OpError;
use crate::node;

/// The agent's TOML configuration file, checked as `AgentConfig::load` checks it (pools,
/// `[connections]`, `history_max_age`); reading files (`token_file`) is left out.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = ConfigFile::parse(text) else {
        return;
    };
    let declared = file.pools.unwrap_or_else(default_pools);
    if let Ok(scope) = pools(&declared) {
        assert_eq!(scope.pools.len(), declared.len(), "a declared pool lost");
    }
    let _ = connection_limits(&file.connections.unwrap_or_default());
    if let Some(age) = &file.history_max_age {
        let _ = parse_duration(age);
    }
}

/// A request body of the agent's API, read as its handler reads it: the first byte chooses the
/// route, the rest is the body (JSON that must be an object), then checked into the node
/// state's request as the handler checks it. A body that reads prints JSON that reads the same.
pub fn api_body(data: &[u8]) {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    match route % 16 {
        0 => checked::<api::AllocateRequest, node::Allocate>(body),
        1 => checked::<api::ReleaseRequest, node::Release>(body),
        2 => checked::<api::CniAddRequest, node::CniAdd>(body),
        3 => checked::<api::CniKeyRequest, node::CniDel>(body),
        4 => checked::<api::CniKeyRequest, node::CniCheck>(body),
        5 => checked::<api::CniStatusRequest, node::CniStatus>(body),
        6 => checked::<api::CniGcRequest, node::CniGc>(body),
        7 => checked::<api::GcRequest, node::Gc>(body),
        8 => checked::<api::LeaseStopRequest, node::LeaseStop>(body),
        9 => checked::<api::RangeRequest, node::PoolRange>(body),
        10 => checked::<api::ExclusionRequest, node::AddExclusion>(body),
        11 => checked::<api::ExclusionRequest, node::RemoveExclusion>(body),
        12 => checked::<api::InterfaceRequest, node::AddInterface>(body),
        13 => checked::<api::IpamdImportRequest, node::ImportIpamd>(body),
        14 => {
            if let Some(request) = read::<api::LeaseStartRequest>(body) {
                let _ = node::LeaseStart::from(request);
            }
        }
        _ => {
            if let Some(request) = read::<api::ReserveLocalRoutesRequest>(body) {
                let _ = crate::local_routes::check_scope(&request.scope);
            }
            // The checkpoint's body is any JSON object, read into the checkpoint after: its
            // numbers may be floats, which serde_json does not promise to print back exactly.
            if let Ok(Json(JsonObject(request))) =
                Json::<JsonObject<serde_json::Value>>::from_bytes(body)
            {
                let _ = serde_json::from_value::<corral_store::Checkpoint>(request);
            }
        }
    }
}

/// Reads `body` as the handler's `Body<T>` does; a body that reads prints JSON that reads the
/// same.
fn read<T: DeserializeOwned + Serialize + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    match Json::<JsonObject<T>>::from_bytes(body) {
        Ok(Json(JsonObject(value))) => {
            let printed = serde_json::to_vec(&value).expect("a read body prints");
            let again = serde_json::from_slice::<T>(&printed).unwrap_or_else(|e| {
                panic!(
                    "a printed body does not read: {e}: {}",
                    String::from_utf8_lossy(&printed)
                )
            });
            assert_eq!(value, again);
            Some(value)
        }
        Err(rejection) => {
            let message = json_rejection(rejection).0.0.message;
            assert!(
                message.chars().count() <= 515,
                "a rejection of {} characters",
                message.chars().count()
            );
            None
        }
    }
}

fn checked<T, R>(body: &[u8])
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
    R: TryFrom<T, Error = OpError>,
{
    if let Some(request) = read::<T>(body)
        && let Err(error) = R::try_from(request)
    {
        assert!(!error.message.is_empty(), "a refusal without a message");
    }
}

/// The query string of `GET /v1/history`, read as axum reads it and checked as the handler
/// checks it.
pub fn history_query(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(uri) = format!("/v1/history?{query}").parse::<Uri>() else {
        return;
    };
    if let Ok(Query(params)) = Query::<HistoryParams>::try_from_uri(&uri) {
        let _ = node::History::try_from(params);
    }
}

/// AWS VPC CNI's ipamd checkpoint: what reads has one or two addresses per pod (one per
/// family), and no address or key twice.
pub fn ipamd_checkpoint(data: &[u8]) {
    let Ok(document) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(allocations) = crate::ipamd::parse_checkpoint(&document) else {
        return;
    };
    let mut addresses = HashSet::new();
    let mut keys = HashSet::new();
    for allocation in &allocations {
        assert!(
            matches!(allocation.addresses.len(), 1 | 2),
            "{allocation:?}"
        );
        if let [a, b] = allocation.addresses[..] {
            assert_ne!(Family::of(a), Family::of(b), "{allocation:?}");
        }
        for address in &allocation.addresses {
            assert!(addresses.insert(*address), "{address} twice");
        }
        assert!(
            keys.insert(allocation.key.clone()),
            "{} twice",
            allocation.key
        );
        assert!(!allocation.owner.is_empty());
    }
}

/// etcd's keys and values under the node's prefixes, as the agent's cluster link reads them
/// (see `link/fuzz.rs`).
pub fn records(data: &[u8]) {
    crate::link::fuzz_records(data);
}
