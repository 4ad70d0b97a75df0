//! The `corral` command line against the real agent process (`corral agent`), end to end:
//! allocate, refuse, report, check, export from one agent and import into another.

use std::process::{Command, Output, Stdio};

use crate::common;

use common::{Agent, BINARY, ok_json as json};

fn corral(agent: &Agent, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BINARY)
        .arg("--socket")
        .arg(&agent.socket)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// `corral check --live -` with `live` on its input must exit with `code`.
fn check_live(agent: &Agent, live: &str, code: i32) {
    let out = corral(agent, &["check", "--live", "-"], live);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_command_line_drives_a_real_agent() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_in(&dir.path().join("one"));

    let out = corral(
        &agent,
        &[
            "-o",
            "json",
            "alloc",
            "--owner",
            "pod-a",
            "--family",
            "dual",
            "--key",
            "net/c1/eth0",
        ],
        "",
    );
    let allocations = json(&out)["allocations"].clone();
    assert_eq!(allocations[0]["address"], "10.88.0.1");
    assert_eq!(allocations[1]["address"], "fd88::1");
    // The table is for people: the address is in it.
    let table = corral(&agent, &["dump"], "");
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).contains("10.88.0.1"));

    // A held address is refused: exit code 1, the reason on stderr.
    let refused = corral(
        &agent,
        &["alloc", "--owner", "x", "--address", "10.88.0.1"],
        "",
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("10.88.0.1"));

    // check: the attachment is not live → stale, exit code 5; live → clean.
    check_live(&agent, "net/other/eth0\n", 5);
    check_live(&agent, "net/c1/eth0\n", 0);

    // Export from this agent, import into a fresh one.
    let file = dir.path().join("checkpoint.json");
    let exported = corral(&agent, &["export", file.to_str().unwrap()], "");
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    drop(agent);
    let other = Agent::start_in(&dir.path().join("two"));
    let imported = corral(&other, &["import", file.to_str().unwrap()], "");
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let dump = json(&corral(&other, &["-o", "json", "dump"], ""));
    let held: Vec<&str> = dump["scopes"][0]["pools"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["allocations"].as_array().unwrap())
        .map(|a| a["address"].as_str().unwrap())
        .collect();
    assert!(
        held.contains(&"10.88.0.1") && held.contains(&"fd88::1"),
        "{dump}"
    );
    // The next allocation continues after the imported ones.
    let next = json(&corral(
        &other,
        &["-o", "json", "alloc", "--owner", "b"],
        "",
    ));
    assert_eq!(next["allocations"][0]["address"], "10.88.0.2");

    // No agent: exit code 3.
    drop(other);
    let gone = Command::new(BINARY)
        .arg("--socket")
        .arg(dir.path().join("nobody.sock"))
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(3));
}
