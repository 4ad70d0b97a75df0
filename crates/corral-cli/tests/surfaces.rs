//! The daemons' own surfaces (issue 24): a bearer token file that others can read is refused at
//! start, naming the file and its mode, by `corral agent` (`--token-file`, the file's
//! `token_file`) and `corral operator` (`--token-file`), as ssh refuses a private key; the
//! agent's socket is given the group asked for (`--socket-group`, `socket_group`), mode 0660,
//! and a group that does not exist is a clear error; and at `--log-level trace` neither daemon
//! writes its token to its log or echoes a token it was sent in an answer.
//!
//! None needs etcd: the operator reaches its API (and its refusals) before it reaches etcd.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cluster_common;
use crate::common;

use cluster_common::wait_showing;
use common::{Agent, BINARY};

const TOKEN: &str = "tok-5e1b9d7c3a8f2046-never-logged";

/// A loopback address free when asked (the daemon binds it a moment later).
fn free_addr() -> SocketAddr {
    let port = corral_etcd::testing::free_ports(1).expect("a free port")[0];
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// An etcd URL nothing listens on.
fn unreachable_etcd() -> String {
    format!("http://{}", free_addr())
}

/// `corral <args>` run to its end, which must refuse to start (exit 2): its stderr.
fn refused(args: &[&OsStr]) -> String {
    let output = Command::new(BINARY)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code().unwrap_or(-1), 2, "{stderr}");
    stderr
}

/// `corral agent` in `dir` (`dir/state`, `dir/agent.sock`) with `extra`, which must refuse to
/// start: its stderr.
fn agent_refused(dir: &Path, extra: &[&OsStr]) -> String {
    let (state, socket) = (dir.join("state"), dir.join("agent.sock"));
    let mut args: Vec<&OsStr> = vec!["agent".as_ref()];
    args.extend(common::serve_args(&state, &socket, extra));
    refused(&args)
}

/// A token file of `mode` in `dir`.
fn token_file(dir: &Path, mode: u32) -> std::path::PathBuf {
    let path = dir.join(format!("token-{mode:o}"));
    std::fs::write(&path, TOKEN).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn refusal(path: &Path, mode: u32) -> String {
    format!(
        "token file {} is readable by others (mode {mode:04o}): chmod 600 it",
        path.display()
    )
}

#[test]
fn the_agent_refuses_a_token_file_others_can_read_by_flag_and_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let tcp = free_addr().to_string();
    for mode in [0o644, 0o640] {
        let path = token_file(dir, mode);
        let stderr = agent_refused(
            dir,
            &[
                "--tcp".as_ref(),
                tcp.as_ref(),
                "--token-file".as_ref(),
                path.as_os_str(),
            ],
        );
        assert!(stderr.contains(&refusal(&path, mode)), "{stderr}");
        assert!(!stderr.contains(TOKEN), "{stderr}");
    }
    // The configuration file's `token_file` the same.
    let path = token_file(dir, 0o604);
    let config = common::agent_toml(dir, &format!("tcp = \"{tcp}\"\ntoken_file = {path:?}\n"));
    let stderr = refused(&["agent".as_ref(), "--config".as_ref(), config.as_os_str()]);
    assert!(stderr.contains(&refusal(&path, 0o604)), "{stderr}");
    assert!(!dir.join("agent.sock").exists());
}

#[test]
fn the_operator_refuses_a_token_file_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let path = token_file(dir, 0o644);
    let etcd = unreachable_etcd();
    let tcp = free_addr().to_string();
    let stderr = refused(&[
        "operator".as_ref(),
        "--etcd".as_ref(),
        etcd.as_ref(),
        "--api-socket".as_ref(),
        dir.join("op.sock").as_os_str(),
        "--api-tcp".as_ref(),
        tcp.as_ref(),
        "--token-file".as_ref(),
        path.as_os_str(),
    ]);
    assert!(stderr.contains(&refusal(&path, 0o644)), "{stderr}");
    assert!(!stderr.contains(TOKEN), "{stderr}");
}

#[test]
fn a_socket_group_that_does_not_exist_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stderr = agent_refused(
        dir,
        &["--socket-group".as_ref(), "corral-no-such-group".as_ref()],
    );
    assert!(
        stderr.contains("socket_group corral-no-such-group: no such group in /etc/group"),
        "{stderr}"
    );
    assert!(!dir.join("agent.sock").exists());
}

/// A group made for the test (`groupadd`), removed when dropped.
struct TestGroup(String);

impl Drop for TestGroup {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.0).status();
    }
}

#[test]
fn the_agent_socket_gets_the_group_asked_for_by_flag_and_by_file() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "skipped: creating a group (groupadd) needs root, and an unprivileged agent may \
             give its socket only a group it is in"
        );
        return;
    }
    let name = format!("corral-t{}", std::process::id());
    let created = Command::new("groupadd")
        .args(["--system", &name])
        .status()
        .expect("groupadd runs (Debian's passwd package)");
    assert!(created.success(), "groupadd {name}");
    let _group = TestGroup(name.clone());
    let gid = std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f[0] == name).then(|| f[2].parse::<u32>().unwrap())
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (state, socket) = (dir.join("state"), dir.join("agent.sock"));
    // By flag.
    let agent = Agent::serve_with(&state, &socket, &["--socket-group".as_ref(), name.as_ref()]);
    let metadata = std::fs::metadata(&socket).unwrap();
    assert_eq!(metadata.gid(), gid);
    assert_eq!(metadata.mode() & 0o777, 0o660);
    drop(agent);
    // By the configuration file.
    let config = common::agent_toml(dir, &format!("socket_group = {name:?}\n"));
    let _agent = Agent::start(&["--config".as_ref(), config.as_os_str()], &socket);
    let metadata = std::fs::metadata(&socket).unwrap();
    assert_eq!(metadata.gid(), gid);
    assert_eq!(metadata.mode() & 0o777, 0o660);
}

/// One request on `addr` with `Authorization: Bearer <token>`: the whole answer.
fn request(addr: SocketAddr, method: &str, path: &str, token: &str, body: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Both daemons at `--log-level trace`, with their TCP listeners' token: requests with the
/// token, with a wrong one (which is a secret too), with bodies that are refused; no log line
/// and no answer holds either token.
#[test]
fn at_trace_level_no_token_is_logged_or_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let path = token_file(dir, 0o600);
    const WRONG: &str = "wrong-9c2e7a41d05b83f6-secret-too";
    let trace: [&OsStr; 2] = ["--log-level".as_ref(), "trace".as_ref()];

    let agent_tcp = free_addr();
    let agent_tcp_text = agent_tcp.to_string();
    let socket = dir.join("agent.sock");
    let state = dir.join("state");
    let agent = Agent::serve_with(
        &state,
        &socket,
        &[
            "--tcp".as_ref(),
            agent_tcp_text.as_ref(),
            "--token-file".as_ref(),
            path.as_os_str(),
            trace[0],
            trace[1],
        ],
    );
    let mut answers = Vec::new();
    answers.push(request(agent_tcp, "GET", "/v1/status", TOKEN, ""));
    answers.push(request(
        agent_tcp,
        "POST",
        "/v1/allocate",
        TOKEN,
        r#"{"scope":"node","pool":"no-such-pool","owner":"x"}"#,
    ));
    answers.push(request(agent_tcp, "GET", "/v1/status", WRONG, ""));
    assert!(answers[0].starts_with("HTTP/1.1 200"), "{}", answers[0]);
    assert!(answers[2].starts_with("HTTP/1.1 401"), "{}", answers[2]);

    let operator_tcp = free_addr();
    let operator_tcp_text = operator_tcp.to_string();
    let etcd = unreachable_etcd();
    let operator_log = dir.join("operator.log");
    let mut operator = common::spawn_logged(
        Command::new(BINARY)
            .args(["operator", "--etcd", &etcd, "--replica", "op-a"])
            .arg("--api-socket")
            .arg(dir.join("op.sock"))
            .args(["--api-tcp", &operator_tcp_text, "--token-file"])
            .arg(&path)
            .args(trace),
        &operator_log,
    );
    wait_showing(
        "the operator serves its api",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&operator_log)
                .unwrap_or_default()
                .contains("serving the api")
        },
        || std::fs::read_to_string(&operator_log).unwrap_or_default(),
    );
    answers.push(request(operator_tcp, "GET", "/v1/status", TOKEN, ""));
    answers.push(request(
        operator_tcp,
        "GET",
        "/v1/nodes/NOT_A_NAME",
        TOKEN,
        "",
    ));
    answers.push(request(operator_tcp, "GET", "/v1/status", WRONG, ""));
    assert!(answers[5].starts_with("HTTP/1.1 401"), "{}", answers[5]);

    // Both stopped, so every line is written.
    let pid = rustix::process::Pid::from_raw(operator.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let _ = operator.wait();
    let agent_log = agent.log();
    drop(agent);
    let operator_log = std::fs::read_to_string(&operator_log).unwrap();
    assert!(
        agent_log.contains("TRACE") || agent_log.contains("DEBUG"),
        "the agent did not log at trace level:\n{agent_log}"
    );
    for (who, text) in [
        ("the agent's log", agent_log.as_str()),
        ("the operator's log", operator_log.as_str()),
    ]
    .into_iter()
    .chain(answers.iter().map(|a| ("an answer", a.as_str())))
    {
        for secret in [TOKEN, WRONG] {
            assert!(!text.contains(secret), "{who} holds {secret}:\n{text}");
        }
    }
}
