//! An acknowledged change is durable: the real corral-ipam binary, traced with strace, syncs
//! the write-ahead log after its last write to it and before it prints its result, and needs
//! exactly one sync to do so. (The store syncs the log itself, after releasing the directory
//! lock, so a mistake in that order would not show in any functional test.)
//!
//! Needs `/usr/bin/strace` (`make deps` installs it) and fails loudly without it.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

const STRACE: &str = "/usr/bin/strace";

/// What one traced call did, in order: `Write` to the log, `Sync` of the log, `Print` on
/// stdout, and `OtherSync` for a sync of anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Write,
    Sync,
    OtherSync,
    Print,
}

fn events(trace: &str) -> Vec<Event> {
    trace
        .lines()
        // `strace -f` prefixes each line with the pid.
        .map(|line| {
            line.trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start()
        })
        .filter_map(|line| {
            let (call, rest) = line.split_once('(')?;
            let on_log = rest.split(',').next()?.contains("corral.db-wal>");
            match call {
                "pwrite64" | "write" | "pwritev" | "writev" if on_log => Some(Event::Write),
                "write" if rest.starts_with("1<") => Some(Event::Print),
                "fsync" | "fdatasync" | "sync_file_range" | "syncfs" => Some(if on_log {
                    Event::Sync
                } else {
                    Event::OtherSync
                }),
                _ => None,
            }
        })
        .collect()
}

/// Runs one verb under strace; returns the plugin's stdout and the events of the trace.
fn traced(dir: &Path, command: &str, container: &str) -> (Value, Vec<Event>) {
    assert!(
        Path::new(STRACE).exists(),
        "{STRACE} is missing: run `make deps` (Debian package strace)"
    );
    let trace = dir.join(format!("trace-{command}-{container}"));
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "syncnet",
        "type": "bridge",
        "ipam": {
            "type": "corral-ipam",
            "dataDir": dir.join("state"),
            "ranges": [[{"subnet": "10.42.0.0/24"}]]
        }
    }))
    .unwrap();
    let mut strace = Command::new(STRACE);
    strace
        .args(["-f", "-y", "-qq", "-s", "0", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=write,pwrite64,writev,pwritev,fsync,fdatasync,sync_file_range,syncfs",
        ])
        .arg(common::binary());
    common::cni_env(&mut strace, command, container, "x", "eth0").env("CNI_PATH", "/usr/lib/cni");
    let mut child = common::spawn_piped(&mut strace, "strace");
    child.stdin.take().unwrap().write_all(&stdin).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{command} failed: {} {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let value = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap()
    };
    (value, events(&std::fs::read_to_string(&trace).unwrap()))
}

/// The log is written, then synced once, and only then is anything printed.
fn assert_synced_before_acknowledged(what: &str, events: &[Event], prints: bool) {
    let last_write = events
        .iter()
        .rposition(|e| *e == Event::Write)
        .unwrap_or_else(|| panic!("{what} wrote nothing to the log: {events:?}"));
    let sync = events
        .iter()
        .rposition(|e| *e == Event::Sync)
        .unwrap_or_else(|| panic!("{what} never synced the log: {events:?}"));
    assert!(
        sync > last_write,
        "{what} wrote to the log after its last sync: {events:?}"
    );
    let syncs = events
        .iter()
        .filter(|e| matches!(e, Event::Sync | Event::OtherSync))
        .count();
    assert_eq!(syncs, 1, "{what} should need exactly one sync: {events:?}");
    match events.iter().position(|e| *e == Event::Print) {
        Some(print) => assert!(
            print > sync,
            "{what} printed its result before the log was synced: {events:?}"
        ),
        None => assert!(!prints, "{what} printed nothing: {events:?}"),
    }
}

#[test]
#[ignore = "needs strace; `make test` runs it"]
fn add_and_del_sync_the_log_before_they_answer() {
    let dir = tempfile::tempdir().unwrap();
    // The first call creates the database (and syncs its directory): not the steady state.
    let (first, _) = traced(dir.path(), "ADD", "warm");
    assert_eq!(first["ips"][0]["address"], "10.42.0.2/24");

    let (second, events) = traced(dir.path(), "ADD", "c1");
    assert_eq!(second["ips"][0]["address"], "10.42.0.3/24");
    assert_synced_before_acknowledged("ADD", &events, true);

    let (_, events) = traced(dir.path(), "DEL", "c1");
    assert_synced_before_acknowledged("DEL", &events, false);

    // An ADD that finds its attachment already recorded writes nothing, but still syncs the
    // log before it answers: the record it read may be the commit of an ADD that was killed
    // before its own sync. The same holds for a DEL that finds nothing to release.
    let (again, events) = traced(dir.path(), "ADD", "warm");
    assert_eq!(again["ips"][0]["address"], "10.42.0.2/24");
    assert_answered_from_synced_state("repeated ADD", &events, true);
    let (_, events) = traced(dir.path(), "DEL", "c1");
    assert_answered_from_synced_state("repeated DEL", &events, false);
}

/// Nothing written, one sync, and the answer after it.
fn assert_answered_from_synced_state(what: &str, events: &[Event], prints: bool) {
    assert!(
        !events.contains(&Event::Write),
        "{what} wrote to the log: {events:?}"
    );
    let syncs: Vec<usize> = (0..events.len())
        .filter(|&i| matches!(events[i], Event::Sync | Event::OtherSync))
        .collect();
    assert!(
        syncs.len() == 1 && events[syncs[0]] == Event::Sync,
        "{what} should sync the log once: {events:?}"
    );
    match events.iter().position(|e| *e == Event::Print) {
        Some(print) => assert!(
            print > syncs[0],
            "{what} answered before syncing: {events:?}"
        ),
        None => assert!(!prints, "{what} printed nothing: {events:?}"),
    }
}
