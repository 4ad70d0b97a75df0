//! The adapter against moto's EC2 server (PyPI `moto[server]`, installed by `make deps` into
//! `target/moto-venv`): each test starts its own `moto_server` on 127.0.0.1, creates a VPC, a
//! subnet and a running instance through the SDK, and runs one function of the shared contract
//! suite `corral_cloud::contract` against [`Ec2`].
//!
//! Moto is laxer than EC2 (see `MOTO` below for what it lacks), so what it cannot show is
//! proven on `corral_cloud::FakeEc2` only; the contract skips those checks by the capabilities.

use std::process::Command;

use common::{Moto, create_fixture, create_subnet};
use corral_aws::{Ec2, Timeouts};
use corral_cloud::contract::{self, Capabilities};
use corral_cloud::{
    AttachInterface, CloudError, CloudProvider, CreateInterface, Instance, InstanceTypeInfo,
    InterfaceFilter, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Subnet,
    SubnetFilter, Tags,
};

use crate::common;

/// What moto 5.2 does of EC2 (found by poking its server): it enforces no interface or address
/// limits, delegates no prefixes (it ignores `Ipv4PrefixCount`), ignores `ClientToken`,
/// attaches at an occupied device index (even 0, the primary's) and deletes an attached
/// interface. The contract checks that need those run on `FakeEc2` only; here each runs and is
/// expected to fail in the way that shows the gap, so a moto that closes one is noticed.
/// Moto also loops forever assigning more addresses than a subnet has left, so no check here
/// exhausts a subnet.
const MOTO: Capabilities = Capabilities {
    limits: false,
    prefix_delegation: false,
    client_tokens: false,
    occupied_device_index: false,
    delete_attached_refused: false,
};

/// [`Ec2`] with one correction of moto's answers: moto 5.2 answers AssignPrivateIpAddresses
/// with every private address of the interface, the primary included (its
/// `responses/elastic_network_interfaces.py`), where EC2 answers the new ones only. This
/// describes the interface before and drops what it already had. Every other call goes to the
/// adapter as is.
struct MotoEc2(Ec2);

impl CloudProvider for MotoEc2 {
    async fn describe_instance(&self, instance_id: &str) -> Result<Instance, CloudError> {
        self.0.describe_instance(instance_id).await
    }
    async fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        self.0.describe_instance_types(instance_types).await
    }
    async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        self.0.describe_subnets(filter).await
    }
    async fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        self.0.describe_interfaces(filter).await
    }
    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        self.0.create_interface(request).await
    }
    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        self.0.attach_interface(request).await
    }
    async fn detach_interface(&self, attachment_id: &str, force: bool) -> Result<(), CloudError> {
        self.0.detach_interface(attachment_id, force).await
    }
    async fn delete_interface(&self, interface_id: &str) -> Result<(), CloudError> {
        self.0.delete_interface(interface_id).await
    }
    async fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        // On error, let the assign itself answer (not found, throttled, ...).
        let before = self
            .0
            .describe_interfaces(&InterfaceFilter::id(interface_id))
            .await
            .unwrap_or_default();
        let mut assigned = self.0.assign_ipv4(interface_id, request).await?;
        assigned.addresses.retain(|address| {
            !before.iter().any(|interface| {
                interface.primary_ipv4 == *address || interface.secondary_ipv4.contains(address)
            })
        });
        Ok(assigned)
    }
    async fn unassign_ipv4(&self, interface_id: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.0.unassign_ipv4(interface_id, release).await
    }
    async fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        self.0.assign_ipv6(interface_id, request).await
    }
    async fn unassign_ipv6(&self, interface_id: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.0.unassign_ipv6(interface_id, release).await
    }
    async fn create_tags(&self, resource_ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        self.0.create_tags(resource_ids, tags).await
    }
    async fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> Result<(), CloudError> {
        self.0.delete_tags(resource_ids, keys).await
    }
}

/// A moto server with a VPC (10.0.0.0/16), a subnet (10.0.0.0/24) and a running m5.large in
/// it, created through the SDK; the provider and the contract's fixture for them.
struct Setup {
    provider: MotoEc2,
    fixture: contract::Fixture,
    // Last: the server outlives the client's calls.
    _moto: Moto,
}

async fn setup() -> Setup {
    let moto = Moto::start();
    let ec2 = moto.provider();
    let (subnet_id, instance_id) = create_fixture(&ec2, "m5.large").await;
    Setup {
        fixture: contract::Fixture::new(&instance_id, &subnet_id),
        provider: MotoEc2(ec2),
        _moto: moto,
    }
}

#[test]
fn moto_lacks_limits_prefixes_client_tokens_and_two_refusals() {
    assert_eq!(
        MOTO.checks_not_run(),
        [
            "limits_attachment",
            "limits_addresses",
            "prefix_delegation_ipv4",
            "client_token_idempotent_create",
            "occupied_device_index_refused",
            "delete_attached_refused",
        ]
    );
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn describe_instance_and_type() {
    let setup = setup().await;
    contract::describe_instance_and_type(&setup.provider, &setup.fixture).await;
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn describe_subnets() {
    let setup = setup().await;
    contract::describe_subnets(&setup.provider, &setup.fixture).await;
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn interface_lifecycle() {
    let setup = setup().await;
    contract::interface_lifecycle(&setup.provider, &setup.fixture).await;
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn secondary_addresses() {
    let setup = setup().await;
    contract::secondary_addresses(&setup.provider, &setup.fixture).await;
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn tags() {
    let setup = setup().await;
    contract::tags(&setup.provider, &setup.fixture).await;
}

#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn not_found_errors() {
    let setup = setup().await;
    contract::not_found_errors(&setup.provider, &setup.fixture).await;
}

/// Moto enforces no interface limit: the attach past m5.large's 3 interfaces succeeds.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "expected AttachmentLimitExceeded")]
async fn limits_attachment_not_enforced_by_moto() {
    const { assert!(!MOTO.limits) };
    let setup = setup().await;
    contract::limits_attachment(&setup.provider, &setup.fixture).await;
}

/// Moto enforces no address limit: the 11th address of an m5.large interface is assigned.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "expected PrivateIpAddressLimitExceeded")]
async fn limits_addresses_not_enforced_by_moto() {
    const { assert!(!MOTO.limits) };
    let setup = setup().await;
    contract::limits_addresses(&setup.provider, &setup.fixture).await;
}

/// Moto delegates no prefix: AssignPrivateIpAddresses with a prefix count assigns nothing.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "prefixes: [] }\n  left: 0\n right: 1")]
async fn prefix_delegation_ipv4_not_supported_by_moto() {
    const { assert!(!MOTO.prefix_delegation) };
    let setup = setup().await;
    contract::prefix_delegation_ipv4(&setup.provider, &setup.fixture).await;
}

/// Moto ignores client tokens: the repeated create makes a second interface.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "same client token, same interface")]
async fn client_token_idempotent_create_ignored_by_moto() {
    const { assert!(!MOTO.client_tokens) };
    let setup = setup().await;
    contract::client_token_idempotent_create(&setup.provider, &setup.fixture).await;
}

/// Moto attaches at an occupied device index (even 0).
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "expected DeviceIndexInUse")]
async fn occupied_device_index_accepted_by_moto() {
    const { assert!(!MOTO.occupied_device_index) };
    let setup = setup().await;
    contract::occupied_device_index_refused(&setup.provider, &setup.fixture).await;
}

/// Moto deletes an attached interface.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
#[should_panic(expected = "expected InterfaceInUse")]
async fn delete_attached_accepted_by_moto() {
    const { assert!(!MOTO.delete_attached_refused) };
    let setup = setup().await;
    contract::delete_attached_refused(&setup.provider, &setup.fixture).await;
}

/// `Ec2::from_env` finds the endpoint, region and credentials where every AWS tool does. The
/// variables are set on a child process (this test binary again, running only this test), as
/// setting them here would reach every test of the process; the child describes the instance the
/// parent created.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn from_env_finds_endpoint_region_and_credentials() {
    const CHILD: &str = "CORRAL_AWS_TEST_FROM_ENV_INSTANCE";
    if let Ok(instance_id) = std::env::var(CHILD) {
        let ec2 = Ec2::from_env(Timeouts::default()).await;
        let instance = ec2
            .describe_instance(&instance_id)
            .await
            .expect("DescribeInstances through the environment's endpoint");
        assert_eq!(instance.id, instance_id);
        return;
    }
    let moto = Moto::start();
    let (_, instance_id) = create_fixture(&moto.provider(), "t3.small").await;
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "moto::from_env_finds_endpoint_region_and_credentials",
            "--exact",
            "--include-ignored",
            "--test-threads",
            "1",
        ])
        .env(CHILD, &instance_id)
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Beyond the contract, what the adapter converts from moto's answers: instance types in the
/// order asked with their limits (Xen's t2.micro without prefix delegation), an unknown type as
/// a bad parameter, and the status filter of DescribeNetworkInterfaces.
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn instance_types_in_the_order_asked_and_the_status_filter() {
    use corral_cloud::{Hypervisor, InterfaceStatus};
    let setup = setup().await;
    let ec2 = &setup.provider.0;
    let names = ["t3.small", "m5.24xlarge", "t2.micro"].map(str::to_owned);
    let types = ec2.describe_instance_types(&names).await.unwrap();
    let summary: Vec<_> = types
        .iter()
        .map(|t| {
            (
                t.instance_type.as_str(),
                t.max_interfaces,
                t.ipv4_per_interface,
                t.hypervisor,
                t.prefix_delegation,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("t3.small", 3, 4, Hypervisor::Nitro, true),
            ("m5.24xlarge", 15, 50, Hypervisor::Nitro, true),
            ("t2.micro", 2, 2, Hypervisor::Xen, false),
        ]
    );
    let unknown = ec2
        .describe_instance_types(&["zz.huge".to_owned()])
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), "InvalidParameterValue", "{unknown:?}");

    let create = CreateInterface {
        subnet_id: setup.fixture.subnet_id.clone(),
        ..CreateInterface::default()
    };
    let attached = ec2.create_interface(&create).await.unwrap();
    let free = ec2.create_interface(&create).await.unwrap();
    ec2.attach_interface(AttachInterface::new(
        &attached.id,
        &setup.fixture.instance_id,
        1,
    ))
    .await
    .unwrap();
    let with_status = |status| InterfaceFilter {
        subnet_id: Some(setup.fixture.subnet_id.clone()),
        status: Some(status),
        ..InterfaceFilter::default()
    };
    let available: Vec<String> = ec2
        .describe_interfaces(&with_status(InterfaceStatus::Available))
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(available, std::slice::from_ref(&free.id));
    let in_use = ec2
        .describe_interfaces(&with_status(InterfaceStatus::InUse))
        .await
        .unwrap();
    assert!(in_use.iter().any(|i| i.id == attached.id), "{in_use:?}");
    assert!(in_use.iter().all(|i| i.id != free.id));
}

/// The moto these tests run picks private addresses as EC2 does (`common/moto_server.py`):
/// an interface asking for every address a /28 has left gets exactly the eleven EC2 hands
/// out, never the subnet's network address, its .1–.3, its broadcast address or one twice.
/// moto's own picker gave an interface the subnet's gateway one run in about twenty-five
/// (which corral refuses to serve: the e2e test waited in vain).
#[tokio::test]
#[ignore = "needs moto_server (make deps)"]
async fn moto_picks_private_addresses_as_ec2_does() {
    let moto = Moto::start();
    let ec2 = moto.provider();
    let subnet_id = create_subnet(&ec2, "10.1.0.0/16", "10.1.0.0/28").await;
    let created = ec2
        .client()
        .create_network_interface()
        .subnet_id(&subnet_id)
        .secondary_private_ip_address_count(10)
        .send()
        .await
        .expect("CreateNetworkInterface");
    let addresses: Vec<String> = created
        .network_interface()
        .expect("an interface")
        .private_ip_addresses()
        .iter()
        .filter_map(|a| a.private_ip_address().map(str::to_owned))
        .collect();
    let mut got: Vec<std::net::Ipv4Addr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    got.sort();
    let usable: Vec<std::net::Ipv4Addr> = (4..=14).map(|i| [10, 1, 0, i].into()).collect();
    assert_eq!(got, usable, "the interface's addresses: {addresses:?}");
}
