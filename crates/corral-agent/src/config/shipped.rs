//! The configuration file the packages install (`packaging/agent.toml`, installed as
//! /etc/corral/agent.toml by `make install` and the .deb), read with the real parser: it must
//! load as shipped, name every setting the file format has, and each setting it shows must be
//! the default it claims to be.
//!
//! Settings are shown commented out as `#key = value` (a `#` right before the key), prose as
//! `# text`; uncommenting every setting must give the defaults, but for the settings without
//! one ([`NO_DEFAULT`]), which are examples.

use corral_cluster::daemon::shipped::{self, commented_setting, fields, key};

use super::*;

const SHIPPED: &str = include_str!("../../../../packaging/agent.toml");

/// The settings shown as examples because they have no default (uncommented, they turn
/// something on).
const NO_DEFAULT: &[&str] = &[
    "tcp",
    "endpoints",
    "token_file",
    "socket_group",
    "etcd_cacert",
    "etcd_cert",
    "etcd_key",
    "etcd_user",
    "etcd_password_file",
];

/// The shipped file with its settings uncommented, but those `keep` says stay commented.
fn uncommented(keep: impl Fn(&str) -> bool) -> String {
    shipped::uncommented(SHIPPED, |setting| key(setting).is_some_and(&keep))
}

fn load(text: &str) -> AgentConfig {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    AgentConfig::load(&Overrides {
        config: Some(file.path().into()),
        ..Overrides::default()
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn the_shipped_file_loads_as_the_defaults() {
    assert_eq!(
        load(SHIPPED),
        AgentConfig::load(&Overrides::default()).unwrap()
    );
}

#[test]
fn every_setting_shown_is_its_default() {
    let text = uncommented(|key| NO_DEFAULT.contains(&key));
    assert_ne!(text, SHIPPED, "nothing was uncommented");
    assert_eq!(
        load(&text),
        AgentConfig::load(&Overrides::default()).unwrap()
    );
}

#[test]
fn the_settings_without_a_default_are_well_formed() {
    let text = uncommented(|_| false);
    let file: ConfigFile = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(file.tcp.is_some() && file.token_file.is_some(), "{file:?}");
}

#[test]
fn every_setting_of_the_format_is_shown() {
    let shown: Vec<&str> = SHIPPED.lines().filter_map(commented_setting).collect();
    let shown_as = |field: &str| {
        shown.iter().any(|line| {
            key(line) == Some(field)
                || *line == format!("[{field}]")
                || *line == format!("[[{field}]]")
        })
    };
    let mut missing = Vec::new();
    for (table, names) in [
        ("", fields::<ConfigFile>()),
        ("connections.", fields::<ConnectionsFile>()),
        ("log.", fields::<LogTable>()),
        ("cluster.", fields::<ClusterTable>()),
        ("pools.", fields::<PoolFile>()),
    ] {
        assert!(names.len() > 1, "{table}: {names:?}");
        missing.extend(
            names
                .iter()
                .filter(|name| !shown_as(name))
                .map(|name| format!("{table}{name}")),
        );
    }
    // An exclusion's fields are shown in the prose's example (the default has none).
    missing.extend(
        fields::<ExclusionFile>()
            .into_iter()
            .filter(|name| !SHIPPED.contains(&format!("{name} = ")))
            .map(|name| format!("exclusions.{name}")),
    );
    assert!(
        missing.is_empty(),
        "packaging/agent.toml does not show {missing:?}"
    );
    for key in NO_DEFAULT {
        assert!(shown_as(key), "{key}");
    }
}
