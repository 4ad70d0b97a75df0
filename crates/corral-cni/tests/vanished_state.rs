//! The real corral-ipam binary on a state directory whose database or log vanished from
//! outside: every verb fails with code 103 naming the file, and nothing is handed out again.

use std::path::Path;

use serde_json::{Value, json};

use crate::common;

use common::{Outcome, run};

fn conf(dir: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "testnet",
        "type": "bridge",
        "ipam": {"type": "corral-ipam", "dataDir": dir, "ranges": [[{"subnet": "10.9.0.0/24"}]]}
    }))
    .unwrap()
}

fn add(stdin: &[u8], container: &str) -> Outcome {
    run("ADD", container, "eth0", &[], stdin)
}

/// The error object, after checking it is the store's code and names `file`.
fn assert_store_refusal(out: &Outcome, file: &Path) -> Value {
    assert_eq!(out.error_code(), 103, "{}", out.stdout);
    let error = out.json();
    let msg = error["msg"].as_str().unwrap();
    assert!(msg.contains(&file.display().to_string()), "{msg}");
    assert!(msg.contains("to start afresh"), "{msg}");
    error
}

#[test]
fn a_database_truncated_to_zero_bytes_fails_with_103_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let stdin = conf(dir.path());
    assert_eq!(add(&stdin, "c1").addresses(), ["10.9.0.2/24"]);
    assert_eq!(add(&stdin, "c2").addresses(), ["10.9.0.3/24"]);
    let db = dir.path().join("corral.db");
    std::fs::File::create(&db).unwrap();
    let log = std::fs::read(dir.path().join("corral.db-wal")).unwrap();
    for verb in ["ADD", "DEL", "CHECK"] {
        let out = run(verb, "c3", "eth0", &[], &stdin);
        assert_store_refusal(&out, &db);
    }
    // Refused, not started afresh: the database is still empty and the log untouched, so
    // restoring the database brings everything back.
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0);
    assert_eq!(
        std::fs::read(dir.path().join("corral.db-wal")).unwrap(),
        log
    );
}

#[test]
fn a_deleted_log_that_held_commits_fails_with_103_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let stdin = conf(dir.path());
    for container in ["c1", "c2", "c3"] {
        add(&stdin, container).addresses();
    }
    let log = dir.path().join("corral.db-wal");
    std::fs::remove_file(&log).unwrap();
    let out = add(&stdin, "c4");
    assert_store_refusal(&out, &log);
    // Without the refusal, c4 would be given 10.9.0.2, which c1 still holds.
    assert!(!log.exists(), "the refusal created no log");
}
