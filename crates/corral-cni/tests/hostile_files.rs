//! Files the configuration names, or finds, that are not what they should be: the real
//! corral-ipam binary must answer at once with a clear error (or, for host-local's files, go
//! on without handing out their addresses), never hang, never read without bound.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common;

use common::{Outcome, plugin, run, run_within};

fn conf(dir: &Path, extra: Value) -> Vec<u8> {
    let mut ipam = json!({
        "type": "corral-ipam",
        "dataDir": dir,
        "ranges": [[{"subnet": "10.44.0.0/24"}]],
    });
    for (k, v) in extra.as_object().unwrap() {
        ipam[k] = v.clone();
    }
    serde_json::to_vec(&json!({"cniVersion": "1.0.0", "name": "files", "ipam": ipam})).unwrap()
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// A hang is what broke: a call that does not answer within seconds is a failure.
const QUICK: Duration = Duration::from_secs(20);

fn add(stdin: &[u8], container: &str) -> Outcome {
    run_within(QUICK, plugin("ADD", container, "eth0", &[]), stdin)
}

/// Regression: `"resolvConf": "/dev/zero"` grew corral-ipam to 1.4 GB, and a FIFO made it wait
/// for a writer while it held the data directory's lock.
#[test]
fn a_resolv_conf_that_is_not_a_small_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let huge = dir.path().join("huge");
    std::fs::write(&huge, "nameserver 10.0.0.1\n".repeat(5000)).unwrap();
    let cases: [(&Path, u64, &str); 5] = [
        (Path::new("/dev/zero"), 7, "character device"),
        (&fifo, 7, "fifo"),
        (&huge, 7, "larger than 65536 bytes"),
        (dir.path(), 7, "directory"),
        (&dir.path().join("absent"), 5, "No such file"),
    ];
    for (path, code, needle) in cases {
        let out = add(&conf(&state, json!({"resolvConf": path})), "c1");
        assert_eq!(out.error_code(), code, "{}: {}", path.display(), out.stdout);
        let msg = out.json()["msg"].as_str().unwrap().to_owned();
        assert!(
            msg.contains("ipam.resolvConf") && msg.contains(needle),
            "{}: {msg}",
            path.display()
        );
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
    // Nothing was allocated by the refused calls, and a good file still works.
    let good = dir.path().join("resolv.conf");
    std::fs::write(&good, "nameserver 10.0.0.53\nsearch example.org\n").unwrap();
    let out = add(&conf(&state, json!({"resolvConf": good})), "c2");
    assert_eq!(out.addresses(), ["10.44.0.2/24"]);
    assert_eq!(out.json()["dns"]["nameservers"], json!(["10.0.0.53"]));
}

/// Regression: a FIFO among host-local's files hung the takeover while it held the lock.
/// Files that cannot be read as host-local writes them keep their addresses (host-local may
/// hold them) and are reported on stderr.
#[test]
fn odd_files_among_host_locals_keep_their_addresses_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let network = dir.path().join("files");
    std::fs::create_dir(&network).unwrap();
    mkfifo(&network.join("10.44.0.2"));
    std::fs::create_dir(network.join("10.44.0.3")).unwrap();
    std::fs::write(network.join("10.44.0.4"), vec![b'x'; 100_000]).unwrap();
    std::fs::write(network.join("10.44.0.5"), "held\r\neth0").unwrap();
    mkfifo(&network.join("last_reserved_ip.0"));
    let out = add(&conf(dir.path(), json!({})), "new");
    assert_eq!(out.addresses(), ["10.44.0.6/24"], "{}", out.stderr);
    for needle in ["fifo", "directory", "larger than 4096 bytes"] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    // The readable entry was taken over with its attachment.
    let held = run("ADD", "held", "eth0", &[], &conf(dir.path(), json!({})));
    assert_eq!(held.addresses(), ["10.44.0.5/24"]);
}

/// Regression (found by the fuzz target `host_local`): two files naming one IPv6 address in two
/// texts were taken over as two allocations of it, which the store refused, so every call on
/// the network failed; the address is taken over once, from its canonical name.
#[test]
fn one_address_named_by_two_host_local_files_is_taken_over_once() {
    let dir = tempfile::tempdir().unwrap();
    let network = dir.path().join("files");
    std::fs::create_dir(&network).unwrap();
    std::fs::write(network.join("fd44::2"), "held\r\neth0").unwrap();
    std::fs::write(network.join("fd44:0::0002"), "other\r\neth0").unwrap();
    let v6 = json!({"ranges": [[{"subnet": "fd44::/64"}]]});
    let out = add(&conf(dir.path(), v6.clone()), "new");
    assert_eq!(out.addresses(), ["fd44::3/64"], "{}", out.stderr);
    assert!(
        out.stderr.contains("fd44:0::0002 names fd44::2 again"),
        "{}",
        out.stderr
    );
    let held = run("ADD", "held", "eth0", &[], &conf(dir.path(), v6));
    assert_eq!(held.addresses(), ["fd44::2/64"]);
}

/// Regression: a `dataDir` that is a regular file gave "File exists (os error 17)".
#[test]
fn a_data_dir_that_is_a_file_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "precious").unwrap();
    for (data_dir, blocker) in [(file.clone(), &file), (file.join("sub"), &file)] {
        let out = add(&conf(&data_dir, json!({})), "c1");
        assert_eq!(out.error_code(), 7, "{}", out.stdout);
        let msg = out.json()["msg"].as_str().unwrap().to_owned();
        assert!(
            msg.starts_with("ipam.dataDir: ")
                && msg.contains(&data_dir.display().to_string())
                && msg.contains(&format!("{} is a regular file", blocker.display()))
                && !msg.contains("os error"),
            "{msg}"
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
}
