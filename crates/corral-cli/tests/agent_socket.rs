//! `corral agent --socket PATH` with something already at PATH, run as the real binary: only a
//! stale socket is replaced; anything else is refused, named, and left byte for byte.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{Agent, BINARY};

/// The exit code of an agent that could not start (`corral --help` lists it).
const AGENT_FAILED: i32 = 4;

/// Runs `corral agent` on `dir/state` and `socket`, expecting it to refuse to start; returns
/// its exit code and what it printed on stderr.
fn agent_refuses(dir: &Path, socket: &Path) -> (i32, String) {
    let mut child = Command::new(BINARY)
        .arg("agent")
        .arg("--data-dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral agent starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent did not refuse {} within 30 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Regression: `corral agent --socket agent.toml` deleted the configuration file and put its
/// socket there.
#[test]
fn a_regular_file_at_the_socket_path_is_refused_and_left_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.toml");
    let contents = b"data_dir = \"/var/lib/corral\"\n[[pools]]\nname = \"default\"\n";
    std::fs::write(&path, contents).unwrap();
    let (code, stderr) = agent_refuses(dir.path(), &path);
    assert_eq!(code, AGENT_FAILED, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "corral: agent: socket {}: it is a regular file, not a socket; refusing to \
             replace it (name a socket path that does not exist yet)",
            path.display()
        )
    );
    assert_eq!(std::fs::read(&path).unwrap(), contents);
}

#[test]
fn a_directory_at_the_socket_path_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sockets");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("keep"), b"x").unwrap();
    let (code, stderr) = agent_refuses(dir.path(), &path);
    assert_eq!(code, AGENT_FAILED, "{stderr}");
    assert!(
        stderr.contains("it is a directory, not a socket"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"x");
}

/// A socket something answers on is another agent's: refused, and it keeps working.
#[test]
fn a_socket_another_process_answers_on_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let (code, stderr) = agent_refuses(dir.path(), &socket);
    assert_eq!(code, AGENT_FAILED, "{stderr}");
    assert!(
        stderr.contains("another agent is listening on it"),
        "{stderr}"
    );
    assert!(
        std::fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let _client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    listener.accept().unwrap();
}

/// A socket nobody answers on (a killed agent's) is removed and bound again.
#[test]
fn a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    drop(UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "the stale socket file stays behind");
    let state = dir.path().join("state");
    let agent = Agent::serve(&state, &socket);
    assert!(
        corral_client::Client::unix(&socket).healthz().is_ok(),
        "the agent answers on the replaced socket"
    );
    agent.kill();
}
