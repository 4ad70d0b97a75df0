//! Leader election on the cluster store, and the fence every leader write carries.
//!
//! Each replica puts `election/<lease-hex>` on a lease of its own; the replica whose key has
//! the lowest create revision leads (etcd's election recipe). The leader's key and its create
//! revision are the fence: every write of the leader is a transaction that also compares
//! `create_revision(key) == revision`, so once the key is gone (lease expired, replica
//! deposed) no write of that replica can land, whatever it believes.
//!
//! Elections heal. Only a key on a live lease, named after that lease (as [`Candidate::join`]
//! writes it), is a candidate ([`is_candidate`]): a key not on a lease (written by hand) would
//! never go away, so it is ignored when choosing the lowest (and reported by the replicas and
//! `corral cluster check`); the fence still compares the leader's own key, so every write
//! stays safe. A candidate whose own key disappears (deleted by hand, or replaced) while its
//! lease lives is lost within a third of its TTL: it steps down and campaigns again.

use std::time::Duration;

use corral_kv::{Compare, Event, Kv, KvError, LeaseId, Revision, Txn, TxnOp};
use tokio::sync::watch;
use tokio::time::Instant;

/// A replica's place in the election.
#[derive(Debug)]
pub struct Candidate {
    pub key: Vec<u8>,
    pub revision: Revision,
    pub lease: LeaseId,
    /// Becomes true once the lease is lost (expired, revoked, or not renewed for half its
    /// TTL): the replica must stop acting as leader at once.
    pub lost: watch::Receiver<bool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The leader's fence: compares added to every transaction of the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub key: Vec<u8>,
    pub revision: Revision,
}

impl Fence {
    pub fn compare(&self) -> Compare {
        Compare::created_at(self.key.clone(), self.revision)
    }

    /// `txn` with the fence's compare first.
    pub fn guard(&self, mut txn: Txn) -> Txn {
        txn.compares.insert(0, self.compare());
        txn
    }
}

impl Candidate {
    /// Joins the election under `prefix` with a lease of `ttl`; `replica` is written as the
    /// key's value (shown as the leader by status).
    pub async fn join<K: Kv>(
        kv: &K,
        prefix: &[u8],
        replica: &str,
        ttl: Duration,
    ) -> Result<Candidate, KvError> {
        let lease = kv.lease_grant(ttl).await?;
        let mut key = prefix.to_vec();
        // The key layout's form: lowercase hex without leading zeros.
        key.extend_from_slice(format!("{:x}", lease.0).as_bytes());
        let response = kv
            .txn(Txn {
                compares: vec![Compare::absent(key.clone())],
                success: vec![TxnOp::put_on_lease(key.clone(), replica.as_bytes(), lease)],
                failure: vec![],
            })
            .await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                let _ = kv.lease_revoke(lease).await;
                return Err(error);
            }
        };
        if !response.succeeded {
            // A lease id is unique while it lives; the key can only exist if a previous
            // attempt of ours was applied and timed out.
            let _ = kv.lease_revoke(lease).await;
            return Err(KvError::Unavailable("election key already exists".into()));
        }
        let (lost_tx, lost) = watch::channel(false);
        let keeper = tokio::spawn(keep_alive(
            kv.clone(),
            lease,
            ttl,
            (key.clone(), response.revision),
            lost_tx,
        ));
        Ok(Candidate {
            key,
            revision: response.revision,
            lease,
            lost,
            keeper,
        })
    }

    /// Waits until this replica leads (its key has the lowest create revision under
    /// `prefix`). Fails when the lease is lost or the store fails; the caller joins again.
    pub async fn wait_to_lead<K: Kv>(&mut self, kv: &K, prefix: &[u8]) -> Result<Fence, KvError> {
        loop {
            if *self.lost.borrow() {
                return Err(KvError::LeaseNotFound(self.lease));
            }
            let (keys, revision) = corral_kv::read_all(kv, prefix, 1000).await?;
            if !keys
                .iter()
                .any(|kv| kv.key == self.key && kv.create_revision == self.revision)
            {
                return Err(KvError::LeaseNotFound(self.lease));
            }
            // Keys that are not candidates (not on a lease, or not named after theirs) are
            // passed over: nothing would ever remove them.
            let Some(lowest) = keys
                .iter()
                .filter(|kv| is_candidate(prefix, kv))
                .min_by_key(|kv| kv.create_revision)
            else {
                return Err(KvError::LeaseNotFound(self.lease));
            };
            if lowest.key == self.key {
                return Ok(Fence {
                    key: self.key.clone(),
                    revision: self.revision,
                });
            }
            // Wait for any deletion under the prefix (a predecessor gone), then look again.
            let mut watch = kv.watch(prefix, revision + 1).await?;
            loop {
                tokio::select! {
                    biased;
                    batch = watch.next() => {
                        let batch = batch?;
                        if batch.iter().any(|e| matches!(e, Event::Delete { .. })) {
                            break;
                        }
                    }
                    _ = self.lost.changed() => {
                        return Err(KvError::LeaseNotFound(self.lease));
                    }
                }
            }
        }
    }

    /// Gives up the place (deleting the key with its lease), so a standby takes over at once.
    pub async fn resign<K: Kv>(self, kv: &K) {
        let _ = kv.lease_revoke(self.lease).await;
    }
}

/// Whether an `election/` key is a candidate: on a lease, and named after it (lowercase hex,
/// as [`Candidate::join`] writes it). A key written by hand (`etcdctl put`, no lease) is not:
/// it would block every replica forever.
pub fn is_candidate(prefix: &[u8], entry: &corral_kv::KeyValue) -> bool {
    let Some(lease) = entry.lease.filter(|l| l.0 != 0) else {
        return false;
    };
    entry.key.strip_prefix(prefix) == Some(format!("{:x}", lease.0).as_bytes())
}

/// Renews the lease every third of its TTL. Declares it lost when the store says it is gone,
/// when no renewal succeeded for half the TTL (the store may already have let it expire:
/// acting on past that would race the next leader, whose writes the fence lets through), or
/// when the replica's own key (`own`: key and create revision) is gone or was replaced while
/// the lease lives (deleted by hand): every fenced write would fail, so the replica steps down
/// and campaigns again.
async fn keep_alive<K: Kv>(
    kv: K,
    lease: LeaseId,
    ttl: Duration,
    own: (Vec<u8>, Revision),
    lost: watch::Sender<bool>,
) {
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut last_renewed = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match tokio::time::timeout(period, kv.lease_keep_alive(lease)).await {
            Ok(Ok(_)) => last_renewed = Instant::now(),
            Ok(Err(KvError::LeaseNotFound(_))) => {
                let _ = lost.send(true);
                return;
            }
            Ok(Err(_)) | Err(_) => {}
        }
        if last_renewed.elapsed() >= ttl / 2 {
            let _ = lost.send(true);
            return;
        }
        // A read that fails says nothing (the renewal rule above covers an unreachable store).
        if let Ok(Ok(entry)) = tokio::time::timeout(period, kv.get(&own.0)).await
            && entry.is_none_or(|e| e.create_revision != own.1 || e.lease != Some(lease))
        {
            tracing::warn!(
                key = %String::from_utf8_lossy(&own.0),
                "the election key is gone or replaced; stepping down"
            );
            let _ = lost.send(true);
            return;
        }
    }
}

/// What is wrong under the election prefix, one sentence each: keys that are not candidates
/// ([`is_candidate`]) and so are passed over.
pub fn problems(prefix: &[u8], entries: &[corral_kv::KeyValue]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| !is_candidate(prefix, e))
        .map(|e| {
            let key = e.key_str();
            match e.lease.filter(|l| l.0 != 0) {
                None => format!(
                    "election key {key} is not on a lease (written by hand?): no replica counts \
                     it as a candidate; delete it (etcdctl del {key})"
                ),
                Some(lease) => format!(
                    "election key {key} is on lease {:x}, not the one its name says: no replica \
                     counts it as a candidate; delete it (etcdctl del {key})",
                    lease.0
                ),
            }
        })
        .collect()
}
