//! `FakeEc2` checked against EC2's numbers: instance-type limits, subnets (reserved addresses,
//! aligned /28s, fragmentation, exhaustion), per-action token buckets, latencies, attachment
//! delays, eventual consistency, termination, client tokens, faults and reproducibility. All on
//! tokio's paused clock: virtual time, no wall-clock assertions.

use crate::common;

use common::subnet;

use std::net::Ipv4Addr;
use std::time::Duration;

use corral_cloud::fake::{BucketLimit, InstanceSpec, Latency, SubnetSpec};
use corral_cloud::{
    Action, Amount, AttachInterface, AttachmentStatus, CloudError, CloudProvider, CreateInterface,
    FakeEc2, InstanceState, InterfaceFilter, InterfaceStatus, Ipv4Assign, Ipv4Set, Ipv6Assign,
    NetworkInterface, SubnetFilter, Tags,
};
use tokio::time::Instant;

fn subnet_a() -> SubnetSpec {
    subnet("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/24")
}

/// A fake with no latency, no lag and no throttling, so each test turns on only what it checks.
fn quiet() -> corral_cloud::fake::FakeEc2Builder {
    unhurried().seed(1).subnet(subnet_a())
}

/// A fake without latency, eventual consistency or throttling, and no subnet yet.
fn unhurried() -> corral_cloud::fake::FakeEc2Builder {
    FakeEc2::builder()
        .no_latency()
        .strongly_consistent()
        .unthrottled()
}

/// [`quiet`] with `subnet-6` (10.0.7.0/24, IPv6 `v6`).
fn with_subnet_6(v6: &str) -> FakeEc2 {
    quiet()
        .subnet(subnet("subnet-6", "vpc-1", "us-east-1a", "10.0.7.0/24").ipv6(v6.parse().unwrap()))
        .build()
        .unwrap()
}

/// An explicit IPv4 prefix assigned to `interface`.
async fn assign_prefix(
    fake: &FakeEc2,
    interface: &str,
    prefix: &str,
) -> Result<Ipv4Set, CloudError> {
    let prefixes = Amount::Explicit(vec![prefix.parse().unwrap()]);
    fake.assign_ipv4(interface, &Ipv4Assign::Prefixes(prefixes))
        .await
}

fn create_in(subnet: &str) -> CreateInterface {
    CreateInterface {
        subnet_id: subnet.to_owned(),
        ..CreateInterface::default()
    }
}

async fn new_interface(fake: &FakeEc2) -> NetworkInterface {
    fake.create_interface(&create_in("subnet-a")).await.unwrap()
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, CloudError>, code: &str) -> CloudError {
    match result {
        Err(error) if error.code() == code => error,
        other => panic!("expected {code}, got {other:?}"),
    }
}

// ---- token buckets ----

#[tokio::test(start_paused = true)]
async fn describe_bucket_is_100_then_20_per_second() {
    let fake = FakeEc2::builder()
        .no_latency()
        .subnet(subnet_a())
        .build()
        .unwrap();
    let filter = SubnetFilter::default();
    for n in 0..100 {
        assert!(fake.describe_subnets(&filter).await.is_ok(), "call {n}");
    }
    assert_code(fake.describe_subnets(&filter).await, "RequestLimitExceeded");
    // A throttled call consumes nothing: ten more refusals leave the refill intact.
    for _ in 0..10 {
        assert!(fake.describe_subnets(&filter).await.is_err());
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    for n in 0..20 {
        assert!(fake.describe_subnets(&filter).await.is_ok(), "refill {n}");
    }
    assert!(fake.describe_subnets(&filter).await.is_err());
    let counters = fake.counters();
    assert_eq!(counters.calls(Action::DescribeSubnets), 132);
    assert_eq!(counters.throttled(Action::DescribeSubnets), 12);
    // Each describe action has its own bucket.
    assert!(
        fake.describe_instance_types(&["m5.large".to_owned()])
            .await
            .is_ok()
    );
    assert_eq!(fake.counters().throttled(Action::DescribeInstanceTypes), 0);
}

#[tokio::test(start_paused = true)]
async fn assign_bucket_refills_5_per_second_and_counts_failed_calls() {
    let fake = FakeEc2::builder()
        .no_latency()
        .subnet(subnet_a())
        .build()
        .unwrap();
    let request = Ipv4Assign::Addresses(Amount::Count(1));
    // Calls that EC2 admits and then refuses (here: no such interface) still take a token.
    for _ in 0..100 {
        assert_code(
            fake.assign_ipv4("eni-missing", &request).await,
            "InvalidNetworkInterfaceID.NotFound",
        );
    }
    assert_code(
        fake.assign_ipv4("eni-missing", &request).await,
        "RequestLimitExceeded",
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_code(
        fake.assign_ipv4("eni-missing", &request).await,
        "InvalidNetworkInterfaceID.NotFound",
    );
    assert_code(
        fake.assign_ipv4("eni-missing", &request).await,
        "RequestLimitExceeded",
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut admitted = 0;
    while fake
        .assign_ipv4("eni-missing", &request)
        .await
        .is_err_and(|e| e.is_not_found())
    {
        admitted += 1;
    }
    assert_eq!(admitted, 5);
    assert_eq!(
        fake.counters().throttled(Action::AssignPrivateIpAddresses),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn attach_bucket_is_50_then_5_per_second() {
    let fake = FakeEc2::builder()
        .no_latency()
        .subnet(subnet_a())
        .build()
        .unwrap();
    for _ in 0..50 {
        assert_code(
            fake.attach_interface(AttachInterface::new("eni-missing", "i-missing", 1))
                .await,
            "InvalidNetworkInterfaceID.NotFound",
        );
    }
    assert_code(
        fake.detach_interface("eni-attach-missing", false).await,
        "InvalidAttachmentID.NotFound",
    );
    assert_code(
        fake.attach_interface(AttachInterface::new("eni-missing", "i-missing", 1))
            .await,
        "RequestLimitExceeded",
    );
    assert_eq!(
        fake.bucket_tokens(Action::AttachNetworkInterface),
        Some(0.0)
    );
    assert_eq!(
        fake.bucket_tokens(Action::DetachNetworkInterface),
        Some(49.0)
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        fake.bucket_tokens(Action::AttachNetworkInterface),
        Some(10.0)
    );
    assert_eq!(
        fake.bucket_tokens(Action::CreateNetworkInterface),
        Some(100.0),
        "full buckets stay at their burst"
    );
}

#[tokio::test(start_paused = true)]
async fn buckets_are_shared_by_every_handle_of_the_account() {
    let fake = FakeEc2::builder()
        .no_latency()
        .subnet(subnet_a())
        .build()
        .unwrap();
    let other_tenant = fake.clone();
    for _ in 0..100 {
        other_tenant
            .create_tags(&["subnet-a".to_owned()], &Tags::new())
            .await
            .unwrap();
    }
    assert_code(
        fake.create_tags(&["subnet-a".to_owned()], &Tags::new())
            .await,
        "RequestLimitExceeded",
    );
    assert_eq!(fake.counters().calls(Action::CreateTags), 101);
}

#[tokio::test(start_paused = true)]
async fn a_custom_bucket_replaces_the_default() {
    let fake = FakeEc2::builder()
        .no_latency()
        .subnet(subnet_a())
        .bucket(
            Action::DescribeSubnets,
            Some(BucketLimit {
                burst: 2,
                per_second: 1,
            }),
        )
        .build()
        .unwrap();
    let filter = SubnetFilter::default();
    assert!(fake.describe_subnets(&filter).await.is_ok());
    assert!(fake.describe_subnets(&filter).await.is_ok());
    assert!(fake.describe_subnets(&filter).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn throttle_storm_refuses_a_fraction_and_ends() {
    let fake = quiet().build().unwrap();
    fake.throttle_storm(0.5, Duration::from_secs(10));
    let filter = SubnetFilter::default();
    let mut refused = 0;
    for _ in 0..400 {
        if fake.describe_subnets(&filter).await.is_err() {
            refused += 1;
        }
    }
    assert!(
        (150..=250).contains(&refused),
        "{refused} of 400 refused at p = 0.5"
    );
    assert_eq!(fake.counters().throttled(Action::DescribeSubnets), refused);
    tokio::time::advance(Duration::from_secs(10)).await;
    for _ in 0..100 {
        assert!(fake.describe_subnets(&filter).await.is_ok());
    }
}

// ---- instance-type limits ----

#[tokio::test(start_paused = true)]
async fn m5_large_refuses_a_fourth_interface_and_an_eleventh_address() {
    let fake = quiet()
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    let mut interfaces = Vec::new();
    for _ in 0..3 {
        interfaces.push(new_interface(&fake).await.id);
    }
    fake.attach_interface(AttachInterface::new(&interfaces[0], "i-1", 1))
        .await
        .unwrap();
    fake.attach_interface(AttachInterface::new(&interfaces[1], "i-1", 2))
        .await
        .unwrap();
    assert_code(
        fake.attach_interface(AttachInterface::new(&interfaces[2], "i-1", 3))
            .await,
        "AttachmentLimitExceeded",
    );
    assert_eq!(
        fake.interface(&interfaces[2]).unwrap().status,
        InterfaceStatus::Available
    );

    // 10 addresses per interface, the primary included.
    let eni = &interfaces[0];
    let nine = fake
        .assign_ipv4(eni, &Ipv4Assign::Addresses(Amount::Count(9)))
        .await
        .unwrap();
    assert_eq!(nine.addresses.len(), 9);
    let free_before = fake.subnet_free_ipv4("subnet-a").unwrap();
    assert_code(
        fake.assign_ipv4(eni, &Ipv4Assign::Addresses(Amount::Count(1)))
            .await,
        "PrivateIpAddressLimitExceeded",
    );
    assert_eq!(fake.subnet_free_ipv4("subnet-a").unwrap(), free_before);
    assert_eq!(fake.interface(eni).unwrap().secondary_ipv4.len(), 9);

    // A prefix takes one of the ten slots.
    let other = &interfaces[1];
    fake.assign_ipv4(other, &Ipv4Assign::Addresses(Amount::Count(8)))
        .await
        .unwrap();
    fake.assign_ipv4(other, &Ipv4Assign::Prefixes(Amount::Count(1)))
        .await
        .unwrap();
    assert_code(
        fake.assign_ipv4(other, &Ipv4Assign::Prefixes(Amount::Count(1)))
            .await,
        "PrivateIpAddressLimitExceeded",
    );
}

#[tokio::test(start_paused = true)]
async fn every_listed_type_enforces_its_interface_limit() {
    let table = [
        ("t2.micro", 2, 2),
        ("t3.nano", 2, 2),
        ("t3.small", 3, 4),
        ("t3.medium", 3, 6),
        ("t3.large", 3, 12),
        ("m4.large", 2, 10),
        ("m5.large", 3, 10),
        ("m5.xlarge", 4, 15),
        ("m5.4xlarge", 8, 30),
        ("m5.24xlarge", 15, 50),
    ];
    let fake = unhurried()
        .subnet(subnet("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/20"))
        .build()
        .unwrap();
    let names: Vec<String> = table
        .iter()
        .map(|(name, _, _)| (*name).to_owned())
        .collect();
    let described = fake.describe_instance_types(&names).await.unwrap();
    for ((name, interfaces, addresses), info) in table.iter().zip(&described) {
        assert_eq!(info.instance_type, *name);
        assert_eq!(info.max_interfaces, *interfaces, "{name}");
        assert_eq!(info.ipv4_per_interface, *addresses, "{name}");
        assert_eq!(info.ipv6_per_interface, *addresses, "{name}");
        assert_eq!(
            info.prefix_delegation,
            !name.starts_with("t2") && !name.starts_with("m4")
        );

        let instance = fake
            .launch_instance(InstanceSpec::new(name, "subnet-a"))
            .unwrap();
        for index in 1..*interfaces {
            let eni = new_interface(&fake).await;
            fake.attach_interface(AttachInterface::new(&eni.id, &instance, index))
                .await
                .unwrap();
            fake.assign_ipv4(
                &eni.id,
                &Ipv4Assign::Addresses(Amount::Count(addresses - 1)),
            )
            .await
            .unwrap();
            assert_code(
                fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
                    .await,
                "PrivateIpAddressLimitExceeded",
            );
        }
        let extra = new_interface(&fake).await;
        assert_code(
            fake.attach_interface(AttachInterface::new(&extra.id, &instance, *interfaces))
                .await,
            "AttachmentLimitExceeded",
        );
        fake.delete_interface(&extra.id).await.unwrap();
    }
    assert_code(
        fake.describe_instance_types(&["x9.huge".to_owned()]).await,
        "InvalidParameterValue",
    );
}

#[tokio::test(start_paused = true)]
async fn xen_types_refuse_prefixes() {
    let fake = quiet()
        .instance(InstanceSpec::new("t2.micro", "subnet-a").id("i-xen"))
        .instance(InstanceSpec::new("m4.large", "subnet-a").id("i-m4"))
        .build()
        .unwrap();
    let primary = fake.describe_instance("i-xen").await.unwrap().interfaces[0]
        .interface_id
        .clone();
    let free = fake.subnet_free_ipv4("subnet-a").unwrap();
    assert_code(
        fake.assign_ipv4(&primary, &Ipv4Assign::Prefixes(Amount::Count(1)))
            .await,
        "InvalidParameterValue",
    );
    assert_code(
        fake.assign_ipv6(&primary, &Ipv6Assign::Prefixes(Amount::Count(1)))
            .await,
        "InvalidParameterValue",
    );
    assert_eq!(fake.subnet_free_ipv4("subnet-a").unwrap(), free);
    // An interface that got a prefix while unattached cannot join a Xen instance.
    let eni = new_interface(&fake).await;
    fake.assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Count(1)))
        .await
        .unwrap();
    assert_code(
        fake.attach_interface(AttachInterface::new(&eni.id, "i-m4", 1))
            .await,
        "InvalidParameterValue",
    );
    // ... nor one holding more addresses than the type allows per interface.
    let crowded = new_interface(&fake).await;
    fake.assign_ipv4(&crowded.id, &Ipv4Assign::Addresses(Amount::Count(2)))
        .await
        .unwrap();
    assert_code(
        fake.attach_interface(AttachInterface::new(&crowded.id, "i-xen", 1))
            .await,
        "PrivateIpAddressLimitExceeded",
    );
}

// ---- subnets ----

#[tokio::test(start_paused = true)]
async fn subnets_reserve_aws_addresses_and_delegate_aligned_prefixes() {
    let fake = quiet().build().unwrap();
    let subnet = &fake
        .describe_subnets(&SubnetFilter::default())
        .await
        .unwrap()[0];
    assert_eq!(subnet.available_ipv4, 256 - 5);
    let eni = new_interface(&fake).await;
    assert_eq!(eni.primary_ipv4, Ipv4Addr::new(10, 0, 0, 4));
    let prefixes = fake
        .assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Count(2)))
        .await
        .unwrap()
        .prefixes;
    assert_eq!(
        prefixes,
        vec![
            "10.0.0.16/28".parse().unwrap(),
            "10.0.0.32/28".parse().unwrap()
        ]
    );
    assert_eq!(fake.subnet_free_ipv4("subnet-a"), Some(251 - 1 - 32));
    // An explicit prefix must be aligned and free.
    assert_code(
        assign_prefix(&fake, &eni.id, "10.0.0.40/28").await,
        "InvalidParameterValue",
    );
    assert_code(
        assign_prefix(&fake, &eni.id, "10.0.0.32/28").await,
        "InvalidIPAddress.InUse",
    );
}

#[tokio::test(start_paused = true)]
async fn a_fragmented_subnet_refuses_a_prefix_but_grants_an_address() {
    let fake = FakeEc2::builder()
        .seed(3)
        .no_latency()
        .strongly_consistent()
        .unthrottled()
        .subnet(subnet_a().fragmented(1.0))
        .build()
        .unwrap();
    let eni = new_interface(&fake).await;
    let free = fake.subnet_free_ipv4("subnet-a").unwrap();
    assert!(
        free > 200,
        "fragmentation takes one address per /28: {free} free"
    );
    let error = assert_code(
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Count(1)))
            .await,
        "InsufficientCidrBlocks",
    );
    assert!(!error.is_retryable());
    assert_eq!(fake.subnet_free_ipv4("subnet-a"), Some(free));
    let granted = fake
        .assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
        .await
        .unwrap();
    assert_eq!(granted.addresses.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_subnet_refuses_with_insufficient_free_addresses() {
    let fake = unhurried()
        .subnet(subnet("subnet-tiny", "vpc-1", "us-east-1a", "10.0.9.0/28"))
        .build()
        .unwrap();
    let mut request = create_in("subnet-tiny");
    request.secondary_ipv4 = Some(Amount::Count(12));
    assert_code(
        fake.create_interface(&request).await,
        "InsufficientFreeAddressesInSubnet",
    );
    assert_eq!(
        fake.interfaces().len(),
        0,
        "a refused create leaves nothing"
    );
    assert_eq!(fake.subnet_free_ipv4("subnet-tiny"), Some(11));
    request.secondary_ipv4 = Some(Amount::Count(10));
    let eni = fake.create_interface(&request).await.unwrap();
    assert_eq!(eni.secondary_ipv4.len(), 10);
    assert_code(
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
            .await,
        "InsufficientFreeAddressesInSubnet",
    );
    // Deleting frees every address again.
    fake.delete_interface(&eni.id).await.unwrap();
    assert_eq!(fake.subnet_free_ipv4("subnet-tiny"), Some(11));
}

#[tokio::test(start_paused = true)]
async fn ipv6_addresses_and_prefixes() {
    let fake = unhurried()
        .subnet(subnet_a().ipv6("2600:1f18:1:2::/64".parse().unwrap()))
        .subnet(subnet("subnet-v4", "vpc-1", "us-east-1a", "10.0.1.0/24"))
        .build()
        .unwrap();
    let mut request = create_in("subnet-a");
    request.ipv6_addresses = Some(Amount::Count(2));
    let eni = fake.create_interface(&request).await.unwrap();
    assert_eq!(eni.ipv6_addresses.len(), 2);
    let prefixes = fake
        .assign_ipv6(&eni.id, &Ipv6Assign::Prefixes(Amount::Count(1)))
        .await
        .unwrap()
        .prefixes;
    assert_eq!(prefixes[0].prefix_len(), 80);
    assert!(
        "2600:1f18:1:2::/64"
            .parse::<ipnet::Ipv6Net>()
            .unwrap()
            .contains(&prefixes[0])
    );
    let v4_only = fake
        .create_interface(&create_in("subnet-v4"))
        .await
        .unwrap();
    assert_code(
        fake.assign_ipv6(&v4_only.id, &Ipv6Assign::Addresses(Amount::Count(1)))
            .await,
        "InvalidParameterValue",
    );
    fake.unassign_ipv6(
        &eni.id,
        &corral_cloud::Ipv6Set {
            addresses: eni.ipv6_addresses.clone(),
            prefixes,
        },
    )
    .await
    .unwrap();
    let after = fake.interface(&eni.id).unwrap();
    assert!(after.ipv6_addresses.is_empty() && after.ipv6_prefixes.is_empty());
}

/// Regression (review): the subnet's first /80, where addresses by count come from, was
/// accepted as an explicit prefix; the next `assign_ipv6(Count(1))` then stepped through its
/// 2^48 addresses one at a time, holding the account's lock forever. EC2 refuses it.
#[tokio::test(start_paused = true)]
async fn ipv6_first_80_is_refused_as_a_prefix_and_count_assigns_still_answer() {
    let fake = with_subnet_6("2600:1f18:0:1::/64");
    let mut request = create_in("subnet-6");
    request.ipv6_prefixes = Some(Amount::Explicit(vec![
        "2600:1f18:0:1::/80".parse().unwrap(),
    ]));
    assert_code(
        fake.create_interface(&request).await,
        "InvalidParameterValue",
    );
    assert!(
        fake.interfaces().is_empty(),
        "a refused create leaves nothing"
    );
    request.ipv6_prefixes = Some(Amount::Explicit(vec![
        "2600:1f18:0:1:1::/80".parse().unwrap(),
    ]));
    let eni = fake.create_interface(&request).await.unwrap();
    let assigned = fake
        .assign_ipv6(&eni.id, &Ipv6Assign::Addresses(Amount::Count(1)))
        .await
        .unwrap();
    assert_eq!(
        assigned.addresses,
        vec!["2600:1f18:0:1::1".parse::<std::net::Ipv6Addr>().unwrap()]
    );
    let next = fake
        .assign_ipv6(&eni.id, &Ipv6Assign::Prefixes(Amount::Count(1)))
        .await
        .unwrap();
    assert_eq!(
        next.prefixes,
        vec!["2600:1f18:0:1:2::/80".parse::<ipnet::Ipv6Net>().unwrap()]
    );
}

#[tokio::test(start_paused = true)]
async fn unassigning_what_the_interface_lacks_changes_nothing() {
    let fake = quiet().build().unwrap();
    let eni = new_interface(&fake).await;
    let held = fake
        .assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(2)))
        .await
        .unwrap()
        .addresses;
    let release = Ipv4Set {
        addresses: vec![held[0], Ipv4Addr::new(10, 0, 0, 200)],
        prefixes: Vec::new(),
    };
    assert_code(
        fake.unassign_ipv4(&eni.id, &release).await,
        "InvalidParameterValue",
    );
    assert_eq!(fake.interface(&eni.id).unwrap().secondary_ipv4, held);
    let primary = Ipv4Set {
        addresses: vec![eni.primary_ipv4],
        prefixes: Vec::new(),
    };
    assert_code(
        fake.unassign_ipv4(&eni.id, &primary).await,
        "InvalidParameterValue",
    );
}

// ---- attachments and instances ----

#[tokio::test(start_paused = true)]
async fn attachments_complete_between_one_and_eight_seconds_later() {
    let fake = FakeEc2::builder()
        .seed(7)
        .strongly_consistent()
        .unthrottled()
        .subnet(subnet_a())
        .instance(InstanceSpec::new("m5.24xlarge", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    let mut completions = Vec::new();
    for index in 1..15 {
        let eni = fake.create_interface(&create_in("subnet-a")).await.unwrap();
        fake.attach_interface(AttachInterface::new(&eni.id, "i-1", index))
            .await
            .unwrap();
        let attached_at = Instant::now();
        let seen = fake
            .describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await
            .unwrap();
        assert_eq!(seen[0].status, InterfaceStatus::Attaching);
        assert_eq!(
            seen[0].attachment.as_ref().unwrap().status,
            AttachmentStatus::Attaching
        );
        while fake.interface(&eni.id).unwrap().status != InterfaceStatus::InUse {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        completions.push(attached_at.elapsed());
    }
    for completion in &completions {
        assert!(
            *completion >= Duration::from_millis(900) && *completion <= Duration::from_millis(8100),
            "{completions:?}"
        );
    }
    let spread = completions
        .iter()
        .max()
        .unwrap()
        .saturating_sub(*completions.iter().min().unwrap());
    assert!(
        spread > Duration::from_secs(2),
        "uniform over 1–8 s: {completions:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn detach_goes_through_detaching_and_delete_waits_for_it() {
    let fake = FakeEc2::builder()
        .strongly_consistent()
        .unthrottled()
        .detach_delay(Duration::from_secs(3), Duration::from_secs(3))
        .attach_delay(Duration::ZERO, Duration::ZERO)
        .subnet(subnet_a())
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    let eni = fake.create_interface(&create_in("subnet-a")).await.unwrap();
    let attachment = fake
        .attach_interface(AttachInterface::new(&eni.id, "i-1", 1))
        .await
        .unwrap();
    assert_code(
        fake.delete_interface(&eni.id).await,
        "InvalidNetworkInterface.InUse",
    );
    fake.detach_interface(&attachment, false).await.unwrap();
    assert_eq!(
        fake.interface(&eni.id).unwrap().status,
        InterfaceStatus::Detaching
    );
    assert_code(
        fake.delete_interface(&eni.id).await,
        "InvalidNetworkInterface.InUse",
    );
    // The device index stays taken until the detachment completes.
    let other = fake.create_interface(&create_in("subnet-a")).await.unwrap();
    assert_code(
        fake.attach_interface(AttachInterface::new(&other.id, "i-1", 1))
            .await,
        "InvalidParameterValue",
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        fake.interface(&eni.id).unwrap().status,
        InterfaceStatus::Available
    );
    fake.delete_interface(&eni.id).await.unwrap();
    assert!(fake.interface(&eni.id).is_none());
    fake.attach_interface(AttachInterface::new(&other.id, "i-1", 1))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn occupied_device_index_and_instances_not_running() {
    let fake = quiet()
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .instance(
            InstanceSpec::new("m5.large", "subnet-a")
                .id("i-pending")
                .state(InstanceState::Pending),
        )
        .build()
        .unwrap();
    let eni = new_interface(&fake).await;
    let error = assert_code(
        fake.attach_interface(AttachInterface::new(&eni.id, "i-1", 0))
            .await,
        "InvalidParameterValue",
    );
    assert!(
        matches!(error, CloudError::DeviceIndexInUse { .. }),
        "{error:?}"
    );
    let error = assert_code(
        fake.attach_interface(AttachInterface::new(&eni.id, "i-pending", 1))
            .await,
        "IncorrectInstanceState",
    );
    assert!(error.is_retryable());
    fake.set_instance_state("i-1", InstanceState::Stopped)
        .unwrap();
    assert_code(
        fake.attach_interface(AttachInterface::new(&eni.id, "i-1", 1))
            .await,
        "IncorrectInstanceState",
    );
    fake.set_instance_state("i-1", InstanceState::Running)
        .unwrap();
    fake.attach_interface(AttachInterface::new(&eni.id, "i-1", 1))
        .await
        .unwrap();
    let primary = fake.describe_instance("i-1").await.unwrap().interfaces[0].clone();
    assert_code(
        fake.detach_interface(&primary.attachment.id, true).await,
        "OperationNotPermitted",
    );
}

#[tokio::test(start_paused = true)]
async fn termination_deletes_delete_on_termination_interfaces_and_frees_the_rest() {
    let fake = quiet()
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    let instance = fake.describe_instance("i-1").await.unwrap();
    let primary = instance.interfaces[0].interface_id.clone();
    let secondary = new_interface(&fake).await;
    fake.attach_interface(AttachInterface::new(&secondary.id, "i-1", 1))
        .await
        .unwrap();
    fake.assign_ipv4(&primary, &Ipv4Assign::Addresses(Amount::Count(5)))
        .await
        .unwrap();
    let free_before = fake.subnet_free_ipv4("subnet-a").unwrap();
    fake.terminate_instance("i-1").unwrap();
    assert_eq!(fake.instance_state("i-1"), Some(InstanceState::Terminated));
    assert!(fake.interface(&primary).is_none());
    assert_eq!(fake.subnet_free_ipv4("subnet-a"), Some(free_before + 6));
    let left = fake.interface(&secondary.id).unwrap();
    assert_eq!(left.status, InterfaceStatus::Available);
    assert_eq!(left.attachment, None);
    let instance = fake.describe_instance("i-1").await.unwrap();
    assert_eq!(instance.state, InstanceState::Terminated);
    assert!(instance.interfaces.is_empty());
    assert_code(
        fake.attach_interface(AttachInterface::new(&secondary.id, "i-1", 1))
            .await,
        "IncorrectInstanceState",
    );
}

// ---- client tokens ----

#[tokio::test(start_paused = true)]
async fn a_client_token_makes_create_idempotent() {
    let fake = quiet().build().unwrap();
    let mut request = create_in("subnet-a");
    request.client_token = Some("token-1".to_owned());
    let first = fake.create_interface(&request).await.unwrap();
    let again = fake.create_interface(&request).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(fake.interfaces().len(), 1);
    request.description = Some("changed".to_owned());
    let error = assert_code(
        fake.create_interface(&request).await,
        "IdempotentParameterMismatch",
    );
    assert!(matches!(&error, CloudError::Other { .. }));
    request.client_token = Some("token-2".to_owned());
    fake.create_interface(&request).await.unwrap();
    assert_eq!(fake.interfaces().len(), 2);
}

// ---- faults ----

#[tokio::test(start_paused = true)]
async fn applied_but_timed_out_is_really_applied() {
    let fake = quiet().build().unwrap();
    let eni = new_interface(&fake).await;
    fake.time_out_next(Action::AssignPrivateIpAddresses, 1);
    let started = Instant::now();
    let error = assert_code(
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(2)))
            .await,
        "Timeout",
    );
    assert!(error.is_ambiguous() && !error.is_retryable());
    assert!(
        !error.can_repeat(false),
        "an assign by count is not repeated blindly"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(5),
        "answered after the timeout"
    );
    assert_eq!(fake.interface(&eni.id).unwrap().secondary_ipv4.len(), 2);

    // A create that timed out, repeated with its client token, yields the one interface.
    fake.time_out_next(Action::CreateNetworkInterface, 1);
    let mut request = create_in("subnet-a");
    request.client_token = Some("retry-me".to_owned());
    let error = assert_code(fake.create_interface(&request).await, "Timeout");
    assert!(error.can_repeat(request.client_token.is_some()));
    assert_eq!(fake.interfaces().len(), 2);
    let retried = fake.create_interface(&request).await.unwrap();
    assert_eq!(fake.interfaces().len(), 2);
    assert!(fake.interface(&retried.id).is_some());
    assert_eq!(fake.counters().faults(Action::CreateNetworkInterface), 1);
}

#[tokio::test(start_paused = true)]
async fn internal_errors_and_scripted_failures_apply_nothing() {
    let fake = quiet()
        .internal_error_rate(Action::CreateNetworkInterface, 1.0)
        .build()
        .unwrap();
    let error = assert_code(
        fake.create_interface(&create_in("subnet-a")).await,
        "InternalError",
    );
    // The fake applies nothing, but a caller cannot know that: EC2's 5xx is ambiguous.
    assert!(error.is_ambiguous() && !error.is_retryable());
    assert!(fake.interfaces().is_empty());
    fake.set_fault_rates(Action::CreateNetworkInterface, 0.0, 0.0);
    fake.fail_next(
        Action::CreateNetworkInterface,
        2,
        CloudError::InsufficientFreeAddressesInSubnet {
            message: "scripted".to_owned(),
        },
    );
    for _ in 0..2 {
        assert_code(
            fake.create_interface(&create_in("subnet-a")).await,
            "InsufficientFreeAddressesInSubnet",
        );
    }
    assert!(fake.interfaces().is_empty());
    fake.create_interface(&create_in("subnet-a")).await.unwrap();
    assert_eq!(fake.counters().faults(Action::CreateNetworkInterface), 3);
}

#[tokio::test(start_paused = true)]
async fn random_timeouts_apply_about_their_rate() {
    let fake = quiet()
        .timeout_rate(Action::CreateTags, 0.2)
        .timeout_after(Duration::ZERO)
        .build()
        .unwrap();
    let eni = new_interface(&fake).await;
    let mut timeouts = 0;
    for n in 0..500 {
        let tags = Tags::from([(format!("k{n}"), "v".to_owned())]);
        if fake
            .create_tags(std::slice::from_ref(&eni.id), &tags)
            .await
            .is_err()
        {
            timeouts += 1;
        }
    }
    assert!(
        (70..=130).contains(&timeouts),
        "{timeouts} of 500 at p = 0.2"
    );
    assert_eq!(
        fake.interface(&eni.id).unwrap().tags.len(),
        500,
        "all were applied"
    );
}

// ---- latencies ----

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64) * p) as usize]
}

#[tokio::test(start_paused = true)]
async fn latencies_are_lognormal_around_their_medians() {
    let fake = FakeEc2::builder()
        .seed(11)
        .unthrottled()
        .subnet(subnet_a())
        .build()
        .unwrap();
    let samples = 2001;
    let mut create = Vec::with_capacity(samples);
    let mut describe = Vec::with_capacity(samples);
    let missing = create_in("subnet-missing");
    for _ in 0..samples {
        let started = Instant::now();
        assert!(fake.create_interface(&missing).await.is_err());
        create.push(started.elapsed());
        let started = Instant::now();
        fake.describe_subnets(&SubnetFilter::default())
            .await
            .unwrap();
        describe.push(started.elapsed());
    }
    let within = |value: Duration, target: Duration, tolerance: f64| {
        let ratio = value.as_secs_f64() / target.as_secs_f64();
        (1.0 - tolerance..=1.0 + tolerance).contains(&ratio)
    };
    let create_latency = Latency::default_for(Action::CreateNetworkInterface);
    let describe_latency = Latency::default_for(Action::DescribeSubnets);
    assert_eq!(create_latency.median, Duration::from_millis(350));
    let create_median = median(&mut create);
    let describe_median = median(&mut describe);
    assert!(
        within(create_median, create_latency.median, 0.1),
        "{create_median:?}"
    );
    assert!(
        within(describe_median, describe_latency.median, 0.1),
        "{describe_median:?}"
    );
    let create_p99 = percentile(&mut create, 0.99);
    assert!(
        within(create_p99, create_latency.p99, 0.3),
        "{create_p99:?}"
    );
    assert!(create.iter().all(|d| !d.is_zero()));
}

// ---- eventual consistency ----

#[tokio::test(start_paused = true)]
async fn describe_lags_changes_then_catches_up() {
    // Exp(1 h) capped at 2 s is 2 s for all but a handful of draws in ten thousand.
    let fake = quiet()
        .consistency_lag(Duration::from_secs(3600), Duration::from_secs(2))
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    let eni = new_interface(&fake).await;
    assert_code(
        fake.describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await,
        "InvalidNetworkInterfaceID.NotFound",
    );
    assert!(
        fake.interface(&eni.id).is_some(),
        "the truth has it at once"
    );
    // Mutations act on the truth: the caller may assign before describe sees the interface.
    fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(1)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = fake
        .describe_interfaces(&InterfaceFilter::id(&eni.id))
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    // The assign came later than the create, so it shows no earlier than it.
    let versions_seen = seen[0].secondary_ipv4.len();
    fake.attach_interface(AttachInterface::new(&eni.id, "i-1", 1))
        .await
        .unwrap();
    let described = fake.describe_instance("i-1").await.unwrap();
    assert_eq!(
        described.interfaces.len(),
        1,
        "the attachment is not visible yet"
    );
    assert_eq!(
        fake.describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await
            .unwrap()[0]
            .attachment,
        None
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let caught_up = fake
        .describe_interfaces(&InterfaceFilter::id(&eni.id))
        .await
        .unwrap();
    assert_eq!(caught_up[0].secondary_ipv4.len(), 1);
    assert!(versions_seen <= 1);
    assert_eq!(caught_up[0].status, InterfaceStatus::InUse);
    assert_eq!(
        fake.describe_instance("i-1")
            .await
            .unwrap()
            .interfaces
            .len(),
        2
    );
    // A deletion also lags: the interface is still described for a while.
    fake.detach_interface(&caught_up[0].attachment.as_ref().unwrap().id, false)
        .await
        .unwrap();
    fake.delete_interface(&eni.id).await.unwrap();
    assert!(
        fake.describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await
            .is_ok()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_code(
        fake.describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await,
        "InvalidNetworkInterfaceID.NotFound",
    );
}

#[tokio::test(start_paused = true)]
async fn deleted_interfaces_are_forgotten_once_every_describe_sees_it() {
    let fake = quiet()
        .consistency_lag(Duration::from_millis(500), Duration::from_secs(5))
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    for _ in 0..50 {
        let eni = new_interface(&fake).await;
        let attachment = fake
            .attach_interface(AttachInterface::new(&eni.id, "i-1", 1))
            .await
            .unwrap();
        fake.detach_interface(&attachment, false).await.unwrap();
        fake.delete_interface(&eni.id).await.unwrap();
    }
    assert_eq!(fake.interfaces().len(), 1, "the primary");
    tokio::time::sleep(Duration::from_secs(5)).await;
    fake.describe_subnets(&SubnetFilter::default())
        .await
        .unwrap();
    assert_eq!(fake.interface_records(), 1);
    let instance = fake.describe_instance("i-1").await.unwrap();
    assert_eq!(instance.interfaces.len(), 1);
}

// ---- reproducibility and scale ----

/// A run with latencies, lag, attach delays and random faults, traced call by call.
async fn traced_run(seed: u64) -> Vec<String> {
    let fake = FakeEc2::builder()
        .seed(seed)
        .subnet(subnet_a().fragmented(0.5))
        .instance(InstanceSpec::new("m5.4xlarge", "subnet-a").id("i-1"))
        .internal_error_rate(Action::AssignPrivateIpAddresses, 0.2)
        .timeout_rate(Action::CreateNetworkInterface, 0.2)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut trace = Vec::new();
    for index in 1..8 {
        let created = fake.create_interface(&create_in("subnet-a")).await;
        trace.push(format!("{:?} create {created:?}", start.elapsed()));
        let Ok(eni) = created else { continue };
        let attached = fake
            .attach_interface(AttachInterface::new(&eni.id, "i-1", index))
            .await;
        trace.push(format!("{:?} attach {attached:?}", start.elapsed()));
        let assigned = fake
            .assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Count(1)))
            .await;
        trace.push(format!("{:?} assign {assigned:?}", start.elapsed()));
        let seen = fake
            .describe_interfaces(&InterfaceFilter::id(&eni.id))
            .await;
        trace.push(format!("{:?} describe {seen:?}", start.elapsed()));
    }
    trace.push(format!("{:?}", fake.counters()));
    trace
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_run() {
    let first = traced_run(42).await;
    let second = traced_run(42).await;
    assert_eq!(first, second);
    let other = traced_run(43).await;
    assert_ne!(first, other);
}

/// 1,000 m5.large nodes each create, attach and fill a second interface through one account,
/// retrying throttled calls after a backoff: every node ends with 2 interfaces and 18
/// secondaries, no address is handed out twice, and the run cannot beat the create bucket
/// ((1000 - 100) / 5 = 180 s of virtual time).
#[tokio::test(start_paused = true)]
async fn a_thousand_nodes_scale_out_within_the_buckets() {
    let fake = FakeEc2::builder()
        .seed(1000)
        .subnet(subnet("subnet-big", "vpc-1", "us-east-1a", "10.1.0.0/16"))
        .build()
        .unwrap();
    let nodes: Vec<String> = (0..1000)
        .map(|_| {
            fake.launch_instance(InstanceSpec::new("m5.large", "subnet-big"))
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let wall = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, node) in nodes.iter().enumerate() {
        let fake = fake.clone();
        let node = node.clone();
        tasks.spawn(async move {
            let mut backoff = Duration::from_millis(200 + (n as u64 % 7) * 50);
            macro_rules! retry {
                ($call:expr) => {
                    loop {
                        match $call.await {
                            Err(error) if error.is_retryable() => {
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(20));
                            }
                            other => break other.unwrap(),
                        }
                    }
                };
            }
            let mut request = create_in("subnet-big");
            request.client_token = Some(format!("{node}-eni-1"));
            let eni = retry!(fake.create_interface(&request));
            retry!(fake.attach_interface(AttachInterface::new(&eni.id, &node, 1)));
            let primary = retry!(fake.describe_instance(&node)).interfaces[0]
                .interface_id
                .clone();
            retry!(fake.assign_ipv4(&primary, &Ipv4Assign::Addresses(Amount::Count(9))));
            retry!(fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(9))));
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    let virtual_time = started.elapsed();
    let interfaces = fake.interfaces();
    assert_eq!(interfaces.len(), 2000);
    let mut addresses: Vec<Ipv4Addr> = interfaces
        .iter()
        .flat_map(|i| i.secondary_ipv4.iter().copied().chain([i.primary_ipv4]))
        .collect();
    assert_eq!(addresses.len(), 2000 * 10);
    addresses.sort();
    addresses.dedup();
    assert_eq!(
        addresses.len(),
        2000 * 10,
        "an address was handed out twice"
    );
    assert!(virtual_time >= Duration::from_secs(180), "{virtual_time:?}");
    let counters = fake.counters();
    assert_eq!(
        counters.calls(Action::CreateNetworkInterface)
            - counters.throttled(Action::CreateNetworkInterface),
        1000
    );
    println!(
        "1000 nodes: {virtual_time:?} virtual, {:?} wall, {} calls, {} throttled",
        wall.elapsed(),
        counters.total_calls(),
        counters.total_throttled()
    );
}

// ---- odd inputs: typed errors or clamping, never a panic ----

fn refused(builder: corral_cloud::fake::FakeEc2Builder, what: &str) {
    match builder.build() {
        Err(CloudError::InvalidParameterValue { message }) => {
            assert!(message.contains(what), "{what}: {message}");
        }
        other => panic!("{what}: expected InvalidParameterValue, got {other:?}"),
    }
}

/// Regression (review): a NaN fraction made the next call panic inside the fake.
#[tokio::test(start_paused = true)]
async fn a_nan_storm_fraction_is_no_storm() {
    let fake = quiet()
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    fake.throttle_storm(f64::NAN, Duration::from_secs(10));
    for _ in 0..20 {
        fake.describe_instance("i-1").await.unwrap();
    }
    assert_eq!(fake.counters().total_throttled(), 0);
}

/// Regression (review): `Instant::now() + Duration::MAX` panicked.
#[tokio::test(start_paused = true)]
async fn a_storm_for_good_throttles_and_does_not_panic() {
    let fake = quiet()
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-1"))
        .build()
        .unwrap();
    fake.throttle_storm(2.0, Duration::MAX);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_code(fake.describe_instance("i-1").await, "RequestLimitExceeded");
}

#[test]
fn the_builder_refuses_probabilities_outside_zero_to_one() {
    let action = Action::CreateNetworkInterface;
    refused(
        quiet().internal_error_rate(action, f64::NAN),
        "internal error rate of CreateNetworkInterface",
    );
    refused(
        quiet().internal_error_rate(action, -0.1),
        "internal error rate",
    );
    refused(quiet().timeout_rate(action, 1.5), "timeout rate");
    refused(quiet().timeout_rate(action, f64::INFINITY), "timeout rate");
    refused(
        FakeEc2::builder().subnet(subnet_a().fragmented(f64::NAN)),
        "fragmentation of subnet subnet-a",
    );
    refused(
        FakeEc2::builder().subnet(subnet_a().fragmented(2.0)),
        "fragmentation",
    );
    assert!(quiet().timeout_rate(action, 1.0).build().is_ok());
}

/// Regression (review): delays beyond what `Instant` can add panicked on the first call that
/// used them (`Duration::from_secs_f64` or `Instant + Duration` overflow).
#[test]
fn the_builder_refuses_delays_above_a_day() {
    let huge = Duration::MAX;
    refused(quiet().consistency_lag(huge, huge), "mean consistency lag");
    refused(
        quiet().consistency_lag(Duration::ZERO, huge),
        "maximum consistency lag",
    );
    refused(quiet().attach_delay(Duration::ZERO, huge), "attach delay");
    refused(quiet().detach_delay(Duration::ZERO, huge), "detach delay");
    refused(
        quiet().attach_delay(Duration::from_secs(5), Duration::from_secs(1)),
        "attach delay: minimum",
    );
    refused(quiet().timeout_after(huge), "the timeout");
    refused(
        quiet().latency(
            Action::AssignIpv6Addresses,
            Latency {
                median: huge,
                p99: huge,
            },
        ),
        "median latency of AssignIpv6Addresses",
    );
    refused(
        quiet().latency(
            Action::DescribeSubnets,
            Latency {
                median: Duration::from_millis(1),
                p99: huge,
            },
        ),
        "p99 latency",
    );
    let day = corral_cloud::fake::MAX_DELAY;
    assert!(
        quiet()
            .consistency_lag(day, day)
            .attach_delay(day, day)
            .timeout_after(day)
            .build()
            .is_ok()
    );
}

/// Regression (review): a huge lag set at run time overflowed `Instant + Duration` at the next
/// change; it is clamped to a day.
#[tokio::test(start_paused = true)]
async fn a_huge_runtime_lag_is_clamped_to_a_day() {
    let fake = quiet().build().unwrap();
    fake.set_consistency_lag(Duration::MAX, Duration::MAX);
    let eni = new_interface(&fake).await;
    tokio::time::advance(corral_cloud::fake::MAX_DELAY).await;
    let seen = fake
        .describe_interfaces(&InterfaceFilter::id(&eni.id))
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn runtime_fault_rates_are_clamped() {
    let fake = quiet().build().unwrap();
    fake.set_fault_rates(Action::CreateNetworkInterface, f64::NAN, 2.0);
    for _ in 0..5 {
        assert_code(
            fake.create_interface(&create_in("subnet-a")).await,
            "Timeout",
        );
    }
    fake.set_fault_rates(Action::CreateNetworkInterface, -1.0, f64::NAN);
    new_interface(&fake).await;
    assert_eq!(fake.counters().faults(Action::CreateNetworkInterface), 5);
}

/// Regression: `fail_next(.., usize::MAX, ..)` pushed one entry per call to come, forever.
#[tokio::test(start_paused = true)]
async fn scripting_usize_max_faults_takes_no_time_and_applies_to_every_call() {
    let fake = quiet().build().unwrap();
    fake.fail_next(
        Action::DescribeSubnets,
        usize::MAX,
        CloudError::InternalError {
            message: "scripted".to_owned(),
        },
    );
    fake.time_out_next(Action::CreateNetworkInterface, usize::MAX);
    fake.fail_next(
        Action::DeleteNetworkInterface,
        0,
        CloudError::InternalError {
            message: "never".to_owned(),
        },
    );
    for _ in 0..3 {
        assert_code(
            fake.describe_subnets(&SubnetFilter::default()).await,
            "InternalError",
        );
        assert_code(
            fake.create_interface(&create_in("subnet-a")).await,
            "Timeout",
        );
    }
    assert_eq!(fake.interfaces().len(), 3, "timed out but applied");
    let id = fake.interfaces()[0].id.clone();
    fake.delete_interface(&id).await.unwrap();
}

/// Counts far beyond any limit are refused by the limit before any pool is searched, and
/// change nothing.
#[tokio::test(start_paused = true)]
async fn counts_of_u32_max_are_refused_by_the_limit() {
    let fake = with_subnet_6("2600:1f18:0:7::/64");
    let eni = fake.create_interface(&create_in("subnet-6")).await.unwrap();
    let free = fake.subnet_free_ipv4("subnet-6");
    let max = Amount::Count(u32::MAX);
    for result in [
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(max.clone()))
            .await,
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Count(u32::MAX)))
            .await,
    ] {
        assert_code(result, "PrivateIpAddressLimitExceeded");
    }
    for result in [
        fake.assign_ipv6(&eni.id, &Ipv6Assign::Addresses(Amount::Count(u32::MAX)))
            .await,
        fake.assign_ipv6(&eni.id, &Ipv6Assign::Prefixes(Amount::Count(u32::MAX)))
            .await,
    ] {
        assert_code(result, "PrivateIpAddressLimitExceeded");
    }
    let mut request = create_in("subnet-6");
    request.secondary_ipv4 = Some(max);
    assert_code(
        fake.create_interface(&request).await,
        "PrivateIpAddressLimitExceeded",
    );
    let mut request = create_in("subnet-6");
    request.ipv6_prefixes = Some(Amount::Count(u32::MAX));
    assert_code(
        fake.create_interface(&request).await,
        "PrivateIpAddressLimitExceeded",
    );
    assert_eq!(fake.subnet_free_ipv4("subnet-6"), free);
    assert_eq!(fake.interfaces().len(), 1);
    let now = fake.interface(&eni.id).unwrap();
    assert!(now.secondary_ipv4.is_empty() && now.ipv6_addresses.is_empty());
}

/// Count(0) is refused by assign (EC2: nothing to assign) and is no address at creation.
#[tokio::test(start_paused = true)]
async fn count_zero() {
    let fake = quiet().build().unwrap();
    let eni = new_interface(&fake).await;
    assert_code(
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(0)))
            .await,
        "InvalidParameterValue",
    );
    assert_code(
        fake.assign_ipv4(&eni.id, &Ipv4Assign::Prefixes(Amount::Explicit(Vec::new())))
            .await,
        "InvalidParameterValue",
    );
    let mut request = create_in("subnet-a");
    request.secondary_ipv4 = Some(Amount::Count(0));
    let created = fake.create_interface(&request).await.unwrap();
    assert!(created.secondary_ipv4.is_empty());
}

/// Explicit addresses outside the subnet, reserved by AWS, or named twice are refused and
/// change nothing.
#[tokio::test(start_paused = true)]
async fn explicit_addresses_outside_reserved_or_duplicated_are_refused() {
    let fake = with_subnet_6("2600:1f18:0:7::/64");
    let eni = fake.create_interface(&create_in("subnet-6")).await.unwrap();
    let free = fake.subnet_free_ipv4("subnet-6");
    let v4 = |addrs: &[&str]| {
        Ipv4Assign::Addresses(Amount::Explicit(
            addrs.iter().map(|a| a.parse().unwrap()).collect(),
        ))
    };
    for (request, why) in [
        (v4(&["10.0.8.9"]), "outside the subnet"),
        (v4(&["10.0.7.1"]), "the VPC router"),
        (v4(&["10.0.7.255"]), "the last address"),
        (v4(&["10.0.7.0"]), "the network address"),
        (v4(&["10.0.7.20", "10.0.7.20"]), "named twice"),
    ] {
        let error = assert_code(
            fake.assign_ipv4(&eni.id, &request).await,
            "InvalidParameterValue",
        );
        if why == "named twice" {
            assert!(error.to_string().contains("Duplicate"), "{error}");
        }
    }
    let twice: ipnet::Ipv4Net = "10.0.7.32/28".parse().unwrap();
    assert_code(
        fake.assign_ipv4(
            &eni.id,
            &Ipv4Assign::Prefixes(Amount::Explicit(vec![twice, twice])),
        )
        .await,
        "InvalidParameterValue",
    );
    let v6 = |addrs: &[&str]| {
        Ipv6Assign::Addresses(Amount::Explicit(
            addrs.iter().map(|a| a.parse().unwrap()).collect(),
        ))
    };
    for request in [
        v6(&["2600:1f18:0:8::5"]),
        v6(&["2600:1f18:0:7::"]),
        v6(&["2600:1f18:0:7::5", "2600:1f18:0:7::5"]),
    ] {
        assert_code(
            fake.assign_ipv6(&eni.id, &request).await,
            "InvalidParameterValue",
        );
    }
    for prefix in [
        "2600:1f18:0:8:1::/80",
        "2600:1f18:0:7::/64",
        "2600:1f18:0:7:1::5/80",
    ] {
        assert_code(
            fake.assign_ipv6(
                &eni.id,
                &Ipv6Assign::Prefixes(Amount::Explicit(vec![prefix.parse().unwrap()])),
            )
            .await,
            "InvalidParameterValue",
        );
    }
    assert_eq!(fake.subnet_free_ipv4("subnet-6"), free);
    let now = fake.interface(&eni.id).unwrap();
    assert!(now.secondary_ipv4.is_empty() && now.ipv4_prefixes.is_empty());
    assert!(now.ipv6_addresses.is_empty() && now.ipv6_prefixes.is_empty());
    // The same addresses, once each and inside, are granted.
    fake.assign_ipv4(&eni.id, &v4(&["10.0.7.20"]))
        .await
        .unwrap();
    fake.assign_ipv6(&eni.id, &v6(&["2600:1f18:0:7::5"]))
        .await
        .unwrap();
}

#[test]
fn subnet_sizes_outside_what_aws_allows_and_overlaps_are_refused() {
    let v4 = |cidr: &str| SubnetSpec::new("subnet-x", "vpc-1", "us-east-1a", cidr.parse().unwrap());
    refused(FakeEc2::builder().subnet(v4("10.0.0.0/29")), "/16 to /28");
    refused(FakeEc2::builder().subnet(v4("10.0.0.0/15")), "/16 to /28");
    refused(
        FakeEc2::builder().subnet(v4("10.0.0.0/24").ipv6("2600:1f18::/56".parse().unwrap())),
        "an IPv6 subnet is a /64",
    );
    refused(
        FakeEc2::builder().subnet(v4("10.0.0.0/24").ipv6("2600:1f18::/80".parse().unwrap())),
        "an IPv6 subnet is a /64",
    );
    refused(
        FakeEc2::builder()
            .subnet(subnet_a())
            .subnet(v4("10.0.0.128/25")),
        "overlaps subnet subnet-a of vpc-1",
    );
    refused(
        FakeEc2::builder()
            .subnet(subnet_a().ipv6("2600:1f18:0:1::/64".parse().unwrap()))
            .subnet(v4("10.0.9.0/24").ipv6("2600:1f18:0:1::/64".parse().unwrap())),
        "overlaps",
    );
    // Another VPC may reuse the CIDR.
    assert!(
        FakeEc2::builder()
            .subnet(subnet_a())
            .subnet(subnet("subnet-y", "vpc-2", "us-east-1a", "10.0.0.0/24"))
            .build()
            .is_ok()
    );
}

/// The extremes of subnet size: a /16 hands out its last addresses and /28s, a /28 has no room
/// for a prefix and runs out after 11 addresses.
#[tokio::test(start_paused = true)]
async fn a_16_and_a_28_to_the_last_address() {
    let fake = quiet()
        .subnet(subnet("subnet-16", "vpc-2", "us-east-1a", "10.1.0.0/16"))
        .subnet(subnet("subnet-28", "vpc-2", "us-east-1a", "10.2.0.0/28"))
        .build()
        .unwrap();
    assert_eq!(fake.subnet_free_ipv4("subnet-16"), Some(65536 - 5));
    let eni = fake
        .create_interface(&create_in("subnet-16"))
        .await
        .unwrap();
    let prefix = fake
        .assign_ipv4(
            &eni.id,
            &Ipv4Assign::Prefixes(Amount::Explicit(vec!["10.1.255.224/28".parse().unwrap()])),
        )
        .await
        .unwrap();
    assert_eq!(prefix.prefixes.len(), 1);
    assert_code(
        assign_prefix(&fake, &eni.id, "10.1.255.240/28").await,
        "InvalidIPAddress.InUse",
    );
    fake.assign_ipv4(&eni.id, &Ipv4Assign::Addresses(Amount::Count(3)))
        .await
        .unwrap();
    let tiny = fake
        .create_interface(&create_in("subnet-28"))
        .await
        .unwrap();
    assert_code(
        fake.assign_ipv4(&tiny.id, &Ipv4Assign::Prefixes(Amount::Count(1)))
            .await,
        "InsufficientFreeAddressesInSubnet",
    );
    let rest = fake
        .assign_ipv4(&tiny.id, &Ipv4Assign::Addresses(Amount::Count(10)))
        .await
        .unwrap();
    assert_eq!(rest.addresses.last(), Some(&Ipv4Addr::new(10, 2, 0, 14)));
    assert_eq!(fake.subnet_free_ipv4("subnet-28"), Some(0));
    let mut another = create_in("subnet-28");
    another.description = Some("no room".to_owned());
    assert_code(
        fake.create_interface(&another).await,
        "InsufficientFreeAddressesInSubnet",
    );
}
