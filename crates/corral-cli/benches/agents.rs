//! `make bench-agents`: the agents' footprint on etcd (issue 25). `AGENTS` (default 5,000)
//! real agent links in this process (`tests/common/fleet.rs`: each a whole agent over a
//! `MemoryStore`, its cluster link the one `corral agent --etcd` runs, on its own etcd client)
//! on a local three-member etcd (real processes, fsync on), a `corral operator` process
//! leading. Four runs: a node-CIDR pool and a block pool, each with the agents on the members
//! directly and through `etcd grpc-proxy`. In each run, from etcd's own metrics (and the TCP
//! connections to its client ports), per agent: connections, watches, streams, lease
//! keep-alives per second, writes (raft proposals) and requests per second, idle after
//! settling (`IDLE_SECS`, default 30) and under pod churn (`CHURN_SECS`, default 60;
//! `CHURN_PER_MIN` CNI ADDs per agent per minute, default 3, each with the DEL of the agent's
//! previous pod: every agent runs one pod throughout, started before the idle window). The operator's own rate, measured alone before the agents start, is taken off.
//! `RUNS` picks runs (e.g. `cidr-direct,blocks-proxy`).
//!
//! Figures go to BENCHMARKS.md by hand, with the command.

use std::time::{Duration, Instant};

#[allow(dead_code)] // the bench uses part of the tests\' harness
#[path = "../tests/common/fleet.rs"]
mod fleet;
mod knobs;

use fleet::{Fleet, Operator, Proxy, Sample};
use knobs::env;

fn main() {
    let agents = env::<u64>("AGENTS", 5_000) as usize;
    let idle = Duration::from_secs(env("IDLE_SECS", 30));
    let churn = Duration::from_secs(env("CHURN_SECS", 60));
    let per_min: u64 = env("CHURN_PER_MIN", 3);
    let runs = std::env::var("RUNS")
        .unwrap_or_else(|_| "cidr-direct,cidr-proxy,blocks-direct,blocks-proxy".into());
    let nofile = fleet::raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let etcd = runtime
        // etcd's own timings (heartbeat 100 ms, election timeout 1 s), as a production
        // cluster runs, not the test harness's quick failover ones (50 ms and 250 ms): on this
        // 2-core machine thousands of agents starve the members, and under the harness's
        // timings their leader lost its term dozens of times while the agents started.
        .block_on(corral_etcd::testing::EtcdCluster::start_with(
            3,
            &["--heartbeat-interval", "100", "--election-timeout", "1000"],
        ))
        .expect("etcd starts (make deps)");
    let version = corral_etcd::testing::version_of(&corral_etcd::testing::etcd_binary().unwrap());
    println!(
        "rig: {version} (3 members on 127.0.0.1, fsync on, heartbeat 100 ms, election timeout 1 s), {} cores; {agents} agents in one process (open files {nofile}); idle {} s, churn {} s at {per_min} ADDs per agent per minute",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        idle.as_secs(),
        churn.as_secs()
    );
    let dir = tempfile::tempdir().unwrap();
    for run in runs.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let (pool, path) = run
            .split_once('-')
            .expect("RUNS: POOL-PATH, e.g. cidr-direct");
        let toml = match pool {
            "cidr" => fleet::CIDR_POOL,
            "blocks" => fleet::BLOCK_POOL,
            other => panic!("RUNS: no pool kind {other} (cidr, blocks)"),
        };
        let proxied = match path {
            "direct" => false,
            "proxy" => true,
            other => panic!("RUNS: no path {other} (direct, proxy)"),
        };
        fleet::init(&etcd, run, toml, dir.path());
        let operator = Operator::start(&etcd, run, dir.path());
        std::thread::sleep(Duration::from_secs(3));
        // The operator alone (and this bench's client), to take off.
        let alone = Sample::take(&etcd);
        std::thread::sleep(Duration::from_secs(5));
        let alone_end = Sample::take(&etcd);
        let proxy = proxied.then(|| Proxy::start(&etcd, dir.path()));
        let endpoints = match &proxy {
            Some(proxy) => vec![proxy.endpoint()],
            None => etcd.endpoints(),
        };
        let started = Instant::now();
        let fleet = runtime.block_on(Fleet::start(run, &endpoints, agents, 500));
        let ready = started.elapsed();
        runtime.block_on(fleet.wait_granted(Duration::from_secs(900)));
        let granted = started.elapsed();
        println!(
            "{run}: {agents} agents ready (holding their liveness keys) in {:.1} s, all granted in {:.1} s",
            ready.as_secs_f64(),
            granted.as_secs_f64()
        );
        // One pod on every agent first (a node's first pod changes what it asserts at once;
        // later ones only its counts), then settled: no write for six seconds, past the
        // holdings' look every 5 s (or a minute at most).
        let mut fleet = fleet;
        let mut cursor = 0usize;
        for _ in 0..agents.div_ceil(500) {
            runtime.block_on(fleet.churn_round(500.min(agents), 1, &mut cursor));
        }
        let settle_started = Instant::now();
        let mut last = Sample::take(&etcd);
        loop {
            std::thread::sleep(Duration::from_secs(6));
            let now = Sample::take(&etcd);
            if now.proposals == last.proposals || settle_started.elapsed() > Duration::from_secs(60)
            {
                break;
            }
            last = now;
        }
        let idle_start = Sample::take(&etcd);
        let proxy_idle_start = proxy.as_ref().map(Sample::of_proxy);
        std::thread::sleep(idle);
        let idle_end = Sample::take(&etcd);
        let proxy_idle_end = proxy.as_ref().map(Sample::of_proxy);
        let churn_end = runtime.block_on(async {
            // Rounds every 100 ms: agents * per_min / 600 ADDs each.
            let per_round = (agents as u64 * per_min).div_ceil(600) as usize;
            let began = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (mut calls, mut rounds) = (0usize, 0u64);
            while began.elapsed() < churn {
                tick.tick().await;
                calls += fleet.churn_round(per_round, 1, &mut cursor).await;
                rounds += 1;
            }
            (calls, rounds, began.elapsed())
        });
        let churned = Sample::take(&etcd);
        let proxy_churned = proxy.as_ref().map(Sample::of_proxy);
        let (calls, _rounds, churn_took) = churn_end;
        let base = Rates::between(&alone, &alone_end, 1.0);
        report(
            run,
            agents,
            "idle",
            &alone_end,
            &idle_start,
            &idle_end,
            &base,
            proxy_idle_start.as_ref().zip(proxy_idle_end.as_ref()),
        );
        println!(
            "{run}: churn: {calls} ADDs and DELs in {:.1} s ({:.1} per second fleet-wide)",
            churn_took.as_secs_f64(),
            calls as f64 / churn_took.as_secs_f64()
        );
        report(
            run,
            agents,
            "churn",
            &alone_end,
            &idle_end,
            &churned,
            &base,
            proxy_idle_end.as_ref().zip(proxy_churned.as_ref()),
        );
        runtime.block_on(fleet.stop());
        drop(proxy);
        drop(operator);
    }
}

/// Rates over a window, per second (divided by `n`).
#[derive(Clone, Copy, Debug, Default)]
struct Rates {
    keep_alives: f64,
    writes: f64,
    requests: f64,
    txns: f64,
    ranges: f64,
    streams: f64,
}

impl Rates {
    fn between(from: &Sample, to: &Sample, n: f64) -> Rates {
        let secs = to.secs_since(from) * n;
        let streams = |s: &Sample| s.streams_started.values().sum::<f64>();
        Rates {
            keep_alives: (to.keep_alives - from.keep_alives) / secs,
            writes: (to.proposals - from.proposals) / secs,
            requests: to.all_unary_since(from) / secs,
            txns: to.unary_since(from, "Txn") / secs,
            ranges: to.unary_since(from, "Range") / secs,
            streams: (streams(to) - streams(from)) / secs,
        }
    }
}

/// One line per window: what the members see per agent (the operator's share taken off),
/// and what the agents asked of the proxy, if any.
#[allow(clippy::too_many_arguments)]
fn report(
    run: &str,
    agents: usize,
    window: &str,
    before_agents: &Sample,
    from: &Sample,
    to: &Sample,
    operator: &Rates,
    proxy: Option<(&Sample, &Sample)>,
) {
    let n = agents as f64;
    let all = Rates::between(from, to, 1.0);
    let per = |total: f64, base: f64| (total - base) / n;
    println!(
        "{run} {window} (members see, per agent): connections {:.3}, watches {:.2}, watch streams {:.2}, open streams {:.2}, keep-alives/s {:.4}, new streams/s {:.4}, writes/s {:.4}, requests/s {:.4} (txn {:.4}, range {:.4}); cluster-wide: {:.0} connections, {:.0} watches, {:.1} keep-alives/s, {:.1} writes/s, {:.1} requests/s",
        (to.ours - before_agents.ours) / n,
        (to.watchers - before_agents.watchers) / n,
        (to.watch_streams - before_agents.watch_streams) / n,
        (to.open() - before_agents.open()) / n,
        per(all.keep_alives, operator.keep_alives),
        per(all.streams, operator.streams),
        per(all.writes, operator.writes),
        per(all.requests, operator.requests),
        per(all.txns, operator.txns),
        per(all.ranges, operator.ranges),
        to.connections,
        to.watchers,
        all.keep_alives,
        all.writes,
        all.requests,
    );
    println!(
        "{run} {window}: the members' CPU {:.1} % of a core, resident memory {:.0} MiB (summed over the three)",
        (to.cpu_seconds - from.cpu_seconds) / to.secs_since(from) * 100.0,
        to.rss_bytes / (1 << 20) as f64,
    );
    if let Some((_, to)) = proxy {
        println!(
            "{run} {window}: the agents' connections to the proxy: {:.3} per agent ({:.0} in all)",
            to.ours / n,
            to.connections,
        );
    }
}
