//! The real corral-ipam binary, executed as a container runtime does, and what it answered:
//! shared by the test files that run it.

// Each test file uses part of this module.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

/// The corral-ipam under test: this build's, or the one `CORRAL_IPAM_BIN` names (`make test`
/// also runs these tests against the installed build from `make plugin`).
pub fn binary() -> String {
    std::env::var("CORRAL_IPAM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_corral-ipam").into())
}

pub struct Outcome {
    pub code: i32,
    pub stdout: String,
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

pub fn run(
    command: &str,
    container: &str,
    ifname: &str,
    extra: &[(&str, &str)],
    stdin: &[u8],
) -> Outcome {
    let mut child = Command::new(binary())
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", format!("/var/run/netns/{container}"))
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", "/usr/lib/cni")
        .envs(extra.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral-ipam starts");
    let mut input = child.stdin.take().unwrap();
    // The plugin may refuse before reading everything; a broken pipe is then expected.
    let _ = input.write_all(stdin);
    drop(input);
    let output = child.wait_with_output().unwrap();
    Outcome {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
    }
}
