//! What the allocation history costs the agent, history on against `--history-max-events 0`
//! (which records nothing), in one run of the same build (`CORRAL_HISTORY_AB=<rounds>`):
//!
//! * Throughput, side by side: both agents run at once, each on its own state directory, and
//!   the 64-connection evented load alternates between them round by round (A, B, A, B, ...),
//!   3 s each, so the machine's drift hits both sides; the history side's log and history grow
//!   from round to round as a long-running agent's do. Reported per round and as medians:
//!   allocations/s, allocate p50 and p99, and the ratio.
//! * Fixed work, which a busy machine does not move: a fresh agent per side, 1,000 warm-up
//!   pairs, then a fixed number of allocate + release pairs with 1 client (one commit each)
//!   and with 64 blocking clients (group commits); from `/proc/<pid>/io` and `/proc/<pid>/stat`
//!   of the agent: bytes written and write calls per allocation, and CPU time per allocation.
//! * With `CORRAL_HISTORY_CALLGRIND=1` also: instructions per allocation, each side's agent
//!   under `valgrind --tool=callgrind` (user-space instructions of every thread), from two runs
//!   per side that differ only in the number of pairs (the difference over the difference, so
//!   start-up and shutdown cancel out); `CORRAL_HISTORY_CALLGRIND_KEEP=<dir>` keeps their
//!   callgrind files there (`callgrind.<on|off>.<clients>.<pairs>.out`, for
//!   `callgrind_annotate --inclusive=yes`).
//! * With `CORRAL_HISTORY_CALLGRIND=1` also: instructions per allocation in **fixed batches**,
//!   the like-for-like measure. Under valgrind the agent's threads take turns, so each side
//!   forms its own batches, and a commit costs ~600k instructions whatever it holds: a side
//!   that happens to make 17% more commits pays ~5% more per allocation (BENCHMARKS.md,
//!   2026-11-30). Here the agent's state (`NodeState` over the owned SQLite store, as `corral
//!   agent` opens it from the same configuration file and flags) runs in a child process
//!   under callgrind, driven with batches of exactly `size` allocations (one commit) then
//!   their `size` releases (one commit): both sides make the same commits of the same
//!   operations, and what differs is the history alone. It leaves out the agent's HTTP and
//!   JSON work (the same on both sides), so the history's share of it is overstated, not
//!   understated. Runs of 512 and 2,560 pairs per side and size, the difference (files
//!   `callgrind.batch.<on|off>.<size>.<pairs>.out` with `_KEEP`);
//!   `CORRAL_HISTORY_CALLGRIND=batches` runs only this.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::allocate_release_evented;
use super::common::{self, Agent, BINARY as CORRAL, ms, pct};

/// The two sides: extra arguments of `corral agent`.
const SIDES: [(&str, &[&str]); 2] = [
    ("history on", &[]),
    ("history off", &["--history-max-events", "0"]),
];

fn start(dir: &Path, extra: &[&str]) -> Agent {
    let socket = dir.join("agent.sock");
    let config = common::agent_config_file(dir, "10.64.0.0/16", 0);
    let mut command = Command::new(CORRAL);
    command
        .arg("agent")
        .arg("--config")
        .arg(&config)
        .args(extra);
    Agent::start_command(command, &socket)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `CORRAL_HISTORY_AB=<rounds>`: the whole comparison (see the module's documentation); 0
/// rounds: only the fixed work (and the instructions).
pub fn run(rounds: usize) {
    // Only the fixed batches (they need no `corral` binary of the same build).
    if std::env::var("CORRAL_HISTORY_CALLGRIND").as_deref() == Ok("batches") {
        fixed_batches();
        return;
    }
    if rounds > 0 {
        side_by_side(rounds);
    }
    fixed_work();
    if std::env::var_os("CORRAL_HISTORY_CALLGRIND").is_some() {
        instructions();
        fixed_batches();
    }
}

/// The 64-connection load on both agents, alternately.
fn side_by_side(rounds: usize) {
    println!(
        "## history on vs --history-max-events 0, {rounds} alternating rounds of 3 s, 64 evented connections"
    );
    println!();
    let dirs: Vec<_> = SIDES
        .iter()
        .map(|_| {
            tempfile::Builder::new()
                .prefix("corral-history-ab")
                .tempdir_in("/tmp")
                .unwrap()
        })
        .collect();
    let agents: Vec<Agent> = SIDES
        .iter()
        .zip(&dirs)
        .map(|((_, extra), dir)| start(dir.path(), extra))
        .collect();
    println!("| round | side | allocations/s | allocate p50 (ms) | allocate p99 (ms) |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    let mut figures: Vec<Vec<(f64, Duration, Duration)>> = vec![Vec::new(); SIDES.len()];
    for round in 0..rounds {
        // Who goes first alternates too: A B, B A, A B, ...
        let order: Vec<usize> = if round % 2 == 0 {
            (0..SIDES.len()).collect()
        } else {
            (0..SIDES.len()).rev().collect()
        };
        for side in order {
            let (rate, allocs, _) =
                allocate_release_evented(&agents[side].socket, 64, Duration::from_secs(3));
            let (p50, p99) = (pct(&allocs, 50.0), pct(&allocs, 99.0));
            println!(
                "| {round} | {} | {rate:.0} | {} | {} |",
                SIDES[side].0,
                ms(p50),
                ms(p99)
            );
            figures[side].push((rate, p50, p99));
        }
    }
    drop(agents);
    println!();
    println!(
        "| median of {rounds} rounds | allocations/s | allocate p50 (ms) | allocate p99 (ms) |"
    );
    println!("| --- | ---: | ---: | ---: |");
    let mut medians = Vec::new();
    for (side, rows) in figures.iter().enumerate() {
        let rate = median(rows.iter().map(|r| r.0).collect());
        let p50 = median(rows.iter().map(|r| r.1.as_secs_f64() * 1e3).collect());
        let p99 = median(rows.iter().map(|r| r.2.as_secs_f64() * 1e3).collect());
        println!("| {} | {rate:.0} | {p50:.3} | {p99:.3} |", SIDES[side].0);
        medians.push((rate, p50, p99));
    }
    // Per round, on / off: the ratio the drift cancels out of.
    let ratios: Vec<f64> = figures[0]
        .iter()
        .zip(&figures[1])
        .map(|(on, off)| on.0 / off.0)
        .collect();
    println!(
        "| on / off | {:.3} (median of the rounds' ratios {:.3}) | {:.3} | {:.3} |",
        medians[0].0 / medians[1].0,
        median(ratios),
        medians[0].1 / medians[1].1,
        medians[0].2 / medians[1].2,
    );
    println!();
}

/// (bytes written, write calls, CPU ticks of user + system time, bytes read) of process `pid`
/// so far.
fn counters(pid: u32) -> (u64, u64, u64, u64) {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let field = |name: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    (field("wchar:"), field("syscw:"), ticks, field("rchar:"))
}

/// `pairs` allocate + release pairs over `clients` blocking connections (rounded to a whole
/// number per client); answers how many were made.
fn pairs(socket: &Path, clients: usize, pairs: usize) -> usize {
    let each = pairs.div_ceil(clients);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut client = corral_client::Client::unix(&socket);
                for i in 0..each as u64 {
                    let answer = client
                        .allocate(&super::allocate_request(c, i))
                        .expect("allocate");
                    client
                        .release(&super::release_request(&answer))
                        .expect("release");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    each * clients
}

const FIXED_PAIRS: usize = 6_400;

fn fixed_work() {
    // `/proc/<pid>/stat` counts in USER_HZ, 100 per second on Linux.
    let tick = 1e6 / 100.0;
    println!(
        "## fixed work: {FIXED_PAIRS} allocate + release pairs after 1,000 warm-up pairs, a fresh agent per side"
    );
    println!();
    println!(
        "| side | clients | bytes written / allocation | write calls / allocation | bytes read / allocation | agent CPU µs / allocation |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for clients in [1, 64] {
        for (name, extra) in SIDES {
            let dir = tempfile::Builder::new()
                .prefix("corral-history-fixed")
                .tempdir_in("/tmp")
                .unwrap();
            let agent = start(dir.path(), extra);
            pairs(&agent.socket, clients, 1_000);
            let before = counters(agent.pid());
            let n = pairs(&agent.socket, clients, FIXED_PAIRS) as f64;
            let after = counters(agent.pid());
            println!(
                "| {name} | {clients} | {:.0} | {:.2} | {:.0} | {:.1} |",
                (after.0 - before.0) as f64 / n,
                (after.1 - before.1) as f64 / n,
                (after.3 - before.3) as f64 / n,
                (after.2 - before.2) as f64 * tick / n,
            );
        }
    }
    println!();
}

/// The total of instructions (`summary:`) of a callgrind output file.
fn callgrind_total(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary in {}", path.display()))
}

/// Instructions of an agent under callgrind that served `n` pairs over `clients` blocking
/// connections (after its start) and then stopped on SIGTERM. Started here, not through
/// [`Agent`]: under valgrind, on a busy machine, the agent takes longer than a test's bound
/// to become ready.
fn instructions_of(extra: &[&str], clients: usize, n: usize) -> (u64, usize) {
    let dir = tempfile::Builder::new()
        .prefix("corral-history-callgrind")
        .tempdir_in("/tmp")
        .unwrap();
    let out: PathBuf = dir.path().join("callgrind.out");
    let socket = dir.path().join("agent.sock");
    let config = common::agent_config_file(dir.path(), "10.64.0.0/16", 0);
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let mut child = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(CORRAL)
        .arg("agent")
        .arg("--config")
        .arg(&config)
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("valgrind starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while corral_client::Client::unix(&socket).readyz().is_err() {
        assert!(
            child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "the agent under valgrind did not become ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let made = if n > 0 { pairs(&socket, clients, n) } else { 0 };
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
    );
    if let Some(keep) = std::env::var_os("CORRAL_HISTORY_CALLGRIND_KEEP") {
        let side = if extra.is_empty() { "on" } else { "off" };
        let name = format!("callgrind.{side}.{clients}.{n}.out");
        std::fs::copy(&out, Path::new(&keep).join(name)).unwrap();
    }
    (callgrind_total(&out), made)
}

fn instructions() {
    const SMALL: usize = 256;
    const LARGE: usize = 1_280;
    println!(
        "## instructions per allocation (callgrind, all threads of the agent; runs of {LARGE} and {SMALL} pairs, the difference)"
    );
    println!();
    println!("| side | clients | instructions / allocation (allocate + release) |");
    println!("| --- | ---: | ---: |");
    let mut per = Vec::new();
    for clients in [1, 64] {
        for (name, extra) in SIDES {
            let (small, a) = instructions_of(extra, clients, SMALL);
            let (large, b) = instructions_of(extra, clients, LARGE);
            let each = (large as f64 - small as f64) / (b - a) as f64;
            println!("| {name} | {clients} | {each:.0} |");
            per.push(each);
        }
    }
    println!();
    println!(
        "on / off: {:.3} with 1 client, {:.3} with 64",
        per[0] / per[1],
        per[2] / per[3]
    );
}

/// Operations per commit in [`fixed_batches`]: one (a client alone), and batches as 64
/// clients make them (~20 operations a commit under valgrind, ~60 natively).
const BATCH_SIZES: [usize; 3] = [1, 16, 64];

/// The child of [`fixed_batches`] (`CORRAL_HISTORY_BATCH_CHILD=<on|off>:<size>:<pairs>`):
/// the agent's state over a fresh state directory, `pairs` allocate + release pairs in
/// batches of `size` allocations then their `size` releases, one commit each.
pub fn batch_child(spec: &str) {
    use corral_agent::node::{NodeState, Op, Reply};
    let fields: Vec<&str> = spec.split(':').collect();
    let [side, size, pairs] = fields[..] else {
        panic!("CORRAL_HISTORY_BATCH_CHILD=<on|off>:<size>:<pairs>, not {spec:?}");
    };
    let (size, pairs): (usize, usize) = (size.parse().unwrap(), pairs.parse().unwrap());
    let dir = tempfile::Builder::new()
        .prefix("corral-history-batch")
        .tempdir_in("/tmp")
        .unwrap();
    let config = corral_agent::AgentConfig::load(&corral_agent::Overrides {
        config: Some(common::agent_config_file(dir.path(), "10.64.0.0/16", 0)),
        history_max_events: (side == "off").then_some(0),
        ..corral_agent::Overrides::default()
    })
    .unwrap();
    let store = corral_store::SqliteStore::open_owned(&config.data_dir, &config.socket).unwrap();
    let mut node = NodeState::restore(store, &config.pools)
        .unwrap()
        .with_history(config.history);
    for batch in 0..pairs.div_ceil(size) as u64 {
        let allocations = (0..size)
            .map(|c| Op::Allocate(super::allocate_request(c, batch).try_into().unwrap()))
            .collect();
        let releases = node
            .run_batch(allocations)
            .into_iter()
            .map(|answer| match answer {
                Ok(Reply::Allocated(answer)) => {
                    Op::Release(super::release_request(&answer).try_into().unwrap())
                }
                other => panic!("allocate answered {other:?}"),
            })
            .collect();
        for answer in node.run_batch(releases) {
            answer.expect("release");
        }
    }
}

/// Instructions of a [`batch_child`] under callgrind.
fn batch_instructions(side: &str, size: usize, pairs: usize) -> u64 {
    let dir = tempfile::Builder::new()
        .prefix("corral-history-callgrind")
        .tempdir_in("/tmp")
        .unwrap();
    let out = dir.path().join("callgrind.out");
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(std::env::current_exe().unwrap())
        .env(
            "CORRAL_HISTORY_BATCH_CHILD",
            format!("{side}:{size}:{pairs}"),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("valgrind starts");
    assert!(status.success(), "{side}:{size}:{pairs}: {status}");
    if let Some(keep) = std::env::var_os("CORRAL_HISTORY_CALLGRIND_KEEP") {
        let name = format!("callgrind.batch.{side}.{size}.{pairs}.out");
        std::fs::copy(&out, Path::new(&keep).join(name)).unwrap();
    }
    callgrind_total(&out)
}

/// Instructions per allocation with the same commits on both sides (see the module's
/// documentation).
fn fixed_batches() {
    const SMALL: usize = 512;
    const LARGE: usize = 2_560;
    println!(
        "## instructions per allocation in fixed batches (callgrind, the agent's state in-process; runs of {LARGE} and {SMALL} pairs, the difference)"
    );
    println!();
    println!(
        "| operations a commit | history on | history off | on / off | history's own (per allocation) |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for size in BATCH_SIZES {
        let per: Vec<f64> = ["on", "off"]
            .iter()
            .map(|side| {
                let small = batch_instructions(side, size, SMALL);
                let large = batch_instructions(side, size, LARGE);
                (large as f64 - small as f64) / (LARGE - SMALL) as f64
            })
            .collect();
        println!(
            "| {size} | {:.0} | {:.0} | {:.3} | {:.0} |",
            per[0],
            per[1],
            per[0] / per[1],
            per[0] - per[1]
        );
    }
    println!();
}
