//! schemathesis (property-based API testing, from PyPI) against the real agent: started
//! in-process on a temporary state directory with its TCP listener on 127.0.0.1 and a
//! bearer token, then every operation of the committed `openapi.json` is fed generated
//! valid and invalid requests, single and chained along the document's links. A response
//! must never be a 5xx; its status, media type and body must be what the document says;
//! invalid requests and undocumented methods must be refused. Then the agent restarts on
//! the same state, which must hold exactly the allocations it held before.
//!
//! schemathesis must be installed (`make deps` puts it in `target/schemathesis-venv`); the
//! test fails, it does not skip, when it is missing. `SCHEMATHESIS` names another `st`
//! executable; `SCHEMATHESIS_SEED` another seed (the default is fixed, so a failure is
//! reproducible); `SCHEMATHESIS_EXAMPLES` another number of examples per operation.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_agent::{AgentConfig, AgentError, Running};

/// What `make deps` installs, and the test's advice when it is missing.
const INSTALL: &str = "make deps  (or: python3 -m venv target/schemathesis-venv && \
                       target/schemathesis-venv/bin/pip install 'schemathesis==4.32.5')";
const TOKEN: &str = "schemathesis-test-token-0123456789";
/// Examples per operation and phase; with 22 operations the run takes about 30 s on two
/// cores.
const EXAMPLES: u32 = 100;
const SEED: u64 = 20261122;
/// The whole schemathesis run is killed (and the test fails) after this long.
const DEADLINE: Duration = Duration::from_secs(180);

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `st` executable: `$SCHEMATHESIS`, the venv `make deps` creates, `st` on the PATH,
/// or pip's `--user` location.
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
    let mut candidates = Vec::new();
    candidates.push(workspace_root().join("target/schemathesis-venv/bin/st"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("st")));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".local/bin/st"));
    }
    if let Some(found) = candidates.iter().find(|candidate| works(candidate)) {
        return found.clone();
    }
    panic!(
        "schemathesis is not installed: no working `st` in $SCHEMATHESIS, {}, the PATH or \
         ~/.local/bin; install it with:\n    {INSTALL}",
        candidates[0].display()
    );
}

/// Starts the agent with the embedded default pools on `dir`, its TCP listener on a free
/// port.
fn start_agent(dir: &Path) -> (Running, SocketAddr) {
    // The port is free when asked, and the agent binds it a moment later; should another
    // process take it in between, try another.
    let mut last_error = None;
    for _ in 0..3 {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap();
        let config = AgentConfig {
            tcp: Some(addr),
            token: Some(TOKEN.to_owned()),
            ..AgentConfig::in_dir(dir)
        };
        match Running::start(config) {
            Ok(running) => return (running, addr),
            Err(error @ AgentError::Tcp { .. }) => last_error = Some(error),
            Err(error) => panic!("the agent does not start: {error}"),
        }
    }
    panic!("the agent does not start: {last_error:?}");
}

/// `GET path` on the TCP listener, with the token; the status and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (status, body.to_owned())
}

/// Every allocation the agent holds, one line each, leaving out those whose lease runs out
/// before `until_ms` (a restart may rightly have released them).
fn allocations(addr: SocketAddr, until_ms: u64) -> BTreeSet<String> {
    let (status, body) = get(addr, "/v1/dump");
    assert_eq!(status, 200, "{body}");
    let dump: corral_api::DumpResponse = serde_json::from_str(&body).unwrap();
    let mut lines = BTreeSet::new();
    for scope in &dump.scopes {
        for pool in &scope.pools {
            for entry in &pool.allocations {
                if entry
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.expires_at_ms <= until_ms)
                {
                    continue;
                }
                lines.insert(format!("{} {} {:?}", scope.scope, pool.pool, entry));
            }
        }
    }
    lines
}

fn now_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since_epoch.as_millis()).unwrap()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
        Err(_) => default,
    }
}

#[test]
#[ignore = "needs schemathesis (PyPI, installed by `make deps`); `make test` runs it"]
fn schemathesis_finds_nothing_and_a_restart_keeps_every_allocation() {
    let st = schemathesis();
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = start_agent(dir.path());
    let seed: u64 = env_or("SCHEMATHESIS_SEED", SEED);
    let examples: u32 = env_or("SCHEMATHESIS_EXAMPLES", EXAMPLES);
    let url = format!("http://{addr}");
    let schema = workspace_root().join("openapi.json");
    let started = Instant::now();
    let mut child = Command::new(&st)
        .arg("run")
        .arg(&schema)
        .args(["--url", &url])
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
        // Reports and hypothesis' files go to the temporary directory, not the tree.
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
    // Read both pipes while waiting, so a chatty run never blocks on a full pipe.
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
    match status {
        None => panic!("schemathesis did not finish within {DEADLINE:?} (seed {seed}):\n{output}"),
        Some(status) if !status.success() => panic!(
            "schemathesis found problems (seed {seed}, {examples} examples per operation, \
             {elapsed:.0?}); reproduce with SCHEMATHESIS_SEED={seed}:\n{output}"
        ),
        Some(_) => eprintln!("schemathesis passed in {elapsed:.0?} (seed {seed}):\n{output}"),
    }

    // Everything acknowledged was durable: after thousands of generated requests, a restart
    // on the same state brings back exactly the allocations the agent held. Leases that run
    // out within a minute are left out on both sides: a restart rightly releases those.
    let until_ms = now_ms() + 60_000;
    let before = allocations(addr, until_ms);
    agent.stop().expect("the agent stops cleanly");
    let (agent, addr) = start_agent(dir.path());
    let after = allocations(addr, until_ms);
    agent.stop().expect("the agent stops cleanly");
    let lost: Vec<&String> = before.difference(&after).collect();
    let gained: Vec<&String> = after.difference(&before).collect();
    assert!(
        lost.is_empty() && gained.is_empty(),
        "a restart changed the allocations (seed {seed}):\nlost: {lost:#?}\ngained: {gained:#?}"
    );
}
