//! `corral history` against the real agent process: an address allocated with `corral alloc`,
//! released, allocated again to a pod through a CNI ADD, the agent killed with SIGKILL right
//! after that ADD was acknowledged and started again; `corral history ADDRESS --at TIME`
//! names the right holder at each instant, from the history the agent wrote in the commits
//! of those changes. Bad input is a usage error (exit 2) that sends nothing.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::{Agent, agent_config_file, corral_at, ok_json, pod_key, podnet};
use corral_api::history::format_time;

const ADDR: &str = "10.99.0.5";

fn start(dir: &Path) -> Agent {
    let config = agent_config_file(dir, "10.99.0.0/29", 0);
    Agent::start(
        &["--config".as_ref(), config.as_os_str()],
        &dir.join("agent.sock"),
    )
}

fn text(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Who held ADDR at `at_ms`, as `corral history ADDR --at` says in JSON.
fn holders(socket: &Path, at: &str) -> Vec<String> {
    let answer = ok_json(&corral_at(
        socket,
        &["history", ADDR, "--at", at, "-o", "json"],
    ));
    answer["held"]
        .as_array()
        .expect("held is answered with --at")
        .iter()
        .map(|event| event["owner"].as_str().unwrap().to_owned())
        .collect()
}

/// The events of ADDR, newest first: (event, owner, at_ms).
fn events(socket: &Path) -> Vec<(String, String, u64)> {
    let answer = ok_json(&corral_at(socket, &["history", ADDR, "-o", "json"]));
    answer["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["owner"].as_str().unwrap().to_owned(),
                e["at_ms"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Each change lands in a later millisecond than the one before, so every instant asked
/// below lies between two events (the history's times are milliseconds).
fn next_millisecond() {
    std::thread::sleep(Duration::from_millis(5));
}

#[test]
fn history_names_who_held_an_address_at_each_instant_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path());
    let socket = agent.socket.clone();
    ok_json(&corral_at(
        &socket,
        &["alloc", "--address", ADDR, "--owner", "ns/a", "-o", "json"],
    ));
    next_millisecond();
    ok_json(&corral_at(
        &socket,
        &["release", "--address", ADDR, "-o", "json"],
    ));
    next_millisecond();
    // The same address to a pod, through a CNI ADD naming it (as corral-ipam sends the pod's
    // K8S_POD_NAMESPACE/K8S_POD_NAME as the owner).
    let mut client = corral_client::Client::unix(&socket);
    let added = client
        .cni_add(&corral_api::CniAddRequest {
            network: podnet("default"),
            key: pod_key("c-web"),
            owner: "ns/web-0".into(),
            sets: vec![corral_api::CniSet {
                pool: "default".into(),
                family: corral_api::FamilyName::Ipv4,
                requested: Some(ADDR.parse().unwrap()),
            }],
        })
        .unwrap();
    assert_eq!(added.allocations[0].address.to_string(), ADDR);
    // Killed right after the ADD was acknowledged: nothing runs on the way down.
    agent.kill();
    let agent = start(dir.path());

    let history = events(&agent.socket);
    let kinds: Vec<(&str, &str)> = history
        .iter()
        .map(|(event, owner, _)| (event.as_str(), owner.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("allocated", "ns/web-0"),
            ("released", "ns/a"),
            ("allocated", "ns/a")
        ],
        "the acknowledged ADD survived the SIGKILL with its event"
    );
    let (allocated_a, released_a, allocated_web) = (history[2].2, history[1].2, history[0].2);
    assert!(allocated_a < released_a && released_a < allocated_web);
    let at = |ms: u64| format_time(ms);
    assert!(holders(&agent.socket, &at(allocated_a - 1)).is_empty());
    assert_eq!(holders(&agent.socket, &at(allocated_a)), ["ns/a"]);
    assert_eq!(holders(&agent.socket, &at(released_a - 1)), ["ns/a"]);
    assert!(holders(&agent.socket, &at(released_a)).is_empty());
    assert_eq!(holders(&agent.socket, &at(allocated_web)), ["ns/web-0"]);
    // Milliseconds since the epoch work too, and the table says it in words.
    assert_eq!(
        holders(&agent.socket, &(allocated_web + 60_000).to_string()),
        ["ns/web-0"]
    );
    let table = text(&corral_at(
        &agent.socket,
        &["history", ADDR, "--at", &at(released_a - 1)],
    ));
    assert!(
        table.contains(&format!("{ADDR} at {}: held by ns/a", at(released_a - 1))),
        "{table}"
    );
    assert!(table.contains("TIME"), "{table}");

    // The pod's and the attachment's events.
    let by_pod = ok_json(&corral_at(
        &agent.socket,
        &["history", "--pod", "ns/web-0", "-o", "json"],
    ));
    assert_eq!(by_pod["events"].as_array().unwrap().len(), 1);
    assert_eq!(by_pod["events"][0]["key"]["container_id"], "c-web");
    let by_key = ok_json(&corral_at(
        &agent.socket,
        &["history", "--key", "c-web/eth0", "-o", "json"],
    ));
    assert_eq!(by_key["events"], by_pod["events"]);
    let since = ok_json(&corral_at(
        &agent.socket,
        &["history", "--since", &at(released_a), "-o", "json"],
    ));
    assert_eq!(since["events"].as_array().unwrap().len(), 2);

    // Bad input: exit 2 with the reason, nothing sent, nothing changed.
    for (args, needle) in [
        (vec!["history", "10.99.0.300"], "is not an IP address"),
        (vec!["history", ADDR, "--at", "yesterday"], "is not a time"),
        (
            vec!["history", ADDR, "--at", "2026-02-30T00:00"],
            "is not a time",
        ),
        (vec!["history", "--at", "2026-11-27T14:02"], "ADDRESS"),
        (
            vec![
                "history",
                "--since",
                "2030-01-01T00:00",
                "--until",
                "2029-01-01T00:00",
            ],
            "--since is after --until",
        ),
        (vec!["history", "--limit", "0"], "limit"),
    ] {
        let output = corral_at(&agent.socket, &args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert_eq!(events(&agent.socket), history);
}
