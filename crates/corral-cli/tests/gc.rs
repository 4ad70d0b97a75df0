//! `corral gc --live` against the real agent process: a leak is only recorded by the first
//! run, survives a SIGKILL of the agent, waits out the grace period, and is released whole by
//! a later run; a live attachment and an allocation without a key stay; a malformed live
//! list is refused naming its line, and changes nothing.

use std::path::Path;

use serde_json::{Value, json};

use crate::common;

use common::{Agent, corral_at as corral, ok_json as json};

fn owners(socket: &Path) -> Vec<String> {
    let dump = json(&corral(socket, &["-o", "json", "dump"]));
    let mut owners: Vec<String> = dump["scopes"][0]["pools"][0]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["owner"].as_str().unwrap().to_owned())
        .collect();
    owners.sort();
    owners
}

fn key(container: &str) -> Value {
    json!({"network": "net", "container_id": container, "ifname": "eth0"})
}

#[test]
fn gc_releases_a_leak_at_a_later_run_past_the_grace_period() {
    let (dir, agent) = Agent::start_in_tempdir();
    let socket = agent.socket.clone();
    for (owner, args) in [
        ("leak", vec!["--key", "net/leak/eth0", "--family", "dual"]),
        ("kept", vec!["--key", "net/kept/eth0"]),
        ("no-key", vec![]),
    ] {
        let mut all = vec!["alloc", "--owner", owner];
        all.extend(args);
        assert!(corral(&socket, &all).status.success());
    }
    let live = dir.path().join("live");
    std::fs::write(&live, "# the runtime's containers\n\n  net/kept/eth0  \n").unwrap();
    let live = live.to_str().unwrap();

    // A malformed line: usage (2), naming the file and line; nothing sent.
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "net/kept/eth0\nnet/../eth0\n").unwrap();
    let out = corral(
        &socket,
        &["gc", "--live", bad.to_str().unwrap(), "--grace", "0s"],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    // A cap of 0 is refused by the command line (2); an unreachable agent is 3.
    let out = corral(&socket, &["gc", "--live", live, "--max", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = corral(&dir.path().join("nowhere.sock"), &["gc", "--live", live]);
    assert_eq!(out.status.code(), Some(3));
    // A scope the agent does not have: refused (1).
    let out = corral(&socket, &["--scope", "nope", "gc", "--live", live]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The first run records (so nothing was recorded by the refused ones) and releases nothing.
    let first = json(&corral(
        &socket,
        &["-o", "json", "gc", "--live", live, "--grace", "1h"],
    ));
    assert_eq!(first["live"], 1, "{first}");
    assert_eq!(first["recorded"][0]["key"], key("leak"), "{first}");
    assert_eq!(first["released"], json!([]), "{first}");
    assert_eq!(owners(&socket), ["kept", "leak", "leak", "no-key"]);

    // The suspect is durable: a SIGKILLed agent, restarted, goes on from it.
    agent.kill();
    let agent = Agent::start_in(dir.path());
    let waiting = json(&corral(
        &socket,
        &["-o", "json", "gc", "--live", live, "--grace", "1h"],
    ));
    assert_eq!(waiting["waiting"][0]["key"], key("leak"), "{waiting}");
    assert_eq!(waiting["recorded"], json!([]), "{waiting}");
    let dry = corral(
        &socket,
        &["gc", "--live", live, "--grace", "0s", "--dry-run"],
    );
    assert!(dry.status.success());
    let table = String::from_utf8_lossy(&dry.stdout);
    assert!(
        table.contains("net/leak/eth0") && table.contains("would release"),
        "{table}"
    );
    assert_eq!(owners(&socket), ["kept", "leak", "leak", "no-key"]);

    let out = corral(&socket, &["gc", "--live", live, "--grace", "0s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("net/leak/eth0") && table.contains("released"),
        "{table}"
    );
    assert!(table.contains("1 live, 0 recorded, 1 released"), "{table}");
    assert_eq!(owners(&socket), ["kept", "no-key"], "both families went");
    drop(agent);
}
