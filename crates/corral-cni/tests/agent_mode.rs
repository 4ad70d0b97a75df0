//! corral-ipam in agent mode: the real binary, executed as a runtime does, with
//! `"agent": "<socket>"` in its ipam configuration, against the real agent (in this test's
//! process, on a temporary directory). It must answer exactly as the standalone plugin does —
//! same addresses in the same order, same result format, same error codes — and give code 11
//! when no agent listens.

use std::path::Path;

use corral_agent::{AgentConfig, Running};
use serde_json::{Value, json};

use crate::common;

use common::Outcome;

/// corral-ipam with `command` for `container` on eth0.
fn run(command: &str, container: &str, stdin: &[u8]) -> Outcome {
    common::run(command, container, "eth0", &[], stdin)
}

/// The same network configuration, standalone (state under `data`) or through `agent`.
fn conf(data: &Path, agent: Option<&Path>, extra: Value) -> Vec<u8> {
    let mut ipam = json!({
        "type": "corral-ipam",
        "dataDir": data,
        "ranges": [[{"subnet": "10.7.0.0/29", "gateway": "10.7.0.1"}], [{"subnet": "fd07::/125"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    });
    if let Some(agent) = agent {
        ipam["agent"] = json!(agent);
    }
    for (k, v) in extra.as_object().unwrap() {
        ipam[k] = v.clone();
    }
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "agentnet",
        "type": "bridge",
        "ipam": ipam
    }))
    .unwrap()
}

fn start_agent(dir: &Path) -> Running {
    Running::start(AgentConfig::in_dir(dir)).expect("the agent starts")
}

#[test]
fn every_verb_answers_as_the_standalone_plugin_does() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path());
    let socket = dir.path().join("agent.sock");
    let via_agent = |extra: Value| conf(&dir.path().join("unused"), Some(&socket), extra);
    let standalone = |extra: Value| conf(&dir.path().join("standalone"), None, extra);

    // The same sequence through both: identical stdout and exit codes, call by call.
    let steps: Vec<(&str, &str, Value)> = vec![
        ("ADD", "c1", json!({})),
        ("ADD", "c2", json!({})),
        ("ADD", "c1", json!({})), // idempotent
        ("CHECK", "c1", json!({})),
        ("ADD", "c3", json!({"ips": ["10.7.0.3"]})), // held by c2: 101
        ("DEL", "c1", json!({})),
        ("DEL", "c1", json!({})),   // nothing to release
        ("ADD", "c4", json!({})),   // next-fit, past c1's cooling address
        ("CHECK", "c1", json!({})), // 105: c1 holds nothing now
        ("ADD", "c5", json!({})),
        ("ADD", "c6", json!({})),
        ("ADD", "c7", json!({})),
        ("ADD", "c8", json!({})), // the /29 is out: 100
        ("STATUS", "", json!({})),
    ];
    for (verb, container, extra) in steps {
        let mine = run(verb, container, &via_agent(extra.clone()));
        let theirs = run(verb, container, &standalone(extra.clone()));
        assert_eq!(
            (mine.code, &mine.stdout),
            (theirs.code, &theirs.stdout),
            "{verb} {container} {extra}: agent mode differs from standalone"
        );
    }
    let exhausted = run("ADD", "c9", &via_agent(json!({})));
    assert_eq!(exhausted.error_code(), 100, "{}", exhausted.stdout);

    // GC through the agent with no grace period: what is not listed goes at the first GC
    // (one observation is enough), what is listed stays.
    let gc = |valid: Value| {
        let mut config: Value =
            serde_json::from_slice(&via_agent(json!({"gcGracePeriodSeconds": 0}))).unwrap();
        config["cniVersion"] = json!("1.1.0");
        config["cni.dev/valid-attachments"] = valid;
        serde_json::to_vec(&config).unwrap()
    };
    let out = run(
        "GC",
        "",
        &gc(json!([{"containerID": "c2", "ifname": "eth0"}])),
    );
    assert_eq!(out.code, 0, "{}", out.stdout);
    let check_c4 = run("CHECK", "c4", &via_agent(json!({})));
    assert_eq!(
        check_c4.error_code(),
        105,
        "c4 was not listed, so the GC released it: {}",
        check_c4.stdout
    );
    let check_c2 = run("CHECK", "c2", &via_agent(json!({})));
    assert_eq!(check_c2.code, 0, "{}", check_c2.stdout);
    agent.stop().unwrap();
}

/// A refusal has one CNI code whichever way the plugin runs, for the refusals a runtime meets.
#[test]
fn a_refusal_has_the_same_code_through_the_agent_as_standalone() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path());
    let socket = dir.path().join("agent.sock");
    // (what, the ipam section's own keys, the runtime's requested addresses)
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "an address outside the ranges",
            json!({}),
            json!(["10.9.9.9"]),
        ),
        ("the gateway", json!({}), json!(["10.7.0.1"])),
        ("the network address", json!({}), json!(["10.7.0.0"])),
        (
            "an address of a family the network lacks",
            json!({"ranges": [[{"subnet": "10.7.0.0/29"}]]}),
            json!(["fd07::3"]),
        ),
        (
            "ranges that overlap",
            json!({"ranges": [[{"subnet": "10.7.0.0/29"}], [{"subnet": "10.7.0.0/30"}]]}),
            json!([]),
        ),
    ];
    for (i, (what, ipam, ips)) in cases.into_iter().enumerate() {
        let container = format!("r{i}");
        let data = dir.path().join(format!("standalone{i}"));
        let with_ips = |agent: Option<&Path>| {
            let mut config: Value =
                serde_json::from_slice(&conf(&data, agent, ipam.clone())).unwrap();
            config["runtimeConfig"] = json!({"ips": ips});
            serde_json::to_vec(&config).unwrap()
        };
        let theirs = run("ADD", &container, &with_ips(None));
        let mine = run("ADD", &container, &with_ips(Some(&socket)));
        assert_ne!(
            theirs.code, 0,
            "{what}: standalone refuses: {}",
            theirs.stdout
        );
        assert_eq!(
            mine.error_code(),
            theirs.error_code(),
            "{what}: agent mode answered {} where standalone answered {}",
            mine.stdout,
            theirs.stdout
        );
    }
    agent.stop().unwrap();
}

/// The engine's refusals keep their CNI code through the agent: the agent sends the code the
/// plugin on its own gives (`cni_code`, from `corral_core::cni_code`) beside its API code, which
/// is coarser (a range overlap is a "conflict" to the API, 101 if mapped from it; the plugin
/// on its own says 7), and the plugin answers that code. Here a stand-in agent on the socket
/// answers as the agent does.
#[test]
fn the_plugin_answers_the_cni_code_the_agent_sends() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixListener;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let body = json!({"error": {
        "code": "conflict",
        "message": "range 10.7.0.0/30 overlaps range 10.7.0.0/29 of pool p",
        "cni_code": 7,
    }})
    .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut request = vec![0; length];
            let _ = reader.read_exact(&mut request);
            let answer = format!(
                "HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = reader.into_inner().write_all(answer.as_bytes());
        }
    });
    let out = run(
        "ADD",
        "c1",
        &conf(&dir.path().join("unused"), Some(&socket), json!({})),
    );
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
}

#[test]
fn no_agent_is_try_again_later_and_an_agents_directory_is_not_used_standalone() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let out = run(
        "ADD",
        "c1",
        &conf(&dir.path().join("x"), Some(&socket), json!({})),
    );
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("agent.sock"),
        "{}",
        out.stdout
    );

    // A standalone call on the directory a running agent owns is told to use the agent.
    let agent = start_agent(dir.path());
    let out = run(
        "ADD",
        "c1",
        &conf(&dir.path().join("state"), None, json!({})),
    );
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("agent"),
        "{}",
        out.stdout
    );
    agent.stop().unwrap();
}
