//! corral-ipam: the CNI IPAM plugin binary, a drop-in for host-local.
//!
//! Reads the CNI environment and the network configuration on stdin, chooses the backend the
//! configuration names (the node agent with `"agent"`, else the embedded store), runs one verb
//! durably, and prints the result (or the spec's error object) on stdout. No async runtime:
//! the process lives for one call.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use corral_cni::{
    Agent, CniError, Local, MAX_STDIN_BYTES, backend, parse_invocation, reply_version, version_json,
};
use corral_core::Timestamp;

/// The installed build is on musl (see `make plugin`); mimalloc serves every allocation there
/// (see corral-cni's Cargo.toml).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn now() -> Timestamp {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Timestamp::from_unix_millis(millis)
}

fn run(stdin: &[u8]) -> Result<Option<String>, CniError> {
    let invocation = parse_invocation(std::env::vars_os(), stdin)?;
    let Some(config) = invocation.config() else {
        // VERSION answers in the version it was given, when it speaks it (spec 1.0+).
        return Ok(Some(version_json(reply_version(stdin))));
    };
    match &config.ipam.agent {
        Some(socket) => backend::run(&Agent::new(socket), &invocation, now()),
        None => backend::run(&Local, &invocation, now()),
    }
}

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    // One byte more than allowed, so an oversized config is seen and refused, not truncated.
    let read = std::io::stdin()
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut stdin);
    let outcome = match read {
        Ok(_) => run(&stdin),
        Err(error) => Err(CniError::io(format!("cannot read stdin: {error}"))),
    };
    let mut stdout = std::io::stdout().lock();
    match outcome {
        Ok(output) => {
            if let Some(text) = output {
                let _ = writeln!(stdout, "{text}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            let _ = writeln!(stdout, "{}", error.to_json(reply_version(&stdin)));
            ExitCode::FAILURE
        }
    }
}
