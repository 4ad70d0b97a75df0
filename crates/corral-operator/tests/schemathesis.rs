//! schemathesis (property-based API testing, from PyPI) against the real operator: a
//! one-member etcd on 127.0.0.1, a dual-stack cluster configuration and a few registered
//! nodes, `corral_operator::run` in-process on `EtcdKv` with its API's TCP listener on
//! 127.0.0.1 and a bearer token; every operation of the committed `openapi-operator.json` is
//! fed generated valid and invalid requests. A response must never be a 5xx (the replica
//! leads throughout, so not even 503); its status, media type and body must be what the
//! document says; invalid requests and undocumented methods must be refused.
//!
//! schemathesis and etcd must be installed (`make deps`); the test fails, it does not skip,
//! when either is missing. `SCHEMATHESIS` names another `st` executable, `SCHEMATHESIS_SEED`
//! another seed, `SCHEMATHESIS_EXAMPLES` another number of examples per operation.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_cluster::{ClusterConfig, ClusterName, Keys};
use corral_etcd::testing::EtcdCluster;
use corral_kv::{Compare, Kv, Txn, TxnOp};
use corral_operator::api::ApiConfig;
use corral_operator::{OperatorConfig, Shared};

const INSTALL: &str = "make deps  (or: python3 -m venv target/schemathesis-venv && \
                       target/schemathesis-venv/bin/pip install 'schemathesis==4.32.5')";
const TOKEN: &str = "schemathesis-operator-token-0123456789";
const EXAMPLES: u32 = 100;
const SEED: u64 = 20261122;
const DEADLINE: Duration = Duration::from_secs(180);
const NODES: usize = 5;

const CONFIG: &str = include_str!("configs/schemathesis.toml");

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `st` executable: `$SCHEMATHESIS`, the venv `make deps` creates, or `st` on the PATH.
fn schemathesis() -> PathBuf {
    let works = |candidate: &Path| {
        Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|out| {
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("st, version")
            })
    };
    if let Some(path) = std::env::var_os("SCHEMATHESIS") {
        let path = PathBuf::from(path);
        assert!(
            works(&path),
            "SCHEMATHESIS={} does not run `st --version`",
            path.display()
        );
        return path;
    }
    let mut candidates = vec![workspace_root().join("target/schemathesis-venv/bin/st")];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("st")));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".local/bin/st"));
    }
    candidates
        .iter()
        .find(|candidate| works(candidate))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "schemathesis is not installed: no working `st` in $SCHEMATHESIS, {}, the PATH \
                 or ~/.local/bin; install it with:\n    {INSTALL}",
                candidates[0].display()
            )
        })
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
        Err(_) => default,
    }
}

/// Writes the configuration (as `corral cluster init` does: only if absent) and registers
/// the nodes (as agents do).
async fn seed_cluster(kv: &impl Kv, keys: &Keys) {
    let config = ClusterConfig::from_toml(CONFIG).unwrap();
    let mut txns = vec![Txn {
        compares: vec![Compare::absent(keys.config())],
        success: vec![TxnOp::put(keys.config(), config.to_json().unwrap())],
        failure: vec![],
    }];
    for n in 0..NODES {
        let name = format!("node-{n}");
        let record = common::node_record(&name);
        let key = format!("/corral/t/v1/nodes/{name}");
        txns.push(Txn {
            compares: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::put(key, record)],
            failure: vec![],
        });
    }
    for txn in txns {
        assert!(kv.txn(txn).await.unwrap().succeeded);
    }
}

#[test]
#[ignore = "needs schemathesis and etcd (make deps)"]
fn schemathesis_finds_nothing_in_the_operator_api() {
    let st = schemathesis();
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let etcd = runtime
        .block_on(EtcdCluster::start(1))
        .expect("etcd starts (make deps installs it)");
    let kv = runtime
        .block_on(corral_etcd::EtcdKv::connect(
            &etcd.endpoints(),
            Default::default(),
        ))
        .unwrap();
    let keys = Keys::new(ClusterName::new("t").unwrap());
    runtime.block_on(seed_cluster(&kv, &keys));
    let shared = Arc::new(Shared::new("op-st".into()));
    let api = runtime
        .block_on(corral_operator::api::bind(
            ApiConfig {
                socket: dir.path().join("operator.sock"),
                tcp: Some("127.0.0.1:0".parse().unwrap()),
                token: Some(TOKEN.to_owned()),
            },
            Arc::clone(&shared),
        ))
        .unwrap();
    let addr = api.tcp_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = runtime.spawn(corral_operator::run(
        kv,
        OperatorConfig {
            cluster: "t".into(),
            replica: "op-st".into(),
            lease_ttl: Duration::from_secs(5),
            workers: 4,
        },
        Arc::clone(&shared),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while shared
        .with_view(|view, _| view.served_nodes())
        .is_none_or(|served| served < NODES)
    {
        assert!(
            Instant::now() < deadline,
            "the operator did not serve {NODES} nodes within 30 s: {:?}",
            shared.problems()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let seed: u64 = env_or("SCHEMATHESIS_SEED", SEED);
    let examples: u32 = env_or("SCHEMATHESIS_EXAMPLES", EXAMPLES);
    let started = Instant::now();
    let mut child = Command::new(&st)
        .arg("run")
        .arg(workspace_root().join("openapi-operator.json"))
        .args(["--url", &format!("http://{addr}")])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance,\
             content_type_conformance,negative_data_rejection,unsupported_method,\
             allow_header_conformance",
        ])
        .args(["--max-examples", &examples.to_string()])
        .args(["--seed", &seed.to_string()])
        .args(["--workers", "2"])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .args(["--max-failures", "20"])
        .arg("--no-color")
        .current_dir(dir.path())
        .env_remove("SCHEMATHESIS_HOOKS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {}: {e}; install it with:\n    {INSTALL}",
                st.display()
            )
        });
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = format!(
        "{}\n{}",
        out_reader.join().unwrap(),
        err_reader.join().unwrap()
    );
    let elapsed = started.elapsed();

    // The replica led throughout and still serves every node.
    let still_leading = shared.leading();
    let _ = stop.send(());
    runtime.block_on(operator).unwrap().unwrap();
    runtime.block_on(api.stop());
    drop(etcd);
    match status {
        None => panic!("schemathesis did not finish within {DEADLINE:?} (seed {seed}):\n{output}"),
        Some(status) if !status.success() => panic!(
            "schemathesis found problems (seed {seed}, {examples} examples per operation, \
             {elapsed:.0?}); reproduce with SCHEMATHESIS_SEED={seed}:\n{output}"
        ),
        Some(_) => eprintln!("schemathesis passed in {elapsed:.0?} (seed {seed}):\n{output}"),
    }
    assert!(still_leading, "the replica lost the lead during the run");
}
