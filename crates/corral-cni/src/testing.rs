//! Running CNI plugins as a container runtime does, for tests (feature `testing`; never in a
//! production path): the environment a runtime sets for one call ([`cni_env`], [`cni_call`]),
//! and Debian's
//! `host-local` run beside corral-ipam ([`host_local`]), as the plugin's own tests, the
//! command line's export test, the CNI bench and the AWS end-to-end test use them.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Where a runtime finds its plugins (`CNI_PATH`), and Debian installs them.
pub const CNI_PATH: &str = "/usr/lib/cni";

/// `command`'s environment as a runtime sets it for a CNI call, and nothing else: the verb,
/// the container, its namespace `/var/run/netns/NETNS`, the interface.
pub fn cni_env<'a>(
    command: &'a mut Command,
    verb: &str,
    container: &str,
    netns: &str,
    ifname: &str,
) -> &'a mut Command {
    command
        .env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", format!("/var/run/netns/{netns}"))
        .env("CNI_IFNAME", ifname)
}

/// `command` set up for one CNI call on interface `eth0` as a runtime sets it up: [`cni_env`]
/// with a namespace named after the container, [`CNI_PATH`], stdin and stdout piped.
pub fn cni_call<'a>(command: &'a mut Command, verb: &str, container: &str) -> &'a mut Command {
    cni_env(command, verb, container, container, "eth0")
        .env("CNI_PATH", CNI_PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
}

/// Debian's host-local, run as a runtime does ([`cni_call`]: container `container`) on
/// the network configuration `stdin`; its result (or null for DEL). The test fails if
/// host-local is not installed or refuses.
pub fn host_local(command: &str, container: &str, stdin: &[u8]) -> Value {
    let host_local = Path::new(CNI_PATH).join("host-local");
    assert!(
        host_local.exists(),
        "this test needs Debian's containernetworking-plugins (/usr/lib/cni/host-local); run `make test`"
    );
    let output = cni_call(&mut Command::new(host_local), command, container)
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(stdin)?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        output.status.success(),
        "host-local {command} {container}: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}
