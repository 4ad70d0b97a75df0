//! A real failing disk under a running agent: its state directory is on an ext4 filesystem on
//! a loop device, whose backing file is then cut to 1 MiB, so the next fdatasync of the log
//! fails with EIO as a dying disk's would. The agent must not acknowledge that change, must
//! refuse every later one (the kernel may have dropped the pages it could not write, so a
//! later sync that succeeds would prove nothing), and must say so: 503 on `/healthz` and
//! `/readyz`, `corral_store_sync_failed 1` in `/metrics`.
//!
//! Needs root, `losetup`, `mkfs.ext4` and `mount` (`make deps`); fails loudly without them.

use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Agent;
use corral_api::AllocateRequest;
use corral_client::{Client, Error};

fn run(program: &str, args: &[&OsStr]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (run `make deps`; needs root): {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}); this test needs root and loop devices: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// An ext4 filesystem on a loop device, mounted; unmounted and detached when dropped.
struct LoopFs {
    image: PathBuf,
    device: String,
    mount: PathBuf,
}

impl LoopFs {
    fn new(dir: &Path) -> LoopFs {
        let image = dir.join("disk.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .expect("disk image");
        run(
            "mkfs.ext4",
            &["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
        );
        let device = run(
            "losetup",
            &["-f".as_ref(), "--show".as_ref(), image.as_os_str()],
        );
        let mount = dir.join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let fs = LoopFs {
            image,
            device,
            mount,
        };
        run("mount", &[fs.device.as_ref(), fs.mount.as_os_str()]);
        fs
    }

    /// The disk fails: the device shrinks to 1 MiB under the mounted filesystem, so writing
    /// back anything beyond (the log's pages, the journal) is an I/O error.
    fn fail(&self) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.image)
            .and_then(|f| f.set_len(1 << 20))
            .expect("shrink the disk image");
        run("losetup", &["-c".as_ref(), self.device.as_ref()]);
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

fn allocate(client: &mut Client, owner: &str) -> Result<String, Error> {
    let request = AllocateRequest {
        scope: corral_api::NODE_SCOPE.into(),
        pool: corral_api::DEFAULT_POOL.into(),
        family: None,
        address: None,
        owner: owner.into(),
        key: None,
        lease_ms: None,
    };
    client
        .allocate(&request)
        .map(|answer| answer.allocations[0].address.to_string())
}

fn unavailable(result: Result<impl std::fmt::Debug, Error>, what: &str) -> String {
    match result {
        Err(Error::Api { status: 503, error }) => error.message,
        other => panic!("{what}: expected a 503 error answer, got {other:?}"),
    }
}

#[test]
#[ignore = "needs root and loop devices (ext4 on a loop device); `make test` runs it"]
fn a_failed_log_sync_refuses_every_change_and_fails_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let fs = LoopFs::new(dir.path());
    let state = fs.mount.join("state");
    let socket = dir.path().join("agent.sock");
    let agent = Agent::serve(&state, &socket);
    let mut client = Client::unix(&socket);
    allocate(&mut client, "before").expect("a healthy disk takes allocations");
    client.healthz().expect("healthy");

    fs.fail();
    // The first change after the failure is not acknowledged: its log sync fails.
    let message = unavailable(
        allocate(&mut client, "during"),
        "the change whose sync failed",
    );
    assert!(message.contains("store failed"), "{message}");
    // Nor is any later one, although a sync might now appear to succeed.
    for i in 0..3 {
        let message = unavailable(
            allocate(&mut client, &format!("after{i}")),
            "a later change",
        );
        assert!(message.contains("restart the agent"), "{message}");
    }
    for (probe, result) in [("healthz", client.healthz()), ("readyz", client.readyz())] {
        let message = unavailable(result, probe);
        assert!(message.contains("restarted"), "{probe}: {message}");
    }
    let metrics = client.metrics().expect("metrics still answer");
    assert!(
        metrics.lines().any(|l| l == "corral_store_sync_failed 1"),
        "{metrics}"
    );
    // Reads still answer from memory.
    client.status(None).expect("status answers");
    agent.kill();
}
