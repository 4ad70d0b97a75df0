//! The agent in-process on a temporary directory and socket, driven over the real unix socket
//! with plain HTTP/1.1: every operation, its errors, durability across a restart, and group
//! commit under concurrency.

use crate::http;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_agent::{AgentConfig, config};
use serde_json::{Value, json};

struct Agent {
    socket: PathBuf,
    running: corral_agent::Running,
}

impl Agent {
    fn start(dir: &Path) -> Agent {
        Agent::start_with(dir, config::default_pools())
    }

    /// [`Agent::start`] in a new temporary directory; bound as `let (dir, agent) = ...`, the
    /// agent stops before the directory goes.
    fn start_in_tempdir() -> (tempfile::TempDir, Agent) {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start(dir.path());
        (dir, agent)
    }

    fn start_with(dir: &Path, pools: Vec<config::PoolFile>) -> Agent {
        let config = AgentConfig {
            pools: config::pools(&pools).unwrap(),
            ..AgentConfig::in_dir(dir)
        };
        let socket = config.socket.clone();
        Agent {
            socket,
            running: corral_agent::Running::start(config).expect("the agent starts"),
        }
    }

    fn stop(self) {
        self.running.stop().unwrap();
    }

    fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, String) {
        request(&self.socket, method, path, body)
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let (status, text) = self.request("GET", path, None);
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let (status, text) = self.request("POST", path, Some(&bytes));
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// One request on a new connection, `Connection: close`, the whole response read.
fn request(socket: &Path, method: &str, path: &str, body: Option<&[u8]>) -> (u16, String) {
    let stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n");
    if let Some(body) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    http::exchange(stream, &head, body)
}

fn addresses(body: &Value) -> Vec<String> {
    body["allocations"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|a| a["address"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn allocate_release_and_errors_over_the_socket() {
    let (_dir, agent) = Agent::start_in_tempdir();
    assert_eq!(agent.request("GET", "/healthz", None).0, 200);
    assert_eq!(agent.request("GET", "/readyz", None).0, 200);

    let (status, body) = agent.post("/v1/allocate", json!({"owner": "pod-a"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(addresses(&body), ["10.88.0.1"]);
    let (_, body) = agent.post(
        "/v1/allocate",
        json!({"owner": "pod-b", "family": "dual",
               "key": {"network": "n", "container_id": "c1", "ifname": "eth0"}}),
    );
    assert_eq!(addresses(&body), ["10.88.0.2", "fd88::1"]);
    // The same key again: the same addresses, nothing new.
    let (_, again) = agent.post(
        "/v1/allocate",
        json!({"owner": "pod-b", "family": "dual",
               "key": {"network": "n", "container_id": "c1", "ifname": "eth0"}}),
    );
    assert_eq!(addresses(&again), ["10.88.0.2", "fd88::1"]);
    assert_eq!(again["allocations"][0]["existing"], true);

    // Specific address: in use → 409 in_use; outside → 409 unavailable.
    let (status, body) = agent.post(
        "/v1/allocate",
        json!({"owner": "x", "address": "10.88.0.1"}),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("in_use")),
        "{body}"
    );
    let (status, body) = agent.post(
        "/v1/allocate",
        json!({"owner": "x", "address": "192.0.2.1"}),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("unavailable")),
        "{body}"
    );
    // Unknown pool → 404 naming the pool.
    let (status, body) = agent.post("/v1/allocate", json!({"owner": "x", "pool": "nope"}));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["pool"], "nope");
    // Malformed JSON, unknown field, wrong type → 400 naming the problem.
    let (status, text) = agent.request("POST", "/v1/allocate", Some(b"{\"owner\": "));
    assert_eq!(status, 400, "{text}");
    let (status, body) = agent.post("/v1/allocate", json!({"owner": "x", "colour": "red"}));
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("colour"),
        "{body}"
    );
    let (status, _) = agent.post("/v1/allocate", json!({"owner": 7}));
    assert_eq!(status, 400);
    // Too large a body → 413; unknown path → 404; wrong method → 405.
    let big = vec![b' '; corral_api::MAX_BODY_BYTES + 10];
    assert_eq!(agent.request("POST", "/v1/allocate", Some(&big)).0, 413);
    assert_eq!(agent.request("GET", "/v2/nothing", None).0, 404);
    assert_eq!(agent.request("GET", "/v1/allocate", None).0, 405);

    // Release by key, by address with a stale generation (refused), by owner.
    let (status, body) = agent.post(
        "/v1/release",
        json!({"key": {"network": "n", "container_id": "c1", "ifname": "eth0"}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["released"].as_array().unwrap().len(), 2);
    let (status, body) = agent.post(
        "/v1/release",
        json!({"address": "10.88.0.1", "generation": 999}),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    let (status, body) = agent.post("/v1/release", json!({"owner": "pod-a"}));
    assert_eq!(status, 200);
    assert_eq!(body["released"][0]["address"], "10.88.0.1");
    let (status, _) = agent.post("/v1/release", json!({"owner": "a", "address": "10.88.0.1"}));
    assert_eq!(status, 400, "two selectors at once");
    agent.stop();
}

#[test]
fn exhaustion_names_the_pool_and_pools_can_grow() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start_with(
        dir.path(),
        vec![config::PoolFile {
            name: "tiny".into(),
            ranges: vec!["10.9.0.0/30".into()],
            cooldown_ms: 0,
            lowest_free: false,
            exclusions: vec![],
        }],
    );
    for _ in 0..2 {
        let (status, _) = agent.post("/v1/allocate", json!({"owner": "o", "pool": "tiny"}));
        assert_eq!(status, 200);
    }
    let (status, body) = agent.post("/v1/allocate", json!({"owner": "o", "pool": "tiny"}));
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "exhausted");
    assert_eq!(body["error"]["pool"], "tiny");
    let (status, body) = agent.post(
        "/v1/pools/ranges/add",
        json!({"pool": "tiny", "range": "10.9.1.0/30"}),
    );
    assert_eq!(status, 200, "{body}");
    let (_, body) = agent.post("/v1/allocate", json!({"owner": "o", "pool": "tiny"}));
    assert_eq!(addresses(&body), ["10.9.1.1"]);
    let (status, body) = agent.post(
        "/v1/pools/exclusions/add",
        json!({"pool": "tiny", "network": "10.9.1.2", "reason": "router"}),
    );
    assert_eq!(status, 200, "{body}");
    let (_, pools) = agent.get("/v1/pools");
    let tiny = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tiny")
        .unwrap_or_else(|| panic!("{pools}"));
    assert_eq!(tiny["ranges"].as_array().unwrap().len(), 2);
    assert_eq!(tiny["exclusions"][0]["network"], "10.9.1.2/32");
    let (status, body) = agent.post(
        "/v1/pools/ranges/remove",
        json!({"pool": "tiny", "range": "10.9.1.0/30"}),
    );
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("draining")),
        "{body}"
    );
    agent.stop();
}

#[test]
fn a_restart_brings_back_allocations_leases_and_cooldowns_and_expires_overdue_leases() {
    let (dir, agent) = Agent::start_in_tempdir();
    let (_, held) = agent.post("/v1/allocate", json!({"owner": "keeper"}));
    let (_, short) = agent.post("/v1/allocate", json!({"owner": "short", "lease_ms": 300}));
    let (_, long) = agent.post("/v1/allocate", json!({"owner": "long", "lease_ms": 600000}));
    let (_, cooled) = agent.post("/v1/allocate", json!({"owner": "gone"}));
    let cooled_addr = addresses(&cooled)[0].clone();
    agent.post("/v1/release", json!({"owner": "gone"}));
    agent.stop();
    std::thread::sleep(Duration::from_millis(400));

    let agent = Agent::start(dir.path());
    let (_, dump) = agent.get("/v1/dump?scope=node");
    let entries = dump["scopes"][0]["pools"][0]["allocations"]
        .as_array()
        .unwrap()
        .clone();
    let held_now: Vec<&str> = entries
        .iter()
        .map(|e| e["address"].as_str().unwrap())
        .collect();
    assert!(held_now.contains(&addresses(&held)[0].as_str()), "{dump}");
    assert!(held_now.contains(&addresses(&long)[0].as_str()), "{dump}");
    assert!(
        !held_now.contains(&addresses(&short)[0].as_str()),
        "the overdue lease is released after the restore: {dump}"
    );
    let long_entry = entries
        .iter()
        .find(|e| e["address"] == addresses(&long)[0].as_str())
        .unwrap();
    assert_eq!(
        long_entry["lease"]["id"],
        long["allocations"][0]["lease"]["id"]
    );
    // The released address is still cooling: the next allocation does not get it.
    let (_, next) = agent.post("/v1/allocate", json!({"owner": "new"}));
    assert_ne!(addresses(&next)[0], cooled_addr);
    let (_, status) = agent.get("/v1/status");
    let v4 = &status["scopes"][0]["pools"][0]["families"][0];
    assert_eq!(v4["cooling"], "2", "{status}");
    agent.stop();
}

#[test]
fn concurrent_requests_share_commits_and_every_answer_is_distinct() {
    let (dir, agent) = Agent::start_in_tempdir();
    let socket = agent.socket.clone();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|i| {
                        let body =
                            serde_json::to_vec(&json!({"owner": format!("t{t}-{i}")})).unwrap();
                        let (status, text) = request(&socket, "POST", "/v1/allocate", Some(&body));
                        assert_eq!(status, 200, "{text}");
                        let value: Value = serde_json::from_str(&text).unwrap();
                        addresses(&value)[0].clone()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "an address was handed out twice");
    agent.stop();
    // Everything acknowledged is on disk.
    let agent = Agent::start(dir.path());
    let (_, dump) = agent.get("/v1/dump");
    let held = dump["scopes"][0]["pools"][0]["allocations"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(held, 400);
    agent.stop();
}

/// Regressions found by review: a refused range leaves no empty pool behind; a pool created
/// through the API keeps its cooldown across a restart; a checkpoint that lists an address
/// twice is the caller's 400, not the store's 503.
#[test]
fn refused_changes_leave_nothing_and_api_pools_survive_restarts() {
    let (dir, agent) = Agent::start_in_tempdir();
    let (status, body) = agent.post(
        "/v1/pools/ranges/add",
        json!({"pool": "zz", "range": "10.88.0.0/24"}),
    );
    assert_eq!(status, 409, "{body}");
    let (_, pools) = agent.get("/v1/pools");
    assert!(
        !pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "zz"),
        "{pools}"
    );
    let (status, _) = agent.post(
        "/v1/pools/ranges/add",
        json!({"pool": "blue", "range": "10.50.0.0/24"}),
    );
    assert_eq!(status, 200);
    let cooldown = |pools: &Value| {
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "blue")
            .map(|p| p["cooldown_ms"].clone())
    };
    let (_, before) = agent.get("/v1/pools");
    agent.stop();
    let agent = Agent::start(dir.path());
    let (_, after) = agent.get("/v1/pools");
    assert_eq!(cooldown(&after), cooldown(&before), "{after}");
    assert_ne!(cooldown(&after), Some(json!(0)));

    let row = json!({"address": "10.77.0.5", "generation": 1, "owner": "a", "pool": "p"});
    let document = json!({
        "format": "corral-checkpoint/1",
        "scopes": [{
            "scope": "imp",
            "config": {"pools": [{"name": "p", "cooldown_ms": 0, "lowest_free": false,
                                   "ranges": ["10.77.0.0/24"], "exclusions": []}]},
            "nextGeneration": 5,
            "allocations": [row.clone(), row],
            "cooling": []
        }]
    });
    let (status, body) = agent.post("/v1/checkpoint", document);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10.77.0.5"),
        "{body}"
    );
    agent.stop();
}

/// `/metrics` in Prometheus text: attempts by outcome, the latency histogram, per-pool gauges
/// and expired leases.
#[test]
fn metrics_count_attempts_by_outcome_and_show_the_pools() {
    let (_dir, agent) = Agent::start_in_tempdir();
    agent.post("/v1/allocate", json!({"owner": "a"}));
    agent.post(
        "/v1/allocate",
        json!({"owner": "b", "address": "10.88.0.1"}),
    );
    agent.post("/v1/allocate", json!({"owner": "c", "lease_ms": 1}));
    agent.post("/v1/release", json!({"owner": "a"}));
    // The lease of "c" runs out; the ticker (every 500 ms) releases it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (status, text) = agent.request("GET", "/metrics", None);
        assert_eq!(status, 200);
        if text.contains("corral_leases_expired_total 1") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for needle in [
        "corral_allocation_attempts_total{outcome=\"ok\"} 2",
        "corral_allocation_attempts_total{outcome=\"in_use\"} 1",
        "corral_release_attempts_total{outcome=\"ok\"} 1",
        "corral_request_duration_seconds_bucket{",
        "corral_addresses{scope=\"node\",pool=\"default\",family=\"ipv4\",state=\"used\"} 0",
        "corral_addresses{scope=\"node\",pool=\"default\",family=\"ipv4\",state=\"cooling\"} 2",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    agent.stop();
}

/// Regression: a range or exclusion added to the engine's implicit `default` pool (not
/// declared in the configuration) is stored, so it is still there after a restart.
#[test]
fn ranges_added_to_the_implicit_default_pool_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pods = || {
        vec![config::PoolFile {
            name: "pods".into(),
            ranges: vec!["10.1.0.0/24".into()],
            cooldown_ms: 0,
            lowest_free: false,
            exclusions: vec![],
        }]
    };
    let agent = Agent::start_with(dir.path(), pods());
    let (status, body) = agent.post(
        "/v1/pools/ranges/add",
        json!({"pool": "default", "range": "10.9.0.0/24"}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = agent.post(
        "/v1/pools/exclusions/add",
        json!({"pool": "default", "network": "10.9.0.1", "reason": "router"}),
    );
    assert_eq!(status, 200, "{body}");
    agent.stop();
    let agent = Agent::start_with(dir.path(), pods());
    let (_, body) = agent.post("/v1/allocate", json!({"owner": "o"}));
    assert_eq!(addresses(&body), ["10.9.0.2"], "{body}");
    agent.stop();
}

/// Regression: serde fills a struct from a JSON array, field by field in order, so
/// `["node", "default", null, null, "pod-array", null, null]` allocated for owner
/// "pod-array". Every body must be a JSON object; anything else is a 400 that says so.
#[test]
fn a_body_that_is_not_a_json_object_is_refused_on_every_endpoint() {
    let (_dir, agent) = Agent::start_in_tempdir();
    let positional = json!(["node", "default", null, null, "pod-array", null, null]).to_string();
    let bodies = [
        (
            positional.as_str(),
            "the body must be a JSON object, not an array",
        ),
        ("[]", "the body must be a JSON object, not an array"),
        ("\"pod-a\"", "the body must be a JSON object, not a string"),
        ("7", "expected a JSON object"),
        ("true", "expected a JSON object"),
        ("null", "expected a JSON object"),
    ];
    use corral_api::paths;
    for path in [
        paths::ALLOCATE,
        paths::RELEASE,
        paths::LEASE_START,
        paths::LEASE_STOP,
        paths::POOL_RANGES_ADD,
        paths::POOL_RANGES_REMOVE,
        paths::POOL_EXCLUSIONS_ADD,
        paths::POOL_EXCLUSIONS_REMOVE,
        paths::CHECKPOINT,
        paths::CNI_ADD,
        paths::CNI_DEL,
        paths::CNI_CHECK,
        paths::CNI_GC,
        paths::CNI_STATUS,
        paths::GC,
    ] {
        for (body, needle) in bodies {
            let (status, text) = agent.request("POST", path, Some(body.as_bytes()));
            assert_eq!(status, 400, "POST {path} {body}: {text}");
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains(needle), "POST {path} {body}: {message}");
        }
    }
    // Nothing was allocated.
    let (_, dump) = agent.get("/v1/dump");
    assert_eq!(
        dump["scopes"][0]["pools"][0]["allocations"],
        json!([]),
        "{dump}"
    );
    agent.stop();
}

/// Regression: a container ID over 1,024 bytes was told to "use [A-Za-z0-9_.-]" and echoed
/// whole; an exclusion reason with a control character was an "invalid owner"; an unknown
/// variant of a megabyte came back whole in serde's message.
#[test]
fn over_long_inputs_are_called_too_long_and_never_echoed_whole() {
    let (_dir, agent) = Agent::start_in_tempdir();
    let id = "c".repeat(1100);
    let (status, body) = agent.post(
        "/v1/allocate",
        json!({"owner": "o", "key": {"network": "n", "container_id": id, "ifname": "eth0"}}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["message"],
        format!(
            "key: container id {:?}... is too long: 1100 bytes, at most 1024",
            "c".repeat(64)
        )
    );
    let (status, body) = agent.post(
        "/v1/pools/exclusions/add",
        json!({"pool": "default", "network": "10.88.0.5", "reason": "bad\nreason"}),
    );
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid exclusion reason") && !message.contains("owner"),
        "{message}"
    );
    let long = "x".repeat(512 * 1024);
    for request in [
        json!({"owner": "o", "family": long}),
        json!({"owner": "o", "pool": long}),
        json!({"owner": "o", "scope": long}),
        json!({"owner": long}),
        json!({"pool": "default", "range": long}),
        json!({"pool": "default", "network": long, "reason": "r"}),
    ] {
        for path in [
            "/v1/allocate",
            "/v1/pools/ranges/add",
            "/v1/pools/exclusions/add",
        ] {
            let (status, text) = agent.request("POST", path, Some(request.to_string().as_bytes()));
            assert!((400..500).contains(&status), "{status}: {text:.300}");
            assert!(
                text.len() < 1024,
                "{path}: {} bytes: {text:.300}",
                text.len()
            );
        }
    }
    agent.stop();
}

/// The agent on its unix socket and on a loopback TCP port with a bearer token.
fn start_with_tcp(dir: &Path, token: &str) -> (corral_agent::Running, std::net::SocketAddr) {
    // The port is free when asked, and the agent binds it a moment later; should another
    // process take it in between, try another.
    for _ in 0..3 {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap();
        let config = AgentConfig {
            tcp: Some(addr),
            token: Some(config::BearerToken::new(token)),
            ..AgentConfig::in_dir(dir)
        };
        match corral_agent::Running::start(config) {
            Ok(running) => return (running, addr),
            Err(corral_agent::AgentError::Tcp { .. }) => continue,
            Err(error) => panic!("the agent does not start: {error}"),
        }
    }
    panic!("no free loopback port for the agent");
}

/// `GET /v1/status` on TCP with these extra header lines; the status.
fn tcp_status(addr: std::net::SocketAddr, headers: &str) -> u16 {
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head =
        format!("GET /v1/status HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
    http::exchange(stream, &head, None).0
}

/// Regression: `Authorization: bearer <token>` was refused, although an authentication
/// scheme's name is case-insensitive (RFC 7235 section 2.1).
#[test]
fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
    const TOKEN: &str = "api-test-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let (running, addr) = start_with_tcp(dir.path(), TOKEN);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let header = format!("Authorization: {scheme} {TOKEN}\r\n");
        assert_eq!(tcp_status(addr, &header), 200, "{header}");
    }
    // Several spaces may separate the scheme from the token (RFC 7235: 1*SP).
    assert_eq!(
        tcp_status(addr, &format!("Authorization: Bearer   {TOKEN}\r\n")),
        200
    );
    for header in [
        String::new(),
        format!("Authorization: Bearer {}\r\n", TOKEN.to_uppercase()),
        format!("Authorization: Bearer {TOKEN}x\r\n"),
        format!("Authorization: Basic {TOKEN}\r\n"),
        format!("Authorization: Bearer{TOKEN}\r\n"),
        format!("Authorization: Bearers {TOKEN}\r\n"),
        "Authorization: Bearer \r\n".to_owned(),
        "Authorization: bearer\r\n".to_owned(),
    ] {
        assert_eq!(tcp_status(addr, &header), 401, "{header:?}");
    }
    running.stop().unwrap();
}

/// A request whose body never arrives is answered 400 once the body timeout has passed, and
/// a connection that sends nothing is closed after the header timeout: neither holds a place
/// on the socket for ever.
#[test]
fn slow_bodies_and_idle_connections_are_timed_out_on_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        connections: corral_agent::ConnectionLimits {
            header_timeout: Duration::from_millis(500),
            body_timeout: Duration::from_millis(500),
            ..corral_agent::ConnectionLimits::default()
        },
        ..AgentConfig::in_dir(dir.path())
    };
    let socket = config.socket.clone();
    let running = corral_agent::Running::start(config).unwrap();

    let mut slow = UnixStream::connect(&socket).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = std::time::Instant::now();
    slow.write_all(
        b"POST /v1/allocate HTTP/1.1\r\nHost: corral\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"owner\":",
    )
    .unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("the body did not arrive within 500 ms of the request's head"),
        "{answer}"
    );

    let mut idle = UnixStream::connect(&socket).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut nothing = Vec::new();
    idle.read_to_end(&mut nothing).unwrap();
    let lived = started.elapsed();
    // Closed by the agent after its header timeout, not before (a connection it never
    // closed would fail the read above on the socket's 10 s timeout).
    assert!(
        lived >= Duration::from_millis(450),
        "closed after {lived:?}"
    );
    assert!(
        nothing.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&nothing)
    );
    // Nothing was allocated.
    let (_, dump) = {
        let (status, text) = request(&socket, "GET", "/v1/dump", None);
        (status, serde_json::from_str::<Value>(&text).unwrap())
    };
    assert_eq!(dump["scopes"][0]["pools"][0]["allocations"], json!([]));
    running.stop().unwrap();
}

/// `/v1/gc` over the node scope: the first run only records suspects, durably (a restart in
/// between keeps them), a later run past the grace period releases them, whole; a live
/// attachment, an allocation without a key and anything on a dry run stay; bad input is 400
/// and changes nothing. With no grace period a first observation is enough.
#[test]
fn gc_releases_a_leak_only_at_a_later_run_past_the_grace_period() {
    let (dir, agent) = Agent::start_in_tempdir();
    let key = |c: &str| json!({"network": "podnet", "container_id": c, "ifname": "eth0"});
    let (status, leaked) = agent.post(
        "/v1/allocate",
        json!({"owner": "leak", "key": key("leak"), "family": "dual"}),
    );
    assert_eq!(status, 200, "{leaked}");
    agent.post("/v1/allocate", json!({"owner": "kept", "key": key("kept")}));
    agent.post("/v1/allocate", json!({"owner": "no-key"}));
    let held = |agent: &Agent| -> Vec<String> {
        let (_, dump) = agent.get("/v1/dump?scope=node");
        dump["scopes"][0]["pools"][0]["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["owner"].as_str().unwrap().to_owned())
            .collect()
    };

    // Refused input changes nothing: a malformed key, a cap of 0, an unknown scope.
    let bad_key = json!({"live": [{"network": "podnet", "container_id": "../x", "ifname": "eth0"}], "grace_ms": 0});
    assert_eq!(agent.post("/v1/gc", bad_key).0, 400);
    assert_eq!(
        agent
            .post("/v1/gc", json!({"live": [], "max_released": 0}))
            .0,
        400
    );
    assert_eq!(
        agent.post("/v1/gc", json!({"scope": "nope", "live": []})).0,
        404
    );

    let live = json!([key("kept")]);
    let (status, first) = agent.post("/v1/gc", json!({"live": live, "grace_ms": 600000}));
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["live"], 1, "{first}");
    assert_eq!(first["recorded"][0]["key"], key("leak"), "{first}");
    assert_eq!(
        first["recorded"][0]["addresses"].as_array().unwrap().len(),
        2
    );
    assert_eq!(first["released"], json!([]), "{first}");
    assert_eq!(
        held(&agent).len(),
        4,
        "the first observation releases nothing"
    );

    // The suspect survives a restart of the agent.
    agent.stop();
    std::thread::sleep(Duration::from_millis(5));
    let agent = Agent::start(dir.path());
    let (_, dry) = agent.post(
        "/v1/gc",
        json!({"live": live, "grace_ms": 0, "dry_run": true}),
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["released"][0]["key"], key("leak"), "{dry}");
    assert_eq!(held(&agent).len(), 4, "a dry run changes nothing");
    // A long grace period keeps it waiting.
    let (_, waiting) = agent.post("/v1/gc", json!({"live": live, "grace_ms": 600000}));
    assert_eq!(waiting["waiting"][0]["key"], key("leak"), "{waiting}");
    assert!(waiting["waiting"][0]["due_ms"].as_u64().is_some());
    let (_, second) = agent.post("/v1/gc", json!({"live": live, "grace_ms": 0}));
    assert_eq!(second["released"][0]["key"], key("leak"), "{second}");
    // With no grace period one observation is enough: a new leak goes at the first run.
    let (status, _) = agent.post(
        "/v1/allocate",
        json!({"owner": "leak-2", "key": key("leak-2")}),
    );
    assert_eq!(status, 200);
    let (_, once) = agent.post("/v1/gc", json!({"live": live, "grace_ms": 0}));
    assert_eq!(once["recorded"], json!([]), "{once}");
    assert_eq!(once["released"][0]["key"], key("leak-2"), "{once}");
    let mut owners = held(&agent);
    owners.sort();
    assert_eq!(owners, ["kept", "no-key"], "both families of the leak went");
    agent.stop();
}
