//! The `corral` binary against a fake agent: a unix socket served by a thread of the test
//! that records each request (method, path, JSON body) and answers canned API responses.
//! Asserts what each subcommand sends, what it prints, and its exit code.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::{Value, json};

/// One request as the fake agent read it.
#[derive(Clone, Debug, PartialEq)]
struct Request {
    method: String,
    path: String,
    body: Value,
}

/// The fake agent's answer to a request: status and JSON body.
type Route = dyn Fn(&Request) -> (u16, String) + Send + Sync;

struct FakeAgent {
    dir: tempfile::TempDir,
    socket: PathBuf,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeAgent {
    fn start(route: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> FakeAgent {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        let route: Arc<Route> = Arc::new(route);
        // Serves connections one after another until the test process ends.
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                serve_connection(stream, &recorded, route.as_ref());
            }
        });
        FakeAgent {
            dir,
            socket,
            requests,
        }
    }

    /// Answers every request with `status` and `body`.
    fn answering(status: u16, body: &str) -> FakeAgent {
        let body = body.to_owned();
        FakeAgent::start(move |_| (status, body.clone()))
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    fn run(&self, args: &[&str]) -> Run {
        run_corral(&self.socket, args, None)
    }

    fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Run {
        run_corral(&self.socket, args, Some(stdin))
    }
}

fn serve_connection(mut stream: UnixStream, recorded: &Mutex<Vec<Request>>, route: &Route) {
    let mut buffer = Vec::new();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        let Ok(status) = parsed.parse(&buffer) else {
            return;
        };
        if let httparse::Status::Complete(head_len) = status {
            let length: usize = parsed
                .headers
                .iter()
                .find(|header| header.name.eq_ignore_ascii_case("content-length"))
                .and_then(|header| std::str::from_utf8(header.value).ok()?.parse().ok())
                .unwrap_or(0);
            let method = parsed.method.unwrap_or_default().to_owned();
            let path = parsed.path.unwrap_or_default().to_owned();
            while buffer.len() < head_len + length {
                if !read_more(&mut stream, &mut buffer) {
                    return;
                }
            }
            let body = &buffer[head_len..head_len + length];
            let request = Request {
                method,
                path,
                body: if body.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(body).unwrap()
                },
            };
            buffer.drain(..head_len + length);
            let (status, body) = route(&request);
            recorded.lock().unwrap().push(request);
            let response = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if stream.write_all(response.as_bytes()).is_err() {
                return;
            }
        } else if !read_more(&mut stream, &mut buffer) {
            return;
        }
    }
}

fn read_more(stream: &mut UnixStream, buffer: &mut Vec<u8>) -> bool {
    let mut chunk = [0; 4096];
    match stream.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buffer.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_corral(socket: &Path, args: &[&str], stdin: Option<&str>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corral"));
    command
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("CORRAL_SOCKET")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    Run {
        code: output.status.code().unwrap(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn get(path: &str) -> Request {
    Request {
        method: "GET".to_owned(),
        path: path.to_owned(),
        body: Value::Null,
    }
}

fn post(path: &str, body: Value) -> Request {
    Request {
        method: "POST".to_owned(),
        path: path.to_owned(),
        body,
    }
}

const DONE: &str = r#"{"ok":true}"#;

fn status_body() -> Value {
    json!({
        "ready": true,
        "summary": ["node: 2 pools"],
        "scopes": [{"scope": "node", "pools": [
            {"pool": "default", "families": [
                {"family": "ipv4", "capacity": "253", "used": "12", "free": "241", "excluded": "0", "cooling": "0"},
                {"family": "ipv6", "capacity": "18446744073709551616", "used": "3", "free": "18446744073709551613", "excluded": "0", "cooling": "0"}
            ]},
            {"pool": "small", "families": [
                {"family": "ipv4", "capacity": "6", "used": "6", "free": "0", "excluded": "0", "cooling": "0"}
            ]}
        ]}]
    })
}

fn dump_body() -> Value {
    json!({"scopes": [{"scope": "node", "pools": [{"pool": "default", "allocations": [
        {"address": "10.0.0.2", "owner": "ns/web", "key": {"network": "net1", "container_id": "c1", "ifname": "eth0"}, "generation": 4},
        {"address": "10.0.0.3", "owner": "ns/gone", "key": {"network": "net1", "container_id": "c2", "ifname": "eth0"}, "generation": 5},
        {"address": "10.0.0.9", "owner": "vm-7", "generation": 9, "lease": {"id": "7f1c", "expires_at_ms": 4102444800000_u64}}
    ]}]}]})
}

// ---- reads ------------------------------------------------------------------------------

#[test]
fn status_prints_a_table() {
    let agent = FakeAgent::answering(200, &status_body().to_string());
    let run = agent.run(&["status"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    // An IPv6 /64's counts print readably (they once printed as 20 digits); `-o json` keeps
    // them exact (status_json_is_the_api_answer).
    assert_eq!(
        run.stdout,
        "\
SCOPE  POOL     FAMILY  CAPACITY  USED    FREE  EXCLUDED  COOLING
node   default  ipv4         253    12     241         0        0
node   default  ipv6        2^64     3  2^64-3         0        0
node   small    ipv4           6     6       0         0        0
"
    );
    assert_eq!(agent.requests(), [get("/v1/status?scope=node")]);
}

#[test]
fn status_json_is_the_api_answer() {
    let agent = FakeAgent::answering(200, &status_body().to_string());
    let run = agent.run(&["-o", "json", "status", "--scope", "net 1"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&run.stdout).unwrap(),
        status_body()
    );
    assert_eq!(agent.requests(), [get("/v1/status?scope=net%201")]);
}

#[test]
fn dump_of_every_scope() {
    let agent = FakeAgent::answering(200, &dump_body().to_string());
    let run = agent.run(&["dump", "--all-scopes"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "\
SCOPE  POOL     ADDRESS   OWNER    ATTACHMENT    GENERATION  LEASE  EXPIRES
node   default  10.0.0.2  ns/web   net1/c1/eth0           4  -      -
node   default  10.0.0.3  ns/gone  net1/c2/eth0           5  -      -
node   default  10.0.0.9  vm-7     -                      9  7f1c   2100-01-01T00:00:00Z
"
    );
    assert_eq!(agent.requests(), [get("/v1/dump")]);
}

#[test]
fn pool_list_shows_ranges_and_exclusions() {
    let agent = FakeAgent::answering(
        200,
        &json!({"pools": [
            {"scope": "node", "name": "default", "cooldown_ms": 30000, "lowest_free": false,
             "ranges": [{"range": "10.0.0.0/24", "draining": false, "source": "file", "allocated": 3},
                        {"range": "10.0.1.0/24", "draining": true, "source": "api", "allocated": 2}],
             "exclusions": [{"network": "10.0.0.5/32", "reason": "router"}],
             "removed": ["10.0.2.0/24"]},
            {"scope": "node", "name": "empty", "cooldown_ms": 0, "lowest_free": true, "ranges": [], "exclusions": []}
        ]})
        .to_string(),
    );
    let run = agent.run(&["pool", "list"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "\
SCOPE  POOL     COOLDOWN  REUSE        RANGE                                 EXCLUSION
node   default  30s       next-fit     10.0.0.0/24 [file]                    10.0.0.5/32 (router)
                                       10.0.1.0/24 [api] (draining, 2 left)
                                       10.0.2.0/24 [file] (removed)
node   empty    0s        lowest-free
"
    );
    assert_eq!(agent.requests(), [get("/v1/pools?scope=node")]);
}

// ---- changes ----------------------------------------------------------------------------

#[test]
fn alloc_sends_every_option() {
    let agent = FakeAgent::answering(
        200,
        &json!({"allocations": [
            {"address": "10.0.0.7", "family": "ipv4", "pool": "p", "generation": 11, "existing": false,
             "subnet": "10.0.0.0/24", "gateway": "10.0.0.1", "lease": {"id": "ab12", "expires_at_ms": 0}},
            {"address": "fd00::7", "family": "ipv6", "pool": "p", "generation": 12, "existing": true}
        ]})
        .to_string(),
    );
    let run = agent.run(&[
        "--scope",
        "net1",
        "alloc",
        "--pool",
        "p",
        "--family",
        "dual",
        "--owner",
        "ns/pod",
        "--key",
        "net1/c9/eth0",
        "--lease",
        "5m",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        agent.requests(),
        [post(
            "/v1/allocate",
            json!({"scope": "net1", "pool": "p", "family": "dual", "owner": "ns/pod",
                   "key": {"network": "net1", "container_id": "c9", "ifname": "eth0"}, "lease_ms": 300000})
        )]
    );
    assert_eq!(
        run.stdout,
        "\
ADDRESS   FAMILY  POOL  GENERATION  SUBNET       GATEWAY   LEASE  EXPIRES               STATE
10.0.0.7  ipv4    p             11  10.0.0.0/24  10.0.0.1  ab12   1970-01-01T00:00:00Z  new
fd00::7   ipv6    p             12  -            -         -      -                     existing
"
    );
}

#[test]
fn alloc_of_an_address_with_defaults() {
    let agent = FakeAgent::answering(200, r#"{"allocations":[]}"#);
    let run = agent.run(&["alloc", "--address", "fd00::9", "--owner", "me"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        agent.requests(),
        [post(
            "/v1/allocate",
            json!({"scope": "node", "pool": "default", "address": "fd00::9", "owner": "me"})
        )]
    );
}

#[test]
fn release_by_address_key_or_owner() {
    let agent = FakeAgent::answering(
        200,
        r#"{"released":[{"address":"10.0.0.5","pool":"default","generation":3}]}"#,
    );
    let run = agent.run(&["release", "--address", "10.0.0.5", "--generation", "3"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "ADDRESS   POOL     GENERATION\n10.0.0.5  default           3\n"
    );
    agent.run(&["release", "--key", "net1/c1/eth0"]);
    agent.run(&["release", "--owner", "ns/pod"]);
    assert_eq!(
        agent.requests(),
        [
            post(
                "/v1/release",
                json!({"scope": "node", "address": "10.0.0.5", "generation": 3})
            ),
            post(
                "/v1/release",
                json!({"scope": "node", "key": {"network": "net1", "container_id": "c1", "ifname": "eth0"}})
            ),
            post("/v1/release", json!({"scope": "node", "owner": "ns/pod"})),
        ]
    );

    let nothing = FakeAgent::answering(200, r#"{"released":[]}"#);
    let run = nothing.run(&["release", "--owner", "nobody"]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "nothing released: nothing matched\n")
    );
}

#[test]
fn pool_ranges_and_exclusions() {
    let agent = FakeAgent::start(|request| match request.path.as_str() {
        "/v1/pools/ranges/remove" => (200, r#"{"outcome":"draining"}"#.to_owned()),
        _ => (200, DONE.to_owned()),
    });
    let added = agent.run(&["pool", "add", "blue", "10.1.0.0/24,gateway=10.1.0.1"]);
    assert_eq!(
        added.stdout,
        "added range 10.1.0.0/24,gateway=10.1.0.1 to pool blue (scope node)\n"
    );
    let removed = agent.run(&["pool", "remove", "blue", "10.1.0.0/24"]);
    assert!(
        removed
            .stdout
            .starts_with("range 10.1.0.0/24 of pool blue (scope node) is draining"),
        "{removed:?}"
    );
    let excluded = agent.run(&["exclude", "blue", "10.1.0.5", "--reason", "printer"]);
    assert_eq!(excluded.stdout, "excluded 10.1.0.5 from pool blue\n");
    let allowed = agent.run(&["-o", "json", "exclude", "--remove", "blue", "10.1.0.5"]);
    assert_eq!(
        serde_json::from_str::<Value>(&allowed.stdout).unwrap(),
        json!({"ok": true})
    );
    for run in [&added, &removed, &excluded, &allowed] {
        assert_eq!(run.code, 0, "{run:?}");
    }
    assert_eq!(
        agent.requests(),
        [
            post(
                "/v1/pools/ranges/add",
                json!({"scope": "node", "pool": "blue", "range": "10.1.0.0/24,gateway=10.1.0.1"})
            ),
            post(
                "/v1/pools/ranges/remove",
                json!({"scope": "node", "pool": "blue", "range": "10.1.0.0/24"})
            ),
            post(
                "/v1/pools/exclusions/add",
                json!({"scope": "node", "pool": "blue", "network": "10.1.0.5", "reason": "printer"})
            ),
            post(
                "/v1/pools/exclusions/remove",
                json!({"scope": "node", "pool": "blue", "network": "10.1.0.5", "reason": ""})
            ),
        ]
    );
}

#[test]
fn leases_start_and_stop() {
    let agent = FakeAgent::start(|request| match request.path.as_str() {
        "/v1/leases/start" => (
            200,
            r#"{"id":"9d2e","expires_at_ms":4102444800000}"#.to_owned(),
        ),
        _ => (200, DONE.to_owned()),
    });
    let started = agent.run(&["lease", "start", "10.0.0.9", "1h30m"]);
    assert_eq!(
        (started.code, started.stdout.as_str()),
        (
            0,
            "lease 9d2e on 10.0.0.9 expires at 2100-01-01T00:00:00Z\n"
        )
    );
    let stopped = agent.run(&["lease", "stop", "10.0.0.9", "9d2e"]);
    assert_eq!(
        (stopped.code, stopped.stdout.as_str()),
        (0, "stopped lease 9d2e on 10.0.0.9\n")
    );
    assert_eq!(
        agent.requests(),
        [
            post(
                "/v1/leases/start",
                json!({"scope": "node", "address": "10.0.0.9", "duration_ms": 5400000})
            ),
            post(
                "/v1/leases/stop",
                json!({"scope": "node", "address": "10.0.0.9", "id": "9d2e"})
            ),
        ]
    );
}

#[test]
fn export_and_import_checkpoints() {
    let checkpoint = json!({"format": "corral-checkpoint/1", "scopes": []});
    let body = checkpoint.to_string();
    let agent = FakeAgent::start(move |request| match request.method.as_str() {
        "GET" => (200, body.clone()),
        _ => (200, DONE.to_owned()),
    });
    let to_stdout = agent.run(&["export"]);
    assert_eq!(to_stdout.code, 0, "{to_stdout:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&to_stdout.stdout).unwrap(),
        checkpoint
    );

    let file = agent.dir.path().join("state.json");
    let file_arg = file.to_str().unwrap();
    let to_file = agent.run(&["export", file_arg]);
    assert_eq!(
        to_file.stdout,
        format!("exported the checkpoint to {file_arg}\n")
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, checkpoint);

    let from_file = agent.run(&["import", file_arg]);
    assert_eq!(
        (from_file.code, from_file.stdout.clone()),
        (0, format!("imported the checkpoint from {file_arg}\n"))
    );
    let from_stdin = agent.run_with_stdin(&["import", "-"], &checkpoint.to_string());
    assert_eq!(from_stdin.code, 0, "{from_stdin:?}");
    assert_eq!(
        agent.requests(),
        [
            get("/v1/checkpoint"),
            get("/v1/checkpoint"),
            post("/v1/checkpoint", checkpoint.clone()),
            post("/v1/checkpoint", checkpoint),
        ]
    );
}

#[test]
fn import_of_bad_input_sends_nothing() {
    let agent = FakeAgent::answering(200, DONE);
    let not_json = agent.run_with_stdin(&["import", "-"], "{not json");
    assert_eq!(not_json.code, 2, "{not_json:?}");
    assert!(
        not_json.stderr.starts_with("corral: - is not JSON: "),
        "{not_json:?}"
    );
    let missing = agent.run(&["import", "/nonexistent/state.json"]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(
        missing
            .stderr
            .starts_with("corral: cannot read /nonexistent/state.json: "),
        "{missing:?}"
    );
    assert_eq!(agent.requests(), []);
}

// ---- check ------------------------------------------------------------------------------

fn check_agent() -> FakeAgent {
    FakeAgent::start(|request| {
        let body = if request.path.starts_with("/v1/dump") {
            dump_body()
        } else {
            status_body()
        };
        (200, body.to_string())
    })
}

#[test]
fn check_finds_stale_allocations_and_full_pools() {
    let agent = check_agent();
    let live = agent.dir.path().join("live.txt");
    std::fs::write(&live, "# running containers\nnet1/c1/eth0\n\n").unwrap();
    let run = agent.run(&["check", "--live", live.to_str().unwrap()]);
    assert_eq!(run.code, 5, "{run:?}");
    assert_eq!(
        run.stdout,
        "\
PROBLEM    SCOPE  POOL     SUBJECT   DETAIL
stale      node   default  10.0.0.3  attachment net1/c2/eth0 is not live (owner ns/gone)
exhausted  node   small    ipv4      no free address (capacity 6, 0 excluded)
2 problems in 3 allocations and 2 pools
"
    );
    assert_eq!(
        agent.requests(),
        [get("/v1/dump?scope=node"), get("/v1/status?scope=node")]
    );

    let json_run = agent.run_with_stdin(&["-o", "json", "check", "--live", "-"], "net1/c1/eth0\n");
    assert_eq!(json_run.code, 5, "{json_run:?}");
    let report: Value = serde_json::from_str(&json_run.stdout).unwrap();
    assert_eq!(report["ok"], json!(false));
    assert_eq!(report["problems"][0]["problem"], json!("stale"));
    assert_eq!(report["problems"][1]["problem"], json!("exhausted"));
}

#[test]
fn check_without_problems_exits_zero() {
    let agent = FakeAgent::start(|request| {
        let body = if request.path.starts_with("/v1/dump") {
            json!({"scopes": []})
        } else {
            json!({"ready": true, "summary": [], "scopes": []})
        };
        (200, body.to_string())
    });
    let run = agent.run_with_stdin(&["check", "--live", "-", "--all-scopes"], "");
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, "no problems in 0 allocations and 0 pools\n")
    );
    assert_eq!(agent.requests(), [get("/v1/dump"), get("/v1/status")]);
}

#[test]
fn check_refuses_a_bad_live_list() {
    let agent = check_agent();
    let run = agent.run_with_stdin(&["check", "--live", "-"], "net1/c1/eth0\nnot-a-key\n");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .starts_with("corral: - line 2: invalid attachment key \"not-a-key\""),
        "{run:?}"
    );
    assert_eq!(agent.requests(), []);
}

// ---- failures and exit codes ------------------------------------------------------------

#[test]
fn unreachable_agent_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let run = run_corral(&socket, &["status"], None);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.stderr.starts_with(&format!(
            "corral: cannot reach the agent at {}: ",
            socket.display()
        )),
        "{run:?}"
    );
    assert_eq!(run.stdout, "");
}

#[test]
fn socket_from_the_environment() {
    let agent = FakeAgent::answering(200, &status_body().to_string());
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["-o", "json", "status"])
        .env("CORRAL_SOCKET", &agent.socket)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn refusal_exits_1_with_the_agents_message() {
    let agent = FakeAgent::answering(
        409,
        r#"{"error":{"code":"exhausted","message":"pool small has no free ipv4 address","pool":"small"}}"#,
    );
    let run = agent.run(&["alloc", "--pool", "small", "--owner", "x"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(
        run.stderr,
        "corral: the agent answered 409 exhausted: pool small has no free ipv4 address\n"
    );
    assert_eq!(run.stdout, "");
}

#[test]
fn agent_failures_exit_4() {
    let failed = FakeAgent::answering(
        503,
        r#"{"error":{"code":"retry_later","message":"the agent is restoring its state"}}"#,
    );
    assert_eq!(failed.run(&["status"]).code, 4);
    let broken = FakeAgent::answering(500, "<html>oops</html>");
    let run = broken.run(&["dump"]);
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (4, "corral: the agent answered 500: <html>oops</html>\n")
    );
    let garbage = FakeAgent::answering(200, r#"{"scopes": 7}"#);
    let run = garbage.run(&["dump"]);
    assert_eq!(run.code, 4, "{run:?}");
    assert!(
        run.stderr
            .starts_with("corral: malformed answer from the agent: /v1/dump"),
        "{run:?}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let agent = FakeAgent::answering(200, DONE);
    assert_eq!(agent.run(&["release"]).code, 2);
    assert_eq!(
        agent
            .run(&["release", "--owner", "x", "--generation", "3"])
            .code,
        2
    );
    assert_eq!(
        agent.run(&["alloc", "--owner", "x", "--lease", "5"]).code,
        2
    );
    assert_eq!(
        agent.run(&["alloc", "--owner", "x", "--key", "a/b"]).code,
        2
    );
    assert_eq!(
        agent
            .run(&["exclude", "--remove", "p", "10.0.0.1", "--reason", "r"])
            .code,
        2
    );
    let all_scopes = agent.run(&["--all-scopes", "pool", "add", "p", "10.0.0.0/24"]);
    assert_eq!(all_scopes.code, 2, "{all_scopes:?}");
    assert!(
        all_scopes.stderr.contains("--all-scopes applies to"),
        "{all_scopes:?}"
    );
    assert_eq!(agent.requests(), []);
}

#[test]
fn a_lease_ttl_etcd_cannot_grant_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    for args in [
        &[
            "agent",
            "--etcd",
            "http://127.0.0.1:1",
            "--lease-ttl",
            "9000000001",
        ][..],
        &["agent", "--etcd", "http://127.0.0.1:1", "--lease-ttl", "0"],
        &[
            "operator",
            "--etcd",
            "http://127.0.0.1:1",
            "--lease-ttl",
            "0",
        ],
        &[
            "operator",
            "--etcd",
            "http://127.0.0.1:1",
            "--lease-ttl",
            "18446744073709551615",
        ],
    ] {
        let run = run_corral(&socket, args, None);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains("--lease-ttl"), "{run:?}");
        assert!(run.stderr.contains("1..=9000000000"), "{run:?}");
    }
}

#[test]
fn no_workers_is_a_usage_error() {
    operator_flag_is_a_usage_error("--workers", "0", "1..");
}

/// etcd takes 128 operations a transaction unless told more: fewer is no setting.
#[test]
fn max_txn_ops_below_etcds_default_is_a_usage_error() {
    operator_flag_is_a_usage_error("--max-txn-ops", "64", "128..");
}

/// `corral operator FLAG VALUE` exits 2, naming the flag and the range it takes.
fn operator_flag_is_a_usage_error(flag: &str, value: &str, range: &str) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("unused.sock");
    let args = ["operator", "--etcd", "http://127.0.0.1:1", flag, value];
    let run = run_corral(&socket, &args, None);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains(flag), "{run:?}");
    assert!(run.stderr.contains(range), "{run:?}");
}

#[test]
fn help_documents_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_corral(&dir.path().join("unused.sock"), &["--help"], None);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout
            .contains("Exit codes:\n  0  done\n  1  the agent refused"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("  5  `corral check` found problems"),
        "{run:?}"
    );
}

#[test]
fn operator_fake_cloud_file_problems_are_usage_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"subnets":[{"id":"s","vpc":"v","zone":"z","ipv4":"10.0.0.0/8"}]}"#,
    )
    .unwrap();
    for (file, problem) in [
        (&missing, "No such file"),
        (&bad, "an IPv4 subnet is /16 to /28"),
    ] {
        // Refused before etcd is asked (none listens there).
        let output = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args([
                "operator",
                "--etcd",
                "http://127.0.0.1:1",
                "--cloud",
                "fake",
            ])
            .arg("--fake-cloud")
            .arg(file)
            .arg("--api-socket")
            .arg(dir.path().join("op.sock"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains(problem), "{stderr}");
    }
}

/// The plain `corral` knows the fake cloud only: `--cloud aws` is a usage error naming the
/// build that has it (`corral-aws`), `--cloud fake` without its seed file one naming the option,
/// an unknown cloud one listing what this build knows; each refused before etcd is asked (none
/// listens there), by the operator and by `cluster check` alike.
#[test]
fn a_cloud_this_build_lacks_is_a_usage_error_naming_the_build_that_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("op.sock");
    let etcd = ["--etcd", "http://127.0.0.1:1"];
    for (args, expected) in [
        (vec!["--cloud", "aws"], "corral-aws"),
        (
            vec!["--cloud", "aws", "--cloud-endpoint", "http://127.0.0.1:1"],
            "corral-aws",
        ),
        (vec!["--cloud", "fake"], "--fake-cloud"),
        (
            vec!["--cloud", "gcp"],
            "unknown cloud (this build knows fake)",
        ),
    ] {
        for command in [
            vec!["operator", "--api-socket", socket.to_str().unwrap()],
            vec!["cluster", "check"],
        ] {
            let output = Command::new(env!("CARGO_BIN_EXE_corral"))
                .args(&command)
                .args(etcd)
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{command:?} {args:?}: {stderr}"
            );
            assert!(stderr.contains(expected), "{command:?} {args:?}: {stderr}");
        }
    }
}

// ---- which options each subcommand takes ------------------------------------------------

/// `corral ARGS` with no socket given and none in the environment.
fn run_bare(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .env_remove("CORRAL_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: output.status.code().unwrap(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// The daemons' help once listed the agent client's `--socket`, `-o`, `--scope` and
/// `--all-scopes` (global options they ignore); each help now lists only what it honours.
#[test]
fn help_lists_only_the_options_a_subcommand_honours() {
    let client_only = ["--socket", "--scope", "--all-scopes"];
    for subcommand in [
        &["operator"][..],
        &["host-local", "export"],
        &["cluster", "status"],
        &["node", "list"],
        &["node", "show"],
    ] {
        let run = run_bare(&[subcommand, &["--help"]].concat());
        assert_eq!(run.code, 0, "{run:?}");
        for option in client_only {
            assert!(
                !run.stdout.contains(&format!("{option} ")),
                "{subcommand:?} lists {option}: {}",
                run.stdout
            );
        }
    }
    for subcommand in [&["operator"][..], &["host-local", "export"], &["agent"]] {
        let run = run_bare(&[subcommand, &["--help"]].concat());
        assert!(
            !run.stdout.contains("--output"),
            "{subcommand:?}: {}",
            run.stdout
        );
    }
    let agent = run_bare(&["agent", "--help"]);
    assert!(agent.stdout.contains("--socket <PATH>"), "{agent:?}");
    for option in ["--scope", "--all-scopes"] {
        assert!(!agent.stdout.contains(option), "{agent:?}");
    }
    for subcommand in [&["cluster", "status"][..], &["node", "list"]] {
        let run = run_bare(&[subcommand, &["--help"]].concat());
        assert!(run.stdout.contains("-o, --output <OUTPUT>"), "{run:?}");
    }
    for subcommand in [&["status"][..], &["pool", "list"], &["lease", "stop"]] {
        let run = run_bare(&[subcommand, &["--help"]].concat());
        for option in [
            "--socket <PATH>",
            "-o, --output",
            "--scope <SCOPE>",
            "--all-scopes",
        ] {
            assert!(
                run.stdout.contains(option),
                "{subcommand:?} lacks {option}: {run:?}"
            );
        }
    }
}

/// Every agent client subcommand takes `--socket` both before and after itself.
#[test]
fn client_options_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let socket = socket.to_str().unwrap();
    let unreachable = format!("corral: cannot reach the agent at {socket}: ");
    for subcommand in [
        &["status"][..],
        &["dump"],
        &["alloc", "--owner", "o"],
        &["release", "--owner", "o"],
        &["pool", "list"],
        &["pool", "add", "p", "10.0.0.0/24"],
        &["exclude", "p", "10.0.0.1"],
        &["lease", "stop", "10.0.0.1", "id"],
        &["interface", "list"],
        &["export"],
        &["check", "--live", "-"],
        &["gc", "--live", "-"],
    ] {
        for args in [
            [&["--socket", socket][..], subcommand].concat(),
            [subcommand, &["--socket", socket]].concat(),
            [
                &["-o", "json", "--scope", "net1", "--socket", socket][..],
                subcommand,
            ]
            .concat(),
        ] {
            let run = run_bare(&args);
            assert_eq!(run.code, 3, "{args:?}: {run:?}");
            assert!(run.stderr.starts_with(&unreachable), "{args:?}: {run:?}");
        }
    }
    // A flag beats the environment, in either position.
    for args in [
        ["--socket", socket, "status"],
        ["status", "--socket", socket],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .env("CORRAL_SOCKET", "/nonexistent/env.sock")
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.starts_with(&unreachable), "{args:?}: {stderr}");
    }
    // Output before or after: both print the API's JSON.
    let agent = FakeAgent::answering(200, &status_body().to_string());
    let before = agent.run(&["-o", "json", "status"]);
    let after = agent.run(&["status", "-o", "json"]);
    assert_eq!(before.code, 0, "{before:?}");
    assert_eq!(before.stdout, after.stdout);
    assert!(before.stdout.starts_with('{'), "{before:?}");
    // Given both ways, --scope and --all-scopes still conflict.
    let run = run_bare(&["--scope", "a", "status", "--all-scopes"]);
    assert_eq!(run.code, 2, "{run:?}");
}

/// An option before a subcommand that does not honour it is refused, not ignored.
#[test]
fn client_options_before_a_daemon_are_refused() {
    let run = run_bare(&[
        "--socket",
        "/tmp/x.sock",
        "operator",
        "--etcd",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.stderr,
        "corral: --socket does not apply to `corral operator`\n"
    );
    let run = run_bare(&["-o", "json", "agent", "--data-dir", "/nonexistent"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.stderr,
        "corral: --output does not apply to `corral agent`\n"
    );
    let run = run_bare(&[
        "--scope",
        "n",
        "node",
        "list",
        "--etcd",
        "http://127.0.0.1:1",
    ]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(
        run.stderr,
        "corral: --scope does not apply to `corral node`\n"
    );
}
