//! The cluster over TLS end to end: real etcd that serves TLS only and asks for client
//! certificates (`--client-cert-auth`), `corral cluster init`, a real `corral operator` (TLS
//! flags), a real `corral agent` (TLS files in its configuration file's `[cluster]` table) that
//! gets a grant, and `corral cluster status` (TLS files from the environment). Then what each
//! fault says: another CA, no client certificate, a missing key, a key others can read, an
//! https:// URL without a CA; none of them is "is etcd running?". Last, a rotation: a key that
//! does not match is refused by the running operator (logged, its connections stay), a new
//! certificate and key are taken up.

use crate::cluster_common;
use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster_common::*;
use common::{Agent, BINARY};
use corral_etcd::testing::{EtcdCluster, Leaf, TestPki};

/// An agent configuration whose `[cluster]` table names etcd's TLS files.
fn agent_config_with_tls(dir: &Path, etcd: &EtcdCluster) -> std::path::PathBuf {
    let tls = etcd.client_tls().expect("TLS etcd");
    let path = agent_config(dir);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = format!(
        "{text}\n[cluster]\netcd_cacert = {:?}\netcd_cert = {:?}\netcd_key = {:?}\n",
        tls.ca_cert,
        tls.cert.expect("cert"),
        tls.key.expect("key"),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `command` with the etcd client files `[ca, cert, key]`: it must refuse to start (exit
/// 2); answers what it said.
fn refused_at_start(command: &mut Command, [ca, cert, key]: [&Path; 3]) -> String {
    let output = command
        .arg("--etcd-cacert")
        .arg(ca)
        .arg("--etcd-cert")
        .arg(cert)
        .arg("--etcd-key")
        .arg(key)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{err}");
    err
}

/// `corral cluster status` of cluster `t` with `args` and `envs`; answers (exit code, output).
fn status(etcd: &EtcdCluster, args: &[&str], envs: &[(&str, &OsStr)]) -> (i32, String) {
    let output = Command::new(BINARY)
        .args([
            "cluster",
            "status",
            "--etcd",
            &endpoints(etcd),
            "--cluster",
            "t",
        ])
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn operator_agent_and_cli_work_over_tls_and_each_fault_says_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = block_on(EtcdCluster::start_tls(1)).expect("TLS etcd starts (make deps)");
    assert!(endpoints(&etcd).starts_with("https://"));
    init(&etcd, dir.path(), DUAL);
    let operator = Operator::start(&etcd, dir.path(), "op-a");

    // The agent reads the TLS files from its configuration file, and gets its grant.
    let agent_dir = dir.path().join("a");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let config = agent_config_with_tls(&agent_dir, &etcd);
    let endpoints = endpoints(&etcd);
    let mut args = agent_args(&config, &endpoints, "node-a");
    args.extend(SHORT_LEASE.map(OsStr::new));
    let agent = Agent::start(&args, &agent_dir.join("agent.sock"));
    wait_ranges("node-a holds its ranges", &agent.socket, 2, 20);
    assert_eq!(grants(&etcd)["node-a"].len(), 2, "{:?}", grants(&etcd));

    // The CLI with the TLS files from the environment.
    let tls = etcd.client_tls().unwrap();
    let (cert, key) = (tls.cert.clone().unwrap(), tls.key.clone().unwrap());
    let envs: [(&str, &OsStr); 3] = [
        ("CORRAL_ETCD_CACERT", tls.ca_cert.as_os_str()),
        ("CORRAL_ETCD_CERT", cert.as_os_str()),
        ("CORRAL_ETCD_KEY", key.as_os_str()),
    ];
    let (code, out) = status(&etcd, &[], &envs);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("leader op-a, 1 node (1 served"), "{out}");

    // etcd's certificate from another CA: refused, and said so.
    let other = TestPki::new(&dir.path().join("other"), "other").unwrap();
    let ca = other.ca_cert();
    let (cert_s, key_s) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let (code, out) = status(
        &etcd,
        &[
            "--etcd-cacert",
            ca.to_str().unwrap(),
            "--etcd-cert",
            cert_s,
            "--etcd-key",
            key_s,
        ],
        &[],
    );
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("etcd's TLS certificate does not verify against the CA certificate given"),
        "{out}"
    );
    assert!(out.contains("are etcd's TLS files right?"), "{out}");
    assert!(!out.contains("is etcd running"), "{out}");

    // No client certificate: etcd refuses.
    let (code, out) = status(
        &etcd,
        &["--etcd-cacert", tls.ca_cert.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("etcd refused the TLS client certificate"),
        "{out}"
    );
    assert!(!out.contains("is etcd running"), "{out}");

    // A missing key: a usage error naming the file, before any connection.
    let missing = dir.path().join("missing-key.pem");
    let (code, out) = status(
        &etcd,
        &[
            "--etcd-cacert",
            tls.ca_cert.to_str().unwrap(),
            "--etcd-cert",
            cert_s,
            "--etcd-key",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!(
            "etcd TLS: cannot read the etcd client key {}",
            missing.display()
        )),
        "{out}"
    );

    // https:// without a CA.
    let (code, out) = status(&etcd, &[], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("needs the CA certificate that signs etcd's certificate"),
        "{out}"
    );

    // An agent whose key others can read does not start, and says which file.
    let exposed = dir.path().join("exposed-key.pem");
    std::fs::copy(&key, &exposed).unwrap();
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = refused_at_start(
        Command::new(BINARY)
            .args(["agent", "--data-dir"])
            .arg(dir.path().join("b-state"))
            .arg("--socket")
            .arg(dir.path().join("b.sock"))
            .args(["--etcd", &endpoints, "--node", "node-b"]),
        [&tls.ca_cert, &cert, &exposed],
    );
    assert!(
        err.contains(&format!(
            "the etcd client key {} can be read by others (mode 0644)",
            exposed.display()
        )),
        "{err}"
    );

    // Nor does an operator whose key file is missing.
    let err = refused_at_start(
        Command::new(BINARY)
            .args([
                "operator",
                "--etcd",
                &endpoints,
                "--cluster",
                "t",
                "--api-socket",
            ])
            .arg(dir.path().join("op-b.sock")),
        [&tls.ca_cert, &cert, &missing],
    );
    assert!(
        err.contains(&format!(
            "cannot read the etcd client key {}",
            missing.display()
        )),
        "{err}"
    );

    // Rotation: a key that is not the certificate's is refused, the operator says so and keeps
    // its connections; a new certificate and key are taken up (files read every 5 s).
    let pki = etcd.pki().unwrap();
    let (_, wrong_key) = pki.issue("wrong", Leaf::Client).unwrap();
    std::fs::copy(&wrong_key, &key).unwrap();
    wait_showing(
        "the operator refuses the rotated key",
        Duration::from_secs(60),
        || {
            operator
                .log()
                .contains("etcd's TLS files changed but cannot be used")
        },
        || operator.log(),
    );
    let (renewed_cert, renewed_key) = pki.issue("client", Leaf::Client).unwrap();
    assert_eq!((&renewed_cert, &renewed_key), (&cert, &key));
    wait_showing(
        "the operator reloads the new files",
        Duration::from_secs(60),
        || operator.log().contains("etcd's TLS files reloaded"),
        || operator.log(),
    );
    let (code, out) = status(&etcd, &[], &envs);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("leader op-a, 1 node (1 served"), "{out}");
}
