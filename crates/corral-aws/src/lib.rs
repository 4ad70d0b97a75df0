//! corral's cloud provider on the official AWS SDK for EC2: [`Ec2`] implements
//! [`corral_cloud::CloudProvider`] call for call on `aws-sdk-ec2`, maps EC2's error codes to
//! [`CloudError`] and passes client tokens through.
//!
//! This crate is the only one that links the AWS SDK, and nothing in the workspace depends on it:
//! the SDK takes minutes to build. A node binary that runs on EC2 links it; everything else codes
//! against the trait and is tested on `corral_cloud::FakeEc2`.
//!
//! The SDK's own retries are off (the SDK would repeat a 5xx or a timeout of any call, an assign
//! by count included): the trait leaves retrying to the caller, which knows whether a mutating
//! call is safe to repeat ([`CloudError::can_repeat`], client tokens). Every call has a deadline
//! ([`Timeouts`]); a call without an answer in time, or that could not be sent, is
//! [`CloudError::Timeout`], and a 5xx or an unreadable answer is `InternalError`: both
//! [ambiguous](CloudError::is_ambiguous), the call may or may not have been applied.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as sdk;
use corral_cloud::{
    Action, Amount, AttachInterface, Attachment, AttachmentStatus, CloudError, CloudProvider,
    CreateInterface, Hypervisor, Instance, InstanceInterface, InstanceTypeInfo, InterfaceFilter,
    InterfaceStatus, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, MacAddress, NetworkInterface,
    Subnet, SubnetFilter, Tags,
};
use ipnet::{Ipv4Net, Ipv6Net};

/// The deadlines of every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the TCP and TLS connection.
    pub connect: Duration,
    /// One call from sending to the whole answer (the SDK makes one attempt: retries are off).
    pub operation: Duration,
}

impl Default for Timeouts {
    /// 3 s to connect, 20 s per call: EC2's slowest calls here (CreateNetworkInterface,
    /// a DescribeNetworkInterfaces page of 1,000) answer in about a second.
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(3),
            operation: Duration::from_secs(20),
        }
    }
}

impl Timeouts {
    fn config(self) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.connect)
            .operation_attempt_timeout(self.operation)
            .operation_timeout(self.operation)
            .build()
    }
}

/// EC2 through the official SDK: one account in one region.
#[derive(Clone, Debug)]
pub struct Ec2 {
    client: Client,
}

/// The HTTP client: hyper with rustls on ring (the SDK's default would build aws-lc, a large C
/// library), certificates from the system's store. It speaks plain HTTP too, for local
/// endpoints such as moto.
fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

impl Ec2 {
    /// From the environment, as every AWS tool finds it: the region from `AWS_REGION`, the
    /// profile or the instance metadata service, and credentials from the default chain
    /// (environment, profile, web identity as on EKS, ECS task role, instance profile).
    /// `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_EC2`) points it elsewhere, e.g. at moto.
    pub async fn from_env(timeouts: Timeouts) -> Ec2 {
        Ec2::from_env_at(None, timeouts).await
    }

    /// [`Ec2::from_env`], with `endpoint_url` (when given) in place of the environment's
    /// endpoint: `corral-aws --cloud-endpoint`, for a VPC endpoint or moto.
    pub async fn from_env_at(endpoint_url: Option<&str>, timeouts: Timeouts) -> Ec2 {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        let config = loader
            .http_client(http_client())
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts.config())
            .load()
            .await;
        Ec2::from_client(Client::new(&config))
    }

    /// For an explicit endpoint, region and static credentials (tests against moto, or an
    /// endpoint that the default chain would not find).
    pub fn with_endpoint(
        endpoint_url: &str,
        region: &str,
        access_key_id: &str,
        secret_access_key: &str,
        timeouts: Timeouts,
    ) -> Ec2 {
        let credentials = Credentials::new(
            access_key_id,
            secret_access_key,
            None,
            None,
            "corral-static",
        );
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(endpoint_url)
            .region(Region::new(region.to_owned()))
            .credentials_provider(credentials)
            .http_client(http_client())
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts.config())
            .build();
        Ec2::from_client(Client::from_conf(config))
    }

    /// Around a client configured by the caller (its retry and timeout settings are kept).
    pub fn from_client(client: Client) -> Ec2 {
        Ec2 { client }
    }

    /// The SDK client, for calls the trait does not cover (test fixtures: VPCs, instances).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The SDK's error for `action` as a [`CloudError`]: service errors by EC2's error code (an
/// answer without one by its HTTP status), no answer in time or none at all as `Timeout`.
pub fn map_error<E>(action: Action, error: SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match error {
        SdkError::ServiceError(context) => {
            let status = context.raw().status().as_u16();
            let error = context.into_err();
            let message = error.message().unwrap_or_default().to_owned();
            match error.code() {
                Some(code) => from_code(action, code, message),
                None => without_code(status, message),
            }
        }
        // Sent (or maybe sent) and no answer in time, or the connection failed: EC2 may have
        // applied it.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => CloudError::Timeout { action },
        // An answer that could not be read: as a failure of EC2's (it may have been applied).
        SdkError::ResponseError(context) => CloudError::InternalError {
            message: format!(
                "unreadable answer (http status {})",
                context.raw().status().as_u16()
            ),
        },
        // The request could not be built: nothing was sent.
        SdkError::ConstructionFailure(_) => CloudError::InvalidParameterValue {
            message: aws_sdk_ec2::error::DisplayErrorContext(&error).to_string(),
        },
        other => CloudError::Other {
            code: "Unknown".to_owned(),
            message: aws_sdk_ec2::error::DisplayErrorContext(&other).to_string(),
        },
    }
}

/// EC2's code to a variant. `InvalidInstanceType` (DescribeInstanceTypes for a type that does
/// not exist) is a bad parameter as the trait states it.
fn from_code(action: Action, code: &str, message: String) -> CloudError {
    match code {
        "InvalidInstanceType" => CloudError::InvalidParameterValue { message },
        _ => CloudError::from_code(action, code, message),
    }
}

/// An error answer without an EC2 error code (a proxy's or a load balancer's page).
fn without_code(status: u16, message: String) -> CloudError {
    let message = if message.is_empty() {
        format!("http status {status}")
    } else {
        message
    };
    match status {
        500..=599 => CloudError::InternalError { message },
        _ => CloudError::Other {
            code: format!("Http{status}"),
            message,
        },
    }
}

/// An answer that lacks a field corral needs, or has one it cannot read.
fn invalid(action: Action, what: &str) -> CloudError {
    CloudError::Other {
        code: "InvalidResponse".to_owned(),
        message: format!("{action} answered without a valid {what}"),
    }
}

fn required<'a>(action: Action, value: Option<&'a str>, what: &str) -> Result<&'a str, CloudError> {
    value
        .filter(|value| !value.is_empty())
        .ok_or_else(|| invalid(action, what))
}

fn parse<T: FromStr>(action: Action, value: Option<&str>, what: &str) -> Result<T, CloudError> {
    required(action, value, what)?
        .parse()
        .map_err(|_| invalid(action, what))
}

fn count(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// A request builder asked for `amount` (none: left as it is): a count through `by_count`,
/// each explicit item through `each`.
fn with_amount<B, T>(
    call: B,
    amount: Option<&Amount<T>>,
    by_count: impl FnOnce(B, i32) -> B,
    each: impl Fn(B, &T) -> B,
) -> B {
    match amount {
        Some(Amount::Count(n)) => by_count(call, count(*n)),
        Some(Amount::Explicit(items)) => items.iter().fold(call, each),
        None => call,
    }
}

fn index(action: Action, value: Option<i32>) -> Result<u32, CloudError> {
    value
        .and_then(|value| u32::try_from(value).ok())
        .ok_or_else(|| invalid(action, "device index"))
}

fn tags_from(tags: &[sdk::Tag]) -> Tags {
    tags.iter()
        .filter_map(|tag| {
            Some((
                tag.key()?.to_owned(),
                tag.value().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

fn tags_to(tags: &Tags) -> Vec<sdk::Tag> {
    tags.iter()
        .map(|(key, value)| sdk::Tag::builder().key(key).value(value).build())
        .collect()
}

/// EC2's filters for tags: `tag:<key>` with the value, `tag-key` for a key with any value.
fn tag_filters(tags: &std::collections::BTreeMap<String, Option<String>>) -> Vec<sdk::Filter> {
    tags.iter()
        .map(|(key, value)| match value {
            Some(value) => filter(&format!("tag:{key}"), value),
            None => filter("tag-key", key),
        })
        .collect()
}

fn filter(name: &str, value: &str) -> sdk::Filter {
    sdk::Filter::builder().name(name).values(value).build()
}

fn attachment_status(action: Action, status: Option<&str>) -> Result<AttachmentStatus, CloudError> {
    parse(action, status, "attachment status")
}

fn instance_from(action: Action, instance: &sdk::Instance) -> Result<Instance, CloudError> {
    let id = required(action, instance.instance_id(), "instance id")?.to_owned();
    let mut interfaces = Vec::new();
    for interface in instance.network_interfaces() {
        let Some(attachment) = interface.attachment() else {
            continue;
        };
        interfaces.push(InstanceInterface {
            interface_id: required(action, interface.network_interface_id(), "interface id")?
                .to_owned(),
            subnet_id: required(action, interface.subnet_id(), "subnet id")?.to_owned(),
            mac: parse(action, interface.mac_address(), "mac address")?,
            primary_ipv4: parse(action, interface.private_ip_address(), "private ip address")?,
            attachment: Attachment {
                id: required(action, attachment.attachment_id(), "attachment id")?.to_owned(),
                instance_id: id.clone(),
                device_index: index(action, attachment.device_index())?,
                status: attachment_status(action, attachment.status().map(|s| s.as_str()))?,
                delete_on_termination: attachment.delete_on_termination().unwrap_or(false),
            },
        });
    }
    interfaces.sort_by_key(|interface| interface.attachment.device_index);
    Ok(Instance {
        instance_type: required(
            action,
            instance.instance_type().map(|t| t.as_str()),
            "instance type",
        )?
        .to_owned(),
        state: parse(
            action,
            instance.state().and_then(|s| s.name()).map(|n| n.as_str()),
            "instance state",
        )?,
        availability_zone: required(
            action,
            instance.placement().and_then(|p| p.availability_zone()),
            "availability zone",
        )?
        .to_owned(),
        vpc_id: instance.vpc_id().unwrap_or_default().to_owned(),
        subnet_id: instance.subnet_id().unwrap_or_default().to_owned(),
        interfaces,
        id,
    })
}

fn instance_type_from(
    action: Action,
    info: &sdk::InstanceTypeInfo,
) -> Result<InstanceTypeInfo, CloudError> {
    let network = info
        .network_info()
        .ok_or_else(|| invalid(action, "network info"))?;
    let limit = |value: Option<i32>, what| {
        value
            .and_then(|value| u32::try_from(value).ok())
            .ok_or_else(|| invalid(action, what))
    };
    let hypervisor = match info.hypervisor() {
        Some(hypervisor) => parse(action, Some(hypervisor.as_str()), "hypervisor")?,
        None => Hypervisor::None,
    };
    let ipv6_supported = network.ipv6_supported().unwrap_or(false);
    Ok(InstanceTypeInfo {
        instance_type: required(
            action,
            info.instance_type().map(|t| t.as_str()),
            "instance type",
        )?
        .to_owned(),
        max_interfaces: limit(network.maximum_network_interfaces(), "interface limit")?,
        ipv4_per_interface: limit(network.ipv4_addresses_per_interface(), "ipv4 limit")?,
        ipv6_per_interface: if ipv6_supported {
            limit(network.ipv6_addresses_per_interface(), "ipv6 limit")?
        } else {
            0
        },
        // Prefix delegation is a Nitro feature; bare-metal types (no hypervisor) are Nitro too.
        prefix_delegation: hypervisor == Hypervisor::Nitro || info.bare_metal() == Some(true),
        hypervisor,
    })
}

fn subnet_from(action: Action, subnet: &sdk::Subnet) -> Result<Subnet, CloudError> {
    let ipv6_cidr = subnet
        .ipv6_cidr_block_association_set()
        .iter()
        .find(|association| {
            association
                .ipv6_cidr_block_state()
                .and_then(|state| state.state())
                == Some(&sdk::SubnetCidrBlockStateCode::Associated)
        })
        .map(|association| parse(action, association.ipv6_cidr_block(), "ipv6 cidr"))
        .transpose()?;
    Ok(Subnet {
        id: required(action, subnet.subnet_id(), "subnet id")?.to_owned(),
        vpc_id: required(action, subnet.vpc_id(), "vpc id")?.to_owned(),
        availability_zone: subnet.availability_zone().unwrap_or_default().to_owned(),
        ipv4_cidr: parse(action, subnet.cidr_block(), "cidr block")?,
        ipv6_cidr,
        available_ipv4: subnet
            .available_ip_address_count()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        tags: tags_from(subnet.tags()),
    })
}

fn interface_from(
    action: Action,
    interface: &sdk::NetworkInterface,
) -> Result<NetworkInterface, CloudError> {
    let attachment = match interface.attachment() {
        Some(attachment) => Some(Attachment {
            id: required(action, attachment.attachment_id(), "attachment id")?.to_owned(),
            instance_id: attachment.instance_id().unwrap_or_default().to_owned(),
            device_index: index(action, attachment.device_index())?,
            status: attachment_status(action, attachment.status().map(|s| s.as_str()))?,
            delete_on_termination: attachment.delete_on_termination().unwrap_or(false),
        }),
        None => None,
    };
    let primary_ipv4: Ipv4Addr = parse(action, interface.private_ip_address(), "private ip")?;
    let mut secondary_ipv4 = Vec::new();
    for address in interface.private_ip_addresses() {
        let ip: Ipv4Addr = parse(action, address.private_ip_address(), "private ip")?;
        if address.primary() != Some(true) && ip != primary_ipv4 {
            secondary_ipv4.push(ip);
        }
    }
    let ipv4_prefixes = interface
        .ipv4_prefixes()
        .iter()
        .map(|prefix| parse::<Ipv4Net>(action, prefix.ipv4_prefix(), "ipv4 prefix"))
        .collect::<Result<_, _>>()?;
    let ipv6_addresses = interface
        .ipv6_addresses()
        .iter()
        .map(|address| parse::<Ipv6Addr>(action, address.ipv6_address(), "ipv6 address"))
        .collect::<Result<_, _>>()?;
    let ipv6_prefixes = interface
        .ipv6_prefixes()
        .iter()
        .map(|prefix| parse::<Ipv6Net>(action, prefix.ipv6_prefix(), "ipv6 prefix"))
        .collect::<Result<_, _>>()?;
    Ok(NetworkInterface {
        id: required(action, interface.network_interface_id(), "interface id")?.to_owned(),
        subnet_id: required(action, interface.subnet_id(), "subnet id")?.to_owned(),
        vpc_id: interface.vpc_id().unwrap_or_default().to_owned(),
        availability_zone: interface.availability_zone().unwrap_or_default().to_owned(),
        mac: parse::<MacAddress>(action, interface.mac_address(), "mac address")?,
        description: interface.description().unwrap_or_default().to_owned(),
        status: parse::<InterfaceStatus>(
            action,
            interface.status().map(|s| s.as_str()),
            "interface status",
        )?,
        attachment,
        primary_ipv4,
        secondary_ipv4,
        ipv4_prefixes,
        ipv6_addresses,
        ipv6_prefixes,
        security_groups: interface
            .groups()
            .iter()
            .filter_map(|group| group.group_id().map(str::to_owned))
            .collect(),
        tags: tags_from(interface.tag_set()),
    })
}

fn parse_all<T: FromStr>(
    action: Action,
    values: &[String],
    what: &str,
) -> Result<Vec<T>, CloudError> {
    values
        .iter()
        .map(|value| parse(action, Some(value.as_str()), what))
        .collect()
}

impl CloudProvider for Ec2 {
    async fn describe_instance(&self, instance_id: &str) -> Result<Instance, CloudError> {
        let action = Action::DescribeInstances;
        let answer = self
            .client
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        let instance = answer
            .reservations()
            .iter()
            .flat_map(|reservation| reservation.instances())
            .find(|instance| instance.instance_id() == Some(instance_id))
            .ok_or_else(|| CloudError::InstanceNotFound {
                message: format!("The instance ID '{instance_id}' does not exist"),
            })?;
        instance_from(action, instance)
    }

    async fn describe_instance_types(
        &self,
        instance_types: &[String],
    ) -> Result<Vec<InstanceTypeInfo>, CloudError> {
        let action = Action::DescribeInstanceTypes;
        if instance_types.is_empty() {
            return Ok(Vec::new());
        }
        let mut request = self.client.describe_instance_types();
        for instance_type in instance_types {
            request = request.instance_types(sdk::InstanceType::from(instance_type.as_str()));
        }
        let answer = request
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        let known = answer
            .instance_types()
            .iter()
            .map(|info| instance_type_from(action, info))
            .collect::<Result<Vec<_>, _>>()?;
        // EC2 answers in its own order; the trait promises the order asked.
        instance_types
            .iter()
            .map(|name| {
                known
                    .iter()
                    .find(|info| &info.instance_type == name)
                    .cloned()
                    .ok_or_else(|| CloudError::InvalidParameterValue {
                        message: format!(
                            "The following supplied instance types do not exist: [{name}]"
                        ),
                    })
            })
            .collect()
    }

    async fn describe_subnets(&self, filter: &SubnetFilter) -> Result<Vec<Subnet>, CloudError> {
        let action = Action::DescribeSubnets;
        let mut filters = tag_filters(&filter.tags);
        if let Some(vpc_id) = &filter.vpc_id {
            filters.push(self::filter("vpc-id", vpc_id));
        }
        let pages = self
            .client
            .describe_subnets()
            .set_subnet_ids((!filter.ids.is_empty()).then(|| filter.ids.clone()))
            .set_filters((!filters.is_empty()).then_some(filters))
            .into_paginator()
            .send()
            .collect::<Result<Vec<_>, _>>()
            .await
            .map_err(|error| map_error(action, error))?;
        pages
            .iter()
            .flat_map(|page| page.subnets())
            .map(|subnet| subnet_from(action, subnet))
            .collect()
    }

    async fn describe_interfaces(
        &self,
        filter: &InterfaceFilter,
    ) -> Result<Vec<NetworkInterface>, CloudError> {
        let action = Action::DescribeNetworkInterfaces;
        let mut filters = tag_filters(&filter.tags);
        if let Some(instance_id) = &filter.attached_instance {
            filters.push(self::filter("attachment.instance-id", instance_id));
        }
        if let Some(subnet_id) = &filter.subnet_id {
            filters.push(self::filter("subnet-id", subnet_id));
        }
        if let Some(status) = filter.status {
            filters.push(self::filter("status", status.as_str()));
        }
        let pages = self
            .client
            .describe_network_interfaces()
            .set_network_interface_ids((!filter.ids.is_empty()).then(|| filter.ids.clone()))
            .set_filters((!filters.is_empty()).then_some(filters))
            .into_paginator()
            .send()
            .collect::<Result<Vec<_>, _>>()
            .await
            .map_err(|error| map_error(action, error))?;
        pages
            .iter()
            .flat_map(|page| page.network_interfaces())
            .map(|interface| interface_from(action, interface))
            .collect()
    }

    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        let action = Action::CreateNetworkInterface;
        let mut call = self
            .client
            .create_network_interface()
            .subnet_id(&request.subnet_id)
            .set_description(request.description.clone())
            .set_groups(
                (!request.security_groups.is_empty()).then(|| request.security_groups.clone()),
            )
            .set_private_ip_address(request.primary_ipv4.map(|ip| ip.to_string()))
            .set_client_token(request.client_token.clone());
        if !request.tags.is_empty() {
            call = call.tag_specifications(
                sdk::TagSpecification::builder()
                    .resource_type(sdk::ResourceType::NetworkInterface)
                    .set_tags(Some(tags_to(&request.tags)))
                    .build(),
            );
        }
        call = with_amount(
            call,
            request.secondary_ipv4.as_ref(),
            |call, n| call.secondary_private_ip_address_count(n),
            |call, address| {
                call.private_ip_addresses(
                    sdk::PrivateIpAddressSpecification::builder()
                        .private_ip_address(address.to_string())
                        .primary(false)
                        .build(),
                )
            },
        );
        call = with_amount(
            call,
            request.ipv4_prefixes.as_ref(),
            |call, n| call.ipv4_prefix_count(n),
            |call, prefix| {
                call.ipv4_prefixes(
                    sdk::Ipv4PrefixSpecificationRequest::builder()
                        .ipv4_prefix(prefix.to_string())
                        .build(),
                )
            },
        );
        call = with_amount(
            call,
            request.ipv6_addresses.as_ref(),
            |call, n| call.ipv6_address_count(n),
            |call, address| {
                call.ipv6_addresses(
                    sdk::InstanceIpv6Address::builder()
                        .ipv6_address(address.to_string())
                        .build(),
                )
            },
        );
        call = with_amount(
            call,
            request.ipv6_prefixes.as_ref(),
            |call, n| call.ipv6_prefix_count(n),
            |call, prefix| {
                call.ipv6_prefixes(
                    sdk::Ipv6PrefixSpecificationRequest::builder()
                        .ipv6_prefix(prefix.to_string())
                        .build(),
                )
            },
        );
        let answer = call
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        let interface = answer
            .network_interface()
            .ok_or_else(|| invalid(action, "network interface"))?;
        interface_from(action, interface)
    }

    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        let action = Action::AttachNetworkInterface;
        let answer = self
            .client
            .attach_network_interface()
            .network_interface_id(request.interface_id)
            .instance_id(request.instance_id)
            .device_index(count(request.device_index))
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(required(action, answer.attachment_id(), "attachment id")?.to_owned())
    }

    async fn detach_interface(&self, attachment_id: &str, force: bool) -> Result<(), CloudError> {
        let action = Action::DetachNetworkInterface;
        self.client
            .detach_network_interface()
            .attachment_id(attachment_id)
            .force(force)
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }

    async fn delete_interface(&self, interface_id: &str) -> Result<(), CloudError> {
        let action = Action::DeleteNetworkInterface;
        self.client
            .delete_network_interface()
            .network_interface_id(interface_id)
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }

    async fn assign_ipv4(
        &self,
        interface_id: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        let action = Action::AssignPrivateIpAddresses;
        let call = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(interface_id)
            .allow_reassignment(false);
        let call = match request {
            Ipv4Assign::Addresses(Amount::Count(n)) => {
                call.secondary_private_ip_address_count(count(*n))
            }
            Ipv4Assign::Addresses(Amount::Explicit(addresses)) => call.set_private_ip_addresses(
                Some(addresses.iter().map(ToString::to_string).collect()),
            ),
            Ipv4Assign::Prefixes(Amount::Count(n)) => call.ipv4_prefix_count(count(*n)),
            Ipv4Assign::Prefixes(Amount::Explicit(prefixes)) => {
                call.set_ipv4_prefixes(Some(prefixes.iter().map(ToString::to_string).collect()))
            }
        };
        let answer = call
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        let addresses = answer
            .assigned_private_ip_addresses()
            .iter()
            .map(|address| parse(action, address.private_ip_address(), "assigned address"))
            .collect::<Result<_, _>>()?;
        let prefixes = answer
            .assigned_ipv4_prefixes()
            .iter()
            .map(|prefix| parse(action, prefix.ipv4_prefix(), "assigned prefix"))
            .collect::<Result<_, _>>()?;
        Ok(Ipv4Set {
            addresses,
            prefixes,
        })
    }

    async fn unassign_ipv4(&self, interface_id: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        let action = Action::UnassignPrivateIpAddresses;
        self.client
            .unassign_private_ip_addresses()
            .network_interface_id(interface_id)
            .set_private_ip_addresses(
                (!release.addresses.is_empty())
                    .then(|| release.addresses.iter().map(ToString::to_string).collect()),
            )
            .set_ipv4_prefixes(
                (!release.prefixes.is_empty())
                    .then(|| release.prefixes.iter().map(ToString::to_string).collect()),
            )
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }

    async fn assign_ipv6(
        &self,
        interface_id: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        let action = Action::AssignIpv6Addresses;
        let call = self
            .client
            .assign_ipv6_addresses()
            .network_interface_id(interface_id);
        let call = match request {
            Ipv6Assign::Addresses(Amount::Count(n)) => call.ipv6_address_count(count(*n)),
            Ipv6Assign::Addresses(Amount::Explicit(addresses)) => {
                call.set_ipv6_addresses(Some(addresses.iter().map(ToString::to_string).collect()))
            }
            Ipv6Assign::Prefixes(Amount::Count(n)) => call.ipv6_prefix_count(count(*n)),
            Ipv6Assign::Prefixes(Amount::Explicit(prefixes)) => {
                call.set_ipv6_prefixes(Some(prefixes.iter().map(ToString::to_string).collect()))
            }
        };
        let answer = call
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(Ipv6Set {
            addresses: parse_all(action, answer.assigned_ipv6_addresses(), "assigned address")?,
            prefixes: parse_all(action, answer.assigned_ipv6_prefixes(), "assigned prefix")?,
        })
    }

    async fn unassign_ipv6(&self, interface_id: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        let action = Action::UnassignIpv6Addresses;
        self.client
            .unassign_ipv6_addresses()
            .network_interface_id(interface_id)
            .set_ipv6_addresses(
                (!release.addresses.is_empty())
                    .then(|| release.addresses.iter().map(ToString::to_string).collect()),
            )
            .set_ipv6_prefixes(
                (!release.prefixes.is_empty())
                    .then(|| release.prefixes.iter().map(ToString::to_string).collect()),
            )
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }

    async fn create_tags(&self, resource_ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        let action = Action::CreateTags;
        if resource_ids.is_empty() || tags.is_empty() {
            return Ok(());
        }
        self.client
            .create_tags()
            .set_resources(Some(resource_ids.to_vec()))
            .set_tags(Some(tags_to(tags)))
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }

    async fn delete_tags(
        &self,
        resource_ids: &[String],
        keys: &[String],
    ) -> Result<(), CloudError> {
        let action = Action::DeleteTags;
        // DeleteTags without keys deletes every tag: never send that.
        if resource_ids.is_empty() || keys.is_empty() {
            return Ok(());
        }
        self.client
            .delete_tags()
            .set_resources(Some(resource_ids.to_vec()))
            .set_tags(Some(
                keys.iter()
                    .map(|key| sdk::Tag::builder().key(key).build())
                    .collect(),
            ))
            .send()
            .await
            .map_err(|error| map_error(action, error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_ec2::operation::create_network_interface::CreateNetworkInterfaceError;
    use aws_smithy_types::body::SdkBody;

    type Error = SdkError<CreateNetworkInterfaceError, HttpResponse>;

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(status.try_into().unwrap(), SdkBody::empty())
    }

    fn service(code: Option<&str>, message: &str, status: u16) -> Error {
        let mut metadata = ErrorMetadata::builder().message(message);
        if let Some(code) = code {
            metadata = metadata.code(code);
        }
        SdkError::service_error(
            CreateNetworkInterfaceError::generic(metadata.build()),
            response(status),
        )
    }

    fn mapped(error: Error) -> CloudError {
        map_error(Action::CreateNetworkInterface, error)
    }

    #[test]
    fn ec2_error_codes_map_to_their_variants() {
        let message = "m".to_owned();
        let cases = [
            (
                "RequestLimitExceeded",
                CloudError::RequestLimitExceeded {
                    action: Action::CreateNetworkInterface,
                },
            ),
            (
                "InsufficientFreeAddressesInSubnet",
                CloudError::InsufficientFreeAddressesInSubnet {
                    message: message.clone(),
                },
            ),
            (
                "InsufficientCidrBlocks",
                CloudError::InsufficientCidrBlocks {
                    message: message.clone(),
                },
            ),
            (
                "AttachmentLimitExceeded",
                CloudError::AttachmentLimitExceeded {
                    message: message.clone(),
                },
            ),
            (
                "PrivateIpAddressLimitExceeded",
                CloudError::PrivateIpAddressLimitExceeded {
                    message: message.clone(),
                },
            ),
            (
                "IncorrectInstanceState",
                CloudError::IncorrectInstanceState {
                    message: message.clone(),
                },
            ),
            (
                "InternalError",
                CloudError::InternalError {
                    message: message.clone(),
                },
            ),
            (
                "InvalidNetworkInterfaceID.NotFound",
                CloudError::InterfaceNotFound {
                    message: message.clone(),
                },
            ),
            (
                "InvalidInstanceID.NotFound",
                CloudError::InstanceNotFound {
                    message: message.clone(),
                },
            ),
            (
                "InvalidSubnetID.NotFound",
                CloudError::SubnetNotFound {
                    message: message.clone(),
                },
            ),
            (
                "InvalidAttachmentID.NotFound",
                CloudError::AttachmentNotFound {
                    message: message.clone(),
                },
            ),
            (
                "InvalidNetworkInterface.InUse",
                CloudError::InterfaceInUse {
                    message: message.clone(),
                },
            ),
            (
                "UnauthorizedOperation",
                CloudError::UnauthorizedOperation {
                    message: message.clone(),
                },
            ),
            (
                "InvalidParameterValue",
                CloudError::InvalidParameterValue {
                    message: message.clone(),
                },
            ),
            // DescribeInstanceTypes' answer for a type that does not exist.
            (
                "InvalidInstanceType",
                CloudError::InvalidParameterValue {
                    message: message.clone(),
                },
            ),
            (
                "VcpuLimitExceeded",
                CloudError::Other {
                    code: "VcpuLimitExceeded".to_owned(),
                    message: message.clone(),
                },
            ),
        ];
        for (code, expected) in cases {
            let status = if code == "RequestLimitExceeded" {
                503
            } else {
                400
            };
            assert_eq!(
                mapped(service(Some(code), &message, status)),
                expected,
                "{code}"
            );
        }
    }

    #[test]
    fn an_occupied_device_index_is_told_apart_by_its_message() {
        let message = "Instance 'i-0123' already has an interface attached at device index '1'.";
        let error = mapped(service(Some("InvalidParameterValue"), message, 400));
        assert_eq!(
            error,
            CloudError::DeviceIndexInUse {
                message: message.to_owned()
            }
        );
        assert!(!error.is_retryable());
    }

    #[test]
    fn throttling_is_retryable_internal_errors_ambiguous_and_bad_requests_neither() {
        assert!(mapped(service(Some("RequestLimitExceeded"), "slow down", 503)).is_retryable());
        for ambiguous in [
            mapped(service(Some("InternalError"), "oops", 500)),
            mapped(service(Some("ServiceUnavailable"), "busy", 503)),
            mapped(service(None, "", 502)),
        ] {
            assert!(
                ambiguous.is_ambiguous() && !ambiguous.is_retryable(),
                "{ambiguous:?}"
            );
        }
        let unlisted = mapped(service(Some("InvalidIPAddress.InUse"), "taken", 400));
        assert_eq!(unlisted.code(), "InvalidIPAddress.InUse");
        assert!(!unlisted.is_retryable() && !unlisted.is_ambiguous());
        assert!(
            !mapped(service(
                Some("InsufficientFreeAddressesInSubnet"),
                "full",
                400
            ))
            .is_retryable()
        );
        assert!(mapped(service(Some("InvalidSubnetID.NotFound"), "no", 400)).is_not_found());
    }

    #[test]
    fn answers_without_a_code_map_by_http_status() {
        assert_eq!(
            mapped(service(None, "", 500)),
            CloudError::InternalError {
                message: "http status 500".to_owned()
            }
        );
        assert_eq!(
            mapped(service(None, "", 502)),
            CloudError::InternalError {
                message: "http status 502".to_owned()
            }
        );
        assert_eq!(
            mapped(service(None, "forbidden", 403)),
            CloudError::Other {
                code: "Http403".to_owned(),
                message: "forbidden".to_owned()
            }
        );
    }

    #[test]
    fn no_answer_in_time_or_no_connection_is_a_timeout() {
        let timeout = CloudError::Timeout {
            action: Action::CreateNetworkInterface,
        };
        assert_eq!(mapped(SdkError::timeout_error("deadline")), timeout);
        assert_eq!(
            mapped(SdkError::dispatch_failure(ConnectorError::timeout(
                "read timed out".into()
            ))),
            timeout
        );
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            mapped(SdkError::dispatch_failure(ConnectorError::io(
                refused.into()
            ))),
            timeout
        );
        assert!(timeout.is_ambiguous() && !timeout.is_retryable());
    }

    #[test]
    fn an_unreadable_answer_is_an_internal_error_and_a_request_not_built_a_bad_parameter() {
        assert!(matches!(
            mapped(SdkError::response_error("not xml", response(200))),
            CloudError::InternalError { message } if message.contains("200")
        ));
        assert!(matches!(
            mapped(SdkError::construction_failure("missing subnet id")),
            CloudError::InvalidParameterValue { message } if message.contains("missing subnet id")
        ));
    }

    fn sdk_interface() -> sdk::NetworkInterface {
        sdk::NetworkInterface::builder()
            .network_interface_id("eni-1")
            .subnet_id("subnet-1")
            .vpc_id("vpc-1")
            .availability_zone("us-east-1a")
            .mac_address("02:00:00:AB:cd:01")
            .status(sdk::NetworkInterfaceStatus::InUse)
            .private_ip_address("10.0.0.10")
            // EC2 (and moto) list the primary among the private addresses, flagged.
            .private_ip_addresses(
                sdk::NetworkInterfacePrivateIpAddress::builder()
                    .private_ip_address("10.0.0.10")
                    .primary(true)
                    .build(),
            )
            .private_ip_addresses(
                sdk::NetworkInterfacePrivateIpAddress::builder()
                    .private_ip_address("10.0.0.11")
                    .primary(false)
                    .build(),
            )
            .ipv4_prefixes(
                sdk::Ipv4PrefixSpecification::builder()
                    .ipv4_prefix("10.0.0.32/28")
                    .build(),
            )
            .attachment(
                sdk::NetworkInterfaceAttachment::builder()
                    .attachment_id("eni-attach-1")
                    .instance_id("i-1")
                    .device_index(2)
                    .status(sdk::AttachmentStatus::Attached)
                    .build(),
            )
            .groups(sdk::GroupIdentifier::builder().group_id("sg-1").build())
            .tag_set(sdk::Tag::builder().key("k").value("v").build())
            .build()
    }

    #[test]
    fn an_interface_converts_with_its_secondaries_without_the_primary() {
        let interface =
            interface_from(Action::DescribeNetworkInterfaces, &sdk_interface()).unwrap();
        assert_eq!(interface.id, "eni-1");
        assert_eq!(interface.mac.to_string(), "02:00:00:ab:cd:01");
        assert_eq!(interface.status, InterfaceStatus::InUse);
        assert_eq!(interface.primary_ipv4, Ipv4Addr::new(10, 0, 0, 10));
        assert_eq!(interface.secondary_ipv4, vec![Ipv4Addr::new(10, 0, 0, 11)]);
        assert_eq!(
            interface.ipv4_prefixes,
            vec!["10.0.0.32/28".parse::<Ipv4Net>().unwrap()]
        );
        let attachment = interface.attachment.unwrap();
        assert_eq!(
            (
                attachment.id.as_str(),
                attachment.instance_id.as_str(),
                attachment.device_index
            ),
            ("eni-attach-1", "i-1", 2)
        );
        assert_eq!(attachment.status, AttachmentStatus::Attached);
        assert_eq!(interface.security_groups, vec!["sg-1".to_owned()]);
        assert_eq!(interface.tags.get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn an_interface_with_a_bad_field_is_an_invalid_response() {
        let mut broken = sdk_interface();
        broken.mac_address = Some("02:00".to_owned());
        let error = interface_from(Action::DescribeNetworkInterfaces, &broken).unwrap_err();
        assert!(
            matches!(&error, CloudError::Other { code, message } if code == "InvalidResponse" && message.contains("mac address")),
            "{error:?}"
        );
        let mut without_id = sdk_interface();
        without_id.network_interface_id = None;
        assert!(interface_from(Action::DescribeNetworkInterfaces, &without_id).is_err());
    }

    #[test]
    fn instance_type_limits_convert_and_xen_has_no_prefix_delegation() {
        let network = |interfaces, ipv4, ipv6_supported| {
            sdk::NetworkInfo::builder()
                .maximum_network_interfaces(interfaces)
                .ipv4_addresses_per_interface(ipv4)
                .ipv6_addresses_per_interface(ipv4)
                .ipv6_supported(ipv6_supported)
                .build()
        };
        let m5 = sdk::InstanceTypeInfo::builder()
            .instance_type(sdk::InstanceType::M5Large)
            .hypervisor(sdk::InstanceTypeHypervisor::Nitro)
            .network_info(network(3, 10, true))
            .build();
        let t2 = sdk::InstanceTypeInfo::builder()
            .instance_type(sdk::InstanceType::T2Micro)
            .hypervisor(sdk::InstanceTypeHypervisor::Xen)
            .network_info(network(2, 2, false))
            .build();
        let m5 = instance_type_from(Action::DescribeInstanceTypes, &m5).unwrap();
        assert_eq!(
            (
                m5.max_interfaces,
                m5.ipv4_per_interface,
                m5.ipv6_per_interface
            ),
            (3, 10, 10)
        );
        assert!(m5.prefix_delegation);
        assert_eq!(m5.max_pods(), 29);
        let t2 = instance_type_from(Action::DescribeInstanceTypes, &t2).unwrap();
        assert_eq!(
            (t2.hypervisor, t2.prefix_delegation),
            (Hypervisor::Xen, false)
        );
        assert_eq!(t2.ipv6_per_interface, 0);
    }
}
