//! One live agent per node: the identity an agent writes into `live/<node>`, the claim of that
//! key (created only if absent, on the agent's lease), the judgement of a key some other
//! process holds, and the lease's renewal through slow answers ([`Renewal`]).
//!
//! A node's `live/` key names one process: its host, boot ID, PID namespace, PID and start
//! time. An agent that finds the key held judges the holder ([`judge`]):
//! - this very process (an earlier round whose lease has not expired yet): taken over;
//! - a process of this machine (same boot ID and PID namespace) that is gone, or whose PID now
//!   belongs to another process (another start time): an earlier agent killed before its lease
//!   expired, so the key is taken over at once (a restart after SIGKILL does not wait);
//! - a process of this machine that runs: another live agent, refused at once;
//! - anything else (another machine, a reboot, another container, a record from an older
//!   agent): the agent waits for the key's lease to expire, at most about the holder's TTL; a
//!   key still there after that is kept alive by a live agent, and the node is refused.
//!
//! A key not on a lease (written by hand) holds nothing: no agent writes one, and nothing would
//! ever remove it. It is replaced, with a compare on its revision.

use std::time::Duration;

use corral_cluster::{LiveRecord, decode_value, encode_value};
use corral_kv::{Compare, Event, KeyValue, Kv, KvError, LeaseId, Revision, Txn, TxnOp};

/// Who this process is, as a `live/` key names it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProcessIdentity {
    pub host: String,
    pub boot_id: String,
    pub pid_namespace: String,
    pub pid: u32,
    pub process_start: u64,
}

impl ProcessIdentity {
    /// This process, read from `/proc` (what cannot be read stays empty, and such a record is
    /// never judged gone: its holder is waited for).
    pub fn current() -> ProcessIdentity {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        let pid = std::process::id();
        ProcessIdentity {
            host: read("/proc/sys/kernel/hostname"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid,
            process_start: process_start(pid).unwrap_or(0),
        }
    }

    /// The record this process writes into `live/<node>`.
    pub fn record(&self, since_ms: u64, ttl: Duration) -> LiveRecord {
        LiveRecord {
            pid: self.pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_ms: since_ms,
            host: self.host.clone(),
            boot_id: self.boot_id.clone(),
            pid_namespace: self.pid_namespace.clone(),
            process_start: self.process_start,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The start time (clock ticks after boot) of process `pid` in this PID namespace, if it runs.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_process_start(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line; the command (field 2) may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn parse_process_start(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the command: state is field 3, so field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What a `live/` key held by a record says about its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// This very process (an earlier round of its link).
    ThisProcess,
    /// A process of this machine that is gone: its key waits only for its lease.
    GoneProcess,
    /// A process of this machine that runs: another live agent.
    LiveProcess,
    /// Cannot tell (another machine, a reboot, another container, an older agent's record):
    /// wait for its lease.
    Unknown,
}

/// Judges the holder of a `live/` key from its record. `start_of` answers the start time of a
/// PID in this namespace if it runs ([`process_start`]).
pub fn judge(
    record: &LiveRecord,
    me: &ProcessIdentity,
    start_of: impl Fn(u32) -> Option<u64>,
) -> Holder {
    let known = |s: &str| !s.is_empty();
    if !(known(&record.boot_id)
        && known(&me.boot_id)
        && known(&record.pid_namespace)
        && known(&me.pid_namespace)
        && record.process_start != 0
        && me.process_start != 0)
    {
        return Holder::Unknown;
    }
    if record.boot_id != me.boot_id || record.pid_namespace != me.pid_namespace {
        return Holder::Unknown;
    }
    if record.pid == me.pid && record.process_start == me.process_start {
        return Holder::ThisProcess;
    }
    match start_of(record.pid) {
        Some(start) if start == record.process_start => Holder::LiveProcess,
        _ => Holder::GoneProcess,
    }
}

/// How a holder is named in messages: `host H, pid P, since T`.
pub fn describe(record: Option<&LiveRecord>, lease: Option<LeaseId>) -> String {
    let lease = lease.map_or_else(|| "no lease".to_owned(), |l| format!("lease {:x}", l.0));
    match record {
        Some(r) => format!(
            "host {}, pid {}, since {} ({lease})",
            if r.host.is_empty() {
                "unknown"
            } else {
                &r.host
            },
            r.pid,
            utc(r.started_ms)
        ),
        None => format!("a record that cannot be read ({lease})"),
    }
}

/// How long to wait for a key of TTL `ttl_ms` to expire: half again its TTL (at least 2 s,
/// etcd's own floor for a lease) and a second, for etcd's expiry checks and clock rates.
pub fn expiry_wait(ttl_ms: u64, own_ttl: Duration) -> Duration {
    let ttl = if ttl_ms == 0 {
        own_ttl
    } else {
        Duration::from_millis(ttl_ms)
    };
    ttl.max(Duration::from_secs(2)) * 3 / 2 + Duration::from_secs(1)
}

/// Why the claim failed.
#[derive(Debug)]
pub enum ClaimError {
    /// Another live agent holds the key: how it is named.
    Held(String),
    Kv(KvError),
    /// The agent stops.
    Stopped,
    /// A holder must be waited for (asked with `ask_first`): why, in a sentence.
    MustWait(String),
}

impl From<KvError> for ClaimError {
    fn from(error: KvError) -> ClaimError {
        ClaimError::Kv(error)
    }
}

/// The claim: the key's create revision (the fence of a clean stop and of the guard).
#[derive(Clone, Copy, Debug)]
pub struct Claimed {
    pub revision: Revision,
}

/// Puts `record` at `key` on `lease` only if no other process holds it (see the module's
/// rules). `waiting` is told, in a sentence, before the agent waits for a holder's lease;
/// with `ask_first`, the claim answers [`ClaimError::MustWait`] instead of waiting (an agent
/// that serves stops serving the node's ranges, then claims again).
#[allow(clippy::too_many_arguments)]
pub async fn claim<K: Kv>(
    kv: &K,
    key: &str,
    record: &LiveRecord,
    lease: LeaseId,
    me: &ProcessIdentity,
    own_ttl: Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    ask_first: bool,
    mut waiting: impl FnMut(&str),
) -> Result<Claimed, ClaimError> {
    let value = encode_value(record).unwrap_or_default();
    let put = TxnOp::put_on_lease(key, value, lease);
    // The holder judged `Unknown` last, and until when it is waited for.
    let mut waited: Option<(Revision, tokio::time::Instant)> = None;
    loop {
        let response = kv
            .txn(Txn {
                compares: vec![Compare::absent(key)],
                success: vec![put.clone()],
                failure: vec![TxnOp::get(key)],
            })
            .await?;
        if response.succeeded {
            return Ok(Claimed {
                revision: response.revision,
            });
        }
        let Some(current) = response.gets.into_iter().next().flatten() else {
            continue;
        };
        let holder: Option<LiveRecord> = decode_value(&current.value).ok();
        let verdict = match (&holder, current.lease) {
            (_, None) => None,
            (Some(record), Some(_)) => Some(judge(record, me, process_start)),
            (None, Some(_)) => Some(Holder::Unknown),
        };
        let named = describe(holder.as_ref(), current.lease);
        match verdict {
            None | Some(Holder::ThisProcess | Holder::GoneProcess) => {
                // Deleted if still the key judged; then created as any absent key is (another
                // process may take it first, and is judged in turn).
                let deleted = kv
                    .txn(Txn {
                        compares: vec![
                            Compare::created_at(key, current.create_revision),
                            Compare::modified_at(key, current.mod_revision),
                        ],
                        success: vec![TxnOp::delete(key)],
                        failure: vec![],
                    })
                    .await?;
                if deleted.succeeded {
                    let from = match verdict {
                        None => "a key not on a lease (no agent writes one)",
                        Some(Holder::ThisProcess) => "an earlier round of this process",
                        _ => "an earlier agent of this machine that is gone",
                    };
                    tracing::info!(key, holder = %named, from, "took over the liveness key");
                    if let Some(old) = current.lease
                        && old != lease
                    {
                        // The lease of a process that is gone (or of this one's earlier round).
                        let _ = kv.lease_revoke(old).await;
                    }
                }
                continue;
            }
            Some(Holder::LiveProcess) => return Err(ClaimError::Held(named)),
            Some(Holder::Unknown) => {}
        }
        let now = tokio::time::Instant::now();
        let deadline = match waited {
            Some((revision, deadline)) if revision == current.create_revision => {
                if now >= deadline {
                    return Err(ClaimError::Held(format!(
                        "{named}; its lease is kept alive past its TTL"
                    )));
                }
                deadline
            }
            _ => {
                let ttl = holder.as_ref().map_or(0, |r| r.ttl_ms);
                let deadline = now + expiry_wait(ttl, own_ttl);
                waited = Some((current.create_revision, deadline));
                let message = format!(
                    "{key} is held by {named}; waiting up to {}s for its lease to expire \
                     (a process that is gone), else it is a live agent and this one serves \
                     nothing of the node",
                    expiry_wait(ttl, own_ttl).as_secs()
                );
                if ask_first {
                    return Err(ClaimError::MustWait(message));
                }
                tracing::warn!("{message}");
                waiting(&message);
                deadline
            }
        };
        // Wait for the key to go (or change hands), or the deadline; then look again.
        let mut watch = kv.watch(key.as_bytes(), response.revision + 1).await?;
        loop {
            tokio::select! {
                batch = watch.next() => {
                    let batch = batch?;
                    if batch.iter().any(|e| e.key() == key.as_bytes()) {
                        break;
                    }
                }
                () = tokio::time::sleep_until(deadline) => break,
                _ = stop.changed() => return Err(ClaimError::Stopped),
            }
        }
    }
}

/// A lease kept alive through slow answers. A keep-alive that fails for a passing reason (a
/// timeout, an unreachable or leaderless etcd) leaves the lease as it is, and is tried again
/// soon; the lease is given up only when etcd says it is gone, or when its TTL has run out
/// since the last renewal etcd acknowledged (counted from when that keep-alive was sent, so
/// never later than etcd's own expiry). Ending the link's round at every slow keep-alive made
/// an overloaded etcd worse: each such round registered again, claimed its liveness again and
/// opened its watches again (thousands of agents on a starved etcd flapped that way).
#[derive(Debug)]
pub struct Renewal {
    lease: LeaseId,
    ttl: Duration,
    renewed: tokio::time::Instant,
}

/// How a renewal went.
#[derive(Debug)]
pub enum Renewed {
    /// etcd renewed the lease.
    Yes,
    /// The keep-alive failed, but the lease may still run: try again soon.
    Late(KvError),
}

impl Renewal {
    /// A lease of `ttl` whose grant (or last renewal) was asked for at `asked`.
    pub fn new(lease: LeaseId, ttl: Duration, asked: tokio::time::Instant) -> Renewal {
        Renewal {
            lease,
            ttl,
            renewed: asked,
        }
    }

    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// One keep-alive: an error only when the lease is gone or cannot be told alive any more.
    pub async fn renew<K: Kv>(&mut self, kv: &K) -> Result<Renewed, KvError> {
        let sent = tokio::time::Instant::now();
        match kv.lease_keep_alive(self.lease).await {
            Ok(ttl) => {
                self.renewed = sent;
                self.ttl = ttl;
                Ok(Renewed::Yes)
            }
            Err(error) if error.is_retryable() && self.renewed.elapsed() < self.ttl => {
                Ok(Renewed::Late(error))
            }
            Err(error) => Err(error),
        }
    }

    /// When to try again after a late keep-alive: a second, or sooner for a short TTL.
    pub fn retry_in(&self) -> Duration {
        (self.ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// What the guard found.
#[derive(Debug)]
pub enum Lost {
    /// Another process holds the key now: how it is named.
    Taken(String),
    Kv(KvError),
}

/// Watches the claimed key while the round runs. A deletion (by hand) is answered by putting
/// the key back on the lease if it is still absent; a key that another process created or
/// overwrote ends the round: this agent no longer holds the node's liveness, and does not
/// fight for it.
pub async fn guard<K: Kv>(
    kv: &K,
    key: &str,
    record: &LiveRecord,
    lease: LeaseId,
    mut claimed: Claimed,
) -> Lost {
    let value = encode_value(record).unwrap_or_default();
    let mut from = claimed.revision + 1;
    loop {
        let mut watch = match kv.watch(key.as_bytes(), from).await {
            Ok(watch) => watch,
            Err(error) => return Lost::Kv(error),
        };
        loop {
            let batch = match watch.next().await {
                Ok(batch) => batch,
                Err(error) => return Lost::Kv(error),
            };
            let mut deleted = None;
            for event in batch.iter().filter(|e| e.key() == key.as_bytes()) {
                match event {
                    Event::Put(entry) if !is_ours(entry, lease, claimed) => {
                        let holder: Option<LiveRecord> = decode_value(&entry.value).ok();
                        return Lost::Taken(describe(holder.as_ref(), entry.lease));
                    }
                    Event::Put(_) => deleted = None,
                    Event::Delete { mod_revision, .. } => deleted = Some(*mod_revision),
                }
            }
            let Some(at) = deleted else { continue };
            let response = kv
                .txn(Txn {
                    compares: vec![Compare::absent(key)],
                    success: vec![TxnOp::put_on_lease(key, value.clone(), lease)],
                    failure: vec![TxnOp::get(key)],
                })
                .await;
            match response {
                Ok(response) if response.succeeded => {
                    tracing::warn!(
                        key,
                        revision = at,
                        "the liveness key was deleted; put back on this agent's lease"
                    );
                    claimed = Claimed {
                        revision: response.revision,
                    };
                    from = response.revision + 1;
                    break;
                }
                Ok(response) => {
                    let current = response.gets.into_iter().next().flatten();
                    let holder: Option<LiveRecord> =
                        current.as_ref().and_then(|c| decode_value(&c.value).ok());
                    return Lost::Taken(describe(holder.as_ref(), current.and_then(|c| c.lease)));
                }
                Err(error) => return Lost::Kv(error),
            }
        }
    }
}

fn is_ours(entry: &KeyValue, lease: LeaseId, claimed: Claimed) -> bool {
    entry.create_revision == claimed.revision && entry.lease == Some(lease)
}

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> ProcessIdentity {
        ProcessIdentity {
            host: "h".into(),
            boot_id: "boot-1".into(),
            pid_namespace: "pid:[1]".into(),
            pid: 100,
            process_start: 5_000,
        }
    }

    fn record(pid: u32, start: u64) -> LiveRecord {
        LiveRecord {
            pid,
            process_start: start,
            ..me().record(0, Duration::from_secs(20))
        }
    }

    #[test]
    fn a_holder_is_judged_by_boot_namespace_pid_and_start_time() {
        let none = |_| None;
        assert_eq!(judge(&record(100, 5_000), &me(), none), Holder::ThisProcess);
        // The same PID, started at another time: an earlier process, gone.
        assert_eq!(judge(&record(100, 4_000), &me(), none), Holder::GoneProcess);
        assert_eq!(judge(&record(7, 4_000), &me(), none), Holder::GoneProcess);
        // Its PID runs, started when the record says: alive.
        assert_eq!(
            judge(&record(7, 4_000), &me(), |p| (p == 7).then_some(4_000)),
            Holder::LiveProcess
        );
        // Its PID was reused by a process started later: the holder is gone.
        assert_eq!(
            judge(&record(7, 4_000), &me(), |p| (p == 7).then_some(4_500)),
            Holder::GoneProcess
        );
        // Another boot (a clone, a reboot), another container, or an older agent's record:
        // nothing is presumed.
        let other_boot = LiveRecord {
            boot_id: "boot-2".into(),
            ..record(7, 4_000)
        };
        assert_eq!(judge(&other_boot, &me(), none), Holder::Unknown);
        let other_namespace = LiveRecord {
            pid_namespace: "pid:[2]".into(),
            ..record(100, 5_000)
        };
        assert_eq!(judge(&other_namespace, &me(), none), Holder::Unknown);
        let old: LiveRecord =
            serde_json::from_str(r#"{"pid":7,"version":"0.1.0","started_ms":1}"#).unwrap();
        assert_eq!(judge(&old, &me(), none), Holder::Unknown);
        let unknown_me = ProcessIdentity {
            boot_id: String::new(),
            ..me()
        };
        assert_eq!(
            judge(&record(100, 5_000), &unknown_me, none),
            Holder::Unknown
        );
    }

    #[test]
    fn this_process_reads_its_own_start_time() {
        let me = ProcessIdentity::current();
        assert!(me.process_start > 0, "{me:?}");
        assert_eq!(process_start(me.pid), Some(me.process_start));
        assert_eq!(
            judge(&me.record(0, Duration::from_secs(1)), &me, process_start),
            Holder::ThisProcess
        );
        assert_eq!(
            parse_process_start(
                "12 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19"
            ),
            Some(777)
        );
        assert_eq!(parse_process_start("garbage"), None);
    }

    #[test]
    fn holders_are_named_with_host_pid_and_since() {
        let named = describe(
            Some(&LiveRecord {
                started_ms: 1_700_000_000_000,
                ..record(7, 1)
            }),
            Some(LeaseId(0xab)),
        );
        assert_eq!(
            named,
            "host h, pid 7, since 2023-11-14T22:13:20Z (lease ab)"
        );
        assert_eq!(
            describe(None, None),
            "a record that cannot be read (no lease)"
        );
        assert_eq!(
            expiry_wait(0, Duration::from_secs(20)),
            Duration::from_secs(31)
        );
        assert_eq!(
            expiry_wait(1_000, Duration::from_secs(20)),
            Duration::from_secs(4)
        );
    }
}
