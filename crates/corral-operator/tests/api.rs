//! The operator's API over its real listeners (a unix socket in a temporary directory and a
//! loopback TCP port), on a view built here without etcd: a standby's answers, a leader's
//! nodes, pools, grants and plans, errors as JSON bodies, the token on TCP, and `/metrics`
//! as valid OpenMetrics text.

use crate::common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use corral_api::ErrorResponse;
use corral_api::operator as body;
use corral_cluster::testing::PoolTable;
use corral_cluster::{ClusterConfig, ClusterName, ClusterView, Keys, NodeName};
use corral_operator::Shared;
use corral_operator::api::{Api, ApiConfig, BindError};

const TOKEN: &str = "operator-test-token-0123456789";

const DUAL: &str = include_str!("configs/api_dual.toml");

const NODE_IDS: &str = include_str!("configs/api_node_ids.toml");

/// A view of cluster `t` under `toml`, with `nodes` registered and granted what they need,
/// and `waiting` registered only.
fn view(toml: &str, nodes: &[&str], waiting: &[&str]) -> ClusterView {
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let config = ClusterConfig::from_toml(toml).unwrap();
    let mut view = ClusterView::new(keys.clone(), config.clone());
    view.apply_put(&keys.config(), config.to_json().unwrap().as_bytes(), 1, 1);
    let mut revision = 2;
    for name in nodes.iter().chain(waiting) {
        let record = common::node_record(name);
        view.apply_put(
            &format!("/corral/t/v1/nodes/{name}"),
            &record,
            revision,
            revision,
        );
        revision += 1;
    }
    for name in nodes {
        let proposal = view.propose(&NodeName::new(name).unwrap()).unwrap();
        view.commit(&proposal, revision);
        revision += 1;
    }
    view
}

struct Running {
    runtime: tokio::runtime::Runtime,
    api: Option<Api>,
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

impl Running {
    fn start(shared: Arc<Shared>) -> Running {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/operator.sock");
        let config = ApiConfig {
            socket: socket.clone(),
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            token: Some(corral_operator::api::BearerToken::new(TOKEN)),
        };
        let api = runtime
            .block_on(corral_operator::api::bind(config, shared))
            .unwrap();
        Running {
            runtime,
            api: Some(api),
            _dir: dir,
            socket,
        }
    }

    fn tcp(&self) -> SocketAddr {
        self.api.as_ref().unwrap().tcp_addr().unwrap()
    }

    fn get(&self, path: &str) -> Answer {
        request_unix(&self.socket, "GET", path, "")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(api) = self.api.take() {
            self.runtime.block_on(api.stop());
        }
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    /// The status line and headers.
    head: String,
    body: String,
}

impl Answer {
    fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        assert_eq!(self.status, 200, "{}", self.body);
        assert_eq!(self.content_type, "application/json", "{self:?}");
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The error body, which must be an `ErrorResponse` with the status's code.
    fn error(&self, status: u16) -> ErrorResponse {
        assert_eq!(self.status, status, "{}", self.body);
        let error: ErrorResponse = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not an error body ({e}): {}", self.body));
        assert_eq!(error.error.code.status(), status);
        error
    }
}

fn exchange(mut stream: impl Read + Write, method: &str, path: &str, headers: &str) -> Answer {
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    Answer {
        status,
        content_type,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

fn request_unix(socket: &Path, method: &str, path: &str, headers: &str) -> Answer {
    let stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    exchange(stream, method, path, headers)
}

fn request_tcp(addr: SocketAddr, path: &str, headers: &str) -> Answer {
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    exchange(stream, "GET", path, headers)
}

fn leader(view: &ClusterView) -> Arc<Shared> {
    let shared = Arc::new(Shared::new("op-a".into()));
    shared.install(view.clone(), 42);
    shared.set_leading(true, Duration::from_millis(7));
    shared
}

#[test]
fn a_standby_answers_503_naming_itself_and_says_what_it_knows() {
    let running = Running::start(Arc::new(Shared::new("op-b".into())));
    for path in [
        "/v1/nodes",
        "/v1/nodes/node-a",
        "/v1/nodes/node-a/plan",
        "/v1/pools",
        "/v1/grants",
        "/readyz",
    ] {
        let error = running.get(path).error(503);
        assert!(error.error.message.contains("op-b"), "{path}: {error:?}");
        assert!(error.error.retryable, "{path}");
    }
    let status: body::OperatorStatus = running.get("/v1/status").json();
    assert_eq!(status.replica, "op-b");
    assert!(!status.leading);
    assert!(status.cluster.is_none());
    let health = running.get("/healthz");
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    let metrics = running.get("/metrics");
    assert_eq!(metrics.status, 200);
    check_openmetrics(&metrics.body);
}

/// `/v1/status` says what is wrong now, since when, and keeps the past apart (issue 23).
#[test]
fn status_lists_current_problems_with_their_times_and_the_past_as_events() {
    let shared = Arc::new(Shared::new("op-b".into()));
    shared.raise("etcd", "resync", "resync: etcd is down".into());
    shared.raise("grant", "node-a", "grant to node-a: etcd is down".into());
    shared.resolve("grant", "node-a");
    let running = Running::start(Arc::clone(&shared));
    let status: body::OperatorStatus = running.get("/v1/status").json();
    assert_eq!(status.problems, vec!["resync: etcd is down".to_owned()]);
    assert_eq!(status.current.len(), 1);
    let problem = &status.current[0];
    assert_eq!(
        (problem.kind.as_str(), problem.subject.as_str()),
        ("etcd", "resync")
    );
    assert!(problem.since_ms > 1_600_000_000_000, "{problem:?}");
    assert!(problem.last_seen_ms >= problem.since_ms, "{problem:?}");
    let events: Vec<(&str, &str, bool)> = status
        .events
        .iter()
        .map(|e| (e.kind.as_str(), e.subject.as_str(), e.resolved))
        .collect();
    assert_eq!(
        events,
        [
            ("etcd", "resync", false),
            ("grant", "node-a", false),
            ("grant", "node-a", true)
        ]
    );
    let metrics = running.get("/metrics");
    check_openmetrics(&metrics.body);
    assert!(
        metrics
            .body
            .contains("\ncorral_operator_current_problems{kind=\"etcd\"} 1\n"),
        "{}",
        metrics.body
    );
    assert!(!metrics.body.contains("kind=\"grant\""), "{}", metrics.body);
}

#[test]
fn a_leader_answers_nodes_pools_grants_and_status_from_its_view() {
    let view = view(DUAL, &["node-a", "node-b"], &[]);
    let running = Running::start(leader(&view));
    let ready = running.get("/readyz");
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));

    let status: body::OperatorStatus = running.get("/v1/status").json();
    assert!(status.leading);
    assert_eq!(status.took_lead_ms, Some(7));
    let cluster = status.cluster.unwrap();
    assert_eq!(
        (cluster.revision, cluster.nodes, cluster.nodes_served),
        (42, 2, 2)
    );
    assert_eq!(cluster.leader.as_deref(), Some("op-a"));
    let v4 = cluster.pools.iter().find(|p| p.family == "ipv4").unwrap();
    // A /16 cut at /24 is 256 node CIDRs; one is reserved, two are granted.
    assert_eq!((v4.capacity.as_str(), v4.granted.as_str()), ("256", "2"));
    assert_eq!((v4.free.as_str(), v4.quarantined.as_str()), ("253", "0"));
    let v6 = cluster.pools.iter().find(|p| p.family == "ipv6").unwrap();
    assert_eq!(v6.capacity, "65536");

    let nodes: body::NodesResponse = running.get("/v1/nodes").json();
    let names: Vec<&str> = nodes.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node-a", "node-b"]);
    for node in &nodes.nodes {
        assert_eq!(node.grants.len(), 2, "{node:?}");
        assert!(node.waiting_for.is_empty(), "{node:?}");
    }
    let a: body::NodeStatus = running.get("/v1/nodes/node-a").json();
    assert_eq!(a, nodes.nodes[0]);
    assert_eq!(a.uid, "uid-node-a");

    let pools: body::ClusterPools = running.get("/v1/pools").json();
    assert_eq!(pools.pools.len(), 1);
    let families = &pools.pools[0].families;
    assert_eq!(families[0].family, "ipv4");
    assert_eq!(families[0].cidrs, ["10.192.0.0/16"]);
    assert_eq!(families[0].reserved, ["10.192.0.0/24"]);
    assert_eq!(
        (families[0].node_prefix_len, families[0].granted.as_str()),
        (24, "2")
    );
    assert_eq!(families[1].family, "ipv6");

    let grants: body::GrantsResponse = running.get("/v1/grants").json();
    assert_eq!(grants.grants.len(), 4);
    assert!(grants.node_ids.is_empty());
    let cidrs: BTreeSet<&str> = grants.grants.iter().map(|g| g.cidr.as_str()).collect();
    assert_eq!(cidrs.len(), 4, "no CIDR twice: {grants:?}");
    for grant in &grants.grants {
        assert!(
            a.grants.iter().any(|g| g.cidr == grant.cidr) == (grant.node == "node-a"),
            "{grant:?}"
        );
    }

    let metrics = running.get("/metrics");
    check_openmetrics(&metrics.body);
    assert!(
        metrics
            .body
            .contains("corral_operator_nodes{state=\"served\"} 2"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("corral_operator_leader 1"),
        "{}",
        metrics.body
    );
}

/// What a node's agent asserts it holds comes with each range's use and size, in decimal
/// strings (an IPv6 /64 holds 2^64 addresses): the dashboard's per-node bars.
#[test]
fn a_nodes_holdings_carry_their_use_and_size() {
    let mut view = view(DUAL, &["node-a"], &[]);
    let name = NodeName::new("node-a").unwrap();
    let ranges = view
        .grants_of(&name)
        .into_iter()
        .map(|grant| corral_cluster::HeldRange {
            pool: grant.pool.clone(),
            cidr: grant.cidr,
            draining: grant.cidr.addr().is_ipv6(),
            allocations: 3,
        })
        .collect();
    let record = corral_cluster::HoldingsRecord {
        uid: "uid-node-a".into(),
        ranges,
        node_id: None,
        other_node_ids: vec![],
        cloud: vec![],
        refused: vec![],
        refused_node_id: None,
        written_ms: 0,
    };
    view.apply_put(
        "/corral/t/v1/holdings/node-a",
        &corral_cluster::encode_value(&record).unwrap(),
        100,
        100,
    );
    let running = Running::start(leader(&view));
    let node: body::NodeStatus = running.get("/v1/nodes/node-a").json();
    let mut holdings: Vec<(&str, &str, &str, bool)> = node
        .holdings
        .iter()
        .map(|h| {
            assert_eq!(h.pool, "default");
            assert!(node.grants.iter().any(|g| g.cidr == h.cidr), "{h:?}");
            (
                h.family.as_str(),
                h.allocated.as_str(),
                h.size.as_str(),
                h.draining,
            )
        })
        .collect();
    holdings.sort();
    assert_eq!(
        holdings,
        [
            ("ipv4", "3", "256", false),
            ("ipv6", "3", "18446744073709551616", true)
        ]
    );
    assert_eq!(node.held.len(), 2, "{:?}", node.held);
}

#[test]
fn errors_are_json_bodies_naming_what_failed() {
    let view = view(DUAL, &["node-a"], &["node-w"]);
    let running = Running::start(leader(&view));
    let missing = running.get("/v1/nodes/node-x").error(404);
    assert!(missing.error.message.contains("node-x"), "{missing:?}");
    for garbage in [
        "/v1/nodes/Node_A",
        "/v1/nodes/%FF%FE",
        "/v1/nodes/a%2Fb/plan",
        "/v1/nodes/-x",
    ] {
        let error = running.get(garbage).error(400);
        assert!(
            error.error.message.contains("node name"),
            "{garbage}: {error:?}"
        );
    }
    let long = format!("/v1/nodes/{}", "a".repeat(5000));
    let error = running.get(&long).error(400);
    assert!(
        error.error.message.len() < 400,
        "the message quotes a prefix: {error:?}"
    );
    // No node-ID plan in this cluster.
    let error = running.get("/v1/nodes/node-a/plan").error(404);
    assert!(error.error.message.contains("node-ID plan"), "{error:?}");
    running.get("/v1/nope").error(404);
    running.get("/v1/nodes/node-a/extra/x").error(404);
    for method in ["POST", "DELETE", "PUT"] {
        request_unix(
            &running.socket,
            method,
            "/v1/nodes",
            "Content-Length: 0\r\n",
        )
        .error(405);
    }
    let waiting: body::NodeStatus = running.get("/v1/nodes/node-w").json();
    assert!(waiting.grants.is_empty());
    assert_eq!(waiting.waiting_for, ["default ipv4", "default ipv6"]);
    let openapi = running.get("/openapi.json");
    assert_eq!(openapi.status, 200);
    assert_eq!(openapi.body, corral_operator::api::OPENAPI);
}

#[test]
fn plans_in_a_node_id_cluster() {
    let view = view(NODE_IDS, &["node-a"], &[]);
    let running = Running::start(leader(&view));
    let plan: body::NodePlan = running.get("/v1/nodes/node-a/plan").json();
    assert_eq!(plan.node_id, 1);
    assert_eq!(plan.pod_subnet, "10.1.1.0/24");
    let grants: body::GrantsResponse = running.get("/v1/grants").json();
    assert_eq!(grants.node_ids.len(), 1);
    assert_eq!(
        (grants.node_ids[0].node.as_str(), grants.node_ids[0].id),
        ("node-a", 1)
    );
    let error = running.get("/v1/nodes/node-z/plan").error(404);
    assert!(
        error.error.message.contains("node-z is not registered"),
        "{error:?}"
    );
}

#[test]
fn tcp_needs_the_token_in_any_case_of_the_scheme() {
    let view = view(DUAL, &["node-a"], &[]);
    let running = Running::start(leader(&view));
    let addr = running.tcp();
    assert!(addr.ip().is_loopback());
    request_tcp(addr, "/v1/nodes", "").error(401);
    request_tcp(
        addr,
        "/healthz",
        "Authorization: Bearer wrong-token-0123456789\r\n",
    )
    .error(401);
    request_tcp(
        addr,
        "/healthz",
        &format!("Authorization: Basic {TOKEN}\r\n"),
    )
    .error(401);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let answer = request_tcp(
            addr,
            "/v1/nodes",
            &format!("Authorization: {scheme} {TOKEN}\r\n"),
        );
        let nodes: body::NodesResponse = answer.json();
        assert_eq!(nodes.nodes.len(), 1);
    }
}

/// The dashboard's page and assets are served on TCP without the token (they hold no data),
/// under a policy that lets them load and fetch from their own origin only; every API route,
/// and any other path, still needs the token.
#[test]
fn the_dashboard_is_served_without_the_token_and_holds_no_data() {
    let view = view(DUAL, &["node-a"], &["node-b"]);
    let running = Running::start(leader(&view));
    let addr = running.tcp();
    for (path, content_type) in [
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/app.css", "text/css; charset=utf-8"),
    ] {
        let answer = request_tcp(addr, path, "");
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert_eq!(answer.content_type, content_type, "{path}");
        let head = answer.head.to_ascii_lowercase();
        assert!(
            head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
            "{path}: {head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert!(!answer.body.contains("node-a"), "{path} holds data");
        // The same on the socket.
        assert_eq!(running.get(path).body, answer.body);
    }
    let page = request_tcp(addr, "/dashboard", "").body;
    assert!(
        page.contains(r#"<script src="/dashboard/app.js""#),
        "{page}"
    );
    // The script reads the API the CLI reads, with the bearer token from the fragment.
    let script = request_tcp(addr, "/dashboard/app.js", "").body;
    for needle in [
        "'/v1/status'",
        "'/v1/nodes'",
        "/v1/history?limit=",
        "#token=",
        "Bearer",
    ] {
        assert!(script.contains(needle), "{needle} in app.js");
    }
    request_tcp(addr, "/v1/status", "").error(401);
    request_tcp(addr, "/dashboard/other.js", "").error(401);
    request_tcp(addr, "/", "").error(401);
    let answer = request_tcp(
        addr,
        "/dashboard/other.js",
        &format!("Authorization: Bearer {TOKEN}\r\n"),
    );
    answer.error(404);
}

#[test]
fn a_tcp_listener_must_be_loopback_with_a_token_and_a_live_socket_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared::new("op".into()));
    let bind = |config: ApiConfig| {
        runtime.block_on(corral_operator::api::bind(config, Arc::clone(&shared)))
    };
    let socket = dir.path().join("op.sock");
    let config = |tcp: &str, token: Option<&str>| ApiConfig {
        socket: socket.clone(),
        tcp: Some(tcp.parse().unwrap()),
        token: token.map(corral_operator::api::BearerToken::new),
    };
    let error = bind(config("0.0.0.0:0", Some(TOKEN))).unwrap_err();
    assert!(
        matches!(error, BindError::Tcp { .. }) && error.to_string().contains("loopback"),
        "{error}"
    );
    let error = bind(config("127.0.0.1:0", None)).unwrap_err();
    assert!(error.to_string().contains("token"), "{error}");
    let error = bind(config("127.0.0.1:0", Some("  "))).unwrap_err();
    assert!(error.to_string().contains("token"), "{error}");
    assert!(
        !socket.exists(),
        "nothing bound before the settings were checked"
    );
    let api = bind(ApiConfig {
        socket: socket.clone(),
        tcp: None,
        token: None,
    })
    .unwrap();
    let error = bind(ApiConfig {
        socket: socket.clone(),
        tcp: None,
        token: None,
    })
    .unwrap_err();
    assert!(
        error.to_string().contains("another process is listening"),
        "{error}"
    );
    runtime.block_on(api.stop());
    assert!(!socket.exists(), "stop removes the socket");
}

#[test]
fn resyncs_are_counted_by_outcome() {
    let shared = Arc::new(Shared::new("op".into()));
    shared.note_resync(true);
    shared.note_resync(true);
    shared.note_resync(false);
    let running = Running::start(shared);
    let metrics = running.get("/metrics").body;
    check_openmetrics(&metrics);
    assert!(
        metrics.contains("corral_operator_resyncs_total{outcome=\"Ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("corral_operator_resyncs_total{outcome=\"Failed\"} 1"),
        "{metrics}"
    );
}

/// OpenMetrics text: `# EOF` once, at the end; every sample belongs to a family declared
/// before it with `# HELP` and `# TYPE`, each family declared once and its samples together.
fn check_openmetrics(text: &str) {
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    let mut helped = BTreeSet::new();
    let mut typed: Vec<(String, String)> = Vec::new();
    let mut finished = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in text.lines().filter(|l| *l != "# EOF") {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let family = rest.split(' ').next().unwrap().to_owned();
            assert!(
                helped.insert(family.clone()),
                "{family} described twice:\n{text}"
            );
            if let Some(previous) = current.replace(family) {
                finished.insert(previous);
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let family = parts.next().unwrap().to_owned();
            let kind = parts.next().unwrap().to_owned();
            assert_eq!(current.as_ref(), Some(&family), "TYPE after HELP:\n{text}");
            assert!(["counter", "gauge", "histogram", "info", "unknown"].contains(&kind.as_str()));
            typed.push((family, kind));
        } else {
            assert!(!line.starts_with('#'), "unexpected comment {line:?}");
            let name = line.split(['{', ' ']).next().unwrap();
            let (family, kind) = typed
                .iter()
                .rfind(|(family, _)| name.starts_with(family.as_str()))
                .unwrap_or_else(|| panic!("sample {line:?} of no declared family:\n{text}"));
            assert_eq!(
                Some(family),
                current.as_ref(),
                "{line:?} outside its family:\n{text}"
            );
            assert!(!finished.contains(family));
            let suffix = &name[family.len()..];
            let allowed: &[&str] = match kind.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_count", "_sum", "_created"],
                _ => &[""],
            };
            assert!(
                allowed.contains(&suffix),
                "{line:?}: suffix {suffix:?} of a {kind}"
            );
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line:?}: value {value:?}");
        }
    }
}

#[test]
fn a_block_pool_nodes_statistics_and_metrics_are_served() {
    const BLOCKS: &str = include_str!("configs/api_blocks.toml");
    let mut view = view(BLOCKS, &[], &["node-a"]);
    let node = NodeName::new("node-a").unwrap();
    let pool = corral_cluster::PoolName::new("pods").unwrap();
    let proposal = view
        .propose_blocks(&node, &pool, corral_cluster::Family::V4, 2)
        .unwrap();
    view.commit_blocks(&proposal, 10);
    let demand = corral_cluster::DemandRecord {
        ipv4: Some(corral_cluster::FamilyDemand {
            used: 25,
            free: 3,
            ..Default::default()
        }),
        ipv6: None,
        at_ms: 0,
    };
    view.apply_put(
        "/corral/t/v1/demand/node-a/pods",
        &corral_cluster::encode_value(&demand).unwrap(),
        11,
        11,
    );
    let running = Running::start(leader(&view));
    let a: body::NodeStatus = running.get("/v1/nodes/node-a").json();
    assert_eq!(a.grants.len(), 2);
    assert_eq!(a.blocks.len(), 1, "{a:?}");
    let blocks = &a.blocks[0];
    assert_eq!(
        (blocks.pool.as_str(), blocks.family.as_str()),
        ("pods", "ipv4")
    );
    assert_eq!(
        (
            blocks.used.as_str(),
            blocks.available.as_str(),
            blocks.capacity.as_str(),
            blocks.needed.as_str(),
            blocks.excess.as_str()
        ),
        ("25", "28", "28", "0", "0")
    );
    assert_eq!((blocks.blocks, blocks.in_handshake), (2, 0));
    assert!(blocks.at_capacity && blocks.has_demand);
    let nodes: body::NodesResponse = running.get("/v1/nodes").json();
    assert_eq!(nodes.nodes[0], a);
    let metrics = running.get("/metrics");
    check_openmetrics(&metrics.body);
    for line in [
        "corral_operator_block_addresses_available{pool=\"pods\",family=\"ipv4\"} 3",
        // No liveness key: degraded.
        "corral_operator_block_nodes{category=\"degraded\"} 1",
        "corral_operator_block_nodes{category=\"at_capacity\"} 0",
    ] {
        assert!(metrics.body.contains(line), "{line} in\n{}", metrics.body);
    }
}

#[test]
fn a_cloud_pool_nodes_interfaces_and_statistics_are_served() {
    const CLOUD: &str = include_str!("configs/api_cloud.toml");
    let mut view = view(CLOUD, &[], &["node-a"]);
    let record = corral_cluster::CloudInterfaceRecord {
        pool: corral_cluster::PoolName::new("pods").unwrap(),
        instance_id: "i-1".into(),
        device_index: 1,
        subnet_id: "subnet-a".into(),
        subnets: vec!["10.0.0.0/18".parse().unwrap()],
        mac: "0a:00:00:00:00:01".into(),
        primary_ipv4: Some("10.0.0.9".parse().unwrap()),
        addresses: vec![
            "10.0.0.10/32".parse().unwrap(),
            "10.0.0.16/28".parse().unwrap(),
        ],
        assigned_ms: Default::default(),
        attachment: corral_cluster::CloudAttachment::Attached,
        managed: true,
        prefixes_refused_ms: None,
    };
    view.apply_put(
        "/corral/t/v1/interfaces/node-a/eni-1",
        &corral_cluster::encode_value(&record).unwrap(),
        10,
        10,
    );
    let shared = leader(&view);
    shared.note_cloud_node(
        "node-a",
        vec![corral_operator::state::CloudNodeFigures {
            pool: "pods".into(),
            family: corral_cluster::Family::V4,
            stats: corral_cluster::blocks::Statistics {
                used: 3,
                available: 17,
                capacity: 18,
                needed: 0,
                excess: 6,
            },
            at_capacity: true,
        }],
    );
    let running = Running::start(shared);
    let a: body::NodeStatus = running.get("/v1/nodes/node-a").json();
    assert_eq!(
        a.cloud_interfaces,
        [body::NodeCloudInterface {
            id: "eni-1".into(),
            pool: "pods".into(),
            device_index: 1,
            subnet_id: "subnet-a".into(),
            attachment: "attached".into(),
            managed: true,
            addresses: vec!["10.0.0.10/32".into(), "10.0.0.16/28".into()],
        }]
    );
    assert_eq!(
        a.cloud,
        [body::NodeCloud {
            pool: "pods".into(),
            family: "ipv4".into(),
            used: "3".into(),
            available: "17".into(),
            capacity: "18".into(),
            needed: "0".into(),
            excess: "6".into(),
            at_capacity: true,
        }]
    );
    let metrics = running.get("/metrics");
    check_openmetrics(&metrics.body);
}

/// Issue 23: with a block pool exhausted, the nodes with no block looked served everywhere
/// and `full` named one of them, as a "CIDR".
#[test]
fn nodes_starving_in_an_exhausted_block_pool_are_waiting_everywhere_and_all_named_in_full() {
    let two_blocks = PoolTable::blocks("pods")
        .pre_allocate(8)
        .ipv4("10.64.0.0/27", 28)
        .to_string();
    let names = ["node-a", "node-b", "node-c", "node-d"];
    let mut view = view(&two_blocks, &[], &names);
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let pool = corral_cluster::PoolName::new("pods").unwrap();
    for (i, name) in names.iter().enumerate() {
        let node = NodeName::new(name).unwrap();
        if let Ok(proposal) = view.propose_blocks(&node, &pool, corral_cluster::Family::V4, 1) {
            view.commit_blocks(&proposal, 20 + i as i64);
        }
        view.apply_put(
            &keys.live(&node),
            b"{\"schema\":1,\"pid\":1,\"version\":\"t\",\"started_ms\":0}",
            30 + i as i64,
            30 + i as i64,
        );
    }
    let running = Running::start(leader(&view));
    let nodes: body::NodesResponse = running.get("/v1/nodes").json();
    for node in &nodes.nodes {
        if ["node-a", "node-b"].contains(&node.name.as_str()) {
            assert!(
                node.waiting_for.is_empty() && node.waiting.is_empty(),
                "{node:?}"
            );
        } else {
            assert_eq!(node.waiting_for, ["pods ipv4"], "{node:?}");
            assert_eq!(
                node.waiting,
                [body::NodeWaiting {
                    what: "pods ipv4".into(),
                    unit: "block".into(),
                    reason: "no free block: the pool is exhausted".into(),
                    starving: true,
                }]
            );
        }
    }
    let status: body::OperatorStatus = running.get("/v1/status").json();
    assert_eq!(
        status.full.get("pods/ipv4").map(String::as_str),
        Some("no free block for 2 nodes (node-c, node-d): the pool is exhausted"),
        "{:?}",
        status.full
    );
    let cluster = status.cluster.unwrap();
    assert_eq!(
        (cluster.nodes, cluster.nodes_served, cluster.nodes_waiting),
        (4, 2, 2)
    );
    let metrics = running.get("/metrics");
    check_openmetrics(&metrics.body);
    for line in [
        "corral_operator_nodes{state=\"served\"} 2",
        "corral_operator_nodes{state=\"waiting\"} 2",
        "corral_operator_block_nodes{category=\"ok\"} 2",
        "corral_operator_block_nodes{category=\"starving\"} 2",
    ] {
        assert!(metrics.body.contains(line), "{line} in\n{}", metrics.body);
    }
}

/// Issue 23: the standby's 503 did not name the leader.
#[test]
fn a_standby_503_names_the_leader_it_last_read() {
    let shared = Arc::new(Shared::new("op-b".into()));
    let running = Running::start(Arc::clone(&shared));
    let error = running.get("/v1/nodes").error(503);
    assert!(
        error.error.message.contains("no replica leads now"),
        "{error:?}"
    );
    shared.set_leader_seen(Some("op-a".into()));
    for path in ["/v1/nodes", "/v1/pools", "/readyz"] {
        let error = running.get(path).error(503);
        assert!(
            error.error.message.contains("ask the leader, op-a"),
            "{path}: {error:?}"
        );
    }
}

/// `GET /v1/history` reads etcd through the replica's reader: who held an address (at a
/// time), a node's grants, the newest; bad queries are 400 naming what is wrong; a replica
/// that does not lead is 503.
#[test]
fn history_answers_who_held_an_address_and_refuses_bad_queries() {
    use corral_cluster::{GrantEnd, HistoryRecord, PoolName};
    let view = view(DUAL, &["node-a"], &[]);
    let kv = corral_kv::MemKv::new();
    let keys = Keys::new(ClusterName::new("t").unwrap());
    // node-old held 10.192.9.0/24 from 1000 to 2000; node-a holds 10.192.1.0/24 (in the view
    // only: the store has no grant, so only the newest events name it, from the view).
    let record = HistoryRecord {
        pool: PoolName::new("default").unwrap(),
        cidr: "10.192.9.0/24".parse().unwrap(),
        node: NodeName::new("node-old").unwrap(),
        from_ms: Some(1000),
        to_ms: 2000,
        why: GrantEnd::NodeRemoved,
    };
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async {
            for (key, value) in corral_cluster::history::puts(&keys, &record).unwrap() {
                corral_kv::Kv::txn(
                    &kv,
                    corral_kv::Txn {
                        compares: vec![],
                        success: vec![corral_kv::TxnOp::put(key, value)],
                        failure: vec![],
                    },
                )
                .await
                .unwrap();
            }
        });
    let shared = leader(&view);
    {
        let (kv, keys) = (kv.clone(), keys.clone());
        shared.set_history_reader(Arc::new(move |config, request, held| {
            let (kv, keys) = (kv.clone(), keys.clone());
            Box::pin(async move {
                corral_operator::history::read_with_held(
                    &kv, &keys, &config, &request, 10_000, held,
                )
                .await
            })
        }));
    }
    let running = Running::start(shared);
    let expected = body::GrantEvent {
        pool: "default".into(),
        family: "ipv4".into(),
        cidr: "10.192.9.0/24".into(),
        node: "node-old".into(),
        from_ms: Some(1000),
        to_ms: Some(2000),
        why: Some("node_removed".into()),
    };
    for path in [
        "/v1/history?address=10.192.9.77",
        "/v1/history?address=10.192.9.77&at=1999",
        "/v1/history?address=10.192.9.0/24&at=1970-01-01T00:00:01Z",
        "/v1/history?node=node-old",
    ] {
        let answer: body::GrantHistory = running.get(path).json();
        assert_eq!(answer.events, std::slice::from_ref(&expected), "{path}");
    }
    // The newest events: the ended one read back, and the grants held from the leader's view
    // (node-a's, which the store does not have: the view is read, not `grants/`).
    let answer: body::GrantHistory = running.get("/v1/history?limit=5").json();
    let held: Vec<_> = answer.events[1..]
        .iter()
        .map(|e| (e.node.as_str(), e.cidr.as_str(), e.to_ms))
        .collect();
    assert_eq!(answer.events[0], expected, "{answer:?}");
    assert_eq!(
        held,
        [
            ("node-a", "10.192.1.0/24", None),
            ("node-a", "fd00:200::/64", None)
        ],
        "{answer:?}"
    );
    let answer: body::GrantHistory = running.get("/v1/history?limit=1").json();
    assert_eq!(answer.events, std::slice::from_ref(&expected), "{answer:?}");
    for path in [
        "/v1/history?address=10.192.9.77&at=2000",
        "/v1/history?address=10.192.8.1",
        "/v1/history?node=node-a",
    ] {
        let answer: body::GrantHistory = running.get(path).json();
        assert!(answer.events.is_empty(), "{path}: {answer:?}");
    }
    for (path, words) in [
        ("/v1/history?address=nope", "invalid address"),
        ("/v1/history?at=yesterday", "invalid time"),
        ("/v1/history?node=Node_A", "node name"),
        ("/v1/history?address=10.0.0.1&node=a", "not both"),
        ("/v1/history?limit=0", "invalid limit"),
        ("/v1/history?limit=x", "limit"),
        ("/v1/history?color=red", "color"),
    ] {
        let error = running.get(path).error(400);
        assert!(error.error.message.contains(words), "{path}: {error:?}");
    }
    drop(running);
    let standby = Running::start(Arc::new(Shared::new("op-b".into())));
    standby.get("/v1/history?address=10.192.9.77").error(503);
}
