//! corral-ipam against Debian's host-local, side by side in one run with the same configuration.
//!
//! Every figure comes from the real plugin executables, spawned exactly as a container runtime
//! spawns them (`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_PATH`; the
//! network configuration on stdin; stdout and stderr captured) and timed from just before the
//! spawn to just after exit. Both plugins get the same configuration (cniVersion 1.0.0, network
//! `benchnet`, one range set `{"subnet": "10.77.0.0/16"}`) but for `ipam.type` and their own
//! `ipam.dataDir`, in a fresh temporary directory.
//!
//! * Floor: spawning `/bin/true` the same way (stdin piped, the same environment), and each
//!   plugin's `VERSION` (its process start, no state read).
//! * Sequential ADD then DEL (of the attachments just added) on an empty /16 — calls of
//!   `/bin/true`, corral-ipam and host-local interleaved, so all three see the same machine —
//!   and on a /16 held at 95% (62,258 of 65,534 addresses), filled without the plugins (see
//!   `support/prefill.rs`). host-local takes ~0.6 s per call there, so it gets fewer samples.
//!   The targets are judged on the interleaved calls; ADDs on another empty /16 with each
//!   plugin's calls back to back show what the other programs' cache footprint costs.
//! * Cooldown queue: a /16 with every address held (filled in-process as for 95%), then the
//!   same seeded 5% (3,277 addresses) released through corral-ipam itself (DEL, back to back),
//!   so each released address cools for the default 30 s. While they cool, ADDs on it (each
//!   gets the oldest cooling address: nothing else is free) alternate call by call with ADDs
//!   on an empty /16; the CPU time of each (user + system, from the bench's reaped children
//!   in `/proc/self/stat`) is summed per series. host-local, which has no cooldown, gets the
//!   same 95% written in its format. At the end of the run, once every cooldown has ended,
//!   the same alternating ADDs again.
//! * Throughput: N callers (threads), each spawning ADDs back to back with distinct container
//!   IDs for a fixed time, on a fresh /16; ADDs completed over the time until the last returns.
//!   The same callers spawning `/bin/true` give the machine's ceiling.
//! * Peak RSS of one ADD, from GNU time's `%M`; fsync-family calls of one ADD, from strace
//!   (durability: a plugin that never syncs can lose an acknowledged address in a crash).
//!
//! `cargo bench` passes `--bench`, which runs the full sample counts (about 1.5 minutes);
//! without it (as under `cargo test --benches`) every count is small, as a smoke run.
//! The binary measured is the one `CORRAL_IPAM_BIN` names (`make bench-cni` passes the
//! installed build, `target/install/corral-ipam` from `make plugin`), else the `corral-ipam` of
//! the same profile as this bench (`cargo bench`: the optimised one in `target/release`).
//! With `CORRAL_BENCH_KEEP=1` in the environment the state directories are kept (their path is
//! printed) for profiling; with `CORRAL_BENCH_ONLY=cooling` only the cooldown case runs. With `CORRAL_AB=<corral-ipam A>,<corral-ipam B>` it only compares
//! two builds of corral-ipam, their ADDs alternating (see `ab`).

mod support;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::{
    ALLOCATABLE, FILLED, HOSTS, Latency, NETWORK, Plugin, SUBNET, added_address, call,
    container_id, invoke, ms, peak_rss_kib, prefill, syncs,
};

/// The two plugins, in column order.
const CORRAL: usize = 0;
const HOST_LOCAL: usize = 1;

// Container ID streams, so no phase reuses another's IDs.
const WARM_STREAM: u64 = 2;
const EMPTY_STREAM: u64 = 3;
const FULL_STREAM: u64 = 4;
const THROUGHPUT_STREAM: u64 = 5;
const RSS_STREAM: u64 = 6;
const BLOCKS_STREAM: u64 = 7;
const COOLING_STREAM: u64 = 8;

struct Params {
    /// Sequential samples per verb on the empty /16 (each plugin, and `/bin/true`).
    empty: usize,
    /// Sequential samples per verb at 95% for corral-ipam and host-local.
    full: [usize; 2],
    /// How long each throughput run lasts.
    throughput_for: Duration,
    callers: &'static [usize],
    /// Runs under GNU time per plugin and scenario (the largest peak is reported).
    rss_runs: [usize; 2],
    /// Addresses released through corral-ipam in the cooldown case (of the seeded 5%).
    cooling_releases: usize,
    /// ADDs in each half of the cooldown case (while cooling, and after), per series.
    cooling_adds: usize,
}

const BENCH: Params = Params {
    empty: 400,
    full: [400, 20],
    throughput_for: Duration::from_secs(3),
    callers: &[2, 8, 32],
    rss_runs: [5, 3],
    cooling_releases: ALLOCATABLE - FILLED,
    cooling_adds: 400,
};

const SMOKE: Params = Params {
    empty: 10,
    full: [10, 2],
    throughput_for: Duration::from_millis(300),
    callers: &[2],
    rss_runs: [1, 1],
    cooling_releases: 20,
    cooling_adds: 10,
};

/// Targets for corral-ipam, from the issue.
const TARGET_ADD_EMPTY: Duration = Duration::from_micros(1_500);
const TARGET_SPEEDUP_EMPTY: f64 = 3.0;
const TARGET_ADD_FULL: Duration = Duration::from_millis(2);
const TARGET_ADDS_PER_S_8: f64 = 1_000.0;

#[derive(Default)]
struct Figures {
    floor: Option<Latency>,
    floor_rss: u64,
    /// `VERSION`: starting the plugin process, no state touched.
    version: [Option<Latency>; 2],
    add_empty: [Option<Latency>; 2],
    /// ADD on another empty /16, each plugin's calls back to back (warm caches).
    add_empty_blocks: [Option<Latency>; 2],
    /// ADD on the empty /16: the first and the last quarter of the calls.
    add_empty_quarters: [(Option<Latency>, Option<Latency>); 2],
    del_empty: [Option<Latency>; 2],
    add_full: [Option<Latency>; 2],
    del_full: [Option<Latency>; 2],
    /// (callers, ADDs/s per plugin, ADDs done per plugin, `/bin/true` spawns/s).
    throughput: Vec<(usize, [f64; 2], [usize; 2], f64)>,
    rss_empty: [u64; 2],
    rss_full: [u64; 2],
    /// Calls that force data to disk during one ADD on the empty /16.
    syncs: [Option<usize>; 2],
    cooling: Cooling,
}

/// The cooldown case (see the module documentation).
#[derive(Default)]
struct Cooling {
    /// Addresses released through corral-ipam, and how long their DELs took in all.
    released: usize,
    releasing_took: Duration,
    /// corral-ipam's DELs that released them: all, then the first and the last quarter.
    dels: Option<Latency>,
    dels_quarters: (Option<Latency>, Option<Latency>),
    /// While cooling: ADDs on the cooling /16 (corral-ipam), on an empty /16 (corral-ipam,
    /// alternating with the former), and host-local on its 95% /16.
    during: [Option<Latency>; 3],
    /// Mean CPU time (user + system) per ADD of the first two series.
    during_cpu: [Option<Duration>; 2],
    /// Whether the last ADD while cooling came within 30 s of the first release.
    during_in_window: bool,
    /// Once every cooldown has ended: the same two corral-ipam series, and the first and last
    /// quarter of the first.
    after: [Option<Latency>; 2],
    after_cpu: [Option<Duration>; 2],
    after_quarters: (Option<Latency>, Option<Latency>),
}

fn progress(text: &str) {
    eprintln!("cni bench: {text}");
}

/// `CORRAL_AB=<corral-ipam A>,<corral-ipam B>`: the two builds' ADDs on an empty /16 (one
/// fresh directory each), alternating call by call for 400 rounds, each ADD right after
/// host-local's `VERSION` (a Go program, as the bridge plugin that runs an IPAM plugin is), and
/// the same again with nothing in between. Machine noise here is larger than most single
/// changes, so one `make bench-cni` of each build is not a comparison.
fn ab(builds: &str) {
    let paths: Vec<PathBuf> = builds.split(',').map(PathBuf::from).collect();
    assert_eq!(
        paths.len(),
        2,
        "CORRAL_AB wants two paths separated by a comma"
    );
    let host_local = Path::new("/usr/lib/cni/host-local");
    let root = tempfile::tempdir().expect("temporary directory");
    for after_go in [true, false] {
        let plugins: Vec<Plugin> = paths
            .iter()
            .map(|path| Plugin {
                label: "corral-ipam",
                path: path.clone(),
                ipam_type: "corral-ipam",
            })
            .collect();
        let stdins: Vec<Vec<u8>> = (0..2)
            .map(|b| plugins[b].config(&root.path().join(format!("ab-{after_go}-{b}"))))
            .collect();
        let mut adds = [Vec::new(), Vec::new()];
        for i in 0..400u64 {
            for (b, plugin) in plugins.iter().enumerate() {
                if after_go {
                    invoke(host_local, &[], "VERSION", "", b"");
                }
                let container = container_id(EMPTY_STREAM, i);
                adds[b].push(call(plugin, "ADD", &container, &stdins[b]).0);
            }
        }
        for (b, path) in paths.iter().enumerate() {
            let l = Latency::of(&adds[b]);
            let quarter = Latency::of(&adds[b][300..]);
            println!(
                "{} ADD {}: p50 {} ms, p99 {} ms, p50 of calls 301-400 {} ms",
                if after_go {
                    "after host-local VERSION"
                } else {
                    "back to back"
                },
                path.display(),
                ms(l.p50),
                ms(l.p99),
                ms(quarter.p50)
            );
        }
    }
}

fn main() {
    if let Ok(builds) = std::env::var("CORRAL_AB") {
        return ab(&builds);
    }
    let params = if std::env::args().any(|a| a == "--bench") {
        BENCH
    } else {
        SMOKE
    };
    let plugins = [
        Plugin {
            label: "corral-ipam",
            // `make bench-cni` passes the statically linked build users install (see
            // `make plugin`); a plain `cargo bench` measures the default build.
            path: std::env::var_os("CORRAL_IPAM_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral-ipam"))),
            ipam_type: "corral-ipam",
        },
        Plugin {
            label: "host-local",
            path: PathBuf::from("/usr/lib/cni/host-local"),
            ipam_type: "host-local",
        },
    ];
    assert!(
        plugins[HOST_LOCAL].path.exists(),
        "{} is missing: run `make deps` (Debian package containernetworking-plugins)",
        plugins[HOST_LOCAL].path.display()
    );
    assert!(
        Path::new("/usr/bin/time").exists(),
        "/usr/bin/time is missing: run `make deps` (Debian package time)"
    );
    let root = tempfile::tempdir().expect("temporary directory");
    print_setup(&plugins, root.path());
    if std::env::var_os("CORRAL_BENCH_KEEP").is_some() {
        progress(&format!(
            "CORRAL_BENCH_KEEP is set: {} is kept for profiling",
            root.path().display()
        ));
    }

    let mut figures = Figures::default();
    warm_up(&plugins, root.path());
    // `CORRAL_BENCH_ONLY=cooling`: the cooldown phases alone.
    let only_cooling = std::env::var("CORRAL_BENCH_ONLY").is_ok_and(|only| only == "cooling");
    if !only_cooling {
        sequential_empty(&plugins, &params, root.path(), &mut figures);
        sequential_blocks(&plugins, &params, root.path(), &mut figures);
        sequential_full(&plugins, &params, root.path(), &mut figures);
    }
    let cooled_at = cooling_during(&plugins, &params, root.path(), &mut figures.cooling);
    if !only_cooling {
        throughput_and_footprint(&plugins, &params, root.path(), &mut figures);
    }
    if std::env::args().any(|a| a == "--bench") {
        // The smoke run does not wait the 30 s.
        cooling_after(
            &plugins,
            &params,
            root.path(),
            cooled_at,
            &mut figures.cooling,
        );
    }
    if !only_cooling {
        print_table(&plugins, &params, &figures);
    }
    print_cooling(&params, &figures.cooling);
    if std::env::var_os("CORRAL_BENCH_KEEP").is_some() {
        let _ = root.keep();
    }
}

/// The throughput rows (and the spawn ceiling), peak RSS and the syncs of one ADD.
fn throughput_and_footprint(
    plugins: &[Plugin; 2],
    params: &Params,
    root: &Path,
    figures: &mut Figures,
) {
    for &callers in params.callers {
        let mut rates = [0.0; 2];
        let mut done = [0; 2];
        for (p, plugin) in plugins.iter().enumerate() {
            let dir = root.join(format!("tp{callers}-{}", plugin.label));
            (rates[p], done[p]) = throughput(plugin, callers, params.throughput_for, &dir);
            progress(&format!(
                "{}: {callers} callers, {} ADDs in {:?}: {:.0} ADDs/s",
                plugin.label, done[p], params.throughput_for, rates[p]
            ));
        }
        // The ceiling the machine allows: the same callers spawning `/bin/true`.
        let floor = Plugin {
            label: "/bin/true",
            path: PathBuf::from("/bin/true"),
            ipam_type: "none",
        };
        let dir = root.join(format!("tp{callers}-true"));
        let (spawns, _) = throughput(&floor, callers, params.throughput_for, &dir);
        progress(&format!(
            "/bin/true: {callers} callers: {spawns:.0} spawns/s"
        ));
        figures.throughput.push((callers, rates, done, spawns));
    }
    peak_rss(plugins, params, root, figures);
    for (p, plugin) in plugins.iter().enumerate() {
        let dir = root.join(format!("empty-{}", plugin.label));
        figures.syncs[p] = syncs(
            &plugin.path,
            "ADD",
            &container_id(RSS_STREAM, 1 << 20),
            &plugin.config(&dir),
            root,
        );
    }
}

fn print_setup(plugins: &[Plugin; 2], root: &Path) {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let host_local_version = {
        let (_, out) = invoke(&plugins[HOST_LOCAL].path, &[], "VERSION", "", b"");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("")
            .to_owned()
    };
    println!("# corral-ipam vs host-local (CNI IPAM plugins)");
    println!();
    println!(
        "- corral-ipam: {} ({} build)",
        plugins[CORRAL].path.display(),
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "optimised"
        }
    );
    println!(
        "- host-local: {} (`VERSION`: {host_local_version})",
        plugins[HOST_LOCAL].path.display()
    );
    println!(
        "- config: cniVersion 1.0.0, network `{NETWORK}`, ipam.ranges [[{{\"subnet\": \"{SUBNET}\"}}]], \
         only ipam.type and ipam.dataDir differ"
    );
    println!(
        "- state directories under {} ; kernel {} ; {} CPUs",
        root.display(),
        read("/proc/sys/kernel/osrelease"),
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!();
}

/// A few calls of each program before anything is timed, so binaries and libraries are in
/// the page cache.
fn warm_up(plugins: &[Plugin; 2], root: &Path) {
    for plugin in plugins {
        let stdin = plugin.config(&root.join(format!("warm-{}", plugin.label)));
        for i in 0..5 {
            let container = container_id(WARM_STREAM, i);
            call(plugin, "ADD", &container, &stdin);
            call(plugin, "DEL", &container, &stdin);
            invoke(Path::new("/bin/true"), &[], "ADD", &container, &stdin);
        }
    }
}

/// ADD then DEL on an empty /16, the three programs interleaved call by call.
fn sequential_empty(plugins: &[Plugin; 2], params: &Params, root: &Path, figures: &mut Figures) {
    progress(&format!(
        "empty /16: {} ADDs then {} DELs each, interleaved with /bin/true",
        params.empty, params.empty
    ));
    let stdins: Vec<Vec<u8>> = plugins
        .iter()
        .map(|p| p.config(&root.join(format!("empty-{}", p.label))))
        .collect();
    let mut floor = Vec::with_capacity(params.empty);
    let mut versions = [Vec::new(), Vec::new()];
    let mut adds = [Vec::new(), Vec::new()];
    let mut dels = [Vec::new(), Vec::new()];
    let mut addresses = [HashSet::new(), HashSet::new()];
    for i in 0..params.empty {
        let container = container_id(EMPTY_STREAM, i as u64);
        let (elapsed, out) = invoke(
            Path::new("/bin/true"),
            &[],
            "ADD",
            &container,
            &stdins[CORRAL],
        );
        assert!(out.status.success());
        floor.push(elapsed);
        for (p, plugin) in plugins.iter().enumerate() {
            versions[p].push(call(plugin, "VERSION", "", b"").0);
            let (elapsed, stdout) = call(plugin, "ADD", &container, &stdins[p]);
            adds[p].push(elapsed);
            assert!(
                addresses[p].insert(added_address(&stdout)),
                "{} handed out an address twice",
                plugin.label
            );
        }
    }
    for i in 0..params.empty {
        let container = container_id(EMPTY_STREAM, i as u64);
        for (p, plugin) in plugins.iter().enumerate() {
            dels[p].push(call(plugin, "DEL", &container, &stdins[p]).0);
        }
    }
    figures.floor = Some(Latency::of(&floor));
    let quarter = (params.empty / 4).max(1);
    for p in [CORRAL, HOST_LOCAL] {
        figures.version[p] = Some(Latency::of(&versions[p]));
        figures.add_empty[p] = Some(Latency::of(&adds[p]));
        figures.add_empty_quarters[p] = (
            Some(Latency::of(&adds[p][..quarter])),
            Some(Latency::of(&adds[p][adds[p].len() - quarter..])),
        );
        figures.del_empty[p] = Some(Latency::of(&dels[p]));
    }
    report_wal(&root.join("empty-corral-ipam"), "after the empty /16 calls");
}

/// ADD on a fresh empty /16, each plugin's calls back to back, one plugin after the other:
/// what a plugin costs when nothing else ran in between. Interleaved (above), every call
/// starts with caches that the other programs filled — a Go program like host-local or the
/// bridge plugin that runs each IPAM plugin touches megabytes — which costs corral-ipam
/// 0.5–0.9 ms per call on this machine.
fn sequential_blocks(plugins: &[Plugin; 2], params: &Params, root: &Path, figures: &mut Figures) {
    let n = (params.empty / 2).max(1);
    progress(&format!(
        "empty /16: {n} ADDs back to back per plugin, one plugin after the other"
    ));
    for (p, plugin) in plugins.iter().enumerate() {
        let stdin = plugin.config(&root.join(format!("blocks-{}", plugin.label)));
        let adds: Vec<Duration> = (0..n)
            .map(|i| {
                let container = container_id(BLOCKS_STREAM, i as u64);
                call(plugin, "ADD", &container, &stdin).0
            })
            .collect();
        figures.add_empty_blocks[p] = Some(Latency::of(&adds));
    }
}

/// The sizes of corral-ipam's files: a log that grows with every call (as SQLite's WAL did
/// when no process ever reset it) shows here.
fn report_wal(dir: &Path, when: &str) {
    let mib = |name: &str| {
        std::fs::metadata(dir.join(name)).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64)
    };
    progress(&format!(
        "corral-ipam's files {when}: corral.db {:.1} MiB, -wal {:.1} MiB, -journal {:.2} MiB",
        mib("corral.db"),
        mib("corral.db-wal"),
        mib("corral.db-journal")
    ));
}

/// ADD then DEL on a /16 held at 95%, filled in each plugin's own format.
fn sequential_full(plugins: &[Plugin; 2], params: &Params, root: &Path, figures: &mut Figures) {
    let dirs: Vec<PathBuf> = plugins
        .iter()
        .map(|p| root.join(format!("full-{}", p.label)))
        .collect();
    let stdins: Vec<Vec<u8>> = plugins
        .iter()
        .zip(&dirs)
        .map(|(p, dir)| p.config(dir))
        .collect();
    let started = Instant::now();
    let fill = prefill::corral(&stdins[CORRAL], &dirs[CORRAL]);
    progress(&format!(
        "corral-ipam store filled in-process to {} addresses in {:.1?}",
        fill.held.len(),
        started.elapsed()
    ));
    let started = Instant::now();
    prefill::host_local(&dirs[HOST_LOCAL], &fill);
    progress(&format!(
        "host-local directory written ({} address files) in {:.1?}",
        fill.held.len(),
        started.elapsed()
    ));
    let held = fill.held_set();
    assert_eq!(held.len(), FILLED);

    // One ADD through each binary first: it must succeed with a free address, and corral-ipam
    // must have found its own configuration (no rebuild) and one more row.
    for (p, plugin) in plugins.iter().enumerate() {
        let (elapsed, stdout) = call(plugin, "ADD", "verify-fill", &stdins[p]);
        let addr = added_address(&stdout);
        assert!(
            !held.contains(&addr),
            "{} handed out held {addr}",
            plugin.label
        );
        progress(&format!(
            "95% full: first ADD through {} got {addr} in {} ms",
            plugin.label,
            ms(elapsed)
        ));
    }
    prefill::check_corral(&stdins[CORRAL], &dirs[CORRAL], FILLED + 1);

    for (p, plugin) in plugins.iter().enumerate() {
        let n = params.full[p];
        progress(&format!(
            "95% full /16: {n} ADDs then {n} DELs through {}",
            plugin.label
        ));
        let mut adds = Vec::with_capacity(n);
        let mut dels = Vec::with_capacity(n);
        let mut added: Vec<IpAddr> = Vec::with_capacity(n);
        for i in 0..n {
            let container = container_id(FULL_STREAM, i as u64);
            let (elapsed, stdout) = call(plugin, "ADD", &container, &stdins[p]);
            let addr = added_address(&stdout);
            assert!(
                !held.contains(&addr) && !added.contains(&addr),
                "{} handed out {addr} twice",
                plugin.label
            );
            adds.push(elapsed);
            added.push(addr);
        }
        for i in 0..n {
            let container = container_id(FULL_STREAM, i as u64);
            dels.push(call(plugin, "DEL", &container, &stdins[p]).0);
        }
        if p == HOST_LOCAL {
            // DEL released what it was asked to: the address files are gone.
            let dir = dirs[HOST_LOCAL].join(NETWORK);
            for addr in &added {
                assert!(!dir.join(addr.to_string()).exists(), "{addr} still held");
            }
        }
        figures.add_full[p] = Some(Latency::of(&adds));
        figures.del_full[p] = Some(Latency::of(&dels));
    }
    report_wal(&dirs[CORRAL], "after the 95% full calls");
    if params.full[CORRAL] > 0 {
        // The fill, the verification ADD; everything the bench added it deleted.
        prefill::check_corral(&stdins[CORRAL], &dirs[CORRAL], FILLED + 1);
    }
}

/// CPU time (user + system) of the bench's children that have been waited for, from
/// `/proc/self/stat` (clock ticks of 10 ms: Linux reports these fields in USER_HZ, always 100).
/// Summed over hundreds of calls, the rounding of each reading averages out.
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The fields after the command name (which may hold spaces) start with field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    let ticks = |field: usize| -> u64 { fields[field - 3].parse().expect("a tick count") };
    Duration::from_millis((ticks(16) + ticks(17)) * 10)
}

/// The ADDs of one cooldown phase: corral-ipam on the cooling /16 and on an empty /16,
/// alternating call by call; returns the latencies and the CPU time of each series, and the
/// addresses the first handed out.
fn alternating_adds(
    plugin: &Plugin,
    stdins: [&[u8]; 2],
    n: usize,
    first_container: u64,
) -> ([Vec<Duration>; 2], [Duration; 2], Vec<IpAddr>) {
    let mut latencies = [Vec::with_capacity(n), Vec::with_capacity(n)];
    let mut cpu = [Duration::ZERO; 2];
    let mut handed_out = Vec::with_capacity(n);
    for i in 0..n {
        let container = container_id(COOLING_STREAM, first_container + i as u64);
        for (series, stdin) in stdins.iter().enumerate() {
            let before = children_cpu();
            let (elapsed, stdout) = call(plugin, "ADD", &container, stdin);
            cpu[series] += children_cpu().saturating_sub(before);
            latencies[series].push(elapsed);
            if series == 0 {
                handed_out.push(added_address(&stdout));
            }
        }
    }
    (latencies, cpu, handed_out)
}

/// The cooldown case while the addresses cool (see the module documentation). Returns when
/// the last cooldown ends (30 s after the last release).
fn cooling_during(
    plugins: &[Plugin; 2],
    params: &Params,
    root: &Path,
    figures: &mut Cooling,
) -> Instant {
    let dir = root.join("cooling-corral-ipam");
    let stdin = plugins[CORRAL].config(&dir);
    let started = Instant::now();
    let (fill, to_release) = prefill::corral_all(&stdin, &dir);
    progress(&format!(
        "cooldown queue: corral-ipam store filled in-process to {} addresses in {:.1?}",
        fill.held.len(),
        started.elapsed()
    ));
    let to_release = &to_release[..params.cooling_releases.min(to_release.len())];
    progress(&format!(
        "cooldown queue: releasing {} addresses through corral-ipam (DEL)",
        to_release.len()
    ));
    let first_release = Instant::now();
    let dels: Vec<Duration> = to_release
        .iter()
        .map(|container| call(&plugins[CORRAL], "DEL", container, &stdin).0)
        .collect();
    let last_release = Instant::now();
    figures.released = to_release.len();
    figures.releasing_took = last_release - first_release;
    let quarter = (dels.len() / 4).max(1);
    figures.dels = Some(Latency::of(&dels));
    figures.dels_quarters = (
        Some(Latency::of(&dels[..quarter])),
        Some(Latency::of(&dels[dels.len() - quarter..])),
    );
    progress(&format!(
        "cooldown queue: {} DELs in {:.1?}",
        dels.len(),
        figures.releasing_took
    ));

    let reference = plugins[CORRAL].config(&root.join("cooling-empty-corral-ipam"));
    // Creating the reference's state directory is not part of the steady state.
    call(&plugins[CORRAL], "ADD", "cooling-init", &reference);
    let released: HashSet<IpAddr> = {
        let released: HashSet<&String> = to_release.iter().collect();
        fill.held
            .iter()
            .filter(|(_, owner)| released.contains(owner))
            .map(|(addr, _)| *addr)
            .collect()
    };
    let n = params.cooling_adds;
    let (latencies, cpu, handed_out) =
        alternating_adds(&plugins[CORRAL], [&stdin, &reference], n, 0);
    figures.during_in_window = first_release.elapsed() < Duration::from_secs(30);
    let mut seen = HashSet::new();
    for addr in &handed_out {
        // Nothing else is free: every ADD takes a cooling address, each once.
        assert!(
            released.contains(addr) && seen.insert(*addr),
            "corral-ipam handed out {addr}, which is not a released address or was handed out twice"
        );
    }
    for series in 0..2 {
        figures.during[series] = Some(Latency::of(&latencies[series]));
        figures.during_cpu[series] = Some(cpu[series] / n as u32);
    }

    // host-local keeps no cooldown: its directory holds the 95% that remain.
    let host_local_dir = root.join("cooling-host-local");
    let remaining = prefill::Fill {
        held: fill
            .held
            .iter()
            .filter(|(addr, _)| !released.contains(addr))
            .cloned()
            .collect(),
        last: fill.last,
    };
    prefill::host_local(&host_local_dir, &remaining);
    let host_local_stdin = plugins[HOST_LOCAL].config(&host_local_dir);
    let adds: Vec<Duration> = (0..params.full[HOST_LOCAL])
        .map(|i| {
            let container = container_id(COOLING_STREAM, (1 << 30) + i as u64);
            let (elapsed, stdout) =
                call(&plugins[HOST_LOCAL], "ADD", &container, &host_local_stdin);
            assert!(
                released.contains(&added_address(&stdout)),
                "host-local handed out a held address"
            );
            elapsed
        })
        .collect();
    figures.during[2] = Some(Latency::of(&adds));
    progress("cooldown queue: ADDs while cooling done");
    last_release + Duration::from_secs(30)
}

/// The cooldown case once every cooldown has ended: the same alternating ADDs again.
fn cooling_after(
    plugins: &[Plugin; 2],
    params: &Params,
    root: &Path,
    cooled_at: Instant,
    figures: &mut Cooling,
) {
    let wait = cooled_at.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    progress(&format!(
        "cooldown queue: waiting {wait:.1?} for the last cooldown to end"
    ));
    std::thread::sleep(wait);
    let stdin = plugins[CORRAL].config(&root.join("cooling-corral-ipam"));
    let reference = plugins[CORRAL].config(&root.join("cooling-empty-corral-ipam"));
    let n = params.cooling_adds;
    let (latencies, cpu, _) = alternating_adds(&plugins[CORRAL], [&stdin, &reference], n, 1 << 20);
    for series in 0..2 {
        figures.after[series] = Some(Latency::of(&latencies[series]));
        figures.after_cpu[series] = Some(cpu[series] / n as u32);
    }
    let quarter = (n / 4).max(1);
    figures.after_quarters = (
        Some(Latency::of(&latencies[0][..quarter])),
        Some(Latency::of(&latencies[0][n - quarter..])),
    );
}

/// The cooling table's rows of the ADDs on the empty /16 that alternate with the row above,
/// and of the CPU per ADD of both: `words` are the /16's article and what follows "CPU per ADD".
fn print_empty_and_cpu(
    params: &Params,
    words: (&str, &str),
    empty: Option<Latency>,
    cpu: [Option<Duration>; 2],
) {
    let (article, when) = words;
    let cpu = cpu.map(|d| d.map_or("—".into(), ms));
    println!(
        "| ADD on {article} /16, alternating with the row above: p50 / p99 (ms) | {} | | {} |",
        pair(empty),
        samples(empty)
    );
    println!(
        "| CPU per ADD{when}, user + system (ms): cooling / empty | {} / {} | | {} each |",
        cpu[0], cpu[1], params.cooling_adds
    );
}

fn print_cooling(params: &Params, c: &Cooling) {
    println!();
    println!(
        "Cooldown queue: every address of the /16 held, then {} released through corral-ipam (DEL, {:.1?} in all), each cooling for 30 s.",
        c.released, c.releasing_took
    );
    println!();
    println!("| | corral-ipam | host-local | samples (corral / host-local) |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| DEL of those {} addresses, one after the other: p50 / p99 (ms); first → last quarter p50 | {}; {} → {} | | {} |",
        c.released,
        pair(c.dels),
        c.dels_quarters.0.map_or("—".into(), |l| ms(l.p50)),
        c.dels_quarters.1.map_or("—".into(), |l| ms(l.p50)),
        samples(c.dels)
    );
    println!(
        "| ADD while they cool (corral-ipam: the oldest cooling address; host-local: 95% full, no cooldown): p50 / p99 (ms){} | {} | {} | {} / {} |",
        if c.during_in_window {
            ""
        } else {
            " (**some cooldowns had ended**)"
        },
        pair(c.during[0]),
        pair(c.during[2]),
        samples(c.during[0]),
        samples(c.during[2])
    );
    print_empty_and_cpu(params, ("an empty", ""), c.during[1], c.during_cpu);
    if c.after[0].is_some() {
        println!(
            "| ADD once every cooldown ended: p50 / p99 (ms); first → last quarter p50 | {}; {} → {} | | {} |",
            pair(c.after[0]),
            c.after_quarters.0.map_or("—".into(), |l| ms(l.p50)),
            c.after_quarters.1.map_or("—".into(), |l| ms(l.p50)),
            samples(c.after[0])
        );
        print_empty_and_cpu(
            params,
            ("the empty", " once ended"),
            c.after[1],
            c.after_cpu,
        );
    }
}

/// ADDs per second with `callers` threads each spawning ADDs back to back, on a fresh /16.
fn throughput(plugin: &Plugin, callers: usize, run_for: Duration, dir: &Path) -> (f64, usize) {
    let stdin = plugin.config(dir);
    // Creating the state directory (and corral's database) is not part of the steady state.
    call(plugin, "ADD", "throughput-init", &stdin);
    let done = AtomicUsize::new(0);
    let failure = Mutex::new(None::<String>);
    let started = Instant::now();
    let deadline = started + run_for;
    std::thread::scope(|scope| {
        for thread in 0..callers {
            let (stdin, done, failure) = (&stdin, &done, &failure);
            scope.spawn(move || {
                let mut i = 0_u64;
                while Instant::now() < deadline {
                    let container = container_id(
                        THROUGHPUT_STREAM,
                        ((callers as u64) << 32) | ((thread as u64) << 20) | i,
                    );
                    let (_, out) = invoke(&plugin.path, &[], "ADD", &container, stdin);
                    if out.status.success() {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let text = String::from_utf8_lossy(&out.stdout).into_owned();
                        failure.lock().expect("lock").get_or_insert(text);
                    }
                    i += 1;
                }
            });
        }
    });
    let elapsed = started.elapsed();
    if plugin.ipam_type == "corral-ipam" {
        report_wal(dir, &format!("after the {callers}-caller run"));
    }
    if let Some(text) = failure.into_inner().expect("lock") {
        panic!("{} ADD failed with {callers} callers: {text}", plugin.label);
    }
    let done = done.into_inner();
    (done as f64 / elapsed.as_secs_f64(), done)
}

fn peak_rss(plugins: &[Plugin; 2], params: &Params, root: &Path, figures: &mut Figures) {
    progress("peak RSS under /usr/bin/time");
    let scratch = root.join("rss");
    std::fs::create_dir_all(&scratch).expect("scratch directory");
    let true_stdin = plugins[CORRAL].config(&root.join("empty-corral-ipam"));
    figures.floor_rss = (0..3)
        .map(|_| peak_rss_kib(Path::new("/bin/true"), "ADD", "x", &true_stdin, &scratch))
        .max()
        .unwrap_or(0);
    let mut i = 0_u64;
    for (p, plugin) in plugins.iter().enumerate() {
        for (scenario, runs, out) in [
            ("empty", params.rss_runs[0], &mut figures.rss_empty[p]),
            ("full", params.rss_runs[1], &mut figures.rss_full[p]),
        ] {
            let stdin = plugin.config(&root.join(format!("{scenario}-{}", plugin.label)));
            for _ in 0..runs {
                let container = container_id(RSS_STREAM, i);
                i += 1;
                let kib = peak_rss_kib(&plugin.path, "ADD", &container, &stdin, &scratch);
                *out = (*out).max(kib);
            }
        }
    }
}

fn pair(latency: Option<Latency>) -> String {
    latency.map_or("—".into(), |l| format!("{} / {}", ms(l.p50), ms(l.p99)))
}

fn samples(latency: Option<Latency>) -> String {
    latency.map_or("—".into(), |l| l.n.to_string())
}

/// host-local's p50 over corral-ipam's: how many times faster corral-ipam is.
fn speedup(latencies: &[Option<Latency>; 2]) -> Option<f64> {
    match latencies {
        [Some(c), Some(h)] => Some(h.p50.as_secs_f64() / c.p50.as_secs_f64()),
        _ => None,
    }
}

fn times(x: Option<f64>) -> String {
    x.map_or("—".into(), |x| {
        if x >= 10.0 {
            format!("{x:.0}×")
        } else {
            format!("{x:.1}×")
        }
    })
}

fn verdict(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

fn print_table(plugins: &[Plugin; 2], params: &Params, f: &Figures) {
    let fill = format!(
        "{FILLED} of {HOSTS} ({:.1}%)",
        FILLED as f64 * 100.0 / HOSTS as f64
    );
    println!(
        "| | {} | {} | corral-ipam's advantage | samples (corral / host-local) |",
        plugins[CORRAL].label, plugins[HOST_LOCAL].label
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    let quarters = |p: usize| {
        let (first, last) = f.add_empty_quarters[p];
        format!(
            "{} → {}",
            first.map_or("—".into(), |l| ms(l.p50)),
            last.map_or("—".into(), |l| ms(l.p50))
        )
    };
    let quarter = (params.empty / 4).max(1);
    let latency_rows = [
        ("ADD, empty /16", &f.add_empty),
        ("DEL, empty /16", &f.del_empty),
        (
            "ADD, empty /16, each plugin's calls back to back",
            &f.add_empty_blocks,
        ),
        ("ADD, /16 95% full", &f.add_full),
        ("DEL, /16 95% full", &f.del_full),
    ];
    for (i, (label, l)) in latency_rows.into_iter().enumerate() {
        if i == 1 {
            println!(
                "| ADD, empty /16: p50 of calls 1–{quarter} → {}–{} (ms) | {} | {} | | {quarter} each |",
                params.empty - quarter + 1,
                params.empty,
                quarters(CORRAL),
                quarters(HOST_LOCAL),
            );
        }
        println!(
            "| {label}: p50 / p99 (ms) | {} | {} | {} | {} / {} |",
            pair(l[CORRAL]),
            pair(l[HOST_LOCAL]),
            times(speedup(l)),
            samples(l[CORRAL]),
            samples(l[HOST_LOCAL])
        );
    }
    for (callers, rates, done, spawns) in &f.throughput {
        println!(
            "| throughput, {callers} concurrent callers (ADDs/s; `/bin/true`: {spawns:.0}/s) | {:.0} | {:.0} | {} | {} / {} ADDs in {:?} |",
            rates[CORRAL],
            rates[HOST_LOCAL],
            times(Some(rates[CORRAL] / rates[HOST_LOCAL])),
            done[CORRAL],
            done[HOST_LOCAL],
            params.throughput_for
        );
    }
    for (label, rss, runs) in [
        ("empty /16", f.rss_empty, params.rss_runs[0]),
        ("/16 95% full", f.rss_full, params.rss_runs[1]),
    ] {
        println!(
            "| peak RSS of one ADD, {label} (KiB) | {} | {} | {} | max of {runs} / {runs} |",
            rss[CORRAL],
            rss[HOST_LOCAL],
            times(Some(rss[HOST_LOCAL] as f64 / rss[CORRAL] as f64)),
        );
    }
    let count = |n: Option<usize>| n.map_or("— (no strace)".into(), |n| n.to_string());
    println!(
        "| durability: fsync-family calls in one ADD, empty /16 | {} | {} | | 1 / 1 |",
        count(f.syncs[CORRAL]),
        count(f.syncs[HOST_LOCAL])
    );
    println!(
        "| `VERSION` (process start, no state): p50 / p99 (ms) | {} | {} | {} | {} / {} |",
        pair(f.version[CORRAL]),
        pair(f.version[HOST_LOCAL]),
        times(speedup(&f.version)),
        samples(f.version[CORRAL]),
        samples(f.version[HOST_LOCAL])
    );
    println!(
        "| floor: spawn `/bin/true` p50 / p99 (ms); peak RSS {} KiB | {} | (same) | | {} |",
        f.floor_rss,
        pair(f.floor),
        samples(f.floor)
    );
    println!();
    println!("95% full: {fill} addresses held, the 5% free scattered at random (seeded).");
    println!();

    println!("| target for corral-ipam | result |");
    println!("| --- | --- |");
    if let Some(c) = f.add_empty[CORRAL] {
        println!(
            "| ADD p50 ≤ 1.5 ms on the empty /16 | {}: {} ms |",
            verdict(c.p50 <= TARGET_ADD_EMPTY),
            ms(c.p50)
        );
    }
    if let Some(x) = speedup(&f.add_empty) {
        println!(
            "| ADD ≥ 3× faster than host-local on the empty /16 (p50) | {}: {x:.2}× |",
            verdict(x >= TARGET_SPEEDUP_EMPTY)
        );
    }
    if let Some(c) = f.add_full[CORRAL] {
        println!(
            "| ADD p50 ≤ 2 ms on the 95% full /16 | {}: {} ms (host-local {} ms) |",
            verdict(c.p50 <= TARGET_ADD_FULL),
            ms(c.p50),
            f.add_full[HOST_LOCAL].map_or("—".into(), |h| ms(h.p50))
        );
    }
    if let Some((_, rates, _, _)) = f.throughput.iter().find(|(n, _, _, _)| *n == 8) {
        println!(
            "| ≥ 1,000 ADDs/s with 8 concurrent callers | {}: {:.0} ADDs/s (host-local {:.0}) |",
            verdict(rates[CORRAL] >= TARGET_ADDS_PER_S_8),
            rates[CORRAL],
            rates[HOST_LOCAL]
        );
    }
}
