//! The cloud scenarios' harness: a `FakeEc2` behind `Audited` (which records every unassign and
//! checks it against the pods the agents hold at that moment), agents played by the test by
//! the protocol (register with an instance ID, serve the attached `interfaces/` records'
//! addresses, hold pods, report demand, answer release handshakes), a clock on virtual time,
//! and the end-of-scenario invariants.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cloud::fake::{InstanceSpec, SubnetSpec};
use corral_cloud::{
    Action, AttachInterface, CloudError, CloudProvider, CreateInterface, FakeEc2, Ipv4Assign,
    Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Tags,
};
use corral_cluster::{
    CloudAttachment, CloudInterfaceRecord, DemandRecord, Family, FamilyDemand, IpNet, Key,
    NodeName, NodeRecord, PoolName, ReleaseRecord, ReleaseState, decode_value, encode_value,
};
use corral_kv::{Compare, Event, Kv, MemKv, Txn, TxnOp};
use corral_operator::{CloudOptions, WallClock};

use super::{Replica, keys, node, put, under, wait_leading, wait_until};

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

/// Subnet `id` of the VPC in the zone, IPv4 `cidr`.
pub fn zone_subnet(id: &str, cidr: &str) -> SubnetSpec {
    SubnetSpec::new(id, VPC, ZONE, cidr.parse().unwrap())
}

/// A dual-stack pool `pods` kept in step with the cloud (`sync`: `from-cloud`, `to-cloud`):
/// IPv4 /`v4_len`s of `v4`, IPv6 /80s of `v6`, and `v6_lines` more in its `[pools.ipv6]`.
pub fn synced_config(
    sync: &str,
    quarantine_secs: u64,
    (v4, v4_len): (&str, u8),
    v6: &str,
    v6_lines: &str,
) -> String {
    format!(
        r#"
quarantine_secs = {quarantine_secs}
[[pools]]
name = "pods"
cloud_sync = "{sync}"
[pools.ipv4]
cidrs = ["{v4}"]
node_prefix_len = {v4_len}
[pools.ipv6]
cidrs = ["{v6}"]
node_prefix_len = 80
{v6_lines}"#
    )
}

/// The fake with a dual-stack `subnet-a`: IPv4 10.0.0.0/18, IPv6 `v6`.
pub fn dual_stack_fake(seed: u64, v6: &str) -> FakeEc2 {
    FakeEc2::builder()
        .seed(seed)
        .subnet(zone_subnet("subnet-a", "10.0.0.0/18").ipv6(v6.parse().unwrap()))
        .build()
        .unwrap()
}

/// What the agents hold, shared with `Audited`.
#[derive(Default, Debug)]
pub struct AgentState {
    pub nodes: BTreeMap<NodeName, AgentNode>,
    /// Unassigns of an address a pod held at that moment, or that its agent still served
    /// (not surrendered in a handshake).
    pub violations: Vec<String>,
    /// Every unassign: (interface, address).
    pub unassigned: Vec<(String, IpNet)>,
    /// Every unassign with what the agents knew of it then.
    pub unassign_log: Vec<UnassignEntry>,
    /// Every mutating call answered `ok`, in order.
    pub calls: Vec<CallEntry>,
    /// Nodes the test changed (pods wanted, registered): stepped on the next poke.
    pub dirty: BTreeSet<NodeName>,
    /// Every interface deleted: (interface, when, its creation tag, whether a `interfaces/`
    /// record named it then is not known here: the test checks the store).
    pub deleted: Vec<Deleted>,
    /// Creates applied whose caller never heard back (a crash between create and attach).
    pub hung: Vec<String>,
    /// The families of the pool the agents serve (empty: IPv4 only).
    pub families: Vec<Family>,
}

/// A mutating call the cloud answered `ok`.
#[derive(Debug, Clone)]
pub struct CallEntry {
    pub at_ms: u64,
    pub action: Action,
    /// The interface it names (a create: the new interface).
    pub interface: String,
    /// The addresses it assigned or unassigned.
    pub nets: Vec<IpNet>,
}

/// An unassign as `Audited` saw it.
#[derive(Debug, Clone)]
pub struct UnassignEntry {
    pub at_ms: u64,
    pub interface: String,
    pub net: IpNet,
    /// The node whose agent's records list the address, if any.
    pub node: Option<NodeName>,
    /// Whether that agent had surrendered it (answered `ready`).
    pub ready: bool,
    /// When the operator marked it (the release key's `marked_ms`), if a key was open.
    pub marked_ms: Option<u64>,
}

/// An interface deletion as `Audited` saw it.
#[derive(Debug, Clone)]
pub struct Deleted {
    pub interface: String,
    pub at_ms: u64,
    pub created_ms: Option<u64>,
    pub node_tag: Option<String>,
}

/// One demand an agent wrote, per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemandSample {
    pub at_ms: u64,
    pub family: Family,
    pub used: u64,
    pub free: u64,
    pub pending: u64,
    /// What the operator counts as available: the recorded entries (attaching interfaces'
    /// too) not surrendered.
    pub held: u64,
}

/// One node's agent.
#[derive(Default, Debug, Clone)]
pub struct AgentNode {
    /// `interfaces/` records: interface → (create revision, record).
    pub records: BTreeMap<String, (i64, CloudInterfaceRecord)>,
    /// Pods wanted on the node (each has an address of every family of the pool).
    pub want: u64,
    /// Addresses held by pods, every family (a dual-stack pod holds two).
    pub pods: BTreeSet<IpAddr>,
    /// Entries surrendered in a handshake (answered `ready`).
    pub surrendered: BTreeSet<IpNet>,
    /// Open release keys: entry → (mod revision, record).
    pub releases: BTreeMap<IpNet, (i64, ReleaseRecord)>,
    /// The last IPv4 demand written.
    pub written: Option<FamilyDemand>,
    /// The last IPv6 demand written.
    pub written_v6: Option<FamilyDemand>,
    /// The families of the pool (empty: IPv4 only).
    pub families: Vec<Family>,
    /// Every demand written, per family.
    pub history: Vec<DemandSample>,
}

/// The family of an address or prefix.
pub fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// Takes `net` off `interface` behind corral's back, as someone at the console would: a /32 or
/// /128 as a secondary address, anything shorter as a delegated prefix.
pub async fn unassign_out_of_band(ec2: &FakeEc2, interface: &str, net: IpNet) {
    let (v4, v6) = corral_cloud::sets_of(&[net]);
    if v4.is_empty() {
        ec2.unassign_ipv6(interface, &v6).await
    } else {
        ec2.unassign_ipv4(interface, &v4).await
    }
    .unwrap();
}

/// Addresses an entry holds (a /80: 2^48).
fn units(net: &IpNet) -> u64 {
    corral_cluster::cloud::units(net)
}

/// The first and last address of an entry.
fn bounds(net: &IpNet) -> (IpAddr, IpAddr) {
    match net {
        IpNet::V4(n) => (IpAddr::V4(n.network()), IpAddr::V4(n.broadcast())),
        IpNet::V6(n) => (IpAddr::V6(n.network()), IpAddr::V6(n.broadcast())),
    }
}

/// The `i`-th address of an entry.
fn nth(net: &IpNet, i: u64) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(std::net::Ipv4Addr::from(
            u32::from(n.network()).wrapping_add(i as u32),
        )),
        IpNet::V6(n) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(n.network()).wrapping_add(u128::from(i)),
        )),
    }
}

impl AgentNode {
    /// The families the node's pool has.
    pub fn families(&self) -> Vec<Family> {
        if self.families.is_empty() {
            vec![Family::V4]
        } else {
            self.families.clone()
        }
    }

    /// Entries the agent serves: those of attached records, IPv4.
    pub fn entries(&self) -> Vec<IpNet> {
        self.entries_of(Family::V4)
    }

    /// Entries the agent serves in `family`: those of attached records.
    pub fn entries_of(&self, family: Family) -> Vec<IpNet> {
        self.records
            .values()
            .filter(|(_, r)| r.attachment == CloudAttachment::Attached)
            .flat_map(|(_, r)| r.addresses.iter().copied())
            .filter(|n| family_of(n) == family)
            .collect()
    }

    /// Addresses the records list in `family`, attaching interfaces' too (what the operator
    /// counts as held; a /80 counts 2^48).
    pub fn held_of(&self, family: Family) -> u64 {
        self.records
            .values()
            .flat_map(|(_, r)| r.addresses.iter())
            .filter(|n| family_of(n) == family)
            .fold(0u64, |s, e| s.saturating_add(units(e)))
    }

    fn usable_entries(&self, family: Family) -> Vec<IpNet> {
        let mut usable: Vec<IpNet> = self
            .entries_of(family)
            .into_iter()
            .filter(|e| !self.surrendered.contains(e) && !self.releases.contains_key(e))
            .collect();
        usable.sort();
        usable
    }

    /// Pods holding an address of `entry`.
    fn pods_in(&self, entry: &IpNet) -> u64 {
        let (first, last) = bounds(entry);
        self.pods.range(first..=last).count() as u64
    }

    /// Pods of `family` (the pod count, in a single family).
    pub fn pods_of(&self, family: Family) -> u64 {
        self.pods_in(&space(family))
    }

    fn demand(&self) -> FamilyDemand {
        self.demand_of(Family::V4)
    }

    /// The demand the agent reports for `family`.
    pub fn demand_of(&self, family: Family) -> FamilyDemand {
        let usable = self.usable_entries(family);
        let used = self.pods_of(family);
        let free = usable
            .iter()
            .fold(0u64, |s, e| s.saturating_add(units(e) - self.pods_in(e)));
        let mut empty: Vec<IpNet> = usable
            .iter()
            .filter(|e| self.pods_in(e) == 0)
            .copied()
            .collect();
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

    /// Drops pods beyond `want` in `family` (highest address first) and places wanted ones on
    /// free addresses (lowest first).
    fn place(&mut self, family: Family) {
        let mut count = self.pods_of(family);
        while count > self.want {
            let (first, last) = bounds(&space(family));
            let highest = *self.pods.range(first..=last).next_back().unwrap();
            self.pods.remove(&highest);
            count -= 1;
        }
        if count >= self.want {
            return;
        }
        'entries: for entry in self.usable_entries(family) {
            let size = units(&entry);
            let mut i = 0u64;
            while i < size {
                if count >= self.want {
                    break 'entries;
                }
                let address = nth(&entry, i);
                if self.pods.insert(address) {
                    count += 1;
                }
                i += 1;
            }
        }
    }
}

/// The whole address space of a family (`0.0.0.0/0`, `::/0`).
fn space(family: Family) -> IpNet {
    match family {
        Family::V4 => IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::UNSPECIFIED, 0).unwrap()),
        Family::V6 => IpNet::V6(ipnet::Ipv6Net::new(std::net::Ipv6Addr::UNSPECIFIED, 0).unwrap()),
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
    /// Checks an unassign against the agents: no pod holds an address of it, and the agent
    /// serving it surrendered it (answered `ready`).
    fn audit(&self, interface: &str, nets: Vec<IpNet>) {
        let at_ms = (self.clock)();
        let mut state = self.agents.lock().unwrap();
        for net in nets {
            state.unassigned.push((interface.to_owned(), net));
            let held: Vec<String> = state
                .nodes
                .iter()
                .filter(|(_, n)| n.pods_in(&net) > 0)
                .map(|(name, _)| name.to_string())
                .collect();
            if !held.is_empty() {
                state.violations.push(format!(
                    "{net} unassigned from {interface} while a pod of {held:?} holds it"
                ));
            }
            let serving = state.nodes.iter().find(|(_, n)| {
                n.records
                    .get(interface)
                    .is_some_and(|(_, r)| r.addresses.contains(&net))
            });
            let entry = UnassignEntry {
                at_ms,
                interface: interface.to_owned(),
                net,
                node: serving.map(|(name, _)| name.clone()),
                ready: serving.is_some_and(|(_, n)| n.surrendered.contains(&net)),
                marked_ms: serving
                    .and_then(|(_, n)| n.releases.get(&net))
                    .map(|(_, r)| r.marked_ms),
            };
            if let Some(node) = &entry.node
                && !entry.ready
            {
                state.violations.push(format!(
                    "{net} unassigned from {interface} while {node}'s agent serves it (not surrendered)"
                ));
            }
            state.unassign_log.push(entry);
        }
    }

    /// Logs a mutating call the cloud answered `ok`.
    fn log(&self, action: Action, interface: &str, nets: Vec<IpNet>) {
        let at_ms = (self.clock)();
        self.agents.lock().unwrap().calls.push(CallEntry {
            at_ms,
            action,
            interface: interface.to_owned(),
            nets,
        });
    }
}

/// An interface's secondary addresses and prefixes, both families (not the primary).
pub fn nets_of(ni: &NetworkInterface) -> Vec<IpNet> {
    ni.secondary_nets()
}

/// The describe calls of a `CloudProvider` that wraps another (`self.$inner`), passed on
/// unchanged.
macro_rules! forward_describes {
    ($inner:ident) => {
        async fn describe_instance(
            &self,
            id: &str,
        ) -> Result<corral_cloud::Instance, corral_cloud::CloudError> {
            self.$inner.describe_instance(id).await
        }
        async fn describe_instance_types(
            &self,
            types: &[String],
        ) -> Result<Vec<corral_cloud::InstanceTypeInfo>, corral_cloud::CloudError> {
            self.$inner.describe_instance_types(types).await
        }
        async fn describe_subnets(
            &self,
            filter: &corral_cloud::SubnetFilter,
        ) -> Result<Vec<corral_cloud::Subnet>, corral_cloud::CloudError> {
            self.$inner.describe_subnets(filter).await
        }
        async fn describe_interfaces(
            &self,
            filter: &corral_cloud::InterfaceFilter,
        ) -> Result<Vec<corral_cloud::NetworkInterface>, corral_cloud::CloudError> {
            self.$inner.describe_interfaces(filter).await
        }
    };
}
// Only the test binaries that wrap a provider of their own use it.
#[allow(unused_imports)]
pub(crate) use forward_describes;

impl CloudProvider for Audited {
    forward_describes!(ec2);
    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        self.mutation();
        let created = self.ec2.create_interface(request).await?;
        self.log(
            Action::CreateNetworkInterface,
            &created.id,
            nets_of(&created),
        );
        if self.hang_creates.load(std::sync::atomic::Ordering::SeqCst) {
            self.agents.lock().unwrap().hung.push(created.id.clone());
            std::future::pending::<()>().await;
        }
        Ok(created)
    }
    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        self.mutation();
        let attached = self.ec2.attach_interface(request).await?;
        self.log(
            Action::AttachNetworkInterface,
            request.interface_id,
            Vec::new(),
        );
        Ok(attached)
    }
    async fn detach_interface(&self, attachment: &str, force: bool) -> Result<(), CloudError> {
        self.mutation();
        self.ec2.detach_interface(attachment, force).await?;
        self.log(Action::DetachNetworkInterface, attachment, Vec::new());
        Ok(())
    }
    async fn delete_interface(&self, interface: &str) -> Result<(), CloudError> {
        self.mutation();
        let truth = self.ec2.interface(interface);
        let result = self.ec2.delete_interface(interface).await;
        if result.is_ok() {
            self.log(Action::DeleteNetworkInterface, interface, Vec::new());
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
        let nets = assigned.nets();
        self.log(Action::AssignPrivateIpAddresses, interface, nets);
        if self.hang_assigns.load(std::sync::atomic::Ordering::SeqCst) {
            self.agents.lock().unwrap().hung.push(interface.to_owned());
            std::future::pending::<()>().await;
        }
        Ok(assigned)
    }
    async fn unassign_ipv4(&self, interface: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.mutation();
        let nets: Vec<IpNet> = release.nets();
        self.audit(interface, nets.clone());
        self.ec2.unassign_ipv4(interface, release).await?;
        self.log(Action::UnassignPrivateIpAddresses, interface, nets);
        let lost = self.timeout_unassigns.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        if lost.is_ok() {
            return Err(CloudError::Timeout {
                action: Action::UnassignPrivateIpAddresses,
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
        let assigned = self.ec2.assign_ipv6(interface, request).await?;
        let nets = assigned.nets();
        self.log(Action::AssignIpv6Addresses, interface, nets);
        Ok(assigned)
    }
    async fn unassign_ipv6(&self, interface: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.mutation();
        let nets: Vec<IpNet> = release.nets();
        self.audit(interface, nets.clone());
        self.ec2.unassign_ipv6(interface, release).await?;
        self.log(Action::UnassignIpv6Addresses, interface, nets);
        Ok(())
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
        .subnet(zone_subnet("subnet-a", "10.0.0.0/18"))
        .subnet(zone_subnet("subnet-b", "10.0.64.0/20"))
}

/// The VPC's IPv6 CIDR (a /56) and the subnets' /64s in it (dual-stack scenarios).
pub const VPC_V6: &str = "2600:1f14:ab:cd00::/56";
pub const SUBNET_A_V6: &str = "2600:1f14:ab:cd01::/64";
pub const SUBNET_B_V6: &str = "2600:1f14:ab:cd02::/64";

/// A dual-stack cloud pool `pods`: [`cloud_config`] with the VPC's IPv6 /56 beside its IPv4.
pub fn cloud_config_dual(pool_lines: &str, cloud_lines: &str) -> String {
    format!(
        "{}[pools.ipv6]\ncidrs = [\"{VPC_V6}\"]\n",
        cloud_config(pool_lines, cloud_lines)
    )
}

/// [`fake_builder`]'s subnets with IPv6 /64s ([`SUBNET_A_V6`], [`SUBNET_B_V6`]).
pub fn fake_builder_dual(seed: u64) -> corral_cloud::fake::FakeEc2Builder {
    FakeEc2::builder()
        .seed(seed)
        .subnet(zone_subnet("subnet-a", "10.0.0.0/18").ipv6(SUBNET_A_V6.parse().unwrap()))
        .subnet(zone_subnet("subnet-b", "10.0.64.0/20").ipv6(SUBNET_B_V6.parse().unwrap()))
}

/// A scenario's set-up in one expression: the pool's lines, its `[pools.cloud]` lines, the
/// families, the fake's seed (or a whole builder), and the nodes; `build` gives the rig,
/// `start` the rig and a leading replica `op-a`.
pub struct Scenario {
    pool_lines: String,
    cloud_lines: String,
    dual_stack: bool,
    seed: u64,
    fake: Option<corral_cloud::fake::FakeEc2Builder>,
    nodes: Vec<(String, String)>,
}

impl Scenario {
    /// A pool with no extra lines, the fake seeded with `seed`, no nodes.
    pub fn new(seed: u64) -> Scenario {
        Scenario {
            pool_lines: String::new(),
            cloud_lines: String::new(),
            dual_stack: false,
            seed,
            fake: None,
            nodes: Vec::new(),
        }
    }

    /// Lines of the pool's table (e.g. `release_delay_secs = 10\n[pools.watermarks]\n...`).
    pub fn pool(mut self, lines: &str) -> Scenario {
        self.pool_lines = lines.to_owned();
        self
    }

    /// Lines of `[pools.cloud]`.
    pub fn cloud(mut self, lines: &str) -> Scenario {
        self.cloud_lines = lines.to_owned();
        self
    }

    /// IPv6 beside IPv4: the pool gets the VPC's /56, the fake's subnets their /64s.
    pub fn dual_stack(mut self) -> Scenario {
        self.dual_stack = true;
        self
    }

    /// The fake from this builder (its own subnets) instead of the seeded default.
    pub fn fake(mut self, builder: corral_cloud::fake::FakeEc2Builder) -> Scenario {
        self.fake = Some(builder);
        self
    }

    /// `n` nodes `node-0000`... of `instance_type`.
    pub fn nodes(mut self, n: usize, instance_type: &str) -> Scenario {
        self.nodes = (0..n)
            .map(|i| (format!("node-{i:04}"), instance_type.to_owned()))
            .collect();
        self
    }

    /// These nodes (name, instance type).
    pub fn named(mut self, nodes: &[(String, &str)]) -> Scenario {
        self.nodes = nodes
            .iter()
            .map(|(n, t)| (n.clone(), (*t).to_owned()))
            .collect();
        self
    }

    /// The configuration written to the store.
    pub fn config(&self) -> String {
        if self.dual_stack {
            cloud_config_dual(&self.pool_lines, &self.cloud_lines)
        } else {
            cloud_config(&self.pool_lines, &self.cloud_lines)
        }
    }

    /// The rig: the store, the fake, the agents registered.
    pub async fn build(self) -> Rig {
        let config = self.config();
        let builder = match self.fake {
            Some(builder) => builder,
            None if self.dual_stack => fake_builder_dual(self.seed),
            None => fake_builder(self.seed),
        };
        let nodes: Vec<(String, &str)> = self
            .nodes
            .iter()
            .map(|(n, t)| (n.clone(), t.as_str()))
            .collect();
        Rig::new(&config, builder.build().unwrap(), &nodes).await
    }

    /// The rig with the fake's counters at zero, and a replica `op-a` leading on it since the
    /// instant answered.
    pub async fn start_counted(self) -> (Rig, Replica, tokio::time::Instant) {
        let rig = self.build().await;
        rig.ec2.reset_counters();
        let started = tokio::time::Instant::now();
        let replica = rig.start_leader("op-a").await;
        (rig, replica, started)
    }

    /// The rig and a replica `op-a` leading on it.
    pub async fn start(self) -> (Rig, Replica) {
        let rig = self.build().await;
        let replica = rig.start_leader("op-a").await;
        (rig, replica)
    }
}

impl Rig {
    /// The store with `config`, the fake, and agents for `nodes` (name, instance type), each
    /// launched in `subnet-a` and registered with its instance ID.
    pub async fn new(config: &str, ec2: FakeEc2, nodes: &[(String, &str)]) -> Rig {
        let kv = MemKv::new();
        super::init(&kv, config).await;
        let agents: Agents = Arc::default();
        agents.lock().unwrap().families = corral_cluster::ClusterConfig::from_toml(config)
            .ok()
            .and_then(|c| {
                c.pools
                    .iter()
                    .find(|p| p.name == pods())
                    .map(|p| p.families().map(|(f, _)| f).collect())
            })
            .unwrap_or_default();
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
            let families = state.families.clone();
            state.nodes.insert(
                node(name),
                AgentNode {
                    families,
                    ..AgentNode::default()
                },
            );
            state.dirty.insert(node(name));
        }
        let record = NodeRecord {
            uid: format!("uid-{name}"),
            addresses: vec![],
            registered_ms: 0,
            instance_id: Some(instance.clone()),
            max_pods: None,
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
        let clock = Arc::clone(&self.clock);
        let mut watch = kv.watch(keys().prefix().as_bytes(), 1).await.unwrap();
        self.agent_task = Some(tokio::spawn(async move {
            loop {
                let mut touched: BTreeSet<NodeName> = BTreeSet::new();
                // In a fixed order (`biased`), so a seeded run repeats itself.
                let events = tokio::select! {
                    biased;
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
                    step_agent(&kv, &agents, &name, clock()).await;
                }
            }
        }));
    }
}

/// One agent's step: forget surrendered entries no longer recorded, take back those whose
/// release key went while recorded, answer marks (`refused` if a pod holds an address of the
/// entry, else surrender and `ready`), place wanted pods on free addresses (lowest first) and
/// drop extra ones (highest first), in every family of the pool, then write demand if it
/// changed.
async fn step_agent(kv: &MemKv, agents: &Agents, name: &NodeName, now_ms: u64) {
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
            let in_use = agent.pods_in(entry) > 0;
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
        let served: Vec<IpNet> = Family::ALL
            .into_iter()
            .flat_map(|f| agent.entries_of(f))
            .collect();
        let lost: Vec<IpAddr> = agent
            .pods
            .iter()
            .filter(|a| !served.iter().any(|e| e.contains(*a)))
            .copied()
            .collect();
        if !lost.is_empty() {
            state
                .violations
                .push(format!("{name}: pods lost their addresses {lost:?}"));
        }
        let agent = state.nodes.get_mut(name).unwrap();
        let families = agent.families();
        for family in &families {
            agent.place(*family);
        }
        let mut record = DemandRecord::default();
        let mut changed = false;
        for family in families {
            let demand = agent.demand_of(family);
            let written = match family {
                Family::V4 => &mut agent.written,
                Family::V6 => &mut agent.written_v6,
            };
            if written.as_ref() != Some(&demand) {
                changed = true;
                *written = Some(demand.clone());
                let surrendered = agent
                    .surrendered
                    .iter()
                    .filter(|e| family_of(e) == family)
                    .fold(0u64, |s, e| s.saturating_add(units(e)));
                agent.history.push(DemandSample {
                    at_ms: now_ms,
                    family,
                    used: demand.used,
                    free: demand.free,
                    pending: demand.pending,
                    held: agent.held_of(family).saturating_sub(surrendered),
                });
            }
            match family {
                Family::V4 => record.ipv4 = Some(demand),
                Family::V6 => record.ipv6 = Some(demand),
            }
        }
        changed.then_some(record)
    };
    for (entry, revision, answer) in answers {
        let key = keys().release(name, &pods(), family_of(&entry), &entry);
        let _ = kv
            .txn(Txn {
                compares: vec![Compare::modified_at(key.clone(), revision)],
                success: vec![TxnOp::put(key, encode_value(&answer).unwrap())],
                failure: vec![],
            })
            .await;
    }
    if let Some(record) = demand {
        put(
            kv,
            &keys().demand(name, &pods()),
            &encode_value(&record).unwrap(),
        )
        .await;
    }
}

impl Rig {
    /// The end-of-scenario invariants: `check` on the store; the records against the cloud's
    /// truth (`cloud_problems`); no address or prefix on two interfaces in the cloud's truth
    /// (both families); no unassign of an address a pod held or its agent still served; no
    /// pod lost its address; every pod's address (both families) on an interface attached to
    /// its own node's instance.
    pub async fn assert_invariants(&self) {
        super::assert_consistent(&self.kv).await;
        // The records against the cloud's truth (`corral_cluster::cloud_problems`).
        let interfaces = self.ec2.interfaces();
        let truth: corral_cluster::CloudTruth = interfaces
            .iter()
            .map(|ni| {
                let attached = ni.attachment.as_ref().map(|a| a.instance_id.clone());
                (ni.id.clone(), (attached, nets_of(ni)))
            })
            .collect();
        let problems =
            corral_cluster::cloud_problems(&keys(), &super::entries(&self.kv).await, &truth);
        assert!(
            problems.is_empty(),
            "records against the cloud: {problems:#?}"
        );
        let mut owner: BTreeMap<IpNet, String> = BTreeMap::new();
        for ni in &interfaces {
            let primary = IpNet::from(IpAddr::V4(ni.primary_ipv4));
            for net in nets_of(ni).into_iter().chain(std::iter::once(primary)) {
                if let Some(other) = owner.insert(net, ni.id.clone()) {
                    panic!("{net} on two interfaces: {other} and {}", ni.id);
                }
            }
        }
        // Overlaps too (a prefix holding another interface's address): neighbours in order.
        let owned: Vec<(&IpNet, &String)> = owner.iter().collect();
        for pair in owned.windows(2) {
            let ((a, ia), (b, ib)) = (pair[0], pair[1]);
            assert!(
                !(a.contains(&b.network()) || b.contains(&a.network())),
                "{a} on {ia} overlaps {b} on {ib}"
            );
        }
        let state = self.agents.lock().unwrap();
        assert!(
            state.violations.is_empty(),
            "violations: {:#?}",
            state.violations
        );
        for (name, agent) in &state.nodes {
            let instance = &self.instances[name.as_str()];
            let on_instance: Vec<IpNet> = interfaces
                .iter()
                .filter(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == *instance)
                })
                .flat_map(nets_of)
                .collect();
            for pod in &agent.pods {
                assert!(
                    on_instance.iter().any(|n| n.contains(pod)),
                    "{name}: pod address {pod} is on no interface of {instance}"
                );
            }
        }
    }

    /// What a scenario ends with once quiet: no intent open, no corral interface left
    /// unattached, the records exactly the cloud's truth, and [`Rig::assert_invariants`].
    pub async fn assert_settled(&self) {
        assert!(intents(&self.kv).await.is_empty(), "intents left open");
        assert!(
            unattached_managed(self).is_empty(),
            "unattached corral interfaces: {:?}",
            unattached_managed(self)
        );
        assert_records_match_the_cloud(self).await;
        self.assert_invariants().await;
    }

    /// Free IPv4 addresses the agent reports.
    pub fn free_of(&self, name: &str) -> u64 {
        self.agent(name).demand().free
    }

    /// Whether `done` holds for every node's agent (one lock, no copies).
    pub fn all_agents(&self, done: impl Fn(&AgentNode) -> bool) -> bool {
        self.agents.lock().unwrap().nodes.values().all(done)
    }

    /// Starts an operator replica on the rig's cloud and waits until it leads.
    pub async fn start_leader(&self, name: &str) -> Replica {
        let replica = Replica::start_with_cloud(&self.kv, name, Some(self.options()));
        leads(&replica).await;
        replica
    }

    /// Waits (saying `what`, 120 s of virtual time at most) until `node`'s agent holds `n`
    /// entries.
    pub async fn wait_entries(&self, what: &str, node: &str, n: usize) {
        wait_soon(what, || self.agent(node).entries().len() == n).await;
    }

    /// Mutating calls the cloud received (answered or not).
    pub fn mutating_calls(&self) -> u64 {
        mutating_calls(self)
    }
}

/// A run's mutating calls judged against the agents' demand (`Rig::audit_calls`).
#[derive(Debug, Default)]
pub struct CallAudit {
    /// Calls answered `ok` before the warm-up's end, by action.
    pub warm_up: BTreeMap<&'static str, u64>,
    /// Calls answered `ok` from the warm-up's end on, by action.
    pub after: BTreeMap<&'static str, u64>,
    /// Entries unassigned from the warm-up's end on (trims).
    pub trimmed_after: usize,
    /// Entries unassigned in all.
    pub trimmed: usize,
    /// Growths within the release delay after an unassign on the same node, each justified
    /// by the node's pods rising beyond the allowed slack since.
    pub regrowths: usize,
    /// Marks whose release delay held a lapse of the excess shorter than [`SHORT_DIP_MS`]
    /// (unseen by the operator: it plans a node when its demand changes, but not while the
    /// node's own task runs, a mutation and its describe, or an attachment polled every 2 s;
    /// Cilium's rounds are a minute apart).
    pub short_dips: usize,
    /// Calls that break the rules (see `Rig::audit_calls`).
    pub problems: Vec<String>,
}

/// The longest lapse of a node's excess that its release delay may hold (see
/// [`CallAudit::short_dips`]).
pub const SHORT_DIP_MS: u64 = 5_000;

impl CallAudit {
    /// Calls after the warm-up, all actions.
    pub fn after_total(&self) -> u64 {
        self.after.values().sum()
    }
}

impl Rig {
    /// The node an interface is attached to now.
    pub fn node_of_interface(&self, interface: &str) -> Option<String> {
        let instance = self.ec2.interface(interface)?.attachment?.instance_id;
        self.instances
            .iter()
            .find(|(_, i)| **i == instance)
            .map(|(n, _)| n.clone())
    }

    /// Judges every mutating call in `family` against what the agents reported (their demand
    /// history) under the pool's rules, given as `excess` (what the pure rules count as
    /// excess for one demand sample: growing counts 0):
    ///
    /// - an unassign only of an entry its agent surrendered (`ready`), marked by the operator
    ///   after the node had been in excess for the whole release delay (every demand the
    ///   agent wrote in `[mark - delay, mark)`, and the one in force at `mark - delay`, counts
    ///   excess, but for lapses shorter than [`SHORT_DIP_MS`], counted in `short_dips`);
    /// - no unassign within the release delay after a growth (assign or create) of the node;
    /// - a growth within the release delay after an unassign of the node only when its pods
    ///   rose by more than `slack` since (what releasing down to the keep level leaves room
    ///   for: max-above-watermark under watermarks); anything less is a flap.
    ///
    /// Calls are split at `warm_end_ms` for the counts.
    pub fn audit_calls(
        &self,
        family: Family,
        warm_end_ms: u64,
        delay_ms: u64,
        slack: u64,
        excess: impl Fn(&DemandSample) -> u64,
    ) -> CallAudit {
        let state = self.agents.lock().unwrap();
        let mut audit = CallAudit::default();
        // Per node: growths and unassigns in time order.
        let mut growths: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut unassigns: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for call in &state.calls {
            let counts = if call.at_ms < warm_end_ms {
                &mut audit.warm_up
            } else {
                &mut audit.after
            };
            *counts.entry(call.action.as_str()).or_default() += 1;
            let in_family = call.nets.iter().any(|n| family_of(n) == family);
            let Some(node) = self.node_of_interface(&call.interface) else {
                continue;
            };
            match call.action {
                Action::CreateNetworkInterface
                | Action::AssignPrivateIpAddresses
                | Action::AssignIpv6Addresses
                    if in_family =>
                {
                    growths.entry(node).or_default().push(call.at_ms);
                }
                Action::UnassignPrivateIpAddresses | Action::UnassignIpv6Addresses if in_family => {
                    unassigns.entry(node).or_default().push(call.at_ms);
                }
                _ => {}
            }
        }
        let samples = |node: &str| -> Vec<DemandSample> {
            state
                .nodes
                .get(&super::node(node))
                .map(|a| {
                    a.history
                        .iter()
                        .filter(|s| s.family == family)
                        .copied()
                        .collect()
                })
                .unwrap_or_default()
        };
        for entry in state
            .unassign_log
            .iter()
            .filter(|e| family_of(&e.net) == family)
        {
            audit.trimmed += 1;
            if entry.at_ms >= warm_end_ms {
                audit.trimmed_after += 1;
            }
            let (Some(node), Some(marked)) = (&entry.node, entry.marked_ms) else {
                audit.problems.push(format!(
                    "{} unassigned at {} ms from {} with no agent's handshake",
                    entry.net, entry.at_ms, entry.interface
                ));
                continue;
            };
            if !entry.ready {
                audit.problems.push(format!(
                    "{} of {node} unassigned at {} ms without `ready`",
                    entry.net, entry.at_ms
                ));
            }
            let history = samples(node.as_str());
            let start = marked.saturating_sub(delay_ms);
            let in_force = history.iter().rev().find(|s| s.at_ms <= start);
            let window = history
                .iter()
                .filter(|s| s.at_ms > start && s.at_ms < marked);
            for sample in in_force.into_iter().chain(window) {
                if excess(sample) == 0 {
                    let until = history
                        .iter()
                        .find(|s| s.at_ms > sample.at_ms)
                        .map_or(u64::MAX, |s| s.at_ms);
                    if until - sample.at_ms < SHORT_DIP_MS {
                        audit.short_dips += 1;
                        continue;
                    }
                    audit.problems.push(format!(
                        "{} of {node} marked at {marked} ms though not in excess at {} ms \
                         for {} ms (within the release delay): {sample:?}",
                        entry.net,
                        sample.at_ms,
                        until - sample.at_ms
                    ));
                    break;
                }
            }
            if let Some(g) = growths.get(node.as_str()).and_then(|g| {
                g.iter()
                    .find(|t| **t <= entry.at_ms && entry.at_ms - **t < delay_ms)
            }) {
                audit.problems.push(format!(
                    "{} of {node} unassigned at {} ms, {} ms after a growth",
                    entry.net,
                    entry.at_ms,
                    entry.at_ms - g
                ));
            }
        }
        // Growths after an unassign within the delay: the pods must have risen beyond `slack`.
        for (node, times) in &unassigns {
            let history = samples(node);
            let used_around = |t: u64| -> Vec<u64> {
                let before = history
                    .iter()
                    .rev()
                    .find(|s| s.at_ms <= t.saturating_sub(2_000));
                before
                    .into_iter()
                    .chain(
                        history
                            .iter()
                            .filter(|s| s.at_ms > t.saturating_sub(2_000) && s.at_ms <= t),
                    )
                    .map(|s| s.used)
                    .collect()
            };
            for t_u in times {
                let Some(grown) = growths.get(node) else {
                    continue;
                };
                for t_g in grown.iter().filter(|t| **t > *t_u && **t - t_u < delay_ms) {
                    let low = used_around(*t_u).into_iter().min().unwrap_or(0);
                    let high = used_around(*t_g).into_iter().max().unwrap_or(0);
                    if high > low.saturating_add(slack) {
                        audit.regrowths += 1;
                    } else {
                        audit.problems.push(format!(
                            "{node} grew at {t_g} ms, {} ms after an unassign at {t_u} ms, its \
                             pods from {low} to {high} only (a flap)",
                            t_g - t_u
                        ));
                    }
                }
            }
        }
        audit
    }
}

/// `n` m5.large nodes named `node-0000`...
pub fn names(n: usize) -> Vec<(String, &'static str)> {
    names_padded(n, 4)
}

/// `n` m5.large nodes named `node-` and their index padded with zeros to `width` digits.
pub fn names_padded(n: usize, width: usize) -> Vec<(String, &'static str)> {
    (0..n)
        .map(|i| (format!("node-{i:0width$}"), "m5.large"))
        .collect()
}

/// Scenario 1's bounds, `what` of it done for `n` nodes in `took` of virtual time: within
/// 198 s, under 1% of the calls throttled; says what it took (the cloud's calls, its assigns,
/// how many it throttled) and answers the fake's counters.
pub fn scenario_1_bounds(
    rig: &Rig,
    what: &str,
    n: usize,
    took: Duration,
) -> corral_cloud::fake::Counters {
    let counters = rig.ec2.counters();
    let calls = counters.total_calls();
    let throttled = counters.total_throttled();
    let assigns = counters.calls(Action::AssignPrivateIpAddresses);
    eprintln!(
        "{what}: {n} nodes in {:.1} s virtual; {calls} calls ({assigns} assigns), {throttled} throttled ({:.2}%)",
        took.as_secs_f64(),
        100.0 * throttled as f64 / calls.max(1) as f64
    );
    assert!(took <= Duration::from_secs(198), "took {took:?}");
    assert!(throttled * 100 < calls, "{throttled} of {calls} throttled");
    counters
}

/// The primary interface (device index 0) of node `name`'s instance.
pub fn primary(rig: &Rig, name: &str) -> NetworkInterface {
    let instance = &rig.instances[name];
    rig.ec2
        .interfaces()
        .into_iter()
        .find(|ni| {
            ni.attachment
                .as_ref()
                .is_some_and(|a| a.instance_id == *instance && a.device_index == 0)
        })
        .expect("every instance has a primary interface")
}

/// etcd goes back in time (a restored snapshot: another cluster ID); waits until `leader`
/// sees the regression.
pub async fn regression_seen(rig: &Rig, leader: &Replica) {
    rig.kv.set_cluster_id(MemKv::CLUSTER_ID + 1);
    wait_until(
        "the regression is seen",
        Duration::from_secs(30),
        || async { leader.shared.regression_unsettled() },
    )
    .await;
}

/// Waits until the replica leads (30 s of virtual time at most).
pub async fn leads(replica: &Replica) {
    wait_leading(replica, Duration::from_secs(30)).await;
}

/// Mutating calls the fake received (answered or not).
pub fn mutating_calls(rig: &Rig) -> u64 {
    let counters = rig.ec2.counters();
    Action::ALL
        .iter()
        .filter(|a| a.is_mutating())
        .map(|a| counters.calls(*a))
        .sum()
}

/// The open intents in the store: id → record.
pub async fn intents(kv: &MemKv) -> Vec<(String, corral_cluster::CloudIntentRecord)> {
    under(kv, "intents/")
        .await
        .into_iter()
        .filter_map(|e| {
            let id = e.key_str().rsplit('/').next()?.to_owned();
            Some((id, decode_value(&e.value).ok()?))
        })
        .collect()
}

/// Every `interfaces/` record in the store: (node, interface, record).
pub async fn records(kv: &MemKv) -> Vec<(String, String, CloudInterfaceRecord)> {
    under(kv, "interfaces/")
        .await
        .into_iter()
        .filter_map(|e| {
            let key = e.key_str().into_owned();
            let mut parts = key.rsplit('/');
            let interface = parts.next()?.to_owned();
            let node = parts.next()?.to_owned();
            Some((node, interface, decode_value(&e.value).ok()?))
        })
        .collect()
}

/// Every recorded interface exists in the cloud's truth, attached to its node's instance at
/// the recorded index, with exactly the recorded addresses and prefixes of both families
/// (nothing assigned twice or lost).
pub async fn assert_records_match_the_cloud(rig: &Rig) {
    for (node, interface, record) in records(&rig.kv).await {
        let truth = rig
            .ec2
            .interface(&interface)
            .unwrap_or_else(|| panic!("{node}: recorded {interface} is not in the cloud"));
        let attachment = truth.attachment.as_ref().expect("recorded and attached");
        assert_eq!(attachment.instance_id, rig.instances[&node], "{interface}");
        assert_eq!(attachment.device_index, record.device_index, "{interface}");
        let mut held = nets_of(&truth);
        let mut recorded = record.addresses.clone();
        held.sort();
        recorded.sort();
        assert_eq!(held, recorded, "{node} {interface}: cloud vs record");
    }
}

/// Corral's interfaces in the cloud that are not attached: (id, node tag).
pub fn unattached_managed(rig: &Rig) -> Vec<(String, String)> {
    rig.ec2
        .interfaces()
        .into_iter()
        .filter(|ni| ni.tags.contains_key("corral.io/cluster") && ni.attachment.is_none())
        .map(|ni| {
            let node = ni.tags.get("corral.io/node").cloned().unwrap_or_default();
            (ni.id, node)
        })
        .collect()
}

/// [`wait_every`] with the bounds most waits here take: polling every 100 ms, for up to 120 s
/// of virtual time.
pub async fn wait_soon(what: &str, done: impl FnMut() -> bool) -> Duration {
    wait_every(
        what,
        Duration::from_secs(120),
        Duration::from_millis(100),
        done,
    )
    .await
}

/// [`wait_every`] with the bounds of the waits for a release (a delay, then the handshake):
/// polling every 500 ms, for up to 300 s of virtual time.
pub async fn wait_long(what: &str, done: impl FnMut() -> bool) -> Duration {
    wait_every(
        what,
        Duration::from_secs(300),
        Duration::from_millis(500),
        done,
    )
    .await
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
