//! The committed `openapi-operator.json` (served verbatim at `/openapi.json`) is the document
//! the code builds, it describes exactly the paths of `corral_api::operator::paths`, and its
//! references hold. After a deliberate change to the API,
//! `UPDATE_EXPECT=1 cargo test -p corral-operator --test integration openapi::` rewrites the file.

use corral_api::testing::{check_committed, dangling_references, path_constants, workspace_root};
use corral_operator::openapi::{document, render};

#[test]
fn committed_openapi_operator_json_is_the_generated_document() {
    let committed = check_committed(
        &workspace_root().join("openapi-operator.json"),
        &render(&document()),
    );
    assert_eq!(corral_operator::api::OPENAPI, committed);
}

/// The paths of `corral_api::operator::paths`, read from its source.
fn registered_paths() -> Vec<String> {
    path_constants(include_str!("../../corral-api/src/operator.rs"))
        .into_iter()
        .map(|(_, path)| path)
        .collect()
}

#[test]
fn every_registered_path_is_documented_and_nothing_else() {
    let document = document();
    let mut documented: Vec<String> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut registered = registered_paths();
    assert!(registered.contains(&corral_api::operator::paths::GRANTS.to_owned()));
    documented.sort();
    registered.sort();
    assert_eq!(documented, registered);
}

#[test]
fn every_referenced_component_exists() {
    let missing = dangling_references(&document());
    assert!(missing.is_empty(), "dangling references: {missing:?}");
}
