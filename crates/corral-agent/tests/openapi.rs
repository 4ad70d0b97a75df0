//! The committed `openapi.json` (served verbatim at `/openapi.json`) is the document the code
//! builds; it describes every path of `corral_api::paths`, exactly the methods the router
//! takes, and its references, links and examples hold. After a deliberate change to the
//! API, `UPDATE_EXPECT=1 cargo test -p corral-agent --test integration openapi::` rewrites the file.

use corral_agent::openapi::{document, render};
use corral_api::testing::{check_committed, dangling_references, path_constants, workspace_root};

#[test]
fn committed_openapi_json_is_the_generated_document() {
    let committed = check_committed(&workspace_root().join("openapi.json"), &render(&document()));
    assert_eq!(corral_agent::api::OPENAPI, committed);
}

/// The paths of `corral_api::paths`, read from its source.
fn registered_paths() -> Vec<(String, String)> {
    path_constants(include_str!("../../corral-api/src/lib.rs"))
}

#[test]
fn every_registered_path_is_documented() {
    let document = document();
    let documented = document["paths"].as_object().unwrap();
    let registered = registered_paths();
    assert!(registered.len() >= 20, "{registered:?}");
    // The constants themselves, to catch the parser drifting from the module.
    assert!(registered.contains(&(
        "ALLOCATE".to_owned(),
        corral_api::paths::ALLOCATE.to_owned()
    )));
    assert!(registered.contains(&(
        "CNI_STATUS".to_owned(),
        corral_api::paths::CNI_STATUS.to_owned()
    )));
    let missing: Vec<&(String, String)> = registered
        .iter()
        .filter(|(_, path)| !documented.contains_key(path.as_str()))
        .collect();
    assert!(missing.is_empty(), "not in the document: {missing:?}");
    let extra: Vec<&String> = documented
        .keys()
        .filter(|path| !registered.iter().any(|(_, p)| p == *path))
        .collect();
    assert!(
        extra.is_empty(),
        "documented but not in corral_api::paths: {extra:?}"
    );
}

#[test]
fn every_referenced_component_exists() {
    let missing = dangling_references(&document());
    assert!(missing.is_empty(), "dangling references: {missing:?}");
}

#[test]
fn every_link_names_an_operation() {
    let document = document();
    let operations: Vec<&serde_json::Value> = document["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .collect();
    let ids: Vec<&str> = operations
        .iter()
        .map(|op| op["operationId"].as_str().unwrap())
        .collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "operation ids are unique: {ids:?}");
    let mut n_links = 0;
    for op in &operations {
        for response in op["responses"].as_object().unwrap().values() {
            for (name, link) in response["links"].as_object().into_iter().flatten() {
                n_links += 1;
                let target = link["operationId"].as_str().unwrap();
                assert!(
                    ids.contains(&target),
                    "link {name} to unknown operation {target}"
                );
            }
        }
    }
    assert!(n_links > 0);
}

/// Every example a schema gives parses as its type: the examples are what schemathesis
/// starts from, and what a reader copies.
#[test]
fn every_schema_example_parses_as_its_type() {
    fn parses<T: serde::de::DeserializeOwned>(example: &serde_json::Value) -> Result<(), String> {
        serde_json::from_value::<T>(example.clone())
            .map(drop)
            .map_err(|e| e.to_string())
    }
    macro_rules! check {
        ($name:expr, $example:expr, $($type:ident),* $(,)?) => {
            match $name {
                $(stringify!($type) => parses::<corral_api::$type>($example),)*
                other => Err(format!("no type listed for schema {other}")),
            }
        };
    }
    let document = document();
    let mut n_examples = 0;
    let mut failures = Vec::new();
    for (name, schema) in document["components"]["schemas"].as_object().unwrap() {
        for example in schema["examples"].as_array().into_iter().flatten() {
            n_examples += 1;
            let result = check!(
                name.as_str(),
                example,
                AttachmentKey,
                AllocateRequest,
                ReleaseRequest,
                LeaseStartRequest,
                LeaseStopRequest,
                RangeRequest,
                ExclusionRequest,
                ReserveLocalRoutesRequest,
                CniNetwork,
                CniAddRequest,
                CniKeyRequest,
                CniGcRequest,
                CniStatusRequest,
                GcRequest,
                InterfaceRequest,
                InterfaceAddressRequest,
                IpamdImportRequest,
            );
            if let Err(error) = result {
                failures.push(format!("{name}: {example}: {error}"));
            }
        }
    }
    assert!(n_examples >= 10, "{n_examples} examples");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every documented operation is routed: the real agent answers it with neither the
/// fallback's 404 ("no such path") nor 405, and answers every other method on a documented
/// path with 405.
#[test]
fn every_documented_operation_is_routed() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let agent = corral_agent::Running::start(corral_agent::AgentConfig::in_dir(dir.path()))
        .expect("the agent starts");
    let request = |method: &str, path: &str| -> (u16, String) {
        let mut stream = UnixStream::connect(&socket).unwrap();
        // An empty object: a 400 for most bodies, but routed.
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        (status, response)
    };
    let document = document();
    let mut wrong = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        let item = item.as_object().unwrap();
        for method in ["get", "post", "put", "delete", "patch"] {
            let (status, response) = request(&method.to_ascii_uppercase(), path);
            let documented = item.contains_key(method);
            let routed = status != 405 && !response.contains("no such path");
            if documented != routed {
                wrong.push(format!(
                    "{method} {path}: documented {documented}, got {status}"
                ));
            }
        }
    }
    agent.stop().unwrap();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
