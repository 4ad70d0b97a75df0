//! The cloud scenarios' harness: a `FakeEc2` behind `Audited` (which records every unassign and
//! checks it against the pods the agents hold at that moment), agents played by the test by
//! the protocol (register with an instance ID, serve the attached `interfaces/` records'
//! addresses, hold pods, report demand, answer release handshakes), a clock on virtual time,
//! and the end-of-scenario invariants.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cloud::fake::{InstanceSpec, SubnetSpec};
use corral_cloud::{
    CloudError, CloudProvider, CreateInterface, FakeEc2, Instance, InstanceTypeInfo,
    InterfaceFilter, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Subnet,
    SubnetFilter, Tags,
};
use corral_cluster::{
    CloudAttachment, CloudInterfaceRecord, DemandRecord, Family, FamilyDemand, IpNet, Key,
    NodeName, NodeRecord, PoolName, ReleaseRecord, ReleaseState, decode_value, encode_value,
};
use corral_kv::{Compare, Event, Kv, MemKv, Txn, TxnOp};
use corral_operator::{CloudOptions, WallClock};

use super::{keys, node, put};

pub const VPC: &str = "vpc-1";
pub const ZONE: &str = "us-east-1a";

/// A wall clock on tokio's (paused) clock: 2023-11-14 plus the virtual time since `t0`.
pub fn virtual_clock() -> WallClock {
    let t0 = tokio::time::Instant::now();
    Arc::new(move || 1_700_000_000_000 + u64::try_from(t0.elapsed().as_millis()).unwrap())
}

pub fn pods() -> PoolName {
    PoolName::new("pods").unwrap()
}

/// A cloud pool `pods` in the VPC 10.0.0.0/16 with these extra lines in its table and
/// `[pools.cloud]` lines.
pub fn cloud_config(pool_lines: &str, cloud_lines: &str) -> String {
    format!(
        r#"
quarantine_secs = 5
[[pools]]
name = "pods"
mode = "cloud"
{pool_lines}
[pools.cloud]
{cloud_lines}
[pools.ipv4]
cidrs = ["10.0.0.0/16"]
"#
    )
}

/// What the agents hold, shared with `Audited`.
#[derive(Default, Debug)]
pub struct AgentState {
    pub nodes: BTreeMap<NodeName, AgentNode>,
    /// Unassigns of an address a pod held at that moment.
    pub violations: Vec<String>,
    /// Every unassign: (interface, address).
    pub unassigned: Vec<(String, IpNet)>,
    /// Nodes the test changed (pods wanted, registered): stepped on the next poke.
    pub dirty: BTreeSet<NodeName>,
    /// Every interface deleted: (interface, when, its creation tag, whether a `interfaces/`
    /// record named it then is not known here: the test checks the store).
    pub deleted: Vec<Deleted>,
    /// Creates applied whose caller never heard back (a crash between create and attach).
    pub hung: Vec<String>,
}

/// An interface deletion as `Audited` saw it.
#[derive(Debug, Clone)]
pub struct Deleted {
    pub interface: String,
    pub at_ms: u64,
    pub created_ms: Option<u64>,
    pub node_tag: Option<String>,
}

/// One node's agent.
#[derive(Default, Debug, Clone)]
pub struct AgentNode {
    /// `interfaces/` records: interface → (create revision, record).
    pub records: BTreeMap<String, (i64, CloudInterfaceRecord)>,
    /// Pods wanted on the node.
    pub want: u64,
    /// Addresses held by pods.
    pub pods: BTreeSet<IpAddr>,
    /// Entries surrendered in a handshake (answered `ready`).
    pub surrendered: BTreeSet<IpNet>,
    /// Open release keys: entry → (mod revision, record).
    pub releases: BTreeMap<IpNet, (i64, ReleaseRecord)>,
    /// The last demand written.
    pub written: Option<FamilyDemand>,
}

impl AgentNode {
    /// Entries the agent serves: those of attached records, IPv4.
    pub fn entries(&self) -> Vec<IpNet> {
        self.records
            .values()
            .filter(|(_, r)| r.attachment == CloudAttachment::Attached)
            .flat_map(|(_, r)| r.addresses.iter().copied())
            .filter(|n| matches!(n, IpNet::V4(_)))
            .collect()
    }

    fn usable_entries(&self) -> Vec<IpNet> {
        self.entries()
            .into_iter()
            .filter(|e| !self.surrendered.contains(e) && !self.releases.contains_key(e))
            .collect()
    }

    fn addresses(entry: &IpNet) -> Vec<IpAddr> {
        match entry {
            IpNet::V4(n) => n.hosts_all().map(IpAddr::V4).collect(),
            IpNet::V6(n) => vec![IpAddr::V6(n.addr())],
        }
    }

    /// Free addresses to hand out now.
    fn free(&self) -> Vec<IpAddr> {
        self.usable_entries()
            .iter()
            .flat_map(AgentNode::addresses)
            .filter(|a| !self.pods.contains(a))
            .collect()
    }

    fn demand(&self) -> FamilyDemand {
        let free = self.free().len() as u64;
        let used = self.pods.len() as u64;
        let mut empty: Vec<IpNet> = self
            .usable_entries()
            .into_iter()
            .filter(|e| {
                !AgentNode::addresses(e)
                    .iter()
                    .any(|a| self.pods.contains(a))
            })
            .collect();
        empty.sort();
        empty.reverse();
        empty.truncate(FamilyDemand::MAX_EMPTY);
        FamilyDemand {
            used,
            free,
            pending: self.want.saturating_sub(used),
            blocks: 0,
            empty,
        }
    }
}

trait HostsAll {
    fn hosts_all(&self) -> Box<dyn Iterator<Item = std::net::Ipv4Addr>>;
}

impl HostsAll for ipnet::Ipv4Net {
    /// Every address of the network (a /32 is itself, a /28 its 16).
    fn hosts_all(&self) -> Box<dyn Iterator<Item = std::net::Ipv4Addr>> {
        let start = u32::from(self.network());
        let n = 1u64 << (32 - self.prefix_len());
        Box::new((0..n).map(move |i| std::net::Ipv4Addr::from(start + i as u32)))
    }
}

pub type Agents = Arc<Mutex<AgentState>>;

/// The fake EC2, every unassign checked against the agents' pods at the moment it is made.
#[derive(Clone)]
pub struct Audited {
    pub ec2: FakeEc2,
    pub agents: Agents,
    pub clock: WallClock,
    /// While set, a create is applied and then never answers (the caller "crashes" there).
    pub hang_creates: Arc<std::sync::atomic::AtomicBool>,
    /// While set, an IPv4 assign is applied and then never answers.
    pub hang_assigns: Arc<std::sync::atomic::AtomicBool>,
    /// Mutating calls sent through this handle (one per replica, see `Rig::provider_for`).
    pub mutations: Arc<std::sync::atomic::AtomicU64>,
    /// While above zero, an IPv4 unassign is applied and then answered `Timeout` (counted
    /// down): an answer lost after the cloud applied the call.
    pub timeout_unassigns: Arc<std::sync::atomic::AtomicU64>,
}

impl Audited {
    fn mutation(&self) {
        self.mutations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Audited {
    fn audit(&self, interface: &str, nets: Vec<IpNet>) {
        let mut state = self.agents.lock().unwrap();
        for net in nets {
            state.unassigned.push((interface.to_owned(), net));
            let held: Vec<String> = state
                .nodes
                .iter()
                .filter(|(_, n)| {
                    AgentNode::addresses(&net)
                        .iter()
                        .any(|a| n.pods.contains(a))
                })
                .map(|(name, _)| name.to_string())
                .collect();
            if !held.is_empty() {
                state.violations.push(format!(
                    "{net} unassigned from {interface} while a pod of {held:?} holds it"
                ));
            }
        }
    }
}

impl CloudProvider for Audited {
    async fn describe_instance(&self, id: &str) -> Result<Instance, CloudError> {
        self.ec2.describe_instance(id).await
    }
    async fn describe_instance_types(
        &self,
        types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        self.ec2.describe_instance_types(types).await
    }
    async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        self.ec2.describe_subnets(filter).await
    }
    async fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        self.ec2.describe_interfaces(filter).await
    }
    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        self.mutation();
        let created = self.ec2.create_interface(request).await?;
        if self.hang_creates.load(std::sync::atomic::Ordering::SeqCst) {
            self.agents.lock().unwrap().hung.push(created.id.clone());
            std::future::pending::<()>().await;
        }
        Ok(created)
    }
    async fn attach_interface(
        &self,
        interface: &str,
        instance: &str,
        index: u32,
    ) -> Result<String, CloudError> {
        self.mutation();
        self.ec2.attach_interface(interface, instance, index).await
    }
    async fn detach_interface(&self, attachment: &str, force: bool) -> Result<(), CloudError> {
        self.mutation();
        self.ec2.detach_interface(attachment, force).await
    }
    async fn delete_interface(&self, interface: &str) -> Result<(), CloudError> {
        self.mutation();
        let truth = self.ec2.interface(interface);
        let result = self.ec2.delete_interface(interface).await;
        if result.is_ok() {
            let tags = truth.map(|ni| ni.tags).unwrap_or_default();
            self.agents.lock().unwrap().deleted.push(Deleted {
                interface: interface.to_owned(),
                at_ms: (self.clock)(),
                created_ms: tags
                    .get("corral.io/created-at")
                    .and_then(|t| t.parse().ok()),
                node_tag: tags.get("corral.io/node").cloned(),
            });
        }
        result
    }
    async fn assign_ipv4(
        &self,
        interface: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        self.mutation();
        let assigned = self.ec2.assign_ipv4(interface, request).await?;
        if self.hang_assigns.load(std::sync::atomic::Ordering::SeqCst) {
            self.agents.lock().unwrap().hung.push(interface.to_owned());
            std::future::pending::<()>().await;
        }
        Ok(assigned)
    }
    async fn unassign_ipv4(&self, interface: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.mutation();
        let nets = release
            .addresses
            .iter()
            .map(|a| IpNet::from(IpAddr::V4(*a)))
            .chain(release.prefixes.iter().map(|p| IpNet::V4(*p)))
            .collect();
        self.audit(interface, nets);
        self.ec2.unassign_ipv4(interface, release).await?;
        let lost = self.timeout_unassigns.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        if lost.is_ok() {
            return Err(CloudError::Timeout {
                action: corral_cloud::Action::UnassignPrivateIpAddresses,
            });
        }
        Ok(())
    }
    async fn assign_ipv6(
        &self,
        interface: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        self.mutation();
        self.ec2.assign_ipv6(interface, request).await
    }
    async fn unassign_ipv6(&self, interface: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.mutation();
        let nets = release
            .addresses
            .iter()
            .map(|a| IpNet::from(IpAddr::V6(*a)))
            .chain(release.prefixes.iter().map(|p| IpNet::V6(*p)))
            .collect();
        self.audit(interface, nets);
        self.ec2.unassign_ipv6(interface, release).await
    }
    async fn create_tags(&self, ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        self.mutation();
        self.ec2.create_tags(ids, tags).await
    }
    async fn delete_tags(&self, ids: &[String], tag_keys: &[String]) -> Result<(), CloudError> {
        self.mutation();
        self.ec2.delete_tags(ids, tag_keys).await
    }
}

/// A scenario's world: the store, the cloud, the agents.
pub struct Rig {
    pub kv: MemKv,
    pub ec2: FakeEc2,
    pub provider: Arc<Audited>,
    pub agents: Agents,
    pub clock: WallClock,
    /// Node → instance.
    pub instances: BTreeMap<String, String>,
    agent_task: Option<tokio::task::JoinHandle<()>>,
    poke: Arc<tokio::sync::Notify>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(task) = self.agent_task.take() {
            task.abort();
        }
    }
}

/// A builder of the fake with the scenario's subnets: `subnet-a` (a /18 in the zone) and
/// `subnet-b` (a /20, same zone), both in the VPC.
pub fn fake_builder(seed: u64) -> corral_cloud::fake::FakeEc2Builder {
    FakeEc2::builder()
        .seed(seed)
        .subnet(SubnetSpec::new(
            "subnet-a",
            VPC,
            ZONE,
            "10.0.0.0/18".parse().unwrap(),
        ))
        .subnet(SubnetSpec::new(
            "subnet-b",
            VPC,
            ZONE,
            "10.0.64.0/20".parse().unwrap(),
        ))
}

impl Rig {
    /// The store with `config`, the fake, and agents for `nodes` (name, instance type), each
    /// launched in `subnet-a` and registered with its instance ID.
    pub async fn new(config: &str, ec2: FakeEc2, nodes: &[(String, &str)]) -> Rig {
        let kv = MemKv::new();
        super::init(&kv, config).await;
        let agents: Agents = Arc::default();
        let clock = virtual_clock();
        let provider = Arc::new(Audited {
            ec2: ec2.clone(),
            agents: Arc::clone(&agents),
            clock: Arc::clone(&clock),
            hang_creates: Arc::default(),
            hang_assigns: Arc::default(),
            mutations: Arc::default(),
            timeout_unassigns: Arc::default(),
        });
        let mut rig = Rig {
            kv,
            ec2,
            provider,
            agents,
            clock,
            instances: BTreeMap::new(),
            agent_task: None,
            poke: Arc::new(tokio::sync::Notify::new()),
        };
        rig.start_agents().await;
        for (name, instance_type) in nodes {
            rig.add_node(name, instance_type).await;
        }
        rig
    }

    /// Launches an instance and registers its node.
    pub async fn add_node(&mut self, name: &str, instance_type: &str) {
        let instance = self
            .ec2
            .launch_instance(InstanceSpec::new(instance_type, "subnet-a"))
            .unwrap();
        {
            let mut state = self.agents.lock().unwrap();
            state.nodes.insert(node(name), AgentNode::default());
            state.dirty.insert(node(name));
        }
        let record = NodeRecord {
            uid: format!("uid-{name}"),
            addresses: vec![],
            registered_ms: 0,
            instance_id: Some(instance.clone()),
        };
        put(
            &self.kv,
            &keys().node(&node(name)),
            &encode_value(&record).unwrap(),
        )
        .await;
        self.instances.insert(name.to_owned(), instance);
        self.poke.notify_one();
    }

    pub fn options(&self) -> CloudOptions<Audited> {
        let mut options = CloudOptions::new(Arc::clone(&self.provider));
        options.clock = Arc::clone(&self.clock);
        options
    }

    /// Options on a handle of the same cloud and agents that counts its own mutating calls.
    pub fn options_counted(&self) -> (CloudOptions<Audited>, Arc<std::sync::atomic::AtomicU64>) {
        let mutations: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let provider = Arc::new(Audited {
            mutations: Arc::clone(&mutations),
            ..(*self.provider).clone()
        });
        let mut options = CloudOptions::new(provider);
        options.clock = Arc::clone(&self.clock);
        (options, mutations)
    }

    /// Sets how many pods a node wants.
    pub fn set_pods(&self, name: &str, want: u64) {
        {
            let mut state = self.agents.lock().unwrap();
            state.nodes.get_mut(&node(name)).unwrap().want = want;
            state.dirty.insert(node(name));
        }
        self.poke.notify_one();
    }

    pub fn agent(&self, name: &str) -> AgentNode {
        self.agents.lock().unwrap().nodes[&node(name)].clone()
    }

    /// The agents: one task watching the whole prefix from revision 1, applying `interfaces/`
    /// and `release/` events to each node's model, then answering handshakes, placing pods
    /// and writing demand (only on change) for the nodes touched.
    async fn start_agents(&mut self) {
        let kv = self.kv.clone();
        let agents = Arc::clone(&self.agents);
        let poke = Arc::clone(&self.poke);
        let mut watch = kv.watch(keys().prefix().as_bytes(), 1).await.unwrap();
        self.agent_task = Some(tokio::spawn(async move {
            loop {
                let mut touched: BTreeSet<NodeName> = BTreeSet::new();
                let events = tokio::select! {
                    batch = watch.next() => match batch {
                        Ok(events) => events,
                        Err(_) => return,
                    },
                    () = poke.notified() => {
                        touched.extend(std::mem::take(&mut agents.lock().unwrap().dirty));
                        Vec::new()
                    }
                };
                {
                    let mut state = agents.lock().unwrap();
                    for event in &events {
                        let key = String::from_utf8_lossy(event.key()).into_owned();
                        let Ok(parsed) = keys().parse(&key) else {
                            continue;
                        };
                        match (parsed, event) {
                            (Key::CloudInterface { node, interface }, Event::Put(kv)) => {
                                if let Some(agent) = state.nodes.get_mut(&node)
                                    && let Ok(record) =
                                        decode_value::<CloudInterfaceRecord>(&kv.value)
                                {
                                    agent.records.insert(
                                        interface.to_string(),
                                        (kv.create_revision, record),
                                    );
                                    touched.insert(node);
                                }
                            }
                            (Key::CloudInterface { node, interface }, Event::Delete { .. }) => {
                                if let Some(agent) = state.nodes.get_mut(&node) {
                                    agent.records.remove(interface.as_str());
                                    touched.insert(node);
                                }
                            }
                            (Key::Release { node, cidr, .. }, Event::Put(kv)) => {
                                if let Some(agent) = state.nodes.get_mut(&node)
                                    && let Ok(record) = decode_value::<ReleaseRecord>(&kv.value)
                                {
                                    agent.releases.insert(cidr, (kv.mod_revision, record));
                                    touched.insert(node);
                                }
                            }
                            (Key::Release { node, cidr, .. }, Event::Delete { .. }) => {
                                if let Some(agent) = state.nodes.get_mut(&node) {
                                    agent.releases.remove(&cidr);
                                    touched.insert(node);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                for name in touched {
                    step_agent(&kv, &agents, &name).await;
                }
            }
        }));
    }
}

/// One agent's step: forget surrendered entries no longer recorded, take back those whose
/// release key went while recorded, answer marks (`refused` if a pod holds an address of the
/// entry, else surrender and `ready`), place wanted pods on free addresses (lowest first) and
/// drop extra ones (highest first), then write demand if it changed.
async fn step_agent(kv: &MemKv, agents: &Agents, name: &NodeName) {
    let mut answers: Vec<(IpNet, i64, ReleaseRecord)> = Vec::new();
    let demand = {
        let mut state = agents.lock().unwrap();
        let Some(agent) = state.nodes.get_mut(name) else {
            return;
        };
        let recorded: BTreeSet<IpNet> = agent
            .records
            .values()
            .flat_map(|(_, r)| r.addresses.iter().copied())
            .collect();
        let releases = agent.releases.clone();
        agent
            .surrendered
            .retain(|e| recorded.contains(e) && releases.contains_key(e));
        for (entry, (revision, record)) in &releases {
            if record.state != ReleaseState::Marked {
                continue;
            }
            let in_use = AgentNode::addresses(entry)
                .iter()
                .any(|a| agent.pods.contains(a));
            let mut answer = record.clone();
            answer.answered_ms = 1;
            if in_use || !recorded.contains(entry) {
                answer.state = ReleaseState::Refused;
                answer.reason = Some("in use".into());
            } else {
                agent.surrendered.insert(*entry);
                answer.state = ReleaseState::Ready;
            }
            answers.push((*entry, *revision, answer));
        }
        // Pods: a pod keeps its address while the entry is recorded.
        let served: BTreeSet<IpAddr> = agent
            .entries()
            .iter()
            .flat_map(AgentNode::addresses)
            .collect();
        let lost: Vec<IpAddr> = agent
            .pods
            .iter()
            .filter(|a| !served.contains(a))
            .copied()
            .collect();
        if !lost.is_empty() {
            state
                .violations
                .push(format!("{name}: pods lost their addresses {lost:?}"));
        }
        let agent = state.nodes.get_mut(name).unwrap();
        while (agent.pods.len() as u64) > agent.want {
            let last = *agent.pods.iter().next_back().unwrap();
            agent.pods.remove(&last);
        }
        let mut free = agent.free();
        free.sort();
        for address in free {
            if agent.pods.len() as u64 >= agent.want {
                break;
            }
            agent.pods.insert(address);
        }
        let demand = agent.demand();
        if agent.written.as_ref() == Some(&demand) {
            None
        } else {
            agent.written = Some(demand.clone());
            Some(demand)
        }
    };
    for (entry, revision, answer) in answers {
        let key = keys().release(name, &pods(), Family::V4, &entry);
        let _ = kv
            .txn(Txn {
                compares: vec![Compare::modified_at(key.clone(), revision)],
                success: vec![TxnOp::put(key, encode_value(&answer).unwrap())],
                failure: vec![],
            })
            .await;
    }
    if let Some(demand) = demand {
        let record = DemandRecord {
            ipv4: Some(demand),
            ipv6: None,
            at_ms: 0,
        };
        put(
            kv,
            &keys().demand(name, &pods()),
            &encode_value(&record).unwrap(),
        )
        .await;
    }
}

impl Rig {
    /// The end-of-scenario invariants: `check` on the store; no address on two interfaces in
    /// the cloud's truth; no unassign of an address a pod held; every pod's address on an
    /// interface attached to its node's instance.
    pub async fn assert_invariants(&self) {
        super::assert_consistent(&self.kv).await;
        // The records against the cloud's truth (`corral_cluster::cloud_problems`).
        let truth: corral_cluster::CloudTruth = self
            .ec2
            .interfaces()
            .into_iter()
            .map(|ni| {
                let attached = ni.attachment.as_ref().map(|a| a.instance_id.clone());
                let nets = ni
                    .secondary_ipv4
                    .iter()
                    .map(|a| IpNet::from(IpAddr::V4(*a)))
                    .chain(ni.ipv4_prefixes.iter().map(|p| IpNet::V4(*p)))
                    .chain(
                        ni.ipv6_addresses
                            .iter()
                            .map(|a| IpNet::from(IpAddr::V6(*a))),
                    )
                    .chain(ni.ipv6_prefixes.iter().map(|p| IpNet::V6(*p)))
                    .collect();
                (ni.id, (attached, nets))
            })
            .collect();
        let problems =
            corral_cluster::cloud_problems(&keys(), &super::entries(&self.kv).await, &truth);
        assert!(
            problems.is_empty(),
            "records against the cloud: {problems:#?}"
        );
        let mut owner: HashMap<IpNet, String> = HashMap::new();
        let interfaces = self.ec2.interfaces();
        for ni in &interfaces {
            let nets = ni
                .secondary_ipv4
                .iter()
                .map(|a| IpNet::from(IpAddr::V4(*a)))
                .chain(ni.ipv4_prefixes.iter().map(|p| IpNet::V4(*p)))
                .chain(std::iter::once(IpNet::from(IpAddr::V4(ni.primary_ipv4))));
            for net in nets {
                if let Some(other) = owner.insert(net, ni.id.clone()) {
                    panic!("{net} on two interfaces: {other} and {}", ni.id);
                }
            }
        }
        let state = self.agents.lock().unwrap();
        assert!(
            state.violations.is_empty(),
            "violations: {:#?}",
            state.violations
        );
        for (name, agent) in &state.nodes {
            let instance = &self.instances[name.as_str()];
            let on_instance: BTreeSet<IpAddr> = interfaces
                .iter()
                .filter(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == *instance)
                })
                .flat_map(|ni| {
                    ni.secondary_ipv4
                        .iter()
                        .map(|a| IpAddr::V4(*a))
                        .chain(
                            ni.ipv4_prefixes
                                .iter()
                                .flat_map(|p| p.hosts_all().map(IpAddr::V4)),
                        )
                        .collect::<Vec<_>>()
                })
                .collect();
            for pod in &agent.pods {
                assert!(
                    on_instance.contains(pod),
                    "{name}: pod address {pod} is on no interface of {instance}"
                );
            }
        }
    }

    /// Free addresses each agent reports.
    pub fn free_of(&self, name: &str) -> u64 {
        self.agent(name).demand().free
    }
}

/// Waits (in virtual time, polling every `step`) until `done` holds; panics after `limit`.
/// Answers the virtual time it took, to within `step`.
pub async fn wait_every(
    what: &str,
    limit: Duration,
    step: Duration,
    mut done: impl FnMut() -> bool,
) -> Duration {
    let started = tokio::time::Instant::now();
    loop {
        if done() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "not within {limit:?} of virtual time: {what}"
        );
        tokio::time::sleep(step).await;
    }
}
