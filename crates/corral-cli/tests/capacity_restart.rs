//! Run-time capacity changes and the configuration file, through the real `corral` command
//! line and the real agent process, across restarts (SIGKILL included): removed ranges stay
//! removed, draining ranges stay draining, and the agent always starts again.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common;

use common::{Agent, BINARY};

const CONFIG: &str = r#"
[[pools]]
name = "default"
ranges = ["10.88.0.0/24"]
cooldown_ms = 0

[[pools]]
name = "a"
ranges = ["10.50.0.0/24"]
cooldown_ms = 0
"#;

fn start(dir: &Path) -> Agent {
    let socket = dir.join("agent.sock");
    let state = dir.join("state");
    let config = dir.join("agent.toml");
    std::fs::write(&config, CONFIG).unwrap();
    Agent::serve_with(&state, &socket, &["--config".as_ref(), config.as_os_str()])
}

fn corral(agent: &Agent, args: &[&str]) -> Output {
    Command::new(BINARY)
        .arg("--socket")
        .arg(&agent.socket)
        .args(args)
        .output()
        .unwrap()
}

fn ok(agent: &Agent, args: &[&str]) -> Value {
    let output = corral(agent, &[&["-o", "json"], args].concat());
    assert!(
        output.status.success(),
        "corral {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

/// (pool, range, draining) of every node range.
type Listed = Vec<(String, String, bool)>;
/// (pool, range) of the file ranges removed at run time.
type Removed = Vec<(String, String)>;

fn ranges(agent: &Agent) -> (Listed, Removed) {
    let pools = ok(agent, &["pool", "list"]);
    let mut ranges = Vec::new();
    let mut removed = Vec::new();
    for pool in pools["pools"].as_array().unwrap() {
        let name = pool["name"].as_str().unwrap().to_owned();
        for range in pool["ranges"].as_array().unwrap() {
            ranges.push((
                name.clone(),
                range["range"].as_str().unwrap().to_owned(),
                range["draining"].as_bool().unwrap(),
            ));
        }
        for range in pool["removed"].as_array().into_iter().flatten() {
            removed.push((name.clone(), range.as_str().unwrap().to_owned()));
        }
    }
    (ranges, removed)
}

#[test]
fn removed_and_draining_ranges_keep_their_state_across_restarts_of_the_real_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = start(dir.path());
    // The issue's sequence: add, remove naming a gateway, move to another pool.
    ok(&agent, &["pool", "add", "x", "10.60.0.0/24"]);
    ok(
        &agent,
        &["pool", "remove", "x", "10.60.0.0/24,gateway=10.60.0.1"],
    );
    ok(&agent, &["pool", "add", "y", "10.60.0.0/24"]);
    // A file range removed at run time, another pool over it.
    ok(&agent, &["pool", "remove", "a", "10.50.0.0/24"]);
    ok(&agent, &["pool", "add", "b", "10.50.0.0/25"]);
    // A range draining with an allocation in it.
    let held = ok(&agent, &["alloc", "--pool", "default", "--owner", "held"]);
    let held = held["allocations"][0]["address"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(&agent, &["pool", "remove", "default", "10.88.0.0/24"]);
    let before = ranges(&agent);
    assert!(
        before
            .0
            .contains(&("default".into(), "10.88.0.0/24".into(), true))
    );
    assert_eq!(before.1, [("a".to_owned(), "10.50.0.0/24".to_owned())]);

    agent.kill();
    let agent = start(dir.path());
    assert_eq!(
        ranges(&agent),
        before,
        "SIGKILL and a restart changed the pools"
    );
    let status = ok(&agent, &["status"]);
    assert!(status.get("warnings").is_none(), "{status}");

    // Cancel the drain, then drain again and release: the range goes for good.
    ok(&agent, &["pool", "add", "default", "10.88.0.0/24"]);
    assert!(
        ranges(&agent)
            .0
            .contains(&("default".into(), "10.88.0.0/24".into(), false))
    );
    ok(&agent, &["pool", "remove", "default", "10.88.0.0/24"]);
    ok(&agent, &["release", "--address", &held]);
    let after = ranges(&agent);
    assert!(!after.0.iter().any(|(_, range, _)| range == "10.88.0.0/24"));
    assert!(
        after
            .1
            .contains(&("default".to_owned(), "10.88.0.0/24".to_owned()))
    );
    drop(agent);
    let agent = start(dir.path());
    assert_eq!(ranges(&agent), after);
}
