//! The operator's laptop-tier harness: replicas of `corral_operator::run` in one process on one
//! `MemKv` (or on `FaultyKv`, which wraps it to lose answers and compact at the worst moment),
//! a consistency `check` by `corral_cluster::check`, and an auditor that watches every grant
//! ever written, so "no CIDR held by two nodes" is checked at every revision, not only at the end.

pub mod cloud;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cluster::{
    ClusterConfig, ClusterName, DemandRecord, Family, FamilyDemand, IpNet, Keys, NodeName,
    NodeRecord, PoolName, ReleaseRecord, RemovalRecord, decode_value, encode_value,
};
use corral_kv::{
    Compare, Event, KeyValue, Kv, KvError, LeaseId, MemKv, Revision, Txn, TxnOp, TxnResponse, Watch,
};
use corral_operator::election::Candidate;
use corral_operator::{OperatorConfig, Shared};
use tokio::task::JoinHandle;

/// The election lease TTL of test replicas.
pub const TTL: Duration = Duration::from_secs(2);

pub fn keys() -> Keys {
    Keys::new(ClusterName::new("t").unwrap())
}

/// `op-a`, a candidate in the election of `kv` (on a lease of [`TTL`]).
pub async fn join_election(kv: &MemKv) -> Candidate {
    let prefix = keys().election_prefix();
    Candidate::join(kv, prefix.as_bytes(), "op-a", TTL)
        .await
        .unwrap()
}

pub fn node(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

/// Dual-stack, a reserved first /24, a node-ID plan, quarantine 5 s.
pub const DUAL: &str = include_str!("../configs/dual.toml");

/// A fresh store with the configuration `toml` written.
pub async fn initialized(toml: &str) -> MemKv {
    let kv = MemKv::new();
    init(&kv, toml).await;
    kv
}

/// The store is consistent, and the auditor saw nothing written while held.
pub async fn assert_clean_end<K: Kv>(kv: &K, auditor: &Auditor) {
    assert_consistent(kv).await;
    auditor.assert_clean();
}

/// A node's registration record, as its agent writes it (no addresses, no instance).
pub fn node_record(name: &str) -> Vec<u8> {
    encode_value(&NodeRecord {
        uid: format!("uid-{name}"),
        addresses: vec![],
        registered_ms: 0,
        instance_id: None,
        max_pods: None,
    })
    .unwrap()
}

/// Writes the configuration as `corral cluster init` does.
pub async fn init<K: Kv>(kv: &K, toml: &str) {
    let config = ClusterConfig::from_toml(toml).unwrap();
    put(kv, &keys().config(), config.to_json().unwrap().as_bytes()).await;
}

pub async fn put<K: Kv>(kv: &K, key: &str, value: &[u8]) -> Revision {
    apply(kv, vec![TxnOp::put(key, value)]).await
}

/// Applies `ops` in one unconditional transaction; answers its revision.
pub async fn apply<K: Kv>(kv: &K, ops: Vec<TxnOp>) -> Revision {
    let response = kv
        .txn(Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        })
        .await
        .unwrap();
    response.revision
}

/// A fresh store with the configuration `toml` written, and an auditor watching it.
pub async fn audited(toml: &str) -> (MemKv, Auditor) {
    let kv = initialized(toml).await;
    let auditor = Auditor::start(&kv).await;
    (kv, auditor)
}

/// Registers a node as its agent does (create if absent); answers the registration's create
/// revision.
pub async fn register<K: Kv>(kv: &K, name: &str) -> Revision {
    let key = keys().node(&node(name));
    let record = node_record(name);
    let response = kv
        .txn(Txn {
            compares: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::put(key.clone(), record)],
            failure: vec![TxnOp::get(key)],
        })
        .await
        .unwrap();
    if response.succeeded {
        response.revision
    } else {
        response.gets[0].as_ref().unwrap().create_revision
    }
}

/// The node's registration (its record's create revision); none once it is deleted.
pub async fn registration<K: Kv>(kv: &K, name: &str) -> Option<Revision> {
    let entry = kv.get(keys().node(&node(name)).as_bytes()).await.unwrap();
    entry.map(|e| e.create_revision)
}

/// Whether `name` holds its two grants (one a family of `DUAL`).
pub async fn dual_served<K: Kv>(kv: &K, name: &str) -> bool {
    grants(kv).await.get(name).is_some_and(|g| g.len() == 2)
}

/// [`dual_served`], and `name` holds its node ID.
pub async fn served_with_id<K: Kv>(kv: &K, name: &str) -> bool {
    dual_served(kv, name).await && node_id(kv, name).await.is_some()
}

/// Registers `name` and waits (30 s at most) until it is [`served_with_id`]; answers the
/// registration.
pub async fn register_served<K: Kv>(kv: &K, name: &str) -> Revision {
    let revision = register(kv, name).await;
    wait_until(
        &format!("{name} is served"),
        Duration::from_secs(30),
        || served_with_id(kv, name),
    )
    .await;
    revision
}

/// Asks for a node's removal as `corral node remove` does.
pub async fn request_removal<K: Kv>(kv: &K, name: &str, node_revision: Revision) {
    let value = encode_value(&RemovalRecord {
        node_revision,
        requested_ms: 0,
        mode: Default::default(),
        phase: Default::default(),
    })
    .unwrap();
    put(kv, &keys().removal(&node(name)), &value).await;
}

/// Every key of the cluster, as `corral cluster check` reads it.
pub async fn entries<K: Kv>(kv: &K) -> Vec<(String, Vec<u8>, i64)> {
    let (all, _) = corral_kv::read_all(kv, keys().prefix().as_bytes(), 1000)
        .await
        .unwrap();
    all.into_iter()
        .map(|e| (e.key_str().into_owned(), e.value, e.create_revision))
        .collect()
}

/// The consistency problems `corral cluster check` would report.
pub async fn check<K: Kv>(kv: &K) -> Vec<String> {
    corral_cluster::check(&keys(), &entries(kv).await)
}

pub async fn assert_consistent<K: Kv>(kv: &K) {
    let problems = check(kv).await;
    assert!(problems.is_empty(), "consistency problems: {problems:#?}");
}

/// Keys under `rest` (relative to the cluster prefix), with their entries.
pub async fn under<K: Kv>(kv: &K, rest: &str) -> Vec<KeyValue> {
    let prefix = format!("{}{rest}", keys().prefix());
    corral_kv::read_all(kv, prefix.as_bytes(), 1000)
        .await
        .unwrap()
        .0
}

/// Grants in the store: node → its grant keys (relative, e.g. `default/ipv4/10.192.1.0-24`).
pub async fn grants<K: Kv>(kv: &K) -> BTreeMap<String, Vec<String>> {
    let prefix = format!("{}grants/", keys().prefix());
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in under(kv, "grants/").await {
        let Ok(record) = decode_value::<corral_cluster::GrantRecord>(&entry.value) else {
            continue;
        };
        let key = entry.key_str().strip_prefix(&prefix).unwrap().to_owned();
        by_node
            .entry(record.node.to_string())
            .or_default()
            .push(key);
    }
    by_node
}

/// The node ID granted to `name`, if any.
pub async fn node_id<K: Kv>(kv: &K, name: &str) -> Option<u32> {
    let entry = kv
        .get(keys().node_id_of_node(&node(name)).as_bytes())
        .await
        .unwrap()?;
    Some(
        decode_value::<corral_cluster::NodeIdOfNodeRecord>(&entry.value)
            .ok()?
            .id,
    )
}

/// Waits (in virtual time, polling every 50 ms) until `done` holds; panics after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut done: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    loop {
        if done().await {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "not within {limit:?} of virtual time: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `replica` leads, `limit` of virtual time at most.
pub async fn wait_leading(replica: &Replica, limit: Duration) {
    let what = format!("{} leads", replica.name);
    wait_until(&what, limit, || async { replica.leading() }).await;
}

/// A replica started and waited on until it leads (5 s of virtual time at most: the only
/// one, or the first).
pub async fn start_leading<K: Kv>(kv: &K, name: &str) -> Replica {
    let replica = Replica::start(kv, name);
    wait_leading(&replica, Duration::from_secs(5)).await;
    replica
}

/// A randomized run's store: `toml` written on a `FaultyKv` (no fault yet), an auditor
/// watching it, and two replicas started (`op-1`, `op-2`; `started` counts them).
pub async fn faulty_pair(toml: &str, started: &mut usize) -> (FaultyKv, Auditor, Vec<Replica>) {
    let kv = FaultyKv::new(MemKv::new());
    init(&kv, toml).await;
    let auditor = Auditor::start(&kv.inner).await;
    let mut replicas = Vec::new();
    start_next(&kv, &mut replicas, started);
    start_next(&kv, &mut replicas, started);
    (kv, auditor, replicas)
}

/// Starts the next replica, `op-N` (`started` counts them).
pub fn start_next<K: Kv>(kv: &K, replicas: &mut Vec<Replica>, started: &mut usize) {
    *started += 1;
    replicas.push(Replica::start(kv, &format!("op-{started}")));
}

/// After a randomized step (`context` says which): no consistency problem, nothing written
/// while held.
pub async fn assert_step<K: Kv>(kv: &K, auditor: &Auditor, context: &str, log: &[String]) {
    let problems = check(kv).await;
    assert!(
        problems.is_empty(),
        "{context}: {problems:#?}\nafter {log:#?}"
    );
    assert!(
        auditor.doubles.lock().unwrap().is_empty(),
        "{context}: {:#?}\nafter {log:#?}",
        auditor.doubles.lock().unwrap()
    );
}

/// The leader (or any replica, if none leads yet) dies without resigning; the next replica
/// starts if fewer than two are left, or half the time.
pub fn kill_leader<K: Kv>(
    kv: &K,
    replicas: &mut Vec<Replica>,
    started: &mut usize,
    rng: &mut Rng,
    log: &mut Vec<String>,
) {
    let index = replicas.iter().position(Replica::leading).unwrap_or(0);
    let replica = replicas.remove(index);
    log.push(format!("kill {}", replica.name));
    replica.kill();
    if replicas.len() < 2 || rng.below(2) == 0 {
        start_next(kv, replicas, started);
    }
}

/// etcd answers nothing for `outage`.
pub async fn outage(kv: &FaultyKv, outage: Duration, log: &mut Vec<String>) {
    log.push(format!("outage {outage:?}"));
    kv.inner.set_unavailable(true);
    tokio::time::sleep(outage).await;
    kv.inner.set_unavailable(false);
}

/// Asserts that `shared` reported a problem that says every one of `words` (current, or over
/// and kept among the events).
pub fn assert_reported(shared: &Shared, words: &[&str]) {
    let problems = shared.reported();
    assert!(
        problems
            .iter()
            .any(|p| words.iter().all(|word| p.contains(word))),
        "{problems:?}"
    );
}

/// One operator replica running in this process.
pub struct Replica {
    pub name: String,
    pub shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Replica {
    pub fn start<K: Kv>(kv: &K, name: &str) -> Replica {
        Replica::start_with_cloud::<K, corral_cloud::FakeEc2>(kv, name, None)
    }

    /// A replica whose leader runs the cloud node manager on `cloud`.
    pub fn start_with_cloud<K: Kv, P: corral_cloud::CloudProvider + 'static>(
        kv: &K,
        name: &str,
        cloud: Option<corral_operator::CloudOptions<P>>,
    ) -> Replica {
        Replica::start_paged(kv, name, OperatorConfig::DEFAULT_PAGE, cloud)
    }

    /// A replica whose rebuilds read `page` keys per range request.
    pub fn start_paged<K: Kv, P: corral_cloud::CloudProvider + 'static>(
        kv: &K,
        name: &str,
        page: usize,
        cloud: Option<corral_operator::CloudOptions<P>>,
    ) -> Replica {
        Replica::start_sized(kv, name, page, corral_kv::MAX_TXN_OPS, cloud)
    }

    /// As `start_paged`, its transactions up to `max_txn_ops` operations.
    pub fn start_sized<K: Kv, P: corral_cloud::CloudProvider + 'static>(
        kv: &K,
        name: &str,
        page: usize,
        max_txn_ops: usize,
        cloud: Option<corral_operator::CloudOptions<P>>,
    ) -> Replica {
        let shared = Arc::new(Shared::new(name.to_owned()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = OperatorConfig {
            cluster: "t".into(),
            replica: name.into(),
            lease_ttl: TTL,
            workers: 4,
            page,
            max_txn_ops,
        };
        let task = tokio::spawn({
            let (kv, shared) = (kv.clone(), Arc::clone(&shared));
            async move {
                corral_operator::run_with_cloud(kv, config, shared, cloud, async move {
                    let _ = stopped.await;
                })
                .await
                .expect("the operator runs until stopped");
            }
        });
        Replica {
            name: name.to_owned(),
            shared,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn leading(&self) -> bool {
        self.shared.leading()
    }

    /// Whether the replica's task ended (it never should, short of a stop or a kill).
    pub fn finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// The process dies: the task is dropped where it stands, nothing resigns.
    pub fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// A clean stop (a leader resigns).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the replica stops cleanly");
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The replica named in the lowest election key, and that key's lease.
pub async fn leader_key<K: Kv>(kv: &K) -> Option<(String, LeaseId, Vec<u8>, Revision)> {
    under(kv, "election/")
        .await
        .into_iter()
        .min_by_key(|e| e.create_revision)
        .map(|e| {
            (
                String::from_utf8_lossy(&e.value).into_owned(),
                e.lease.unwrap(),
                e.key,
                e.create_revision,
            )
        })
}

/// Watches `grants/` from revision 1 for as long as the test runs and records every moment a
/// CIDR's grant key was written while it already named a node: a grant written twice.
#[derive(Clone, Default)]
pub struct Auditor {
    pub doubles: Arc<Mutex<Vec<String>>>,
    pub grants_written: Arc<Mutex<u64>>,
}

impl Auditor {
    pub async fn start<K: Kv>(kv: &K) -> Auditor {
        let auditor = Auditor::default();
        let prefix = format!("{}grants/", keys().prefix());
        let id_prefix = format!("{}nodeids/id/", keys().prefix());
        for prefix in [prefix, id_prefix] {
            let mut watch = kv.watch(prefix.as_bytes(), 1).await.unwrap();
            let auditor = auditor.clone();
            tokio::spawn(async move {
                let mut held: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                while let Ok(batch) = watch.next().await {
                    for event in batch {
                        match event {
                            Event::Put(kv) => {
                                *auditor.grants_written.lock().unwrap() += 1;
                                if let Some(before) = held.insert(kv.key.clone(), kv.value.clone())
                                {
                                    auditor.doubles.lock().unwrap().push(format!(
                                        "{} written at revision {} while held ({} -> {})",
                                        kv.key_str(),
                                        kv.mod_revision,
                                        String::from_utf8_lossy(&before),
                                        String::from_utf8_lossy(&kv.value)
                                    ));
                                }
                            }
                            Event::Delete { key, .. } => {
                                held.remove(&key);
                            }
                        }
                    }
                }
            });
        }
        auditor
    }

    pub fn assert_clean(&self) {
        let doubles = self.doubles.lock().unwrap();
        assert!(
            doubles.is_empty(),
            "a CIDR or node ID granted while held: {doubles:#?}"
        );
    }
}

/// What `FaultyKv` does to the next calls.
#[derive(Default, Debug)]
pub struct Faults {
    /// Grant and removal transactions that succeed are applied, but the caller hears `Unavailable` (the answer
    /// lost on the way back), for this many of them.
    pub lose_answers: usize,
    /// Grant and removal transactions are not applied, and the caller hears `Unavailable`
    /// (the request lost on the way), for this many of them.
    pub lose_requests: usize,
    /// Before the next watch of the whole cluster prefix: run these writes (registrations, as
    /// an agent would make them meanwhile), then compact the store past the watch's start.
    pub compact_before_prefix_watch: Option<Vec<String>>,
    /// How many prefix watches were compacted.
    pub compacted_watches: usize,
}

/// `MemKv` with faults a real network and etcd produce and a single in-memory store cannot:
/// a transaction applied whose answer is lost, and a compaction that lands between the
/// leader's read of the prefix and its watch.
#[derive(Clone)]
pub struct FaultyKv {
    pub inner: MemKv,
    pub faults: Arc<Mutex<Faults>>,
}

impl FaultyKv {
    pub fn new(inner: MemKv) -> FaultyKv {
        FaultyKv {
            inner,
            faults: Arc::default(),
        }
    }
}

/// The reads, leases and compaction of a `Kv` that wraps another (`self.$inner`), passed on
/// unchanged: the wrapper writes only `txn` and `watch` itself.
macro_rules! forward_kv {
    ($inner:ident) => {
        async fn get(&self, key: &[u8]) -> Result<Option<corral_kv::KeyValue>, corral_kv::KvError> {
            self.$inner.get(key).await
        }
        async fn range(
            &self,
            prefix: &[u8],
            after: Option<&[u8]>,
            limit: usize,
            revision: Option<corral_kv::Revision>,
        ) -> Result<corral_kv::RangePage, corral_kv::KvError> {
            self.$inner.range(prefix, after, limit, revision).await
        }
        async fn range_span(
            &self,
            start: &[u8],
            end: &[u8],
            limit: usize,
            revision: Option<corral_kv::Revision>,
        ) -> Result<corral_kv::RangePage, corral_kv::KvError> {
            self.$inner.range_span(start, end, limit, revision).await
        }
        async fn lease_grant(
            &self,
            ttl: std::time::Duration,
        ) -> Result<corral_kv::LeaseId, corral_kv::KvError> {
            self.$inner.lease_grant(ttl).await
        }
        async fn lease_keep_alive(
            &self,
            lease: corral_kv::LeaseId,
        ) -> Result<std::time::Duration, corral_kv::KvError> {
            self.$inner.lease_keep_alive(lease).await
        }
        async fn lease_revoke(&self, lease: corral_kv::LeaseId) -> Result<(), corral_kv::KvError> {
            self.$inner.lease_revoke(lease).await
        }
        async fn compact(&self, revision: corral_kv::Revision) -> Result<(), corral_kv::KvError> {
            self.$inner.compact(revision).await
        }
    };
}
// The test binaries that wrap a store of their own use it too.
#[allow(unused_imports)]
pub(crate) use forward_kv;

impl Kv for FaultyKv {
    forward_kv!(inner);

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, KvError> {
        // Only the operator's grants and removals lose their answers (they touch `grants/`).
        let operator = txn.success.iter().any(|op| match op {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => {
                String::from_utf8_lossy(key).contains("/v1/grants/")
            }
            TxnOp::Get { .. } => false,
        });
        if operator {
            let mut faults = self.faults.lock().unwrap();
            if faults.lose_requests > 0 {
                faults.lose_requests -= 1;
                return Err(KvError::Unavailable("the request was lost (test)".into()));
            }
        }
        let response = self.inner.txn(txn).await?;
        let mut faults = self.faults.lock().unwrap();
        if response.succeeded && operator && faults.lose_answers > 0 {
            faults.lose_answers -= 1;
            return Err(KvError::Unavailable("the answer was lost (test)".into()));
        }
        Ok(response)
    }

    async fn watch(&self, prefix: &[u8], from: Revision) -> Result<Watch, KvError> {
        let writes = if prefix == keys().prefix().as_bytes() {
            self.faults
                .lock()
                .unwrap()
                .compact_before_prefix_watch
                .take()
        } else {
            None
        };
        if let Some(writes) = writes {
            for name in writes {
                register(&self.inner, &name).await;
            }
            // Two writes at least past `from`, so `from` itself is compacted away.
            put(&self.inner, "/scratch/a", b"1").await;
            let revision = put(&self.inner, "/scratch/b", b"2").await;
            assert!(revision > from);
            self.inner.compact(revision).await.unwrap();
            self.faults.lock().unwrap().compacted_watches += 1;
        }
        self.inner.watch(prefix, from).await
    }
}

/// xorshift64*: a few lines, reproducible from the seed (the randomized tests).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The block pool of the block and history tests.
pub fn pods() -> PoolName {
    PoolName::new("pods").unwrap()
}

pub fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// A runtime on one thread with tokio's clock paused, for a test that runs a scenario to its end
/// outside `#[tokio::test]`.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A runtime of two workers, a one-member etcd on 127.0.0.1 started on it and a client of that
/// etcd (drop them in the reverse order: client, etcd, runtime).
pub fn etcd_runtime() -> (
    tokio::runtime::Runtime,
    corral_etcd::testing::EtcdCluster,
    corral_etcd::EtcdKv,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let etcd = runtime
        .block_on(corral_etcd::testing::EtcdCluster::start(1))
        .expect("etcd starts (make deps installs it)");
    let kv = runtime
        .block_on(corral_etcd::EtcdKv::connect(
            &etcd.endpoints(),
            Default::default(),
        ))
        .unwrap();
    (runtime, etcd, kv)
}

/// An agent's answer to the operator's mark of `block` (pool `pods`, IPv4) on node `name`: the
/// release record as `answer` changes it, written by CAS on the key's mod revision as the
/// protocol says. `None` when there is no release record; else whether the CAS went through.
pub async fn answer_release<K: Kv>(
    kv: &K,
    name: &str,
    block: &str,
    answer: impl FnOnce(&mut ReleaseRecord),
) -> Option<bool> {
    let key = keys().release(&node(name), &pods(), Family::V4, &net(block));
    let entry = kv.get(key.as_bytes()).await.unwrap()?;
    let mut record: ReleaseRecord = decode_value(&entry.value).unwrap();
    answer(&mut record);
    let txn = Txn {
        compares: vec![Compare::modified_at(key.clone(), entry.mod_revision)],
        success: vec![TxnOp::put(key, encode_value(&record).unwrap())],
        failure: vec![],
    };
    Some(kv.txn(txn).await.unwrap().succeeded)
}

/// Writes a node's demand as its agent would.
pub async fn demand<K: Kv>(kv: &K, name: &str, used: u64, free: u64, pending: u64, empty: &[&str]) {
    let record = DemandRecord {
        ipv4: Some(FamilyDemand {
            used,
            free,
            pending,
            blocks: 0,
            empty: empty.iter().map(|e| net(e)).collect(),
        }),
        ipv6: None,
        at_ms: 0,
    };
    put(
        kv,
        &keys().demand(&node(name), &pods()),
        &encode_value(&record).unwrap(),
    )
    .await;
}
