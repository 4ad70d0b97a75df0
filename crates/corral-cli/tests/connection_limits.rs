//! The real `corral agent` under the usual open-files limit of 1,024, flooded on its TCP
//! listener with connections that never finish a request (no token is needed to open them):
//! the unix socket must keep answering at once, and the agent must close the flood's
//! connections after its timeouts.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corral_api::AllocateRequest;
use corral_client::Client;

use crate::common;

use common::{Agent, BINARY};

const TOKEN: &str = "connection-limits-test-token";
/// The open-files limit (soft and hard) the agent runs under, as on most distributions.
const AGENT_OPEN_FILES: u64 = 1024;
/// Header and body timeouts, shortened from the default 10 s so the test takes seconds.
const TIMEOUT_MS: u64 = 2000;
const IDLE: usize = 700;
const HALF_SENT_HEADS: usize = 400;
const HALF_SENT_BODIES: usize = 100;

/// A loopback address free when asked, outside the ephemeral range (`free_ports`): the agent
/// binds it a moment later.
fn free_addr() -> SocketAddr {
    let port = corral_etcd::testing::free_ports(1).expect("a free port")[0];
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `corral agent` through a shell that sets the open-files limit to 1,024 (soft and hard),
/// on `dir`, with its TCP listener on a free loopback port.
fn start_agent(dir: &Path) -> (Agent, SocketAddr) {
    let socket = dir.join("agent.sock");
    let token_file = dir.join("token");
    common::write_token_file(&token_file, TOKEN);
    // Free when asked; the agent binds it a moment later.
    let addr = free_addr();
    let config = common::agent_toml(
        dir,
        &format!(
            "tcp = \"{addr}\"\ntoken_file = {token_file:?}\n\n\
             [connections]\nheader_timeout_ms = {TIMEOUT_MS}\nbody_timeout_ms = {TIMEOUT_MS}\n",
        ),
    );
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!(
            "ulimit -n {AGENT_OPEN_FILES} && exec \"$0\" agent --config \"$1\""
        ))
        .arg(BINARY)
        .arg(&config);
    (Agent::start_command(command, &socket), addr)
}

/// The agent's open-files limits, soft and hard, from /proc.
fn open_files_limits(pid: u32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Lets this process hold the flood: its soft open-files limit up to its hard limit.
fn raise_own_open_files_limit(needed: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    assert!(
        hard >= needed,
        "this test needs an open-files hard limit of at least {needed} (it is {hard}): \
         raise it with `ulimit -Hn {needed}` as root"
    );
    if limit.current.is_some_and(|soft| soft < needed) {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(needed.min(hard)),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
}

/// One connection of the flood: open until the agent closes it.
struct Flood {
    stream: TcpStream,
    closed: bool,
}

fn open(addr: SocketAddr, sent: &[u8]) -> Flood {
    // Past the agent's cap and the kernel's queue of 128, the kernel drops the SYN and the
    // connect retries after 1, 3 and 7 s; the agent frees its places every timeout.
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("cannot connect to the agent's tcp listener in 20 s: {e}"));
    stream.write_all(sent).unwrap();
    stream.set_nonblocking(true).unwrap();
    Flood {
        stream,
        closed: false,
    }
}

impl Flood {
    /// Whether the agent has closed the connection (reading whatever it answered first).
    fn poll_closed(&mut self) -> bool {
        let mut buffer = [0u8; 1024];
        while !self.closed {
            match self.stream.read(&mut buffer) {
                Ok(0) => self.closed = true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Reset: closed too.
                Err(_) => self.closed = true,
            }
        }
        self.closed
    }
}

/// `/healthz` and an allocation on a new connection to the unix socket, as each corral-ipam
/// call makes, answered within 2 s.
fn check_unix_socket(socket: &Path, round: usize) {
    let started = Instant::now();
    let mut client = Client::unix(socket).with_read_timeout(Some(Duration::from_secs(5)));
    client.healthz().expect("/healthz on the unix socket");
    let answer = client
        .allocate(&AllocateRequest {
            scope: corral_api::NODE_SCOPE.into(),
            pool: corral_api::DEFAULT_POOL.into(),
            family: None,
            address: None,
            owner: format!("during-the-flood-{round}"),
            key: None,
            lease_ms: None,
        })
        .expect("an allocation on the unix socket");
    assert_eq!(answer.allocations.len(), 1);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "check {round} took {took:?}");
}

/// Regression: 1,100 idle or half-sent TCP connections under the open-files limit of 1,024
/// took every file descriptor of the agent: `/healthz` and allocations on the unix socket
/// timed out, and corral-ipam answered 11 after 10 s.
#[test]
fn a_flood_of_idle_and_half_sent_tcp_connections_does_not_starve_the_unix_socket() {
    let total = IDLE + HALF_SENT_HEADS + HALF_SENT_BODIES;
    raise_own_open_files_limit(2 * total as u64 + 256);
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = start_agent(dir.path());
    let limit = AGENT_OPEN_FILES.to_string();
    assert_eq!(open_files_limits(agent.pid()), format!("{limit} {limit}"));

    // The flood is opened on a thread of its own: past the agent's cap and the kernel's
    // queue, a connect waits for the agent to close an earlier connection.
    let opened = Arc::new(AtomicUsize::new(0));
    let flood_thread = {
        let opened = Arc::clone(&opened);
        std::thread::spawn(move || {
            let half_head = b"POST /v1/allocate HTTP/1.1\r\nHost: corral\r\nContent-Le".to_vec();
            let half_body = format!(
                "POST /v1/allocate HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer {TOKEN}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"owner\":"
            )
            .into_bytes();
            let sent = std::iter::repeat_n(&b""[..], IDLE)
                .chain(std::iter::repeat_n(&half_head[..], HALF_SENT_HEADS))
                .chain(std::iter::repeat_n(&half_body[..], HALF_SENT_BODIES));
            let mut flood = Vec::with_capacity(total);
            for bytes in sent {
                flood.push(open(addr, bytes));
                opened.fetch_add(1, Ordering::Relaxed);
            }
            (flood, Instant::now())
        })
    };

    // The unix socket answers at once while the flood holds every TCP connection the agent
    // serves, while it is being opened, and once it is all open.
    let started = Instant::now();
    while opened.load(Ordering::Relaxed) < 300 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the flood does not open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut round = 0;
    while !flood_thread.is_finished() {
        check_unix_socket(&agent.socket, round);
        round += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let (mut flood, flooded) = flood_thread.join().unwrap();
    eprintln!(
        "{total} connections opened in {:?}, {round} checks of the unix socket meanwhile",
        flooded - started
    );
    check_unix_socket(&agent.socket, round);

    // The agent closes every connection of the flood after the timeouts: those it serves
    // first, then those waiting in the queue as places free up (128 at a time).
    let deadline = flooded + Duration::from_secs(60);
    loop {
        let open = flood
            .iter_mut()
            .map(Flood::poll_closed)
            .filter(|closed| !closed)
            .count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} of {total} connections still open after {:?}",
            flooded.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let all_closed = flooded.elapsed();
    assert!(
        all_closed >= Duration::from_millis(TIMEOUT_MS),
        "closed before the timeout ({all_closed:?})"
    );
    // An idle connection is closed after the header timeout, not before.
    let mut idle = open(addr, b"");
    let opened_at = Instant::now();
    while !idle.poll_closed() {
        assert!(
            opened_at.elapsed() < Duration::from_millis(TIMEOUT_MS + 5000),
            "an idle connection still open after {:?}",
            opened_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let lived = opened_at.elapsed();
    assert!(
        lived >= Duration::from_millis(TIMEOUT_MS - 100),
        "an idle connection was closed after {lived:?}, before the timeout"
    );
    // Its file descriptors are back to what an idle agent holds.
    let held = open_files(agent.pid());
    assert!(held < 64, "the agent still holds {held} file descriptors");
    check_unix_socket(&agent.socket, round + 1);
    eprintln!(
        "{total} connections closed by the agent within {all_closed:?}; an idle one after {lived:?}"
    );
    agent.kill();
}

/// Regression (review): a client that pipelines requests and never reads the answers held
/// its TCP slot for good (the answers could not be written, and no timeout counted), so the
/// token holders queued behind 128 of them, and a graceful shutdown never finished.
#[test]
fn a_client_that_never_reads_its_answers_loses_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let token_file = dir.path().join("token");
    common::write_token_file(&token_file, TOKEN);
    let addr = free_addr();
    let config = common::agent_toml(
        dir.path(),
        &format!(
            "tcp = \"{addr}\"\ntoken_file = {token_file:?}\n\n\
             [connections]\nmax_tcp = 1\nheader_timeout_ms = 1000\n",
        ),
    );
    let mut command = Command::new(BINARY);
    command.arg("agent").arg("--config").arg(&config);
    let _agent = Agent::start_command(command, &socket);
    // Requests without end, never a byte read: the answers fill both socket buffers.
    let mut greedy = TcpStream::connect(addr).unwrap();
    greedy
        .set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: corral\r\n\r\n".repeat(64);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        if greedy.write_all(&request).is_err() {
            break;
        }
    }
    // The slot comes free: a token holder is answered on TCP within a few timeouts.
    let mut client = Client::tcp(addr, TOKEN)
        .unwrap()
        .with_connect_timeout(Some(Duration::from_secs(8)))
        .with_read_timeout(Some(Duration::from_secs(8)));
    let answered = Instant::now();
    client
        .healthz()
        .expect("a token holder is answered once the greedy client is cut off");
    assert!(
        answered.elapsed() < Duration::from_secs(8),
        "{:?}",
        answered.elapsed()
    );
}
