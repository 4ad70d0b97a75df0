//! The configuration file the packages install (`packaging/operator.toml`, installed as
//! /etc/corral/operator.toml by `make install` and the .deb), read with the real parser: it
//! must load as shipped, name every setting the file format has, and each setting it shows
//! must be the default it claims to be (as the agent's `config/shipped.rs`).
//!
//! Settings are shown commented out as `#key = value` (a `#` right before the key), prose as
//! `# text`; uncommenting every setting must give the defaults, but for the settings without
//! one ([`NO_DEFAULT`]), which are examples.

use corral_cluster::daemon::shipped::{self, commented_setting, fields, key};

use super::*;

const SHIPPED: &str = include_str!("../../../../packaging/operator.toml");

/// The settings shown as examples because they have no default (uncommented, they turn
/// something on or name a file).
const NO_DEFAULT: &[&str] = &[
    "replica",
    "api_tcp",
    "token_file",
    "state_dir",
    "endpoints",
    "etcd_cacert",
    "etcd_cert",
    "etcd_key",
    "etcd_user",
    "etcd_password_file",
    "name = \"aws\"",
    "fake_cloud",
    "endpoint",
];

/// Whether the setting `line` is one of [`NO_DEFAULT`] (by key, or the whole line).
fn without_default(line: &str) -> bool {
    NO_DEFAULT
        .iter()
        .any(|entry| key(line) == Some(entry) || line == *entry)
}

/// The shipped file with its settings uncommented, but those `keep` says stay commented.
fn uncommented(keep: impl Fn(&str) -> bool) -> String {
    shipped::uncommented(SHIPPED, keep)
}

fn load(text: &str) -> OperatorFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    OperatorFile::load(file.path()).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn the_shipped_file_loads_as_the_defaults() {
    assert_eq!(load(SHIPPED).settings(), OperatorFile::default().settings());
}

#[test]
fn every_setting_shown_is_its_default() {
    let text = uncommented(without_default);
    assert_ne!(text, SHIPPED, "nothing was uncommented");
    assert!(
        text.contains("\n[cluster]\n") && text.contains("\n[log]\n"),
        "{text}"
    );
    assert_eq!(load(&text).settings(), OperatorFile::default().settings());
}

#[test]
fn the_settings_without_a_default_are_well_formed() {
    let text = uncommented(|_| false);
    let settings = load(&text).settings();
    assert!(
        settings.api_tcp.is_some()
            && settings.token_file.is_some()
            && !settings.endpoints().is_empty()
            && settings.cluster.etcd_password_file.is_some()
            && settings.cloud.is_some(),
        "{settings:?}"
    );
}

#[test]
fn every_setting_of_the_format_is_shown() {
    let shown: Vec<&str> = SHIPPED.lines().filter_map(commented_setting).collect();
    // Each table's settings follow its header.
    let shown_in = |table: &str, field: &str| {
        let mut current = "";
        shown.iter().any(|line| {
            if line.starts_with('[') {
                current = line.trim_matches(|c| c == '[' || c == ']');
                return current == field && table.is_empty();
            }
            current == table && key(line) == Some(field)
        })
    };
    let mut missing = Vec::new();
    for (table, names) in [
        ("", fields::<OperatorFile>()),
        ("cluster", fields::<ClusterTable>()),
        ("cloud", fields::<CloudTable>()),
        ("log", fields::<LogTable>()),
    ] {
        assert!(names.len() > 1, "{table}: {names:?}");
        missing.extend(
            names
                .iter()
                .filter(|name| !shown_in(table, name))
                .map(|name| format!("{table}.{name}")),
        );
    }
    assert!(
        missing.is_empty(),
        "packaging/operator.toml does not show {missing:?}"
    );
    for entry in NO_DEFAULT {
        assert!(
            shown
                .iter()
                .any(|line| key(line) == Some(entry) || line == entry),
            "{entry}"
        );
    }
}
