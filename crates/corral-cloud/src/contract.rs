//! The contract suite: EC2's behaviour as checks any [`CloudProvider`] must pass, run against
//! [`crate::FakeEc2`] (`tests/contract_fake.rs`) and against moto's server through the
//! `aws-sdk-ec2` adapter (corral-aws), so the fake cannot drift from what the real API does.
//!
//! Each check is a public async function taking the provider and a [`Fixture`] that the
//! implementation's test prepares (a running instance with room for one more interface, a
//! subnet in its zone with free addresses). It panics, as a test does, naming the call and what
//! it got, and deletes what it created when it passes. Checks attach at the instance's first
//! free device index, so run them one at a time per instance.
//!
//! Some emulators lack parts of EC2 (moto enforces no limits and delegates no prefixes): a check
//! that needs such a part says so in its name (`limits_...`, `prefix_delegation_...`, ...) and
//! in [`Capabilities::checks_not_run`], so an implementation's test file lists what it skips
//! instead of passing it silently.
//!
//! Describe calls are eventually consistent: the checks poll (with [`Poll`]) while a new
//! interface is not found or a change has not shown yet, and repeat a call only when that is
//! safe: after a throttle, or after a timeout or internal error (which may have been applied)
//! only for idempotent calls (describes, tags, a create with a client token).
//! Waits use tokio's clock, so under a paused clock they cost no real time.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::{
    Action, Amount, AttachInterface, AttachmentStatus, CloudError, CloudProvider, CreateInterface,
    InstanceState, InterfaceFilter, InterfaceStatus, Ipv4Assign, Ipv4Set, NetworkInterface, Subnet,
    SubnetFilter, Tags,
};

/// How the checks wait for eventual consistency and for attachments to complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poll {
    /// Between two describe calls.
    pub interval: Duration,
    /// Giving up (and failing the check) after this long.
    pub timeout: Duration,
}

impl Default for Poll {
    fn default() -> Poll {
        Poll {
            interval: Duration::from_millis(250),
            timeout: Duration::from_secs(60),
        }
    }
}

/// What the implementation's test prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixture {
    /// A running instance with room for at least one more interface.
    pub instance_id: String,
    /// A subnet in the instance's zone and VPC with at least 32 free addresses.
    pub subnet_id: String,
    /// Tags put on every interface the checks create (e.g. to find leftovers), besides their
    /// own.
    pub tags: Tags,
    /// Waiting.
    pub poll: Poll,
}

impl Fixture {
    /// A fixture with default polling and no extra tags.
    pub fn new(instance_id: &str, subnet_id: &str) -> Fixture {
        Fixture {
            instance_id: instance_id.to_owned(),
            subnet_id: subnet_id.to_owned(),
            tags: Tags::new(),
            poll: Poll::default(),
        }
    }
}

/// Parts of EC2 an implementation may lack; the checks that need a missing part are not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Interface and address limits of instance types are enforced (`AttachmentLimitExceeded`,
    /// `PrivateIpAddressLimitExceeded`).
    pub limits: bool,
    /// /28 prefixes can be delegated (on a Nitro instance).
    pub prefix_delegation: bool,
    /// `ClientToken` makes a repeated create return the same interface.
    pub client_tokens: bool,
    /// Attaching at an occupied device index is refused.
    pub occupied_device_index: bool,
    /// Deleting an attached interface is refused (`InvalidNetworkInterface.InUse`).
    pub delete_attached_refused: bool,
}

impl Capabilities {
    /// Everything EC2 does.
    pub const EC2: Capabilities = Capabilities {
        limits: true,
        prefix_delegation: true,
        client_tokens: true,
        occupied_device_index: true,
        delete_attached_refused: true,
    };

    /// The names of the checks these capabilities leave out.
    pub fn checks_not_run(&self) -> Vec<&'static str> {
        let mut skipped = Vec::new();
        if !self.limits {
            skipped.extend(["limits_attachment", "limits_addresses"]);
        }
        if !self.prefix_delegation {
            skipped.push("prefix_delegation_ipv4");
        }
        if !self.client_tokens {
            skipped.push("client_token_idempotent_create");
        }
        if !self.occupied_device_index {
            skipped.push("occupied_device_index_refused");
        }
        if !self.delete_attached_refused {
            skipped.push("delete_attached_refused");
        }
        skipped
    }
}

/// Every check, one after the other (for a provider with all of [`Capabilities::EC2`]).
pub async fn every_check<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    describe_instance_and_type(provider, fixture).await;
    describe_subnets(provider, fixture).await;
    interface_lifecycle(provider, fixture).await;
    secondary_addresses(provider, fixture).await;
    tags(provider, fixture).await;
    not_found_errors(provider, fixture).await;
    client_token_idempotent_create(provider, fixture).await;
    occupied_device_index_refused(provider, fixture).await;
    delete_attached_refused(provider, fixture).await;
    limits_attachment(provider, fixture).await;
    limits_addresses(provider, fixture).await;
    prefix_delegation_ipv4(provider, fixture).await;
}

fn ok<T>(what: &str, result: Result<T, CloudError>) -> T {
    result.unwrap_or_else(|error| panic!("{what} failed: {error} ({})", error.code()))
}

/// `action` through [`retrying`]; a failure fails the check naming the action.
async fn must<T>(
    poll: &Poll,
    action: Action,
    call: impl AsyncFnMut() -> Result<T, CloudError>,
) -> T {
    ok(action.as_str(), retrying(poll, action, call).await)
}

/// [`must`], naming what the call was for (unless empty) in a failure ("DescribeSubnets by
/// VPC").
async fn must_for<T>(
    poll: &Poll,
    action: Action,
    detail: &str,
    call: impl AsyncFnMut() -> Result<T, CloudError>,
) -> T {
    let what = if detail.is_empty() {
        action.to_string()
    } else {
        format!("{action} {detail}")
    };
    ok(&what, retrying(poll, action, call).await)
}

/// Repeats a call while repeating it is safe ([`CloudError::can_repeat`]) and the poll timeout
/// has not passed: after a throttle (or any error that says the call was not applied) always,
/// after an ambiguous one (`Timeout`, `InternalError`: the call may have been applied) only if
/// the action [is idempotent](Action::is_idempotent). A non-idempotent mutation that fails
/// ambiguously is not repeated: its error is returned, and the check fails naming it, instead
/// of, say, assigning twice the addresses it asked for.
async fn retrying<T>(
    poll: &Poll,
    action: Action,
    call: impl AsyncFnMut() -> Result<T, CloudError>,
) -> Result<T, CloudError> {
    retrying_as(poll, action, action.is_idempotent(), call).await
}

/// [`retrying`] for a call whose request makes it idempotent or not (a create with a client
/// token is).
async fn retrying_as<T>(
    poll: &Poll,
    action: Action,
    idempotent: bool,
    mut call: impl AsyncFnMut() -> Result<T, CloudError>,
) -> Result<T, CloudError> {
    poll_until(poll, async || match call().await {
        Err(error) if error.can_repeat(idempotent) => Err(format!(
            "{action}: still failing after {:?}: {error}",
            poll.timeout
        )),
        other => Ok(other),
    })
    .await
}

/// Calls `step` every poll interval until it answers `Ok`; `Err` says what to fail with if
/// the poll timeout passes first.
async fn poll_until<T>(poll: &Poll, mut step: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + poll.timeout;
    loop {
        match step().await {
            Ok(done) => return done,
            Err(message) if tokio::time::Instant::now() >= deadline => panic!("{message}"),
            Err(_) => tokio::time::sleep(poll.interval).await,
        }
    }
}

/// Describes one interface, polling while it is not found (not visible yet) or `done` is false.
async fn wait_for<P: CloudProvider>(
    provider: &P,
    poll: &Poll,
    interface_id: &str,
    what: &str,
    done: impl Fn(&NetworkInterface) -> bool,
) -> NetworkInterface {
    let filter = InterfaceFilter::id(interface_id);
    let mut last = None;
    poll_until(poll, async || {
        match retrying(poll, Action::DescribeNetworkInterfaces, async || {
            provider.describe_interfaces(&filter).await
        })
        .await
        {
            Ok(found) => {
                assert!(
                    found.len() <= 1,
                    "describing {interface_id} by id returned {} interfaces",
                    found.len()
                );
                if let Some(interface) = found.into_iter().next() {
                    assert_eq!(interface.id, interface_id, "describe by id");
                    if done(&interface) {
                        return Ok(interface);
                    }
                    last = Some(interface);
                }
            }
            Err(CloudError::InterfaceNotFound { .. }) => {}
            Err(error) => panic!("describing {interface_id} failed: {error}"),
        }
        Err(format!(
            "{interface_id}: {what} not seen within {:?}; last seen {last:?}",
            poll.timeout
        ))
    })
    .await
}

/// Polls until describing the interface by id answers not found.
async fn wait_gone<P: CloudProvider>(provider: &P, poll: &Poll, interface_id: &str) {
    let filter = InterfaceFilter::id(interface_id);
    poll_until(poll, async || {
        match retrying(poll, Action::DescribeNetworkInterfaces, async || {
            provider.describe_interfaces(&filter).await
        })
        .await
        {
            Err(CloudError::InterfaceNotFound { .. }) => Ok(()),
            Ok(found) if found.is_empty() => Ok(()),
            Ok(_) => Err(format!(
                "{interface_id} still described {:?} after its deletion",
                poll.timeout
            )),
            Err(error) => panic!("describing deleted {interface_id} failed: {error}"),
        }
    })
    .await;
}

/// The interfaces `filter` finds; `detail` names the filter in a failure.
async fn interfaces_by<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    detail: &str,
    filter: &InterfaceFilter,
) -> Vec<NetworkInterface> {
    must_for(
        &fixture.poll,
        Action::DescribeNetworkInterfaces,
        detail,
        async || provider.describe_interfaces(filter).await,
    )
    .await
}

/// The fixture's subnet, described by id.
async fn fixture_subnet<P: CloudProvider>(provider: &P, fixture: &Fixture) -> Subnet {
    must(&fixture.poll, Action::DescribeSubnets, async || {
        provider
            .describe_subnets(&SubnetFilter {
                ids: vec![fixture.subnet_id.clone()],
                ..SubnetFilter::default()
            })
            .await
    })
    .await
    .remove(0)
}

/// AssignPrivateIpAddresses of `request` to `interface_id`; `detail` names it in a failure.
async fn assign_ipv4<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    detail: &str,
    interface_id: &str,
    request: &Ipv4Assign,
) -> Ipv4Set {
    must_for(
        &fixture.poll,
        Action::AssignPrivateIpAddresses,
        detail,
        async || provider.assign_ipv4(interface_id, request).await,
    )
    .await
}

/// UnassignPrivateIpAddresses of `release` from `interface_id`; `detail` names it in a failure.
async fn unassign_ipv4<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    detail: &str,
    interface_id: &str,
    release: Ipv4Set,
) {
    must_for(
        &fixture.poll,
        Action::UnassignPrivateIpAddresses,
        detail,
        async || provider.unassign_ipv4(interface_id, &release).await,
    )
    .await;
}

/// The lowest device index not used on the instance.
async fn first_free_device_index<P: CloudProvider>(provider: &P, fixture: &Fixture) -> u32 {
    let instance = must(&fixture.poll, Action::DescribeInstances, async || {
        provider.describe_instance(&fixture.instance_id).await
    })
    .await;
    (0..)
        .find(|index| {
            !instance
                .interfaces
                .iter()
                .any(|i| i.attachment.device_index == *index)
        })
        .expect("a free index exists")
}

fn create_request(fixture: &Fixture, name: &str) -> CreateInterface {
    let mut tags = fixture.tags.clone();
    tags.insert("corral.contract".to_owned(), name.to_owned());
    CreateInterface {
        subnet_id: fixture.subnet_id.clone(),
        description: Some(format!("corral contract {name}")),
        tags,
        ..CreateInterface::default()
    }
}

async fn create<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    request: &CreateInterface,
) -> NetworkInterface {
    ok(
        "CreateNetworkInterface",
        retrying_as(
            &fixture.poll,
            Action::CreateNetworkInterface,
            request.client_token.is_some(),
            async || provider.create_interface(request).await,
        )
        .await,
    )
}

/// [`create`] of [`create_request`] `name`.
async fn create_named<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    name: &str,
) -> NetworkInterface {
    create(provider, fixture, &create_request(fixture, name)).await
}

/// The interface once describe sees it.
async fn visible<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    interface_id: &str,
) -> NetworkInterface {
    wait_for(provider, &fixture.poll, interface_id, "visible", |_| true).await
}

/// Attaches `interface_id` to the fixture's instance at `device_index`, repeated while that is
/// safe ([`retrying`]).
async fn attach_at<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    interface_id: &str,
    device_index: u32,
) -> Result<String, CloudError> {
    retrying(&fixture.poll, Action::AttachNetworkInterface, async || {
        provider
            .attach_interface(AttachInterface::new(
                interface_id,
                &fixture.instance_id,
                device_index,
            ))
            .await
    })
    .await
}

/// Attaches at the first free device index and waits until the attachment is complete;
/// returns the attachment id and the index.
async fn attach<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
    interface_id: &str,
) -> (String, u32) {
    let device_index = first_free_device_index(provider, fixture).await;
    let attachment_id = ok(
        "AttachNetworkInterface",
        attach_at(provider, fixture, interface_id, device_index).await,
    );
    wait_for(provider, &fixture.poll, interface_id, "in-use", |i| {
        i.status == InterfaceStatus::InUse
    })
    .await;
    (attachment_id, device_index)
}

/// Detaches (if attached), waits until available, deletes and waits until gone.
async fn remove<P: CloudProvider>(provider: &P, fixture: &Fixture, interface_id: &str) {
    let current = visible(provider, fixture, interface_id).await;
    if let Some(attachment) = current.attachment {
        if attachment.status != AttachmentStatus::Detaching {
            must(&fixture.poll, Action::DetachNetworkInterface, async || {
                provider.detach_interface(&attachment.id, false).await
            })
            .await;
        }
        wait_for(provider, &fixture.poll, interface_id, "available", |i| {
            i.status == InterfaceStatus::Available
        })
        .await;
    }
    must(&fixture.poll, Action::DeleteNetworkInterface, async || {
        provider.delete_interface(interface_id).await
    })
    .await;
    wait_gone(provider, &fixture.poll, interface_id).await;
}

/// The instance and its type: running, its primary interface at device index 0 in its subnet,
/// and limits that allow at least one more interface.
pub async fn describe_instance_and_type<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let instance = must(&fixture.poll, Action::DescribeInstances, async || {
        provider.describe_instance(&fixture.instance_id).await
    })
    .await;
    assert_eq!(instance.id, fixture.instance_id);
    assert_eq!(instance.state, InstanceState::Running);
    let primary = instance
        .interfaces
        .iter()
        .find(|i| i.attachment.device_index == 0)
        .unwrap_or_else(|| panic!("no interface at device index 0: {instance:?}"));
    assert_eq!(primary.subnet_id, instance.subnet_id);
    assert_eq!(primary.attachment.instance_id, instance.id);
    assert!(primary.attachment.delete_on_termination);
    let types = must(&fixture.poll, Action::DescribeInstanceTypes, async || {
        provider
            .describe_instance_types(std::slice::from_ref(&instance.instance_type))
            .await
    })
    .await;
    assert_eq!(types.len(), 1, "{types:?}");
    let limits = &types[0];
    assert_eq!(limits.instance_type, instance.instance_type);
    assert!(
        limits.max_interfaces as usize > instance.interfaces.len(),
        "{limits:?}"
    );
    assert!(limits.ipv4_per_interface >= 2, "{limits:?}");
}

/// The fixture's subnet by id and by VPC: its zone and CIDR, and a free-address count that a
/// new interface with three secondary addresses lowers by four.
pub async fn describe_subnets<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let by_id = SubnetFilter {
        ids: vec![fixture.subnet_id.clone()],
        ..SubnetFilter::default()
    };
    let subnets = must(&fixture.poll, Action::DescribeSubnets, async || {
        provider.describe_subnets(&by_id).await
    })
    .await;
    assert_eq!(subnets.len(), 1, "{subnets:?}");
    let subnet = &subnets[0];
    assert_eq!(subnet.id, fixture.subnet_id);
    let by_vpc = SubnetFilter {
        vpc_id: Some(subnet.vpc_id.clone()),
        ..SubnetFilter::default()
    };
    let in_vpc = must_for(
        &fixture.poll,
        Action::DescribeSubnets,
        "by VPC",
        async || provider.describe_subnets(&by_vpc).await,
    )
    .await;
    assert!(in_vpc.iter().any(|s| s.id == subnet.id), "{in_vpc:?}");
    assert!(
        in_vpc.iter().all(|s| s.vpc_id == subnet.vpc_id),
        "{in_vpc:?}"
    );

    let mut request = create_request(fixture, "describe_subnets");
    request.secondary_ipv4 = Some(Amount::Count(3));
    let interface = create(provider, fixture, &request).await;
    assert!(subnet.ipv4_cidr.contains(&interface.primary_ipv4));
    assert_eq!(interface.availability_zone, subnet.availability_zone);
    let after = must(&fixture.poll, Action::DescribeSubnets, async || {
        provider.describe_subnets(&by_id).await
    })
    .await;
    assert_eq!(
        after[0].available_ipv4 + 4,
        subnet.available_ipv4,
        "a new interface with 3 secondary addresses takes 4"
    );
    remove(provider, fixture, &interface.id).await;
}

/// The whole life of an interface: create with tags and a description; describe sees it (after
/// eventual consistency); attach at the first free index; in use with its attachment; assign 3
/// secondary addresses, seen; unassign them; detach; available; delete; not found.
pub async fn interface_lifecycle<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let request = create_request(fixture, "lifecycle");
    let created = create(provider, fixture, &request).await;
    assert_eq!(created.subnet_id, fixture.subnet_id);
    assert_eq!(created.status, InterfaceStatus::Available);
    assert_eq!(created.attachment, None);
    assert_eq!(created.description, "corral contract lifecycle");
    assert!(created.secondary_ipv4.is_empty());
    for (key, value) in &request.tags {
        assert_eq!(created.tags.get(key), Some(value), "tag {key} on create");
    }

    let seen = visible(provider, fixture, &created.id).await;
    assert_eq!(seen.primary_ipv4, created.primary_ipv4);
    assert_eq!(seen.mac, created.mac);
    assert_eq!(seen.tags, created.tags);
    assert_eq!(seen.description, created.description);

    let device_index = first_free_device_index(provider, fixture).await;
    assert!(device_index > 0, "device index 0 is the primary's");
    let attachment_id = ok(
        "AttachNetworkInterface",
        attach_at(provider, fixture, &created.id, device_index).await,
    );
    let attached = wait_for(provider, &fixture.poll, &created.id, "in-use", |i| {
        i.status == InterfaceStatus::InUse
    })
    .await;
    let attachment = attached.attachment.clone().expect("in use means attached");
    assert_eq!(attachment.id, attachment_id);
    assert_eq!(attachment.instance_id, fixture.instance_id);
    assert_eq!(attachment.device_index, device_index);
    assert_eq!(attachment.status, AttachmentStatus::Attached);
    assert!(!attachment.delete_on_termination);

    let by_instance = interfaces_by(
        provider,
        fixture,
        "by instance",
        &InterfaceFilter::instance(&fixture.instance_id),
    )
    .await;
    assert!(by_instance.iter().any(|i| i.id == created.id));
    assert!(by_instance.iter().all(|i| {
        i.attachment
            .as_ref()
            .is_some_and(|a| a.instance_id == fixture.instance_id)
    }));

    let request = Ipv4Assign::Addresses(Amount::Count(3));
    let assigned = assign_ipv4(provider, fixture, "", &created.id, &request).await;
    assert_eq!(assigned.addresses.len(), 3, "{assigned:?}");
    assert!(assigned.prefixes.is_empty());
    let mut sorted = assigned.addresses.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "distinct addresses: {assigned:?}");
    assert!(!assigned.addresses.contains(&created.primary_ipv4));
    let with_three = wait_for(provider, &fixture.poll, &created.id, "3 secondaries", |i| {
        i.secondary_ipv4.len() == 3
    })
    .await;
    let mut described = with_three.secondary_ipv4.clone();
    described.sort();
    assert_eq!(described, sorted);
    assert_eq!(with_three.primary_ipv4, created.primary_ipv4);

    unassign_ipv4(
        provider,
        fixture,
        "",
        &created.id,
        Ipv4Set {
            addresses: assigned.addresses.clone(),
            prefixes: Vec::new(),
        },
    )
    .await;
    wait_for(
        provider,
        &fixture.poll,
        &created.id,
        "no secondaries",
        |i| i.secondary_ipv4.is_empty(),
    )
    .await;

    must(&fixture.poll, Action::DetachNetworkInterface, async || {
        provider.detach_interface(&attachment_id, false).await
    })
    .await;
    let detached = wait_for(provider, &fixture.poll, &created.id, "available", |i| {
        i.status == InterfaceStatus::Available
    })
    .await;
    assert_eq!(detached.attachment, None);

    must(&fixture.poll, Action::DeleteNetworkInterface, async || {
        provider.delete_interface(&created.id).await
    })
    .await;
    wait_gone(provider, &fixture.poll, &created.id).await;
}

/// Secondary addresses by count and explicit: created with 2, one more given explicitly, all in
/// the subnet and distinct; unassigning one keeps the others; unassigning an address the
/// interface does not hold is refused and changes nothing.
pub async fn secondary_addresses<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let mut request = create_request(fixture, "secondary_addresses");
    request.secondary_ipv4 = Some(Amount::Count(2));
    let created = create(provider, fixture, &request).await;
    assert_eq!(created.secondary_ipv4.len(), 2, "{created:?}");
    let subnet = fixture_subnet(provider, fixture).await;
    for addr in created.secondary_ipv4.iter().chain([&created.primary_ipv4]) {
        assert!(
            subnet.ipv4_cidr.contains(addr),
            "{addr} outside {}",
            subnet.ipv4_cidr
        );
    }
    wait_for(provider, &fixture.poll, &created.id, "2 secondaries", |i| {
        i.secondary_ipv4.len() == 2
    })
    .await;

    // An explicit address: the highest host of the subnet below the broadcast-like last one,
    // then lower ones until one is free (every address any interface of the subnet holds is
    // skipped; the rest of the subnet is assumed free).
    let in_subnet = interfaces_by(
        provider,
        fixture,
        "by subnet",
        &InterfaceFilter {
            subnet_id: Some(fixture.subnet_id.clone()),
            ..InterfaceFilter::default()
        },
    )
    .await;
    let used: Vec<Ipv4Addr> = in_subnet
        .iter()
        .flat_map(|i| i.secondary_ipv4.iter().copied().chain([i.primary_ipv4]))
        .collect();
    let last = u32::from(subnet.ipv4_cidr.broadcast());
    let explicit = (last - 40..last - 1)
        .rev()
        .map(Ipv4Addr::from)
        .find(|a| !used.contains(a))
        .expect("a free address near the top of the subnet");
    let request = Ipv4Assign::Addresses(Amount::Explicit(vec![explicit]));
    let assigned = assign_ipv4(provider, fixture, "explicit", &created.id, &request).await;
    assert_eq!(assigned.addresses, vec![explicit]);
    let with_three = wait_for(provider, &fixture.poll, &created.id, "3 secondaries", |i| {
        i.secondary_ipv4.len() == 3
    })
    .await;
    assert!(with_three.secondary_ipv4.contains(&explicit));

    let kept = created.secondary_ipv4[1];
    let dropped = created.secondary_ipv4[0];
    unassign_ipv4(
        provider,
        fixture,
        "one",
        &created.id,
        Ipv4Set {
            addresses: vec![dropped],
            prefixes: Vec::new(),
        },
    )
    .await;
    let after = wait_for(
        provider,
        &fixture.poll,
        &created.id,
        "2 secondaries left",
        |i| i.secondary_ipv4.len() == 2,
    )
    .await;
    assert!(after.secondary_ipv4.contains(&kept));
    assert!(after.secondary_ipv4.contains(&explicit));
    assert!(!after.secondary_ipv4.contains(&dropped));

    remove(provider, fixture, &created.id).await;
}

/// Tags: set at creation, added and overwritten with CreateTags, found by a tag filter (key and
/// value, key only), removed with DeleteTags.
pub async fn tags<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let request = create_request(fixture, "tags");
    let created = create(provider, fixture, &request).await;
    visible(provider, fixture, &created.id).await;
    let marker = format!("corral-contract-{}", created.id);
    let added = Tags::from([
        ("corral.marker".to_owned(), marker.clone()),
        ("corral.contract".to_owned(), "tags-overwritten".to_owned()),
    ]);
    must(&fixture.poll, Action::CreateTags, async || {
        provider
            .create_tags(std::slice::from_ref(&created.id), &added)
            .await
    })
    .await;
    let tagged = wait_for(provider, &fixture.poll, &created.id, "tags", |i| {
        i.tags.get("corral.marker") == Some(&marker)
    })
    .await;
    assert_eq!(
        tagged.tags.get("corral.contract").map(String::as_str),
        Some("tags-overwritten")
    );
    let by_value = InterfaceFilter {
        tags: [("corral.marker".to_owned(), Some(marker.clone()))].into(),
        ..InterfaceFilter::default()
    };
    let found = interfaces_by(provider, fixture, "by tag", &by_value).await;
    assert_eq!(
        found.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        vec![created.id.as_str()]
    );
    let by_key = InterfaceFilter {
        tags: [("corral.marker".to_owned(), None)].into(),
        ..InterfaceFilter::default()
    };
    let found = interfaces_by(provider, fixture, "by tag key", &by_key).await;
    assert!(found.iter().any(|i| i.id == created.id));
    let wrong_value = InterfaceFilter {
        tags: [("corral.marker".to_owned(), Some("no-such-value".to_owned()))].into(),
        ..InterfaceFilter::default()
    };
    let found = interfaces_by(provider, fixture, "by another value", &wrong_value).await;
    assert!(found.iter().all(|i| i.id != created.id));

    must(&fixture.poll, Action::DeleteTags, async || {
        provider
            .delete_tags(
                std::slice::from_ref(&created.id),
                &["corral.marker".to_owned()],
            )
            .await
    })
    .await;
    let untagged = wait_for(provider, &fixture.poll, &created.id, "tag removed", |i| {
        !i.tags.contains_key("corral.marker")
    })
    .await;
    assert!(untagged.tags.contains_key("corral.contract"));
    remove(provider, fixture, &created.id).await;
}

/// Resources that do not exist are typed not-found errors: an interface (describe, delete,
/// assign, attach), an instance, a subnet (describe, create in it) and an attachment.
pub async fn not_found_errors<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let poll = &fixture.poll;
    let eni = "eni-0123456789abcdef0";
    let expect_not_found = |what: &str, result: Result<(), CloudError>, code: &str| match result {
        Err(error) if error.code() == code => {}
        other => panic!("{what}: expected {code}, got {other:?}"),
    };
    expect_not_found(
        "describe a missing interface",
        retrying(poll, Action::DescribeNetworkInterfaces, async || {
            provider
                .describe_interfaces(&InterfaceFilter::id(eni))
                .await
        })
        .await
        .map(|found| assert!(found.is_empty(), "{found:?}")),
        "InvalidNetworkInterfaceID.NotFound",
    );
    expect_not_found(
        "delete a missing interface",
        retrying(poll, Action::DeleteNetworkInterface, async || {
            provider.delete_interface(eni).await
        })
        .await,
        "InvalidNetworkInterfaceID.NotFound",
    );
    expect_not_found(
        "assign to a missing interface",
        retrying(poll, Action::AssignPrivateIpAddresses, async || {
            provider
                .assign_ipv4(eni, &Ipv4Assign::Addresses(Amount::Count(1)))
                .await
        })
        .await
        .map(drop),
        "InvalidNetworkInterfaceID.NotFound",
    );
    expect_not_found(
        "attach a missing interface",
        retrying(poll, Action::AttachNetworkInterface, async || {
            provider
                .attach_interface(AttachInterface::new(eni, &fixture.instance_id, 7))
                .await
        })
        .await
        .map(drop),
        "InvalidNetworkInterfaceID.NotFound",
    );
    expect_not_found(
        "describe a missing instance",
        retrying(poll, Action::DescribeInstances, async || {
            provider.describe_instance("i-0123456789abcdef0").await
        })
        .await
        .map(drop),
        "InvalidInstanceID.NotFound",
    );
    let missing_subnet = "subnet-0123456789abcdef0";
    expect_not_found(
        "describe a missing subnet",
        retrying(poll, Action::DescribeSubnets, async || {
            provider
                .describe_subnets(&SubnetFilter {
                    ids: vec![missing_subnet.to_owned()],
                    ..SubnetFilter::default()
                })
                .await
        })
        .await
        .map(drop),
        "InvalidSubnetID.NotFound",
    );
    let mut request = create_request(fixture, "not_found");
    request.subnet_id = missing_subnet.to_owned();
    expect_not_found(
        "create in a missing subnet",
        retrying(poll, Action::CreateNetworkInterface, async || {
            provider.create_interface(&request).await
        })
        .await
        .map(drop),
        "InvalidSubnetID.NotFound",
    );
    expect_not_found(
        "detach a missing attachment",
        retrying(poll, Action::DetachNetworkInterface, async || {
            provider
                .detach_interface("eni-attach-0123456789abcdef0", false)
                .await
        })
        .await,
        "InvalidAttachmentID.NotFound",
    );
}

/// Needs [`Capabilities::client_tokens`]: two creates with one client token make one interface.
pub async fn client_token_idempotent_create<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let mut request = create_request(fixture, "client_token");
    // Unique per run: EC2 (and a long-lived emulator) remembers tokens for a while.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    request.client_token = Some(format!("corral-contract-{}-{nanos}", std::process::id()));
    request.secondary_ipv4 = Some(Amount::Count(1));
    let first = create(provider, fixture, &request).await;
    let second = create(provider, fixture, &request).await;
    assert_eq!(first.id, second.id, "same client token, same interface");
    assert_eq!(first.primary_ipv4, second.primary_ipv4);
    let tagged = interfaces_by(
        provider,
        fixture,
        "by tag",
        &InterfaceFilter {
            tags: [(
                "corral.contract".to_owned(),
                Some("client_token".to_owned()),
            )]
            .into(),
            subnet_id: Some(fixture.subnet_id.clone()),
            ..InterfaceFilter::default()
        },
    )
    .await;
    assert!(
        tagged.iter().filter(|i| i.id != first.id).count() == 0,
        "a second interface was created: {tagged:?}"
    );
    remove(provider, fixture, &first.id).await;
}

/// Needs [`Capabilities::occupied_device_index`]: attaching at the primary's device index 0,
/// or at an index just taken, is refused, and the interface stays available.
pub async fn occupied_device_index_refused<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let first = create_named(provider, fixture, "device_index_a").await;
    let second = create_named(provider, fixture, "device_index_b").await;
    visible(provider, fixture, &second.id).await;
    match attach_at(provider, fixture, &second.id, 0).await {
        Err(CloudError::DeviceIndexInUse { .. }) => {}
        other => panic!("attach at device index 0: expected DeviceIndexInUse, got {other:?}"),
    }
    let (_, index) = attach(provider, fixture, &first.id).await;
    match attach_at(provider, fixture, &second.id, index).await {
        Err(CloudError::DeviceIndexInUse { .. }) => {}
        other => panic!("attach at taken index {index}: expected DeviceIndexInUse, got {other:?}"),
    }
    let second_now = visible(provider, fixture, &second.id).await;
    assert_eq!(second_now.status, InterfaceStatus::Available);
    assert_eq!(second_now.attachment, None);
    remove(provider, fixture, &first.id).await;
    remove(provider, fixture, &second.id).await;
}

/// Needs [`Capabilities::delete_attached_refused`]: deleting an attached interface is
/// `InvalidNetworkInterface.InUse` and the interface stays.
pub async fn delete_attached_refused<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let created = create_named(provider, fixture, "delete_attached").await;
    visible(provider, fixture, &created.id).await;
    attach(provider, fixture, &created.id).await;
    match retrying(&fixture.poll, Action::DeleteNetworkInterface, async || {
        provider.delete_interface(&created.id).await
    })
    .await
    {
        Err(CloudError::InterfaceInUse { .. }) => {}
        other => panic!("delete while attached: expected InterfaceInUse, got {other:?}"),
    }
    let still = wait_for(provider, &fixture.poll, &created.id, "in-use", |i| {
        i.status == InterfaceStatus::InUse
    })
    .await;
    assert!(still.attachment.is_some());
    remove(provider, fixture, &created.id).await;
}

async fn instance_limits<P: CloudProvider>(
    provider: &P,
    fixture: &Fixture,
) -> (usize, crate::InstanceTypeInfo) {
    let instance = must(&fixture.poll, Action::DescribeInstances, async || {
        provider.describe_instance(&fixture.instance_id).await
    })
    .await;
    let types = must(&fixture.poll, Action::DescribeInstanceTypes, async || {
        provider
            .describe_instance_types(std::slice::from_ref(&instance.instance_type))
            .await
    })
    .await;
    (instance.interfaces.len(), types[0].clone())
}

/// Needs [`Capabilities::limits`]: the instance takes interfaces up to its type's limit, and
/// the next attach is `AttachmentLimitExceeded`.
pub async fn limits_attachment<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let (attached, limits) = instance_limits(provider, fixture).await;
    let room = limits.max_interfaces as usize - attached;
    assert!(room >= 1, "the fixture's instance is full: {limits:?}");
    let mut created = Vec::new();
    for n in 0..=room {
        let interface = create_named(provider, fixture, &format!("limit_{n}")).await;
        visible(provider, fixture, &interface.id).await;
        created.push(interface.id);
    }
    for id in &created[..room] {
        attach(provider, fixture, id).await;
    }
    let index = first_free_device_index(provider, fixture).await;
    match attach_at(provider, fixture, &created[room], index).await {
        Err(CloudError::AttachmentLimitExceeded { .. }) => {}
        other => panic!(
            "attach beyond {} interfaces of {}: expected AttachmentLimitExceeded, got {other:?}",
            limits.max_interfaces, limits.instance_type
        ),
    }
    for id in &created {
        remove(provider, fixture, id).await;
    }
}

/// Needs [`Capabilities::limits`]: an attached interface takes addresses up to its type's
/// per-interface limit (the primary included), and one more is `PrivateIpAddressLimitExceeded`
/// with nothing assigned.
pub async fn limits_addresses<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let (_, limits) = instance_limits(provider, fixture).await;
    let created = create_named(provider, fixture, "address_limit").await;
    visible(provider, fixture, &created.id).await;
    attach(provider, fixture, &created.id).await;
    let room = limits.ipv4_per_interface - 1;
    let request = Ipv4Assign::Addresses(Amount::Count(room));
    let assigned = assign_ipv4(provider, fixture, "up to the limit", &created.id, &request).await;
    assert_eq!(assigned.addresses.len(), room as usize);
    match retrying(
        &fixture.poll,
        Action::AssignPrivateIpAddresses,
        async || {
            provider
                .assign_ipv4(&created.id, &Ipv4Assign::Addresses(Amount::Count(1)))
                .await
        },
    )
    .await
    {
        Err(CloudError::PrivateIpAddressLimitExceeded { .. }) => {}
        other => panic!(
            "address {} of {}: expected PrivateIpAddressLimitExceeded, got {other:?}",
            limits.ipv4_per_interface + 1,
            limits.instance_type
        ),
    }
    let after = wait_for(provider, &fixture.poll, &created.id, "full", |i| {
        i.secondary_ipv4.len() == room as usize
    })
    .await;
    assert_eq!(after.secondary_ipv4.len(), room as usize);
    remove(provider, fixture, &created.id).await;
}

/// Needs [`Capabilities::prefix_delegation`] and a Nitro instance: an attached interface gets a
/// /28 prefix, aligned and inside the subnet, seen by describe, and unassigned again.
pub async fn prefix_delegation_ipv4<P: CloudProvider>(provider: &P, fixture: &Fixture) {
    let created = create_named(provider, fixture, "prefix").await;
    visible(provider, fixture, &created.id).await;
    attach(provider, fixture, &created.id).await;
    let request = Ipv4Assign::Prefixes(Amount::Count(1));
    let assigned = assign_ipv4(provider, fixture, "prefix", &created.id, &request).await;
    assert_eq!(assigned.prefixes.len(), 1, "{assigned:?}");
    assert!(assigned.addresses.is_empty());
    let prefix = assigned.prefixes[0];
    assert_eq!(prefix.prefix_len(), 28);
    assert_eq!(prefix.trunc(), prefix, "aligned");
    let subnet = fixture_subnet(provider, fixture).await;
    assert!(
        subnet.ipv4_cidr.contains(&prefix),
        "{prefix} in {}",
        subnet.ipv4_cidr
    );
    assert!(!prefix.contains(&created.primary_ipv4));
    wait_for(provider, &fixture.poll, &created.id, "prefix", |i| {
        i.ipv4_prefixes == vec![prefix]
    })
    .await;
    unassign_ipv4(
        provider,
        fixture,
        "prefix",
        &created.id,
        Ipv4Set {
            addresses: Vec::new(),
            prefixes: vec![prefix],
        },
    )
    .await;
    wait_for(provider, &fixture.poll, &created.id, "no prefix", |i| {
        i.ipv4_prefixes.is_empty()
    })
    .await;
    remove(provider, fixture, &created.id).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeEc2;
    use crate::fake::{InstanceSpec, SubnetSpec};

    fn fake() -> (FakeEc2, Fixture) {
        let fake = FakeEc2::builder()
            .no_latency()
            .strongly_consistent()
            .unthrottled()
            .subnet(SubnetSpec::subnet_a())
            .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
            .build()
            .unwrap();
        (fake, Fixture::new("i-1", "subnet-a"))
    }

    /// Regression (review): a helper that repeats after `Timeout` assigns 2n addresses when the
    /// first `AssignPrivateIpAddresses(Count n)` was applied; after `InternalError` (which may
    /// have been applied as well) the same.
    #[tokio::test(start_paused = true)]
    async fn an_ambiguous_failure_of_an_assign_by_count_is_not_repeated() {
        let (fake, fixture) = fake();
        let eni = create(&fake, &fixture, &create_request(&fixture, "t")).await;
        let assign = Ipv4Assign::Addresses(Amount::Count(2));
        fake.time_out_next(Action::AssignPrivateIpAddresses, 1);
        let result = retrying(
            &fixture.poll,
            Action::AssignPrivateIpAddresses,
            async || fake.assign_ipv4(&eni.id, &assign).await,
        )
        .await;
        assert!(
            matches!(result, Err(CloudError::Timeout { .. })),
            "{result:?}"
        );
        assert_eq!(fake.interface(&eni.id).unwrap().secondary_ipv4.len(), 2);
        fake.fail_next(
            Action::AssignPrivateIpAddresses,
            1,
            CloudError::InternalError {
                message: "oops".to_owned(),
            },
        );
        let result = retrying(
            &fixture.poll,
            Action::AssignPrivateIpAddresses,
            async || fake.assign_ipv4(&eni.id, &assign).await,
        )
        .await;
        assert!(matches!(result, Err(CloudError::InternalError { .. })));
        assert_eq!(fake.counters().calls(Action::AssignPrivateIpAddresses), 2);
        assert_eq!(fake.interface(&eni.id).unwrap().secondary_ipv4.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn throttles_and_ambiguous_failures_of_idempotent_calls_are_repeated() {
        let (fake, fixture) = fake();
        fake.fail_next(
            Action::AssignPrivateIpAddresses,
            2,
            CloudError::RequestLimitExceeded {
                action: Action::AssignPrivateIpAddresses,
            },
        );
        let eni = create(&fake, &fixture, &create_request(&fixture, "t")).await;
        let assigned = retrying(
            &fixture.poll,
            Action::AssignPrivateIpAddresses,
            async || {
                fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
                    .await
            },
        )
        .await
        .unwrap();
        assert_eq!(assigned.addresses.len(), 1);
        assert_eq!(fake.counters().calls(Action::AssignPrivateIpAddresses), 3);

        fake.time_out_next(Action::DescribeNetworkInterfaces, 1);
        let found = retrying(
            &fixture.poll,
            Action::DescribeNetworkInterfaces,
            async || {
                fake.describe_interfaces(&InterfaceFilter::id(&eni.id))
                    .await
            },
        )
        .await
        .unwrap();
        assert_eq!(found.len(), 1);

        // A create with a client token is repeated after a timeout: one interface.
        let mut request = create_request(&fixture, "token");
        request.client_token = Some("contract-token".to_owned());
        fake.time_out_next(Action::CreateNetworkInterface, 1);
        let before = fake.interfaces().len();
        let created = create(&fake, &fixture, &request).await;
        assert_eq!(fake.interfaces().len(), before + 1);
        assert!(fake.interface(&created.id).is_some());
        assert_eq!(fake.counters().calls(Action::CreateNetworkInterface), 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "CreateNetworkInterface failed")]
    async fn a_create_without_a_client_token_that_timed_out_fails_the_check() {
        let (fake, fixture) = fake();
        fake.time_out_next(Action::CreateNetworkInterface, 1);
        create(&fake, &fixture, &create_request(&fixture, "t")).await;
    }
}
