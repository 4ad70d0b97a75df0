//! The real `corral agent` process for tests and benches: started with arguments, waited on
//! until `/readyz` answers, and killed with SIGKILL when dropped (also when a test fails).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BINARY: &str = env!("CARGO_BIN_EXE_corral");

/// A running `corral agent`.
pub struct Agent {
    child: Child,
    pub socket: PathBuf,
}

impl Agent {
    /// `corral agent <args>`, serving on `socket` (which `args` must name, directly or in a
    /// configuration file); returns once it is ready.
    pub fn start(args: &[&std::ffi::OsStr], socket: &Path) -> Agent {
        Agent::start_binary(Path::new(BINARY), args, socket)
    }

    /// `corral agent --data-dir STATE --socket SOCKET`: no configuration file.
    pub fn serve(state: &Path, socket: &Path) -> Agent {
        Agent::serve_with(state, socket, &[])
    }

    /// [`Agent::serve`] with more arguments.
    pub fn serve_with(state: &Path, socket: &Path, extra: &[&std::ffi::OsStr]) -> Agent {
        Agent::start(&serve_args(state, socket, extra), socket)
    }

    /// [`Agent::serve`] on `dir/state` and `dir/agent.sock`.
    pub fn start_in(dir: &Path) -> Agent {
        Agent::serve(&dir.join("state"), &dir.join("agent.sock"))
    }

    /// [`Agent::start_in`] a new temporary directory; bound as `let (dir, agent) = ...`, the
    /// agent stops before the directory goes.
    pub fn start_in_tempdir() -> (tempfile::TempDir, Agent) {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start_in(dir.path());
        (dir, agent)
    }

    /// As [`Agent::start`], with another build of `corral`.
    pub fn start_binary(binary: &Path, args: &[&std::ffi::OsStr], socket: &Path) -> Agent {
        let mut command = Command::new(binary);
        command.arg("agent").args(args);
        Agent::start_command(command, socket)
    }

    /// Runs `command`, which must start `corral agent` on `socket` (through a shell, say);
    /// returns once it is ready.
    pub fn start_command(mut command: Command, socket: &Path) -> Agent {
        // What the agent says goes beside its socket (`agent.log`), for a failing test to show.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(socket.with_file_name("agent.log"))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("corral agent starts");
        let mut agent = Agent {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while corral_client::Client::unix(socket).readyz().is_err() {
            let exited = agent.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "the agent did not become ready (exit: {exited:?})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        agent
    }

    /// What the agent wrote to its standard error so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.socket.with_file_name("agent.log")).unwrap_or_default()
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (SIGTERM, SIGINT) to the agent.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    /// Waits for the agent to exit (`bound` only catches a hang) and answers how it ended.
    pub fn wait_exit(&mut self, bound: Duration) -> std::process::ExitStatus {
        let log = self.socket.with_file_name("agent.log");
        wait_exit(&mut self.child, bound, "the agent", &log)
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `corral agent`'s arguments (after the subcommand) with its state in `state`, its socket at
/// `socket`, then `extra`.
pub fn serve_args<'a>(
    state: &'a Path,
    socket: &'a Path,
    extra: &[&'a std::ffi::OsStr],
) -> Vec<&'a std::ffi::OsStr> {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--data-dir".as_ref(),
        state.as_os_str(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ];
    args.extend(extra);
    args
}

/// Starts `command`, its stdin and stdout closed and its stderr written to `log`; not waited
/// on.
pub fn spawn_logged(command: &mut Command, log: &Path) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|error| panic!("{command:?} does not start: {error}"))
}

/// Waits for `child` to exit (`bound` only catches a hang) and answers how it ended; on a hang
/// the failure names `what` and shows its `log` file.
pub fn wait_exit(
    child: &mut Child,
    bound: Duration,
    what: &str,
    log: &Path,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not exit (it hangs):\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `dir/agent.toml`: state in `dir/state`, the socket `dir/agent.sock`, and pool
/// `default` of `range` whose released addresses cool for `cooldown_ms`; answers its path.
pub fn agent_config_file(dir: &Path, range: &str, cooldown_ms: u64) -> PathBuf {
    agent_toml(
        dir,
        &format!(
            "\n[[pools]]\nname = \"default\"\nranges = [\"{range}\"]\ncooldown_ms = {cooldown_ms}\n"
        ),
    )
}

/// Writes `dir/agent.toml`: state in `dir/state`, the socket `dir/agent.sock`, then `rest`
/// (more of the file); answers its path.
pub fn agent_toml(dir: &Path, rest: &str) -> PathBuf {
    let path = dir.join("agent.toml");
    let head = format!(
        "data_dir = {:?}\nsocket = {:?}\n",
        dir.join("state"),
        dir.join("agent.sock"),
    );
    std::fs::write(&path, head + rest).unwrap();
    path
}

/// Writes a bearer token file at `path` with mode 0600 (the daemons refuse one others can
/// read).
pub fn write_token_file(path: &Path, token: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, token).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `corral --socket SOCKET <args>` with nothing on its standard input: what it wrote.
pub fn corral_at(socket: &Path, args: &[&str]) -> Output {
    Command::new(BINARY)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// The JSON a command that must have succeeded wrote.
pub fn ok_json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The `p`th percentile of sorted latencies (the benches' reports).
#[allow(dead_code)] // no test reports percentiles
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A duration in milliseconds, three decimals (the benches' reports).
#[allow(dead_code)] // no test reports durations
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// CNI network `podnet`, its pods taking addresses of the node's pool `pool`.
pub fn podnet(pool: &str) -> corral_api::CniNetwork {
    corral_api::CniNetwork {
        configured_pool: Some(pool.into()),
        ..corral_api::CniNetwork::on_node_pool("podnet", pool)
    }
}

/// Container `container`'s `eth0` on `podnet`.
pub fn pod_key(container: &str) -> corral_api::AttachmentKey {
    corral_api::AttachmentKey {
        network: "podnet".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
    }
}

/// A CNI ADD of `container` to `podnet` (pool `pool`) through the agent's API.
pub fn pod_add(
    client: &mut corral_client::Client,
    pool: &str,
    container: &str,
    owner: String,
) -> Result<corral_api::AllocateResponse, corral_client::Error> {
    client.cni_add(&corral_api::CniAddRequest {
        network: podnet(pool),
        key: pod_key(container),
        owner,
        sets: Vec::new(),
    })
}

/// [`pod_add`] on the agent at `socket`, owner `pod/CONTAINER`.
pub fn pod_add_at(
    socket: &Path,
    pool: &str,
    container: &str,
) -> Result<corral_api::AllocateResponse, corral_client::Error> {
    let owner = format!("pod/{container}");
    pod_add(
        &mut corral_client::Client::unix(socket),
        pool,
        container,
        owner,
    )
}

/// A CNI DEL of `container` from `podnet` (pool `pool`) through the agent's API.
pub fn pod_del(
    client: &mut corral_client::Client,
    pool: &str,
    container: &str,
) -> Result<corral_api::ReleaseResponse, corral_client::Error> {
    client.cni_del(&corral_api::CniKeyRequest {
        network: podnet(pool),
        key: pod_key(container),
    })
}

/// Interface `eni-I` (device I, the primary for 0) of pool `eni` on 10.0.0.0/16, holding
/// `count` addresses 10.0.I.FIRST and up.
pub fn eni_request(i: u32, first: u32, count: u32) -> corral_api::InterfaceRequest {
    corral_api::InterfaceRequest {
        pool: "eni".into(),
        id: format!("eni-{i:02}"),
        device_number: i,
        mac: format!("0a:00:00:00:00:{i:02x}"),
        subnets: vec!["10.0.0.0/16".into()],
        gateways: vec![],
        routes: vec!["10.0.0.0/8".into()],
        primary: i == 0,
        primary_addresses: vec![],
        trunk: false,
        excluded: false,
        addresses: (first..first + count)
            .map(|a| format!("10.0.{i}.{a}"))
            .collect(),
    }
}
