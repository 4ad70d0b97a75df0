//! The CNI protocol as a runtime sees it: environment and stdin in, typed requests or the
//! exact error JSON out, and results in each spec version's format.

use std::net::IpAddr;

use corral_cni::{
    CniError, CniVersion, Command, Dns, Invocation, IpConfig, IpamResult, Route, parse_config,
    parse_env, parse_invocation, parse_prev_result, reply_version, version_json,
};
use corral_core::{AllocError, AttachmentKey, Family, Holder, IpNet, PoolName, SpecError};

const ADD: &[(&str, &str)] = &[
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "c1"),
    ("CNI_NETNS", "/run/netns/c1"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/opt/cni/bin"),
];

/// The environment of `command` for container c1 on eth0.
fn env(command: &str) -> Vec<(&'static str, String)> {
    let mut vars: Vec<(&'static str, String)> = ADD
        .iter()
        .filter(|(name, _)| *name != "CNI_COMMAND")
        .map(|&(name, value)| (name, value.to_owned()))
        .collect();
    vars.push(("CNI_COMMAND", command.to_owned()));
    vars
}

/// A network config of `version` named `net` with the given `ipam` body.
fn conf(version: &str, ipam: &str) -> String {
    format!(r#"{{"cniVersion":"{version}","name":"net","type":"bridge","ipam":{ipam}}}"#)
}

/// The one helper that runs an invocation: the request, or the error JSON a runtime reads.
fn invoke(vars: &[(&str, String)], stdin: &str) -> Result<Invocation, String> {
    parse_invocation(vars.iter().map(|(k, v)| (*k, v.as_str())), stdin.as_bytes())
        .map_err(|err| err.to_json(reply_version(stdin.as_bytes())))
}

fn add(stdin: &str) -> corral_cni::Attachment {
    match invoke(&env("ADD"), stdin) {
        Ok(Invocation::Add(add)) => add,
        other => panic!("expected an ADD, got {other:?}"),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// The ranges of each set in canonical text, and each set's pool.
fn sets_text(config: &corral_cni::NetConfig) -> Vec<(String, Vec<String>)> {
    config
        .ipam
        .range_sets
        .iter()
        .map(|set| {
            (
                set.pool.to_string(),
                set.ranges.iter().map(ToString::to_string).collect(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// host-local configurations

#[test]
fn host_local_readme_ranges_example() {
    let stdin = r#"{
        "cniVersion": "0.3.1",
        "name": "examplenet",
        "ipam": {
            "type": "host-local",
            "ranges": [
                [
                    {
                        "subnet": "10.10.0.0/16",
                        "rangeStart": "10.10.1.20",
                        "rangeEnd": "10.10.3.50",
                        "gateway": "10.10.0.254"
                    },
                    {
                        "subnet": "172.16.5.0/24"
                    }
                ],
                [
                    {
                        "subnet": "3ffe:ffff:0:01ff::/64",
                        "rangeStart": "3ffe:ffff:0:01ff::0010",
                        "rangeEnd": "3ffe:ffff:0:01ff::0020"
                    }
                ]
            ],
            "routes": [
                { "dst": "0.0.0.0/0" },
                { "dst": "192.168.0.0/16", "gw": "10.10.5.1" },
                { "dst": "3ffe:ffff:0:01ff::1/64" }
            ],
            "dataDir": "/run/my-orchestrator/container-ipam-state"
        }
    }"#;
    let add = add(stdin);
    let config = &add.config;
    assert_eq!(config.cni_version, CniVersion::V0_3_1);
    assert_eq!(config.name, "examplenet");
    assert_eq!(config.ipam.plugin_type.as_deref(), Some("host-local"));
    assert_eq!(
        sets_text(config),
        [
            (
                "examplenet".to_owned(),
                vec![
                    "10.10.0.0/16,range=10.10.1.20-10.10.3.50,gateway=10.10.0.254".to_owned(),
                    "172.16.5.0/24,gateway=172.16.5.1".to_owned(),
                ]
            ),
            (
                "examplenet".to_owned(),
                vec!["3ffe:ffff:0:1ff::/64,range=3ffe:ffff:0:1ff::10-3ffe:ffff:0:1ff::20,gateway=3ffe:ffff:0:1ff::1".to_owned()]
            ),
        ]
    );
    assert_eq!(config.ipam.range_sets[0].family, Family::V4);
    assert_eq!(config.ipam.range_sets[1].family, Family::V6);
    assert_eq!(
        config.ipam.routes,
        [
            Route::new(net("0.0.0.0/0"), None),
            Route::new(net("192.168.0.0/16"), Some(ip("10.10.5.1"))),
            // Host bits in a route's destination are kept, as host-local keeps them.
            Route::new(net("3ffe:ffff:0:1ff::1/64"), None),
        ]
    );
    assert_eq!(
        config.ipam.data_dir.to_str(),
        Some("/run/my-orchestrator/container-ipam-state")
    );
    assert_eq!(config.ipam.resolv_conf, None);
    assert!(config.requested.is_empty());
}

#[test]
fn host_local_readme_legacy_single_range() {
    let stdin = r#"{
        "cniVersion": "0.4.0",
        "name": "legacy",
        "ipam": {
            "type": "host-local",
            "subnet": "3ffe:ffff:0:01ff::/64",
            "rangeStart": "3ffe:ffff:0:01ff::0010",
            "rangeEnd": "3ffe:ffff:0:01ff::0020",
            "routes": [
                { "dst": "3ffe:ffff:0:01ff::1/64" }
            ],
            "resolvConf": "/etc/resolv.conf"
        }
    }"#;
    let config = add(stdin).config;
    assert_eq!(
        sets_text(&config),
        [(
            "legacy".to_owned(),
            vec!["3ffe:ffff:0:1ff::/64,range=3ffe:ffff:0:1ff::10-3ffe:ffff:0:1ff::20,gateway=3ffe:ffff:0:1ff::1".to_owned()]
        )]
    );
    assert_eq!(config.ipam.range_sets[0].field, "ipam");
    assert_eq!(
        config.ipam.resolv_conf.as_deref().and_then(|p| p.to_str()),
        Some("/etc/resolv.conf")
    );
    assert_eq!(config.ipam.data_dir.to_str(), Some("/var/lib/cni/networks"));
}

#[test]
fn host_local_readme_command_line_example_renders_its_output() {
    // The README's example: two single-subnet range sets, answered in 0.3.1 with the first
    // usable address of each (the gateway, network + 1, is reserved).
    let stdin = r#"{ "cniVersion": "0.3.1", "name": "examplenet", "ipam": { "type": "host-local", "ranges": [ [{"subnet": "203.0.113.0/24"}], [{"subnet": "2001:db8:1::/64"}]], "dataDir": "/tmp/cni-example"  } }"#;
    let add = add(stdin);
    let sets = &add.config.ipam.range_sets;
    let result = IpamResult {
        ips: vec![
            sets[0].ip_config(ip("203.0.113.2")).unwrap(),
            sets[1].ip_config(ip("2001:db8:1::2")).unwrap(),
        ],
        routes: add.config.ipam.routes.clone(),
        dns: Dns::default(),
        cloud_interfaces: Vec::new(),
    };
    assert_eq!(
        result.to_json(add.config.cni_version),
        r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"203.0.113.2/24","gateway":"203.0.113.1"},{"version":"6","address":"2001:db8:1::2/64","gateway":"2001:db8:1::1"}],"dns":{}}"#
    );
    // The reserved gateway sits at the start of both ranges.
    assert_eq!(sets[0].ranges[0].start(), ip("203.0.113.1"));
    assert_eq!(sets[0].ranges[0].end(), ip("203.0.113.254"));
    assert_eq!(sets[0].ranges[0].size(), 253);
    assert_eq!(
        sets[1].ranges[0].end(),
        ip("2001:db8:1::ffff:ffff:ffff:ffff")
    );
}

#[test]
fn spec_bridge_example_with_host_local_ipam() {
    let stdin = r#"{
        "cniVersion": "1.0.0",
        "name": "dbnet",
        "type": "bridge",
        "bridge": "cni0",
        "keyA": ["some more", "plugin specific", "configuration"],
        "args": {"argA": "foo"},
        "ipam": {
            "type": "host-local",
            "subnet": "10.1.0.0/16",
            "gateway": "10.1.0.1"
        },
        "dns": {
            "nameservers": [ "10.1.0.1" ]
        }
    }"#;
    let add = add(stdin);
    assert_eq!(add.key, AttachmentKey::new("dbnet", "c1", "eth0").unwrap());
    assert_eq!(
        sets_text(&add.config),
        [(
            "dbnet".to_owned(),
            vec!["10.1.0.0/16,gateway=10.1.0.1".to_owned()]
        )]
    );
}

#[test]
fn gateways_default_like_host_local() {
    // (subnet and bounds as configured, gateway written or not) -> the canonical range.
    let cases = [
        (
            r#"{"subnet":"10.0.0.0/24"}"#,
            "10.0.0.0/24,gateway=10.0.0.1",
        ),
        (
            r#"{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100"}"#,
            "10.0.0.0/24,range=10.0.0.100-10.0.0.254,gateway=10.0.0.1",
        ),
        (
            r#"{"subnet":"10.0.0.0/24","gateway":"10.0.0.254"}"#,
            "10.0.0.0/24,gateway=10.0.0.254",
        ),
        (r#"{"subnet":"fd00::/120"}"#, "fd00::/120,gateway=fd00::1"),
        // Empty strings read as absent, as Go's decoder reads them.
        (
            r#"{"subnet":"10.0.0.0/24","rangeStart":"","rangeEnd":"","gateway":""}"#,
            "10.0.0.0/24,gateway=10.0.0.1",
        ),
        // Point-to-point subnets have no address to spare for a gateway.
        (r#"{"subnet":"10.0.0.8/31"}"#, "10.0.0.8/31"),
        (r#"{"subnet":"10.0.0.9/32"}"#, "10.0.0.9/32"),
        (r#"{"subnet":"fd00::8/127"}"#, "fd00::8/127"),
    ];
    for (range, expected) in cases {
        let config = add(&conf("1.0.0", &format!(r#"{{"ranges":[[{range}]]}}"#))).config;
        assert_eq!(
            config.ipam.range_sets[0].ranges[0].to_string(),
            expected,
            "{range}"
        );
    }
}

#[test]
fn runtime_ip_ranges_come_first_then_legacy_then_ranges() {
    let stdin = r#"{
        "cniVersion": "1.1.0",
        "name": "net",
        "runtimeConfig": {"ipRanges": [[{"subnet": "10.9.0.0/24"}]]},
        "ipam": {
            "subnet": "10.8.0.0/24",
            "ranges": [[{"subnet": "10.7.0.0/24"}], [{"subnet": "fd00::/64"}]],
            "pool": "blue"
        }
    }"#;
    let config = add(stdin).config;
    let fields: Vec<(&str, &str)> = config
        .ipam
        .range_sets
        .iter()
        .map(|set| (set.field.as_str(), set.pool.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("runtimeConfig.ipRanges[0]", "blue"),
            ("ipam", "blue-2"),
            ("ipam.ranges[0]", "blue-3"),
            ("ipam.ranges[1]", "blue"),
        ]
    );
}

#[test]
fn long_network_names_get_stable_short_pool_names() {
    let long = "n".repeat(200);
    let stdin = format!(
        r#"{{"cniVersion":"1.0.0","name":"{long}","ipam":{{"ranges":[[{{"subnet":"10.0.0.0/24"}}],[{{"subnet":"10.0.1.0/24"}}]]}}}}"#
    );
    let config = add(&stdin).config;
    let pools: Vec<&str> = config
        .ipam
        .range_sets
        .iter()
        .map(|set| set.pool.as_str())
        .collect();
    assert_eq!(pools[0].len(), 63);
    assert_eq!(pools[1].len(), 63);
    assert!(pools[0].starts_with(&"n".repeat(54)), "{}", pools[0]);
    assert!(pools[1].ends_with("-2"), "{}", pools[1]);
    assert_ne!(pools[0], pools[1]);
    // The same name always gives the same pool; a different long name another.
    assert_eq!(corral_cni::pool_name(&long, "").unwrap().as_str(), pools[0]);
    let other = format!("{}m", "n".repeat(199));
    assert_ne!(
        corral_cni::pool_name(&other, "").unwrap().as_str(),
        pools[0]
    );
    // Names that fit are used as they are.
    assert_eq!(
        corral_cni::pool_name("net", "-2").unwrap().as_str(),
        "net-2"
    );
    assert_eq!(corral_cni::pool_name("../x", "").unwrap_err().code, 7);
}

#[test]
fn corral_keys_are_read() {
    let stdin = conf(
        "1.1.0",
        r#"{
            "type": "corral-ipam",
            "ranges": [[{"subnet": "10.0.0.0/24"}]],
            "pool": "pods",
            "exclude": ["10.0.0.5", {"network": "10.0.0.16/28", "reason": "routers"}, {"network": "fd00::/120"}],
            "cooldownSeconds": 30,
            "dataDir": "/run/corral/agent.sock"
        }"#,
    );
    let config = add(&stdin).config;
    assert_eq!(config.ipam.pool, Some(PoolName::new("pods").unwrap()));
    assert_eq!(config.ipam.range_sets[0].pool.as_str(), "pods");
    let exclusions: Vec<(String, &str)> = config
        .ipam
        .exclude
        .iter()
        .map(|e| (e.network().to_string(), e.reason()))
        .collect();
    assert_eq!(
        exclusions,
        [
            ("10.0.0.5/32".to_owned(), "excluded in network config"),
            ("10.0.0.16/28".to_owned(), "routers"),
            ("fd00::/120".to_owned(), "excluded in network config"),
        ]
    );
    assert_eq!(config.ipam.cooldown_seconds, Some(30));
    assert_eq!(config.ipam.agent, None);
    assert_eq!(config.ipam.node_pool, None);
}

#[test]
fn requested_addresses_from_every_source_go_to_their_range_sets() {
    let stdin = r#"{
        "cniVersion": "1.0.0",
        "name": "net",
        "args": {"cni": {"ips": ["fd00::10"]}},
        "runtimeConfig": {"ips": ["10.0.1.7/24", "10.0.0.9"]},
        "ipam": {"ranges": [
            [{"subnet": "10.0.0.0/24"}],
            [{"subnet": "fd00::/64"}],
            [{"subnet": "10.0.1.0/24"}]
        ]}
    }"#;
    let mut vars = env("ADD");
    vars.push((
        "CNI_ARGS",
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0;IP=10.0.0.9".to_owned(),
    ));
    let Ok(Invocation::Add(add)) = invoke(&vars, stdin) else {
        panic!("ADD was refused");
    };
    assert_eq!(
        add.config.requested,
        [ip("10.0.0.9"), ip("fd00::10"), ip("10.0.1.7")]
    );
    let per_set: Vec<Option<IpAddr>> = add
        .config
        .ipam
        .range_sets
        .iter()
        .map(|set| set.requested)
        .collect();
    assert_eq!(
        per_set,
        [
            Some(ip("10.0.0.9")),
            Some(ip("fd00::10")),
            Some(ip("10.0.1.7"))
        ]
    );
    assert_eq!(add.owner(), "ns/web-0");
    assert_eq!(add.env.args.get("K8S_POD_NAME"), Some("web-0"));
}

#[test]
fn owner_falls_back_to_the_container_id() {
    assert_eq!(
        add(&conf("1.0.0", r#"{"subnet":"10.0.0.0/24"}"#)).owner(),
        "c1"
    );
}

#[test]
fn requested_addresses_are_only_read_by_add() {
    // DEL must release even when the request part of the config is broken.
    let stdin = r#"{"cniVersion":"1.0.0","name":"net","runtimeConfig":{"ips":["banana"]},
        "ipam":{"subnet":"10.0.0.0/24"}}"#;
    let Ok(Invocation::Del(del)) = invoke(&env("DEL"), stdin) else {
        panic!("DEL was refused");
    };
    assert!(del.config.requested.is_empty());
    assert!(invoke(&env("ADD"), stdin).is_err());
}

#[test]
fn gc_reads_both_attachment_keys() {
    let stdin = r#"{
        "cniVersion": "1.1.0",
        "name": "net",
        "ipam": {"subnet": "10.0.0.0/24"},
        "cni.dev/valid-attachments": [
            {"containerID": "a", "ifname": "eth0"},
            {"containerID": "b", "ifname": "net1"}
        ],
        "cni.dev/attachments": [
            {"containerID": "a", "ifname": "eth0"},
            {"containerID": "c", "ifname": "eth0"}
        ]
    }"#;
    let vars = [
        ("CNI_COMMAND", "GC".to_owned()),
        ("CNI_PATH", "/opt/cni/bin".to_owned()),
    ];
    let Ok(Invocation::Gc(config)) = invoke(&vars, stdin) else {
        panic!("GC was refused");
    };
    let keys: Vec<String> = config
        .valid_attachments
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(keys, ["net/a/eth0", "net/b/net1", "net/c/eth0"]);

    let empty = r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24"},
        "cni.dev/valid-attachments":[]}"#;
    let Ok(Invocation::Gc(config)) = invoke(&vars, empty) else {
        panic!("GC was refused");
    };
    assert!(config.valid_attachments.is_empty());
}

#[test]
fn status_and_version_need_no_attachment() {
    let stdin = conf("1.1.0", r#"{"subnet":"10.0.0.0/24"}"#);
    let status = invoke(&[("CNI_COMMAND", "STATUS".to_owned())], &stdin).unwrap();
    assert_eq!(status.command(), Command::Status);
    assert_eq!(status.cni_version(), CniVersion::V1_1_0);
    let version = invoke(&[("CNI_COMMAND", "VERSION".to_owned())], "not json").unwrap();
    assert_eq!(version, Invocation::Version);
    assert_eq!(version.cni_version(), CniVersion::V1_1_0);
}

#[test]
fn check_reads_the_previous_result() {
    // A bridge result in 0.4.0 format, as a runtime passes it to CHECK.
    let stdin = r#"{
        "cniVersion": "0.4.0",
        "name": "net",
        "ipam": {"subnet": "10.1.0.0/16"},
        "prevResult": {
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/c1"}],
            "ips": [
                {"version": "4", "interface": 2, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"version": "6", "address": "fd00::5/64"}
            ],
            "dns": {}
        }
    }"#;
    let Ok(Invocation::Check(check)) = invoke(&env("CHECK"), stdin) else {
        panic!("CHECK was refused");
    };
    let prev = check.config.prev_result.unwrap();
    assert_eq!(
        prev.ips,
        [
            IpConfig {
                address: net("10.1.0.5/16"),
                gateway: Some(ip("10.1.0.1")),
                interface: Some(2)
            },
            IpConfig::new(net("fd00::5/64"), None),
        ]
    );
    assert_eq!(
        prev.addresses().collect::<Vec<_>>(),
        [ip("10.1.0.5"), ip("fd00::5")]
    );
}

#[test]
fn check_without_a_previous_result_is_accepted() {
    let stdin = conf("1.0.0", r#"{"subnet":"10.0.0.0/24"}"#);
    let Ok(Invocation::Check(check)) = invoke(&env("CHECK"), &stdin) else {
        panic!("CHECK was refused");
    };
    assert_eq!(check.config.prev_result, None);
}

#[test]
fn previous_results_of_each_version_parse() {
    let cases = [
        (
            r#"{"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"}]}"#,
            Ok(vec![IpConfig::new(
                net("10.0.0.2/24"),
                Some(ip("10.0.0.1")),
            )]),
        ),
        (
            r#"{"cniVersion":"0.3.0","ips":[{"version":"6","address":"fd00::2/64"}]}"#,
            Ok(vec![IpConfig::new(net("fd00::2/64"), None)]),
        ),
        (r#"{"dns":{}}"#, Ok(vec![])),
        (
            r#"{"ips":[{"version":"4","address":"fd00::2/64"}]}"#,
            Err(r#"prevResult.ips[0].version: version "4" does not match address fd00::2/64"#),
        ),
        (
            r#"{"ips":[{"address":"10.0.0.2"}]}"#,
            Err(
                r#"prevResult.ips[0].address: "10.0.0.2" is not in cidr notation (such as 10.1.0.0/16)"#,
            ),
        ),
        (
            r#"{"ips":[{"gateway":"10.0.0.1"}]}"#,
            Err("prevResult.ips[0].address: missing"),
        ),
        (
            r#"{"ips":[{"address":"10.0.0.2/24","interface":-1}]}"#,
            Err("prevResult.ips[0].interface: expected a non-negative integer, found a number"),
        ),
        (
            r#"{"ips":{}}"#,
            Err("prevResult.ips: expected an array, found an object"),
        ),
        (
            r#"[]"#,
            Err("prevResult: expected an object, found an array"),
        ),
    ];
    for (json, expected) in cases {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let parsed = parse_prev_result("prevResult", &value)
            .map(|prev| prev.ips)
            .map_err(|err| err.msg);
        assert_eq!(parsed, expected.map_err(str::to_owned), "{json}");
    }
}

// ---------------------------------------------------------------------------------------
// Errors: every path, with the exact JSON a runtime reads

/// One refused invocation and the JSON a runtime reads on stdout.
struct ErrorCase {
    what: &'static str,
    vars: Vec<(&'static str, String)>,
    stdin: String,
    json: &'static str,
}

fn error_cases() -> Vec<ErrorCase> {
    let ok = conf("1.0.0", r#"{"subnet":"10.0.0.0/24"}"#);
    let ranges = |ranges: &str| conf("1.0.0", &format!(r#"{{"ranges":{ranges}}}"#));
    let with = |name: &'static str, value: &str| {
        let mut vars = env("ADD");
        vars.retain(|(n, _)| *n != name);
        vars.push((name, value.to_owned()));
        vars
    };
    let without = |names: &[&str]| {
        let mut vars = env("ADD");
        vars.retain(|(n, _)| !names.contains(n));
        vars
    };
    let gc = vec![
        ("CNI_COMMAND", "GC".to_owned()),
        ("CNI_PATH", "/opt/cni/bin".to_owned()),
    ];
    let cases = vec![
        // Environment (4).
        (
            "no command",
            without(&["CNI_COMMAND"]),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_COMMAND is not set","details":"expected ADD, DEL, CHECK, GC, STATUS or VERSION"}"#,
        ),
        (
            "unknown command",
            with("CNI_COMMAND", "add"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"unknown CNI_COMMAND \"add\"","details":"expected ADD, DEL, CHECK, GC, STATUS or VERSION"}"#,
        ),
        (
            "missing variables",
            without(&["CNI_NETNS", "CNI_IFNAME"]),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"ADD needs CNI_NETNS, CNI_IFNAME, which are not set"}"#,
        ),
        (
            "gc needs the plugin path",
            vec![("CNI_COMMAND", "GC".to_owned())],
            conf("1.1.0", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"1.1.0","code":4,"msg":"GC needs CNI_PATH, which is not set"}"#,
        ),
        (
            "container id climbing out",
            with("CNI_CONTAINERID", "../../etc"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_CONTAINERID: invalid container id \"../../etc\": use [A-Za-z0-9_.-], starting with a letter or digit"}"#,
        ),
        (
            "container id with a slash",
            with("CNI_CONTAINERID", "abc/def"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_CONTAINERID: invalid container id \"abc/def\": use [A-Za-z0-9_.-], starting with a letter or digit"}"#,
        ),
        (
            "ifname dot-dot",
            with("CNI_IFNAME", ".."),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_IFNAME: invalid interface name \"..\": use 1-15 bytes without '/', ':' or whitespace, not '.' or '..'"}"#,
        ),
        (
            "ifname with a path",
            with("CNI_IFNAME", "../eth0"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_IFNAME: invalid interface name \"../eth0\": use 1-15 bytes without '/', ':' or whitespace, not '.' or '..'"}"#,
        ),
        (
            "ifname too long",
            with("CNI_IFNAME", "eth0123456789012"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_IFNAME: invalid interface name \"eth0123456789012\": use 1-15 bytes without '/', ':' or whitespace, not '.' or '..'"}"#,
        ),
        (
            "malformed args",
            with("CNI_ARGS", "IgnoreUnknown=1;oops"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_ARGS: invalid pair \"oops\", expected KEY=VALUE"}"#,
        ),
        (
            "bad requested address in args",
            with("CNI_ARGS", "IP=10.0.0.300"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_ARGS: IP=10.0.0.300: invalid address \"10.0.0.300\""}"#,
        ),
        // Versions (1).
        (
            "old version",
            env("ADD"),
            conf("0.2.0", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"1.1.0","code":1,"msg":"unsupported cniVersion \"0.2.0\"","details":"supported versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"}"#,
        ),
        (
            "future version",
            env("ADD"),
            conf("2.0.0", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"1.1.0","code":1,"msg":"unsupported cniVersion \"2.0.0\"","details":"supported versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"}"#,
        ),
        (
            "no version",
            env("ADD"),
            r#"{"name":"net","ipam":{"subnet":"10.0.0.0/24"}}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":1,"msg":"cniVersion: missing","details":"supported versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"}"#,
        ),
        (
            "check before 0.4.0",
            env("CHECK"),
            conf("0.3.1", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"0.3.1","code":1,"msg":"cniVersion 0.3.1 does not allow CHECK","details":"CHECK needs cniVersion 0.4.0 or later"}"#,
        ),
        (
            "gc before 1.1.0",
            gc.clone(),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"1.0.0","code":1,"msg":"cniVersion 1.0.0 does not allow GC","details":"GC needs cniVersion 1.1.0 or later"}"#,
        ),
        // Decoding (6).
        (
            "empty stdin",
            env("ADD"),
            "  \n".to_owned(),
            r#"{"cniVersion":"1.1.0","code":6,"msg":"network config on stdin is empty"}"#,
        ),
        (
            "bad json",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"net","#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":6,"msg":"network config is not valid json: EOF while parsing a value at line 1 column 35"}"#,
        ),
        (
            "not an object",
            env("ADD"),
            "[1,2]".to_owned(),
            r#"{"cniVersion":"1.1.0","code":6,"msg":"network config: expected an object, found an array"}"#,
        ),
        (
            "version of the wrong type",
            env("ADD"),
            r#"{"cniVersion":1.0,"name":"net","ipam":{}}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":6,"msg":"cniVersion: expected a string, found a number"}"#,
        ),
        (
            "name of the wrong type",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":5,"ipam":{}}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"name: expected a string, found a number"}"#,
        ),
        (
            "ipam of the wrong type",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"net","ipam":"host-local"}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam: expected an object, found a string"}"#,
        ),
        (
            "ranges of the wrong type",
            env("ADD"),
            ranges(r#""10.0.0.0/24""#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.ranges: expected an array, found a string"}"#,
        ),
        (
            "range set of the wrong type",
            env("ADD"),
            ranges(r#"[{"subnet":"10.0.0.0/24"}]"#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.ranges[0]: expected an array, found an object"}"#,
        ),
        (
            "range start of the wrong type",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","rangeStart":5}]]"#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.ranges[0][1].rangeStart: expected a string, found a number"}"#,
        ),
        (
            "negative cooldown",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","cooldownSeconds":-5}"#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.cooldownSeconds: expected a non-negative integer, found a number"}"#,
        ),
        (
            "routes of the wrong type",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","routes":[["0.0.0.0/0"]]}"#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.routes[0]: expected an object, found an array"}"#,
        ),
        (
            "exclusion of the wrong type",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","exclude":[5]}"#),
            r#"{"cniVersion":"1.0.0","code":6,"msg":"ipam.exclude[0]: expected an address, a cidr or {\"network\", \"reason\"}, found a number"}"#,
        ),
        // Invalid network configuration (7).
        (
            "network name climbing out",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"../net","ipam":{"subnet":"10.0.0.0/24"}}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"name: invalid network name \"../net\": use [A-Za-z0-9_.-], starting with a letter or digit"}"#,
        ),
        (
            "no network name",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","ipam":{"subnet":"10.0.0.0/24"}}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"name: missing (the network name)"}"#,
        ),
        (
            "no ipam",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"net"}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam: missing (the ipam section)"}"#,
        ),
        (
            "no ranges",
            env("ADD"),
            conf("1.0.0", r#"{"type":"host-local"}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam: no ranges configured (set ipam.ranges, or the older ipam.subnet)"}"#,
        ),
        (
            "empty range set",
            env("ADD"),
            ranges("[[]]"),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0]: empty range set"}"#,
        ),
        (
            "subnet missing",
            env("ADD"),
            ranges(r#"[[{"rangeStart":"10.0.0.5"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: missing"}"#,
        ),
        (
            "bad cidr",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/33"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: invalid cidr \"10.0.0.0/33\""}"#,
        ),
        (
            "subnet without a prefix",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: \"10.0.0.0\" is not in cidr notation (such as 10.1.0.0/16)"}"#,
        ),
        (
            "host bits set",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.7/24"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: subnet 10.0.0.7/24 has host bits set; the network is 10.0.0.0/24"}"#,
        ),
        (
            "the whole ipv4 space",
            env("ADD"),
            ranges(r#"[[{"subnet":"0.0.0.0/0"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: 0.0.0.0/0 is too large; ipv4 subnets must be /8 or longer"}"#,
        ),
        (
            "the whole ipv6 space",
            env("ADD"),
            ranges(r#"[[{"subnet":"::/0"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].subnet: ::/0 is too large; ipv6 subnets must be /16 or longer"}"#,
        ),
        (
            "bad range start",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","rangeStart":"banana"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][1].rangeStart: invalid address \"banana\""}"#,
        ),
        (
            "range start outside the subnet",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.5"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].rangeStart: start 10.0.1.5 is not in subnet 10.0.0.0/24"}"#,
        ),
        (
            "range end on the broadcast address",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.255"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].rangeEnd: end 10.0.0.255 is the subnet's broadcast address, which is never handed out"}"#,
        ),
        (
            "start after end",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.10"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].rangeStart: range start 10.0.0.50 is after its end 10.0.0.10"}"#,
        ),
        (
            "gateway of the wrong family",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","gateway":"fd00::1"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].gateway: gateway fd00::1 is not of the family of subnet 10.0.0.0/24"}"#,
        ),
        (
            "gateway outside the subnet",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","gateway":"10.0.9.1"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0].gateway: gateway 10.0.9.1 is not in subnet 10.0.0.0/24"}"#,
        ),
        (
            "mixed families in a set",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][1]: subnet fd00::/64 is ipv6 but ipam.ranges[0][0] is ipv4; a range set holds one family"}"#,
        ),
        (
            "overlap within a set",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.0.0/16"},{"subnet":"10.0.5.0/24"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][1] (10.0.5.1-10.0.5.254) overlaps ipam.ranges[0][0] (10.0.0.1-10.0.255.254)"}"#,
        ),
        (
            "overlap across sets",
            env("ADD"),
            ranges(r#"[[{"subnet":"10.0.5.0/24"}],[{"subnet":"fd00::/64"}],[{"subnet":"10.0.0.0/16","rangeStart":"10.0.5.200","rangeEnd":"10.0.6.10"}]]"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[2][0] (10.0.5.200-10.0.6.10) overlaps ipam.ranges[0][0] (10.0.5.1-10.0.5.254)"}"#,
        ),
        (
            "legacy range overlapping a range",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.0.0.0/24"}]]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][0] (10.0.0.1-10.0.0.254) overlaps ipam (10.0.0.1-10.0.0.254)"}"#,
        ),
        (
            "range start without a subnet",
            env("ADD"),
            conf("1.0.0", r#"{"rangeStart":"10.0.0.5","ranges":[[{"subnet":"10.0.0.0/24"}]]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.rangeStart: set without ipam.subnet (put ranges in ipam.ranges)"}"#,
        ),
        (
            "route without a destination",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","routes":[{"gw":"10.0.0.1"}]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.routes[0].dst: missing"}"#,
        ),
        (
            "route through a gateway of the other family",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","routes":[{"dst":"0.0.0.0/0","gw":"fd00::1"}]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.routes[0].gw: gateway fd00::1 is not of the family of destination 0.0.0.0/0"}"#,
        ),
        (
            "bad pool name",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","pool":"../x"}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.pool: invalid pool name \"../x\": use 1-63 of [A-Za-z0-9._-], starting with a letter or digit"}"#,
        ),
        (
            "exclusion with host bits",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","exclude":[{"network":"10.0.0.17/28"}]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.exclude[0].network: subnet 10.0.0.17/28 has host bits set; the network is 10.0.0.16/28"}"#,
        ),
        (
            "exclusion that is no address",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","exclude":["router"]}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.exclude[0]: invalid address \"router\""}"#,
        ),
        (
            "cooldown of a month",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","cooldownSeconds":2592000}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.cooldownSeconds: 2592000 is more than the maximum 604800"}"#,
        ),
        (
            "relative agent socket",
            env("ADD"),
            conf("1.0.0", r#"{"subnet":"10.0.0.0/24","agent":"agent.sock"}"#),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.agent: socket path \"agent.sock\" is not absolute"}"#,
        ),
        (
            "bad requested address in the config",
            env("ADD"),
            r#"{"cniVersion":"1.0.0","name":"net","args":{"cni":{"ips":["10.0.0.x"]}},"ipam":{"subnet":"10.0.0.0/24"}}"#.to_owned(),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"args.cni.ips[0]: invalid address \"10.0.0.x\""}"#,
        ),
        (
            "gc without valid attachments",
            gc.clone(),
            conf("1.1.0", r#"{"subnet":"10.0.0.0/24"}"#),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"cni.dev/valid-attachments: missing; GC without it would release every allocation"}"#,
        ),
        (
            "gc with a hostile container id",
            gc.clone(),
            r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24"},"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"../b","ifname":"eth0"}]}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"cni.dev/valid-attachments[1]: invalid container id \"../b\": use [A-Za-z0-9_.-], starting with a letter or digit"}"#,
        ),
        (
            "gc attachment without an interface",
            gc.clone(),
            r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24"},"cni.dev/valid-attachments":[{"containerID":"a"}]}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"cni.dev/valid-attachments[0].ifname: missing"}"#,
        ),
        (
            "gc grace period of the wrong type",
            gc.clone(),
            r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24","gcGracePeriodSeconds":"15m"},"cni.dev/valid-attachments":[]}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":6,"msg":"ipam.gcGracePeriodSeconds: expected a non-negative integer, found a string"}"#,
        ),
        (
            "gc grace period over a week",
            gc.clone(),
            r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24","gcGracePeriodSeconds":604801},"cni.dev/valid-attachments":[]}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"ipam.gcGracePeriodSeconds: 604801 is more than the maximum 604800"}"#,
        ),
        (
            "gc releasing at most nothing",
            gc.clone(),
            r#"{"cniVersion":"1.1.0","name":"net","ipam":{"subnet":"10.0.0.0/24","gcMaxReleased":0},"cni.dev/valid-attachments":[]}"#.to_owned(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"ipam.gcMaxReleased: 0 would release nothing; give at least 1"}"#,
        ),
        // Unsupported field (2).
        (
            "range from a file",
            env("ADD"),
            conf("1.0.0", r#"{"rangeFromFile":"/etc/cni/range.json"}"#),
            r#"{"cniVersion":"1.0.0","code":2,"msg":"unsupported field ipam.rangeFromFile = /etc/cni/range.json","details":"put the range in ipam.ranges"}"#,
        ),
        // Requested addresses (102).
        (
            "requested address outside every range",
            with("CNI_ARGS", "IP=10.9.9.9"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":102,"msg":"requested address 10.9.9.9 is not in any configured range"}"#,
        ),
        (
            "requested address outside the range bounds",
            with("CNI_ARGS", "IP=10.0.0.5"),
            ranges(r#"[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100"}]]"#),
            r#"{"cniVersion":"1.0.0","code":102,"msg":"requested address 10.0.0.5 is not in any configured range"}"#,
        ),
        (
            "two requested addresses in one set",
            with("CNI_ARGS", "IP=10.0.0.5,10.0.0.6"),
            ok.clone(),
            r#"{"cniVersion":"1.0.0","code":102,"msg":"requested addresses 10.0.0.5 and 10.0.0.6 are both in range set ipam, which hands out one address"}"#,
        ),
    ];
    cases
        .into_iter()
        .map(|(what, vars, stdin, json)| ErrorCase {
            what,
            vars,
            stdin,
            json,
        })
        .collect()
}

#[test]
fn every_error_path_prints_its_exact_json() {
    let mut failures = Vec::new();
    for ErrorCase {
        what,
        vars,
        stdin,
        json: expected,
    } in error_cases()
    {
        match invoke(&vars, &stdin) {
            Ok(invocation) => failures.push(format!("{what}: accepted as {invocation:?}")),
            Err(json) if json != expected => {
                failures.push(format!("{what}:\n  got      {json}\n  expected {expected}"));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn error_messages_follow_the_style() {
    for ErrorCase {
        what, vars, stdin, ..
    } in error_cases()
    {
        let err = parse_invocation(vars.iter().map(|(k, v)| (*k, v.as_str())), stdin.as_bytes())
            .unwrap_err();
        assert!(!err.msg.ends_with('.'), "{what}: {}", err.msg);
        assert!(!err.msg.is_empty(), "{what}");
        assert!(
            !err.msg.starts_with(|c: char| c.is_ascii_uppercase())
                || err.msg.starts_with("CNI_")
                || err.msg.starts_with("ADD")
                || err.msg.starts_with("GC"),
            "{what}: {}",
            err.msg
        );
    }
}

#[test]
fn oversized_stdin_is_refused_before_parsing() {
    let big = format!(
        r#"{{"cniVersion":"1.0.0","name":"net","pad":"{}","ipam":{{"subnet":"10.0.0.0/24"}}}}"#,
        "x".repeat(corral_cni::MAX_STDIN_BYTES)
    );
    let json = invoke(&env("ADD"), &big).unwrap_err();
    assert_eq!(
        json,
        format!(
            r#"{{"cniVersion":"1.1.0","code":6,"msg":"network config is {} bytes, more than the limit of 1048576"}}"#,
            big.len()
        )
    );
    // Exactly at the limit is still read.
    let head = r#"{"cniVersion":"1.0.0","name":"net","ipam":{"subnet":"10.0.0.0/24"},"p":""#;
    let tail = r#""}"#;
    let pad = corral_cni::MAX_STDIN_BYTES - head.len() - tail.len();
    let at_limit = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(at_limit.len(), corral_cni::MAX_STDIN_BYTES);
    assert!(invoke(&env("ADD"), &at_limit).is_ok());
}

#[test]
fn deeply_nested_json_is_a_decoding_error() {
    let stdin = format!(
        r#"{{"cniVersion":"1.0.0","name":"net","x":{}{}, "ipam":{{"subnet":"10.0.0.0/24"}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let json = invoke(&env("ADD"), &stdin).unwrap_err();
    // The version cannot be read from a document that does not parse: answer in the newest.
    assert!(
        json.starts_with(r#"{"cniVersion":"1.1.0","code":6,"msg":"network config is not valid json: recursion limit exceeded"#),
        "{json}"
    );
}

#[test]
fn thousands_of_ranges_are_checked_for_overlap() {
    // 16384 disjoint /30s, then one that overlaps the 1000th of them.
    let mut ranges: Vec<String> = (0..16384u32)
        .map(|i| {
            let base = std::net::Ipv4Addr::from(0x0a00_0000 + i * 4);
            format!(r#"{{"subnet":"{base}/30"}}"#)
        })
        .collect();
    let accepted = add(&conf(
        "1.0.0",
        &format!(r#"{{"ranges":[[{}]]}}"#, ranges.join(",")),
    ));
    assert_eq!(accepted.config.ipam.range_sets[0].ranges.len(), 16384);
    ranges.push(r#"{"subnet":"10.0.15.160/27"}"#.to_owned());
    let refused = invoke(
        &env("ADD"),
        &conf(
            "1.0.0",
            &format!(r#"{{"ranges":[[{}]]}}"#, ranges.join(",")),
        ),
    )
    .unwrap_err();
    assert_eq!(
        refused,
        r#"{"cniVersion":"1.0.0","code":7,"msg":"ipam.ranges[0][16384] (10.0.15.161-10.0.15.190) overlaps ipam.ranges[0][1000] (10.0.15.161-10.0.15.162)"}"#
    );
}

#[test]
fn a_flood_of_requested_addresses_is_refused() {
    let ips: Vec<String> = (0..50_000u32)
        .map(|i| {
            format!(
                r#""{}""#,
                std::net::Ipv4Addr::from(0x0a00_0000 + i % 200 + 1)
            )
        })
        .collect();
    let stdin = format!(
        r#"{{"cniVersion":"1.0.0","name":"net","runtimeConfig":{{"ips":[{}]}},"ipam":{{"subnet":"10.0.0.0/24"}}}}"#,
        ips.join(",")
    );
    assert!(stdin.len() < corral_cni::MAX_STDIN_BYTES);
    assert_eq!(
        invoke(&env("ADD"), &stdin).unwrap_err(),
        r#"{"cniVersion":"1.0.0","code":102,"msg":"requested addresses 10.0.0.1 and 10.0.0.2 are both in range set ipam, which hands out one address"}"#
    );
}

#[test]
fn non_utf8_environment_values_are_refused() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let vars = vec![
        (OsString::from("CNI_COMMAND"), OsString::from("ADD")),
        (
            OsString::from("CNI_CONTAINERID"),
            OsString::from_vec(vec![b'c', 0xff]),
        ),
    ];
    let err = parse_env(vars).unwrap_err();
    assert_eq!(err.code, 4);
    assert_eq!(err.msg, "CNI_CONTAINERID is not valid utf-8");
    // Other variables of the environment are none of corral's business.
    let vars = vec![
        (
            OsString::from_vec(vec![0xfe]),
            OsString::from_vec(vec![0xff]),
        ),
        (OsString::from("CNI_COMMAND"), OsString::from("VERSION")),
    ];
    assert_eq!(parse_env(vars).unwrap().command, Command::Version);
}

#[test]
fn reply_version_follows_the_config_when_it_can() {
    assert_eq!(
        reply_version(br#"{"cniVersion":"0.3.0"}"#),
        CniVersion::V0_3_0
    );
    assert_eq!(
        reply_version(br#"{"cniVersion":"9.9.9"}"#),
        CniVersion::V1_1_0
    );
    assert_eq!(reply_version(b"garbage"), CniVersion::V1_1_0);
    assert_eq!(reply_version(b""), CniVersion::V1_1_0);
}

#[test]
fn parse_config_refuses_version() {
    let err = parse_config(Command::Version, b"{}", &Default::default()).unwrap_err();
    assert_eq!(err.code, CniError::INTERNAL);
}

// ---------------------------------------------------------------------------------------
// Results

#[test]
fn results_render_per_version() {
    let result = IpamResult {
        ips: vec![
            IpConfig::new(net("10.0.0.2/24"), Some(ip("10.0.0.1"))),
            IpConfig::new(net("fd00::2/64"), Some(ip("fd00::1"))),
        ],
        routes: vec![Route {
            mtu: Some(1400),
            table: Some(100),
            scope: Some(0),
            priority: Some(0),
            ..Route::new(net("0.0.0.0/0"), Some(ip("10.0.0.1")))
        }],
        dns: Dns {
            nameservers: vec!["10.0.0.10".to_owned()],
            domain: Some("cluster.local".to_owned()),
            search: vec!["svc.cluster.local".to_owned()],
            options: vec!["ndots:5".to_owned()],
        },
        cloud_interfaces: Vec::new(),
    };
    let old_ips = r#""ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1"},{"version":"6","address":"fd00::2/64","gateway":"fd00::1"}]"#;
    let new_ips = r#""ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"},{"address":"fd00::2/64","gateway":"fd00::1"}]"#;
    let rest = r#""routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1","mtu":1400,"table":100,"scope":0}],"dns":{"nameservers":["10.0.0.10"],"domain":"cluster.local","search":["svc.cluster.local"],"options":["ndots:5"]}"#;
    for (version, ips) in [
        (CniVersion::V0_3_0, old_ips),
        (CniVersion::V0_3_1, old_ips),
        (CniVersion::V0_4_0, old_ips),
        (CniVersion::V1_0_0, new_ips),
        (CniVersion::V1_1_0, new_ips),
    ] {
        assert_eq!(
            result.to_json(version),
            format!(r#"{{"cniVersion":"{version}",{ips},{rest}}}"#)
        );
    }
}

#[test]
fn interface_indexes_are_rendered_when_known() {
    let result = IpamResult {
        ips: vec![IpConfig {
            interface: Some(2),
            ..IpConfig::new(net("10.0.0.2/24"), None)
        }],
        ..IpamResult::default()
    };
    assert_eq!(
        result.to_json(CniVersion::V0_4_0),
        r#"{"cniVersion":"0.4.0","ips":[{"version":"4","interface":2,"address":"10.0.0.2/24"}],"dns":{}}"#
    );
    assert_eq!(
        result.to_json(CniVersion::V1_1_0),
        r#"{"cniVersion":"1.1.0","ips":[{"interface":2,"address":"10.0.0.2/24"}],"dns":{}}"#
    );
}

#[test]
fn rendered_results_read_back_as_previous_results() {
    let config = add(&conf(
        "0.4.0",
        r#"{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64","gateway":"fd00::fe"}]]}"#,
    ))
    .config;
    let sets = &config.ipam.range_sets;
    let ips = vec![
        sets[0].ip_config(ip("10.0.0.7")).unwrap(),
        sets[1].ip_config(ip("fd00::7")).unwrap(),
    ];
    for version in CniVersion::ALL {
        let json = IpamResult {
            ips: ips.clone(),
            ..IpamResult::default()
        }
        .to_json(version);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            parse_prev_result("prevResult", &value).unwrap().ips,
            ips,
            "{version}"
        );
    }
}

#[test]
fn ip_config_uses_the_subnet_of_the_address() {
    let config = add(&conf(
        "1.0.0",
        r#"{"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100"},{"subnet":"10.0.8.0/22","gateway":"10.0.8.254"}]]}"#,
    ))
    .config;
    let set = &config.ipam.range_sets[0];
    assert_eq!(
        set.ip_config(ip("10.0.9.3")),
        Some(IpConfig::new(net("10.0.9.3/22"), Some(ip("10.0.8.254"))))
    );
    // Outside the bounds but inside a subnet: an address kept from an older configuration.
    assert_eq!(
        set.ip_config(ip("10.0.0.5")),
        Some(IpConfig::new(net("10.0.0.5/24"), Some(ip("10.0.0.1"))))
    );
    assert_eq!(set.ip_config(ip("192.168.0.1")), None);
    assert!(set.contains(ip("10.0.0.100")));
    assert!(!set.contains(ip("10.0.0.99")));
}

#[test]
fn version_result_lists_every_supported_version() {
    assert_eq!(
        version_json(CniVersion::LATEST),
        r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
    );
    assert_eq!(
        version_json(CniVersion::V1_0_0),
        r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
    );
}

// ---------------------------------------------------------------------------------------
// Engine errors and teardown

#[test]
fn engine_errors_map_to_codes() {
    let pool = PoolName::new("net").unwrap();
    let key = AttachmentKey::new("net", "c1", "eth0").unwrap();
    let cases: Vec<(AllocError, u32)> = vec![
        (
            AllocError::PoolExhausted {
                pool: pool.clone(),
                family: Family::V4,
            },
            100,
        ),
        (
            AllocError::NoCapacity {
                pool: pool.clone(),
                family: Family::V6,
            },
            100,
        ),
        (
            AllocError::AddressInUse {
                addr: ip("10.0.0.5"),
                holder: Box::new(Holder {
                    owner: "other".to_owned(),
                    key: None,
                    generation: 3,
                }),
            },
            101,
        ),
        (
            AllocError::OutsidePool {
                addr: ip("10.9.0.1"),
                pool: pool.clone(),
            },
            102,
        ),
        (
            AllocError::Excluded {
                addr: ip("10.0.0.5"),
                network: "10.0.0.5/32".to_owned(),
                reason: "router".to_owned(),
            },
            102,
        ),
        (
            AllocError::Reserved {
                addr: ip("10.0.0.1"),
                reserved: corral_core::Reserved::Gateway,
                range: "10.0.0.0/24".to_owned(),
            },
            102,
        ),
        (
            AllocError::Draining {
                addr: ip("10.0.0.9"),
                range: "10.0.0.0/24".to_owned(),
                pool: pool.clone(),
            },
            102,
        ),
        (AllocError::FamilyDisabled { family: Family::V6 }, 7),
        (
            AllocError::RangeOverlap {
                range: "10.0.0.0/24".to_owned(),
                existing: "10.0.0.0/16".to_owned(),
                existing_pool: pool.clone(),
            },
            7,
        ),
        (
            AllocError::Invalid(SpecError::InvalidCidr {
                input: "x".to_owned(),
            }),
            7,
        ),
        (
            AllocError::Invalid(SpecError::InvalidContainerId {
                id: "../x".to_owned(),
            }),
            4,
        ),
        (
            AllocError::AttachmentConflict {
                key,
                existing: ip("10.0.0.2"),
                pool: pool.clone(),
            },
            106,
        ),
        (
            AllocError::RestoreInProgress {
                operation: "allocate",
            },
            11,
        ),
        (AllocError::PoolExists { pool }, 999),
    ];
    for (err, code) in cases {
        let text = err.to_string();
        let cni = CniError::from(err);
        assert_eq!(cni.code, code, "{text}");
        assert_eq!(cni.msg, text);
    }
}

#[test]
fn exhaustion_says_it_may_pass() {
    let err = CniError::from(AllocError::PoolExhausted {
        pool: PoolName::new("net").unwrap(),
        family: Family::V4,
    });
    assert_eq!(
        err.to_json(CniVersion::V1_0_0),
        r#"{"cniVersion":"1.0.0","code":100,"msg":"pool net has no free ipv4 address","details":"the request may succeed later"}"#
    );
}

#[test]
fn teardown_failures_are_reported_together() {
    assert_eq!(CniError::combine(Vec::new()), None);
    let one = CniError::store("disk full");
    assert_eq!(CniError::combine(vec![one.clone()]), Some(one.clone()));
    let two = CniError::combine(vec![one, CniError::agent("connection refused")]).unwrap();
    assert_eq!(two.code, CniError::STORE_FAILURE);
    assert_eq!(
        two.msg,
        "2 failures: state store: disk full; node agent: connection refused"
    );
    assert_eq!(
        two.details,
        "code 103: state store: disk full\ncode 104: node agent: connection refused"
    );
}
