//! The agents' footprint on etcd, counted (issue 25): 50 real agent links in this process
//! (`common/fleet.rs`) on a three-member etcd with a `corral operator` leading a node-CIDR
//! pool, and what etcd's members count of them: connections, watches, keep-alive streams and
//! writes per agent, idle after settling, directly and through `etcd grpc-proxy`. `make
//! bench-agents` measures the same at 5,000 agents (BENCHMARKS.md); this keeps its per-agent
//! figures from rotting. Counts, not times: the only bound involving time is an upper bound on
//! keep-alives in a window (the link's interval never sends them faster).

use std::time::Duration;

use crate::fleet;

use fleet::{Fleet, Operator, Proxy, Sample};

const AGENTS: usize = 50;
/// The watches each agent's link holds: its grants (`owned/`), node ID, the cluster's
/// configuration, its registration, its release handshakes, its cloud records, the operators'
/// election, its liveness key, its holdings and the leader's `reassert` key.
const WATCHES_PER_AGENT: f64 = 10.0;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts the fleet of cluster `cluster` on `endpoints`, waits until it is granted and etcd
/// saw no write for two seconds; answers it with the sample taken before it started (the
/// operator alone) and the one once settled.
fn settled_fleet(
    runtime: &tokio::runtime::Runtime,
    etcd: &corral_etcd::testing::EtcdCluster,
    cluster: &str,
    endpoints: &[String],
) -> (Fleet, Sample, Sample) {
    let before = Sample::take(etcd);
    let agents = runtime.block_on(Fleet::start(cluster, endpoints, AGENTS, AGENTS));
    runtime.block_on(agents.wait_granted(Duration::from_secs(120)));
    let mut last = Sample::take(etcd);
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = Sample::take(etcd);
        if now.proposals == last.proposals {
            return (agents, before, now);
        }
        last = now;
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn fifty_agents_footprint_on_etcd_direct_and_through_the_proxy() {
    fleet::raise_nofile();
    let runtime = runtime();
    let etcd = runtime
        .block_on(corral_etcd::testing::EtcdCluster::start(3))
        .expect("etcd starts (make deps)");
    let dir = tempfile::tempdir().unwrap();

    // Directly on the members.
    fleet::init(&etcd, "direct", fleet::CIDR_POOL, dir.path());
    let operator = Operator::start(&etcd, "direct", dir.path());
    std::thread::sleep(Duration::from_secs(2));
    let (agents, before, settled) = settled_fleet(&runtime, &etcd, "direct", &etcd.endpoints());
    std::thread::sleep(Duration::from_secs(10));
    let idle = Sample::take(&etcd);
    println!("direct: before {before:?}\nsettled {settled:?}\nidle {idle:?}");
    let n = AGENTS as f64;
    // One connection each (this process holds no other).
    assert_eq!((before.ours, idle.ours), (0.0, n), "{idle:?}");
    // Ten watches each, each on a stream of its own.
    assert_eq!(
        idle.watchers - before.watchers,
        WATCHES_PER_AGENT * n,
        "{idle:?}"
    );
    assert_eq!(
        idle.watch_streams - before.watch_streams,
        WATCHES_PER_AGENT * n,
        "{idle:?}"
    );
    // Idle after settling: not one write, not one transaction or lease grant.
    assert_eq!(idle.proposals, settled.proposals, "writes while idle");
    assert_eq!(idle.unary_since(&settled, "Txn"), 0.0, "{idle:?}");
    assert_eq!(idle.unary_since(&settled, "LeaseGrant"), 0.0, "{idle:?}");
    // A keep-alive every lease TTL / 3 (20 s / 3) per agent (and the operator's, 10 s / 3),
    // each on a new stream: never more than the window allows.
    let keep_alives = idle.keep_alives - settled.keep_alives;
    let streams = |s: &Sample| {
        s.streams_started
            .get("LeaseKeepAlive")
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(streams(&idle) - streams(&settled), keep_alives, "{idle:?}");
    let secs = idle.secs_since(&settled);
    let most = n * (secs / (20.0 / 3.0) + 1.0).floor() + (secs / (10.0 / 3.0) + 1.0).floor();
    assert!(
        keep_alives > 0.0 && keep_alives <= most,
        "{keep_alives} > {most}"
    );
    runtime.block_on(agents.stop());
    drop(operator);

    // Through the proxy: the members see its connections and its watches, not the agents'.
    fleet::init(&etcd, "proxied", fleet::CIDR_POOL, dir.path());
    let operator = Operator::start(&etcd, "proxied", dir.path());
    let proxy = Proxy::start(&etcd, dir.path());
    std::thread::sleep(Duration::from_secs(2));
    let proxy_before = Sample::of_proxy(&proxy);
    let (agents, before, settled) = settled_fleet(&runtime, &etcd, "proxied", &[proxy.endpoint()]);
    std::thread::sleep(Duration::from_secs(10));
    let idle = Sample::take(&etcd);
    let asked = Sample::of_proxy(&proxy);
    println!(
        "proxied: before {before:?}\nsettled {settled:?}\nidle {idle:?}\nproxy before {proxy_before:?}\nproxy {asked:?}"
    );
    // The agents' connections end at the proxy, which has a few of its own to the members.
    assert_eq!(asked.ours, n, "{asked:?}");
    assert_eq!(idle.ours, 0.0, "{idle:?}");
    assert!(idle.connections - before.connections <= 3.0, "{idle:?}");
    // Their watches reach the members on the proxy's few streams (those of the same keys
    // from the same revision as one).
    assert!(idle.watch_streams - before.watch_streams <= 3.0, "{idle:?}");
    assert!(
        idle.watchers - before.watchers <= WATCHES_PER_AGENT * n,
        "{idle:?}"
    );
    // Their keep-alives reach the members as many, on the proxy's one stream: the new
    // keep-alive streams the members see are the operator's (10 s / 3) alone.
    let keep_alives = idle.keep_alives - settled.keep_alives;
    let secs = idle.secs_since(&settled);
    let operators = (secs / (10.0 / 3.0) + 1.0).floor();
    assert!(
        streams(&idle) - streams(&settled) <= operators,
        "{idle:?} {settled:?}"
    );
    assert!(keep_alives > operators, "{keep_alives} keep-alives");
    assert_eq!(idle.proposals, settled.proposals, "writes while idle");
    runtime.block_on(agents.stop());
    drop(proxy);
    drop(operator);
}
