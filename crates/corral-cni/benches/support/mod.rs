//! Spawning a CNI plugin as a runtime does, timing it, and summarising the samples.

pub mod prefill;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use corral_cni::testing::cni_call;
use serde_json::json;

/// The network name both plugins see: host-local's directory and corral's scope.
pub const NETWORK: &str = "benchnet";
/// The one range set both plugins are given.
pub const SUBNET: &str = "10.77.0.0/16";
/// Host addresses of the /16 (all but the network and broadcast addresses).
pub const HOSTS: usize = 65_534;
/// Addresses either plugin hands out: the hosts less the gateway (10.77.0.1).
pub const ALLOCATABLE: usize = HOSTS - 1;
/// Addresses held in the "95% full" scenario: 95% of the hosts, rounded.
pub const FILLED: usize = 62_258;

/// SplitMix64: a deterministic stream for container IDs and the choice of free addresses.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 64-hex-character container ID, as container runtimes pass; `stream` keeps the IDs of
/// different phases apart.
pub fn container_id(stream: u64, i: u64) -> String {
    let base = (stream << 40) | i;
    (0..4)
        .map(|k| format!("{:016x}", mix(base * 4 + k)))
        .collect()
}

/// One IPAM plugin under test.
#[derive(Clone, Debug)]
pub struct Plugin {
    /// Column heading.
    pub label: &'static str,
    /// The executable.
    pub path: PathBuf,
    /// `ipam.type` in the configuration.
    pub ipam_type: &'static str,
}

impl Plugin {
    /// The network configuration for this plugin: identical for both plugins but for
    /// `ipam.type` and `ipam.dataDir`.
    pub fn config(&self, data_dir: &Path) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "bridge",
            "ipam": {
                "type": self.ipam_type,
                "dataDir": data_dir,
                "ranges": [[{"subnet": SUBNET}]],
            }
        }))
        .expect("config serialises")
    }
}

/// Runs `program args…` with the CNI environment of `command` on `container` and `stdin` on
/// its standard input, exactly as a runtime executes a plugin; returns the time from just
/// before the spawn to just after exit (with all output read).
pub fn invoke(
    program: &Path,
    args: &[&str],
    command: &str,
    container: &str,
    stdin: &[u8],
) -> (Duration, Output) {
    let start = Instant::now();
    let mut child = cni_call(Command::new(program).args(args), command, container)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let mut input = child.stdin.take().expect("stdin is piped");
    // `/bin/true` exits without reading: a broken pipe is expected there.
    let _ = input.write_all(stdin);
    drop(input);
    let output = child.wait_with_output().expect("wait for the plugin");
    (start.elapsed(), output)
}

/// One plugin call that must succeed; panics with the plugin's output otherwise.
pub fn call(plugin: &Plugin, command: &str, container: &str, stdin: &[u8]) -> (Duration, String) {
    let (elapsed, output) = invoke(&plugin.path, &[], command, container, stdin);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {command} {container} failed ({}): {stdout} {}",
        plugin.label,
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    (elapsed, stdout)
}

/// The IPv4 address (without prefix length) of an ADD result.
pub fn added_address(stdout: &str) -> std::net::IpAddr {
    let value: serde_json::Value = serde_json::from_str(stdout).expect("ADD prints JSON");
    let cidr = value["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {stdout}"));
    let addr = cidr.split('/').next().unwrap_or(cidr);
    addr.parse().expect("an IP address")
}

/// Latency figures of one series of samples.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
}

impl Latency {
    /// Nearest-rank percentiles: p is the sample at rank ⌈p·n⌉ of the sorted samples (for
    /// n < 100, p99 is therefore the largest sample).
    pub fn of(samples: &[Duration]) -> Latency {
        assert!(!samples.is_empty(), "no samples");
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let rank = |q: f64| {
            let r = (q * sorted.len() as f64).ceil() as usize;
            sorted[r.clamp(1, sorted.len()) - 1]
        };
        Latency {
            n: sorted.len(),
            p50: rank(0.50),
            p99: rank(0.99),
        }
    }
}

/// Milliseconds with a precision that suits the value.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Peak resident set size (KiB) of one run of `program`, read by GNU time (`%M`).
pub fn peak_rss_kib(
    program: &Path,
    command: &str,
    container: &str,
    stdin: &[u8],
    scratch: &Path,
) -> u64 {
    let time = Path::new("/usr/bin/time");
    let report = scratch.join("time.out");
    let text = report_under(
        time,
        &["-f", "%M"],
        &report,
        program,
        command,
        container,
        stdin,
    );
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected GNU time output {text:?}"))
}

/// How many times one run of `program` forced data to disk (`fsync`, `fdatasync`,
/// `sync_file_range`, `syncfs`), counted by strace; `None` without strace.
pub fn syncs(
    program: &Path,
    command: &str,
    container: &str,
    stdin: &[u8],
    scratch: &Path,
) -> Option<usize> {
    let strace = Path::new("/usr/bin/strace");
    if !strace.exists() {
        return None;
    }
    let options = [
        "-f",
        "-qq",
        "-e",
        "trace=fsync,fdatasync,sync_file_range,syncfs",
    ];
    let report = scratch.join("strace.out");
    let text = report_under(
        strace, &options, &report, program, command, container, stdin,
    );
    let calls = ["fsync(", "fdatasync(", "sync_file_range(", "syncfs("];
    Some(
        text.lines()
            .filter(|line| calls.iter().any(|call| line.contains(call)))
            .count(),
    )
}

/// The report `tool` (run with `options`, then `-o report`) writes of one run of `program`.
fn report_under(
    tool: &Path,
    options: &[&str],
    report: &Path,
    program: &Path,
    command: &str,
    container: &str,
    stdin: &[u8],
) -> String {
    let program_text = program.to_str().expect("UTF-8 path");
    let report_text = report.to_str().expect("UTF-8 path");
    let mut args = options.to_vec();
    args.extend(["-o", report_text, program_text]);
    let (_, output) = invoke(tool, &args, command, container, stdin);
    assert!(
        output.status.success(),
        "{program_text} {command} under {} failed: {}",
        tool.display(),
        String::from_utf8_lossy(&output.stdout)
    );
    std::fs::read_to_string(report)
        .unwrap_or_else(|error| panic!("{} wrote no report: {error}", tool.display()))
}
