//! The fake's resources and what each EC2 action does to them: subnets with their address pools,
//! instances, interfaces with their attachments, and the versions of each interface that
//! describe calls see (eventual consistency). Pure: every operation takes `now` and the random
//! source, and changes nothing when it refuses.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;

use super::pool::{FamilyPool, Ipv4Pool, Ipv6Pool, Refusal};
use crate::error::DEVICE_INDEX_IN_USE;
use crate::{
    Amount, AttachInterface, Attachment, AttachmentStatus, CloudError, CreateInterface, Instance,
    InstanceInterface, InstanceState, InstanceTypeInfo, InterfaceFilter, InterfaceStatus,
    Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, MacAddress, NetworkInterface, Subnet, SubnetFilter,
    Tags,
};

/// The most IPv4 (and IPv6) addresses an interface may hold while attached to nothing: the
/// largest per-interface limit of any type; the instance type's own limit applies on attach.
const UNATTACHED_LIMIT: u32 = 50;

/// A subnet of the fake.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FakeSubnet {
    pub(crate) id: String,
    pub(crate) vpc_id: String,
    pub(crate) zone: String,
    pub(crate) ipv4: Ipv4Pool,
    pub(crate) ipv4_cidr: Ipv4Net,
    pub(crate) ipv6: Option<Ipv6Pool>,
    pub(crate) tags: Tags,
}

/// An instance of the fake.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FakeInstance {
    pub(crate) id: String,
    pub(crate) instance_type: String,
    pub(crate) state: InstanceState,
    pub(crate) zone: String,
    pub(crate) vpc_id: String,
    pub(crate) subnet_id: String,
    pub(crate) tags: Tags,
}

/// An attachment as the fake keeps it: the times at which it completes, and at which its
/// detachment completes once asked.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FakeAttachment {
    id: String,
    instance_id: String,
    device_index: u32,
    delete_on_termination: bool,
    #[serde(with = "super::wall::instant")]
    attached_at: Instant,
    #[serde(with = "super::wall::instant_option")]
    detached_at: Option<Instant>,
}

impl FakeAttachment {
    fn is_active(&self, now: Instant) -> bool {
        self.detached_at.is_none_or(|done| now < done)
    }

    fn status(&self, now: Instant) -> AttachmentStatus {
        match self.detached_at {
            Some(done) if now >= done => AttachmentStatus::Detached,
            Some(_) => AttachmentStatus::Detaching,
            None if now < self.attached_at => AttachmentStatus::Attaching,
            None => AttachmentStatus::Attached,
        }
    }

    fn render(&self, now: Instant) -> Attachment {
        Attachment {
            id: self.id.clone(),
            instance_id: self.instance_id.clone(),
            device_index: self.device_index,
            status: self.status(now),
            delete_on_termination: self.delete_on_termination,
        }
    }
}

/// An interface as the fake keeps it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FakeInterface {
    id: String,
    subnet_id: String,
    vpc_id: String,
    zone: String,
    mac: MacAddress,
    description: String,
    security_groups: Vec<String>,
    tags: Tags,
    primary_ipv4: Ipv4Addr,
    secondary_ipv4: Vec<Ipv4Addr>,
    ipv4_prefixes: Vec<Ipv4Net>,
    ipv6_addresses: Vec<Ipv6Addr>,
    ipv6_prefixes: Vec<Ipv6Net>,
    attachment: Option<FakeAttachment>,
}

impl FakeInterface {
    fn active_attachment(&self, now: Instant) -> Option<&FakeAttachment> {
        self.attachment.as_ref().filter(|a| a.is_active(now))
    }

    fn ipv4_slots(&self) -> u32 {
        (1 + self.secondary_ipv4.len() + self.ipv4_prefixes.len()) as u32
    }

    fn ipv6_slots(&self) -> u32 {
        (self.ipv6_addresses.len() + self.ipv6_prefixes.len()) as u32
    }

    pub(crate) fn render(&self, now: Instant) -> NetworkInterface {
        let attachment = self.active_attachment(now).map(|a| a.render(now));
        let status = match attachment.as_ref().map(|a| a.status) {
            None | Some(AttachmentStatus::Detached) => InterfaceStatus::Available,
            Some(AttachmentStatus::Attaching) => InterfaceStatus::Attaching,
            Some(AttachmentStatus::Attached) => InterfaceStatus::InUse,
            Some(AttachmentStatus::Detaching) => InterfaceStatus::Detaching,
        };
        NetworkInterface {
            id: self.id.clone(),
            subnet_id: self.subnet_id.clone(),
            vpc_id: self.vpc_id.clone(),
            availability_zone: self.zone.clone(),
            mac: self.mac,
            description: self.description.clone(),
            status,
            attachment,
            primary_ipv4: self.primary_ipv4,
            secondary_ipv4: self.secondary_ipv4.clone(),
            ipv4_prefixes: self.ipv4_prefixes.clone(),
            ipv6_addresses: self.ipv6_addresses.clone(),
            ipv6_prefixes: self.ipv6_prefixes.clone(),
            security_groups: self.security_groups.clone(),
            tags: self.tags.clone(),
        }
    }
}

/// One interface's true state and the versions describe calls see: each change becomes visible
/// at its own time, never before an earlier change.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct InterfaceEntry {
    truth: Option<FakeInterface>,
    #[serde(with = "super::wall::instant_versions")]
    versions: VecDeque<(Instant, Option<FakeInterface>)>,
    /// Every instance it was attached to and every attachment id it had, to clean the indexes
    /// when the entry goes.
    instances: Vec<String>,
    attachment_ids: Vec<String>,
}

impl InterfaceEntry {
    fn visible(&self, now: Instant) -> Option<&FakeInterface> {
        self.versions
            .iter()
            .rev()
            .find(|(at, _)| *at <= now)
            .and_then(|(_, version)| version.as_ref())
    }

    /// Records the true state as a new version, visible after `lag`; returns when.
    fn publish(&mut self, now: Instant, lag: Duration) -> Instant {
        let at = self
            .versions
            .back()
            .map_or(now + lag, |(last, _)| (*last).max(now + lag));
        while self.versions.len() > 1 && self.versions[1].0 <= now {
            self.versions.pop_front();
        }
        self.versions.push_back((at, self.truth.clone()));
        at
    }
}

/// How long a change takes to show in describe calls: Exp(mean), capped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lag {
    pub(crate) mean: Duration,
    pub(crate) max: Duration,
}

impl Lag {
    fn sample(&self, rng: &mut ChaCha8Rng) -> Duration {
        if self.mean.is_zero() {
            return Duration::ZERO;
        }
        let uniform: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        let lag = -self.mean.as_secs_f64() * uniform.ln();
        Duration::try_from_secs_f64(lag)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// A uniform delay between two bounds (attach and detach completion).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Span {
    pub(crate) min: Duration,
    pub(crate) max: Duration,
}

impl Span {
    fn sample(&self, rng: &mut ChaCha8Rng) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        rng.random_range(self.min..=self.max)
    }
}

/// Every resource of one account in one region.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) types: BTreeMap<String, InstanceTypeInfo>,
    pub(crate) subnets: BTreeMap<String, FakeSubnet>,
    pub(crate) instances: BTreeMap<String, FakeInstance>,
    interfaces: BTreeMap<String, InterfaceEntry>,
    /// Interfaces that have been attached to each instance (a superset of those attached in
    /// any version), so instance-scoped calls do not scan every interface of the account.
    by_instance: HashMap<String, BTreeSet<String>>,
    /// Attachment id to interface id.
    attachment_index: HashMap<String, String>,
    /// Deleted interfaces, by when their deletion becomes visible: then they are forgotten.
    deletions: BinaryHeap<Reverse<(Instant, String)>>,
    client_tokens: HashMap<String, (CreateInterface, NetworkInterface)>,
    next_id: u64,
    pub(crate) lag: Lag,
    pub(crate) attach_delay: Span,
    pub(crate) detach_delay: Span,
}

fn not_found_interface(id: &str) -> CloudError {
    CloudError::InterfaceNotFound {
        message: format!("The networkInterface ID '{id}' does not exist"),
    }
}

fn not_found_instance(id: &str) -> CloudError {
    CloudError::InstanceNotFound {
        message: format!("The instance ID '{id}' does not exist"),
    }
}

fn not_found_subnet(id: &str) -> CloudError {
    CloudError::SubnetNotFound {
        message: format!("The subnet ID '{id}' does not exist"),
    }
}

fn invalid(message: impl Into<String>) -> CloudError {
    CloudError::InvalidParameterValue {
        message: message.into(),
    }
}

fn in_use_address(what: impl std::fmt::Display) -> CloudError {
    CloudError::Other {
        code: "InvalidIPAddress.InUse".to_owned(),
        message: format!("Address {what} is in use"),
    }
}

fn refused(refusal: Refusal, what: impl std::fmt::Display, subnet_id: &str) -> CloudError {
    match refusal {
        Refusal::Outside => invalid(format!(
            "Address {what} is not valid for subnet '{subnet_id}'"
        )),
        Refusal::InUse => in_use_address(what),
    }
}

fn no_free_addresses(subnet_id: &str) -> CloudError {
    CloudError::InsufficientFreeAddressesInSubnet {
        message: format!(
            "There are not enough free addresses in subnet '{subnet_id}' to satisfy the requested number of addresses"
        ),
    }
}

fn no_cidr_blocks(subnet_id: &str) -> CloudError {
    CloudError::InsufficientCidrBlocks {
        message: format!(
            "The specified subnet '{subnet_id}' does not have enough free cidr blocks to satisfy the request"
        ),
    }
}

/// Refuses an assign of `asked` addresses (or prefixes) to an interface that holds `slots` of
/// its `limit` already, as EC2 does: nothing asked, prefixes without prefix delegation, or
/// over the limit.
fn check_assign(
    interface_id: &str,
    (asked, prefixes): (usize, bool),
    prefix_delegation: bool,
    (slots, limit): (u32, u32),
) -> Result<(), CloudError> {
    if asked == 0 {
        return Err(invalid("Nothing to assign"));
    }
    if prefixes && !prefix_delegation {
        return Err(invalid(format!(
            "Prefix delegation is not supported for the instance type of interface '{interface_id}'"
        )));
    }
    if slots as usize + asked > limit as usize {
        return Err(address_limit(interface_id, limit));
    }
    Ok(())
}

/// Refuses an unassign naming `what` (addresses or prefixes) the interface does not hold.
fn not_assigned<T: PartialEq + std::fmt::Display>(
    interface_id: &str,
    what: &str,
    released: &[T],
    held: &[T],
) -> Result<(), CloudError> {
    match released.iter().find(|r| !held.contains(r)) {
        Some(r) => Err(invalid(format!(
            "Some of the specified {what} are not assigned to interface {interface_id}: {r}"
        ))),
        None => Ok(()),
    }
}

fn address_limit(interface_id: &str, limit: u32) -> CloudError {
    CloudError::PrivateIpAddressLimitExceeded {
        message: format!(
            "Number of private addresses will exceed limit of {limit} for interface '{interface_id}'"
        ),
    }
}

fn tags_match(tags: &Tags, wanted: &BTreeMap<String, Option<String>>) -> bool {
    wanted
        .iter()
        .all(|(key, value)| match (tags.get(key), value) {
            (Some(_), None) => true,
            (Some(have), Some(want)) => have == want,
            (None, _) => false,
        })
}

/// Refuses a list that names an address or prefix twice.
fn no_duplicates<T: Ord + std::fmt::Display>(items: &[T]) -> Result<(), CloudError> {
    let mut seen = BTreeSet::new();
    match items.iter().find(|item| !seen.insert(*item)) {
        Some(twice) => Err(invalid(format!(
            "Duplicate address or prefix {twice} in the request"
        ))),
        None => Ok(()),
    }
}

/// Takes addresses of one family from a subnet's pool as a request says.
fn take_addresses<P: FamilyPool>(
    pool: &mut P,
    subnet_id: &str,
    amount: &Amount<P::Addr>,
) -> Result<Vec<P::Addr>, CloudError> {
    match amount {
        Amount::Count(n) => pool
            .take_any(*n as usize)
            .ok_or_else(|| no_free_addresses(subnet_id)),
        Amount::Explicit(addresses) => {
            no_duplicates(addresses)?;
            for &addr in addresses {
                pool.take(addr).map_err(|r| refused(r, addr, subnet_id))?;
            }
            Ok(addresses.clone())
        }
    }
}

/// Takes prefixes of one family from a subnet's pool as a request says.
fn take_prefixes<P: FamilyPool>(
    pool: &mut P,
    subnet_id: &str,
    amount: &Amount<P::Net>,
) -> Result<Vec<P::Net>, CloudError> {
    match amount {
        Amount::Count(n) => pool
            .take_prefixes(*n as usize)
            .ok_or_else(|| no_cidr_blocks(subnet_id)),
        Amount::Explicit(prefixes) => {
            no_duplicates(prefixes)?;
            for &prefix in prefixes {
                pool.take_prefix(prefix)
                    .map_err(|r| refused(r, prefix, subnet_id))?;
            }
            Ok(prefixes.clone())
        }
    }
}

/// [`take_prefixes`] of IPv4, where a count of /28s the subnet has too few free addresses for
/// is refused as EC2 refuses it (no free addresses) before any free /28 is looked for.
fn take_ipv4_prefixes(
    pool: &mut Ipv4Pool,
    subnet_id: &str,
    amount: &Amount<Ipv4Net>,
) -> Result<Vec<Ipv4Net>, CloudError> {
    if let Amount::Count(n) = amount
        && (pool.free() as usize) < *n as usize * 16
    {
        return Err(no_free_addresses(subnet_id));
    }
    take_prefixes(pool, subnet_id, amount)
}

fn ipv6_pool(subnet: &mut FakeSubnet) -> Result<&mut Ipv6Pool, CloudError> {
    let id = subnet.id.clone();
    subnet
        .ipv6
        .as_mut()
        .ok_or_else(|| invalid(format!("Subnet '{id}' has no IPv6 CIDR block")))
}

/// What a state file keeps of the model, written: the resources and the id counter (the
/// instance-type catalog and the timing knobs are each process's builder's; the indexes are
/// rebuilt on import).
#[derive(serde::Serialize)]
pub(crate) struct PersistedRef<'a> {
    subnets: &'a BTreeMap<String, FakeSubnet>,
    instances: &'a BTreeMap<String, FakeInstance>,
    interfaces: &'a BTreeMap<String, InterfaceEntry>,
    client_tokens: BTreeMap<&'a String, &'a (CreateInterface, NetworkInterface)>,
    next_id: u64,
}

/// [`PersistedRef`], read back.
#[derive(serde::Deserialize)]
pub(crate) struct Persisted {
    subnets: BTreeMap<String, FakeSubnet>,
    instances: BTreeMap<String, FakeInstance>,
    interfaces: BTreeMap<String, InterfaceEntry>,
    client_tokens: BTreeMap<String, (CreateInterface, NetworkInterface)>,
    next_id: u64,
}

impl Model {
    /// The model's resources, for a state file.
    pub(crate) fn export(&self) -> PersistedRef<'_> {
        PersistedRef {
            subnets: &self.subnets,
            instances: &self.instances,
            interfaces: &self.interfaces,
            client_tokens: self.client_tokens.iter().collect(),
            next_id: self.next_id,
        }
    }

    /// Replaces the model's resources with a state file's, rebuilding the indexes.
    pub(crate) fn import(&mut self, persisted: Persisted) {
        self.subnets = persisted.subnets;
        self.instances = persisted.instances;
        self.interfaces = persisted.interfaces;
        self.client_tokens = persisted.client_tokens.into_iter().collect();
        self.next_id = persisted.next_id;
        self.by_instance.clear();
        self.attachment_index.clear();
        self.deletions.clear();
        for (id, entry) in &self.interfaces {
            for instance in &entry.instances {
                self.by_instance
                    .entry(instance.clone())
                    .or_default()
                    .insert(id.clone());
            }
            for attachment in &entry.attachment_ids {
                self.attachment_index.insert(attachment.clone(), id.clone());
            }
            if entry.truth.is_none()
                && let Some((at, _)) = entry.versions.back()
            {
                self.deletions.push(Reverse((*at, id.clone())));
            }
        }
    }

    pub(crate) fn new(types: Vec<InstanceTypeInfo>) -> Model {
        Model {
            types: types
                .into_iter()
                .map(|t| (t.instance_type.clone(), t))
                .collect(),
            subnets: BTreeMap::new(),
            instances: BTreeMap::new(),
            interfaces: BTreeMap::new(),
            by_instance: HashMap::new(),
            attachment_index: HashMap::new(),
            deletions: BinaryHeap::new(),
            client_tokens: HashMap::new(),
            next_id: 1,
            lag: Lag {
                mean: Duration::ZERO,
                max: Duration::ZERO,
            },
            attach_delay: Span {
                min: Duration::ZERO,
                max: Duration::ZERO,
            },
            detach_delay: Span {
                min: Duration::ZERO,
                max: Duration::ZERO,
            },
        }
    }

    fn next(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn publish(&mut self, id: &str, now: Instant, rng: &mut ChaCha8Rng) {
        let lag = self.lag.sample(rng);
        if let Some(entry) = self.interfaces.get_mut(id) {
            let at = entry.publish(now, lag);
            if entry.truth.is_none() {
                self.deletions.push(Reverse((at, id.to_owned())));
            }
        }
    }

    /// Interfaces with a record (existing, or deleted but still visible to some describe).
    pub(crate) fn records(&self) -> usize {
        self.interfaces.len()
    }

    /// Forgets the interfaces whose deletion every describe sees by now.
    pub(crate) fn prune(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.deletions.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, id))) = self.deletions.pop() else {
                break;
            };
            let gone = self
                .interfaces
                .get(&id)
                .is_some_and(|e| e.truth.is_none() && e.visible(now).is_none());
            if !gone {
                continue;
            }
            let entry = self.interfaces.remove(&id).expect("checked above");
            for instance in &entry.instances {
                if let Some(set) = self.by_instance.get_mut(instance) {
                    set.remove(&id);
                }
            }
            for attachment in &entry.attachment_ids {
                self.attachment_index.remove(attachment);
            }
        }
    }

    /// Records an attachment in the indexes.
    fn index_attachment(&mut self, interface_id: &str, instance_id: &str, attachment_id: &str) {
        self.by_instance
            .entry(instance_id.to_owned())
            .or_default()
            .insert(interface_id.to_owned());
        self.attachment_index
            .insert(attachment_id.to_owned(), interface_id.to_owned());
        if let Some(entry) = self.interfaces.get_mut(interface_id) {
            entry.instances.push(instance_id.to_owned());
            entry.attachment_ids.push(attachment_id.to_owned());
        }
    }

    /// The entries of the interfaces ever attached to an instance.
    fn entries_of<'a>(&'a self, instance_id: &str) -> impl Iterator<Item = &'a InterfaceEntry> {
        self.by_instance
            .get(instance_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.interfaces.get(id))
    }

    fn truth(&self, id: &str) -> Result<&FakeInterface, CloudError> {
        self.interfaces
            .get(id)
            .and_then(|e| e.truth.as_ref())
            .ok_or_else(|| not_found_interface(id))
    }

    fn truth_mut(&mut self, id: &str) -> Result<&mut FakeInterface, CloudError> {
        self.interfaces
            .get_mut(id)
            .and_then(|e| e.truth.as_mut())
            .ok_or_else(|| not_found_interface(id))
    }

    /// The limits that apply to an interface now: its instance type's while attached, the
    /// largest otherwise.
    fn limits_of(&self, interface: &FakeInterface, now: Instant) -> (u32, u32, bool) {
        interface
            .active_attachment(now)
            .and_then(|a| self.instances.get(&a.instance_id))
            .and_then(|i| self.types.get(&i.instance_type))
            .map_or((UNATTACHED_LIMIT, UNATTACHED_LIMIT, true), |t| {
                (
                    t.ipv4_per_interface,
                    t.ipv6_per_interface,
                    t.prefix_delegation,
                )
            })
    }

    /// The true state of an interface, as the fake's own inspection sees it (no lag).
    pub(crate) fn inspect(&self, id: &str, now: Instant) -> Option<NetworkInterface> {
        self.truth(id).ok().map(|i| i.render(now))
    }

    /// Every existing interface's true state.
    pub(crate) fn inspect_all(&self, now: Instant) -> Vec<NetworkInterface> {
        self.interfaces
            .values()
            .filter_map(|e| e.truth.as_ref())
            .map(|i| i.render(now))
            .collect()
    }

    /// Adds an instance, running, with its primary interface attached at device index 0
    /// (delete on termination), visible at once.
    pub(crate) fn launch(
        &mut self,
        id: Option<String>,
        instance_type: &str,
        subnet_id: &str,
        now: Instant,
    ) -> Result<String, CloudError> {
        if !self.types.contains_key(instance_type) {
            return Err(invalid(format!(
                "The instance type '{instance_type}' does not exist"
            )));
        }
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| not_found_subnet(subnet_id))?;
        let (zone, vpc_id) = (subnet.zone.clone(), subnet.vpc_id.clone());
        let id = match id {
            Some(id) => id,
            None => format!("i-{:017x}", self.next()),
        };
        if self.instances.contains_key(&id) {
            return Err(invalid(format!("Instance '{id}' already exists")));
        }
        let request = CreateInterface {
            subnet_id: subnet_id.to_owned(),
            description: Some("Primary network interface".to_owned()),
            ..CreateInterface::default()
        };
        let interface_id = self.create_truth(&request, now)?;
        let attachment_id = format!("eni-attach-{:017x}", self.next());
        let entry = self
            .interfaces
            .get_mut(&interface_id)
            .expect("just created");
        let interface = entry.truth.as_mut().expect("just created");
        interface.attachment = Some(FakeAttachment {
            id: attachment_id.clone(),
            instance_id: id.clone(),
            device_index: 0,
            delete_on_termination: true,
            attached_at: now,
            detached_at: None,
        });
        entry.publish(now, Duration::ZERO);
        self.index_attachment(&interface_id, &id, &attachment_id);
        self.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                instance_type: instance_type.to_owned(),
                state: InstanceState::Running,
                zone,
                vpc_id,
                subnet_id: subnet_id.to_owned(),
                tags: Tags::new(),
            },
        );
        Ok(id)
    }

    /// Sets an instance's state (pending, stopped, ...) without side effects.
    pub(crate) fn set_state(&mut self, id: &str, state: InstanceState) -> Result<(), CloudError> {
        let instance = self
            .instances
            .get_mut(id)
            .ok_or_else(|| not_found_instance(id))?;
        instance.state = state;
        Ok(())
    }

    /// Terminates an instance: its delete-on-termination interfaces are deleted, the others
    /// detached and `available`.
    pub(crate) fn terminate(
        &mut self,
        id: &str,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        self.set_state(id, InstanceState::Terminated)?;
        let attached: Vec<(String, bool)> = self
            .entries_of(id)
            .filter_map(|entry| {
                let interface = entry.truth.as_ref()?;
                let attachment = interface.active_attachment(now)?;
                (attachment.instance_id == id)
                    .then(|| (interface.id.clone(), attachment.delete_on_termination))
            })
            .collect();
        for (eni, delete) in attached {
            if delete {
                self.remove_interface(&eni);
            } else if let Ok(interface) = self.truth_mut(&eni) {
                interface.attachment = None;
            }
            self.publish(&eni, now, rng);
        }
        Ok(())
    }

    fn remove_interface(&mut self, id: &str) {
        let Some(interface) = self.interfaces.get_mut(id).and_then(|e| e.truth.take()) else {
            return;
        };
        let Some(subnet) = self.subnets.get_mut(&interface.subnet_id) else {
            return;
        };
        subnet.ipv4.release(interface.primary_ipv4);
        for &addr in &interface.secondary_ipv4 {
            subnet.ipv4.release(addr);
        }
        for &prefix in &interface.ipv4_prefixes {
            subnet.ipv4.release_prefix(prefix);
        }
        if let Some(pool) = subnet.ipv6.as_mut() {
            for &addr in &interface.ipv6_addresses {
                pool.release(addr);
            }
            for &prefix in &interface.ipv6_prefixes {
                pool.release_prefix(prefix);
            }
        }
    }

    pub(crate) fn describe_instance(&self, id: &str, now: Instant) -> Result<Instance, CloudError> {
        let instance = self
            .instances
            .get(id)
            .ok_or_else(|| not_found_instance(id))?;
        let mut interfaces: Vec<InstanceInterface> = self
            .entries_of(id)
            .filter_map(|entry| entry.visible(now))
            .filter_map(|interface| {
                let attachment = interface.active_attachment(now)?;
                (attachment.instance_id == id).then(|| InstanceInterface {
                    interface_id: interface.id.clone(),
                    subnet_id: interface.subnet_id.clone(),
                    mac: interface.mac,
                    primary_ipv4: interface.primary_ipv4,
                    attachment: attachment.render(now),
                })
            })
            .collect();
        interfaces.sort_by_key(|i| i.attachment.device_index);
        Ok(Instance {
            id: instance.id.clone(),
            instance_type: instance.instance_type.clone(),
            state: instance.state,
            availability_zone: instance.zone.clone(),
            vpc_id: instance.vpc_id.clone(),
            subnet_id: instance.subnet_id.clone(),
            interfaces,
        })
    }

    pub(crate) fn describe_instance_types(
        &self,
        names: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        names
            .iter()
            .map(|name| {
                self.types.get(name).cloned().ok_or_else(|| {
                    invalid(format!(
                        "The following supplied instance types do not exist: [{name}]"
                    ))
                })
            })
            .collect()
    }

    pub(crate) fn describe_subnets(
        &self,
        filter: &SubnetFilter,
    ) -> Result<Vec<Subnet>, CloudError> {
        if let Some(missing) = filter.ids.iter().find(|id| !self.subnets.contains_key(*id)) {
            return Err(not_found_subnet(missing));
        }
        Ok(self
            .subnets
            .values()
            .filter(|s| filter.ids.is_empty() || filter.ids.contains(&s.id))
            .filter(|s| filter.vpc_id.as_ref().is_none_or(|vpc| *vpc == s.vpc_id))
            .filter(|s| tags_match(&s.tags, &filter.tags))
            .map(|s| Subnet {
                id: s.id.clone(),
                vpc_id: s.vpc_id.clone(),
                availability_zone: s.zone.clone(),
                ipv4_cidr: s.ipv4_cidr,
                ipv6_cidr: s.ipv6.as_ref().map(|p| p.cidr()),
                available_ipv4: s.ipv4.free(),
                tags: s.tags.clone(),
            })
            .collect())
    }

    pub(crate) fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
        now: Instant,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        for id in &filter.ids {
            if self
                .interfaces
                .get(id)
                .and_then(|e| e.visible(now))
                .is_none()
            {
                return Err(not_found_interface(id));
            }
        }
        let matches = |interface: &&FakeInterface| {
            let attachment = interface.active_attachment(now);
            (filter.ids.is_empty() || filter.ids.contains(&interface.id))
                && filter
                    .attached_instance
                    .as_ref()
                    .is_none_or(|want| attachment.is_some_and(|a| a.instance_id == *want))
                && filter
                    .subnet_id
                    .as_ref()
                    .is_none_or(|want| *want == interface.subnet_id)
                && tags_match(&interface.tags, &filter.tags)
        };
        let candidates: Box<dyn Iterator<Item = &InterfaceEntry>> = match &filter.attached_instance
        {
            Some(instance) => Box::new(self.entries_of(instance)),
            None => Box::new(self.interfaces.values()),
        };
        Ok(candidates
            .filter_map(|entry| entry.visible(now))
            .filter(matches)
            .map(|interface| interface.render(now))
            .filter(|rendered| filter.status.is_none_or(|want| rendered.status == want))
            .collect())
    }

    /// Creates an interface in the true state (not yet published); returns its id.
    fn create_truth(
        &mut self,
        request: &CreateInterface,
        _now: Instant,
    ) -> Result<String, CloudError> {
        let subnet_id = &request.subnet_id;
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| not_found_subnet(subnet_id))?;
        if request.secondary_ipv4.is_some() && request.ipv4_prefixes.is_some() {
            return Err(invalid(
                "Secondary private IPv4 addresses and IPv4 prefixes cannot be specified together",
            ));
        }
        if request.ipv6_addresses.is_some() && request.ipv6_prefixes.is_some() {
            return Err(invalid(
                "IPv6 addresses and IPv6 prefixes cannot be specified together",
            ));
        }
        let ipv4_slots = 1
            + request.secondary_ipv4.as_ref().map_or(0, Amount::len)
            + request.ipv4_prefixes.as_ref().map_or(0, Amount::len);
        let ipv6_slots = request.ipv6_addresses.as_ref().map_or(0, Amount::len)
            + request.ipv6_prefixes.as_ref().map_or(0, Amount::len);
        if ipv4_slots > UNATTACHED_LIMIT as usize || ipv6_slots > UNATTACHED_LIMIT as usize {
            return Err(address_limit("(new)", UNATTACHED_LIMIT));
        }
        // Taken on a copy of the subnet, kept only if everything succeeds: a refusal changes
        // nothing.
        let mut scratch = subnet.clone();
        let primary_ipv4 = match request.primary_ipv4 {
            Some(addr) => {
                scratch
                    .ipv4
                    .take(addr)
                    .map_err(|r| refused(r, addr, subnet_id))?;
                addr
            }
            None => scratch
                .ipv4
                .take_any(1)
                .ok_or_else(|| no_free_addresses(subnet_id))?[0],
        };
        let secondary_ipv4 = match &request.secondary_ipv4 {
            Some(amount) => take_addresses(&mut scratch.ipv4, subnet_id, amount)?,
            None => Vec::new(),
        };
        let ipv4_prefixes = match &request.ipv4_prefixes {
            Some(amount) => take_ipv4_prefixes(&mut scratch.ipv4, subnet_id, amount)?,
            None => Vec::new(),
        };
        let (mut ipv6_addresses, mut ipv6_prefixes) = (Vec::new(), Vec::new());
        if request.ipv6_addresses.is_some() || request.ipv6_prefixes.is_some() {
            let pool = ipv6_pool(&mut scratch)?;
            if let Some(amount) = &request.ipv6_addresses {
                ipv6_addresses = take_addresses(pool, subnet_id, amount)?;
            }
            if let Some(amount) = &request.ipv6_prefixes {
                ipv6_prefixes = take_prefixes(pool, subnet_id, amount)?;
            }
        }
        let number = self.next();
        let id = format!("eni-{number:017x}");
        let bytes = number.to_be_bytes();
        let mac = MacAddress([0x0a, bytes[3], bytes[4], bytes[5], bytes[6], bytes[7]]);
        let subnet = self.subnets.get_mut(subnet_id).expect("checked above");
        *subnet = scratch;
        let interface = FakeInterface {
            id: id.clone(),
            subnet_id: subnet_id.clone(),
            vpc_id: subnet.vpc_id.clone(),
            zone: subnet.zone.clone(),
            mac,
            description: request.description.clone().unwrap_or_default(),
            security_groups: if request.security_groups.is_empty() {
                vec!["sg-default".to_owned()]
            } else {
                request.security_groups.clone()
            },
            tags: request.tags.clone(),
            primary_ipv4,
            secondary_ipv4,
            ipv4_prefixes,
            ipv6_addresses,
            ipv6_prefixes,
            attachment: None,
        };
        self.interfaces.insert(
            id.clone(),
            InterfaceEntry {
                truth: Some(interface),
                versions: VecDeque::new(),
                instances: Vec::new(),
                attachment_ids: Vec::new(),
            },
        );
        Ok(id)
    }

    pub(crate) fn create_interface(
        &mut self,
        request: &CreateInterface,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<NetworkInterface, CloudError> {
        if let Some(token) = &request.client_token
            && let Some((first, created)) = self.client_tokens.get(token)
        {
            if first != request {
                return Err(CloudError::Other {
                    code: "IdempotentParameterMismatch".to_owned(),
                    message: format!(
                        "The client token '{token}' was used with different parameters"
                    ),
                });
            }
            return Ok(created.clone());
        }
        let id = self.create_truth(request, now)?;
        self.publish(&id, now, rng);
        let created = self.truth(&id)?.render(now);
        if let Some(token) = &request.client_token {
            self.client_tokens
                .insert(token.clone(), (request.clone(), created.clone()));
        }
        Ok(created)
    }

    pub(crate) fn attach(
        &mut self,
        request: AttachInterface<'_>,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<String, CloudError> {
        let AttachInterface {
            interface_id,
            instance_id,
            device_index,
        } = request;
        let interface = self.truth(interface_id)?;
        let instance = self
            .instances
            .get(instance_id)
            .ok_or_else(|| not_found_instance(instance_id))?;
        if instance.state != InstanceState::Running {
            return Err(CloudError::IncorrectInstanceState {
                message: format!("Instance '{instance_id}' is not 'running'."),
            });
        }
        if interface.active_attachment(now).is_some() {
            return Err(CloudError::InterfaceInUse {
                message: format!("Interface: [{interface_id}] in use."),
            });
        }
        if interface.zone != instance.zone || interface.vpc_id != instance.vpc_id {
            return Err(invalid(format!(
                "Interface '{interface_id}' and instance '{instance_id}' are not in the same availability zone"
            )));
        }
        let limits = self
            .types
            .get(&instance.instance_type)
            .cloned()
            .ok_or_else(|| {
                invalid(format!(
                    "Unknown instance type '{}'",
                    instance.instance_type
                ))
            })?;
        let attached: Vec<u32> = self
            .entries_of(instance_id)
            .filter_map(|e| e.truth.as_ref()?.active_attachment(now))
            .filter(|a| a.instance_id == instance_id)
            .map(|a| a.device_index)
            .collect();
        if attached.contains(&device_index) {
            return Err(CloudError::DeviceIndexInUse {
                message: format!(
                    "Instance '{instance_id}' {DEVICE_INDEX_IN_USE} '{device_index}'."
                ),
            });
        }
        if attached.len() as u32 >= limits.max_interfaces {
            return Err(CloudError::AttachmentLimitExceeded {
                message: format!(
                    "Interface count {} exceeds the limit for {}",
                    attached.len() + 1,
                    limits.instance_type
                ),
            });
        }
        if interface.ipv4_slots() > limits.ipv4_per_interface
            || interface.ipv6_slots() > limits.ipv6_per_interface
        {
            return Err(address_limit(interface_id, limits.ipv4_per_interface));
        }
        if !limits.prefix_delegation
            && (!interface.ipv4_prefixes.is_empty() || !interface.ipv6_prefixes.is_empty())
        {
            return Err(invalid(format!(
                "Interface '{interface_id}' has prefixes, which instance type {} does not support",
                limits.instance_type
            )));
        }
        let attachment_id = format!("eni-attach-{:017x}", self.next());
        let attached_at = now + self.attach_delay.sample(rng);
        let interface = self.truth_mut(interface_id)?;
        interface.attachment = Some(FakeAttachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            delete_on_termination: false,
            attached_at,
            detached_at: None,
        });
        self.index_attachment(interface_id, instance_id, &attachment_id);
        self.publish(interface_id, now, rng);
        Ok(attachment_id)
    }

    pub(crate) fn detach(
        &mut self,
        attachment_id: &str,
        _force: bool,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        let interface_id = self
            .attachment_index
            .get(attachment_id)
            .filter(|id| {
                self.truth(id)
                    .ok()
                    .and_then(|i| i.active_attachment(now))
                    .is_some_and(|a| a.id == attachment_id)
            })
            .cloned()
            .ok_or_else(|| CloudError::AttachmentNotFound {
                message: format!("The attachment ID '{attachment_id}' does not exist"),
            })?;
        let delay = self.detach_delay.sample(rng);
        let interface = self.truth_mut(&interface_id)?;
        let attachment = interface.attachment.as_mut().expect("found active above");
        if attachment.device_index == 0 {
            return Err(CloudError::Other {
                code: "OperationNotPermitted".to_owned(),
                message: "The network interface at device index 0 cannot be detached.".to_owned(),
            });
        }
        if attachment.detached_at.is_none() {
            attachment.detached_at = Some(now + delay);
        }
        self.publish(&interface_id, now, rng);
        Ok(())
    }

    pub(crate) fn delete(
        &mut self,
        interface_id: &str,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        let interface = self.truth(interface_id)?;
        if interface.active_attachment(now).is_some() {
            return Err(CloudError::InterfaceInUse {
                message: format!("The network interface '{interface_id}' is currently in use."),
            });
        }
        self.remove_interface(interface_id);
        self.publish(interface_id, now, rng);
        Ok(())
    }

    pub(crate) fn assign_ipv4(
        &mut self,
        interface_id: &str,
        request: &Ipv4Assign,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<Ipv4Set, CloudError> {
        let interface = self.truth(interface_id)?;
        let (limit, _, prefix_delegation) = self.limits_of(interface, now);
        let (asked, prefixes) = match request {
            Ipv4Assign::Addresses(amount) => (amount.len(), false),
            Ipv4Assign::Prefixes(amount) => (amount.len(), true),
        };
        check_assign(
            interface_id,
            (asked, prefixes),
            prefix_delegation,
            (interface.ipv4_slots(), limit),
        )?;
        let subnet_id = interface.subnet_id.clone();
        let subnet = self
            .subnets
            .get_mut(&subnet_id)
            .ok_or_else(|| not_found_subnet(&subnet_id))?;
        let mut pool = subnet.ipv4.clone();
        let assigned = match request {
            Ipv4Assign::Addresses(amount) => Ipv4Set {
                addresses: take_addresses(&mut pool, &subnet_id, amount)?,
                prefixes: Vec::new(),
            },
            Ipv4Assign::Prefixes(amount) => Ipv4Set {
                addresses: Vec::new(),
                prefixes: take_ipv4_prefixes(&mut pool, &subnet_id, amount)?,
            },
        };
        subnet.ipv4 = pool;
        let interface = self.truth_mut(interface_id)?;
        interface.secondary_ipv4.extend(&assigned.addresses);
        interface.ipv4_prefixes.extend(&assigned.prefixes);
        self.publish(interface_id, now, rng);
        Ok(assigned)
    }

    pub(crate) fn unassign_ipv4(
        &mut self,
        interface_id: &str,
        release: &Ipv4Set,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        let interface = self.truth(interface_id)?;
        if release.addresses.is_empty() && release.prefixes.is_empty() {
            return Err(invalid("Nothing to unassign"));
        }
        if release.addresses.contains(&interface.primary_ipv4) {
            return Err(invalid(format!(
                "The primary address {} cannot be unassigned",
                interface.primary_ipv4
            )));
        }
        not_assigned(
            interface_id,
            "addresses",
            &release.addresses,
            &interface.secondary_ipv4,
        )?;
        not_assigned(
            interface_id,
            "prefixes",
            &release.prefixes,
            &interface.ipv4_prefixes,
        )?;
        let subnet_id = interface.subnet_id.clone();
        if let Some(subnet) = self.subnets.get_mut(&subnet_id) {
            for &addr in &release.addresses {
                subnet.ipv4.release(addr);
            }
            for &prefix in &release.prefixes {
                subnet.ipv4.release_prefix(prefix);
            }
        }
        let interface = self.truth_mut(interface_id)?;
        interface
            .secondary_ipv4
            .retain(|a| !release.addresses.contains(a));
        interface
            .ipv4_prefixes
            .retain(|p| !release.prefixes.contains(p));
        self.publish(interface_id, now, rng);
        Ok(())
    }

    pub(crate) fn assign_ipv6(
        &mut self,
        interface_id: &str,
        request: &Ipv6Assign,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<Ipv6Set, CloudError> {
        let interface = self.truth(interface_id)?;
        let (_, limit, prefix_delegation) = self.limits_of(interface, now);
        let (asked, prefixes) = match request {
            Ipv6Assign::Addresses(amount) => (amount.len(), false),
            Ipv6Assign::Prefixes(amount) => (amount.len(), true),
        };
        check_assign(
            interface_id,
            (asked, prefixes),
            prefix_delegation,
            (interface.ipv6_slots(), limit),
        )?;
        let subnet_id = interface.subnet_id.clone();
        let subnet = self
            .subnets
            .get_mut(&subnet_id)
            .ok_or_else(|| not_found_subnet(&subnet_id))?;
        let mut pool = ipv6_pool(subnet)?.clone();
        let assigned = match request {
            Ipv6Assign::Addresses(amount) => Ipv6Set {
                addresses: take_addresses(&mut pool, &subnet_id, amount)?,
                prefixes: Vec::new(),
            },
            Ipv6Assign::Prefixes(amount) => Ipv6Set {
                addresses: Vec::new(),
                prefixes: take_prefixes(&mut pool, &subnet_id, amount)?,
            },
        };
        subnet.ipv6 = Some(pool);
        let interface = self.truth_mut(interface_id)?;
        interface.ipv6_addresses.extend(&assigned.addresses);
        interface.ipv6_prefixes.extend(&assigned.prefixes);
        self.publish(interface_id, now, rng);
        Ok(assigned)
    }

    pub(crate) fn unassign_ipv6(
        &mut self,
        interface_id: &str,
        release: &Ipv6Set,
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        let interface = self.truth(interface_id)?;
        if release.addresses.is_empty() && release.prefixes.is_empty() {
            return Err(invalid("Nothing to unassign"));
        }
        not_assigned(
            interface_id,
            "addresses",
            &release.addresses,
            &interface.ipv6_addresses,
        )?;
        not_assigned(
            interface_id,
            "prefixes",
            &release.prefixes,
            &interface.ipv6_prefixes,
        )?;
        let subnet_id = interface.subnet_id.clone();
        if let Some(pool) = self
            .subnets
            .get_mut(&subnet_id)
            .and_then(|s| s.ipv6.as_mut())
        {
            for &addr in &release.addresses {
                pool.release(addr);
            }
            for &prefix in &release.prefixes {
                pool.release_prefix(prefix);
            }
        }
        let interface = self.truth_mut(interface_id)?;
        interface
            .ipv6_addresses
            .retain(|a| !release.addresses.contains(a));
        interface
            .ipv6_prefixes
            .retain(|p| !release.prefixes.contains(p));
        self.publish(interface_id, now, rng);
        Ok(())
    }

    fn check_resource(&self, id: &str) -> Result<(), CloudError> {
        if id.starts_with("eni-") {
            self.truth(id).map(|_| ())
        } else if id.starts_with("subnet-") {
            self.subnets
                .contains_key(id)
                .then_some(())
                .ok_or_else(|| not_found_subnet(id))
        } else if id.starts_with("i-") {
            self.instances
                .contains_key(id)
                .then_some(())
                .ok_or_else(|| not_found_instance(id))
        } else {
            Err(CloudError::Other {
                code: "InvalidID".to_owned(),
                message: format!("The ID '{id}' is not valid"),
            })
        }
    }

    fn tags_mut(&mut self, id: &str) -> Option<&mut Tags> {
        if id.starts_with("eni-") {
            self.truth_mut(id).ok().map(|i| &mut i.tags)
        } else if id.starts_with("subnet-") {
            self.subnets.get_mut(id).map(|s| &mut s.tags)
        } else {
            self.instances.get_mut(id).map(|i| &mut i.tags)
        }
    }

    pub(crate) fn change_tags(
        &mut self,
        resource_ids: &[String],
        change: &dyn Fn(&mut Tags),
        now: Instant,
        rng: &mut ChaCha8Rng,
    ) -> Result<(), CloudError> {
        for id in resource_ids {
            self.check_resource(id)?;
        }
        for id in resource_ids {
            if let Some(tags) = self.tags_mut(id) {
                change(tags);
            }
            if id.starts_with("eni-") {
                self.publish(id, now, rng);
            }
        }
        Ok(())
    }
}
