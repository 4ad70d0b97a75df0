//! The agent's durable throughput and latency over its unix socket, and corral-ipam's ADD in
//! agent mode (`make bench-agent`).
//!
//! * The agent is the real `corral agent` process, on a fresh state directory in `/tmp`
//!   (the same ext4 as the CNI bench), with one pool of a /16 (as the embedded default); with no cooldown, released addresses are
//!   free again, so it never runs out.
//! * Allocate + release: N client threads, each with one keep-alive connection (the lean
//!   `corral-client`), each looping allocate-next then release-by-address for a fixed time.
//!   Every answer arrives only after its change is durable (group commit). Reported: durable
//!   allocations per second (allocate answers over the run), and p50 / p99 of each call.
//!   N = 1, 8 and 64. Then 8 and 64 connections again, driven by one event-loop thread (hyper's
//!   client on a current-thread runtime, as wrk drives a server), so that the load generator
//!   does not need 64 threads of the same two vCPUs.
//! * fsync floor: `fdatasync` after rewriting 4 KiB in place in a file on the same
//!   filesystem, as the agent's log is rewritten in place, p50 of 400.
//! * corral-ipam ADD in agent mode: the plugin build from `make plugin` (or this profile's
//!   `corral-ipam` if `CORRAL_IPAM_BIN` is unset) exec'd as a runtime does, with
//!   `"agent": "<socket>"`, timed from spawn to exit; and `/bin/true` spawned the same way.
//!
//! `cargo bench` passes `--bench` for the full run (about 50 s); without it (as under
//! `cargo test --benches`) every phase is short, as a smoke run. `CORRAL_AB=<corral>,<corral>`
//! compares two builds of the agent instead, alternating them round by round (machine noise
//! here is larger than most single changes); `CORRAL_BENCH_ONLY=evented-64` runs only the
//! 64-connection load, for 8 s, to profile it. `CORRAL_HISTORY_AB=<rounds>` measures what the
//! allocation history costs (`history.rs`: history on against `--history-max-events 0`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_api::{AllocateRequest, AllocateResponse, NODE_SCOPE, ReleaseRequest};
use corral_client::Client;

#[allow(dead_code)] // the bench uses part of the tests\' harness
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "agent/history.rs"]
mod history;

use common::{Agent, BINARY as CORRAL, ms, pct};

struct Params {
    run_for: Duration,
    clients: &'static [usize],
    add_samples: usize,
}

const BENCH: Params = Params {
    run_for: Duration::from_secs(5),
    clients: &[1, 8, 64],
    add_samples: 400,
};

const SMOKE: Params = Params {
    run_for: Duration::from_millis(300),
    clients: &[1, 8],
    add_samples: 10,
};

/// Targets from the issue.
const TARGET_ALLOCS_64: f64 = 50_000.0;
const TARGET_SINGLE_OVER_FSYNC: Duration = Duration::from_micros(150);
const TARGET_ADD: Duration = Duration::from_millis(1);

fn start_agent(dir: &Path) -> (Agent, PathBuf) {
    start_agent_binary(Path::new(CORRAL), dir)
}

fn start_agent_binary(binary: &Path, dir: &Path) -> (Agent, PathBuf) {
    let socket = dir.join("agent.sock");
    let config = common::agent_config_file(dir, "10.64.0.0/16", 0);
    let agent = Agent::start_binary(binary, &["--config".as_ref(), config.as_os_str()], &socket);
    (agent, socket)
}

/// Client `c`'s `i`-th allocation: the next address of the pool, with its own owner.
fn allocate_request(c: usize, i: u64) -> AllocateRequest {
    AllocateRequest {
        scope: NODE_SCOPE.into(),
        pool: "default".into(),
        family: None,
        address: None,
        owner: format!("bench-{c}-{i}"),
        key: None,
        lease_ms: None,
    }
}

/// The release of what `answer` allocated, by address and generation.
fn release_request(answer: &AllocateResponse) -> ReleaseRequest {
    ReleaseRequest {
        scope: NODE_SCOPE.into(),
        address: Some(answer.allocations[0].address),
        generation: Some(answer.allocations[0].generation),
        ..ReleaseRequest::default()
    }
}

/// (allocations per second, sorted allocate latencies, sorted release latencies) from each
/// client's latencies over a run that began at `start`.
fn summary(
    start: Instant,
    clients: impl IntoIterator<Item = (Vec<Duration>, Vec<Duration>)>,
) -> (f64, Vec<Duration>, Vec<Duration>) {
    let mut allocs = Vec::new();
    let mut releases = Vec::new();
    for (a, r) in clients {
        allocs.extend(a);
        releases.extend(r);
    }
    let elapsed = start.elapsed().as_secs_f64();
    allocs.sort();
    releases.sort();
    (allocs.len() as f64 / elapsed, allocs, releases)
}

/// (allocations per second, allocate latencies, release latencies)
fn allocate_release(
    socket: &Path,
    clients: usize,
    run_for: Duration,
) -> (f64, Vec<Duration>, Vec<Duration>) {
    let start = Instant::now();
    let stop = start + run_for;
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut client = Client::unix(&socket);
                let mut allocs = Vec::new();
                let mut releases = Vec::new();
                let mut i = 0u64;
                while Instant::now() < stop {
                    i += 1;
                    let t = Instant::now();
                    let answer = client.allocate(&allocate_request(c, i)).expect("allocate");
                    allocs.push(t.elapsed());
                    let t = Instant::now();
                    client.release(&release_request(&answer)).expect("release");
                    releases.push(t.elapsed());
                }
                (allocs, releases)
            })
        })
        .collect();
    summary(
        start,
        threads
            .into_iter()
            .map(|t| t.join().expect("client thread")),
    )
}

/// As [`allocate_release`], but the `clients` connections are driven by one thread with an
/// event loop (hyper's HTTP/1.1 client on a current-thread tokio runtime), the way load
/// generators such as wrk drive a server: one thread woken when any answer is ready, instead
/// of 64 threads each woken for its own (it still takes about a quarter of the two vCPUs).
fn allocate_release_evented(
    socket: &Path,
    clients: usize,
    run_for: Duration,
) -> (f64, Vec<Duration>, Vec<Duration>) {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;

    async fn call(
        sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        path: &str,
        body: Vec<u8>,
    ) -> Bytes {
        sender.ready().await.expect("connection ready");
        let request = hyper::Request::post(path)
            .header("host", "corral")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = sender.send_request(request).await.expect("request");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert!(status.is_success(), "{status}: {body:?}");
        body
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = Instant::now();
        let stop = start + run_for;
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let socket = socket.to_path_buf();
                tokio::spawn(async move {
                    let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
                    let (mut sender, connection) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                            .await
                            .unwrap();
                    tokio::spawn(connection);
                    let mut allocs = Vec::new();
                    let mut releases = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < stop {
                        i += 1;
                        let request = serde_json::to_vec(&allocate_request(c, i)).unwrap();
                        let t = Instant::now();
                        let body = call(&mut sender, "/v1/allocate", request).await;
                        allocs.push(t.elapsed());
                        let answer: AllocateResponse = serde_json::from_slice(&body).unwrap();
                        let request = serde_json::to_vec(&release_request(&answer)).unwrap();
                        let t = Instant::now();
                        call(&mut sender, "/v1/release", request).await;
                        releases.push(t.elapsed());
                    }
                    (allocs, releases)
                })
            })
            .collect();
        let mut clients = Vec::new();
        for task in tasks {
            clients.push(task.await.expect("client task"));
        }
        summary(start, clients)
    })
}

/// p50 of rewriting 4 KiB in place and fdatasync, in `dir`.
fn fsync_floor(dir: &Path, samples: usize) -> Duration {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(&path)
        .unwrap();
    let page = vec![7u8; 4096];
    file.write_all(&page).unwrap();
    file.sync_all().unwrap();
    let mut times: Vec<Duration> = (0..samples)
        .map(|_| {
            use std::os::unix::fs::FileExt;
            let t = Instant::now();
            file.write_all_at(&page, 0).unwrap();
            file.sync_data().unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    pct(&times, 50.0)
}

fn spawn_timed(program: &Path, env: &[(&str, String)], stdin: &[u8]) -> (Duration, String) {
    let t = Instant::now();
    let mut child = Command::new(program)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // `/bin/true` exits without reading: a broken pipe is expected there.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let output = child.wait_with_output().unwrap();
    let elapsed = t.elapsed();
    assert!(
        output.status.success(),
        "{} failed: {}",
        program.display(),
        String::from_utf8_lossy(&output.stdout)
    );
    (
        elapsed,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

fn plugin_adds(socket: &Path, samples: usize) -> (Vec<Duration>, Vec<Duration>) {
    let plugin = std::env::var_os("CORRAL_IPAM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // The corral-ipam of this profile, next to the corral binary.
            Path::new(CORRAL).with_file_name("corral-ipam")
        });
    assert!(
        plugin.exists(),
        "{} is missing: run `make plugin` (or build corral-ipam)",
        plugin.display()
    );
    let stdin = serde_json::to_vec(&serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "benchnet",
        "type": "bridge",
        "ipam": {
            "type": "corral-ipam",
            "agent": socket,
            "ranges": [[{"subnet": "10.200.0.0/16"}]]
        }
    }))
    .unwrap();
    let mut adds = Vec::new();
    let mut floor = Vec::new();
    for i in 0..samples + 5 {
        let env = [
            ("CNI_COMMAND", "ADD".to_owned()),
            ("CNI_CONTAINERID", format!("bench{i:060}")),
            ("CNI_NETNS", "/var/run/netns/bench".to_owned()),
            ("CNI_IFNAME", "eth0".to_owned()),
            ("CNI_PATH", "/usr/lib/cni".to_owned()),
        ];
        let (t_true, _) = spawn_timed(Path::new("/bin/true"), &env, &stdin);
        let (t_add, out) = spawn_timed(&plugin, &env, &stdin);
        assert!(out.contains("10.200."), "{out}");
        if i >= 5 {
            adds.push(t_add);
            floor.push(t_true);
        }
    }
    adds.sort();
    floor.sort();
    (adds, floor)
}

/// `CORRAL_AB=<corral A>,<corral B>`: two builds of the agent, alternately, 6 rounds of 2 s
/// with 1 client and with 64 (evented); prints each round's figures.
fn ab(builds: &str) {
    let builds: Vec<PathBuf> = builds.split(',').map(PathBuf::from).collect();
    for round in 0..6 {
        for (i, binary) in builds.iter().enumerate() {
            let dir = tempfile::Builder::new()
                .prefix("corral-ab")
                .tempdir_in("/tmp")
                .unwrap();
            let (agent, socket) = start_agent_binary(binary, dir.path());
            let (_, single, _) = allocate_release(&socket, 1, Duration::from_secs(2));
            let (rate, _, _) = allocate_release_evented(&socket, 64, Duration::from_secs(2));
            let (brate, _, _) = allocate_release(&socket, 64, Duration::from_secs(2));
            drop(agent);
            println!(
                "round {round} build {i}: 1 client p50 {} ms; 64 evented {rate:.0}/s; 64 blocking {brate:.0}/s",
                ms(pct(&single, 50.0))
            );
        }
    }
}

fn main() {
    if let Ok(builds) = std::env::var("CORRAL_AB") {
        return ab(&builds);
    }
    // Before the comparison's own variable, which its children inherit.
    if let Ok(spec) = std::env::var("CORRAL_HISTORY_BATCH_CHILD") {
        return history::batch_child(&spec);
    }
    if let Ok(rounds) = std::env::var("CORRAL_HISTORY_AB") {
        return history::run(rounds.parse().expect("CORRAL_HISTORY_AB=<rounds>"));
    }
    let params = if std::env::args().any(|a| a == "--bench") {
        BENCH
    } else {
        SMOKE
    };
    let dir = tempfile::Builder::new()
        .prefix("corral-bench-agent")
        .tempdir_in("/tmp")
        .unwrap();
    let fsync = fsync_floor(dir.path(), if params.add_samples > 100 { 400 } else { 20 });
    let (agent, socket) = start_agent(dir.path());
    let mut rows = Vec::new();
    let mut single_p50 = Duration::ZERO;
    let mut at_64 = None;
    // `CORRAL_BENCH_ONLY=evented-64`: only that run, 8 s (for `perf record`).
    if std::env::var("CORRAL_BENCH_ONLY").as_deref() == Ok("evented-64") {
        let (rate, allocs, _) = allocate_release_evented(&socket, 64, Duration::from_secs(8));
        println!(
            "64 connections, evented: {rate:.0}/s, p50 {}",
            ms(pct(&allocs, 50.0))
        );
        return;
    }
    let runs = params.clients.iter().map(|&c| (c, false)).chain(
        params
            .clients
            .iter()
            .filter(|&&c| c > 1)
            .map(|&c| (c, true)),
    );
    for (clients, evented) in runs {
        let (rate, allocs, releases) = if evented {
            allocate_release_evented(&socket, clients, params.run_for)
        } else {
            allocate_release(&socket, clients, params.run_for)
        };
        let how = match (evented, clients) {
            (true, _) => "connections, one event loop",
            (false, 1) => "blocking client",
            (false, _) => "blocking clients",
        };
        eprintln!("agent bench: {clients} {how}: {rate:.0} durable allocations/s");
        if clients == 1 {
            single_p50 = pct(&allocs, 50.0);
        }
        if clients == 64 {
            at_64 = Some(at_64.map_or(rate, |r: f64| r.max(rate)));
        }
        rows.push(format!(
            "| {clients} {how} | {rate:.0} | {} / {} | {} / {} | {} |",
            ms(pct(&allocs, 50.0)),
            ms(pct(&allocs, 99.0)),
            ms(pct(&releases, 50.0)),
            ms(pct(&releases, 99.0)),
            allocs.len(),
        ));
    }
    let (adds, floor) = plugin_adds(&socket, params.add_samples);
    drop(agent);

    println!(
        "| load | durable allocations/s | allocate p50 / p99 (ms) | release p50 / p99 (ms) | allocations |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for row in rows {
        println!("{row}");
    }
    println!();
    println!("| | p50 (ms) | p99 (ms) | samples |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| corral-ipam ADD in agent mode (exec to exit) | {} | {} | {} |",
        ms(pct(&adds, 50.0)),
        ms(pct(&adds, 99.0)),
        adds.len()
    );
    println!(
        "| spawn `/bin/true` the same way | {} | {} | {} |",
        ms(pct(&floor, 50.0)),
        ms(pct(&floor, 99.0)),
        floor.len()
    );
    println!(
        "| fdatasync of 4 KiB rewritten in place | {} | | |",
        ms(fsync)
    );
    println!();
    let verdict = |met: bool| if met { "**met**" } else { "**missed**" };
    println!("| target | result |");
    println!("| --- | --- |");
    if let Some(rate) = at_64 {
        println!(
            "| ≥ 50,000 durable allocations/s at 64 clients | {}: {rate:.0}/s (the better of the two loads) |",
            verdict(rate >= TARGET_ALLOCS_64)
        );
    }
    println!(
        "| single-client allocate p50 ≤ one fsync + 0.15 ms | {}: {} ms (fsync {} ms) |",
        verdict(single_p50 <= fsync + TARGET_SINGLE_OVER_FSYNC),
        ms(single_p50),
        ms(fsync)
    );
    println!(
        "| corral-ipam ADD via the agent p50 ≤ 1.0 ms | {}: {} ms |",
        verdict(pct(&adds, 50.0) <= TARGET_ADD),
        ms(pct(&adds, 50.0))
    );
}
