//! The real corral-ipam binary, executed as a container runtime does, and what it answered:
//! shared by the test files that run it.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The corral-ipam under test: this build's, or the one `CORRAL_IPAM_BIN` names (`make test`
/// also runs these tests against the installed build from `make plugin`).
pub fn binary() -> String {
    std::env::var("CORRAL_IPAM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_corral-ipam").into())
}

pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    /// Warnings the plugin printed for the runtime's log.
    pub stderr: String,
}

impl Outcome {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    /// The spec's error object: exit status non-zero, `code` as given.
    pub fn error_code(&self) -> u64 {
        assert_ne!(self.code, 0, "expected a failure, got {:?}", self.stdout);
        let value = self.json();
        assert!(
            value["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{value}"
        );
        value["code"].as_u64().expect("error code")
    }

    pub fn addresses(&self) -> Vec<String> {
        assert_eq!(self.code, 0, "plugin failed: {}", self.stdout);
        self.json()["ips"]
            .as_array()
            .expect("ips")
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// How long one call may take before the test calls it hung (a call takes milliseconds; the
/// margin is for a loaded machine).
pub const DEADLINE: Duration = Duration::from_secs(60);

pub use corral_cni::testing::cni_env;

/// Starts `command` with all three of its standard streams piped (`what` it is, if it does
/// not start).
pub fn spawn_piped(command: &mut Command, what: &str) -> std::process::Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{what} does not start: {error}"))
}

/// Runs corral-ipam as a runtime does; a call still running after [`DEADLINE`] is killed and
/// fails the test (a plugin that hangs holds its data directory's lock for every other call).
pub fn run(
    command: &str,
    container: &str,
    ifname: &str,
    extra: &[(&str, &str)],
    stdin: &[u8],
) -> Outcome {
    run_within(DEADLINE, plugin(command, container, ifname, extra), stdin)
}

/// corral-ipam set up for one call as a runtime sets it up: the CNI variables and `extra`.
pub fn plugin(command: &str, container: &str, ifname: &str, extra: &[(&str, &str)]) -> Command {
    let mut plugin = Command::new(binary());
    cni_env(&mut plugin, command, container, container, ifname)
        .env("CNI_PATH", "/usr/lib/cni")
        .envs(extra.iter().copied());
    plugin
}

/// [`run`] of a [`plugin`] call with a deadline of its own.
pub fn run_within(deadline: Duration, mut plugin: Command, stdin: &[u8]) -> Outcome {
    // The command and container, for the message of a hang.
    let call: Vec<String> = ["CNI_COMMAND", "CNI_CONTAINERID"]
        .iter()
        .filter_map(|name| {
            let (_, value) = plugin.get_envs().find(|(key, _)| key == name)?;
            Some(value?.to_string_lossy().into_owned())
        })
        .collect();
    let mut child = spawn_piped(&mut plugin, "corral-ipam");
    let mut input = child.stdin.take().unwrap();
    // The plugin may refuse before reading everything; a broken pipe is then expected.
    let _ = input.write_all(stdin);
    drop(input);
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "corral-ipam {} hung: killed after {deadline:?}",
                call.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome {
        code: status.code().expect("exited, not killed"),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}
