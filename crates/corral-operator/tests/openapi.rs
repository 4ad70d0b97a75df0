//! The committed `openapi-operator.json` (served verbatim at `/openapi.json`) is the document
//! the code builds, it describes exactly the paths of `corral_api::operator::paths`, and its
//! references hold. After a deliberate change to the API,
//! `UPDATE_EXPECT=1 cargo test -p corral-operator --test openapi` rewrites the file.

use std::path::PathBuf;

use corral_operator::openapi::{document, render};

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../openapi-operator.json")
}

#[test]
fn committed_openapi_operator_json_is_the_generated_document() {
    let committed = corral_api::openapi::check_committed(&committed_path(), &render(&document()));
    assert_eq!(corral_operator::api::OPENAPI, committed);
}

/// The paths of `corral_api::operator::paths`, read from its source: a module's constants
/// cannot be listed at run time, and a path added there must not be missed here.
fn registered_paths() -> Vec<String> {
    let source = include_str!("../../corral-api/src/operator.rs");
    let start = source.find("pub mod paths {").expect("a paths module");
    let end = start + source[start..].find("\n}").expect("the module ends");
    let paths: Vec<String> = source[start..end]
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (_, rest) = rest.split_once(": &str = \"")?;
            Some(rest.strip_suffix("\";")?.to_owned())
        })
        .collect();
    assert_eq!(
        paths.len(),
        source[start..end].matches("pub const ").count()
    );
    paths
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
    let document = document();
    let text = document.to_string();
    let mut missing = Vec::new();
    for (kind, prefix) in [
        ("schemas", "#/components/schemas/"),
        ("responses", "#/components/responses/"),
    ] {
        for piece in text.split(prefix).skip(1) {
            let name = &piece[..piece.find('"').unwrap()];
            if document["components"][kind].get(name).is_none() {
                missing.push(format!("{prefix}{name}"));
            }
        }
    }
    assert!(missing.is_empty(), "dangling references: {missing:?}");
}
