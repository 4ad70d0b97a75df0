//! `corral operator --config FILE` with real processes: an operator started from its file
//! alone (no etcd flag, no CORRAL_* variable) leads on real etcd and grants; a flag and an
//! environment variable each win over the file; a bad file is refused before anything starts,
//! with the file, the key and what is wrong (a value written under a wrong key never echoed);
//! the file's TLS files (etcd with `--client-cert-auth`) and etcd user (auth on, the
//! operator's role from `corral cluster rbac`) work.
//!
//! The etcd tests need Debian's etcd (`make deps`) and are ignored by a plain `cargo test`.

use crate::cluster_common;
use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster_common::*;
use common::BINARY;
use corral_etcd::testing::EtcdCluster;

/// The variables `corral operator` reads: the tests give (or leave out) each on purpose.
const OPERATOR_ENV: &[&str] = &[
    "CORRAL_ETCD",
    "CORRAL_CLUSTER",
    "CORRAL_ETCD_CACERT",
    "CORRAL_ETCD_CERT",
    "CORRAL_ETCD_KEY",
    "CORRAL_ETCD_USER",
    "CORRAL_ETCD_PASSWORD_FILE",
    "CORRAL_OPERATOR_STATE_DIR",
    "CORRAL_LOG",
];

/// `corral operator` with `args` and only the `envs` of [`OPERATOR_ENV`].
fn operator_command(args: &[&OsStr], envs: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BINARY);
    command.arg("operator").args(args).stdin(Stdio::null());
    for name in OPERATOR_ENV {
        command.env_remove(name);
    }
    command.envs(envs.iter().copied());
    command
}

/// Replica `name` started with `--config config` and `args`, what it says in `dir/NAME.log`;
/// its API socket is the one `config` names (`dir/NAME.sock` by [`file_for`]).
fn start(
    dir: &Path,
    name: &str,
    config: &Path,
    args: &[&OsStr],
    envs: &[(&str, &str)],
) -> Operator {
    let log = dir.join(format!("{name}.log"));
    let mut all: Vec<&OsStr> = vec!["--config".as_ref(), config.as_os_str()];
    all.extend_from_slice(args);
    let child = operator_command(&all, envs)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("corral operator starts");
    Operator {
        child,
        log,
        socket: dir.join(format!("{name}.sock")),
    }
}

/// A configuration file for replica `name` in `dir`: its socket and state there, a 2 s lease,
/// then `rest` (tables).
fn file_for(dir: &Path, name: &str, rest: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "replica = {name:?}\nlease_ttl_secs = 2\napi_socket = {:?}\nstate_dir = {:?}\n{rest}",
            dir.join(format!("{name}.sock")),
            dir.join(format!("{name}-state")),
        ),
    )
    .unwrap();
    path
}

/// Waits until the replica on `operator`'s socket says it leads (20 s at most).
fn wait_leading(operator: &Operator) {
    wait_showing(
        "the operator leads",
        Duration::from_secs(20),
        || {
            operator.socket.exists()
                && operator_get(&operator.socket, "/v1/status").1["leading"] == true
        },
        || operator.log(),
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn an_operator_from_its_file_alone_leads_and_grants() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let config = file_for(
        dir.path(),
        "op-file",
        &format!(
            "[cluster]\nendpoints = [{:?}]\nname = \"t\"\n[log]\nformat = \"json\"\n",
            endpoints(&etcd)
        ),
    );
    let operator = start(dir.path(), "op-file", &config, &[], &[]);
    wait_leads(&etcd, "op-file", Duration::from_secs(20));
    wait_leading(&operator);
    // The file's state directory and log format are taken.
    let epoch = dir.path().join("op-file-state/etcd-epoch-t.json");
    wait_until("the epoch file", Duration::from_secs(20), || epoch.exists());
    assert!(
        operator.log().lines().all(|line| line.starts_with('{')),
        "{}",
        operator.log()
    );
    let agent = start_agent(&etcd, &dir.path().join("a"), "node-a");
    wait_ranges("node-a holds its grants", &agent.socket, 2, 20);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_flag_and_an_environment_variable_win_over_the_file() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    // The file names etcd nobody serves, another cluster and another replica.
    let config = file_for(
        dir.path(),
        "from-file",
        "[cluster]\nendpoints = [\"http://127.0.0.1:1\"]\nname = \"other\"\n",
    );
    let endpoints = endpoints(&etcd);
    let args: [&OsStr; 4] = [
        "--etcd".as_ref(),
        endpoints.as_ref(),
        "--replica".as_ref(),
        "from-flag".as_ref(),
    ];
    let operator = start(
        dir.path(),
        "from-file",
        &config,
        &args,
        &[("CORRAL_CLUSTER", "t")],
    );
    wait_leads(&etcd, "from-flag", Duration::from_secs(20));
    let (_, status) = operator_get(&operator.socket, "/v1/status");
    assert_eq!(status["replica"], "from-flag", "{status}");
    // And a flag wins over the environment.
    drop(operator);
    let config = file_for(dir.path(), "second", "[cluster]\nname = \"other\"\n");
    let args: [&OsStr; 4] = [
        "--cluster".as_ref(),
        "t".as_ref(),
        "--replica".as_ref(),
        "second-flag".as_ref(),
    ];
    let envs = [
        ("CORRAL_ETCD", endpoints.as_str()),
        ("CORRAL_CLUSTER", "nobody"),
    ];
    let _second = start(dir.path(), "second", &config, &args, &envs);
    wait_leads(&etcd, "second-flag", Duration::from_secs(20));
}

#[test]
fn a_bad_file_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("op.sock");
    let base =
        format!("api_socket = {socket:?}\n[cluster]\nendpoints = [\"http://127.0.0.1:1\"]\n");
    for (text, expected) in [
        (
            format!("workers = 0\n{base}"),
            ": workers 0 is not 1 or more".to_owned(),
        ),
        (
            format!("{base}name = \"Blue\"\n"),
            ": cluster.name \"Blue\" is not a cluster name (".to_owned(),
        ),
        (
            format!("lease_ttl_secs = 9000000001\n{base}"),
            ": lease_ttl_secs 9000000001 is not in 1..=9000000000 (seconds; etcd's longest \
             lease)"
                .to_owned(),
        ),
        (
            format!("{base}etcd_password = \"hunter2-secret\"\n"),
            ", line 4 (etcd_password): unknown field `etcd_password`, expected one of ".to_owned(),
        ),
        (
            format!("workers = \"many\"\n{base}"),
            ", line 1 (workers): invalid type: string \"many\", expected usize".to_owned(),
        ),
        (
            format!("{base}[log]\nlevel = \"loud\"\n"),
            ": log.level \"loud\" is not error, warn, info, debug or trace".to_owned(),
        ),
        (
            format!("api_tcp = \"10.1.2.3:80\"\n{base}"),
            ": api_tcp 10.1.2.3:80 is not a loopback address (the operator listens on the \
             loopback interface only)"
                .to_owned(),
        ),
        (
            format!("api_tcp = \"127.0.0.1:80\"\n{base}"),
            ": api_tcp 127.0.0.1:80 needs a bearer token (token_file or --token-file)".to_owned(),
        ),
        (
            format!("{base}[cloud]\nfake_cloud = \"seed.json\"\n"),
            ": cloud.fake_cloud needs a cloud (cloud.name or --cloud)".to_owned(),
        ),
    ] {
        let config = dir.path().join("operator.toml");
        std::fs::write(&config, &text).unwrap();
        let output = operator_command(&["--config".as_ref(), config.as_os_str()], &[])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
        let prefix = format!("corral: {}{expected}", config.display());
        assert!(
            stderr.starts_with(&prefix),
            "{text}:\n{stderr}\nwanted {prefix}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(!socket.exists(), "{text}: the API was served");
    }
    // No endpoints anywhere; a file that is not there.
    let config = dir.path().join("no-etcd.toml");
    std::fs::write(&config, "workers = 2\n").unwrap();
    let output = operator_command(&["--config".as_ref(), config.as_os_str()], &[])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "corral: no etcd endpoints: give --etcd, CORRAL_ETCD or endpoints in the [cluster] \
             table of {}\n",
            config.display()
        )
    );
    let missing = dir.path().join("missing.toml");
    let output = operator_command(&["--config".as_ref(), missing.as_os_str()], &[])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(&format!("corral: cannot read {}: ", missing.display())),
        "{stderr}"
    );
    // Without --config, --etcd is required as before.
    let output = operator_command(&[], &[]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--etcd <URL[,URL…]>"),
        "{output:?}"
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_files_tls_settings_reach_etcd_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = block_on(EtcdCluster::start_tls(1)).expect("TLS etcd starts (make deps)");
    init(&etcd, dir.path(), DUAL);
    let tls = etcd.client_tls().expect("TLS etcd");
    let table = format!(
        "[cluster]\nendpoints = [{:?}]\nname = \"t\"\netcd_cacert = {:?}\netcd_cert = {:?}\n\
         etcd_key = {:?}\n",
        endpoints(&etcd),
        tls.ca_cert,
        tls.cert.as_ref().expect("a client certificate"),
        tls.key.as_ref().expect("its key"),
    );
    let config = file_for(dir.path(), "op-tls", &table);
    let operator = start(dir.path(), "op-tls", &config, &[], &[]);
    wait_leading(&operator);
    // Without the client certificate etcd refuses it: the file's TLS files were what worked.
    let config = file_for(
        dir.path(),
        "op-no-cert",
        &format!(
            "[cluster]\nendpoints = [{:?}]\nname = \"t\"\netcd_cacert = {:?}\n",
            endpoints(&etcd),
            tls.ca_cert
        ),
    );
    let refused = start(dir.path(), "op-no-cert", &config, &[], &[]);
    wait_until(
        "the operator without a certificate says why",
        Duration::from_secs(20),
        || refused.log().contains("certificate"),
    );
    assert!(
        !refused.socket.exists()
            || operator_get(&refused.socket, "/v1/status").1["leading"] != true
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_files_etcd_user_and_password_file_reach_etcd_with_auth_on() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(1);
    let passwords = dir.path().join("passwords");
    std::fs::create_dir_all(&passwords).unwrap();
    let passwords_text = passwords.display().to_string();
    let (code, out, err) = on_cluster(
        &etcd,
        &["cluster", "rbac"],
        &["--password-dir", &passwords_text, "--enable-auth"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let password_file = passwords.join("corral-t-operator.password");
    let password = std::fs::read_to_string(&password_file).unwrap();
    let cluster_toml = dir.path().join("cluster.toml");
    std::fs::write(&cluster_toml, DUAL).unwrap();
    let (code, out, err) = on_cluster(
        &etcd,
        &["cluster", "init"],
        &[
            "--config",
            cluster_toml.to_str().unwrap(),
            "--etcd-user",
            "corral-t-operator",
            "--etcd-password-file",
            password_file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let table = format!(
        "[cluster]\nendpoints = [{:?}]\nname = \"t\"\netcd_user = \"corral-t-operator\"\n\
         etcd_password_file = {password_file:?}\n[log]\nlevel = \"debug\"\n",
        endpoints(&etcd),
    );
    let config = file_for(dir.path(), "op-auth", &table);
    let operator = start(dir.path(), "op-auth", &config, &[], &[]);
    wait_leading(&operator);
    let log = operator.log();
    assert!(
        !log.contains(password.trim()),
        "the password was logged:\n{log}"
    );
    // The same file with another user's password: etcd refuses, and says so.
    let wrong = dir.path().join("wrong.password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let table = table
        .replace(&format!("{password_file:?}"), &format!("{wrong:?}"))
        .replace("debug", "info");
    let config = file_for(dir.path(), "op-wrong", &table);
    let refused = start(dir.path(), "op-wrong", &config, &[], &[]);
    wait_showing(
        "the operator with a wrong password says why",
        Duration::from_secs(20),
        || refused.log().contains("wrong user name or password"),
        || refused.log(),
    );
    assert!(
        !refused.log().contains("not-the-password"),
        "{}",
        refused.log()
    );
}
